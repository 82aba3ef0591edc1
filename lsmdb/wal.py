"""Write-ahead log: framed, checksummed records in numbered segment files.

Record layout (docs/FORMAT.md, "WAL")::

    crc32 u32 (of payload) | length u32 | payload: length bytes

The payload of a database WAL record is msgpack ``[seq, [[table_id, key,
value|nil], ...]]``: one record per write or batch, so a batch across tables
is atomic.  A record that runs past the end of the file, or a checksum
failure in the very last record, is a torn write that was never acknowledged
and is dropped; a checksum failure followed by more data is corruption.
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
            fsync_dir(os.path.dirname(path) or ".")

    def add_record(self, payload: bytes, sync: bool = False) -> None:
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
            if not any(data[off:]):  # zero-filled tail of a torn write
                return LogReadResult(records, off, True, size)
            raise CorruptionError(f"WAL record with invalid length {length}", path, off)
        if end > size:
            return LogReadResult(records, off, True, size)
        payload = data[off + WAL_HEADER_SIZE:end]
        if crc32(payload) != crc:
            if end == size:  # the last write was torn: never acknowledged
                return LogReadResult(records, off, True, size)
            raise CorruptionError("WAL record checksum mismatch", path, off)
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
