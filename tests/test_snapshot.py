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
    t0 = snaps[0]._table(None)
    getter = snaps[0]._getter(t0, t0.files)
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
        it = snap.scan()
        db.compact()
        # compact() flushed k000's x first.  The snapshot follows the compaction:
        # it reads the output and a history file holding its k000 (w), and gives
        # the inputs back; the scan taken before holds the two it read still
        assert sst_count(path) == 4
        assert snap.get(b"k000") == b"w"
        assert sum(1 for _ in it) == 500
        del it
        assert sst_count(path) == 2
        assert dict(snap.scan()) == {b"k%03d" % i: b"w" for i in range(500)}
        it = snap.scan()
    assert snap.closed and state.mem.undos == []
    assert sst_count(path) == 1  # the history file went with the snapshot
    with pytest.raises(ValueError, match="closed"):
        snap.get(b"k000")
    db.put(b"k001", b"y")
    db.flush()
    db.compact()
    assert sst_count(path) == 2  # the scan taken from it holds the file it read
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
        t = snap._table(None)
        assert type(snap._getter(t, t.files)).__name__ != "Getter"
    db.close()


def test_compaction_keeps_each_snapshots_version_and_the_rest_goes(tmp_path, merge_impl):
    """Three generations of every key, a snapshot after each of the first two:
    a full compaction leaves one output and history files holding only the
    versions the snapshots read; the inputs leave the disk at once, the
    history files when the last snapshot goes, the tombstones at the next
    compaction after that."""
    path = str(tmp_path / "db")
    db = lsmdb.open(path, auto_compaction=False)
    keys = [b"k%04d" % i for i in range(400)]
    for k in keys:
        db.put(k, b"v1" + k)
    db.flush()
    s1 = db.snapshot()
    want1 = {k: b"v1" + k for k in keys}
    want2 = dict(want1)
    for i, k in enumerate(keys):
        if i % 5 == 0:
            db.delete(k)
            del want2[k]
        elif i % 2:
            db.put(k, b"v2" + k)
            want2[k] = b"v2" + k
    db.flush()
    s2 = db.snapshot()
    now = dict(want2)
    for i, k in enumerate(keys):
        if i % 3 == 0:
            db.put(k, b"v3" + k)
            now[k] = b"v3" + k
        elif i % 7 == 0:
            db.delete(k)
            now.pop(k, None)
    db.flush()
    assert sst_count(path) == 3
    db.compact()
    outputs = len(db.sstables())
    assert outputs == 1
    # The second version kept of a key, and the third: two history files
    assert sst_count(path) == outputs + 2
    probe = keys + [b"absent", b"k9999"]
    for snap, want in ((s1, want1), (s2, want2)):
        assert dict(snap.scan()) == want
        assert list(snap.scan(reverse=True)) == sorted(want.items(), reverse=True)
        assert [snap.get(k) for k in probe] == [want.get(k) for k in probe]
        assert snap.get_many(probe) == [want.get(k) for k in probe]
        it = snap.scan()
        it.seek(b"k0200")
        assert next(it) == min((k, v) for k, v in want.items() if k >= b"k0200")
    assert dict(db.scan()) == now
    # The history holds no version no snapshot reads: at most one per snapshot per key
    kept = sum(e.entries for e in db.sstables())
    assert kept == len(keys)  # tombstones kept while snapshots live
    s1.close()
    assert dict(s2.scan()) == want2
    s2.close()
    assert sst_count(path) == outputs
    db.compact()
    assert sum(e.entries for e in db.sstables()) == len(now)
    assert dict(db.scan()) == now
    db.close()
    with lsmdb.open(path) as db:
        assert dict(db.scan()) == now


def test_a_snapshot_reads_what_a_compaction_after_a_drop_left(tmp_path):
    """A snapshot that followed a compaction keeps reading a table dropped later,
    and one taken between the compaction's start and its install needs no
    history (every input is older than it)."""
    path = str(tmp_path / "db")
    db = lsmdb.open(path, auto_compaction=False)
    t = db.create_table("t")
    for k in range(300):
        t.put(b"%04d" % k, b"a")
    db.flush()
    snap = db.snapshot()
    for k in range(0, 300, 2):
        t.put(b"%04d" % k, b"b")
    db.flush()
    db.compact()
    assert snap._table("t").files.exact is False
    db.drop_table("t")
    assert dict(snap.scan(table="t")) == {b"%04d" % k: b"a" for k in range(300)}
    assert snap.get(b"0002", table="t") == b"a"
    snap.close()
    assert sst_count(path) == 0
    db.close()


@pytest.mark.parametrize("strategy", ["size_tiered", "leveled"])
@pytest.mark.parametrize("seed", range(4))
def test_snapshots_through_random_compactions_read_what_the_model_says(tmp_path, strategy,
                                                                       seed, merge_impl):
    """Random puts (some expiring), deletes, flushes, compactions (full and the
    picker's) over a few hundred keys rewritten many times, with up to four
    snapshots taken and closed among them: each live snapshot reads what the
    model held when it was taken, every file on disk is a current one, held
    by a snapshot or by nothing once every snapshot is closed."""
    from tests.support.clock import Clock

    rng = random.Random(seed)
    clock = Clock()
    path = str(tmp_path / "db")
    db = lsmdb.open(path, auto_compaction=False, clock=clock)
    db.alter_table("default", memtable_size_bytes=4096, block_size_bytes=512,
                   compaction=strategy, min_threshold=2)
    keys = [b"k%03d" % i for i in range(150)]
    model: dict[bytes, tuple[bytes, float]] = {}  # key -> (value, expires at; inf: never)
    snaps: list[tuple[lsmdb.Snapshot, dict[bytes, tuple[bytes, float]]]] = []

    def live(m: dict[bytes, tuple[bytes, float]]) -> dict[bytes, bytes]:
        return {k: v for k, (v, at) in m.items() if clock.t < at}

    for step in range(700):
        r = rng.random()
        k = rng.choice(keys)
        if r < 0.55:
            v = b"%d-%d" % (step, rng.randrange(10**6))
            if rng.random() < 0.15:
                ttl = rng.choice([1, 3, 10])
                db.put(k, v, ttl=ttl)
                model[k] = (v, clock.t + ttl)
            else:
                db.put(k, v)
                model[k] = (v, float("inf"))
        elif r < 0.7:
            db.delete(k)
            model.pop(k, None)
        elif r < 0.75:
            db.flush()
        elif r < 0.79:
            db._compactor.run_pending(lambda: False)
        elif r < 0.81:
            db.compact()
        elif r < 0.85 and len(snaps) < 4:
            snaps.append((db.snapshot(), dict(model)))
        elif r < 0.88 and snaps:
            snaps.pop(rng.randrange(len(snaps)))[0].close()
        elif r < 0.9:
            clock.t += rng.choice([0.5, 1.0, 2.0])
        if step % 25 == 0 or r >= 0.75:
            for snap, m in snaps:
                want = live(m)
                assert dict(snap.scan()) == want
                probe = rng.sample(keys, 20)
                assert [snap.get(x) for x in probe] == [want.get(x) for x in probe]
            assert dict(db.scan()) == live(model)
    for snap, _m in snaps:
        snap.close()
    assert sst_count(path) == len(db.sstables())
    db.compact()
    assert dict(db.scan()) == live(model)
    db.close()


def test_history_files_a_crash_left_are_swept_at_open(tmp_path):
    """History files are named by no MANIFEST: an open after a crash (the
    directory copied while a snapshot held them) removes them, and reads the
    newest versions, not theirs."""
    import shutil

    path = str(tmp_path / "db")
    db = lsmdb.open(path, auto_compaction=False)
    for i in range(200):
        db.put(b"k%03d" % i, b"old")
    db.flush()
    snap = db.snapshot()
    for i in range(0, 200, 2):
        db.put(b"k%03d" % i, b"new")
    db.delete(b"k001")
    db.flush()
    db.compact()
    names = set(os.listdir(path))
    live = {os.path.basename(i.file) for i in db.sstables()}
    history = {n for n in names if n.endswith(".sst")} - live
    assert len(history) == 1
    crashed = str(tmp_path / "crashed")
    shutil.copytree(path, crashed, ignore=shutil.ignore_patterns("LOCK"))
    snap.close()
    db.close()
    with lsmdb.open(crashed) as again:
        assert not history & set(os.listdir(crashed))
        assert again.get(b"k000") == b"new" and again.get(b"k003") == b"old"
        assert again.get(b"k001") is None
        assert len(dict(again.scan())) == 199


def _followed_snapshots(path: str, python: bool, monkeypatch) -> tuple[list, list]:
    """Leveled files and a few snapshots that followed compactions (history files
    among their files): each snapshot's answers for every key, then the counters
    of every file its reads walked."""
    if python:
        monkeypatch.setattr(lsmdb.readpath, "USE_C_GETTER", False)
    db = lsmdb.open(path, auto_compaction=False)
    db.alter_table("default", compaction="leveled", memtable_size_bytes=4096,
                   block_size_bytes=512, bloom_filter_fp_chance=0.1)
    rng = random.Random(11)
    keys = [b"k%04d" % i for i in range(400)]
    snaps = []
    for round_ in range(5):
        for k in rng.sample(keys, 150):
            if rng.random() < 0.2:
                db.delete(k)
            else:
                db.put(k, b"%d:%s" % (round_, k))
        db.flush()
        if round_ % 2 == 0:
            snaps.append(db.snapshot())
        db._compactor.run_pending(lambda: False)
        for k in rng.sample(keys, 40):
            db.put(k, b"late")
        db.flush()
    db.compact()
    answers = []
    walked = []
    probe = keys + [b"k9999", b"a", b"k0100x"]
    for snap in snaps:
        t = snap._table(None)
        assert not t.files.exact and t.files.history
        getter = snap._getter(t, t.files)
        assert (type(getter).__name__ == "Getter") == (not python)
        answers.append([snap.get(k) for k in probe])
        walked.append([tuple(r.counts) for r in t.files.files().files])
    for snap in snaps:
        snap.close()
    db.close()
    return answers, walked


def test_the_c_getter_reads_a_followed_snapshot_as_python_does(tmp_path, monkeypatch):
    if not lsmdb.SPEEDUPS:
        pytest.skip("built without the C speedups")
    py = _followed_snapshots(str(tmp_path / "py"), True, monkeypatch)
    monkeypatch.undo()
    c = _followed_snapshots(str(tmp_path / "c"), False, monkeypatch)
    assert py == c
    assert any(a is not None for a in py[0][0])
