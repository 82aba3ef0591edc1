/* filters_hashing.h: xxh3_64, hash algorithm 1 of the filters, computed
 * here for keys up to XXH3_NATIVE_MAX bytes (filters_hashing.c).  Python
 * twin: lsmdb/filters/hashing.py's key_hash. */

#ifndef LSMDB_FILTERS_HASHING_H
#define LSMDB_FILTERS_HASHING_H

#include "base.h"
#include "coding.h"

/* The longest key xxh3_64 hashes here; longer ones go to the xxhash package. */
#define XXH3_NATIVE_MAX 240

HIDDEN_BEGIN

/* filters_hashing.c */
int hashing_init(void);
uint64_t xxh3_64_short(const unsigned char *p, size_t n);
int xxh3_64_bytes(PyObject *key, uint64_t *out);
PyObject *speedups_xxh3_64(PyObject *module, PyObject *arg);

HIDDEN_END

/* The hash of a bytes object of at most XXH3_NATIVE_MAX bytes. */
static inline uint64_t
xxh3_64_of_short(PyObject *key)
{
    return xxh3_64_short((const unsigned char *)PyBytes_AS_STRING(key),
                         (size_t)PyBytes_GET_SIZE(key));
}

#endif
