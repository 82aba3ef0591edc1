"""The database's write-ahead log: numbered segments, one of them open for appends.

A segment is closed for good when a flush starts a new one, and deleted
once no memtable holds any record from it (every record is in an SSTable
named by the manifest).  Record framing is in :mod:`lsmdb.wal`; a record's
payload is msgpack ``[seq, [[table_id, key, value|nil], ...]]``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from itertools import repeat

import msgpack

from .errors import CorruptionError

try:  # optional C speedups (lsmdb/_speedups.c)
    from ._speedups import encode_ops as _encode_ops
except ImportError:  # pragma: no cover - built without a C compiler
    _encode_ops = None  # type: ignore[assignment]
from .wal import LogWriter, read_log_file, truncate_file

log = logging.getLogger("lsmdb")

WAL_RE = re.compile(r"wal-(\d{6,})\.log\Z")

Op = tuple[int, bytes, "bytes | None"]


def wal_name(number: int) -> str:
    return f"wal-{number:06d}.log"


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


class LogSet:
    """Owns the WAL segments of one database directory."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.writer: LogWriter | None = None
        self.number = 0        # number of the segment open for appends
        self.max_seq = 0       # highest sequence number appended to it
        self.closed: list[list[int]] = []   # [number, max_seq] of closed segments

    def path(self, number: int) -> str:
        return os.path.join(self.directory, wal_name(number))

    def replay(self, apply: Callable[[int, list[Op]], None], repair: bool) -> tuple[int, int]:
        """Feed every record of every segment, oldest first, to ``apply(seq, ops)``.

        A torn last record is dropped (and cut off the file when ``repair``).
        Returns (highest sequence number, highest segment number) seen.
        """
        numbers = sorted(int(m.group(1)) for n in os.listdir(self.directory)
                         if (m := WAL_RE.match(n)))
        top_seq = 0
        for number in numbers:
            seg = self.path(number)
            result = read_log_file(seg)
            seg_max = 0
            for offset, payload in result.records:
                seq, ops = decode_record(payload, seg, offset)
                seg_max = max(seg_max, seq)
                apply(seq, ops)
            if result.torn and repair:
                log.warning("%s: dropping a torn last record at offset %d (never acknowledged)",
                            seg, result.valid_length)
                truncate_file(seg, result.valid_length)
            top_seq = max(top_seq, seg_max)
            self.closed.append([number, seg_max])
        return top_seq, max(numbers, default=0)

    def start(self, number: int) -> None:
        """Close the current segment (if any) and open segment ``number`` for appends."""
        writer = LogWriter(self.path(number))  # if this fails, the current one stays open
        if self.writer is not None:
            self.writer.close()
            self.closed.append([self.number, self.max_seq])
        self.writer = writer
        self.number = number
        self.max_seq = 0

    def append(self, seq: int, payload: bytes, sync: bool) -> None:
        if self.writer is None:
            raise RuntimeError("no WAL segment open")
        self.writer.add_record(payload, sync)
        self.max_seq = seq

    def retire(self, low_seq: int | None) -> None:
        """Delete closed segments holding only records older than ``low_seq``.

        ``low_seq`` is the smallest sequence number any memtable still holds
        (None: the memtables are empty, every closed segment can go).
        """
        keep = []
        for number, max_seq in self.closed:
            if low_seq is None or max_seq < low_seq:
                try:
                    os.unlink(self.path(number))
                except FileNotFoundError:
                    pass
            else:
                keep.append([number, max_seq])
        self.closed = keep

    def sync(self) -> None:
        if self.writer is not None:
            self.writer.sync()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
