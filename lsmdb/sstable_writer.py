"""Writing SSTables: ``SSTableBuilder`` (into any binary file object), ``write_sstable``
(a complete fsynced file) and ``rewrite_filter`` (a new filter over copied data blocks).

See :mod:`lsmdb.sstable_format` for the layout.  The filter is built at the end from
the exact entry count, so a file whose length is not known in advance
(compaction) is sized right too.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate, islice, repeat
from operator import add, itemgetter, lt
from typing import Any, Protocol

from . import block as blk
from . import compression as _compression
from .coding import crc32
from .files import FileWriter
from .filters import DEFAULT_FAMILY, Filter, FilterSpec, build
from .filters.hashing import FAST_HASHER, Hasher
from .sstable_format import (
    BLOCK_TRAILER_SIZE,
    DATA_TRAILER_V2,
    DATA_TRAILER_V2_SIZE,
    KIND_BITS,
    KIND_EXPIRING,
    KIND_TOMBSTONE,
    MAX_SEQ,
    SSTABLE_FORMAT_DICTIONARY,
    SSTABLE_FORMAT_EXPIRING,
    SSTABLE_FORMAT_VERSION,
    pack_footer,
)
from .sstable_reader import SSTableReader
from .ttl import has_expiring, payload_len

try:  # optional C speedups: block_cuts' and memtable_section's twins
    # (csrc/sstable_writer.c), and a data block's payload written (csrc/block.c,
    # block.encode_data_payload's twin)
    from ._speedups import block_cuts as _c_block_cuts
    from ._speedups import data_payload as _c_data_payload
    from ._speedups import memtable_section as _c_memtable_section
except ImportError:  # pragma: no cover - no C compiler when installed
    _c_block_cuts = _c_data_payload = _c_memtable_section = None  # type: ignore[assignment]

#: Whether builders made from now on cut and encode blocks in C (tests switch
#: it off to compare the two).
USE_SPEEDUPS = _c_block_cuts is not None


class Sink(Protocol):
    """Where a builder writes its bytes: a FileWriter, a file, an ``io.BytesIO``."""

    def write(self, data: bytes, /) -> object: ...


# Per-entry encoding overhead estimate used to cut blocks near block_size.
_ENTRY_OVERHEAD = 4
CHUNK_ENTRIES = 4096  # entries of a sorted stream handed to add_chunk at a time
_first = itemgetter(0)
_second = itemgetter(1)


_third = itemgetter(2)


def data_trailer(kind: int, stored: bytes) -> bytes:
    """A format-2 data block's trailer: its type byte, then the CRC-32 of its
    stored bytes and that byte."""
    return DATA_TRAILER_V2.pack(kind, crc32(kind.to_bytes(1, "little"), crc32(stored)))


def block_cuts(keys: list[bytes], values: list[Any], need: int, block_size: int
               ) -> tuple[list[int], list[int], int]:
    """Where a chunk of sorted entries is cut into data blocks: a block ends
    once its estimated size -- each entry's key and value bytes (an expiring
    value's bytes) plus _ENTRY_OVERHEAD -- reaches ``block_size``, the first
    after ``need`` more bytes (what completes the block pending before the
    chunk).  Returns (cuts, bases, total): each block ends before entry
    ``cuts[i]``, ``bases[i]`` the estimate of the chunk's entries up to there,
    ``total`` that of the whole chunk.  ValueError unless the keys are strictly
    increasing.

    >>> block_cuts([b"a", b"b", b"c"], [b"1", b"2", None], 7, 12)
    ([2], [12], 17)
    """
    n = len(keys)
    if n != len(values):
        raise ValueError("block_cuts: keys and values differ in length")
    if n > 1 and not all(map(lt, keys, islice(keys, 1, None))):
        raise ValueError("SSTable keys must be added in strictly increasing order")
    if has_expiring(values):
        value_lens: Iterable[int] = list(map(payload_len, values))
    else:
        try:
            value_lens = list(map(len, values))
        except TypeError:  # tombstones
            value_lens = [0 if v is None else len(v) for v in values]
    # cum[j]: the estimate of the first j entries; a cut is the first j past
    # the last cut whose estimate reaches it (a bisect per block, not per entry)
    cum = list(accumulate(map(add, map(add, map(len, keys), value_lens),
                              repeat(_ENTRY_OVERHEAD, n)), initial=0))
    cuts: list[int] = []
    bases: list[int] = []
    done = base = 0
    while True:
        cut = bisect_left(cum, base + need, done + 1)
        if cut > n:
            return cuts, bases, cum[n]
        cuts.append(cut)
        bases.append(cum[cut])
        done, base, need = cut, cum[cut], block_size


#: What :func:`memtable_section` returns: the size of the data section it
#: wrote (every data block with its trailer, back to back, from offset 0),
#: the index (each block's last key, offset and stored size), the keys' filter
#: hashes in key order (an ``array("Q")``; None unless asked for), the counts of tombstones and
#: expiring values, the payloads' total size, and the smallest key.
Section = tuple[int, list[bytes], list[int], list[int], "array[int] | None", int, int, int,
                bytes]


def memtable_section(data: dict[bytes, Any], tags: dict[bytes, int], block_size: int,
                     kind: int, compress: Callable[[bytes], bytes] | None,
                     want_hashes: bool, sink: Callable[[bytes], object]) -> Section:
    """A frozen memtable's entries (``data``, its values; ``tags``, its tags)
    written to ``sink`` as the data blocks of a new SSTable: sorted, cut
    where :func:`block_cuts` cuts a chunk added to an empty builder, each
    block's payload (lsmdb.block.encode_data_payload) stored as
    ``compress(payload)`` (type ``kind``) where that saves at least an
    eighth, else as it is (type 0), then its trailer.  ``want_hashes``: the
    keys' xxh3_64 (the fast hasher's) too.  The same bytes
    :class:`SSTableBuilder`'s ``add_chunk`` writes.

    The C twin (csrc/sstable_writer.c) sorts, cuts and encodes without the
    GIL, a run of blocks (about 4 MiB) at a time, so writers run while a
    flush works; for ``kind`` LZ4 it compresses there too, with the lz4
    package's own library (``compress`` is then not called)."""
    if not data:
        raise ValueError("an SSTable needs at least one entry")
    keys = sorted(data)
    values = list(map(data.__getitem__, keys))
    tag_list = list(map(tags.__getitem__, keys))
    cuts, _bases, _total = block_cuts(keys, values, block_size, block_size)
    if not cuts or cuts[-1] != len(keys):
        cuts.append(len(keys))
    index_offsets: list[int] = []
    index_sizes: list[int] = []
    offset = uncompressed = 0
    lo = 0
    for hi in cuts:
        payload = blk.encode_data_payload(keys[lo:hi], values[lo:hi], tag_list[lo:hi])
        uncompressed += len(payload)
        type_, stored = (_compression.NONE, payload) if compress is None else \
            _compression.kept(kind, payload, compress(payload))
        sink(stored + data_trailer(type_, stored))
        index_offsets.append(offset)
        index_sizes.append(len(stored))
        offset += len(stored) + DATA_TRAILER_V2_SIZE
        lo = hi
    index_keys = [keys[hi - 1] for hi in cuts]
    hashes = array("Q", map(FAST_HASHER.fn, keys)) if want_hashes else None
    expiring = sum(type(v) is tuple for v in values) if has_expiring(values) else 0
    return (offset, index_keys, index_offsets, index_sizes, hashes, values.count(None),
            expiring, uncompressed, keys[0])


def take_chunk(items: Iterator[tuple[bytes, bytes | None]]
               ) -> tuple[list[bytes], list[bytes | None]]:
    """The next CHUNK_ENTRIES (key, value) pairs of ``items`` as two lists
    (empty at the end): what :meth:`SSTableBuilder.add_chunk` takes."""
    chunk = list(islice(items, CHUNK_ENTRIES))
    return list(map(_first, chunk)), list(map(_second, chunk))


def take_tagged(items: Iterator[tuple[bytes, bytes | None, int]]
                ) -> tuple[list[bytes], list[bytes | None], list[int]]:
    """The next CHUNK_ENTRIES (key, value, tag) triples of ``items`` as three
    lists (empty at the end): a merge's output, for :meth:`SSTableBuilder.add_chunk`."""
    chunk = list(islice(items, CHUNK_ENTRIES))
    return list(map(_first, chunk)), list(map(_second, chunk)), list(map(_third, chunk))


class SSTableBuilder:
    """Assembles an SSTable into a binary file object (a file or ``io.BytesIO``).

    Add entries in strictly increasing key order, then ``finish()``.  The
    filter is built at the end from the exact entry count, so it can be
    sized for an output whose length is not known in advance (compaction).
    """

    def __init__(self, out: Sink, *, fp_chance: float, block_size: int,
                 table: str = "", build_filter: bool = True,
                 hasher: Hasher = FAST_HASHER, family: int | None = None,
                 compression: str = "lz4", file_number: int = 0, db_id: str = "",
                 version: int = SSTABLE_FORMAT_VERSION, seq: int = 0) -> None:
        """``compression`` (lsmdb.compression.CHOICES) for the data blocks;
        ``file_number`` and ``db_id``, the file's identity, in its properties;
        ``version`` 1 writes the old format (tests and golden files only);
        ``seq``, the sequence number of entries added without tags."""
        if version not in (1, 2):
            raise ValueError(f"SSTable format version {version} is not one lsmdb writes")
        if compression not in _compression.TYPES:
            raise ValueError(f"compression must be one of {', '.join(_compression.CHOICES)}, "
                             f"not {compression!r}")
        if not 0 <= seq <= MAX_SEQ:
            raise ValueError(f"sequence number {seq} out of range")
        self._version = version
        #: block_cuts and the payloads of data blocks: in C, or their Python twins
        self._block_cuts = _c_block_cuts if USE_SPEEDUPS else block_cuts
        self._c_payload = USE_SPEEDUPS
        self._compression_name = compression if version >= 2 else "none"
        self._compression = _compression.TYPES[self._compression_name]
        self._file_number = file_number
        self._db_id = db_id
        self._seq = seq
        self._tags: list[int] = []
        #: Entries with an expiring value (the file is then format 3).
        self.expiring = 0
        self.uncompressed_bytes = 0
        self._out = out
        self._hasher = hasher
        self._family = DEFAULT_FAMILY if family is None else family
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
        #: An lz4 file's dictionary once made (b"": the file ended without
        #: one), what stores its blocks in pieces against it, and the blocks
        #: waiting for it: (payload, its whole LZ4 (type, stored), last key).
        self._dictionary: bytes | None = None
        self._pieces: Callable[[bytes], tuple[int, bytes]] | None = None
        self._pending: list[tuple[bytes, tuple[int, bytes], bytes]] = []
        self._pending_bytes = 0    # as stored whole, with their trailers
        self._pending_payload = 0

    def add(self, key: bytes, value: bytes | None, tag: int | None = None) -> None:
        """Add one entry after the last; ``tag`` (``seq << 8 | kind``) defaults
        to the builder's ``seq`` and the value's kind."""
        if tag is None:
            tag = blk.tags_for([value], self._seq)[0]
        else:
            self._check_tags([value], [tag])
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
            if type(value) is tuple:
                if self._version < 2:
                    raise ValueError("SSTable format 1 holds no expiring values")
                self.expiring += 1
            self._block_bytes += len(key) + payload_len(value) + _ENTRY_OVERHEAD
        self._keys.append(key)
        self._values.append(value)
        self._tags.append(tag)
        if self._fp_chance < 1.0:
            self._hashes.append(self._hash(key))
        if self._block_bytes >= self._block_size:
            self._flush_block()

    def add_many(self, items: Iterable[tuple[bytes, bytes | None]]) -> None:
        """``add`` for a sorted stream of (key, value|None): taken a chunk at a
        time through :meth:`add_chunk`."""
        it = iter(items)
        while True:
            keys, values = take_chunk(it)
            if not keys:
                return
            self.add_chunk(keys, values)

    @staticmethod
    def _check_tags(values: list[Any], tags: list[int]) -> None:
        for v, t in zip(values, tags, strict=True):
            kind = t & ((1 << KIND_BITS) - 1)
            if kind > KIND_EXPIRING or (kind == KIND_TOMBSTONE) != (v is None) or t < 0 or \
                    (kind == KIND_EXPIRING) != (type(v) is tuple):
                raise ValueError(f"tag {t} does not fit its value")

    def add_chunk(self, keys: list[bytes], values: list[bytes | None],
                  max_file_bytes: int | None = None, tags: list[int] | None = None) -> int:
        """Add sorted entries given as two lists; returns how many were added.

        The same blocks as ``add`` one entry at a time -- a block is cut once
        its estimated size reaches ``block_size`` -- with the work per block,
        not per entry (cumulative sizes and a bisect find each cut).  With
        ``max_file_bytes``, stops at the first block boundary at or past it
        and returns the count added: the rest belongs in the next file.
        """
        n = len(keys)
        if n != len(values) or (tags is not None and n != len(tags)):
            raise ValueError("add_chunk: keys and values differ in length")
        if tags is None:  # (given tags come from blocks or a memtable, checked there)
            tags = blk.tags_for(values, self._seq)
        if not n:
            return 0
        if self._last is not None and keys[0] <= self._last:
            raise ValueError("SSTable keys must be added in strictly increasing order")
        expiring = has_expiring(values)
        if expiring and self._version < 2:
            raise ValueError("SSTable format 1 holds no expiring values")
        block_size = self._block_size
        cuts, bases, total = self._block_cuts(keys, values, block_size - self._block_bytes,
                                              block_size)
        if self.min_key is None:
            self.min_key = keys[0]
        done = 0        # entries of this chunk placed in written blocks
        base = 0        # the estimate where the pending block's chunk part starts
        for cut, at in zip(cuts, bases, strict=True):
            self._add_block(keys, values, tags, done, cut)
            done, base = cut, at
            if max_file_bytes is not None and self.file_size >= max_file_bytes:
                break
        if done < n and not (max_file_bytes is not None and self.file_size >= max_file_bytes):
            self._keys.extend(keys[done:])
            self._values.extend(values[done:])
            self._tags.extend(tags[done:])
            self._block_bytes += total - base
            added = n
        else:
            added = done
        if self._fp_chance < 1.0:
            self._hashes.extend(map(self._hash, keys[:added] if added < n else keys))
        self.entries += added
        self.tombstones += (values[:added] if added < n else values).count(None)
        if expiring:
            self.expiring += sum(type(v) is tuple for v in (values[:added] if added < n
                                                            else values))
        self.max_key = self._last = keys[added - 1]
        return added

    def _add_block(self, keys: list[bytes], values: list[Any], tags: list[int],
                   lo: int, hi: int) -> None:
        """Write a data block: the pending entries, then entries lo..hi of these lists."""
        if self._keys or self._version < 2:
            self._keys.extend(keys[lo:hi])
            self._values.extend(values[lo:hi])
            self._tags.extend(tags[lo:hi])
            self._flush_block()
            return
        if self._c_payload:
            payload = _c_data_payload(keys, values, tags, lo, hi)
        else:
            payload = blk.encode_data_payload(keys[lo:hi], values[lo:hi], tags[lo:hi])
        self._write_data_block(payload, keys[hi - 1])

    def add_section(self, section: Section, entries: int,
                    hashes: list[int] | array[int] | None) -> None:
        """Every entry of the file at once: the ``entries`` :func:`memtable_section`
        wrote to this builder's sink before the builder wrote anything, with
        their filter ``hashes`` (any order; None without a filter).  An empty
        format-2 builder only; then ``finish()``."""
        if self.entries or self._keys or self._offset or self._version < 2:
            raise ValueError("add_section: an empty format-2 builder only")
        if self._fp_chance < 1.0 and (hashes is None or len(hashes) != entries):
            raise ValueError("add_section: one filter hash per entry")
        (size, index_keys, index_offsets, index_sizes, _hashes, tombstones, expiring,
         uncompressed, min_key) = section
        self._offset = size
        self._index_keys = index_keys
        self._index_offsets = index_offsets
        self._index_sizes = index_sizes
        self.entries = entries
        self.tombstones = tombstones
        self.expiring = expiring
        self.uncompressed_bytes = uncompressed
        self.min_key = min_key
        self.max_key = self._last = index_keys[-1]
        if self._fp_chance < 1.0:
            self._hashes = hashes  # type: ignore[assignment]

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
        """Write the pending entries as a data block."""
        if not self._keys:
            return
        if self._version < 2:
            self._index_block(self._keys[-1],
                              *self._write(blk.encode_block([self._keys, self._values])))
        else:
            self._write_data_block(
                blk.encode_data_payload(self._keys, self._values, self._tags), self._keys[-1])
        self._keys = []
        self._values = []
        self._tags = []
        self._block_bytes = 0

    def _write_data_block(self, payload: bytes, last_key: bytes) -> None:
        """A format-2 data block of ``payload``, compressed where that pays,
        with its trailer; indexed under ``last_key``.  An ``lz4`` file's first
        blocks wait here, compressed whole (as they are written if the file
        ends first), until there are DICT_BLOCKS of them or DICT_HELD_BYTES of
        payload: then the file gets its dictionary, and they and every later
        block are stored in pieces against it."""
        self.uncompressed_bytes += len(payload)
        if self._compression != _compression.LZ4:
            self._store_block(*_compression.compress(self._compression, payload), last_key)
            return
        if self._pieces is not None:
            self._store_block(*self._pieces(payload), last_key)
            return
        whole = _compression.compress(self._compression, payload)
        self._pending.append((payload, whole, last_key))
        self._pending_bytes += len(whole[1]) + DATA_TRAILER_V2_SIZE
        self._pending_payload += len(payload)
        if len(self._pending) >= _compression.DICT_BLOCKS or \
                self._pending_payload >= _compression.DICT_HELD_BYTES:
            self._dictionary = _compression.make_dictionary(
                [p[blk.payload_value_starts(p)[0]:] for p, _w, _l in self._pending])
            self._pieces = _compression.piece_compressor(self._dictionary)
            self._drain_pending()

    def _drain_pending(self) -> None:
        """Write the blocks waiting for a dictionary: in pieces against it
        where the file has one, else as the whole LZ4 blocks they are."""
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        self._pending_payload = 0
        for payload, whole, last_key in pending:
            self._store_block(*(self._pieces(payload) if self._pieces is not None else whole),
                              last_key)

    def _store_block(self, kind: int, stored: bytes, last_key: bytes) -> None:
        """Write a data block's stored bytes (of type ``kind``) and trailer;
        indexed under ``last_key``."""
        offset = self._offset
        self._out.write(stored)
        self._out.write(data_trailer(kind, stored))
        self._offset += len(stored) + DATA_TRAILER_V2_SIZE
        self._index_block(last_key, offset, len(stored))

    def _index_block(self, last_key: bytes, offset: int, size: int) -> None:
        """A data block written at ``offset`` (``size`` bytes before its trailer)
        enters the index under its last key."""
        self._index_keys.append(last_key)
        self._index_offsets.append(offset)
        self._index_sizes.append(size)

    def build_filter(self) -> Filter:
        """The filter of every key added (lsmdb.filters.build), sized from their count."""
        return build(FilterSpec(self._family, self._fp_chance, self._hasher), self.entries,
                     self._hashes)

    def finish(self, flt_obj: Filter | None = None) -> dict[str, Any]:
        """Write index, filter, properties and footer; return the properties."""
        if self.entries == 0:
            raise ValueError("an SSTable needs at least one entry")
        self._flush_block()
        if self._dictionary is None:
            self._dictionary = b""
        self._drain_pending()
        index = self._write(blk.encode_block(
            [self._index_keys, self._index_offsets, self._index_sizes]))
        built = flt_obj if flt_obj is not None else self.build_filter()
        filter_payload = built.to_bytes()
        flt = self._write(filter_payload + crc32(filter_payload).to_bytes(4, "little"))
        version = self._version
        if self.expiring:
            version = SSTABLE_FORMAT_EXPIRING
        if self._dictionary:
            version += SSTABLE_FORMAT_DICTIONARY
        props = {
            "format_version": version,
            "table": self._table,
            "entries": self.entries,
            "tombstones": self.tombstones,
            "data_blocks": len(self._index_keys),
            "data_bytes": index[0],
            "min_key": self.min_key,
            "max_key": self.max_key,
            "min_seq": self.min_seq if self.min_seq is not None else 0,
            "max_seq": self.max_seq,
            **filter_properties(built),
        }
        if self._version >= 2:
            props.update(file_number=self._file_number, db_id=self._db_id,
                         compression=self._compression_name,
                         uncompressed_bytes=self.uncompressed_bytes)
            if self._dictionary:
                props["compression_dict"] = self._dictionary
        if self.expiring:
            props["expiring_entries"] = self.expiring
        prop = self._write(blk.encode_block(props))
        self._write_raw(pack_footer(index, flt, prop, version))
        return props

    def _write_raw(self, data: bytes) -> None:
        self._out.write(data)
        self._offset += len(data)

    @property
    def file_size(self) -> int:
        """The file's bytes so far (blocks waiting for a dictionary counted as
        stored without one); once finished, its size."""
        return self._offset + self._pending_bytes


def filter_properties(flt: Filter) -> dict[str, Any]:
    """What the properties block says of a file's filter (docs/FORMAT.md §4.5):
    the fp chance it was built for (1.0 without bits), its bits and probes."""
    stats = flt.statistics()
    return {"fp_chance": flt.fp_chance if stats.bits else 1.0, "filter_bits": stats.bits,
            "filter_hashes": stats.hashes}


#: The write buffer of a new SSTable: one write call per MiB rather than one per
#: 8 KiB (two data blocks).  Each call lets the GIL go and take it back, a turn
#: the other threads (a background compaction, the writers) may take; with the
#: default buffer a 200,000-key load through batches measured 12-14% slower.
WRITE_BUFFER_BYTES = 1 << 20


def write_sstable(path: str, items: Iterable[tuple[bytes, bytes | None]], *, fp_chance: float,
                  block_size: int, table: str = "", min_seq: int | None = None,
                  max_seq: int = 0, hasher: Hasher = FAST_HASHER,
                  chunks: Iterable[tuple[Any, ...]] = (), compression: str = "lz4",
                  file_number: int = 0, db_id: str = "",
                  family: int | None = None) -> dict[str, Any]:
    """Write a complete SSTable to ``path`` and fsync it.  Returns its properties.

    The entries are ``items`` (key, value|None) pairs, then ``chunks`` of
    (keys, values) or (keys, values, tags) lists (a memtable's flush), all in
    increasing key order; entries without tags are tagged with ``max_seq``.
    """
    def fill(builder: SSTableBuilder, _f: FileWriter) -> None:
        builder.add_many(items)
        for chunk in chunks:
            builder.add_chunk(chunk[0], chunk[1], None, chunk[2] if len(chunk) > 2 else None)

    return _write_file(path, fill, min_seq, max_seq, fp_chance=fp_chance,
                       block_size=block_size, table=table, hasher=hasher,
                       compression=compression, file_number=file_number, db_id=db_id,
                       seq=max_seq, family=family)


def _write_file(path: str, fill: Callable[[SSTableBuilder, FileWriter], None],
                min_seq: int | None, max_seq: int, **builder_options: Any) -> dict[str, Any]:
    """A new SSTable at ``path``: a builder of ``builder_options`` over its file,
    ``fill(builder, file)``, the WAL sequence range noted, finished and
    fsynced.  Returns its properties, with ``size_bytes``."""
    with FileWriter(path, WRITE_BUFFER_BYTES) as f:
        builder = SSTableBuilder(f, **builder_options)
        fill(builder, f)
        builder.note_seq(min_seq, max_seq)
        props = builder.finish()
        f.sync()
    props["size_bytes"] = builder.file_size
    return props


def write_memtable(path: str, data: dict[bytes, Any], tags: dict[bytes, int], *,
                   fp_chance: float, block_size: int, table: str = "",
                   min_seq: int | None = None, max_seq: int = 0, hasher: Hasher = FAST_HASHER,
                   compression: str = "lz4", file_number: int = 0,
                   db_id: str = "", family: int | None = None) -> dict[str, Any]:
    """A frozen memtable (its ``data`` and ``tags`` dicts) written as a complete
    SSTable at ``path`` and fsynced: the same file :func:`write_sstable` writes
    from its sorted chunks, the data blocks made by :func:`memtable_section`
    (in C where built, which lets the GIL go while it sorts, cuts and encodes).
    Returns its properties."""
    kind = _compression.TYPES[compression]
    filtered = fp_chance < 1.0
    fast = filtered and hasher.fn is FAST_HASHER.fn
    make = _c_memtable_section if USE_SPEEDUPS else memtable_section

    def fill(builder: SSTableBuilder, f: FileWriter) -> None:
        section = make(data, tags, block_size, kind, _compression.compressor(kind), fast,
                       f.write)
        # A filter's bits do not depend on the order its keys are added in.
        hashes = section[4] if fast else list(map(hasher.fn, data)) if filtered else None
        builder.add_section(section, len(data), hashes)

    return _write_file(path, fill, min_seq, max_seq, fp_chance=fp_chance,
                       block_size=block_size, table=table, hasher=hasher,
                       compression=compression, file_number=file_number, db_id=db_id,
                       seq=max_seq, family=family)


def rewrite_filter(reader: SSTableReader, path: str, number: int, fp_chance: float,
                   hasher: Hasher = FAST_HASHER, family: int | None = None) -> SSTableReader:
    """A copy of ``reader``'s file with a new filter built at ``fp_chance``.

    Data blocks and index are copied byte for byte (they are only decoded to
    hash the keys); the filter, properties block and footer are new.  The new
    file is fsynced before this returns.
    """
    idx_off, idx_size = reader.index_handle
    prefix_len = idx_off + idx_size + BLOCK_TRAILER_SIZE
    prefix = reader.copy_prefix(prefix_len)
    hashes: list[int] = []
    if fp_chance < 1.0:
        hash_fn = hasher.fn
        for i in range(len(reader.index_keys)):
            keys, _values = reader.read_block(i)
            hashes.extend(map(hash_fn, keys))
    new_filter = build(FilterSpec(DEFAULT_FAMILY if family is None else family, fp_chance,
                                  hasher), reader.entries, hashes)
    props = dict(reader.properties)
    props.update(filter_properties(new_filter))
    if reader.version >= 2:
        props["file_number"] = number
    filter_payload = new_filter.to_bytes()
    filter_block = filter_payload + crc32(filter_payload).to_bytes(4, "little")
    props_block = blk.encode_block(props)
    flt_off = prefix_len
    prop_off = flt_off + len(filter_block)
    footer = pack_footer((idx_off, idx_size), (flt_off, len(filter_payload)),
                         (prop_off, len(props_block) - BLOCK_TRAILER_SIZE), reader.file_version)
    with FileWriter(path) as f:
        f.write(prefix)
        f.write(filter_block)
        f.write(props_block)
        f.write(footer)
        f.sync()
    new = SSTableReader(path, number)
    new.level = reader.level
    return new
