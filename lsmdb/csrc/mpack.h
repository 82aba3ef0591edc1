/* mpack.h: msgpack writers, mpw_ (block.c's readers are mp_), the smallest
 * form of each item as msgpack.packb writes it (use_bin_type=True) -- what
 * logset.c's WAL records and block.c's data block payloads are made of.
 * Each writes at p, which has the room, and returns the end; the _size twins
 * give that room. */

#ifndef LSMDB_MPACK_H
#define LSMDB_MPACK_H

#include "base.h"

/* msgpack of one unsigned int, the smallest form (as msgpack.packb writes it). */
static inline unsigned char *
mpw_uint(unsigned char *p, uint64_t v)
{
    if (v <= 0x7F) {
        *p++ = (unsigned char)v;
    } else if (v <= 0xFF) {
        *p++ = 0xCC;
        *p++ = (unsigned char)v;
    } else if (v <= 0xFFFF) {
        *p++ = 0xCD;
        *p++ = (unsigned char)(v >> 8);
        *p++ = (unsigned char)v;
    } else if (v <= 0xFFFFFFFFu) {
        *p++ = 0xCE;
        for (int s = 24; s >= 0; s -= 8)
            *p++ = (unsigned char)(v >> s);
    } else {
        *p++ = 0xCF;
        for (int s = 56; s >= 0; s -= 8)
            *p++ = (unsigned char)(v >> s);
    }
    return p;
}

/* msgpack header of an array of n items. */
static inline unsigned char *
mpw_array(unsigned char *p, size_t n)
{
    if (n <= 15) {
        *p++ = (unsigned char)(0x90 | n);
    } else if (n <= 0xFFFF) {
        *p++ = 0xDC;
        *p++ = (unsigned char)(n >> 8);
        *p++ = (unsigned char)n;
    } else {
        *p++ = 0xDD;
        for (int s = 24; s >= 0; s -= 8)
            *p++ = (unsigned char)(n >> s);
    }
    return p;
}

/* msgpack bin of the n bytes at s. */
static inline unsigned char *
mpw_bin_raw(unsigned char *p, const unsigned char *s, size_t n)
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
        for (int sh = 24; sh >= 0; sh -= 8)
            *p++ = (unsigned char)(n >> sh);
    }
    if (n)
        memcpy(p, s, n);
    return p + n;
}

/* msgpack bin of b (bytes). */
static inline unsigned char *
mpw_bin(unsigned char *p, PyObject *b)
{
    return mpw_bin_raw(p, (const unsigned char *)PyBytes_AS_STRING(b),
                       (size_t)PyBytes_GET_SIZE(b));
}

static inline size_t
mpw_uint_size(uint64_t v)
{
    return v <= 0x7F ? 1 : v <= 0xFF ? 2 : v <= 0xFFFF ? 3 : v <= 0xFFFFFFFFu ? 5 : 9;
}

static inline size_t
mpw_bin_size(size_t n)
{
    return n + (n <= 0xFF ? 2 : n <= 0xFFFF ? 3 : 5);
}

static inline size_t
mpw_array_size(size_t n)
{
    return n <= 15 ? 1 : n <= 0xFFFF ? 3 : 5;
}

#endif
