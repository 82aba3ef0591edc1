"""The database's write-ahead log: numbered segments, one of them live (docs/FORMAT.md §3).

Records are appended to the **live** segment.  A flush **rotates** the log:
the live segment is fsynced and closed, a new one is created, and the
manifest is switched to name both -- the closed one with its size, the new
one as live -- before anything is appended to the new one.  So:

* every closed segment the manifest names was fsynced whole, and a reader
  knows its exact size (a segment missing, cut short or zero-filled is
  corruption, never a torn tail);
* a segment newer than the manifest's live one never holds a record;
* a closed segment is deleted only after a manifest that no longer names it
  is durable (it is no longer named once no memtable holds any of its
  records), and ``close()`` seals the live segment the same way.

After a failed append or fsync the live segment is **failed**: nothing more
is appended to it (its end may hold part of a record, and after a failed
fsync the kernel may have dropped data it held).  The database then makes
its records durable another way -- by flushing every memtable -- before it
accepts another write (:meth:`lsmdb.db.DB._recover_log`).

Record framing is in :mod:`lsmdb.wal`; a record's payload is msgpack
``[seq, [[table_id, key, value|nil], ...]]``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import repeat

import msgpack

from .errors import CorruptionError
from .files import SwitchedButNotSynced, unlink_quietly, wal_name

try:  # optional C speedups (lsmdb/_speedups.c)
    from ._speedups import encode_ops as _encode_ops
except ImportError:  # pragma: no cover - built without a C compiler
    _encode_ops = None  # type: ignore[assignment]
from .wal import LEGACY_FORMAT, SEGMENT_FORMAT, LogReadResult, LogWriter, read_segment_file

Op = tuple[int, bytes, "bytes | None"]


def encode_record(seq: int, ops: list[tuple[int, bytes, bytes | None]]) -> bytes:
    """One WAL record payload: msgpack [seq, [[table_id, key, value|None], ...]]
    (tuples pack as arrays: the same bytes as lists)."""
    return msgpack.packb([seq, ops], use_bin_type=True)


def encode_table_record(seq: int, table_id: int, keys: list[bytes],
                        values: list[bytes | None]) -> bytes:
    """``encode_record`` of ops that all go to one table: keys[i] -> values[i]
    (the C speedups write the same bytes about 10x faster than msgpack)."""
    if _encode_ops is not None:
        return _encode_ops(seq, table_id, keys, values)
    return encode_record(seq, list(zip(repeat(table_id, len(keys)), keys, values, strict=True)))


def decode_record(payload: bytes, path: str, offset: int) -> tuple[int, list[Op]]:
    """(seq, [(table_id, key, value|None)]) of one record; CorruptionError if malformed."""
    try:
        seq, ops = msgpack.unpackb(payload, raw=False)
        if type(seq) is not int or seq < 0 or type(ops) is not list:
            raise ValueError
        decoded = []
        for tid, key, value in ops:
            if type(tid) is not int or type(key) is not bytes or not (
                    value is None or type(value) is bytes):
                raise ValueError
            decoded.append((tid, key, value))
    except Exception:
        raise CorruptionError("WAL record undecodable", path, offset) from None
    return seq, decoded


@dataclass
class Segment:
    """One segment as the log keeps it."""

    number: int
    size: int = 0          # bytes of whole records (header included)
    max_seq: int = 0       # highest sequence number in it; 0: no record
    format: int = SEGMENT_FORMAT
    synced: bool = True    # every byte of ``size`` fsynced


@dataclass
class WalState:
    """The WAL as the manifest records it: the live segment and the closed ones still needed."""

    live: int | None = None
    closed: list[tuple[int, int, int]] = field(default_factory=list)  # (number, size, format)

    def to_obj(self) -> dict[str, object]:
        return {"live": self.live, "closed": [list(c) for c in self.closed]}

    @classmethod
    def from_obj(cls, obj: object) -> WalState:
        if not isinstance(obj, dict):
            raise ValueError("bad wal entry")
        live = obj["live"]
        if live is not None and (type(live) is not int or live < 0):
            raise ValueError("bad live segment")
        closed = []
        for entry in obj["closed"]:
            number, size, fmt = entry
            if any(type(v) is not int or v < 0 for v in (number, size, fmt)) or \
                    fmt not in (LEGACY_FORMAT, SEGMENT_FORMAT):
                raise ValueError("bad closed segment")
            closed.append((number, size, fmt))
        return cls(live, closed)

    def numbers(self) -> list[int]:
        return [c[0] for c in self.closed] + ([] if self.live is None else [self.live])


@dataclass
class ReplayedLog:
    """What :meth:`LogSet.replay` found: the segments read and the highest sequence number."""

    segments: list[Segment]
    top_seq: int
    torn: list[tuple[str, int]]   # (path, offset) of each torn tail dropped


class LogSet:
    """Owns the WAL segments of one database directory (see the module docstring)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.writer: LogWriter | None = None
        self.live: Segment | None = None
        self.closed: list[Segment] = []     # oldest first
        #: The error that failed the live segment (no more appends), or None.
        self.failed: OSError | None = None

    def path(self, number: int) -> str:
        return os.path.join(self.directory, wal_name(number))

    # -- reading --------------------------------------------------------------
    def read(self, wal: WalState | None, numbers_on_disk: list[int]) -> Iterator[
            tuple[Segment, LogReadResult]]:
        """Each segment to replay, oldest first, with what it holds.

        ``wal`` is the manifest's record; None for a manifest written before
        segments were recorded, whose segments are every one on disk, each
        read as a live one.  Closed segments are read strictly to their
        recorded size; FileNotFoundError if one is gone (a concurrent writer
        retired it, or it was deleted: the caller decides).
        """
        if wal is None:
            for number in numbers_on_disk:
                result = read_segment_file(self.path(number), number)
                yield Segment(number, result.valid_length, 0, result.format, False), result
            return
        for number, size, fmt in wal.closed:
            result = read_segment_file(self.path(number), number, size, fmt)
            yield Segment(number, size, 0, fmt, True), result
        if wal.live is not None:
            number = wal.live
            result = read_segment_file(self.path(number), number, None, SEGMENT_FORMAT)
            yield Segment(number, result.valid_length, 0, SEGMENT_FORMAT, False), result

    def replay(self, wal: WalState | None, numbers_on_disk: list[int],
               apply: Callable[[int, list[Op]], None]) -> ReplayedLog:
        """Feed every record to ``apply(seq, ops)``, oldest first; see :meth:`read`."""
        segments = []
        torn = []
        top = 0
        for seg, result in self.read(wal, numbers_on_disk):
            path = self.path(seg.number)
            for offset, payload in result.records:
                seq, ops = decode_record(payload, path, offset)
                seg.max_seq = max(seg.max_seq, seq)
                apply(seq, ops)
            if result.torn:
                torn.append((path, result.valid_length))
            top = max(top, seg.max_seq)
            segments.append(seg)
        return ReplayedLog(segments, top, torn)

    def adopt(self, segments: list[Segment]) -> None:
        """Take replayed segments as closed ones (each fsynced first if it was not)."""
        for seg in segments:
            if not seg.synced:
                fd = os.open(self.path(seg.number), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                seg.synced = True
            self.closed.append(seg)

    # -- the manifest's view --------------------------------------------------
    def needed(self, low_seq: int | None) -> list[Segment]:
        """Closed segments holding a record some memtable still holds: any record
        at or past ``low_seq``, the smallest sequence number in any memtable (None:
        the memtables are empty)."""
        if low_seq is None:
            return []
        return [s for s in self.closed if s.max_seq >= low_seq]

    def state(self, low_seq: int | None) -> WalState:
        return WalState(None if self.live is None else self.live.number,
                        [(s.number, s.size, s.format) for s in self.needed(low_seq)])

    def retire(self, low_seq: int | None) -> None:
        """Delete the closed segments :meth:`needed` leaves out.  Call only once a
        manifest of ``state(low_seq)`` is durable."""
        keep = self.needed(low_seq)
        for seg in self.closed:
            if seg not in keep:
                unlink_quietly(self.path(seg.number))
        self.closed = keep

    @property
    def total_bytes(self) -> int:
        """Bytes of every segment on disk the log still holds."""
        return sum(s.size for s in self.closed) + (self.writer.size if self.writer else 0)

    def oldest_max_seq(self) -> int | None:
        """The highest sequence number in the oldest segment holding a record."""
        for seg in self.closed:
            if seg.max_seq:
                return seg.max_seq
        return self.live.max_seq if self.live is not None and self.live.max_seq else None

    # -- writing --------------------------------------------------------------
    def rotate(self, number: int, commit: Callable[[], None]) -> None:
        """Close the live segment (fsynced, unless failed) and make segment ``number`` live.

        ``commit()`` -- the manifest switch naming the new layout -- runs once
        the layout has changed.  If it raises, the old layout comes back and
        the new file is removed; SwitchedButNotSynced keeps the new layout
        (the visible manifest names it) but fails the new segment, so nothing
        is appended to it before a manifest naming it is known durable.
        """
        old, old_writer = self.live, self.writer
        if old_writer is not None and self.failed is None:
            try:
                old_writer.sync()
            except OSError as exc:
                self.failed = exc
                raise
        writer = LogWriter(self.path(number), number)
        failed = self.failed
        if old is not None and old_writer is not None:
            self.closed.append(Segment(old.number, old_writer.size, old.max_seq, old.format,
                                       failed is None))
        self.live, self.writer, self.failed = Segment(number, writer.size), writer, None
        try:
            commit()
        except SwitchedButNotSynced as exc:
            self.failed = exc
            if old_writer is not None:
                old_writer.close()
            raise
        except BaseException:
            if old is not None:
                self.closed.pop()
            self.live, self.writer, self.failed = old, old_writer, failed
            writer.close()
            unlink_quietly(writer.path)
            raise
        if old_writer is not None:
            old_writer.close()

    def seal(self, commit: Callable[[], None]) -> None:
        """Close the live segment (fsynced) with no new one: what ``close()`` leaves.

        ``commit()`` writes the manifest; if it fails the segment stays live.
        """
        old, old_writer = self.live, self.writer
        if old is None or old_writer is None or self.failed is not None:
            return
        old_writer.sync()
        self.closed.append(Segment(old.number, old_writer.size, old.max_seq, old.format, True))
        self.live = None
        try:
            commit()
        except SwitchedButNotSynced:
            pass  # the sealed layout is visible; the live one it replaced is as good
        except BaseException:
            self.closed.pop()
            self.live = old
            raise
        self.writer = None
        old_writer.close()

    def append(self, seq: int, payload: bytes, sync: bool) -> None:
        """Append one record (fsync it too if ``sync``); on OSError the segment is failed."""
        writer, live = self.writer, self.live
        if writer is None or live is None or self.failed is not None:
            raise RuntimeError("no WAL segment open for appends")
        try:
            writer.add_record(payload)
            if sync:
                writer.sync()
        except OSError as exc:
            self.failed = exc
            raise
        live.max_seq = seq

    def presync(self) -> None:
        """Write the live segment's data out ahead of a rotation, outside the DB's lock.

        A rotation may close the segment meanwhile: an error then says nothing
        about the live one and is ignored."""
        writer = self.writer
        if writer is not None and self.failed is None:
            try:
                writer.datasync()
            except OSError as exc:
                if self.writer is writer:
                    self.failed = exc

    def sync(self) -> None:
        """fsync the live segment (closed ones were fsynced when they closed)."""
        if self.failed is not None:
            raise self.failed
        if self.writer is not None:
            try:
                self.writer.sync()
            except OSError as exc:
                self.failed = exc
                raise

    def sync_failed_quietly(self) -> None:
        """Best effort for a failed segment at close: its whole records may still reach
        the disk (a reopen replays them; its partial tail is dropped as torn)."""
        if self.writer is not None:
            try:
                self.writer.sync()
            except OSError:
                pass

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def _check(self) -> None:
        """Invariants: segments in order, sizes known, every needed one synced."""
        numbers = [s.number for s in self.closed] + ([self.live.number] if self.live else [])
        assert numbers == sorted(set(numbers)), numbers
        if self.writer is not None:
            assert self.live is not None and self.writer.number == self.live.number
