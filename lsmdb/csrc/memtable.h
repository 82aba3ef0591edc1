/* memtable.h: MemFilter, a filter over a memtable's keys, so that a get
 * skips the memtable's dict for keys it does not hold (memtable.c; no
 * Python twin: without it a get asks the dict), and apply_columns, a
 * batch's step into a memtable (twin: Memtable.apply_columns). */

#ifndef LSMDB_MEMTABLE_H
#define LSMDB_MEMTABLE_H

#include "base.h"

/* A Bloom filter over a memtable's keys (memtable.c): a key sets MF_K bits
 * of one 512-bit line. */
#define MF_K 6

/* lsmdb/memtable.py's size accounting (checked against it through
 * WRITE_PATH_CONSTANTS, module.c). */
#define MEM_ENTRY_OVERHEAD_BYTES 64      /* memtable.ENTRY_OVERHEAD_BYTES */
#define MEM_EXPIRING_OVERHEAD_BYTES 88   /* memtable.EXPIRING_OVERHEAD_BYTES */

typedef struct {
    PyObject_HEAD
    PyObject *data;      /* the memtable's dict */
    uint64_t *lines;     /* nlines lines of 8 words, 64-byte aligned in raw */
    void *raw;
    uint64_t nlines;
    Py_ssize_t capacity; /* keys it is sized for */
    Py_ssize_t count;    /* keys it holds: the first `count` of hashes */
    uint64_t *hashes;    /* each key's hash, in the order added, to resize from */
    Py_ssize_t hcap;     /* room in hashes */
} MemFilter;

/* The bytes a memtable value counts for in its size (memtable.value_size; a
 * tombstone 0): 0, or -1 with a TypeError for what a memtable cannot hold. */
static inline int
mem_value_size(PyObject *v, long long *size)
{
    if (v == Py_None) {
        *size = 0;
    } else if (PyBytes_CheckExact(v)) {
        *size = PyBytes_GET_SIZE(v);
    } else if (PyTuple_CheckExact(v) && PyTuple_GET_SIZE(v) == 2
               && PyBytes_CheckExact(PyTuple_GET_ITEM(v, 0))) {
        *size = PyBytes_GET_SIZE(PyTuple_GET_ITEM(v, 0)) + MEM_EXPIRING_OVERHEAD_BYTES;
    } else {
        PyErr_SetString(PyExc_TypeError, "a memtable value is bytes, None or (bytes, int)");
        return -1;
    }
    return 0;
}

HIDDEN_BEGIN

extern PyTypeObject MemFilterType;

/* The n keys of items (bytes) are about to enter the filter's dict: 0, or -1
 * with an exception set (a key not bytes: nothing added). */
int mf_add(MemFilter *self, PyObject *const *items, Py_ssize_t n);

/* apply_columns(data, tags, filter, pending, seq, keys, values) -> (grow,
 * expiring): Memtable.apply_columns's step in C (memtable.c). */
PyObject *speedups_apply_columns(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

HIDDEN_END

static inline uint64_t *
mf_line(uint64_t *lines, uint64_t nlines, uint64_t h)
{
    return lines + 8 * (((h >> 32) * nlines) >> 32);
}

/* 0: no key of the filter hashes to h; 1: maybe. */
static inline int
mf_test(const MemFilter *mf, uint64_t h)
{
    const uint64_t *line = mf_line(mf->lines, mf->nlines, h);
    uint64_t g = h * UINT64_C(0x9E3779B97F4A7C15);
    for (int i = 0; i < MF_K; i++) {
        unsigned b = (unsigned)(g >> (9 * i)) & 511;
        if (!(line[b >> 6] & (UINT64_C(1) << (b & 63))))
            return 0;
    }
    return 1;
}

#endif
