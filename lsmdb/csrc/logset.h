/* logset.h: encode_ops, a one-table WAL record, and encode_one, a one-op
 * record, byte for byte what msgpack writes (logset.c).  Python twin:
 * lsmdb/logset.py's encode_record. */

#ifndef LSMDB_LOGSET_H
#define LSMDB_LOGSET_H

#include "base.h"

HIDDEN_BEGIN

PyObject *speedups_encode_ops(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* The payload of one op [seq, [[tid, key, value]]] (key bytes of at most
 * 4 GiB, value such bytes or None): its exact size, and written at p (which
 * has that room), returning its end.  The same bytes as encode_ops. */
size_t encode_one_size(uint64_t seq, uint64_t tid, PyObject *key, PyObject *value);
unsigned char *encode_one(unsigned char *p, uint64_t seq, uint64_t tid, PyObject *key,
                          PyObject *value);

HIDDEN_END

#endif
