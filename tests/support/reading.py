"""Reading one SSTable in a test, outside a database: a key's value through the file's
block access, and its entries in order."""

from __future__ import annotations

from typing import Any

from lsmdb.readpath import entry_find
from lsmdb.scan import items as scan_items
from lsmdb.sstable_format import MISSING
from lsmdb.sstable_reader import SSTableReader


def find(reader: SSTableReader, key: bytes) -> Any:
    """``key``'s value in ``reader``'s file (None: a tombstone), or MISSING: the
    one block that can hold it, read and checked (nothing counted, nothing
    cached)."""
    i = reader.block_for(key)
    if i == len(reader.index_keys):
        return MISSING
    return entry_find(reader.read_entry(i), key)


def items(reader: SSTableReader, start: bytes | None = None, end: bytes | None = None,
          reverse: bool = False) -> list[tuple[bytes, bytes | None]]:
    """Every (key, value|None) of ``reader``'s file with start <= key < end."""
    return list(scan_items(reader, start, end, reverse))
