/* sstable_writer.c: block_cuts, where an SSTable builder cuts a chunk of
 * sorted entries into data blocks.  Python twin: lsmdb/sstable_writer.py's
 * block_cuts (the tests compare the two on the same chunks). */

#include "sstable_writer.h"
#include "keys.h"

/* The bytes a block's size estimate counts for each entry besides its key
 * and value (sstable_writer._ENTRY_OVERHEAD). */
#define CUT_ENTRY_OVERHEAD 4

PyObject *
speedups_block_cuts(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* block_cuts(keys, values, need, block_size) -> (cuts, bases, total):
     * lsmdb.sstable_writer.block_cuts. */
    if (nargs != 4 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "block_cuts(keys: list, values: list, need: int, block_size: int)");
        return NULL;
    }
    PyObject *keys = args[0], *values = args[1];
    long long need = PyLong_AsLongLong(args[2]), block_size = PyLong_AsLongLong(args[3]);
    if ((need == -1 || block_size == -1) && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (PyList_GET_SIZE(values) != n) {
        PyErr_SetString(PyExc_ValueError, "block_cuts: keys and values differ in length");
        return NULL;
    }
    PyObject *cuts = PyList_New(0), *bases = PyList_New(0);
    if (cuts == NULL || bases == NULL)
        goto fail;
    long long cum = 0, base = 0;
    PyObject *prev = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyList_GET_ITEM(keys, i), *v = PyList_GET_ITEM(values, i);
        if (PyTuple_CheckExact(v) && PyTuple_GET_SIZE(v) == 2)
            v = PyTuple_GET_ITEM(v, 0);  /* an expiring value: its bytes count */
        if (!PyBytes_CheckExact(k) || (v != Py_None && !PyBytes_CheckExact(v))) {
            PyErr_SetString(PyExc_TypeError, "block_cuts: keys bytes, values bytes or None");
            goto fail;
        }
        if (prev != NULL && bytes_cmp(prev, k) >= 0) {
            PyErr_SetString(PyExc_ValueError,
                            "SSTable keys must be added in strictly increasing order");
            goto fail;
        }
        prev = k;
        cum += PyBytes_GET_SIZE(k) + (v == Py_None ? 0 : PyBytes_GET_SIZE(v)) + CUT_ENTRY_OVERHEAD;
        if (cum >= base + need) {  /* the block ends after entry i */
            PyObject *c = PyLong_FromSsize_t(i + 1), *b = PyLong_FromLongLong(cum);
            int bad = c == NULL || b == NULL || PyList_Append(cuts, c) < 0
                      || PyList_Append(bases, b) < 0;
            Py_XDECREF(c);
            Py_XDECREF(b);
            if (bad)
                goto fail;
            base = cum;
            need = block_size;
        }
    }
    PyObject *out = Py_BuildValue("(NNL)", cuts, bases, cum);
    return out;
fail:
    Py_XDECREF(cuts);
    Py_XDECREF(bases);
    return NULL;
}
