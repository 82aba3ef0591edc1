"""The SSTable layout and the constants its writer and reader share (docs/FORMAT.md §4).

Layout::

    [data block 0][crc] ... [data block n-1][crc]
    [index block][crc]
    [filter block][crc]
    [properties block][crc]
    [footer: 64 bytes]

Footer (the last 64 bytes): index (offset u64, size u64), filter (offset u64,
size u64), properties (offset u64, size u64), format_version u32, crc32 u32 of
the preceding 52 bytes, magic ``b"LSMDBSST"``.  Sizes exclude the 4-byte
block trailer.

The filter covers every key in the file, tombstones included: a tombstone the
filter skipped would let an older value in an older file resurface.  The
writer is :mod:`lsmdb.sstable_writer`, the reader :mod:`lsmdb.sstable_reader`.
"""

from __future__ import annotations

import struct

from .coding import crc32

SSTABLE_FORMAT_VERSION = 1  # DO NOT CHANGE: on disk.

# Block trailer: crc32 (u32) of the block payload.  DO NOT CHANGE: on disk.
BLOCK_TRAILER = struct.Struct("<I")
BLOCK_TRAILER_SIZE = BLOCK_TRAILER.size
assert BLOCK_TRAILER_SIZE == 4
#: crc32(payload + crc32(payload) as 4 little-endian bytes) for every payload:
#: checking a block's payload and trailer in one pass, without slicing them apart.
CRC32_RESIDUE = 0x2144DF1C
assert crc32(b"x" + BLOCK_TRAILER.pack(crc32(b"x"))) == CRC32_RESIDUE
SSTABLE_MAGIC = b"LSMDBSST"  # DO NOT CHANGE: on disk.
FOOTER = struct.Struct("<QQQQQQII8s")
FOOTER_SIZE = FOOTER.size
assert FOOTER_SIZE == 64
FOOTER_CRC_SPAN = FOOTER_SIZE - 12  # bytes covered by the footer checksum
_FOOTER_HEAD = struct.Struct("<QQQQQQI")
assert _FOOTER_HEAD.size == FOOTER_CRC_SPAN

MISSING = object()  # "not in this file" (distinct from a tombstone, None)


def pack_footer(index: tuple[int, int], filter_: tuple[int, int],
                props: tuple[int, int]) -> bytes:
    """The 64-byte footer for the three (offset, size) handles."""
    head = _FOOTER_HEAD.pack(*index, *filter_, *props, SSTABLE_FORMAT_VERSION)
    return head + crc32(head).to_bytes(4, "little") + SSTABLE_MAGIC
