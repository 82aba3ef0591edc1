/* logset.c: encode_ops, the WAL record payload of a batch that goes to one
 * table, byte for byte what msgpack writes, and encode_one, that of a single
 * put or delete (the C put, writepath.c).  Python twin: lsmdb/logset.py's
 * encode_record (encode_table_record calls this where it is built). */

#include "logset.h"
#include "mpack.h"

/* ---- encode_ops: a WAL record payload of one table's batch --------------- */

PyObject *
speedups_encode_ops(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* encode_ops(seq, table_id, keys, values) -> the same bytes as
     * msgpack.packb([seq, [[table_id, keys[i], values[i]], ...]], use_bin_type=True):
     * keys a list of bytes, values a list of bytes, None or (bytes, expires)
     * tuples (packed as [bin, uint]), of the same length;
     * seq and table_id ints in [0, 2**64). */
    if (nargs != 4 || !PyList_CheckExact(args[2]) || !PyList_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "encode_ops(seq, table_id, keys: list, values: list)");
        return NULL;
    }
    unsigned long long seq = PyLong_AsUnsignedLongLong(args[0]);
    if (seq == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    unsigned long long tid = PyLong_AsUnsignedLongLong(args[1]);
    if (tid == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    PyObject *keys = args[2], *values = args[3];
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (PyList_GET_SIZE(values) != n || (uint64_t)n > 0xFFFFFFFFu) {
        PyErr_SetString(PyExc_ValueError, "keys and values must have the same length");
        return NULL;
    }
    unsigned char tidbuf[9];
    size_t tidlen = (size_t)(mpw_uint(tidbuf, tid) - tidbuf);
    size_t total = 1 + 9 + 5;  /* [seq, ops] headers */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyList_GET_ITEM(keys, i), *v = PyList_GET_ITEM(values, i);
        if (PyTuple_CheckExact(v)) {  /* an expiring value: (bytes, expires) */
            if (PyTuple_GET_SIZE(v) != 2 || !PyBytes_CheckExact(PyTuple_GET_ITEM(v, 0))
                || !PyLong_CheckExact(PyTuple_GET_ITEM(v, 1))) {
                PyErr_SetString(PyExc_TypeError, "an expiring value is (bytes, int)");
                return NULL;
            }
            unsigned long long e = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(v, 1));
            if (e == (unsigned long long)-1 && PyErr_Occurred())
                return NULL;
            total += 1 + 9;  /* [value, expires]: the array header, the uint */
            v = PyTuple_GET_ITEM(v, 0);
        }
        if (!PyBytes_CheckExact(k) || (v != Py_None && !PyBytes_CheckExact(v))) {
            PyErr_SetString(PyExc_TypeError, "keys must be bytes and values bytes or None");
            return NULL;
        }
        if ((uint64_t)PyBytes_GET_SIZE(k) > 0xFFFFFFFFu
            || (v != Py_None && (uint64_t)PyBytes_GET_SIZE(v) > 0xFFFFFFFFu)) {
            PyErr_SetString(PyExc_ValueError, "a key or value too long for msgpack");
            return NULL;
        }
        total += 1 + tidlen + 5 + (size_t)PyBytes_GET_SIZE(k)
                 + (v == Py_None ? 1 : 5 + (size_t)PyBytes_GET_SIZE(v));
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (out == NULL)
        return NULL;
    unsigned char *start = (unsigned char *)PyBytes_AS_STRING(out), *p = start;
    *p++ = 0x92;
    p = mpw_uint(p, seq);
    p = mpw_array(p, (size_t)n);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        *p++ = 0x93;
        memcpy(p, tidbuf, tidlen);
        p += tidlen;
        p = mpw_bin(p, PyList_GET_ITEM(keys, i));
        if (v == Py_None) {
            *p++ = 0xC0;
        } else if (PyTuple_CheckExact(v)) {
            *p++ = 0x92;
            p = mpw_bin(p, PyTuple_GET_ITEM(v, 0));
            p = mpw_uint(p, PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(v, 1)));
        } else {
            p = mpw_bin(p, v);
        }
    }
    if (_PyBytes_Resize(&out, (Py_ssize_t)(p - start)) < 0)
        return NULL;
    return out;
}

/* ---- encode_one: the payload of one put or delete ------------------------ */

size_t
encode_one_size(uint64_t seq, uint64_t tid, PyObject *key, PyObject *value)
{
    /* [seq, [[tid, key, value]]]: 0x92, seq, 0x91, 0x93, tid, key, value */
    return 3 + mpw_uint_size(seq) + mpw_uint_size(tid) + mpw_bin_size((size_t)PyBytes_GET_SIZE(key))
           + (value == Py_None ? 1 : mpw_bin_size((size_t)PyBytes_GET_SIZE(value)));
}

unsigned char *
encode_one(unsigned char *p, uint64_t seq, uint64_t tid, PyObject *key, PyObject *value)
{
    *p++ = 0x92;
    p = mpw_uint(p, seq);
    *p++ = 0x91;
    *p++ = 0x93;
    p = mpw_uint(p, tid);
    p = mpw_bin(p, key);
    if (value == Py_None)
        *p++ = 0xC0;
    else
        p = mpw_bin(p, value);
    return p;
}
