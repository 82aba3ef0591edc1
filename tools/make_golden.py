#!/usr/bin/env python3
"""(Re)write the golden SSTables the format tests compare against.

The golden files pin the SSTable format: tests/test_golden.py rebuilds them
in memory with the code under test and demands the same bytes.  Regenerate
them only for a deliberate, versioned format change -- never to make a
failing golden test pass.  ``tests/data/golden.sst`` is format 1 (what the
previous release wrote; still read); ``golden_f2_none.sst``,
``golden_f2_lz4.sst`` and ``golden_f2_zstd.sst`` are format 2, one per
compression kind; ``golden_f3_lz4.sst`` is format 3, the same entries with
three of them expiring values.  ``golden_f2_lz4_pieces.sst`` is format 2 with
a dictionary: 3,000 entries in 1.5 KiB blocks, every block stored in pieces.

    python tools/make_golden.py            # write the golden files
    python tools/make_golden.py --check    # exit 1 if a committed file differs
    python tools/make_golden.py --dump golden|example|f2-none|f2-lz4|f2-zstd|f3-lz4|pieces
                                           # annotated hex dump (docs/FORMAT.md)

The contents are fixed here and nowhere else: 20 keys ``key000``..``key019``
whose values have assorted lengths, ``key005`` and ``key013`` deleted
(tombstones), a 64-byte block size so that the file has several data blocks,
``fp_chance`` 0.01, table name ``golden``, WAL sequence range 1000..1019.  In
format 2 entry ``i`` has sequence number ``1000 + i``, the file records number
7 and database id ``GOLDEN_DB_ID``, and the blocks are 256 bytes (so that
LZ4 and Zstandard find something to save).  In format 3, ``key003``,
``key008`` and ``key017`` are expiring values, each expiring at
``GOLDEN_EXPIRES_US`` plus its index.
"""

from __future__ import annotations

import argparse
import io
import os
import struct
import sys
from typing import Any

import msgpack

from lsmdb import compression
from lsmdb.filters.bloom import FILTER_HEADER, FILTER_HEADER_SIZE
from lsmdb.sstable_format import BLOCK_TRAILER_SIZE, DATA_TRAILER_V2, FOOTER, FOOTER_SIZE
from lsmdb.sstable_writer import SSTableBuilder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN_PATH = os.path.join(ROOT, "tests", "data", "golden.sst")

GOLDEN_TOMBSTONES = (5, 13)
GOLDEN_BLOCK_SIZE = 64
GOLDEN_FP_CHANCE = 0.01
GOLDEN_TABLE = "golden"
GOLDEN_MIN_SEQ = 1000
GOLDEN_MAX_SEQ = 1019
GOLDEN_F2_BLOCK_SIZE = 256
GOLDEN_NUMBER = 7
GOLDEN_DB_ID = "00112233445566778899aabbccddeeff"
GOLDEN_F2_KINDS = ("none", "lz4", "zstd")
GOLDEN_EXPIRING = (3, 8, 17)
GOLDEN_EXPIRES_US = 1_700_000_000_000_000
GOLDEN_PIECES_ENTRIES = 3000
GOLDEN_PIECES_BLOCK_SIZE = 1536


def golden_f2_path(kind: str) -> str:
    return os.path.join(ROOT, "tests", "data", f"golden_f2_{kind}.sst")


def golden_items() -> list[tuple[bytes, bytes | None]]:
    """The 20 (key, value) pairs of the golden SSTable, in key order (None: tombstone)."""
    items: list[tuple[bytes, bytes | None]] = []
    for i in range(20):
        key = b"key%03d" % i
        value = None if i in GOLDEN_TOMBSTONES else b"value-%d-" % i + b"*" * (i % 5)
        items.append((key, value))
    return items


def build(items: list[tuple[bytes, Any]], *, block_size: int, fp_chance: float,
          table: str, min_seq: int, max_seq: int, version: int = 1,
          compression: str = "none") -> bytes:
    """An SSTable of ``items``; in format 2 entry ``i`` written at ``min_seq + i``."""
    out = io.BytesIO()
    builder = SSTableBuilder(out, fp_chance=fp_chance, block_size=block_size, table=table,
                             version=version, compression=compression,
                             file_number=GOLDEN_NUMBER if version >= 2 else 0,
                             db_id=GOLDEN_DB_ID if version >= 2 else "")
    for i, (key, value) in enumerate(items):
        builder.add(key, value, golden_tag(min_seq + i, value) if version >= 2 else None)
    builder.note_seq(min_seq, max_seq)
    builder.finish()
    return out.getvalue()


def golden_tag(seq: int, value: bytes | tuple[bytes, int] | None) -> int:
    """The tag of an entry written at ``seq``: ``seq << 8 | kind``."""
    return seq << 8 | (0 if value is None else 2 if type(value) is tuple else 1)


def golden_f3_path() -> str:
    return os.path.join(ROOT, "tests", "data", "golden_f3_lz4.sst")


def golden_f3_items() -> list[tuple[bytes, Any]]:
    """The golden items with three expiring values (lsmdb.ttl's (value, expires))."""
    return [(k, (v, GOLDEN_EXPIRES_US + i) if i in GOLDEN_EXPIRING else v)
            for i, (k, v) in enumerate(golden_items())]


def build_golden_f3() -> bytes:
    """The bytes of tests/data/golden_f3_lz4.sst as the current code writes them."""
    return build(golden_f3_items(), block_size=GOLDEN_F2_BLOCK_SIZE,
                 fp_chance=GOLDEN_FP_CHANCE, table=GOLDEN_TABLE, min_seq=GOLDEN_MIN_SEQ,
                 max_seq=GOLDEN_MAX_SEQ, version=2, compression="lz4")


def build_golden() -> bytes:
    """The bytes of tests/data/golden.sst (format 1) as the current code writes them."""
    return build(golden_items(), block_size=GOLDEN_BLOCK_SIZE, fp_chance=GOLDEN_FP_CHANCE,
                 table=GOLDEN_TABLE, min_seq=GOLDEN_MIN_SEQ, max_seq=GOLDEN_MAX_SEQ)


def build_golden_f2(kind: str) -> bytes:
    """The bytes of tests/data/golden_f2_<kind>.sst as the current code writes them."""
    return build(golden_items(), block_size=GOLDEN_F2_BLOCK_SIZE, fp_chance=GOLDEN_FP_CHANCE,
                 table=GOLDEN_TABLE, min_seq=GOLDEN_MIN_SEQ, max_seq=GOLDEN_MAX_SEQ, version=2,
                 compression=kind)


def golden_pieces_path() -> str:
    return os.path.join(ROOT, "tests", "data", "golden_f2_lz4_pieces.sst")


def golden_pieces_items() -> list[tuple[bytes, bytes | None]]:
    """The 3,000 entries of the golden file in pieces: ``key00000``.. whose
    values grow and shrink in a cycle of 37 lengths, every 11th deleted."""
    return [(b"key%05d" % i, None if i % 11 == 5 else
             b"value-%d-" % i + b"*" * (i % 37)) for i in range(GOLDEN_PIECES_ENTRIES)]


def build_golden_pieces() -> bytes:
    """The bytes of tests/data/golden_f2_lz4_pieces.sst as the current code
    writes them: enough 1.5 KiB blocks for a dictionary, so that every block
    is stored in pieces (type 3)."""
    return build(golden_pieces_items(), block_size=GOLDEN_PIECES_BLOCK_SIZE,
                 fp_chance=GOLDEN_FP_CHANCE, table=GOLDEN_TABLE, min_seq=GOLDEN_MIN_SEQ,
                 max_seq=GOLDEN_MIN_SEQ + GOLDEN_PIECES_ENTRIES - 1, version=2,
                 compression="lz4")


def golden_files() -> dict[str, bytes]:
    """Every golden file by path, as the current code writes it."""
    return {GOLDEN_PATH: build_golden(),
            **{golden_f2_path(k): build_golden_f2(k) for k in GOLDEN_F2_KINDS},
            golden_f3_path(): build_golden_f3(), golden_pieces_path(): build_golden_pieces()}


def build_example(version: int = 1) -> bytes:
    """The 3-key SSTable of the worked example in docs/FORMAT.md.

    ``a -> 1``, a tombstone for ``b``, ``c -> 3``; block size 8 cuts the
    data into two blocks ([a, b] and [c]).  Format 2: written at sequence
    numbers 1, 2, 3, uncompressed.
    """
    return build([(b"a", b"1"), (b"b", None), (b"c", b"3")], block_size=8, fp_chance=0.01,
                 table="ex", min_seq=1, max_seq=3, version=version)


# -- annotated dump --------------------------------------------------------

def _hex_lines(data: bytes, base: int, width: int = 16) -> list[str]:
    lines = []
    for i in range(0, len(data), width):
        chunk = data[i:i + width]
        lines.append(f"  {base + i:06x}  " + " ".join(f"{b:02x}" for b in chunk))
    return lines


def dump(data: bytes) -> str:
    """Every region of an SSTable in order, with its bytes and what they decode to."""
    out: list[str] = []
    foot_off = len(data) - FOOTER_SIZE
    (idx_off, idx_size, flt_off, flt_size, prop_off, prop_size, version, crc,
     magic) = FOOTER.unpack_from(data, foot_off)
    index = msgpack.unpackb(data[idx_off:idx_off + idx_size], raw=False)

    def region(title: str, off: int, size: int) -> None:
        out.append(f"{title}  [offset {off}, {size} bytes]")
        out.extend(_hex_lines(data[off:off + size], off))

    def trailer(off: int) -> None:
        (value,) = struct.unpack_from("<I", data, off)
        region(f"  trailer: crc32 = 0x{value:08x}", off, BLOCK_TRAILER_SIZE)

    props = msgpack.unpackb(data[prop_off:prop_off + prop_size], raw=False)
    for i, (_last, off, size) in enumerate(zip(*index, strict=True)):
        if version < 2:
            keys, values = msgpack.unpackb(data[off:off + size], raw=False)
            region(f"data block {i}: keys {keys} values {values}", off, size)
            trailer(off + size)
            continue
        kind, crc_v = DATA_TRAILER_V2.unpack_from(data, off + size)
        payload = compression.decompress(kind, data[off:off + size], "golden", off,
                                         props.get("compression_dict"))
        keys, values, tags, expiries = msgpack.unpackb(payload, raw=False)
        region(f"data block {i} ({compression.NAMES[kind]}, payload {len(payload)} bytes): "
               f"keys {keys} values {values} tags {tags} expiries {expiries}", off, size)
        region(f"  trailer: type {kind}, crc32 = 0x{crc_v:08x}", off + size,
               DATA_TRAILER_V2.size)
    region(f"index block: last keys {index[0]}, offsets {index[1]}, sizes {index[2]}",
           idx_off, idx_size)
    trailer(idx_off + idx_size)
    fields = FILTER_HEADER.unpack_from(data, flt_off)
    names = ("version", "hash_algorithm", "flags", "k", "m", "n", "fp_chance", "key_id")
    header = ", ".join(f"{n}={v}" for n, v in zip(names, fields, strict=True))
    region(f"filter block header: {header}", flt_off, FILTER_HEADER_SIZE)
    region("filter block bit array", flt_off + FILTER_HEADER_SIZE, flt_size - FILTER_HEADER_SIZE)
    trailer(flt_off + flt_size)
    shown = {k: f"<{len(v)} bytes>" if k == "compression_dict" else v for k, v in props.items()}
    region(f"properties block: {shown}", prop_off, prop_size)
    trailer(prop_off + prop_size)
    out.append(f"footer  [offset {foot_off}, {FOOTER_SIZE} bytes]")
    labels = [("index offset", 8), ("index size", 8), ("filter offset", 8), ("filter size", 8),
              ("properties offset", 8), ("properties size", 8), ("format version", 4),
              ("footer crc32", 4), ("magic", 8)]
    values = [idx_off, idx_size, flt_off, flt_size, prop_off, prop_size, version,
              f"0x{crc:08x}", magic]
    pos = foot_off
    for (label, width), value in zip(labels, values, strict=True):
        chunk = " ".join(f"{b:02x}" for b in data[pos:pos + width])
        out.append(f"  {pos:06x}  {chunk:<23}  {label} = {value}")
        pos += width
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true",
                       help="compare with the committed file instead of writing it")
    group.add_argument("--dump", choices=("golden", "example", "example-f2",
                                          *(f"f2-{k}" for k in GOLDEN_F2_KINDS), "f3-lz4",
                                          "pieces"),
                       help="print an annotated hex dump and exit")
    args = parser.parse_args(argv)
    if args.dump:
        data = (build_golden() if args.dump == "golden" else build_example()
                if args.dump == "example" else build_example(2)
                if args.dump == "example-f2" else build_golden_f3()
                if args.dump == "f3-lz4" else build_golden_pieces()
                if args.dump == "pieces" else build_golden_f2(args.dump[3:]))
        print(dump(data))
        return 0
    status = 0
    for path, data in golden_files().items():
        name = os.path.basename(path)
        if args.check:
            with open(path, "rb") as f:
                same = f.read() == data
            print(f"{name} matches" if same else f"{name} DIFFERS from what the code writes")
            status |= not same
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        print(f"wrote {path} ({len(data)} bytes)")
    return status


if __name__ == "__main__":
    sys.exit(main())
