"""K-way merge of sorted sources: newest version of each key wins, tombstones hidden.

Sources come newest first; each yields ``(keys, values)`` chunks (a data
block, a memtable's range) in key order, or ``(keys, values, tags)`` chunks
(a compaction's, lsmdb.block's tags), whose entries come out as
``(key, value, tag)``.  Of equal keys the newest version wins: in untagged
chunks the newest source's, in tagged ones the highest sequence number's
(``tag >> 8``; among equal numbers the newest source's), so tagged sources
may overlap in age.  With the C speedups the merge is
``lsmdb._speedups.Merge``, which walks the chunks in place; without them each
entry is given an order -- its source's age (0 = newest), after minus its
sequence number when tagged; all negated when ``reverse``, so that for equal
keys the newest version comes first either way -- and merged by
``heapq.merge`` plus one comparison per entry.
Complexity O(N log S) for N entries over S sources, one block per source in
memory.

A merge can hold a *pin* (a scan's :class:`~lsmdb.version.Version`): its
``release()`` runs exactly once, when the merge ends -- exhausted, failed,
closed (``close()``) or freed, started or not -- so the files a scan reads
stay on disk while it runs and go when it ends.  Like a generator, a merge
refuses a ``next()`` or ``close()`` while one of its calls runs (ValueError):
one iterator is read by one thread at a time.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from itertools import chain, repeat
from typing import Any, Protocol

from .sstable_format import KIND_BITS

try:  # the same merge with the heap in C (lsmdb/csrc/merge.c)
    from ._speedups import Merge as _CMerge
except ImportError:  # pragma: no cover - built without a C compiler
    _CMerge = None  # type: ignore[assignment,misc]

#: Whether merges use lsmdb._speedups.Merge (tests switch it off to compare).
USE_SPEEDUPS = _CMerge is not None

_NOTHING = object()


def tag_for(age: int, reverse: bool) -> int:
    """The tag source number ``age`` (0 = newest) carries in the Python merge."""
    return -age if reverse else age


Chunks = Iterable[tuple[list[Any], ...]]


class Pin(Protocol):
    """What a merge holds for its readers until it ends (a Version)."""

    def release(self) -> None: ...


def merge_newest(sources: list[Chunks], reverse: bool = False, keep_tombstones: bool = False,
                 pin: Pin | None = None,
                 reseek: Callable[[bytes], list[Chunks]] | None = None,
                 untag: bool = False, snapshots: Sequence[int] | None = None,
                 kept: list[tuple[int, bytes, Any, int]] | None = None
                 ) -> Iterator[tuple[bytes, bytes | None]]:
    """Merge ``sources`` -- newest first, each yielding (keys, values) chunks in
    key order (descending when ``reverse``) -- into one stream of (key, value)
    pairs: the newest version of each key, tombstones hidden unless
    ``keep_tombstones``; ``pin.release()`` once when it ends (module docstring).
    With a pin, the stream has ``close()``.  With ``reseek``, it has
    ``seek(key)`` too: the merge starts again over the sources
    ``reseek(key)`` gives (those from ``key`` on), its pin kept; refused
    (ValueError) once the merge has ended.  ``untag``: tagged entries come
    out as (key, value) pairs too (a scan's merge by sequence number).
    ``snapshots`` (sequence numbers, descending) and ``kept`` (a list): a
    compaction's merge of tagged sources while snapshots live -- of each
    key's older versions, the one each snapshot reads where it is not the
    newest is appended to ``kept`` as (depth, key, value, tag), depth 0 for
    the second version kept, 1 for the third (lsmdb.history)."""
    if USE_SPEEDUPS:
        return _CMerge(sources, reverse, keep_tombstones, pin, reseek, untag, snapshots, kept)
    if snapshots is not None and kept is not None:
        return _keeping(sources, snapshots, kept, keep_tombstones)  # type: ignore[return-value]
    if reseek is not None:
        return SeekableMerge(sources, reverse, keep_tombstones, pin, reseek, untag)
    merged: Iterator[tuple[bytes, bytes | None]]
    if len(sources) == 1:
        pairs = chain.from_iterable(zip(*chunk[:2] if untag else chunk, strict=True)
                                    for chunk in sources[0])
        merged = pairs if keep_tombstones else (e for e in pairs if e[1] is not None)
    else:
        tagged = [_tagged(src, tag_for(age, reverse), reverse) for age, src in enumerate(sources)]
        merged = _merge(heapq.merge(*tagged, reverse=reverse), keep_tombstones, untag)
    return merged if pin is None else pinned(merged, pin)


class SeekableMerge:
    """The Python merge with ``seek`` (what ``_speedups.Merge`` does with a
    ``reseek``): the pin released once when it ends -- exhausted, failed,
    ``close()`` or freed -- and a ``next()``, ``seek()`` or ``close()`` while
    another call of it runs refused (ValueError)."""

    def __init__(self, sources: list[Chunks], reverse: bool, keep_tombstones: bool,
                 pin: Pin | None, reseek: Callable[[bytes], list[Chunks]],
                 untag: bool = False) -> None:
        self._reverse = reverse
        self._keep = keep_tombstones
        self._untag = untag
        self._pin = pin
        self._reseek: Callable[[bytes], list[Chunks]] | None = reseek
        self._it: Iterator[Any] | None = merge_newest(sources, reverse, keep_tombstones,
                                                      untag=untag)
        self._busy = threading.Lock()

    def __iter__(self) -> SeekableMerge:
        return self

    def _enter(self) -> None:
        if not self._busy.acquire(blocking=False):
            raise ValueError("Merge already executing")

    def __next__(self) -> Any:
        self._enter()
        try:
            if self._it is None:
                raise StopIteration
            try:
                return next(self._it)
            except BaseException:
                self._end()
                raise
        finally:
            self._busy.release()

    def seek(self, key: bytes) -> None:
        self._enter()
        try:
            if self._it is None or self._reseek is None:
                raise ValueError("the scan is over: it cannot seek")
            fresh = list(self._reseek(key))
            self._it = merge_newest(fresh, self._reverse, self._keep, untag=self._untag)
        finally:
            self._busy.release()

    def _end(self) -> None:
        self._it = None
        self._reseek = None
        pin, self._pin = self._pin, None
        if pin is not None:
            pin.release()

    def close(self) -> None:
        self._enter()
        try:
            self._end()
        finally:
            self._busy.release()

    def __del__(self) -> None:
        if getattr(self, "_pin", None) is not None:
            self._end()


def pinned(entries: Iterator[tuple[bytes, bytes | None]],
           pin: Pin) -> Generator[tuple[bytes, bytes | None], None, None]:
    """``entries`` holding ``pin`` (the Python merge's; the C Merge holds its own):
    a generator already started, so that ``pin.release()`` runs once whichever
    way it ends -- exhausted, failed, ``close()``, or freed before its first item."""
    gen = _pinned(entries, pin)
    next(gen)
    return gen


def _pinned(entries: Iterator[tuple[bytes, bytes | None]],
            pin: Pin) -> Generator[Any, None, None]:
    try:
        yield None  # the start: from here on, any end runs the finally
        yield from entries
    finally:
        pin.release()


def _tagged(chunks: Chunks, tag: int, reverse: bool = False) -> Iterator[tuple[Any, ...]]:
    """(key, order, value[, tag]) of each entry: ``order`` is ``tag`` (the
    source's, tag_for), in a tagged chunk after minus the sequence number
    (reversed: the number itself), so the merge's order puts the highest
    first."""
    sign = 1 if reverse else -1
    for chunk in chunks:
        keys = chunk[0]
        if len(chunk) < 3:
            yield from zip(keys, repeat(tag, len(keys)), *chunk[1:], strict=True)
            continue
        orders = [(sign * (t >> 8), tag) for t in chunk[2]]
        yield from zip(keys, orders, *chunk[1:], strict=True)


def _merge(merged: Iterator[Any], keep_tombstones: bool, untag: bool = False) -> Iterator[Any]:
    last: Any = _NOTHING
    for entry in merged:
        key = entry[0]
        if key == last:
            continue  # an older version of a key already emitted
        last = key
        if entry[2] is None and not keep_tombstones:
            continue
        yield (key, entry[2]) if len(entry) == 3 or untag else (key, entry[2], entry[3])


def versions_of(sources: list[Chunks]) -> Iterator[tuple[bytes, list[tuple[Any, int]]]]:
    """Each key of ``sources`` -- tagged (keys, values, tags) chunks in key order,
    newest source first -- with all its versions, as (value, tag) pairs by
    sequence number, highest first (of two with one number, the newest
    source's alone).  O(N log S) for N entries over S sources."""
    tagged = [_tagged(src, age) for age, src in enumerate(sources)]
    key: Any = None
    versions: list[tuple[Any, int]] = []
    last_seq = -1
    for entry in heapq.merge(*tagged):
        k, _order, value, tag = entry
        if k != key:
            if versions:
                yield key, versions
            key, versions, last_seq = k, [], -1
        seq = tag >> KIND_BITS
        if seq != last_seq:
            versions.append((value, tag))
            last_seq = seq
    if versions:
        yield key, versions


def kept_versions(versions: list[tuple[Any, int]], snapshots: Sequence[int]) -> list[int]:
    """The indexes in ``versions`` (highest sequence number first) a compaction
    keeps for live snapshots with sequence numbers ``snapshots`` (descending):
    the newest, then each snapshot's own where it is another.  O(V + S)."""
    kept = [0]
    i = 0
    n = len(versions)
    for s in snapshots:
        while i < n and versions[i][1] >> KIND_BITS > s:
            i += 1
        if i == n:
            break
        if i != kept[-1]:
            kept.append(i)
    return kept


def _keeping(sources: list[Chunks], snapshots: Sequence[int],
             kept: list[tuple[int, bytes, Any, int]],
             keep_tombstones: bool) -> Iterator[tuple[bytes, Any, int]]:
    """merge_newest with ``snapshots`` and ``kept``, in Python."""
    for key, versions in versions_of(sources):
        keep = kept_versions(versions, snapshots)
        for depth, i in enumerate(keep[1:]):
            kept.append((depth, key, *versions[i]))
        value, tag = versions[0]
        if value is not None or keep_tombstones:
            yield key, value, tag
