/* readpath.c: Getter, a table's whole point read in C -- the memtables and
 * their filters, the files' probes (readpath_probes.c), the block that can
 * hold the key found in the index, then answered from the block cache or
 * read from disk (sstable_reader.c) and checked (block.c) -- and the steps
 * after a "maybe" that get_many (readpath_many.c) shares (readpath.h draws
 * them).  Anything unusual goes to the Python getter.  Python twin:
 * lsmdb/readpath.py's lookup and file_blocks, and make_getter's get. */

#include <time.h>

#include "readpath.h"
#include "sstable_reader.h"
#include "sstable_format.h"
#include "coding.h"

/* A Getter and its DB refer to each other (db.get is the Getter): the
 * cycle collector must see the references, or neither is ever freed. */
static int
Getter_traverse(Getter *self, visitproc visit, void *arg)
{
    Py_VISIT(self->db);
    Py_VISIT(self->cell);
    Py_VISIT(self->missing);
    Py_VISIT(self->file_blocks);
    Py_VISIT(self->slow_get);
    Py_VISIT(self->cache);
    Py_VISIT(self->watch);
    Py_VISIT(self->catch_up);
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
    Py_CLEAR(self->file_blocks);
    Py_CLEAR(self->slow_get);
    Py_CLEAR(self->cache);
    Py_CLEAR(self->watch);
    Py_CLEAR(self->catch_up);
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
    PyObject *db, *state, *missing, *file_blocks, *slow_get, *cache;
    Py_ssize_t max_key;
    static char *kwlist[] = {"db", "state", "missing", "file_blocks", "slow_get", "max_key",
                             "cache", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOnO:Getter", kwlist, &db, &state,
                                     &missing, &file_blocks, &slow_get, &max_key, &cache))
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
    if (!PyCallable_Check(file_blocks) || !PyCallable_Check(slow_get)) {
        PyErr_SetString(PyExc_TypeError, "file_blocks and slow_get must be callable");
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
        || strcmp(self->counts.format, "Q") != 0
        || self->counts.len < 8 * TABLE_COUNTER_SLOTS) {
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
    self->file_blocks = Py_NewRef(file_blocks);
    self->slow_get = Py_NewRef(slow_get);
    if (cache != Py_None)
        self->cache = (Cache *)Py_NewRef(cache);
    self->max_key = max_key;
    self->vectorcall = Getter_vectorcall;
    return 0;
}

/* ---- the block of a file that can hold a key ---------------------------- */

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
Py_ssize_t
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
int
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

/* ---- after a "maybe": the block, from the cache or read from disk -------- */

/* Block i of file e as the block cache holds it: 1 and *entry (a new
 * reference, the hit marked), or 0 (no cache, not cached, or an object that
 * is not a cached block: read from disk).  Block i of a file is cached under
 * its cache_base + i (the first of the range Cache.reserve gave the file's
 * reader, one key per block). */
int
cached_entry(Getter *self, const Entry *e, Py_ssize_t i, PyObject **entry)
{
    if (self->cache == NULL)
        return 0;
    Py_ssize_t s = cache_find(self->cache, e->cache_base + (uint64_t)i);
    if (s < 0)
        return 0;
    PyObject *bl = self->cache->slots[s].block;
    if (!PyBytes_CheckExact(bl))
        return 0;
    self->cache->slots[s].marked = 1;
    PREFETCH(PyBytes_AS_STRING(bl));
    *entry = Py_NewRef(bl);
    return 1;
}

/* key looked up in parsed block b of file e, a true or a false positive
 * counted (*present: whether the block holds the key, visible or not): 1,
 * found, *value its visible value (a new reference; None for a tombstone);
 * 0, not there (or no version visible); 2, an offset or header that does not
 * hold (nothing counted: the caller hands over); -1, error. */
int
parsed_answer(Getter *self, PyObject *fast, Entry *e, const ParsedBlock *b, PyObject *key,
              uint64_t bound, PyObject **value, int *present, uint64_t *seq)
{
    const unsigned char *vp = NULL;
    size_t vlen = 0;
    uint64_t expires = 0;
    int f = parsed_find(b, (const unsigned char *)PyBytes_AS_STRING(key),
                        (size_t)PyBytes_GET_SIZE(key), &vp, &vlen, &expires);
    *present = f > 0;
    if (f < 0)
        return 2;
    if (f > 0 && seq != NULL) {  /* the entry's sequence number, asked for: from its tag */
        if (e->format < 2)
            *seq = e->max_seq;  /* a format-1 file's entries all take its max_seq */
        else if (parsed_seq(b, (const unsigned char *)PyBytes_AS_STRING(key),
                            (size_t)PyBytes_GET_SIZE(key), seq) < 0)
            return 2;
    }
    uint64_t *counts = (uint64_t *)e->counts.buf;
    if (f == 0) {
        counts[FALSE_POSITIVES]++;
        return 0;
    }
    counts[TRUE_POSITIVES]++;
    if (f == 1 && expires) {  /* an expiring value: read it as of now, without a tuple */
        uint64_t now;
        if (view_now_us(fast, &now) < 0)
            return -1;
        if (now >= expires)
            f = 2;  /* expired: a tombstone */
        expires = 0;
    }
    PyObject *v = found_value(f, vp, vlen, expires);
    if (v == NULL)
        return -1;
    v = visible(self, fast, v, bound);
    if (v == NULL)
        return -1;
    if (v == self->missing) {
        Py_DECREF(v);
        return 0;
    }
    *value = v;
    return 1;
}

/* key looked up in a cached block of file e, as parsed_answer, the hit
 * counted; 2 (nothing counted) for an entry that does not hold together. */
int
entry_answer(Getter *self, PyObject *fast, Entry *e, PyObject *entry, PyObject *key,
             uint64_t bound, PyObject **value, uint64_t *seq)
{
    ParsedBlock b;
    int present;
    if (entry_parsed((const unsigned char *)PyBytes_AS_STRING(entry),
                     (size_t)PyBytes_GET_SIZE(entry), &b) < 0)
        return 2;
    int r = parsed_answer(self, fast, e, &b, key, bound, value, &present, seq);
    if (r == 0 || r == 1)
        ((uint64_t *)e->counts.buf)[BLOCK_CACHE_HITS]++;
    return r;
}

/* Data block i of file e read from disk -- one copy out of the reader's
 * mapping, or where it has none one pread, the GIL released either way --
 * its checksum verified and the data block rule applied (block.c): 0, d
 * filled (free it with disk_block_free); 2, for the Python side to read
 * (the reader closed or in memory, a mapping that ends short or faulted, a
 * short read, a bad checksum, a block the rule refuses); -1, error (d holds
 * nothing).  Nothing is counted. */
int
disk_block(Entry *e, Py_ssize_t i, DiskBlock *d)
{
    return disk_block_stored(e, i, NULL, 0, 0, d);
}

/* disk_block, from `stored` (bytes read_stored_buf read, stored as `kind`:
 * taken, freed or kept in d) where not NULL. */
int
disk_block_stored(Entry *e, Py_ssize_t i, unsigned char *stored, size_t stored_size, int kind,
                  DiskBlock *d)
{
    size_t size;
    d->buf = d->heap = NULL;
    int r = stored != NULL ? stored_payload(e->reader, stored, stored_size, kind, &d->buf, &size)
                           : read_block_buf(e, e->reader, i, &d->buf, &size);
    if (r != 0)
        return r;
    BlockBounds bounds;
    block_bounds(e, i, &bounds);
    r = parse_with_stack(d->buf, size, &bounds, &d->b, d->stack, &d->heap);
    if (r < 0) {
        PyMem_RawFree(d->buf);
        d->buf = NULL;
        return r == -1 ? 2 : -1;
    }
    return 0;
}

void
disk_block_free(DiskBlock *d)
{
    PyMem_RawFree(d->buf);
    PyMem_Free(d->heap);
    d->buf = d->heap = NULL;
}

/* Offer block i of file e, read from disk and parsed into b, to the cache:
 * cached in its cached form if the cache takes it (cache_admits: as a get's
 * block when `found`, as a false positive's when not).  0, or -1 on error. */
int
offer_parsed(Getter *self, const Entry *e, Py_ssize_t i, const ParsedBlock *b, int found)
{
    uint64_t key = e->cache_base + (uint64_t)i;
    if (self->cache == NULL || !cache_admits(self->cache, key, found))
        return 0;
    PyObject *entry = parsed_entry(b);
    if (entry == NULL)
        return -1;
    int r = cache_put(self->cache, key, entry, PyBytes_GET_SIZE(entry));
    Py_DECREF(entry);
    return r;
}

/* ---- keys first: a false positive decided from a block's keys alone ----- */

/* keys_lean's bounds (readpath_probes.h). */
#define KEYS_LEAN_MAX 8
/* Where a file's first keys-first read stops decompressing (in 256ths of the
 * payload), and the bytes past where its keys array ended last time that a
 * read decompresses too (a block's keys take about the same share of it). */
#define KEYS_SHARE_FIRST 64
#define KEYS_SLACK 64
/* A keys array ending past this share of its payload (in 256ths) leaves too
 * little undecompressed to be worth a second decompression when the key is
 * there: such a file's reads take the whole block. */
#define KEYS_SHARE_MAX 160

static inline void
keys_lean_by(Entry *e, int found)
{
    if (found ? e->keys_lean > -KEYS_LEAN_MAX : e->keys_lean < KEYS_LEAN_MAX)
        e->keys_lean += found ? -1 : 1;
}

/* A get's read from disk of block i of file e after its filter let key
 * through, when the block is stored LZ4-compressed or as it is: the
 * checksum of the stored bytes verified, the payload decompressed only as
 * far as its keys array (lz4_payload_prefix; an uncompressed one read in
 * place), and that array read under the rule (block_keys_find).  When key
 * is not among the keys the read is a false positive, decided without the
 * rest of the block: counted as file_get's whole read counts one (a block
 * read, a false positive, the admission told of it).  When key is there,
 * `values` (the entry's sequence number not asked for) and the file of
 * format 2 (no expiring value: an entry's kind follows from its value), an
 * LZ4 payload is decompressed again as far as the key's value, estimated
 * from where the keys ended and the entries' mean size (the whole payload
 * where that falls short), and the value read under the rule
 * (block_value_at): *value, counted as a true positive's read.  Taken only
 * when the admission would not cache this block (a cache with room takes a
 * get's block; a full one a block read again: those are read whole), and,
 * for a key the file may hold, when `values` or e's recent reads were
 * mostly false positives (keys_lean).  The Python twin: readpath.py's
 * file_blocks with SSTableReader.keys_among and values_among.
 * 0: not there, counted; 3: found, *value (a new reference, None for a
 * tombstone), counted; 1: read the whole block (stored otherwise, or
 * anything unusual: the whole read decides), from st's bytes where it
 * holds them (st->buf: the caller takes them); 2: the block's read failed
 * (read_stored_buf's 2): for the Python side; -1: error. */
/* keys_first's read of the type-3 block stored[0:size] of file e (block i):
 * the keys piece decompressed against the file's dictionary and read under
 * the rule (block_keys_find: *hold 0 or 1; -1 where the whole read is to
 * decide, the keys array not ending where the piece does among them); when
 * key is there and `values`, the piece holding its value decompressed and
 * that value read under the rule (block_piece_value: *f 1, *value a new
 * reference, or 2, *value None; -1 where the whole read is to decide).
 * 0, or -1 on error (*value not set). */
static int
pieces_find(Entry *e, Py_ssize_t i, PyObject *key, int values, const unsigned char *stored,
            size_t size, int *hold, int *f, PyObject **value)
{
    Pieces t;
    Dict dict;
    *hold = *f = -1;
    if (pieces_table(stored, size, &t) < 0)
        return 0;
    int r = reader_dictionary(e->reader, t.plen, &dict);
    if (r <= 0)
        return r;
    const unsigned char *src, *vp = NULL;
    size_t len, keys_end = 0, index = 0, count = 0, vlen = 0;
    pieces_piece(&t, 0, &src, &len);
    Py_ssize_t got = pieces_decode(src, len, &dict, t.plen);
    if (got > 0) {
        BlockBounds bounds;
        block_bounds(e, i, &bounds);
        *hold = block_keys_find(dict.room, (size_t)got, t.plen, &bounds,
                                (const unsigned char *)PyBytes_AS_STRING(key),
                                (size_t)PyBytes_GET_SIZE(key), &keys_end, &index, &count);
        if (*hold < 0 || keys_end != (size_t)got)
            *hold = -1;
    }
    r = 0;
    if (*hold == 1 && values && keys_end < t.plen) {
        size_t first, next, p = pieces_holding(&t, index, &first, &next);
        int last = next == SIZE_MAX;
        pieces_piece(&t, p, &src, &len);
        got = pieces_decode(src, len, &dict, t.plen - keys_end);
        if (got > 0 && (last ? first < count : next <= count))
            *f = block_piece_value(dict.room, (size_t)got, p == 1, last, count,
                                   (last ? count : next) - first, index - first, &vp, &vlen);
        if (*f > 0 && (*value = found_value(*f, vp, vlen, 0)) == NULL)
            r = -1;
    }
    dict_release(&dict);
    return r;
}

int
keys_first(Getter *self, Entry *e, Py_ssize_t i, PyObject *key, int values, PyObject **value,
           Stored *st)
{
    st->buf = NULL;
    st->size = 0;
    st->kind = 0;
    uint64_t cache_key = e->cache_base + (uint64_t)i;
    values = values && e->format == 2
             && (self->cache == NULL || self->cache->admission->full);
    if ((e->keys_lean < 0 && !values) || e->format < 2 || e->keys_share > KEYS_SHARE_MAX)
        return 1;
    if (self->cache != NULL && admission_rereads(self->cache->admission, cache_key))
        return 1;
    unsigned char *stored;
    size_t size;
    int kind;
    int r = read_stored_buf(e, e->reader, i, &stored, &size, &kind);
    if (r != 0)
        return r < 0 ? -1 : 2;
    int lz4 = kind == COMPRESSION_LZ4 && size >= 4 && rd32(stored) != 0 && rd32(stored) <= INT_MAX;
    int hold = -1, f = -1, err = 0;
    if (kind == COMPRESSION_LZ4_PIECES) {
        if (pieces_find(e, i, key, values, stored, size, &hold, &f, value) < 0)
            err = 1;
        goto decided;
    }
    if (!lz4 && kind != COMPRESSION_NONE) {  /* the whole read decodes it */
        st->buf = stored;
        st->size = size;
        st->kind = kind;
        return 1;
    }
    size_t room = lz4 ? rd32(stored) : size, got = 0, plen = 0, keys_end = 0, index = 0,
           count = 0;
    unsigned char *out = lz4 ? PyMem_RawMalloc(room) : stored;  /* uncompressed: read in place */
    if (out == NULL) {
        PyMem_RawFree(stored);
        PyErr_NoMemory();
        return -1;
    }
    BlockBounds bounds;
    block_bounds(e, i, &bounds);
    const unsigned char *k = (const unsigned char *)PyBytes_AS_STRING(key);
    size_t klen = (size_t)PyBytes_GET_SIZE(key);
    size_t share = e->keys_share ? e->keys_share : KEYS_SHARE_FIRST;
    const unsigned char *vp = NULL;
    size_t vlen = 0;
    if (lz4) {
        r = lz4_payload_prefix(stored, size, room / 256 * share + KEYS_SLACK, out, room, &got,
                               &plen);
    } else {
        got = plen = size;
        r = 0;
    }
    if (r == 0)
        hold = block_keys_find(out, got, plen, &bounds, k, klen, &keys_end, &index, &count);
    if (hold == -2) {  /* the keys run further: the whole payload */
        r = lz4_payload_prefix(stored, size, plen, out, room, &got, &plen);
        hold = r == 0 ? block_keys_find(out, got, plen, &bounds, k, klen, &keys_end, &index,
                                        &count)
                      : -1;
    }
    if (hold >= 0) {
        uint64_t s = ((uint64_t)keys_end * 256 + plen - 1) / plen;
        e->keys_share = (unsigned char)(s < 255 ? s : 255);
    }
    if (hold == 1 && values) {
        /* through the key's value: the mean entry's share of what follows
         * the keys, for every entry up to it and one more */
        size_t mean = (plen - keys_end) / count;
        size_t want = keys_end + mean * (index + 2) + KEYS_SLACK;
        if (want > got && lz4) {
            r = lz4_payload_prefix(stored, size, want < plen ? want : plen, out, room, &got,
                                   &plen);
            if (r != 0)
                got = 0;
        }
        f = got ? block_value_at(out, got, plen, keys_end, count, index, &vp, &vlen) : -1;
        if (f == -2 && lz4) {
            r = lz4_payload_prefix(stored, size, plen, out, room, &got, &plen);
            f = r == 0 ? block_value_at(out, got, plen, keys_end, count, index, &vp, &vlen) : -1;
        }
        if (f > 0) {
            *value = found_value(f, vp, vlen, 0);
            if (*value == NULL)
                err = 1;
        }
    }
    if (lz4)
        PyMem_RawFree(out);
decided:
    if (err) {
        PyMem_RawFree(stored);
        return -1;
    }
    if (hold != 0 && f <= 0) {  /* the whole read decides, from the bytes read */
        st->buf = stored;
        st->size = size;
        st->kind = kind;
        return 1;
    }
    PyMem_RawFree(stored);
    uint64_t *counts = (uint64_t *)e->counts.buf;
    counts[BLOCK_READS]++;
    counts[hold ? TRUE_POSITIVES : FALSE_POSITIVES]++;
    keys_lean_by(e, hold);
    if (self->cache != NULL)  /* remembered, as the whole read's offer would */
        (void)cache_admits(self->cache, cache_key, hold);
    return hold ? 3 : 0;
}

/* The Python side's file_blocks(fast, f, keys) for the keys (a list) whose
 * block of file f the C path did not serve: the list of their values
 * (MISSING where not there), or NULL with the error it raised. */
PyObject *
hand_over(Getter *self, PyObject *fast, Py_ssize_t f, PyObject *keys)
{
    PyObject *fi = PyLong_FromSsize_t(f);
    if (fi == NULL)
        return NULL;
    PyObject *args[3] = {fast, fi, keys};
    PyObject *out = PyObject_Vectorcall(self->file_blocks, args, 3, NULL);
    Py_DECREF(fi);
    if (out != NULL && (!PyList_CheckExact(out) || PyList_GET_SIZE(out) != PyList_GET_SIZE(keys))) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_TypeError, "file_blocks must return a value per key");
        return NULL;
    }
    return out;
}

/* After a "maybe" from file f (entry e) for key: its value there.  1, found,
 * *value (a new reference; None for a tombstone); 0, not there; -1, error.
 * Counted as readpath.py's file_blocks counts a key. */
static int handed_seq(PyObject *fast, Py_ssize_t f, PyObject *key, uint64_t *seq);

NOINLINE static int
file_get(Getter *self, PyObject *fast, Py_ssize_t f, Entry *e, PyObject *key, uint64_t bound,
         PyObject **value, uint64_t *seq)
{
    Py_ssize_t i = bisect_index(e, key);
    uint64_t *counts = (uint64_t *)e->counts.buf;
    if (i == e->nidx) {  /* past the last block: no block can hold it */
        counts[FALSE_POSITIVES]++;
        return 0;
    }
    PyObject *entry;
    int r = 2;
    if (cached_entry(self, e, i, &entry)) {
        r = entry_answer(self, fast, e, entry, key, bound, value, seq);
        Py_DECREF(entry);
        if (r != 2)
            return r;
    } else {
        Stored st;
        r = keys_first(self, e, i, key, seq == NULL, value, &st);
        if (r <= 0)
            return r;
        if (r == 3)
            return 1;
        DiskBlock d;
        if (r == 1)  /* 2: the read failed already; the Python side reads again */
            r = disk_block_stored(e, i, st.buf, st.size, st.kind, &d);
        if (r < 0)
            return -1;
        if (r == 0) {
            int present;
            r = parsed_answer(self, fast, e, &d.b, key, bound, value, &present, seq);
            if (r == 0 || r == 1) {
                counts[BLOCK_READS]++;
                keys_lean_by(e, present);
                if (offer_parsed(self, e, i, &d.b, present) < 0) {
                    disk_block_free(&d);
                    if (r == 1)
                        Py_CLEAR(*value);
                    return -1;
                }
            }
            disk_block_free(&d);
            if (r != 2)
                return r;
        }
    }
    /* the Python side reads the block (and raises what it should) */
    PyObject *keys = PyList_New(1);
    if (keys == NULL)
        return -1;
    PyList_SET_ITEM(keys, 0, Py_NewRef(key));
    PyObject *out = hand_over(self, fast, f, keys);
    Py_DECREF(keys);
    if (out == NULL)
        return -1;
    PyObject *v = Py_NewRef(PyList_GET_ITEM(out, 0));
    Py_DECREF(out);
    if (v == self->missing) {
        Py_DECREF(v);
        return 0;
    }
    if (seq != NULL && handed_seq(fast, f, key, seq) < 0) {
        Py_DECREF(v);
        return -1;
    }
    *value = v;
    return 1;
}

/* lsmdb.readpath.entry_seq, registered at import (set_entry_seq): the
 * sequence number of a key's entry in a file whose block the C path handed
 * over. */
static PyObject *entry_seq_fn = NULL;

PyObject *
speedups_set_entry_seq(PyObject *Py_UNUSED(module), PyObject *fn)
{
    Py_XSETREF(entry_seq_fn, Py_NewRef(fn));
    Py_RETURN_NONE;
}

/* entry_seq(fast, fast.files[f], key) into *seq: 0, or -1 with an error set. */
static int
handed_seq(PyObject *fast, Py_ssize_t f, PyObject *key, uint64_t *seq)
{
    if (entry_seq_fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "lsmdb.readpath did not register entry_seq");
        return -1;
    }
    PyObject *args[3] = {fast, PyTuple_GET_ITEM(PyTuple_GET_ITEM(fast, FAST_FILES), f), key};
    PyObject *r = PyObject_Vectorcall(entry_seq_fn, args, 3, NULL);
    if (r == NULL)
        return -1;
    unsigned long long s = PyLong_AsUnsignedLongLong(r);
    Py_DECREF(r);
    if (s == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *seq = s;
    return 0;
}

/* File i's version of key, if it has one, taken as *best (a new reference)
 * when its sequence number is not above bound and above *best_seq: 0, or -1
 * on error. */
static int
best_of_file(Getter *self, PyObject *fast, Py_ssize_t i, PyObject *key, uint64_t bound,
             PyObject **best, uint64_t *best_seq)
{
    PyObject *v = NULL;
    uint64_t seq = 0;
    int r = file_get(self, fast, i, &((Probes *)PyTuple_GET_ITEM(fast, FAST_PROBES))->e[i],
                     key, bound, &v, &seq);
    if (r < 0)
        return -1;
    if (r == 1) {
        if (seq <= bound && (*best == NULL || seq > *best_seq)) {
            Py_XSETREF(*best, v);
            *best_seq = seq;
        } else {
            Py_DECREF(v);
        }
    }
    return 0;
}

/* Level 0's files when they overlap in sequence numbers (FastPath's
 * seq_overlap; readpath.py's lookup_by_seq): of those that hold key, the
 * version with the highest sequence number not above bound, the walk
 * stopping at the first file whose max_seq is not above the best found; with
 * a bound below LATEST (a snapshot's view) the deeper levels' files are
 * compared the same way.  1 and *value (a new reference; None for a
 * tombstone), 0 when level 0 (bounded: any level) holds no version, -1 on
 * error. */
static int
overlap_get(Getter *self, PyObject *fast, Probes *probes, PyObject *key, uint64_t bound,
            PyObject **value)
{
    PyObject *best = NULL;
    uint64_t best_seq = 0;
    Py_ssize_t i = 0;
    for (; i < probes->n0; i++) {
        if (best != NULL && probes->e[i].max_seq <= best_seq)
            break;
        int c = probes_check_l0(probes, i, key);
        if (c < 0 || (c > 0 && best_of_file(self, fast, i, key, bound, &best, &best_seq) < 0))
            goto fail;
    }
    for (i = bound == LATEST ? -1 : probes_first(probes, key, probes->n0); i >= 0;
         i = probes_first(probes, key, i + 1)) {
        if ((best == NULL || probes->e[i].max_seq > best_seq)
            && best_of_file(self, fast, i, key, bound, &best, &best_seq) < 0)
            goto fail;
    }
    if (best == NULL)
        return 0;
    *value = best;
    return 1;
fail:
    Py_XDECREF(best);
    return -1;
}

/* ---- get ------------------------------------------------------------------ */

/* key in the memtable or the frozen ones (newest first): 1 and *value
 * (borrowed; None for a tombstone), 0 when none has it, -1 on error.  With
 * have_h, h is the key's xxh3_64, and a memtable whose filter (the FastPath's
 * filters) says "no" is passed without a dict lookup. */
int
mem_lookup(PyObject *fast, PyObject *key, uint64_t h, int have_h, PyObject **value)
{
    PyObject *imms = PyTuple_GET_ITEM(fast, FAST_IMM_DATAS);
    PyObject *filters = PyTuple_GET_ITEM(fast, FAST_FILTERS);
    for (Py_ssize_t j = -1; j < PyTuple_GET_SIZE(imms); j++) {
        PyObject *d = j < 0 ? PyTuple_GET_ITEM(fast, FAST_DATA) : PyTuple_GET_ITEM(imms, j);
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

/* key's version in the memtables of view fast as a get of the newest sees it:
 * 1 and *value (a new reference; None for a tombstone, an expired value
 * included), 0 when no memtable holds a visible one, -1 on error. */
static inline int
mem_visible(Getter *self, PyObject *fast, PyObject *key, uint64_t h, int have_h,
            PyObject **value)
{
    PyObject *v = NULL;
    if (mem_lookup(fast, key, h, have_h, &v) < 0)
        return -1;
    if (v == NULL)
        return 0;
    v = visible(self, fast, Py_NewRef(v), LATEST);
    if (v == NULL)
        return -1;
    if (v == self->missing) {
        Py_DECREF(v);
        return 0;
    }
    *value = v;
    return 1;
}

/* lsmdb.ttl.system_now_us, registered at import (set_system_clock): a view
 * on that clock is read here, not through a call. */
static PyObject *system_clock = NULL;

PyObject *
speedups_set_system_clock(PyObject *Py_UNUSED(module), PyObject *clock)
{
    Py_XSETREF(system_clock, Py_NewRef(clock));
    Py_RETURN_NONE;
}

/* Whether FastPath fast reads the system clock (in C: no Python code runs). */
int
view_clock_is_system(PyObject *fast)
{
    return PyTuple_GET_ITEM(fast, FAST_NOW_US) == system_clock;
}

/* The clock of FastPath fast in microseconds since the epoch (a clock
 * before it reads as 0): 0 and *now, or -1 with an exception set.  The
 * system clock is read as lsmdb.ttl.system_now_us reads it, time.time_ns()
 * // 1000: CLOCK_REALTIME. */
int
view_now_us(PyObject *fast, uint64_t *now)
{
    PyObject *clock = PyTuple_GET_ITEM(fast, FAST_NOW_US);
    if (clock == system_clock) {
        struct timespec ts;
        if (clock_gettime(CLOCK_REALTIME, &ts) == 0) {
            *now = ts.tv_sec < 0 ? 0
                                 : (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
            return 0;
        }
    }
    PyObject *t = PyObject_CallNoArgs(clock);
    if (t == NULL)
        return -1;
    if (!PyLong_Check(t)) {
        Py_DECREF(t);
        PyErr_SetString(PyExc_TypeError, "a view's clock returns microseconds (an int)");
        return -1;
    }
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(t, &overflow);
    Py_DECREF(t);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *now = overflow > 0 ? UINT64_MAX : overflow < 0 || v < 0 ? 0 : (uint64_t)v;
    return 0;
}

/* An expiring value (value, expires) found in a read of FastPath fast: its
 * value while the view's clock (FAST_NOW_US, microseconds) is before
 * expires, then None -- a tombstone; the tuple released.  A new reference,
 * or NULL with an exception set. */
PyObject *
expiring_visible(PyObject *fast, PyObject *value)
{
    PyObject *out = NULL;
    uint64_t now;
    if (PyTuple_GET_SIZE(value) != 2 || !PyLong_Check(PyTuple_GET_ITEM(value, 1))) {
        PyErr_SetString(PyExc_TypeError, "an expiring value is (value, expires)");
        goto done;
    }
    unsigned long long expires = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(value, 1));
    if ((expires == (unsigned long long)-1 && PyErr_Occurred()) || view_now_us(fast, &now) < 0)
        goto done;
    out = Py_NewRef(now < expires ? PyTuple_GET_ITEM(value, 0) : Py_None);
done:
    Py_DECREF(value);
    return out;
}

/* r and *value of a step of a get that found key's newest version (1),
 * found none (0) or failed (-1): the same, but 0 where that version is a
 * tombstone (None, released) -- the key is absent. */
static inline int
newest(int r, PyObject **value)
{
    if (r == 1 && *value == Py_None) {
        Py_DECREF(*value);
        return 0;
    }
    return r;
}

/* The files' part of a get of key as view fast sees the newest versions,
 * once no memtable holds a visible version of it (and key is the one the
 * probes hold: getter_hash).  g: the key's gather_start, or NULL (not
 * gathered: the filters are then probed one by one).  1 and *value (a new
 * reference, never None), 0 when absent (no version, or a tombstone), -1 on
 * error.  The files count their steps; GETS and GETS_ABSENT are the
 * caller's.  Inline in the get (Getter_vectorcall); get_latest_files is the
 * same for get_many. */
static inline ALWAYS_INLINE int
files_latest(Getter *self, PyObject *fast, Probes *probes, PyObject *key, const Gather *g,
             PyObject **value)
{
    Py_ssize_t f;
    if (PyTuple_GET_ITEM(fast, FAST_SEQ_OVERLAP) == Py_True) {
        uint64_t bound = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(fast, FAST_BOUND));
        if (bound == (uint64_t)-1 && PyErr_Occurred())
            return -1;
        int r = overlap_get(self, fast, probes, key, bound, value);
        if (r != 0)
            return newest(r, value);
        if (bound != LATEST)  /* every level was compared */
            return 0;
        f = probes_first(probes, key, probes->n0);  /* the deeper levels, as ever */
    } else {
        f = g != NULL ? gather_finish(probes, g) : probes_first(probes, key, 0);
    }
    while (f >= 0) {
        int r = file_get(self, fast, f, &probes->e[f], key, LATEST, value, NULL);
        if (r != 0)
            return newest(r, value);
        f = probes_first(probes, key, f + 1);
    }
    return f == -2 ? -1 : 0;  /* -2: error in a probe */
}

int
get_latest_files(Getter *self, PyObject *fast, Probes *probes, PyObject *key,
                 PyObject **value)
{
    return files_latest(self, fast, probes, key, NULL, value);
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
    if (getter_follow(self) < 0)
        return NULL;
    PyObject *fast = NULL, *result = NULL, *value = NULL;
    int ok = getter_fast(self, &fast);
    if (ok <= 0)  /* 0: the Python getter serves (and raises DatabaseClosedError) */
        return ok < 0 ? NULL : PyObject_Vectorcall(self->slow_get, args, nargsf, NULL);
    uint64_t *counts = (uint64_t *)self->counts.buf;
    counts[GETS]++;
    Probes *probes = (Probes *)PyTuple_GET_ITEM(fast, FAST_PROBES);
    uint64_t h = 0;
    int have_h = getter_hash(probes, key, &h);
    /* The files' filter lines start loading before the memtables are asked:
     * the loads overlap that work, and each other's.  Files overlapping in
     * sequence numbers (overlap_get) test every level-0 filter one by one
     * afterwards, so their lines are loaded the same way. */
    Gather g;
    int gathered = have_h && can_gather(probes, key);
    if (gathered)
        gather_start(probes, key, h, &g);
    int r = mem_visible(self, fast, key, h, have_h, &value);
    r = r != 0 ? newest(r, &value)
               : files_latest(self, fast, probes, key, gathered ? &g : NULL, &value);
    if (r == 1) {
        result = value;
    } else if (r == 0) {
        counts[GETS_ABSENT]++;
        result = Py_NewRef(dflt);
    }
    Py_DECREF(fast);
    return result;
}

/* ---- nodisk and resume: a get that never waits on the disk (lsmdb.aio) ---- */

/* (MISSING, fast, f): "go on from file f of view fast, off the event loop";
 * (MISSING, None, -1): "the whole get, off the event loop" (nothing counted);
 * (MISSING, None, -2): the same, but the view has no C path (shadow mode, a
 * closed database): the Python twin may answer from memory first. */
static PyObject *
resume_marker(Getter *self, PyObject *fast, Py_ssize_t f)
{
    return Py_BuildValue("(OOn)", self->missing, fast != NULL ? fast : Py_None, f);
}

/* Whether file e's read of key needs a block the cache does not hold. */
static int
block_uncached(Getter *self, const Entry *e, PyObject *key)
{
    Py_ssize_t i = bisect_index(e, key);
    if (i == e->nidx)
        return 0;  /* past the last block: answered without one */
    if (self->cache == NULL)
        return 1;
    Py_ssize_t s = cache_find(self->cache, e->cache_base + (uint64_t)i);
    return s < 0 || !PyBytes_CheckExact(self->cache->slots[s].block);
}

/* key's get in view fast from file f on (f: a file that may hold it, as
 * probes_first gives, or -1: none), read and counted as the getter reads
 * them: the value (a new reference) or dflt (GETS_ABSENT counted); with
 * nodisk, a resume marker at the first file whose block the cache does not
 * hold, nothing of that file counted.  NULL on error. */
static PyObject *
files_from(Getter *self, PyObject *fast, Probes *probes, PyObject *key, PyObject *dflt,
           Py_ssize_t f, int nodisk)
{
    PyObject *value = NULL;
    while (f >= 0) {
        if (nodisk && block_uncached(self, &probes->e[f], key))
            return resume_marker(self, fast, f);
        int r = file_get(self, fast, f, &probes->e[f], key, LATEST, &value, NULL);
        if (r < 0)
            return NULL;
        if (r == 1) {
            if (value != Py_None)
                return value;
            Py_DECREF(value);  /* a tombstone: the newest version says deleted */
            break;
        }
        f = probes_first(probes, key, f + 1);
    }
    if (f == -2)
        return NULL;
    ((uint64_t *)self->counts.buf)[GETS_ABSENT]++;
    return Py_NewRef(dflt);
}

static PyObject *
Getter_nodisk(Getter *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* nodisk(key, default=None): the get, when memory answers it (a memtable,
     * the filters' "no", the block cache), counted as a get; else a resume
     * marker for resume() -- what it has counted so far stays counted, and
     * resume() counts the rest.  Python twin: readpath.make_nodisk. */
    if (self->db == NULL) {
        PyErr_SetString(PyExc_TypeError, "Getter is not initialised");
        return NULL;
    }
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "nodisk(key, default=None)");
        return NULL;
    }
    PyObject *key = args[0], *dflt = nargs > 1 ? args[1] : Py_None;
    if (!PyBytes_CheckExact(key) || PyBytes_GET_SIZE(key) > self->max_key
        || (self->watch != NULL && watch_changed(self->watch)))
        return resume_marker(self, NULL, -1);  /* checks, a catch-up: the whole get */
    PyObject *fast = NULL, *value = NULL, *result = NULL;
    int ok = getter_fast(self, &fast);
    if (ok <= 0)  /* -2: no C path for this view (shadow mode...): the Python twin's */
        return ok < 0 ? NULL : resume_marker(self, NULL, self->db != NULL ? -2 : -1);
    Probes *probes = (Probes *)PyTuple_GET_ITEM(fast, FAST_PROBES);
    uint64_t *counts = (uint64_t *)self->counts.buf;
    uint64_t h = 0;
    int have_h = getter_hash(probes, key, &h);
    int m = mem_visible(self, fast, key, h, have_h, &value);
    if (m < 0)
        goto done;
    if (m == 1) {
        counts[GETS]++;
        if (value == Py_None) {
            Py_DECREF(value);
            counts[GETS_ABSENT]++;
            result = Py_NewRef(dflt);
        } else {
            result = value;
        }
        goto done;
    }
    if (PyTuple_GET_ITEM(fast, FAST_SEQ_OVERLAP) == Py_True) {
        result = resume_marker(self, NULL, -1);  /* files compared by sequence number */
        goto done;
    }
    counts[GETS]++;
    Py_ssize_t f = probes_first(probes, key, 0);
    if (f != -2)
        result = files_from(self, fast, probes, key, dflt, f, 1);
done:
    Py_DECREF(fast);
    return result;
}

static PyObject *
Getter_resume(Getter *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* resume(key, default, fast, f): the rest of a get nodisk() stopped, reading
     * from disk (the GIL let go for each read); f -1: the whole get. */
    if (self->db == NULL) {
        PyErr_SetString(PyExc_TypeError, "Getter is not initialised");
        return NULL;
    }
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "resume(key, default, fast, f)");
        return NULL;
    }
    Py_ssize_t f = PyLong_AsSsize_t(args[3]);
    if (f == -1 && PyErr_Occurred())
        return NULL;
    if (f < 0)  /* -1, -2: the whole get */
        return PyObject_Vectorcall((PyObject *)self, args, 2, NULL);
    PyObject *fast = args[2];
    if (!PyBytes_CheckExact(args[0]) || !PyTuple_Check(fast)
        || PyTuple_GET_SIZE(fast) != FAST_FIELDS
        || !PyObject_TypeCheck(PyTuple_GET_ITEM(fast, FAST_PROBES), &ProbesType)
        || f >= ((Probes *)PyTuple_GET_ITEM(fast, FAST_PROBES))->n) {
        PyErr_SetString(PyExc_TypeError, "resume: not what nodisk() returned");
        return NULL;
    }
    Py_INCREF(fast);  /* held while the reads let the GIL go */
    PyObject *out = files_from(self, fast, (Probes *)PyTuple_GET_ITEM(fast, FAST_PROBES),
                               args[0], args[1], f, 0);
    Py_DECREF(fast);
    return out;
}

static PyObject *
Getter_follow(Getter *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* follow(watch, catch_up): before each read, catch_up() when the watch
     * sees a change (a following handle: lsmdb.follow). */
    if (nargs != 2 || !PyObject_TypeCheck(args[0], &ChangeWatchType)
        || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "follow(watch: ChangeWatch, catch_up: callable)");
        return NULL;
    }
    Py_XSETREF(self->catch_up, Py_NewRef(args[1]));
    Py_XSETREF(self->watch, (ChangeWatch *)Py_NewRef(args[0]));
    Py_RETURN_NONE;
}

static PyMethodDef Getter_methods[] = {
    {"nodisk", (PyCFunction)(void (*)(void))Getter_nodisk, METH_FASTCALL,
     "nodisk($self, key, default=None, /)\n--\n\n"
     "The get when memory answers it, counted; else (MISSING, fast, f) for resume()."},
    {"resume", (PyCFunction)(void (*)(void))Getter_resume, METH_FASTCALL,
     "resume($self, key, default, fast, f, /)\n--\n\n"
     "The rest of a get nodisk() stopped, reading from disk (f -1: the whole get)."},
    {"follow", (PyCFunction)(void (*)(void))Getter_follow, METH_FASTCALL,
     "follow($self, watch, catch_up, /)\n--\n\n"
     "Before each read, call catch_up() when the ChangeWatch sees a change."},
    {"many", (PyCFunction)Getter_many, METH_O,
     "many($self, keys, /)\n--\n\n"
     "The values of keys (None where absent), as get_many: None when the Python path "
     "must serve."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject GetterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lsmdb._speedups.Getter",
    .tp_basicsize = sizeof(Getter),
    .tp_dealloc = (destructor)Getter_dealloc,
    .tp_vectorcall_offset = offsetof(Getter, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Getter_traverse,
    .tp_clear = (inquiry)Getter_clear,
    .tp_doc = "Getter(db, state, missing, file_blocks, slow_get, max_key, cache)\n"
              "--\n\n"
              "get(key, default=None): a table's point read with the per-file steps in C;\n"
              "anything but a plain bytes key on an open database with C probes goes to\n"
              "the Python getter (slow_get), a block it cannot serve to file_blocks.",
    .tp_init = (initproc)Getter_init,
    .tp_methods = Getter_methods,
    .tp_new = PyType_GenericNew,
};

/* ---- Contains: `key in db` through the instance's compiled getter --------
 *
 * Contains(name) is a method for a class's __contains__: called with (self,
 * key) it calls self's attribute `name` (DB's per-instance compiled getter,
 * db.get) with the key and answers whether the value is not None.  It is a
 * method descriptor, so `key in db` calls it without a Python frame or a
 * bound method.  Python twin: the Python DB.__contains__ in lsmdb/db.py. */

typedef struct {
    PyObject_HEAD
    PyObject *name;
    vectorcallfunc vectorcall;
} Contains;

static PyObject *
Contains_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                    PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 2 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_SetString(PyExc_TypeError, "__contains__ takes exactly one key");
        return NULL;
    }
    PyObject *get = PyObject_GetAttr(args[0], ((Contains *)callable)->name);
    if (get == NULL)
        return NULL;
    PyObject *value = PyObject_Vectorcall(get, args + 1, 1, NULL);
    Py_DECREF(get);
    if (value == NULL)
        return NULL;
    int found = value != Py_None;
    Py_DECREF(value);
    return PyBool_FromLong(found);
}

static PyObject *
Contains_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *name;
    static char *kwlist[] = {"name", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "U:Contains", kwlist, &name))
        return NULL;
    Contains *self = (Contains *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->name = Py_NewRef(name);
    self->vectorcall = Contains_vectorcall;
    return (PyObject *)self;
}

static void
Contains_dealloc(Contains *self)
{
    Py_XDECREF(self->name);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Contains_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

PyTypeObject ContainsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lsmdb._speedups.Contains",
    .tp_basicsize = sizeof(Contains),
    .tp_dealloc = (destructor)Contains_dealloc,
    .tp_vectorcall_offset = offsetof(Contains, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = Contains_get,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "Contains(name)\n--\n\n"
              "A method for __contains__: (self, key) -> getattr(self, name)(key) is not None.",
    .tp_new = Contains_new,
};
