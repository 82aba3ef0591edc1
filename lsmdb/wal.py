"""Write-ahead-log segments: records framed in 32 KiB blocks (docs/FORMAT.md §3).

A segment (format 2)::

    segment header, 16 bytes: magic "LSMDBWAL" | format u32 = 2 | number u32
    then fragments, packed into blocks of 32768 bytes counted from offset 0:

    fragment: crc32 u32 | length u16 | type u8 | payload: length bytes
      type 1 FULL (a whole record), 2 FIRST, 3 MIDDLE, 4 LAST (a record in pieces)
      crc32 over: the segment's number (u32), type, payload

A fragment never crosses a block boundary: a record that does not fit in
what is left of a block continues in the next one, and fewer than 7 bytes
left at a block's end are zeros.  So the writer, never a payload, puts the
bytes at every block start, and a payload -- user data -- can never be taken
for a fragment there: that is what lets a reader tell a torn tail from
damage in the middle of the log.  The number in every checksum makes a
fragment of another segment (a copy, a stale disk block) fail.

Reading a segment:

* a **closed** segment has the size its manifest entry records, every byte
  of it fsynced before that entry was written: any bad fragment within that
  size, or a file shorter than it, is a CorruptionError;
* the **live** segment (the one a crash interrupted) ends where its last
  whole record ends.  Zeros from there to the end of the file are its clean
  end: space the writer allocated ahead, or a tail that never reached the
  disk.  Any other bad fragment with no valid fragment at a later block
  start is a torn tail -- a crash cut the write short -- and is dropped; a
  bad fragment followed by a valid one at a later block start is corruption.

A record's payload is opaque here (:mod:`lsmdb.logset` gives it meaning).
Segments written before format 2 (no header; ``crc32 u32 | length u32 |
payload`` records back to back) are still read: :func:`read_legacy_log`.
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
import zlib

from .coding import WAL_HEADER, WAL_HEADER_SIZE, crc32
from .errors import CorruptionError
from .files import create, preallocate, read_file, unlink_quietly

SEGMENT_MAGIC = b"LSMDBWAL"   # DO NOT CHANGE: on disk.
SEGMENT_FORMAT = 2            # DO NOT CHANGE: on disk.
LEGACY_FORMAT = 1             # segments without a header (read only)
SEGMENT_HEADER = struct.Struct("<8sII")
SEGMENT_HEADER_SIZE = SEGMENT_HEADER.size
assert SEGMENT_HEADER_SIZE == 16

BLOCK_SIZE_BYTES = 32768      # DO NOT CHANGE: on disk.
FRAGMENT_HEADER = struct.Struct("<IHB")
FRAGMENT_HEADER_SIZE = FRAGMENT_HEADER.size
assert FRAGMENT_HEADER_SIZE == 7
MAX_FRAGMENT_BYTES = BLOCK_SIZE_BYTES - FRAGMENT_HEADER_SIZE

# Fragment types.  DO NOT CHANGE: on disk (0 is never written: zeros are padding).
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4

#: A record larger than this is refused (batches are limited well below it).
MAX_RECORD_BYTES = 1 << 31

#: A segment's file grows by its size so far, at least the first and at most
#: the second (rounded up to whole pages), allocated ahead of the records.
PREALLOCATE_MIN_BYTES = 64 << 10
PREALLOCATE_MAX_BYTES = 8 << 20
#: A record this large or larger (a batch) is written with ``pwrite`` past
#: ``size``, rather than copied into space allocated ahead and mapped: the copy
#: takes a page fault for every fresh page of the shared mapping (12 MB of
#: 650 KB records measured 11-17 ms that way, 1.6-2 ms with pwrite), and each
#: allocation is a system call that lets other threads take the GIL.
PWRITE_MIN_BYTES = 64 << 10

#: Reads of a live segment that another writer may be filling, before a
#: defect that moves from one read to the next is taken for corruption.
LIVE_READ_ATTEMPTS = 8

#: Linux writes a shared mapping's dirty pages back at an fsync of the file;
#: elsewhere ``msync`` comes first.
_FSYNC_COVERS_MAPPINGS = sys.platform.startswith("linux")


def crc_seeds(number: int) -> tuple[int, ...]:
    """Per fragment type, the CRC-32 of (segment number u32, type u8): a
    fragment's checksum is ``crc32(payload, seeds[type])``."""
    prefix = (number & 0xFFFFFFFF).to_bytes(4, "little")
    return tuple(zlib.crc32(prefix + bytes([t])) for t in range(LAST + 1))


class LogWriter:
    """Appends records to a new segment file.  Not thread-safe: the DB serialises writers.

    A small record is copied into a shared memory mapping of space allocated
    ahead (``files.preallocate``, at least PREALLOCATE_MIN_BYTES at a time)
    -- the page cache itself, so it survives this process being killed, as a
    ``write`` would -- with no system call; space runs out in
    :meth:`reserve` (an OSError, nothing of the record stored).  A large one
    (PWRITE_MIN_BYTES) goes in with ``pwrite``, which allocates as it
    writes: one that fails (a full disk) may leave part of the record past
    ``size``, which a reader takes for a torn tail (the log is failed:
    nothing follows it in this segment).  ``sync`` fsyncs the file.  Past
    the last record the file reads as zeros, which a reader takes as the
    live segment's clean end; ``close`` cuts the file to ``size`` (in the
    process that made it).

    ``size`` counts the bytes of whole records written (and the header).
    """

    # (slots: the C put, lsmdb/csrc/writepath.c, reads them at their offsets)
    __slots__ = ("path", "number", "_seeds", "_fd", "_map", "size", "_pid", "_allocated")

    def __init__(self, path: str, number: int) -> None:
        self.path = path
        self.number = number
        self._seeds = crc_seeds(number)
        self._fd = create(path, readable=True)
        self._pid = os.getpid()
        self._map: mmap.mmap | None = None
        self._allocated = 0  # bytes the file holds: allocated ahead, or written with pwrite
        self.size = 0
        try:
            self.reserve(SEGMENT_HEADER_SIZE)
            self._store(SEGMENT_HEADER.pack(SEGMENT_MAGIC, SEGMENT_FORMAT, number & 0xFFFFFFFF))
        except BaseException:
            self._unmap()
            os.close(self._fd)
            unlink_quietly(path)
            raise

    def reserve(self, need: int) -> None:
        """Room in the file, and in its mapping, for its first ``need`` bytes;
        OSError (ENOSPC) if the disk has none, the segment then as it was."""
        have = self._allocated
        if need > have:
            grow = min(max(have, PREALLOCATE_MIN_BYTES), PREALLOCATE_MAX_BYTES)
            new = -(-(need + grow) // mmap.PAGESIZE) * mmap.PAGESIZE
            preallocate(self._fd, have, new - have)
            self._allocated = new
        if need <= (0 if self._map is None else len(self._map)):
            return
        fresh = mmap.mmap(self._fd, self._allocated)  # shared, read and write
        if self._map is not None and not _FSYNC_COVERS_MAPPINGS:
            self._map.flush()  # its pages, before the mapping goes (sync flushes the new one)
        self._unmap()
        self._map = fresh

    def _store(self, data: bytes | bytearray) -> None:
        """Write whole fragments in after ``size`` (below PWRITE_MIN_BYTES, into
        the room reserved in the mapping) and count them."""
        end = self.size + len(data)
        if len(data) >= PWRITE_MIN_BYTES:
            view, at = memoryview(data), self.size
            while view:
                done = os.pwrite(self._fd, view, at)
                view, at = view[done:], at + done
            # The file holds these bytes now: space allocated later starts past
            # them (where a file system cannot allocate, preallocate writes zeros).
            self._allocated = max(self._allocated, end)
        else:
            assert self._map is not None
            self._map[self.size:end] = data
        self.size = end

    def add_record(self, payload: bytes) -> None:
        n = len(payload)
        if not n:
            raise ValueError("a WAL record needs a non-empty payload")
        if n > MAX_RECORD_BYTES:
            raise ValueError(f"a WAL record is limited to {MAX_RECORD_BYTES} bytes")
        left = BLOCK_SIZE_BYTES - self.size % BLOCK_SIZE_BYTES
        if n + FRAGMENT_HEADER_SIZE <= left:  # the common case: one fragment
            data: bytes | bytearray = FRAGMENT_HEADER.pack(
                crc32(payload, self._seeds[FULL]), n, FULL) + payload
        else:
            data = self._fragments(payload, left)
        if len(data) < PWRITE_MIN_BYTES:
            self.reserve(self.size + len(data))
        self._store(data)

    def _fragments(self, payload: bytes, left: int) -> bytearray:
        out = bytearray()
        view = memoryview(payload)
        first = True
        while True:
            if left < FRAGMENT_HEADER_SIZE:
                out += bytes(left)  # padding: the next fragment starts the next block
                left = BLOCK_SIZE_BYTES
            room = left - FRAGMENT_HEADER_SIZE
            piece, view = view[:room], view[room:]
            kind = (FULL if first else LAST) if not view else (FIRST if first else MIDDLE)
            out += FRAGMENT_HEADER.pack(crc32(piece, self._seeds[kind]), len(piece), kind)
            out += piece
            left -= FRAGMENT_HEADER_SIZE + len(piece)
            first = False
            if not view:
                return out

    def unwrite(self, start: int) -> None:
        """Take back the records from ``start`` (a record's start) on: zeros again,
        the segment's clean end there -- for a write that raised after it was
        stored (its fsync failed), which no reader may then take.  Zeroed from
        the end backwards, so that a failure or a crash part way leaves the
        record cut short (a torn tail), never its start gone with later
        fragments still in place."""
        if start >= self.size:
            return
        mapped = min(self.size, 0 if self._map is None else len(self._map))
        end = self.size
        while end > max(start, mapped):  # the part written with pwrite, past the mapping
            at = max(start, mapped, end - (1 << 20))
            zeros = memoryview(bytes(end - at))
            while zeros:
                zeros = zeros[os.pwrite(self._fd, zeros, end - len(zeros)):]
            self.size = end = at
        if self._map is not None and start < mapped:
            self._map[start:mapped] = bytes(mapped - start)
        self.size = start

    def sync(self) -> None:
        if self._map is not None and not _FSYNC_COVERS_MAPPINGS:
            self._map.flush()  # msync: where fsync alone may miss the mapping's pages
        os.fsync(self._fd)

    def _unmap(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None

    def close(self) -> None:
        """Unmap and close; the space allocated past ``size`` is given back (not
        in a forked child: the file is its parent's)."""
        if self._fd < 0:
            return
        self._unmap()
        if self._pid == os.getpid():
            try:
                os.ftruncate(self._fd, self.size)
            except OSError:
                pass  # zeros past the last record read as the clean end all the same
        os.close(self._fd)
        self._fd = -1


class LogReadResult:
    """Records read from one segment."""

    __slots__ = ("records", "valid_length", "torn", "file_length", "format")

    def __init__(self, records: list[tuple[int, bytes]], valid_length: int,
                 torn: bool, file_length: int, fmt: int = SEGMENT_FORMAT) -> None:
        self.records = records            # (offset of the record's first fragment, payload)
        self.valid_length = valid_length  # bytes up to the end of the last whole record
        self.torn = torn                  # something after it was dropped
        self.file_length = file_length
        self.format = fmt


def segment_format(data: bytes) -> int:
    """SEGMENT_FORMAT for a segment that starts with the header, else LEGACY_FORMAT."""
    return SEGMENT_FORMAT if data[:len(SEGMENT_MAGIC)] == SEGMENT_MAGIC else LEGACY_FORMAT


def _fragment_at(data: bytes, off: int, end: int, seeds: tuple[int, ...]
                 ) -> tuple[int, int] | None:
    """(type, payload end) of a valid fragment at ``off`` (which leaves at least a
    header's room in its block), or None."""
    if end - off < FRAGMENT_HEADER_SIZE:
        return None
    crc, length, kind = FRAGMENT_HEADER.unpack_from(data, off)
    start = off + FRAGMENT_HEADER_SIZE
    stop = start + length
    if not FULL <= kind <= LAST or stop > end or \
            stop > (off // BLOCK_SIZE_BYTES + 1) * BLOCK_SIZE_BYTES:
        return None
    if (kind in (FULL, LAST) and length == 0) or crc32(data[start:stop], seeds[kind]) != crc:
        return None
    return kind, stop


class _Records:
    """Whole records put together from fragments, in order."""

    __slots__ = ("records", "valid", "start", "pieces")

    def __init__(self, valid: int) -> None:
        self.records: list[tuple[int, bytes]] = []
        self.valid = valid           # where the last whole record ends
        self.start = -1              # offset of the FIRST fragment of a record in pieces
        self.pieces: list[bytes] = []

    def fits(self, kind: int) -> bool:
        """Whether a fragment of ``kind`` may come next (a record starts, or goes on)."""
        return (kind in (FULL, FIRST)) == (self.start < 0)

    def add(self, off: int, kind: int, payload: bytes, stop: int) -> None:
        if kind == FULL:
            self.records.append((off, payload))
            self.valid = stop
        elif kind == FIRST:
            self.start, self.pieces = off, [payload]
        else:
            self.pieces.append(payload)
            if kind == LAST:
                self.records.append((self.start, b"".join(self.pieces)))
                self.drop_partial()
                self.valid = stop

    def drop_partial(self) -> None:
        self.start, self.pieces = -1, []


def read_segment(data: bytes, number: int, path: str = "<memory>",
                 closed_size: int | None = None) -> LogReadResult:
    """Every record of segment ``number`` (format 2) from its bytes.

    ``closed_size``: the segment is closed and holds exactly that many bytes
    of records (anything past them is ignored); every defect is corruption.
    None: the live segment, whose torn tail is dropped (see the module
    docstring).
    """
    closed = closed_size is not None
    size = len(data)
    if closed:
        assert closed_size is not None
        if size < closed_size:
            raise CorruptionError(f"WAL segment has {size} bytes; the manifest records "
                                  f"{closed_size}", path, size)
        end = closed_size
    else:
        end = size
    seeds = crc_seeds(number)
    if end == 0:
        return LogReadResult([], 0, False, size)
    header = data[:min(end, SEGMENT_HEADER_SIZE)]
    expected = SEGMENT_HEADER.pack(SEGMENT_MAGIC, SEGMENT_FORMAT, number & 0xFFFFFFFF)
    if header != expected:
        same = 0  # the header's bytes that agree with the expected one
        while same < len(header) and header[same] == expected[same]:
            same += 1
        if closed or any(header[same:]):
            magic, fmt, num = SEGMENT_HEADER.unpack_from(data.ljust(SEGMENT_HEADER_SIZE, b"\0"))
            if magic == SEGMENT_MAGIC and fmt == SEGMENT_FORMAT:
                raise CorruptionError(f"WAL segment header names segment {num}, not {number}",
                                      path, 0)
            raise CorruptionError(f"bad WAL segment header (magic {magic!r}, format {fmt})",
                                  path, 0)
        # The live segment's header only partly reached the disk (the rest
        # zeros): it holds no record, unless records follow (a damaged header).
        if _fragment_at(data, SEGMENT_HEADER_SIZE, end, seeds) is not None:
            raise CorruptionError("WAL segment header zeroed before valid records", path, 0)
        return _bad(data, 0, 0, end, seeds, _Records(0), path, False,
                    "segment header cut short")
    got = _Records(SEGMENT_HEADER_SIZE)
    off = SEGMENT_HEADER_SIZE
    while off < end:
        left = BLOCK_SIZE_BYTES - off % BLOCK_SIZE_BYTES
        if left < FRAGMENT_HEADER_SIZE:  # a block's padding
            if any(data[off:min(off + left, end)]):
                return _bad(data, off, off, end, seeds, got, path, closed,
                            "nonzero padding at a block's end")
            off += left
            continue
        found = _fragment_at(data, off, end, seeds)
        if found is None or not got.fits(found[0]):
            why = "bad fragment" if found is None else "fragment out of sequence"
            return _bad(data, off, off, end, seeds, got, path, closed, why)
        kind, stop = found
        got.add(off, kind, data[off + FRAGMENT_HEADER_SIZE:stop], stop)
        off = stop
    if got.start >= 0:  # the file ends inside a record
        return _bad(data, got.start, end, end, seeds, got, path, closed, "record cut short")
    return LogReadResult(got.records, got.valid, False, size)


def _bad(data: bytes, off: int, defect: int, end: int, seeds: tuple[int, ...],
         got: _Records, path: str, closed: bool, why: str) -> LogReadResult:
    """A segment's first defect (reported at ``off``; found at ``defect``): corruption,
    or the live segment's torn tail when no valid fragment starts a later block."""
    if closed:
        raise CorruptionError(f"WAL {why} in a closed segment", path, off)
    if got.start < 0 and off == defect and data.count(b"\0", off) == len(data) - off:
        # Zeros from a record's end to the end of the file: space the writer
        # allocated ahead (LogWriter), or a tail that never reached the disk --
        # the segment's end either way, nothing dropped.
        return LogReadResult(got.records, got.valid, False, len(data))
    block = (defect // BLOCK_SIZE_BYTES + 1) * BLOCK_SIZE_BYTES
    while block < end:
        if _fragment_at(data, block, end, seeds) is not None:
            raise CorruptionError(f"WAL {why} followed by valid records", path, off)
        block += BLOCK_SIZE_BYTES
    return LogReadResult(got.records, got.valid, True, len(data))


def read_segment_file(path: str, number: int, closed_size: int | None = None,
                      fmt: int | None = None) -> LogReadResult:
    """:func:`read_segment` or :func:`read_legacy_log` of the file, by ``fmt``
    (None: by what the file starts with)."""
    data = read_file(path)
    if fmt is None:
        fmt = segment_format(data) if any(data[:SEGMENT_HEADER_SIZE]) else SEGMENT_FORMAT
    if fmt == LEGACY_FORMAT:
        result = read_legacy_log(data if closed_size is None else data[:closed_size], path)
        if closed_size is not None and (result.torn or len(data) < closed_size):
            raise CorruptionError("legacy WAL segment shorter than the manifest records",
                                  path, result.valid_length)
        return result
    if closed_size is not None:
        return read_segment(data, number, path, closed_size)
    # The live segment may be written (another process, another thread) while
    # it is read: a read returns its pages as they were at different moments,
    # so a page the writer had not yet filled (zeros) can come back before a
    # later one it filled since -- which reads as damage followed by valid
    # records.  Read again: a real defect stays where it is, a race moves on.
    defect = None
    for _ in range(LIVE_READ_ATTEMPTS - 1):
        try:
            return read_segment(data, number, path)
        except CorruptionError as exc:
            if exc.offset == defect:
                raise
            defect = exc.offset
        data = read_file(path)
    return read_segment(data, number, path)


def read_records_from(path: str, number: int, start: int) -> tuple[list[tuple[int, bytes]], int]:
    """The whole records of live segment ``number`` (format 2) from ``start``, an
    offset where a record ends, on: (records as ``(offset, payload)``, where
    the last of them ends -- ``start`` when there are none).

    What a reader that follows a writer reads to catch up, without reading
    the segment again from its start.  It stops at the first bytes that do
    not make a whole, valid fragment sequence -- zeros the writer allocated
    ahead, a record it is writing this instant, or damage -- and never
    raises for them: a reread of the whole segment (:func:`read_segment_file`)
    tells damage from a tail.  FileNotFoundError when the segment is gone.
    """
    seeds = crc_seeds(number)
    got = _Records(start)
    data = bytearray()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        def have(end: int) -> bool:  # data covers [start, end)
            while start + len(data) < end:
                chunk = os.pread(fd, max(1 << 16, end - start - len(data)), start + len(data))
                if not chunk:
                    return False
                data.extend(chunk)
            return True

        off = start
        while True:
            left = BLOCK_SIZE_BYTES - off % BLOCK_SIZE_BYTES
            if left < FRAGMENT_HEADER_SIZE:  # a block's padding
                off += left
                continue
            if not have(off + FRAGMENT_HEADER_SIZE):
                break
            crc, length, kind = FRAGMENT_HEADER.unpack_from(data, off - start)
            stop = off + FRAGMENT_HEADER_SIZE + length
            if not FULL <= kind <= LAST or length > left - FRAGMENT_HEADER_SIZE or \
                    (kind in (FULL, LAST) and length == 0) or not got.fits(kind) or \
                    not have(stop):
                break
            payload = bytes(data[off + FRAGMENT_HEADER_SIZE - start:stop - start])
            if crc32(payload, seeds[kind]) != crc:
                break
            got.add(off, kind, payload, stop)
            off = stop
    finally:
        os.close(fd)
    return got.records, got.valid


# -- segments written before format 2 ----------------------------------------------------

def _valid_legacy_record_at(data: bytes, off: int) -> bool:
    size = len(data)
    if size - off < WAL_HEADER_SIZE:
        return False
    crc, length = WAL_HEADER.unpack_from(data, off)
    end = off + WAL_HEADER_SIZE + length
    return 0 < length <= MAX_RECORD_BYTES and end <= size and \
        crc32(data[off + WAL_HEADER_SIZE:end]) == crc


def read_legacy_log(data: bytes, path: str = "<memory>") -> LogReadResult:
    """Records of a segment without a header (``crc32 u32 | length u32 | payload``).

    Such a log has no block structure, so its torn-tail rule is a scan: a bad
    record followed by a valid record at any later byte offset is corruption.
    """
    records: list[tuple[int, bytes]] = []
    size = len(data)
    off = 0
    while off < size:
        bad = None
        if size - off < WAL_HEADER_SIZE:
            bad = "record header cut short"
        else:
            crc, length = WAL_HEADER.unpack_from(data, off)
            end = off + WAL_HEADER_SIZE + length
            if length == 0 or length > MAX_RECORD_BYTES:
                bad = f"record with invalid length {length}"
            elif end > size:
                bad = "record running past the end of the file"
            elif crc32(data[off + WAL_HEADER_SIZE:end]) != crc:
                bad = "record checksum mismatch"
        if bad is not None:
            for start in range(off + 1, size - WAL_HEADER_SIZE):
                if _valid_legacy_record_at(data, start):
                    raise CorruptionError(f"WAL {bad} followed by valid records", path, off)
            return LogReadResult(records, off, True, size, LEGACY_FORMAT)
        records.append((off, data[off + WAL_HEADER_SIZE:end]))
        off = end
    return LogReadResult(records, off, False, size, LEGACY_FORMAT)


def salvage_segment(data: bytes, number: int) -> tuple[list[tuple[int, bytes]],
                                                       list[tuple[int, int]]]:
    """Every whole record of a format-2 segment that still reads, for ``lsmdb repair``.

    Past a defect, reading resumes at the next block start that begins a
    record (a FULL or FIRST fragment whose checksum holds): only the writer
    puts bytes there, so no payload can be taken for a record.  Returns the
    records (offset, payload) and the damaged stretches (start, end) skipped.
    """
    seeds = crc_seeds(number)
    size = len(data)
    got = _Records(SEGMENT_HEADER_SIZE)
    damaged: list[tuple[int, int]] = []
    off = SEGMENT_HEADER_SIZE
    bad_from = -1 if data[:SEGMENT_HEADER_SIZE] == SEGMENT_HEADER.pack(
        SEGMENT_MAGIC, SEGMENT_FORMAT, number & 0xFFFFFFFF) else 0
    while off < size:
        left = BLOCK_SIZE_BYTES - off % BLOCK_SIZE_BYTES
        if left < FRAGMENT_HEADER_SIZE:
            off += left
            continue
        found = _fragment_at(data, off, size, seeds)
        resuming = bad_from >= 0
        if found is None and not resuming and got.start < 0 \
                and data.count(b"\0", off) == size - off:
            break  # zeros from a record's end on: the clean end (LogWriter's space ahead)
        if found is None or (not resuming and not got.fits(found[0])):
            if bad_from < 0:
                bad_from = got.start if got.start >= 0 else off
            got.drop_partial()
            off = (off // BLOCK_SIZE_BYTES + 1) * BLOCK_SIZE_BYTES  # resynchronise
            continue
        kind, stop = found
        if resuming:
            if kind in (MIDDLE, LAST):  # the rest of a record whose start was lost
                off = stop
                continue
            damaged.append((bad_from, off))
            bad_from = -1
        got.add(off, kind, data[off + FRAGMENT_HEADER_SIZE:stop], stop)
        off = stop
    if bad_from >= 0:
        damaged.append((bad_from, size))
    elif got.start >= 0:
        damaged.append((got.start, size))
    return got.records, damaged
