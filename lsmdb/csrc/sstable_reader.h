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
    /* for a dictionary (NULL where not exported) */
    int (*load_dict)(void *stream, const char *dict, int size);
    int (*sizeof_state)(void);
} Lz4Api;

/* The table of a type-3 block's pieces (pieces_table). */
typedef struct {
    size_t plen;                 /* the payload's bytes */
    size_t count;                /* its pieces, 2 or more */
    const unsigned char *sizes;  /* each piece's stored size, varints */
    const unsigned char *firsts; /* the entry each piece from the third on begins with */
    const unsigned char *data;   /* piece 0's bytes; the others follow */
} Pieces;

/* A file's dictionary in its scratch buffer, the room for a piece right
 * after it (reader_dictionary). */
typedef struct {
    PyObject *holder;     /* the bytearray holding both */
    unsigned char *dict;
    size_t dlen;
    unsigned char *room;  /* right after the dictionary */
    size_t rlen;          /* its bytes: at least what reader_dictionary was asked for */
} Dict;

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
int stored_payload(PyObject *reader, unsigned char *buf, size_t size, int kind,
                   unsigned char **bufp, size_t *sizep);
int pieces_table(const unsigned char *stored, size_t n, Pieces *t);
void pieces_piece(const Pieces *t, size_t p, const unsigned char **src, size_t *len);
size_t pieces_holding(const Pieces *t, size_t index, size_t *first, size_t *next);
int reader_dictionary(PyObject *reader, size_t need, Dict *d);
void dict_release(Dict *d);
Py_ssize_t pieces_decode(const unsigned char *src, size_t len, const Dict *d, size_t limit);
int lz4_payload_prefix(const unsigned char *stored, size_t n, size_t want, unsigned char *out,
                       size_t room, size_t *got, size_t *plen);
PyObject *speedups_pieces_payload(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *speedups_map_file(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

HIDDEN_END

#endif
