"""lsmdb.version: immutable versions of a table's files, counted while read; a file
leaves the disk only once it is retired through a durable manifest switch and no
live version names it.  And recovery returns the state it read, which Versions
installs."""

from __future__ import annotations

import errno
import gc
import os

import pytest

import lsmdb
from lsmdb.files import SwitchedButNotSynced
from lsmdb.manifest import Manifest
from lsmdb.recovery import read_state
from lsmdb.version import Version, VersionSet


def _files(db: lsmdb.DB, table: str | None = None) -> list[str]:
    return [i.path for i in db.sstables(table)]


def _loaded(path: str, files: int = 3, table: str = "default") -> lsmdb.DB:
    db = lsmdb.open(path, auto_compaction=False)
    if table != "default":
        db.create_table(table)
    t = db.table(table)
    for f in range(files):
        for i in range(f, 600, files):
            t.put(b"k%04d" % i, b"v%d" % i)
        db.flush(table)
    return db


def test_a_scan_keeps_a_compaction_s_inputs_on_disk_until_it_ends(tmp_path):
    db = _loaded(str(tmp_path / "db"))
    try:
        inputs = _files(db)
        assert len(inputs) == 3
        scan = db.scan()
        first = next(scan)
        db.compact()
        [output] = _files(db)
        assert output not in inputs
        assert all(os.path.exists(p) for p in inputs)  # the scan's version names them
        assert [first, *scan] == [(b"k%04d" % i, b"v%d" % i) for i in range(600)]
        assert not any(os.path.exists(p) for p in inputs)  # exhausted: gone
        assert db.get(b"k0100") == b"v100"
        db._check()
    finally:
        db.close()


@pytest.mark.parametrize("how", ["closed", "dropped unstarted", "dropped half-read"])
def test_a_scan_lets_its_files_go_when_closed_or_freed(tmp_path, how):
    db = _loaded(str(tmp_path / "db"))
    try:
        inputs = _files(db)
        scan = db.scan()
        if how != "dropped unstarted":
            next(scan)
        db.compact()
        assert all(os.path.exists(p) for p in inputs)
        if how == "closed":
            scan.close()
        else:
            del scan
            gc.collect()
        assert not any(os.path.exists(p) for p in inputs)
        db._check()
    finally:
        db.close()


def test_a_dropped_table_s_files_stay_while_a_scan_reads_them(tmp_path):
    db = _loaded(str(tmp_path / "db"), table="t")
    try:
        files = _files(db, "t")
        scan = db.table("t").scan(start=b"k0100")
        assert next(scan) == (b"k0100", b"v100")
        db.drop_table("t")
        assert all(os.path.exists(p) for p in files)
        assert len(list(scan)) == 499
        assert not any(os.path.exists(p) for p in files)
    finally:
        db.close()


def test_two_scans_and_a_compaction_each_file_goes_with_its_last_reader(tmp_path):
    db = _loaded(str(tmp_path / "db"))
    try:
        first_files = _files(db)
        early = db.scan()
        next(early)
        db.put(b"k9999", b"new")
        db.compact()
        middle_files = _files(db)
        late = db.scan()
        next(late)
        db.put(b"k9998", b"newer")
        db.compact()
        assert all(os.path.exists(p) for p in first_files + middle_files)
        early.close()
        assert not any(os.path.exists(p) for p in first_files)
        assert all(os.path.exists(p) for p in middle_files)
        assert list(late)[-1] == (b"k9999", b"new")  # its own view: not k9998
        assert not any(os.path.exists(p) for p in middle_files)
        db._check()
    finally:
        db.close()


def test_close_removes_the_retired_files_a_live_scan_held(tmp_path):
    path = str(tmp_path / "db")
    db = lsmdb.open(path, auto_compaction=False)
    db.alter_table("default", block_size_bytes=512)  # many blocks: the scan must read more
    for f in range(3):
        for i in range(f, 600, 3):
            db.put(b"k%04d" % i, b"v%d" % i)
        db.flush()
    inputs = _files(db)
    scan = db.scan()
    next(scan)
    db.compact()
    assert all(os.path.exists(p) for p in inputs)
    db.close()
    assert not any(os.path.exists(p) for p in inputs)
    with pytest.raises(lsmdb.DatabaseClosedError):
        list(scan)  # its files closed with the database: it reads nothing more
    scan.close()


def test_a_scan_that_fails_to_start_lets_its_version_go(tmp_path, monkeypatch):
    class Unanswerable:
        def __bool__(self):
            raise RuntimeError("no truth value")

    db = _loaded(str(tmp_path / "db"))
    try:
        db.put(b"in-the-memtable", b"v")
        state = db._default_state
        assert state.version.refs == 1
        with pytest.raises(RuntimeError, match="no truth value"):
            db.scan(reverse=Unanswerable())
        monkeypatch.setattr(type(state.mem), "chunk_range",
                            lambda *a: (_ for _ in ()).throw(MemoryError("out")))
        with pytest.raises(MemoryError):
            db.scan()
        monkeypatch.undo()
        assert state.version.refs == 1
        inputs = _files(db)
        db.compact()
        assert not any(os.path.exists(p) for p in inputs)  # nothing pinned them
        db._check()
    finally:
        db.close()


def test_a_switch_that_may_not_be_durable_retires_nothing(tmp_path, monkeypatch):
    """When the manifest switch of a compaction lands but its directory fsync
    fails, the inputs are never removed by this process (the old manifest
    could come back after a crash); the next open sweeps them."""
    import lsmdb.versions
    path = str(tmp_path / "db")
    db = _loaded(path)
    inputs = _files(db)
    real = lsmdb.versions.Versions.write_manifest

    def not_synced(self):
        real(self)
        raise SwitchedButNotSynced(errno.EIO, "directory fsync failed")
    monkeypatch.setattr(lsmdb.versions.Versions, "write_manifest", not_synced)
    with pytest.raises(SwitchedButNotSynced):
        db.compact()
    monkeypatch.undo()
    assert all(os.path.exists(p) for p in inputs)
    assert db.get(b"k0001") == b"v1"
    db.close()
    assert all(os.path.exists(p) for p in inputs)  # not even at close
    with lsmdb.open(path) as again:  # the sweep of the next open
        assert again.get(b"k0001") == b"v1"
    assert not any(os.path.exists(p) for p in inputs)


def test_a_version_is_immutable_and_ordered_as_reads_consult_it():
    class R:
        def __init__(self, n, level, lo, hi, seq):
            self.number, self.level, self.min_key, self.max_key, self.max_seq = (
                n, level, lo, hi, seq)
            self.path = f"/nowhere/{n}"

        def drop_cached(self):
            pass

    a, b, c, d = R(1, 0, b"a", b"z", 5), R(2, 0, b"a", b"z", 9), R(3, 1, b"m", b"p", 1), \
        R(4, 1, b"a", b"c", 2)
    v = Version([a, b, c, d])
    assert v.l0 == (b, a) and v.levels == (((b"c", b"p"), (d, c)),)
    assert v.in_read_order() == [b, a, d, c]
    owner = VersionSet(remove=False)
    v1 = owner.new([a, b])
    v2 = owner.new([b, c])
    owner.retire([a, b])
    assert owner.waiting() == [a, b]
    v1.release()
    assert owner.waiting() == [b]
    v2.acquire()
    v2.release()
    assert owner.waiting() == [b]
    v2.release()
    assert owner.waiting() == []
    with pytest.raises(RuntimeError):
        v2.acquire()


def test_recovery_reads_a_state_and_versions_installs_it(tmp_path):
    """read_state builds the tables a directory describes -- files opened, WAL
    replayed into memtables -- without touching the open database; the same
    code can read a newer MANIFEST beside a live handle."""
    path = str(tmp_path / "db")
    db = _loaded(path)
    db.put(b"in-the-wal", b"1")
    db.sync()
    try:
        reader = lsmdb.open(path, read_only=True)
        versions = reader._versions
        before = {name: state for name, state in versions.tables.items()}
        manifest = Manifest.read(os.path.join(path, "MANIFEST"))
        state, replayed = read_state(versions, manifest)
        try:
            assert versions.tables == before  # nothing installed
            table = state.tables["default"]
            assert {r.number for r in table.files} == {r.number for r in before["default"].files}
            assert table.mem.data.get(b"in-the-wal") == b"1" and replayed.records >= 1
        finally:
            state.close()
        reader.close()
    finally:
        db.close()
