/* readpath_many.c: Getter.many, the whole of get_many in C -- the memtables
 * and their filters for every key, then each file in read order for the keys
 * still open, the same per-file steps as a get (readpath.h) taken a file at a
 * time for all of them.  Python twin: lsmdb/readpath.py's get_many
 * (many_python), which takes the same steps in the same order and counts the
 * same:
 *
 *   - files in read order: the level-0 files newest first, then each deeper
 *     level's files in key order, each with the keys picked for it;
 *   - in a file: the range check and the filter for every key still open,
 *     then every block those keys need looked up in the cache, then the
 *     blocks it does not hold read from disk, in file order, each once for
 *     all its keys and offered to the cache once;
 *
 * so that what the cache holds, and so every counter, does not depend on the
 * order of the keys.  A block the C path cannot serve goes to the Python
 * file_blocks of that file for the keys that need it (hand_over). */

#include "readpath.h"
#include "sstable_reader.h"

/* get_many's first pass over its keys touches each key object first: loading
 * this many keys ahead made a call 16-17% faster on shuffled keys. */
#define MANY_PREFETCH_AHEAD 16

/* get_many's pass over one file tests the keys' filters one key after
 * another, each test's early exit a branch the CPU cannot guess, so the lines
 * of one key were fetched only after the last key's test.  Where the table's
 * filters outgrow the L2 cache (prefetch_all), each step first starts loading
 * all the probe lines of the key MANY_AHEAD places on.  Paired against that,
 * chunks of 1,000 absent keys at 2,000,000 keys took 0.78-0.88x the time
 * (size-tiered, three files), 0.86-0.92x (five files), 0.83-0.87x
 * (leveled); 4 to 32 places ahead measured alike.  Below the threshold, where
 * the lines stay in the L2 cache, it cost time (1.04-1.17x at 200,000 keys):
 * not done there. */
#define MANY_AHEAD 8

/* Cached blocks whose offsets and keys are prefetched ahead of the one looked in. */
#define CAND_AHEAD 4

/* The distinct hash functions a table's filters may use at once (the fast
 * one aside): more sends the call to the Python path. */
#define MAX_KEYED 4

/* The keys of a get_many call: the caller's list, used as it is while
 * nothing can change it (see Getter_many), and a private copy from the first
 * step that runs Python code or lets the GIL go on. */
typedef struct {
    PyObject *given;  /* the caller's list (borrowed) */
    PyObject *keys;   /* given, or a copy of it (a new reference either way) */
    int gc_paused;    /* the collector was running and is paused until own_keys */
} ManyKeys;

/* A key some file's filter let through: its block in that file, and while
 * it is looked up in the cache, the cached block. */
typedef struct {
    Py_ssize_t i;        /* the key */
    Py_ssize_t block;    /* its block (the file's block count: past the last) */
    PyObject *cached;    /* the cached block, a new reference, or NULL */
} Cand;

/* One call's state. */
typedef struct {
    Getter *self;
    PyObject *fast;
    Probes *probes;
    ManyKeys mk;
    PyObject *out;          /* the answers, set once each */
    Py_ssize_t *koff;       /* key i's copy: kbuf[koff[i]:koff[i + 1]] */
    char *kbuf;
    uint64_t *hashes;       /* each key's xxh3_64 */
    PyObject *kfs[MAX_KEYED];  /* the keyed hash functions of the filters (borrowed) */
    uint64_t *kh[MAX_KEYED];   /* each key's hash under each */
    int nkf;
    Py_ssize_t *pending, npend;  /* the keys still open */
    Py_ssize_t *next;            /* scratch: the keys open after a level-0 file */
    Py_ssize_t *spare;           /* scratch: the keys a file hands over */
    Py_ssize_t *picks;           /* scratch: each open key's file of a level */
    Cand *cands;
    uint64_t absent;
} Many;

#define KEY_AT(m, i) (m)->kbuf + (m)->koff[i], (m)->koff[(i) + 1] - (m)->koff[i]

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

/* Start loading what entry_answer reads of a cached block: its offsets and
 * the keys (the payload's first part), once its tail (the count) is in. */
PREFETCH_HELPER
entry_prefetch(PyObject *entry)
{
    ParsedBlock b;
    if (entry_parsed((const unsigned char *)PyBytes_AS_STRING(entry),
                     (size_t)PyBytes_GET_SIZE(entry), &b) < 0)
        return;
    for (uint64_t off = 0; off < ENTRY_OFFSET * b.count; off += 64)  /* key_at */
        PREFETCH(b.offs + off);
    size_t keys = b.plen / 4 < 1024 ? b.plen / 4 : 1024;  /* where the keys usually are */
    for (size_t off = 64; off < keys; off += 64)
        PREFETCH(b.payload + off);
}

/* The hashes file e's filter tests: the keys' xxh3_64, or their hash under
 * e's keyed function. */
static const uint64_t *
hashes_for(const Many *m, const Entry *e)
{
    for (int j = 0; j < m->nkf; j++)
        if (m->kfs[j] == e->kf)
            return m->kh[j];
    return m->hashes;
}

/* Key i answered: value (a new reference, stolen) into out. */
static inline void
answer(Many *m, Py_ssize_t i, PyObject *value)
{
    m->absent += value == Py_None;
    PyList_SET_ITEM(m->out, i, value);
}

/* The Python file_blocks of file f for the keys idx[0:n] (a block the C path
 * did not serve): each answered or left open (onto keep).  0, or -1. */
static int
hand_over_keys(Many *m, Py_ssize_t f, const Py_ssize_t *idx, Py_ssize_t n, Py_ssize_t *keep,
               Py_ssize_t *nkeep)
{
    if (own_keys(&m->mk) < 0)
        return -1;
    PyObject *keys = PyList_New(n);
    if (keys == NULL)
        return -1;
    for (Py_ssize_t c = 0; c < n; c++)
        PyList_SET_ITEM(keys, c, Py_NewRef(PyList_GET_ITEM(m->mk.keys, idx[c])));
    PyObject *values = hand_over(m->self, m->fast, f, keys);
    Py_DECREF(keys);
    if (values == NULL)
        return -1;
    for (Py_ssize_t c = 0; c < n; c++) {
        PyObject *v = PyList_GET_ITEM(values, c);
        if (v == m->self->missing)
            keep[(*nkeep)++] = idx[c];
        else
            answer(m, idx[c], Py_NewRef(v));
    }
    Py_DECREF(values);
    return 0;
}

static int
cand_order(const void *x, const void *y)
{
    const Cand *a = x, *b = y;
    if (a->block != b->block)
        return a->block < b->block ? -1 : 1;
    return (a->i > b->i) - (a->i < b->i);
}

/* File f's step for the open keys idx[0:n]: the range check and the filter
 * for each (every key of a level-0 file whose range holds them all when
 * `whole`), then the cache for the blocks those that may be here need, then
 * the rest read from disk in file order.  The keys the file does not answer
 * go onto keep.  0, or -1 with an exception set. */
static int
file_step(Many *m, Py_ssize_t f, const Py_ssize_t *idx, Py_ssize_t n, int whole,
          Py_ssize_t *keep, Py_ssize_t *nkeep)
{
    Probes *probes = m->probes;
    Entry *e = &probes->e[f];
    const uint64_t *fh = hashes_for(m, e);
    const int picked = f >= probes->n0;
    int ahead = probes->prefetch_all && filter_present(&e->filter);
    Py_ssize_t nc = 0;
    for (Py_ssize_t q = 0; q < n; q++) {
        Py_ssize_t i = idx[q];
        if (ahead && q + MANY_AHEAD < n)
            filter_prefetch(&e->filter, fh[idx[q + MANY_AHEAD]], 1);
        if (whole ? !filter_says_maybe(e, fh[i]) : !check_raw(e, KEY_AT(m, i), fh[i], picked)) {
            keep[(*nkeep)++] = i;  /* not in this file: on to the next */
            continue;
        }
        m->cands[nc].i = i;  /* a "maybe" */
        m->cands[nc].block = bisect_index(e, PyList_GET_ITEM(m->mk.keys, i));
        m->cands[nc].cached = NULL;
        nc++;
    }
    if (nc == 0)
        return 0;
    uint64_t *counts = (uint64_t *)e->counts.buf;
    /* The cache, for every key's block: first each cached block found (its
     * tail prefetched), then each looked in with the offsets and keys of the
     * blocks CAND_AHEAD further on already loading. */
    for (Py_ssize_t c = 0; c < nc; c++) {
        Cand *x = &m->cands[c];
        if (x->block < e->nidx && cached_entry(m->self, e, x->block, &x->cached))
            continue;
        x->cached = NULL;
    }
    Py_ssize_t nmiss = 0, nrefused = 0;
    int rc = -1;
    for (Py_ssize_t c = 0; c < nc; c++) {
        Cand *x = &m->cands[c];
        if (c + CAND_AHEAD < nc && m->cands[c + CAND_AHEAD].cached != NULL)
            entry_prefetch(m->cands[c + CAND_AHEAD].cached);
        if (x->block == e->nidx) {  /* past the last block: no block can hold it */
            counts[FALSE_POSITIVES]++;
            keep[(*nkeep)++] = x->i;
            continue;
        }
        if (x->cached == NULL) {
            m->cands[nmiss++] = *x;  /* read below (nmiss <= c: in place) */
            continue;
        }
        PyObject *value = NULL;
        int r = entry_answer(m->self, m->fast, e, x->cached, PyList_GET_ITEM(m->mk.keys, x->i),
                             LATEST, &value, NULL);
        Py_CLEAR(x->cached);
        if (r < 0)
            goto fail;
        if (r == 1)
            answer(m, x->i, value);
        else if (r == 0)
            keep[(*nkeep)++] = x->i;
        else  /* an entry that does not hold together: the Python side */
            m->spare[nrefused++] = x->i;
    }
    if (nrefused && hand_over_keys(m, f, m->spare, nrefused, keep, nkeep) < 0)
        goto fail_all;
    if (nmiss == 0)
        return 0;
    /* The blocks not cached, in file order, each read once for its keys.  A
     * read lets the GIL go, and a hand-over runs Python code: the keys are
     * held by a copy from here. */
    if (own_keys(&m->mk) < 0)
        goto fail_all;
    qsort(m->cands, (size_t)nmiss, sizeof(Cand), cand_order);
    for (Py_ssize_t a = 0, b; a < nmiss; a = b) {
        Py_ssize_t block = m->cands[a].block;
        for (b = a + 1; b < nmiss && m->cands[b].block == block; b++)
            ;
        DiskBlock d;
        int r;
        if (b - a == 1) {
            /* A block for one key: as a get reads it (keys_first), which
             * decompresses no more than that key needs where the cache will
             * not keep the block -- what the Python side's values_among does
             * for every block. */
            PyObject *value = NULL;
            Stored st;
            r = keys_first(m->self, e, block, PyList_GET_ITEM(m->mk.keys, m->cands[a].i), 1,
                           &value, &st);
            if (r < 0)
                goto fail_all;
            if (r == 0 || r == 3) {  /* answered (and counted) from the keys and its value */
                if (r == 3)
                    answer(m, m->cands[a].i, value);
                else
                    keep[(*nkeep)++] = m->cands[a].i;
                continue;
            }
            if (r == 1)  /* the whole block decides, from the bytes read where it holds them */
                r = disk_block_stored(e, block, st.buf, st.size, st.kind, &d);
        } else {
            r = disk_block(e, block, &d);
        }
        if (r < 0)
            goto fail_all;
        if (r == 2) {  /* the Python side reads it, for these keys */
            for (Py_ssize_t c = a; c < b; c++)
                m->spare[c - a] = m->cands[c].i;
            if (hand_over_keys(m, f, m->spare, b - a, keep, nkeep) < 0)
                goto fail_all;
            continue;
        }
        counts[BLOCK_READS]++;
        int found = 0;
        for (Py_ssize_t c = a; c < b; c++) {
            PyObject *value = NULL;
            int present;
            r = parsed_answer(m->self, m->fast, e, &d.b,
                              PyList_GET_ITEM(m->mk.keys, m->cands[c].i), LATEST, &value,
                              &present, NULL);
            found |= present;
            if (r == 1) {
                answer(m, m->cands[c].i, value);
            } else if (r == 0) {
                keep[(*nkeep)++] = m->cands[c].i;
            } else {  /* a block the rule accepted holds together: this is a bug */
                if (r == 2)
                    PyErr_SetString(PyExc_SystemError, "a parsed block does not hold together");
                disk_block_free(&d);
                goto fail_all;
            }
        }
        r = offer_parsed(m->self, e, block, &d.b, found);
        disk_block_free(&d);
        if (r < 0)
            goto fail_all;
    }
    return 0;
fail:
    for (Py_ssize_t c = 0; c < nc; c++)
        Py_CLEAR(m->cands[c].cached);
fail_all:
    return rc;
}

/* The file of level L (flat index) each open key belongs to, or -1. */
static void
level_picks(Many *m, Py_ssize_t L)
{
    for (Py_ssize_t q = 0; q < m->npend; q++)
        m->picks[q] = level_pick(m->probes, L, PyList_GET_ITEM(m->mk.keys, m->pending[q]));
}

/* Every open key through the files in read order; those no file answers are
 * absent.  0, or -1. */
static int
many_files(Many *m)
{
    Probes *probes = m->probes;
    /* The smallest and largest key still open: a level-0 file whose range
     * holds both holds every one, and its range check per key is skipped (a
     * key in range is not counted, so the counters are the same). */
    Py_ssize_t kmin = m->npend ? m->pending[0] : 0, kmax = kmin;
    for (Py_ssize_t q = 1; q < m->npend; q++) {
        Py_ssize_t i = m->pending[q];
        if (mem_order(KEY_AT(m, i), KEY_AT(m, kmin)) < 0)
            kmin = i;
        else if (mem_order(KEY_AT(m, i), KEY_AT(m, kmax)) > 0)
            kmax = i;
    }
    for (Py_ssize_t f = 0; f < probes->n0 && m->npend > 0; f++) {
        Entry *e = &probes->e[f];
        int whole = range_holds(e, KEY_AT(m, kmin)) && range_holds(e, KEY_AT(m, kmax));
        Py_ssize_t nkeep = 0;
        if (file_step(m, f, m->pending, m->npend, whole, m->next, &nkeep) < 0)
            return -1;
        memcpy(m->pending, m->next, (size_t)nkeep * sizeof(Py_ssize_t));
        m->npend = nkeep;
    }
    for (Py_ssize_t L = 0; L < probes->nlevels && m->npend > 0; L++) {
        level_picks(m, L);
        /* the level's files in key order, each with its keys in their order;
         * keys no file of the level can hold stay open */
        Py_ssize_t nkeep = 0, npend = m->npend;
        Py_ssize_t *keys_of = PyMem_Malloc((size_t)(npend ? npend : 1) * sizeof(Py_ssize_t));
        Py_ssize_t *keep = PyMem_Malloc((size_t)(npend ? npend : 1) * sizeof(Py_ssize_t));
        if (keys_of == NULL || keep == NULL) {
            PyMem_Free(keys_of);
            PyMem_Free(keep);
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t q = 0; q < npend; q++)
            if (m->picks[q] < 0)
                keep[nkeep++] = m->pending[q];
        for (Py_ssize_t f = probes->off[L]; f < probes->off[L + 1]; f++) {
            Py_ssize_t nk = 0;
            for (Py_ssize_t q = 0; q < npend; q++)
                if (m->picks[q] == f)
                    keys_of[nk++] = m->pending[q];
            if (nk && file_step(m, f, keys_of, nk, 0, keep, &nkeep) < 0) {
                PyMem_Free(keys_of);
                PyMem_Free(keep);
                return -1;
            }
        }
        memcpy(m->pending, keep, (size_t)nkeep * sizeof(Py_ssize_t));
        m->npend = nkeep;
        PyMem_Free(keys_of);
        PyMem_Free(keep);
    }
    for (Py_ssize_t q = 0; q < m->npend; q++)
        answer(m, m->pending[q], Py_NewRef(Py_None));
    m->npend = 0;
    return 0;
}

/* The keyed hash functions of probes' filters into m (the fast one aside):
 * 0, or -1 when there are more than MAX_KEYED. */
static int
collect_keyed(Many *m)
{
    m->nkf = 0;
    for (Py_ssize_t f = 0; f < m->probes->n; f++) {
        const Entry *e = &m->probes->e[f];
        if (e->kf == NULL || !filter_present(&e->filter))
            continue;
        int seen = 0;
        for (int j = 0; j < m->nkf; j++)
            seen |= m->kfs[j] == e->kf;
        if (seen)
            continue;
        if (m->nkf == MAX_KEYED)
            return -1;
        m->kfs[m->nkf++] = e->kf;
    }
    return 0;
}

/* Each open key's hash under each keyed function (Python calls: the keys are
 * held by a copy first).  0, or -1. */
static int
keyed_hashes(Many *m, Py_ssize_t n)
{
    for (int j = 0; j < m->nkf; j++) {
        m->kh[j] = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(uint64_t));
        if (m->kh[j] == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t q = 0; q < m->npend; q++) {
            Py_ssize_t i = m->pending[q];
            PyObject *r = PyObject_CallOneArg(m->kfs[j], PyList_GET_ITEM(m->mk.keys, i));
            if (r == NULL)
                return -1;
            unsigned long long v = PyLong_AsUnsignedLongLong(r);
            Py_DECREF(r);
            if (v == (unsigned long long)-1 && PyErr_Occurred())
                return -1;
            m->kh[j][i] = (uint64_t)v;
        }
    }
    return 0;
}

/* get_many where level 0's files overlap in sequence numbers (a key's
 * newest version may be in any of them: overlap_get compares them).  First
 * the memtables for every key, in one pass that lets nothing else run (so
 * the call sees a batch applied to them whole or not at all, as the pass of
 * the other case does), then the files key by key as a get takes them
 * (get_latest_files), a file at a time being no help there, the filter lines
 * of the key MANY_AHEAD places on starting to load meanwhile (gather_start,
 * for its loads alone) so that the keys' cache misses overlap as one key's
 * do.  The keys are the checked list of Getter_many, copied: a file's read
 * may let the GIL go or hand over to Python code.  The answers (None where
 * absent), counted as many_python counts them, or NULL with an exception. */
static PyObject *
many_overlap(Getter *self, PyObject *fast, Probes *probes, PyObject *given)
{
    PyObject *keys = PyList_GetSlice(given, 0, PyList_GET_SIZE(given));
    if (keys == NULL)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(keys), npend = 0;
    PyObject *out = PyList_New(n);
    Py_ssize_t *pending = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Py_ssize_t));
    uint64_t *hs = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(uint64_t));  /* each key's, once */
    if (out == NULL || pending == NULL || hs == NULL) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto fail;
    }
    uint64_t *counts = (uint64_t *)self->counts.buf;
    uint64_t absent = 0;
    counts[GETS] += (uint64_t)n;
    /* (the collector paused: a finaliser it ran would be Python code in the pass) */
    int gc_paused = PyGC_Disable();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *value = NULL;
        hs[i] = 0;
        int have_h = getter_hash(probes, key, &hs[i]);
        if (mem_lookup(fast, key, hs[i], have_h, &value) < 0)
            break;
        if (value != NULL) {
            value = visible(self, fast, Py_NewRef(value), LATEST);
            if (value == NULL)
                break;
            if (value != self->missing) {
                PyList_SET_ITEM(out, i, value);  /* None: a tombstone, counted below */
                continue;
            }
            Py_DECREF(value);
        }
        pending[npend++] = i;
    }
    if (gc_paused)
        PyGC_Enable();
    if (PyErr_Occurred())
        goto fail;
    Gather g;
    for (Py_ssize_t j = 0; j < npend && j < MANY_AHEAD; j++) {
        PyObject *key = PyList_GET_ITEM(keys, pending[j]);
        if (can_gather(probes, key))
            gather_start(probes, key, hs[pending[j]], &g);
    }
    for (Py_ssize_t j = 0; j < npend; j++) {
        if (j + MANY_AHEAD < npend) {
            PyObject *ahead = PyList_GET_ITEM(keys, pending[j + MANY_AHEAD]);
            if (can_gather(probes, ahead))
                gather_start(probes, ahead, hs[pending[j + MANY_AHEAD]], &g);
        }
        PyObject *key = PyList_GET_ITEM(keys, pending[j]), *value = NULL;
        if (PyBytes_GET_SIZE(key) <= XXH3_NATIVE_MAX && probes->native_hash)
            probes_hold(probes, key, hs[pending[j]]);  /* the key the probes hold */
        int r = get_latest_files(self, fast, probes, key, &value);
        if (r < 0)
            goto fail;
        PyList_SET_ITEM(out, pending[j], r == 1 ? value : Py_NewRef(Py_None));
    }
    for (Py_ssize_t i = 0; i < n; i++)
        absent += PyList_GET_ITEM(out, i) == Py_None;
    counts[GETS_ABSENT] += absent;
    PyMem_Free(pending);
    PyMem_Free(hs);
    Py_DECREF(keys);
    return out;
fail:
    PyMem_Free(pending);
    PyMem_Free(hs);
    Py_XDECREF(out);
    Py_DECREF(keys);
    return NULL;
}

PyObject *
Getter_many(Getter *self, PyObject *keys)
{
    /* many(keys) -> the list of values of keys (None where absent), as
     * get_many; None when the Python path must serve (keys not all plain
     * bytes within the size limit, a closed database, no C probes for this
     * state, more keyed hashes than MAX_KEYED, a fast hash not computed here).
     *
     * The caller's list is not copied up front (that cost 5-7% of a call):
     * with keys short enough to hash here and no keyed hash, nothing after
     * getter_fast runs Python code or lets the GIL go until a block has to be
     * read, and the cyclic collector -- whose finalisers could run from any
     * allocation here -- is paused, so the list and its items stay as they
     * are.  Before a block read or a hand-over, and from the start on the
     * other paths (a keyed hash is Python code; xxhash may let the GIL go), a
     * copy holds them (own_keys). */
    if (self->db == NULL) {
        PyErr_SetString(PyExc_TypeError, "Getter is not initialised");
        return NULL;
    }
    if (!PyList_CheckExact(keys)) {
        PyErr_SetString(PyExc_TypeError, "keys must be a list");
        return NULL;
    }
    if (getter_follow(self) < 0)
        return NULL;
    Many m;
    memset(&m, 0, sizeof m);
    m.self = self;
    int ok = getter_fast(self, &m.fast);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    m.probes = (Probes *)PyTuple_GET_ITEM(m.fast, FAST_PROBES);
    PyObject *result = NULL;
    Py_ssize_t n = PyList_GET_SIZE(keys), total = 0;
    int all_short = 1;
    if (!m.probes->native_hash || collect_keyed(&m) < 0) {
        Py_DECREF(m.fast);
        return Py_NewRef(Py_None);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        if (i + MANY_PREFETCH_AHEAD < n) {  /* key objects spread over the heap: fetch ahead */
            const char *ahead = (const char *)PyList_GET_ITEM(keys, i + MANY_PREFETCH_AHEAD);
            PREFETCH(ahead);       /* header */
            PREFETCH(ahead + 63);  /* bytes, when the object straddles two lines */
        }
        if (!PyBytes_CheckExact(key) || PyBytes_GET_SIZE(key) > self->max_key) {
            Py_DECREF(m.fast);
            return Py_NewRef(Py_None);
        }
        all_short &= PyBytes_GET_SIZE(key) <= XXH3_NATIVE_MAX;  /* hashed here, not by xxhash */
        total += PyBytes_GET_SIZE(key);
    }
    if (PyTuple_GET_ITEM(m.fast, FAST_SEQ_OVERLAP) == Py_True) {
        result = many_overlap(self, m.fast, m.probes, keys);
        goto done;
    }
    m.mk.given = keys;
    m.mk.keys = Py_NewRef(keys);
    m.mk.gc_paused = PyGC_Disable();
    /* A clock of the caller's runs Python code, which may change the caller's
     * list while the loops below read it (the system clock is read in C). */
    if (!(all_short && m.nkf == 0 && view_clock_is_system(m.fast)) && own_keys(&m.mk) < 0)
        goto done;
    size_t np = (size_t)(n ? n : 1);
    m.out = PyList_New(n);
    m.koff = PyMem_Malloc((np + 1) * sizeof(Py_ssize_t));
    m.kbuf = PyMem_Malloc(total ? (size_t)total : 1);
    m.hashes = PyMem_Malloc(np * sizeof(uint64_t));
    m.pending = PyMem_Malloc(np * sizeof(Py_ssize_t));
    m.next = PyMem_Malloc(np * sizeof(Py_ssize_t));
    m.spare = PyMem_Malloc(np * sizeof(Py_ssize_t));
    m.picks = PyMem_Malloc(np * sizeof(Py_ssize_t));
    m.cands = PyMem_Malloc(np * sizeof(Cand));
    if (m.out == NULL || m.koff == NULL || m.kbuf == NULL || m.hashes == NULL
        || m.pending == NULL || m.next == NULL || m.spare == NULL || m.picks == NULL
        || m.cands == NULL) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto done;
    }
    /* Every key's memtable lookup, hash and a copy of its bytes (keys are
     * objects scattered over the heap: each is visited once, in a loop whose
     * loads overlap); the files then test the copies. */
    m.koff[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(m.mk.keys, i), *value = NULL;
        Py_ssize_t klen = PyBytes_GET_SIZE(key);
        m.koff[i + 1] = m.koff[i] + klen;
        if (xxh3_64_bytes(key, &m.hashes[i]) < 0)
            goto done;
        if (mem_lookup(m.fast, key, m.hashes[i], klen <= XXH3_NATIVE_MAX, &value) < 0)
            goto done;
        if (value != NULL) {
            value = visible(self, m.fast, Py_NewRef(value), LATEST);
            if (value == NULL)
                goto done;
            if (value != self->missing) {
                answer(&m, i, value);
                continue;
            }
            Py_DECREF(value);
        }
        memcpy(m.kbuf + m.koff[i], PyBytes_AS_STRING(key), (size_t)klen);
        m.pending[m.npend++] = i;
    }
    if (m.nkf && keyed_hashes(&m, n) < 0)
        goto done;
    if (many_files(&m) < 0)
        goto done;
    uint64_t *counts = (uint64_t *)self->counts.buf;
    counts[GETS] += (uint64_t)n;
    counts[GETS_ABSENT] += m.absent;
    result = Py_NewRef(m.out);
done:
    if (m.mk.gc_paused)
        PyGC_Enable();
    Py_XDECREF(m.mk.keys);
    Py_XDECREF(m.out);
    PyMem_Free(m.koff);
    PyMem_Free(m.kbuf);
    PyMem_Free(m.hashes);
    PyMem_Free(m.pending);
    PyMem_Free(m.next);
    PyMem_Free(m.spare);
    PyMem_Free(m.picks);
    PyMem_Free(m.cands);
    for (int j = 0; j < m.nkf; j++)
        PyMem_Free(m.kh[j]);
    Py_DECREF(m.fast);
    return result;
}
