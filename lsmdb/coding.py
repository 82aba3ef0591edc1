"""Fixed-width encodings and checksums shared by every on-disk format.

All integers are little-endian.  Checksums are CRC-32 (``zlib.crc32``, the
IEEE polynomial), computed over the bytes they protect.  See docs/FORMAT.md.
"""

from __future__ import annotations

import struct
import zlib

try:  # optional C speedups: the same CRC-32, about 4x faster where PCLMULQDQ exists
    from ._speedups import CRC32_CLMUL as _CRC32_CLMUL
    from ._speedups import crc32 as _c_crc32
except ImportError:  # pragma: no cover - built without a C compiler
    _CRC32_CLMUL = 0

#: ``crc32(data, value=0)``: zlib.crc32, or the C fold where it is faster.
crc32 = _c_crc32 if _CRC32_CLMUL else zlib.crc32

# Record header of a WAL segment written before format 2 (read only):
# crc32 (u32) of the payload, payload length (u32).  DO NOT CHANGE: on disk.
WAL_HEADER = struct.Struct("<II")
WAL_HEADER_SIZE = WAL_HEADER.size
assert WAL_HEADER_SIZE == 8
