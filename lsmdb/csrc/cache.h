/* cache.h: the block cache's books (Cache: a table of slots and a clock's
 * ring, under a byte budget) and its admission of blocks read from disk
 * (Admission), which the C read path reads and fills without a call into
 * Python (cache.c).  Python twins: lsmdb/cache.py's PyBlockCache and
 * PyAdmission. */

#ifndef LSMDB_CACHE_H
#define LSMDB_CACHE_H

#include "base.h"

/* The admission's bitmap: bits per turned-away read remembered, and at most
 * (8 MiB).  cache.py's twins: BITS_PER_REMEMBERED, MAX_ADMISSION_BITS
 * (module.c exports these; lsmdb checks them at import). */
#define ADMISSION_BITS_PER_KEY 64
#define ADMISSION_MAX_BITS ((uint64_t)1 << 26)

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

HIDDEN_BEGIN

extern PyTypeObject AdmissionType;
extern PyTypeObject CacheType;

/* cache.c */
int admission_admit_reread(Admission *self, uint64_t key);
int admission_rereads(const Admission *self, uint64_t key);
Py_ssize_t cache_find(const Cache *c, uint64_t key);
int cache_put(Cache *c, uint64_t key, PyObject *block, Py_ssize_t size);

HIDDEN_END

/* Whether to cache the block with cache key `key` that a lookup found its
 * key in (and the books kept): every one while the cache has room. */
static inline int
admission_admit(Admission *self, uint64_t key)
{
    return !self->full || admission_admit_reread(self, key);
}

/* Whether the cache takes the block with cache key `key` that a read just
 * took from disk: as a get's block when the read found its key there
 * (admission_admit), as a false positive's when not (admission_admit_reread,
 * its second read only).  PyBlockCache.offer's twin; the caller builds and
 * puts the block only when this says yes. */
static inline int
cache_admits(Cache *c, uint64_t key, int found)
{
    return found ? admission_admit(c->admission, key) : admission_admit_reread(c->admission, key);
}

#endif
