/* filters_bloom.c: the Bloom family's parameters checked, and the setting of
 * many keys' bits (bloom_add); its probe is inline, in filters_bloom.h.
 * Python twin: lsmdb/filters/bloom.py (BloomFilter.probe_spec, add_hashes). */

#include "filters.h"

/* 0 when s (0: family 1) is a valid partition size for m bits and k probes:
 * the k partitions inside the m bits and each under 2^32 bits; else -1 with
 * ValueError set. */
int
check_part(uint64_t s, uint64_t m, uint64_t k)
{
    if (s && (k == 0 || s > m / k || s > PART_MAX)) {
        PyErr_SetString(PyExc_ValueError, "partition size beyond m / k or 2^32 - 1");
        return -1;
    }
    return 0;
}

/* b from the parameters (m, k, s) of a Bloom filter of `family` whose bit
 * array holds data_len bytes: 0, or -1 with an exception set (parameters
 * that do not fit the family or the array). */
int
bloom_params_init(BloomParams *b, int family, PyObject *params, Py_ssize_t data_len)
{
    unsigned long long m, k, s;
    if (!PyTuple_Check(params)
        || !PyArg_ParseTuple(params, "KKK:bloom parameters (m, k, s)", &m, &k, &s))
        return -1;
    if (m == 0 || k == 0 || k > 1024) {
        PyErr_SetString(PyExc_ValueError, "a Bloom filter needs m > 0 and 0 < k <= 1024");
        return -1;
    }
    if ((family == FILTER_BLOOM_PARTITIONED) != (s != 0)) {
        PyErr_SetString(PyExc_ValueError, "a partition size for family 2 only");
        return -1;
    }
    if (check_part(s, m, k) < 0)
        return -1;
    if ((uint64_t)data_len < (m + 7) / 8) {
        PyErr_SetString(PyExc_ValueError, "filter bit array shorter than m bits");
        return -1;
    }
    b->m = m;
    b->k = k;
    b->s = s;
    b->mod_M = fastmod_M(m);
    return 0;
}

/* ---- bloom_add: set the bits of many keys ------------------------------- */

/* The bits of hash h's k probes (filters/bloom.py's probe_bit): with part = 0
 * bits (h1 + i*h2) mod m, else i*part + (((h1 + i*h2) mod 2^32) * part >> 32). */
static inline void
bloom_set_hash(unsigned char *bits, uint64_t m, uint64_t M, uint64_t k, uint64_t part,
               uint64_t h)
{
    if (part) {
        uint32_t g = (uint32_t)h, h2 = (uint32_t)(h >> 32);
        uint64_t base = 0;
        for (uint64_t i = 0; i < k; i++, g += h2, base += part) {
            uint64_t pos = base + part_pos(g, part);
            bits[pos >> 3] |= (unsigned char)(1u << (pos & 7));
        }
        return;
    }
    uint64_t pos = fastmod(h & 0xFFFFFFFFu, m, M), step = fastmod(h >> 32, m, M);
    for (uint64_t i = 0; i < k; i++) {
        bits[pos >> 3] |= (unsigned char)(1u << (pos & 7));
        pos += step;
        if (pos >= m)
            pos -= m;
    }
}

/* bloom_add's bits for `count` hashes given as native unsigned 64-bit words
 * (no GIL needed). */
static void
bloom_set_all(unsigned char *bits, uint64_t m, uint64_t k, uint64_t part,
              const unsigned char *words, Py_ssize_t count)
{
    uint64_t M = fastmod_M(m);
    for (Py_ssize_t j = 0; j < count; j++) {
        uint64_t h;
        memcpy(&h, words + 8 * j, 8);  /* native order; the buffer may be unaligned */
        bloom_set_hash(bits, m, M, k, part, h);
    }
}

PyObject *
speedups_bloom_add(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* bloom_add(bits, m, k, hashes[, part]): for each 64-bit hash h (hashes a
     * sequence of ints, or a buffer of native unsigned 64-bit words -- an
     * array('Q'); hash_words_get), without the GIL, set the
     * bits of its k probes, h1 = h & 0xFFFFFFFF, h2 = h >> 32: with part = 0
     * (the default) bits (h1 + i*h2) mod m (format 1); else bits
     * i*part + (((h1 + i*h2) mod 2^32) * part >> 32) (format 2).  The same bits
     * as BloomFilter.add_hash. */
    if (nargs != 4 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "bloom_add(bits, m, k, hashes[, part])");
        return NULL;
    }
    unsigned long long m = PyLong_AsUnsignedLongLong(args[1]);
    if (m == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t k = PyLong_AsSsize_t(args[2]);
    if (k == -1 && PyErr_Occurred())
        return NULL;
    if (k < 0 || k > 1024) {
        PyErr_SetString(PyExc_ValueError, "hash count out of range");
        return NULL;
    }
    unsigned long long part = 0;
    if (nargs == 5) {
        part = PyLong_AsUnsignedLongLong(args[4]);
        if (part == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
        if (check_part(part, m, (uint64_t)k) < 0)
            return NULL;
    }
    HashWords w;
    if (hash_words_get(args[3], &w) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0) {
        hash_words_release(&w);
        return NULL;
    }
    if (m == 0 || (uint64_t)view.len < (m + 7) / 8) {
        PyBuffer_Release(&view);
        hash_words_release(&w);
        PyErr_SetString(PyExc_ValueError, "bit array shorter than m bits (or m is 0)");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    bloom_set_all((unsigned char *)view.buf, m, (uint64_t)k, part, w.words, w.count);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    hash_words_release(&w);
    Py_RETURN_NONE;
}

PyObject *
speedups_fastmod(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* _fastmod(a, d) -> a % d through fastmod (for the tests). */
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_fastmod(a, d)");
        return NULL;
    }
    unsigned long long a = PyLong_AsUnsignedLongLong(args[0]);
    if (a == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    unsigned long long d = PyLong_AsUnsignedLongLong(args[1]);
    if (d == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (d == 0) {
        PyErr_SetString(PyExc_ZeroDivisionError, "_fastmod by zero");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(fastmod(a, d, fastmod_M(d)));
}
