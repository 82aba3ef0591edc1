/* block.c: the data block rule (lsmdb/block.py's docstring states it) applied
 * to a payload's bytes in one walk, which also finds where each entry's key
 * and value begin; a key's value found through those offsets; and the block
 * cache's form of a block -- the payload followed by its offsets -- with a
 * lookup in it; and data_payload, such a payload written.  Python twins:
 * lsmdb/block.py's decode_data_block, cache_entry, entry_find, entry_lists
 * and encode_data_payload; the tests feed both the same payloads and entries
 * and compare what they accept and return.
 *
 * The payload is msgpack [[key, ...], [value|nil, ...], [tag, ...],
 * [expiry, ...]] (format 2; format 1 has the first two lists alone) in the
 * shortest encoding, as msgpack.packb writes it: the outer fixarray of 4 (or
 * 2), each array header the shortest for its count (fixarray below 16, array
 * 16 below 65536, array 32), each bin header the shortest for its length (bin
 * 8 below 256, bin 16 below 65536, bin 32), each unsigned integer the
 * shortest (positive fixint below 128, uint 8, 16, 32, 64).  A tag is seq <<
 * 8 | kind: kind 0 exactly where the value is nil, 1 a value, 2 an expiring
 * value (format 3 only).  The expiries array is empty, or (format 3, a block
 * with an expiring value) holds one uint per entry, nonzero exactly where
 * the kind is 2.  A checksum-valid payload of any other shape is refused,
 * and the Python side then raises CorruptionError naming the file and the
 * block's offset. */

#include "block.h"
#include "keys.h"
#include "mpack.h"

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

/* The shortest msgpack array header at *pp: its count, *pp moved past it;
 * -1 for any other byte, a longer header than the count needs, or one that
 * runs past end. */
static int64_t
mp_array(const unsigned char **pp, const unsigned char *end)
{
    const unsigned char *p = *pp;
    if (p >= end)
        return -1;
    if ((*p & 0xF0) == 0x90) {
        *pp = p + 1;
        return *p & 0x0F;
    }
    if (*p == 0xDC && end - p >= 3 && be16(p + 1) >= 16) {
        *pp = p + 3;
        return be16(p + 1);
    }
    if (*p == 0xDD && end - p >= 5 && be32(p + 1) >= 65536) {
        *pp = p + 5;
        return be32(p + 1);
    }
    return -1;
}

/* The shortest msgpack bin header at *pp: its length, *pp moved past it, the
 * bytes within end; -1 otherwise.  A bin 8, what keys and most values are,
 * is read inline: the walk of a block read from disk is a false positive's
 * whole cost beside its read. */
static int64_t mp_bin_long(const unsigned char **pp, const unsigned char *end);

static inline int64_t
mp_bin(const unsigned char **pp, const unsigned char *end)
{
    const unsigned char *p = *pp;
    if (end - p >= 2 && *p == 0xC4) {
        size_t len = p[1];
        if ((size_t)(end - p - 2) < len)
            return -1;
        *pp = p + 2;
        return (int64_t)len;
    }
    return mp_bin_long(pp, end);
}

static int64_t
mp_bin_long(const unsigned char **pp, const unsigned char *end)
{
    const unsigned char *p = *pp;
    size_t len;
    if (end - p >= 2 && *p == 0xC4) {
        len = p[1];
        p += 2;
    } else if (end - p >= 3 && *p == 0xC5 && be16(p + 1) >= 256) {
        len = be16(p + 1);
        p += 3;
    } else if (end - p >= 5 && *p == 0xC6 && be32(p + 1) >= 65536) {
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

/* The shortest msgpack unsigned integer at *pp: 0 and *v, *pp moved past
 * it; -1 for any other byte, a longer encoding than the value needs, or one
 * that runs past end. */
static int
mp_uint(const unsigned char **pp, const unsigned char *end, uint64_t *v)
{
    const unsigned char *p = *pp;
    if (p >= end)
        return -1;
    if (*p < 0x80) {
        *v = *p;
        *pp = p + 1;
        return 0;
    }
    size_t w = *p == 0xCC ? 1 : *p == 0xCD ? 2 : *p == 0xCE ? 4 : *p == 0xCF ? 8 : 0;
    if (w == 0 || (size_t)(end - p - 1) < w)
        return -1;
    uint64_t x = 0;
    for (size_t j = 1; j <= w; j++)
        x = (x << 8) | p[j];
    uint64_t floor = w == 1 ? 0x80 : w == 2 ? 0x100 : w == 4 ? 0x10000 : 0x100000000ULL;
    if (x < floor)
        return -1;  /* a shorter encoding holds it */
    *v = x;
    *pp = p + 1 + w;
    return 0;
}

/* A bin whose header is at `at` in a payload of plen bytes, bounds-checked:
 * its length and *kp, or -1. */
static inline int64_t
bin_at(const unsigned char *payload, uint64_t plen, uint64_t at, const unsigned char **kp)
{
    if (at >= plen)
        return -1;
    *kp = payload + at;
    return mp_bin(kp, payload + plen);
}

/* ---- the rule ------------------------------------------------------------ */

/* The entry count of the data block payload p[0:n]: its keys' array header
 * read (at least 1, at most n / 3: a key takes 2 bytes at least, a value 1);
 * -1 for a payload that does not begin as the rule says, or of 2^32 bytes
 * or more (its offsets would not fit the cached form's u32). */
int64_t
block_entry_count(const unsigned char *p, size_t n, int version)
{
    const unsigned char *q = p, *end = p + n;
    if (n < 1 || n > UINT32_MAX || *q != (version >= 2 ? 0x94 : 0x92))
        return -1;
    q++;
    int64_t count = mp_array(&q, end);
    if (count < 1 || (uint64_t)count > n / 3)
        return -1;
    return count;
}

/* Whether the payload p[0:n] of `count` entries (block_entry_count) meets the
 * rule within `bounds`: 0, its entries' offsets written to offs (key_at then
 * value_at, u32 little-endian, 2 * count of them; offs has ENTRY_SLOT bytes
 * per entry); 1, the same and the block's expiries after them (u64
 * little-endian, count of them); -1 if not. */
int
block_parse(const unsigned char *p, size_t n, const BlockBounds *bounds, unsigned char *offs,
            uint64_t count)
{
    const unsigned char *q = p + 1, *end = p + n, *prev = NULL;
    int64_t prev_len = 0;
    if ((uint64_t)mp_array(&q, end) != count)
        return -1;
    for (uint64_t i = 0; i < count; i++) {
        put_le32(offs + ENTRY_OFFSET * i, (uint32_t)(q - p));
        int64_t len = mp_bin(&q, end);
        if (len < 0)
            return -1;
        if (prev != NULL ? mem_order((const char *)prev, prev_len, (const char *)q, len) >= 0
                         : bounds->after != NULL && mem_order((const char *)q, len, bounds->after,
                                                              bounds->after_len) <= 0)
            return -1;  /* keys out of order, or at or below the previous block's */
        prev = q;
        prev_len = len;
        q += len;
    }
    if (bounds->last != NULL
        && mem_order((const char *)prev, prev_len, bounds->last, bounds->last_len) != 0)
        return -1;  /* the last key is not the index's */
    if ((uint64_t)mp_array(&q, end) != count)
        return -1;
    for (uint64_t i = 0; i < count; i++) {
        put_le32(offs + ENTRY_OFFSET * (count + i), (uint32_t)(q - p));
        if (q < end && *q == 0xC0) {
            q++;
            continue;
        }
        int64_t len = mp_bin(&q, end);
        if (len < 0)
            return -1;
        q += len;
    }
    if (bounds->version < 2)
        return q == end ? 0 : -1;
    /* the tags: one per entry, its kind agreeing with its value (kind 2, an
     * expiring value, in format 3 only) */
    if ((uint64_t)mp_array(&q, end) != count)
        return -1;
    unsigned top = bounds->version >= 3 ? 2 : 1;
    const unsigned char *tags = q;
    int expiring = 0;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t tag;
        if (mp_uint(&q, end, &tag) < 0)
            return -1;
        unsigned kind = (unsigned)(tag & 0xFF);
        int nil = p[rd32(offs + ENTRY_OFFSET * (count + i))] == 0xC0;
        if (kind > top || (kind == 0) != nil)
            return -1;
        expiring |= kind == 2;
    }
    if (!expiring) {  /* the expiries: none */
        if (q >= end || *q++ != 0x90)
            return -1;
        return q == end ? 0 : -1;
    }
    /* one expiry per entry, nonzero exactly where the kind is 2 */
    if ((uint64_t)mp_array(&q, end) != count)
        return -1;
    unsigned char *exps = offs + 2 * ENTRY_OFFSET * count;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t tag, expires;
        if (mp_uint(&tags, end, &tag) < 0 || mp_uint(&q, end, &expires) < 0)
            return -1;
        if (((tag & 0xFF) == 2) != (expires != 0) || expires > MAX_EXPIRES)
            return -1;
        put_le64(exps + ENTRY_EXPIRY * i, expires);
    }
    return q == end ? 1 : -1;
}

/* ---- a key among a block's keys alone ---------------------------------- */

/* Whether key[0:klen] is among the keys of the data block whose payload of
 * `total` bytes begins with p[0:n] (n < total: as far as a partial
 * decompression went), the keys array read under the rule's parts that
 * concern it alone: the outer array's header, the keys' count (at least 1,
 * at most total / 3), each key a bin in its shortest header, strictly
 * increasing, the first above bounds->after, the last equal to bounds->last.
 * 1: there; 0: not there (either way *keys_end, unless NULL, where the keys
 * array ends); -1: the rule refuses the keys; -2: they run past p[0:n] (or
 * break the rule there) while n < total: read further and ask again.  A key not among keys that hold this way is absent from the block,
 * whatever its other arrays hold (docs/FORMAT.md §4.2). */
int
block_keys_hold(const unsigned char *p, size_t n, size_t total, const BlockBounds *bounds,
                const unsigned char *key, size_t klen, size_t *keys_end)
{
    size_t index, count;
    return block_keys_find(p, n, total, bounds, key, klen, keys_end, &index, &count);
}

/* block_keys_hold, and where it answers 0 or 1 also *count, the keys, and
 * where it answers 1 *index, the key's place among them. */
int
block_keys_find(const unsigned char *p, size_t n, size_t total, const BlockBounds *bounds,
                const unsigned char *key, size_t klen, size_t *keys_end, size_t *index,
                size_t *count_out)
{
    const unsigned char *q = p, *end = p + n, *prev = NULL;
    int64_t prev_len = 0;
    int found = 0, more = n < total ? -2 : -1;
    if (total > UINT32_MAX || n > total)
        return -1;
    if (n < 1)
        return more;
    if (*q++ != (bounds->version >= 2 ? 0x94 : 0x92))
        return -1;
    int64_t count = mp_array(&q, end);
    if (count < 0)
        return more;
    if (count < 1 || (uint64_t)count > total / 3)
        return -1;
    for (int64_t i = 0; i < count; i++) {
        int64_t len = mp_bin(&q, end);
        if (len < 0)
            return more;
        if (prev != NULL ? mem_order((const char *)prev, prev_len, (const char *)q, len) >= 0
                         : bounds->after != NULL && mem_order((const char *)q, len, bounds->after,
                                                              bounds->after_len) <= 0)
            return -1;  /* keys out of order, or at or below the previous block's */
        if (!found && (size_t)len == klen && memcmp(q, key, klen) == 0) {
            found = 1;
            *index = (size_t)i;
        }
        prev = q;
        prev_len = len;
        q += len;
    }
    if (bounds->last != NULL
        && mem_order((const char *)prev, prev_len, bounds->last, bounds->last_len) != 0)
        return -1;  /* the last key is not the index's */
    if (keys_end != NULL)
        *keys_end = (size_t)(q - p);
    *count_out = (size_t)count;
    return found;
}

/* Value `index` of a format-2 data block whose payload of `total` bytes
 * begins with p[0:n], its keys array (of `count` keys, read by
 * block_keys_find) ending at keys_end: the values array's header (the
 * shortest for count entries) and each value up to that one read under the
 * rule (a bin in its shortest header, or nil).  1: a value, *value and *vlen
 * its bytes within p; 2: nil, a tombstone; -1: the rule refuses them; -2:
 * they run past p[0:n] while n < total: read further and ask again. */
int
block_value_at(const unsigned char *p, size_t n, size_t total, size_t keys_end, size_t count,
               size_t index, const unsigned char **value, size_t *vlen)
{
    const unsigned char *q = p + keys_end, *end = p + n;
    int more = n < total ? -2 : -1;
    if (keys_end > n || index >= count)
        return -1;
    int64_t c = mp_array(&q, end);
    if (c < 0)
        return more;
    if ((uint64_t)c != count)
        return -1;
    for (size_t i = 0;; i++) {
        if (q >= end)
            return more;
        if (*q == 0xC0) {
            q++;
            if (i == index)
                return 2;
            continue;
        }
        int64_t len = mp_bin(&q, end);
        if (len < 0)
            return more;
        if (i == index) {
            *value = q;
            *vlen = (size_t)len;
            return 1;
        }
        q += len;
    }
}

/* ---- a key in a parsed block --------------------------------------------- */

/* key's entry in b, bisecting the keys through their offsets (each offset
 * and header bounds-checked, so that a cached block that does not hold
 * together is refused, not read past): 1, *value and *vlen its bytes,
 * *expires when it expires (0: never); 2, a tombstone; 0, not in the block;
 * -1, an offset or header that does not hold. */
int
parsed_find(const ParsedBlock *b, const unsigned char *key, size_t klen,
            const unsigned char **value, size_t *vlen, uint64_t *expires)
{
    const unsigned char *q;
    uint64_t lo = 0, hi = b->count;
    while (lo < hi) {
        uint64_t mid = (lo + hi) / 2;
        int64_t len = bin_at(b->payload, b->plen, rd32(b->offs + ENTRY_OFFSET * mid), &q);
        if (len < 0)
            return -1;
        if (mem_order((const char *)q, (Py_ssize_t)len, (const char *)key, (Py_ssize_t)klen) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == b->count)
        return 0;
    int64_t len = bin_at(b->payload, b->plen, rd32(b->offs + ENTRY_OFFSET * lo), &q);
    if (len < 0)
        return -1;
    if ((size_t)len != klen || memcmp(q, key, klen) != 0)
        return 0;
    uint64_t at = rd32(b->offs + ENTRY_OFFSET * (b->count + lo));
    if (at >= b->plen)
        return -1;
    if (b->payload[at] == 0xC0)
        return 2;
    len = bin_at(b->payload, b->plen, at, &q);
    if (len < 0)
        return -1;
    *value = q;
    *vlen = (size_t)len;
    *expires = b->exps != NULL ? rd64(b->exps + ENTRY_EXPIRY * lo) : 0;
    return 1;
}

/* The sequence number of key's entry in b, a block of format 2 or 3 that
 * holds it (tag >> 8): 0 and *seq; -1 when the key is not there or an
 * offset or header does not hold.  The tags follow the values' array: after
 * the last value, an array header, then one shortest uint per entry, walked
 * up to the entry's. */
int
parsed_seq(const ParsedBlock *b, const unsigned char *key, size_t klen, uint64_t *seq)
{
    const unsigned char *q;
    uint64_t lo = 0, hi = b->count;
    while (lo < hi) {
        uint64_t mid = (lo + hi) / 2;
        int64_t len = bin_at(b->payload, b->plen, rd32(b->offs + ENTRY_OFFSET * mid), &q);
        if (len < 0)
            return -1;
        if (mem_order((const char *)q, (Py_ssize_t)len, (const char *)key, (Py_ssize_t)klen) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == b->count || b->count == 0)
        return -1;
    uint64_t at = rd32(b->offs + ENTRY_OFFSET * (2 * b->count - 1));  /* the last value */
    const unsigned char *end = b->payload + b->plen;
    if (at >= b->plen)
        return -1;
    if (b->payload[at] == 0xC0) {
        q = b->payload + at + 1;
    } else {
        int64_t len = bin_at(b->payload, b->plen, at, &q);
        if (len < 0)
            return -1;
        q += len;
    }
    if ((uint64_t)mp_array(&q, end) != b->count)
        return -1;
    uint64_t tag = 0;
    for (uint64_t j = 0; j <= lo; j++)
        if (mp_uint(&q, end, &tag) < 0)
            return -1;
    *seq = tag >> 8;
    return 0;
}

/* An expiring value found: the tuple (vp[0:vlen] as bytes, expires), as
 * lsmdb.ttl carries one.  A new reference, or NULL with an exception set. */
PyObject *
expiring_value(const unsigned char *vp, size_t vlen, uint64_t expires)
{
    PyObject *v = PyBytes_FromStringAndSize((const char *)vp, (Py_ssize_t)vlen);
    PyObject *e = v != NULL ? PyLong_FromUnsignedLongLong(expires) : NULL;
    PyObject *t = e != NULL ? PyTuple_Pack(2, v, e) : NULL;
    Py_XDECREF(v);
    Py_XDECREF(e);
    return t;
}

/* ---- the pieces of a type-3 block (lsmdb/compression.py) -------------------- */

/* Value `skip` of the piece p[0:n] of a format-2 payload of `count` entries
 * that begins with a value (`header` 0) or with the values array's header
 * (`header` 1: the piece after the keys), and holds `held` values: each
 * value read under the rule (a bin in its shortest header, or nil), the
 * piece holding exactly `held` of them -- ending where they end, or, the
 * last piece (`last`), going on with the tags array's header for `count`
 * entries.  1, a value, *value and *vlen its bytes within p; 2, nil; -1
 * where the rule refuses them or the piece is not what its table says. */
int
block_piece_value(const unsigned char *p, size_t n, int header, int last, size_t count,
                  size_t held, size_t skip, const unsigned char **value, size_t *vlen)
{
    const unsigned char *q = p, *end = p + n, *vp = NULL;
    size_t len = 0;
    int kind = -1;
    if (skip >= held || (header && (uint64_t)mp_array(&q, end) != count))
        return -1;
    for (size_t i = 0; i < held; i++) {
        if (q >= end)
            return -1;
        if (*q == 0xC0) {
            q++;
            if (i == skip)
                kind = 2;
            continue;
        }
        int64_t l = mp_bin(&q, end);
        if (l < 0)
            return -1;
        if (i == skip) {
            vp = q;
            len = (size_t)l;
            kind = 1;
        }
        q += l;
    }
    if (last ? (uint64_t)mp_array(&q, end) != count : q != end)
        return -1;
    *value = vp;
    *vlen = len;
    return kind;
}

/* The format-2 payload p[0:n]'s keys array walked: 0, *count its entries
 * and *q at the values array's header (where the keys array ends); -1
 * where p is not such arrays. */
static int
walk_keys(const unsigned char *p, size_t n, int64_t *count, const unsigned char **q)
{
    const unsigned char *at = p, *end = p + n;
    if (n < 1 || *at++ != 0x94 || (*count = mp_array(&at, end)) < 1)
        return -1;
    for (int64_t i = 0; i < *count; i++) {
        int64_t len = mp_bin(&at, end);
        if (len < 0)
            return -1;
        at += len;
    }
    *q = at;
    return 0;
}

/* Past the value (bin or nil) at *q: 0, or -1 where there is none before end. */
static inline int
skip_value(const unsigned char **q, const unsigned char *end)
{
    if (*q >= end)
        return -1;
    if (**q == 0xC0) {
        (*q)++;
        return 0;
    }
    int64_t len = mp_bin(q, end);
    if (len < 0)
        return -1;
    *q += len;
    return 0;
}

/* Where the pieces of a type-3 block of the format-2 payload p[0:n] begin
 * (lsmdb/compression.py's cut_pieces of lsmdb/block.py's
 * payload_value_starts): begins[0] 0, begins[1] where the keys array ends,
 * then each value that starts `piece_bytes` or more after the last piece
 * began, firsts[k - 1] the entry piece k begins with (firsts[0] 0); at most
 * `cap` pieces.  0 and *pieces; -1 where p is not arrays of keys and values
 * to walk, or more than `cap` pieces. */
int
block_piece_cuts(const unsigned char *p, size_t n, size_t piece_bytes, size_t *begins,
                 size_t *firsts, size_t cap, size_t *pieces)
{
    const unsigned char *q, *end = p + n;
    int64_t count;
    if (cap < 2 || walk_keys(p, n, &count, &q) < 0)
        return -1;
    size_t begin = (size_t)(q - p), k = 2;
    begins[0] = 0;
    begins[1] = begin;
    firsts[0] = 0;
    if (mp_array(&q, end) != count)
        return -1;
    for (int64_t i = 0; i < count; i++) {
        size_t at = (size_t)(q - p);
        if (i > 0 && at - begin >= piece_bytes) {
            if (k >= cap)
                return -1;
            begins[k] = begin = at;
            firsts[k - 1] = (size_t)i;
            k++;
        }
        if (skip_value(&q, end) < 0)
            return -1;
    }
    *pieces = k;
    return 0;
}

/* Whether the pieces of a whole format-2 payload p[0:n] begin where a
 * type-3 block's table says: begins[1] where the keys array ends, and
 * begins[k] (k >= 2) at the header of value firsts[k - 1] (begins[0] is 0;
 * firsts[0] is 0).  0, or -1 where they do not, or the arrays are not
 * there to walk. */
int
block_pieces_check(const unsigned char *p, size_t n, const size_t *begins, const size_t *firsts,
                   size_t pieces)
{
    const unsigned char *q, *end = p + n;
    int64_t count;
    if (pieces < 2 || walk_keys(p, n, &count, &q) < 0)
        return -1;
    if ((size_t)(q - p) != begins[1] || mp_array(&q, end) != count)
        return -1;
    size_t k = 2;
    for (int64_t i = 0; i < count; i++) {
        if (k < pieces && (size_t)i == firsts[k - 1]) {
            if ((size_t)(q - p) != begins[k])
                return -1;
            k++;
        }
        if (skip_value(&q, end) < 0)
            return -1;
    }
    return k == pieces ? 0 : -1;
}

/* ---- the block cache's form of a block -----------------------------------
 *
 *   payload[P] | key_at[n] u32 | value_at[n] u32 | n u32 | P u32   (little-endian)
 *
 * and with expiring values, expires[n] u64 before the tail and
 * EXPIRIES_FLAG set in its n word. */

/* The cached form of the parsed block b: a new bytes object, or NULL with an
 * exception set. */
PyObject *
parsed_entry(const ParsedBlock *b)
{
    size_t offs = (size_t)b->count * 2 * ENTRY_OFFSET;
    size_t exps = b->exps != NULL ? (size_t)b->count * ENTRY_EXPIRY : 0;
    PyObject *out = PyBytes_FromStringAndSize(NULL,
                                              (Py_ssize_t)(b->plen + offs + exps + ENTRY_TAIL));
    if (out == NULL)
        return NULL;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    memcpy(o, b->payload, b->plen);
    memcpy(o + b->plen, b->offs, offs);
    if (exps)
        memcpy(o + b->plen + offs, b->exps, exps);
    put_le32(o + b->plen + offs + exps, (uint32_t)b->count | (exps ? EXPIRIES_FLAG : 0));
    put_le32(o + b->plen + offs + exps + 4, (uint32_t)b->plen);
    return out;
}

/* b over the cached block e[0:n]: 0, or -1 when its tail and size disagree. */
int
entry_parsed(const unsigned char *e, size_t n, ParsedBlock *b)
{
    if (n < ENTRY_TAIL)
        return -1;
    uint64_t word = rd32(e + n - 8), plen = rd32(e + n - 4);
    uint64_t count = word & ~(uint64_t)EXPIRIES_FLAG;
    uint64_t exps = word & EXPIRIES_FLAG ? ENTRY_EXPIRY * count : 0;
    if (plen + 2 * ENTRY_OFFSET * count + exps + ENTRY_TAIL != n)
        return -1;
    b->payload = e;
    b->plen = (size_t)plen;
    b->offs = e + plen;
    b->exps = exps ? e + plen + 2 * ENTRY_OFFSET * count : NULL;
    b->count = count;
    return 0;
}

/* ---- their Python faces -------------------------------------------------- */

/* bounds from (after, last): bytes or None each.  0, or -1 with TypeError. */
static int
bounds_arg(PyObject *after, PyObject *last, BlockBounds *bounds)
{
    memset(bounds, 0, sizeof *bounds);
    bounds->version = 1;
    if ((after != Py_None && !PyBytes_Check(after)) || (last != Py_None && !PyBytes_Check(last))) {
        PyErr_SetString(PyExc_TypeError, "the bounds are bytes or None");
        return -1;
    }
    if (after != Py_None) {
        bounds->after = PyBytes_AS_STRING(after);
        bounds->after_len = PyBytes_GET_SIZE(after);
    }
    if (last != Py_None) {
        bounds->last = PyBytes_AS_STRING(last);
        bounds->last_len = PyBytes_GET_SIZE(last);
    }
    return 0;
}

/* The (keys, values) lists of parsed block b: a new tuple, or NULL. */
static PyObject *
parsed_lists(const ParsedBlock *b)
{
    PyObject *keys = PyList_New((Py_ssize_t)b->count), *values = PyList_New((Py_ssize_t)b->count);
    if (keys == NULL || values == NULL)
        goto fail;
    for (uint64_t j = 0; j < b->count; j++) {
        const unsigned char *q = NULL, *vp = NULL;
        int64_t len = bin_at(b->payload, b->plen, rd32(b->offs + ENTRY_OFFSET * j), &q);
        uint64_t at = rd32(b->offs + ENTRY_OFFSET * (b->count + j));
        int v = -1;
        size_t vlen = 0;
        if (len >= 0 && at < b->plen) {
            if (b->payload[at] == 0xC0) {
                v = 2;
            } else {
                int64_t vl = bin_at(b->payload, b->plen, at, &vp);
                v = vl < 0 ? -1 : 1;
                vlen = (size_t)vl;
            }
        }
        if (v < 0) {
            PyErr_SetString(PyExc_ValueError, "not a cached block entry_lists reads");
            goto fail;
        }
        PyObject *k = PyBytes_FromStringAndSize((const char *)q, (Py_ssize_t)len);
        uint64_t expires = b->exps != NULL ? rd64(b->exps + ENTRY_EXPIRY * j) : 0;
        PyObject *val = found_value(v, vp, vlen, expires);
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
}

/* The payload args[0] parsed under the rule within the bounds (args[1],
 * args[2]) into *b, its offsets PyMem_Malloc'd into *offs (the caller frees
 * them): 0, or -1 with an exception set (ValueError for a payload the rule
 * refuses). */
static int
parse_args(PyObject *const *args, Py_ssize_t nargs, const char *usage, ParsedBlock *b,
           unsigned char **offs)
{
    BlockBounds bounds;
    *offs = NULL;
    if ((nargs != 3 && nargs != 4) || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    if (bounds_arg(args[1], args[2], &bounds) < 0)
        return -1;
    if (nargs == 4) {
        long v = PyLong_AsLong(args[3]);
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (v < 1 || v > 3) {
            PyErr_SetString(PyExc_ValueError, "format version must be 1, 2 or 3");
            return -1;
        }
        bounds.version = (int)v;
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    size_t n = (size_t)PyBytes_GET_SIZE(args[0]);
    int64_t count = block_entry_count(p, n, bounds.version);
    if (count >= 0) {
        *offs = PyMem_Malloc((size_t)count * ENTRY_SLOT + 1);
        if (*offs == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    int r = count < 0 ? -1 : block_parse(p, n, &bounds, *offs, (uint64_t)count);
    if (r < 0) {
        PyMem_Free(*offs);
        *offs = NULL;
        PyErr_SetString(PyExc_ValueError, "not a data block the rule accepts");
        return -1;
    }
    b->payload = p;
    b->plen = n;
    b->offs = *offs;
    b->exps = r == 1 ? *offs + 2 * ENTRY_OFFSET * (size_t)count : NULL;
    b->count = (uint64_t)count;
    return 0;
}

PyObject *
speedups_block_entry(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* block_entry(payload, after, last, version=1) -> the cached form of a
     * data block of that format the rule accepts within those bounds;
     * ValueError if it refuses it. */
    ParsedBlock b;
    unsigned char *offs;
    if (parse_args(args, nargs, "block_entry(payload: bytes, after, last, version=1)", &b, &offs) < 0)
        return NULL;
    PyObject *out = parsed_entry(&b);
    PyMem_Free(offs);
    return out;
}

PyObject *
speedups_block_lists(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* block_lists(payload, after, last, version=1) -> (keys, values) of a
     * data block of that format the rule accepts within those bounds, as
     * decode_data_block returns them; ValueError if it refuses it. */
    ParsedBlock b;
    unsigned char *offs;
    if (parse_args(args, nargs, "block_lists(payload: bytes, after, last, version=1)", &b, &offs) < 0)
        return NULL;
    PyObject *out = parsed_lists(&b);
    PyMem_Free(offs);
    return out;
}

/* The tags of parsed format-2 block b (the rule accepted it): a new list of
 * ints, or NULL with an exception set.  They follow the values' array: after
 * the last value, an array header, then one shortest uint per entry. */
static PyObject *
parsed_tags(const ParsedBlock *b)
{
    const unsigned char *q, *end = b->payload + b->plen;
    uint64_t at = rd32(b->offs + ENTRY_OFFSET * (2 * b->count - 1));  /* the last value */
    if (b->payload[at] == 0xC0) {
        q = b->payload + at + 1;
    } else {
        int64_t len = bin_at(b->payload, b->plen, at, &q);
        if (len < 0)
            goto bad;
        q += len;
    }
    if ((uint64_t)mp_array(&q, end) != b->count)
        goto bad;
    PyObject *tags = PyList_New((Py_ssize_t)b->count);
    if (tags == NULL)
        return NULL;
    for (uint64_t j = 0; j < b->count; j++) {
        uint64_t tag;
        PyObject *t = mp_uint(&q, end, &tag) < 0 ? NULL : PyLong_FromUnsignedLongLong(tag);
        if (t == NULL) {
            Py_DECREF(tags);
            if (!PyErr_Occurred())
                goto bad;
            return NULL;
        }
        PyList_SET_ITEM(tags, (Py_ssize_t)j, t);
    }
    return tags;
bad:
    PyErr_SetString(PyExc_ValueError, "not a block of format 2 or 3 block_full reads");
    return NULL;
}

PyObject *
speedups_block_full(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* block_full(payload, after, last, version=2) -> (keys, values, tags) of a
     * data block of format 2 or 3 the rule accepts within those bounds, as the
     * reader's decode_full returns them (expiring values as (value, expires));
     * ValueError if it refuses it. */
    ParsedBlock b;
    unsigned char *offs;
    PyObject *two = NULL, *tags = NULL, *out = NULL;
    PyObject *argv[4] = {NULL, NULL, NULL, NULL};
    if (nargs != 3 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "block_full(payload: bytes, after, last, version=2)");
        return NULL;
    }
    PyObject *version = nargs == 4 ? Py_NewRef(args[3]) : PyLong_FromLong(2);
    if (version == NULL)
        return NULL;
    long v = PyLong_AsLong(version);
    if (v != 2 && v != 3) {
        Py_DECREF(version);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "block_full reads formats 2 and 3");
        return NULL;
    }
    argv[0] = args[0];
    argv[1] = args[1];
    argv[2] = args[2];
    argv[3] = version;
    int r = parse_args(argv, 4, "block_full(payload: bytes, after, last, version=2)", &b, &offs);
    Py_DECREF(version);
    if (r < 0)
        return NULL;
    two = parsed_lists(&b);
    if (two != NULL)
        tags = parsed_tags(&b);
    if (tags != NULL)
        out = PyTuple_Pack(3, PyTuple_GET_ITEM(two, 0), PyTuple_GET_ITEM(two, 1), tags);
    Py_XDECREF(two);
    Py_XDECREF(tags);
    PyMem_Free(offs);
    return out;
}

PyObject *
speedups_entry_lists(PyObject *Py_UNUSED(module), PyObject *entry)
{
    /* entry_lists(entry) -> (keys, values) of a cached block; ValueError for
     * an entry that does not hold together. */
    ParsedBlock b;
    if (!PyBytes_Check(entry)) {
        PyErr_SetString(PyExc_TypeError, "entry_lists(entry: bytes)");
        return NULL;
    }
    if (entry_parsed((const unsigned char *)PyBytes_AS_STRING(entry),
                     (size_t)PyBytes_GET_SIZE(entry), &b) < 0) {
        PyErr_SetString(PyExc_ValueError, "not a cached block entry_lists reads");
        return NULL;
    }
    return parsed_lists(&b);
}

PyObject *
speedups_entry_find(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* entry_find(entry, key, missing) -> key's value in a cached block, None
     * for a tombstone, (value, expires) for an expiring value, or missing;
     * ValueError for an entry that does not hold together. */
    ParsedBlock b;
    if (nargs != 3 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "entry_find(entry: bytes, key: bytes, missing)");
        return NULL;
    }
    const unsigned char *vp = NULL;
    size_t vlen = 0;
    uint64_t expires = 0;
    int r = entry_parsed((const unsigned char *)PyBytes_AS_STRING(args[0]),
                         (size_t)PyBytes_GET_SIZE(args[0]), &b);
    if (r == 0)
        r = parsed_find(&b, (const unsigned char *)PyBytes_AS_STRING(args[1]),
                        (size_t)PyBytes_GET_SIZE(args[1]), &vp, &vlen, &expires);
    if (r < 0) {
        PyErr_SetString(PyExc_ValueError, "not a cached block entry_find reads");
        return NULL;
    }
    if (r == 0)
        return Py_NewRef(args[2]);
    return found_value(r, vp, vlen, expires);
}

PyObject *
speedups_block_keys_hold(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* block_keys_hold(prefix, total, key, after, last, version) -> True, False
     * or None: block_keys_hold over the first bytes of a payload of total
     * bytes -- None when its keys run past them (read further); ValueError
     * for keys the rule refuses. */
    BlockBounds bounds;
    if (nargs != 6 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "block_keys_hold(prefix, total, key, after, last, version)");
        return NULL;
    }
    if (bounds_arg(args[3], args[4], &bounds) < 0)
        return NULL;
    Py_ssize_t total = PyLong_AsSsize_t(args[1]);
    long v = PyLong_AsLong(args[5]);
    if ((total == -1 || v == -1) && PyErr_Occurred())
        return NULL;
    if (v < 1 || v > 3 || total < PyBytes_GET_SIZE(args[0])) {
        PyErr_SetString(PyExc_ValueError, "version 1 to 3, total at least the prefix's bytes");
        return NULL;
    }
    bounds.version = (int)v;
    int r = block_keys_hold((const unsigned char *)PyBytes_AS_STRING(args[0]),
                            (size_t)PyBytes_GET_SIZE(args[0]), (size_t)total, &bounds,
                            (const unsigned char *)PyBytes_AS_STRING(args[2]),
                            (size_t)PyBytes_GET_SIZE(args[2]), NULL);
    if (r == -1) {
        PyErr_SetString(PyExc_ValueError, "not a keys array the rule accepts");
        return NULL;
    }
    if (r == -2)
        Py_RETURN_NONE;
    return PyBool_FromLong(r);
}

PyObject *
speedups_block_value_of(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* block_value_of(prefix, total, key, after, last) -> False, None or
     * (value,): over the first bytes of a format-2 payload of total bytes,
     * block_keys_find then block_value_at -- False when key is not among the
     * keys, (value,) (None: a tombstone) when it is, None when what decides
     * runs past the prefix (read further); ValueError for arrays the rule
     * refuses. */
    BlockBounds bounds;
    if (nargs != 5 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "block_value_of(prefix, total, key, after, last)");
        return NULL;
    }
    if (bounds_arg(args[3], args[4], &bounds) < 0)
        return NULL;
    Py_ssize_t total = PyLong_AsSsize_t(args[1]);
    if (total == -1 && PyErr_Occurred())
        return NULL;
    if (total < PyBytes_GET_SIZE(args[0])) {
        PyErr_SetString(PyExc_ValueError, "total at least the prefix's bytes");
        return NULL;
    }
    bounds.version = 2;
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(args[0]), *vp = NULL;
    size_t n = (size_t)PyBytes_GET_SIZE(args[0]), keys_end = 0, index = 0, count = 0, vlen = 0;
    int r = block_keys_find(p, n, (size_t)total, &bounds,
                            (const unsigned char *)PyBytes_AS_STRING(args[2]),
                            (size_t)PyBytes_GET_SIZE(args[2]), &keys_end, &index, &count);
    if (r == 1)
        r = block_value_at(p, n, (size_t)total, keys_end, count, index, &vp, &vlen);
    else if (r == 0)
        Py_RETURN_FALSE;
    if (r == -1) {
        PyErr_SetString(PyExc_ValueError, "not arrays the rule accepts");
        return NULL;
    }
    if (r == -2)
        Py_RETURN_NONE;
    PyObject *v = found_value(r, vp, vlen, 0);
    if (v == NULL)
        return NULL;
    PyObject *out = PyTuple_Pack(1, v);
    Py_DECREF(v);
    return out;
}

/* ---- data_payload: a data block's payload, written -------------------------- */

PyObject *
speedups_data_payload(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* data_payload(keys, values, tags, lo, hi) -> the same bytes as
     * block.encode_data_payload(keys[lo:hi], values[lo:hi], tags[lo:hi]) of
     * format 2: msgpack [keys, values, tags, expiries], values bytes or None
     * (a tombstone) and, where any is an expiring (bytes, expires), each
     * such split into the values and the expiries (0 for the others); else
     * expiries []. */
    if (nargs != 5 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1])
        || !PyList_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "data_payload(keys: list, values: list, tags: list, lo, hi)");
        return NULL;
    }
    PyObject *keys = args[0], *values = args[1], *tags = args[2];
    Py_ssize_t lo = PyLong_AsSsize_t(args[3]), hi = PyLong_AsSsize_t(args[4]);
    if ((lo == -1 || hi == -1) && PyErr_Occurred())
        return NULL;
    if (lo < 0 || hi < lo || hi > PyList_GET_SIZE(keys) || hi > PyList_GET_SIZE(values)
        || hi > PyList_GET_SIZE(tags) || (uint64_t)(hi - lo) > 0xFFFFFFFFu) {
        PyErr_SetString(PyExc_ValueError, "data_payload: lo and hi out of the lists' range");
        return NULL;
    }
    size_t n = (size_t)(hi - lo), total = 1 + 4 * mpw_array_size(n);
    int expiring = 0;
    for (Py_ssize_t i = lo; i < hi; i++) {
        PyObject *k = PyList_GET_ITEM(keys, i), *v = PyList_GET_ITEM(values, i);
        PyObject *t = PyList_GET_ITEM(tags, i);
        if (PyTuple_CheckExact(v)) {
            if (PyTuple_GET_SIZE(v) != 2 || !PyLong_CheckExact(PyTuple_GET_ITEM(v, 1))) {
                PyErr_SetString(PyExc_TypeError, "an expiring value is (bytes, int)");
                return NULL;
            }
            expiring = 1;
            v = PyTuple_GET_ITEM(v, 0);
        }
        if (!PyBytes_CheckExact(k) || (v != Py_None && !PyBytes_CheckExact(v))
            || !PyLong_CheckExact(t)) {
            PyErr_SetString(PyExc_TypeError,
                            "data_payload: keys bytes, values bytes or None, tags int");
            return NULL;
        }
        if ((uint64_t)PyBytes_GET_SIZE(k) > 0xFFFFFFFFu
            || (v != Py_None && (uint64_t)PyBytes_GET_SIZE(v) > 0xFFFFFFFFu)) {
            PyErr_SetString(PyExc_ValueError, "a key or value too long for msgpack");
            return NULL;
        }
        total += mpw_bin_size((size_t)PyBytes_GET_SIZE(k)) + 9
                 + (v == Py_None ? 1 : mpw_bin_size((size_t)PyBytes_GET_SIZE(v)));
    }
    if (expiring)
        total += 9 * n;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (out == NULL)
        return NULL;
    unsigned char *start = (unsigned char *)PyBytes_AS_STRING(out), *p = start;
    *p++ = 0x94;
    p = mpw_array(p, n);
    for (Py_ssize_t i = lo; i < hi; i++)
        p = mpw_bin(p, PyList_GET_ITEM(keys, i));
    p = mpw_array(p, n);
    for (Py_ssize_t i = lo; i < hi; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        if (PyTuple_CheckExact(v))
            v = PyTuple_GET_ITEM(v, 0);
        if (v == Py_None)
            *p++ = 0xC0;
        else
            p = mpw_bin(p, v);
    }
    p = mpw_array(p, n);
    for (Py_ssize_t i = lo; i < hi; i++) {
        unsigned long long t = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(tags, i));
        if (t == (unsigned long long)-1 && PyErr_Occurred()) {
            Py_DECREF(out);
            return NULL;
        }
        p = mpw_uint(p, t);
    }
    p = mpw_array(p, expiring ? n : 0);
    for (Py_ssize_t i = lo; expiring && i < hi; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        unsigned long long e = 0;
        if (PyTuple_CheckExact(v)) {
            e = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(v, 1));
            if (e == (unsigned long long)-1 && PyErr_Occurred()) {
                Py_DECREF(out);
                return NULL;
            }
        }
        p = mpw_uint(p, e);
    }
    if (_PyBytes_Resize(&out, (Py_ssize_t)(p - start)) < 0)
        return NULL;
    return out;
}
