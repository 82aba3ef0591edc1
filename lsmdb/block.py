"""Checksummed blocks: the unit an SSTable is read in.

On disk a block is ``payload | crc32(payload) u32``; its *handle* in the
index or footer is (offset, payload size).  Payloads are msgpack:

* data block: ``[[key, ...], [value|nil, ...]]`` -- keys strictly
  increasing bytewise; ``nil`` is a tombstone.
* index block: ``[[last_key, ...], [offset, ...], [size, ...]]`` -- one
  entry per data block, the last key it holds.

Worked example: the data block holding ``b"a" -> b"1"`` and a tombstone for
``b"b"`` is the msgpack ``92 92 c4 01 61 c4 01 62 92 c4 01 31 c0`` (13 bytes)
followed by its CRC-32 ``90 83 be 5d``; see docs/FORMAT.md.
"""

from __future__ import annotations

from typing import Any

import msgpack

from .coding import BLOCK_TRAILER, BLOCK_TRAILER_SIZE, crc32
from .errors import CorruptionError

_packb = msgpack.packb
_BYTES = {bytes}
_VALUE_TYPES = {bytes, type(None)}


def encode_block(payload_obj: Any) -> bytes:
    """msgpack payload followed by its trailer."""
    payload = _packb(payload_obj, use_bin_type=True)
    return payload + BLOCK_TRAILER.pack(crc32(payload))


def check_block(raw: bytes, path: str, offset: int, what: str) -> bytes:
    """Verify the trailer of ``raw`` (payload + trailer); return the payload."""
    if len(raw) < BLOCK_TRAILER_SIZE:
        raise CorruptionError(f"{what} truncated", path, offset)
    payload = raw[:-BLOCK_TRAILER_SIZE]
    (crc,) = BLOCK_TRAILER.unpack_from(raw, len(raw) - BLOCK_TRAILER_SIZE)
    if crc32(payload) != crc:
        raise CorruptionError(f"{what} checksum mismatch", path, offset)
    return payload


def unpack(payload: bytes | memoryview, path: str, offset: int, what: str) -> Any:
    try:
        return msgpack.unpackb(payload, raw=False, use_list=True, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise CorruptionError(f"{what} undecodable ({type(exc).__name__})", path, offset) from None


def decode_data_block(payload: bytes | memoryview, path: str,
                      offset: int) -> tuple[list[bytes], list[bytes | None]]:
    obj = unpack(payload, path, offset, "data block")
    if (type(obj) is not list or len(obj) != 2 or type(obj[0]) is not list
            or type(obj[1]) is not list or len(obj[0]) != len(obj[1])):
        raise CorruptionError("data block has the wrong shape", path, offset)
    keys, values = obj
    # A block that passed its checksum can still have been written wrongly;
    # a non-bytes key or value must never reach a caller.
    # (set(map(type, ...)) runs in C: a few hundred ns per block.)
    if not set(map(type, keys)) <= _BYTES or not set(map(type, values)) <= _VALUE_TYPES:
        raise CorruptionError("data block entry of the wrong type", path, offset)
    return keys, values


def validate_data_block(keys: list[Any], values: list[Any], path: str, offset: int) -> None:
    """Full structural check (types and order) -- used by verify, not per read."""
    prev = None
    for key, value in zip(keys, values, strict=True):
        if type(key) is not bytes or (value is not None and type(value) is not bytes):
            raise CorruptionError("data block entry of the wrong type", path, offset)
        if prev is not None and key <= prev:
            raise CorruptionError("data block keys out of order", path, offset)
        prev = key
