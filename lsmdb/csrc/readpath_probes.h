/* readpath_probes.h: Probes, the files a point read consults, and each
 * one's Entry -- its key range, its filter, its index, its reader and cache
 * keys -- with the range check and the filter test of a file
 * (readpath_probes.c).  Python twin: the per-file step of lsmdb/readpath.py,
 * over lsmdb/fastpath.py's FileProbes. */

#ifndef LSMDB_READPATH_PROBES_H
#define LSMDB_READPATH_PROBES_H

#include "base.h"
#include "fastpath.h"
#include "filters.h"
#include "filters_hashing.h"
#include "keys.h"

/* Index words per group in bisect_index's two steps: 32 words, four cache
 * lines. */
#define INDEX_GROUP 32

/* One file of a table's Probes: its key range, its filter, its index, its
 * reader and cache keys (readpath_probes.c's entry_init builds it from the
 * file's FileProbe). */
typedef struct {
    PyObject *reader;    /* the SSTableReader (any object for Probes alone) */
    PyObject *lo;        /* bytes */
    PyObject *hi;        /* bytes */
    PyObject *kf;        /* the filter's hash function; NULL: algorithm 1 (xxh3_64) */
    FilterProbe filter;  /* family FILTER_NONE: no filter, every key "maybe" */
    Py_buffer counts;    /* array('Q') */
    char *ikeys;         /* the index keys (last key of each block), back to back */
    Py_ssize_t *ioff;    /* nidx + 1 offsets into ikeys */
    Py_ssize_t nidx;
    Py_ssize_t icp;      /* how many leading bytes all the index keys share */
    uint64_t *ipre;      /* each index key's next 8 bytes after those (bisect_index) */
    uint64_t *itop;      /* ipre's last word of each group of INDEX_GROUP */
    uint64_t *boff;      /* NULL, or each data block's offset and size in the file */
    uint64_t *bsize;
    uint64_t cache_base; /* block i is cached under cache_base + i */
    uint64_t max_seq;    /* the file's newest sequence number */
    int have_counts;
    unsigned char format; /* the file's format version: 1, 2 or 3 */
    char index_shared;   /* ikeys .. bsize point into the reader's compact index
                          * (Probes.owners holds it), not arrays of its own */
    /* What a get's block reads from disk found lately (readpath.c's
     * keys_first): up for a false positive, down for a key there, within
     * +-KEYS_LEAN_MAX; at 0 or above a read looks at the keys first. */
    signed char keys_lean;
    /* How far into its payload a block's keys array ends, in 256ths, as the
     * last keys-first read found it (0: none yet). */
    unsigned char keys_share;
    /* To 320 bytes, five cache lines: the address of entry f is then f * 5
     * shifted (two instructions), where at 304 it took three, and an
     * absent get over three files six instructions more. */
} Entry;

#if defined(__x86_64__) || defined(__aarch64__)
_Static_assert(sizeof(Entry) % 64 == 0, "Entry: adjust pad to a multiple of 64 bytes");
#endif

/* The files a point read consults, level-0 first (readpath_probes.c). */
typedef struct {
    PyObject_HEAD
    Entry *e;
    PyObject **owners;    /* per entry: the compact index it points into, or NULL */
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
    int native_hash;      /* fast_hash is xxh3_64 of filters_hashing.c: computed inline */
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

HIDDEN_BEGIN

extern PyTypeObject ProbesType;

/* readpath_probes.c */
extern uint64_t prefetch_all_bytes;
void readpath_probes_init(void);
Py_ssize_t level_pick(Probes *self, Py_ssize_t L, PyObject *key);
void gather_start(Probes *self, PyObject *key, uint64_t h, Gather *g);
Py_ssize_t gather_finish(Probes *self, const Gather *g);
Py_ssize_t probes_first(Probes *self, PyObject *key, Py_ssize_t start);
int probes_check_l0(Probes *self, Py_ssize_t i, PyObject *key);

HIDDEN_END

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

/* Whether e's filter may hold the key of hash h (or e has none); a "no" is
 * counted. */
static inline int
filter_says_maybe(Entry *e, uint64_t h)
{
    if (filter_maybe(&e->filter, h))
        return 1;
    ((uint64_t *)e->counts.buf)[FILTER_NEGATIVES]++;
    return 0;
}

/* The range check and then the filter test of file e, given the key's bytes
 * k[0:klen] and its hash h under e's hash function, each "no" counted. */
static inline int
check_raw(Entry *e, const char *k, Py_ssize_t klen, uint64_t h, const int picked)
{
    return in_range(e, k, klen, picked) && filter_says_maybe(e, h);
}

/* Whether probes_first from the start gathers for key (probes_gather). */
static inline int
can_gather(const Probes *self, PyObject *key)
{
    return self->native_hash && !self->has_keyed && self->n0 + self->nlevels <= MAX_GATHER
           && PyBytes_GET_SIZE(key) <= XXH3_NATIVE_MAX;
}

#endif
