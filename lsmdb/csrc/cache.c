/* cache.c: the block cache in C -- its admission of blocks read from disk
 * (Admission) and its books (Cache: table, clock and budget), which the C
 * getter reads and fills without a call into Python.  Python twins:
 * lsmdb/cache.py's PyAdmission and PyBlockCache (CBlockCache is PyBlockCache
 * with its books here). */

#include "cache.h"

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
 * runs under the GIL without releasing it, so threads need no lock.  The
 * struct is in speedups.h: the getter's block reads ask it too. */


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
int
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

/* Whether admission_admit_reread(self, key) would say yes now: the block was
 * read and turned away within the window.  Nothing remembered. */
int
admission_rereads(const Admission *self, uint64_t key)
{
    uint64_t b = admission_mix(key) & self->mask;
    return (int)((self->bits[b >> 6] >> (b & 63)) & 1);
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

/* admit(key) (reread 0), admit_reread(key) (1) or rereads(key) (2) of a
 * cache key given from Python: a bool, or NULL with an error set. */
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
    return PyBool_FromLong(reread == 2 ? admission_rereads(self, k)
                           : reread    ? admission_admit_reread(self, k)
                                       : admission_admit(self, k));
}

static PyObject *
Admission_rereads(Admission *self, PyObject *key)
{
    return admission_answer(self, key, 2);
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
     "admit($self, key, /)\n--\n\n"
     "Whether a full cache takes the block read with this cache key."},
    {"admit_reread", (PyCFunction)Admission_admit_reread, METH_O,
     "admit_reread($self, key, /)\n--\n\n"
     "Whether the block read with this cache key is read again within the window."},
    {"rereads", (PyCFunction)Admission_rereads, METH_O,
     "rereads($self, key, /)\n--\n\n"
     "Whether admit_reread(key) would say yes now (nothing remembered)."},
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

PyTypeObject AdmissionType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lsmdb._speedups.Admission",
    .tp_basicsize = sizeof(Admission),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Admission(window)\n--\n\n"
              "Which blocks read from disk a full block cache takes in.",
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
 * no call into Python (the struct is in speedups.h). */
enum { SLOT_EMPTY = 0, SLOT_LIVE = 1, SLOT_GONE = 2 };

Py_ssize_t
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
int
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

static PyObject *
Cache_offer(Cache *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* offer(key, block, found) -> whether block (bytes) was cached: as
     * PyBlockCache.offer, through cache_admits. */
    uint64_t k;
    if (nargs != 3 || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "offer(key, block: bytes, found)");
        return NULL;
    }
    if (!cache_ready(self) || cache_key_arg(args[0], &k) < 0)
        return NULL;
    int found = PyObject_IsTrue(args[2]);
    if (found < 0)
        return NULL;
    if (!cache_admits(self, k, found))
        Py_RETURN_FALSE;
    if (cache_put(self, k, args[1], PyBytes_GET_SIZE(args[1])) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyMethodDef Cache_methods[] = {
    {"offer", (PyCFunction)(void (*)(void))Cache_offer, METH_FASTCALL,
     "offer($self, key, block, found, /)\n--\n\n"
     "Cache a block a read took from disk if the admission takes it (as a get's block when "
     "found, a false positive's when not); whether it did."},
    {"lookup", (PyCFunction)Cache_lookup, METH_O,
     "lookup($self, key, /)\n--\n\nThe cached block or None."},
    {"get", (PyCFunction)Cache_get, METH_O,
     "get($self, key, /)\n--\n\nThe cached block or None; a hit is marked as recently used."},
    {"touch", (PyCFunction)Cache_touch, METH_O, "touch($self, key, /)\n--\n\nMark a hit."},
    {"put", (PyCFunction)(void (*)(void))Cache_put, METH_FASTCALL,
     "put($self, key, block, size, /)\n--\n\nCache a block, evicting down to the budget."},
    {"admit", (PyCFunction)Cache_admit, METH_O,
     "admit($self, key, /)\n--\n\nWhether to cache the block a get read from disk."},
    {"admit_reread", (PyCFunction)Cache_admit_reread, METH_O,
     "admit_reread($self, key, /)\n--\n\n"
     "Whether to cache the block of a false positive: on its second read."},
    {"reserve", (PyCFunction)Cache_reserve, METH_O,
     "reserve($self, nblocks, /)\n--\n\n"
     "The first of nblocks keys of a reader's own: block i's is that + i."},
    {"evict_range", (PyCFunction)(void (*)(void))Cache_evict_range, METH_FASTCALL,
     "evict_range($self, lo, hi, /)\n--\n\nDrop every block with a key in [lo, hi)."},
    {"entries", (PyCFunction)Cache_entries, METH_NOARGS,
     "entries($self, /)\n--\n\n[(key, size, marked)] of the cached blocks, oldest first."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Cache_getset[] = {
    {"used_bytes", (getter)Cache_get_used, NULL, "bytes the cached blocks count", NULL},
    {"capacity_bytes", (getter)Cache_get_capacity, NULL, "the budget", NULL},
    {"admission", (getter)Cache_get_admission, NULL, "its Admission", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods Cache_as_sequence = {.sq_length = (lenfunc)Cache_len};

PyTypeObject CacheType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lsmdb._speedups.Cache",
    .tp_basicsize = sizeof(Cache),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Cache(capacity_bytes, admission, min_window=1024, window_divisor=4)\n--\n\n"
              "The block cache's books in C.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Cache_init,
    .tp_dealloc = (destructor)Cache_dealloc,
    .tp_traverse = (traverseproc)Cache_traverse,
    .tp_clear = (inquiry)Cache_clear,
    .tp_methods = Cache_methods,
    .tp_getset = Cache_getset,
    .tp_as_sequence = &Cache_as_sequence,
};
