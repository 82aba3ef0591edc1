/* changes.c: ChangeWatch, a following reader's read-only mapping of the
 * CHANGES file and the counters it last caught up to.  Python twin:
 * lsmdb/changes.py's ChangeWatch (the file's layout is described there and
 * in docs/FORMAT.md). */

#include "changes.h"

#ifndef _WIN32
#include <fcntl.h>
#include <sys/stat.h>
#endif

static const char CHANGES_MAGIC[8] = {'L', 'S', 'M', 'D', 'B', 'C', 'H', 'G'};
#define CHANGES_FORMAT 1

static void
watch_unmap(ChangeWatch *self)
{
#ifndef _WIN32
    if (self->words != NULL)
        munmap((void *)self->words, CHANGES_SIZE);
#endif
    self->words = NULL;
}

/* Map the file if it is not mapped: 1 mapped, 0 not (missing, short, not a
 * CHANGES file), -1 error. */
static int
watch_attach(ChangeWatch *self)
{
#ifdef _WIN32
    return 0;
#else
    if (self->words != NULL)
        return 1;
    PyObject *bytes = PyUnicode_EncodeFSDefault(self->path);
    if (bytes == NULL)
        return -1;
    void *map = MAP_FAILED;
    /* O_NONBLOCK: a FIFO planted under the name must not block the open; only a
     * regular file is mapped.  The GIL is let go for the system calls. */
    Py_BEGIN_ALLOW_THREADS
    int fd = open(PyBytes_AS_STRING(bytes), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd >= 0) {
        struct stat st;
        if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= CHANGES_SIZE)
            map = mmap(NULL, CHANGES_SIZE, PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
    }
    Py_END_ALLOW_THREADS
    Py_DECREF(bytes);
    if (map == MAP_FAILED)
        return 0;
    const unsigned char *head = (const unsigned char *)map;
    uint32_t fmt = (uint32_t)head[8] | (uint32_t)head[9] << 8 | (uint32_t)head[10] << 16
                   | (uint32_t)head[11] << 24;
    if (memcmp(head, CHANGES_MAGIC, 8) != 0 || fmt != CHANGES_FORMAT) {
        munmap(map, CHANGES_SIZE);
        return 0;
    }
    self->words = (const uint64_t *)map;
    return 1;
#endif
}

static int
ChangeWatch_init(ChangeWatch *self, PyObject *args, PyObject *kwds)
{
    PyObject *path;
    static char *kwlist[] = {"path", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "U:ChangeWatch", kwlist, &path))
        return -1;
    watch_unmap(self);
    Py_XSETREF(self->path, Py_NewRef(path));
    self->seen_seq = self->seen_epoch = UINT64_MAX;
    return watch_attach(self) < 0 ? -1 : 0;
}

static void
ChangeWatch_dealloc(ChangeWatch *self)
{
    watch_unmap(self);
    Py_CLEAR(self->path);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
ChangeWatch_attach(ChangeWatch *self, PyObject *Py_UNUSED(arg))
{
    if (self->path == NULL) {
        PyErr_SetString(PyExc_TypeError, "ChangeWatch is not initialised");
        return NULL;
    }
    int r = watch_attach(self);
    if (r < 0)
        return NULL;
    return PyBool_FromLong(r);
}

static PyObject *
ChangeWatch_read(ChangeWatch *self, PyObject *Py_UNUSED(arg))
{
    if (self->words == NULL)
        Py_RETURN_NONE;
    uint64_t seq, epoch;
    watch_load(self->words, &seq, &epoch);
    return Py_BuildValue("(KK)", (unsigned long long)seq, (unsigned long long)epoch);
}

static PyObject *
ChangeWatch_changed(ChangeWatch *self, PyObject *Py_UNUSED(arg))
{
    return PyBool_FromLong(watch_changed(self));
}

static PyObject *
ChangeWatch_close(ChangeWatch *self, PyObject *Py_UNUSED(arg))
{
    /* Unmapped only when freed: a getter of another thread may be reading it. */
    Py_RETURN_NONE;
}

static PyObject *
ChangeWatch_get_seen(ChangeWatch *self, void *Py_UNUSED(closure))
{
    if (self->seen_seq == UINT64_MAX && self->seen_epoch == UINT64_MAX)
        return Py_BuildValue("(ii)", -1, -1);
    return Py_BuildValue("(KK)", (unsigned long long)self->seen_seq,
                         (unsigned long long)self->seen_epoch);
}

static int
ChangeWatch_set_seen(ChangeWatch *self, PyObject *value, void *Py_UNUSED(closure))
{
    if (value == NULL || !PyTuple_Check(value) || PyTuple_GET_SIZE(value) != 2) {
        PyErr_SetString(PyExc_TypeError, "seen must be a (seq, epoch) tuple");
        return -1;
    }
    unsigned long long v[2];
    for (int i = 0; i < 2; i++) {
        PyObject *item = PyTuple_GET_ITEM(value, i);
        if (PyLong_Check(item) && PyLong_AsLongLong(item) == -1 && !PyErr_Occurred()) {
            v[i] = UINT64_MAX;
            continue;
        }
        PyErr_Clear();
        v[i] = PyLong_AsUnsignedLongLong(item);
        if (v[i] == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
    }
    self->seen_seq = v[0];
    self->seen_epoch = v[1];
    return 0;
}

static PyObject *
ChangeWatch_get_path(ChangeWatch *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(self->path != NULL ? self->path : Py_None);
}

/* changes_store(buffer, offset, value): value as a u64 at offset of a writable
 * buffer (the writer's CHANGES mapping), a release store: whatever was
 * written before it (the WAL record, the manifest) is visible to a reader
 * that sees it.  Python twin: struct.pack_into in lsmdb/changes.py. */
PyObject *
speedups_changes_store(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "changes_store(buffer, offset, value)");
        return NULL;
    }
    Py_ssize_t offset = PyLong_AsSsize_t(args[1]);
    if (offset == -1 && PyErr_Occurred())
        return NULL;
    unsigned long long value = PyLong_AsUnsignedLongLong(args[2]);
    if (value == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0)
        return NULL;
    if (offset < 0 || offset % 8 != 0 || offset + 8 > view.len
        || ((uintptr_t)view.buf & 7) != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "changes_store: an aligned u64 inside the buffer");
        return NULL;
    }
    uint64_t *word = (uint64_t *)((char *)view.buf + offset);
#if defined(__GNUC__) || defined(__clang__)
    __atomic_store_n(word, (uint64_t)value, __ATOMIC_RELEASE);
#else
    *(volatile uint64_t *)word = (uint64_t)value;
#endif
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyMethodDef ChangeWatch_methods[] = {
    {"attach", (PyCFunction)ChangeWatch_attach, METH_NOARGS,
     "attach($self, /)\n--\n\nMap the file if it is not mapped yet: whether it is now."},
    {"read", (PyCFunction)ChangeWatch_read, METH_NOARGS,
     "read($self, /)\n--\n\n(seq, epoch), seq read first; None while not mapped."},
    {"changed", (PyCFunction)ChangeWatch_changed, METH_NOARGS,
     "changed($self, /)\n--\n\nWhether the counters differ from seen (always, unmapped)."},
    {"close", (PyCFunction)ChangeWatch_close, METH_NOARGS,
     "close($self, /)\n--\n\nNothing: the mapping goes when the watch is freed."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ChangeWatch_getset[] = {
    {"seen", (getter)ChangeWatch_get_seen, (setter)ChangeWatch_set_seen,
     "(seq, epoch) last caught up to; (-1, -1) before any", NULL},
    {"path", (getter)ChangeWatch_get_path, NULL, "the CHANGES file", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject ChangeWatchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lsmdb._speedups.ChangeWatch",
    .tp_basicsize = sizeof(ChangeWatch),
    .tp_dealloc = (destructor)ChangeWatch_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ChangeWatch(path)\n--\n\n"
              "A follower's read-only view of a CHANGES file (lsmdb.changes.ChangeWatch).",
    .tp_init = (initproc)ChangeWatch_init,
    .tp_methods = ChangeWatch_methods,
    .tp_getset = ChangeWatch_getset,
    .tp_new = PyType_GenericNew,
};
