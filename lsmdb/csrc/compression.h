/* compression.h: PieceCompressor, a data block stored in pieces against its
 * file's dictionary (compression.c).  Python twin: lsmdb/compression.py's
 * compress_pieces. */

#ifndef LSMDB_COMPRESSION_H
#define LSMDB_COMPRESSION_H

#include "base.h"

/* lsmdb/compression.py's PIECE_BYTES and MAX_DICT (module.c exports them
 * as COMPRESSION_CONSTANTS; lsmdb.compression compares them at import). */
#define PIECE_BYTES 1024
#define MAX_DICT 65536

HIDDEN_BEGIN

extern PyTypeObject PieceCompressorType;

HIDDEN_END

#endif
