/* keys.h: the key order -- bytes compared bytewise, a shorter prefix first --
 * and the words the bisects over keys compare (a key's 8 bytes after a
 * shared prefix, as a big-endian word).  Python twin: the order of bytes
 * itself (lsmdb/keys.py); tests/test_speedups.py compares the two. */

#ifndef LSMDB_KEYS_H
#define LSMDB_KEYS_H

#include "base.h"

/* memcmp-then-length order of a[0:la] and b[0:lb] (bytes order), inline:
 * keys are short, and a call to memcmp costs more than comparing them. */
static inline int
mem_order(const char *a, Py_ssize_t la, const char *b, Py_ssize_t lb)
{
    const unsigned char *p = (const unsigned char *)a, *q = (const unsigned char *)b;
    Py_ssize_t n = la < lb ? la : lb, i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x, y;
        memcpy(&x, p + i, 8);
        memcpy(&y, q + i, 8);
        if (x != y) {
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
            x = __builtin_bswap64(x);
            y = __builtin_bswap64(y);
#endif
            return x < y ? -1 : 1;
        }
    }
    if (i < n && n >= 8) {
        /* The last 8 bytes of the shorter, overlapping bytes already found
         * equal: one more word instead of a branch per byte. */
        uint64_t x, y;
        memcpy(&x, p + n - 8, 8);
        memcpy(&y, q + n - 8, 8);
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        x = __builtin_bswap64(x);
        y = __builtin_bswap64(y);
#endif
        if (x != y)
            return x < y ? -1 : 1;
        i = n;
    }
    for (; i < n; i++)
        if (p[i] != q[i])
            return p[i] < q[i] ? -1 : 1;
    return (la > lb) - (la < lb);
}

static inline int
bytes_cmp(PyObject *a, PyObject *b)
{
    return mem_order(PyBytes_AS_STRING(a), PyBytes_GET_SIZE(a), PyBytes_AS_STRING(b),
                     PyBytes_GET_SIZE(b));
}

/* How many leading bytes a[0:la] and b[0:lb] share: for keys in order, the
 * prefix every key from a to b starts with. */
static inline Py_ssize_t
shared_prefix(const char *a, Py_ssize_t la, const char *b, Py_ssize_t lb)
{
    Py_ssize_t cp = 0;
    while (cp < la && cp < lb && a[cp] == b[cp])
        cp++;
    return cp;
}

/* p[0:min(n, 8)] as a big-endian word, zero-padded: in the order of the bytes
 * (two strings that differ within those bytes compare as their words do;
 * equal words say nothing more). */
static inline uint64_t
be_word(const char *p, Py_ssize_t n)
{
    unsigned char b[8] = {0};
    memcpy(b, p, (size_t)(n < 8 ? n : 8));
    uint64_t w = 0;
    for (int i = 0; i < 8; i++)
        w = w << 8 | b[i];
    return w;
}

/* The first i in a[0:n] (n >= 1, in order) with a[i] >= v, or n: a binary
 * search whose steps choose without a branch (a cmov), the loop's length
 * fixed by n. */
static inline Py_ssize_t
lower_bound_u64(const uint64_t *a, Py_ssize_t n, uint64_t v)
{
    const uint64_t *base = a;
    while (n > 1) {
        Py_ssize_t half = n / 2;
        base = base[half - 1] < v ? base + half : base;
        n -= half;
    }
    return (base - a) + (*base < v);
}

#endif
