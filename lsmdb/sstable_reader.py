"""Reading SSTables: ``SSTableReader`` keeps footer, index, properties and filter in
memory and reads a point lookup's data block with one ``os.pread``; scans and
compactions read runs of blocks ahead, one ``os.pread`` per run
(:mod:`lsmdb.scan`).

See :mod:`lsmdb.sstable_format` for the layout.  The filter is held as a
:class:`lsmdb.filters.FilterHandle`: one that cannot be decoded (or a keyed
filter without its secret) fails open, and every probe answers "maybe".
"""

from __future__ import annotations

import logging
import os
import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from itertools import accumulate, pairwise
from typing import Any

from . import block as blk
from . import compression
from .block import Block, FullBlock
from .coding import crc32
from .errors import CorruptionError, DatabaseClosedError, UnsupportedFormatError
from .files import open_regular
from .filters import FilterHandle
from .filters.hashing import Hasher
from .sstable_format import (
    BLOCK_TRAILER_SIZE,
    CRC32_RESIDUE,
    FOOTER,
    FOOTER_CRC_SPAN,
    FOOTER_SIZE,
    READABLE_VERSIONS,
    SSTABLE_MAGIC,
    data_trailer_size,
    layout_of,
)
from .stats import FILE_COUNTERS, ArrayCounter

_block_entry: Callable[[bytes, bytes | None, bytes | None, int], bytes] | None
_block_lists: Callable[[bytes, bytes | None, bytes | None, int], Block] | None
_block_full: Callable[[bytes, bytes | None, bytes | None, int],
                      tuple[list[bytes], list[Any], list[int]]] | None
_map_file: Callable[[int, int], Any] | None
_pieces_payload: Callable[[Any, Any], bytes | None] | None
try:  # optional C speedups (lsmdb/csrc/block.c, sstable_reader.c)
    from ._speedups import block_entry as _block_entry
    from ._speedups import block_full as _block_full
    from ._speedups import block_lists as _block_lists
    from ._speedups import map_file as _map_file
    from ._speedups import pieces_payload as _pieces_payload
except ImportError:  # pragma: no cover - built without a C compiler
    _block_entry = _block_lists = _block_full = _map_file = _pieces_payload = None

log = logging.getLogger("lsmdb")

#: A scan or a compaction reads a file's data blocks ahead (lsmdb.scan), in runs
#: that start at one block and double up to this many blocks or this many bytes
#: per read (a short scan reads no more than twice what it uses).
READAHEAD_BLOCKS = 64
READAHEAD_BYTES = 1 << 20
#: The bytes an open reads at once from a file's end: its footer and, in
#: most files, its index, properties and filter.
TAIL_READ_BYTES = 64 << 10


class SSTableReader:
    """An open SSTable, the file: footer, index, properties and filter held in
    memory, and its data blocks read on demand.

    Block access: ``block_for`` (which block can hold a key), ``read_entry``
    (a block in the block cache's form, for point reads), ``read_block``
    (decoded), ``read_run`` and ``decode_raw`` (runs of blocks read ahead, for
    scans and compactions: :mod:`lsmdb.scan`).  Every block is checked -- its
    checksum, then the data block rule (:mod:`lsmdb.block`) -- before any key
    in it is used.  The reader counts nothing and caches nothing: the read
    paths count into ``counts`` and decide what the block cache keeps.  The
    file descriptor stays open until ``close()``, so a file unlinked by
    compaction can still serve readers that hold this object.
    """

    def __init__(self, path: str, number: int = 0, data: bytes | None = None) -> None:
        self.path = path
        self.number = number
        #: The first of this reader's range of keys in its cache (attach_cache):
        #: block i is cached under cache_base + i.
        self.cache_base = 0
        self.level = 0
        #: The file's filter (lsmdb.filters.FilterHandle), failing open until usable.
        self.filter: FilterHandle
        # Counters: cumulative, never reset on read; named by the
        # ArrayCounter attributes below (lsmdb/stats.py).
        self.counts = array("Q", bytes(8 * len(FILE_COUNTERS)))
        self._cache: Any = None  # the shared block cache, or None
        #: The open descriptor (-1 once closed, or for a file held in memory):
        #: the C read path reads blocks through it.
        self.fd = -1
        self._parked = -1  # the descriptor's number after close (see close)
        #: The C read path's compact copy of the index (keys, words, block
        #: offsets and sizes in one bytes object), made by the first C Probes
        #: over this file and used by every later one, each holding it (one
        #: that does not check out as this file's is not used).
        self._c_index: bytes | None = None
        #: The file mapped read-only (map_file), or None: the C getter
        #: copies a block out of the mapping instead of a pread.
        self.mapped: Any = None
        self._data: bytes | None = None
        if data is None:
            self.fd, st = open_regular(path)
            try:
                self.size_bytes = st.st_size
                self._load(self._tail_reader())
            except BaseException:
                os.close(self.fd)
                self.fd = -1
                raise
        else:
            self._data = data
            self.size_bytes = len(data)
            self._load(self._slice)

    @property
    def cache(self) -> Any:
        """The block cache this reader's blocks go through (``attach_cache``), or None."""
        return self._cache

    def attach_cache(self, cache: Any) -> None:
        """Cache this file's data blocks in ``cache`` (None: in none), under a
        range of keys no other reader of that cache shares, one per block:
        ``cache_base = cache.reserve(blocks)``, block ``i`` under
        ``cache_base + i``, however many blocks the file has.  Blocks cached
        under a range this reader held before are dropped from their cache.
        The DB attaches its cache before it publishes the reader.
        OverflowError, the reader left as it was, if the cache's keys are
        spent (which takes 2**64 blocks: see :mod:`lsmdb.cache`)."""
        base = cache.reserve(len(self.index_keys)) if cache is not None else 0
        self.drop_cached()
        self.cache_base, self._cache = base, cache

    def drop_cached(self) -> None:
        """Drop this file's blocks from its cache (the file left the database)."""
        if self._cache is not None:
            self._cache.evict_range(self.cache_base, self.cache_base + len(self.index_keys))

    # The counters by name (lsmdb/stats.py says what each counts).
    range_skips = ArrayCounter(FILE_COUNTERS)
    filter_negatives = ArrayCounter(FILE_COUNTERS)
    true_positives = ArrayCounter(FILE_COUNTERS)
    false_positives = ArrayCounter(FILE_COUNTERS)
    false_negatives = ArrayCounter(FILE_COUNTERS)
    block_reads = ArrayCounter(FILE_COUNTERS)
    block_cache_hits = ArrayCounter(FILE_COUNTERS)

    # -- low-level reads --------------------------------------------------
    def _pread(self, size: int, offset: int) -> bytes:
        """``size`` bytes at ``offset``, or fewer at the end of the file;
        DatabaseClosedError when the reader is (or got, meanwhile) closed."""
        fd = self.fd
        if fd < 0:
            raise DatabaseClosedError(f"{self.path}: SSTable reader is closed")
        raw = os.pread(fd, size, offset)
        if len(raw) < size and self.fd < 0:  # closed while reading: read /dev/null
            raise DatabaseClosedError(f"{self.path}: SSTable reader is closed")
        return raw

    def _tail_reader(self) -> Any:
        """``_pread`` for ``_load``: the file's last TAIL_READ_BYTES read once,
        where the footer and, in most files, the meta blocks lie."""
        start = max(self.size_bytes - TAIL_READ_BYTES, 0)
        tail = self._pread(self.size_bytes - start, start)

        def read(size: int, offset: int) -> bytes:
            if offset >= start and offset + size <= start + len(tail):
                return tail[offset - start:offset - start + size]
            return self._pread(size, offset)

        return read

    def _slice(self, size: int, offset: int) -> bytes:
        data = self._data
        if data is None:
            raise DatabaseClosedError(f"{self.path}: SSTable reader is closed")
        return data[offset:offset + size]

    def _read_meta_block(self, read: Any, offset: int, size: int, what: str) -> bytes:
        if offset < 0 or size < 0 or offset + size + BLOCK_TRAILER_SIZE > self._data_end:
            raise CorruptionError(f"{what} handle out of bounds", self.path, offset)
        raw = read(size + BLOCK_TRAILER_SIZE, offset)
        if len(raw) != size + BLOCK_TRAILER_SIZE:
            raise CorruptionError(f"{what} truncated", self.path, offset)
        return blk.check_block(raw, self.path, offset, what)

    def _load(self, read: Any) -> None:
        path = self.path
        if self.size_bytes < FOOTER_SIZE:
            raise CorruptionError("file shorter than an SSTable footer", path, 0)
        foot_off = self.size_bytes - FOOTER_SIZE
        footer = read(FOOTER_SIZE, foot_off)
        if len(footer) != FOOTER_SIZE:
            raise CorruptionError("footer truncated", path, foot_off)
        (idx_off, idx_size, flt_off, flt_size, prop_off, prop_size, version, crc,
         magic) = FOOTER.unpack(footer)
        if magic != SSTABLE_MAGIC:
            raise CorruptionError("bad SSTable magic (not an lsmdb SSTable?)", path, foot_off)
        if crc32(footer[:FOOTER_CRC_SPAN]) != crc:
            raise CorruptionError("footer checksum mismatch", path, foot_off)
        if version not in READABLE_VERSIONS:
            raise UnsupportedFormatError(
                f"{path}: SSTable format version {version}; this lsmdb reads "
                f"{' and '.join(map(str, READABLE_VERSIONS))}")
        #: The file's format version as its footer records it (1 to 5).
        self.file_version = version
        #: Its layout, what its blocks and entries look like: 1, 2 or 3 (a
        #: format-4 or -5 file is format 2 or 3 with a dictionary).
        self.version = layout_of(version)
        #: The bytes after each data block's stored payload: 4 (format 1) or 5.
        self.data_trailer = data_trailer_size(self.version)
        self._data_end = foot_off
        self.index_handle = (idx_off, idx_size)
        self.filter_handle = (flt_off, flt_size)
        self.props_handle = (prop_off, prop_size)

        props = blk.unpack(self._read_meta_block(read, prop_off, prop_size, "properties block"),
                           path, prop_off, "properties block")
        if type(props) is not dict:
            raise CorruptionError("properties block has the wrong shape", path, prop_off)
        try:
            self.entries = int(props["entries"])
            self.tombstones = int(props["tombstones"])
            self.min_key = props["min_key"]
            self.max_key = props["max_key"]
            self.min_seq = int(props["min_seq"])
            self.max_seq = int(props["max_seq"])
            self.table = str(props["table"])
            self.fp_chance = float(props["fp_chance"])
            if props.get("format_version", version) != version:
                raise CorruptionError(f"properties say format {props['format_version']}, the "
                                      f"footer {version}", path, prop_off)
            if version >= 2:
                #: The file's identity: its number and its database's id, as
                #: written (format 2; None for a format-1 file, which has none).
                self.file_number: int | None = props["file_number"]
                self.db_id: str | None = props["db_id"]
                #: How its data blocks are compressed (the table's option when written).
                self.compression = props["compression"]
                #: Its data blocks' payloads, decompressed, in bytes.
                self.uncompressed_bytes = props["uncompressed_bytes"]
                #: Its entries of kind 2, expiring values (format 3).
                self.expiring = props["expiring_entries"] if self.version >= 3 else 0
                #: The dictionary its type-3 (pieces) LZ4 blocks were
                #: compressed against, or None (lsmdb.compression).
                self.compression_dict: bytes | None = props.get("compression_dict")
                if (self.compression_dict is not None) != (version != self.version) or (
                        self.compression_dict is not None
                        and (type(self.compression_dict) is not bytes
                             or not 0 < len(self.compression_dict) <= compression.MAX_DICT)):
                    raise TypeError
                if (type(self.file_number) is not int or type(self.uncompressed_bytes) is not int
                        or self.file_number < 0 or self.uncompressed_bytes < 0
                        or type(self.expiring) is not int or self.expiring < 0
                        or type(self.db_id) is not str
                        or self.compression not in compression.TYPES):
                    raise TypeError
            else:
                self.file_number = self.db_id = None
                self.compression_dict = None
                self.compression = "none"
                self.expiring = 0
                self.uncompressed_bytes = (int(props["data_bytes"])
                                           - BLOCK_TRAILER_SIZE * int(props["data_blocks"]))
        except (KeyError, TypeError, ValueError):
            raise CorruptionError("properties block is missing fields", path, prop_off) from None
        if type(self.min_key) is not bytes or type(self.max_key) is not bytes:
            raise CorruptionError("properties block key range of the wrong type", path, prop_off)
        self.properties = props

        index = blk.unpack(self._read_meta_block(read, idx_off, idx_size, "index block"),
                           path, idx_off, "index block")
        if (type(index) is not list or len(index) != 3
                or not all(type(part) is list for part in index)
                or not len(index[0]) == len(index[1]) == len(index[2])):
            raise CorruptionError("index block has the wrong shape", path, idx_off)
        self.index_keys: list[bytes] = index[0]
        self.index_offsets: list[int] = index[1]
        self.index_sizes: list[int] = index[2]
        prev = None
        for key, off, size in zip(*index, strict=True):
            if (type(key) is not bytes or type(off) is not int or type(size) is not int
                    or off < 0 or size < 0 or off + size + self.data_trailer > idx_off):
                raise CorruptionError("index block entry invalid", path, idx_off)
            # Reads bisect the index: keys out of order would send a key to the wrong block.
            if prev is not None and key <= prev:
                raise CorruptionError("index block keys out of order", path, idx_off)
            prev = key
        self._index_memory: int | None = None
        if not self.index_keys or self.index_keys[-1] != self.max_key:
            raise CorruptionError("index block does not match the key range", path, idx_off)

        self.filter = FilterHandle.load(
            lambda: self._read_meta_block(read, flt_off, flt_size, "filter block"), path, flt_off)
        if self.filter.stored is None:
            log.warning("%s: filter unusable, every read will check the data (%s)", path,
                        self.filter.error)

    def attach_hasher(self, keyed: Hasher | None) -> None:
        """Give a keyed filter its secret's hash (``FilterHandle.attach_hasher``)."""
        self.filter.attach_hasher(keyed)
        if self.filter.error is not None and self.filter.stored is not None:
            log.warning("%s: %s", self.path, self.filter.error)

    # -- data blocks ------------------------------------------------------
    def block_for(self, key: bytes) -> int:
        """Index of the only data block that can hold ``key`` (len(index) if none)."""
        return bisect_left(self.index_keys, key)

    def bounds(self, i: int) -> tuple[bytes | None, bytes]:
        """Where block ``i``'s keys lie by the index: above the first (the previous
        block's last key; None for block 0), up to and ending at the second."""
        keys = self.index_keys
        return (keys[i - 1] if i else None), keys[i]

    def read_raw(self, i: int, check: bool = True) -> bytes:
        """Data block ``i`` as stored (payload and trailer): one ``os.pread`` (or a
        slice of the file in memory), its length and checksum verified unless
        ``check`` is False (then ``entry_of`` or ``decode_raw`` checks it)."""
        offset = self.index_offsets[i]
        size = self.index_sizes[i] + self.data_trailer
        raw = self._pread(size, offset) if self._data is None else self._data[offset:offset + size]
        if check:
            self.check_raw(i, raw)
        return raw

    def check_raw(self, i: int, raw: bytes | memoryview) -> None:
        """CorruptionError unless ``raw`` is data block ``i`` whole (payload and
        trailer) with a matching checksum."""
        if len(raw) != self.index_sizes[i] + self.data_trailer:
            raise CorruptionError("data block truncated", self.path, self.index_offsets[i])
        if crc32(raw) != CRC32_RESIDUE:  # payload and trailer in one pass
            raise CorruptionError("data block checksum mismatch", self.path,
                                  self.index_offsets[i])

    def payload_of(self, i: int, raw: bytes | memoryview) -> bytes | memoryview:
        """Block ``i``'s payload from ``raw`` (as ``check_raw`` accepts it):
        decompressed as its type byte says (format 2), or as it is."""
        if self.version < 2:
            return raw[:-BLOCK_TRAILER_SIZE]
        kind = raw[-self.data_trailer]
        stored = raw[:-self.data_trailer]
        if kind == compression.NONE:
            return stored
        if kind == compression.LZ4_PIECES and _pieces_payload is not None:
            payload = _pieces_payload(self, stored)  # C: decompress_pieces' twin
            if payload is not None:
                return payload  # (None: the Python twin says why it refuses the block)
        return compression.decompress(kind, stored, self.path, self.index_offsets[i],
                                      self.compression_dict)

    def keys_among(self, i: int, raw: bytes | memoryview, keys: list[bytes]) -> bool:
        """Whether any of ``keys`` is among data block ``i``'s keys, from ``raw``
        (payload and trailer, as read): its length and checksum verified, its
        payload decompressed whole (the C getter decodes an LZ4 block only as
        far as it reads, so it does not see a recorded length that lies
        beyond) -- a block in pieces, its keys piece alone -- then its keys
        array alone read under the rule (lsmdb.block.keys_among);
        CorruptionError at the block's offset if any of these fails."""
        self.check_raw(i, raw)
        after, last = self.bounds(i)
        if self.version >= 2 and raw[-self.data_trailer] == compression.LZ4_PIECES:
            held = set(self._pieces_of(i, raw)[0])
            return any(key in held for key in keys)
        return blk.keys_among(self.payload_of(i, raw), keys, self.path,
                              self.index_offsets[i], after, last, self.version)

    def values_among(self, i: int, raw: bytes | memoryview, keys: list[bytes]) -> dict[bytes, Any]:
        """The values of those of ``keys`` that data block ``i`` of this format-2
        file holds, from ``raw`` as ``keys_among`` reads it, the block read no
        further than the last of them (lsmdb.block.values_among)."""
        self.check_raw(i, raw)
        after, last = self.bounds(i)
        if raw[-self.data_trailer] == compression.LZ4_PIECES:
            held, value_of = self._pieces_of(i, raw)
            place = {key: n for n, key in enumerate(held)}
            return {key: value_of(place[key]) for key in keys if key in place}
        return blk.values_among(self.payload_of(i, raw), keys, self.path,
                                self.index_offsets[i], after, last)

    def _pieces_of(self, i: int, raw: bytes | memoryview) -> tuple[list[bytes], Any]:
        """Type-3 block ``i`` (``raw`` checked) read piece by piece: its keys,
        from its first piece alone (lsmdb.block.keys_piece), and a function
        of an entry's place among them to its value, read from the piece the
        table says holds it alone (lsmdb.block.piece_values, each piece
        decompressed once).  CorruptionError at the block's offset where the
        table, a piece or the arrays break the rule."""
        path, offset = self.path, self.index_offsets[i]
        stored = bytes(raw[:-self.data_trailer])
        try:
            plen, sizes, firsts, at = compression.piece_table(stored)
        except ValueError as exc:
            raise CorruptionError(f"data block pieces: {exc}", path, offset) from None
        bounds = list(accumulate(sizes, initial=at))
        dictionary = self.compression_dict

        def piece(k: int) -> bytes:
            return compression.decompress_piece(stored[bounds[k]:bounds[k + 1]], plen,
                                                dictionary, path, offset)

        after, last = self.bounds(i)
        keys = blk.keys_piece(piece(0), path, offset, after, last)
        count = len(keys)
        if firsts[-1] >= count:
            raise CorruptionError("data block pieces name entries it lacks", path, offset)
        read: dict[int, list[bytes | None]] = {}

        def value_of(n: int) -> bytes | None:
            p = bisect_right(firsts, n)  # the piece (1 on) holding entry n's value
            if p not in read:
                nxt = firsts[p] if p < len(firsts) else count
                read[p] = blk.piece_values(piece(p), p == 1, p == len(firsts), count,
                                           nxt - firsts[p - 1], path, offset)
            return read[p][n - firsts[p - 1]]

        return keys, value_of

    def decode_raw(self, i: int, raw: bytes | memoryview) -> Block:
        """Block ``i``'s (keys, values) from ``raw`` (as ``check_raw`` accepts it),
        under the data block rule: lsmdb.block.decode_data_block, or its C twin."""
        payload = self.payload_of(i, raw)
        after, last = self.bounds(i)
        if _block_lists is not None:
            try:
                return _block_lists(bytes(payload), after, last, self.version)
            except ValueError:
                pass  # the Python rule says why (or, disagreeing, decodes it)
        return blk.decode_data_block(payload, self.path, self.index_offsets[i], after, last,
                                     self.version)

    def decode_full(self, i: int, raw: bytes | memoryview) -> tuple[list[bytes], list[Any],
                                                                      list[int]]:
        """Block ``i``'s (keys, values, tags) from ``raw`` (as ``check_raw``
        accepts it), under the data block rule, expiring values as (value,
        expires) tuples.  A format-1 file records no
        sequence numbers: its entries are tagged with the file's ``max_seq``,
        newer than any older file's and older than any newer one's."""
        if self.version < 2:
            keys, values = self.decode_raw(i, raw)
            return keys, values, blk.tags_for(values, self.max_seq)
        after, last = self.bounds(i)
        payload = self.payload_of(i, raw)
        if _block_full is not None:
            try:
                return _block_full(bytes(payload), after, last, self.version)
            except ValueError:
                pass  # the Python rule says why (or, disagreeing, decodes it)
        full: FullBlock = blk.decode_full(payload, self.path, self.index_offsets[i], after,
                                          last, self.version)
        return full[0], blk.join_expiries(full[1], full[3]), full[2]

    def read_block(self, i: int) -> Block:
        """Data block ``i``'s (keys, values), read from disk (one ``os.pread``) and
        checked."""
        return self.decode_raw(i, self.read_raw(i))

    def read_entry(self, i: int) -> bytes:
        """Data block ``i`` read from disk and checked, in the block cache's form
        (lsmdb.block's cached block: the payload, then its entries' offsets)."""
        return self.entry_of(i, self.read_raw(i, check=False))

    def entry_of(self, i: int, raw: bytes) -> bytes:
        """Data block ``i`` from ``raw`` (payload and trailer, as read), checked --
        its length and checksum, then the data block rule -- in the block
        cache's form; CorruptionError at the block's offset if it fails."""
        self.check_raw(i, raw)
        payload = bytes(self.payload_of(i, raw))
        if _block_entry is not None:
            after, last = self.bounds(i)
            try:
                return _block_entry(payload, after, last, self.version)
            except ValueError:
                pass  # the Python rule says why (or, disagreeing, decodes it)
        return blk.cache_entry(payload, self.decode_raw(i, raw))

    def read_run(self, blocks: range) -> dict[int, bytes | memoryview]:
        """Data blocks ``blocks`` (ascending or descending, at least one) as stored
        (payload and trailer, not yet checked: the caller checks each block it
        uses, ``check_raw``), by block number: the longest run of them from the
        first that lies back to back in the file, up to ``READAHEAD_BYTES``, in
        one read (one ``os.pread``, one hand-off of the GIL).  A block cut short
        by the end of the file comes back short."""
        offsets, sizes, trailer = self.index_offsets, self.index_sizes, self.data_trailer
        if self._data is not None:  # the file is in memory: nothing to read ahead
            b = blocks[0]
            return {b: self._data[offsets[b]:offsets[b] + sizes[b] + trailer]}
        run = [blocks[0]]
        lo = offsets[blocks[0]]
        hi = lo + sizes[blocks[0]] + trailer
        for b in blocks[1:]:
            b_lo, b_hi = offsets[b], offsets[b] + sizes[b] + trailer
            if b_lo == hi and b_hi - lo <= READAHEAD_BYTES:
                hi = b_hi
            elif b_hi == lo and hi - b_lo <= READAHEAD_BYTES:
                lo = b_lo
            else:
                break
            run.append(b)
        data = self._pread(hi - lo, lo)
        if len(run) == 1:
            return {run[0]: data}
        view = memoryview(data)
        return {b: view[offsets[b] - lo:offsets[b] - lo + sizes[b] + trailer] for b in run}

    def copy_prefix(self, length: int) -> bytes:
        """The file's first ``length`` bytes, verbatim."""
        if self._data is not None:
            return self._data[:length]
        out = bytearray()
        while len(out) < length:
            chunk = self._pread(min(1 << 20, length - len(out)), len(out))
            if not chunk:
                raise CorruptionError("file shorter than its index says", self.path, len(out))
            out += chunk
        return bytes(out)

    def counters(self) -> dict[str, int]:
        """Every counter by name (see FILE_COUNTERS)."""
        return dict(zip(FILE_COUNTERS, self.counts.tolist(), strict=True))

    def map_file(self) -> bool:
        """Map the file read-only for the C getter's block reads (``mapped``):
        whether it is now mapped.  Only with the C speedups, on 64-bit POSIX
        systems, for a file-backed reader that is open and not empty; a
        mapping the system refuses leaves the reader on ``pread``.

        A block read from the mapping is a memory copy, not a system call
        (a system call costs about 1.7 us on this machine, a false
        positive's whole block read 3-5 us).  The copy runs with the GIL
        released (a page the page cache lost waits for the device) and
        guarded against SIGBUS, which the kernel raises for a page of the
        mapping that cannot be read (a file cut short under it, a device
        error): the C getter then lets the Python read path read the block
        again with ``pread``, which raises CorruptionError.  The mapping's
        pages are the page cache's, shared with every process reading the
        file; once touched they count in the process's resident size."""
        if self.mapped is not None:
            return True
        if (_map_file is None or self.fd < 0 or not self.size_bytes
                or os.name != "posix" or sys.maxsize <= 2 ** 32):
            return False
        try:
            self.mapped = _map_file(self.fd, self.size_bytes)
        except (OSError, ValueError, OverflowError) as exc:
            log.warning("%s: not mapped (%s); reading with pread", self.path, exc)
            return False
        return True

    @property
    def index_memory_bytes(self) -> int:
        """Bytes the index takes in memory: its three lists and their items
        (measured once; the index never changes)."""
        if self._index_memory is None:
            size = sys.getsizeof
            self._index_memory = sum(size(part) + sum(map(size, part)) for part in
                                     (self.index_keys, self.index_offsets, self.index_sizes))
        return self._index_memory

    def close(self) -> None:
        """Stop reading the file.  Its descriptor's number stays taken, now
        open on /dev/null, until this reader is freed: a read that fetched the
        number before the close (the C getter lets the GIL go for its pread)
        then reads nothing and reports the reader closed, rather than reading
        whatever file the number would otherwise be reused for.  A database's
        readers are freed once no read holds them (DB.close drops its own).
        The mapping, if any, is dropped, not closed: a read copying out of it
        holds it until done, and it is unmapped when the last holder lets go."""
        self.mapped = None
        fd = self.fd
        if fd < 0:
            return
        self.fd = -1
        try:
            null = os.open(os.devnull, os.O_RDONLY)
            try:
                os.dup2(null, fd)  # in one step: the number never refers to nothing
            finally:
                os.close(null)
            self._parked = fd
        except OSError:
            os.close(fd)

    def _check(self) -> None:
        """Invariants: the index tiles the data region in key order and ends at
        ``max_key``; the properties and the counters are in range; the filter's
        own invariants; a mapping covers the whole file."""
        keys, offsets, sizes = self.index_keys, self.index_offsets, self.index_sizes
        if not keys or not len(keys) == len(offsets) == len(sizes):
            raise AssertionError(f"{self.path}: index of {len(keys)} keys")
        if any(a >= b for a, b in pairwise(keys)):
            raise AssertionError(f"{self.path}: index keys out of order")
        end = 0
        for off, size in zip(offsets, sizes, strict=True):
            if off != end:
                raise AssertionError(f"{self.path}: data block at {off}, expected at {end}")
            end = off + size + self.data_trailer
        if end > self._data_end or keys[-1] != self.max_key or self.min_key > keys[0]:
            raise AssertionError(f"{self.path}: index does not match the key range")
        if not 0 <= self.tombstones <= self.entries or not 0 <= self.min_seq <= self.max_seq:
            raise AssertionError(f"{self.path}: properties out of range")
        if len(self.counts) != len(FILE_COUNTERS) or self.cache_base < 0 or self.level < 0:
            raise AssertionError(f"{self.path}: counters or cache keys out of range")
        self.filter._check()
        if self.mapped is not None and self.mapped.size != self.size_bytes:
            raise AssertionError(f"{self.path}: mapping of {self.mapped.size} bytes")

    def __del__(self) -> None:
        for name in ("fd", "_parked"):  # nothing reads through a reader being freed
            fd = getattr(self, name, -1)
            if fd >= 0:
                setattr(self, name, -1)
                try:
                    os.close(fd)
                except OSError:
                    pass
