/* logset.c: encode_ops, the WAL record payload of a batch that goes to one
 * table, byte for byte what msgpack writes, and encode_one, that of a single
 * put or delete (the C put, writepath.c).  Python twin: lsmdb/logset.py's
 * encode_record (encode_table_record calls this where it is built). */

#include "logset.h"

/* ---- encode_ops: a WAL record payload of one table's batch --------------- */

/* msgpack of one unsigned int, the smallest form (as msgpack.packb writes it). */
static unsigned char *
mp_uint(unsigned char *p, uint64_t v)
{
    if (v <= 0x7F) {
        *p++ = (unsigned char)v;
    } else if (v <= 0xFF) {
        *p++ = 0xCC;
        *p++ = (unsigned char)v;
    } else if (v <= 0xFFFF) {
        *p++ = 0xCD;
        *p++ = (unsigned char)(v >> 8);
        *p++ = (unsigned char)v;
    } else if (v <= 0xFFFFFFFFu) {
        *p++ = 0xCE;
        for (int s = 24; s >= 0; s -= 8)
            *p++ = (unsigned char)(v >> s);
    } else {
        *p++ = 0xCF;
        for (int s = 56; s >= 0; s -= 8)
            *p++ = (unsigned char)(v >> s);
    }
    return p;
}

/* msgpack header of an array of n items. */
static unsigned char *
mp_array(unsigned char *p, size_t n)
{
    if (n <= 15) {
        *p++ = (unsigned char)(0x90 | n);
    } else if (n <= 0xFFFF) {
        *p++ = 0xDC;
        *p++ = (unsigned char)(n >> 8);
        *p++ = (unsigned char)n;
    } else {
        *p++ = 0xDD;
        for (int s = 24; s >= 0; s -= 8)
            *p++ = (unsigned char)(n >> s);
    }
    return p;
}

/* msgpack bin of b (bytes). */
static unsigned char *
mp_bin(unsigned char *p, PyObject *b)
{
    size_t n = (size_t)PyBytes_GET_SIZE(b);
    if (n <= 0xFF) {
        *p++ = 0xC4;
        *p++ = (unsigned char)n;
    } else if (n <= 0xFFFF) {
        *p++ = 0xC5;
        *p++ = (unsigned char)(n >> 8);
        *p++ = (unsigned char)n;
    } else {
        *p++ = 0xC6;
        for (int s = 24; s >= 0; s -= 8)
            *p++ = (unsigned char)(n >> s);
    }
    memcpy(p, PyBytes_AS_STRING(b), n);
    return p + n;
}

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
    size_t tidlen = (size_t)(mp_uint(tidbuf, tid) - tidbuf);
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
    p = mp_uint(p, seq);
    p = mp_array(p, (size_t)n);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        *p++ = 0x93;
        memcpy(p, tidbuf, tidlen);
        p += tidlen;
        p = mp_bin(p, PyList_GET_ITEM(keys, i));
        if (v == Py_None) {
            *p++ = 0xC0;
        } else if (PyTuple_CheckExact(v)) {
            *p++ = 0x92;
            p = mp_bin(p, PyTuple_GET_ITEM(v, 0));
            p = mp_uint(p, PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(v, 1)));
        } else {
            p = mp_bin(p, v);
        }
    }
    if (_PyBytes_Resize(&out, (Py_ssize_t)(p - start)) < 0)
        return NULL;
    return out;
}

/* ---- encode_one: the payload of one put or delete ------------------------ */

static size_t
mp_uint_size(uint64_t v)
{
    return v <= 0x7F ? 1 : v <= 0xFF ? 2 : v <= 0xFFFF ? 3 : v <= 0xFFFFFFFFu ? 5 : 9;
}

static size_t
mp_bin_size(size_t n)
{
    return n + (n <= 0xFF ? 2 : n <= 0xFFFF ? 3 : 5);
}

size_t
encode_one_size(uint64_t seq, uint64_t tid, PyObject *key, PyObject *value)
{
    /* [seq, [[tid, key, value]]]: 0x92, seq, 0x91, 0x93, tid, key, value */
    return 3 + mp_uint_size(seq) + mp_uint_size(tid) + mp_bin_size((size_t)PyBytes_GET_SIZE(key))
           + (value == Py_None ? 1 : mp_bin_size((size_t)PyBytes_GET_SIZE(value)));
}

unsigned char *
encode_one(unsigned char *p, uint64_t seq, uint64_t tid, PyObject *key, PyObject *value)
{
    *p++ = 0x92;
    p = mp_uint(p, seq);
    *p++ = 0x91;
    *p++ = 0x93;
    p = mp_uint(p, tid);
    p = mp_bin(p, key);
    if (value == Py_None)
        *p++ = 0xC0;
    else
        p = mp_bin(p, value);
    return p;
}
