/* sstable_reader.h: an SSTable's data blocks read for the C read path: the
 * file mapped read-only (Mapping) and a block copied out of it or read with
 * one pread, its checksum verified (sstable_reader.c).  Python twin:
 * lsmdb/sstable_reader.py's SSTableReader. */

#ifndef LSMDB_SSTABLE_READER_H
#define LSMDB_SSTABLE_READER_H

#include "base.h"
#include "readpath_probes.h"

HIDDEN_BEGIN

extern PyTypeObject MappingType;

/* sstable_reader.c */
int sstable_reader_init(void);
PyObject *speedups_lz4_direct(PyObject *module, PyObject *arg);
int read_block_buf(Entry *e, PyObject *reader, Py_ssize_t i, unsigned char **bufp,
                   size_t *sizep);
PyObject *speedups_map_file(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

HIDDEN_END

#endif
