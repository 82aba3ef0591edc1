/* readpath_probes.c: Probes, the files a point read consults and each one's
 * range check and filter test, in the order of a get.  Python twin: the
 * per-file loop of the getter in lsmdb/readpath.py, over the same FileProbes
 * (lsmdb/fastpath.py).
 *
 * For each SSTable a get consults it does what the Python read path does,
 * in the same order:
 *
 *   key range check            -> counts[RANGE_SKIPS] += 1 when outside
 *   filter probe               -> counts[FILTER_NEGATIVES] += 1 on a "no"
 *                                 (filter_says_maybe: filters.h dispatches
 *                                 on the filter's family)
 *   "maybe" (or no filter)     -> the one data block: from the cache, or
 *                                 read, checked and walked (readpath.c)
 *
 * The hashes are computed at most once per key and reused for every file,
 * also across calls that resume after a false positive (the last key and
 * its hashes are kept, compared by identity while a reference is held).
 *
 * Probes(l0, deeper, fast_hash)
 *   l0:     sequence of FileProbes, newest first
 *   deeper: sequence of Levels (max_keys, files) per level >= 1, sorted by key
 *   FileProbe (lsmdb/fastpath.py, its fields by the FILE_* macros of
 *           fastpath.h): reader, min_key, max_key, counts, hash_fn, filter,
 *           filter_family, filter_data, filter_params, index_keys,
 *           index_offsets, index_sizes, cache_base
 *           counts: array('Q') of the file's counters (stats.FILE_COUNTERS)
 *           hash_fn: None for xxh3_64, else the filter's (keyed) hash
 *           filter_family, filter_data, filter_params: the filter's
 *                   ProbeSpec (filters.c; filter, the object, is Python's)
 *           index_keys, index_offsets, index_sizes: the file's index
 *           reader, cache_base: what the getter reads a block through (any
 *                   object and 0 for Probes alone)
 *   fast_hash: xxh3_64 (an int in [0, 2**64) for every key); given this
 *           module's xxh3_64, the probes compute it inline
 *   prefetch_all_bytes (keyword only): the filter bytes in all above which
 *           lookups start loading every probe's line up front (prefetch_all);
 *           default FILTER_PREFETCH_BYTES, the L2 cache's size
 * Probes.first(key, start) -> index of the first file at or after flat
 *   index `start` (level-0 files, then the deeper levels' files in order)
 *   whose range holds key and whose filter says "maybe"; -1 when none.
 */

#include "readpath_probes.h"
#include "readpath.h"

/* Filters larger than this in all (the L2 cache's size where the system
 * tells it, else 1 MiB) are taken to be mostly out of the L2 cache, so
 * gather_start starts to load the lines of all k probes of each filter, not
 * only the first two (set at import). */
uint64_t prefetch_all_bytes = 1 << 20;

/* prefetch_all_bytes from the L2 cache's size, where the system tells it
 * (at import). */
void
readpath_probes_init(void)
{
#if !defined(_WIN32) && defined(_SC_LEVEL2_CACHE_SIZE)
    long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (l2 > 0)
        prefetch_all_bytes = (uint64_t)l2;
#endif
}

/* ---- a file's compact index, built once per reader ----------------------
 * The index keys back to back with their offsets, the bisect words, and
 * each block's offset and size: what entry_init makes from a FileProbe's
 * lists (a walk over a list of objects, a cache miss each), kept in one
 * bytes object on the reader (SSTableReader._c_index) so that the next
 * Probes over the same file -- one per memtable freeze and per install --
 * points into it instead of building it again. */

static PyObject *s_c_index;  /* "_c_index", interned at the first use */

/* The layout stores Py_ssize_t offsets as 8-byte words: elsewhere each
 * entry keeps arrays of its own. */
#if SIZEOF_SIZE_T == 8
#define CINDEX_ON 1
#else
#define CINDEX_ON 0
#endif

#define CINDEX_MAGIC UINT64_C(0x31584449434d534c)  /* "LSMCIDX1" */

typedef struct {
    uint64_t magic;
    int64_t nidx, icp, has_words, ngroups, keys_len;
} CIndexHead;

static Py_ssize_t
cindex_size(const CIndexHead *h)
{
    return (Py_ssize_t)(sizeof(CIndexHead) + 8 * (size_t)(h->nidx + 1)
                        + (h->has_words ? 8 * (size_t)(h->nidx + h->ngroups) : 0)
                        + 16 * (size_t)h->nidx + (size_t)h->keys_len);
}

/* e's index fields pointed into the compact index `packed` of a file of
 * `expect_nidx` blocks: 0, or -1 (not one: nothing set, no exception).
 * Everything the read path trusts is checked: the arrays' sizes from the
 * block count, the offsets in order within the keys, the shared prefix
 * within the first key. */
static int
cindex_attach(Entry *e, PyObject *packed, Py_ssize_t expect_nidx)
{
    if (!PyBytes_CheckExact(packed) || PyBytes_GET_SIZE(packed) < (Py_ssize_t)sizeof(CIndexHead))
        return -1;
    char *p = PyBytes_AS_STRING(packed);
    CIndexHead h;
    memcpy(&h, p, sizeof h);
    if (h.magic != CINDEX_MAGIC || h.nidx != expect_nidx || h.nidx < 0 || h.keys_len < 0
        || h.nidx > PY_SSIZE_T_MAX / 64 || h.keys_len > PY_SSIZE_T_MAX / 2
        || (uint64_t)h.has_words > 1 || (h.has_words && h.nidx == 0)
        || h.ngroups != (h.has_words ? (h.nidx + INDEX_GROUP - 1) / INDEX_GROUP : 0)
        || h.icp < 0 || (!h.has_words && h.icp != 0)
        || cindex_size(&h) != PyBytes_GET_SIZE(packed))
        return -1;
    char *q = p + sizeof(CIndexHead);
    Py_ssize_t *ioff = (Py_ssize_t *)q;
    q += 8 * (h.nidx + 1);
    for (Py_ssize_t i = 0; i < h.nidx; i++)  /* offsets in order, within the keys */
        if (ioff[i] < 0 || ioff[i] > ioff[i + 1])
            return -1;
    if (ioff[0] != 0 || ioff[h.nidx] != h.keys_len
        || (h.has_words && h.icp > ioff[1] - ioff[0]))  /* the prefix lies in every key */
        return -1;
    e->ioff = ioff;
    e->nidx = (Py_ssize_t)h.nidx;
    e->icp = (Py_ssize_t)h.icp;
    if (h.has_words) {
        e->ipre = (uint64_t *)q;
        q += 8 * h.nidx;
        e->itop = (uint64_t *)q;
        q += 8 * h.ngroups;
    } else {
        e->ipre = e->itop = NULL;
    }
    e->boff = (uint64_t *)q;
    q += 8 * h.nidx;
    e->bsize = (uint64_t *)q;
    q += 8 * h.nidx;
    e->ikeys = q;
    e->index_shared = 1;
    return 0;
}

/* The compact index of e's own arrays (a new reference), or NULL with an
 * exception set. */
static PyObject *
cindex_pack(const Entry *e)
{
    CIndexHead h = {CINDEX_MAGIC, e->nidx, e->icp, e->ipre != NULL,
                    e->ipre != NULL ? (e->nidx + INDEX_GROUP - 1) / INDEX_GROUP : 0,
                    e->ioff[e->nidx]};
    PyObject *packed = PyBytes_FromStringAndSize(NULL, cindex_size(&h));
    if (packed == NULL)
        return NULL;
    char *q = PyBytes_AS_STRING(packed);
    memcpy(q, &h, sizeof h);
    q += sizeof h;
    memcpy(q, e->ioff, 8 * (size_t)(h.nidx + 1));
    q += 8 * (h.nidx + 1);
    if (h.has_words) {
        memcpy(q, e->ipre, 8 * (size_t)h.nidx);
        q += 8 * h.nidx;
        memcpy(q, e->itop, 8 * (size_t)h.ngroups);
        q += 8 * h.ngroups;
    }
    if (h.nidx) {
        memcpy(q, e->boff, 8 * (size_t)h.nidx);
        memcpy(q + 8 * h.nidx, e->bsize, 8 * (size_t)h.nidx);
    }
    q += 16 * h.nidx;
    if (h.keys_len)
        memcpy(q, e->ikeys, (size_t)h.keys_len);
    return packed;
}

static void
entry_free_index(Entry *e)
{
    if (!e->index_shared) {
        PyMem_Free(e->ikeys);
        PyMem_Free(e->ioff);
        PyMem_Free(e->ipre);
        PyMem_Free(e->itop);
        PyMem_Free(e->boff);
        PyMem_Free(e->bsize);
    }
    e->index_shared = 0;
    e->ikeys = NULL;
    e->ioff = NULL;
    e->ipre = NULL;
    e->itop = NULL;
    e->boff = NULL;
    e->bsize = NULL;
}

static void
entry_clear(Entry *e)
{
    entry_free_index(e);
    Py_CLEAR(e->reader);
    Py_CLEAR(e->lo);
    Py_CLEAR(e->hi);
    Py_CLEAR(e->kf);
    filter_probe_clear(&e->filter);
    if (e->have_counts) {
        PyBuffer_Release(&e->counts);
        e->have_counts = 0;
    }
}

/* e from the FileProbe item (its fields by the FILE_* macros); 0, or -1
 * with an exception set (Probes_dealloc releases what e holds by then). */
static int
entry_init(Entry *e, PyObject *item, PyObject **owner)
{
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != FILE_FIELDS) {
        PyErr_SetString(PyExc_TypeError, "a file is a FileProbe (lsmdb/fastpath.py)");
        return -1;
    }
    PyObject *counts = PyTuple_GET_ITEM(item, FILE_COUNTS);
    PyObject *lo = PyTuple_GET_ITEM(item, FILE_MIN_KEY), *hi = PyTuple_GET_ITEM(item, FILE_MAX_KEY);
    PyObject *kf = PyTuple_GET_ITEM(item, FILE_HASH_FN);
    PyObject *index_keys = PyTuple_GET_ITEM(item, FILE_INDEX_KEYS);
    if (!PyBytes_CheckExact(lo) || !PyBytes_CheckExact(hi)) {
        PyErr_SetString(PyExc_TypeError, "min_key and max_key must be bytes");
        return -1;
    }
    e->reader = Py_NewRef(PyTuple_GET_ITEM(item, FILE_READER));
    e->lo = Py_NewRef(lo);
    e->hi = Py_NewRef(hi);
    unsigned long long base = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(item, FILE_CACHE_BASE));
    if (base == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    e->cache_base = base;
    long format = PyLong_AsLong(PyTuple_GET_ITEM(item, FILE_FORMAT_VERSION));
    if (format == -1 && PyErr_Occurred())
        return -1;
    if (format < 1 || format > 3) {
        PyErr_SetString(PyExc_ValueError, "format_version must be 1, 2 or 3");
        return -1;
    }
    e->format = (unsigned char)format;
    unsigned long long max_seq = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(item, FILE_MAX_SEQ));
    if (max_seq == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    e->max_seq = max_seq;
    if (PyObject_GetBuffer(counts, &e->counts, PyBUF_WRITABLE | PyBUF_FORMAT) < 0)
        return -1;
    e->have_counts = 1;
    if (e->counts.itemsize != 8 || e->counts.format == NULL || strcmp(e->counts.format, "Q") != 0
        || e->counts.len < 8 * FILE_COUNTER_SLOTS) {
        PyErr_SetString(PyExc_TypeError, "counts must be an array('Q') of the file counters");
        return -1;
    }
    if (filter_probe_init(&e->filter, PyTuple_GET_ITEM(item, FILE_FILTER_FAMILY),
                          PyTuple_GET_ITEM(item, FILE_FILTER_DATA),
                          PyTuple_GET_ITEM(item, FILE_FILTER_PARAMS)) < 0)
        return -1;
    if (kf != Py_None) {
        if (!PyCallable_Check(kf)) {
            PyErr_SetString(PyExc_TypeError, "hash_fn must be callable or None");
            return -1;
        }
        e->kf = Py_NewRef(kf);
    }
    if (!PyList_CheckExact(index_keys)) {
        PyErr_SetString(PyExc_TypeError, "index_keys must be a list of bytes");
        return -1;
    }
    /* The reader's compact index, where an earlier Probes made it. */
    if (s_c_index == NULL && (s_c_index = PyUnicode_InternFromString("_c_index")) == NULL)
        return -1;
    int keep = 0;  /* make the reader's compact index from this entry's arrays */
    PyObject *cached = CINDEX_ON ? PyObject_GetAttr(e->reader, s_c_index) : NULL;
    if (cached == NULL) {
        PyErr_Clear();  /* not an SSTableReader: the entry keeps arrays of its own */
    } else if (cached == Py_None) {
        keep = 1;
        Py_DECREF(cached);
    } else if (cindex_attach(e, cached, PyList_GET_SIZE(index_keys)) == 0) {
        *owner = cached;
        return 0;
    } else {
        Py_DECREF(cached);  /* not this file's: build this entry's own */
    }
    /* A compact copy of the index keys: the bisect after a "maybe" walks one
     * small buffer instead of a list of objects spread over the heap. */
    Py_ssize_t nidx = PyList_GET_SIZE(index_keys), total = 0;
    for (Py_ssize_t i = 0; i < nidx; i++) {
        PyObject *ik = PyList_GET_ITEM(index_keys, i);
        if (!PyBytes_CheckExact(ik)) {
            PyErr_SetString(PyExc_TypeError, "index_keys must be a list of bytes");
            return -1;
        }
        total += PyBytes_GET_SIZE(ik);
    }
    e->ikeys = PyMem_Malloc(total ? (size_t)total : 1);
    e->ioff = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(nidx + 1));
    if (e->ikeys == NULL || e->ioff == NULL) {
        PyErr_NoMemory();
        return -1;
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
        return -1;
    /* where each block is: a get's disk read needs no lookup */
    PyObject *offs = PyTuple_GET_ITEM(item, FILE_INDEX_OFFSETS);
    PyObject *sizes = PyTuple_GET_ITEM(item, FILE_INDEX_SIZES);
    if (!PyList_CheckExact(offs) || !PyList_CheckExact(sizes)
        || PyList_GET_SIZE(offs) != nidx || PyList_GET_SIZE(sizes) != nidx) {
        PyErr_SetString(PyExc_TypeError, "offsets and sizes must be lists, one per block");
        return -1;
    }
    e->boff = PyMem_Malloc(sizeof(uint64_t) * (size_t)(nidx ? nidx : 1));
    e->bsize = PyMem_Malloc(sizeof(uint64_t) * (size_t)(nidx ? nidx : 1));
    if (e->boff == NULL || e->bsize == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < nidx; i++) {
        e->boff[i] = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(offs, i));
        e->bsize[i] = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(sizes, i));
        if (PyErr_Occurred())
            return -1;
    }
    /* Kept on the reader (set once: None there) for the next Probes. */
    if (keep) {
        PyObject *packed = cindex_pack(e);
        if (packed == NULL)
            return -1;
        if (PyObject_SetAttr(e->reader, s_c_index, packed) < 0) {
            PyErr_Clear();  /* it cannot keep one: the entry keeps its own arrays */
            Py_DECREF(packed);
            return 0;
        }
        Entry own = *e;
        if (cindex_attach(e, packed, nidx) < 0) {  /* cannot happen: it was just made */
            Py_DECREF(packed);
            return 0;  /* e unchanged: its own arrays */
        }
        entry_free_index(&own);
        *owner = packed;
    }
    return 0;
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
    if (self->owners) {
        for (Py_ssize_t i = 0; i < self->n; i++)
            Py_XDECREF(self->owners[i]);
        PyMem_Free(self->owners);
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
        PyObject *level = PyTuple_GET_ITEM(deeper, L);
        if (!PyTuple_Check(level) || PyTuple_GET_SIZE(level) != LEVEL_FIELDS) {
            PyErr_SetString(PyExc_TypeError, "a level is a Level (lsmdb/fastpath.py)");
            goto fail;
        }
        PyObject *keys = PySequence_Tuple(PyTuple_GET_ITEM(level, LEVEL_MAX_KEYS));
        PyObject *entries = keys ? PySequence_Tuple(PyTuple_GET_ITEM(level, LEVEL_FILES)) : NULL;
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
    self->owners = PyMem_Calloc(n ? n : 1, sizeof(PyObject *));
    if (self->e == NULL || self->owners == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    self->n = n;
    self->n0 = n0;
    for (Py_ssize_t i = 0; i < n0; i++)
        if (entry_init(&self->e[i], PyTuple_GET_ITEM(l0, i), &self->owners[i]) < 0)
            goto fail;
    for (Py_ssize_t L = 0; L < nlevels; L++) {
        PyObject *entries = PyTuple_GET_ITEM(levels, L);
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(entries); j++) {
            Entry *e = &self->e[self->off[L] + j];
            if (entry_init(e, PyTuple_GET_ITEM(entries, j), &self->owners[self->off[L] + j]) < 0)
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
        self->filter_bytes += filter_bytes(&self->e[i].filter);
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

/* 1: the file may hold key (or has no filter); 0: certainly not; -1: error.
 * `picked`: e is the file level_pick chose for key. */
static inline int
check(Probes *self, Entry *e, PyObject *key, const int picked)
{
    if (!in_range(e, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), picked))
        return 0;
    if (!filter_present(&e->filter))
        return 1;
    uint64_t h;
    if (key_hash(self, key, e->kf, &h) < 0)
        return -1;
    return filter_says_maybe(e, h);
}

/* The file of level L that may hold key (flat index), or -1: bisect_left on
 * the level's max keys.  The bisect runs on each max key's 8 bytes after the
 * prefix they all share (pre[L], one small array, the steps without branches)
 * rather than on the key objects (a dependent load and a compare per step);
 * only the max keys whose 8 bytes equal the key's are compared whole. */
Py_ssize_t
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
void
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
        if (g->holds[j])
            filter_prefetch(&e->filter, h, self->prefetch_all);
    }
}

/* The second half of probes_gather: g's files in order, counted as
 * probes_first counts them (only those consulted up to the first "maybe");
 * the first that may hold the key, or -1. */
Py_ssize_t
gather_finish(Probes *self, const Gather *g)
{
    for (Py_ssize_t j = 0; j < g->c; j++) {
        Entry *e = &self->e[g->files[j]];
        if (!g->holds[j]) {
            ((uint64_t *)e->counts.buf)[RANGE_SKIPS]++;
            continue;
        }
        if (filter_says_maybe(e, g->h))
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

/* Whether level-0 file i may hold key (its range, then its filter, counted
 * as probes_first counts them): 1, 0, or -1 with an error set. */
int
probes_check_l0(Probes *self, Py_ssize_t i, PyObject *key)
{
    return check(self, &self->e[i], key, 0);
}

/* The first file from `start` that may hold key (bytes); -1: none; -2: error set. */
Py_ssize_t
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
     "first($self, key, start, /)\n--\n\n"
     "The index of the first file from start that may hold key, or -1."},
    {"index_block", (PyCFunction)(void (*)(void))Probes_index_block, METH_FASTCALL,
     "index_block($self, f, key, /)\n--\n\n"
     "bisect_left of key over file f's index keys: the block that can hold it (the index's "
     "length if none)."},
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

PyTypeObject ProbesType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lsmdb._speedups.Probes",
    .tp_basicsize = sizeof(Probes),
    .tp_dealloc = (destructor)Probes_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Probes(l0, deeper, fast_hash, *, prefetch_all_bytes=FILTER_PREFETCH_BYTES)\n--\n\n"
              "The files a point read consults: range checks and Bloom filter probes in C.",
    .tp_methods = Probes_methods,
    .tp_members = Probes_members,
    .tp_init = (initproc)Probes_init,
    .tp_new = PyType_GenericNew,
};
