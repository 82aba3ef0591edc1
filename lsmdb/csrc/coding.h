/* coding.h: fixed-width little-endian integers and CRC-32.  Python twin:
 * lsmdb/coding.py (coding.c computes zlib.crc32, folded with PCLMULQDQ). */

#ifndef LSMDB_CODING_H
#define LSMDB_CODING_H

#include "base.h"

/* Little-endian reads and writes (xxh3's input and secret, a cached block's
 * offsets, the block trailer). */
static inline uint64_t
rd64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint32_t
rd32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static inline void
put_le32(unsigned char *p, uint32_t v)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    memcpy(p, &v, 4);
}

static inline void
put_le64(unsigned char *p, uint64_t v)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    memcpy(p, &v, 8);
}

HIDDEN_BEGIN

/* coding.c */
extern int have_clmul;   /* the CPU has PCLMULQDQ (and SSE4.1): crc32 folds 128-bit lanes */
extern int have_vclmul;  /* ... and VPCLMULQDQ and AVX2, saved by the OS: 256-bit lanes
                          * too, unless set_crc32_wide(False) */
void coding_init(void);
uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n);
PyObject *speedups_crc32(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *speedups_set_crc32_wide(PyObject *module, PyObject *arg);

HIDDEN_END

#endif
