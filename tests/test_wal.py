"""The write-ahead log: record framing, torn tails, corruption, and recovery of a database.

Unit tests drive ``lsmdb.wal`` directly (``LogWriter``, ``read_log``,
``read_log_file``); the database-level tests cut a real WAL segment at every
byte offset of its last records and check that ``lsmdb.open`` recovers
exactly the writes whose records are complete.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lsmdb
from lsmdb.coding import WAL_HEADER_SIZE
from lsmdb.wal import LogWriter, read_log, read_log_file

# Payloads without zero bytes, of assorted sizes (the last ones long enough to
# cut in many places).  Zero-free payloads keep "which records survive a
# zero-filled tail" unambiguous.
PAYLOADS = [b"a", b"hello", b"x" * 37, bytes(range(1, 200)), b"tail-record-" * 3, b"z" * 9]


def _write_log(path: str, payloads: list[bytes]) -> bytes:
    w = LogWriter(path)
    try:
        for p in payloads:
            w.add_record(p)
    finally:
        w.close()
    with open(path, "rb") as f:
        return f.read()


def _boundaries(payloads: list[bytes]) -> list[int]:
    """Offsets where each record starts, plus the end of the log."""
    out = [0]
    for p in payloads:
        out.append(out[-1] + WAL_HEADER_SIZE + len(p))
    return out


@pytest.fixture
def log_bytes(tmp_path):
    path = str(tmp_path / "wal-000001.log")
    data = _write_log(path, PAYLOADS)
    return path, data


# --------------------------------------------------------------------------- unit: round trip

@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=300), max_size=20))
def test_records_round_trip(payloads):
    d = tempfile.mkdtemp()
    try:
        path = os.path.join(d, "w.log")
        w = LogWriter(path)
        for p in payloads:
            w.add_record(p)
        size = w.size
        w.close()
        assert size == os.path.getsize(path)
        result = read_log_file(path)
        assert [p for _off, p in result.records] == payloads
        assert [off for off, _p in result.records] == _boundaries(payloads)[:-1]
        assert result.torn is False
        assert result.valid_length == result.file_length == size
        # read_log on the bytes gives the same answer
        with open(path, "rb") as f:
            again = read_log(f.read())
        assert again.records == result.records
    finally:
        shutil.rmtree(d)


def test_writer_appends_to_an_existing_segment(tmp_path):
    path = str(tmp_path / "w.log")
    _write_log(path, [b"one", b"two"])
    w = LogWriter(path)
    assert w.size == os.path.getsize(path)
    w.add_record(b"three", sync=True)
    w.close()
    assert [p for _o, p in read_log_file(path).records] == [b"one", b"two", b"three"]


def test_empty_log_has_no_records():
    result = read_log(b"")
    assert result.records == []
    assert result.torn is False
    assert result.valid_length == 0


def test_empty_payload_round_trips_or_is_refused(tmp_path):
    """LogWriter must not write a record its own reader cannot read back."""
    path = str(tmp_path / "w.log")
    w = LogWriter(path)
    try:
        try:
            w.add_record(b"")
        except ValueError:
            return  # refusing an empty record is fine
        w.add_record(b"after")
    finally:
        w.close()
    assert [p for _o, p in read_log_file(path).records] == [b"", b"after"]


# --------------------------------------------------------------------------- unit: torn tails

def test_truncation_at_every_offset_keeps_exactly_the_complete_records(log_bytes):
    _path, data = log_bytes
    bounds = _boundaries(PAYLOADS)
    assert bounds[-1] == len(data)
    for cut in range(len(data) + 1):
        result = read_log(data[:cut])
        complete = [i for i in range(len(PAYLOADS)) if bounds[i + 1] <= cut]
        assert [p for _o, p in result.records] == [PAYLOADS[i] for i in complete], cut
        assert [o for o, _p in result.records] == [bounds[i] for i in complete], cut
        last_end = bounds[len(complete)]
        assert result.valid_length == last_end, cut
        assert result.torn is (cut != last_end), cut
        assert result.file_length == cut


def test_truncated_file_read_from_disk(log_bytes, tmp_path):
    path, data = log_bytes
    bounds = _boundaries(PAYLOADS)
    cut = bounds[-2] + 5  # in the header of the last record
    with open(path, "r+b") as f:
        f.truncate(cut)
    result = read_log_file(path)
    assert [p for _o, p in result.records] == PAYLOADS[:-1]
    assert result.torn is True
    assert result.valid_length == bounds[-2]
    assert result.file_length == cut


def _flipped(data: bytes, pos: int, mask: int = 0xFF) -> bytes:
    b = bytearray(data)
    b[pos] ^= mask
    return bytes(b)


@pytest.mark.parametrize("index", [0, 1, 2, 3])
def test_flipped_byte_in_a_middle_record_is_corruption(log_bytes, index):
    """Every byte of a record that is followed by more records: CorruptionError at its offset.

    This includes the header (checksum and length field): a damaged length
    must not make the rest of the log look like a torn tail and vanish.
    """
    path, data = log_bytes
    bounds = _boundaries(PAYLOADS)
    start, end = bounds[index], bounds[index + 1]
    failures: list[tuple] = []
    for pos in range(start, end):
        for mask in (0xFF, 0x01):
            bad = _flipped(data, pos, mask)
            try:
                result = read_log(bad, path)
            except lsmdb.CorruptionError as exc:
                if exc.path != path or exc.offset != start:
                    failures.append((pos, mask, f"path={exc.path!r} offset={exc.offset}"))
            else:
                failures.append((pos, mask, f"no error: {len(result.records)} records, "
                                            f"torn={result.torn}"))
    assert not failures, f"record {index} at [{start}, {end}): {failures}"


def test_flipped_byte_in_a_middle_record_read_log_file_names_the_file(log_bytes):
    path, data = log_bytes
    bounds = _boundaries(PAYLOADS)
    with open(path, "wb") as f:
        f.write(_flipped(data, bounds[2] + WAL_HEADER_SIZE + 3))
    with pytest.raises(lsmdb.CorruptionError) as info:
        read_log_file(path)
    assert info.value.path == path
    assert info.value.offset == bounds[2]


def test_flipped_byte_in_the_last_record_drops_it_as_torn(log_bytes):
    """Damage anywhere in the very last record (checksum, length, payload): a torn
    write, dropped -- nothing valid follows it."""
    path, data = log_bytes
    bounds = _boundaries(PAYLOADS)
    start = bounds[-2]
    for pos in range(start, len(data)):
        for mask in (0xFF, 0x01, 0x80):
            result = read_log(_flipped(data, pos, mask), path)
            assert [p for _o, p in result.records] == PAYLOADS[:-1], (pos, mask)
            assert result.torn is True, (pos, mask)
            assert result.valid_length == start, (pos, mask)


@pytest.mark.parametrize("zeros", [1, 3, 7, 8, 9, 16, 100, 4096])
def test_zero_filled_tail_after_complete_records_is_torn(log_bytes, zeros):
    _path, data = log_bytes
    result = read_log(data + bytes(zeros))
    assert [p for _o, p in result.records] == PAYLOADS
    assert result.torn is True
    assert result.valid_length == len(data)
    assert result.file_length == len(data) + zeros


def test_zero_filled_tail_over_partial_records_is_torn(log_bytes):
    """A crash can leave the file's tail zeroed from any byte on (the file length
    was persisted but the last data pages were not).  Every record that is
    still intact is kept; the zeroed rest is a torn tail, not corruption."""
    _path, data = log_bytes
    bounds = _boundaries(PAYLOADS)
    failures: list[tuple] = []
    for cut in range(bounds[-4], len(data)):
        for extra in (0, 64):
            damaged = data[:cut] + bytes(len(data) - cut + extra)
            complete = [i for i in range(len(PAYLOADS)) if bounds[i + 1] <= cut]
            try:
                result = read_log(damaged)
            except lsmdb.CorruptionError as exc:
                failures.append((cut, extra, str(exc)))
                continue
            if [p for _o, p in result.records] != [PAYLOADS[i] for i in complete] \
                    or not result.torn or result.valid_length != bounds[len(complete)]:
                failures.append((cut, extra, len(result.records), result.torn))
    assert not failures, failures[:10] + [f"... {len(failures)} failures in all"]


def test_garbage_after_complete_records_is_corruption(log_bytes):
    """Non-zero bytes that do not form a record, followed by more data: never skipped."""
    _path, data = log_bytes
    bounds = _boundaries(PAYLOADS)
    # Replace record 1's length field with an absurd value and keep the rest.
    bad = bytearray(data)
    bad[bounds[1] + 4:bounds[1] + 8] = (0xFFFFFFFF).to_bytes(4, "little")
    with pytest.raises(lsmdb.CorruptionError) as info:
        read_log(bytes(bad), "p")
    assert info.value.offset == bounds[1]


# --------------------------------------------------------------------------- database level

Op = tuple[str, bytes, "bytes | None"]  # (table, key, value or None for a delete)

def _wal_files(path: str) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.startswith("wal-") and n.endswith(".log"))


def _state(db, tables=("default", "t2")) -> dict[str, list[tuple[bytes, bytes]]]:
    return {t: list(db.table(t).scan()) for t in tables}


def _apply(model: dict[str, dict[bytes, bytes]], ops) -> None:
    for table, key, value in ops:
        if value is None:
            model[table].pop(key, None)
        else:
            model[table][key] = value


def _expected(writes, n: int) -> dict[str, list[tuple[bytes, bytes]]]:
    model: dict[str, dict[bytes, bytes]] = {"default": {}, "t2": {}}
    for ops in writes[:n]:
        _apply(model, ops)
    return {t: sorted(m.items()) for t, m in model.items()}


def _make_db(path: str):
    """A database whose only WAL segment holds one record per entry of ``writes``."""
    writes: list[list[Op]] = []
    with lsmdb.open(path, sync=True) as db:
        t2 = db.create_table("t2")
        for i in range(20):
            ops: list[Op] = [("default", b"k%02d" % i, b"v%02d" % i)]
            db.put(ops[0][1], ops[0][2], sync=True)
            writes.append(ops)
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
def wal_db(tmp_path):
    path = str(tmp_path / "db")
    writes = _make_db(path)
    wals = [n for n in _wal_files(path) if os.path.getsize(os.path.join(path, n))]
    assert len(wals) == 1, os.listdir(path)
    wal = wals[0]
    result = read_log_file(os.path.join(path, wal))
    assert not result.torn
    assert len(result.records) == len(writes)
    return path, wal, writes, result


def test_reopen_recovers_every_write(wal_db):
    path, _wal, writes, _result = wal_db
    with lsmdb.open(path) as db:
        assert _state(db) == _expected(writes, len(writes))


def test_truncated_wal_recovers_exactly_the_complete_records(wal_db, tmp_path):
    path, wal, writes, result = wal_db
    offsets = [off for off, _p in result.records]
    ends = offsets[1:] + [result.file_length]
    failures: list[tuple] = []
    for cut in range(offsets[-6], result.file_length + 1):
        copy = str(tmp_path / f"cut-{cut}")
        shutil.copytree(path, copy)
        os.truncate(os.path.join(copy, wal), cut)
        complete = sum(1 for e in ends if e <= cut)
        try:
            with lsmdb.open(copy) as db:
                got = _state(db)
                # point reads agree with the scan, for every key ever written
                keys = {(t, k) for ops in writes for t, k, _v in ops}
                exp = _expected(writes, complete)
                for t, k in keys:
                    want = dict(exp[t]).get(k)
                    if db.table(t).get(k) != want:
                        failures.append((cut, "get", t, k))
        except Exception as exc:  # report every offset, not just the first
            failures.append((cut, repr(exc)))
        else:
            if got != exp:
                failures.append((cut, complete, "state differs"))
        shutil.rmtree(copy)
    assert not failures, failures[:10]


def test_zeroed_wal_tail_recovers_exactly_the_intact_records(wal_db, tmp_path):
    """A machine crash can leave the segment's tail zero-filled from any byte on
    (its length reached the disk, its last pages did not): open must keep every
    intact record and drop the rest, not refuse to open."""
    path, wal, writes, result = wal_db
    offsets = [off for off, _p in result.records]
    ends = offsets[1:] + [result.file_length]
    failures: list[tuple] = []
    for cut in range(offsets[-3], result.file_length):
        copy = str(tmp_path / f"zero-{cut}")
        shutil.copytree(path, copy)
        seg = os.path.join(copy, wal)
        with open(seg, "r+b") as f:
            f.seek(cut)
            f.write(bytes(result.file_length - cut + 512))
        complete = sum(1 for e in ends if e <= cut)
        try:
            with lsmdb.open(copy) as db:
                got = _state(db)
        except Exception as exc:
            failures.append((cut, repr(exc)))
        else:
            if got != _expected(writes, complete):
                failures.append((cut, complete, "state differs"))
        shutil.rmtree(copy)
    assert not failures, failures[:10]


def test_torn_tail_is_truncated_and_the_database_keeps_working(wal_db):
    path, wal, writes, result = wal_db
    offsets = [off for off, _p in result.records]
    cut = offsets[-1] + WAL_HEADER_SIZE + 2  # mid-way through the last record
    os.truncate(os.path.join(path, wal), cut)
    expected = _expected(writes, len(writes) - 1)
    with lsmdb.open(path) as db:
        assert _state(db) == expected
        # the torn bytes are gone from the segment
        assert os.path.getsize(os.path.join(path, wal)) == offsets[-1]
        db.put(b"after-1", b"a1")
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
    # every WAL segment still present reads cleanly
    for name in _wal_files(path):
        assert read_log_file(os.path.join(path, name)).torn is False


@pytest.mark.parametrize("where", ["crc", "length-low", "length-mid", "payload"])
def test_corrupt_middle_record_refuses_to_open_and_keeps_the_wal(wal_db, where):
    """A damaged record followed by good ones is corruption: open fails, nothing is cut."""
    path, wal, _writes, result = wal_db
    offsets = [off for off, _p in result.records]
    victim = offsets[len(offsets) // 2]
    pos = victim + {"crc": 1, "length-low": 4, "length-mid": 5,
                    "payload": WAL_HEADER_SIZE + 2}[where]
    wal_path = os.path.join(path, wal)
    with open(wal_path, "rb") as f:
        data = f.read()
    damaged = _flipped(data, pos)
    with open(wal_path, "wb") as f:
        f.write(damaged)
    with pytest.raises(lsmdb.CorruptionError) as info:
        lsmdb.open(path)
    assert info.value.path == wal_path
    assert info.value.offset == victim
    with open(wal_path, "rb") as f:
        assert f.read() == damaged, "the WAL must not be truncated or rewritten"


def test_reopening_does_not_pile_up_wal_segments(tmp_path):
    """Each read-write open starts a segment; the ones left with nothing
    unflushed (an open without writes leaves an empty one) go at the next
    open, while a segment still holding memtable records stays."""
    path = str(tmp_path / "db")
    with lsmdb.open(path) as db:
        db.put(b"a", b"1")                      # stays in the memtable (and its segment)
    for _ in range(6):
        with lsmdb.open(path) as db:
            assert db.get(b"a") == b"1"
    # the segment holding b"a" and the one the last open started
    assert len(_wal_files(path)) == 2
    with lsmdb.open(path) as db:
        db.flush()                              # b"a" is now in an SSTable
    with lsmdb.open(path) as db:
        assert db.get(b"a") == b"1"
    assert len(_wal_files(path)) == 1           # only the segment of the open that just closed
    for _ in range(3):
        with lsmdb.open(path, read_only=True) as db:  # a reader deletes nothing
            assert db.get(b"a") == b"1"
    assert len(_wal_files(path)) == 1
