/* speedups.h: what the C files of lsmdb._speedups share.
 *
 *   - the slots of the counters they count into;
 *   - the structures that cross files: a table's Probes and their file
 *     Entries, the block Cache and its Admission, a memtable's MemFilter,
 *     the Getter;
 *   - one declaration of each type and function a file defines for others
 *     (everything else in a file is static);
 *   - the helpers of the hot paths (key order, bit positions, range checks,
 *     the cache's admission, the memtable filter's test, a cached block's
 *     shape, the steps get and get_many share), static inline so that each
 *     file compiles them into its loops as it would its own.
 *
 * The files, each named after the Python module whose step it does in C:
 * bloom.c, bloom_probes.c, cache.c, memtable.c, readpath.c,
 * readpath_many.c, sstable_reader.c, block.c, merge.c, logset.c, coding.c,
 * and module.c, the module itself. */

#ifndef LSMDB_SPEEDUPS_H
#define LSMDB_SPEEDUPS_H

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

/* Slots of a file's counters (array('Q')), as lsmdb/stats.py's
 * FILE_COUNTERS orders them: module.c exports their names in slot order
 * (FILE_COUNTERS), which lsmdb checks against stats.py at import, and
 * refuses the C read path on a mismatch. */
#define RANGE_SKIPS 0
#define FILTER_NEGATIVES 1
#define TRUE_POSITIVES 2
#define FALSE_POSITIVES 3
#define FALSE_NEGATIVES 4
#define BLOCK_READS 5
#define BLOCK_CACHE_HITS 6
#define FILE_COUNTER_SLOTS 7

/* Slots of a table's read counters (state.counts, lsmdb/stats.py's
 * TABLE_COUNTERS; exported and checked the same way). */
#define GETS 0
#define GETS_ABSENT 1
#define TABLE_COUNTER_SLOTS 2

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

/* Everything declared from here on is internal to the extension: hidden from
 * the dynamic linker, so that a call from one file into another is a direct
 * call, as a call within one file is.  The module's one export is
 * PyInit__speedups, which PyMODINIT_FUNC makes visible. */
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC visibility push(hidden)
#endif

/* ---- the structures Python hands over ---------------------------------- */

/* The fields of the named tuples of lsmdb/fastpath.py, by index.  module.c
 * exports their names in this order (FILE_PROBE_FIELDS, LEVEL_FIELDS,
 * FAST_PATH_FIELDS), which lsmdb checks against the NamedTuples' _fields at
 * import, and refuses the C read path on a mismatch. */

/* FileProbe: what a point read needs of one SSTable (entry_init reads it). */
#define FILE_READER 0
#define FILE_MIN_KEY 1
#define FILE_MAX_KEY 2
#define FILE_COUNTS 3
#define FILE_KEYED_FN 4
#define FILE_BITS 5
#define FILE_M 6
#define FILE_K 7
#define FILE_PART 8
#define FILE_INDEX_KEYS 9
#define FILE_INDEX_OFFSETS 10
#define FILE_INDEX_SIZES 11
#define FILE_CACHE_BASE 12
#define FILE_FIELDS 13

/* Level: one level below 0, its files' max keys and the files (Probes_init). */
#define LEVEL_MAX_KEYS 0
#define LEVEL_FILES 1
#define LEVEL_FIELDS 2

/* FastPath: a table's read state (state.fast, the item of state.fast_cell;
 * getter_fast checks what the getter reads of it). */
#define FAST_DATA 0
#define FAST_IMM_DATAS 1
#define FAST_L0 2
#define FAST_DEEPER 3
#define FAST_PROBES 4
#define FAST_FILES 5
#define FAST_FILTERS 6
#define FAST_FIELDS 7

/* ---- the structures the files share ------------------------------------ */

/* One file of a table's Probes: its key range, its filter, its index, its
 * reader and cache keys (bloom_probes.c's entry_init builds it from the
 * file's FileProbe). */
typedef struct {
    PyObject *reader;    /* the SSTableReader (any object for Probes alone) */
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
    uint64_t cache_base; /* block i is cached under cache_base + i */
    Py_ssize_t k;
    int have_bits;
    int have_counts;
    /* To 320 bytes, five cache lines: the address of entry f is then f * 5
     * shifted (two instructions), where at 304 it took three, and an
     * absent get over three files six instructions more. */
    char pad[16];
} Entry;

#if defined(__x86_64__) || defined(__aarch64__)
_Static_assert(sizeof(Entry) % 64 == 0, "Entry: adjust pad to a multiple of 64 bytes");
#endif

/* The files a point read consults, level-0 first (bloom_probes.c). */
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
    int native_hash;      /* fast_hash is xxh3_64 of bloom.c: computed inline */
    int has_keyed;        /* some filter uses a keyed hash */
} Probes;

/* Files a lookup can consult (level-0 files plus one per level) up to which
 * probes_first gathers them all first and starts loading their filter lines
 * before testing any (probes_gather). */
#define MAX_GATHER 64

/* The files a lookup of one key meets, gathered (gather_start) before any of
 * their filters is tested (gather_finish). */
typedef struct {
    Py_ssize_t files[MAX_GATHER];
    unsigned char holds[MAX_GATHER];
    Py_ssize_t c;
    uint64_t h;
} Gather;

/* Which blocks a full block cache takes in (cache.c). */
typedef struct {
    PyObject_HEAD
    uint64_t *bits;
    uint64_t mask;        /* bit count - 1 (a power of two) */
    Py_ssize_t window;    /* turned-away reads remembered at most */
    Py_ssize_t count;     /* keys set since the last clear */
    char full;
} Admission;

/* The block cache's books (cache.c): a table of slots and a clock's ring. */
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

/* A Bloom filter over a memtable's keys (memtable.c): a key sets MF_K bits
 * of one 512-bit line. */
#define MF_K 6

typedef struct {
    PyObject_HEAD
    PyObject *data;      /* the memtable's dict */
    uint64_t *lines;     /* nlines lines of 8 words, 64-byte aligned in raw */
    void *raw;
    uint64_t nlines;
    Py_ssize_t capacity; /* keys it is sized for */
    Py_ssize_t count;    /* keys added since it was sized */
} MemFilter;

/* A table's point read in C, db.get itself (readpath.c). */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *db;           /* the database (its close empties the cell) */
    PyObject *cell;         /* state.fast_cell: [state.fast], or [None] once the database closed */
    Py_buffer counts;       /* state.counts: gets, gets_absent */
    int have_counts;
    PyObject *missing;      /* the MISSING sentinel */
    PyObject *lookup_block; /* (reader, key[, block]) -> value/None/MISSING: SSTableReader.lookup */
    PyObject *slow_get;     /* the Python getter: anything unusual goes there */
    Cache *cache;           /* the block cache (its entries: block_entry bytes), or NULL */
    Py_ssize_t max_key;
} Getter;

/* ---- the types, one per file that defines it ----------------------------- */

extern PyTypeObject ProbesType;     /* bloom_probes.c */
extern PyTypeObject AdmissionType;  /* cache.c */
extern PyTypeObject CacheType;      /* cache.c */
extern PyTypeObject MemFilterType;  /* memtable.c */
extern PyTypeObject GetterType;     /* readpath.c */
extern PyTypeObject ContainsType;   /* readpath.c */
extern PyTypeObject MappingType;    /* sstable_reader.c */
extern PyTypeObject MergeType;      /* merge.c */

/* ---- functions of one file that others call ------------------------------ */

/* bloom.c */
int bloom_init(void);
int check_part(uint64_t s, uint64_t m, Py_ssize_t k);
uint64_t xxh3_64_short(const unsigned char *p, size_t n);
int xxh3_64_bytes(PyObject *key, uint64_t *out);
int filter_says_maybe(Entry *e, uint64_t h);
PyObject *speedups_xxh3_64(PyObject *module, PyObject *arg);
PyObject *speedups_bloom_add(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *speedups_fastmod(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* bloom_probes.c */
extern uint64_t prefetch_all_bytes;
void bloom_probes_init(void);
Py_ssize_t level_pick(Probes *self, Py_ssize_t L, PyObject *key);
void gather_start(Probes *self, PyObject *key, uint64_t h, Gather *g);
Py_ssize_t gather_finish(Probes *self, const Gather *g);
Py_ssize_t probes_first(Probes *self, PyObject *key, Py_ssize_t start);

/* cache.c */
int admission_admit_reread(Admission *self, uint64_t key);
Py_ssize_t cache_find(const Cache *c, uint64_t key);
int cache_put(Cache *c, uint64_t key, PyObject *block, Py_ssize_t size);

/* readpath.c */
Py_ssize_t bisect_index(const Entry *e, PyObject *key);
int index_words_init(Entry *e);
int cached_block_for(Getter *self, const Entry *e, PyObject *key, PyObject **block,
                     Py_ssize_t *block_index);
int cached_answer(Entry *e, PyObject *entry, PyObject *key, PyObject **value);
int offer_block(Getter *self, const Entry *e, Py_ssize_t i, const unsigned char *p, size_t size,
                int false_positive);
int disk_probe(Getter *self, Entry *e, PyObject *key, Py_ssize_t i, PyObject **value);
int mem_lookup(PyObject *fast, PyObject *key, uint64_t h, int have_h, PyObject **value);

/* readpath_many.c */
PyObject *Getter_many(Getter *self, PyObject *keys);

/* sstable_reader.c */
int sstable_reader_init(void);
int read_block_buf(Entry *e, PyObject *reader, Py_ssize_t i, unsigned char **bufp,
                   size_t *sizep);
PyObject *speedups_map_file(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* block.c */
int block_may_hold(const unsigned char *p, size_t n, const unsigned char *key, size_t klen);
int block_find(const unsigned char *p, size_t n, const unsigned char *key, size_t klen,
               const unsigned char **value, size_t *vlen);
PyObject *block_entry(const unsigned char *p, size_t n);
int entry_find(const unsigned char *e, size_t n, const unsigned char *key, size_t klen,
               const unsigned char **value, size_t *vlen);
PyObject *speedups_block_may_hold(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *speedups_block_find(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *speedups_block_entry(PyObject *module, PyObject *payload);
PyObject *speedups_entry_find(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *speedups_entry_lists(PyObject *module, PyObject *entry);

/* logset.c */
PyObject *speedups_encode_ops(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* coding.c */
extern int have_clmul;   /* the CPU has PCLMULQDQ (and SSE4.1): crc32 folds 128-bit lanes */
extern int have_vclmul;  /* ... and VPCLMULQDQ and AVX2, saved by the OS: 256-bit lanes
                          * too, unless set_crc32_wide(False) */
void coding_init(void);
uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n);
PyObject *speedups_crc32(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *speedups_set_crc32_wide(PyObject *module, PyObject *arg);

/* ---- inline helpers: the key order, words and bit positions ------------- */

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
 * (g * s) >> 32, as lsmdb/bloom.py's probe_bit (the reference) has it.  A format-2 filter has s < 2^32 (larger ones are written in
 * format 1), so the product fits 64 bits: one multiply.  With a 128-bit
 * product the filter step of a table that fits the caches measured 8-10%
 * slower than format 1's; with this one, the same. */
#define PART_MAX UINT64_C(0xFFFFFFFF)
static inline uint64_t
part_pos(uint32_t g, uint64_t s)
{
    return ((uint64_t)g * s) >> 32;
}

/* Little-endian reads (xxh3's input and secret, a cached block's offsets). */
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

/* ---- inline helpers: a key's hash and a file's range (bloom*.c) ---------- */

/* The longest key xxh3_64 hashes here (bloom.c); longer ones go to the
 * xxhash package. */
#define XXH3_NATIVE_MAX 240

/* The hash of a bytes object of at most XXH3_NATIVE_MAX bytes. */
static inline uint64_t
xxh3_64_of_short(PyObject *key)
{
    return xxh3_64_short((const unsigned char *)PyBytes_AS_STRING(key),
                         (size_t)PyBytes_GET_SIZE(key));
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

/* check for a file of the fast hash, given the key's bytes k[0:klen] and
 * its hash h (get_many). */
static inline int
check_raw(Entry *e, const char *k, Py_ssize_t klen, uint64_t h, const int picked)
{
    return in_range(e, k, klen, picked) && (!e->m || filter_says_maybe(e, h));
}

/* Start loading the lines of the first `lines` probes (at most k) of key
 * hash h in e's partitioned filter (e->part > 0): the bits of bloom.py's
 * probe_bit. */
PREFETCH_HELPER
prefetch_part_lines(const Entry *e, uint64_t h, Py_ssize_t lines)
{
    const unsigned char *bits = (const unsigned char *)e->bits.buf;
    uint32_t g0 = (uint32_t)h, h2 = (uint32_t)(h >> 32);
    uint64_t base = 0;
    for (Py_ssize_t q = 0; q < lines; q++, g0 += h2, base += e->part)
        PREFETCH(bits + ((base + part_pos(g0, e->part)) >> 3));
}

/* Whether probes_first from the start gathers for key (probes_gather). */
static inline int
can_gather(const Probes *self, PyObject *key)
{
    return self->native_hash && !self->has_keyed && self->n0 + self->nlevels <= MAX_GATHER
           && PyBytes_GET_SIZE(key) <= XXH3_NATIVE_MAX;
}

/* The hashes held for the last key, as an opaque seed: (fast, keyed, keyed_fn),
 * -1 for a hash not computed. */
static inline PyObject *
hash_seed(Probes *self)
{
    return Py_BuildValue("(LLO)", self->have_fast ? (long long)self->last_fast : -1LL,
                         self->have_keyed ? (long long)self->last_keyed : -1LL,
                         self->have_keyed ? self->last_kf : Py_None);
}

/* ---- inline helpers: the block cache and the memtable filter ------------ */

/* Whether to cache the block with cache key `key` that a lookup found its
 * key in (and the books kept): every one while the cache has room. */
static inline int
admission_admit(Admission *self, uint64_t key)
{
    return !self->full || admission_admit_reread(self, key);
}

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

/* ---- inline helpers: blocks (block.c) ------------------------------------ */

/* The size of a cached block's tail: its entry count and payload size
 * (block.c draws the layout). */
#define ENTRY_TAIL 8

/* The count and payload size of a cached block e[0:n] whose tail and size
 * agree: 0; else -1. */
static inline int
entry_shape(const unsigned char *e, size_t n, uint64_t *count, uint64_t *plen)
{
    if (n < ENTRY_TAIL)
        return -1;
    *count = rd32(e + n - 8);
    *plen = rd32(e + n - 4);
    return *plen + 8 * *count + ENTRY_TAIL == n ? 0 : -1;
}

/* The value a lookup found: for f 1 the bytes vp[0:vlen], for f 2 (a
 * tombstone) None.  A new reference, or NULL with an exception set. */
static inline PyObject *
found_value(int f, const unsigned char *vp, size_t vlen)
{
    return f == 2 ? Py_NewRef(Py_None)
                  : PyBytes_FromStringAndSize((const char *)vp, (Py_ssize_t)vlen);
}

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

/* ---- inline helpers: the getter's steps that get and get_many share ------ */

/* The state's fast tuple when the C path can serve: 1 and *fast (a new
 * reference); 0 when the Python getter must (closed database: its close
 * puts None in the cell; no C probes: shadow mode).  The tuple is taken out
 * of the state's cell, a list that TableState.publish and DB.close write:
 * the attribute lookups of db._closed and state.fast it replaced took
 * 13-20% of an absent get (paired, 2,000,000 and 200,000 keys). */
static inline int
getter_fast(Getter *self, PyObject **fast)
{
    PyObject *cell = self->cell;
    if (PyList_GET_SIZE(cell) != 1)
        return 0;
    PyObject *f = PyList_GET_ITEM(cell, 0);  /* borrowed: no other thread runs until the incref */
    if (!PyTuple_Check(f) || PyTuple_GET_SIZE(f) != FAST_FIELDS  /* a FastPath */
        || !PyObject_TypeCheck(PyTuple_GET_ITEM(f, FAST_PROBES), &ProbesType)
        || !PyDict_CheckExact(PyTuple_GET_ITEM(f, FAST_DATA))
        || !PyTuple_CheckExact(PyTuple_GET_ITEM(f, FAST_IMM_DATAS))
        || !PyTuple_CheckExact(PyTuple_GET_ITEM(f, FAST_FILTERS))
        || PyTuple_GET_SIZE(PyTuple_GET_ITEM(f, FAST_FILTERS))
               != PyTuple_GET_SIZE(PyTuple_GET_ITEM(f, FAST_IMM_DATAS)) + 1)
        return 0;
    *fast = Py_NewRef(f);
    return 1;
}

/* Make key the probes' held key with h as its fast hash (the probes' fast
 * hash being this module's xxh3_64), so that the files' probes reuse it. */
static inline void
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
static inline int
getter_hash(Probes *probes, PyObject *key, uint64_t *h)
{
    if (PyBytes_GET_SIZE(key) > XXH3_NATIVE_MAX)
        return 0;
    *h = xxh3_64_of_short(key);
    if (probes->native_hash)
        probes_hold(probes, key, *h);
    return 1;
}

/* After a "maybe" from file e: answer from the block cache when it holds
 * the block.  1: found, *value set (a new reference; None for a
 * tombstone); 0: a false positive (counted); 2: not answerable here (block
 * not cached, no cache, an odd cache entry): the caller asks the Python
 * lookup_block, passing it *block_index when that is >= 0 (the block that
 * can hold key, which the cache does not hold, or there is no cache); -1:
 * error. */
static inline int
cached_lookup(Getter *self, Entry *e, PyObject *key, PyObject **value, Py_ssize_t *block_index)
{
    PyObject *block;
    int r = cached_block_for(self, e, key, &block, block_index);
    if (r <= 0)
        return r < 0 ? -1 : 2;
    int found = cached_answer(e, block, key, value);
    Py_DECREF(block);
    return found;
}

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC visibility pop
#endif

#endif
