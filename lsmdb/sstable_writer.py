"""Writing SSTables: ``SSTableBuilder`` (into any binary file object), ``write_sstable``
(a complete fsynced file) and ``rewrite_filter`` (a new filter over copied data blocks).

See :mod:`lsmdb.sstable` for the layout.  The filter is built at the end from
the exact entry count, so a file whose length is not known in advance
(compaction) is sized right too.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, BinaryIO

from . import block as blk
from .bloom import FAST_HASHER, BloomFilter, Hasher
from .coding import BLOCK_TRAILER_SIZE, crc32
from .sstable_format import SSTABLE_FORMAT_VERSION, pack_footer
from .sstable_reader import SSTableReader

# Per-entry encoding overhead estimate used to cut blocks near block_size.
_ENTRY_OVERHEAD = 4


class SSTableBuilder:
    """Assembles an SSTable into a binary file object (a file or ``io.BytesIO``).

    Add entries in strictly increasing key order, then ``finish()``.  The
    filter is built at the end from the exact entry count, so it can be
    sized for an output whose length is not known in advance (compaction).
    """

    def __init__(self, out: BinaryIO, *, fp_chance: float, block_size: int,
                 table: str = "", build_filter: bool = True,
                 hasher: Hasher = FAST_HASHER) -> None:
        self._out = out
        self._hasher = hasher
        self._hash = hasher.fn
        self._fp_chance = fp_chance if build_filter else 1.0
        self._block_size = block_size
        self._table = table
        self._offset = 0
        self._keys: list[bytes] = []
        self._values: list[bytes | None] = []
        self._block_bytes = 0
        self._hashes: list[int] = []
        self._index_keys: list[bytes] = []
        self._index_offsets: list[int] = []
        self._index_sizes: list[int] = []
        self.entries = 0
        self.tombstones = 0
        self.min_key: bytes | None = None
        self.max_key: bytes | None = None
        self.min_seq: int | None = None
        self.max_seq = 0
        self._last: bytes | None = None

    def add(self, key: bytes, value: bytes | None) -> None:
        if self._last is not None and key <= self._last:
            raise ValueError("SSTable keys must be added in strictly increasing order")
        self._last = key
        if self.min_key is None:
            self.min_key = key
        self.max_key = key
        self.entries += 1
        if value is None:
            self.tombstones += 1
            self._block_bytes += len(key) + _ENTRY_OVERHEAD
        else:
            self._block_bytes += len(key) + len(value) + _ENTRY_OVERHEAD
        self._keys.append(key)
        self._values.append(value)
        if self._fp_chance < 1.0:
            self._hashes.append(self._hash(key))
        if self._block_bytes >= self._block_size:
            self._flush_block()

    def add_many(self, items: Iterable[tuple[bytes, bytes | None]],
                 max_file_bytes: int | None = None) -> bool:
        """``add`` for a sorted stream, with the per-entry work inlined.

        With ``max_file_bytes``, stops once the file has grown past it (at a
        block boundary) and returns True; the rest of ``items`` is left for
        the next file.  Returns False when ``items`` ran out.
        """
        full = False
        keys, values = self._keys, self._values
        hashes = self._hashes if self._fp_chance < 1.0 else None
        hash_fn = self._hash
        block_size = self._block_size
        block_bytes = self._block_bytes
        last = self._last
        entries = tombstones = 0
        for key, value in items:
            if last is not None and key <= last:
                raise ValueError("SSTable keys must be added in strictly increasing order")
            last = key
            entries += 1
            if value is None:
                tombstones += 1
                block_bytes += len(key) + _ENTRY_OVERHEAD
            else:
                block_bytes += len(key) + len(value) + _ENTRY_OVERHEAD
            keys.append(key)
            values.append(value)
            if hashes is not None:
                hashes.append(hash_fn(key))
            if block_bytes >= block_size:
                if self.min_key is None:
                    self.min_key = keys[0]
                self._flush_block()
                keys, values = self._keys, self._values
                block_bytes = 0
                if max_file_bytes is not None and self._offset >= max_file_bytes:
                    full = True
                    break
        if entries:
            if self.min_key is None:  # no block was cut: the first key is still pending
                self.min_key = keys[0]
            self.max_key = last
        self._last = last
        self._block_bytes = block_bytes
        self.entries += entries
        self.tombstones += tombstones
        return full

    def note_seq(self, min_seq: int | None, max_seq: int) -> None:
        """Record the WAL sequence range the entries came from (properties only)."""
        if min_seq is not None and (self.min_seq is None or min_seq < self.min_seq):
            self.min_seq = min_seq
        self.max_seq = max(self.max_seq, max_seq)

    def _write(self, data: bytes) -> tuple[int, int]:
        offset = self._offset
        self._out.write(data)
        self._offset += len(data)
        return offset, len(data) - BLOCK_TRAILER_SIZE

    def _flush_block(self) -> None:
        if not self._keys:
            return
        offset, size = self._write(blk.encode_block([self._keys, self._values]))
        self._index_keys.append(self._keys[-1])
        self._index_offsets.append(offset)
        self._index_sizes.append(size)
        self._keys = []
        self._values = []
        self._block_bytes = 0

    def build_filter(self) -> BloomFilter:
        n = self.entries
        bloom = BloomFilter(n, self._fp_chance) if n else BloomFilter(0, 1.0)
        bloom.hash_algorithm = self._hasher.algorithm
        bloom.key_id = self._hasher.key_id
        if self._fp_chance < 1.0:
            bloom.add_hashes(self._hashes)
        bloom.n = n
        return bloom

    def finish(self, bloom: BloomFilter | None = None) -> dict[str, Any]:
        """Write index, filter, properties and footer; return the properties."""
        if self.entries == 0:
            raise ValueError("an SSTable needs at least one entry")
        self._flush_block()
        index = self._write(blk.encode_block(
            [self._index_keys, self._index_offsets, self._index_sizes]))
        if bloom is None:
            bloom = self.build_filter()
        filter_payload = bloom.to_bytes()
        flt = self._write(filter_payload + crc32(filter_payload).to_bytes(4, "little"))
        props = {
            "format_version": SSTABLE_FORMAT_VERSION,
            "table": self._table,
            "entries": self.entries,
            "tombstones": self.tombstones,
            "data_blocks": len(self._index_keys),
            "data_bytes": index[0],
            "min_key": self.min_key,
            "max_key": self.max_key,
            "min_seq": self.min_seq if self.min_seq is not None else 0,
            "max_seq": self.max_seq,
            "fp_chance": bloom.fp_chance if bloom.m else 1.0,
            "filter_bits": bloom.m,
            "filter_hashes": bloom.k,
        }
        prop = self._write(blk.encode_block(props))
        self._write_raw(pack_footer(index, flt, prop))
        return props

    def _write_raw(self, data: bytes) -> None:
        self._out.write(data)
        self._offset += len(data)

    @property
    def file_size(self) -> int:
        return self._offset


def write_sstable(path: str, items: Iterable[tuple[bytes, bytes | None]], *, fp_chance: float,
                  block_size: int, table: str = "", min_seq: int | None = None,
                  max_seq: int = 0, hasher: Hasher = FAST_HASHER) -> dict[str, Any]:
    """Write a complete SSTable to ``path`` and fsync it.  Returns its properties."""
    with open(path, "wb") as f:
        builder = SSTableBuilder(f, fp_chance=fp_chance, block_size=block_size, table=table,
                                 hasher=hasher)
        builder.add_many(items)
        builder.note_seq(min_seq, max_seq)
        props = builder.finish()
        f.flush()
        os.fsync(f.fileno())
    props["size_bytes"] = builder.file_size
    return props



def rewrite_filter(reader: SSTableReader, path: str, number: int, fp_chance: float,
                   hasher: Hasher = FAST_HASHER) -> SSTableReader:
    """A copy of ``reader``'s file with a new filter built at ``fp_chance``.

    Data blocks and index are copied byte for byte (they are only decoded to
    hash the keys); the filter, properties block and footer are new.  The new
    file is fsynced before this returns.
    """
    idx_off, idx_size = reader.index_handle
    prefix_len = idx_off + idx_size + BLOCK_TRAILER_SIZE
    prefix = reader.copy_prefix(prefix_len)
    bloom = BloomFilter(reader.entries, fp_chance) if fp_chance < 1.0 else BloomFilter(0, 1.0)
    bloom.hash_algorithm = hasher.algorithm
    bloom.key_id = hasher.key_id
    hash_fn = hasher.fn
    for i in range(len(reader.index_keys)):
        keys, _values = reader.read_data_block(i, count=False)
        if bloom.m:
            bloom.add_hashes(map(hash_fn, keys))
    bloom.n = reader.entries
    props = dict(reader.properties)
    props.update(fp_chance=bloom.fp_chance if bloom.m else 1.0, filter_bits=bloom.m,
                 filter_hashes=bloom.k)
    filter_payload = bloom.to_bytes()
    filter_block = filter_payload + crc32(filter_payload).to_bytes(4, "little")
    props_block = blk.encode_block(props)
    flt_off = prefix_len
    prop_off = flt_off + len(filter_block)
    footer = pack_footer((idx_off, idx_size), (flt_off, len(filter_payload)),
                         (prop_off, len(props_block) - BLOCK_TRAILER_SIZE))
    with open(path, "wb") as f:
        f.write(prefix)
        f.write(filter_block)
        f.write(props_block)
        f.write(footer)
        f.flush()
        os.fsync(f.fileno())
    new = SSTableReader(path, number)
    new.level = reader.level
    return new
