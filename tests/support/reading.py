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


def stored_block(reader: SSTableReader, payload: bytes) -> bytes:
    """A data block of ``reader``'s file as stored: ``payload`` and its trailer
    (format 2: uncompressed, type 0; format 1: the crc alone), its checksum right."""
    from lsmdb.coding import crc32
    if reader.version < 2:
        return payload + crc32(payload).to_bytes(4, "little")
    return payload + b"\x00" + crc32(b"\x00", crc32(payload)).to_bytes(4, "little")


def data_payload(reader: SSTableReader, keys: list[bytes], values: list[bytes | None],
                 tags: list[int] | None = None) -> bytes:
    """The msgpack payload of a data block of ``reader``'s format holding these
    entries (format 2: tagged with the file's max_seq unless ``tags``)."""
    from lsmdb import block as blk
    if tags is None:
        tags = blk.tags_for(values, reader.max_seq)
    return blk.encode_data_payload(keys, values, tags, reader.version)
