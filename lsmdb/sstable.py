"""SSTable files: immutable sorted runs with an embedded Bloom filter.

Layout (docs/FORMAT.md, "SSTable")::

    [data block 0][crc] ... [data block n-1][crc]
    [index block][crc]
    [filter block][crc]
    [properties block][crc]
    [footer: 64 bytes]

Footer: index (offset u64, size u64), filter (offset u64, size u64),
properties (offset u64, size u64), format_version u32, crc32 u32 of the
preceding 52 bytes, magic ``b"LSMDBSST"``.  Sizes exclude the 4-byte trailer.

The filter covers every key in the file, tombstones included: a tombstone the
filter skipped would let an older value in an older file resurface.

The writer lives in :mod:`lsmdb.sstable_writer`, the reader in
:mod:`lsmdb.sstable_reader`, the shared constants in
:mod:`lsmdb.sstable_format`; this module gathers them.
"""

from __future__ import annotations

from .sstable_format import (
                             FOOTER,
                             FOOTER_CRC_SPAN,
                             FOOTER_SIZE,
                             MISSING,
                             SSTABLE_FORMAT_VERSION,
                             SSTABLE_MAGIC,
                             pack_footer,
)
from .sstable_reader import SSTableReader
from .sstable_writer import SSTableBuilder, rewrite_filter, write_sstable

__all__ = ["FOOTER", "FOOTER_CRC_SPAN", "FOOTER_SIZE", "MISSING", "SSTABLE_FORMAT_VERSION",
           "SSTABLE_MAGIC", "SSTableBuilder", "SSTableReader", "pack_footer", "rewrite_filter",
           "write_sstable"]
