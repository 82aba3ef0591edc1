/* memtable.c: MemFilter, a Bloom filter over a memtable's keys for the C
 * getter (lsmdb/memtable.py's Memtable holds one beside its dict; it has no
 * Python twin: without the extension a get asks the dict), and
 * apply_columns, Memtable.apply_columns's step. */

#include "memtable.h"
#include "filters_hashing.h"

/* ------------------------------------------------------------------ MemFilter
 * A Bloom filter over a memtable's keys, kept in memory only, so that a get
 * of a key the memtable does not hold skips the dict lookup (a walk into a
 * dict of tens of thousands of entries, cache misses and all) for a test of
 * a few bits in one cache line.  The key's hash is xxh3_64, which the get
 * computes anyway for the files' filters and reuses for them.
 *
 * Layout: lines of 512 bits (8 words); a key sets MF_K bits of one line:
 * line ((h >> 32) * nlines) >> 32, bits (g >> 9i) & 511 for i < MF_K, where
 * g = h * 0x9E3779B97F4A7C15.  Sized at MF_BITS_PER_KEY bits per key of its
 * capacity; when a write would take it past its capacity it is rebuilt at
 * twice the keys from the hashes it keeps of its keys (8 bytes a key, read in
 * order: no walk over the key objects, whose headers miss the cache), the
 * new lines replacing the old ones only when complete.
 *
 * Writers add a batch's new keys *before* the batch enters the dict, in one
 * call that never releases the GIL or runs Python code, so a reader that
 * finds a key in the dict always finds it in the filter, and a batch still
 * becomes visible in one dict.update.  Keys longer than XXH3_NATIVE_MAX
 * bytes are not added: the getter looks them up in the dict without asking
 * the filter.  A memtable never loses a key (a delete is a tombstone), so the
 * filter never has to.  MF_K, the struct and the test the getter runs
 * (mf_line, mf_test) are in speedups.h. */
#define MF_BITS_PER_KEY 10
#define MF_MIN_KEYS 1024

static inline void
mf_set(uint64_t *lines, uint64_t nlines, uint64_t h)
{
    uint64_t *line = mf_line(lines, nlines, h);
    uint64_t g = h * UINT64_C(0x9E3779B97F4A7C15);
    for (int i = 0; i < MF_K; i++) {
        unsigned b = (unsigned)(g >> (9 * i)) & 511;
        line[b >> 6] |= UINT64_C(1) << (b & 63);
    }
}

/* Room in mf->hashes for `more` hashes after its `count`.  0, or -1
 * (MemoryError, nothing changed). */
static int
mf_reserve_hashes(MemFilter *mf, Py_ssize_t more)
{
    if (mf->count + more <= mf->hcap)
        return 0;
    Py_ssize_t want = mf->hcap * 2;
    if (want < mf->count + more)
        want = mf->count + more;
    if (want < MF_MIN_KEYS)
        want = MF_MIN_KEYS;
    if ((size_t)want > PY_SSIZE_T_MAX / sizeof(uint64_t)) {
        PyErr_NoMemory();
        return -1;
    }
    uint64_t *grown = PyMem_RawRealloc(mf->hashes, (size_t)want * sizeof(uint64_t));
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    mf->hashes = grown;
    mf->hcap = want;
    return 0;
}

/* Size the filter for `keys` keys and set the bits of the hashes it holds;
 * the old lines stay in place until the new ones are complete.  0, or -1
 * (MemoryError). */
static int
mf_resize(MemFilter *mf, Py_ssize_t keys)
{
    if (keys < MF_MIN_KEYS)
        keys = MF_MIN_KEYS;
    if ((uint64_t)keys > (UINT64_C(1) << 40))
        keys = (Py_ssize_t)(UINT64_C(1) << 40);
    uint64_t nlines = ((uint64_t)keys * MF_BITS_PER_KEY + 511) / 512;
    if (nlines > UINT32_MAX || nlines > (uint64_t)PY_SSIZE_T_MAX / 64 - 1) {
        PyErr_NoMemory();
        return -1;
    }
    void *raw = PyMem_RawCalloc((size_t)nlines * 64 + 64, 1);
    if (raw == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    uint64_t *lines = (uint64_t *)(((uintptr_t)raw + 63) & ~(uintptr_t)63);
    for (Py_ssize_t i = 0; i < mf->count; i++)
        mf_set(lines, nlines, mf->hashes[i]);
    PyMem_RawFree(mf->raw);
    mf->raw = raw;
    mf->lines = lines;
    mf->nlines = nlines;
    mf->capacity = keys;
    return 0;
}

static int
MemFilter_init(MemFilter *self, PyObject *args, PyObject *kwds)
{
    PyObject *data;
    static char *kwlist[] = {"data", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!:MemFilter", kwlist, &PyDict_Type, &data))
        return -1;
    if (!PyDict_CheckExact(data)) {
        PyErr_SetString(PyExc_TypeError, "data must be a dict");
        return -1;
    }
    Py_INCREF(data);
    Py_XSETREF(self->data, data);
    self->count = 0;  /* (re)initialised: the dict's keys, hashed once */
    if (mf_reserve_hashes(self, PyDict_GET_SIZE(data)) < 0)
        return -1;
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(data, &pos, &key, &value))
        if (PyBytes_CheckExact(key) && PyBytes_GET_SIZE(key) <= XXH3_NATIVE_MAX)
            self->hashes[self->count++] = xxh3_64_of_short(key);
    return mf_resize(self, 2 * PyDict_GET_SIZE(data));
}

static void
MemFilter_dealloc(MemFilter *self)
{
    Py_XDECREF(self->data);
    PyMem_RawFree(self->raw);
    PyMem_RawFree(self->hashes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The n keys of items (bytes, checked first: a bad one adds nothing) are
 * about to enter the dict.  0, or -1 with an exception set. */
int
mf_add(MemFilter *self, PyObject *const *items, Py_ssize_t n)
{
    if (self->lines == NULL) {
        PyErr_SetString(PyExc_TypeError, "MemFilter is not initialised");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (!PyBytes_CheckExact(items[i])) {
            PyErr_SetString(PyExc_TypeError, "keys must be bytes");
            return -1;
        }
    if (mf_reserve_hashes(self, n) < 0
        || (self->count + n > self->capacity
            && mf_resize(self, 2 * (PyDict_GET_SIZE(self->data) + n)) < 0))
        return -1;
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyBytes_GET_SIZE(items[i]) <= XXH3_NATIVE_MAX) {
            uint64_t h = xxh3_64_of_short(items[i]);
            mf_set(self->lines, self->nlines, h);
            self->hashes[self->count++] = h;
        }
    return 0;
}

/* add_many(keys): keys (a list of bytes) are about to enter the dict. */
static PyObject *
MemFilter_add_many(MemFilter *self, PyObject *keys)
{
    if (!PyList_CheckExact(keys)) {
        PyErr_SetString(PyExc_TypeError, "keys must be a list");
        return NULL;
    }
    if (mf_add(self, PySequence_Fast_ITEMS(keys), PyList_GET_SIZE(keys)) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
MemFilter_add(MemFilter *self, PyObject *key)
{
    if (mf_add(self, &key, 1) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
MemFilter_may_hold(MemFilter *self, PyObject *key)
{
    if (self->lines == NULL) {
        PyErr_SetString(PyExc_TypeError, "MemFilter is not initialised");
        return NULL;
    }
    if (!PyBytes_CheckExact(key)) {
        PyErr_SetString(PyExc_TypeError, "key must be bytes");
        return NULL;
    }
    if (PyBytes_GET_SIZE(key) > XXH3_NATIVE_MAX)
        Py_RETURN_TRUE;
    return PyBool_FromLong(mf_test(self, xxh3_64_of_short(key)));
}

static PyObject *
MemFilter_get_capacity(MemFilter *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->capacity);
}

static PyObject *
MemFilter_get_nbytes(MemFilter *self, void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLongLong(self->nlines * 64);
}

static PyMethodDef MemFilter_methods[] = {
    {"add_many", (PyCFunction)MemFilter_add_many, METH_O,
     "add_many($self, keys, /)\n--\n\n"
     "Keys (a list of bytes) that are about to enter the memtable's dict."},
    {"add", (PyCFunction)MemFilter_add, METH_O, "add($self, key, /)\n--\n\nadd_many([key])."},
    {"may_hold", (PyCFunction)MemFilter_may_hold, METH_O,
     "may_hold($self, key, /)\n--\n\nFalse when the memtable cannot hold key, else True."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef MemFilter_getset[] = {
    {"capacity", (getter)MemFilter_get_capacity, NULL, "keys the filter is sized for", NULL},
    {"nbytes", (getter)MemFilter_get_nbytes, NULL, "bytes of filter lines", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject MemFilterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lsmdb._speedups.MemFilter",
    .tp_basicsize = sizeof(MemFilter),
    .tp_dealloc = (destructor)MemFilter_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "MemFilter(data)\n--\n\n"
              "A Bloom filter over the keys of a memtable's dict, for gets.",
    .tp_methods = MemFilter_methods,
    .tp_getset = MemFilter_getset,
    .tp_init = (initproc)MemFilter_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------ apply_columns
 * Memtable.apply_columns (lsmdb/memtable.py) in C: keys[i] -> values[i] of
 * one batch at one sequence number, the Python twin being apply_many over
 * dict(zip(keys, values)).  Every key and value is checked first (nothing
 * changes on a bad one); then each op, in order, looks the key up once and
 * sets it in the filter (a new key, before the dict), the dict and the tags;
 * an op that fails (MemoryError) is undone and the call raises, the ops
 * before it applied (the caller then recounts the memtable's size).
 * The loop calls no Python code and allocates no object the garbage
 * collector tracks, so it never lets another thread run: readers see the
 * whole batch or none of it, as with apply_many's one dict.update.  A later
 * op on a key wins, and the size accounting comes out as apply_many's. */
PyObject *
speedups_apply_columns(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 || !PyDict_CheckExact(args[0]) || !PyDict_CheckExact(args[1])
        || !PyList_CheckExact(args[3]) || !PyList_CheckExact(args[5])
        || !PyList_CheckExact(args[6])
        || (args[2] != Py_None && Py_TYPE(args[2]) != &MemFilterType)) {
        PyErr_SetString(PyExc_TypeError,
                        "apply_columns(data: dict, tags: dict, filter: MemFilter | None, "
                        "pending: list, seq, keys: list, values: list)");
        return NULL;
    }
    PyObject *data = args[0], *tags = args[1], *pending = args[3];
    if (pending == args[5] || pending == args[6]) {  /* appends would move the columns */
        PyErr_SetString(PyExc_ValueError, "apply_columns: pending is a list of its own");
        return NULL;
    }
    MemFilter *filter = args[2] == Py_None ? NULL : (MemFilter *)args[2];
    unsigned long long seq = PyLong_AsUnsignedLongLong(args[4]);
    if (seq == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (seq > (UINT64_MAX >> 8)) {
        PyErr_SetString(PyExc_OverflowError, "seq too large for a tag");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(args[5]);
    if (PyList_GET_SIZE(args[6]) != n) {
        PyErr_SetString(PyExc_ValueError, "keys and values differ in length");
        return NULL;
    }
    PyObject **keys = PySequence_Fast_ITEMS(args[5]), **values = PySequence_Fast_ITEMS(args[6]);
    int expiring = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = values[i];
        if (!PyBytes_CheckExact(keys[i])) {
            PyErr_SetString(PyExc_TypeError, "memtable keys are bytes");
            return NULL;
        }
        if (v == Py_None || PyBytes_CheckExact(v))
            continue;
        if (!PyTuple_CheckExact(v) || PyTuple_GET_SIZE(v) != 2
            || !PyBytes_CheckExact(PyTuple_GET_ITEM(v, 0))) {
            PyErr_SetString(PyExc_TypeError, "a memtable value is bytes, None or (bytes, int)");
            return NULL;
        }
        expiring = 1;
    }
    PyObject *tag[3] = {NULL, NULL, NULL};  /* by kind: tombstone, value, expiring */
    uint64_t base = (uint64_t)seq << 8;
    for (int k = 0; k < 3; k++)
        if ((tag[k] = PyLong_FromUnsignedLongLong(base | (uint64_t)k)) == NULL)
            goto fail;
    if (PyList_GET_SIZE(pending) > PY_SSIZE_T_MAX - n) {
        PyErr_NoMemory();
        goto fail;
    }
    long long grow = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = keys[i], *value = values[i];
        /* One probe of the dict: the key's old value, or the new one put in
         * (the dict grew; it is taken out again if the op cannot complete). */
        Py_ssize_t before = PyDict_GET_SIZE(data);
        PyObject *old = PyDict_SetDefault(data, key, value);  /* borrowed */
        if (old == NULL)
            goto fail;
        int added = PyDict_GET_SIZE(data) != before;
        if (added)
            old = NULL;
        long long change, size = 0;
        if (old == NULL) {
            change = PyBytes_GET_SIZE(key) + MEM_ENTRY_OVERHEAD_BYTES;  /* a new entry */
        } else {
            if (mem_value_size(old, &size) < 0)
                goto fail;
            change = -size;  /* the old value leaves */
        }
        (void)mem_value_size(value, &size);  /* checked above: cannot fail */
        change += size;
        int kind = value == Py_None ? 0 : PyBytes_CheckExact(value) ? 1 : 2;
        /* Each op whole or not at all (a MemoryError can stop the loop): a new
         * key, already in the dict, enters the filter (a superset is harmless),
         * the pending list and the tags; a failed step undoes the op's earlier
         * ones, which cannot fail (a key removed, an existing key's old value
         * put back).  The ops before it stay applied.  No other thread runs
         * meanwhile (no Python code here), so none sees the dict ahead of the
         * filter. */
        if (old == NULL) {
            int bad = (filter != NULL && mf_add(filter, &key, 1) < 0)
                      || PyList_Append(pending, key) < 0;
            if (!bad && PyDict_SetItem(tags, key, tag[kind]) < 0) {
                PyObject *type, *exc, *tb;
                PyErr_Fetch(&type, &exc, &tb);
                PyList_SetSlice(pending, PyList_GET_SIZE(pending) - 1,
                                PyList_GET_SIZE(pending), NULL);
                PyErr_Restore(type, exc, tb);
                bad = 1;
            }
            if (bad) {
                PyObject *type, *exc, *tb;
                PyErr_Fetch(&type, &exc, &tb);
                PyDict_DelItem(data, key);
                PyErr_Restore(type, exc, tb);
                goto fail;
            }
        } else {
            Py_INCREF(old);  /* the dict's reference goes with the set */
            if (PyDict_SetItem(data, key, value) < 0) {
                Py_DECREF(old);
                goto fail;
            }
            if (PyDict_SetItem(tags, key, tag[kind]) < 0) {
                PyObject *type, *exc, *tb;
                PyErr_Fetch(&type, &exc, &tb);
                PyDict_SetItem(data, key, old);
                PyErr_Restore(type, exc, tb);
                Py_DECREF(old);
                goto fail;
            }
            Py_DECREF(old);
        }
        grow += change;
    }
    for (int k = 0; k < 3; k++)
        Py_DECREF(tag[k]);
    return Py_BuildValue("(LO)", grow, expiring ? Py_True : Py_False);
fail:
    for (int k = 0; k < 3; k++)
        Py_XDECREF(tag[k]);
    return NULL;
}
