"""Reading SSTables: ``SSTableReader`` keeps footer, index, properties and filter in
memory and reads a point lookup's data block with one ``os.pread``; scans and
compactions (``chunks``) read runs of blocks ahead, one ``os.pread`` per run.

See :mod:`lsmdb.sstable` for the layout.  A filter that cannot be decoded (or
a keyed filter without its secret) fails open: every probe answers "maybe".
"""

from __future__ import annotations

import logging
import os
import sys
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterator
from itertools import chain, pairwise
from typing import Any

from . import block as blk
from .bloom import FAST_HASHER, BloomFilter, Hasher
from .coding import BLOCK_TRAILER_SIZE, CRC32_RESIDUE, crc32
from .errors import CorruptionError, DatabaseClosedError, LsmdbError, UnsupportedFormatError
from .files import open_for_reading
from .sstable_format import (
    FOOTER,
    FOOTER_CRC_SPAN,
    FOOTER_SIZE,
    MISSING,
    SSTABLE_FORMAT_VERSION,
    SSTABLE_MAGIC,
)
from .stats import FILE_COUNTERS, ArrayCounter

_block_entry: Callable[[bytes], bytes] | None
_entry_find: Callable[[bytes, bytes, object], Any] | None
_entry_lists: Callable[[bytes], tuple[list[bytes], list[bytes | None]]] | None
_map_file: Callable[[int, int], Any] | None
try:  # optional C speedups (lsmdb/csrc/block.c, sstable_reader.c)
    from ._speedups import block_entry as _block_entry
    from ._speedups import block_may_hold
    from ._speedups import entry_find as _entry_find
    from ._speedups import entry_lists as _entry_lists
    from ._speedups import map_file as _map_file
except ImportError:  # pragma: no cover - built without a C compiler
    _block_entry = _entry_find = _entry_lists = _map_file = None

    def block_may_hold(raw: bytes, key: bytes, /) -> bool:
        """False when the data block ``raw`` (payload and trailer) certainly
        does not hold ``key``: its bytes appear nowhere in it."""
        return key in raw

log = logging.getLogger("lsmdb")


class _FailOpenFilter:
    """Stands in for a filter that cannot be decoded: always "maybe"."""

    m = 0
    k = 0
    n = 0
    part = 0  # no partitions (BloomFilter.part of a filter with no bits)
    fp_chance = 1.0

    def may_contain_hash(self, h1: int, h2: int) -> bool:
        return True

    def _check(self) -> None:
        """A filter that fails open has no bits to check."""


#: A scan or a compaction reads a file's data blocks ahead, in runs that start at
#: one block and double up to this many blocks or this many bytes per read (a
#: short scan reads no more than twice what it uses).
READAHEAD_BLOCKS = 64
READAHEAD_BYTES = 1 << 20


class SSTableReader:
    """An open SSTable: footer, index, properties and filter held in memory.

    ``get`` is a range check, one filter probe (by the caller) and, on a
    "maybe", one ``os.pread`` of a single data block.  The file descriptor
    stays open until ``close()``, so a file unlinked by compaction can still
    serve readers that hold this object.
    """

    def __init__(self, path: str, number: int = 0, data: bytes | None = None) -> None:
        self.path = path
        self.number = number
        #: The first of this reader's range of keys in its cache (attach_cache):
        #: block i is cached under cache_base + i.
        self.cache_base = 0
        self.filter_error: str | None = None
        self.level = 0
        #: Hash function for this file's filter when it is keyed (set by the DB
        #: once it knows the secret); None for the fast hash.
        self.keyed_fn: Any = None
        self._filter_stats: dict[str, float] | None = None
        # Counters: cumulative, never reset on read; named by the
        # ArrayCounter attributes below (lsmdb/stats.py).
        self.counts = array("Q", bytes(8 * len(FILE_COUNTERS)))
        self._cache: Any = None  # the shared block cache of payloads, or None
        self._fd = -1
        self._parked = -1  # the descriptor's number after close (see close)
        #: The file mapped read-only (map_file), or None: the C getter
        #: copies a block out of the mapping instead of a pread.
        self.mapped: Any = None
        self._data: bytes | None = None
        if data is None:
            self._fd = open_for_reading(path)
            try:
                self.size_bytes = os.fstat(self._fd).st_size
                self._load(self._pread)
            except BaseException:
                os.close(self._fd)
                self._fd = -1
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
        fd = self._fd
        if fd < 0:
            raise DatabaseClosedError(f"{self.path}: SSTable reader is closed")
        raw = os.pread(fd, size, offset)
        if len(raw) < size and self._fd < 0:  # closed while reading: read /dev/null
            raise DatabaseClosedError(f"{self.path}: SSTable reader is closed")
        return raw

    def _slice(self, size: int, offset: int) -> bytes:
        data = self._data
        if data is None:
            raise DatabaseClosedError(f"{self.path}: SSTable reader is closed")
        return data[offset:offset + size]

    def _read_block(self, read: Any, offset: int, size: int, what: str) -> bytes:
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
        if version != SSTABLE_FORMAT_VERSION:
            raise UnsupportedFormatError(
                f"{path}: SSTable format version {version}; "
                f"this lsmdb reads {SSTABLE_FORMAT_VERSION}")
        self._data_end = foot_off
        self.index_handle = (idx_off, idx_size)
        self.filter_handle = (flt_off, flt_size)
        self.props_handle = (prop_off, prop_size)

        props = blk.unpack(self._read_block(read, prop_off, prop_size, "properties block"),
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
        except (KeyError, TypeError, ValueError):
            raise CorruptionError("properties block is missing fields", path, prop_off) from None
        if type(self.min_key) is not bytes or type(self.max_key) is not bytes:
            raise CorruptionError("properties block key range of the wrong type", path, prop_off)
        self.properties = props

        index = blk.unpack(self._read_block(read, idx_off, idx_size, "index block"),
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
                    or off < 0 or size < 0 or off + size + BLOCK_TRAILER_SIZE > idx_off):
                raise CorruptionError("index block entry invalid", path, idx_off)
            # Reads bisect the index: keys out of order would send a key to the wrong block.
            if prev is not None and key <= prev:
                raise CorruptionError("index block keys out of order", path, idx_off)
            prev = key
        if not self.index_keys or self.index_keys[-1] != self.max_key:
            raise CorruptionError("index block does not match the key range", path, idx_off)

        self.bloom: Any
        self._keyed_bloom: BloomFilter | None = None
        try:
            raw = self._read_block(read, flt_off, flt_size, "filter block")
            self.bloom = BloomFilter.from_bytes(raw, path, flt_off)
            if self.bloom.m and self.bloom.hash_algorithm != FAST_HASHER.algorithm:
                # Probing with any other hash would give false negatives.
                self._keyed_bloom = self.bloom
                self.bloom = _FailOpenFilter()
                self.filter_error = "keyed filter: no secret attached yet"
        except LsmdbError as exc:
            # A filter can only make reads slower, never wrong: fail open.
            self.filter_error = str(exc)
            self.bloom = _FailOpenFilter()
            log.warning("%s: filter unusable, every read will check the data (%s)", path, exc)

    @property
    def hash_algorithm(self) -> int:
        bloom = self._keyed_bloom or self.bloom
        return getattr(bloom, "hash_algorithm", FAST_HASHER.algorithm)

    def attach_hasher(self, keyed: Hasher | None) -> None:
        """Give a keyed filter its hash function, or leave it failing open.

        A keyed filter answers "maybe" until this is called with the secret
        it was built with: forgetting to attach costs speed, never a key.
        """
        bloom = self._keyed_bloom
        if bloom is None:
            return
        if keyed is not None and keyed.algorithm == bloom.hash_algorithm \
                and keyed.key_id == bloom.key_id:
            self.keyed_fn = keyed.fn
            self.bloom = bloom
            self.filter_error = None
            return
        self.filter_error = (f"keyed filter (key id {bloom.key_id}) built with a secret this "
                             "database does not have; the filter fails open")
        log.warning("%s: %s", self.path, self.filter_error)

    # -- reads ------------------------------------------------------------
    def read_data_block(self, i: int, count: bool = True) -> tuple[list[bytes], list[bytes | None]]:
        """Read, check and decode data block ``i`` (one ``os.pread``)."""
        payload, offset = self._read_payload(i, count)
        return blk.decode_data_block(payload, self.path, offset)

    def _read_payload(self, i: int, count: bool = True) -> tuple[bytes, int]:
        """Data block ``i``'s payload, checksum verified, and its offset."""
        raw, offset = self._read_raw(i, count)
        return raw[:-BLOCK_TRAILER_SIZE], offset

    def _read_raw(self, i: int, count: bool = True) -> tuple[bytes, int]:
        """Data block ``i`` as stored (payload and trailer), checksum verified,
        and its offset."""
        offset = self.index_offsets[i]
        size = self.index_sizes[i]
        if self._data is None:
            raw = self._pread(size + BLOCK_TRAILER_SIZE, offset)
        else:
            raw = self._data[offset:offset + size + BLOCK_TRAILER_SIZE]
        if count:
            self.block_reads += 1
        self._check_raw(i, raw)
        return raw, offset

    def _check_raw(self, i: int, raw: bytes | memoryview) -> None:
        """CorruptionError unless ``raw`` is data block ``i`` whole (payload and
        trailer) with a matching checksum."""
        if len(raw) != self.index_sizes[i] + BLOCK_TRAILER_SIZE:
            raise CorruptionError("data block truncated", self.path, self.index_offsets[i])
        if crc32(raw) != CRC32_RESIDUE:  # payload and trailer in one pass
            raise CorruptionError("data block checksum mismatch", self.path,
                                  self.index_offsets[i])

    def read_block_for(self, i: int, key: bytes) -> tuple[list[bytes], list[bytes | None]] | None:
        """Data block ``i`` read from disk for a lookup of ``key`` (then cached,
        if the cache admits it), or None when it certainly does not hold ``key``.

        A key is stored in a block as a msgpack bin among the block's sorted
        keys.  So when the checksum-verified block's keys, walked in place
        (``block_may_hold``; without the C speedups: when the key's bytes
        appear nowhere in the block), do not include the key, it is a false
        positive of the filter, and the block is not decoded: it costs one
        read and one checksum.  It is cached only on its second read within
        the admission's window (``BlockCache.admit_reread``), so that the
        false positives of keys looked up again and again stop reading the
        disk, while those of keys looked up once do not fill the cache.
        Otherwise the block is decoded for this lookup, and its payload cached
        if the cache admits it (``BlockCache.admit``: a full cache, only on
        the block's second read), as the C getter does.
        """
        raw, _offset = self._read_raw(i)
        held = block_may_hold(raw, key)
        block = self.decode_raw(i, raw) if held else None  # a malformed block raises here
        if self._cache is not None:
            self.offer_block(i, raw[:-BLOCK_TRAILER_SIZE], held)
        return block

    def decode_raw(self, i: int, raw: bytes | memoryview) -> tuple[list[bytes], list[bytes | None]]:
        """Data block ``i`` decoded from ``raw`` (payload and verified trailer)."""
        return self._decode_payload(i, raw[:-BLOCK_TRAILER_SIZE])

    def _decode_payload(self, i: int, payload: bytes | memoryview
                        ) -> tuple[list[bytes], list[bytes | None]]:
        """Data block ``i`` decoded from its checksum-verified payload."""
        return blk.decode_data_block(payload, self.path, self.index_offsets[i])

    def find_in_cached(self, i: int, entry: bytes, key: bytes) -> Any:
        """``key``'s value in data block ``i`` as the cache holds it: the value,
        None for a tombstone, or MISSING.  With the C speedups the entry is
        the payload followed by its entries' offsets (``block_entry``), and
        ``entry_find`` bisects the keys in place; without them it is the
        payload, decoded here (as is one ``entry_find`` cannot read: then the
        decoder raises CorruptionError if it is malformed)."""
        if _entry_find is not None:
            try:
                return _entry_find(entry, key, MISSING)
            except ValueError:
                pass
        keys, values = self._decode_cached(i, entry)
        j = bisect_left(keys, key)
        return values[j] if j < len(keys) and keys[j] == key else MISSING

    def _cached_payload(self, i: int, entry: bytes) -> memoryview:
        """Data block ``i``'s payload in its cache entry (its first bytes)."""
        return memoryview(entry)[:self.index_sizes[i]]

    def _decode_cached(self, i: int, entry: bytes) -> tuple[list[bytes], list[bytes | None]]:
        """Data block ``i`` decoded from its cache entry: through its offsets
        (``entry_lists``) with the C speedups, else from its payload."""
        if _entry_lists is not None:
            try:
                return _entry_lists(entry)
            except ValueError:
                pass
        return self._decode_payload(i, self._cached_payload(i, entry))

    def block_for(self, key: bytes) -> int:
        """Index of the only data block that can hold ``key`` (len(index) if none)."""
        return bisect_left(self.index_keys, key)

    def find(self, key: bytes) -> Any:
        """The value, None for a tombstone, or MISSING; reads at most one block.

        The block comes from the shared cache when it holds it, else from
        disk with exactly one ``os.pread``.
        """
        index_keys = self.index_keys
        i = bisect_left(index_keys, key)
        if i == len(index_keys):
            return MISSING
        keys, values = self.load_block(i)
        j = bisect_left(keys, key)
        if j < len(keys) and keys[j] == key:
            return values[j]
        return MISSING

    def load_block(self, i: int) -> tuple[list[bytes], list[bytes | None]]:
        """Data block ``i`` from the cache (a counted hit), or from disk (then
        cached if the cache admits it)."""
        block = self.cached_block(i)
        if block is None:
            return self.fetch_block(i)
        self.block_cache_hits += 1
        return block

    def cached_block(self, i: int) -> tuple[list[bytes], list[bytes | None]] | None:
        """Data block ``i`` decoded from the cache's copy, if the cache holds
        it (marked as used; not counted)."""
        cache = self._cache
        entry = cache.get(self.cache_base + i) if cache is not None else None
        return None if entry is None else self._decode_cached(i, entry)

    def fetch_block(self, i: int) -> tuple[list[bytes], list[bytes | None]]:
        """Data block ``i`` read from disk (a counted read), then cached if the
        cache admits it (``BlockCache.admit``, as for a get's block: a full
        cache only on the block's second read), so that shadow mode's reads
        cannot flush a cache that a loop of ``get`` would have kept.
        (``get_many``'s blocks for several keys go through ``read_block`` and
        ``offer_block``.)"""
        block, payload = self.read_block(i)
        self.offer_block(i, payload, held=True)
        return block

    def read_block(self, i: int) -> tuple[tuple[list[bytes], list[bytes | None]], bytes]:
        """Data block ``i`` read from disk (a counted read) and decoded, not
        cached: (block, its checksum-verified payload), for ``offer_block``
        once the caller knows whether it held what was looked for."""
        payload, _offset = self._read_payload(i)
        return self._decode_payload(i, payload), payload

    def offer_block(self, i: int, payload: bytes, held: bool) -> None:
        """Cache data block ``i`` (its payload, as ``read_block`` gave it) if
        the cache admits it: as a get's block (``BlockCache.admit``) when it
        held a key looked up in it, else as a false positive's
        (``BlockCache.admit_reread``: only on its second read), as the C
        getter offers the blocks it reads."""
        cache = self._cache
        if cache is not None and (cache.admit if held else cache.admit_reread)(self.cache_base + i):
            self._remember(i, payload)

    def _remember(self, i: int, payload: bytes) -> None:
        """Cache data block ``i`` from its payload (checksum verified and
        decoded): with the C speedups as ``block_entry`` makes it (not cached
        if that refuses it), else the payload itself."""
        if self._cache is None:
            return
        entry = payload
        if _block_entry is not None:
            try:
                entry = _block_entry(payload)
            except ValueError:
                return
        self._cache.put(self.cache_base + i, entry, len(entry))

    def iter_range(self, start: bytes | None, end: bytes | None,
                   reverse: bool = False) -> Iterator[tuple[bytes, bytes | None]]:
        """(key, value|None) with start <= key < end, one block in memory at a
        time.  The per-entry work runs in C (``zip`` over block slices)."""
        return chain.from_iterable(zip(k, v, strict=True)
                                   for k, v in self.chunks(start, end, reverse))

    def chunks(self, start: bytes | None, end: bytes | None,
               reverse: bool = False) -> Iterator[tuple[list[bytes], list[bytes | None]]]:
        """The entries with start <= key < end as (keys, values) lists, a data
        block at a time, in key order (descending when ``reverse``): what
        :func:`lsmdb.merge.merge_newest` takes.

        Blocks the cache holds are used as they are (counted as cache hits);
        the others are read from disk and not cached, so a long scan does not
        push out the blocks point reads keep hot.
        """
        index_keys = self.index_keys
        nblocks = len(index_keys)
        i = 0 if start is None else bisect_left(index_keys, start)
        last = nblocks - 1 if end is None else min(bisect_left(index_keys, end), nblocks - 1)
        order = range(i, last + 1) if not reverse else range(last, i - 1, -1)
        lookup = self._cache.lookup if self._cache is not None else None
        base = self.cache_base
        ahead: dict[int, bytes | memoryview] = {}  # blocks read ahead, not yet yielded
        span = 1                      # blocks the next read ahead takes
        for n, b in enumerate(order):
            block = lookup(base + b) if lookup is not None else None
            if block is None:
                raw = ahead.pop(b, None)
                if raw is None:
                    ahead = self._read_ahead(order[n:n + span])
                    span = min(2 * span, READAHEAD_BLOCKS)
                    raw = ahead.pop(b)
                self._check_raw(b, raw)  # as used: a block read ahead, unused, fails nothing
                keys, values = self.decode_raw(b, raw)
            else:
                keys, values = self._decode_cached(b, block)
                self.block_cache_hits += 1
            lo = 0 if start is None else bisect_left(keys, start)
            hi = len(keys) if end is None else bisect_left(keys, end)
            if lo >= hi:
                continue
            if lo or hi < len(keys):
                keys, values = keys[lo:hi], values[lo:hi]
            if reverse:
                keys, values = keys[::-1], values[::-1]
            yield keys, values

    def _read_ahead(self, blocks: range) -> dict[int, bytes | memoryview]:
        """Data blocks ``blocks`` (ascending or descending, at least one) as
        stored (payload and trailer, not yet checked: the caller checks each
        block it uses), by block number: the longest run of them from the
        first that lies back to back in the file, up to ``READAHEAD_BYTES``,
        in one read (one ``os.pread``, one hand-off of the GIL), each counted
        as a block read.  A block cut short by the end of the file comes back
        short."""
        offsets, sizes = self.index_offsets, self.index_sizes
        if self._data is not None:  # the file is in memory: nothing to read ahead
            b = blocks[0]
            self.block_reads += 1
            return {b: self._data[offsets[b]:offsets[b] + sizes[b] + BLOCK_TRAILER_SIZE]}
        run = [blocks[0]]
        lo = offsets[blocks[0]]
        hi = lo + sizes[blocks[0]] + BLOCK_TRAILER_SIZE
        for b in blocks[1:]:
            b_lo, b_hi = offsets[b], offsets[b] + sizes[b] + BLOCK_TRAILER_SIZE
            if b_lo == hi and b_hi - lo <= READAHEAD_BYTES:
                hi = b_hi
            elif b_hi == lo and hi - b_lo <= READAHEAD_BYTES:
                lo = b_lo
            else:
                break
            run.append(b)
        data = self._pread(hi - lo, lo)
        if len(run) == 1:
            self.block_reads += 1
            return {run[0]: data}
        view = memoryview(data)
        out: dict[int, bytes | memoryview] = {}
        for b in run:
            offset = offsets[b] - lo
            out[b] = view[offset:offset + sizes[b] + BLOCK_TRAILER_SIZE]
            self.block_reads += 1
        return out

    def bloom_memory_bytes(self) -> int:
        """Bytes the filter's bit array holds in memory."""
        return getattr(self.bloom, "size_bytes", 0)

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

    def filter_stats(self) -> dict[str, float]:
        """fill ratio and what it implies; computed once (the bits never change)."""
        if self._filter_stats is None:
            bloom = self.bloom
            if isinstance(bloom, BloomFilter) and bloom.m:
                est = bloom.estimated_keys_from_fill()
                self._filter_stats = {
                    "fill_ratio": bloom.fill_ratio,
                    "estimated_fpr_from_fill": bloom.estimated_fpr_from_fill(),
                    "estimated_keys_from_fill": est,
                }
            else:
                self._filter_stats = {"fill_ratio": 0.0, "estimated_fpr_from_fill": 1.0,
                                      "estimated_keys_from_fill": 0.0}
        return self._filter_stats

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
        if (_map_file is None or self._fd < 0 or not self.size_bytes
                or os.name != "posix" or sys.maxsize <= 2 ** 32):
            return False
        try:
            self.mapped = _map_file(self._fd, self.size_bytes)
        except (OSError, ValueError, OverflowError) as exc:
            log.warning("%s: not mapped (%s); reading with pread", self.path, exc)
            return False
        return True

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
        fd = self._fd
        if fd < 0:
            return
        self._fd = -1
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
            end = off + size + BLOCK_TRAILER_SIZE
        if end > self._data_end or keys[-1] != self.max_key or self.min_key > keys[0]:
            raise AssertionError(f"{self.path}: index does not match the key range")
        if not 0 <= self.tombstones <= self.entries or not 0 <= self.min_seq <= self.max_seq:
            raise AssertionError(f"{self.path}: properties out of range")
        if len(self.counts) != len(FILE_COUNTERS) or self.cache_base < 0 or self.level < 0:
            raise AssertionError(f"{self.path}: counters or cache keys out of range")
        self.bloom._check()
        if self.mapped is not None and self.mapped.size != self.size_bytes:
            raise AssertionError(f"{self.path}: mapping of {self.mapped.size} bytes")

    def __del__(self) -> None:
        for name in ("_fd", "_parked"):  # nothing reads through a reader being freed
            fd = getattr(self, name, -1)
            if fd >= 0:
                setattr(self, name, -1)
                try:
                    os.close(fd)
                except OSError:
                    pass
