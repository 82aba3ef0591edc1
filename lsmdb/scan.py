"""Scans: a table's entries in key order over a pinned view, and a file's blocks read ahead.

A scan (:func:`scan`) takes the table's memtables and its current
:class:`~lsmdb.version.Version` -- a reference that keeps the version's files on
disk until the scan ends -- and merges, newest first (:mod:`lsmdb.merge`), each
memtable's range and each file whose key range meets it.  A file is walked
by :func:`chunks`: its data blocks in runs read ahead (one ``os.pread`` a run,
doubling from one block up to ``READAHEAD_BLOCKS`` or ``READAHEAD_BYTES``),
each checked and decoded only as it is used; the blocks the block cache holds
are used as they are (counted as ``block_cache_hits``), the others read and
counted as ``block_reads`` but not cached, so a long scan does not push out
the blocks point reads keep hot.  Compactions read their inputs the same way.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from itertools import chain
from typing import TYPE_CHECKING, Any, Protocol

from . import block as blk
from .block import Block, tags_for
from .block import entry_lists as _py_entry_lists
from .fastpath import seq_overlap
from .keys import as_key
from .merge import merge_newest
from .sstable_format import KIND_BITS, KIND_VALUE, MAX_SEQ
from .sstable_reader import READAHEAD_BLOCKS, SSTableReader
from .stats import BLOCK_CACHE_HITS, BLOCK_READS
from .ttl import resolve

_c_entry_lists: Callable[[bytes], Block] | None
try:  # optional C speedups (lsmdb/csrc/block.c)
    from ._speedups import entry_lists as _c_entry_lists
except ImportError:  # pragma: no cover - built without a C compiler
    _c_entry_lists = None

if TYPE_CHECKING:
    from .memtable import Memtable
    from .table import TableState
    from .version import Version
    from .versions import Versions


def entry_lists(entry: bytes) -> Block:
    """The (keys, values) of a cached block (lsmdb.block.entry_lists; C where built)."""
    if _c_entry_lists is not None:
        return _c_entry_lists(entry)
    return _py_entry_lists(entry)


def entry_tagged(reader: SSTableReader, entry: bytes) -> tuple[list[bytes], list[Any],
                                                               list[int]]:
    """(keys, values, tags) of a cached block of ``reader``'s file: a format-2
    block's payload holds its tags; a format-1 file's entries are tagged as
    ``SSTableReader.decode_full`` tags them."""
    if reader.version < 2:
        keys, values = entry_lists(entry)
        return keys, values, tags_for(values, reader.max_seq)
    return blk.entry_tagged(entry)  # one decode


def chunks(reader: SSTableReader, start: bytes | None, end: bytes | None,
           reverse: bool = False, tagged: bool = False, now_us: int | None = None,
           keep_expiring: bool = False, with_tags: bool = False) -> Iterator[Any]:
    """The entries of ``reader``'s file with start <= key < end as (keys, values)
    lists, a data block at a time, in key order (descending when ``reverse``):
    what :func:`lsmdb.merge.merge_newest` takes; (keys, values, tags) lists
    when ``tagged`` (a compaction's, whole blocks), expiring values as
    (value, expires) tuples.  With ``now_us``, a scan's: expiring values read
    as they are at that moment (lsmdb.ttl.resolve; ``keep_expiring``, the
    live ones stay tuples).  ``with_tags``: a scan's chunks with their tags,
    (keys, values, tags), for a merge by sequence number.  See the module
    docstring."""
    index_keys = reader.index_keys
    nblocks = len(index_keys)
    i = 0 if start is None else bisect_left(index_keys, start)
    last = nblocks - 1 if end is None else min(bisect_left(index_keys, end), nblocks - 1)
    order = range(i, last + 1) if not reverse else range(last, i - 1, -1)
    cache = reader.cache
    lookup = cache.lookup if cache is not None else None
    base = reader.cache_base
    counts = reader.counts
    ahead: dict[int, Any] = {}   # blocks read ahead, not yet yielded
    span = 1                      # blocks the next read ahead takes
    for n, b in enumerate(order):
        entry = lookup(base + b) if lookup is not None else None
        if entry is None:
            raw = ahead.pop(b, None)
            if raw is None:
                ahead = reader.read_run(order[n:n + span])
                counts[BLOCK_READS] += len(ahead)
                span = min(2 * span, READAHEAD_BLOCKS)
                raw = ahead.pop(b)
            reader.check_raw(b, raw)  # as used: a block read ahead, unused, fails nothing
            if tagged:
                yield reader.decode_full(b, raw)
                continue
            if with_tags:
                keys, values, tags = reader.decode_full(b, raw)
            else:
                keys, values = reader.decode_raw(b, raw)
        else:
            counts[BLOCK_CACHE_HITS] += 1
            if tagged:
                yield entry_tagged(reader, entry)
                continue
            if with_tags:
                keys, values, tags = entry_tagged(reader, entry)
            else:
                keys, values = entry_lists(entry)
        lo = 0 if start is None else bisect_left(keys, start)
        hi = len(keys) if end is None else bisect_left(keys, end)
        if lo >= hi:
            continue
        if lo or hi < len(keys):
            keys, values = keys[lo:hi], values[lo:hi]
            if with_tags:
                tags = tags[lo:hi]
        if reverse:
            keys, values = keys[::-1], values[::-1]
            if with_tags:
                tags = tags[::-1]
        if now_us is not None and reader.version >= 3:
            values = resolve(values, now_us, keep_expiring)
        if with_tags:
            yield keys, values, tags
        else:
            yield keys, values


def items(reader: SSTableReader, start: bytes | None = None, end: bytes | None = None,
          reverse: bool = False) -> Iterator[tuple[bytes, bytes | None]]:
    """(key, value|None) of ``reader``'s file with start <= key < end, tombstones
    included, one block in memory at a time (``chunks``, walked in C by zip)."""
    return chain.from_iterable(zip(k, v, strict=True) for k, v in chunks(reader, start, end,
                                                                           reverse))


def prefix_end(prefix: bytes) -> bytes | None:
    """Smallest key greater than every key starting with ``prefix`` (None: no bound)."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return None
    p[-1] += 1
    return bytes(p)


def bounds_of(start: Any, end: Any, prefix: Any) -> tuple[bytes | None, bytes | None]:
    """The (lo, hi) of a scan's start, end and prefix: start <= key < end, and
    keys with the prefix (None: no bound)."""
    lo = None if start is None else as_key(start)
    hi = None if end is None else as_key(end)
    if prefix is not None:
        p = as_key(prefix)
        if lo is None or lo < p:
            lo = p
        pe = prefix_end(p)
        if pe is not None and (hi is None or hi > pe):
            hi = pe
    return lo, hi


class ScanIterator(Protocol):
    """What ``scan`` returns (from a DB, a Table or a Snapshot): an iterator of
    (key, value) pairs with ``seek(key)`` -- the next pair is then the first
    with a key at or after ``key`` (at or before it when the scan is reversed),
    within the scan's bounds and its view -- and ``close()``, which lets the
    view go before the end.  Once it is exhausted or closed it cannot seek
    (ValueError).  One thread at a time: a call while another runs is a
    ValueError."""

    def __iter__(self) -> ScanIterator: ...
    def __next__(self) -> tuple[bytes, bytes]: ...
    def seek(self, key: Any, /) -> None: ...
    def close(self) -> None: ...


def view_scan(mem: list[tuple[list[bytes], list[Any]]], imms: Sequence[Memtable],
              version: Version | None, lo: bytes | None, hi: bytes | None,
              reverse: bool, now_us: int = 0, keep_expiring: bool = False,
              bound: int | None = None, extra: Sequence[SSTableReader] = ()) -> ScanIterator:
    """A scan over a view: ``mem``, the active memtable's entries in [lo, hi)
    copied when the view was taken (one ascending (keys, values) chunk, or
    none), the frozen memtables ``imms`` (newest first), and ``version``'s
    files, which the scan holds (``version`` acquired for it: released when the
    scan ends).  Expiring values read as they were at ``now_us``, the moment
    the view was taken (``keep_expiring``: the live ones come out as (value,
    expires) tuples, an export's).  ``seek`` starts the merge again from a key
    over the same view.  ``bound`` (a snapshot that followed a compaction,
    lsmdb.history): the files' entries above that sequence number are passed
    over, and the history files ``extra`` are read too; the merge takes each
    key's highest number."""

    by_seq = version is not None and (bound is not None or seq_overlap(version.l0))

    def sources(a: bytes | None, b: bytes | None) -> list[Any]:
        out: list[Any] = []
        if mem:
            keys, values = mem[0]
            i = 0 if a is None else bisect_left(keys, a)
            j = len(keys) if b is None else bisect_left(keys, b)
            if i < j:
                ks, vs = keys[i:j], resolve(values[i:j], now_us, keep_expiring)
                out.append([(ks[::-1], vs[::-1]) if reverse else (ks, vs)])
        for imm in imms:  # frozen: they never change
            if len(imm):
                chunk = imm.chunk_range(a, b, reverse)
                if chunk:
                    if imm.expiring:
                        ks, vs = chunk[0]
                        chunk = [(ks, resolve(vs, now_us, keep_expiring))]
                    out.append(chunk)
        if by_seq:  # the memtables' entries newer than any file's: the highest number
            out = [[(ks, vs, [NEWER_THAN_FILES] * len(ks)) for ks, vs in src] for src in out]
        if version is not None:
            for r in (*version.in_read_order(), *extra):  # newest first, as the merge wants
                if (b is None or r.min_key < b) and (a is None or r.max_key >= a) and (
                        bound is None or r.min_seq <= bound):
                    src = chunks(r, a, b, reverse, now_us=now_us,
                                 keep_expiring=keep_expiring, with_tags=by_seq)
                    out.append(src if bound is None or r.max_seq <= bound else
                               not_above(src, bound))
        return out

    def reseek(key: Any) -> list[Any]:
        k = key if type(key) is bytes else as_key(key)  # a bound: any length will do
        a, b = lo, hi
        if not reverse:
            a = k if a is None or k > a else a
        else:
            above = k + b"\x00"  # the smallest key after k: the range ends at k
            b = above if b is None or above < b else b
        if a is not None and b is not None and a >= b:
            return []
        return sources(a, b)

    try:
        first = sources(lo, hi)
    except BaseException:
        if version is not None:
            version.release()
        raise
    return merge_newest(first, reverse, pin=version, reseek=reseek,  # type: ignore[return-value]
                        untag=by_seq)


def not_above(source: Iterator[Any], bound: int) -> Iterator[Any]:
    """Tagged chunks of ``source`` without the entries whose sequence number is
    above ``bound`` (what a snapshot does not see)."""
    for keys, values, tags in source:
        keep = [j for j, t in enumerate(tags) if t >> KIND_BITS <= bound]
        if len(keep) == len(tags):
            yield keys, values, tags
        elif keep:
            yield [keys[j] for j in keep], [values[j] for j in keep], [tags[j] for j in keep]


#: The tag a merge by sequence number gives memtable entries (lsmdb.merge):
#: above every file's, a value's kind (the merge reads only the number).
NEWER_THAN_FILES = MAX_SEQ << KIND_BITS | KIND_VALUE



def scan(versions: Versions, state: TableState, start: Any, end: Any, prefix: Any,
         reverse: bool, keep_expiring: bool = False, now_us: int | None = None) -> ScanIterator:
    """(key, value) pairs of ``state`` with start <= key < end (and ``prefix``), in key
    order (``reverse``: descending), over a view taken now: later writes,
    flushes and compactions do not change what it returns, and a value that
    expires later still comes out (``keep_expiring``: as a (value, expires)
    tuple; ``now_us``: the moment expiry is read at, None: the clock's now,
    asked only where a value may expire).  One data block per SSTable is in
    memory at a time; the view's files stay on disk until the iterator is
    exhausted, closed or freed."""
    versions.check_open()
    lo, hi = bounds_of(start, end, prefix)
    reverse = bool(reverse)
    if lo is not None and hi is not None and lo >= hi:
        return view_scan([], (), None, lo, hi, reverse)
    with versions.lock:  # a consistent view of the active memtable (age 0)
        mem, imms, version = state.mem, state.imms, state.version.acquire()
        try:
            snapshot = mem.chunk_range(lo, hi)
            if now_us is None:
                now_us = state.now_us() if state.may_expire() else 0
        except BaseException:
            version.release()
            raise
    return view_scan(snapshot, imms, version, lo, hi, reverse, now_us, keep_expiring)
