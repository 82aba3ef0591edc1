/* logset.h: encode_ops, a one-table WAL record, byte for byte what msgpack
 * writes (logset.c).  Python twin: lsmdb/logset.py's encode_record. */

#ifndef LSMDB_LOGSET_H
#define LSMDB_LOGSET_H

#include "base.h"

HIDDEN_BEGIN

PyObject *speedups_encode_ops(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

HIDDEN_END

#endif
