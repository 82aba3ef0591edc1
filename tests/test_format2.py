"""SSTable format 2: per-entry sequence numbers and kinds, block compression,
file identity checked against the manifest, manifest counter bounds."""

from __future__ import annotations

import json
import os
import random
import shutil
import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lsmdb
from lsmdb import block as blk
from lsmdb import compression
from lsmdb.coding import crc32
from lsmdb.errors import CorruptionError
from lsmdb.files import sst_name
from lsmdb.manifest import MANIFEST_HEADER, Manifest
from lsmdb.sstable_format import DATA_TRAILER_V2, MAX_SEQ
from lsmdb.sstable_reader import SSTableReader
from lsmdb.sstable_writer import write_sstable
from tests.support.tools import load_tool

try:
    from lsmdb import _speedups
except ImportError:  # pragma: no cover
    _speedups = None  # type: ignore[assignment]

KINDS = ("none", "lz4", "zstd")


def records(n: int, seed: int = 1) -> list[tuple[bytes, bytes]]:
    """JSON records of realistic fields, keyed in order."""
    rng = random.Random(seed)
    names = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"]
    cities = ["Lisbon", "Oslo", "Kyoto", "Quito", "Accra", "Perth", "Lima", "Riga"]
    out = []
    for i in range(n):
        name = rng.choice(names)
        rec = {"id": i, "name": name.title(), "email": f"{name}{rng.randrange(999)}@example.org",
               "city": rng.choice(cities), "score": round(rng.random() * 100, 2),
               "tags": rng.sample(["new", "vip", "late", "eu", "us", "beta"], 2)}
        out.append((b"user:%08d" % i, json.dumps(rec).encode()))
    return out


def stored_types(reader: SSTableReader) -> list[int]:
    return [reader.read_raw(i)[-DATA_TRAILER_V2.size] for i in range(len(reader.index_keys))]


@pytest.mark.parametrize("kind", KINDS)
def test_each_compression_reads_back_exactly(tmp_path, kind):
    items = records(2000)
    path = str(tmp_path / "000001.sst")
    props = write_sstable(path, items, fp_chance=0.01, block_size=4096, compression=kind,
                          file_number=1, db_id="ab" * 16, max_seq=77)
    reader = SSTableReader(path, 1)
    assert reader.version == 2 and reader.compression == kind
    assert reader.file_number == 1 and reader.db_id == "ab" * 16
    types = set(stored_types(reader))
    # JSON records shrink by far more than 1/8; an lz4 file this large has a
    # dictionary, and its blocks are stored in pieces against it
    assert len(reader.index_keys) >= compression.DICT_BLOCKS
    assert types == {compression.LZ4_PIECES if kind == "lz4" else compression.TYPES[kind]}
    assert (reader.compression_dict is not None) == (kind == "lz4")
    got = [kv for i in range(len(reader.index_keys))
           for kv in zip(*reader.read_block(i), strict=True)]
    assert got == items
    assert props["uncompressed_bytes"] == reader.uncompressed_bytes
    if kind == "none":
        assert reader.uncompressed_bytes == sum(reader.index_sizes)
    else:
        assert sum(reader.index_sizes) < 0.7 * reader.uncompressed_bytes
    for i in range(len(reader.index_keys)):
        keys, values, tags = reader.decode_full(i, reader.read_raw(i))
        assert tags == [77 << 8 | 1] * len(keys)
    reader.close()


def test_a_block_that_does_not_shrink_by_an_eighth_is_stored_as_it_is(tmp_path):
    rng = random.Random(5)
    items = [(b"k%06d" % i, rng.randbytes(200)) for i in range(500)]
    path = str(tmp_path / "000001.sst")
    write_sstable(path, items, fp_chance=0.01, block_size=4096, compression="lz4")
    reader = SSTableReader(path, 1)
    assert set(stored_types(reader)) == {compression.NONE}
    assert reader.uncompressed_bytes == sum(reader.index_sizes)
    reader.close()
    # the rule itself, at its edge
    payload = bytes(800)
    kind, stored = compression.compress(compression.LZ4, payload)
    assert kind == compression.LZ4 and len(stored) <= 700
    noise = random.Random(1).randbytes(800)
    assert compression.compress(compression.ZSTD, noise) == (compression.NONE, noise)


def _rewrite_block(path: str, reader: SSTableReader, i: int, stored: bytes, kind: int) -> None:
    """Replace block i's stored bytes in place (same length), its checksum made valid."""
    off = reader.index_offsets[i]
    assert len(stored) == reader.index_sizes[i]
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(stored + DATA_TRAILER_V2.pack(kind, crc32(bytes([kind]), crc32(stored))))


@pytest.mark.parametrize("kind", ["lz4", "zstd"])
@pytest.mark.parametrize("use_c", [True, False])
def test_a_compressed_block_that_does_not_decompress_is_corruption(tmp_path, kind, use_c,
                                                                   monkeypatch):
    db = lsmdb.open(str(tmp_path / "db"), auto_compaction=False)
    db.create_table("t", compression=kind)
    items = records(3000)
    for k, v in items:
        db.table("t").put(k, v)
    db.flush()
    reader = db._versions.tables["t"].files[0]
    path = reader.path
    stored = bytearray(reader.read_raw(1)[:-DATA_TRAILER_V2.size])
    stored[len(stored) // 2] ^= 0xFF   # garbage inside the compressed stream
    stored[-1] ^= 0x55
    db.close()
    _rewrite_block(path, SSTableReader(path, 1), 1, bytes(stored), compression.TYPES[kind])
    db = lsmdb.open(str(tmp_path / "db"), auto_compaction=False, block_cache_size_bytes=0)
    key = SSTableReader(path, 1).index_keys[1]
    if not use_c:
        monkeypatch.setattr(lsmdb.readpath, "USE_C_GETTER", False)
        db.close()
        db = lsmdb.open(str(tmp_path / "db"), auto_compaction=False, block_cache_size_bytes=0)
    get = db.table("t").get
    with pytest.raises(CorruptionError) as exc:
        value = get(key)
        # a decompressor that accepted the bytes would still fail the length or the rule
        pytest.fail(f"read {value!r} from a damaged block")
    assert os.path.basename(path) in str(exc.value)
    assert f"offset {SSTableReader(path, 1).index_offsets[1]}" in str(exc.value)
    assert db.table("t").get(items[0][0]) == items[0][1]  # block 0 is whole
    db.close()


def test_a_flipped_byte_of_a_compressed_block_fails_the_checksum(tmp_path):
    path = str(tmp_path / "000001.sst")
    write_sstable(path, records(500), fp_chance=0.01, block_size=4096, compression="zstd")
    reader = SSTableReader(path, 1)
    off = reader.index_offsets[0]
    with open(path, "r+b") as f:
        f.seek(off + 10)
        b = f.read(1)
        f.seek(off + 10)
        f.write(bytes([b[0] ^ 1]))
    reader = SSTableReader(path, 1)
    with pytest.raises(CorruptionError, match="checksum"):
        reader.read_block(0)


def test_flush_and_compaction_keep_each_entrys_sequence_number(tmp_path):
    db = lsmdb.open(str(tmp_path / "db"), auto_compaction=False)
    seqs = {}
    for i in range(300):
        key = b"k%04d" % (i % 200)
        if i % 7 == 3:
            db.delete(key)
        else:
            db.put(key, b"v%d" % i)
        seqs[key] = db._versions.last_seq
        if i % 100 == 99:
            db.flush()
    db.flush()
    state = db._versions.tables["default"]

    def tags_on_disk():
        out = {}
        for reader in state.files:  # newest first: the first seen wins
            for i in range(len(reader.index_keys)):
                keys, values, tags = reader.decode_full(i, reader.read_raw(i))
                for k, v, t in zip(keys, values, tags, strict=True):
                    out.setdefault(k, (t, v))
        return out

    before = tags_on_disk()
    for key in seqs:  # every block cached: the compaction takes its tags from the cache
        db.get(key)
    assert len(db._versions.block_cache) > 0
    for key, seq in seqs.items():
        tag, value = before[key]
        assert tag >> 8 == seq
        assert tag & 0xFF == (0 if value is None else 1)
    db.compact()
    assert len(state.files) == 1
    after = tags_on_disk()
    assert {k: t for k, (t, v) in after.items()} == {k: t for k, (t, v) in before.items()
                                                    if v is not None}
    db.close()


def _two_twins(tmp_path):
    """Two databases written the same way: same file numbers and sizes, other ids."""
    paths = []
    for name in ("a", "b"):
        p = str(tmp_path / name)
        db = lsmdb.open(p, auto_compaction=False)
        db.create_table("t")
        for k, v in records(200):
            db.put(k, v)
            db.table("t").put(k, v[::-1])
        db.flush()
        db.close()
        paths.append(p)
    return paths


def test_a_file_in_place_of_another_of_the_same_database_is_refused(tmp_path):
    a, _b = _two_twins(tmp_path)
    m = Manifest.read(os.path.join(a, "MANIFEST"))
    (f_default,) = m.tables["default"].files
    (f_t,) = m.tables["t"].files
    victim = os.path.join(a, sst_name(f_default.number))
    shutil.copyfile(os.path.join(a, sst_name(f_t.number)), victim)
    with pytest.raises(CorruptionError) as exc:
        lsmdb.open(a)
    assert os.path.basename(victim) in str(exc.value)
    assert "not the file the manifest names" in str(exc.value)


def test_a_file_of_another_database_is_refused(tmp_path):
    a, b = _two_twins(tmp_path)
    m = Manifest.read(os.path.join(a, "MANIFEST"))
    number = m.tables["default"].files[0].number
    name = sst_name(number)
    assert os.path.getsize(os.path.join(a, name)) == os.path.getsize(os.path.join(b, name))
    shutil.copyfile(os.path.join(b, name), os.path.join(a, name))
    with pytest.raises(CorruptionError, match="belongs to database") as exc:
        lsmdb.open(a)
    assert name in str(exc.value)
    # repair sets it aside rather than serve it
    from lsmdb.repair import repair_database
    report = repair_database(a)
    assert any(name == n and "another database" in why for n, why in report.set_aside)
    db = lsmdb.open(a)
    assert db.get(records(1)[0][0]) is None
    assert db.table("t").get(records(1)[0][0]) == records(1)[0][1][::-1]
    db.close()


def test_each_database_gets_its_own_id_recorded_in_its_files(tmp_path):
    a, b = _two_twins(tmp_path)
    ma, mb = Manifest.read(os.path.join(a, "MANIFEST")), Manifest.read(os.path.join(b, "MANIFEST"))
    assert len(ma.db_id) == 32 and ma.db_id != mb.db_id
    for p, m in ((a, ma), (b, mb)):
        for t in m.tables.values():
            for f in t.files:
                r = SSTableReader(os.path.join(p, sst_name(f.number)), f.number)
                assert (r.db_id, r.file_number) == (m.db_id, f.number)
                r.close()


def _rewrite_manifest(path: str, **changes) -> None:
    mpath = os.path.join(path, "MANIFEST")
    with open(mpath, "rb") as f:
        data = f.read()
    obj = msgpack.unpackb(data[MANIFEST_HEADER.size:], raw=False)
    obj.update(changes)
    payload = msgpack.packb(obj, use_bin_type=True)
    magic, version, _crc, _len = MANIFEST_HEADER.unpack_from(data, 0)
    with open(mpath, "wb") as f:
        f.write(MANIFEST_HEADER.pack(magic, version, crc32(payload), len(payload)) + payload)


@pytest.mark.parametrize("changes", [
    {"last_seq": MAX_SEQ + 1},
    {"last_seq": (1 << 64) - 1},
    {"next_file_number": 1 << 63},
    {"next_file_number": 0},
    {"next_table_id": (1 << 64) - 1},
    {"next_table_id": 1},
])
def test_manifest_counters_out_of_range_are_corruption(tmp_path, changes):
    path = str(tmp_path / "db")
    db = lsmdb.open(path)
    db.put(b"k", b"v")
    db.close()
    _rewrite_manifest(path, **changes)
    with pytest.raises(CorruptionError, match="manifest counters out of range"):
        lsmdb.open(path)


def test_the_highest_sequence_number_the_format_holds_still_opens(tmp_path):
    path = str(tmp_path / "db")
    db = lsmdb.open(path)
    db.put(b"k", b"v")
    db.close()
    _rewrite_manifest(path, last_seq=MAX_SEQ - 10)
    db = lsmdb.open(path)
    assert db.get(b"k") == b"v"
    db.put(b"k2", b"v2")
    db.flush()
    assert db.get(b"k2") == b"v2"
    db.close()


# -- the data block rule for format 2, Python and C alike -----------------------

def _payload(keys, values, tags, expiries):
    return msgpack.packb([keys, values, tags, expiries], use_bin_type=True)


GOOD = ([b"a", b"b", b"c"], [b"1", None, b"3"], [5 << 8 | 1, 6 << 8 | 0, 7 << 8 | 1], [])
BAD = {
    "tag count": ([b"a", b"b"], [b"1", b"2"], [257], []),
    "kind of a tombstone": ([b"a"], [None], [257], []),
    "kind of a value": ([b"a"], [b"1"], [256], []),
    "unknown kind": ([b"a"], [b"1"], [259], []),
    # expiring values are a later format's: format 2 holds neither kind 2 nor expiries
    "expiring kind": ([b"a"], [b"1"], [258], [10**12]),
    "expiring kind without expiry": ([b"a"], [b"1"], [258], []),
    "an expiry": ([b"a"], [b"1"], [257], [5]),
    "negative tag": ([b"a"], [b"1"], [-1], []),
    "tag not an int": ([b"a"], [b"1"], [b"x"], []),
}


def test_format2_rule_accepts_the_good_block_in_both_paths():
    payload = _payload(*GOOD)
    assert blk.decode_full(payload, "f", 0, None, b"c", 2) == GOOD
    assert blk.decode_data_block(payload, "f", 0, None, b"c", 2) == (GOOD[0], GOOD[1])
    entry = blk.cache_entry(payload, (GOOD[0], GOOD[1]))
    if _speedups is not None:
        assert _speedups.block_lists(payload, None, b"c", 2) == (GOOD[0], GOOD[1])
        assert _speedups.block_entry(payload, None, b"c", 2) == entry
        assert _speedups.entry_find(entry, b"c", None) == b"3"
    assert blk.entry_find(entry, b"a") == b"1"
    assert blk.entry_lists(entry) == (GOOD[0], GOOD[1])
    # a format-2 block is not a format-1 block, nor the reverse
    with pytest.raises(CorruptionError):
        blk.decode_data_block(payload, "f", 0, None, b"c", 1)
    v1 = msgpack.packb([GOOD[0], GOOD[1]], use_bin_type=True)
    with pytest.raises(CorruptionError):
        blk.decode_full(v1, "f", 0, None, b"c", 2)
    if _speedups is not None:
        for p, v in ((payload, 1), (v1, 2)):
            with pytest.raises(ValueError):
                _speedups.block_lists(p, None, b"c", v)


@pytest.mark.parametrize("name", sorted(BAD))
def test_format2_rule_refuses_bad_tags_in_both_paths(name):
    keys, values, tags, expiries = BAD[name]
    payload = _payload(keys, values, tags, expiries)
    with pytest.raises(CorruptionError):
        blk.decode_full(payload, "f", 0, None, keys[-1], 2)
    if _speedups is not None:
        with pytest.raises(ValueError):
            _speedups.block_lists(payload, None, keys[-1], 2)
        with pytest.raises(ValueError):
            _speedups.block_entry(payload, None, keys[-1], 2)


@pytest.mark.parametrize("good,bad", [
    (b"\xcd\x01\x01", b"\xce\x00\x00\x01\x01"),   # 257: uint 16, not a longer uint 32
    (b"\xcd\x01\x01", b"\xd1\x01\x01"),             # ... nor an int 16 of the same length
    (b"\xce\x00\x01\x00\x01", b"\xd2\x00\x01\x00\x01"),  # 65537: uint 32, not int 32
])
def test_format2_rule_refuses_any_other_integer_encoding_in_both_paths(good, bad):
    tag = msgpack.unpackb(good)
    payload = _payload([b"a"], [b"1"], [tag], [])
    assert good in payload
    damaged = payload.replace(good, bad)
    assert msgpack.unpackb(damaged)[2] == [tag]  # the same value, another encoding
    with pytest.raises(CorruptionError):
        blk.decode_full(damaged, "f", 0, None, b"a", 2)
    if _speedups is not None:
        with pytest.raises(ValueError):
            _speedups.block_lists(damaged, None, b"a", 2)


def test_a_zstd_block_with_bytes_after_its_frame_is_corruption():
    payload = _payload(*GOOD)
    kind, stored = compression.compress(compression.ZSTD, payload * 8)
    assert kind == compression.ZSTD
    assert compression.decompress(kind, stored, "f", 0) == payload * 8
    for tail in (b"xx", stored):  # garbage, or a second frame
        with pytest.raises(CorruptionError, match="does not decompress"):
            compression.decompress(kind, stored + tail, "f", 0)
    with pytest.raises(CorruptionError):
        compression.decompress(kind, stored[:-3], "f", 0)


def test_a_footer_that_disagrees_with_the_properties_on_the_version_is_corruption(tmp_path):
    from lsmdb.sstable_format import FOOTER_SIZE
    path = str(tmp_path / "000001.sst")
    write_sstable(path, records(100), fp_chance=0.01, block_size=4096)
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        foot = len(data) - FOOTER_SIZE
        struct.pack_into("<I", data, foot + 48, 1)
        struct.pack_into("<I", data, foot + 52, crc32(bytes(data[foot:foot + 52])))
        f.seek(0)
        f.write(data)
    with pytest.raises(CorruptionError, match="properties say format 2, the footer 1"):
        SSTableReader(path, 1)


def test_verify_reports_a_file_in_place_of_another(tmp_path):
    from lsmdb.verify import verify_database
    path = str(tmp_path / "db")
    db = lsmdb.open(path, auto_compaction=False)
    db.alter_table("default", compression="none")
    other = db.create_table("other")
    for i in range(300):  # sequence numbers past 255: both files' take the same bytes
        other.put(b"x%03d" % i, b"")
    for part in (0, 1):  # two files of the same size
        for i in range(100):
            db.put(b"k%d-%03d" % (part, i), b"v" * 20)
        db.table("default").flush()
    db.close()
    a, b = sorted(n for n in os.listdir(path) if n.endswith(".sst"))
    assert os.path.getsize(os.path.join(path, a)) == os.path.getsize(os.path.join(path, b))
    assert verify_database(path) == []
    data_a = open(os.path.join(path, a), "rb").read()
    data_b = open(os.path.join(path, b), "rb").read()
    open(os.path.join(path, a), "wb").write(data_b)
    open(os.path.join(path, b), "wb").write(data_a)
    problems = verify_database(path)
    assert {os.path.basename(p.path) for p in problems if p.severity == "error"} == {a, b}
    assert all("not the file the manifest names" in p.message for p in problems)


def test_repair_without_a_manifest_keeps_the_files_most_of_them_say_are_its_own(tmp_path):
    from lsmdb.repair import repair_database
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for p in (a, b):
        db = lsmdb.open(p, auto_compaction=False)
        for part in range(3):
            for i in range(100):
                db.put(b"%s%d-%03d" % (os.path.basename(p).encode(), part, i), b"v")
            db.flush()
        db.close()
    first = sorted(n for n in os.listdir(a) if n.endswith(".sst"))[0]
    shutil.copyfile(os.path.join(b, first), os.path.join(a, first))  # a bad restore
    os.remove(os.path.join(a, "MANIFEST"))
    report = repair_database(a)
    assert [n for n, why in report.set_aside if "another database" in why] == [first]
    db = lsmdb.open(a)
    keys = {k for k, _v in db.scan()}
    assert keys == {b"a%d-%03d" % (part, i) for part in (1, 2) for i in range(100)}
    db.close()


def test_properties_record_sizes_and_db_sstables_show_them(tmp_path):
    db = lsmdb.open(str(tmp_path / "db"), auto_compaction=False)
    for k, v in records(3000):
        db.put(k, v)
    db.flush()
    (info,) = db.sstables()
    assert info.compression == "lz4" and info.format_version == 2
    assert info.uncompressed_bytes > 2 * info.data_bytes > 0
    d = info.to_dict()
    assert d["compression_ratio"] == pytest.approx(info.data_bytes / info.uncompressed_bytes)
    db.close()


def test_uint_encodings_at_every_width_in_both_paths():
    for seq in (0, 1, 1 << 8, 1 << 16, 1 << 24, 1 << 40, MAX_SEQ):
        payload = _payload([b"a"], [b"1"], [seq << 8 | 1], [])
        assert blk.decode_full(payload, "f", 0, None, b"a", 2)[2] == [seq << 8 | 1]
        if _speedups is not None:
            assert _speedups.block_lists(payload, None, b"a", 2) == ([b"a"], [b"1"])


def test_struct_of_the_trailer():
    assert DATA_TRAILER_V2.size == 5
    assert struct.calcsize("<BI") == 5


# -- a database written by the release before format 2 --------------------------

RELEASE1_DB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "release1_db")


def _check_every_key(db, model):
    for table, expected in model.items():
        t = db.table(table)
        assert dict(t.scan()) == expected
        names = sorted({k for k in expected} | {b"%s:%05d" % (table.encode(), i)
                                                 for i in range(800)})
        for k in names:
            assert t.get(k) == expected.get(k)
        assert t.get_many(names) == [expected.get(k) for k in names]


def test_a_database_of_the_previous_release_reads_and_moves_to_format_2(tmp_path):
    tool = load_tool("make_release1_db")
    model = tool.expected()
    path = str(tmp_path / "db")
    shutil.copytree(RELEASE1_DB, path)
    os.chmod(os.path.join(path, "FILTER_KEY"), 0o600)
    db = lsmdb.open(path, auto_compaction=False)
    versions = {r.version for s in db._versions.tables.values() for r in s.files}
    assert versions == {1}
    assert db.table("events").options.bloom_filter_fp_chance == 0.001
    assert db.table("sessions").options.bloom_filter_hash == "keyed"
    _check_every_key(db, model)
    db.compact()
    versions = {r.version for s in db._versions.tables.values() for r in s.files}
    assert versions == {2}
    _check_every_key(db, model)
    db.close()
    m = Manifest.read(os.path.join(path, "MANIFEST"))
    assert len(m.db_id) == 32  # the database got an identity, which its new files carry
    db = lsmdb.open(path)
    assert {r.db_id for s in db._versions.tables.values() for r in s.files} == {m.db_id}
    _check_every_key(db, model)
    db.close()


@pytest.mark.skipif(_speedups is None, reason="compares the C rule with the Python one")
@settings(max_examples=1500, deadline=None)
@given(st.data())
def test_c_and_python_accept_the_same_format2_payloads(data):
    """Mutations of valid format-2 payloads: the C rule and the Python rule
    accept exactly the same ones, and read the same entries from them."""
    n = data.draw(st.integers(1, 6))
    keys = sorted(set(data.draw(st.lists(st.binary(min_size=1, max_size=4), min_size=n,
                                         max_size=n))))
    values = [data.draw(st.one_of(st.none(), st.binary(max_size=6))) for _ in keys]
    tags = [data.draw(st.integers(0, 1 << 40)) << 8 | (0 if v is None else 1) for v in values]
    payload = bytearray(_payload(keys, values, tags, []))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(payload) - 1))
        how = data.draw(st.sampled_from(["set", "insert", "delete"]))
        if how == "set":
            payload[at] = data.draw(st.integers(0, 255))
        elif how == "insert":
            payload.insert(at, data.draw(st.integers(0, 255)))
        elif len(payload) > 1:
            del payload[at]
    p = bytes(payload)
    try:
        py = blk.decode_data_block(p, "f", 0, None, None, 2)
    except CorruptionError:
        py = None
    try:
        c = _speedups.block_lists(p, None, None, 2)
    except ValueError:
        c = None
    assert c == py, p.hex()
    try:
        full = blk.decode_full(p, "f", 0, None, None, 2)[:3]
    except CorruptionError:
        full = None
    try:
        c_full = _speedups.block_full(p, None, None)
    except ValueError:
        c_full = None
    assert c_full == full, p.hex()


def test_compression_from_many_threads_at_once():
    """A flush and a compaction compress at once: each thread's zstd is its own."""
    import threading
    payloads = [_payload([b"k%05d" % i for i in range(j, j + 200)], [b"v" * 50] * 200,
                         [257] * 200, []) for j in range(8)]
    errors: list[BaseException] = []

    def work(p: bytes) -> None:
        try:
            for _ in range(300):
                for kind in (compression.ZSTD, compression.LZ4):
                    k, stored = compression.compress(kind, p)
                    assert compression.decompress(k, stored, "f", 0) == p
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(p,)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


@pytest.mark.skipif(_speedups is None or os.name != "posix", reason="the C getter's LZ4")
@pytest.mark.parametrize("lie", [+1, -1, 1 << 20])
def test_the_c_getter_decompresses_lz4_itself_and_refuses_a_lying_length(tmp_path, lie):
    assert _speedups.lz4_direct()  # the lz4 package's LZ4_decompress_safe, found
    path = str(tmp_path / "db")
    db = lsmdb.open(path, auto_compaction=False, block_cache_size_bytes=0)
    items = records(3000)
    for k, v in items:
        db.put(k, v)
    db.flush()
    db.close()
    db = lsmdb.open(path, auto_compaction=False, block_cache_size_bytes=0)
    assert type(db.get).__name__ == "Getter"
    assert all(db.get(k) == v for k, v in items)  # every block decompressed in C
    reader = db._versions.tables["default"].files[0]
    file, i = reader.path, 2
    raw = reader.read_raw(i)
    db.close()
    stored = bytearray(raw[:-DATA_TRAILER_V2.size])
    assert stored[-1:] and raw[-DATA_TRAILER_V2.size] == compression.LZ4
    size = int.from_bytes(stored[:4], "little")
    stored[:4] = (size + lie).to_bytes(4, "little")
    _rewrite_block(file, SSTableReader(file, 1), i, bytes(stored), compression.LZ4)
    db = lsmdb.open(path, auto_compaction=False, block_cache_size_bytes=0)
    key = SSTableReader(file, 1).index_keys[i]
    with pytest.raises(CorruptionError) as exc:
        db.get(key)
    assert exc.value.offset == SSTableReader(file, 1).index_offsets[i]
    db.close()
