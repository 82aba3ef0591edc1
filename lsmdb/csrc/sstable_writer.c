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

#define SEC_HEAD 16

/* One entry of the memtable: borrowed pointers into its dicts' bytes, which
 * the caller's references keep alive and a frozen memtable never changes, so
 * the sort, the cuts and the payloads are made with the GIL released. */
typedef struct {
    const unsigned char *k;
    const unsigned char *v;   /* NULL: a tombstone */
    size_t kn, vn;
    uint64_t tag, expires, hash;
    PyObject *key;            /* borrowed */
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

/* What the GIL-free part makes: the payloads, back to back, and each block's
 * end (an entry index), offset and length in them. */
typedef struct {
    unsigned char *buf;
    size_t *end, *off, *len;
    size_t *slen;            /* each block's stored size (before its trailer) */
    unsigned char *types;    /* and its type byte */
    size_t blocks;
} SecBlocks;

static void
sec_blocks_free(SecBlocks *b)
{
    PyMem_RawFree(b->buf);
    PyMem_RawFree(b->end);
    PyMem_RawFree(b->off);
    PyMem_RawFree(b->len);
    PyMem_RawFree(b->slen);
    PyMem_RawFree(b->types);
}

/* No GIL: room for each block's stored size and type.  0, or -1. */
static int
sec_alloc_stored(SecBlocks *b)
{
    b->slen = PyMem_RawMalloc(b->blocks * sizeof(size_t));
    b->types = PyMem_RawMalloc(b->blocks);
    return b->slen == NULL || b->types == NULL ? -1 : 0;
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

/* No GIL: the section, each block stored as LZ4 -- what lz4.block.compress
 * stores: the payload's length, u32 little-endian, then the LZ4 block of a
 * fresh stream -- where that saves at least an eighth, else as it is: *raw
 * (PyMem_RawMalloc'd) and *total.  0, or -1: out of memory. */
static int
sec_pack_lz4(SecBlocks *b, const Lz4Api *lz4, unsigned char **raw, size_t *total)
{
    size_t room = 0, widest = 0;
    for (size_t i = 0; i < b->blocks; i++) {
        room += b->len[i] + 5;
        if (b->len[i] > widest)
            widest = b->len[i];
    }
    if (widest > (size_t)INT_MAX - 64)
        return -1;
    int cap = lz4->bound((int)widest);
    void *stream = lz4->create();
    unsigned char *out = PyMem_RawMalloc(room), *tmp = PyMem_RawMalloc((size_t)cap + 4);
    if (out == NULL || tmp == NULL || stream == NULL || cap <= 0) {
        PyMem_RawFree(out);
        PyMem_RawFree(tmp);
        if (stream != NULL)
            lz4->release(stream);
        return -1;
    }
    unsigned char *p = out;
    for (size_t i = 0; i < b->blocks; i++) {
        size_t len = b->len[i];
        const unsigned char *payload = b->buf + b->off[i];
        lz4->reset(stream);
        int got = lz4->compress(stream, (const char *)payload, (char *)tmp + 4, (int)len,
                                lz4->bound((int)len), 1);
        if (got > 0 && (size_t)got + 4 <= len - len / 8) {
            for (int j = 0; j < 4; j++)
                tmp[j] = (unsigned char)(len >> (8 * j));
            memcpy(p, tmp, (size_t)got + 4);
            b->slen[i] = (size_t)got + 4;
            b->types[i] = COMPRESSION_LZ4;
        } else {
            memcpy(p, payload, len);
            b->slen[i] = len;
            b->types[i] = COMPRESSION_NONE;
        }
        p = sec_trailer(p, b->slen[i], b->types[i]);
    }
    lz4->release(stream);
    PyMem_RawFree(tmp);
    *raw = out;
    *total = (size_t)(p - out);
    return 0;
}

/* No GIL: the section at out, each block's stored bytes (stored[i], or its
 * payload where that is NULL) with its trailer. */
static void
sec_pack(const SecBlocks *b, PyObject *const *stored, unsigned char *out)
{
    for (size_t i = 0; i < b->blocks; i++) {
        const unsigned char *s = stored[i] ? (const unsigned char *)PyBytes_AS_STRING(stored[i])
                                           : b->buf + b->off[i];
        memcpy(out, s, b->slen[i]);
        out = sec_trailer(out, b->slen[i], b->types[i]);
    }
}

static unsigned char *
sec_bin(unsigned char *p, const unsigned char *s, size_t n)
{
    if (n <= 0xFF) {
        *p++ = 0xC4;
        *p++ = (unsigned char)n;
    } else if (n <= 0xFFFF) {
        *p++ = 0xC5;
        *p++ = (unsigned char)(n >> 8);
        *p++ = (unsigned char)n;
    } else {
        *p++ = 0xC6;
        for (int s8 = 24; s8 >= 0; s8 -= 8)
            *p++ = (unsigned char)(n >> s8);
    }
    if (n)
        memcpy(p, s, n);
    return p + n;
}

/* No GIL: sort, hash the short keys, cut into blocks (block_cuts' rule with
 * nothing pending) and write each block's payload (block.c's data_payload
 * format).  0, or -1: out of memory. */
static int
sec_build(SecEntry **order, size_t n, long long block_size, int want_hashes, SecBlocks *out)
{
    qsort(order, n, sizeof(SecEntry *), sec_cmp);
    if (want_hashes)
        for (size_t i = 0; i < n; i++)
            if (!order[i]->hashed)
                order[i]->hash = xxh3_64_short(order[i]->k, order[i]->kn);
    out->end = PyMem_RawMalloc((n + 1) * sizeof(size_t));
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
    out->off = PyMem_RawMalloc(blocks * sizeof(size_t));
    out->len = PyMem_RawMalloc(blocks * sizeof(size_t));
    if (out->off == NULL || out->len == NULL)
        return -1;
    size_t total = 0, lo = 0;
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
        size += mpw_array_size(expiring ? m : 0);
        out->off[b] = total;
        out->len[b] = size;
        total += size;
        lo = hi;
    }
    out->buf = PyMem_RawMalloc(total ? total : 1);
    if (out->buf == NULL)
        return -1;
    lo = 0;
    for (size_t b = 0; b < blocks; b++) {
        size_t hi = out->end[b], m = hi - lo;
        unsigned char *p = out->buf + out->off[b];
        int expiring = 0;
        *p++ = 0x94;
        p = mpw_array(p, m);
        for (size_t i = lo; i < hi; i++) {
            p = sec_bin(p, order[i]->k, order[i]->kn);
            expiring |= order[i]->expiring;
        }
        p = mpw_array(p, m);
        for (size_t i = lo; i < hi; i++)
            p = order[i]->v == NULL ? (*p = 0xC0, p + 1) : sec_bin(p, order[i]->v, order[i]->vn);
        p = mpw_array(p, m);
        for (size_t i = lo; i < hi; i++)
            p = mpw_uint(p, order[i]->tag);
        p = mpw_array(p, expiring ? m : 0);
        for (size_t i = lo; expiring && i < hi; i++)
            p = mpw_uint(p, order[i]->expires);
        lo = hi;
    }
    return 0;
}

/* Under the GIL: one entry of the memtable, its key k, value v and tag t. */
static int
sec_entry(SecEntry *e, PyObject *k, PyObject *v, PyObject *t, int want_hashes)
{
    if (!PyBytes_CheckExact(k)) {
        PyErr_SetString(PyExc_TypeError, "memtable_section: keys bytes");
        return -1;
    }
    e->key = k;
    e->k = (const unsigned char *)PyBytes_AS_STRING(k);
    e->kn = (size_t)PyBytes_GET_SIZE(k);
    memset(e->head, 0, SEC_HEAD);
    memcpy(e->head, e->k, e->kn < SEC_HEAD ? e->kn : SEC_HEAD);
    e->expiring = 0;
    e->expires = 0;
    e->hashed = 0;
    if (PyTuple_CheckExact(v)) {
        if (PyTuple_GET_SIZE(v) != 2 || !PyLong_CheckExact(PyTuple_GET_ITEM(v, 1))) {
            PyErr_SetString(PyExc_TypeError, "an expiring value is (bytes, int)");
            return -1;
        }
        unsigned long long x = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(v, 1));
        if (x == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
        e->expiring = 1;
        e->expires = x;
        v = PyTuple_GET_ITEM(v, 0);
    }
    if (v == Py_None) {
        e->v = NULL;
        e->vn = 0;
    } else if (PyBytes_CheckExact(v)) {
        e->v = (const unsigned char *)PyBytes_AS_STRING(v);
        e->vn = (size_t)PyBytes_GET_SIZE(v);
    } else {
        PyErr_SetString(PyExc_TypeError, "memtable_section: values bytes, None or expiring");
        return -1;
    }
    if (e->kn > 0xFFFFFFFFu || e->vn > 0xFFFFFFFFu) {
        PyErr_SetString(PyExc_ValueError, "a key or value too long for msgpack");
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
    if (want_hashes && e->kn > XXH3_NATIVE_MAX) {
        if (xxh3_64_bytes(k, &e->hash) < 0)
            return -1;
        e->hashed = 1;
    }
    return 0;
}

/* Under the GIL: each block's stored form -- compress(payload) where that
 * saves at least an eighth (stored[b], type kind), else the payload (stored[b]
 * NULL, type 0) -- and the section's size.  0, or -1 with an exception. */
static int
sec_compress(SecBlocks *bl, PyObject *compress, PyObject **stored, int kind, size_t *total)
{
    *total = 0;
    for (size_t b = 0; b < bl->blocks; b++) {
        size_t len = bl->len[b];
        stored[b] = NULL;
        bl->types[b] = 0;
        if (compress != Py_None) {
            PyObject *payload = PyBytes_FromStringAndSize((const char *)bl->buf + bl->off[b],
                                                          (Py_ssize_t)len);
            if (payload == NULL)
                return -1;
            PyObject *c = PyObject_CallOneArg(compress, payload);
            Py_DECREF(payload);
            if (c == NULL)
                return -1;
            if (!PyBytes_CheckExact(c)) {
                Py_DECREF(c);
                PyErr_SetString(PyExc_TypeError, "memtable_section: compress returned no bytes");
                return -1;
            }
            if ((size_t)PyBytes_GET_SIZE(c) <= len - len / 8) {
                stored[b] = c;
                bl->types[b] = (unsigned char)kind;
                len = (size_t)PyBytes_GET_SIZE(c);
            } else {
                Py_DECREF(c);
            }
        }
        bl->slen[b] = len;
        *total += len + 5;  /* DATA_TRAILER_V2: type byte, crc32 */
    }
    return 0;
}

PyObject *
speedups_memtable_section(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* memtable_section(data, tags, block_size, kind, compress, want_hashes) ->
     * lsmdb.sstable_writer.memtable_section: (section, index_keys,
     * index_offsets, index_sizes, hashes, tombstones, expiring,
     * uncompressed_bytes, min_key). */
    if (nargs != 6 || !PyDict_CheckExact(args[0]) || !PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "memtable_section(data: dict, tags: dict, block_size, "
                                         "kind, compress, want_hashes)");
        return NULL;
    }
    PyObject *data = args[0], *tags = args[1], *compress = args[4];
    long long block_size = PyLong_AsLongLong(args[2]);
    long kind = PyLong_AsLong(args[3]);
    int want_hashes = PyObject_IsTrue(args[5]);
    if ((block_size == -1 || kind == -1) && PyErr_Occurred())
        return NULL;
    if (want_hashes < 0)
        return NULL;
    if (block_size < 1 || kind < 0 || kind > 255 || (compress != Py_None && !PyCallable_Check(compress))) {
        PyErr_SetString(PyExc_ValueError, "memtable_section: bad block_size, kind or compress");
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
    size_t n = (size_t)sn;
    SecEntry *entries = PyMem_RawMalloc(n * sizeof(SecEntry));
    SecEntry **order = PyMem_RawMalloc(n * sizeof(SecEntry *));
    SecBlocks bl = {NULL, NULL, NULL, NULL, NULL, NULL, 0};
    PyObject **stored = NULL;
    unsigned char *raw = NULL;
    PyObject *section = NULL, *ikeys = NULL, *ioffs = NULL, *isizes = NULL, *hashes = NULL;
    PyObject *result = NULL;
    if (entries == NULL || order == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* The two dicts were filled together, so they are walked in step; where
     * their orders differ, the tag is looked up. */
    Py_ssize_t pos = 0, tpos = 0;
    PyObject *k, *v, *tk, *tv;
    int lockstep = 1;
    size_t i = 0, tombstones = 0, expiring = 0;
    while (PyDict_Next(data, &pos, &k, &v)) {
        PyObject *t = NULL;
        if (i >= n) {
            PyErr_SetString(PyExc_RuntimeError, "memtable_section: the memtable changed");
            goto done;
        }
        if (lockstep && PyDict_Next(tags, &tpos, &tk, &tv) && tk == k)
            t = tv;
        else {
            lockstep = 0;
            t = PyDict_GetItemWithError(tags, k);
            if (t == NULL) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_KeyError, "memtable_section: a key without a tag");
                goto done;
            }
        }
        if (sec_entry(&entries[i], k, v, t, want_hashes) < 0)
            goto done;
        tombstones += entries[i].v == NULL;
        expiring += (size_t)entries[i].expiring;
        order[i] = &entries[i];
        i++;
    }
    if (i != n) {
        PyErr_SetString(PyExc_RuntimeError, "memtable_section: the memtable changed");
        goto done;
    }
    const Lz4Api *lz4 = kind == COMPRESSION_LZ4 && compress != Py_None ? lz4_compressor() : NULL;
    int direct = lz4 != NULL;
    size_t total = 0, uncompressed = 0;
    int built;
    Py_BEGIN_ALLOW_THREADS
    built = sec_build(order, n, block_size, want_hashes, &bl);
    if (built == 0)
        built = sec_alloc_stored(&bl);
    if (built == 0 && direct)
        built = sec_pack_lz4(&bl, lz4, &raw, &total);
    Py_END_ALLOW_THREADS
    if (built < 0) {
        PyErr_NoMemory();
        goto done;
    }
    if (!direct) {
        stored = PyMem_Calloc(bl.blocks, sizeof(PyObject *));
        if (stored == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        if (sec_compress(&bl, compress, stored, (int)kind, &total) < 0)
            goto done;
    }
    section = PyBytes_FromStringAndSize(direct ? (const char *)raw : NULL, (Py_ssize_t)total);
    ikeys = PyList_New((Py_ssize_t)bl.blocks);
    ioffs = PyList_New((Py_ssize_t)bl.blocks);
    isizes = PyList_New((Py_ssize_t)bl.blocks);
    if (section == NULL || ikeys == NULL || ioffs == NULL || isizes == NULL)
        goto done;
    if (!direct) {
        Py_BEGIN_ALLOW_THREADS
        sec_pack(&bl, stored, (unsigned char *)PyBytes_AS_STRING(section));
        Py_END_ALLOW_THREADS
    }
    size_t offset = 0;
    for (size_t b = 0; b < bl.blocks; b++) {
        size_t len = bl.slen[b];
        PyObject *last = order[bl.end[b] - 1]->key, *o = PyLong_FromSize_t(offset);
        PyObject *s = PyLong_FromSize_t(len);
        if (o == NULL || s == NULL) {
            Py_XDECREF(o);
            Py_XDECREF(s);
            goto done;
        }
        Py_INCREF(last);
        PyList_SET_ITEM(ikeys, (Py_ssize_t)b, last);
        PyList_SET_ITEM(ioffs, (Py_ssize_t)b, o);
        PyList_SET_ITEM(isizes, (Py_ssize_t)b, s);
        offset += len + 5;
        uncompressed += bl.len[b];
    }
    if (want_hashes) {
        hashes = PyList_New((Py_ssize_t)n);
        if (hashes == NULL)
            goto done;
        for (size_t j = 0; j < n; j++) {
            PyObject *h = PyLong_FromUnsignedLongLong(order[j]->hash);
            if (h == NULL)
                goto done;
            PyList_SET_ITEM(hashes, (Py_ssize_t)j, h);
        }
    } else {
        hashes = Py_NewRef(Py_None);
    }
    result = Py_BuildValue("(OOOOOnnnO)", section, ikeys, ioffs, isizes, hashes,
                           (Py_ssize_t)tombstones, (Py_ssize_t)expiring, (Py_ssize_t)uncompressed,
                           order[0]->key);
done:
    if (stored != NULL)
        for (size_t b = 0; b < bl.blocks; b++)
            Py_XDECREF(stored[b]);
    PyMem_Free(stored);
    PyMem_RawFree(raw);
    Py_XDECREF(section);
    Py_XDECREF(ikeys);
    Py_XDECREF(ioffs);
    Py_XDECREF(isizes);
    Py_XDECREF(hashes);
    sec_blocks_free(&bl);
    PyMem_RawFree(entries);
    PyMem_RawFree(order);
    return result;
}
