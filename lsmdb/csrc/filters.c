/* filters.c: a file's filter made ready to probe (FilterProbe) from what
 * Python hands over -- its family id, the buffer it probes and the family's
 * parameters (lsmdb/filters' ProbeSpec) -- and the families this module
 * probes.  The probes themselves are inline (filters.h). */

#include "filters.h"

/* f from a filter's (family, data, params): 0, or -1 with an exception set
 * (ValueError for a family this module does not probe or parameters that
 * do not fit it).  On failure f holds nothing to release. */
int
filter_probe_init(FilterProbe *f, PyObject *family, PyObject *data, PyObject *params)
{
    memset(f, 0, sizeof *f);
    long id = PyLong_AsLong(family);
    if (id == -1 && PyErr_Occurred())
        return -1;
    if (id == FILTER_NONE)
        return 0;
    if (id != FILTER_BLOOM_WHOLE && id != FILTER_BLOOM_PARTITIONED && id != FILTER_BLOCKED_BLOOM) {
        PyErr_Format(PyExc_ValueError, "filter family %ld has no C probe", id);
        return -1;
    }
    if (PyObject_GetBuffer(data, &f->data, PyBUF_SIMPLE) < 0)
        return -1;
    f->have_data = 1;
    if ((id == FILTER_BLOCKED_BLOOM
         ? blocked_params_init(&f->u.blocked, params, f->data.len)
         : bloom_params_init(&f->u.bloom, (int)id, params, f->data.len)) < 0) {
        filter_probe_clear(f);
        return -1;
    }
    f->family = (int)id;
    return 0;
}

void
filter_probe_clear(FilterProbe *f)
{
    if (f->have_data) {
        PyBuffer_Release(&f->data);
        f->have_data = 0;
    }
    f->family = FILTER_NONE;
}

/* w from `hashes`: a buffer of native unsigned 64-bit words (an array('Q'))
 * as it is, or a sequence of ints copied into words (OverflowError or
 * TypeError for anything else): 0, or -1 with an exception set and nothing
 * held.  The words can then be read without the GIL. */
int
hash_words_get(PyObject *hashes, HashWords *w)
{
    memset(w, 0, sizeof *w);
    if (!PyList_CheckExact(hashes) && !PyTuple_CheckExact(hashes)
        && PyObject_CheckBuffer(hashes)) {
        if (PyObject_GetBuffer(hashes, &w->view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
            return -1;
        if (w->view.itemsize == 8 && w->view.format != NULL
            && (strcmp(w->view.format, "Q") == 0 || strcmp(w->view.format, "@Q") == 0)) {
            w->have_view = 1;
            w->words = (const unsigned char *)w->view.buf;
            w->count = w->view.len / 8;
            return 0;
        }
        PyBuffer_Release(&w->view);  /* not native unsigned 64-bit words: as a sequence */
    }
    PyObject *seq = PySequence_Fast(hashes, "hashes must be a sequence of ints");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    w->copy = PyMem_Malloc(n ? 8 * (size_t)n : 1);
    if (w->copy == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        unsigned long long h = PyLong_AsUnsignedLongLong(items[j]);
        if (h == (unsigned long long)-1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            hash_words_release(w);
            return -1;
        }
        uint64_t word = h;
        memcpy(w->copy + 8 * j, &word, 8);
    }
    Py_DECREF(seq);
    w->words = w->copy;
    w->count = n;
    return 0;
}

void
hash_words_release(HashWords *w)
{
    if (w->have_view)
        PyBuffer_Release(&w->view);
    PyMem_Free(w->copy);
    memset(w, 0, sizeof *w);
}

/* {id: name} of every family filter_probe_init takes (FILTER_FAMILIES). */
PyObject *
filter_families(void)
{
    static const char *const names[FILTER_FAMILY_SLOTS] = FILTER_FAMILY_NAMES;
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    for (int id = 0; id < FILTER_FAMILY_SLOTS; id++) {
        if (names[id] == NULL)
            continue;
        PyObject *key = PyLong_FromLong(id), *name = PyUnicode_FromString(names[id]);
        int r = key && name ? PyDict_SetItem(out, key, name) : -1;
        Py_XDECREF(key);
        Py_XDECREF(name);
        if (r < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}
