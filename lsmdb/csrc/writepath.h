/* writepath.h: put_one, a put in its common case, and put_locked, its step
 * under the database lock, in C (writepath.c).  Python twins:
 * lsmdb/writepath.py's WritePath.put_one (with WritePath.put) and put_locked.
 *
 * The constants below are lsmdb's own (lsmdb/wal.py, lsmdb/memtable.py,
 * lsmdb/sstable_format.py, lsmdb/writepath.py); module.c exports them as
 * WRITE_PATH_CONSTANTS and lsmdb/writepath.py takes the C put only where
 * each matches its Python definition. */

#ifndef LSMDB_WRITEPATH_H
#define LSMDB_WRITEPATH_H

#include "base.h"
#include "memtable.h"  /* MEM_ENTRY_OVERHEAD_BYTES, MEM_EXPIRING_OVERHEAD_BYTES */

#define WAL_BLOCK_SIZE_BYTES 32768       /* wal.BLOCK_SIZE_BYTES */
#define WAL_FRAGMENT_HEADER_SIZE 7       /* wal.FRAGMENT_HEADER_SIZE: crc32, length, type */
#define WAL_FULL 1                       /* wal.FULL */
#define MEM_KIND_VALUE 1                 /* sstable_format.KIND_VALUE (KIND_TOMBSTONE is 0) */
#define WRITE_MAX_SEQ ((1LL << 56) - 1)  /* sstable_format.MAX_SEQ */
#define PUT_FULL 1                       /* writepath.PUT_FULL */
#define PUT_WAL_OVER 2                   /* writepath.PUT_WAL_OVER */
#define PUT_DECLINED (-1)                /* writepath.PUT_DECLINED */
#define MAX_FROZEN_MEMTABLES 2           /* writepath.MAX_FROZEN_MEMTABLES */
#define MAX_BATCH_SIZE_BYTES (512LL * 1024 * 1024)  /* keys.MAX_BATCH_SIZE_BYTES */
#define MAX_KEY_SIZE_BYTES (64 * 1024)               /* keys.MAX_KEY_SIZE_BYTES */
#define MAX_VALUE_SIZE_BYTES (64LL * 1024 * 1024)    /* keys.MAX_VALUE_SIZE_BYTES */

HIDDEN_BEGIN

int writepath_init(void);
PyObject *speedups_put_locked(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *speedups_put_one(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *speedups_batch_bytes(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern PyTypeObject PutterType;

HIDDEN_END

#endif
