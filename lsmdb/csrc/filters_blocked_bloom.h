/* filters_blocked_bloom.h: the blocked Bloom family's probe, inline
 * (filters.h dispatches to it).  Python twin: lsmdb/filters/blocked_bloom.py
 * -- block_of and block_positions say where a probe falls, may_contain is the
 * test; the tests compare the two.
 *
 * The layout (docs/FORMAT.md §5): blocks of 512 bits; a key of 64-bit hash h
 * probes block ((h >> 32) * blocks) >> 32, and in it the bits x_i >> 23 for
 * x_0 = h & 0xFFFFFFFF, x_i+1 = x_i * 0x9E3779B9 mod 2^32; bit b of the array
 * at byte b >> 3, mask 1 << (b & 7).  The parameters Python hands over
 * (BlockedBloomFilter.probe_spec): (blocks, k). */

#ifndef LSMDB_FILTERS_BLOCKED_BLOOM_H
#define LSMDB_FILTERS_BLOCKED_BLOOM_H

#include "base.h"

#define BLOCKED_BLOCK_BYTES 64
#define BLOCKED_MULTIPLIER UINT32_C(0x9E3779B9)
#define BLOCKED_MAX_BLOCKS UINT64_C(0xFFFFFFFF)

/* A blocked Bloom filter's probe parameters. */
typedef struct {
    uint64_t blocks;  /* 512-bit blocks, 1 to 2^32 - 1 */
    uint64_t k;       /* probes, all in one block */
} BlockedParams;

/* The first byte of the block hash h probes. */
static inline const unsigned char *
blocked_block(const BlockedParams *b, const unsigned char *bits, uint64_t h)
{
    return bits + (((h >> 32) * b->blocks) >> 32) * BLOCKED_BLOCK_BYTES;
}

/* Whether every probe bit of hash h is set: k bits of one block, tested
 * together (no branch per probe: the block is one line, loaded once). */
static inline int
blocked_maybe(const BlockedParams *b, const unsigned char *bits, uint64_t h)
{
    const unsigned char *blk = blocked_block(b, bits, h);
    uint32_t x = (uint32_t)h;
    unsigned all = 1;
    for (uint64_t i = 0; i < b->k; i++, x *= BLOCKED_MULTIPLIER) {
        uint32_t p = x >> 23;
        all &= (unsigned)blk[p >> 3] >> (p & 7);
    }
    return (int)(all & 1);
}

/* Start loading the block hash h probes. */
PREFETCH_HELPER
blocked_prefetch(const BlockedParams *b, const unsigned char *bits, uint64_t h)
{
    PREFETCH(blocked_block(b, bits, h));
}

HIDDEN_BEGIN

/* filters_blocked_bloom.c */
int blocked_params_init(BlockedParams *b, PyObject *params, Py_ssize_t data_len);
PyObject *speedups_blocked_bloom_add(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *speedups_blocked_bloom_fill(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

HIDDEN_END

#endif
