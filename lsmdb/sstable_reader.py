"""Reading SSTables: ``SSTableReader`` keeps footer, index, properties and filter in
memory and reads a point lookup's data block with one ``os.pread``; scans and
compactions (``chunks``) read runs of blocks ahead, one ``os.pread`` per run.

See :mod:`lsmdb.sstable_format` for the layout.  The filter is held as a
:class:`lsmdb.filters.FilterHandle`: one that cannot be decoded (or a keyed
filter without its secret) fails open, and every probe answers "maybe".
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
from .coding import BLOCK_TRAILER_SIZE, CRC32_RESIDUE, crc32
from .errors import CorruptionError, DatabaseClosedError, UnsupportedFormatError
from .files import open_for_reading
from .filters import FilterHandle
from .filters.hashing import Hasher
from .sstable_format import (
    FOOTER,
    FOOTER_CRC_SPAN,
    FOOTER_SIZE,
    MISSING,
    SSTABLE_FORMAT_VERSION,
    SSTABLE_MAGIC,
)
from .stats import BLOCK_CACHE_HITS, FALSE_POSITIVES, FILE_COUNTERS, TRUE_POSITIVES, ArrayCounter

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

#: A decoded data block: its keys in order, and their values (None: a tombstone).
Block = tuple[list[bytes], list[bytes | None]]


#: A scan or a compaction reads a file's data blocks ahead, in runs that start at
#: one block and double up to this many blocks or this many bytes per read (a
#: short scan reads no more than twice what it uses).
READAHEAD_BLOCKS = 64
READAHEAD_BYTES = 1 << 20


class SSTableReader:
    """An open SSTable: footer, index, properties and filter held in memory.

    A point read is a range check and a filter probe (by the caller) and, on
    a "maybe", ``lookup``: one data block from the cache or one ``os.pread``.
    The data block methods: ``block_for`` (which block can hold a key),
    ``read_block`` (one from disk, not cached), ``block_entries`` and
    ``find`` (through the cache), ``lookup`` and ``lookup_many`` (through the
    cache, counted as the filter's true or false positives), ``chunks`` and
    ``iter_range`` (a key range, blocks read ahead).  The file descriptor
    stays open until ``close()``, so a file unlinked by compaction can still
    serve readers that hold this object.
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
        if version != SSTABLE_FORMAT_VERSION:
            raise UnsupportedFormatError(
                f"{path}: SSTable format version {version}; "
                f"this lsmdb reads {SSTABLE_FORMAT_VERSION}")
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
                    or off < 0 or size < 0 or off + size + BLOCK_TRAILER_SIZE > idx_off):
                raise CorruptionError("index block entry invalid", path, idx_off)
            # Reads bisect the index: keys out of order would send a key to the wrong block.
            if prev is not None and key <= prev:
                raise CorruptionError("index block keys out of order", path, idx_off)
            prev = key
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
    # A data block is read whole, payload and trailer, and its checksum
    # verified before any of it is used.  ``read_block`` reads one for tools
    # (not cached); ``block_entries`` and ``find`` go through the block cache;
    # ``lookup`` and ``lookup_many`` are the read path's step after a
    # filter's "maybe", counted as its true or false positives; ``chunks``
    # walks a key range for scans and compactions.

    def block_for(self, key: bytes) -> int:
        """Index of the only data block that can hold ``key`` (len(index) if none)."""
        return bisect_left(self.index_keys, key)

    def read_block(self, i: int, count: bool = True) -> Block:
        """Data block ``i``'s (keys, values) read from disk (one ``os.pread``),
        checksum verified and decoded; counted as a block read unless
        ``count`` is False; not cached."""
        return self._decode(i, self._read_raw(i, count)[:-BLOCK_TRAILER_SIZE])

    def block_entries(self, i: int) -> Block:
        """Data block ``i``'s (keys, values) from the cache (a counted hit), or
        read from disk (a counted read) and then cached if the cache admits it
        as a get's block (``BlockCache.admit``: a full cache only on the
        block's second read), so that shadow mode's reads cannot flush a
        cache that a loop of ``get`` would have kept."""
        cache = self._cache
        entry = cache.get(self.cache_base + i) if cache is not None else None
        if entry is not None:
            self.block_cache_hits += 1
            return self._decode_entry(i, entry)
        payload = self._read_raw(i)[:-BLOCK_TRAILER_SIZE]
        block = self._decode(i, payload)
        self._offer(i, payload, held=True)
        return block

    def find(self, key: bytes) -> Any:
        """The value, None for a tombstone, or MISSING: ``key`` looked up in the
        one data block that can hold it (``block_entries``: the cache's copy,
        else one ``os.pread``).  Not counted as a filter's true or false
        positive (shadow mode and tools)."""
        i = self.block_for(key)
        if i == len(self.index_keys):
            return MISSING
        keys, values = self.block_entries(i)
        j = bisect_left(keys, key)
        return values[j] if j < len(keys) and keys[j] == key else MISSING

    def lookup(self, key: bytes, i: int = -1) -> Any:
        """After a filter's "maybe": ``key``'s value here (None: a tombstone),
        or MISSING (a false positive), from the one data block that can hold
        it -- the cache's copy (a hit), else read from disk (a block read) --
        counted as a true or a false positive.  ``i`` >= 0: the C getter found
        that block ``i`` is the one and that the cache does not hold it, so it
        is read from disk straight away.

        A key is stored in a block as a msgpack bin among the block's sorted
        keys.  So when the checksum-verified block read from disk, its keys
        walked in place (``block_may_hold``; without the C speedups: when the
        key's bytes appear nowhere in it), does not hold the key, the block is
        not decoded: a false positive costs one read and one checksum, and its
        block is cached only on its second read within the admission's window
        (``BlockCache.admit_reread``), so that the false positives of keys
        looked up again and again stop reading the disk, while those of keys
        looked up once do not fill the cache.  A block that may hold it is
        decoded and cached if the cache admits it (``BlockCache.admit``), as
        the C getter does."""
        counts = self.counts
        cache = self._cache
        if i < 0:
            index_keys = self.index_keys
            i = bisect_left(index_keys, key)
            if i == len(index_keys):
                counts[FALSE_POSITIVES] += 1
                return MISSING
            entry = cache.get(self.cache_base + i) if cache is not None else None
            if entry is not None:
                counts[BLOCK_CACHE_HITS] += 1
                value = self._find_in_entry(i, entry, key)
                counts[FALSE_POSITIVES if value is MISSING else TRUE_POSITIVES] += 1
                return value
        raw = self._read_raw(i)
        value = MISSING
        held = block_may_hold(raw, key)
        if held:
            keys, values = self._decode(i, raw[:-BLOCK_TRAILER_SIZE])  # a malformed block raises
            j = bisect_left(keys, key)
            if j < len(keys) and keys[j] == key:
                value = values[j]
        if cache is not None:
            self._offer(i, raw[:-BLOCK_TRAILER_SIZE], held)
        counts[FALSE_POSITIVES if value is MISSING else TRUE_POSITIVES] += 1
        return value

    def lookup_many(self, keys: list[bytes]) -> list[Any]:
        """``lookup`` of each of ``keys`` (get_many's step after the filter),
        each distinct data block taken from the cache or read from disk once
        for all the keys it can hold.  Counted as a loop of ``lookup`` would
        count them -- a cache hit per key a cached block answers -- except
        that a block several keys need, read from disk, is one block read,
        and is cached if the cache admits it as a get's block when it held one
        of them, as a false positive's when it held none."""
        out: list[Any] = [MISSING] * len(keys)
        index_keys = self.index_keys
        by_block: dict[int, list[int]] = {}
        for n, key in enumerate(keys):
            by_block.setdefault(bisect_left(index_keys, key), []).append(n)
        cache = self._cache
        tp = fp = 0
        for b, members in by_block.items():
            if len(members) == 1 or b == len(index_keys):
                for n in members:
                    out[n] = self.lookup(keys[n])
                continue
            entry = cache.get(self.cache_base + b) if cache is not None else None
            payload = None
            if entry is not None:
                self.block_cache_hits += len(members)
                block_keys, values = self._decode_entry(b, entry)
            else:  # from disk, once for them all
                payload = self._read_raw(b)[:-BLOCK_TRAILER_SIZE]
                block_keys, values = self._decode(b, payload)
            found = tp
            for n in members:
                key = keys[n]
                j = bisect_left(block_keys, key)
                if j < len(block_keys) and block_keys[j] == key:
                    tp += 1
                    out[n] = values[j]
                else:
                    fp += 1
            if payload is not None:
                self._offer(b, payload, held=tp > found)
        self.true_positives += tp
        self.false_positives += fp
        return out

    def iter_range(self, start: bytes | None, end: bytes | None,
                   reverse: bool = False) -> Iterator[tuple[bytes, bytes | None]]:
        """(key, value|None) with start <= key < end, one block in memory at a
        time.  The per-entry work runs in C (``zip`` over block slices)."""
        return chain.from_iterable(zip(k, v, strict=True)
                                   for k, v in self.chunks(start, end, reverse))

    def chunks(self, start: bytes | None, end: bytes | None,
               reverse: bool = False) -> Iterator[Block]:
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
                self._verify(b, raw)  # as used: a block read ahead, unused, fails nothing
                keys, values = self._decode(b, raw[:-BLOCK_TRAILER_SIZE])
            else:
                keys, values = self._decode_entry(b, block)
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

    # -- data blocks: the private steps -------------------------------------
    def _read_raw(self, i: int, count: bool = True) -> bytes:
        """Data block ``i`` as stored (payload and trailer), checksum verified:
        one ``os.pread`` (or a slice of the file in memory), counted as a
        block read unless ``count`` is False."""
        offset = self.index_offsets[i]
        size = self.index_sizes[i] + BLOCK_TRAILER_SIZE
        if self._data is None:
            raw = self._pread(size, offset)
        else:
            raw = self._data[offset:offset + size]
        if count:
            self.block_reads += 1
        self._verify(i, raw)
        return raw

    def _verify(self, i: int, raw: bytes | memoryview) -> None:
        """CorruptionError unless ``raw`` is data block ``i`` whole (payload and
        trailer) with a matching checksum."""
        if len(raw) != self.index_sizes[i] + BLOCK_TRAILER_SIZE:
            raise CorruptionError("data block truncated", self.path, self.index_offsets[i])
        if crc32(raw) != CRC32_RESIDUE:  # payload and trailer in one pass
            raise CorruptionError("data block checksum mismatch", self.path,
                                  self.index_offsets[i])

    def _decode(self, i: int, payload: bytes | memoryview) -> Block:
        """Data block ``i`` decoded from its checksum-verified payload."""
        return blk.decode_data_block(payload, self.path, self.index_offsets[i])

    def _decode_entry(self, i: int, entry: bytes) -> Block:
        """Data block ``i`` decoded from its cache entry: through its offsets
        (``entry_lists``) with the C speedups, else from its payload (the
        entry's first bytes)."""
        if _entry_lists is not None:
            try:
                return _entry_lists(entry)
            except ValueError:
                pass
        return self._decode(i, memoryview(entry)[:self.index_sizes[i]])

    def _find_in_entry(self, i: int, entry: bytes, key: bytes) -> Any:
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
        keys, values = self._decode_entry(i, entry)
        j = bisect_left(keys, key)
        return values[j] if j < len(keys) and keys[j] == key else MISSING

    def _offer(self, i: int, payload: bytes, held: bool) -> None:
        """Cache data block ``i`` from its checksum-verified payload if the
        cache admits it: as a get's block (``BlockCache.admit``) when it held a
        key looked up in it, else as a false positive's
        (``BlockCache.admit_reread``: only on its second read), as the C
        getter offers the blocks it reads.  The entry is what ``block_entry``
        makes of the payload with the C speedups (not cached if that refuses
        it), else the payload itself."""
        cache = self._cache
        key = self.cache_base + i
        if cache is None or not (cache.admit if held else cache.admit_reread)(key):
            return
        entry = payload
        if _block_entry is not None:
            try:
                entry = _block_entry(payload)
            except ValueError:
                return
        cache.put(key, entry, len(entry))

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
        self.filter._check()
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
