/* block.c: a data block's keys walked in place, without decoding the block
 * -- whether it may hold a key (block_may_hold, a false positive known
 * without decoding), a key's value in it (block_find) -- and the block
 * cache's form of a block with a lookup in it (block_entry, entry_find,
 * entry_lists).  Python twins: lsmdb/block.py's decode_data_block and the
 * fallbacks of lsmdb/sstable_reader.py (block_may_hold, _find_in_entry,
 * _decode_entry). */

#include "block.h"
#include "keys.h"

/* ---- block_may_hold: is a key among a data block's keys? ----------------- */

/* Big-endian reads for the msgpack headers. */
static inline uint32_t
be16(const unsigned char *p)
{
    return ((uint32_t)p[0] << 8) | p[1];
}

static inline uint32_t
be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* msgpack array header at *pp (fixarray, array 16, array 32): its count, *pp
 * moved past it; -1 when it is not one or runs past end. */
static int64_t
mp_read_array(const unsigned char **pp, const unsigned char *end)
{
    const unsigned char *p = *pp;
    if (p >= end)
        return -1;
    if ((*p & 0xF0) == 0x90) {
        *pp = p + 1;
        return *p & 0x0F;
    }
    if (*p == 0xDC && end - p >= 3) {
        *pp = p + 3;
        return be16(p + 1);
    }
    if (*p == 0xDD && end - p >= 5) {
        *pp = p + 5;
        return be32(p + 1);
    }
    return -1;
}

/* msgpack bin header at *pp (bin 8/16/32): its length, *pp moved past it, the
 * bytes within end; -1 otherwise. */
static int64_t
mp_read_bin(const unsigned char **pp, const unsigned char *end)
{
    const unsigned char *p = *pp;
    size_t len;
    if (end - p >= 2 && *p == 0xC4) {
        len = p[1];
        p += 2;
    } else if (end - p >= 3 && *p == 0xC5) {
        len = be16(p + 1);
        p += 3;
    } else if (end - p >= 5 && *p == 0xC6) {
        len = be32(p + 1);
        p += 5;
    } else {
        return -1;
    }
    if ((size_t)(end - p) < len)
        return -1;
    *pp = p;
    return (int64_t)len;
}

/* 0 when the data block payload p[0:n] certainly does not hold key, else 1.
 * The payload is msgpack [[key, ...], [value, ...]] with the keys as bins in
 * strictly increasing order (docs/FORMAT.md): the keys are walked in place
 * until one is >= key.  Anything else than that shape answers 1, so the
 * caller decodes the block and reports what is wrong with it. */
int
block_may_hold(const unsigned char *p, size_t n, const unsigned char *key, size_t klen)
{
    const unsigned char *end = p + n;
    if (n < 2 || p[0] != 0x92)
        return 1;
    p++;
    int64_t count = mp_read_array(&p, end);
    if (count < 0)
        return 1;
    for (int64_t i = 0; i < count; i++) {
        int64_t len = mp_read_bin(&p, end);
        if (len < 0)
            return 1;
        int c = mem_order((const char *)p, (Py_ssize_t)len, (const char *)key, (Py_ssize_t)klen);
        if (c >= 0)
            return c == 0;  /* found it, or passed where it would be */
        p += len;
    }
    return 0;
}

/* Key's entry in a data block payload p[0:n] ([[key, ...], [value, ...]], as
 * the writer packs it), without decoding it: 1, *value and *vlen its bytes;
 * 2, a tombstone; 0, not in the block; -1, a payload of any other shape
 * (non-bin keys, values neither bin nor nil, arrays of unequal length,
 * bytes left over), which the Python decoder then reads and refuses with a
 * CorruptionError.  Walks the whole payload, so it refuses what
 * decode_data_block would whichever key is asked. */
int
block_find(const unsigned char *p, size_t n, const unsigned char *key, size_t klen,
           const unsigned char **value, size_t *vlen)
{
    const unsigned char *end = p + n;
    if (n < 1 || *p != 0x92)
        return -1;
    p++;
    int64_t count = mp_read_array(&p, end);
    if (count < 0)
        return -1;
    int64_t at = -1;
    for (int64_t i = 0; i < count; i++) {
        int64_t len = mp_read_bin(&p, end);
        if (len < 0)
            return -1;
        if (at < 0 && (size_t)len == klen && memcmp(p, key, klen) == 0)
            at = i;
        p += len;
    }
    if (mp_read_array(&p, end) != count)
        return -1;
    int found = 0;
    for (int64_t i = 0; i < count; i++) {
        if (p < end && *p == 0xC0) {
            if (i == at)
                found = 2;
            p++;
            continue;
        }
        int64_t len = mp_read_bin(&p, end);
        if (len < 0)
            return -1;
        if (i == at) {
            found = 1;
            *value = p;
            *vlen = (size_t)len;
        }
        p += len;
    }
    return p == end ? found : -1;
}

/* ---- the block cache's form of a data block --------------------------- */

/* A cached block: the payload as stored, then the offsets of its entries,
 * so that a cache hit bisects the keys instead of walking up to the key and
 * then the values before its own (a walk of up to a few dozen dependent
 * loads over a cold 4 KiB):
 *
 *   payload[P] | key_at[n] u32 | value_at[n] u32 | n u32 | P u32  (little-endian:
 *   rd32 reads them, put_le32 writes them)
 *
 * key_at[j] is the offset in the payload of entry j's key's bin header,
 * value_at[j] of its value's header (bin or nil).  Built by block_entry from
 * a payload block_find reads whole, so the keys are bins in the order the
 * payload has them. */

/* Entry j's key in a cached block (bounds-checked): its length and *kp; -1
 * for an offset or header that does not hold. */
static inline int64_t
entry_key(const unsigned char *e, uint64_t plen, uint64_t j, const unsigned char **kp)
{
    uint64_t at = rd32(e + plen + 4 * j);
    if (at >= plen)
        return -1;
    *kp = e + at;
    return mp_read_bin(kp, e + plen);
}

/* Entry j's value in a cached block (bounds-checked): 1, *value and *vlen;
 * 2, a tombstone; -1, an offset or header that does not hold. */
static int
entry_value(const unsigned char *e, uint64_t count, uint64_t plen, uint64_t j,
            const unsigned char **value, size_t *vlen)
{
    uint64_t at = rd32(e + plen + 4 * count + 4 * j);
    if (at >= plen)
        return -1;
    const unsigned char *q = e + at;
    if (*q == 0xC0)
        return 2;
    int64_t len = mp_read_bin(&q, e + plen);
    if (len < 0)
        return -1;
    *value = q;
    *vlen = (size_t)len;
    return 1;
}

/* The cached block of payload p[0:n]: a new bytes object, or NULL with
 * ValueError set for a payload block_find would refuse (any other shape than
 * the writer's), or another exception. */
PyObject *
block_entry(const unsigned char *p, size_t n)
{
    const unsigned char *q = p, *end = p + n;
    if (n < 1 || n > UINT32_MAX / 4 || *q != 0x92)
        goto refuse;
    q++;
    int64_t count = mp_read_array(&q, end);
    if (count < 0 || (uint64_t)count > n / 3)  /* a key takes 2 bytes at least, a value 1 */
        goto refuse;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n + 8 * (size_t)count + ENTRY_TAIL));
    if (out == NULL)
        return NULL;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    memcpy(o, p, n);
    unsigned char *keys_at = o + n, *values_at = keys_at + 4 * count;
    for (int64_t i = 0; i < count; i++) {
        put_le32(keys_at + 4 * i, (uint32_t)(q - p));
        int64_t len = mp_read_bin(&q, end);
        if (len < 0)
            goto refuse_out;
        q += len;
    }
    if (mp_read_array(&q, end) != count)
        goto refuse_out;
    for (int64_t i = 0; i < count; i++) {
        put_le32(values_at + 4 * i, (uint32_t)(q - p));
        if (q < end && *q == 0xC0) {
            q++;
            continue;
        }
        int64_t len = mp_read_bin(&q, end);
        if (len < 0)
            goto refuse_out;
        q += len;
    }
    if (q != end)
        goto refuse_out;
    put_le32(values_at + 4 * count, (uint32_t)count);
    put_le32(values_at + 4 * count + 4, (uint32_t)n);
    return out;
refuse_out:
    Py_DECREF(out);
refuse:
    PyErr_SetString(PyExc_ValueError, "not a data block payload block_find reads");
    return NULL;
}

/* block_find for a cached block e[0:n] (block_entry's layout): the key's
 * bin headers bisected through key_at, its value read at value_at.  Every
 * offset and header is checked against the payload's bounds: -1 for an
 * entry that does not hold together. */
int
entry_find(const unsigned char *e, size_t n, const unsigned char *key, size_t klen,
           const unsigned char **value, size_t *vlen)
{
    uint64_t count, plen;
    if (entry_shape(e, n, &count, &plen) < 0)
        return -1;
    const unsigned char *q;
    uint64_t lo = 0, hi = count;
    while (lo < hi) {
        uint64_t mid = (lo + hi) / 2;
        int64_t len = entry_key(e, plen, mid, &q);
        if (len < 0)
            return -1;
        if (mem_order((const char *)q, (Py_ssize_t)len, (const char *)key, (Py_ssize_t)klen) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == count)
        return 0;
    int64_t len = entry_key(e, plen, lo, &q);
    if (len < 0)
        return -1;
    if ((size_t)len != klen || memcmp(q, key, klen) != 0)
        return 0;
    return entry_value(e, count, plen, lo, value, vlen);
}

/* ---- their Python faces -------------------------------------------------- */

PyObject *
speedups_entry_lists(PyObject *Py_UNUSED(module), PyObject *entry)
{
    /* entry_lists(entry) -> (keys, values): a cached block (block_entry)
     * decoded, as lsmdb.block.decode_data_block decodes its payload;
     * ValueError for an entry that does not hold together. */
    if (!PyBytes_Check(entry)) {
        PyErr_SetString(PyExc_TypeError, "entry_lists(entry: bytes)");
        return NULL;
    }
    const unsigned char *e = (const unsigned char *)PyBytes_AS_STRING(entry);
    uint64_t count, plen;
    if (entry_shape(e, (size_t)PyBytes_GET_SIZE(entry), &count, &plen) < 0)
        goto refuse;
    PyObject *keys = PyList_New((Py_ssize_t)count), *values = PyList_New((Py_ssize_t)count);
    if (keys == NULL || values == NULL)
        goto fail;
    for (uint64_t j = 0; j < count; j++) {
        const unsigned char *q = NULL, *vp = NULL;
        size_t vlen = 0;
        int64_t len = entry_key(e, plen, j, &q);
        int v = len < 0 ? -1 : entry_value(e, count, plen, j, &vp, &vlen);
        if (v < 0) {
            Py_DECREF(keys);
            Py_DECREF(values);
            goto refuse;
        }
        PyObject *k = PyBytes_FromStringAndSize((const char *)q, (Py_ssize_t)len);
        PyObject *val = found_value(v, vp, vlen);
        if (k == NULL || val == NULL) {
            Py_XDECREF(k);
            Py_XDECREF(val);
            goto fail;
        }
        PyList_SET_ITEM(keys, (Py_ssize_t)j, k);
        PyList_SET_ITEM(values, (Py_ssize_t)j, val);
    }
    return Py_BuildValue("(NN)", keys, values);
fail:
    Py_XDECREF(keys);
    Py_XDECREF(values);
    return NULL;
refuse:
    PyErr_SetString(PyExc_ValueError, "not a cached block entry_lists reads");
    return NULL;
}

PyObject *
speedups_block_entry(PyObject *Py_UNUSED(module), PyObject *payload)
{
    /* block_entry(payload) -> the cached block: the payload, then its entries'
     * offsets; ValueError for a payload block_find cannot read. */
    if (!PyBytes_Check(payload)) {
        PyErr_SetString(PyExc_TypeError, "block_entry(payload: bytes)");
        return NULL;
    }
    return block_entry((const unsigned char *)PyBytes_AS_STRING(payload),
                       (size_t)PyBytes_GET_SIZE(payload));
}

/* The Python face of block_find and entry_find: (bytes, key, missing) ->
 * the value, None for a tombstone, or missing; ValueError with `refused`
 * for what find cannot read. */
static PyObject *
find_call(int (*find)(const unsigned char *, size_t, const unsigned char *, size_t,
                      const unsigned char **, size_t *),
          const char *usage, const char *refused, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    const unsigned char *vp = NULL;
    size_t vlen = 0;
    int r = find((const unsigned char *)PyBytes_AS_STRING(args[0]),
                 (size_t)PyBytes_GET_SIZE(args[0]),
                 (const unsigned char *)PyBytes_AS_STRING(args[1]),
                 (size_t)PyBytes_GET_SIZE(args[1]), &vp, &vlen);
    if (r < 0) {
        PyErr_SetString(PyExc_ValueError, refused);
        return NULL;
    }
    if (r == 0)
        return Py_NewRef(args[2]);
    if (r == 2)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)vp, (Py_ssize_t)vlen);
}

PyObject *
speedups_entry_find(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* entry_find(entry, key, missing) -> key's value in a cached block
     * (block_entry), None for a tombstone, or missing; ValueError for an
     * entry that does not hold together. */
    return find_call(entry_find, "entry_find(entry: bytes, key: bytes, missing)",
                     "not a cached block entry_find reads", args, nargs);
}

PyObject *
speedups_block_find(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* block_find(payload, key, missing) -> the value, None for a tombstone,
     * missing when the block does not hold key; ValueError for a payload
     * block_find cannot read (tests). */
    return find_call(block_find, "block_find(payload: bytes, key: bytes, missing)",
                     "not a data block payload block_find reads", args, nargs);
}

PyObject *
speedups_block_may_hold(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* block_may_hold(raw, key) -> False when the data block raw (payload
     * followed by its 4-byte trailer) certainly does not hold key. */
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "block_may_hold(raw: bytes, key: bytes)");
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]) - 4;
    if (n < 0)
        Py_RETURN_TRUE;
    return PyBool_FromLong(block_may_hold((const unsigned char *)PyBytes_AS_STRING(args[0]),
                                          (size_t)n,
                                          (const unsigned char *)PyBytes_AS_STRING(args[1]),
                                          (size_t)PyBytes_GET_SIZE(args[1])));
}
