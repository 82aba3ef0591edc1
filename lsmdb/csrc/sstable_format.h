/* sstable_format.h: the SSTable byte constants the C read path uses.  Python
 * twin: lsmdb/sstable_format.py, where each is defined; module.c exports
 * these (CONSTANTS) and lsmdb compares them with its own at import, refusing
 * the C read path on a mismatch. */

#ifndef LSMDB_SSTABLE_FORMAT_H
#define LSMDB_SSTABLE_FORMAT_H

/* Every block ends in crc32(payload), u32 little-endian.  DO NOT CHANGE: on disk. */
#define BLOCK_TRAILER_SIZE 4

/* A format-2 data block ends in its compression type (u8: 0 none, 1 lz4, 2
 * zstd, 3 lz4 in pieces against the file's dictionary), then crc32 of the stored bytes and that type byte.  DO NOT CHANGE:
 * on disk. */
#define DATA_TRAILER_V2_SIZE 5
#define COMPRESSION_NONE 0
#define COMPRESSION_LZ4 1
#define COMPRESSION_LZ4_PIECES 3

/* crc32(payload + its crc32, little-endian) for every payload: a block's
 * payload and trailer checked in one pass. */
#define CRC32_RESIDUE 0x2144DF1Cu

#endif
