/* readpath_many.c: get_many's C part, Getter.many -- the memtables and the
 * files' filters for all the keys of a call, a file at a time where the
 * filters allow it (many_by_file), else key by key, the blocks the cache
 * holds looked in and those it does not read once for all their keys; what
 * is left goes back to the Python side with the seeds of its probes.
 * Python twin: lsmdb/readpath.py's get_many. */

#include "readpath.h"
#include "sstable_reader.h"

#define PREFETCH_AHEAD 8
/* get_many's first pass over its keys touches each key object first: loading
 * this many keys ahead made a call 16-17% faster on shuffled keys. */
#define MANY_PREFETCH_AHEAD 16

/* The keys of a get_many call: the caller's list, used as it is while
 * nothing can change it (see Getter_many), and a private copy from the first
 * step that runs Python code or lets the GIL go on. */
typedef struct {
    PyObject *given;  /* the caller's list (borrowed) */
    PyObject *keys;   /* given, or a copy of it (a new reference either way) */
    int gc_paused;    /* the collector was running and is paused until own_keys */
} ManyKeys;

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
cached_batch(Getter *self, Probes *probes, PyObject *keys, Cand *cs, Py_ssize_t nc)
{
    for (Py_ssize_t c = 0; c < nc; c++) {
        cs[c].block = -1;
        cs[c].cached = cs[c].value = NULL;
        cs[c].res = 2;
    }
    for (Py_ssize_t c = 0; c < nc; c++) {
        Cand *x = &cs[c];
        int r = cached_block_for(self, &probes->e[x->f], PyList_GET_ITEM(keys, x->i),
                                 &x->cached, &x->block);
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
 * [0, nk), every one a "maybe" of file e whose block i the
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
disk_probe_many(Getter *self, Entry *e, PyObject *keys, const Miss *ms, Py_ssize_t nk,
                Py_ssize_t i, int *res, PyObject **vals)
{
    unsigned char *buf;
    size_t size;
    int r = read_block_buf(e, e->reader, i, &buf, &size);
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
    if (self->cache != NULL && offer_block(self, e, i, buf, size, found == 0) < 0) {
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
static int
many_by_file(Getter *self, Probes *probes, PyObject *fast, ManyKeys *mk, PyObject *out,
             PyObject *maybes, uint64_t *absent, PyObject *kf)
{
    PyObject *keys = mk->keys;
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
                if (fa >= 0)
                    filter_prefetch(&probes->e[fa].filter, fh[pending[q + MANY_AHEAD]], 1);
            }
            if (whole != NULL ? !filter_says_maybe(whole, fh[i])
                              : f < 0 || !check_raw(&probes->e[f], KEY_AT(i), fh[i],
                                                    j >= probes->n0)) {
                pending[keep++] = i;  /* not in this file: on to the next */
                continue;
            }
            cands[ncand].i = i;  /* a "maybe": looked up in the cache below */
            cands[ncand].f = f;
            ncand++;
        }
        if (cached_batch(self, probes, keys, cands, ncand) < 0)
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
                int d = disk_probe(self, &probes->e[f], PyList_GET_ITEM(keys, i),
                                   misses[a].block, &value);
                if (d < 0)
                    goto done;
                if (d == 0) {  /* a false positive: on to the next file */
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
                int d = disk_probe_many(self, &probes->e[f], keys, misses + a, b - a,
                                        misses[a].block, res, vals);
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
        if (!filter_present(&e->filter))
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

PyObject *
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
    Probes *probes = (Probes *)PyTuple_GET_ITEM(fast, FAST_PROBES);
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
            Py_ssize_t block;
            int c = cached_lookup(self, &probes->e[f], key, &value, &block);
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
