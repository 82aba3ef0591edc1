"""Golden files: the on-disk formats must not change by accident.

* ``tests/data/golden.sst`` was written by ``tools/make_golden.py``.  The code
  under test must rebuild it byte for byte, and must read it back exactly.
* ``tests/data/golden_v1.sst`` is the same file as written before filter
  format 2 (partitioned probes): the same bytes but for the filter block,
  whose probes cover the whole array (filter format 1).  It is frozen; the
  code must keep reading it exactly.
* A WAL segment, a MANIFEST and a STATS file are pinned as byte literals
  below, both as the codecs encode them and as a real database writes them.
  The formats before the current ones (a WAL segment without a header, a
  format-1 MANIFEST) are pinned too, as a database left by an older lsmdb:
  it must open, and move to the current formats.

A failure here means the bytes lsmdb writes have changed.  If that was not
intended, it is a bug.  If it was intended, it is a format change: bump the
format version concerned, keep a reader for the old version, update
docs/FORMAT.md, and only then regenerate the golden data
(``python tools/make_golden.py``) and the literals here.
"""

from __future__ import annotations

import glob
import math
import os
import struct
import zlib

import msgpack
import pytest

import lsmdb
from lsmdb import block as blk
from lsmdb import compression as compression_mod
from lsmdb import wal as wal_mod
from lsmdb.coding import WAL_HEADER_SIZE
from lsmdb.filters import bloom as bloom_mod
from lsmdb.filters import hashing as hashing_mod
from lsmdb.logset import WalState
from lsmdb.manifest import MANIFEST_FORMAT_VERSION, MANIFEST_MAGIC, FileMeta, Manifest, TableMeta
from lsmdb.sstable_format import (
    BLOCK_TRAILER_SIZE,
    DATA_TRAILER_V2,
    FOOTER_SIZE,
    KIND_BITS,
    KIND_EXPIRING,
    KIND_TOMBSTONE,
    KIND_VALUE,
    MISSING,
    READABLE_VERSIONS,
    SSTABLE_FORMAT_DICTIONARY,
    SSTABLE_FORMAT_EXPIRING,
    SSTABLE_FORMAT_VERSION,
    SSTABLE_MAGIC,
)
from lsmdb.sstable_reader import SSTableReader
from lsmdb.verify import verify_database
from lsmdb.wal import LogWriter, read_legacy_log, read_segment
from tests.support.reading import find, items
from tests.support.tools import load_tool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN_SST = os.path.join(ROOT, "tests", "data", "golden.sst")
GOLDEN_V1_SST = os.path.join(ROOT, "tests", "data", "golden_v1.sst")


make_golden = load_tool("make_golden")

# What the golden file holds, stated here independently of the generator so
# that an edit to the generator cannot silently change what is checked.
EXPECTED_ITEMS = {
    b"key000": b"value-0-", b"key001": b"value-1-*", b"key002": b"value-2-**",
    b"key003": b"value-3-***", b"key004": b"value-4-****", b"key005": None,
    b"key006": b"value-6-*", b"key007": b"value-7-**", b"key008": b"value-8-***",
    b"key009": b"value-9-****", b"key010": b"value-10-", b"key011": b"value-11-*",
    b"key012": b"value-12-**", b"key013": None, b"key014": b"value-14-****",
    b"key015": b"value-15-", b"key016": b"value-16-*", b"key017": b"value-17-**",
    b"key018": b"value-18-***", b"key019": b"value-19-****",
}
EXPECTED_PROPERTIES = {
    "format_version": 1, "table": "golden", "entries": 20, "tombstones": 2, "data_blocks": 5,
    "data_bytes": 423, "min_key": b"key000", "max_key": b"key019", "min_seq": 1000,
    "max_seq": 1019, "fp_chance": 0.01, "filter_bits": 192, "filter_hashes": 7,
}
# (last key, offset, payload size) of each data block.
EXPECTED_INDEX = [
    (b"key003", 0, 81), (b"key007", 85, 73), (b"key011", 162, 85), (b"key015", 251, 75),
    (b"key019", 330, 89),
]
EXPECTED_FILE_SIZE = 797
EXPECTED_HANDLES = {"index": (423, 58), "filter": (485, 60), "properties": (549, 180)}


@pytest.fixture(scope="module")
def golden_bytes() -> bytes:
    with open(GOLDEN_SST, "rb") as f:
        return f.read()


# -- (a) the code writes the golden file byte for byte ---------------------

def test_generator_inputs_match_expectations():
    assert dict(make_golden.golden_items()) == EXPECTED_ITEMS
    assert [k for k, _ in make_golden.golden_items()] == sorted(EXPECTED_ITEMS)


def test_sstable_builder_reproduces_golden_file(golden_bytes):
    rebuilt = make_golden.build_golden()
    if rebuilt != golden_bytes:
        first = next((i for i, (a, b) in enumerate(zip(rebuilt, golden_bytes, strict=False))
                      if a != b),
                     min(len(rebuilt), len(golden_bytes)))
        pytest.fail(f"SSTable bytes changed: first difference at offset {first} "
                    f"(rebuilt {len(rebuilt)} bytes, golden {len(golden_bytes)} bytes); "
                    "see the module docstring before regenerating")


def test_write_sstable_to_disk_reproduces_golden_file(tmp_path):
    """write_sstable (what flushes use) writes the format-2 golden file byte for byte."""
    from lsmdb.sstable_writer import write_sstable
    items_ = make_golden.golden_items()
    keys = [k for k, _v in items_]
    values = [v for _k, v in items_]
    tags = [make_golden.golden_tag(1000 + i, v) for i, v in enumerate(values)]
    for kind in make_golden.GOLDEN_F2_KINDS:
        path = str(tmp_path / f"{kind}.sst")
        props = write_sstable(path, (), chunks=[(keys, values, tags)], fp_chance=0.01,
                              block_size=256, table="golden", min_seq=1000, max_seq=1019,
                              compression=kind, file_number=7, db_id=make_golden.GOLDEN_DB_ID)
        with open(path, "rb") as f, open(make_golden.golden_f2_path(kind), "rb") as g:
            assert f.read() == g.read(), kind
        assert props["size_bytes"] == EXPECTED_F2_SIZES[kind]


def test_write_memtable_reproduces_golden_file(tmp_path):
    """write_memtable (what flushes use: a frozen memtable's dicts, sorted and
    encoded in C where built, else in Python) writes the format-2 golden file
    byte for byte, whatever order the dicts hold the keys in."""
    from lsmdb import sstable_writer as sw
    items_ = make_golden.golden_items()
    tagged = [(k, v, make_golden.golden_tag(1000 + i, v)) for i, (k, v) in enumerate(items_)]
    tagged.reverse()
    data = {k: v for k, v, _t in tagged}
    tags = {k: t for k, _v, t in tagged}
    for use_c in {False, sw._c_memtable_section is not None}:
        sw.USE_SPEEDUPS = use_c
        try:
            for kind in make_golden.GOLDEN_F2_KINDS:
                path = str(tmp_path / f"{kind}-{use_c}.sst")
                props = sw.write_memtable(path, data, tags, fp_chance=0.01, block_size=256,
                                          table="golden", min_seq=1000, max_seq=1019,
                                          compression=kind, file_number=7,
                                          db_id=make_golden.GOLDEN_DB_ID)
                with open(path, "rb") as f, open(make_golden.golden_f2_path(kind), "rb") as g:
                    assert f.read() == g.read(), (kind, use_c)
                assert props["size_bytes"] == EXPECTED_F2_SIZES[kind]
        finally:
            sw.USE_SPEEDUPS = sw._c_block_cuts is not None


# -- format 2, one golden file per compression kind --------------------------------

EXPECTED_F2_SIZES = {"none": 947, "lz4": 803, "zstd": 741}


@pytest.mark.parametrize("kind", ["none", "lz4", "zstd"])
def test_format2_golden_files_are_rebuilt_and_read_back_exactly(kind):
    path = make_golden.golden_f2_path(kind)
    with open(path, "rb") as f:
        data = f.read()
    assert len(data) == EXPECTED_F2_SIZES[kind]
    assert make_golden.build_golden_f2(kind) == data, "format-2 SSTable bytes changed"
    for reader in (SSTableReader(path, 7), SSTableReader("golden.sst", 7, data=data)):
        assert reader.version == 2
        assert (reader.file_number, reader.db_id, reader.compression) == (
            7, "00112233445566778899aabbccddeeff", kind)
        props = {k: v for k, v in reader.properties.items()
                 if k not in ("data_bytes", "uncompressed_bytes")}
        expected = {k: v for k, v in EXPECTED_PROPERTIES.items() if k != "data_bytes"}
        assert props == {**expected, "format_version": 2, "data_blocks": 2,
                         "file_number": 7, "db_id": "00112233445566778899aabbccddeeff",
                         "compression": kind}
        assert reader.properties["data_bytes"] == reader.index_handle[0]
        assert reader.uncompressed_bytes == 335 + 163
        types = {reader.read_raw(i)[-5] for i in range(len(reader.index_keys))}
        assert types == {{"none": 0, "lz4": 1, "zstd": 2}[kind]}
        got = {}
        for i in range(len(reader.index_keys)):
            keys, values, tags = reader.decode_full(i, reader.read_raw(i))
            for j, (k, v, t) in enumerate(zip(keys, values, tags, strict=True)):
                got[k] = v
                n = int(k[3:])
                assert t == (1000 + n) << 8 | (0 if v is None else 1), (k, j)
        assert got == EXPECTED_ITEMS
        for k, v in EXPECTED_ITEMS.items():
            assert find(reader, k) == v
        assert find(reader, b"key0095") is MISSING
        reader.close()


def test_the_golden_file_in_pieces_is_rebuilt_and_read_back_exactly():
    """golden_f2_lz4_pieces.sst pins type 3 (docs/FORMAT.md §4.1): the writer
    makes the same bytes; every block is stored in pieces against the
    dictionary its properties carry, the excerpts the format describes; each
    piece decompresses on its own; every entry reads back, through whole
    reads and through the pieces a get reads."""
    path = make_golden.golden_pieces_path()
    with open(path, "rb") as f:
        data = f.read()
    assert make_golden.build_golden_pieces() == data, "SSTable bytes in pieces changed"
    reader = SSTableReader(path, 7)
    assert (reader.file_version, reader.version, reader.compression) == (4, 2, "lz4")
    assert reader.properties["format_version"] == 4
    blocks = len(reader.index_keys)
    assert blocks >= compression_mod.DICT_BLOCKS
    payloads = [bytes(reader.payload_of(i, reader.read_raw(i))) for i in range(blocks)]
    excerpts = [p[blk.payload_value_starts(p)[0]:][:1024] for p in payloads[:64:4]]
    assert reader.compression_dict == b"".join(excerpts)
    assert {reader.read_raw(i)[-5] for i in range(blocks)} == {compression_mod.LZ4_PIECES}
    assert any(len(compression_mod.piece_table(bytes(reader.read_raw(i)[:-5]))[1]) > 2
               for i in range(blocks))
    want = dict(make_golden.golden_pieces_items())
    got = {}
    for i in range(blocks):
        keys, values = reader.read_block(i)
        got.update(zip(keys, values, strict=True))
        raw = reader.read_raw(i)
        assert reader.values_among(i, raw, keys) == dict(zip(keys, values, strict=True))
    assert got == want
    reader.close()


# -- (b) the golden file reads back exactly ---------------------------------

@pytest.fixture(params=["pread", "memory"])
def golden_reader(request, golden_bytes):
    if request.param == "pread":
        reader = SSTableReader(GOLDEN_SST, 7)
    else:
        reader = SSTableReader("golden.sst", 7, data=golden_bytes)
    yield reader
    reader.close()


def test_golden_layout(golden_bytes):
    assert len(golden_bytes) == EXPECTED_FILE_SIZE
    assert golden_bytes[-8:] == b"LSMDBSST"
    footer = golden_bytes[-FOOTER_SIZE:]
    fields = struct.unpack("<QQQQQQII8s", footer)
    assert fields[:6] == (*EXPECTED_HANDLES["index"], *EXPECTED_HANDLES["filter"],
                          *EXPECTED_HANDLES["properties"])
    assert fields[6] == 1
    assert fields[7] == zlib.crc32(footer[:52])
    # The regions tile the file: data blocks, index, filter, properties, footer.
    pos = 0
    for _last, off, size in EXPECTED_INDEX:
        assert off == pos
        pos += size + BLOCK_TRAILER_SIZE
    for name in ("index", "filter", "properties"):
        off, size = EXPECTED_HANDLES[name]
        assert off == pos
        payload = golden_bytes[off:off + size]
        assert golden_bytes[off + size:off + size + 4] == zlib.crc32(payload).to_bytes(4, "little")
        pos += size + BLOCK_TRAILER_SIZE
    assert pos == len(golden_bytes) - FOOTER_SIZE


def test_golden_properties(golden_reader):
    r = golden_reader
    assert r.properties == EXPECTED_PROPERTIES
    assert (r.entries, r.tombstones) == (20, 2)
    assert (r.min_key, r.max_key) == (b"key000", b"key019")
    assert (r.min_seq, r.max_seq) == (1000, 1019)
    assert r.table == "golden"
    assert r.fp_chance == 0.01
    assert r.size_bytes == EXPECTED_FILE_SIZE
    assert r.index_handle == EXPECTED_HANDLES["index"]
    assert r.filter_handle == EXPECTED_HANDLES["filter"]
    assert r.props_handle == EXPECTED_HANDLES["properties"]
    assert list(zip(r.index_keys, r.index_offsets, r.index_sizes, strict=True)) == EXPECTED_INDEX


def test_golden_filter_parameters(golden_reader):
    r = golden_reader
    assert r.filter.error is None
    f = r.filter.active
    assert isinstance(f, lsmdb.BloomFilter)
    n, p = 20, 0.01
    m = math.ceil(-n * math.log(p) / math.log(2) ** 2)
    assert (f.m, f.k, f.n) == (m, max(1, round(m / n * math.log(2))), n) == (192, 7, 20)
    assert f.fp_chance == 0.01
    assert f.hash_algorithm == hashing_mod.HASH_XXH3_64 == 1
    assert f.key_id == 0
    assert f.size_bytes == 24
    for key in EXPECTED_ITEMS:  # tombstones included
        assert key in f
    # Format 2: 7 partitions of 192 // 7 = 27 bits (bits 189..191 in none).
    assert (f.version, f.part) == (2, 27)
    # The exact bits, so that a change of hash or probe order fails here too.
    assert bytes(f.bits).hex() == (
        "cc6ec15fc08fa20d8aaeb0ba76cd236ff04a68986b749f11")
    assert not int.from_bytes(f.bits, "little") >> 189


# -- (b') the frozen format-1 file reads back exactly ---------------------------

@pytest.fixture(params=["pread", "memory"])
def golden_v1_reader(request):
    if request.param == "pread":
        reader = SSTableReader(GOLDEN_V1_SST, 8)
    else:
        with open(GOLDEN_V1_SST, "rb") as fh:
            reader = SSTableReader("golden_v1.sst", 8, data=fh.read())
    yield reader
    reader.close()


def test_golden_v1_differs_from_golden_only_in_the_filter_block(golden_bytes):
    with open(GOLDEN_V1_SST, "rb") as fh:
        old = fh.read()
    off, size = EXPECTED_HANDLES["filter"]
    assert len(old) == len(golden_bytes) == EXPECTED_FILE_SIZE
    assert old[:off] == golden_bytes[:off]
    assert old[off + size + 4:] == golden_bytes[off + size + 4:]
    assert (old[off], golden_bytes[off]) == (1, 2)  # the filter format version byte
    assert old[off + 1:off + 36] == golden_bytes[off + 1:off + 36]  # the rest of the header


def test_golden_v1_filter_reads_as_format_1(golden_v1_reader):
    r = golden_v1_reader
    assert r.filter.error is None
    f = r.filter.active
    assert (f.version, f.part, f.m, f.k, f.n) == (1, 0, 192, 7, 20)
    assert bytes(f.bits).hex() == "98a99b05c318873541cd4d4d01fa73fef31aebcf7fd74636"
    # Format 1 probes: (h1 + i*h2) mod m, computed here from the formula.
    for key in EXPECTED_ITEMS:
        h = hashing_mod.key_hash(key)
        h1, h2 = h & 0xFFFFFFFF, h >> 32
        assert all(f.bits[(h1 + i * h2) % 192 >> 3] >> ((h1 + i * h2) % 192 & 7) & 1
                   for i in range(7))
        assert key in f
    for key, value in EXPECTED_ITEMS.items():
        assert find(r, key) == value, key
    for absent in (b"", b"key", b"key0000", b"key020", b"kez", b"\xff"):
        assert find(r, absent) is MISSING



def test_golden_every_key_and_value(golden_reader):
    r = golden_reader
    for key, value in EXPECTED_ITEMS.items():
        assert find(r, key) == value, key  # None: a tombstone
    assert items(r, None, None) == list(EXPECTED_ITEMS.items())
    assert items(r, None, None, reverse=True) == list(reversed(EXPECTED_ITEMS.items()))
    for absent in (b"", b"key", b"key0000", b"key020", b"kez", b"\xff"):
        assert find(r, absent) is MISSING
    blocks = [r.read_block(i) for i in range(len(r.index_keys))]
    assert [len(keys) for keys, _ in blocks] == [4, 4, 4, 4, 4]
    assert [keys[-1] for keys, _ in blocks] == [last for last, _, _ in EXPECTED_INDEX]


def test_golden_data_block_bytes(golden_bytes):
    # Data block 1 holds the tombstone of key005; pin its exact encoding.
    off, size = 85, 73
    payload = golden_bytes[off:off + size]
    assert payload == msgpack.packb(
        [[b"key004", b"key005", b"key006", b"key007"],
         [b"value-4-****", None, b"value-6-*", b"value-7-**"]], use_bin_type=True)
    assert payload[:2] == b"\x92\x94"  # array(2) of array(4): keys, then values
    assert b"\xc0" in payload          # msgpack nil: the tombstone
    assert golden_bytes[off + size:off + size + 4] == bytes.fromhex("af6dd75a")



def test_format_doc_worked_example_matches_the_code():
    """docs/FORMAT.md section 10 pastes a hex dump; it must be what the builder writes."""
    import re
    with open(os.path.join(ROOT, "docs", "FORMAT.md"), encoding="utf-8") as f:
        doc = f.read()
    section = doc[doc.index("## 10. Worked example"):doc.index("### 10.1 ")]
    section_f2 = doc[doc.index("### 10.1 "):doc.index("## Notes")]
    for text, example in ((section, make_golden.build_example()),
                          (section_f2, make_golden.build_example(2))):
        covered: set[int] = set()
        for m in re.finditer(r"^  ([0-9a-f]{6})  ([0-9a-f]{2}(?: [0-9a-f]{2})*)", text, re.M):
            offset = int(m.group(1), 16)
            chunk = bytes.fromhex(m.group(2))
            assert example[offset:offset + len(chunk)] == chunk, f"docs/FORMAT.md at 0x{offset:x}"
            covered.update(range(offset, offset + len(chunk)))
        if text is section:
            assert covered == set(range(len(example))), "the dump must show every byte"
        else:  # format 2: the data blocks and their trailers, every byte of them
            assert covered == set(range(SSTableReader("x", 7, data=example).index_handle[0]))
    assert f"The file is {len(make_golden.build_example(2))} bytes" in section_f2

# -- on-disk constants -------------------------------------------------------

def test_format_constants_are_pinned():
    assert SSTABLE_MAGIC == b"LSMDBSST"
    assert SSTABLE_FORMAT_VERSION == 2
    assert READABLE_VERSIONS == (1, 2, 3, 4, 5)
    assert SSTABLE_FORMAT_EXPIRING == 3
    assert SSTABLE_FORMAT_DICTIONARY == 2  # formats 4 and 5: 2 and 3 with a dictionary
    assert FOOTER_SIZE == 64
    assert BLOCK_TRAILER_SIZE == 4
    assert DATA_TRAILER_V2.format == "<BI" and DATA_TRAILER_V2.size == 5
    assert (KIND_TOMBSTONE, KIND_VALUE, KIND_EXPIRING, KIND_BITS) == (0, 1, 2, 8)
    assert (compression_mod.NONE, compression_mod.LZ4, compression_mod.ZSTD,
            compression_mod.LZ4_PIECES) == (0, 1, 2, 3)
    assert (compression_mod.PIECE_BYTES, compression_mod.DICT_BLOCKS, compression_mod.DICT_SAMPLES,
            compression_mod.DICT_EXCERPT, compression_mod.DICT_HELD_BYTES) == (
        1024, 64, 16, 1024, 1 << 20)
    assert WAL_HEADER_SIZE == 8   # the legacy (headerless) WAL record header
    assert (wal_mod.SEGMENT_MAGIC, wal_mod.SEGMENT_FORMAT) == (b"LSMDBWAL", 2)
    assert wal_mod.SEGMENT_HEADER_SIZE == 16
    assert wal_mod.BLOCK_SIZE_BYTES == 32768
    assert wal_mod.FRAGMENT_HEADER_SIZE == 7
    assert (wal_mod.FULL, wal_mod.FIRST, wal_mod.MIDDLE, wal_mod.LAST) == (1, 2, 3, 4)
    assert MANIFEST_MAGIC == b"LSMDBMAN"
    assert MANIFEST_FORMAT_VERSION == 2
    # Filter format 1 (whole-array probes) is still read; 2 (partitioned) is written.
    assert (bloom_mod.FILTER_VERSION_WHOLE, bloom_mod.FILTER_VERSION_PARTITIONED) == (1, 2)
    assert bloom_mod.KNOWN_FILTER_VERSIONS == (1, 2)
    assert bloom_mod.FILTER_FORMAT_VERSION == 2
    assert bloom_mod.FILTER_HEADER_SIZE == 36
    # Hash algorithm ids are on disk: an id may be added, never renumbered or reused.
    assert hashing_mod.HASH_XXH3_64 == 1
    assert hashing_mod.HASH_BLAKE2B_KEYED == 2
    assert hashing_mod.KNOWN_HASH_ALGORITHMS[1] == "xxh3_64"
    assert hashing_mod.KNOWN_HASH_ALGORITHMS[2] == "blake2b_keyed"


def test_hash_algorithm_1_is_xxh3_64_seed_0():
    # Filters on disk depend on these exact values (hash algorithm id 1).
    assert hashing_mod.key_hash(b"") == 0x2D06800538D394C2
    assert hashing_mod.key_hash(b"a") == 0xE6C632B61E964E1F
    assert hashing_mod.key_hash(b"key000") == 0x981540A6F984FDCB
    assert bloom_mod.split_hash(0x981540A6F984FDCB) == (0xF984FDCB, 0x981540A6)


def test_hash_algorithm_2_is_keyed_blake2b():
    # Algorithm 2: blake2b(key, digest_size=8, key=secret) read as a little-endian
    # u64; the header's key_id is blake2b(secret, digest_size=4, person=b"lsmdb-id")
    # read as a little-endian u32.
    hasher = hashing_mod.keyed_hasher(bytes(range(32)))
    assert hasher.algorithm == 2
    assert hasher.key_id == 0x8618331A
    assert hasher.fn(b"") == 0xDA23B69E45E0FBB6
    assert hasher.fn(b"key000") == 0x608DD77F99A2A308


# -- WAL -----------------------------------------------------------------------

# Segment 1 with one record: header "LSMDBWAL" | format 2 | number 1, then one FULL
# fragment: crc32 u32 | length u16 (20) | type 1 | msgpack [7, [[1, b"k", b"v"],
# [2, b"gone", nil]]].  The crc covers the number (u32), the type and the payload.
GOLDEN_WAL_RECORD = bytes.fromhex(
    "4c534d444257414c" "02000000" "01000000"
    "6d962a85" "1400" "01"
    "92" "07" "92" "93" "01" "c4016b" "c40176" "93" "02" "c404676f6e65" "c0")

# A fresh database after put(k, v), delete(gone), and a batch put(x, 1) + delete(y),
# all in the default table (id 1): three FULL fragments, seq 1, 2, 3, in segment 1.
GOLDEN_DB_WAL = bytes.fromhex(
    "4c534d444257414c" "02000000" "01000000"
    "1f85bc00" "0b00" "01" "9201919301c4016bc40176"
    "75d5bf70" "0c00" "01" "9202919301c404676f6e65c0"
    "1fbfee8d" "1100" "01" "9203929301c40178c401319301c40179c0")

# The same three records as an older lsmdb wrote them: no header, no blocks,
# crc32 u32 (of the payload) | length u32 | payload.
GOLDEN_DB_WAL_V1 = bytes.fromhex(
    "58a24db2" "0b000000" "9201919301c4016bc40176"
    "61f0b598" "0c000000" "9202919301c404676f6e65c0"
    "632d5214" "11000000" "9203929301c40178c401319301c40179c0")


def test_wal_record_encoding(tmp_path):
    payload = msgpack.packb([7, [[1, b"k", b"v"], [2, b"gone", None]]], use_bin_type=True)
    path = str(tmp_path / "wal-000001.log")
    w = LogWriter(path, 1)
    w.add_record(payload)
    w.close()
    with open(path, "rb") as f:
        data = f.read()
    assert data == GOLDEN_WAL_RECORD
    result = read_segment(GOLDEN_WAL_RECORD, 1, closed_size=len(GOLDEN_WAL_RECORD))
    assert result.records == [(16, payload)] and not result.torn
    assert msgpack.unpackb(result.records[0][1], raw=False) == [7, [[1, b"k", b"v"],
                                                                    [2, b"gone", None]]]


def test_format_md_shows_the_golden_wal(tmp_path):
    """docs/FORMAT.md section 3's example is the start of the segment a database writes."""
    with open(os.path.join(ROOT, "docs", "FORMAT.md"), encoding="utf-8") as f:
        doc = f.read()
    block = doc.split("**Example.** A fresh database gets")[1].split("```")[1]
    shown = bytearray()
    for line in block.splitlines():
        for token in line.split():
            if len(token) != 2 or any(c not in "0123456789abcdef" for c in token):
                break
            shown.append(int(token, 16))
    assert len(shown) > 50
    assert GOLDEN_DB_WAL.startswith(bytes(shown))


def test_database_writes_golden_wal(tmp_path):
    path = str(tmp_path / "db")
    db = lsmdb.open(path)
    try:
        db.put(b"k", b"v")
        db.delete(b"gone")
        with db.batch() as b:
            b.put(b"x", b"1")
            b.delete(b"y")
    finally:
        db.close()
    segments = sorted(glob.glob(os.path.join(path, "wal-*.log")))
    assert [os.path.basename(p) for p in segments] == ["wal-000001.log"]
    with open(segments[0], "rb") as f:
        assert f.read() == GOLDEN_DB_WAL
    # ... and the pinned bytes are what recovery understands.
    with lsmdb.open(path, read_only=True) as db:
        assert (db.get(b"k"), db.get(b"x"), db.get(b"gone"), db.get(b"y")) == (
            b"v", b"1", None, None)


# -- MANIFEST --------------------------------------------------------------------

GOLDEN_MANIFEST_OBJ = Manifest(next_file_number=9, next_table_id=3, last_seq=1042, tables={
    "default": TableMeta(1, {}, 40, [FileMeta(7, 0, 797, 20, b"key000", b"key019", 1000, 1019)]),
    "events": TableMeta(2, {"bloom_filter_fp_chance": 0.001, "block_size_bytes": 256}, 0, []),
}, wal=WalState(closed=[(5, 1234, 2)], unsynced=[(6, 99)], live=8),
    db_id="00112233445566778899aabbccddeeff")
GOLDEN_MANIFEST = bytes.fromhex(
    # magic "LSMDBMAN" | version 2 | crc32 | length 296
    "4c534d44424d414e" "02000000" "582d0996" "28010000"
    # {"next_file_number": 9, "next_table_id": 3, "last_seq": 1042, "tables": {...}, "wal": ...,
    #  "db_id": ...}
    "86b06e6578745f66696c655f6e756d62657209ad6e6578745f7461626c655f696403a86c6173745f736571"
    "cd0412" "a67461626c657382"
    # "default": {"id": 1, "options": {}, "flushed_seq": 40, "files": [[7, 0, 797, 20,
    #             b"key000", b"key019", 1000, 1019]]}
    "a764656661756c7484a2696401a76f7074696f6e7380ab666c75736865645f73657128a566696c657391"
    "980700cd031d14c4066b6579303030c4066b6579303139cd03e8cd03fb"
    # "events": {"id": 2, "options": {"bloom_filter_fp_chance": 0.001,
    #            "block_size_bytes": 256}, "flushed_seq": 0, "files": []}
    "a66576656e747384a2696402a76f7074696f6e7382b6626c6f6f6d5f66696c7465725f66705f6368616e6365"
    "cb3f50624dd2f1a9fcb0626c6f636b5f73697a655f6279746573cd0100ab666c75736865645f73657100"
    "a566696c657390"
    # "wal": {"closed": [[5, 1234, 2]], "unsynced": [[6, 99]], "live": 8}
    "a377616c83a6636c6f736564919305cd04d202a8756e73796e63656491920663a46c69766508"
    # "db_id": "00112233445566778899aabbccddeeff" (a str 8 of 32 bytes)
    "a564625f6964d9203030313132323333343435353636373738383939616162626363646465656666")

#: The database id the pinned MANIFEST bytes below carry in place of a new one's random id.
GOLDEN_DB_ID = "00112233445566778899aabbccddeeff"

# The MANIFEST of a new, empty database once closed: no WAL segment left.
GOLDEN_EMPTY_DB_MANIFEST = bytes.fromhex(
    "4c534d44424d414e" "02000000" "1dd80a9f" "a3000000"
    "86b06e6578745f66696c655f6e756d62657202ad6e6578745f7461626c655f696402a86c6173745f73657100"
    "a67461626c657381a764656661756c7484a2696401a76f7074696f6e7380ab666c75736865645f73657100"
    "a566696c657390" "a377616c83a6636c6f73656490a8756e73796e63656490a46c697665c0"
    "a564625f6964d9203030313132323333343435353636373738383939616162626363646465656666")

# A new database's MANIFEST as an older lsmdb wrote it: format 1, no "wal".
GOLDEN_EMPTY_DB_MANIFEST_V1 = bytes.fromhex(
    "4c534d44424d414e" "01000000" "5db5f7b1" "5e000000"
    "84b06e6578745f66696c655f6e756d62657201ad6e6578745f7461626c655f696402a86c6173745f73657100"
    "a67461626c657381a764656661756c7484a2696401a76f7074696f6e7380ab666c75736865645f73657100"
    "a566696c657390")


def test_manifest_encoding():
    assert GOLDEN_MANIFEST_OBJ.encode() == GOLDEN_MANIFEST
    decoded = Manifest.decode(GOLDEN_MANIFEST, "MANIFEST")
    assert decoded == GOLDEN_MANIFEST_OBJ
    old = Manifest.decode(GOLDEN_EMPTY_DB_MANIFEST_V1, "MANIFEST")
    assert old.wal is None and list(old.tables) == ["default"]


def test_new_database_manifest(tmp_path):
    """Byte for byte but for the new database's random id (and so the checksum)."""
    path = str(tmp_path / "db")
    lsmdb.open(path).close()
    with open(os.path.join(path, "MANIFEST"), "rb") as f:
        data = f.read()
    db_id = Manifest.decode(data, "MANIFEST").db_id
    assert len(db_id) == 32 and db_id != GOLDEN_DB_ID
    payload = data[20:].replace(db_id.encode(), GOLDEN_DB_ID.encode())
    assert data[:12] + zlib.crc32(payload).to_bytes(4, "little") + data[16:20] + payload \
        == GOLDEN_EMPTY_DB_MANIFEST


def test_a_database_left_by_an_older_lsmdb_opens_and_moves_to_the_current_formats(tmp_path):
    """A format-1 MANIFEST and a headerless WAL segment: replayed, kept as a closed
    segment of format 1 while a memtable needs it, and gone once flushed."""
    assert [p for _o, p in read_legacy_log(GOLDEN_DB_WAL_V1).records] == \
        [p for _o, p in read_segment(GOLDEN_DB_WAL, 1).records]
    path = tmp_path / "db"
    path.mkdir()
    (path / "MANIFEST").write_bytes(GOLDEN_EMPTY_DB_MANIFEST_V1)
    (path / "wal-000001.log").write_bytes(GOLDEN_DB_WAL_V1)
    (path / "LOCK").write_bytes(b"")
    assert verify_database(str(path)) == []
    for read_only in (True, False):
        with lsmdb.open(str(path), read_only=read_only) as db:
            assert (db.get(b"k"), db.get(b"x"), db.get(b"gone"), db.get(b"y")) == (
                b"v", b"1", None, None)
    manifest = Manifest.read(str(path / "MANIFEST"))
    assert manifest.wal == WalState([(1, len(GOLDEN_DB_WAL_V1), 1)], [], None)
    assert verify_database(str(path)) == []
    with lsmdb.open(str(path)) as db:
        assert db.get(b"k") == b"v"
        db.put(b"new", b"2")
        db.flush()
    assert not glob.glob(str(path / "wal-*.log"))
    with lsmdb.open(str(path)) as db:
        assert (db.get(b"k"), db.get(b"new")) == (b"v", b"2")
    assert verify_database(str(path)) == []


# -- STATS -----------------------------------------------------------------------

class _FakeReader:
    number = 7
    range_skips, filter_negatives, true_positives = 1, 2, 3
    false_positives, false_negatives, block_reads, block_cache_hits = 4, 5, 6, 7


class _FakeTable:
    id, gets, gets_absent, write_stalls, write_stall_us = 1, 10, 4, 2, 300000
    write_slowdowns, write_slowdown_us = 3, 40000


# magic "LSMDBSTA" | version 1 | crc32 | length 39 |
# {"files": {7: [1, 2, 3, 4, 5, 6, 7]}, "tables": {1: [10, 4, 2, 300000, 3, 40000]}}
GOLDEN_STATS = bytes.fromhex(
    "4c534d4442535441" "01000000" "58e02774" "27000000"
    "82a566696c657381079701020304050607a67461626c65738101960a0402ce000493e003cd9c40")

# The same file as written before the write-slowdown counters were appended:
# {"tables": {1: [10, 4, 2, 300000]}}.
GOLDEN_STATS_4_TABLE_COUNTERS = bytes.fromhex(
    "4c534d4442535441" "01000000" "9eda17f5" "23000000"
    "82a566696c657381079701020304050607a67461626c65738101940a0402ce000493e0")

# The same file as written before the write-stall counters were appended to the
# per-table counters: {"tables": {1: [10, 4]}}.
GOLDEN_STATS_2_TABLE_COUNTERS = bytes.fromhex(
    "4c534d4442535441" "01000000" "498b3fc5" "1d000000"
    "82a566696c657381079701020304050607a67461626c65738101920a04")

# The same file as written before block_cache_hits was appended to the
# per-file counters (still format version 1: the list is append-only).
GOLDEN_STATS_6_COUNTERS = bytes.fromhex(
    "4c534d4442535441" "01000000" "7bf0173a" "1c000000"
    "82a566696c6573810796010203040506a67461626c65738101920a04")


def test_stats_encoding():
    from lsmdb.stats import FILE_COUNTERS, decode_stats, encode_stats
    # Append only: the first counters keep their positions forever.
    assert FILE_COUNTERS[:7] == ("range_skips", "filter_negatives", "true_positives",
                                 "false_positives", "false_negatives", "block_reads",
                                 "block_cache_hits")
    assert encode_stats([_FakeReader()], [_FakeTable()]) == GOLDEN_STATS
    assert decode_stats(GOLDEN_STATS) == ({7: [1, 2, 3, 4, 5, 6, 7]},
                                          {1: [10, 4, 2, 300000, 3, 40000]})
    assert decode_stats(GOLDEN_STATS_4_TABLE_COUNTERS)[1] == {1: [10, 4, 2, 300000]}
    assert decode_stats(GOLDEN_STATS_2_TABLE_COUNTERS)[1] == {1: [10, 4]}


def test_stats_with_fewer_table_counters_still_load(tmp_path):
    """A STATS written before the write-stall counters: gets load, stalls start at 0."""
    db = lsmdb.open(str(tmp_path / "db"))
    table_id = db._versions.tables["default"].id
    db.close()
    payload = bytes.fromhex("82a566696c657380a67461626c657381") + bytes([table_id]) + \
        bytes.fromhex("920a04")
    from lsmdb.coding import crc32
    from lsmdb.stats import STATS_HEADER, STATS_MAGIC
    with open(tmp_path / "db" / "STATS", "wb") as f:
        f.write(STATS_HEADER.pack(STATS_MAGIC, 1, crc32(payload), len(payload)) + payload)
    with lsmdb.open(str(tmp_path / "db"), read_only=True) as again:
        stats = again.table_stats()
        assert (stats["gets"], stats["gets_absent"], stats["write_stalls"]) == (10, 4, 0)


def test_stats_with_fewer_counters_still_load():
    from lsmdb.stats import apply_file_counters, decode_stats

    class Reader:
        range_skips = block_reads = block_cache_hits = -1

    files, tables = decode_stats(GOLDEN_STATS_6_COUNTERS)
    assert (files, tables) == ({7: [1, 2, 3, 4, 5, 6]}, {1: [10, 4]})
    reader = Reader()
    reader.block_cache_hits = 0
    apply_file_counters(reader, files[7])
    assert (reader.range_skips, reader.block_reads, reader.block_cache_hits) == (1, 6, 0)


def test_format3_golden_file_is_rebuilt_and_read_back_exactly():
    """Format 3: the format-2 golden entries with three expiring values (kind 2,
    the expiries list), LZ4 blocks."""
    path = make_golden.golden_f3_path()
    with open(path, "rb") as f:
        data = f.read()
    assert len(data) == 868
    assert make_golden.build_golden_f3() == data, "format-3 SSTable bytes changed"
    want = dict(make_golden.golden_f3_items())
    for reader in (SSTableReader(path, 7), SSTableReader("golden.sst", 7, data=data)):
        assert reader.version == 3 and reader.compression == "lz4"
        assert reader.properties["expiring_entries"] == 3
        assert reader.properties["format_version"] == 3
        got = {}
        for i in range(len(reader.index_keys)):
            keys, values, tags = reader.decode_full(i, reader.read_raw(i))
            for k, v, t in zip(keys, values, tags, strict=True):
                n = int(k[3:])
                kind = 0 if v is None else 2 if n in make_golden.GOLDEN_EXPIRING else 1
                assert t == (1000 + n) << 8 | kind, k
                got[k] = v
        assert got == want
        assert got[b"key008"] == (want[b"key008"][0], 1_700_000_000_000_008)
        for k, v in want.items():
            assert find(reader, k) == v
        reader.close()
