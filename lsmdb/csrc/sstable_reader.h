/* sstable_reader.h: an SSTable's data blocks read for the C read path: the
 * file mapped read-only (Mapping) and a block copied out of it or read with
 * one pread, its checksum verified (sstable_reader.c).  Python twin:
 * lsmdb/sstable_reader.py's SSTableReader. */

#ifndef LSMDB_SSTABLE_READER_H
#define LSMDB_SSTABLE_READER_H

#include "base.h"
#include "readpath_probes.h"

/* What lz4.block.compress calls in liblz4, as the lz4 package's extension
 * exports it: per block a stream reset, then LZ4_compress_fast_continue
 * (acceleration 1) into LZ4_compressBound bytes. */
typedef struct {
    void *(*create)(void);
    int (*release)(void *stream);
    void (*reset)(void *stream);
    int (*compress)(void *stream, const char *src, char *dst, int n, int capacity, int accel);
    int (*bound)(int n);
} Lz4Api;

HIDDEN_BEGIN

extern PyTypeObject MappingType;

/* sstable_reader.c */
int sstable_reader_init(void);
PyObject *speedups_lz4_direct(PyObject *module, PyObject *arg);
const Lz4Api *lz4_compressor(void);
int read_stored_buf(Entry *e, PyObject *reader, Py_ssize_t i, unsigned char **bufp,
                    size_t *sizep, int *kindp);
int read_block_buf(Entry *e, PyObject *reader, Py_ssize_t i, unsigned char **bufp,
                   size_t *sizep);
int stored_payload(unsigned char *buf, size_t size, int kind, unsigned char **bufp,
                   size_t *sizep);
int lz4_payload_prefix(const unsigned char *stored, size_t n, size_t want, unsigned char *out,
                       size_t room, size_t *got, size_t *plen);
PyObject *speedups_map_file(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

HIDDEN_END

#endif
