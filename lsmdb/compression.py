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
``lz4``   3     the payload in pieces, each one LZ4 block compressed with
                the file's dictionary (below)
========  ====  ==========================================================

**Pieces and the file's dictionary (type 3).** A file of an ``lz4`` table
that the block-by-block writer (compaction) writes gets a dictionary once it
reaches :data:`DICT_BLOCKS` data blocks or :data:`DICT_HELD_BYTES` of
payloads: excerpts of its first blocks' values (:func:`make_dictionary`),
kept in its properties (``compression_dict``); the file is then format 4 (or
5, with expiring values). A flush writes type 1. Each of its LZ4 blocks is
then cut into pieces: the first holds the payload up to the end of its keys
array, the others its values, a new one beginning at the first value at
least :data:`PIECE_BYTES` after the last one began (the tags and expiries
ride in the last). Each piece is compressed on its own, against the
dictionary, so a read that needs one value decompresses the keys and that
value's piece alone, and the dictionary lets small pieces compress better
than one whole block without it. The stored bytes::

    payload_len u32 | pieces varint | size varint x pieces
      | first varint x (pieces - 2) | piece 0 | piece 1 | ...

``size`` is each piece's LZ4 bytes and ``first`` the index of the entry
whose value each piece from the third on begins with (the second begins
with the values array's header, and entry 0).  Varints are LEB128: seven
bits a byte, low first, the top bit set on all but the last.

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
from itertools import accumulate

import lz4.block
import zstandard

from .errors import CorruptionError

NONE, LZ4, ZSTD, LZ4_PIECES = 0, 1, 2, 3  # DO NOT CHANGE: on disk.
#: Type byte by option name, and back.
TYPES = {"none": NONE, "lz4": LZ4, "zstd": ZSTD}
NAMES = {v: k for k, v in TYPES.items()}
NAMES[LZ4_PIECES] = "lz4"
#: What the table option ``compression`` takes, in the order docs list them.
CHOICES = ("lz4", "zstd", "none")

ZSTD_LEVEL = 3
#: The largest payload a block decompresses to: its cached form's offsets are u32.
MAX_PAYLOAD = (1 << 32) - 1

_lz4_compress = lz4.block.compress
_lz4_decompress = lz4.block.decompress

try:  # optional C speedups (lsmdb/csrc/compression.c): a file's pieces compressed in C
    from ._speedups import COMPRESSION_CONSTANTS as _C_CONSTANTS
    from ._speedups import PieceCompressor as _CPieceCompressor
except ImportError:  # pragma: no cover - no C compiler when installed
    _CPieceCompressor = None  # type: ignore[assignment,misc]
    _C_CONSTANTS = {}

#: A new piece of a type-3 block begins at the first value this many bytes
#: or more after the last piece began.
PIECE_BYTES = 1024
#: The data blocks an ``lz4`` file must reach before its writer makes it a
#: dictionary (a smaller file keeps type 1: the dictionary would cost more
#: than it saves).
DICT_BLOCKS = 64
#: ... or before, once the blocks it holds back for it reach this many bytes
#: of payload (blocks of 16 KiB or more).
DICT_HELD_BYTES = 1 << 20
#: The dictionary: an excerpt of this many bytes from the start of the
#: values of every (n // DICT_SAMPLES)th of the n first blocks.
DICT_SAMPLES = 16
DICT_EXCERPT = 1024
#: The largest dictionary a reader accepts (LZ4 looks back 64 KiB at most).
MAX_DICT = 1 << 16


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


#: What the C PieceCompressor was built with, against this module's definitions.
_C_AGREES = _C_CONSTANTS == {"PIECE_BYTES": PIECE_BYTES, "MAX_DICT": MAX_DICT,
                             "LZ4_PIECES": LZ4_PIECES}
#: Whether a file's pieces are compressed in C (tests switch it off to compare).
USE_SPEEDUPS = _CPieceCompressor is not None and _C_AGREES


def piece_compressor(dictionary: bytes) -> Callable[[bytes], tuple[int, bytes]]:
    """What stores a file's data block payloads against its ``dictionary``:
    ``payload -> (type, stored)``, :func:`compress_pieces` of the payload cut
    by :func:`cut_pieces` -- in C where built (the dictionary loaded once for
    the file, the same bytes), else in Python."""
    if USE_SPEEDUPS:
        try:
            return _CPieceCompressor(dictionary).compress
        except RuntimeError:  # the lz4 package's library exports no LZ4_loadDict
            pass

    def store(payload: bytes) -> tuple[int, bytes]:
        from .block import payload_value_starts  # block imports nothing of this module's

        return compress_pieces(payload, *cut_pieces(*payload_value_starts(payload)),
                               dictionary)

    return store


def make_dictionary(excerpts: list[bytes]) -> bytes:
    """A file's dictionary from the values of its n first payloads (each from
    its values array's header on): every (n // DICT_SAMPLES)th one's first
    DICT_EXCERPT bytes, DICT_SAMPLES of them at most, joined."""
    step = max(1, len(excerpts) // DICT_SAMPLES)
    return b"".join(e[:DICT_EXCERPT] for e in excerpts[::step][:DICT_SAMPLES])[:MAX_DICT]


def cut_pieces(keys_end: int, starts: list[int]) -> tuple[list[int], list[int]]:
    """Where each piece of a type-3 block begins in its payload, and the
    entry each value piece begins with: from where the payload's keys array
    ends and where each value begins (lsmdb.block.payload_value_starts)."""
    begins, firsts = [0, keys_end], [0]
    begin = keys_end
    for j in range(1, len(starts)):
        if starts[j] - begin >= PIECE_BYTES:
            begins.append(starts[j])
            firsts.append(j)
            begin = starts[j]
    return begins, firsts


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if at >= len(data) or shift > 28:
            raise ValueError("varint runs past the block")
        b = data[at]
        at += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, at
        shift += 7


def compress_pieces(payload: bytes, begins: list[int], firsts: list[int],
                    dictionary: bytes) -> tuple[int, bytes]:
    """(type, stored bytes) of ``payload`` cut at ``begins`` (``cut_pieces``),
    each piece compressed against ``dictionary``: type 3 where that saves at
    least an eighth of the payload, else (NONE, payload)."""
    ends = begins[1:] + [len(payload)]
    packed = [_lz4_compress(payload[b:e], store_size=False, dict=dictionary)
              for b, e in zip(begins, ends, strict=True)]
    head = [len(payload).to_bytes(4, "little"), _varint(len(packed))]
    head += [_varint(len(p)) for p in packed]
    head += [_varint(f) for f in firsts[1:]]
    return kept(LZ4_PIECES, payload, b"".join(head + packed))


def piece_table(stored: bytes) -> tuple[int, list[int], list[int], int]:
    """A type-3 block's table: (the payload's length, each piece's stored
    size, the entry each value piece begins with, where piece 0 begins in
    ``stored``); ValueError where it does not add up."""
    if len(stored) < 6:
        raise ValueError("too short")
    plen = int.from_bytes(stored[:4], "little")
    count, at = _read_varint(stored, 4)
    if not 2 <= count <= len(stored) or plen == 0:
        raise ValueError("bad piece count")
    sizes, firsts = [], [0]
    for _ in range(count):
        n, at = _read_varint(stored, at)
        sizes.append(n)
    for _ in range(count - 2):
        n, at = _read_varint(stored, at)
        if n <= firsts[-1]:
            raise ValueError("pieces out of order")
        firsts.append(n)
    if at + sum(sizes) != len(stored) or 0 in sizes:
        raise ValueError("pieces do not fill the block")
    return plen, sizes, firsts, at


def decompress_piece(stored: bytes, plen: int, dictionary: bytes | None, path: str,
                     offset: int) -> bytes:
    """One piece of a type-3 block (its LZ4 bytes ``stored``, of a payload of
    ``plen`` bytes) decompressed against ``dictionary``; CorruptionError
    naming ``path`` and ``offset`` where the file has no dictionary or the
    piece does not decompress to at least a byte."""
    if dictionary is None:
        raise CorruptionError("data block needs a dictionary its file lacks", path, offset)
    try:
        part = _lz4_decompress(stored, uncompressed_size=plen, dict=dictionary)
    except Exception as exc:  # lz4 raises its own types
        raise CorruptionError(f"data block piece does not decompress ({exc})", path,
                              offset) from None
    if not part:
        raise CorruptionError("data block piece decompresses to nothing", path, offset)
    return part


def decompress_pieces(stored: bytes | memoryview, dictionary: bytes | None, path: str,
                      offset: int) -> bytes:
    """The payload of a type-3 block, each piece decompressed against
    ``dictionary`` (:func:`decompress_piece`): CorruptionError naming ``path``
    and ``offset`` where the file has no dictionary, the table does not add
    up, a piece does not decompress, the pieces do not make the length the
    block records, or they do not begin where the table says (the keys
    array's end, then the values it names)."""
    from .block import payload_value_starts  # block imports nothing of this module's

    data = bytes(stored)
    try:
        plen, sizes, firsts, at = piece_table(data)
    except ValueError as exc:
        raise CorruptionError(f"data block pieces: {exc}", path, offset) from None
    parts: list[bytes] = []
    done = 0
    for size in sizes:
        if done >= plen:
            raise CorruptionError("data block pieces longer than its payload", path, offset)
        parts.append(decompress_piece(data[at:at + size], plen - done, dictionary, path, offset))
        at += size
        done += len(parts[-1])
    if done != plen:
        raise CorruptionError("data block pieces do not make its payload", path, offset)
    payload = b"".join(parts)
    begins = list(accumulate(map(len, parts[:-1]), initial=0))
    try:
        keys_end, starts = payload_value_starts(payload)
    except (ValueError, IndexError):
        raise CorruptionError("data block pieces do not make its arrays", path, offset) from None
    if begins[1] != keys_end or firsts[-1] >= len(starts) or any(
            begins[p] != starts[firsts[p - 1]] for p in range(2, len(begins))):
        raise CorruptionError("data block pieces do not begin where its table says", path,
                              offset)
    return payload


def _zstd_length(stored: bytes | memoryview) -> int:
    """The payload length a Zstandard frame records; -1 if it records none."""
    try:
        size = zstandard.frame_content_size(stored)
    except zstandard.ZstdError:
        return -1
    return size if size >= 0 else -1


def decompress(kind: int, stored: bytes | memoryview, path: str, offset: int,
               dictionary: bytes | None = None) -> bytes:
    """The payload of a block stored as ``kind`` (type 3 against the file's
    ``dictionary``); CorruptionError naming ``path`` and ``offset`` for an
    unknown type, or bytes that do not decompress to the length they record."""
    if kind == NONE:
        return bytes(stored)
    if kind == LZ4_PIECES:
        return decompress_pieces(stored, dictionary, path, offset)
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
