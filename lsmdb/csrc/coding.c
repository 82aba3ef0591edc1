/* coding.c: crc32, zlib's CRC-32 -- a byte-at-a-time table, and on x86-64
 * folds of 128-bit lanes (PCLMULQDQ) and of 256-bit lanes (VPCLMULQDQ),
 * chosen by what the CPU has and set_crc32_wide.  Python twin: zlib.crc32,
 * which lsmdb/coding.py's crc32 is where PCLMULQDQ is missing. */

#include "coding.h"

/* ---- crc32: zlib's CRC-32, folded with carry-less multiplies ------------- */

/* crc32(data, value=0) -> the same int as zlib.crc32(data, value).  On x86-64
 * with PCLMULQDQ, 16-byte lanes are folded with carry-less multiplies (the
 * method of Gopal et al., "Fast CRC Computation for Generic Polynomials Using
 * PCLMULQDQ Instruction", Intel, 2009); the fold constants are powers of x
 * modulo the CRC-32 polynomial, bit-reflected.  Elsewhere, and for the bytes
 * that do not fill a lane, a byte-at-a-time table (lsmdb.coding then keeps
 * zlib's).  tests/test_speedups.py compares it with zlib.crc32 on every
 * length up to 700 bytes and beyond.  With zlib's code the checksum of a
 * 4 KiB block cost about 1.7 us here, most of a block read's CPU time. */

static uint32_t crc_table[256];

int have_clmul;
int have_vclmul;
/* Whether crc32_update folds 256-bit lanes: where the CPU can, unless
 * set_crc32_wide(False) chose the 128-bit fold (tests compare the two). */
static int use_vclmul;

static void
crc_table_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int i = 0; i < 8; i++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
}

/* state: the register (already complemented); returns the register. */
static uint32_t
crc_bytes(uint32_t state, const unsigned char *p, size_t n)
{
    while (n--)
        state = crc_table[(state ^ *p++) & 0xFF] ^ (state >> 8);
    return state;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_CLMUL_CODE 1

/* k1, k2: x^(4*128+32) and x^(4*128-32) mod P, reflected, shifted left by
 * one; k3, k4: the same for 128 +- 32; k5: x^64 mod P; then P itself and
 * mu = floor(x^64 / P), both reflected (33 bits). */
static const uint64_t crc_k1k2[2] __attribute__((aligned(16))) = {0x154442bd4, 0x1c6e41596};
static const uint64_t crc_k3k4[2] __attribute__((aligned(16))) = {0x1751997d0, 0x0ccaa009e};
static const uint64_t crc_k5k0[2] __attribute__((aligned(16))) = {0x163cd6124, 0};
static const uint64_t crc_poly[2] __attribute__((aligned(16))) = {0x1db710641, 0x1f7011641};
/* k1, k2 for 8*128 +- 32, twice: the fold by 128 bytes of crc_vclmul's
 * four 256-bit lanes (each of their two 128-bit halves). */
static const uint64_t crc_k1k2_8[4] __attribute__((aligned(32))) = {0x1e88ef372, 0x14a7fe880,
                                                                    0x1e88ef372, 0x14a7fe880};

/* The end of a fold: x1, the 128 bits folded so far, then the 16-byte
 * lanes left at p (n, a multiple of 16), reduced to the 32-bit register. */
__attribute__((target("pclmul,sse4.1")))
static inline uint32_t
crc_clmul_tail(__m128i x1, const unsigned char *p, size_t n)
{
    __m128i x0, x2, x3, x5;
    x0 = _mm_load_si128((const __m128i *)crc_k3k4);
    while (n >= 16) {
        x2 = _mm_loadu_si128((const __m128i *)p);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        p += 16;
        n -= 16;
    }
    /* 128 bits to 64 */
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
    x3 = _mm_setr_epi32(~0, 0, ~0, 0);
    x1 = _mm_srli_si128(x1, 8);
    x1 = _mm_xor_si128(x1, x2);
    x0 = _mm_loadl_epi64((const __m128i *)crc_k5k0);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, x3);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    /* Barrett reduction to 32 bits */
    x0 = _mm_load_si128((const __m128i *)crc_poly);
    x2 = _mm_and_si128(x1, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
    x2 = _mm_and_si128(x2, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}

/* The register after n bytes at p: n >= 64 and a multiple of 16. */
__attribute__((target("pclmul,sse4.1")))
static uint32_t
crc_clmul(uint32_t state, const unsigned char *p, size_t n)
{
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8;
    x1 = _mm_loadu_si128((const __m128i *)(p + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(p + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(p + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(p + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)state));
    x0 = _mm_load_si128((const __m128i *)crc_k1k2);
    p += 64;
    n -= 64;
    while (n >= 64) {  /* four lanes, each folded 512 bits forward */
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), _mm_loadu_si128((const __m128i *)(p + 0x00)));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), _mm_loadu_si128((const __m128i *)(p + 0x10)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), _mm_loadu_si128((const __m128i *)(p + 0x20)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), _mm_loadu_si128((const __m128i *)(p + 0x30)));
        p += 64;
        n -= 64;
    }
    /* the four lanes into one, then the remaining 16-byte lanes */
    x0 = _mm_load_si128((const __m128i *)crc_k3k4);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    return crc_clmul_tail(x1, p, n);
}

/* crc_clmul with the lanes twice as wide (VPCLMULQDQ on 256 bits): four
 * 256-bit lanes, each folded 1024 bits forward, take 128 bytes a step,
 * their eight halves then folded into one and the rest as crc_clmul ends.
 * n >= 256 and a multiple of 16. */
__attribute__((target("avx2,vpclmulqdq,pclmul,sse4.1")))
static uint32_t
crc_vclmul(uint32_t state, const unsigned char *p, size_t n)
{
    __m256i y0, y1, y2, y3, y4, y5, y6, y7, k;
    y1 = _mm256_loadu_si256((const __m256i *)(p + 0x00));
    y2 = _mm256_loadu_si256((const __m256i *)(p + 0x20));
    y3 = _mm256_loadu_si256((const __m256i *)(p + 0x40));
    y4 = _mm256_loadu_si256((const __m256i *)(p + 0x60));
    y1 = _mm256_xor_si256(y1, _mm256_set_epi64x(0, 0, 0, (long long)state));
    k = _mm256_load_si256((const __m256i *)crc_k1k2_8);
    p += 128;
    n -= 128;
    while (n >= 128) {
        y0 = _mm256_clmulepi64_epi128(y1, k, 0x00);
        y5 = _mm256_clmulepi64_epi128(y2, k, 0x00);
        y6 = _mm256_clmulepi64_epi128(y3, k, 0x00);
        y7 = _mm256_clmulepi64_epi128(y4, k, 0x00);
        y1 = _mm256_clmulepi64_epi128(y1, k, 0x11);
        y2 = _mm256_clmulepi64_epi128(y2, k, 0x11);
        y3 = _mm256_clmulepi64_epi128(y3, k, 0x11);
        y4 = _mm256_clmulepi64_epi128(y4, k, 0x11);
        y1 = _mm256_xor_si256(_mm256_xor_si256(y1, y0),
                              _mm256_loadu_si256((const __m256i *)(p + 0x00)));
        y2 = _mm256_xor_si256(_mm256_xor_si256(y2, y5),
                              _mm256_loadu_si256((const __m256i *)(p + 0x20)));
        y3 = _mm256_xor_si256(_mm256_xor_si256(y3, y6),
                              _mm256_loadu_si256((const __m256i *)(p + 0x40)));
        y4 = _mm256_xor_si256(_mm256_xor_si256(y4, y7),
                              _mm256_loadu_si256((const __m256i *)(p + 0x60)));
        p += 128;
        n -= 128;
    }
    /* the eight 128-bit halves, in the order of the bytes, into one */
    __m128i h[8] = {_mm256_castsi256_si128(y1), _mm256_extracti128_si256(y1, 1),
                    _mm256_castsi256_si128(y2), _mm256_extracti128_si256(y2, 1),
                    _mm256_castsi256_si128(y3), _mm256_extracti128_si256(y3, 1),
                    _mm256_castsi256_si128(y4), _mm256_extracti128_si256(y4, 1)};
    __m128i k34 = _mm_load_si128((const __m128i *)crc_k3k4), x1 = h[0];
    for (int j = 1; j < 8; j++) {
        __m128i lo = _mm_clmulepi64_si128(x1, k34, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k34, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, h[j]), lo);
    }
    return crc_clmul_tail(x1, p, n);
}
#endif

uint32_t
crc32_update(uint32_t crc, const unsigned char *p, size_t n)
{
    uint32_t state = ~crc;
#ifdef HAVE_CLMUL_CODE
    if (use_vclmul && n >= 256) {
        size_t lanes = n & ~(size_t)15;
        state = crc_vclmul(state, p, lanes);
        p += lanes;
        n -= lanes;
    }
    if (have_clmul && n >= 64) {
        size_t lanes = n & ~(size_t)15;
        state = crc_clmul(state, p, lanes);
        p += lanes;
        n -= lanes;
    }
#endif
    return ~crc_bytes(state, p, n);
}

PyObject *
speedups_crc32(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "crc32(data, value=0)");
        return NULL;
    }
    uint32_t value = 0;
    if (nargs == 2) {
        unsigned long v = PyLong_AsUnsignedLongMask(args[1]);
        if (v == (unsigned long)-1 && PyErr_Occurred())
            return NULL;
        value = (uint32_t)v;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t c;
    if (view.len > 65536) {
        Py_BEGIN_ALLOW_THREADS
        c = crc32_update(value, (const unsigned char *)view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        c = crc32_update(value, (const unsigned char *)view.buf, (size_t)view.len);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

/* The table, and which folds the CPU can run (at import). */
void
coding_init(void)
{
    crc_table_init();
#ifdef HAVE_CLMUL_CODE
    __builtin_cpu_init();
    have_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    /* "avx2" is reported only where the OS saves the YMM registers */
    have_vclmul = have_clmul && __builtin_cpu_supports("avx2")
                  && __builtin_cpu_supports("vpclmulqdq");
#endif
    use_vclmul = have_vclmul;
}

PyObject *
speedups_set_crc32_wide(PyObject *Py_UNUSED(module), PyObject *arg)
{
    /* set_crc32_wide(wide) -> whether crc32, and the getter's checks of the
     * blocks it reads, now fold 256-bit lanes: with True (the choice at
     * import) where the CPU has them (CRC32_VPCLMUL), with False never (the
     * 128-bit fold).  The same checksums either way. */
    if (!PyBool_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "set_crc32_wide(wide: bool)");
        return NULL;
    }
    use_vclmul = arg == Py_True && have_vclmul;
    return PyBool_FromLong(use_vclmul);
}
