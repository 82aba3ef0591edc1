/* sstable_writer.c: block_cuts, where an SSTable builder cuts a chunk of
 * sorted entries into data blocks.  Python twin: lsmdb/sstable_writer.py's
 * block_cuts (the tests compare the two on the same chunks). */

#include "sstable_writer.h"
#include "coding.h"
#include "filters_hashing.h"
#include "keys.h"
#include "mpack.h"
#include "sstable_format.h"
#include "sstable_reader.h"

/* The bytes a block's size estimate counts for each entry besides its key
 * and value (sstable_writer._ENTRY_OVERHEAD). */
#define CUT_ENTRY_OVERHEAD 4

PyObject *
speedups_block_cuts(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* block_cuts(keys, values, need, block_size) -> (cuts, bases, total):
     * lsmdb.sstable_writer.block_cuts. */
    if (nargs != 4 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "block_cuts(keys: list, values: list, need: int, block_size: int)");
        return NULL;
    }
    PyObject *keys = args[0], *values = args[1];
    long long need = PyLong_AsLongLong(args[2]), block_size = PyLong_AsLongLong(args[3]);
    if ((need == -1 || block_size == -1) && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (PyList_GET_SIZE(values) != n) {
        PyErr_SetString(PyExc_ValueError, "block_cuts: keys and values differ in length");
        return NULL;
    }
    PyObject *cuts = PyList_New(0), *bases = PyList_New(0);
    if (cuts == NULL || bases == NULL)
        goto fail;
    long long cum = 0, base = 0;
    PyObject *prev = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyList_GET_ITEM(keys, i), *v = PyList_GET_ITEM(values, i);
        if (PyTuple_CheckExact(v) && PyTuple_GET_SIZE(v) == 2)
            v = PyTuple_GET_ITEM(v, 0);  /* an expiring value: its bytes count */
        if (!PyBytes_CheckExact(k) || (v != Py_None && !PyBytes_CheckExact(v))) {
            PyErr_SetString(PyExc_TypeError, "block_cuts: keys bytes, values bytes or None");
            goto fail;
        }
        if (prev != NULL && bytes_cmp(prev, k) >= 0) {
            PyErr_SetString(PyExc_ValueError,
                            "SSTable keys must be added in strictly increasing order");
            goto fail;
        }
        prev = k;
        cum += PyBytes_GET_SIZE(k) + (v == Py_None ? 0 : PyBytes_GET_SIZE(v)) + CUT_ENTRY_OVERHEAD;
        if (cum >= base + need) {  /* the block ends after entry i */
            PyObject *c = PyLong_FromSsize_t(i + 1), *b = PyLong_FromLongLong(cum);
            int bad = c == NULL || b == NULL || PyList_Append(cuts, c) < 0
                      || PyList_Append(bases, b) < 0;
            Py_XDECREF(c);
            Py_XDECREF(b);
            if (bad)
                goto fail;
            base = cum;
            need = block_size;
        }
    }
    PyObject *out = Py_BuildValue("(NNL)", cuts, bases, cum);
    return out;
fail:
    Py_XDECREF(cuts);
    Py_XDECREF(bases);
    return NULL;
}

/* ---- memtable_section: a frozen memtable's data blocks, written ------------- */

#define SEC_HEAD 16  /* two words: sec_order */
/* The payload bytes encoded, compressed and handed to the sink at a time: a
 * default memtable in one or two runs, as each run takes the GIL back once
 * (a wait of up to the switch interval while a writer runs). */
#define SEC_RUN_BYTES (4 << 20)

/* One entry of the memtable: pointers into its key's and value's bytes,
 * which the call holds references to (so nothing the gathering runs can free
 * them), so that the sort, the cuts and the payloads are made with the GIL
 * released. */
typedef struct {
    const unsigned char *k;
    const unsigned char *v;   /* NULL: a tombstone */
    size_t kn, vn;
    uint64_t tag, expires, hash;
    PyObject *key, *value;    /* references held until the call returns */
    int expiring;             /* the value is an expiring (bytes, expires) */
    int hashed;               /* hash already set (a key too long to hash here) */
    unsigned char head[SEC_HEAD];  /* the key's first bytes, zero-padded */
} SecEntry;

/* Bytewise order of two entries' keys.  Their heads decide most comparisons
 * without touching the keys themselves, which lie scattered in memory. */
static int
sec_cmp(const void *a, const void *b)
{
    const SecEntry *x = *(const SecEntry *const *)a, *y = *(const SecEntry *const *)b;
    int c = memcmp(x->head, y->head, SEC_HEAD);
    if (c)
        return c;
    if (x->kn > SEC_HEAD && y->kn > SEC_HEAD) {
        size_t n = x->kn < y->kn ? x->kn : y->kn;
        c = memcmp(x->k + SEC_HEAD, y->k + SEC_HEAD, n - SEC_HEAD);
        if (c)
            return c;
    }
    /* equal heads, one key at most SEC_HEAD long: a zero pad sorts as the
     * shorter key's end, so the lengths decide */
    return (x->kn > y->kn) - (x->kn < y->kn);
}

/* What the sort moves: an entry's key head as two big-endian words (their
 * order is the bytes' order) beside the entry, so that most comparisons are
 * two integer compares on contiguous memory. */
typedef struct {
    uint64_t w0, w1;
    SecEntry *e;
} SecSortKey;

static inline int
sec_before(const SecSortKey *a, const SecSortKey *b)
{
    if (a->w0 != b->w0)
        return a->w0 < b->w0;
    if (a->w1 != b->w1)
        return a->w1 < b->w1;
    return sec_cmp(&a->e, &b->e) < 0;  /* equal heads: the keys themselves */
}

/* Sort a[0:n] (tmp: room for n more), a merge sort with insertion sort for
 * short runs. */
static void
sec_sort(SecSortKey *a, SecSortKey *tmp, size_t n)
{
    if (n <= 16) {
        for (size_t i = 1; i < n; i++) {
            SecSortKey x = a[i];
            size_t j = i;
            for (; j > 0 && sec_before(&x, &a[j - 1]); j--)
                a[j] = a[j - 1];
            a[j] = x;
        }
        return;
    }
    size_t h = n / 2;
    sec_sort(a, tmp, h);
    sec_sort(a + h, tmp, n - h);
    if (!sec_before(&a[h], &a[h - 1]))
        return;  /* already in order */
    memcpy(tmp, a, h * sizeof(SecSortKey));
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n)
        a[k++] = sec_before(&a[j], &tmp[i]) ? a[j++] : tmp[i++];
    while (i < h)
        a[k++] = tmp[i++];
}

/* The entries' order by key, into order[] (keys: room for 2n). */
static void
sec_order(SecEntry *entries, SecEntry **order, size_t n, SecSortKey *keys)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t w[2];
        memcpy(w, entries[i].head, sizeof w);  /* SEC_HEAD bytes, zero-padded */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        w[0] = __builtin_bswap64(w[0]);
        w[1] = __builtin_bswap64(w[1]);
#endif
        keys[i].w0 = w[0];
        keys[i].w1 = w[1];
        keys[i].e = &entries[i];
    }
    sec_sort(keys, keys + n, n);
    for (size_t i = 0; i < n; i++)
        order[i] = keys[i].e;
}

/* Scratch buffers kept from one call to the next (a flush's entries, sort
 * keys, payloads and stored blocks: several MiB that would otherwise be
 * mapped afresh, page by page, at every flush: about 10 MiB for a default
 * memtable, at most 5 x SEC_SCRATCH_MAX_BYTES per process).  Taken and
 * given back with the GIL held, so two calls never share one; one larger
 * than SEC_SCRATCH_MAX_BYTES is freed instead of kept. */
enum { SCRATCH_ENTRIES, SCRATCH_ORDER, SCRATCH_KEYS, SCRATCH_PAY, SCRATCH_OUT, SCRATCH_SLOTS };
#define SEC_SCRATCH_MAX_BYTES (8u << 20)
static struct {
    void *p;
    size_t cap;
} sec_scratch[SCRATCH_SLOTS];

/* Under the GIL: the slot's kept buffer (NULL, *cap 0: none), now the caller's. */
static void *
scratch_take(int slot, size_t *cap)
{
    void *p = sec_scratch[slot].p;
    *cap = sec_scratch[slot].cap;
    sec_scratch[slot].p = NULL;
    sec_scratch[slot].cap = 0;
    return p;
}

/* Under the GIL: a buffer of at least `need` bytes, the slot's if it is
 * large enough; NULL: out of memory. */
static void *
scratch_alloc(int slot, size_t need, size_t *cap)
{
    void *p = scratch_take(slot, cap);
    if (*cap >= need)
        return p;
    PyMem_RawFree(p);
    *cap = need;
    return PyMem_RawMalloc(need ? need : 1);
}

/* Under the GIL: keep p for the next call, or free it. */
static void
scratch_give(int slot, void *p, size_t cap)
{
    if (p != NULL && cap <= SEC_SCRATCH_MAX_BYTES && sec_scratch[slot].p == NULL) {
        sec_scratch[slot].p = p;
        sec_scratch[slot].cap = cap;
    } else {
        PyMem_RawFree(p);
    }
}

/* The blocks: each one's end (an entry index past its last), payload size,
 * and -- once written -- stored size (before its trailer) and type byte. */
typedef struct {
    size_t *end, *len, *slen;
    unsigned char *types;
    size_t blocks;
} SecBlocks;

static void
sec_blocks_free(SecBlocks *b)
{
    PyMem_RawFree(b->end);
    PyMem_RawFree(b->len);
    PyMem_RawFree(b->slen);
    PyMem_RawFree(b->types);
}

/* No GIL: sort, hash the short keys, cut into blocks (block_cuts' rule with
 * nothing pending) and size each block's payload (block.c's data_payload
 * format).  0, or -1: out of memory. */
static int
sec_plan(SecEntry *entries, SecEntry **order, SecSortKey *keys, size_t n, long long block_size,
         int want_hashes, SecBlocks *out)
{
    sec_order(entries, order, n, keys);
    if (want_hashes)
        for (size_t i = 0; i < n; i++)
            if (!order[i]->hashed)
                order[i]->hash = xxh3_64_short(order[i]->k, order[i]->kn);
    out->end = PyMem_RawMalloc(n * sizeof(size_t));
    if (out->end == NULL)
        return -1;
    long long cum = 0, base = 0;
    size_t blocks = 0;
    for (size_t i = 0; i < n; i++) {
        cum += (long long)(order[i]->kn + order[i]->vn) + CUT_ENTRY_OVERHEAD;
        if (cum >= base + block_size) {
            out->end[blocks++] = i + 1;
            base = cum;
        }
    }
    if (blocks == 0 || out->end[blocks - 1] != n)
        out->end[blocks++] = n;
    out->blocks = blocks;
    out->len = PyMem_RawMalloc(blocks * sizeof(size_t));
    out->slen = PyMem_RawMalloc(blocks * sizeof(size_t));
    out->types = PyMem_RawMalloc(blocks);
    if (out->len == NULL || out->slen == NULL || out->types == NULL)
        return -1;
    size_t lo = 0;
    for (size_t b = 0; b < blocks; b++) {
        size_t hi = out->end[b], m = hi - lo, size = 1 + 3 * mpw_array_size(m);
        int expiring = 0;
        for (size_t i = lo; i < hi; i++) {
            const SecEntry *e = order[i];
            size += mpw_bin_size(e->kn) + mpw_uint_size(e->tag)
                    + (e->v == NULL ? 1 : mpw_bin_size(e->vn));
            expiring |= e->expiring;
        }
        if (expiring)
            for (size_t i = lo; i < hi; i++)
                size += mpw_uint_size(order[i]->expires);
        out->len[b] = size + mpw_array_size(expiring ? m : 0);
        lo = hi;
    }
    return 0;
}

/* No GIL: the payload of block b (entries lo..hi) at p; returns its end. */
static unsigned char *
sec_payload(unsigned char *p, SecEntry *const *order, size_t lo, size_t hi)
{
    size_t m = hi - lo;
    int expiring = 0;
    *p++ = 0x94;
    p = mpw_array(p, m);
    for (size_t i = lo; i < hi; i++) {
        p = mpw_bin_raw(p, order[i]->k, order[i]->kn);
        expiring |= order[i]->expiring;
    }
    p = mpw_array(p, m);
    for (size_t i = lo; i < hi; i++) {
        if (order[i]->v == NULL)
            *p++ = 0xC0;
        else
            p = mpw_bin_raw(p, order[i]->v, order[i]->vn);
    }
    p = mpw_array(p, m);
    for (size_t i = lo; i < hi; i++)
        p = mpw_uint(p, order[i]->tag);
    p = mpw_array(p, expiring ? m : 0);
    for (size_t i = lo; expiring && i < hi; i++)
        p = mpw_uint(p, order[i]->expires);
    return p;
}

/* One block's trailer (DATA_TRAILER_V2: its type byte, then the CRC-32 of
 * its stored bytes and that byte, little-endian) after its n stored bytes at p. */
static unsigned char *
sec_trailer(unsigned char *p, size_t n, unsigned char type)
{
    uint32_t crc = crc32_update(crc32_update(0, p, n), &type, 1);
    p[n] = type;
    for (int j = 0; j < 4; j++)
        p[n + 1 + j] = (unsigned char)(crc >> (8 * j));
    return p + n + 5;
}

/* The buffers of a run of blocks: their payloads back to back (`pay`),
 * the blocks as stored with their trailers (`out`), one block's LZ4 output
 * (`tmp`), and the LZ4 stream. */
typedef struct {
    unsigned char *pay, *out, *tmp;
    size_t pay_cap, out_cap, tmp_cap;
    void *stream;
} SecRun;

static int
sec_room(unsigned char **buf, size_t *cap, size_t need)
{
    if (*cap >= need)
        return 0;
    unsigned char *grown = PyMem_RawRealloc(*buf, need);
    if (grown == NULL)
        return -1;
    *buf = grown;
    *cap = need;
    return 0;
}

/* The end of the run of blocks that starts at block b0: about SEC_RUN_BYTES
 * of payloads, at least one block. */
static size_t
sec_run_end(const SecBlocks *bl, size_t b0)
{
    size_t b1 = b0, bytes = 0;
    while (b1 < bl->blocks && (b1 == b0 || bytes + bl->len[b1] <= SEC_RUN_BYTES))
        bytes += bl->len[b1++];
    return b1;
}

/* No GIL: the payloads of blocks [b0, b1) into run->pay; -1: out of memory. */
static int
sec_encode_run(SecRun *run, SecEntry *const *order, const SecBlocks *bl, size_t b0, size_t b1)
{
    size_t need = 0;
    for (size_t b = b0; b < b1; b++)
        need += bl->len[b];
    if (sec_room(&run->pay, &run->pay_cap, need) < 0)
        return -1;
    unsigned char *p = run->pay;
    for (size_t b = b0; b < b1; b++)
        p = sec_payload(p, order, b ? bl->end[b - 1] : 0, bl->end[b]);
    return 0;
}

/* No GIL: the blocks [b0, b1) of run->pay stored into run->out with their
 * trailers, as LZ4 where `lz4` is given and it saves at least an eighth,
 * else as they are (stored[b - b0], where not NULL: what the caller's
 * compress made of it, type `kind`).  *used: the bytes of run->out; -1: out
 * of memory. */
static int
sec_store_run(SecRun *run, SecBlocks *bl, size_t b0, size_t b1, const Lz4Api *lz4,
              PyObject *const *stored, int kind, size_t *used)
{
    size_t need = 0, widest = 0;
    for (size_t b = b0; b < b1; b++) {
        need += bl->len[b] + 5;
        if (bl->len[b] > widest)
            widest = bl->len[b];
    }
    if (sec_room(&run->out, &run->out_cap, need) < 0)
        return -1;
    if (lz4 != NULL) {
        if (widest > (size_t)INT_MAX - 64)
            return -1;
        int cap = lz4->bound((int)widest);
        if (cap <= 0 || sec_room(&run->tmp, &run->tmp_cap, (size_t)cap + 4) < 0)
            return -1;
        if (run->stream == NULL && (run->stream = lz4->create()) == NULL)
            return -1;
    }
    const unsigned char *payload = run->pay;
    unsigned char *p = run->out;
    for (size_t b = b0; b < b1; b++) {
        size_t len = bl->len[b];
        const unsigned char *s = payload;
        size_t slen = len;
        unsigned char type = COMPRESSION_NONE;
        if (lz4 != NULL) {
            lz4->reset(run->stream);
            int got = lz4->compress(run->stream, (const char *)payload, (char *)run->tmp + 4,
                                    (int)len, lz4->bound((int)len), 1);
            if (got > 0 && (size_t)got + 4 <= len - len / 8) {
                for (int j = 0; j < 4; j++)
                    run->tmp[j] = (unsigned char)(len >> (8 * j));
                s = run->tmp;
                slen = (size_t)got + 4;
                type = COMPRESSION_LZ4;
            }
        } else if (stored != NULL && stored[b - b0] != NULL) {
            s = (const unsigned char *)PyBytes_AS_STRING(stored[b - b0]);
            slen = (size_t)PyBytes_GET_SIZE(stored[b - b0]);
            type = (unsigned char)kind;
        }
        memcpy(p, s, slen);
        bl->slen[b] = slen;
        bl->types[b] = type;
        p = sec_trailer(p, slen, type);
        payload += len;
    }
    *used = (size_t)(p - run->out);
    return 0;
}

/* Under the GIL: compress(payload) for each block of the run where that
 * saves at least an eighth (stored[i] a new reference, else NULL).  0, or -1
 * with an exception. */
static int
sec_compress_run(const SecRun *run, const SecBlocks *bl, size_t b0, size_t b1,
                 PyObject *compress, PyObject **stored)
{
    const unsigned char *payload = run->pay;
    for (size_t b = b0; b < b1; b++) {
        size_t len = bl->len[b];
        stored[b - b0] = NULL;
        PyObject *arg = PyBytes_FromStringAndSize((const char *)payload, (Py_ssize_t)len);
        if (arg == NULL)
            return -1;
        PyObject *c = PyObject_CallOneArg(compress, arg);
        Py_DECREF(arg);
        if (c == NULL)
            return -1;
        if (!PyBytes_CheckExact(c)) {
            Py_DECREF(c);
            PyErr_SetString(PyExc_TypeError, "memtable_section: compress returned no bytes");
            return -1;
        }
        if ((size_t)PyBytes_GET_SIZE(c) <= len - len / 8)
            stored[b - b0] = c;
        else
            Py_DECREF(c);
        payload += len;
    }
    return 0;
}

/* Under the GIL: one entry of the memtable, its key k, value v and tag t
 * (references taken: released as memtable_section returns). */
static int
sec_entry(SecEntry *e, PyObject *k, PyObject *v, PyObject *t, int want_hashes)
{
    e->key = e->value = NULL;
    if (!PyBytes_CheckExact(k)) {
        PyErr_SetString(PyExc_TypeError, "memtable_section: keys bytes");
        return -1;
    }
    if (!PyLong_CheckExact(t)) {
        PyErr_SetString(PyExc_TypeError, "memtable_section: tags int");
        return -1;
    }
    unsigned long long tag = PyLong_AsUnsignedLongLong(t);
    if (tag == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    e->tag = tag;
    e->expiring = 0;
    e->expires = 0;
    e->hashed = 0;
    PyObject *bytes = v;
    if (PyTuple_CheckExact(v)) {
        if (PyTuple_GET_SIZE(v) != 2 || !PyBytes_CheckExact(PyTuple_GET_ITEM(v, 0))
            || !PyLong_CheckExact(PyTuple_GET_ITEM(v, 1))) {
            PyErr_SetString(PyExc_TypeError, "an expiring value is (bytes, int)");
            return -1;
        }
        unsigned long long x = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(v, 1));
        if (x == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
        e->expiring = 1;
        e->expires = x;
        bytes = PyTuple_GET_ITEM(v, 0);
    } else if (v != Py_None && !PyBytes_CheckExact(v)) {
        PyErr_SetString(PyExc_TypeError, "memtable_section: values bytes, None or expiring");
        return -1;
    }
    e->kn = (size_t)PyBytes_GET_SIZE(k);
    e->vn = bytes == Py_None ? 0 : (size_t)PyBytes_GET_SIZE(bytes);
    if (e->kn > 0xFFFFFFFFu || e->vn > 0xFFFFFFFFu) {
        PyErr_SetString(PyExc_ValueError, "a key or value too long for msgpack");
        return -1;
    }
    if (want_hashes && e->kn > XXH3_NATIVE_MAX) {
        if (xxh3_64_bytes(k, &e->hash) < 0)
            return -1;
        e->hashed = 1;
    }
    e->key = Py_NewRef(k);
    e->value = Py_NewRef(v);  /* holds the tuple, and so its bytes */
    e->k = (const unsigned char *)PyBytes_AS_STRING(k);
    e->v = bytes == Py_None ? NULL : (const unsigned char *)PyBytes_AS_STRING(bytes);
    memset(e->head, 0, SEC_HEAD);
    memcpy(e->head, e->k, e->kn < SEC_HEAD ? e->kn : SEC_HEAD);
    return 0;
}

PyObject *
speedups_memtable_section(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* memtable_section(data, tags, block_size, kind, compress, want_hashes, sink) ->
     * lsmdb.sstable_writer.memtable_section: (size, index_keys, index_offsets,
     * index_sizes, hashes, tombstones, expiring, uncompressed_bytes, min_key),
     * the section handed to sink a run of blocks at a time. */
    if (nargs != 7 || !PyDict_CheckExact(args[0]) || !PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "memtable_section(data: dict, tags: dict, block_size, "
                                         "kind, compress, want_hashes, sink)");
        return NULL;
    }
    PyObject *data = args[0], *tags = args[1], *compress = args[4], *sink = args[6];
    long long block_size = PyLong_AsLongLong(args[2]);
    if (block_size == -1 && PyErr_Occurred())
        return NULL;
    long kind = PyLong_AsLong(args[3]);
    if (kind == -1 && PyErr_Occurred())
        return NULL;
    int want_hashes = PyObject_IsTrue(args[5]);
    if (want_hashes < 0)
        return NULL;
    if (block_size < 1 || kind < 0 || kind > 255 || !PyCallable_Check(sink)
        || (compress != Py_None && !PyCallable_Check(compress))) {
        PyErr_SetString(PyExc_ValueError,
                        "memtable_section: bad block_size, kind, compress or sink");
        return NULL;
    }
    Py_ssize_t sn = PyDict_GET_SIZE(data);
    if (PyDict_GET_SIZE(tags) != sn) {
        PyErr_SetString(PyExc_ValueError, "memtable_section: data and tags differ in length");
        return NULL;
    }
    if (sn == 0) {
        PyErr_SetString(PyExc_ValueError, "an SSTable needs at least one entry");
        return NULL;
    }
    size_t n = (size_t)sn, got = 0, entries_cap, order_cap, keys_cap;
    SecEntry *entries = scratch_alloc(SCRATCH_ENTRIES, n * sizeof(SecEntry), &entries_cap);
    SecEntry **order = scratch_alloc(SCRATCH_ORDER, n * sizeof(SecEntry *), &order_cap);
    SecSortKey *keys = scratch_alloc(SCRATCH_KEYS, 2 * n * sizeof(SecSortKey), &keys_cap);
    SecBlocks bl = {NULL, NULL, NULL, NULL, 0};
    SecRun run = {NULL, NULL, NULL, 0, 0, 0, NULL};
    run.pay = scratch_take(SCRATCH_PAY, &run.pay_cap);
    run.out = scratch_take(SCRATCH_OUT, &run.out_cap);
    PyObject **stored = NULL;
    PyObject *ikeys = NULL, *ioffs = NULL, *isizes = NULL, *hashes = NULL, *result = NULL;
    const Lz4Api *lz4 = kind == COMPRESSION_LZ4 && compress != Py_None ? lz4_compressor() : NULL;
    if (entries == NULL || order == NULL || keys == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* The two dicts were filled together, so they are walked in step; where
     * their orders differ, the tag is looked up. */
    Py_ssize_t pos = 0, tpos = 0;
    PyObject *k, *v, *tk, *tv;
    int lockstep = 1;
    size_t tombstones = 0, expiring = 0;
    while (PyDict_Next(data, &pos, &k, &v)) {
        PyObject *t = NULL;
        if (got >= n) {
            PyErr_SetString(PyExc_RuntimeError, "memtable_section: the memtable changed");
            goto done;
        }
        Py_INCREF(k);  /* the lookup below may run Python code */
        Py_INCREF(v);
        if (lockstep && PyDict_Next(tags, &tpos, &tk, &tv) && tk == k) {
            t = Py_NewRef(tv);
        } else {
            lockstep = 0;
            t = PyDict_GetItemWithError(tags, k);
            if (t == NULL && !PyErr_Occurred())
                PyErr_SetString(PyExc_KeyError, "memtable_section: a key without a tag");
            Py_XINCREF(t);
        }
        int bad = t == NULL || sec_entry(&entries[got], k, v, t, want_hashes) < 0;
        Py_XDECREF(t);
        Py_DECREF(k);
        Py_DECREF(v);
        if (bad)
            goto done;
        tombstones += entries[got].v == NULL;
        expiring += (size_t)entries[got].expiring;
        got++;
    }
    if (got != n) {
        PyErr_SetString(PyExc_RuntimeError, "memtable_section: the memtable changed");
        goto done;
    }
    /* None or LZ4 (compressed here): each run is encoded and stored in one
     * stretch without the GIL, the first in the same stretch as the sort,
     * so that a default memtable takes the GIL back once before its sink
     * call (each taking can wait out a busy writer's switch interval). */
    int whole = lz4 != NULL || compress == Py_None;
    int planned, first_ok = 0;
    size_t first_end = 0, first_used = 0;
    Py_BEGIN_ALLOW_THREADS
    planned = sec_plan(entries, order, keys, n, block_size, want_hashes, &bl);
    if (planned == 0 && whole) {
        first_end = sec_run_end(&bl, 0);
        first_ok = sec_encode_run(&run, order, &bl, 0, first_end);
        if (first_ok == 0)
            first_ok = sec_store_run(&run, &bl, 0, first_end, lz4, NULL, (int)kind,
                                     &first_used);
    }
    Py_END_ALLOW_THREADS
    if (planned < 0 || first_ok < 0) {
        PyErr_NoMemory();
        goto done;
    }
    if (!whole && (stored = PyMem_Calloc(bl.blocks, sizeof(PyObject *))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* Runs of about SEC_RUN_BYTES of payloads: encoded (and, by the lz4
     * package's library, compressed) without the GIL, then handed to sink. */
    size_t offset = 0, uncompressed = 0;
    for (size_t b0 = 0; b0 < bl.blocks;) {
        size_t b1 = sec_run_end(&bl, b0), bytes = 0;
        for (size_t b = b0; b < b1; b++)
            bytes += bl.len[b];
        int ok;
        size_t used = 0;
        if (whole && b0 == 0) {  /* stored with the sort */
            ok = 0;
            used = first_used;
        } else if (whole) {
            Py_BEGIN_ALLOW_THREADS
            ok = sec_encode_run(&run, order, &bl, b0, b1);
            if (ok == 0)
                ok = sec_store_run(&run, &bl, b0, b1, lz4, NULL, (int)kind, &used);
            Py_END_ALLOW_THREADS
        } else {  /* compress, a Python callable, between the two */
            Py_BEGIN_ALLOW_THREADS
            ok = sec_encode_run(&run, order, &bl, b0, b1);
            Py_END_ALLOW_THREADS
            if (ok < 0) {
                PyErr_NoMemory();
                goto done;
            }
            if (sec_compress_run(&run, &bl, b0, b1, compress, stored + b0) < 0)
                goto done;
            Py_BEGIN_ALLOW_THREADS
            ok = sec_store_run(&run, &bl, b0, b1, NULL, stored + b0, (int)kind, &used);
            Py_END_ALLOW_THREADS
        }
        if (stored != NULL)
            for (size_t b = b0; b < b1; b++)
                Py_CLEAR(stored[b]);
        if (ok < 0) {
            PyErr_NoMemory();
            goto done;
        }
        PyObject *piece = PyBytes_FromStringAndSize((const char *)run.out, (Py_ssize_t)used);
        if (piece == NULL)
            goto done;
        PyObject *r = PyObject_CallOneArg(sink, piece);
        Py_DECREF(piece);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
        uncompressed += bytes;
        b0 = b1;
    }
    ikeys = PyList_New((Py_ssize_t)bl.blocks);
    ioffs = PyList_New((Py_ssize_t)bl.blocks);
    isizes = PyList_New((Py_ssize_t)bl.blocks);
    if (ikeys == NULL || ioffs == NULL || isizes == NULL)
        goto done;
    for (size_t b = 0; b < bl.blocks; b++) {
        PyObject *o = PyLong_FromSize_t(offset), *s = PyLong_FromSize_t(bl.slen[b]);
        if (o == NULL || s == NULL) {
            Py_XDECREF(o);
            Py_XDECREF(s);
            goto done;
        }
        PyList_SET_ITEM(ikeys, (Py_ssize_t)b, Py_NewRef(order[bl.end[b] - 1]->key));
        PyList_SET_ITEM(ioffs, (Py_ssize_t)b, o);
        PyList_SET_ITEM(isizes, (Py_ssize_t)b, s);
        offset += bl.slen[b] + 5;
    }
    if (want_hashes) {  /* an array('Q'): no int object per key */
        PyObject *words = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * 8));
        if (words == NULL)
            goto done;
        uint64_t *w = (uint64_t *)PyBytes_AS_STRING(words);
        for (size_t j = 0; j < n; j++)
            w[j] = order[j]->hash;
        PyObject *array_mod = PyImport_ImportModule("array");
        if (array_mod != NULL) {
            hashes = PyObject_CallMethod(array_mod, "array", "sO", "Q", words);
            Py_DECREF(array_mod);
        }
        Py_DECREF(words);
        if (hashes == NULL)
            goto done;
    } else {
        hashes = Py_NewRef(Py_None);
    }
    result = Py_BuildValue("(nOOOOnnnO)", (Py_ssize_t)offset, ikeys, ioffs, isizes, hashes,
                           (Py_ssize_t)tombstones, (Py_ssize_t)expiring, (Py_ssize_t)uncompressed,
                           order[0]->key);
done:
    if (stored != NULL)
        for (size_t b = 0; b < bl.blocks; b++)
            Py_XDECREF(stored[b]);
    PyMem_Free(stored);
    Py_XDECREF(ikeys);
    Py_XDECREF(ioffs);
    Py_XDECREF(isizes);
    Py_XDECREF(hashes);
    if (run.stream != NULL)
        lz4->release(run.stream);
    scratch_give(SCRATCH_PAY, run.pay, run.pay_cap);
    scratch_give(SCRATCH_OUT, run.out, run.out_cap);
    PyMem_RawFree(run.tmp);
    sec_blocks_free(&bl);
    /* Exact bytes, tuples and ints (sec_entry): their release runs no Python
     * code, so no other call can take a scratch slot meanwhile. */
    for (size_t i = 0; i < got; i++) {
        Py_DECREF(entries[i].key);
        Py_DECREF(entries[i].value);
    }
    scratch_give(SCRATCH_ENTRIES, entries, entries_cap);
    scratch_give(SCRATCH_ORDER, order, order_cap);
    scratch_give(SCRATCH_KEYS, keys, keys_cap);
    return result;
}
