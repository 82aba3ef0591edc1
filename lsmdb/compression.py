"""Data block compression: the table option ``compression`` and the type byte
each format-2 data block records (docs/FORMAT.md §4.2).

========  ====  ==========================================================
option    type  stored bytes
========  ====  ==========================================================
``none``  0     the payload as it is
``lz4``   1     ``lz4.block.compress(payload)``: the payload's length (u32
                little-endian), then the LZ4 block
``zstd``  2     one Zstandard frame (``zstandard``, level 3) that records
                the payload's length
========  ====  ==========================================================

A block is stored compressed only when that saves at least an eighth of its
payload; otherwise it is stored as it is, type 0, whatever the option says.
The checksum covers the stored bytes, so a corrupt block is refused before
it is decompressed; a checksum-valid block that does not decompress to a
payload of the length it records is a ``CorruptionError`` too.  Filter,
index and properties blocks are never compressed.  The Python and the C read
paths decompress through the same two packages (the C getter calls
:func:`decompress_for_c`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import lz4.block
import zstandard

from .errors import CorruptionError

NONE, LZ4, ZSTD = 0, 1, 2  # DO NOT CHANGE: on disk.
#: Type byte by option name, and back.
TYPES = {"none": NONE, "lz4": LZ4, "zstd": ZSTD}
NAMES = {v: k for k, v in TYPES.items()}
#: What the table option ``compression`` takes, in the order docs list them.
CHOICES = ("lz4", "zstd", "none")

ZSTD_LEVEL = 3
#: The largest payload a block decompresses to: its cached form's offsets are u32.
MAX_PAYLOAD = (1 << 32) - 1

_lz4_compress = lz4.block.compress
_lz4_decompress = lz4.block.decompress


class _Zstd(threading.local):
    """A Zstandard compressor and decompressor per thread: their objects must not
    be used by two threads at once (a flush and a compaction compress at once)."""

    def __init__(self) -> None:
        self.c = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True,
                                          write_checksum=False)
        self.d = zstandard.ZstdDecompressor()


_zstd = _Zstd()


def compress(kind: int, payload: bytes) -> tuple[int, bytes]:
    """(type, stored bytes) of ``payload`` under compression ``kind``: the
    compressed form only when it is at most 7/8 of the payload, else
    (NONE, payload)."""
    pack = compressor(kind)
    if pack is None or not payload:
        return NONE, payload
    return kept(kind, payload, pack(payload))


def kept(kind: int, payload: bytes, packed: bytes) -> tuple[int, bytes]:
    """(type, stored bytes) of ``payload`` compressed as ``kind`` to ``packed``:
    ``packed`` where it is at most 7/8 of the payload, else (NONE, payload)."""
    if len(packed) > len(payload) - len(payload) // 8:
        return NONE, payload
    return kind, packed


def compressor(kind: int) -> Callable[[bytes], bytes] | None:
    """What :func:`compress` calls for ``kind`` (None for NONE), for use on
    this thread: ``compress`` is :func:`kept` of ``compressor(kind)(payload)``."""
    if kind == NONE:
        return None
    return _lz4_compress if kind == LZ4 else _zstd.c.compress


def _zstd_length(stored: bytes | memoryview) -> int:
    """The payload length a Zstandard frame records; -1 if it records none."""
    try:
        size = zstandard.frame_content_size(stored)
    except zstandard.ZstdError:
        return -1
    return size if size >= 0 else -1


def decompress(kind: int, stored: bytes | memoryview, path: str, offset: int) -> bytes:
    """The payload of a block stored as ``kind``; CorruptionError naming
    ``path`` and ``offset`` for an unknown type, or bytes that do not
    decompress to the length they record."""
    if kind == NONE:
        return bytes(stored)
    if kind == LZ4:  # lz4 checks the stream and that it fills the length it records
        try:
            payload = _lz4_decompress(stored)
        except Exception as exc:  # lz4 raises its own types
            raise CorruptionError(f"data block does not decompress ({type(exc).__name__})",
                                  path, offset) from None
        if not payload:
            raise CorruptionError("compressed data block records no valid length", path, offset)
        return payload
    if kind != ZSTD:
        raise CorruptionError(f"data block of unknown compression type {kind}", path, offset)
    size = _zstd_length(stored)
    if not 0 < size <= MAX_PAYLOAD:
        raise CorruptionError("compressed data block records no valid length", path, offset)
    try:  # exactly one frame: nothing after it, and it ends
        frame = _zstd.d.decompressobj()
        payload = frame.decompress(stored)
        if not frame.eof or frame.unused_data:
            raise ValueError("not one whole frame")
    except Exception as exc:  # zstandard raises its own types
        raise CorruptionError(f"data block does not decompress ({type(exc).__name__})",
                              path, offset) from None
    if len(payload) != size:
        raise CorruptionError("data block decompresses to the wrong length", path, offset)
    return payload


def decompress_for_c(kind: int, stored: bytes) -> bytes | None:
    """What the C getter calls for a compressed block it read: the payload, or
    None for one that does not decompress (the Python path then reads the
    block again and raises CorruptionError with its file and offset)."""
    try:
        return decompress(kind, stored, "", 0)
    except CorruptionError:
        return None
