#!/usr/bin/env python3
"""(Re)write tests/data/golden.sst, the golden SSTable the format tests compare against.

The golden file pins the SSTable format: tests/test_golden.py rebuilds it in
memory with the code under test and demands the same bytes.  Regenerate it
only for a deliberate, versioned format change -- never to make a failing
golden test pass.

    python tools/make_golden.py            # write tests/data/golden.sst
    python tools/make_golden.py --check    # exit 1 if the committed file differs
    python tools/make_golden.py --dump golden|example
                                           # annotated hex dump (docs/FORMAT.md)

The contents are fixed here and nowhere else: 20 keys ``key000``..``key019``
whose values have assorted lengths, ``key005`` and ``key013`` deleted
(tombstones), a 64-byte block size so that the file has several data blocks,
``fp_chance`` 0.01, table name ``golden``, WAL sequence range 1000..1019.
"""

from __future__ import annotations

import argparse
import io
import os
import struct
import sys

import msgpack

from lsmdb.filters.bloom import FILTER_HEADER, FILTER_HEADER_SIZE
from lsmdb.sstable_format import BLOCK_TRAILER_SIZE, FOOTER, FOOTER_SIZE
from lsmdb.sstable_writer import SSTableBuilder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN_PATH = os.path.join(ROOT, "tests", "data", "golden.sst")

GOLDEN_TOMBSTONES = (5, 13)
GOLDEN_BLOCK_SIZE = 64
GOLDEN_FP_CHANCE = 0.01
GOLDEN_TABLE = "golden"
GOLDEN_MIN_SEQ = 1000
GOLDEN_MAX_SEQ = 1019


def golden_items() -> list[tuple[bytes, bytes | None]]:
    """The 20 (key, value) pairs of the golden SSTable, in key order (None: tombstone)."""
    items: list[tuple[bytes, bytes | None]] = []
    for i in range(20):
        key = b"key%03d" % i
        value = None if i in GOLDEN_TOMBSTONES else b"value-%d-" % i + b"*" * (i % 5)
        items.append((key, value))
    return items


def build(items: list[tuple[bytes, bytes | None]], *, block_size: int, fp_chance: float,
          table: str, min_seq: int, max_seq: int) -> bytes:
    out = io.BytesIO()
    builder = SSTableBuilder(out, fp_chance=fp_chance, block_size=block_size, table=table)
    for key, value in items:
        builder.add(key, value)
    builder.note_seq(min_seq, max_seq)
    builder.finish()
    return out.getvalue()


def build_golden() -> bytes:
    """The bytes of tests/data/golden.sst as the current code writes them."""
    return build(golden_items(), block_size=GOLDEN_BLOCK_SIZE, fp_chance=GOLDEN_FP_CHANCE,
                 table=GOLDEN_TABLE, min_seq=GOLDEN_MIN_SEQ, max_seq=GOLDEN_MAX_SEQ)


def build_example() -> bytes:
    """The 3-key SSTable of the worked example in docs/FORMAT.md.

    ``a -> 1``, a tombstone for ``b``, ``c -> 3``; block size 8 cuts the
    data into two blocks ([a, b] and [c]).
    """
    return build([(b"a", b"1"), (b"b", None), (b"c", b"3")], block_size=8, fp_chance=0.01,
                 table="ex", min_seq=1, max_seq=3)


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

    for i, (_last, off, size) in enumerate(zip(*index, strict=True)):
        keys, values = msgpack.unpackb(data[off:off + size], raw=False)
        region(f"data block {i}: keys {keys} values {values}", off, size)
        trailer(off + size)
    region(f"index block: last keys {index[0]}, offsets {index[1]}, sizes {index[2]}",
           idx_off, idx_size)
    trailer(idx_off + idx_size)
    fields = FILTER_HEADER.unpack_from(data, flt_off)
    names = ("version", "hash_algorithm", "flags", "k", "m", "n", "fp_chance", "key_id")
    header = ", ".join(f"{n}={v}" for n, v in zip(names, fields, strict=True))
    region(f"filter block header: {header}", flt_off, FILTER_HEADER_SIZE)
    region("filter block bit array", flt_off + FILTER_HEADER_SIZE, flt_size - FILTER_HEADER_SIZE)
    trailer(flt_off + flt_size)
    props = msgpack.unpackb(data[prop_off:prop_off + prop_size], raw=False)
    region(f"properties block: {props}", prop_off, prop_size)
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
    group.add_argument("--dump", choices=("golden", "example"),
                       help="print an annotated hex dump and exit")
    args = parser.parse_args(argv)
    if args.dump:
        print(dump(build_golden() if args.dump == "golden" else build_example()))
        return 0
    data = build_golden()
    if args.check:
        with open(GOLDEN_PATH, "rb") as f:
            same = f.read() == data
        print("golden.sst matches" if same else "golden.sst DIFFERS from what the code writes")
        return 0 if same else 1
    os.makedirs(os.path.dirname(GOLDEN_PATH), exist_ok=True)
    with open(GOLDEN_PATH, "wb") as f:
        f.write(data)
    print(f"wrote {GOLDEN_PATH} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
