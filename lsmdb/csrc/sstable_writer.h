/* sstable_writer.h: block_cuts, where a chunk of sorted entries is cut into
 * data blocks, and memtable_section, a frozen memtable's data blocks written
 * (sstable_writer.c).  Python twins: lsmdb/sstable_writer.py's block_cuts and
 * memtable_section. */

#ifndef LSMDB_SSTABLE_WRITER_H
#define LSMDB_SSTABLE_WRITER_H

#include "base.h"

HIDDEN_BEGIN

PyObject *speedups_block_cuts(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *speedups_memtable_section(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

HIDDEN_END

#endif
