"""Fixed-width encodings and checksums shared by every on-disk format.

All integers are little-endian.  Checksums are CRC-32 (``zlib.crc32``, the
IEEE polynomial), computed over the bytes they protect.  See docs/FORMAT.md.
"""

from __future__ import annotations

import os
import struct
import zlib

try:  # optional C speedups: the same CRC-32, about 4x faster where PCLMULQDQ exists
    from ._speedups import CRC32_CLMUL as _CRC32_CLMUL
    from ._speedups import crc32 as _c_crc32
except ImportError:  # pragma: no cover - built without a C compiler
    _CRC32_CLMUL = 0

#: ``crc32(data, value=0)``: zlib.crc32, or the C fold where it is faster.
crc32 = _c_crc32 if _CRC32_CLMUL else zlib.crc32

#: crc32(payload + crc32(payload) as 4 little-endian bytes) for every payload:
#: checking a block's payload and trailer in one pass, without slicing them apart.
CRC32_RESIDUE = 0x2144DF1C

# Block trailer: crc32 (u32) of the block payload.  DO NOT CHANGE: on disk.
BLOCK_TRAILER = struct.Struct("<I")
BLOCK_TRAILER_SIZE = BLOCK_TRAILER.size
assert BLOCK_TRAILER_SIZE == 4

# WAL record header: crc32 (u32) of the payload, payload length (u32).
WAL_HEADER = struct.Struct("<II")
WAL_HEADER_SIZE = WAL_HEADER.size
assert WAL_HEADER_SIZE == 8


def fsync_dir(path: str) -> None:
    """fsync a directory so that entries created, renamed or removed in it persist."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SwitchedButNotSynced(OSError):
    """The new file replaced the old one, but fsyncing the directory failed.

    The switch is visible (and is what a reopen reads unless the machine
    crashes), so the caller must keep the new state -- never roll back to a
    state that deletes files the new file names -- and must keep anything the
    old state needs, since a machine crash could still bring it back.
    """


def write_file_durably(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: temp file, fsync, rename, fsync dir.

    Raises SwitchedButNotSynced when only the last step failed.
    """
    directory = os.path.dirname(path) or "."
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    try:
        fsync_dir(directory)
    except OSError as exc:
        raise SwitchedButNotSynced(exc.errno, f"{path} replaced, but fsync of its directory "
                                              f"failed: {exc.strerror}") from exc
