/* filters_blocked_bloom.c: the blocked Bloom family's parameters checked, the
 * setting of many keys' bits (blocked_bloom_add) and what its bits say
 * (blocked_bloom_fill); its probe is inline, in filters_blocked_bloom.h.
 * Python twin: lsmdb/filters/blocked_bloom.py (probe_spec, add_hashes,
 * _fill_counts). */

#include <math.h>

#include "filters.h"

/* The bits set in x (a portable popcount). */
static inline unsigned
ones64(uint64_t x)
{
    x -= (x >> 1) & UINT64_C(0x5555555555555555);
    x = (x & UINT64_C(0x3333333333333333)) + ((x >> 2) & UINT64_C(0x3333333333333333));
    x = (x + (x >> 4)) & UINT64_C(0x0F0F0F0F0F0F0F0F);
    return (unsigned)((x * UINT64_C(0x0101010101010101)) >> 56);
}

/* b from the parameters (blocks, k) of a blocked Bloom filter whose bit
 * array holds data_len bytes: 0, or -1 with an exception set. */
int
blocked_params_init(BlockedParams *b, PyObject *params, Py_ssize_t data_len)
{
    unsigned long long blocks, k;
    if (!PyTuple_Check(params)
        || !PyArg_ParseTuple(params, "KK:blocked Bloom parameters (blocks, k)", &blocks, &k))
        return -1;
    if (blocks == 0 || blocks > BLOCKED_MAX_BLOCKS || k == 0 || k > 64) {
        PyErr_SetString(PyExc_ValueError,
                        "a blocked Bloom filter needs 1 to 2^32 - 1 blocks and 0 < k <= 64");
        return -1;
    }
    if ((uint64_t)data_len / BLOCKED_BLOCK_BYTES < blocks) {
        PyErr_SetString(PyExc_ValueError, "filter bit array shorter than its blocks");
        return -1;
    }
    b->blocks = blocks;
    b->k = k;
    return 0;
}

/* The bits of hash h's k probes set (blocked_bloom.py's positions). */
static inline void
blocked_set_hash(const BlockedParams *b, unsigned char *bits, uint64_t h)
{
    unsigned char *blk = (unsigned char *)blocked_block(b, bits, h);
    uint32_t x = (uint32_t)h;
    for (uint64_t i = 0; i < b->k; i++, x *= BLOCKED_MULTIPLIER) {
        uint32_t p = x >> 23;
        blk[p >> 3] |= (unsigned char)(1u << (p & 7));
    }
}

/* (blocks, k) and the writable bit array of a call's first three arguments:
 * 0, or -1 with an exception set (nothing held). */
static int
blocked_args(PyObject *const *args, int writable, BlockedParams *b, Py_buffer *view)
{
    unsigned long long blocks = PyLong_AsUnsignedLongLong(args[1]);
    if (blocks == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    unsigned long long k = PyLong_AsUnsignedLongLong(args[2]);
    if (k == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    if (PyObject_GetBuffer(args[0], view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0)
        return -1;
    PyObject *params = Py_BuildValue("(KK)", blocks, k);
    int r = params == NULL ? -1 : blocked_params_init(b, params, view->len);
    Py_XDECREF(params);
    if (r < 0)
        PyBuffer_Release(view);
    return r;
}

PyObject *
speedups_blocked_bloom_add(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* blocked_bloom_add(bits, blocks, k, hashes): for each 64-bit hash (a
     * sequence of ints, or a buffer of native unsigned 64-bit words -- an
     * array('Q'); hash_words_get), without the GIL, set the bits of its k probes.  The
     * same bits as BlockedBloomFilter.add_hashes in Python. */
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "blocked_bloom_add(bits, blocks, k, hashes)");
        return NULL;
    }
    HashWords w;
    if (hash_words_get(args[3], &w) < 0)
        return NULL;
    BlockedParams b;
    Py_buffer view;
    if (blocked_args(args, 1, &b, &view) < 0) {
        hash_words_release(&w);
        return NULL;
    }
    unsigned char *bits = (unsigned char *)view.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < w.count; j++) {
        uint64_t h;
        memcpy(&h, w.words + 8 * j, 8);  /* native order; the buffer may be unaligned */
        blocked_set_hash(&b, bits, h);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    hash_words_release(&w);
    Py_RETURN_NONE;
}

PyObject *
speedups_blocked_bloom_fill(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* blocked_bloom_fill(bits, blocks, k) -> (bits set, mean over blocks of
     * (bits set in the block / 512)^k), as BlockedBloomFilter._fill_counts. */
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "blocked_bloom_fill(bits, blocks, k)");
        return NULL;
    }
    BlockedParams b;
    Py_buffer view;
    if (blocked_args(args, 0, &b, &view) < 0)
        return NULL;
    const unsigned char *bits = (const unsigned char *)view.buf;
    unsigned long long total = 0;
    double rate = 0.0;
    Py_BEGIN_ALLOW_THREADS
    for (uint64_t i = 0; i < b.blocks; i++) {
        unsigned ones = 0;
        for (int w = 0; w < BLOCKED_BLOCK_BYTES / 8; w++) {
            uint64_t word;
            memcpy(&word, bits + i * BLOCKED_BLOCK_BYTES + 8 * w, 8);
            ones += ones64(word);
        }
        total += ones;
        rate += pow(ones / 512.0, (double)b.k);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return Py_BuildValue("(Kd)", total, rate / (double)b.blocks);
}
