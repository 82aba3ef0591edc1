"""Checksummed blocks, the unit an SSTable is read in, and the one rule a data block meets.

On disk a block is ``payload | crc32(payload) u32``; its *handle* in the
index or footer is (offset, payload size).  Payloads are msgpack
(docs/FORMAT.md §4.2, §4.3):

* data block, formats 2 and 3: ``[[key, ...], [value|nil, ...], [tag, ...],
  [expires, ...]]`` -- keys strictly increasing bytewise; ``nil`` is a
  tombstone; each entry's tag is ``seq << 8 | kind``, an unsigned integer
  (kind 0 a tombstone, 1 a value, 2 an expiring value; nil exactly where the
  kind is 0).  The expiries list is empty unless the block holds an expiring
  value; then it has one unsigned integer per entry: the microsecond an
  expiring value expires (lsmdb.ttl), 0 exactly where the kind is not 2.
  Only a format-3 file holds expiring values: in a format-2 file kind 2 and
  a non-empty expiries list are refused like any block the writer cannot
  write.  (The writer marks a file format 3 only when it holds one, so files
  without them stay readable by readers of format 2.)
* data block, format 1: ``[[key, ...], [value|nil, ...]]``, the first two
  lists alone (no sequence numbers, no kinds).
* index block: ``[[last_key, ...], [offset, ...], [size, ...]]`` -- one
  entry per data block, the last key it holds.

**The data block rule.**  A data block read from disk is believed only once
its checksum holds and :func:`decode_data_block` accepts it: the payload is
exactly what the writer writes -- the msgpack of the lists of its format in
their shortest encoding, keys bins strictly increasing, values bins or nil,
tags and expiries as above, no byte left over -- and its keys lie where the
index says: above the previous block's last key, the last one the index key
of this block.  Any
other checksum-valid block is a ``CorruptionError`` naming the file and the
block's offset, before any key in it answers a read.  The C twin
(lsmdb/csrc/block.c) applies the same rule in one walk of the bytes.

**The block cache's form of a data block** (an *entry*): the payload, then
the offsets of its entries, so that a lookup bisects the keys in place::

    payload[P] | key_at[n] u32 | value_at[n] u32 | n u32 | P u32   (little-endian)

``key_at[j]`` is the offset in the payload of entry j's key's bin header,
``value_at[j]`` of its value's header (bin or nil).  A block with expiring
values has its expiries after the offsets, ``expires[n] u64``, and the top
bit of the ``n`` word set (``EXPIRIES_FLAG``).  Only a block the rule
accepted becomes an entry; both read paths cache the same bytes, so the
cache's budget counts them the same.

Decoded, a block's values are what lsmdb carries everywhere (lsmdb.ttl):
bytes, None for a tombstone, and ``(value, expires)`` for an expiring value.

Worked example: the data block holding ``b"a" -> b"1"`` and a tombstone for
``b"b"`` is the msgpack ``92 92 c4 01 61 c4 01 62 92 c4 01 31 c0`` (13 bytes)
followed by its CRC-32 ``90 83 be 5d``; see docs/FORMAT.md.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections.abc import Iterable
from itertools import accumulate, islice
from operator import lt
from typing import Any

import msgpack

from .coding import crc32
from .errors import CorruptionError
from .sstable_format import (
    BLOCK_TRAILER,
    BLOCK_TRAILER_SIZE,
    KIND_BITS,
    KIND_EXPIRING,
    KIND_TOMBSTONE,
    KIND_VALUE,
    MISSING,
)
from .ttl import MAX_EXPIRES, has_expiring

KIND_MASK = (1 << KIND_BITS) - 1

_packb = msgpack.packb
_BYTES = {bytes}
_VALUE_TYPES = {bytes, type(None)}

#: A decoded data block: its keys in order, and their values (None: a
#: tombstone; (value, expires): an expiring value).
Block = tuple[list[bytes], list[Any]]
#: A decoded format-2 data block whole: keys, values, tags, expiries.
FullBlock = tuple[list[bytes], list[bytes | None], list[int], list[int]]
_INTS = {int}

#: The tail of a cached block: its entry count and its payload's size.
CACHE_ENTRY_TAIL = struct.Struct("<II")
#: The bytes of one offset of a cached block.
CACHE_ENTRY_OFFSET = struct.Struct("<I")
_U32 = CACHE_ENTRY_OFFSET.unpack_from
#: Set in a cached block's entry count when its expiries follow the offsets.
EXPIRIES_FLAG = 1 << 31
#: One expiry of a cached block.
CACHE_ENTRY_EXPIRY = struct.Struct("<Q")
_U64 = CACHE_ENTRY_EXPIRY.unpack_from


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


def encode_data_payload(keys: list[bytes], values: list[Any], tags: list[int],
                        version: int = 2) -> bytes:
    """The payload of a data block of format ``version`` (1: keys and values
    only); ``values`` as decoded ones are (expiring ones split out into the
    expiries list)."""
    if version < 2:
        return _packb([keys, values], use_bin_type=True)
    if not has_expiring(values):
        return _packb([keys, values, tags, []], use_bin_type=True)
    stored, expiries = split_expiries(values)
    return _packb([keys, stored, tags, expiries], use_bin_type=True)


def split_expiries(values: list[Any]) -> tuple[list[bytes | None], list[int]]:
    """Decoded values as a block stores them: the values, and one expiry per
    entry (0: none)."""
    stored = [v[0] if type(v) is tuple else v for v in values]
    return stored, [v[1] if type(v) is tuple else 0 for v in values]


def join_expiries(values: list[bytes | None], expiries: list[int]) -> list[Any]:
    """A block's stored values and expiries as decoded values (the list itself
    when the block has no expiries)."""
    if not expiries:
        return values
    return [v if e == 0 else (v, e) for v, e in zip(values, expiries, strict=True)]


def decode_data_block(payload: bytes | memoryview, path: str, offset: int,
                      after: bytes | None = None, last: bytes | None = None,
                      version: int = 1) -> Block:
    """The (keys, values) of a checksum-verified data block payload, if it meets
    the data block rule (see the module docstring); CorruptionError naming
    ``path`` and ``offset`` if not.  ``after``: the previous block's last key
    (None: the first block); ``last``: this block's index key (None: not
    checked, for a block read outside its file).

    >>> payload = bytes.fromhex("9292c40161c4016292c40131c0")
    >>> decode_data_block(payload, "f.sst", 0, None, b"b")
    ([b'a', b'b'], [b'1', None])
    """
    keys, values, _tags, expiries = decode_full(payload, path, offset, after, last, version)
    return keys, join_expiries(values, expiries)


def _held_keys(data: bytes, path: str, offset: int, after: bytes | None,
               last: bytes | None, version: int) -> tuple[list[bytes], int]:
    """A data block payload's keys array read alone under the rule
    (``keys_among``): the keys, and where their array ends."""
    if not data or data[0] != (0x94 if version >= 2 else 0x92):
        raise CorruptionError("data block has the wrong shape", path, offset)
    unpacker = msgpack.Unpacker(raw=False, use_list=True, max_buffer_size=max(len(data), 1))
    unpacker.feed(data)
    try:
        unpacker.read_array_header()
        count = unpacker.read_array_header()
        keys = [unpacker.unpack() for _ in range(count)]
    except Exception as exc:  # msgpack raises several unrelated types
        raise CorruptionError(f"data block undecodable ({type(exc).__name__})", path,
                              offset) from None
    if not 1 <= count <= len(data) // 3 or not set(map(type, keys)) <= _BYTES:
        raise CorruptionError("data block has the wrong shape", path, offset)
    end = unpacker.tell()
    if _packb(keys, use_bin_type=True) != data[1:end]:
        raise CorruptionError("data block not in the writer's encoding", path, offset)
    if not all(map(lt, keys, islice(keys, 1, None))):
        raise CorruptionError("data block keys out of order", path, offset)
    if (after is not None and keys[0] <= after) or (last is not None and keys[-1] != last):
        raise CorruptionError("data block does not match its index entry", path, offset)
    return keys, end


def keys_among(payload: bytes | memoryview, wanted: Iterable[bytes], path: str, offset: int,
               after: bytes | None = None, last: bytes | None = None,
               version: int = 2) -> bool:
    """Whether any of ``wanted`` is among the keys of a checksum-verified data
    block payload, its keys array read alone under the parts of the data
    block rule that concern it: the outer array's header of its format, the
    keys' count (at least 1, at most a third of the payload's bytes), each key
    a bin in its shortest header, strictly increasing, the first above
    ``after``, the last ``last`` (``decode_full``'s bounds).  CorruptionError
    if they break it.  A key not among keys that hold is absent from the
    block whatever its other arrays hold (docs/FORMAT.md §4.2): a get's read
    that finds none of its keys there stops here.  The C twin,
    ``block_keys_hold`` (lsmdb/csrc/block.c), reads the keys out of the
    first bytes of the payload alone.

    >>> payload = bytes.fromhex("9292c40161c4016292c40131c0")
    >>> keys_among(payload, [b"a"], "f.sst", 0, None, b"b", version=1)
    True
    >>> keys_among(payload, [b"ab"], "f.sst", 0, None, b"b", version=1)
    False
    """
    held = set(_held_keys(bytes(payload), path, offset, after, last, version)[0])
    return any(key in held for key in wanted)


def values_among(payload: bytes | memoryview, wanted: Iterable[bytes], path: str, offset: int,
                 after: bytes | None = None, last: bytes | None = None) -> dict[bytes, Any]:
    """The values (None: a tombstone) of those of ``wanted`` that a
    checksum-verified format-2 data block holds, read no further than the
    last of them: the keys array as ``keys_among`` reads it, then the values
    array's header (the shortest, for as many entries as keys) and each value
    up to that one (bin in its shortest header, or nil).  CorruptionError if
    they break the rule.  In format 2 an entry's kind follows from its value
    (a tombstone exactly where it is nil; no expiring values), so these are
    the answers a whole read gives (docs/FORMAT.md §4.2).  The C twin,
    ``block_value_at`` (lsmdb/csrc/block.c), reads them out of the first
    bytes of the payload alone.

    >>> payload = bytes.fromhex("9492c40161c4016292c40131c092010090")
    >>> values_among(payload, [b"a", b"b", b"c"], "f.sst", 0, None, b"b")
    {b'a': b'1', b'b': None}
    """
    data = bytes(payload)
    keys, end = _held_keys(data, path, offset, after, last, 2)
    place = {key: n for n, key in enumerate(keys)}
    found = {key: place[key] for key in wanted if key in place}
    if not found:
        return {}
    upto = max(found.values()) + 1
    unpacker = msgpack.Unpacker(raw=False, use_list=True, max_buffer_size=max(len(data), 1))
    unpacker.feed(data[end:])
    try:
        count = unpacker.read_array_header()
        values = [unpacker.unpack() for _ in range(upto)]
    except Exception as exc:  # msgpack raises several unrelated types
        raise CorruptionError(f"data block undecodable ({type(exc).__name__})", path,
                              offset) from None
    if count != len(keys) or not set(map(type, values)) <= _VALUE_TYPES:
        raise CorruptionError("data block has the wrong shape", path, offset)
    head = _packb([None] * count)[:-count]  # the shortest array header for count
    if head + b"".join(_packb(v, use_bin_type=True) for v in values) \
            != data[end:end + unpacker.tell()]:
        raise CorruptionError("data block not in the writer's encoding", path, offset)
    return {key: values[n] for key, n in found.items()}


def keys_piece(piece: bytes, path: str, offset: int, after: bytes | None = None,
               last: bytes | None = None) -> list[bytes]:
    """The keys of a type-3 block (lsmdb.compression) from its first piece,
    read as ``keys_among`` reads them; the piece must end where the keys
    array does.  CorruptionError if either breaks."""
    keys, end = _held_keys(piece, path, offset, after, last, 2)
    if end != len(piece):
        raise CorruptionError("data block piece does not end with its keys", path, offset)
    return keys


def piece_values(piece: bytes, header: bool, last: bool, count: int, held: int, path: str,
                 offset: int) -> list[bytes | None]:
    """The ``held`` values a piece of a type-3 block of ``count`` entries holds,
    read under the rule (bin in its shortest header, or nil): the piece begins
    with the values array's header (``header``, the second piece, for
    ``count`` entries) or with a value, and ends where its values end -- or,
    the ``last`` piece, goes on with the tags array's header for ``count``
    entries.  CorruptionError where the piece is not what its table says."""
    unpacker = msgpack.Unpacker(raw=False, use_list=True, max_buffer_size=max(len(piece), 1))
    unpacker.feed(piece)
    try:
        if header and unpacker.read_array_header() != count:
            raise ValueError("values array of another length")
        start = unpacker.tell()
        values = [unpacker.unpack() for _ in range(held)]
        end = unpacker.tell()
        if not set(map(type, values)) <= _VALUE_TYPES:
            raise ValueError("not a value")
        if b"".join(_packb(v, use_bin_type=True) for v in values) != piece[start:end]:
            raise ValueError("not the writer's encoding")
        if (_array_at(piece, end)[0] != count) if last else end != len(piece):
            raise ValueError("the piece holds other than its values")
    except Exception as exc:  # msgpack raises several unrelated types
        raise CorruptionError(f"data block piece undecodable ({exc})", path, offset) from None
    return values


def decode_full(payload: bytes | memoryview, path: str, offset: int,
                after: bytes | None = None, last: bytes | None = None,
                version: int = 2) -> FullBlock:
    """``decode_data_block`` with every list as stored: (keys, values, tags,
    expiries).  A format-1 block has no tags and no expiries ([] and [])."""
    obj = unpack(payload, path, offset, "data block")
    lists = 4 if version >= 2 else 2
    if (type(obj) is not list or len(obj) != lists or not all(type(x) is list for x in obj)
            or len(obj[0]) != len(obj[1])):
        raise CorruptionError("data block has the wrong shape", path, offset)
    keys, values = obj[0], obj[1]
    tags: list[int] = obj[2] if version >= 2 else []
    expiries: list[int] = obj[3] if version >= 2 else []
    # (set(map(type, ...)) runs in C: a few hundred ns per block.)
    if not set(map(type, keys)) <= _BYTES or not set(map(type, values)) <= _VALUE_TYPES:
        raise CorruptionError("data block entry of the wrong type", path, offset)
    # msgpack writes the shortest header for every length: any other encoding
    # of the same lists is longer, and no writer of lsmdb's made it.
    if _packb(obj, use_bin_type=True) != payload:
        raise CorruptionError("data block not in the writer's encoding", path, offset)
    if not keys:
        raise CorruptionError("data block holds no entry", path, offset)
    if not all(map(lt, keys, islice(keys, 1, None))):
        raise CorruptionError("data block keys out of order", path, offset)
    if (after is not None and keys[0] <= after) or (last is not None and keys[-1] != last):
        raise CorruptionError("data block does not match its index entry", path, offset)
    if version >= 2:
        _check_tags(values, tags, expiries, path, offset, version)
    return keys, values, tags, expiries


def _check_tags(values: list[bytes | None], tags: list[Any], expiries: list[Any], path: str,
                offset: int, version: int) -> None:
    """CorruptionError unless tags and expiries meet the rule (module docstring).
    (Their encoding, the shortest, was checked with the whole payload's.)"""
    if len(tags) != len(values) or not set(map(type, tags)) <= _INTS or min(tags) < 0:
        raise CorruptionError("data block tags of the wrong shape", path, offset)
    kinds = [t & KIND_MASK for t in tags]
    top = max(kinds)
    if top > (KIND_EXPIRING if version >= 3 else KIND_VALUE):
        raise CorruptionError(f"data block entry of a kind format {version} does not hold",
                              path, offset)
    if any((k == KIND_TOMBSTONE) != (v is None) for k, v in zip(kinds, values, strict=True)):
        raise CorruptionError("data block kinds do not match its values", path, offset)
    if (top == KIND_EXPIRING) != bool(expiries):
        raise CorruptionError("data block expiries do not match its kinds", path, offset)
    if expiries:
        if len(expiries) != len(values) or not set(map(type, expiries)) <= _INTS or \
                min(expiries) < 0 or max(expiries) > MAX_EXPIRES or \
                any((k == KIND_EXPIRING) != (e != 0)
                    for k, e in zip(kinds, expiries, strict=True)):
            raise CorruptionError("data block expiries do not match its kinds", path, offset)


def tags_for(values: list[Any], seq: int) -> list[int]:
    """The tags of entries written at ``seq`` (decoded values: tuples expire)."""
    value_tag = seq << KIND_BITS | KIND_VALUE
    tomb_tag = seq << KIND_BITS | KIND_TOMBSTONE
    if has_expiring(values):
        exp_tag = seq << KIND_BITS | KIND_EXPIRING
        return [tomb_tag if v is None else exp_tag if type(v) is tuple else value_tag
                for v in values]
    return [tomb_tag if v is None else value_tag for v in values]


def _header_sizes(lengths: Iterable[int]) -> list[int]:
    """The shortest msgpack bin header of each length (bin 8, 16 or 32)."""
    return [2 if n < 256 else 3 if n < 65536 else 5 for n in lengths]


def _array_header_size(count: int) -> int:
    return 1 if count < 16 else 3 if count < 65536 else 5


def _array_at(data: bytes, at: int) -> tuple[int, int]:
    """The count of the msgpack array header at ``data[at]`` and where its
    items begin; ValueError if none is there."""
    b = data[at]
    if 0x90 <= b <= 0x9F:
        return b & 0x0F, at + 1
    if b == 0xDC:
        return int.from_bytes(data[at + 1:at + 3], "big"), at + 3
    if b == 0xDD:
        return int.from_bytes(data[at + 1:at + 5], "big"), at + 5
    raise ValueError("no array header")


def _skip_item(data: bytes, at: int) -> int:
    """Where the bin or nil at ``data[at]`` ends; ValueError for anything else."""
    b = data[at]
    if b == 0xC0:
        return at + 1
    width = {0xC4: 1, 0xC5: 2, 0xC6: 4}.get(b)
    if width is None:
        raise ValueError("neither bin nor nil")
    return at + 1 + width + int.from_bytes(data[at + 1:at + 1 + width], "big")


def payload_value_starts(payload: bytes) -> tuple[int, list[int]]:
    """Where a format-2 payload's keys array ends (its values array's header
    begins there) and where each value's header begins, read off its bytes.
    ValueError (or IndexError) where the bytes are not such arrays."""
    count, at = _array_at(payload, 1)
    for _ in range(count):
        at = _skip_item(payload, at)
    keys_end = at
    vcount, at = _array_at(payload, at)
    if vcount != count or payload[0] != 0x94:
        raise ValueError("not a format-2 payload")
    starts = []
    for _ in range(count):
        starts.append(at)
        at = _skip_item(payload, at)
    return keys_end, starts


def cache_entry(payload: bytes | memoryview, block: Block) -> bytes:
    """The cached form of a data block (see the module docstring) from its
    payload and what :func:`decode_data_block` made of it: the offsets follow
    from the lengths, every header being the shortest.  O(n)."""
    keys, values = block
    n = len(keys)
    key_lens = list(map(len, keys))
    expiries: list[int] = []
    if has_expiring(values):
        values, expiries = split_expiries(values)
    value_lens = [0 if v is None else len(v) for v in values]
    value_heads = [1 if v is None else h
                   for v, h in zip(values, _header_sizes(value_lens), strict=True)]
    start = 1 + _array_header_size(n)   # the outer fixarray (of 2 or 4), the keys' array
    key_at = list(accumulate((h + k for h, k in zip(_header_sizes(key_lens), key_lens,
                                                     strict=True)), initial=start))
    values_start = key_at[-1] + _array_header_size(n)
    value_at = list(accumulate((h + (0 if v is None else k) for h, k, v in
                                zip(value_heads, value_lens, values, strict=True)),
                               initial=values_start))
    offsets = struct.pack(f"<{2 * n}I", *key_at[:-1], *value_at[:-1])
    tail = CACHE_ENTRY_TAIL.pack(n | (EXPIRIES_FLAG if expiries else 0), len(payload))
    if not expiries:
        return b"".join((bytes(payload), offsets, tail))
    return b"".join((bytes(payload), offsets, struct.pack(f"<{n}Q", *expiries), tail))


def _entry_tail(entry: bytes) -> tuple[int, int, bool]:
    """(entry count, payload size, whether expiries follow) of a cached block."""
    word, plen = CACHE_ENTRY_TAIL.unpack_from(entry, len(entry) - CACHE_ENTRY_TAIL.size)
    return word & ~EXPIRIES_FLAG, plen, bool(word & EXPIRIES_FLAG)


def _bin_at(entry: bytes, at: int) -> tuple[int, int]:
    """(start, length) of the bin whose header is at ``at`` (bin 8, 16 or 32)."""
    marker = entry[at]
    if marker == 0xC4:
        return at + 2, entry[at + 1]
    if marker == 0xC5:
        return at + 3, int.from_bytes(entry[at + 1:at + 3], "big")
    return at + 5, int.from_bytes(entry[at + 1:at + 5], "big")


def entry_find(entry: bytes, key: bytes) -> Any:
    """``key``'s value in a cached block: the value, None for a tombstone,
    (value, expires) for an expiring value, or MISSING.  Bisects the keys
    through their offsets.  O(log n)."""
    count, plen, with_expiries = _entry_tail(entry)
    lo, hi = 0, count
    while lo < hi:
        mid = (lo + hi) // 2
        start, length = _bin_at(entry, _U32(entry, plen + 4 * mid)[0])
        if entry[start:start + length] < key:
            lo = mid + 1
        else:
            hi = mid
    if lo == count:
        return MISSING
    start, length = _bin_at(entry, _U32(entry, plen + 4 * lo)[0])
    if entry[start:start + length] != key:
        return MISSING
    at = _U32(entry, plen + 4 * (count + lo))[0]
    if entry[at] == 0xC0:
        return None
    start, length = _bin_at(entry, at)
    value = entry[start:start + length]
    if with_expiries:
        expires = _U64(entry, plen + 8 * count + 8 * lo)[0]
        if expires:
            return value, expires
    return value


def entry_lists(entry: bytes) -> Block:
    """The (keys, values) of a cached block."""
    keys, values, _tags = entry_tagged(entry)
    return keys, values


def entry_tagged(entry: bytes) -> tuple[list[bytes], list[Any], list[int]]:
    """The (keys, values, tags) of a cached block of format 2 or 3 (tags [] in
    format 1's), its payload decoded once."""
    _count, plen, _expiring = _entry_tail(entry)
    lists = msgpack.unpackb(memoryview(entry)[:plen], raw=False, use_list=True)
    if len(lists) < 4:
        return lists[0], lists[1], []
    return lists[0], join_expiries(lists[1], lists[3]), lists[2]


def find_in_block(block: Block, key: bytes) -> Any:
    """``key``'s value in decoded (keys, values): the value, None, or MISSING.  O(log n)."""
    keys, values = block
    j = bisect_left(keys, key)
    return values[j] if j < len(keys) and keys[j] == key else MISSING
