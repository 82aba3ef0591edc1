"""The SSTable layout and the constants its writer and reader share (docs/FORMAT.md §4).

Layout::

    [data block 0][trailer] ... [data block n-1][trailer]
    [index block][crc]
    [filter block][crc]
    [properties block][crc]
    [footer: 64 bytes]

Footer (the last 64 bytes): index (offset u64, size u64), filter (offset u64,
size u64), properties (offset u64, size u64), format_version u32, crc32 u32 of
the preceding 52 bytes, magic ``b"LSMDBSST"``.  Sizes exclude the block
trailer.

Format 2 (what lsmdb writes) ends each data block in a 5-byte trailer: the
block's compression type (u8: :mod:`lsmdb.compression`), then the crc32 of
the stored bytes and that type byte; its payload holds a sequence number and
a kind for every entry (:mod:`lsmdb.block`).  Format 3 is format 2 with
expiring values in it (kind 2 and the expiries list): the writer marks a
file 3 only when it holds one.  Format 1 (still read) ends
every block, data blocks too, in the 4-byte crc32 alone.  Index, filter and
properties blocks are never compressed and end in the 4-byte crc32 in both.

The filter covers every key in the file, tombstones included: a tombstone the
filter skipped would let an older value in an older file resurface.  The
writer is :mod:`lsmdb.sstable_writer`, the reader :mod:`lsmdb.sstable_reader`.
"""

from __future__ import annotations

import struct

from .coding import crc32

SSTABLE_FORMAT_VERSION = 2  # the version lsmdb writes
#: The versions lsmdb reads; a file of any other raises UnsupportedFormatError.
READABLE_VERSIONS = (1, 2, 3, 4, 5)
#: The version of a file that holds expiring values (format 2's layout, with
#: kind 2 and the expiries list in use); the writer marks a file so only then.
SSTABLE_FORMAT_EXPIRING = 3
#: What a file whose LZ4 blocks are stored in pieces against its dictionary
#: adds to its version (lsmdb.compression): format 4 is format 2's layout
#: with them, format 5 format 3's, so that readers of formats 2 and 3 refuse
#: such a file as a newer format rather than read its blocks as corrupt.
SSTABLE_FORMAT_DICTIONARY = 2


def layout_of(version: int) -> int:
    """The layout of a file of ``version`` as its blocks and entries have it:
    1, 2 or 3 (a file with a dictionary has its blocks as format 2 or 3 has)."""
    return version - SSTABLE_FORMAT_DICTIONARY if version > SSTABLE_FORMAT_EXPIRING else version

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
#: A format-2 data block's trailer: the compression type (u8), then crc32 (u32)
#: of the stored bytes and the type byte.  DO NOT CHANGE: on disk.
DATA_TRAILER_V2 = struct.Struct("<BI")
DATA_TRAILER_V2_SIZE = DATA_TRAILER_V2.size
assert DATA_TRAILER_V2_SIZE == 5


def data_trailer_size(version: int) -> int:
    """The bytes after a data block's stored payload in a file of ``version``."""
    return DATA_TRAILER_V2_SIZE if version >= 2 else BLOCK_TRAILER_SIZE


#: A format-2 entry's tag: ``seq << KIND_BITS | kind``.  DO NOT CHANGE: on disk.
KIND_BITS = 8
KIND_TOMBSTONE = 0
KIND_VALUE = 1
KIND_EXPIRING = 2
#: The largest sequence number a tag holds (and the MANIFEST may name).
MAX_SEQ = (1 << (64 - KIND_BITS)) - 1
assert _FOOTER_HEAD.size == FOOTER_CRC_SPAN

MISSING = object()  # "not in this file" (distinct from a tombstone, None)


def pack_footer(index: tuple[int, int], filter_: tuple[int, int],
                props: tuple[int, int], version: int = SSTABLE_FORMAT_VERSION) -> bytes:
    """The 64-byte footer for the three (offset, size) handles."""
    head = _FOOTER_HEAD.pack(*index, *filter_, *props, version)
    return head + crc32(head).to_bytes(4, "little") + SSTABLE_MAGIC
