"""The write-ahead log: block framing, torn tails, corruption, and recovery of a database.

Unit tests drive ``lsmdb.wal`` directly (``LogWriter``, ``read_segment``,
``read_segment_file``, ``read_legacy_log``).  Database-level tests take a
database as a crash leaves it (the directory copied while the database is
open: its live segment never sealed), cut its live segment at every byte
offset of its last records and check that ``lsmdb.open`` recovers exactly
the writes whose records are complete; and damage the segments of a
database closed cleanly, whose every byte is accounted for by the manifest.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lsmdb
import lsmdb.wal
from lsmdb.manifest import Manifest
from lsmdb.repair import repair_database
from lsmdb.verify import verify_database
from lsmdb.wal import (
    BLOCK_SIZE_BYTES,
    FRAGMENT_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    LogWriter,
    read_legacy_log,
    read_segment,
    read_segment_file,
    salvage_segment,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NUMBER = 7
# Payloads without zero bytes, of assorted sizes.  Zero-free payloads keep
# "which records survive a zero-filled tail" unambiguous.
PAYLOADS = [b"a", b"hello", b"x" * 37, bytes(range(1, 200)), b"tail-record-" * 3, b"z" * 9]


def _write(path: str, payloads: list[bytes], number: int = NUMBER) -> tuple[bytes, list[int]]:
    """The segment's bytes and, per record, the offset where it ends."""
    w = LogWriter(path, number)
    ends = []
    try:
        for p in payloads:
            w.add_record(p)
            ends.append(w.size)
    finally:
        w.close()
    with open(path, "rb") as f:
        return f.read(), ends


@pytest.fixture
def small(tmp_path):
    path = str(tmp_path / "wal-000007.log")
    data, ends = _write(path, PAYLOADS)
    return path, data, ends


def _payloads(result) -> list[bytes]:
    return [p for _o, p in result.records]


# --------------------------------------------------------------------------- round trip

@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.binary(min_size=1, max_size=300),
                          st.integers(1, 100_000).map(lambda n: b"\x5a" * n)), max_size=12))
def test_records_round_trip_in_blocks(payloads):
    d = tempfile.mkdtemp()
    try:
        path = os.path.join(d, "wal-000007.log")
        data, ends = _write(path, payloads)
        assert len(data) == (ends[-1] if ends else SEGMENT_HEADER_SIZE)
        for closed_size in (None, len(data)):
            result = read_segment(data, NUMBER, path, closed_size)
            assert _payloads(result) == payloads
            assert result.torn is False
            assert result.valid_length == len(data)
        assert read_segment_file(path, NUMBER).records == read_segment(data, NUMBER).records
    finally:
        shutil.rmtree(d)


def test_no_fragment_crosses_a_block_boundary_and_block_starts_are_headers(tmp_path):
    """Every block start holds a fragment header the writer wrote (or padding
    zeros end the block before it): the property that makes a torn tail
    recognisable whatever the payloads hold."""
    rng = random.Random(5)
    payloads = [bytes(rng.randrange(1, 256) for _ in range(rng.choice([1, 40, 5000, 40000])))
                for _ in range(30)]
    data, _ends = _write(str(tmp_path / "wal-000007.log"), payloads)
    assert len(data) > 4 * BLOCK_SIZE_BYTES
    off = SEGMENT_HEADER_SIZE
    starts = set()
    while off < len(data):
        left = BLOCK_SIZE_BYTES - off % BLOCK_SIZE_BYTES
        if left < FRAGMENT_HEADER_SIZE:
            assert data[off:off + left] == bytes(left)
            off += left
            continue
        starts.add(off)
        length = int.from_bytes(data[off + 4:off + 6], "little")
        assert off % BLOCK_SIZE_BYTES + FRAGMENT_HEADER_SIZE + length <= BLOCK_SIZE_BYTES
        off += FRAGMENT_HEADER_SIZE + length
    assert all(b in starts for b in range(BLOCK_SIZE_BYTES, len(data), BLOCK_SIZE_BYTES)
               if len(data) - b >= FRAGMENT_HEADER_SIZE)


def test_a_record_filling_a_block_exactly_and_padding_at_a_block_end(tmp_path):
    first = BLOCK_SIZE_BYTES - SEGMENT_HEADER_SIZE - FRAGMENT_HEADER_SIZE
    for payloads in ([b"a" * first, b"next"],           # block 0 filled to its last byte
                     [b"a" * (first - 3), b"b" * 10],   # 3 bytes left: padding, then block 1
                     [b"a" * (first - 7), b"c" * 10]):  # exactly a header's room: a FIRST of 0
        path = str(tmp_path / f"wal-{len(payloads[0]):06d}.log")
        data, _ends = _write(path, payloads, 3)
        assert _payloads(read_segment(data, 3, path, len(data))) == payloads


def test_empty_payload_is_refused(tmp_path):
    w = LogWriter(str(tmp_path / "wal-000001.log"), 1)
    with pytest.raises(ValueError):
        w.add_record(b"")
    w.close()


def test_a_new_segment_is_never_written_through_an_existing_name(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"precious")
    link = tmp_path / "wal-000001.log"
    link.symlink_to(target)
    with pytest.raises(FileExistsError):
        LogWriter(str(link), 1)
    assert target.read_bytes() == b"precious"


# --------------------------------------------------------------------------- live segment: torn

def test_truncation_at_every_offset_keeps_exactly_the_complete_records(small):
    path, data, ends = small
    for cut in range(len(data) + 1):
        result = read_segment(data[:cut], NUMBER, path)
        complete = sum(1 for e in ends if e <= cut)
        assert _payloads(result) == PAYLOADS[:complete], cut
        valid = ends[complete - 1] if complete else (SEGMENT_HEADER_SIZE if cut >= 16 else 0)
        assert result.valid_length == valid, cut
        assert result.torn is (cut != valid), cut


def test_zero_filled_tail_from_any_offset_keeps_exactly_the_intact_records(small):
    """A crash can leave the tail zeroed from any byte on (the file's length reached
    the disk, its last pages did not): every intact record is kept, the rest dropped.
    Zeros right from a record's end (or the header's) are the segment's clean end --
    what a writer's space allocated ahead reads as -- and not a torn tail."""
    path, data, ends = small
    for cut in range(len(data)):
        for extra in (0, 64, BLOCK_SIZE_BYTES):
            damaged = data[:cut] + bytes(len(data) - cut + extra)
            result = read_segment(damaged, NUMBER, path)
            complete = sum(1 for e in ends if e <= cut)
            assert _payloads(result) == PAYLOADS[:complete], (cut, extra)
            valid = ends[complete - 1] if complete else 0
            assert result.valid_length in (valid, SEGMENT_HEADER_SIZE if not complete else valid)
            # torn: something but zeros after the last whole record
            assert result.torn is any(damaged[result.valid_length:]), (cut, extra)
            if cut in (SEGMENT_HEADER_SIZE, *ends):
                assert not result.torn


def test_records_over_several_blocks_cut_anywhere_near_the_boundaries(tmp_path):
    payloads = [b"\x01" * 50_000, b"\x02" * 20, b"\x03" * 70_000, b"\x04" * 9]
    path = str(tmp_path / "wal-000007.log")
    data, ends = _write(path, payloads)
    cuts = {c for b in range(0, len(data) + 1, BLOCK_SIZE_BYTES)
            for c in range(max(0, b - 12), min(len(data), b + 12) + 1)} | set(ends)
    for cut in sorted(cuts):
        for zeros in (False, True):
            damaged = data[:cut] + (bytes(len(data) - cut) if zeros else b"")
            result = read_segment(damaged, NUMBER, path)
            complete = sum(1 for e in ends if e <= cut)
            assert _payloads(result) == payloads[:complete], (cut, zeros)


def test_a_value_holding_a_wal_segment_never_turns_a_torn_tail_into_corruption(tmp_path):
    """A payload may hold anything -- here a whole WAL segment of the same number,
    every byte of it a valid record where it lies.  Cut the log anywhere inside
    that payload (and zero-fill the rest): the result is a torn tail with exactly
    the records before it, never a CorruptionError."""
    inner, _ = _write(str(tmp_path / "wal-000007.inner"), [b"i%d" % i * 50 for i in range(800)])
    assert len(inner) > 2 * BLOCK_SIZE_BYTES
    path = str(tmp_path / "wal-000007.log")
    payloads = [b"before", inner, b"after"]
    data, ends = _write(path, payloads)
    rng = random.Random(1)
    cuts = sorted({*range(ends[0], ends[0] + 200), *range(ends[1] - 200, ends[1]),
                   *rng.sample(range(ends[0], ends[1]), 400),
                   *range(BLOCK_SIZE_BYTES - 20, BLOCK_SIZE_BYTES + 40)})
    for cut in cuts:
        for zeros in (False, True):
            damaged = data[:cut] + (bytes(len(data) - cut) if zeros else b"")
            result = read_segment(damaged, NUMBER, path)
            assert _payloads(result) == payloads[:1], (cut, zeros)
            # zeros right from the first record's end are the clean end
            assert result.torn is any(damaged[ends[0]:]) and result.valid_length == ends[0]


# --------------------------------------------------------------------------- corruption

def _flipped(data: bytes, pos: int, mask: int = 0xFF) -> bytes:
    b = bytearray(data)
    b[pos] ^= mask
    return bytes(b)


def test_any_flipped_byte_of_a_closed_segment_is_corruption_at_its_fragment(small):
    path, data, ends = small
    starts = [SEGMENT_HEADER_SIZE] + ends[:-1]
    for pos in range(len(data)):
        for mask in (0xFF, 0x01):
            with pytest.raises(lsmdb.CorruptionError) as info:
                read_segment(_flipped(data, pos, mask), NUMBER, path, len(data))
            assert info.value.path == path
            want = 0 if pos < SEGMENT_HEADER_SIZE else max(s for s in starts if s <= pos)
            assert info.value.offset == want, (pos, mask)


def test_a_closed_segment_cut_short_or_zero_filled_is_corruption(small):
    path, data, _ends = small
    for cut in range(len(data)):
        with pytest.raises(lsmdb.CorruptionError):
            read_segment(data[:cut], NUMBER, path, len(data))
        with pytest.raises(lsmdb.CorruptionError):
            read_segment(data[:cut] + bytes(len(data) - cut), NUMBER, path, len(data))


def test_bytes_past_a_closed_segments_size_are_ignored(small):
    """A failed append may leave part of a record past the size the manifest records."""
    path, data, _ends = small
    result = read_segment(data + b"\x13partial record", NUMBER, path, len(data))
    assert _payloads(result) == PAYLOADS and not result.torn


def test_damage_in_the_live_segment_followed_by_a_later_block_is_corruption(tmp_path):
    payloads = [b"\x01" * 100, b"\x02" * 100, b"\x03" * 40_000, b"\x04" * 100]
    path = str(tmp_path / "wal-000007.log")
    data, ends = _write(path, payloads)
    for pos in (ends[0] + 2, ends[0] + 30, SEGMENT_HEADER_SIZE + 1):
        with pytest.raises(lsmdb.CorruptionError) as info:
            read_segment(_flipped(data, pos), NUMBER, path)
        assert info.value.offset == max(o for o in [SEGMENT_HEADER_SIZE, *ends] if o <= pos)


def test_a_segment_under_another_number_is_corruption(small):
    """A segment copied or renamed over another: its header, and every
    fragment's checksum, name another number."""
    path, data, _ends = small
    for closed_size in (None, len(data)):
        with pytest.raises(lsmdb.CorruptionError, match="names segment 7"):
            read_segment(data, NUMBER + 1, path, closed_size)


# --------------------------------------------------------------------------- legacy format

def test_segments_without_a_header_are_read_by_the_legacy_rules():
    # crc32 u32 | length u32 | payload, back to back (the format before blocks).
    rec = bytes.fromhex("58a24db20b000000" "9201919301c4016bc40176")
    two = rec + bytes.fromhex("61f0b5980c000000" "9202919301c404676f6e65c0")
    result = read_legacy_log(two)
    assert len(result.records) == 2 and not result.torn
    assert _payloads(read_legacy_log(two[:-3])) == _payloads(result)[:1]
    with pytest.raises(lsmdb.CorruptionError):
        read_legacy_log(_flipped(two, 9) + two[len(rec):])


# --------------------------------------------------------------------------- database level

Op = tuple[str, bytes, "bytes | None"]  # (table, key, value or None for a delete)


def _wal_files(path: str) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.startswith("wal-") and n.endswith(".log"))


def _state(db, tables=("default", "t2")) -> dict[str, list[tuple[bytes, bytes]]]:
    return {t: list(db.table(t).scan()) for t in tables}


def _expected(writes, n: int) -> dict[str, list[tuple[bytes, bytes]]]:
    model: dict[str, dict[bytes, bytes]] = {"default": {}, "t2": {}}
    for ops in writes[:n]:
        for table, key, value in ops:
            if value is None:
                model[table].pop(key, None)
            else:
                model[table][key] = value
    return {t: sorted(m.items()) for t, m in model.items()}


def _write_all(db) -> list[list[Op]]:
    writes: list[list[Op]] = []
    t2 = db.create_table("t2")
    for i in range(20):
        db.put(b"k%02d" % i, b"v%02d" % i, sync=True)
        writes.append([("default", b"k%02d" % i, b"v%02d" % i)])
    # The last records: an overwrite, a delete, a batch across tables with a
    # put and a delete, a put to another table, the empty key, a delete.
    db.put(b"k03", b"v03-new", sync=True)
    writes.append([("default", b"k03", b"v03-new")])
    db.delete(b"k05", sync=True)
    writes.append([("default", b"k05", None)])
    with db.batch(sync=True) as b:
        b.put(b"k20", b"v20")
        b.put(b"x", b"in-t2", table="t2")
        b.delete(b"k07")
        b.put(b"y", b"also-t2", table="t2")
    writes.append([("default", b"k20", b"v20"), ("t2", b"x", b"in-t2"),
                   ("default", b"k07", None), ("t2", b"y", b"also-t2")])
    t2.put(b"z", b"v" * 50, sync=True)
    writes.append([("t2", b"z", b"v" * 50)])
    db.put(b"", b"empty-key", sync=True)
    writes.append([("default", b"", b"empty-key")])
    db.delete(b"k00", sync=True)
    writes.append([("default", b"k00", None)])
    return writes


@pytest.fixture
def crashed_db(tmp_path):
    """A database as a crash leaves it: copied while open, its live segment
    holding one record per entry of ``writes``."""
    live, path = str(tmp_path / "live"), str(tmp_path / "db")
    with lsmdb.open(live, sync=True) as db:
        writes = _write_all(db)
        shutil.copytree(live, path)
    manifest = Manifest.read(os.path.join(path, "MANIFEST"))
    assert manifest.wal is not None and manifest.wal.live is not None
    number = manifest.wal.live
    wal = os.path.basename(lsmdb.logset.LogSet(path).path(number))
    result = read_segment_file(os.path.join(path, wal), number)
    assert not result.torn and len(result.records) == len(writes)
    return path, wal, writes, result


def test_reopen_recovers_every_write(crashed_db):
    path, _wal, writes, _result = crashed_db
    with lsmdb.open(path) as db:
        assert _state(db) == _expected(writes, len(writes))


def test_truncated_live_segment_recovers_exactly_the_complete_records(crashed_db, tmp_path):
    path, wal, writes, result = crashed_db
    offsets = [off for off, _p in result.records]
    ends = offsets[1:] + [result.valid_length]
    keys = {(t, k) for ops in writes for t, k, _v in ops}
    failures: list[tuple] = []
    # (past valid_length the file holds the zeros its writer allocated ahead)
    for cut in range(offsets[-6], result.valid_length + 1):
        for zeros in (False, True):
            copy = str(tmp_path / f"cut-{cut}-{zeros}")
            shutil.copytree(path, copy)
            seg = os.path.join(copy, wal)
            os.truncate(seg, cut)
            if zeros:
                os.truncate(seg, result.valid_length + 100)
            complete = sum(1 for e in ends if e <= cut)
            exp = _expected(writes, complete)
            try:
                with lsmdb.open(copy) as db:
                    if _state(db) != exp:
                        failures.append((cut, zeros, complete, "state differs"))
                    for t, k in keys:  # point reads agree with the scan
                        if db.table(t).get(k) != dict(exp[t]).get(k):
                            failures.append((cut, zeros, "get", t, k))
                with lsmdb.open(copy) as db:  # the recovered state is itself durable
                    if _state(db) != exp:
                        failures.append((cut, zeros, "second open differs"))
                if [p for p in verify_database(copy) if p.severity == "error"]:
                    failures.append((cut, zeros, "verify"))
            except Exception as exc:  # report every offset, not just the first
                failures.append((cut, zeros, repr(exc)))
            shutil.rmtree(copy)
    assert not failures, failures[:10]


def test_a_torn_tail_is_reported_by_verify_and_the_database_keeps_working(crashed_db, caplog):
    path, wal, writes, result = crashed_db
    offsets = [off for off, _p in result.records]
    cut = offsets[-1] + FRAGMENT_HEADER_SIZE + 2  # mid-way through the last record
    os.truncate(os.path.join(path, wal), cut)
    torn = [p for p in verify_database(path) if p.severity == "warning" and "torn" in p.message]
    assert [p.offset for p in torn] == [offsets[-1]]
    expected = _expected(writes, len(writes) - 1)
    with caplog.at_level("WARNING", logger="lsmdb"), lsmdb.open(path) as db:
        assert _state(db) == expected
        db.put(b"after-1", b"a1")
    said = [r.getMessage() for r in caplog.records if "torn" in r.getMessage()]
    assert len(said) == 1 and "cut short by a crash" in said[0] and "never" not in said[0]
    with lsmdb.open(path) as db:
        db.table("t2").put(b"after-2", b"a2")
    expected["default"] = sorted(expected["default"] + [(b"after-1", b"a1")])
    expected["t2"] = sorted(expected["t2"] + [(b"after-2", b"a2")])
    with lsmdb.open(path) as db:
        assert _state(db) == expected
        db.delete(b"after-1")
        db.flush()
    expected["default"].remove((b"after-1", b"a1"))
    with lsmdb.open(path) as db:
        assert _state(db) == expected
    assert verify_database(path) == []


@pytest.fixture
def closed_db(tmp_path):
    """A database closed cleanly: every segment sealed, its size in the manifest."""
    path = str(tmp_path / "db")
    with lsmdb.open(path, sync=True) as db:
        writes = _write_all(db)
    manifest = Manifest.read(os.path.join(path, "MANIFEST"))
    assert manifest.wal is not None and manifest.wal.live is None and not manifest.wal.unsynced
    (number, size, _fmt), = manifest.wal.closed
    wal = os.path.join(path, os.path.basename(lsmdb.logset.LogSet(path).path(number)))
    assert os.path.getsize(wal) == size
    return path, wal, writes, read_segment_file(wal, number, size)


@pytest.mark.parametrize("where", ["crc", "length", "type", "payload"])
def test_a_damaged_record_of_a_closed_segment_refuses_to_open_and_keeps_it(closed_db, where):
    """Damage anywhere in a sealed segment is corruption -- even in its last record."""
    path, wal, _writes, result = closed_db
    offsets = [off for off, _p in result.records]
    for victim in (offsets[len(offsets) // 2], offsets[-1]):
        pos = victim + {"crc": 1, "length": 4, "type": 6, "payload": FRAGMENT_HEADER_SIZE}[where]
        with open(wal, "rb") as f:
            data = f.read()
        damaged = _flipped(data, pos)
        with open(wal, "wb") as f:
            f.write(damaged)
        for read_only in (False, True):
            with pytest.raises(lsmdb.CorruptionError) as info:
                lsmdb.open(path, read_only=read_only)
            assert info.value.path == wal
            assert info.value.offset == victim
        with open(wal, "rb") as f:
            assert f.read() == damaged, "the WAL must not be truncated or rewritten"
        assert any(p.severity == "error" and p.path == wal for p in verify_database(path))
        with open(wal, "wb") as f:
            f.write(data)


@pytest.mark.parametrize("damage", ["deleted", "cut short", "zero-filled", "emptied"])
def test_a_closed_segment_lost_behind_the_engines_back_is_corruption(closed_db, damage):
    """Without the manifest's record, these would reopen with older values:
    deleted keys would come back."""
    path, wal, _writes, result = closed_db
    if damage == "deleted":
        os.unlink(wal)
    elif damage == "cut short":
        os.truncate(wal, result.records[-2][0])
    elif damage == "zero-filled":
        size = os.path.getsize(wal)
        with open(wal, "r+b") as f:
            f.seek(result.records[-3][0])
            f.write(bytes(size - result.records[-3][0]))
    else:
        os.truncate(wal, 0)
    for read_only in (False, True):
        with pytest.raises(lsmdb.CorruptionError) as info:
            lsmdb.open(path, read_only=read_only)
        assert info.value.path == wal
    errors = [p for p in verify_database(path) if p.severity == "error"]
    assert [p.path for p in errors] == [wal]


def test_reopening_does_not_pile_up_wal_segments(tmp_path):
    """Each read-write open starts a segment; close seals it, and one holding
    nothing a memtable still needs goes at the next manifest switch."""
    path = str(tmp_path / "db")
    with lsmdb.open(path) as db:
        db.put(b"a", b"1")                      # stays in the memtable (and its segment)
    for _ in range(6):
        with lsmdb.open(path) as db:
            assert db.get(b"a") == b"1"
    assert len(_wal_files(path)) == 1           # only the segment holding b"a"
    with lsmdb.open(path) as db:
        db.flush()                              # b"a" is now in an SSTable
    assert _wal_files(path) == []
    with lsmdb.open(path) as db:
        assert db.get(b"a") == b"1"
    assert _wal_files(path) == []
    for _ in range(3):
        with lsmdb.open(path, read_only=True) as db:  # a reader deletes nothing
            assert db.get(b"a") == b"1"
    assert verify_database(path) == []


def test_a_torn_write_of_a_value_holding_wal_bytes_still_opens(tmp_path):
    """A value that is itself a WAL segment (say, a backup of another lsmdb
    database's log) torn by a crash: the database opens with every write
    before it, whatever offset the tear is at."""
    other = str(tmp_path / "other")
    with lsmdb.open(other) as db:
        for i in range(300):
            db.put(b"o%04d" % i, b"v" * 200)
        shutil.copytree(other, str(tmp_path / "other-open"))
    backup = b"".join(open(os.path.join(tmp_path, "other-open", n), "rb").read()
                      for n in _wal_files(str(tmp_path / "other-open")))
    assert len(backup) > BLOCK_SIZE_BYTES
    live, path = str(tmp_path / "live"), str(tmp_path / "db")
    with lsmdb.open(live) as db:
        db.put(b"first", b"1", sync=True)
        db.put(b"backup", backup)
        shutil.copytree(live, path)
    manifest = Manifest.read(os.path.join(path, "MANIFEST"))
    assert manifest.wal is not None and manifest.wal.live is not None
    seg = os.path.join(path, lsmdb.files.wal_name(manifest.wal.live))
    result = read_segment_file(seg, manifest.wal.live)
    start, end = result.records[-1][0], result.valid_length
    rng = random.Random(3)
    for cut in sorted({start + 1, start + 9, end - 1, *rng.sample(range(start, end), 25)}):
        copy = str(tmp_path / f"cut-{cut}")
        shutil.copytree(path, copy)
        os.truncate(os.path.join(copy, os.path.basename(seg)), cut)
        with lsmdb.open(copy) as db:
            assert db.get(b"first") == b"1" and db.get(b"backup") is None, cut
        shutil.rmtree(copy)


# --------------------------------------------------------------- a live segment read while written

def test_a_live_segment_read_while_its_writer_fills_it_is_read_again(tmp_path, monkeypatch):
    """A read racing the writer can return a page it had not yet filled (zeros)
    before a later one it filled since: damage followed by valid records.  The
    live segment is read again; a defect that stays where it is, is corruption."""
    payloads = [b"r%05d" % i * 40 for i in range(800)]
    path = str(tmp_path / "wal-000007.log")
    data, ends = _write(path, payloads)
    assert len(data) > 2 * BLOCK_SIZE_BYTES
    gap = BLOCK_SIZE_BYTES // 2
    racy = data[:gap] + bytes(4096) + data[gap + 4096:]  # one page caught unfilled
    with pytest.raises(lsmdb.CorruptionError, match="followed by valid records"):
        read_segment(racy, NUMBER, path)
    reads = []

    def read_file(p: str) -> bytes:
        reads.append(p)
        return racy if len(reads) == 1 else data

    monkeypatch.setattr(lsmdb.wal, "read_file", read_file)
    result = read_segment_file(path, NUMBER)
    assert len(reads) == 2 and _payloads(result) == payloads and not result.torn
    reads.clear()
    monkeypatch.setattr(lsmdb.wal, "read_file", lambda p: reads.append(p) or racy)
    with pytest.raises(lsmdb.CorruptionError) as info:   # it stays: damage
        read_segment_file(path, NUMBER)
    assert len(reads) == 2 and info.value.path == path
    with pytest.raises(lsmdb.CorruptionError):             # a closed segment: read once
        read_segment_file(path, NUMBER, len(data))


def test_salvage_takes_zeros_after_the_last_record_for_the_end(tmp_path):
    """lsmdb repair's reading: the space a writer allocated ahead is no damage."""
    path = str(tmp_path / "wal-000007.log")
    data, ends = _write(path, PAYLOADS)
    records, damaged = salvage_segment(data + bytes(70_000), NUMBER)
    assert [p for _o, p in records] == PAYLOADS and damaged == []
    torn = data[:ends[-1] - 3] + bytes(70_000)            # a cut record, then zeros
    records, damaged = salvage_segment(torn, NUMBER)
    assert [p for _o, p in records] == PAYLOADS[:-1] and damaged == [(ends[-2], len(torn))]


def test_repair_after_a_kill_keeps_the_live_segment(tmp_path):
    """A killed writer leaves its live segment with space allocated ahead:
    repair reads every record and sets nothing aside."""
    path = str(tmp_path / "db")
    code = ("import lsmdb, os, sys\n"
            "db = lsmdb.open(sys.argv[1])\n"
            "for i in range(100): db.put(b'k%03d' % i, b'v' * 50)\n"
            "os._exit(0)\n")
    subprocess.run([sys.executable, "-c", code, path], check=True,
                   env={**os.environ, "PYTHONPATH": ROOT})
    report = repair_database(path)
    assert not os.path.exists(os.path.join(path, "lost")) or not os.listdir(
        os.path.join(path, "lost")), report
    with lsmdb.open(path) as db:
        assert all(db.get(b"k%03d" % i) == b"v" * 50 for i in range(100))
