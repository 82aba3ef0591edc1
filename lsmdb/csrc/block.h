/* block.h: a data block's keys walked in place, without decoding the block,
 * and the block cache's form of a block (block.c).  Python twin:
 * lsmdb/block.py. */

#ifndef LSMDB_BLOCK_H
#define LSMDB_BLOCK_H

#include "base.h"
#include "coding.h"

HIDDEN_BEGIN

/* block.c */
int block_may_hold(const unsigned char *p, size_t n, const unsigned char *key, size_t klen);
int block_find(const unsigned char *p, size_t n, const unsigned char *key, size_t klen,
               const unsigned char **value, size_t *vlen);
PyObject *block_entry(const unsigned char *p, size_t n);
int entry_find(const unsigned char *e, size_t n, const unsigned char *key, size_t klen,
               const unsigned char **value, size_t *vlen);
PyObject *speedups_block_may_hold(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *speedups_block_find(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *speedups_block_entry(PyObject *module, PyObject *payload);
PyObject *speedups_entry_find(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *speedups_entry_lists(PyObject *module, PyObject *entry);

HIDDEN_END

/* The size of a cached block's tail: its entry count and payload size
 * (block.c draws the layout). */
#define ENTRY_TAIL 8

/* The count and payload size of a cached block e[0:n] whose tail and size
 * agree: 0; else -1. */
static inline int
entry_shape(const unsigned char *e, size_t n, uint64_t *count, uint64_t *plen)
{
    if (n < ENTRY_TAIL)
        return -1;
    *count = rd32(e + n - 8);
    *plen = rd32(e + n - 4);
    return *plen + 8 * *count + ENTRY_TAIL == n ? 0 : -1;
}

/* The value a lookup found: for f 1 the bytes vp[0:vlen], for f 2 (a
 * tombstone) None.  A new reference, or NULL with an exception set. */
static inline PyObject *
found_value(int f, const unsigned char *vp, size_t vlen)
{
    return f == 2 ? Py_NewRef(Py_None)
                  : PyBytes_FromStringAndSize((const char *)vp, (Py_ssize_t)vlen);
}

/* block_find for key in the checksum-verified payload buf[0:size] of a block
 * read from disk: 0 without it when block_may_hold's walk of the keys does
 * not meet key (a false positive, recognised without decoding the block);
 * else what block_find says (1 or 2, *vp and *vlen; 0; -1, it refuses the
 * block). */
static inline int
disk_block_find(const unsigned char *buf, size_t size, PyObject *key, const unsigned char **vp,
                size_t *vlen)
{
    const unsigned char *k = (const unsigned char *)PyBytes_AS_STRING(key);
    size_t klen = (size_t)PyBytes_GET_SIZE(key);
    return block_may_hold(buf, size, k, klen) ? block_find(buf, size, k, klen, vp, vlen) : 0;
}

#endif
