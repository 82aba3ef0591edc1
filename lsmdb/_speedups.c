/* lsmdb._speedups: the hot per-key and per-file steps of lsmdb, in C.
 *
 * Optional: lsmdb works without it (the same logic runs in Python, and the
 * tests run both and compare answers and counters).  What is here:
 *
 *   Probes      a get's range checks and filter probes, file by file
 *   Getter      the whole db.get (block-cache hits, a block read from disk
 *               and its key walk) and the memtable/filter steps of get_many
 *   Merge       the k-way merge of scans and compactions
 *   MemFilter   a Bloom filter of a memtable's keys, so that a get skips the
 *               memtable's dict for keys it does not hold
 *   Admission   which blocks read from disk a full block cache takes in
 *   Cache       the block cache's books (lsmdb/cache.py's BlockCache)
 *   crc32       zlib's CRC-32, folded with PCLMULQDQ where the CPU has it
 *   xxh3_64     the filters' key hash, for keys up to 240 bytes
 *   block_may_hold, block_find, block_entry, entry_find, encode_ops,
 *               bloom_add: a data block's keys walked in place (a false
 *               positive; a value from a block read), the block cache's form
 *               of a block and a lookup in it, a one-table WAL record, filter
 *               bits set
 *
 * For each SSTable a get consults it does what the Python read path does,
 * in the same order:
 *
 *   key range check            -> counts[RANGE_SKIPS] += 1 when outside
 *   Bloom filter probe         -> counts[FILTER_NEGATIVES] += 1 on a "no"
 *   "maybe" (or no filter)     -> the one data block: from the cache, or
 *                                 read, checked and walked here
 *
 * The filter layouts are the ones in docs/FORMAT.md: h = xxh3_64(key) (or the
 * table's keyed hash), h1 = h & 0xFFFFFFFF, h2 = h >> 32, g_i = (h1 + i * h2)
 * mod 2^32; probe i at bit i * s + (g_i * s) >> 32 with s = m / k (format 2,
 * partitioned) or at bit (h1 + i * h2) mod m (format 1); bit b of the array
 * at byte b >> 3, mask 1 << (b & 7).
 * The hashes are computed at most once per key and reused for every file,
 * also across calls that resume after a false positive (the last key and
 * its hashes are kept, compared by identity while a reference is held).
 *
 * Probes(l0, deeper, fast_hash)
 *   l0:     sequence of file entries, newest first
 *   deeper: sequence of (max_keys, entries) per level >= 1, sorted by key
 *   entry:  (counts, min_key, max_key, bits, m, k, keyed_fn, index_keys
 *            [, index_offsets, index_sizes[, part]])
 *           counts: array('Q') of the file's counters (sstable_reader.FILE_COUNTERS)
 *           bits:   the filter's bit array (any buffer), None when m == 0
 *           keyed_fn: None for xxh3_64, else the keyed hash function
 *           index_keys, index_offsets, index_sizes: the file's index
 *           part:   s, the partition size of a format-2 filter; 0 (the
 *                   default): format 1
 *   fast_hash: xxh3_64 (an int in [0, 2**64) for every key); given this
 *           module's xxh3_64, the probes compute it inline
 *   prefetch_all_bytes (keyword only): the filter bytes in all above which
 *           lookups start loading every probe's line up front (prefetch_all);
 *           default FILTER_PREFETCH_BYTES, the L2 cache's size
 * Probes.first(key, start) -> index of the first file at or after flat
 *   index `start` (level-0 files, then the deeper levels' files in order)
 *   whose range holds key and whose filter says "maybe"; -1 when none.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <limits.h>
#ifndef _WIN32
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

#define RANGE_SKIPS 0
#define FILTER_NEGATIVES 1
#define TRUE_POSITIVES 2
#define FALSE_POSITIVES 3
#define BLOCK_CACHE_HITS 6
#define MIN_COUNTERS 7

/* A function whose only effect is PREFETCH has none the compiler counts: it
 * may drop every call of one it does not inline.  Such helpers are
 * PREFETCH_HELPER, always inlined. */
#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch(p)
#define PREFETCH_HELPER static inline __attribute__((always_inline)) void
#else
#define PREFETCH(p) ((void)(p))
#define PREFETCH_HELPER static inline void
#endif

typedef struct {
    PyObject *lo;        /* bytes */
    PyObject *hi;        /* bytes */
    PyObject *kf;        /* NULL: the fast hash */
    Py_buffer bits;      /* valid when m > 0 */
    Py_buffer counts;    /* array('Q') */
    char *ikeys;         /* the index keys (last key of each block), back to back */
    Py_ssize_t *ioff;    /* nidx + 1 offsets into ikeys */
    Py_ssize_t nidx;
    Py_ssize_t icp;      /* how many leading bytes all the index keys share */
    uint64_t *ipre;      /* each index key's next 8 bytes after those (bisect_index) */
    uint64_t *itop;      /* ipre's last word of each group of INDEX_GROUP */
    uint64_t *boff;      /* NULL, or each data block's offset and size in the file */
    uint64_t *bsize;
    uint64_t m;
    uint64_t mod_M;      /* fastmod_M(m) */
    uint64_t part;       /* s = m / k of a partitioned (format 2) filter; 0: format 1 */
    Py_ssize_t k;
    int have_bits;
    int have_counts;
} Entry;

typedef struct {
    PyObject_HEAD
    Entry *e;
    Py_ssize_t n;         /* entries in all */
    Py_ssize_t n0;        /* level-0 entries */
    Py_ssize_t nlevels;
    Py_ssize_t *off;      /* nlevels + 1 offsets of each level's entries */
    PyObject **max_keys;  /* per level: tuple of bytes */
    Py_ssize_t *cp;       /* per level: how many leading bytes all its max keys share */
    uint64_t **pre;       /* per level: each max key's next 8 bytes after those (level_pick) */
    PyObject *fast_hash;
    /* The last key hashed, held, and its hashes. */
    PyObject *last_key;
    PyObject *last_kf;    /* borrowed from an entry (entries hold it) */
    uint64_t last_fast;
    uint64_t last_keyed;
    int have_fast;
    int have_keyed;
    uint64_t filter_bytes; /* the bytes of all the files' filters */
    char prefetch_all;    /* filter_bytes > prefetch_all_bytes: gather_start loads every probe's line */
    int native_hash;      /* fast_hash is xxh3_64 below: computed inline */
    int has_keyed;        /* some filter uses a keyed hash */
} Probes;

/* Filters larger than this in all (the L2 cache's size where the system
 * tells it, else 1 MiB) are taken to be mostly out of the L2 cache, so
 * gather_start starts to load the lines of all k probes of each filter, not
 * only the first two (set at import). */
static uint64_t prefetch_all_bytes = 1 << 20;

/* Files a lookup can consult (level-0 files plus one per level) up to which
 * probes_first gathers them all first and starts loading their filter lines
 * before testing any (probes_gather). */
#define MAX_GATHER 64

/* Index words per group in bisect_index's two steps: 32 words, four cache
 * lines. */
#define INDEX_GROUP 32

/* memcmp-then-length order of a[0:la] and b[0:lb] (bytes order), inline:
 * keys are short, and a call to memcmp costs more than comparing them. */
static inline int
mem_order(const char *a, Py_ssize_t la, const char *b, Py_ssize_t lb)
{
    const unsigned char *p = (const unsigned char *)a, *q = (const unsigned char *)b;
    Py_ssize_t n = la < lb ? la : lb, i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x, y;
        memcpy(&x, p + i, 8);
        memcpy(&y, q + i, 8);
        if (x != y) {
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
            x = __builtin_bswap64(x);
            y = __builtin_bswap64(y);
#endif
            return x < y ? -1 : 1;
        }
    }
    if (i < n && n >= 8) {
        /* The last 8 bytes of the shorter, overlapping bytes already found
         * equal: one more word instead of a branch per byte. */
        uint64_t x, y;
        memcpy(&x, p + n - 8, 8);
        memcpy(&y, q + n - 8, 8);
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        x = __builtin_bswap64(x);
        y = __builtin_bswap64(y);
#endif
        if (x != y)
            return x < y ? -1 : 1;
        i = n;
    }
    for (; i < n; i++)
        if (p[i] != q[i])
            return p[i] < q[i] ? -1 : 1;
    return (la > lb) - (la < lb);
}

static inline int
bytes_cmp(PyObject *a, PyObject *b)
{
    return mem_order(PyBytes_AS_STRING(a), PyBytes_GET_SIZE(a), PyBytes_AS_STRING(b),
                     PyBytes_GET_SIZE(b));
}

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

/* The offset of g's probe inside a partition of s bits (format 2):
 * (g * s) >> 32.  A format-2 filter has s < 2^32 (larger ones are written in
 * format 1), so the product fits 64 bits: one multiply.  With a 128-bit
 * product the filter step of a table that fits the caches measured 8-10%
 * slower than format 1's; with this one, the same. */
#define PART_MAX UINT64_C(0xFFFFFFFF)
static inline uint64_t
part_pos(uint32_t g, uint64_t s)
{
    return ((uint64_t)g * s) >> 32;
}

/* 0 when s (0: format 1) is a valid partition size for m bits and k probes:
 * the k partitions inside the m bits and each under 2^32 bits; else -1 with
 * ValueError set. */
static int
check_part(uint64_t s, uint64_t m, Py_ssize_t k)
{
    if (s && (k <= 0 || s > m / (uint64_t)k || s > PART_MAX)) {
        PyErr_SetString(PyExc_ValueError, "partition size beyond m / k or 2^32 - 1");
        return -1;
    }
    return 0;
}

/* ---- xxh3_64: the filters' key hash ------------------------------------- */

/* XXH3-64 with seed 0 (xxHash by Yann Collet, BSD 2-Clause; the algorithm
 * and this default secret are those of its specification, doc/xxhash_spec.md),
 * for inputs up to 240 bytes; longer ones go to the xxhash package.  Filters
 * on disk are probed with this hash, so it must equal
 * xxhash.xxh3_64_intdigest bit for bit: tests/test_speedups.py compares the
 * two on every length from 0 to 300 bytes.  Calling it from C skips the
 * argument parsing and the int object of a call into the package (about
 * 40 ns of an absent get's 250). */

static const unsigned char xxh3_secret[192] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c,
    0xf7, 0x21, 0xad, 0x1c, 0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb,
    0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e,
    0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6,
    0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb,
    0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97,
    0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7,
    0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31,
    0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83,
    0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26,
    0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc,
    0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f,
    0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

#define XXH_PRIME64_1 UINT64_C(0x9E3779B185EBCA87)
#define XXH_PRIME64_2 UINT64_C(0xC2B2AE3D27D4EB4F)
#define XXH_PRIME64_3 UINT64_C(0x165667B19E3779F9)
#define XXH_PRIME_MX1 UINT64_C(0x165667919E3779F9)
#define XXH_PRIME_MX2 UINT64_C(0x9FB21C651E98DF25)
#define XXH3_NATIVE_MAX 240

static PyObject *xxh3_fallback;  /* xxhash.xxh3_64_intdigest, for longer inputs */

static inline uint64_t
rd64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint32_t
rd32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static inline uint64_t
mul128_fold64(uint64_t a, uint64_t b)
{
#if defined(__SIZEOF_INT128__)
    unsigned __int128 p = (unsigned __int128)a * b;
    return (uint64_t)p ^ (uint64_t)(p >> 64);
#else
    uint64_t lo_lo = (a & 0xFFFFFFFF) * (b & 0xFFFFFFFF), hi_lo = (a >> 32) * (b & 0xFFFFFFFF);
    uint64_t lo_hi = (a & 0xFFFFFFFF) * (b >> 32), hi_hi = (a >> 32) * (b >> 32);
    uint64_t cross = (lo_lo >> 32) + (hi_lo & 0xFFFFFFFF) + lo_hi;
    uint64_t upper = (hi_lo >> 32) + (cross >> 32) + hi_hi;
    uint64_t lower = (cross << 32) | (lo_lo & 0xFFFFFFFF);
    return lower ^ upper;
#endif
}

static inline uint64_t
xxh64_avalanche(uint64_t h)
{
    h ^= h >> 33;
    h *= XXH_PRIME64_2;
    h ^= h >> 29;
    h *= XXH_PRIME64_3;
    return h ^ (h >> 32);
}

static inline uint64_t
xxh3_avalanche(uint64_t h)
{
    h ^= h >> 37;
    h *= XXH_PRIME_MX1;
    return h ^ (h >> 32);
}

static inline uint64_t
xxh3_mix16(const unsigned char *in, const unsigned char *sec)
{
    return mul128_fold64(rd64(in) ^ rd64(sec), rd64(in + 8) ^ rd64(sec + 8));
}

/* XXH3-64 of p[0:n], n <= XXH3_NATIVE_MAX, seed 0. */
static uint64_t
xxh3_64_short(const unsigned char *p, size_t n)
{
    const unsigned char *s = xxh3_secret;
    if (n <= 16) {
        if (n > 8) {
            uint64_t lo = rd64(p) ^ (rd64(s + 24) ^ rd64(s + 32));
            uint64_t hi = rd64(p + n - 8) ^ (rd64(s + 40) ^ rd64(s + 48));
            uint64_t acc = (uint64_t)n + __builtin_bswap64(lo) + hi + mul128_fold64(lo, hi);
            return xxh3_avalanche(acc);
        }
        if (n >= 4) {
            uint64_t in64 = (uint64_t)rd32(p + n - 4) + ((uint64_t)rd32(p) << 32);
            uint64_t h = in64 ^ (rd64(s + 8) ^ rd64(s + 16));
            h ^= ((h << 49) | (h >> 15)) ^ ((h << 24) | (h >> 40));
            h *= XXH_PRIME_MX2;
            h ^= (h >> 35) + (uint64_t)n;
            h *= XXH_PRIME_MX2;
            return h ^ (h >> 28);
        }
        if (n > 0) {
            uint32_t combined = ((uint32_t)p[0] << 16) | ((uint32_t)p[n >> 1] << 24)
                                | (uint32_t)p[n - 1] | ((uint32_t)n << 8);
            uint64_t bitflip = (uint64_t)(rd32(s) ^ rd32(s + 4));
            return xxh64_avalanche((uint64_t)combined ^ bitflip);
        }
        return xxh64_avalanche(rd64(s + 56) ^ rd64(s + 64));
    }
    uint64_t acc = (uint64_t)n * XXH_PRIME64_1;
    if (n <= 128) {
        if (n > 32) {
            if (n > 64) {
                if (n > 96) {
                    acc += xxh3_mix16(p + 48, s + 96);
                    acc += xxh3_mix16(p + n - 64, s + 112);
                }
                acc += xxh3_mix16(p + 32, s + 64);
                acc += xxh3_mix16(p + n - 48, s + 80);
            }
            acc += xxh3_mix16(p + 16, s + 32);
            acc += xxh3_mix16(p + n - 32, s + 48);
        }
        acc += xxh3_mix16(p, s);
        acc += xxh3_mix16(p + n - 16, s + 16);
        return xxh3_avalanche(acc);
    }
    size_t rounds = n / 16;
    for (size_t i = 0; i < 8; i++)
        acc += xxh3_mix16(p + 16 * i, s + 16 * i);
    acc = xxh3_avalanche(acc);
    for (size_t i = 8; i < rounds; i++)
        acc += xxh3_mix16(p + 16 * i, s + 16 * (i - 8) + 3);
    acc += xxh3_mix16(p + n - 16, s + 136 - 17);
    return xxh3_avalanche(acc);
}

/* The hash of a bytes object of at most XXH3_NATIVE_MAX bytes. */
static inline uint64_t
xxh3_64_of_short(PyObject *key)
{
    return xxh3_64_short((const unsigned char *)PyBytes_AS_STRING(key),
                         (size_t)PyBytes_GET_SIZE(key));
}

/* The hash of a bytes object: 0 and *out, or -1 with an exception set. */
static int
xxh3_64_bytes(PyObject *key, uint64_t *out)
{
    if (PyBytes_GET_SIZE(key) <= XXH3_NATIVE_MAX) {
        *out = xxh3_64_of_short(key);
        return 0;
    }
    PyObject *r = PyObject_CallOneArg(xxh3_fallback, key);
    if (r == NULL)
        return -1;
    unsigned long long h = PyLong_AsUnsignedLongLong(r);
    Py_DECREF(r);
    if (h == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = h;
    return 0;
}

static PyObject *
speedups_xxh3_64(PyObject *Py_UNUSED(module), PyObject *arg)
{
    /* xxh3_64(data) -> xxhash.xxh3_64_intdigest(data) */
    if (!PyBytes_CheckExact(arg))
        return PyObject_CallOneArg(xxh3_fallback, arg);
    uint64_t h;
    if (xxh3_64_bytes(arg, &h) < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(h);
}

static inline uint64_t be_word(const char *p, Py_ssize_t n);
static int index_words_init(Entry *e);

/* How many leading bytes a[0:la] and b[0:lb] share: for keys in order, the
 * prefix every key from a to b starts with. */
static inline Py_ssize_t
shared_prefix(const char *a, Py_ssize_t la, const char *b, Py_ssize_t lb)
{
    Py_ssize_t cp = 0;
    while (cp < la && cp < lb && a[cp] == b[cp])
        cp++;
    return cp;
}

static void
entry_clear(Entry *e)
{
    PyMem_Free(e->ikeys);
    PyMem_Free(e->ioff);
    PyMem_Free(e->ipre);
    PyMem_Free(e->itop);
    PyMem_Free(e->boff);
    PyMem_Free(e->bsize);
    e->ikeys = NULL;
    e->ioff = NULL;
    e->ipre = NULL;
    e->itop = NULL;
    e->boff = NULL;
    e->bsize = NULL;
    Py_CLEAR(e->lo);
    Py_CLEAR(e->hi);
    Py_CLEAR(e->kf);
    if (e->have_bits) {
        PyBuffer_Release(&e->bits);
        e->have_bits = 0;
    }
    if (e->have_counts) {
        PyBuffer_Release(&e->counts);
        e->have_counts = 0;
    }
}

static int
entry_init(Entry *e, PyObject *item)
{
    PyObject *t = PySequence_Tuple(item);
    if (t == NULL)
        return -1;
    if (PyTuple_GET_SIZE(t) != 8 && PyTuple_GET_SIZE(t) != 10 && PyTuple_GET_SIZE(t) != 11) {
        PyErr_SetString(PyExc_ValueError, "a file entry is (counts, min_key, max_key, bits, m, "
                                          "k, keyed_fn, index_keys[, offsets, sizes[, part]])");
        goto fail;
    }
    PyObject *counts = PyTuple_GET_ITEM(t, 0), *lo = PyTuple_GET_ITEM(t, 1),
             *hi = PyTuple_GET_ITEM(t, 2), *bits = PyTuple_GET_ITEM(t, 3),
             *m = PyTuple_GET_ITEM(t, 4), *k = PyTuple_GET_ITEM(t, 5),
             *kf = PyTuple_GET_ITEM(t, 6), *index_keys = PyTuple_GET_ITEM(t, 7);
    if (!PyBytes_CheckExact(lo) || !PyBytes_CheckExact(hi)) {
        PyErr_SetString(PyExc_TypeError, "min_key and max_key must be bytes");
        goto fail;
    }
    e->lo = Py_NewRef(lo);
    e->hi = Py_NewRef(hi);
    if (PyObject_GetBuffer(counts, &e->counts, PyBUF_WRITABLE | PyBUF_FORMAT) < 0)
        goto fail;
    e->have_counts = 1;
    if (e->counts.itemsize != 8 || e->counts.format == NULL || strcmp(e->counts.format, "Q") != 0
        || e->counts.len < 8 * MIN_COUNTERS) {
        PyErr_SetString(PyExc_TypeError, "counts must be an array('Q') of the file counters");
        goto fail;
    }
    unsigned long long mv = PyLong_AsUnsignedLongLong(m);
    if (mv == (unsigned long long)-1 && PyErr_Occurred())
        goto fail;
    Py_ssize_t kv = PyLong_AsSsize_t(k);
    if (kv == -1 && PyErr_Occurred())
        goto fail;
    if (kv < 0 || kv > 1024) {
        PyErr_SetString(PyExc_ValueError, "hash count out of range");
        goto fail;
    }
    e->m = mv;
    e->mod_M = fastmod_M(mv);
    e->k = kv;
    if (PyTuple_GET_SIZE(t) == 11) {
        unsigned long long sv = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, 10));
        if (sv == (unsigned long long)-1 && PyErr_Occurred())
            goto fail;
        if (check_part(sv, mv, kv) < 0)
            goto fail;
        e->part = sv;
    }
    if (mv) {
        if (PyObject_GetBuffer(bits, &e->bits, PyBUF_SIMPLE) < 0)
            goto fail;
        e->have_bits = 1;
        if ((uint64_t)e->bits.len < (mv + 7) / 8) {
            PyErr_SetString(PyExc_ValueError, "filter bit array shorter than m bits");
            goto fail;
        }
    }
    if (kf != Py_None) {
        if (!PyCallable_Check(kf)) {
            PyErr_SetString(PyExc_TypeError, "keyed_fn must be callable or None");
            goto fail;
        }
        e->kf = Py_NewRef(kf);
    }
    /* A compact copy of the index keys: the bisect after a "maybe" walks one
     * small buffer instead of a list of objects spread over the heap. */
    if (!PyList_CheckExact(index_keys)) {
        PyErr_SetString(PyExc_TypeError, "index_keys must be a list of bytes");
        goto fail;
    }
    Py_ssize_t nidx = PyList_GET_SIZE(index_keys), total = 0;
    for (Py_ssize_t i = 0; i < nidx; i++) {
        PyObject *ik = PyList_GET_ITEM(index_keys, i);
        if (!PyBytes_CheckExact(ik)) {
            PyErr_SetString(PyExc_TypeError, "index_keys must be a list of bytes");
            goto fail;
        }
        total += PyBytes_GET_SIZE(ik);
    }
    e->ikeys = PyMem_Malloc(total ? (size_t)total : 1);
    e->ioff = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(nidx + 1));
    if (e->ikeys == NULL || e->ioff == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    total = 0;
    for (Py_ssize_t i = 0; i < nidx; i++) {
        PyObject *ik = PyList_GET_ITEM(index_keys, i);
        e->ioff[i] = total;
        memcpy(e->ikeys + total, PyBytes_AS_STRING(ik), (size_t)PyBytes_GET_SIZE(ik));
        total += PyBytes_GET_SIZE(ik);
    }
    e->ioff[nidx] = total;
    e->nidx = nidx;
    if (index_words_init(e) < 0)
        goto fail;
    if (PyTuple_GET_SIZE(t) >= 10) {  /* where each block is: a get's disk read needs no lookup */
        PyObject *offs = PyTuple_GET_ITEM(t, 8), *sizes = PyTuple_GET_ITEM(t, 9);
        if (!PyList_CheckExact(offs) || !PyList_CheckExact(sizes)
            || PyList_GET_SIZE(offs) != nidx || PyList_GET_SIZE(sizes) != nidx) {
            PyErr_SetString(PyExc_TypeError, "offsets and sizes must be lists, one per block");
            goto fail;
        }
        e->boff = PyMem_Malloc(sizeof(uint64_t) * (size_t)(nidx ? nidx : 1));
        e->bsize = PyMem_Malloc(sizeof(uint64_t) * (size_t)(nidx ? nidx : 1));
        if (e->boff == NULL || e->bsize == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        for (Py_ssize_t i = 0; i < nidx; i++) {
            e->boff[i] = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(offs, i));
            e->bsize[i] = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(sizes, i));
            if (PyErr_Occurred())
                goto fail;
        }
    }
    Py_DECREF(t);
    return 0;
fail:
    Py_DECREF(t);
    return -1;
}

/* p[0:min(n, 8)] as a big-endian word, zero-padded: in the order of the bytes
 * (two strings that differ within those bytes compare as their words do;
 * equal words say nothing more). */
static inline uint64_t
be_word(const char *p, Py_ssize_t n)
{
    unsigned char b[8] = {0};
    memcpy(b, p, (size_t)(n < 8 ? n : 8));
    uint64_t w = 0;
    for (int i = 0; i < 8; i++)
        w = w << 8 | b[i];
    return w;
}

/* cp[L] and pre[L] for level L's max keys (count >= 1, in order): the prefix
 * they all share is the one the first and the last share. */
static int
level_keys_init(Probes *self, Py_ssize_t L, PyObject *keys)
{
    Py_ssize_t count = PyTuple_GET_SIZE(keys);
    PyObject *a = PyTuple_GET_ITEM(keys, 0), *b = PyTuple_GET_ITEM(keys, count - 1);
    Py_ssize_t cp = shared_prefix(PyBytes_AS_STRING(a), PyBytes_GET_SIZE(a),
                                  PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b));
    self->cp[L] = cp;
    self->pre[L] = PyMem_Malloc(sizeof(uint64_t) * (size_t)count);
    if (self->pre[L] == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t j = 0; j < count; j++) {
        PyObject *mk = PyTuple_GET_ITEM(keys, j);
        self->pre[L][j] = be_word(PyBytes_AS_STRING(mk) + cp, PyBytes_GET_SIZE(mk) - cp);
    }
    return 0;
}

static void
Probes_dealloc(Probes *self)
{
    if (self->e) {
        for (Py_ssize_t i = 0; i < self->n; i++)
            entry_clear(&self->e[i]);
        PyMem_Free(self->e);
    }
    if (self->max_keys) {
        for (Py_ssize_t i = 0; i < self->nlevels; i++)
            Py_XDECREF(self->max_keys[i]);
        PyMem_Free(self->max_keys);
    }
    if (self->pre) {
        for (Py_ssize_t i = 0; i < self->nlevels; i++)
            PyMem_Free(self->pre[i]);
        PyMem_Free(self->pre);
    }
    PyMem_Free(self->cp);
    PyMem_Free(self->off);
    Py_XDECREF(self->fast_hash);
    Py_XDECREF(self->last_key);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
Probes_init(Probes *self, PyObject *args, PyObject *kwds)
{
    PyObject *l0_arg, *deeper_arg, *fast_hash;
    PyObject *threshold_arg = NULL;
    uint64_t threshold = prefetch_all_bytes;
    static char *kwlist[] = {"l0", "deeper", "fast_hash", "prefetch_all_bytes", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO|$O:Probes", kwlist, &l0_arg, &deeper_arg,
                                     &fast_hash, &threshold_arg))
        return -1;
    if (threshold_arg != NULL) {
        long long v = PyLong_Check(threshold_arg) ? PyLong_AsLongLong(threshold_arg) : -1;
        if (v < 0) {
            if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_OverflowError)) {
                PyErr_Clear();
                PyErr_SetString(PyExc_ValueError, "prefetch_all_bytes must be an int >= 0");
            }
            return -1;
        }
        threshold = (uint64_t)v;
    }
    if (self->e != NULL) {
        PyErr_SetString(PyExc_TypeError, "Probes cannot be initialised twice");
        return -1;
    }
    if (!PyCallable_Check(fast_hash)) {
        PyErr_SetString(PyExc_TypeError, "fast_hash must be callable");
        return -1;
    }
    self->native_hash = PyCFunction_Check(fast_hash)
                        && PyCFunction_GET_FUNCTION(fast_hash) == (PyCFunction)speedups_xxh3_64;
    PyObject *l0 = PySequence_Tuple(l0_arg);
    if (l0 == NULL)
        return -1;
    PyObject *deeper = PySequence_Tuple(deeper_arg);
    if (deeper == NULL) {
        Py_DECREF(l0);
        return -1;
    }
    Py_ssize_t n0 = PyTuple_GET_SIZE(l0), nlevels = PyTuple_GET_SIZE(deeper);
    PyObject *levels = PyTuple_New(nlevels); /* per level: tuple of entries */
    if (levels == NULL)
        goto fail_early;
    self->max_keys = PyMem_Calloc(nlevels ? nlevels : 1, sizeof(PyObject *));
    self->off = PyMem_Calloc(nlevels + 1, sizeof(Py_ssize_t));
    self->cp = PyMem_Calloc(nlevels ? nlevels : 1, sizeof(Py_ssize_t));
    self->pre = PyMem_Calloc(nlevels ? nlevels : 1, sizeof(uint64_t *));
    if (self->max_keys == NULL || self->off == NULL || self->cp == NULL || self->pre == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    self->nlevels = nlevels;
    Py_ssize_t n = n0;
    for (Py_ssize_t L = 0; L < nlevels; L++) {
        PyObject *pair = PySequence_Tuple(PyTuple_GET_ITEM(deeper, L));
        if (pair == NULL)
            goto fail;
        if (PyTuple_GET_SIZE(pair) != 2) {
            Py_DECREF(pair);
            PyErr_SetString(PyExc_ValueError, "a level is (max_keys, entries)");
            goto fail;
        }
        PyObject *keys = PySequence_Tuple(PyTuple_GET_ITEM(pair, 0));
        PyObject *entries = keys ? PySequence_Tuple(PyTuple_GET_ITEM(pair, 1)) : NULL;
        Py_DECREF(pair);
        if (entries == NULL) {
            Py_XDECREF(keys);
            goto fail;
        }
        self->max_keys[L] = keys;
        PyTuple_SET_ITEM(levels, L, entries);
        if (PyTuple_GET_SIZE(keys) != PyTuple_GET_SIZE(entries)) {
            PyErr_SetString(PyExc_ValueError, "one max key per file of a level");
            goto fail;
        }
        Py_ssize_t count = PyTuple_GET_SIZE(keys);
        for (Py_ssize_t j = 0; j < count; j++) {
            if (!PyBytes_CheckExact(PyTuple_GET_ITEM(keys, j))) {
                PyErr_SetString(PyExc_TypeError, "max keys must be bytes");
                goto fail;
            }
            if (j && bytes_cmp(PyTuple_GET_ITEM(keys, j - 1), PyTuple_GET_ITEM(keys, j)) > 0) {
                PyErr_SetString(PyExc_ValueError, "a level's max keys must be in order");
                goto fail;
            }
        }
        if (count && level_keys_init(self, L, keys) < 0)
            goto fail;
        self->off[L] = n;
        n += PyTuple_GET_SIZE(entries);
    }
    self->off[nlevels] = n;
    self->e = PyMem_Calloc(n ? n : 1, sizeof(Entry));
    if (self->e == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    self->n = n;
    self->n0 = n0;
    for (Py_ssize_t i = 0; i < n0; i++)
        if (entry_init(&self->e[i], PyTuple_GET_ITEM(l0, i)) < 0)
            goto fail;
    for (Py_ssize_t L = 0; L < nlevels; L++) {
        PyObject *entries = PyTuple_GET_ITEM(levels, L);
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(entries); j++) {
            Entry *e = &self->e[self->off[L] + j];
            if (entry_init(e, PyTuple_GET_ITEM(entries, j)) < 0)
                goto fail;
            /* level_pick's file holds the key only below its max key: the
             * range check of a picked file compares the min key alone. */
            if (bytes_cmp(PyTuple_GET_ITEM(self->max_keys[L], j), e->hi) != 0) {
                PyErr_SetString(PyExc_ValueError, "a level's max keys must be its files' max keys");
                goto fail;
            }
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (self->e[i].kf != NULL)
            self->has_keyed = 1;
        if (self->e[i].m)
            self->filter_bytes += (self->e[i].m + 7) / 8;
    }
    self->prefetch_all = self->filter_bytes > threshold;
    self->fast_hash = Py_NewRef(fast_hash);
    Py_DECREF(levels);
    Py_DECREF(l0);
    Py_DECREF(deeper);
    return 0;
fail:
    Py_XDECREF(levels);
fail_early:
    Py_DECREF(l0);
    Py_DECREF(deeper);
    return -1;
}

/* The 64-bit hash of key under fn (the fast hash when fn is NULL), cached. */
static int
key_hash(Probes *self, PyObject *key, PyObject *kf, uint64_t *out)
{
    if (self->last_key == key) {
        if (kf == NULL && self->have_fast) {
            *out = self->last_fast;
            return 0;
        }
        if (kf != NULL && self->have_keyed && self->last_kf == kf) {
            *out = self->last_keyed;
            return 0;
        }
    }
    uint64_t h;
    if (kf == NULL && self->native_hash) {
        if (xxh3_64_bytes(key, &h) < 0)
            return -1;
    } else {
        PyObject *r = PyObject_CallOneArg(kf ? kf : self->fast_hash, key);
        if (r == NULL)
            return -1;
        /* The fast hash is xxh3_64: always an int in [0, 2**64), whose low
         * 64 bits are the value (the mask conversion skips CPython's slow
         * path for multi-digit ints).  A keyed result is checked in full. */
        h = kf == NULL && PyLong_CheckExact(r) ? PyLong_AsUnsignedLongLongMask(r)
                                               : PyLong_AsUnsignedLongLong(r);
        Py_DECREF(r);
        if (h == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
    }
    /* The call may have let another thread in: decide about the cache now. */
    if (self->last_key != key) {
        Py_INCREF(key);
        Py_XSETREF(self->last_key, key);
        self->have_fast = self->have_keyed = 0;
    }
    if (kf == NULL) {
        self->last_fast = h;
        self->have_fast = 1;
    } else {
        self->last_kf = kf;
        self->last_keyed = h;
        self->have_keyed = 1;
    }
    *out = h;
    return 0;
}

/* Whether every probe bit of hash h is set in e's filter (m > 0), for a
 * format-2 filter: probe i tests bit i*s + part_pos(g_i, s) of partition i
 * (filter_test_whole: format 1, bit (h1 + i*h2) mod m).  The first two
 * probes decide together (they are the lines the gathered probes prefetch,
 * in the first two partitions, the part of every filter every absent key
 * touches): one branch, right three times in four on an absent key, where a
 * branch per probe is a coin toss.  Then, only if both are set, the rest:
 * also for get_many, which tests one filter for many keys in a row, where
 * loading all k and letting one branch decide is slower on absent keys. */
static inline int
filter_test_part(const Entry *e, uint64_t h)
{
    const unsigned char *bits = (const unsigned char *)e->bits.buf;
    uint64_t s = e->part, base = 0;
    uint32_t g = (uint32_t)h, h2 = (uint32_t)(h >> 32);
    uint64_t pos = part_pos(g, s);
    unsigned all = bits[pos >> 3] >> (pos & 7);
    Py_ssize_t i = 1;
    if (e->k > 1) {
        g += h2;
        base = s;
        pos = base + part_pos(g, s);
        all &= bits[pos >> 3] >> (pos & 7);
        i = 2;
    }
    if (!(all & 1))
        return 0;
    for (; i < e->k; i++) {
        g += h2;
        base += s;
        pos = base + part_pos(g, s);
        all &= bits[pos >> 3] >> (pos & 7);
    }
    return (int)(all & 1);
}

/* filter_test_part for a format-1 filter. */
static inline int
filter_test_whole(const Entry *e, uint64_t h)
{
    const unsigned char *bits = (const unsigned char *)e->bits.buf;
    uint64_t m = e->m;
    uint64_t pos = fastmod(h & 0xFFFFFFFFu, m, e->mod_M), step = fastmod(h >> 32, m, e->mod_M);
    unsigned all = bits[pos >> 3] >> (pos & 7);
    Py_ssize_t i = 1;
    if (e->k > 1) {
        pos += step;
        pos = pos >= m ? pos - m : pos;
        all &= bits[pos >> 3] >> (pos & 7);
        i = 2;
    }
    if (!(all & 1))
        return 0;
    for (; i < e->k; i++) {
        pos += step;
        pos = pos >= m ? pos - m : pos;
        all &= bits[pos >> 3] >> (pos & 7);
    }
    return (int)(all & 1);
}

/* 1 when every probe bit of hash h is set in e's filter (m > 0). */
static inline int
filter_maybe(const Entry *e, uint64_t h)
{
    return e->part ? filter_test_part(e, h) : filter_test_whole(e, h);
}

/* Whether k[0:klen] is at or above e's min key. */
static inline int
above_lo(const Entry *e, const char *k, Py_ssize_t klen)
{
    return mem_order(k, klen, PyBytes_AS_STRING(e->lo), PyBytes_GET_SIZE(e->lo)) >= 0;
}

/* Whether k[0:klen] is within e's key range. */
static inline int
range_holds(const Entry *e, const char *k, Py_ssize_t klen)
{
    return above_lo(e, k, klen)
           && mem_order(k, klen, PyBytes_AS_STRING(e->hi), PyBytes_GET_SIZE(e->hi)) <= 0;
}

/* Whether k[0:klen] is within the range of e, a file level_pick chose for it
 * (`picked`) or any file: the pick is the first file of the level whose max
 * key is at or above the key, so only the min key is left to compare (a load
 * of the max key object and a compare fewer per level). */
static inline int
range_holds_as(const Entry *e, const char *k, Py_ssize_t klen, const int picked)
{
    return picked ? above_lo(e, k, klen) : range_holds(e, k, klen);
}

/* range_holds_as, a key outside counted. */
static inline int
in_range(Entry *e, const char *k, Py_ssize_t klen, const int picked)
{
    if (!range_holds_as(e, k, klen, picked)) {
        ((uint64_t *)e->counts.buf)[RANGE_SKIPS]++;
        return 0;
    }
    return 1;
}

/* Whether e's filter (m > 0) may hold the key of hash h; a "no" is counted. */
static inline int
filter_says_maybe(Entry *e, uint64_t h)
{
    if (filter_maybe(e, h))
        return 1;
    ((uint64_t *)e->counts.buf)[FILTER_NEGATIVES]++;
    return 0;
}

/* 1: the file may hold key (or has no filter); 0: certainly not; -1: error.
 * `picked`: e is the file level_pick chose for key. */
static inline int
check(Probes *self, Entry *e, PyObject *key, const int picked)
{
    if (!in_range(e, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), picked))
        return 0;
    if (!e->m)
        return 1;
    uint64_t h;
    if (key_hash(self, key, e->kf, &h) < 0)
        return -1;
    return filter_says_maybe(e, h);
}

/* check for a file of the fast hash, given the key's bytes k[0:klen] and
 * its hash h (get_many). */
static inline int
check_raw(Entry *e, const char *k, Py_ssize_t klen, uint64_t h, const int picked)
{
    return in_range(e, k, klen, picked) && (!e->m || filter_says_maybe(e, h));
}

/* The first i in a[0:n] (n >= 1, in order) with a[i] >= v, or n: a binary
 * search whose steps choose without a branch (a cmov), the loop's length
 * fixed by n. */
static inline Py_ssize_t
lower_bound_u64(const uint64_t *a, Py_ssize_t n, uint64_t v)
{
    const uint64_t *base = a;
    while (n > 1) {
        Py_ssize_t half = n / 2;
        base = base[half - 1] < v ? base + half : base;
        n -= half;
    }
    return (base - a) + (*base < v);
}

/* The file of level L that may hold key (flat index), or -1: bisect_left on
 * the level's max keys.  The bisect runs on each max key's 8 bytes after the
 * prefix they all share (pre[L], one small array, the steps without branches)
 * rather than on the key objects (a dependent load and a compare per step);
 * only the max keys whose 8 bytes equal the key's are compared whole. */
static inline Py_ssize_t
level_pick(Probes *self, Py_ssize_t L, PyObject *key)
{
    Py_ssize_t off = self->off[L], count = self->off[L + 1] - off;
    if (count == 0)
        return -1;
    PyObject *keys = self->max_keys[L];
    const char *k = PyBytes_AS_STRING(key);
    Py_ssize_t klen = PyBytes_GET_SIZE(key), cp = self->cp[L];
    if (cp) {
        int c = mem_order(k, klen < cp ? klen : cp, PyBytes_AS_STRING(PyTuple_GET_ITEM(keys, 0)),
                          cp);
        if (c)  /* below the prefix every max key starts with, or beyond them all */
            return c < 0 ? off : -1;
    }
    const uint64_t *pre = self->pre[L];
    uint64_t v = be_word(k + cp, klen - cp);
    Py_ssize_t lo = lower_bound_u64(pre, count, v);
    if (lo < count && pre[lo] == v) {
        Py_ssize_t hi = v == UINT64_MAX ? count : lower_bound_u64(pre, count, v + 1);
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (bytes_cmp(PyTuple_GET_ITEM(keys, mid), key) < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
    }
    return lo == count ? -1 : off + lo;
}

/* Start loading the lines of the first `lines` probes (at most k) of key
 * hash h in e's partitioned filter (e->part > 0). */
PREFETCH_HELPER
prefetch_part_lines(const Entry *e, uint64_t h, Py_ssize_t lines)
{
    const unsigned char *bits = (const unsigned char *)e->bits.buf;
    uint32_t g0 = (uint32_t)h, h2 = (uint32_t)(h >> 32);
    uint64_t base = 0;
    for (Py_ssize_t q = 0; q < lines; q++, g0 += h2, base += e->part)
        PREFETCH(bits + ((base + part_pos(g0, e->part)) >> 3));
}

/* The files a lookup of one key meets, gathered (gather_start) before any of
 * their filters is tested (gather_finish). */
typedef struct {
    Py_ssize_t files[MAX_GATHER];
    unsigned char holds[MAX_GATHER];
    Py_ssize_t c;
    uint64_t h;
} Gather;

/* Whether probes_first from the start gathers for key (probes_gather). */
static inline int
can_gather(const Probes *self, PyObject *key)
{
    return self->native_hash && !self->has_keyed && self->n0 + self->nlevels <= MAX_GATHER
           && PyBytes_GET_SIZE(key) <= XXH3_NATIVE_MAX;
}

/* The first half of probes_gather, for key of fast hash h: the files the key
 * meets (every level-0 file, each level's pick) and their range checks into
 * g, starting to load the lines of the first two probes of every filter in
 * range -- of all k where the filters outgrow the L2 cache (prefetch_all):
 * a key that passes a filter's first two probes (one in four absent keys, at
 * fill 0.5) then finds the other k - 2 lines on their way instead of
 * fetching them after the other files' first two.  Paired with the first
 * two only, absent gets at 2,000,000 keys took 0.87-0.93x the time
 * (size-tiered and leveled); loading all k where the filters fit in the L2
 * cache cost 5-9% at 200,000 (the address arithmetic of lines already near),
 * hence the threshold.  Nothing is counted yet. */
static void
gather_start(Probes *self, PyObject *key, uint64_t h, Gather *g)
{
    const char *k = PyBytes_AS_STRING(key);
    Py_ssize_t klen = PyBytes_GET_SIZE(key), c = 0;
    g->h = h;
    for (Py_ssize_t i = 0; i < self->n0; i++)
        g->files[c++] = i;
    for (Py_ssize_t L = 0; L < self->nlevels; L++) {
        Py_ssize_t f = level_pick(self, L, key);
        if (f >= 0)
            g->files[c++] = f;
    }
    g->c = c;
    for (Py_ssize_t j = 0; j < c; j++) {
        const Entry *e = &self->e[g->files[j]];
        g->holds[j] = (unsigned char)range_holds_as(e, k, klen, j >= self->n0);
        if (g->holds[j] && e->m) {
            if (e->part) {
                prefetch_part_lines(e, h, self->prefetch_all ? e->k : e->k > 1 ? 2 : 1);
                continue;
            }
            const unsigned char *bits = (const unsigned char *)e->bits.buf;
            uint64_t pos = fastmod(h & 0xFFFFFFFFu, e->m, e->mod_M);
            uint64_t step = fastmod(h >> 32, e->m, e->mod_M);
            PREFETCH(bits + (pos >> 3));
            pos += step;
            if (pos >= e->m)
                pos -= e->m;
            PREFETCH(bits + (pos >> 3));
        }
    }
}

/* The second half of probes_gather: g's files in order, counted as
 * probes_first counts them (only those consulted up to the first "maybe");
 * the first that may hold the key, or -1. */
static Py_ssize_t
gather_finish(Probes *self, const Gather *g)
{
    for (Py_ssize_t j = 0; j < g->c; j++) {
        Entry *e = &self->e[g->files[j]];
        if (!g->holds[j]) {
            ((uint64_t *)e->counts.buf)[RANGE_SKIPS]++;
            continue;
        }
        if (!e->m || filter_says_maybe(e, g->h))
            return g->files[j];
    }
    return -1;
}

/* probes_first from the start for a table of the inline fast hash
 * (can_gather): gather_start, then gather_finish.  The filters' loads
 * overlap instead of each waiting for the one before: an absent key's
 * filter steps at 2,000,000 keys (2.4 MB of filters, beyond the L2 cache)
 * took 12-16% less time, 5-8% at 200,000. */
static Py_ssize_t
probes_gather(Probes *self, PyObject *key)
{
    uint64_t h;
    if (key_hash(self, key, NULL, &h) < 0)
        return -2;
    Gather g;
    gather_start(self, key, h, &g);
    return gather_finish(self, &g);
}

/* The first file from `start` that may hold key (bytes); -1: none; -2: error set. */
static Py_ssize_t
probes_first(Probes *self, PyObject *key, Py_ssize_t start)
{
    if (start <= 0 && can_gather(self, key))
        return probes_gather(self, key);
    if (start < 0)
        start = 0;
    for (Py_ssize_t i = start; i < self->n0; i++) {
        int r = check(self, &self->e[i], key, 0);
        if (r)
            return r < 0 ? -2 : i;
    }
    for (Py_ssize_t L = 0; L < self->nlevels; L++) {
        if (start > self->off[L])
            continue; /* this level was consulted before the resume */
        Py_ssize_t f = level_pick(self, L, key);
        if (f < 0)
            continue;
        int r = check(self, &self->e[f], key, 1);
        if (r)
            return r < 0 ? -2 : f;
    }
    return -1;
}

static PyObject *
Probes_first(Probes *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "first(key, start) takes 2 arguments");
        return NULL;
    }
    PyObject *key = args[0];
    if (!PyBytes_CheckExact(key)) {
        PyErr_SetString(PyExc_TypeError, "key must be bytes");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t f = probes_first(self, key, start);
    return f == -2 ? NULL : PyLong_FromSsize_t(f);
}

/* The hashes held for the last key, as an opaque seed: (fast, keyed, keyed_fn),
 * -1 for a hash not computed. */
static PyObject *
hash_seed(Probes *self)
{
    return Py_BuildValue("(LLO)", self->have_fast ? (long long)self->last_fast : -1LL,
                         self->have_keyed ? (long long)self->last_keyed : -1LL,
                         self->have_keyed ? self->last_kf : Py_None);
}

/* Make `key` the held key with the hashes of `seed` (from hash_seed). */
static int
use_seed(Probes *self, PyObject *key, PyObject *seed)
{
    long long fast, keyed;
    PyObject *kf;
    if (!PyTuple_CheckExact(seed) || !PyArg_ParseTuple(seed, "LLO", &fast, &keyed, &kf)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "a hash seed is what first_many wrote");
        return -1;
    }
    Py_INCREF(key);
    Py_XSETREF(self->last_key, key);
    self->have_fast = fast != -1;
    self->last_fast = (uint64_t)fast;
    self->have_keyed = 0;
    for (Py_ssize_t i = 0; keyed != -1 && i < self->n; i++) {
        if (self->e[i].kf == kf) {  /* only a function these files hold */
            self->have_keyed = 1;
            self->last_keyed = (uint64_t)keyed;
            self->last_kf = kf;
            break;
        }
    }
    return 0;
}

static PyObject *
Probes_first_many(Probes *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* first_many(keys, starts=None, seeds=None): [first(key, start) ...] in one
     * call.  seeds, a list as long as keys, carries each key's hashes from
     * one call to the next: where a key may be in a file, its seed is
     * written; where a seed is given, the key is not hashed again. */
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "first_many(keys, starts=None, seeds=None)");
        return NULL;
    }
    PyObject *keys = args[0];
    PyObject *starts = nargs > 1 && args[1] != Py_None ? args[1] : NULL;
    PyObject *seeds = nargs > 2 && args[2] != Py_None ? args[2] : NULL;
    if (!PyList_CheckExact(keys) || (starts && !PyList_CheckExact(starts))
        || (seeds && !PyList_CheckExact(seeds))) {
        PyErr_SetString(PyExc_TypeError, "keys, starts and seeds must be lists");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if ((starts && PyList_GET_SIZE(starts) != n) || (seeds && PyList_GET_SIZE(seeds) != n)) {
        PyErr_SetString(PyExc_ValueError, "keys, starts and seeds must be as long");
        return NULL;
    }
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        if (!PyBytes_CheckExact(key)) {
            PyErr_SetString(PyExc_TypeError, "key must be bytes");
            goto fail;
        }
        Py_ssize_t start = 0;
        if (starts) {
            start = PyLong_AsSsize_t(PyList_GET_ITEM(starts, i));
            if (start == -1 && PyErr_Occurred())
                goto fail;
        }
        if (seeds && PyList_GET_ITEM(seeds, i) != Py_None
            && use_seed(self, key, PyList_GET_ITEM(seeds, i)) < 0)
            goto fail;
        Py_ssize_t f = probes_first(self, key, start);
        if (f == -2)
            goto fail;
        PyObject *r = PyLong_FromSsize_t(f);
        if (r == NULL)
            goto fail;
        PyList_SET_ITEM(out, i, r);
        if (seeds && f >= 0 && self->last_key == key) {
            PyObject *seed = hash_seed(self);
            if (seed == NULL)
                goto fail;
            if (PyList_SetItem(seeds, i, seed) < 0)  /* steals seed */
                goto fail;
        }
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static Py_ssize_t bisect_index(const Entry *e, PyObject *key);

/* index_block(f, key): the block of file f (flat index) that a get of key
 * reads, as the getter finds it (tests compare it with bisect_left). */
static PyObject *
Probes_index_block(Probes *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "index_block(f: int, key: bytes)");
        return NULL;
    }
    Py_ssize_t f = PyLong_AsSsize_t(args[0]);
    if (f == -1 && PyErr_Occurred())
        return NULL;
    if (f < 0 || f >= self->n) {
        PyErr_SetString(PyExc_IndexError, "file index out of range");
        return NULL;
    }
    return PyLong_FromSsize_t(bisect_index(&self->e[f], args[1]));
}

static PyMethodDef Probes_methods[] = {
    {"first", (PyCFunction)(void (*)(void))Probes_first, METH_FASTCALL,
     "first(key, start) -> index of the first file from start that may hold key, or -1"},
    {"first_many", (PyCFunction)(void (*)(void))Probes_first_many, METH_FASTCALL,
     "first_many(keys, starts=None, seeds=None) -> [first(key, start) for each key]"},
    {"index_block", (PyCFunction)(void (*)(void))Probes_index_block, METH_FASTCALL,
     "index_block(f, key) -> bisect_left of key over file f's index keys (the block that "
     "can hold it; the index's length if none)"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Probes_members[] = {
    {"filter_bytes", T_ULONGLONG, offsetof(Probes, filter_bytes), READONLY,
     "the bytes of all the files' filters"},
    {"prefetch_all", T_BOOL, offsetof(Probes, prefetch_all), READONLY,
     "whether a get starts loading every probe's filter line at once (filter_bytes > "
     "FILTER_PREFETCH_BYTES) rather than the first two's"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject ProbesType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lsmdb._speedups.Probes",
    .tp_basicsize = sizeof(Probes),
    .tp_dealloc = (destructor)Probes_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The files a point read consults: range checks and Bloom filter probes in C.",
    .tp_methods = Probes_methods,
    .tp_members = Probes_members,
    .tp_init = (initproc)Probes_init,
    .tp_new = PyType_GenericNew,
};

/* ---- the block cache's admission of blocks read from disk -------------- */

/* Which blocks a full block cache takes in (BlockCache.admit): a block read
 * from disk whose cache key was turned away once within the last `window`
 * turned-away reads.  A table larger than the cache read at random would
 * otherwise have every block it reads put in and another evicted, for a hit
 * rate no policy raises above the cache's share of the table: the puts and
 * evictions cost more than the hits they bring.  The memory of
 * turned-away keys is a bitmap of 64 bits per key of the window (a
 * "doorkeeper", as in TinyLFU), cleared once `window` keys have been set in
 * it: a key is remembered for between 0 and `window` turned-away reads, and
 * a block never read before is let in with a probability of at most
 * 1/64 (a bit some other key set).  A key admitted has its bit cleared: its
 * next read is a first one again.  While the cache is not full (`full`,
 * which the cache keeps up to date) every block is admitted.  Each call
 * runs under the GIL without releasing it, so threads need no lock. */
typedef struct {
    PyObject_HEAD
    uint64_t *bits;
    uint64_t mask;        /* bit count - 1 (a power of two) */
    Py_ssize_t window;    /* turned-away reads remembered at most */
    Py_ssize_t count;     /* keys set since the last clear */
    char full;
} Admission;

#define ADMISSION_BITS_PER_KEY 64
#define ADMISSION_MAX_BITS ((uint64_t)1 << 26)   /* 8 MiB of bits */

/* splitmix64's finaliser: cache keys are runs of consecutive ints (a
 * reader's base + block index, lsmdb/cache.py), whose low bits alone would
 * fill the table's slots in long runs that a lookup of an absent key walks
 * to the end; mixed, they land as random keys would (tests/test_cache.py) */
static inline uint64_t
admission_mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

/* Every turned-away read forgotten: a new window starts. */
static void
admission_forget(Admission *self)
{
    memset(self->bits, 0, (size_t)((self->mask >> 6) + 1) * sizeof(uint64_t));
    self->count = 0;
}

/* The longest window the bits made at creation allow. */
static inline Py_ssize_t
admission_max_window(const Admission *self)
{
    return (Py_ssize_t)((self->mask + 1) / ADMISSION_BITS_PER_KEY);
}

/* A window of w turned-away reads (1 <= w <= admission_max_window);
 * forgotten at once if more than that are remembered. */
static void
admission_set_window(Admission *self, Py_ssize_t w)
{
    self->window = w;
    if (self->count >= w)
        admission_forget(self);
}

/* Whether the block with cache key `key` is read again: it was read and
 * turned away within the window (its bit is cleared, so that its next read
 * is a first one again); if not, it is remembered now.  A full cache admits
 * a block on this, and any cache the block of a false positive. */
static int
admission_admit_reread(Admission *self, uint64_t key)
{
    uint64_t b = admission_mix(key) & self->mask;
    uint64_t *word = &self->bits[b >> 6], bit = (uint64_t)1 << (b & 63);
    if (*word & bit) {
        *word &= ~bit;
        return 1;
    }
    *word |= bit;
    if (++self->count >= self->window)
        admission_forget(self);
    return 0;
}

/* Whether to cache the block with cache key `key` that a lookup found its
 * key in (and the books kept): every one while the cache has room. */
static inline int
admission_admit(Admission *self, uint64_t key)
{
    return !self->full || admission_admit_reread(self, key);
}

static int
Admission_init(Admission *self, PyObject *args, PyObject *kwds)
{
    Py_ssize_t window;
    static char *kwlist[] = {"window", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n:Admission", kwlist, &window))
        return -1;
    if (window < 1) {
        PyErr_SetString(PyExc_ValueError, "window must be >= 1");
        return -1;
    }
    if (self->bits != NULL) {
        PyErr_SetString(PyExc_TypeError, "Admission cannot be initialised twice");
        return -1;
    }
    uint64_t want = (uint64_t)window * ADMISSION_BITS_PER_KEY, nbits = 64;
    while (nbits < want && nbits < ADMISSION_MAX_BITS)
        nbits <<= 1;
    self->bits = PyMem_Calloc((size_t)(nbits >> 6), sizeof(uint64_t));
    if (self->bits == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->mask = nbits - 1;
    self->window = window;
    self->count = 0;
    self->full = 0;
    return 0;
}

static void
Admission_dealloc(Admission *self)
{
    PyMem_Free(self->bits);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A cache key given from Python (an int, taken modulo 2**64) in *out; 0,
 * or -1 with TypeError. */
static int
cache_key_arg(PyObject *key, uint64_t *out)
{
    if (!PyLong_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "a cache key must be an int");
        return -1;
    }
    unsigned long long k = PyLong_AsUnsignedLongLongMask(key);  /* modulo 2**64 */
    if (k == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = (uint64_t)k;
    return 0;
}

/* admit(key) (reread 0) or admit_reread(key) (1) of a cache key given from
 * Python: a bool, or NULL with an error set. */
static PyObject *
admission_answer(Admission *self, PyObject *key, int reread)
{
    uint64_t k;
    if (self->bits == NULL) {
        PyErr_SetString(PyExc_TypeError, "Admission is not initialised");
        return NULL;
    }
    if (cache_key_arg(key, &k) < 0)
        return NULL;
    return PyBool_FromLong(reread ? admission_admit_reread(self, k) : admission_admit(self, k));
}

static PyObject *
Admission_admit(Admission *self, PyObject *key)
{
    return admission_answer(self, key, 0);
}

static PyObject *
Admission_admit_reread(Admission *self, PyObject *key)
{
    return admission_answer(self, key, 1);
}

static PyObject *
Admission_get_window(Admission *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->window);
}

static int
Admission_set_window(Admission *self, PyObject *value, void *Py_UNUSED(closure))
{
    if (self->bits == NULL) {
        PyErr_SetString(PyExc_TypeError, "Admission is not initialised");
        return -1;
    }
    Py_ssize_t w = value != NULL ? PyLong_AsSsize_t(value) : -1;
    if (w == -1 && PyErr_Occurred())
        return -1;
    if (w < 1 || w > admission_max_window(self)) {
        PyErr_SetString(PyExc_ValueError,
                        "window must be >= 1 and within the bits made at creation");
        return -1;
    }
    admission_set_window(self, w);
    return 0;
}

static PyObject *
Admission_get_full(Admission *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->full);
}

static int
Admission_set_full(Admission *self, PyObject *value, void *Py_UNUSED(closure))
{
    if (self->bits == NULL) {
        PyErr_SetString(PyExc_TypeError, "Admission is not initialised");
        return -1;
    }
    int t = value != NULL ? PyObject_IsTrue(value) : -1;
    if (t < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "full cannot be deleted");
        return -1;
    }
    self->full = (char)t;
    return 0;
}

static PyObject *
Admission_get_bits(Admission *self, void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLongLong(self->mask + 1);
}

static PyObject *
Admission_get_count(Admission *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->count);
}

static PyMethodDef Admission_methods[] = {
    {"admit", (PyCFunction)Admission_admit, METH_O,
     "admit(key) -> whether a full cache takes the block read with this cache key"},
    {"admit_reread", (PyCFunction)Admission_admit_reread, METH_O,
     "admit_reread(key) -> whether the block read with this cache key is read again "
     "within the window"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Admission_getset[] = {
    {"window", (getter)Admission_get_window, (setter)Admission_set_window,
     "turned-away reads remembered at most", NULL},
    {"full", (getter)Admission_get_full, (setter)Admission_set_full,
     "whether the cache is full (if not, every block is admitted)", NULL},
    {"bits", (getter)Admission_get_bits, NULL, "size of the bitmap, in bits", NULL},
    {"count", (getter)Admission_get_count, NULL, "keys set since the bitmap was cleared",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject AdmissionType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lsmdb._speedups.Admission",
    .tp_basicsize = sizeof(Admission),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Admission(window): which blocks read from disk a full block cache takes in.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Admission_init,
    .tp_dealloc = (destructor)Admission_dealloc,
    .tp_methods = Admission_methods,
    .tp_getset = Admission_getset,
};

/* ---- the block cache's books: table, clock and admission ---------------- */

/* BlockCache's state in C (lsmdb/cache.py has its Python twin for builds
 * without this extension): cache key -> block object and its size, a byte
 * budget, second-chance ("CLOCK") eviction in the order blocks came in, and
 * the Admission of a full cache's reads.  The table is open addressing with
 * linear probing on the keys' splitmix64 mix; the clock's ring is a circular
 * array of the cached blocks' keys, oldest first, one per cached block
 * (eviction pops the blocks it drops, evict_range rebuilds it without its
 * blocks; a replaced block keeps its place).  Keys are handed out by
 * reserve, a range of consecutive keys per reader from a 64-bit counter
 * that only goes up and refuses to wrap.  A block counting more than
 * 4 GiB (or than the budget) is not cached.  Every method
 * runs under the GIL without letting it go (a block's release can run no
 * Python code for the bytes the read path caches), so threads need no lock,
 * and the C getter looks blocks up, marks hits and puts blocks it read with
 * no call into Python. */
enum { SLOT_EMPTY = 0, SLOT_LIVE = 1, SLOT_GONE = 2 };

typedef struct {
    uint64_t key;
    PyObject *block;     /* a reference while live */
    uint32_t size;       /* what the budget counts for it */
    uint8_t state;
    uint8_t marked;      /* hit since the clock last passed it */
} CacheSlot;             /* 24 bytes */

typedef uint64_t RingItem;  /* a cached block's key */

typedef struct {
    PyObject_HEAD
    CacheSlot *slots;
    size_t nslots;                  /* a power of two, or 0 before __init__ */
    Py_ssize_t live, gone;          /* slots live, and gone (tombstones) */
    RingItem *ring;                 /* circular: oldest at rhead */
    size_t rcap, rhead, rlen;       /* rcap a power of two */
    Py_ssize_t capacity, used;      /* bytes */
    Py_ssize_t min_window, window_divisor;
    uint64_t next_key;              /* the first key reserve has not handed out */
    Admission *admission;
} Cache;

static Py_ssize_t
cache_find(const Cache *c, uint64_t key)
{
    size_t mask = c->nslots - 1, i = (size_t)admission_mix(key) & mask;
    for (;;) {
        const CacheSlot *s = &c->slots[i];
        if (s->state == SLOT_EMPTY)
            return -1;
        if (s->state == SLOT_LIVE && s->key == key)
            return (Py_ssize_t)i;
        i = (i + 1) & mask;
    }
}

/* The table rebuilt with nslots slots (a power of two above twice the live
 * ones): no tombstones left.  0, or -1 with MemoryError. */
static int
cache_resize(Cache *c, size_t nslots)
{
    CacheSlot *fresh = PyMem_Calloc(nslots, sizeof(CacheSlot));
    if (fresh == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t mask = nslots - 1;
    for (size_t j = 0; j < c->nslots; j++) {
        if (c->slots[j].state != SLOT_LIVE)
            continue;
        size_t i = (size_t)admission_mix(c->slots[j].key) & mask;
        while (fresh[i].state != SLOT_EMPTY)
            i = (i + 1) & mask;
        fresh[i] = c->slots[j];
    }
    PyMem_Free(c->slots);
    c->slots = fresh;
    c->nslots = nslots;
    c->gone = 0;
    return 0;
}

static int
ring_push(Cache *c, uint64_t key)
{
    if (c->rlen == c->rcap) {
        size_t cap = c->rcap ? c->rcap * 2 : 64;
        RingItem *fresh = PyMem_Malloc(cap * sizeof(RingItem));
        if (fresh == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (size_t j = 0; j < c->rlen; j++)
            fresh[j] = c->ring[(c->rhead + j) & (c->rcap - 1)];
        PyMem_Free(c->ring);
        c->ring = fresh;
        c->rcap = cap;
        c->rhead = 0;
    }
    c->ring[(c->rhead + c->rlen) & (c->rcap - 1)] = key;
    c->rlen++;
    return 0;
}

static RingItem
ring_pop(Cache *c)
{
    RingItem it = c->ring[c->rhead];
    c->rhead = (c->rhead + 1) & (c->rcap - 1);
    c->rlen--;
    return it;
}

/* Slot i given up: its block (the reference the caller releases). */
static PyObject *
cache_drop(Cache *c, Py_ssize_t i)
{
    CacheSlot *s = &c->slots[i];
    PyObject *block = s->block;
    c->used -= (Py_ssize_t)s->size;
    s->block = NULL;
    s->state = SLOT_GONE;
    s->marked = 0;
    c->live--;
    c->gone++;
    return block;
}

static void
cache_tell_admission(Cache *c)
{
    Admission *a = c->admission;
    a->full = c->live > 0 && c->used + c->used / c->live > c->capacity;
    Py_ssize_t w = c->live / c->window_divisor, most = admission_max_window(a);
    if (w < c->min_window)
        w = c->min_window;
    if (w > most)
        w = most;
    if (w != a->window)
        admission_set_window(a, w);
}

/* Free room down to the budget, the block `keep` (just put) aside: the
 * oldest go first, except marked ones, which are unmarked and go to the
 * back of the ring once each. */
static void
cache_evict(Cache *c, uint64_t keep)
{
    Py_ssize_t second_chances = c->live;
    while (c->used > c->capacity && c->rlen > 0) {
        RingItem it = ring_pop(c);
        Py_ssize_t i = cache_find(c, it);
        if (i < 0)
            continue;  /* cannot be: every cached block has one item */
        if (it == keep || (c->slots[i].marked && second_chances > 0)) {
            if (it != keep) {
                second_chances--;
                c->slots[i].marked = 0;
            }
            c->ring[(c->rhead + c->rlen) & (c->rcap - 1)] = it;  /* popped: room */
            c->rlen++;
            continue;
        }
        PyObject *block = cache_drop(c, i);
        Py_DECREF(block);
    }
}

/* Cache `block` under key, counting size bytes (not cached if larger than
 * the whole budget); one already there is replaced in its place.  0, or -1
 * with an exception set (memory). */
static int
cache_put(Cache *c, uint64_t key, PyObject *block, Py_ssize_t size)
{
    if (size < 0 || size > c->capacity || (uint64_t)size > UINT32_MAX)
        return 0;
    Py_ssize_t i = cache_find(c, key);
    if (i >= 0) {
        CacheSlot *s = &c->slots[i];
        PyObject *old = s->block;
        c->used += size - (Py_ssize_t)s->size;
        s->block = Py_NewRef(block);
        s->size = (uint32_t)size;
        Py_DECREF(old);
    }
    else {
        if ((size_t)(c->live + c->gone + 1) * 2 > c->nslots) {
            size_t n = 16;
            while (n < (size_t)(c->live + 1) * 4)
                n <<= 1;
            if (cache_resize(c, n) < 0)
                return -1;
        }
        if (ring_push(c, key) < 0)
            return -1;
        size_t mask = c->nslots - 1, j = (size_t)admission_mix(key) & mask;
        while (c->slots[j].state == SLOT_LIVE)
            j = (j + 1) & mask;
        if (c->slots[j].state == SLOT_GONE)
            c->gone--;
        c->slots[j] = (CacheSlot){key, Py_NewRef(block), (uint32_t)size, SLOT_LIVE, 0};
        c->live++;
        c->used += size;
    }
    if (c->used > c->capacity)
        cache_evict(c, key);
    cache_tell_admission(c);
    return 0;
}

/* Drop every block with a key in [lo, hi) (a file's range, from reserve),
 * and their items from the ring.  0, or -1 with an exception set. */
static int
cache_evict_range(Cache *c, uint64_t lo, uint64_t hi)
{
    Py_ssize_t dropped = 0;
    PyObject **blocks = NULL;
    for (size_t j = 0; j < c->nslots; j++)
        if (c->slots[j].state == SLOT_LIVE && c->slots[j].key >= lo && c->slots[j].key < hi)
            dropped++;
    if (dropped == 0)
        return 0;
    blocks = PyMem_Malloc((size_t)dropped * sizeof(PyObject *));
    if (blocks == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t n = 0;
    for (size_t j = 0; j < c->nslots; j++)
        if (c->slots[j].state == SLOT_LIVE && c->slots[j].key >= lo && c->slots[j].key < hi)
            blocks[n++] = cache_drop(c, (Py_ssize_t)j);
    size_t kept = 0, len = c->rlen;
    for (size_t j = 0; j < len; j++) {  /* the ring without them, in order */
        RingItem it = c->ring[(c->rhead + j) & (c->rcap - 1)];
        if (cache_find(c, it) >= 0)
            c->ring[(c->rhead + kept++) & (c->rcap - 1)] = it;
    }
    c->rlen = kept;
    cache_tell_admission(c);
    for (Py_ssize_t j = 0; j < n; j++)  /* released once the books are straight */
        Py_DECREF(blocks[j]);
    PyMem_Free(blocks);
    return 0;
}

static int
Cache_init(Cache *self, PyObject *args, PyObject *kwds)
{
    Py_ssize_t capacity, min_window = 1024, divisor = 4;
    PyObject *admission;
    static char *kwlist[] = {"capacity_bytes", "admission", "min_window", "window_divisor", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nO!|nn:Cache", kwlist, &capacity,
                                     &AdmissionType, &admission, &min_window, &divisor))
        return -1;
    if (self->slots != NULL) {
        PyErr_SetString(PyExc_TypeError, "Cache cannot be initialised twice");
        return -1;
    }
    if (capacity < 0 || min_window < 1 || divisor < 1) {
        PyErr_SetString(PyExc_ValueError,
                        "capacity_bytes must be >= 0, min_window and window_divisor >= 1");
        return -1;
    }
    if (((Admission *)admission)->bits == NULL) {
        PyErr_SetString(PyExc_TypeError, "Admission is not initialised");
        return -1;
    }
    self->slots = PyMem_Calloc(16, sizeof(CacheSlot));
    if (self->slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->nslots = 16;
    self->capacity = capacity;
    self->min_window = min_window;
    self->window_divisor = divisor;
    self->admission = (Admission *)Py_NewRef(admission);
    cache_tell_admission(self);
    return 0;
}

static int
Cache_traverse(Cache *self, visitproc visit, void *arg)
{
    for (size_t j = 0; j < self->nslots; j++)
        if (self->slots[j].state == SLOT_LIVE)
            Py_VISIT(self->slots[j].block);
    return 0;
}

/* Every block dropped (the cycle collector's tp_clear: a block could refer
 * back to the cache); the cache stays usable, empty.  The admission, which
 * refers to nothing, stays until the cache goes. */
static int
Cache_clear(Cache *self)
{
    if (self->live == 0)
        return 0;
    CacheSlot *old = self->slots, *fresh = PyMem_Calloc(16, sizeof(CacheSlot));
    size_t n = self->nslots;
    if (fresh == NULL) {  /* no memory for an empty table: drop in place */
        for (size_t j = 0; j < n; j++)
            if (old[j].state == SLOT_LIVE)
                Py_DECREF(cache_drop(self, (Py_ssize_t)j));
        self->rlen = 0;
        return 0;
    }
    /* the books emptied first, the blocks released after: a block's
     * release cannot find the cache half cleared */
    self->slots = fresh;
    self->nslots = 16;
    self->live = self->gone = 0;
    self->used = 0;
    self->rlen = 0;
    if (self->admission != NULL)
        cache_tell_admission(self);
    for (size_t j = 0; j < n; j++)
        if (old[j].state == SLOT_LIVE)
            Py_DECREF(old[j].block);
    PyMem_Free(old);
    return 0;
}

static void
Cache_dealloc(Cache *self)
{
    PyObject_GC_UnTrack(self);
    Cache_clear(self);
    Py_CLEAR(self->admission);
    PyMem_Free(self->slots);
    PyMem_Free(self->ring);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
cache_ready(Cache *self)
{
    if (self->slots == NULL || self->admission == NULL) {
        PyErr_SetString(PyExc_TypeError, "Cache is not initialised");
        return 0;
    }
    return 1;
}

/* The slot of the block cached under `key` (an int from Python) in *slot,
 * -1 if none; 0, or -1 with an exception set. */
static int
cache_slot_of(Cache *self, PyObject *key, Py_ssize_t *slot)
{
    uint64_t k;
    if (!cache_ready(self) || cache_key_arg(key, &k) < 0)
        return -1;
    *slot = cache_find(self, k);
    return 0;
}

static PyObject *
Cache_lookup(Cache *self, PyObject *key)
{
    Py_ssize_t i;
    if (cache_slot_of(self, key, &i) < 0)
        return NULL;
    return i < 0 ? Py_NewRef(Py_None) : Py_NewRef(self->slots[i].block);
}

/* lookup, and a hit marked (mark: get) or only the mark (touch) */
static PyObject *
cache_mark(Cache *self, PyObject *key, int answer)
{
    Py_ssize_t i;
    if (cache_slot_of(self, key, &i) < 0)
        return NULL;
    if (i < 0)
        Py_RETURN_NONE;
    self->slots[i].marked = 1;
    return answer ? Py_NewRef(self->slots[i].block) : Py_NewRef(Py_None);
}

static PyObject *
Cache_get(Cache *self, PyObject *key)
{
    return cache_mark(self, key, 1);
}

static PyObject *
Cache_touch(Cache *self, PyObject *key)
{
    return cache_mark(self, key, 0);
}

static PyObject *
Cache_put(Cache *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t k;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "put(key, block, size)");
        return NULL;
    }
    if (!cache_ready(self) || cache_key_arg(args[0], &k) < 0)
        return NULL;
    Py_ssize_t size = PyLong_AsSsize_t(args[2]);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    if (size < 0) {
        PyErr_SetString(PyExc_ValueError, "a block's size must be >= 0");
        return NULL;
    }
    if (cache_put(self, k, args[1], size) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
Cache_admit(Cache *self, PyObject *key)
{
    return cache_ready(self) ? admission_answer(self->admission, key, 0) : NULL;
}

static PyObject *
Cache_admit_reread(Cache *self, PyObject *key)
{
    return cache_ready(self) ? admission_answer(self->admission, key, 1) : NULL;
}

/* An int from Python in [0, 2**64) in *out, what: its name for the errors
 * (TypeError if not an int, ValueError out of range); 0, or -1. */
static int
u64_arg(PyObject *o, const char *what, uint64_t *out)
{
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int", what);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s must be >= 0 and < 2**64", what);
        }
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

/* reserve(nblocks): the first of nblocks consecutive keys no caller got
 * before nor will get (the counter only goes up); OverflowError, reserving
 * nothing, if the range would reach 2**64. */
static PyObject *
Cache_reserve(Cache *self, PyObject *arg)
{
    uint64_t n;
    if (!cache_ready(self) || u64_arg(arg, "nblocks", &n) < 0)
        return NULL;
    uint64_t base = self->next_key;
    if (n > UINT64_MAX - base) {
        PyErr_SetString(PyExc_OverflowError, "the block cache's keys are spent (2**64 reserved)");
        return NULL;
    }
    self->next_key = base + n;
    return PyLong_FromUnsignedLongLong((unsigned long long)base);
}

static PyObject *
Cache_evict_range(Cache *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t lo, hi;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "evict_range(lo, hi)");
        return NULL;
    }
    if (!cache_ready(self) || u64_arg(args[0], "a cache key", &lo) < 0
            || u64_arg(args[1], "a cache key", &hi) < 0)
        return NULL;
    if (cache_evict_range(self, lo, hi) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* [(key, size, marked)] of the cached blocks in the ring's order, oldest
 * first: for tests and inspection. */
static PyObject *
Cache_entries(Cache *self, PyObject *Py_UNUSED(ignored))
{
    if (!cache_ready(self))
        return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (size_t j = 0; j < self->rlen; j++) {
        RingItem it = self->ring[(self->rhead + j) & (self->rcap - 1)];
        Py_ssize_t i = cache_find(self, it);
        if (i < 0)
            continue;
        PyObject *t = Py_BuildValue("(KnO)", (unsigned long long)it,
                                    (Py_ssize_t)self->slots[i].size,
                                    self->slots[i].marked ? Py_True : Py_False);
        if (t == NULL || PyList_Append(out, t) < 0) {
            Py_XDECREF(t);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(t);
    }
    return out;
}

static Py_ssize_t
Cache_len(Cache *self)
{
    return self->live;
}

static PyObject *
Cache_get_used(Cache *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->used);
}

static PyObject *
Cache_get_capacity(Cache *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->capacity);
}

static PyObject *
Cache_get_admission(Cache *self, void *Py_UNUSED(closure))
{
    if (self->admission == NULL)
        Py_RETURN_NONE;
    return Py_NewRef((PyObject *)self->admission);
}

static PyMethodDef Cache_methods[] = {
    {"lookup", (PyCFunction)Cache_lookup, METH_O, "lookup(key) -> the cached block or None"},
    {"get", (PyCFunction)Cache_get, METH_O,
     "get(key) -> the cached block or None; a hit is marked as recently used"},
    {"touch", (PyCFunction)Cache_touch, METH_O, "touch(key): mark a hit"},
    {"put", (PyCFunction)(void (*)(void))Cache_put, METH_FASTCALL,
     "put(key, block, size): cache a block, evicting down to the budget"},
    {"admit", (PyCFunction)Cache_admit, METH_O,
     "admit(key) -> whether to cache the block a get read from disk"},
    {"admit_reread", (PyCFunction)Cache_admit_reread, METH_O,
     "admit_reread(key) -> whether to cache the block of a false positive: on its second read"},
    {"reserve", (PyCFunction)Cache_reserve, METH_O,
     "reserve(nblocks) -> the first of nblocks keys of a reader's own: block i's is that + i"},
    {"evict_range", (PyCFunction)(void (*)(void))Cache_evict_range, METH_FASTCALL,
     "evict_range(lo, hi): drop every block with a key in [lo, hi)"},
    {"entries", (PyCFunction)Cache_entries, METH_NOARGS,
     "entries() -> [(key, size, marked)], oldest first"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Cache_getset[] = {
    {"used_bytes", (getter)Cache_get_used, NULL, "bytes the cached blocks count", NULL},
    {"capacity_bytes", (getter)Cache_get_capacity, NULL, "the budget", NULL},
    {"admission", (getter)Cache_get_admission, NULL, "its Admission", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods Cache_as_sequence = {.sq_length = (lenfunc)Cache_len};

static PyTypeObject CacheType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lsmdb._speedups.Cache",
    .tp_basicsize = sizeof(Cache),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Cache(capacity_bytes, admission, min_window=1024, window_divisor=4): "
              "the block cache's books in C.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Cache_init,
    .tp_dealloc = (destructor)Cache_dealloc,
    .tp_traverse = (traverseproc)Cache_traverse,
    .tp_clear = (inquiry)Cache_clear,
    .tp_methods = Cache_methods,
    .tp_getset = Cache_getset,
    .tp_as_sequence = &Cache_as_sequence,
};

/* ---- Getter: a table's whole point read, falling back to Python ------- */

#define GETS 0
#define GETS_ABSENT 1
#define PREFETCH_AHEAD 8
/* get_many's first pass over its keys touches each key object first: loading
 * this many keys ahead made a call 16-17% faster on shuffled keys. */
#define MANY_PREFETCH_AHEAD 16

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
 * twice the keys from the memtable's dict (amortised: each key is hashed
 * about twice), the new lines replacing the old ones only when complete.
 *
 * Writers add a batch's new keys *before* the batch enters the dict, in one
 * call that never releases the GIL or runs Python code, so a reader that
 * finds a key in the dict always finds it in the filter, and a batch still
 * becomes visible in one dict.update.  Keys longer than XXH3_NATIVE_MAX
 * bytes are not added: the getter looks them up in the dict without asking
 * the filter.  A memtable never loses a key (a delete is a tombstone), so the
 * filter never has to. */
#define MF_BITS_PER_KEY 10
#define MF_K 6
#define MF_MIN_KEYS 1024

typedef struct {
    PyObject_HEAD
    PyObject *data;      /* the memtable's dict */
    uint64_t *lines;     /* nlines lines of 8 words, 64-byte aligned in raw */
    void *raw;
    uint64_t nlines;
    Py_ssize_t capacity; /* keys it is sized for */
    Py_ssize_t count;    /* keys added since it was sized */
} MemFilter;

static PyTypeObject MemFilterType;

static inline uint64_t *
mf_line(uint64_t *lines, uint64_t nlines, uint64_t h)
{
    return lines + 8 * (((h >> 32) * nlines) >> 32);
}

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

/* Size the filter for `keys` keys and refill it from the dict; the old lines
 * stay in place until the new ones are complete.  0, or -1 (MemoryError). */
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
    Py_ssize_t pos = 0, count = 0;
    PyObject *key, *value;
    while (PyDict_Next(mf->data, &pos, &key, &value)) {
        if (PyBytes_CheckExact(key) && PyBytes_GET_SIZE(key) <= XXH3_NATIVE_MAX) {
            mf_set(lines, nlines, xxh3_64_of_short(key));
            count++;
        }
    }
    PyMem_RawFree(mf->raw);
    mf->raw = raw;
    mf->lines = lines;
    mf->nlines = nlines;
    mf->capacity = keys;
    mf->count = count;
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
    return mf_resize(self, 2 * PyDict_GET_SIZE(data));
}

static void
MemFilter_dealloc(MemFilter *self)
{
    Py_XDECREF(self->data);
    PyMem_RawFree(self->raw);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The n keys of items (bytes, checked first: a bad one adds nothing) are
 * about to enter the dict.  0, or -1 with an exception set. */
static int
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
    if (self->count + n > self->capacity
        && mf_resize(self, 2 * (PyDict_GET_SIZE(self->data) + n)) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyBytes_GET_SIZE(items[i]) <= XXH3_NATIVE_MAX) {
            mf_set(self->lines, self->nlines, xxh3_64_of_short(items[i]));
            self->count++;
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
     "add_many(keys): keys (a list of bytes) are about to enter the memtable's dict"},
    {"add", (PyCFunction)MemFilter_add, METH_O, "add(key): add_many([key])"},
    {"may_hold", (PyCFunction)MemFilter_may_hold, METH_O,
     "may_hold(key) -> False when the memtable cannot hold key, else True"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef MemFilter_getset[] = {
    {"capacity", (getter)MemFilter_get_capacity, NULL, "keys the filter is sized for", NULL},
    {"nbytes", (getter)MemFilter_get_nbytes, NULL, "bytes of filter lines", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject MemFilterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lsmdb._speedups.MemFilter",
    .tp_basicsize = sizeof(MemFilter),
    .tp_dealloc = (destructor)MemFilter_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "MemFilter(data): a Bloom filter over the keys of a memtable's dict, for gets",
    .tp_methods = MemFilter_methods,
    .tp_getset = MemFilter_getset,
    .tp_init = (initproc)MemFilter_init,
    .tp_new = PyType_GenericNew,
};

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *db;           /* the database (its close empties the cell) */
    PyObject *cell;         /* state.fast_cell: [state.fast], or [None] once the database closed */
    Py_buffer counts;       /* state.counts: gets, gets_absent */
    int have_counts;
    PyObject *missing;      /* the MISSING sentinel */
    PyObject *lookup_block; /* (reader, index_keys, base, counts, key[, block]) -> value/None/MISSING */
    PyObject *slow_get;     /* the Python getter: anything unusual goes there */
    PyObject *decode_read;  /* (reader, block, raw, counts, key) -> value/None/MISSING */
    Cache *cache;           /* the block cache (its entries: block_entry bytes), or NULL */
    Py_ssize_t max_key;
} Getter;

static PyObject *str_fd, *str_mapped;

/* A Getter and its DB refer to each other (db.get is the Getter): the
 * cycle collector must see the references, or neither is ever freed. */
static int
Getter_traverse(Getter *self, visitproc visit, void *arg)
{
    Py_VISIT(self->db);
    Py_VISIT(self->cell);
    Py_VISIT(self->missing);
    Py_VISIT(self->lookup_block);
    Py_VISIT(self->slow_get);
    Py_VISIT(self->decode_read);
    Py_VISIT(self->cache);
    if (self->have_counts)
        Py_VISIT(self->counts.obj);
    return 0;
}

static int
Getter_clear(Getter *self)
{
    if (self->have_counts) {
        self->have_counts = 0;
        PyBuffer_Release(&self->counts);
    }
    Py_CLEAR(self->db);  /* a cleared Getter refuses calls: db is NULL */
    Py_CLEAR(self->cell);
    Py_CLEAR(self->missing);
    Py_CLEAR(self->lookup_block);
    Py_CLEAR(self->slow_get);
    Py_CLEAR(self->decode_read);
    Py_CLEAR(self->cache);
    return 0;
}

static void
Getter_dealloc(Getter *self)
{
    PyObject_GC_UnTrack(self);
    Getter_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Getter_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                   PyObject *kwnames);

static int
Getter_init(Getter *self, PyObject *args, PyObject *kwds)
{
    PyObject *db, *state, *missing, *lookup_block, *slow_get, *cache, *decode_read;
    Py_ssize_t max_key;
    static char *kwlist[] = {"db", "state", "missing", "lookup_block", "slow_get", "max_key",
                             "cache", "decode_read", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOnOO:Getter", kwlist, &db, &state,
                                     &missing, &lookup_block, &slow_get, &max_key, &cache,
                                     &decode_read))
        return -1;
    if (cache != Py_None && (!PyObject_TypeCheck(cache, &CacheType)
                             || ((Cache *)cache)->slots == NULL)) {
        PyErr_SetString(PyExc_TypeError, "cache must be an initialised Cache or None");
        return -1;
    }
    if (self->db != NULL) {
        PyErr_SetString(PyExc_TypeError, "Getter cannot be initialised twice");
        return -1;
    }
    if (!PyCallable_Check(lookup_block) || !PyCallable_Check(slow_get)
        || !PyCallable_Check(decode_read)) {
        PyErr_SetString(PyExc_TypeError,
                        "lookup_block, slow_get and decode_read must be callable");
        return -1;
    }
    PyObject *counts = PyObject_GetAttrString(state, "counts");
    if (counts == NULL)
        return -1;
    int r = PyObject_GetBuffer(counts, &self->counts, PyBUF_WRITABLE | PyBUF_FORMAT);
    Py_DECREF(counts);
    if (r < 0)
        return -1;
    self->have_counts = 1;
    if (self->counts.itemsize != 8 || self->counts.format == NULL
        || strcmp(self->counts.format, "Q") != 0 || self->counts.len < 16) {
        PyErr_SetString(PyExc_TypeError, "state.counts must be an array('Q') of 2 counters");
        return -1;
    }
    PyObject *cell = PyObject_GetAttrString(state, "fast_cell");
    if (cell == NULL)
        return -1;
    if (!PyList_CheckExact(cell) || PyList_GET_SIZE(cell) != 1) {
        Py_DECREF(cell);
        PyErr_SetString(PyExc_TypeError, "state.fast_cell must be a list of one item");
        return -1;
    }
    self->cell = cell;
    self->db = Py_NewRef(db);
    self->missing = Py_NewRef(missing);
    self->lookup_block = Py_NewRef(lookup_block);
    self->slow_get = Py_NewRef(slow_get);
    self->decode_read = Py_NewRef(decode_read);
    if (cache != Py_None)
        self->cache = (Cache *)Py_NewRef(cache);
    self->max_key = max_key;
    self->vectorcall = Getter_vectorcall;
    return 0;
}

/* The first i in e's index words (e->ipre[0:nidx]) with ipre[i] >= v, or
 * nidx: first the group, on itop (one word per INDEX_GROUP, a small array
 * whose lines every lookup shares), then within it, its lines all loaded at
 * once.  A plain bisect over a large file's index waits on a cache miss at
 * each of its last steps. */
static inline Py_ssize_t
index_lower_bound(const Entry *e, uint64_t v)
{
    Py_ssize_t ngroups = (e->nidx + INDEX_GROUP - 1) / INDEX_GROUP;
    Py_ssize_t g = lower_bound_u64(e->itop, ngroups, v);
    if (g == ngroups)
        return e->nidx;
    const uint64_t *grp = e->ipre + g * INDEX_GROUP;
    Py_ssize_t len = e->nidx - g * INDEX_GROUP;
    if (len > INDEX_GROUP)
        len = INDEX_GROUP;
    for (Py_ssize_t j = 0; j < len; j += 8)
        PREFETCH(grp + j);
    return g * INDEX_GROUP + lower_bound_u64(grp, len, v);
}

/* bisect_left of key over e's index keys: on their words (index_lower_bound),
 * the keys themselves compared only where a word equals the key's, as
 * level_pick does for a level's max keys. */
static Py_ssize_t
bisect_index(const Entry *e, PyObject *key)
{
    const char *k = PyBytes_AS_STRING(key);
    Py_ssize_t klen = PyBytes_GET_SIZE(key), cp = e->icp;
    if (e->nidx == 0)
        return 0;
    if (cp && e->ipre != NULL) {
        int c = mem_order(k, klen < cp ? klen : cp, e->ikeys, cp);
        if (c)  /* below the prefix every index key starts with, or beyond them all */
            return c < 0 ? 0 : e->nidx;
    }
    Py_ssize_t lo = 0, hi = e->nidx;
    if (e->ipre != NULL) {
        uint64_t v = be_word(k + cp, klen - cp);
        lo = index_lower_bound(e, v);
        hi = lo < e->nidx && e->ipre[lo] == v
             ? (v == UINT64_MAX ? e->nidx : index_lower_bound(e, v + 1)) : lo;
    }
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (mem_order(e->ikeys + e->ioff[mid], e->ioff[mid + 1] - e->ioff[mid], k, klen) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* icp, ipre and itop of e from its index keys (ikeys, ioff, nidx), when the
 * keys are in order (ties allowed): then every key starts with the prefix
 * the first and the last share.  Keys out of order (the reader refuses such
 * an index) leave ipre NULL: their words would not bisect like the keys, so
 * bisect_index bisects the keys. */
static int
index_words_init(Entry *e)
{
    Py_ssize_t n = e->nidx;
    const char *ik = e->ikeys;
    const Py_ssize_t *off = e->ioff;
    e->icp = 0;
    for (Py_ssize_t i = 1; i < n; i++)
        if (mem_order(ik + off[i - 1], off[i] - off[i - 1], ik + off[i], off[i + 1] - off[i]) > 0)
            return 0;
    if (n == 0)
        return 0;
    Py_ssize_t cp = shared_prefix(ik, off[1] - off[0], ik + off[n - 1], off[n] - off[n - 1]);
    Py_ssize_t ngroups = (n + INDEX_GROUP - 1) / INDEX_GROUP;
    e->ipre = PyMem_Malloc(sizeof(uint64_t) * (size_t)n);
    e->itop = PyMem_Malloc(sizeof(uint64_t) * (size_t)ngroups);
    if (e->ipre == NULL || e->itop == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    e->icp = cp;
    for (Py_ssize_t i = 0; i < n; i++)
        e->ipre[i] = be_word(ik + off[i] + cp, off[i + 1] - off[i] - cp);
    for (Py_ssize_t g = 0; g < ngroups; g++) {
        Py_ssize_t last = (g + 1) * INDEX_GROUP - 1;
        e->itop[g] = e->ipre[last < n ? last : n - 1];
    }
    return 0;
}

/* The block cache's key of block i of a file whose key base is base (an
 * int, the first of the range Cache.reserve gave the file's reader, one
 * key per block, so that base + i stays in it for 0 <= i < its blocks):
 * base + i in *key; 0, or -1 with an exception set. */
static int
block_cache_key(PyObject *base, Py_ssize_t i, uint64_t *key)
{
    unsigned long long b = PyLong_AsUnsignedLongLong(base);
    if (b == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *key = (uint64_t)b + (uint64_t)i;
    return 0;
}

/* The cached block of file entry `item` (reader, index_keys, base, counts)
 * that can hold key: 1 and *block (a new reference to its cached bytes, as
 * block_entry made them; marked as used); 0 when the cache cannot answer (odd
 * types, key past the last block, no cache, or the block is not cached: for
 * the last two *block_index is that block, else -1); -1: error. */
static int
cached_block_for(Getter *self, Entry *e, PyObject *item, PyObject *key, PyObject **block,
                 Py_ssize_t *block_index)
{
    *block_index = -1;
    PyObject *index_keys = PyTuple_GET_ITEM(item, 1), *base = PyTuple_GET_ITEM(item, 2);
    if (!PyList_CheckExact(index_keys) || !PyLong_CheckExact(base))
        return 0;
    if (e->nidx != PyList_GET_SIZE(index_keys))
        return 0;
    Py_ssize_t i = bisect_index(e, key);
    if (i == e->nidx)
        return 0; /* past the last block: let the Python side count it */
    if (self->cache == NULL) {  /* no cache: the caller reads block i */
        *block_index = i;
        return 0;
    }
    uint64_t ck;
    if (block_cache_key(base, i, &ck) < 0)
        return -1;
    Py_ssize_t s = cache_find(self->cache, ck);
    if (s < 0) {
        *block_index = i;
        return 0;
    }
    PyObject *bl = self->cache->slots[s].block;
    if (!PyBytes_CheckExact(bl))
        return 0;
    self->cache->slots[s].marked = 1;
    PREFETCH(PyBytes_AS_STRING(bl));
    *block = Py_NewRef(bl);
    return 1;
}

/* A cached block: the payload as stored, then the offsets of its entries,
 * so that a cache hit bisects the keys instead of walking up to the key and
 * then the values before its own (a walk of up to a few dozen dependent
 * loads over a cold 4 KiB):
 *
 *   payload[P] | key_at[n] u32 | value_at[n] u32 | n u32 | P u32  (little-endian:
 *   rd32 reads them, put_le32 writes them)
 *
 * key_at[j] is the offset in the payload of entry j's key's bin header,
 * value_at[j] of its value's header (bin or nil).  Built by block_entry from
 * a payload block_find reads whole, so the keys are bins in the order the
 * payload has them. */
#define ENTRY_TAIL 8

static inline void
put_le32(unsigned char *p, uint32_t v)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    memcpy(p, &v, 4);
}

static int64_t mp_read_bin(const unsigned char **pp, const unsigned char *end);

/* The count and payload size of a cached block e[0:n] whose tail and size
 * agree: 0; else -1. */
static int
entry_shape(const unsigned char *e, size_t n, uint64_t *count, uint64_t *plen)
{
    if (n < ENTRY_TAIL)
        return -1;
    *count = rd32(e + n - 8);
    *plen = rd32(e + n - 4);
    return *plen + 8 * *count + ENTRY_TAIL == n ? 0 : -1;
}

/* Entry j's key in a cached block (bounds-checked): its length and *kp; -1
 * for an offset or header that does not hold. */
static inline int64_t
entry_key(const unsigned char *e, uint64_t plen, uint64_t j, const unsigned char **kp)
{
    uint64_t at = rd32(e + plen + 4 * j);
    if (at >= plen)
        return -1;
    *kp = e + at;
    return mp_read_bin(kp, e + plen);
}

/* Entry j's value in a cached block (bounds-checked): 1, *value and *vlen;
 * 2, a tombstone; -1, an offset or header that does not hold. */
static int
entry_value(const unsigned char *e, uint64_t count, uint64_t plen, uint64_t j,
            const unsigned char **value, size_t *vlen)
{
    uint64_t at = rd32(e + plen + 4 * count + 4 * j);
    if (at >= plen)
        return -1;
    const unsigned char *q = e + at;
    if (*q == 0xC0)
        return 2;
    int64_t len = mp_read_bin(&q, e + plen);
    if (len < 0)
        return -1;
    *value = q;
    *vlen = (size_t)len;
    return 1;
}

/* The value a lookup found: for f 1 the bytes vp[0:vlen], for f 2 (a
 * tombstone) None.  A new reference, or NULL with an exception set. */
static inline PyObject *
found_value(int f, const unsigned char *vp, size_t vlen)
{
    return f == 2 ? Py_NewRef(Py_None)
                  : PyBytes_FromStringAndSize((const char *)vp, (Py_ssize_t)vlen);
}

static int block_find(const unsigned char *p, size_t n, const unsigned char *key, size_t klen,
                      const unsigned char **value, size_t *vlen);
static int entry_find(const unsigned char *e, size_t n, const unsigned char *key, size_t klen,
                      const unsigned char **value, size_t *vlen);
static PyObject *block_entry(const unsigned char *p, size_t n);

/* The answer for key from a cached block (entry_find), counted: 1, found
 * (*value: a new reference, None for a tombstone); 0, a false positive; 2,
 * an entry that does not hold together (not counted: the Python lookup
 * decodes its payload, and refuses it); -1, error. */
static int
cached_answer(Entry *e, PyObject *entry, PyObject *key, PyObject **value)
{
    const unsigned char *vp = NULL;
    size_t vlen = 0;
    int f = entry_find((const unsigned char *)PyBytes_AS_STRING(entry),
                       (size_t)PyBytes_GET_SIZE(entry),
                       (const unsigned char *)PyBytes_AS_STRING(key),
                       (size_t)PyBytes_GET_SIZE(key), &vp, &vlen);
    if (f < 0)
        return 2;
    uint64_t *counts = (uint64_t *)e->counts.buf;
    counts[BLOCK_CACHE_HITS]++;
    if (f == 0) {
        counts[FALSE_POSITIVES]++;
        return 0;
    }
    *value = found_value(f, vp, vlen);
    if (*value == NULL)
        return -1;
    counts[TRUE_POSITIVES]++;
    return 1;
}

/* After a "maybe" from file entry `item`: answer from the block cache when
 * it holds the block.  1: found, *value set (a new reference; None for a
 * tombstone); 0: a false positive (counted); 2: not answerable here (block
 * not cached, no cache, odd types): the caller asks the Python lookup_block,
 * passing it *block_index when that is >= 0 (the block that can hold key,
 * which the cache does not hold, or there is no cache); -1: error. */
static int
cached_lookup(Getter *self, Entry *e, PyObject *item, PyObject *key, PyObject **value,
              Py_ssize_t *block_index)
{
    PyObject *block;
    int r = cached_block_for(self, e, item, key, &block, block_index);
    if (r <= 0)
        return r < 0 ? -1 : 2;
    int found = cached_answer(e, block, key, value);
    Py_DECREF(block);
    return found;
}

/* ---- a file mapped for block reads ------------------------------------- */

/* A whole SSTable mapped read-only (map_file): the C getter copies a block
 * out of it instead of a pread, a memory copy instead of a system call.
 * Unmapped when freed; a read copying out of it holds a reference. */
typedef struct {
    PyObject_HEAD
    unsigned char *addr;
    size_t len;
} Mapping;

static void
Mapping_dealloc(Mapping *self)
{
#ifndef _WIN32
    if (self->addr != NULL)
        munmap(self->addr, self->len);
#endif
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
Mapping_getbuffer(Mapping *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->addr, (Py_ssize_t)self->len, 1, flags);
}

static PyObject *
Mapping_size(Mapping *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSize_t(self->len);
}

static PyBufferProcs Mapping_as_buffer = {(getbufferproc)Mapping_getbuffer, NULL};

static PyGetSetDef Mapping_getset[] = {
    {"size", (getter)Mapping_size, NULL, "bytes mapped", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject MappingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lsmdb._speedups.Mapping",
    .tp_basicsize = sizeof(Mapping),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A file mapped read-only by map_file (read-only buffer).",
    .tp_dealloc = (destructor)Mapping_dealloc,
    .tp_as_buffer = &Mapping_as_buffer,
    .tp_getset = Mapping_getset,
};

#ifndef _WIN32
/* A page of a mapping that cannot be read (the file cut short under it, a
 * device error) raises SIGBUS at the access.  guarded_copy points bus_env
 * at its jump buffer for the length of its copy; the handler jumps back
 * there, and the copy reports failure instead of the process ending.  A
 * SIGBUS anywhere else, or one sent (kill) rather than raised by a fault,
 * goes to the handler there was before (or ends the process, as it would
 * have).  The handler runs with SA_NODEFER, so jumping
 * out of it leaves SIGBUS unblocked, and sigsetjmp need not save the signal
 * mask (which would be a system call per copy).  bus_env is initial-exec
 * TLS: read in a signal handler, it must not need an allocation. */
static __thread sigjmp_buf *volatile bus_env __attribute__((tls_model("initial-exec")));
static struct sigaction prev_bus;
static int bus_handler_installed;

static void
on_sigbus(int sig, siginfo_t *info, void *uctx)
{
    sigjmp_buf *env = bus_env;
    if (env != NULL && (info == NULL || info->si_code > 0)) {  /* a fault, not a signal sent */
        bus_env = NULL;
        siglongjmp(*env, 1);
    }
    if (prev_bus.sa_flags & SA_SIGINFO) {
        if (prev_bus.sa_sigaction != NULL) {
            prev_bus.sa_sigaction(sig, info, uctx);
            return;
        }
    }
    else if (prev_bus.sa_handler != SIG_DFL && prev_bus.sa_handler != SIG_IGN) {
        prev_bus.sa_handler(sig);
        return;
    }
    /* no handler before ours: the default action.  A fault runs again on
     * return and ends the process; a signal sent is sent again. */
    sigaction(SIGBUS, &prev_bus, NULL);
    if (info == NULL || info->si_code <= 0)
        raise(sig);
}

static int
install_bus_handler(void)
{
    if (bus_handler_installed)
        return 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    if (sigaction(SIGBUS, &sa, &prev_bus) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    bus_handler_installed = 1;
    return 0;
}

/* memcpy(dst, src, n) from a mapping: 0, or -1 when a page of it raised
 * SIGBUS (dst then holds part of the bytes).  Needs no GIL. */
static int
guarded_copy(unsigned char *dst, const unsigned char *src, size_t n)
{
    sigjmp_buf env;
    if (sigsetjmp(env, 0))
        return -1;
    bus_env = &env;
    __asm__ __volatile__("" ::: "memory");  /* the copy stays between the two stores */
    memcpy(dst, src, n);
    __asm__ __volatile__("" ::: "memory");
    bus_env = NULL;
    return 0;
}
#endif

static PyObject *
speedups_map_file(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* map_file(fd, size) -> Mapping: the first size bytes of the open file fd,
     * mapped read-only and shared, advised for random reads. */
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "map_file(fd, size)");
        return NULL;
    }
    long fd = PyLong_AsLong(args[0]);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t size = PyLong_AsSsize_t(args[1]);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    if (fd < 0 || fd > INT_MAX || size <= 0) {
        PyErr_SetString(PyExc_ValueError, "map_file needs an open descriptor and a size > 0");
        return NULL;
    }
#ifdef _WIN32
    PyErr_SetString(PyExc_OSError, "map_file: not on Windows");
    return NULL;
#else
    if (install_bus_handler() < 0)
        return NULL;
    void *addr;
    Py_BEGIN_ALLOW_THREADS
    addr = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, (int)fd, 0);
    Py_END_ALLOW_THREADS
    if (addr == MAP_FAILED)
        return PyErr_SetFromErrno(PyExc_OSError);
#ifdef MADV_RANDOM
    (void)madvise(addr, (size_t)size, MADV_RANDOM);  /* a get reads one block: no read-around */
#endif
    Mapping *m = PyObject_New(Mapping, &MappingType);
    if (m == NULL) {
        munmap(addr, (size_t)size);
        return NULL;
    }
    m->addr = addr;
    m->len = (size_t)size;
    return (PyObject *)m;
#endif
}

/* Copy total bytes at offset out of reader's mapping (reader.mapped) into
 * buf, the GIL released: 0; 1 when the reader has no mapping (the caller
 * reads with pread); 2 when the mapping ends before those bytes or a page of
 * it could not be read (the caller lets Python read them again, and raise);
 * -1 on error. */
static int
mapped_read(PyObject *reader, unsigned char *buf, uint64_t offset, size_t total)
{
#ifdef _WIN32
    (void)reader; (void)buf; (void)offset; (void)total;
    return 1;
#else
    PyObject *mp = PyObject_GetAttr(reader, str_mapped);
    if (mp == NULL)
        return -1;
    if (!Py_IS_TYPE(mp, &MappingType)) {
        Py_DECREF(mp);
        return 1;
    }
    Mapping *m = (Mapping *)mp;
    if (offset > m->len || total > m->len - offset) {
        Py_DECREF(mp);
        return 2;
    }
    int bad;
    Py_BEGIN_ALLOW_THREADS  /* a page not in the page cache waits for the device */
    bad = guarded_copy(buf, m->addr + offset, total);
    Py_END_ALLOW_THREADS
    Py_DECREF(mp);  /* the reader may have dropped it meanwhile: unmapped here then */
    return bad ? 2 : 0;
#endif
}

/* The reader's file descriptor: 0 and *fd; 1 when it has none (closed, or
 * in memory: the caller lets Python serve); -1 on error. */
static int
reader_fd(PyObject *reader, int *fd)
{
    PyObject *a = PyObject_GetAttr(reader, str_fd);
    if (a == NULL)
        return -1;
    long v = PyLong_CheckExact(a) ? PyLong_AsLong(a) : -1;
    Py_DECREF(a);
    if (v == -1 && PyErr_Occurred())
        PyErr_Clear();
    if (v < 0 || v > INT_MAX)
        return 1;
    *fd = (int)v;
    return 0;
}

#define BLOCK_READS 5
#define CRC32_RESIDUE 0x2144DF1Cu  /* crc32(payload + its crc32, little-endian) */

static uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n);
static int block_may_hold(const unsigned char *p, size_t n, const unsigned char *key,
                          size_t klen);

/* block_find for key in the checksum-verified payload buf[0:size] of a block
 * read from disk: 0 without it when block_may_hold's walk of the keys does
 * not meet key (a false positive, recognised without decoding the block);
 * else what block_find says (1 or 2, *vp and *vlen; 0; -1, it refuses the
 * block). */
static inline int
disk_block_find(const unsigned char *buf, size_t size, PyObject *key, const unsigned char **vp,
                size_t *vlen)
{
    const unsigned char *k = (const unsigned char *)PyBytes_AS_STRING(key);
    size_t klen = (size_t)PyBytes_GET_SIZE(key);
    return block_may_hold(buf, size, k, klen) ? block_find(buf, size, k, klen, vp, vlen) : 0;
}

/* Offer block i of file entry item (reader, index_keys, base, counts),
 * whose checksum-verified payload is p[0:size], to the cache: if its
 * admission takes base + i (admission_admit for a block that held the key
 * looked up; admission_admit_reread for a false positive's), cache its
 * block_entry there, counting that entry's size.  0, or -1 on error. */
static int
offer_block(Getter *self, PyObject *item, Py_ssize_t i, const unsigned char *p, size_t size,
            int false_positive)
{
    PyObject *base = PyTuple_GET_ITEM(item, 2);
    if (!PyLong_CheckExact(base))
        return 0;
    uint64_t key;
    if (block_cache_key(base, i, &key) < 0)
        return -1;
    Admission *a = self->cache->admission;
    if (!(false_positive ? admission_admit_reread(a, key) : admission_admit(a, key)))
        return 0;
    PyObject *entry = block_entry(p, size);
    if (entry == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError))
            return -1;
        PyErr_Clear();  /* a block over 1 GiB, or one block_find cannot read: not cached */
        return 0;
    }
    int r = cache_put(self->cache, key, entry, PyBytes_GET_SIZE(entry));
    Py_DECREF(entry);
    return r;
}

/* Data block i of file entry e (of reader) read with one copy out of the
 * reader's mapping, or where it has none one pread (the GIL released either
 * way, as os.pread does), its checksum verified: 0 and *buf (payload and
 * trailer, PyMem_RawMalloc'd: the caller frees it) and *size (the payload's
 * bytes); 2 when Python must read it (an entry without block offsets, the
 * reader closed or in memory, a mapping that ends short or faulted, a short
 * read or a checksum mismatch: it reads again and raises what it should);
 * -1 on error.  Nothing is counted. */
static int
read_block_buf(Entry *e, PyObject *reader, Py_ssize_t i, unsigned char **bufp, size_t *sizep)
{
#ifdef _WIN32
    (void)e; (void)reader; (void)i; (void)bufp; (void)sizep;
    return 2;
#else
    if (e->boff == NULL || i >= e->nidx)  /* an entry without block offsets */
        return 2;
    int fd;
    int r = reader_fd(reader, &fd);  /* now: the reader may have been closed */
    if (r != 0)
        return r < 0 ? -1 : 2;
    uint64_t offset = e->boff[i], size = e->bsize[i];
    if (size > (uint64_t)PY_SSIZE_T_MAX - 4 || offset > (uint64_t)INT64_MAX)
        return 2;
    size_t total = (size_t)size + 4;
    unsigned char *buf = PyMem_RawMalloc(total);
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    ssize_t got = (ssize_t)total;
    r = mapped_read(reader, buf, offset, total);
    if (r < 0 || r == 2) {  /* 2: the mapping ends short or faulted: Python reads again */
        PyMem_RawFree(buf);
        return r;
    }
    if (r == 1) {  /* no mapping */
        Py_BEGIN_ALLOW_THREADS
        got = pread(fd, buf, total, (off_t)offset);
        Py_END_ALLOW_THREADS
    }
    if (got < 0 || (size_t)got != total || crc32_update(0, buf, total) != CRC32_RESIDUE) {
        PyMem_RawFree(buf);
        return 2;
    }
    *bufp = buf;
    *sizep = (size_t)size;
    return 0;
#endif
}

/* After a "maybe" for key in data block i of file entry item (reader,
 * index_keys, base, counts), a block the cache does not hold: read it with
 * one copy out of the reader's mapping, or where it has none one pread (the
 * GIL released either way, as os.pread does), verify its checksum and
 * walk its keys (block_may_hold).  0: a false positive, counted (one block
 * read, one false positive), its block cached if the cache admits it on its
 * second read (admission_admit_reread); 1: found, *value the value
 * block_find took from the bytes read (a new reference; None for a
 * tombstone), one true positive counted, and the payload cached if the
 * cache admits it -- or, for a block block_find refuses, what the Python
 * decode_read made of the bytes read (it raises CorruptionError for a
 * malformed block); 2: let the Python lookup_block serve (the reader is
 * closed or in memory, odd types, a short read or a checksum mismatch: it
 * reads again and raises what it should); -1: error. */
static int
disk_probe(Getter *self, Entry *e, PyObject *item, PyObject *key, Py_ssize_t i,
           PyObject **value)
{
#ifdef _WIN32
    (void)self; (void)e; (void)item; (void)key; (void)i; (void)value;
    return 2;
#else
    PyObject *reader = PyTuple_GET_ITEM(item, 0);
    unsigned char *buf;
    size_t size;
    int r = read_block_buf(e, reader, i, &buf, &size);
    if (r != 0)
        return r;
    size_t total = size + 4;
    uint64_t *counts = (uint64_t *)e->counts.buf;
    counts[BLOCK_READS]++;
    const unsigned char *vp = NULL;
    size_t vlen = 0;
    int f = disk_block_find(buf, size, key, &vp, &vlen);
    if (f == 0) {
        /* a false positive: its block is cached only on its second read
         * within the admission's window (BlockCache.admit_reread) */
        r = self->cache != NULL ? offer_block(self, item, i, buf, (size_t)size, 1) : 0;
        PyMem_RawFree(buf);
        if (r < 0)
            return -1;
        counts[FALSE_POSITIVES]++;
        return 0;
    }
    if (f > 0) {
        /* a full cache takes a block a get read only if it was read not long
         * ago (BlockCache.admit) */
        if (self->cache != NULL && offer_block(self, item, i, buf, (size_t)size, 0) < 0) {
            PyMem_RawFree(buf);
            return -1;
        }
        *value = found_value(f, vp, vlen);
        PyMem_RawFree(buf);
        if (*value == NULL)
            return -1;
        counts[TRUE_POSITIVES]++;
        return 1;
    }
    /* a block block_find refuses: the Python decode_read decodes the bytes
     * read, and raises CorruptionError for a malformed block */
    PyObject *raw = PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)total);
    PyMem_RawFree(buf);
    if (raw == NULL)
        return -1;
    PyObject *index = PyLong_FromSsize_t(i);
    if (index == NULL) {
        Py_DECREF(raw);
        return -1;
    }
    PyObject *args[5] = {reader, index, raw, PyTuple_GET_ITEM(item, 3), key};
    *value = PyObject_Vectorcall(self->decode_read, args, 5, NULL);
    Py_DECREF(index);
    Py_DECREF(raw);
    return *value == NULL ? -1 : 1;
#endif
}

/* The state's fast tuple when the C path can serve: 1 and *fast (a new
 * reference); 0 when the Python getter must (closed database: its close
 * puts None in the cell; no C probes: shadow mode).  The tuple is taken out
 * of the state's cell, a list that TableState.publish and DB.close write:
 * the attribute lookups of db._closed and state.fast it replaced took
 * 13-20% of an absent get (paired, 2,000,000 and 200,000 keys). */
static int
getter_fast(Getter *self, PyObject **fast)
{
    PyObject *cell = self->cell;
    if (PyList_GET_SIZE(cell) != 1)
        return 0;
    PyObject *f = PyList_GET_ITEM(cell, 0);  /* borrowed: no other thread runs until the incref */
    if (!PyTuple_CheckExact(f) || PyTuple_GET_SIZE(f) != 7
        || !PyObject_TypeCheck(PyTuple_GET_ITEM(f, 4), &ProbesType)
        || !PyDict_CheckExact(PyTuple_GET_ITEM(f, 0))
        || !PyTuple_CheckExact(PyTuple_GET_ITEM(f, 1))
        || !PyTuple_CheckExact(PyTuple_GET_ITEM(f, 5))
        || !PyTuple_CheckExact(PyTuple_GET_ITEM(f, 6))
        || PyTuple_GET_SIZE(PyTuple_GET_ITEM(f, 6))
               != PyTuple_GET_SIZE(PyTuple_GET_ITEM(f, 1)) + 1)
        return 0;
    *fast = Py_NewRef(f);
    return 1;
}

/* key in the memtable or the frozen ones (newest first): 1 and *value
 * (borrowed; None for a tombstone), 0 when none has it, -1 on error.  With
 * have_h, h is the key's xxh3_64, and a memtable whose filter (fast[6]) says
 * "no" is passed without a dict lookup. */
static int
mem_lookup(PyObject *fast, PyObject *key, uint64_t h, int have_h, PyObject **value)
{
    PyObject *imms = PyTuple_GET_ITEM(fast, 1), *filters = PyTuple_GET_ITEM(fast, 6);
    for (Py_ssize_t j = -1; j < PyTuple_GET_SIZE(imms); j++) {
        PyObject *d = j < 0 ? PyTuple_GET_ITEM(fast, 0) : PyTuple_GET_ITEM(imms, j);
        if (!PyDict_CheckExact(d)) {
            PyErr_SetString(PyExc_TypeError, "frozen memtable is not a dict");
            return -1;
        }
        PyObject *mf = PyTuple_GET_ITEM(filters, j + 1);
        if (have_h && Py_IS_TYPE(mf, &MemFilterType) && ((MemFilter *)mf)->data == d
            && ((MemFilter *)mf)->lines != NULL && !mf_test((MemFilter *)mf, h))
            continue;
        PyObject *v = PyDict_GetItemWithError(d, key);
        if (v != NULL) {
            *value = v;
            return 1;
        }
        if (PyErr_Occurred())
            return -1;
    }
    return 0;
}

/* Make key the probes' held key with h as its fast hash (the probes' fast
 * hash being this module's xxh3_64), so that the files' probes reuse it. */
static void
probes_hold(Probes *self, PyObject *key, uint64_t h)
{
    if (self->last_key != key) {
        Py_INCREF(key);
        Py_XSETREF(self->last_key, key);
        self->have_keyed = 0;
    }
    self->last_fast = h;
    self->have_fast = 1;
}

/* A get's key hashed once, up front, for the memtable filters and then the
 * files' filters: 1 and *h, or 0 for a key too long to hash inline (its
 * memtable lookups then go straight to the dicts). */
static int
getter_hash(Probes *probes, PyObject *key, uint64_t *h)
{
    if (PyBytes_GET_SIZE(key) > XXH3_NATIVE_MAX)
        return 0;
    *h = xxh3_64_of_short(key);
    if (probes->native_hash)
        probes_hold(probes, key, *h);
    return 1;
}

static PyObject *
Getter_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Getter *self = (Getter *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (self->db == NULL) {
        PyErr_SetString(PyExc_TypeError, "Getter is not initialised");
        return NULL;
    }
    if (kwnames != NULL || nargs < 1 || nargs > 2)
        return PyObject_Vectorcall(self->slow_get, args, nargsf, kwnames);
    PyObject *key = args[0];
    PyObject *dflt = nargs > 1 ? args[1] : Py_None;
    if (!PyBytes_CheckExact(key) || PyBytes_GET_SIZE(key) > self->max_key)
        return PyObject_Vectorcall(self->slow_get, args, nargsf, NULL);
    PyObject *fast = NULL, *result = NULL, *value = NULL;
    int ok = getter_fast(self, &fast);
    if (ok <= 0)  /* 0: the Python getter serves (and raises DatabaseClosedError) */
        return ok < 0 ? NULL : PyObject_Vectorcall(self->slow_get, args, nargsf, NULL);
    uint64_t *counts = (uint64_t *)self->counts.buf;
    counts[GETS]++;
    Probes *probes = (Probes *)PyTuple_GET_ITEM(fast, 4);
    uint64_t h = 0;
    int have_h = getter_hash(probes, key, &h);
    /* The files' filter lines start loading before the memtables are asked:
     * the loads overlap that work. */
    Gather g;
    int gathered = have_h && can_gather(probes, key);
    if (gathered)
        gather_start(probes, key, h, &g);
    int m = mem_lookup(fast, key, h, have_h, &value);
    if (m < 0)
        goto done;
    if (value != NULL) {
        if (value == Py_None)
            goto absent;
        result = Py_NewRef(value);
        goto done;
    }
    PyObject *flat = PyTuple_GET_ITEM(fast, 5);
    Py_ssize_t f = gathered ? gather_finish(probes, &g) : probes_first(probes, key, 0);
    while (f >= 0) {
        if (f >= PyTuple_GET_SIZE(flat)) {
            PyErr_SetString(PyExc_IndexError, "file index beyond the table's files");
            goto done;
        }
        PyObject *item = PyTuple_GET_ITEM(flat, f);
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 4) {
            PyErr_SetString(PyExc_TypeError, "bad file entry");
            goto done;
        }
        if (f >= probes->n) {
            PyErr_SetString(PyExc_IndexError, "file index beyond the probes");
            goto done;
        }
        Py_ssize_t block;
        int c = cached_lookup(self, &probes->e[f], item, key, &value, &block);
        if (c < 0)
            goto done;
        if (c == 0) {  /* a false positive, answered from the cache */
            f = probes_first(probes, key, f + 1);
            continue;
        }
        if (c == 2 && block >= 0) {  /* not in the cache (or no cache): read it here */
            c = disk_probe(self, &probes->e[f], item, key, block, &value);
            if (c < 0)
                goto done;
            if (c == 0) {  /* a false positive, read and walked */
                f = probes_first(probes, key, f + 1);
                continue;
            }
        }
        if (c == 2) {  /* the Python side reads the block */
            PyObject *i = block >= 0 ? PyLong_FromSsize_t(block) : NULL;
            if (block >= 0 && i == NULL)
                goto done;
            PyObject *callargs[6] = {PyTuple_GET_ITEM(item, 0), PyTuple_GET_ITEM(item, 1),
                                     PyTuple_GET_ITEM(item, 2), PyTuple_GET_ITEM(item, 3), key,
                                     i};
            value = PyObject_Vectorcall(self->lookup_block, callargs, i ? 6 : 5, NULL);
            Py_XDECREF(i);
            if (value == NULL)
                goto done;
        }
        if (value == Py_None) {  /* a tombstone: newest version says deleted */
            Py_DECREF(value);
            goto absent;
        }
        if (value != self->missing) {
            result = value;
            goto done;
        }
        Py_DECREF(value);
        f = probes_first(probes, key, f + 1);
    }
    if (f == -2)  /* error in a probe */
        goto done;
absent:
    counts[GETS_ABSENT]++;
    result = Py_NewRef(dflt);
done:
    Py_DECREF(fast);
    return result;
}

/* get_many's memtable and filter steps, file by file: first every key's
 * memtable lookup, hash and a copy of its bytes (keys are objects scattered
 * over the heap: each is visited once, in a loop whose loads overlap), then
 * each file in read order (the level-0 files, then each level's pick) for
 * all the keys still unanswered, on the copies, so that one filter at a time
 * is in the CPU's caches rather than all of them in turn for every key.
 * Each key meets the files in the same order as a get and is counted the
 * same.  A block not cached is read here once for all the keys that need it
 * (disk_probe, disk_probe_many); only a block those cannot serve sends its
 * keys to maybes as (file, i, seed) and no further, and the Python side
 * reads it once.  Only for tables whose filters all use the inline fast
 * hash, or all one keyed hash (kf: each key hashed once, up front, by a
 * Python call, the keys then held by a copy).  0, or -1 with an exception
 * set. */
typedef struct {
    Py_ssize_t f;      /* file (flat index) */
    Py_ssize_t block;  /* its block that can hold the key; -1: not known */
    Py_ssize_t i;      /* the key */
} Miss;

static int
miss_order(const void *x, const void *y)
{
    const Miss *a = x, *b = y;
    if (a->f != b->f)
        return a->f < b->f ? -1 : 1;
    if (a->block != b->block)
        return a->block < b->block ? -1 : 1;
    return (a->i > b->i) - (a->i < b->i);
}

/* A key some file's filter let through in get_many, to be looked up in the
 * cached block that can hold it (cached_batch). */
typedef struct {
    Py_ssize_t i, f;     /* the key, the file (flat index) */
    Py_ssize_t block;    /* out: for res 2, the block to read (-1: unknown) */
    PyObject *cached;    /* the cached block (a new reference) while looked up */
    PyObject *value;     /* out: for res 1, the value (a new reference) */
    int res;             /* out: as cached_lookup: 0 false positive, 1 found, 2 not here */
} Cand;

/* Start loading what entry_find reads of a cached block: its offsets and the
 * keys (the payload's first part), once its tail (the count) is in. */
PREFETCH_HELPER
entry_prefetch(PyObject *entry)
{
    const unsigned char *e = (const unsigned char *)PyBytes_AS_STRING(entry);
    uint64_t count, plen;
    if (entry_shape(e, (size_t)PyBytes_GET_SIZE(entry), &count, &plen) < 0)
        return;
    for (uint64_t off = 0; off < 4 * count; off += 64)  /* key_at */
        PREFETCH(e + plen + off);
    uint64_t keys = plen / 4 < 1024 ? plen / 4 : 1024;  /* where the keys usually are */
    for (uint64_t off = 64; off < keys; off += 64)
        PREFETCH(e + off);
}

/* Cands whose cached blocks cached_batch prefetches ahead of the one it looks in. */
#define CAND_AHEAD 4

/* cached_lookup for many keys at once, counted the same: first every key's
 * cached block is found (its first and last lines prefetched), then each is
 * looked in with the offsets and keys of the blocks CAND_AHEAD further on
 * already loading, so that their misses overlap.  0, or -1 with an
 * exception set (every Cand's references released). */
static int
cached_batch(Getter *self, Probes *probes, PyObject *flat, PyObject *keys, Cand *cs,
             Py_ssize_t nc)
{
    for (Py_ssize_t c = 0; c < nc; c++) {
        cs[c].block = -1;
        cs[c].cached = cs[c].value = NULL;
        cs[c].res = 2;
    }
    for (Py_ssize_t c = 0; c < nc; c++) {
        Cand *x = &cs[c];
        int r = cached_block_for(self, &probes->e[x->f], PyTuple_GET_ITEM(flat, x->f),
                                 PyList_GET_ITEM(keys, x->i), &x->cached, &x->block);
        if (r < 0)
            goto error;
        if (r > 0)
            PREFETCH(PyBytes_AS_STRING(x->cached) + PyBytes_GET_SIZE(x->cached) - 1);
    }
    for (Py_ssize_t c = 0; c < nc; c++) {
        Cand *x = &cs[c];
        if (c + CAND_AHEAD < nc && cs[c + CAND_AHEAD].cached != NULL)
            entry_prefetch(cs[c + CAND_AHEAD].cached);
        if (x->cached == NULL)
            continue;
        x->res = cached_answer(&probes->e[x->f], x->cached, PyList_GET_ITEM(keys, x->i),
                               &x->value);
        Py_CLEAR(x->cached);
        if (x->res < 0)
            goto error;
    }
    return 0;
error:
    for (Py_ssize_t c = 0; c < nc; c++) {
        Py_CLEAR(cs[c].cached);
        Py_CLEAR(cs[c].value);
    }
    return -1;
}

/* The keys of a get_many call: the caller's list, used as it is while
 * nothing can change it (see Getter_many), and a private copy from the first
 * step that runs Python code or lets the GIL go on. */
typedef struct {
    PyObject *given;  /* the caller's list (borrowed) */
    PyObject *keys;   /* given, or a copy of it (a new reference either way) */
    int gc_paused;    /* the collector was running and is paused until own_keys */
} ManyKeys;

/* Make mk->keys a copy of the caller's list (the same objects in the same
 * order, now held by the copy) and let the collector run again.  0, or -1. */
static int
own_keys(ManyKeys *mk)
{
    if (mk->keys == mk->given) {
        PyObject *copy = PyList_GetSlice(mk->given, 0, PyList_GET_SIZE(mk->given));
        if (copy == NULL)
            return -1;
        Py_SETREF(mk->keys, copy);
    }
    if (mk->gc_paused) {
        PyGC_Enable();
        mk->gc_paused = 0;
    }
    return 0;
}

/* disk_probe for several keys (get_many): the keys keys[ms[c].i] for c in
 * [0, nk), every one a "maybe" of file entry e (of item) whose block i the
 * cache does not hold.  The block is read once (read_block_buf) and each key
 * walked for in it as disk_probe walks for one.  1: each answered, res[c] 0
 * for a false positive and 1 for a key found, vals[c] then its value (a new
 * reference; None for a tombstone); one block read counted, a true or a
 * false positive per key, and the block offered to the cache once (admitted
 * as a get's block when it held one of the keys, as a false positive's when
 * it held none).  2: nothing answered or counted (a block Python must read,
 * or one block_find refuses: the Python side reads it for these keys, and
 * raises CorruptionError for a malformed block).  -1: error.  Before it,
 * such a block went to the Python side, which decoded it whole: get_many
 * of 50,000 present keys at 2,000,000 keys took 2.4x the time of a loop of
 * get. */
static int
disk_probe_many(Getter *self, Entry *e, PyObject *item, PyObject *keys, const Miss *ms,
                Py_ssize_t nk, Py_ssize_t i, int *res, PyObject **vals)
{
    unsigned char *buf;
    size_t size;
    int r = read_block_buf(e, PyTuple_GET_ITEM(item, 0), i, &buf, &size);
    if (r != 0)
        return r;
    Py_ssize_t c, found = 0;
    for (c = 0; c < nk; c++) {
        const unsigned char *vp = NULL;
        size_t vlen = 0;
        int f = disk_block_find(buf, size, PyList_GET_ITEM(keys, ms[c].i), &vp, &vlen);
        vals[c] = NULL;
        res[c] = f > 0;
        if (f < 0) {
            r = 2;
            goto fail;
        }
        if (f > 0) {
            vals[c] = found_value(f, vp, vlen);
            if (vals[c] == NULL) {
                r = -1;
                goto fail;
            }
            found++;
        }
    }
    if (self->cache != NULL && offer_block(self, item, i, buf, size, found == 0) < 0) {
        r = -1;
        goto fail;
    }
    PyMem_RawFree(buf);
    uint64_t *counts = (uint64_t *)e->counts.buf;
    counts[BLOCK_READS]++;
    counts[TRUE_POSITIVES] += (uint64_t)found;
    counts[FALSE_POSITIVES] += (uint64_t)(nk - found);
    return 1;
fail:  /* vals[0:c] hold values or NULL; vals[c], where the walk stopped, NULL */
    for (Py_ssize_t d = 0; d < c; d++)
        Py_CLEAR(vals[d]);
    PyMem_RawFree(buf);
    return r;
}

/* The one keyed hash function every filter of probes tests with: 1 and
 * *kf (borrowed), or *kf NULL when no filter is keyed; 0 when the filters
 * use different hashes (the fast one and a keyed one, or two keyed ones, as
 * while rebuild_filters or compactions move a table to another hash). */
static int
probes_one_hash(const Probes *self, PyObject **kf)
{
    PyObject *one = NULL;
    int fast = 0;
    for (Py_ssize_t i = 0; i < self->n; i++) {
        const Entry *e = &self->e[i];
        if (!e->m)
            continue;
        if (e->kf == NULL)
            fast = 1;
        else if (one == NULL)
            one = e->kf;
        else if (e->kf != one)
            return 0;
    }
    if (fast && one != NULL)
        return 0;
    *kf = one;
    return 1;
}

/* get_many's pass over one file (or one level) tests the keys' filters one
 * key after another, each test's early exit a branch the CPU cannot guess,
 * so the lines of one key were fetched only after the last key's test.
 * Where the table's filters outgrow the L2 cache (prefetch_all), each step
 * first starts loading all k probe lines of the key MANY_AHEAD places on.
 * Paired against that, chunks of 1,000 absent keys at 2,000,000 keys took
 * 0.78-0.88x the time (size-tiered, three files), 0.86-0.92x (five files),
 * 0.83-0.87x (leveled); 4 to 32 places ahead measured alike, and only the
 * first 4 lines 0.90x.  Below the threshold, where the lines stay in the L2
 * cache, it cost time (1.04-1.17x at 200,000 keys): not done there. */
#define MANY_AHEAD 8

static int
many_by_file(Getter *self, Probes *probes, PyObject *fast, ManyKeys *mk, PyObject *out,
             PyObject *maybes, uint64_t *absent, PyObject *kf)
{
    PyObject *keys = mk->keys;
    PyObject *flat = PyTuple_GET_ITEM(fast, 5);
    Py_ssize_t n = PyList_GET_SIZE(keys), npend = 0, total = 0;
    int rc = -1;
    for (Py_ssize_t i = 0; i < n; i++)
        total += PyBytes_GET_SIZE(PyList_GET_ITEM(keys, i));
    Py_ssize_t *pending = PyMem_Malloc((n ? n : 1) * sizeof(Py_ssize_t));
    Py_ssize_t *koff = PyMem_Malloc((n + 1) * sizeof(Py_ssize_t));
    uint64_t *hashes = PyMem_Malloc((n ? n : 1) * sizeof(uint64_t));
    char *kbuf = PyMem_Malloc(total ? (size_t)total : 1);
    Miss *misses = PyMem_Malloc((n ? n : 1) * sizeof(Miss));
    Cand *cands = PyMem_Malloc((n ? n : 1) * sizeof(Cand));
    int *res = PyMem_Malloc((n ? n : 1) * sizeof(int));
    PyObject **vals = PyMem_Malloc((n ? n : 1) * sizeof(PyObject *));
    Py_ssize_t *picks = PyMem_Malloc((n ? n : 1) * sizeof(Py_ssize_t));
    /* the hashes the files' filters test: the fast ones, or those of kf */
    uint64_t *fh = kf != NULL ? PyMem_Malloc((n ? n : 1) * sizeof(uint64_t)) : hashes;
    Py_XINCREF(kf);
    if (pending == NULL || koff == NULL || hashes == NULL || kbuf == NULL || misses == NULL
        || cands == NULL || res == NULL || vals == NULL || picks == NULL || fh == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    koff[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *value = NULL;
        Py_ssize_t klen = PyBytes_GET_SIZE(key);
        koff[i + 1] = koff[i] + klen;
        if (xxh3_64_bytes(key, &hashes[i]) < 0)
            goto done;
        if (mem_lookup(fast, key, hashes[i], klen <= XXH3_NATIVE_MAX, &value) < 0)
            goto done;
        if (value != NULL) {
            *absent += value == Py_None;
            PyList_SET_ITEM(out, i, Py_NewRef(value));
            continue;
        }
        if (kf != NULL) {  /* Python code: the caller made keys a copy (own_keys) */
            PyObject *r = PyObject_CallOneArg(kf, key);
            if (r == NULL)
                goto done;
            unsigned long long v = PyLong_AsUnsignedLongLong(r);
            Py_DECREF(r);
            if (v == (unsigned long long)-1 && PyErr_Occurred())
                goto done;
            fh[i] = (uint64_t)v;
        }
        memcpy(kbuf + koff[i], PyBytes_AS_STRING(key), (size_t)klen);
        pending[npend++] = i;
    }
    /* The smallest and largest key still to answer: a level-0 file whose range
     * holds both holds every one, and its range check per key is skipped (a
     * key in range is not counted, so the counters are the same). */
#define KEY_AT(i) kbuf + koff[i], koff[(i) + 1] - koff[i]  /* key i's copy: bytes, length */
    Py_ssize_t kmin = npend ? pending[0] : 0, kmax = kmin;
    for (Py_ssize_t q = 1; q < npend; q++) {
        Py_ssize_t i = pending[q];
        if (mem_order(KEY_AT(i), KEY_AT(kmin)) < 0)
            kmin = i;
        else if (mem_order(KEY_AT(i), KEY_AT(kmax)) > 0)
            kmax = i;
    }
    for (Py_ssize_t j = 0; j < probes->n0 + probes->nlevels && npend > 0; j++) {
        Py_ssize_t keep = 0, nmiss = 0, ncand = 0;
        Entry *whole = j < probes->n0 && range_holds(&probes->e[j], KEY_AT(kmin))
                       && range_holds(&probes->e[j], KEY_AT(kmax)) ? &probes->e[j] : NULL;
        if (j >= probes->n0) {  /* each key's file of this level, picked up front */
            for (Py_ssize_t q = 0; q < npend; q++)
                picks[q] = level_pick(probes, j - probes->n0, PyList_GET_ITEM(keys, pending[q]));
        }
        for (Py_ssize_t q = 0; q < npend; q++) {
            Py_ssize_t i = pending[q];
            Py_ssize_t f = j < probes->n0 ? j : picks[q];
            if (probes->prefetch_all && q + MANY_AHEAD < npend) {
                Py_ssize_t fa = j < probes->n0 ? j : picks[q + MANY_AHEAD];
                if (fa >= 0 && probes->e[fa].m && probes->e[fa].part)
                    prefetch_part_lines(&probes->e[fa], fh[pending[q + MANY_AHEAD]],
                                        probes->e[fa].k);
            }
            if (whole != NULL ? whole->m && !filter_says_maybe(whole, fh[i])
                              : f < 0 || !check_raw(&probes->e[f], KEY_AT(i), fh[i],
                                                    j >= probes->n0)) {
                pending[keep++] = i;  /* not in this file: on to the next */
                continue;
            }
            PyObject *item = f < PyTuple_GET_SIZE(flat) ? PyTuple_GET_ITEM(flat, f) : NULL;
            if (item == NULL || !PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 4) {
                PyErr_SetString(PyExc_IndexError, "bad file entry");
                goto done;
            }
            cands[ncand].i = i;  /* a "maybe": looked up in the cache below */
            cands[ncand].f = f;
            ncand++;
        }
        if (cached_batch(self, probes, flat, keys, cands, ncand) < 0)
            goto done;
        for (Py_ssize_t c = 0; c < ncand; c++) {
            Py_ssize_t i = cands[c].i;
            if (cands[c].res == 0) {  /* a false positive, answered from the cache */
                pending[keep++] = i;
            } else if (cands[c].res == 1) {
                *absent += cands[c].value == Py_None;
                PyList_SET_ITEM(out, i, cands[c].value);
            } else {
                misses[nmiss].f = cands[c].f;  /* the block is not cached: read below */
                misses[nmiss].block = cands[c].block;
                misses[nmiss].i = i;
                nmiss++;
            }
        }
        /* Blocks to read, grouped: a block only one key needs is read here as
         * a get reads it, one that several keys need once for all of them; a
         * block neither can serve goes to the Python side.  A read lets the
         * GIL go and decoding runs Python code: the keys are held by a copy
         * from here. */
        if (nmiss > 0) {
            if (own_keys(mk) < 0)
                goto done;
            keys = mk->keys;
        }
        qsort(misses, (size_t)nmiss, sizeof(Miss), miss_order);
        for (Py_ssize_t a = 0, b; a < nmiss; a = b) {
            for (b = a + 1; b < nmiss && misses[b].f == misses[a].f
                            && misses[b].block == misses[a].block; b++)
                ;
            if (b == a + 1 && misses[a].block >= 0) {
                Py_ssize_t f = misses[a].f, i = misses[a].i;
                PyObject *value = NULL;
                int d = disk_probe(self, &probes->e[f], PyTuple_GET_ITEM(flat, f),
                                   PyList_GET_ITEM(keys, i), misses[a].block, &value);
                if (d < 0)
                    goto done;
                if (d == 0 || (d == 1 && value == self->missing)) {
                    Py_XDECREF(value);  /* a false positive: on to the next file */
                    pending[keep++] = i;
                    continue;
                }
                if (d == 1) {
                    *absent += value == Py_None;
                    PyList_SET_ITEM(out, i, value);
                    continue;
                }
            } else if (misses[a].block >= 0) {  /* several keys: one read for them all */
                Py_ssize_t f = misses[a].f;
                int d = disk_probe_many(self, &probes->e[f], PyTuple_GET_ITEM(flat, f), keys,
                                        misses + a, b - a, misses[a].block, res, vals);
                if (d < 0)
                    goto done;
                if (d == 1) {
                    for (Py_ssize_t c = a; c < b; c++) {
                        Py_ssize_t i = misses[c].i;
                        if (!res[c - a]) {  /* a false positive: on to the next file */
                            pending[keep++] = i;
                            continue;
                        }
                        *absent += vals[c - a] == Py_None;
                        PyList_SET_ITEM(out, i, vals[c - a]);
                    }
                    continue;
                }
            }
            for (Py_ssize_t c = a; c < b; c++) {
                Py_ssize_t i = misses[c].i;
                PyObject *entry = Py_BuildValue("(nn(LLO))", misses[c].f, i,
                                                (long long)hashes[i],
                                                kf != NULL ? (long long)fh[i] : -1LL,
                                                kf != NULL ? kf : Py_None);
                if (entry == NULL)
                    goto done;
                int r = PyList_Append(maybes, entry);
                Py_DECREF(entry);
                if (r < 0)
                    goto done;
                PyList_SET_ITEM(out, i, Py_NewRef(self->missing));
            }
        }
        npend = keep;
    }
    for (Py_ssize_t q = 0; q < npend; q++) {
        PyList_SET_ITEM(out, pending[q], Py_NewRef(Py_None));
        (*absent)++;
    }
    rc = 0;
#undef KEY_AT
done:
    PyMem_Free(pending);
    PyMem_Free(koff);
    PyMem_Free(hashes);
    PyMem_Free(kbuf);
    PyMem_Free(misses);
    PyMem_Free(cands);
    PyMem_Free(res);
    PyMem_Free(vals);
    PyMem_Free(picks);
    if (kf != NULL) {
        PyMem_Free(fh);
        Py_DECREF(kf);
    }
    return rc;
}

static PyObject *
Getter_many(Getter *self, PyObject *keys)
{
    /* many(keys) -> None, or (out, maybes, fast, ks): the first steps of
     * get_many.  keys: a list of bytes.  out[i] is the answer where the
     * memtables or the filters settle it (None: absent), else MISSING;
     * maybes lists (file, i, seed) for those, to be read by the Python side
     * (which counts their absences); fast is the state.fast tuple this answer
     * used (its files are what the indexes in maybes refer to); ks is a list
     * of the keys as they were answered, for the Python side to read the
     * maybes with (a private copy whenever maybes is not empty).  None when the
     * Python path must serve (keys not all plain bytes within the size
     * limit, closed database, no C probes for this state).
     *
     * The caller's list is not copied up front (that cost 5-7% of a call):
     * on the native-hash path with keys short enough to hash here, nothing
     * after getter_fast runs Python code or lets the GIL go until a block has
     * to be read, and the cyclic collector -- whose finalisers could run from
     * any allocation here -- is paused, so the list and its items stay as they
     * are.  Before a block read (it lets the GIL go, and decoding is Python
     * code), and from the start on the other paths (a keyed hash is Python
     * code; xxhash may let the GIL go), a copy holds them (own_keys). */
    if (self->db == NULL) {
        PyErr_SetString(PyExc_TypeError, "Getter is not initialised");
        return NULL;
    }
    if (!PyList_CheckExact(keys)) {
        PyErr_SetString(PyExc_TypeError, "keys must be a list");
        return NULL;
    }
    PyObject *fast = NULL;
    int ok = getter_fast(self, &fast);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    Probes *probes = (Probes *)PyTuple_GET_ITEM(fast, 4);
    PyObject *flat = PyTuple_GET_ITEM(fast, 5);
    PyObject *kf = NULL;  /* the keyed hash of every filter, if they all use one */
    int by_file = probes->native_hash && probes_one_hash(probes, &kf), all_short = 1;
    ManyKeys mk = {keys, Py_NewRef(keys), PyGC_Disable()};
    PyObject *out = NULL, *maybes = NULL, *result = NULL;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        if (i + MANY_PREFETCH_AHEAD < n) {  /* key objects spread over the heap: fetch ahead */
            const char *ahead = (const char *)PyList_GET_ITEM(keys, i + MANY_PREFETCH_AHEAD);
            PREFETCH(ahead);       /* header */
            PREFETCH(ahead + 63);  /* bytes, when the object straddles two lines */
        }
        if (!PyBytes_CheckExact(key) || PyBytes_GET_SIZE(key) > self->max_key) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        all_short &= PyBytes_GET_SIZE(key) <= XXH3_NATIVE_MAX;  /* hashed here, not by xxhash */
    }
    if (!(by_file && all_short && kf == NULL) && own_keys(&mk) < 0)
        goto done;
    out = PyList_New(n);
    maybes = PyList_New(0);
    if (out == NULL || maybes == NULL)
        goto done;
    uint64_t *counts = (uint64_t *)self->counts.buf;
    uint64_t absent = 0;
    if (by_file) {
        if (many_by_file(self, probes, fast, &mk, out, maybes, &absent, kf) < 0)
            goto done;
        n = 0;  /* every key answered or in maybes (which only a block read adds: mk owns) */
    }
    PyObject *ks = mk.keys;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(ks, i);
        if (i + PREFETCH_AHEAD < n) {  /* keys scattered in memory: fetch ahead */
            const char *ahead = (const char *)PyList_GET_ITEM(ks, i + PREFETCH_AHEAD);
            PREFETCH(ahead);
            PREFETCH(ahead + 63);
        }
        PyObject *value = NULL;
        uint64_t h = 0;
        int have_h = getter_hash(probes, key, &h);
        if (mem_lookup(fast, key, h, have_h, &value) < 0)
            goto done;
        if (value != NULL) {
            absent += value == Py_None;
            PyList_SET_ITEM(out, i, Py_NewRef(value));
            continue;
        }
        Py_ssize_t f = probes_first(probes, key, 0);
        value = NULL;
        while (f >= 0) {  /* blocks the cache holds are read here; others wait */
            if (f >= PyTuple_GET_SIZE(flat) || f >= probes->n
                || !PyTuple_CheckExact(PyTuple_GET_ITEM(flat, f))
                || PyTuple_GET_SIZE(PyTuple_GET_ITEM(flat, f)) != 4) {
                PyErr_SetString(PyExc_IndexError, "bad file entry");
                goto done;
            }
            Py_ssize_t block;
            int c = cached_lookup(self, &probes->e[f], PyTuple_GET_ITEM(flat, f), key, &value,
                                  &block);
            if (c < 0)
                goto done;
            if (c == 1)
                break;
            if (c == 2) {  /* the Python side reads this block, once for all keys */
                PyObject *seed = probes->last_key == key ? hash_seed(probes)
                                                         : Py_NewRef(Py_None);
                if (seed == NULL)
                    goto done;
                PyObject *item = Py_BuildValue("(nnN)", f, i, seed);
                if (item == NULL)
                    goto done;
                int r = PyList_Append(maybes, item);
                Py_DECREF(item);
                if (r < 0)
                    goto done;
                value = Py_NewRef(self->missing);
                break;
            }
            f = probes_first(probes, key, f + 1);  /* a false positive: resume */
        }
        if (f == -2)
            goto done;
        if (value == NULL || value == Py_None) {
            absent++;
            Py_XDECREF(value);
            value = Py_NewRef(Py_None);
        }
        PyList_SET_ITEM(out, i, value);
    }
    counts[GETS] += (uint64_t)PyList_GET_SIZE(ks);
    counts[GETS_ABSENT] += absent;
    result = PyTuple_Pack(4, out, maybes, fast, ks);
done:
    if (mk.gc_paused)
        PyGC_Enable();
    Py_DECREF(mk.keys);
    Py_XDECREF(out);
    Py_XDECREF(maybes);
    Py_DECREF(fast);
    return result;
}

static PyMethodDef Getter_methods[] = {
    {"many", (PyCFunction)Getter_many, METH_O,
     "many(keys) -> None or (out, maybes, fast, ks): the memtable and filter steps of get_many"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject GetterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lsmdb._speedups.Getter",
    .tp_basicsize = sizeof(Getter),
    .tp_dealloc = (destructor)Getter_dealloc,
    .tp_vectorcall_offset = offsetof(Getter, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Getter_traverse,
    .tp_clear = (inquiry)Getter_clear,
    .tp_doc = "get(key, default=None): a table's point read with the per-file steps in C;\n"
              "anything but a plain bytes key on an open database with C probes goes to\n"
              "the Python getter (slow_get).",
    .tp_init = (initproc)Getter_init,
    .tp_methods = Getter_methods,
    .tp_new = PyType_GenericNew,
};

/* ---- Merge: k-way merge of sorted sources -------------------------------- */

/* Merge(sources, reverse=False, keep_tombstones=False): iterate (key, value)
 * pairs in key order (descending when reverse) from sources given newest
 * first.  Each source yields chunks (keys, values): two lists of the same
 * length, keys bytes, in the scan's order.  For equal keys the newest
 * source wins, older versions are skipped, and tombstones (value None) are
 * hidden unless keep_tombstones.  The entries are walked in place (no
 * per-entry tuple besides the pair returned).  A source is advanced only at
 * the next call after its entry went out, as a generator would; after an
 * error the iteration is over. */

typedef struct {
    PyObject *chunk;   /* the source's current (keys, values), owned */
    PyObject *keys;    /* borrowed from chunk */
    PyObject *values;  /* borrowed from chunk */
    PyObject *key;     /* keys[pos], borrowed */
    Py_ssize_t pos;
    Py_ssize_t len;
    Py_ssize_t src;    /* age: 0 = newest */
} Head;

typedef struct {
    PyObject_HEAD
    PyObject *sources;  /* tuple of the sources as given, until started */
    PyObject **iters;
    Py_ssize_t nsrc;
    Head *heap;
    Py_ssize_t nheap;
    Head pending;       /* the head whose entry went out last (pending.chunk != NULL) */
    int reverse;
    int keep_tombstones;
    int started;
    int failed;
    PyObject *last_key;
} Merge;

static inline int
head_less(const Merge *self, const Head *a, const Head *b)
{
    int c = bytes_cmp(a->key, b->key);
    if (c)
        return self->reverse ? c > 0 : c < 0;
    return a->src < b->src;
}

static void
sift_down(Merge *self, Py_ssize_t i)
{
    Py_ssize_t n = self->nheap;
    Head h = self->heap[i];
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && head_less(self, &self->heap[c + 1], &self->heap[c]))
            c++;
        if (!head_less(self, &self->heap[c], &h))
            break;
        self->heap[i] = self->heap[c];
        i = c;
    }
    self->heap[i] = h;
}

static void
sift_up(Merge *self, Py_ssize_t i)
{
    Head h = self->heap[i];
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        if (!head_less(self, &h, &self->heap[p]))
            break;
        self->heap[i] = self->heap[p];
        i = p;
    }
    self->heap[i] = h;
}

/* Point h at entry h->pos of its chunk; -1 (TypeError) when the key is not bytes. */
static inline int
head_load(Head *h)
{
    h->key = PyList_GET_ITEM(h->keys, h->pos);
    if (!PyBytes_CheckExact(h->key)) {
        PyErr_SetString(PyExc_TypeError, "merge keys must be bytes");
        return -1;
    }
    return 0;
}

/* Move h to its source's next non-empty chunk: 1 done, 0 exhausted, -1 error. */
static int
next_chunk(Merge *self, Head *h)
{
    Py_CLEAR(h->chunk);
    for (;;) {
        PyObject *chunk = PyIter_Next(self->iters[h->src]);
        if (chunk == NULL)
            return PyErr_Occurred() ? -1 : 0;
        if (!PyTuple_CheckExact(chunk) || PyTuple_GET_SIZE(chunk) != 2
            || !PyList_CheckExact(PyTuple_GET_ITEM(chunk, 0))
            || !PyList_CheckExact(PyTuple_GET_ITEM(chunk, 1))
            || PyList_GET_SIZE(PyTuple_GET_ITEM(chunk, 0))
                   != PyList_GET_SIZE(PyTuple_GET_ITEM(chunk, 1))) {
            Py_DECREF(chunk);
            PyErr_SetString(PyExc_TypeError,
                            "a merge source must yield (keys, values) lists of one length");
            return -1;
        }
        if (PyList_GET_SIZE(PyTuple_GET_ITEM(chunk, 0)) == 0) {
            Py_DECREF(chunk);
            continue;
        }
        h->chunk = chunk;
        h->keys = PyTuple_GET_ITEM(chunk, 0);
        h->values = PyTuple_GET_ITEM(chunk, 1);
        h->pos = 0;
        h->len = PyList_GET_SIZE(h->keys);
        return head_load(h) < 0 ? -1 : 1;
    }
}

/* The next entry of h's source: 1 done, 0 exhausted, -1 error. */
static int
head_advance(Merge *self, Head *h)
{
    /* The lists may have been changed by someone holding them: re-check. */
    if (++h->pos < h->len && h->pos < PyList_GET_SIZE(h->keys)
        && h->pos < PyList_GET_SIZE(h->values))
        return head_load(h) < 0 ? -1 : 1;
    return next_chunk(self, h);
}

static void
merge_fail(Merge *self)
{
    for (Py_ssize_t i = 0; i < self->nheap; i++)
        Py_CLEAR(self->heap[i].chunk);
    self->nheap = 0;
    Py_CLEAR(self->pending.chunk);
    self->failed = 1;
}

static int
merge_start(Merge *self)
{
    Py_ssize_t n = PyTuple_GET_SIZE(self->sources);
    self->iters = PyMem_Calloc(n ? n : 1, sizeof(PyObject *));
    self->heap = PyMem_Calloc(n ? n : 1, sizeof(Head));
    if (self->iters == NULL || self->heap == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->nsrc = n;
    self->started = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        self->iters[i] = PyObject_GetIter(PyTuple_GET_ITEM(self->sources, i));
        if (self->iters[i] == NULL)
            return -1;
    }
    Py_CLEAR(self->sources);
    for (Py_ssize_t i = 0; i < n; i++) {
        Head h = {0};
        h.src = i;
        int r = next_chunk(self, &h);
        if (r < 0) {
            Py_XDECREF(h.chunk);
            return -1;
        }
        if (r) {
            self->heap[self->nheap++] = h;
            sift_up(self, self->nheap - 1);
        }
    }
    return 0;
}

static PyObject *
Merge_next(Merge *self)
{
    if (self->failed)
        return NULL;
    if (!self->started) {
        if (self->sources == NULL) {
            PyErr_SetString(PyExc_TypeError, "Merge is not initialised");
            return NULL;
        }
        if (merge_start(self) < 0) {
            merge_fail(self);
            return NULL;
        }
    }
    for (;;) {
        if (self->pending.chunk != NULL) {
            Head h = self->pending;
            self->pending.chunk = NULL;
            int r = head_advance(self, &h);
            if (r < 0) {
                Py_XDECREF(h.chunk);
                merge_fail(self);
                return NULL;
            }
            if (r) {
                self->heap[self->nheap++] = h;
                sift_up(self, self->nheap - 1);
            }
        }
        if (self->nheap == 0)
            return NULL;
        Head top = self->heap[0];
        self->heap[0] = self->heap[--self->nheap];
        if (self->nheap)
            sift_down(self, 0);
        self->pending = top;  /* advanced at the next call */
        PyObject *key = top.key;
        if (self->last_key != NULL && bytes_cmp(key, self->last_key) == 0)
            continue;  /* an older version of a key already decided */
        Py_INCREF(key);
        Py_XSETREF(self->last_key, key);
        PyObject *value = PyList_GET_ITEM(top.values, top.pos);
        if (value == Py_None && !self->keep_tombstones)
            continue;
        return PyTuple_Pack(2, key, value);
    }
}

static void
Merge_dealloc(Merge *self)
{
    Py_XDECREF(self->sources);
    for (Py_ssize_t i = 0; i < self->nheap; i++)
        Py_XDECREF(self->heap[i].chunk);
    Py_XDECREF(self->pending.chunk);
    if (self->iters) {
        for (Py_ssize_t i = 0; i < self->nsrc; i++)
            Py_XDECREF(self->iters[i]);
        PyMem_Free(self->iters);
    }
    PyMem_Free(self->heap);
    Py_XDECREF(self->last_key);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
Merge_init(Merge *self, PyObject *args, PyObject *kwds)
{
    PyObject *sources;
    int reverse = 0, keep = 0;
    static char *kwlist[] = {"sources", "reverse", "keep_tombstones", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|pp:Merge", kwlist, &sources, &reverse, &keep))
        return -1;
    if (self->sources != NULL || self->started) {
        PyErr_SetString(PyExc_TypeError, "Merge cannot be initialised twice");
        return -1;
    }
    self->sources = PySequence_Tuple(sources);
    if (self->sources == NULL)
        return -1;
    self->reverse = reverse;
    self->keep_tombstones = keep;
    return 0;
}

static PyTypeObject MergeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lsmdb._speedups.Merge",
    .tp_basicsize = sizeof(Merge),
    .tp_dealloc = (destructor)Merge_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Merge(sources, reverse=False, keep_tombstones=False): newest version of each\n"
              "key from sorted sources of (keys, values) chunks, newest source first,\n"
              "tombstones hidden (see lsmdb.merge).",
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)Merge_next,
    .tp_init = (initproc)Merge_init,
    .tp_new = PyType_GenericNew,
};

/* ---- crc32: zlib's CRC-32, folded with carry-less multiplies ------------- */

/* crc32(data, value=0) -> the same int as zlib.crc32(data, value).  On x86-64
 * with PCLMULQDQ, 16-byte lanes are folded with carry-less multiplies (the
 * method of Gopal et al., "Fast CRC Computation for Generic Polynomials Using
 * PCLMULQDQ Instruction", Intel, 2009); the fold constants are powers of x
 * modulo the CRC-32 polynomial, bit-reflected.  Elsewhere, and for the bytes
 * that do not fill a lane, a byte-at-a-time table (lsmdb.coding then keeps
 * zlib's).  tests/test_speedups.py compares it with zlib.crc32 on every
 * length up to 700 bytes and beyond.  With zlib's code the checksum of a
 * 4 KiB block cost about 1.7 us here, most of a block read's CPU time. */

static uint32_t crc_table[256];

static void
crc_table_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int i = 0; i < 8; i++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
}

/* state: the register (already complemented); returns the register. */
static uint32_t
crc_bytes(uint32_t state, const unsigned char *p, size_t n)
{
    while (n--)
        state = crc_table[(state ^ *p++) & 0xFF] ^ (state >> 8);
    return state;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_CLMUL_CODE 1

static int have_clmul;

/* k1, k2: x^(4*128+32) and x^(4*128-32) mod P, reflected, shifted left by
 * one; k3, k4: the same for 128 +- 32; k5: x^64 mod P; then P itself and
 * mu = floor(x^64 / P), both reflected (33 bits). */
static const uint64_t crc_k1k2[2] __attribute__((aligned(16))) = {0x154442bd4, 0x1c6e41596};
static const uint64_t crc_k3k4[2] __attribute__((aligned(16))) = {0x1751997d0, 0x0ccaa009e};
static const uint64_t crc_k5k0[2] __attribute__((aligned(16))) = {0x163cd6124, 0};
static const uint64_t crc_poly[2] __attribute__((aligned(16))) = {0x1db710641, 0x1f7011641};
/* k1, k2 for 8*128 +- 32, twice: the fold by 128 bytes of crc_vclmul's
 * four 256-bit lanes (each of their two 128-bit halves). */
static const uint64_t crc_k1k2_8[4] __attribute__((aligned(32))) = {0x1e88ef372, 0x14a7fe880,
                                                                    0x1e88ef372, 0x14a7fe880};
static int have_vclmul;  /* VPCLMULQDQ and AVX2, and the OS saves the YMM registers */

/* The end of a fold: x1, the 128 bits folded so far, then the 16-byte
 * lanes left at p (n, a multiple of 16), reduced to the 32-bit register. */
__attribute__((target("pclmul,sse4.1")))
static inline uint32_t
crc_clmul_tail(__m128i x1, const unsigned char *p, size_t n)
{
    __m128i x0, x2, x3, x5;
    x0 = _mm_load_si128((const __m128i *)crc_k3k4);
    while (n >= 16) {
        x2 = _mm_loadu_si128((const __m128i *)p);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        p += 16;
        n -= 16;
    }
    /* 128 bits to 64 */
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
    x3 = _mm_setr_epi32(~0, 0, ~0, 0);
    x1 = _mm_srli_si128(x1, 8);
    x1 = _mm_xor_si128(x1, x2);
    x0 = _mm_loadl_epi64((const __m128i *)crc_k5k0);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, x3);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    /* Barrett reduction to 32 bits */
    x0 = _mm_load_si128((const __m128i *)crc_poly);
    x2 = _mm_and_si128(x1, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
    x2 = _mm_and_si128(x2, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}

/* The register after n bytes at p: n >= 64 and a multiple of 16. */
__attribute__((target("pclmul,sse4.1")))
static uint32_t
crc_clmul(uint32_t state, const unsigned char *p, size_t n)
{
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8;
    x1 = _mm_loadu_si128((const __m128i *)(p + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(p + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(p + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(p + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)state));
    x0 = _mm_load_si128((const __m128i *)crc_k1k2);
    p += 64;
    n -= 64;
    while (n >= 64) {  /* four lanes, each folded 512 bits forward */
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), _mm_loadu_si128((const __m128i *)(p + 0x00)));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), _mm_loadu_si128((const __m128i *)(p + 0x10)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), _mm_loadu_si128((const __m128i *)(p + 0x20)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), _mm_loadu_si128((const __m128i *)(p + 0x30)));
        p += 64;
        n -= 64;
    }
    /* the four lanes into one, then the remaining 16-byte lanes */
    x0 = _mm_load_si128((const __m128i *)crc_k3k4);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    return crc_clmul_tail(x1, p, n);
}

/* crc_clmul with the lanes twice as wide (VPCLMULQDQ on 256 bits): four
 * 256-bit lanes, each folded 1024 bits forward, take 128 bytes a step,
 * their eight halves then folded into one and the rest as crc_clmul ends.
 * n >= 256 and a multiple of 16. */
__attribute__((target("avx2,vpclmulqdq,pclmul,sse4.1")))
static uint32_t
crc_vclmul(uint32_t state, const unsigned char *p, size_t n)
{
    __m256i y0, y1, y2, y3, y4, y5, y6, y7, k;
    y1 = _mm256_loadu_si256((const __m256i *)(p + 0x00));
    y2 = _mm256_loadu_si256((const __m256i *)(p + 0x20));
    y3 = _mm256_loadu_si256((const __m256i *)(p + 0x40));
    y4 = _mm256_loadu_si256((const __m256i *)(p + 0x60));
    y1 = _mm256_xor_si256(y1, _mm256_set_epi64x(0, 0, 0, (long long)state));
    k = _mm256_load_si256((const __m256i *)crc_k1k2_8);
    p += 128;
    n -= 128;
    while (n >= 128) {
        y0 = _mm256_clmulepi64_epi128(y1, k, 0x00);
        y5 = _mm256_clmulepi64_epi128(y2, k, 0x00);
        y6 = _mm256_clmulepi64_epi128(y3, k, 0x00);
        y7 = _mm256_clmulepi64_epi128(y4, k, 0x00);
        y1 = _mm256_clmulepi64_epi128(y1, k, 0x11);
        y2 = _mm256_clmulepi64_epi128(y2, k, 0x11);
        y3 = _mm256_clmulepi64_epi128(y3, k, 0x11);
        y4 = _mm256_clmulepi64_epi128(y4, k, 0x11);
        y1 = _mm256_xor_si256(_mm256_xor_si256(y1, y0),
                              _mm256_loadu_si256((const __m256i *)(p + 0x00)));
        y2 = _mm256_xor_si256(_mm256_xor_si256(y2, y5),
                              _mm256_loadu_si256((const __m256i *)(p + 0x20)));
        y3 = _mm256_xor_si256(_mm256_xor_si256(y3, y6),
                              _mm256_loadu_si256((const __m256i *)(p + 0x40)));
        y4 = _mm256_xor_si256(_mm256_xor_si256(y4, y7),
                              _mm256_loadu_si256((const __m256i *)(p + 0x60)));
        p += 128;
        n -= 128;
    }
    /* the eight 128-bit halves, in the order of the bytes, into one */
    __m128i h[8] = {_mm256_castsi256_si128(y1), _mm256_extracti128_si256(y1, 1),
                    _mm256_castsi256_si128(y2), _mm256_extracti128_si256(y2, 1),
                    _mm256_castsi256_si128(y3), _mm256_extracti128_si256(y3, 1),
                    _mm256_castsi256_si128(y4), _mm256_extracti128_si256(y4, 1)};
    __m128i k34 = _mm_load_si128((const __m128i *)crc_k3k4), x1 = h[0];
    for (int j = 1; j < 8; j++) {
        __m128i lo = _mm_clmulepi64_si128(x1, k34, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k34, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, h[j]), lo);
    }
    return crc_clmul_tail(x1, p, n);
}
#endif

static uint32_t
crc32_update(uint32_t crc, const unsigned char *p, size_t n)
{
    uint32_t state = ~crc;
#ifdef HAVE_CLMUL_CODE
    if (have_vclmul && n >= 256) {
        size_t lanes = n & ~(size_t)15;
        state = crc_vclmul(state, p, lanes);
        p += lanes;
        n -= lanes;
    }
    if (have_clmul && n >= 64) {
        size_t lanes = n & ~(size_t)15;
        state = crc_clmul(state, p, lanes);
        p += lanes;
        n -= lanes;
    }
#endif
    return ~crc_bytes(state, p, n);
}

static PyObject *
speedups_crc32(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "crc32(data, value=0)");
        return NULL;
    }
    uint32_t value = 0;
    if (nargs == 2) {
        unsigned long v = PyLong_AsUnsignedLongMask(args[1]);
        if (v == (unsigned long)-1 && PyErr_Occurred())
            return NULL;
        value = (uint32_t)v;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t c;
    if (view.len > 65536) {
        Py_BEGIN_ALLOW_THREADS
        c = crc32_update(value, (const unsigned char *)view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        c = crc32_update(value, (const unsigned char *)view.buf, (size_t)view.len);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

/* ---- block_may_hold: is a key among a data block's keys? ----------------- */

/* Big-endian reads for the msgpack headers. */
static inline uint32_t
be16(const unsigned char *p)
{
    return ((uint32_t)p[0] << 8) | p[1];
}

static inline uint32_t
be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* msgpack array header at *pp (fixarray, array 16, array 32): its count, *pp
 * moved past it; -1 when it is not one or runs past end. */
static int64_t
mp_read_array(const unsigned char **pp, const unsigned char *end)
{
    const unsigned char *p = *pp;
    if (p >= end)
        return -1;
    if ((*p & 0xF0) == 0x90) {
        *pp = p + 1;
        return *p & 0x0F;
    }
    if (*p == 0xDC && end - p >= 3) {
        *pp = p + 3;
        return be16(p + 1);
    }
    if (*p == 0xDD && end - p >= 5) {
        *pp = p + 5;
        return be32(p + 1);
    }
    return -1;
}

/* msgpack bin header at *pp (bin 8/16/32): its length, *pp moved past it, the
 * bytes within end; -1 otherwise. */
static int64_t
mp_read_bin(const unsigned char **pp, const unsigned char *end)
{
    const unsigned char *p = *pp;
    size_t len;
    if (end - p >= 2 && *p == 0xC4) {
        len = p[1];
        p += 2;
    } else if (end - p >= 3 && *p == 0xC5) {
        len = be16(p + 1);
        p += 3;
    } else if (end - p >= 5 && *p == 0xC6) {
        len = be32(p + 1);
        p += 5;
    } else {
        return -1;
    }
    if ((size_t)(end - p) < len)
        return -1;
    *pp = p;
    return (int64_t)len;
}

/* 0 when the data block payload p[0:n] certainly does not hold key, else 1.
 * The payload is msgpack [[key, ...], [value, ...]] with the keys as bins in
 * strictly increasing order (docs/FORMAT.md): the keys are walked in place
 * until one is >= key.  Anything else than that shape answers 1, so the
 * caller decodes the block and reports what is wrong with it. */
static int
block_may_hold(const unsigned char *p, size_t n, const unsigned char *key, size_t klen)
{
    const unsigned char *end = p + n;
    if (n < 2 || p[0] != 0x92)
        return 1;
    p++;
    int64_t count = mp_read_array(&p, end);
    if (count < 0)
        return 1;
    for (int64_t i = 0; i < count; i++) {
        int64_t len = mp_read_bin(&p, end);
        if (len < 0)
            return 1;
        int c = mem_order((const char *)p, (Py_ssize_t)len, (const char *)key, (Py_ssize_t)klen);
        if (c >= 0)
            return c == 0;  /* found it, or passed where it would be */
        p += len;
    }
    return 0;
}

/* Key's entry in a data block payload p[0:n] ([[key, ...], [value, ...]], as
 * the writer packs it), without decoding it: 1, *value and *vlen its bytes;
 * 2, a tombstone; 0, not in the block; -1, a payload of any other shape
 * (non-bin keys, values neither bin nor nil, arrays of unequal length,
 * bytes left over), which the Python decoder then reads and refuses with a
 * CorruptionError.  Walks the whole payload, so it refuses what
 * decode_data_block would whichever key is asked. */
static int
block_find(const unsigned char *p, size_t n, const unsigned char *key, size_t klen,
           const unsigned char **value, size_t *vlen)
{
    const unsigned char *end = p + n;
    if (n < 1 || *p != 0x92)
        return -1;
    p++;
    int64_t count = mp_read_array(&p, end);
    if (count < 0)
        return -1;
    int64_t at = -1;
    for (int64_t i = 0; i < count; i++) {
        int64_t len = mp_read_bin(&p, end);
        if (len < 0)
            return -1;
        if (at < 0 && (size_t)len == klen && memcmp(p, key, klen) == 0)
            at = i;
        p += len;
    }
    if (mp_read_array(&p, end) != count)
        return -1;
    int found = 0;
    for (int64_t i = 0; i < count; i++) {
        if (p < end && *p == 0xC0) {
            if (i == at)
                found = 2;
            p++;
            continue;
        }
        int64_t len = mp_read_bin(&p, end);
        if (len < 0)
            return -1;
        if (i == at) {
            found = 1;
            *value = p;
            *vlen = (size_t)len;
        }
        p += len;
    }
    return p == end ? found : -1;
}

/* The cached block of payload p[0:n]: a new bytes object, or NULL with
 * ValueError set for a payload block_find would refuse (any other shape than
 * the writer's), or another exception. */
static PyObject *
block_entry(const unsigned char *p, size_t n)
{
    const unsigned char *q = p, *end = p + n;
    if (n < 1 || n > UINT32_MAX / 4 || *q != 0x92)
        goto refuse;
    q++;
    int64_t count = mp_read_array(&q, end);
    if (count < 0 || (uint64_t)count > n / 3)  /* a key takes 2 bytes at least, a value 1 */
        goto refuse;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n + 8 * (size_t)count + ENTRY_TAIL));
    if (out == NULL)
        return NULL;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    memcpy(o, p, n);
    unsigned char *keys_at = o + n, *values_at = keys_at + 4 * count;
    for (int64_t i = 0; i < count; i++) {
        put_le32(keys_at + 4 * i, (uint32_t)(q - p));
        int64_t len = mp_read_bin(&q, end);
        if (len < 0)
            goto refuse_out;
        q += len;
    }
    if (mp_read_array(&q, end) != count)
        goto refuse_out;
    for (int64_t i = 0; i < count; i++) {
        put_le32(values_at + 4 * i, (uint32_t)(q - p));
        if (q < end && *q == 0xC0) {
            q++;
            continue;
        }
        int64_t len = mp_read_bin(&q, end);
        if (len < 0)
            goto refuse_out;
        q += len;
    }
    if (q != end)
        goto refuse_out;
    put_le32(values_at + 4 * count, (uint32_t)count);
    put_le32(values_at + 4 * count + 4, (uint32_t)n);
    return out;
refuse_out:
    Py_DECREF(out);
refuse:
    PyErr_SetString(PyExc_ValueError, "not a data block payload block_find reads");
    return NULL;
}

/* block_find for a cached block e[0:n] (block_entry's layout): the key's
 * bin headers bisected through key_at, its value read at value_at.  Every
 * offset and header is checked against the payload's bounds: -1 for an
 * entry that does not hold together. */
static int
entry_find(const unsigned char *e, size_t n, const unsigned char *key, size_t klen,
           const unsigned char **value, size_t *vlen)
{
    uint64_t count, plen;
    if (entry_shape(e, n, &count, &plen) < 0)
        return -1;
    const unsigned char *q;
    uint64_t lo = 0, hi = count;
    while (lo < hi) {
        uint64_t mid = (lo + hi) / 2;
        int64_t len = entry_key(e, plen, mid, &q);
        if (len < 0)
            return -1;
        if (mem_order((const char *)q, (Py_ssize_t)len, (const char *)key, (Py_ssize_t)klen) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == count)
        return 0;
    int64_t len = entry_key(e, plen, lo, &q);
    if (len < 0)
        return -1;
    if ((size_t)len != klen || memcmp(q, key, klen) != 0)
        return 0;
    return entry_value(e, count, plen, lo, value, vlen);
}

static PyObject *
speedups_entry_lists(PyObject *Py_UNUSED(module), PyObject *entry)
{
    /* entry_lists(entry) -> (keys, values): a cached block (block_entry)
     * decoded, as lsmdb.block.decode_data_block decodes its payload;
     * ValueError for an entry that does not hold together. */
    if (!PyBytes_Check(entry)) {
        PyErr_SetString(PyExc_TypeError, "entry_lists(entry: bytes)");
        return NULL;
    }
    const unsigned char *e = (const unsigned char *)PyBytes_AS_STRING(entry);
    uint64_t count, plen;
    if (entry_shape(e, (size_t)PyBytes_GET_SIZE(entry), &count, &plen) < 0)
        goto refuse;
    PyObject *keys = PyList_New((Py_ssize_t)count), *values = PyList_New((Py_ssize_t)count);
    if (keys == NULL || values == NULL)
        goto fail;
    for (uint64_t j = 0; j < count; j++) {
        const unsigned char *q = NULL, *vp = NULL;
        size_t vlen = 0;
        int64_t len = entry_key(e, plen, j, &q);
        int v = len < 0 ? -1 : entry_value(e, count, plen, j, &vp, &vlen);
        if (v < 0) {
            Py_DECREF(keys);
            Py_DECREF(values);
            goto refuse;
        }
        PyObject *k = PyBytes_FromStringAndSize((const char *)q, (Py_ssize_t)len);
        PyObject *val = found_value(v, vp, vlen);
        if (k == NULL || val == NULL) {
            Py_XDECREF(k);
            Py_XDECREF(val);
            goto fail;
        }
        PyList_SET_ITEM(keys, (Py_ssize_t)j, k);
        PyList_SET_ITEM(values, (Py_ssize_t)j, val);
    }
    return Py_BuildValue("(NN)", keys, values);
fail:
    Py_XDECREF(keys);
    Py_XDECREF(values);
    return NULL;
refuse:
    PyErr_SetString(PyExc_ValueError, "not a cached block entry_lists reads");
    return NULL;
}

static PyObject *
speedups_block_entry(PyObject *Py_UNUSED(module), PyObject *payload)
{
    /* block_entry(payload) -> the cached block: the payload, then its entries'
     * offsets; ValueError for a payload block_find cannot read. */
    if (!PyBytes_Check(payload)) {
        PyErr_SetString(PyExc_TypeError, "block_entry(payload: bytes)");
        return NULL;
    }
    return block_entry((const unsigned char *)PyBytes_AS_STRING(payload),
                       (size_t)PyBytes_GET_SIZE(payload));
}

/* The Python face of block_find and entry_find: (bytes, key, missing) ->
 * the value, None for a tombstone, or missing; ValueError with `refused`
 * for what find cannot read. */
static PyObject *
find_call(int (*find)(const unsigned char *, size_t, const unsigned char *, size_t,
                      const unsigned char **, size_t *),
          const char *usage, const char *refused, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    const unsigned char *vp = NULL;
    size_t vlen = 0;
    int r = find((const unsigned char *)PyBytes_AS_STRING(args[0]),
                 (size_t)PyBytes_GET_SIZE(args[0]),
                 (const unsigned char *)PyBytes_AS_STRING(args[1]),
                 (size_t)PyBytes_GET_SIZE(args[1]), &vp, &vlen);
    if (r < 0) {
        PyErr_SetString(PyExc_ValueError, refused);
        return NULL;
    }
    if (r == 0)
        return Py_NewRef(args[2]);
    if (r == 2)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)vp, (Py_ssize_t)vlen);
}

static PyObject *
speedups_entry_find(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* entry_find(entry, key, missing) -> key's value in a cached block
     * (block_entry), None for a tombstone, or missing; ValueError for an
     * entry that does not hold together. */
    return find_call(entry_find, "entry_find(entry: bytes, key: bytes, missing)",
                     "not a cached block entry_find reads", args, nargs);
}

static PyObject *
speedups_block_find(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* block_find(payload, key, missing) -> the value, None for a tombstone,
     * missing when the block does not hold key; ValueError for a payload
     * block_find cannot read (tests). */
    return find_call(block_find, "block_find(payload: bytes, key: bytes, missing)",
                     "not a data block payload block_find reads", args, nargs);
}

static PyObject *
speedups_block_may_hold(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* block_may_hold(raw, key) -> False when the data block raw (payload
     * followed by its 4-byte trailer) certainly does not hold key. */
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "block_may_hold(raw: bytes, key: bytes)");
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]) - 4;
    if (n < 0)
        Py_RETURN_TRUE;
    return PyBool_FromLong(block_may_hold((const unsigned char *)PyBytes_AS_STRING(args[0]),
                                          (size_t)n,
                                          (const unsigned char *)PyBytes_AS_STRING(args[1]),
                                          (size_t)PyBytes_GET_SIZE(args[1])));
}

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

static PyObject *
speedups_encode_ops(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* encode_ops(seq, table_id, keys, values) -> the same bytes as
     * msgpack.packb([seq, [[table_id, keys[i], values[i]], ...]], use_bin_type=True):
     * keys a list of bytes, values a list of bytes or None, of the same length;
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
        if (v == Py_None)
            *p++ = 0xC0;
        else
            p = mp_bin(p, v);
    }
    if (_PyBytes_Resize(&out, (Py_ssize_t)(p - start)) < 0)
        return NULL;
    return out;
}

/* ---- bloom_add: set the bits of many keys ------------------------------- */

static PyObject *
speedups_bloom_add(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* bloom_add(bits, m, k, hashes[, part]): for each 64-bit hash h, set the
     * bits of its k probes, h1 = h & 0xFFFFFFFF, h2 = h >> 32: with part = 0
     * (the default) bits (h1 + i*h2) mod m (format 1); else bits
     * i*part + (((h1 + i*h2) mod 2^32) * part >> 32) (format 2).  The same bits
     * as BloomFilter.add_hash. */
    if (nargs != 4 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "bloom_add(bits, m, k, hashes[, part])");
        return NULL;
    }
    unsigned long long m = PyLong_AsUnsignedLongLong(args[1]);
    if (m == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t k = PyLong_AsSsize_t(args[2]);
    if (k == -1 && PyErr_Occurred())
        return NULL;
    if (k < 0 || k > 1024) {
        PyErr_SetString(PyExc_ValueError, "hash count out of range");
        return NULL;
    }
    unsigned long long part = 0;
    if (nargs == 5) {
        part = PyLong_AsUnsignedLongLong(args[4]);
        if (part == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
        if (check_part(part, m, k) < 0)
            return NULL;
    }
    PyObject *seq = PySequence_Fast(args[3], "hashes must be a sequence of ints");
    if (seq == NULL)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    PyObject *result = NULL;
    if (m == 0 || (uint64_t)view.len < (m + 7) / 8) {
        PyErr_SetString(PyExc_ValueError, "bit array shorter than m bits (or m is 0)");
        goto done;
    }
    unsigned char *bits = (unsigned char *)view.buf;
    uint64_t M = fastmod_M(m);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t j = 0; j < n; j++) {
        unsigned long long h = PyLong_AsUnsignedLongLong(items[j]);
        if (h == (unsigned long long)-1 && PyErr_Occurred())
            goto done;
        if (part) {
            uint32_t g = (uint32_t)h, h2 = (uint32_t)(h >> 32);
            uint64_t base = 0;
            for (Py_ssize_t i = 0; i < k; i++, g += h2, base += part) {
                uint64_t pos = base + part_pos(g, part);
                bits[pos >> 3] |= (unsigned char)(1u << (pos & 7));
            }
            continue;
        }
        uint64_t pos = fastmod(h & 0xFFFFFFFFu, m, M), step = fastmod(h >> 32, m, M);
        for (Py_ssize_t i = 0; i < k; i++) {
            bits[pos >> 3] |= (unsigned char)(1u << (pos & 7));
            pos += step;
            if (pos >= m)
                pos -= m;
        }
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&view);
    Py_DECREF(seq);
    return result;
}

static PyObject *
speedups_fastmod(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* _fastmod(a, d) -> a % d through fastmod (for the tests). */
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_fastmod(a, d)");
        return NULL;
    }
    unsigned long long a = PyLong_AsUnsignedLongLong(args[0]);
    if (a == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    unsigned long long d = PyLong_AsUnsignedLongLong(args[1]);
    if (d == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (d == 0) {
        PyErr_SetString(PyExc_ZeroDivisionError, "_fastmod by zero");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(fastmod(a, d, fastmod_M(d)));
}

static PyObject *
speedups_cmp(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* _cmp(a, b) -> -1, 0 or 1: the key order the C code uses (for the tests). */
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "_cmp(a: bytes, b: bytes)");
        return NULL;
    }
    return PyLong_FromLong(bytes_cmp(args[0], args[1]));
}

static PyMethodDef speedups_functions[] = {
    {"_cmp", (PyCFunction)(void (*)(void))speedups_cmp, METH_FASTCALL,
     "_cmp(a, b) -> -1, 0 or 1: bytes order, computed the way the C code computes it"},
    {"_fastmod", (PyCFunction)(void (*)(void))speedups_fastmod, METH_FASTCALL,
     "_fastmod(a, d) -> a % d, computed the way the filter probes compute it"},
    {"crc32", (PyCFunction)(void (*)(void))speedups_crc32, METH_FASTCALL,
     "crc32(data, value=0) -> zlib.crc32(data, value), folded with PCLMULQDQ where present"},
    {"xxh3_64", (PyCFunction)speedups_xxh3_64, METH_O,
     "xxh3_64(data) -> xxhash.xxh3_64_intdigest(data), computed here up to 240 bytes"},
    {"encode_ops", (PyCFunction)(void (*)(void))speedups_encode_ops, METH_FASTCALL,
     "encode_ops(seq, table_id, keys, values) -> msgpack [seq, [[table_id, key, value], ...]]"},
    {"block_find", (PyCFunction)(void (*)(void))speedups_block_find, METH_FASTCALL,
     "block_find(payload, key, missing) -> key's value in a data block payload, None for a "
     "tombstone, or missing"},
    {"block_entry", (PyCFunction)speedups_block_entry, METH_O,
     "block_entry(payload) -> the block cache's form of a data block: the payload, then its "
     "entries' offsets"},
    {"entry_lists", (PyCFunction)speedups_entry_lists, METH_O,
     "entry_lists(entry) -> (keys, values) of a cached block (block_entry)"},
    {"entry_find", (PyCFunction)(void (*)(void))speedups_entry_find, METH_FASTCALL,
     "entry_find(entry, key, missing) -> key's value in a cached block (block_entry), None for "
     "a tombstone, or missing"},
    {"block_may_hold", (PyCFunction)(void (*)(void))speedups_block_may_hold, METH_FASTCALL,
     "block_may_hold(raw, key) -> False when the data block certainly does not hold key"},
    {"map_file", (PyCFunction)(void (*)(void))speedups_map_file, METH_FASTCALL,
     "map_file(fd, size) -> Mapping: the file mapped read-only for the C getter's block reads"},
    {"bloom_add", (PyCFunction)(void (*)(void))speedups_bloom_add, METH_FASTCALL,
     "bloom_add(bits, m, k, hashes[, part]): set the filter bits of every 64-bit hash"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT, "lsmdb._speedups",
    "Optional C speedups for lsmdb's read path, merges and filter building "
    "(see lsmdb/_speedups.c).", -1, speedups_functions,
};

static int
add_type(PyObject *mod, const char *name, PyTypeObject *type)
{
    Py_INCREF(type);
    if (PyModule_AddObject(mod, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&ProbesType) < 0 || PyType_Ready(&GetterType) < 0
        || PyType_Ready(&MergeType) < 0 || PyType_Ready(&MemFilterType) < 0
        || PyType_Ready(&MappingType) < 0 || PyType_Ready(&AdmissionType) < 0
        || PyType_Ready(&CacheType) < 0)
        return NULL;
    str_fd = PyUnicode_InternFromString("_fd");
    str_mapped = PyUnicode_InternFromString("mapped");
    if (str_fd == NULL || str_mapped == NULL)
        return NULL;
    crc_table_init();
    PyObject *xxhash_mod = PyImport_ImportModule("xxhash");
    if (xxhash_mod == NULL)
        return NULL;
    xxh3_fallback = PyObject_GetAttrString(xxhash_mod, "xxh3_64_intdigest");
    Py_DECREF(xxhash_mod);
    if (xxh3_fallback == NULL)
        return NULL;
#ifdef HAVE_CLMUL_CODE
    __builtin_cpu_init();
    have_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    /* "avx2" is reported only where the OS saves the YMM registers */
    have_vclmul = have_clmul && __builtin_cpu_supports("avx2")
                  && __builtin_cpu_supports("vpclmulqdq") && getenv("LSMDB_NO_VPCLMUL") == NULL;
#endif
#if !defined(_WIN32) && defined(_SC_LEVEL2_CACHE_SIZE)
    long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (l2 > 0)
        prefetch_all_bytes = (uint64_t)l2;
#endif
    PyObject *mod = PyModule_Create(&speedups_module);
    if (mod == NULL)
        return NULL;
    if (PyModule_AddIntConstant(mod, "FILTER_PREFETCH_BYTES", (long)prefetch_all_bytes) < 0
        || add_type(mod, "Probes", &ProbesType) < 0 || add_type(mod, "Getter", &GetterType) < 0
        || add_type(mod, "Merge", &MergeType) < 0
        || add_type(mod, "MemFilter", &MemFilterType) < 0
        || add_type(mod, "Mapping", &MappingType) < 0
        || add_type(mod, "Admission", &AdmissionType) < 0
        || add_type(mod, "Cache", &CacheType) < 0
#ifdef HAVE_CLMUL_CODE
        || PyModule_AddIntConstant(mod, "CRC32_CLMUL", have_clmul) < 0
        || PyModule_AddIntConstant(mod, "CRC32_VPCLMUL", have_vclmul) < 0
#else
        || PyModule_AddIntConstant(mod, "CRC32_CLMUL", 0) < 0
#endif
        ) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
