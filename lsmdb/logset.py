"""The database's write-ahead log: numbered segments, one of them live (docs/FORMAT.md §3).

Records are appended to the **live** segment.  A flush **rotates** the log:
the live segment is closed, a new one is created, and the manifest is
switched to name both before anything is appended to the new one.  A closed
segment is either

* **synced** -- fsynced whole, and named in the manifest with its size: a
  reader knows exactly what it holds (missing, cut short or zero-filled is
  corruption, never a torn tail); or
* **unsynced** -- named in the manifest's ``unsynced`` list, with its size:
  read to its last whole record, and if a crash tore it (it ends short of
  that size), every later segment is ignored, so what survives is still a
  prefix of the writes.

Segments become synced oldest first, never one before an older one -- and
a manifest switch then names them synced: by ``sync()`` (every segment, then
the live one), by a rotation that leaves a
record some memtable still needs in the segment it closes (a flush of one
table while others hold writes in it), and at ``close()``, which seals the
live segment too.  A rotation whose closed segment holds only records of
the memtable being flushed leaves it unsynced: once the flush is in an
SSTable the segment is needed no more and is deleted, never fsynced -- what
a single-table load needs.

A segment is deleted only after a manifest that no longer names it is
durable (it is no longer named once no memtable holds any of its records).
A segment newer than every one the manifest names never holds a record.

After a failed append or fsync the log is **failed**: nothing more is
appended to the live segment (its end may hold part of a record, and after
a failed fsync the kernel may have dropped data it held).  The database then
makes its records durable another way -- by flushing every memtable --
before it accepts another write (:meth:`lsmdb.flush.Flusher.recover_log`).

Record framing is in :mod:`lsmdb.wal`; a record's payload is msgpack
``[seq, [[table_id, key, value|nil], ...]]``.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import msgpack

from .changes import note_seq
from .errors import CorruptionError
from .files import SwitchedButNotSynced, read_file, unlink_quietly, wal_name
from .ttl import MAX_EXPIRES

try:  # optional C speedups (lsmdb/csrc/logset.c)
    from ._speedups import encode_ops as _encode_ops
except ImportError:  # pragma: no cover - built without a C compiler
    _encode_ops = None  # type: ignore[assignment]
from .wal import (
    LEGACY_FORMAT,
    SEGMENT_FORMAT,
    LogReadResult,
    LogWriter,
    read_segment,
    read_segment_file,
)

Op = tuple[int, bytes, Any]  # (table id, key, value: bytes, None or (bytes, expires))


def encode_record(seq: int, ops: list[tuple[int, bytes, Any]]) -> bytes:
    """One WAL record payload: msgpack [seq, [[table_id, key, value], ...]],
    each value a bin, nil (a delete) or [bin, expires] (an expiring value,
    lsmdb.ttl) -- tuples pack as arrays: the same bytes as lists."""
    return msgpack.packb([seq, ops], use_bin_type=True)


def encode_table_record(seq: int, table_id: int, keys: list[bytes],
                        values: list[Any]) -> bytes:
    """``encode_record`` of ops that all go to one table: keys[i] -> values[i]
    (the C speedups write the same bytes about 10x faster than msgpack)."""
    if _encode_ops is not None:
        return _encode_ops(seq, table_id, keys, values)
    return encode_record(seq, list(zip(repeat(table_id, len(keys)), keys, values, strict=True)))


def decode_record(payload: bytes, path: str, offset: int) -> tuple[int, list[Op]]:
    """(seq, [(table_id, key, value)]) of one record, each value bytes, None
    or (value, expires); CorruptionError if malformed."""
    try:
        seq, ops = msgpack.unpackb(payload, raw=False)
        if type(seq) is not int or seq < 0 or type(ops) is not list:
            raise ValueError
        decoded = []
        for tid, key, value in ops:
            if type(tid) is not int or type(key) is not bytes:
                raise ValueError
            if value is not None and type(value) is not bytes:
                v, expires = value  # an expiring value
                if type(v) is not bytes or type(expires) is not int or \
                        not 0 < expires <= MAX_EXPIRES:
                    raise ValueError
                value = (v, expires)
            decoded.append((tid, key, value))
    except Exception:
        raise CorruptionError("WAL record undecodable", path, offset) from None
    return seq, decoded


@dataclass(slots=True)  # slots: the C put (lsmdb/csrc/writepath.c) writes them at their offsets
class Segment:
    """One segment as the log keeps it."""

    number: int
    size: int = 0          # bytes of whole records (header included)
    max_seq: int = 0       # highest sequence number in it; 0: no record
    min_seq: int = 0       # lowest sequence number in it; 0: no record
    format: int = SEGMENT_FORMAT
    writer: LogWriter | None = None   # an unsynced closed segment's, kept open for its fsync


@dataclass
class WalState:
    """The WAL as the manifest records it, oldest first: the synced closed segments
    still needed, with their sizes; the unsynced closed ones still needed, with
    their sizes; and the live one (None once sealed by ``close()``)."""

    closed: list[tuple[int, int, int]] = field(default_factory=list)  # (number, size, format)
    unsynced: list[tuple[int, int]] = field(default_factory=list)     # (number, size)
    live: int | None = None

    def to_obj(self) -> dict[str, object]:
        return {"closed": [list(c) for c in self.closed],
                "unsynced": [list(u) for u in self.unsynced], "live": self.live}

    @classmethod
    def from_obj(cls, obj: object) -> WalState:
        if not isinstance(obj, dict):
            raise ValueError("bad wal entry")
        closed = []
        for entry in obj["closed"]:
            number, size, fmt = entry
            if any(type(v) is not int or v < 0 for v in (number, size, fmt)) or \
                    fmt not in (LEGACY_FORMAT, SEGMENT_FORMAT):
                raise ValueError("bad closed segment")
            closed.append((number, size, fmt))
        unsynced = []
        for entry in obj["unsynced"]:
            number, size = entry
            if any(type(v) is not int or v < 0 for v in (number, size)):
                raise ValueError("bad unsynced segment")
            unsynced.append((number, size))
        live = obj["live"]
        if live is not None and (type(live) is not int or live < 0):
            raise ValueError("bad live segment")
        state = cls(closed, unsynced, live)
        numbers = state.numbers()
        if numbers != sorted(set(numbers)):
            raise ValueError("segments out of order")
        return state

    def numbers(self) -> list[int]:
        return [c[0] for c in self.closed] + [u[0] for u in self.unsynced] + \
            ([] if self.live is None else [self.live])


@dataclass
class ReplayedLog:
    """What :meth:`LogSet.replay` found: the segments read and the highest sequence number."""

    segments: list[Segment]
    top_seq: int
    torn: list[tuple[str, int]]   # (path, offset) of each torn tail dropped
    ignored: list[int] = field(default_factory=list)   # segments after a torn one, not read
    records: int = 0                                   # records replayed (set by the caller)


def read_unsynced_segment(path: str, number: int, size: int) -> LogReadResult:
    """An unsynced closed segment, read to its last whole record within ``size``: torn
    if it ends short of it (whole records lost at a boundary count too)."""
    data = read_file(path)
    result = read_segment(data[:size], number, path)
    if result.valid_length < size:
        result.torn = True
    return result


class LogSet:
    """Owns the WAL segments of one database directory (see the module docstring)."""

    # (slots: the C put, lsmdb/csrc/writepath.c, reads them at their offsets)
    __slots__ = ("directory", "writer", "live", "closed", "unsynced", "failed", "promoted",
                 "_closed_bytes", "changes")

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.writer: LogWriter | None = None
        self.live: Segment | None = None
        self.closed: list[Segment] = []     # synced, oldest first
        self.unsynced: list[Segment] = []   # closed but not fsynced, oldest first; newer
        #: The error that failed the live segment (no more appends), or None.
        self.failed: OSError | None = None
        #: Unsynced segments were fsynced since the last :meth:`state`: a manifest
        #: switch should name them synced.
        self.promoted = False
        self._closed_bytes = 0
        #: The writer's CHANGES mapping (lsmdb.changes), or None: each record's
        #: sequence number is stored there once it is in the log.
        self.changes: Any = None

    def path(self, number: int) -> str:
        return os.path.join(self.directory, wal_name(number))

    # -- reading --------------------------------------------------------------
    def read(self, wal: WalState | None, numbers_on_disk: list[int]) -> Iterator[
            tuple[Segment, LogReadResult]]:
        """Each segment to replay, oldest first, with what it holds.

        ``wal`` is the manifest's record; None for a manifest written before
        segments were recorded, whose segments are every one on disk, each
        read as a live one.  Synced closed segments are read strictly to their
        recorded size, the rest to their last whole record (an unsynced one
        that ends short of its recorded size is torn); after a torn one the
        caller stops.  FileNotFoundError if one is gone (a concurrent writer
        retired it, or it was deleted: the caller decides).
        """
        if wal is None:
            for number in numbers_on_disk:
                result = read_segment_file(self.path(number), number)
                yield Segment(number, result.valid_length, format=result.format), result
            return
        for number, size, fmt in wal.closed:
            result = read_segment_file(self.path(number), number, size, fmt)
            yield Segment(number, size, format=fmt), result
        for number, size in wal.unsynced:
            result = read_unsynced_segment(self.path(number), number, size)
            yield Segment(number, result.valid_length), result
        if wal.live is not None:
            number = wal.live
            result = read_segment_file(self.path(number), number, None, SEGMENT_FORMAT)
            yield Segment(number, result.valid_length), result

    def replay(self, wal: WalState | None, numbers_on_disk: list[int],
               apply: Callable[[int, list[Op]], None]) -> ReplayedLog:
        """Feed every record to ``apply(seq, ops)``, oldest first, up to the first torn
        tail (see :meth:`read`)."""
        segments = []
        torn = []
        top = 0
        order = numbers_on_disk if wal is None else wal.numbers()
        for seg, result in self.read(wal, numbers_on_disk):
            path = self.path(seg.number)
            for offset, payload in result.records:
                seq, ops = decode_record(payload, path, offset)
                seg.max_seq = max(seg.max_seq, seq)
                seg.min_seq = min(seg.min_seq or seq, seq)
                apply(seq, ops)
            top = max(top, seg.max_seq)
            segments.append(seg)
            if result.torn:
                torn.append((path, result.valid_length))
                if wal is not None:
                    # What a crash tore was never fsynced, nor was anything after
                    # it.  (Before segments were recorded, a closed segment was
                    # never fsynced, so a later one may hold what was: each is
                    # read to its own torn tail.)
                    return ReplayedLog(segments, top, torn, order[order.index(seg.number) + 1:])
        return ReplayedLog(segments, top, torn)

    def adopt(self, segments: list[Segment]) -> None:
        """Take replayed segments as synced closed ones (each fsynced first: after a
        process crash their tails may be in the page cache only)."""
        for seg in segments:
            fd = os.open(self.path(seg.number), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self.closed.append(seg)
        self._count()

    # -- the manifest's view --------------------------------------------------
    @staticmethod
    def _needed(segments: list[Segment], low_seq: int | None) -> list[Segment]:
        return [] if low_seq is None else [s for s in segments if s.max_seq >= low_seq]

    def state(self, low_seq: int | None) -> WalState:
        """The manifest's record: the closed segments holding a record some memtable
        still holds -- any at or past ``low_seq``, the smallest sequence number in
        any memtable (None: the memtables are empty) -- and the live one."""
        self.promoted = False  # what this state says synced, a manifest will say
        return WalState([(s.number, s.size, s.format) for s in self._needed(self.closed, low_seq)],
                        [(s.number, s.size) for s in self._needed(self.unsynced, low_seq)],
                        None if self.live is None else self.live.number)

    def retire(self, low_seq: int | None) -> None:
        """Delete the closed segments :meth:`state` leaves out.  Call only once a
        manifest of ``state(low_seq)`` is durable."""
        for kept in (self.closed, self.unsynced):
            keep = self._needed(kept, low_seq)
            for seg in kept:
                if seg not in keep:
                    if seg.writer is not None:
                        try:
                            seg.writer.close()
                        except OSError:
                            pass  # after a durable switch nothing may raise
                    unlink_quietly(self.path(seg.number))
            kept[:] = keep
        self._count()

    def may_hold(self, ranges: list[tuple[int, int]]) -> bool:
        """Whether the live segment or an unsynced one may hold a record with a
        sequence number in one of the (lowest, highest) ``ranges``."""
        segments = self.unsynced + ([self.live] if self.live is not None else [])
        return any(seg.min_seq and lo <= seg.max_seq and hi >= seg.min_seq
                   for seg in segments for lo, hi in ranges)

    @property
    def total_bytes(self) -> int:
        """Bytes of every segment on disk the log still holds (a write asks: the closed
        segments' share is kept, not summed)."""
        writer = self.writer
        return self._closed_bytes + (writer.size if writer is not None else 0)

    def _count(self) -> None:
        self._closed_bytes = sum(s.size for s in self.closed) + sum(s.size for s in self.unsynced)

    def oldest_max_seq(self) -> int | None:
        """The highest sequence number in the oldest segment holding a record."""
        for seg in self.closed + self.unsynced:
            if seg.max_seq:
                return seg.max_seq
        return self.live.max_seq if self.live is not None and self.live.max_seq else None

    # -- writing --------------------------------------------------------------
    def _sync_unsynced(self) -> None:
        """fsync the unsynced closed segments, oldest first, each becoming synced."""
        while self.unsynced:
            seg = self.unsynced[0]
            assert seg.writer is not None
            try:
                seg.writer.sync()
            except OSError as exc:
                self.failed = exc
                raise
            seg.writer.close()
            seg.writer = None
            self.closed.append(self.unsynced.pop(0))
            self.promoted = True

    def rotate(self, number: int, commit: Callable[[], None], sync: bool = True) -> None:
        """Close the live segment and make segment ``number`` live.

        ``sync``: the closed segment (and every older unsynced one) is fsynced
        first and becomes synced; else it is left unsynced.  A failed log
        closes the live segment without either.  ``commit()`` -- the manifest
        switch naming the new layout -- runs once the layout has changed.  If
        it raises, the old layout comes back and the new file is removed;
        SwitchedButNotSynced keeps the new layout (the visible manifest names
        it) but fails the log, so nothing is appended to the new segment before
        a manifest naming it is known durable.
        """
        old, old_writer = self.live, self.writer
        failed = self.failed
        if sync and failed is None:
            self._sync_unsynced()
            if old_writer is not None:
                try:
                    old_writer.sync()
                except OSError as exc:
                    self.failed = exc
                    raise
        writer = LogWriter(self.path(number), number)
        unsynced_before = list(self.unsynced)
        closed_before = list(self.closed)
        if old is not None and old_writer is not None:
            seg = Segment(old.number, old_writer.size, old.max_seq, old.min_seq, old.format)
            if failed is not None or not sync:
                # Kept open (a failed one too, so its descriptor outlives any
                # reader) until it is synced or retired.
                seg.writer = old_writer
                self.unsynced.append(seg)
            else:
                self.closed.append(seg)
        self.live, self.writer, self.failed = Segment(number, writer.size), writer, None
        self._count()
        try:
            commit()
        except SwitchedButNotSynced as exc:
            self.failed = exc
            if old_writer is not None and (failed is None and sync):
                old_writer.close()
            raise
        except BaseException:
            self.closed, self.unsynced = closed_before, unsynced_before
            self.live, self.writer, self.failed = old, old_writer, failed
            self._count()
            writer.close()
            unlink_quietly(writer.path)
            raise
        if old_writer is not None and failed is None and sync:
            old_writer.close()

    def seal(self, commit: Callable[[], None]) -> None:
        """Close the live segment with no new one, every segment synced: what
        ``close()`` leaves.  ``commit()`` writes the manifest; if it fails, the
        segment stays live."""
        old, old_writer = self.live, self.writer
        if old is None or old_writer is None or self.failed is not None:
            return
        self._sync_unsynced()
        try:
            old_writer.sync()
        except OSError as exc:
            self.failed = exc
            raise
        self.closed.append(Segment(old.number, old_writer.size, old.max_seq, old.min_seq,
                                   old.format))
        self.live = None
        try:
            commit()
        except SwitchedButNotSynced:
            pass  # the sealed layout is visible; the live one it replaced is as good
        except BaseException:
            self.closed.pop()
            self.live = old
            raise
        finally:
            self._count()
        self.writer = None
        old_writer.close()

    def append(self, seq: int, payload: bytes, sync: bool) -> None:
        """Append one record (with ``sync``, fsync it and every segment before it);
        on OSError the log is failed."""
        writer, live = self.writer, self.live
        if writer is None or live is None or self.failed is not None:
            raise RuntimeError("no WAL segment open for appends")
        start = writer.size
        try:
            writer.add_record(payload)
        except OSError as exc:
            self.failed = exc
            raise
        except BaseException:
            # Interrupted part way (KeyboardInterrupt): what was stored past
            # writer.size must stay the segment's tail, so nothing follows it.
            self.failed = OSError(errno.EIO, "WAL append interrupted")
            raise
        live.max_seq = seq
        if not live.min_seq:
            live.min_seq = seq
        if sync:
            try:
                self.sync()
            except OSError:
                # The write raises: a reader in another process must not take its
                # record (a reopen may not find it either).
                writer.unwrite(start)
                raise
        if self.changes is not None:
            note_seq(self.changes, seq)

    def sync(self) -> None:
        """fsync every unsynced segment, oldest first, then the live one."""
        if self.failed is not None:
            raise self.failed
        self._sync_unsynced()
        if self.writer is not None:
            try:
                self.writer.sync()
            except OSError as exc:
                self.failed = exc
                raise

    def sync_failed_quietly(self) -> None:
        """Best effort for a failed log at close: its whole records may still reach the
        disk (a reopen replays them; a partial tail is dropped as torn)."""
        for seg in self.unsynced:
            if seg.writer is not None:
                try:
                    seg.writer.sync()
                except OSError:
                    pass
        if self.writer is not None:
            try:
                self.writer.sync()
            except OSError:
                pass

    def close(self) -> None:
        for seg in self.unsynced:
            if seg.writer is not None:
                seg.writer.close()
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def _check(self) -> None:
        """Invariants: segments in order, synced ones before unsynced ones."""
        numbers = [s.number for s in self.closed + self.unsynced] + \
            ([self.live.number] if self.live else [])
        if numbers != sorted(set(numbers)):
            raise AssertionError(f"WAL segments out of order: {numbers}")
        if any(s.writer is not None for s in self.closed):
            raise AssertionError("a synced closed WAL segment still has a writer")
        if self._closed_bytes != sum(s.size for s in self.closed + self.unsynced):
            raise AssertionError("closed WAL bytes miscounted")
        if self.writer is not None and (self.live is None
                                        or self.writer.number != self.live.number):
            raise AssertionError("the WAL writer is not the live segment's")
