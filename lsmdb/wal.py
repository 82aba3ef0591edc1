"""Write-ahead log: framed, checksummed records in numbered segment files.

Record layout (docs/FORMAT.md, "WAL")::

    crc32 u32 (of payload) | length u32 | payload: length bytes

The payload of a database WAL record is msgpack ``[seq, [[table_id, key,
value|nil], ...]]``: one record per write or batch, so a batch across tables
is atomic.  A bad record (checksum mismatch, impossible length, running past
the end of the file) with no valid record after it is a torn write that was
never acknowledged and is dropped; a bad record followed by a valid one is
corruption (CorruptionError), never skipped.
"""

from __future__ import annotations

import os
from typing import BinaryIO

from .coding import WAL_HEADER, WAL_HEADER_SIZE, crc32, fsync_dir
from .errors import CorruptionError

# A record larger than this is not something lsmdb writes; its length field
# is garbage.  (Batches are limited well below it.)
MAX_RECORD_BYTES = 1 << 31


class LogWriter:
    """Appends records to one segment file.  Not thread-safe: the DB serialises writers."""

    def __init__(self, path: str, sync_dir: bool = True) -> None:
        self.path = path
        existed = os.path.exists(path)
        self._f: BinaryIO = open(path, "ab", buffering=0)
        self.size = self._f.tell()
        if not existed and sync_dir:
            try:
                fsync_dir(os.path.dirname(path) or ".")
            except BaseException:
                self._f.close()
                raise

    def add_record(self, payload: bytes, sync: bool = False) -> None:
        if not payload:
            raise ValueError("a WAL record needs a non-empty payload")
        if len(payload) > MAX_RECORD_BYTES:
            raise ValueError(f"a WAL record is limited to {MAX_RECORD_BYTES} bytes")
        data = WAL_HEADER.pack(crc32(payload), len(payload)) + payload
        view = memoryview(data)
        while view:
            written = self._f.write(view)
            if written is None:  # pragma: no cover - only for non-blocking files
                continue
            view = view[written:]
        self.size += len(data)
        if sync:
            os.fsync(self._f.fileno())

    def sync(self) -> None:
        os.fsync(self._f.fileno())

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


class LogReadResult:
    """Records read from one segment."""

    __slots__ = ("records", "valid_length", "torn", "file_length")

    def __init__(self, records: list[tuple[int, bytes]], valid_length: int,
                 torn: bool, file_length: int) -> None:
        self.records = records            # (offset, payload)
        self.valid_length = valid_length  # bytes up to the end of the last good record
        self.torn = torn                  # a partial last record was dropped
        self.file_length = file_length


def _valid_record_at(data: bytes, off: int) -> bool:
    size = len(data)
    if size - off < WAL_HEADER_SIZE:
        return False
    crc, length = WAL_HEADER.unpack_from(data, off)
    end = off + WAL_HEADER_SIZE + length
    return 0 < length <= MAX_RECORD_BYTES and end <= size and \
        crc32(data[off + WAL_HEADER_SIZE:end]) == crc


def _bad_record(data: bytes, off: int, records: list[tuple[int, bytes]], path: str,
                why: str) -> LogReadResult:
    """A record at ``off`` is unreadable: a torn tail, unless good records follow it.

    A write torn by a crash can only be the last thing in the file, so if any
    valid record starts after ``off`` the damage is in the middle of the log:
    corruption, never silently skipped.  (A record is valid when its length
    fits and its CRC-32 matches: chance matches in garbage are 2**-32 rare.)
    """
    for start in range(off + 1, len(data) - WAL_HEADER_SIZE):
        if _valid_record_at(data, start):
            raise CorruptionError(f"WAL {why} followed by valid records", path, off)
    return LogReadResult(records, off, True, len(data))


def read_log(data: bytes, path: str = "<memory>") -> LogReadResult:
    """Parse every record of a segment's bytes (see module docstring for torn tails)."""
    records: list[tuple[int, bytes]] = []
    size = len(data)
    off = 0
    while off < size:
        if size - off < WAL_HEADER_SIZE:
            return LogReadResult(records, off, True, size)
        crc, length = WAL_HEADER.unpack_from(data, off)
        end = off + WAL_HEADER_SIZE + length
        if length == 0 or length > MAX_RECORD_BYTES:
            return _bad_record(data, off, records, path, f"record with invalid length {length}")
        if end > size:
            return _bad_record(data, off, records, path, "record running past the end of the file")
        payload = data[off + WAL_HEADER_SIZE:end]
        if crc32(payload) != crc:
            return _bad_record(data, off, records, path, "record checksum mismatch")
        records.append((off, payload))
        off = end
    return LogReadResult(records, off, False, size)


def read_log_file(path: str) -> LogReadResult:
    with open(path, "rb") as f:
        return read_log(f.read(), path)


def truncate_file(path: str, length: int) -> None:
    """Cut a torn tail off a segment durably, so later appends follow good data."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, length)
        os.fsync(fd)
    finally:
        os.close(fd)
