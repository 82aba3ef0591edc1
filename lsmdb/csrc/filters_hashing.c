/* filters_hashing.c: xxh3_64, the key hash of filter hash algorithm 1, for
 * keys up to XXH3_NATIVE_MAX bytes.  Python twin: lsmdb/filters/hashing.py's
 * key_hash (xxhash.xxh3_64_intdigest). */

#include "filters_hashing.h"

/* XXH3-64 with seed 0 (xxHash by Yann Collet, BSD 2-Clause; the algorithm
 * and this default secret are those of its specification, doc/xxhash_spec.md),
 * for inputs up to 240 bytes; longer ones go to the xxhash package.  Filters
 * on disk are probed with this hash, so it must equal
 * xxhash.xxh3_64_intdigest bit for bit: tests/test_speedups.py compares the
 * two on every length from 0 to 300 bytes.  Calling it from C skips the
 * argument parsing and the int object of a call into the package (about
 * 40 ns of an absent get's 250). */

static const unsigned char xxh3_secret[192] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c,
    0xf7, 0x21, 0xad, 0x1c, 0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb,
    0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e,
    0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6,
    0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb,
    0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97,
    0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7,
    0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31,
    0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83,
    0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26,
    0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc,
    0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f,
    0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

#define XXH_PRIME64_1 UINT64_C(0x9E3779B185EBCA87)
#define XXH_PRIME64_2 UINT64_C(0xC2B2AE3D27D4EB4F)
#define XXH_PRIME64_3 UINT64_C(0x165667B19E3779F9)
#define XXH_PRIME_MX1 UINT64_C(0x165667919E3779F9)
#define XXH_PRIME_MX2 UINT64_C(0x9FB21C651E98DF25)

static PyObject *xxh3_fallback;  /* xxhash.xxh3_64_intdigest, for longer inputs */

static inline uint64_t
mul128_fold64(uint64_t a, uint64_t b)
{
#if defined(__SIZEOF_INT128__)
    unsigned __int128 p = (unsigned __int128)a * b;
    return (uint64_t)p ^ (uint64_t)(p >> 64);
#else
    uint64_t lo_lo = (a & 0xFFFFFFFF) * (b & 0xFFFFFFFF), hi_lo = (a >> 32) * (b & 0xFFFFFFFF);
    uint64_t lo_hi = (a & 0xFFFFFFFF) * (b >> 32), hi_hi = (a >> 32) * (b >> 32);
    uint64_t cross = (lo_lo >> 32) + (hi_lo & 0xFFFFFFFF) + lo_hi;
    uint64_t upper = (hi_lo >> 32) + (cross >> 32) + hi_hi;
    uint64_t lower = (cross << 32) | (lo_lo & 0xFFFFFFFF);
    return lower ^ upper;
#endif
}

static inline uint64_t
xxh64_avalanche(uint64_t h)
{
    h ^= h >> 33;
    h *= XXH_PRIME64_2;
    h ^= h >> 29;
    h *= XXH_PRIME64_3;
    return h ^ (h >> 32);
}

static inline uint64_t
xxh3_avalanche(uint64_t h)
{
    h ^= h >> 37;
    h *= XXH_PRIME_MX1;
    return h ^ (h >> 32);
}

static inline uint64_t
xxh3_mix16(const unsigned char *in, const unsigned char *sec)
{
    return mul128_fold64(rd64(in) ^ rd64(sec), rd64(in + 8) ^ rd64(sec + 8));
}

/* XXH3-64 of p[0:n], n <= XXH3_NATIVE_MAX, seed 0. */
uint64_t
xxh3_64_short(const unsigned char *p, size_t n)
{
    const unsigned char *s = xxh3_secret;
    if (n <= 16) {
        if (n > 8) {
            uint64_t lo = rd64(p) ^ (rd64(s + 24) ^ rd64(s + 32));
            uint64_t hi = rd64(p + n - 8) ^ (rd64(s + 40) ^ rd64(s + 48));
            uint64_t acc = (uint64_t)n + __builtin_bswap64(lo) + hi + mul128_fold64(lo, hi);
            return xxh3_avalanche(acc);
        }
        if (n >= 4) {
            uint64_t in64 = (uint64_t)rd32(p + n - 4) + ((uint64_t)rd32(p) << 32);
            uint64_t h = in64 ^ (rd64(s + 8) ^ rd64(s + 16));
            h ^= ((h << 49) | (h >> 15)) ^ ((h << 24) | (h >> 40));
            h *= XXH_PRIME_MX2;
            h ^= (h >> 35) + (uint64_t)n;
            h *= XXH_PRIME_MX2;
            return h ^ (h >> 28);
        }
        if (n > 0) {
            uint32_t combined = ((uint32_t)p[0] << 16) | ((uint32_t)p[n >> 1] << 24)
                                | (uint32_t)p[n - 1] | ((uint32_t)n << 8);
            uint64_t bitflip = (uint64_t)(rd32(s) ^ rd32(s + 4));
            return xxh64_avalanche((uint64_t)combined ^ bitflip);
        }
        return xxh64_avalanche(rd64(s + 56) ^ rd64(s + 64));
    }
    uint64_t acc = (uint64_t)n * XXH_PRIME64_1;
    if (n <= 128) {
        if (n > 32) {
            if (n > 64) {
                if (n > 96) {
                    acc += xxh3_mix16(p + 48, s + 96);
                    acc += xxh3_mix16(p + n - 64, s + 112);
                }
                acc += xxh3_mix16(p + 32, s + 64);
                acc += xxh3_mix16(p + n - 48, s + 80);
            }
            acc += xxh3_mix16(p + 16, s + 32);
            acc += xxh3_mix16(p + n - 32, s + 48);
        }
        acc += xxh3_mix16(p, s);
        acc += xxh3_mix16(p + n - 16, s + 16);
        return xxh3_avalanche(acc);
    }
    size_t rounds = n / 16;
    for (size_t i = 0; i < 8; i++)
        acc += xxh3_mix16(p + 16 * i, s + 16 * i);
    acc = xxh3_avalanche(acc);
    for (size_t i = 8; i < rounds; i++)
        acc += xxh3_mix16(p + 16 * i, s + 16 * (i - 8) + 3);
    acc += xxh3_mix16(p + n - 16, s + 136 - 17);
    return xxh3_avalanche(acc);
}

/* The hash of a bytes object: 0 and *out, or -1 with an exception set. */
int
xxh3_64_bytes(PyObject *key, uint64_t *out)
{
    if (PyBytes_GET_SIZE(key) <= XXH3_NATIVE_MAX) {
        *out = xxh3_64_of_short(key);
        return 0;
    }
    PyObject *r = PyObject_CallOneArg(xxh3_fallback, key);
    if (r == NULL)
        return -1;
    unsigned long long h = PyLong_AsUnsignedLongLong(r);
    Py_DECREF(r);
    if (h == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = h;
    return 0;
}

PyObject *
speedups_xxh3_64(PyObject *Py_UNUSED(module), PyObject *arg)
{
    /* xxh3_64(data) -> xxhash.xxh3_64_intdigest(data) */
    if (!PyBytes_CheckExact(arg))
        return PyObject_CallOneArg(xxh3_fallback, arg);
    uint64_t h;
    if (xxh3_64_bytes(arg, &h) < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(h);
}

/* xxh3_fallback from the xxhash package (at import): 0, or -1 with an
 * exception set. */
int
hashing_init(void)
{
    PyObject *xxhash_mod = PyImport_ImportModule("xxhash");
    if (xxhash_mod == NULL)
        return -1;
    xxh3_fallback = PyObject_GetAttrString(xxhash_mod, "xxh3_64_intdigest");
    Py_DECREF(xxhash_mod);
    return xxh3_fallback == NULL ? -1 : 0;
}
