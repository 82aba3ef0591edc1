"""Snapshots (db.snapshot()) and seek() on scans: a view as of one moment, checked
against a model through writes, flushes, compactions, drop_table and both merges."""

from __future__ import annotations

import os
import random
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lsmdb
import lsmdb.merge
import lsmdb.readpath


@pytest.fixture(params=["c", "python"])
def merge_impl(request, monkeypatch):
    """The C merge and getter, or their Python twins."""
    if request.param == "python":
        monkeypatch.setattr(lsmdb.merge, "USE_SPEEDUPS", False)
        monkeypatch.setattr(lsmdb.readpath, "USE_C_GETTER", False)
    elif not lsmdb.merge.USE_SPEEDUPS:
        pytest.skip("built without the C speedups")
    return request.param


def sst_count(path: str) -> int:
    return sum(n.endswith(".sst") for n in os.listdir(path))


def check(snap: lsmdb.Snapshot, model: dict[str, dict[bytes, bytes]], probe: list[bytes]) -> None:
    for table, want in model.items():
        assert dict(snap.scan(table=table)) == want
        assert list(snap.scan(table=table, reverse=True)) == sorted(want.items(), reverse=True)
        for k in probe:
            assert snap.get(k, table=table) == want.get(k)
        assert snap.get_many(probe, table=table) == [want.get(k) for k in probe]
    assert list(snap) == sorted(model["default"])
    assert len(snap) == len(model["default"])


def test_a_snapshot_keeps_its_view_through_writes_flushes_compactions_and_drops(tmp_path,
                                                                              merge_impl):
    path = str(tmp_path / "db")
    db = lsmdb.open(path, auto_compaction=False)
    db.create_table("t", memtable_size_bytes=16 * 1024)
    rng = random.Random(3)
    model: dict[str, dict[bytes, bytes]] = {"default": {}, "t": {}}
    keys = [b"k%04d" % i for i in range(600)]

    def write(n: int) -> None:
        for _ in range(n):
            table = rng.choice(["default", "t"])
            k = rng.choice(keys)
            if rng.random() < 0.2:
                db.table(table).delete(k)
                model[table].pop(k, None)
            else:
                v = b"%d" % rng.randrange(10**9)
                db.table(table).put(k, v)
                model[table][k] = v

    write(2000)
    db.flush()
    write(800)  # some in the memtables, some flushed by the small memtable of "t"
    frozen = {t: dict(m) for t, m in model.items()}
    snaps = [db.snapshot()]
    getter = snaps[0]._getter(snaps[0]._table(None))
    assert (type(getter).__name__ == "Getter") == (merge_impl == "c")
    probe = keys[::7] + [b"absent"]
    check(snaps[0], frozen, probe)
    with db.batch() as b:  # a batch over both tables, after the snapshot
        for k in keys[:50]:
            b.put(k, b"batched")
            b.put(k, b"batched", table="t")
            model["default"][k] = model["t"][k] = b"batched"
    write(1500)
    check(snaps[0], frozen, probe)
    db.flush()
    db.compact()
    check(snaps[0], frozen, probe)
    second = {t: dict(m) for t, m in model.items()}
    snaps.append(db.snapshot())
    db.alter_table("t", bloom_filter_fp_chance=0.5)
    write(1000)
    db.drop_table("t")
    db.compact()
    check(snaps[0], frozen, probe)
    check(snaps[1], second, probe)
    with pytest.raises(lsmdb.NoSuchTableError):
        db.table("t")
    db.create_table("u")
    with pytest.raises(lsmdb.NoSuchTableError):
        snaps[1].get(b"k", table="u")  # made after the snapshot
    assert snaps[0].tables() == ["default", "t"]
    for s in snaps:
        s.close()
    # every file the snapshots held has left the disk; the live data is what the model says
    assert sst_count(path) == len(db.sstables())
    assert dict(db.scan()) == model["default"]
    db.close()


def test_closing_a_snapshot_releases_its_files_and_its_undo_maps(tmp_path):
    path = str(tmp_path / "db")
    db = lsmdb.open(path, auto_compaction=False)
    for i in range(500):
        db.put(b"k%03d" % i, b"v")
    db.flush()
    for i in range(500):
        db.put(b"k%03d" % i, b"w")
    db.flush()
    state = db._versions.tables["default"]
    with db.snapshot() as snap:
        assert len(state.mem.undos) == 1
        db.put(b"k000", b"x")
        db.compact()
        assert sst_count(path) == 3  # the two files it holds, and the compaction's
        assert snap.get(b"k000") == b"w"
        it = snap.scan()
    assert snap.closed and state.mem.undos == []
    with pytest.raises(ValueError, match="closed"):
        snap.get(b"k000")
    assert sst_count(path) == 3  # the scan taken from it holds them still
    assert sum(1 for _ in it) == 500
    del it
    assert sst_count(path) == 1
    snap.close()  # idempotent
    db.close()


def test_a_snapshot_never_sees_half_a_batch(tmp_path):
    """A writer commits batches that move one unit between two tables; every
    snapshot taken meanwhile sees the two sums add up."""
    db = lsmdb.open(str(tmp_path / "db"), auto_compaction=True)
    db.create_table("b", memtable_size_bytes=8 * 1024)
    db.alter_table("default", memtable_size_bytes=8 * 1024)
    n = 40
    with db.batch() as b:
        for i in range(n):
            b.put(b"a%02d" % i, b"100")
            b.put(b"a%02d" % i, b"0", table="b")
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        rng = random.Random(1)
        try:
            while not stop.is_set():
                i = b"a%02d" % rng.randrange(n)
                x, y = int(db.get(i)), int(db.table("b").get(i))
                with db.batch() as b:
                    b.put(i, b"%d" % (x - 1))
                    b.put(i, b"%d" % (y + 1), table="b")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(150):
            with db.snapshot() as s:
                a = {k: int(v) for k, v in s.scan()}
                b = {k: int(v) for k, v in s.scan(table="b")}
                assert all(a[k] + b[k] == 100 for k in a), (a, b)
                assert sum(int(s.get(b"a%02d" % i)) for i in range(n)) + sum(
                    int(v) for v in s.get_many([b"a%02d" % i for i in range(n)], table="b")
                ) == 100 * n
    finally:
        stop.set()
        t.join()
    assert not errors, errors[0]
    db.close()


def test_snapshot_reads_after_the_database_closed_are_refused(tmp_path):
    db = lsmdb.open(str(tmp_path / "db"))
    db.put(b"k", b"v")
    snap = db.snapshot()
    assert b"k" in snap and snap[b"k"] == b"v" and b"x" not in snap
    db.close()
    with pytest.raises(lsmdb.DatabaseClosedError):
        snap.get(b"k")
    snap.close()


# -- seek --------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.data())
def test_seek_lands_where_the_model_says(tmp_path_factory, data):
    """Random contents over a memtable, a frozen memtable and files; scans with
    random bounds and direction; seeks anywhere: each next item is the model's."""
    for impl in ("c", "python"):
        if impl == "c" and not lsmdb.merge.USE_SPEEDUPS:
            continue
        saved = lsmdb.merge.USE_SPEEDUPS
        lsmdb.merge.USE_SPEEDUPS = impl == "c"
        try:
            _seek_case(tmp_path_factory.mktemp("seek"), data)
        finally:
            lsmdb.merge.USE_SPEEDUPS = saved


def _seek_case(path, data) -> None:
    db = lsmdb.open(str(path / "db"), auto_compaction=False)
    model: dict[bytes, bytes] = {}
    key = st.binary(min_size=1, max_size=3)
    for phase in range(3):
        for k, v in data.draw(st.lists(st.tuples(key, st.one_of(st.none(),
                                                                st.binary(max_size=3))),
                                       max_size=25)):
            if v is None:
                db.delete(k)
                model.pop(k, None)
            else:
                db.put(k, v)
                model[k] = v
        if phase < 2:
            db.flush()
    snap = data.draw(st.booleans())
    source = db.snapshot() if snap else db
    start = data.draw(st.one_of(st.none(), key))
    end = data.draw(st.one_of(st.none(), key))
    reverse = data.draw(st.booleans())
    it = source.scan(start=start, end=end, reverse=reverse)
    inside = sorted((k, v) for k, v in model.items()
                    if (start is None or k >= start) and (end is None or k < end))
    if reverse:
        inside.reverse()
    if snap:
        db.put(b"\x00late", b"x")  # after the snapshot: never seen
    pos = 0
    for _ in range(data.draw(st.integers(0, 6))):
        if data.draw(st.booleans()):
            target = data.draw(key)
            it.seek(target)
            pos = next((i for i, (k, _v) in enumerate(inside)
                        if (k <= target if reverse else k >= target)), len(inside))
        else:
            got = next(it, None)
            want = inside[pos] if pos < len(inside) else None
            assert got == want
            if got is None:
                with pytest.raises(ValueError):
                    it.seek(b"a")  # over: it cannot seek
                break
            pos += 1
    it.close()
    if snap:
        source.close()
    db.close()


def test_seek_while_another_call_runs_is_refused(tmp_path, merge_impl):
    db = lsmdb.open(str(tmp_path / "db"))
    for i in range(10):
        db.put(b"k%d" % i, b"v")
    it = db.scan()
    assert next(it) == (b"k0", b"v")
    it.seek(b"k5")
    assert next(it) == (b"k5", b"v")
    it.close()
    with pytest.raises(ValueError):
        it.seek(b"k0")
    db.close()


def test_closing_the_database_closes_its_snapshots(tmp_path):
    db = lsmdb.open(str(tmp_path / "db"))
    db.put(b"k", b"v")
    snap = db.snapshot()
    state = db._versions.tables["default"]
    db.close()
    assert snap.closed and state.mem.undos == []
    with pytest.raises(lsmdb.DatabaseClosedError):
        snap.scan()


def test_a_seek_bound_may_be_longer_than_a_key(tmp_path, merge_impl):
    db = lsmdb.open(str(tmp_path / "db"))
    for k in (b"a", b"b", b"c"):
        db.put(k, b"v")
    it = db.scan(reverse=True)
    it.seek(b"b" + b"\xff" * (lsmdb.MAX_KEY_SIZE_BYTES + 10))  # the end of prefix b"b"
    assert [k for k, _v in it] == [b"b", b"a"]
    db.close()


def test_snapshot_gets_without_the_c_read_path(tmp_path, monkeypatch):
    """The snapshot's getter follows the table: the Python one where C does not serve."""
    import lsmdb.snapshot
    import lsmdb.table
    monkeypatch.setattr(lsmdb.snapshot, "USE_SPEEDUPS", False)  # as a build without C
    monkeypatch.setattr(lsmdb.table, "USE_SPEEDUPS", False)
    db = lsmdb.open(str(tmp_path / "db"), auto_compaction=False)
    db.put(b"a", b"1")
    db.flush()
    with db.snapshot() as snap:
        db.put(b"a", b"2")
        assert snap.get(b"a") == b"1" and snap.get(b"b") is None
        assert type(snap._getter(snap._table(None))).__name__ != "Getter"
    db.close()
