/* filters_bloom.h: the Bloom family's probe, inline (filters.h dispatches to
 * it).  Python twin: lsmdb/filters/bloom.py -- probe_bit, the reference of
 * where a probe falls, and may_contain, the test; every C copy of that
 * arithmetic here must agree with it (the tests compare them).
 *
 * The layouts are the ones in docs/FORMAT.md §5: h = the key's 64-bit hash,
 * h1 = h & 0xFFFFFFFF, h2 = h >> 32, g_i = (h1 + i * h2) mod 2^32; probe i at
 * bit i * s + (g_i * s) >> 32 with s = m / k (family 2, partitioned) or at bit
 * (h1 + i * h2) mod m (family 1, the whole array); bit b of the array at byte
 * b >> 3, mask 1 << (b & 7).  The parameters Python hands over
 * (BloomFilter.probe_spec): (m, k, s). */

#ifndef LSMDB_FILTERS_BLOOM_H
#define LSMDB_FILTERS_BLOOM_H

#include "base.h"

/* A Bloom filter's probe parameters. */
typedef struct {
    uint64_t m;      /* bits */
    uint64_t k;      /* probes */
    uint64_t s;      /* family 2: the partition size m / k; family 1: 0 */
    uint64_t mod_M;  /* family 1: fastmod_M(m) */
} BloomParams;

/* The largest partition a family-2 filter has (MAX_PARTITION_BITS in Python). */
#define PART_MAX UINT64_C(0xFFFFFFFF)

/* h mod m; a 32-bit division when m fits (both halves of h always do). */
static inline uint64_t
mod_m(uint64_t h, uint64_t m)
{
    return m <= 0xFFFFFFFFu ? (uint64_t)((uint32_t)h % (uint32_t)m) : h % m;
}

/* a mod d without a division (Lemire, Kaser and Kurz, "Faster remainder by
 * direct computation", 2019): with M = floor((2^64 - 1) / d) + 1, computed once
 * per filter, a mod d = ((M * a mod 2^64) * d) >> 64, exact for every 32-bit a
 * and 32-bit d > 0.  Where there is no 128-bit product, or d does not fit in
 * 32 bits (M == 0 marks it), it divides. */
static inline uint64_t
fastmod_M(uint64_t d)
{
#if defined(__SIZEOF_INT128__)
    return (d && d <= 0xFFFFFFFFu) ? UINT64_C(0xFFFFFFFFFFFFFFFF) / d + 1 : 0;
#else
    (void)d;
    return 0;
#endif
}

static inline uint64_t
fastmod(uint64_t a, uint64_t d, uint64_t M)
{
#if defined(__SIZEOF_INT128__)
    if (M && d > 1 && a <= 0xFFFFFFFFu)
        return (uint64_t)(((unsigned __int128)(M * a) * d) >> 64);
#else
    (void)M;
#endif
    return a <= 0xFFFFFFFFu ? mod_m(a, d) : a % d;
}

/* The offset of g's probe inside a partition of s bits (family 2):
 * (g * s) >> 32, as probe_bit has it.  A family-2 filter has s < 2^32 (larger
 * ones take more probes), so the product fits 64 bits: one multiply.  With a
 * 128-bit product the filter step of a table that fits the caches measured
 * 8-10% slower than the whole-array layout's; with this one, the same. */
static inline uint64_t
part_pos(uint32_t g, uint64_t s)
{
    return ((uint64_t)g * s) >> 32;
}

/* Whether every probe bit of hash h is set in a family-2 filter: probe i
 * tests bit i*s + part_pos(g_i, s) of partition i.  The first two probes
 * decide together (they are the lines the gathered probes prefetch, in the
 * first two partitions, the part of every filter every absent key touches):
 * one branch, right three times in four on an absent key, where a branch per
 * probe is a coin toss.  Then, only if both are set, the rest: also for
 * get_many, which tests one filter for many keys in a row, where loading all
 * k and letting one branch decide is slower on absent keys. */
static inline int
bloom_part_maybe(const BloomParams *b, const unsigned char *bits, uint64_t h)
{
    uint64_t s = b->s, base = 0;
    uint32_t g = (uint32_t)h, h2 = (uint32_t)(h >> 32);
    uint64_t pos = part_pos(g, s);
    unsigned all = bits[pos >> 3] >> (pos & 7);
    uint64_t i = 1;
    if (b->k > 1) {
        g += h2;
        base = s;
        pos = base + part_pos(g, s);
        all &= bits[pos >> 3] >> (pos & 7);
        i = 2;
    }
    if (!(all & 1))
        return 0;
    for (; i < b->k; i++) {
        g += h2;
        base += s;
        pos = base + part_pos(g, s);
        all &= bits[pos >> 3] >> (pos & 7);
    }
    return (int)(all & 1);
}

/* bloom_part_maybe for a family-1 filter: probe i at (h1 + i*h2) mod m. */
static inline int
bloom_whole_maybe(const BloomParams *b, const unsigned char *bits, uint64_t h)
{
    uint64_t m = b->m;
    uint64_t pos = fastmod(h & 0xFFFFFFFFu, m, b->mod_M), step = fastmod(h >> 32, m, b->mod_M);
    unsigned all = bits[pos >> 3] >> (pos & 7);
    uint64_t i = 1;
    if (b->k > 1) {
        pos += step;
        pos = pos >= m ? pos - m : pos;
        all &= bits[pos >> 3] >> (pos & 7);
        i = 2;
    }
    if (!(all & 1))
        return 0;
    for (; i < b->k; i++) {
        pos += step;
        pos = pos >= m ? pos - m : pos;
        all &= bits[pos >> 3] >> (pos & 7);
    }
    return (int)(all & 1);
}

/* Start loading the lines of the first `lines` probes (at most k) of hash h
 * in a family-2 filter. */
PREFETCH_HELPER
bloom_part_prefetch(const BloomParams *b, const unsigned char *bits, uint64_t h, uint64_t lines)
{
    uint32_t g0 = (uint32_t)h, h2 = (uint32_t)(h >> 32);
    uint64_t base = 0;
    if (lines > b->k)
        lines = b->k;
    for (uint64_t q = 0; q < lines; q++, g0 += h2, base += b->s)
        PREFETCH(bits + ((base + part_pos(g0, b->s)) >> 3));
}

/* The same for a family-1 filter: its first two probes. */
PREFETCH_HELPER
bloom_whole_prefetch(const BloomParams *b, const unsigned char *bits, uint64_t h)
{
    uint64_t pos = fastmod(h & 0xFFFFFFFFu, b->m, b->mod_M);
    uint64_t step = fastmod(h >> 32, b->m, b->mod_M);
    PREFETCH(bits + (pos >> 3));
    pos += step;
    if (pos >= b->m)
        pos -= b->m;
    PREFETCH(bits + (pos >> 3));
}

HIDDEN_BEGIN

/* filters_bloom.c */
int check_part(uint64_t s, uint64_t m, uint64_t k);
int bloom_params_init(BloomParams *b, int family, PyObject *params, Py_ssize_t data_len);
PyObject *speedups_bloom_add(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *speedups_fastmod(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

HIDDEN_END

#endif
