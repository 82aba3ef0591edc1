"""What a power loss, a torn write, an I/O fault or a racing reader may take: one test each.

Each test pins one way an engine can lose an acknowledged write or stop
opening, in the smallest setting that shows it:

* closed WAL segments are fsynced: a flush of one table, then ``sync()`` (or
  ``close()``), keeps the other tables' writes through a power loss -- also
  while automatic flushes fail, and when ``sync()`` runs during a flush;
* a read-only open racing the writer's flush sees every write acknowledged
  before it began;
* a partial WAL append followed by a failure to start the next segment: the
  caller sees the first error, and the database still opens;
* the WAL stays within ``max_total_wal_size_bytes``;
* symbolic links planted in the directory are never written through;
* ``fork()``: a child holds no lock, and a handle used in a child raises;
* while flushes fail, a table's frozen memtables stop at
  ``MAX_FROZEN_MEMTABLES`` (writes raise instead).

Power losses are simulated with :mod:`faultfs` (only fsynced data and
fsynced directory entries survive), I/O errors with :mod:`faultinject`.
"""

from __future__ import annotations

import errno
import importlib.util
import logging
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import lsmdb
import lsmdb.db
import lsmdb.manifest
import lsmdb.recovery
import lsmdb.stats
from lsmdb.verify import verify_database


def _load(name: str) -> Any:
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"lsmdb_tests_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING:
    from faultfs import FaultFS
    from faultinject import Faults
else:
    FaultFS = _load("faultfs").FaultFS
    Faults = _load("faultinject").Faults

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"),
                                reason="the fault layers read descriptors through /proc")

SMALL = {"memtable_size_bytes": 4096, "block_size_bytes": 512}


@pytest.fixture(autouse=True)
def _no_timed_counter_saves(monkeypatch):
    monkeypatch.setattr(lsmdb.stats, "STATS_INTERVAL_SECONDS", 1e9)


def power_loss(fs: FaultFS, dest: Path) -> str:
    """The directory a power cut at this moment leaves (names and data as last fsynced)."""
    fs.materialize(str(dest))
    return str(dest)


def errors_of(path: str) -> list[str]:
    return [str(p) for p in verify_database(path) if p.severity == "error"]


# --------------------------------------------------------------- closed segments are fsynced

@pytest.mark.parametrize("then", ["sync", "close"])
def test_a_batch_across_tables_survives_a_flush_of_one_and_a_power_loss(tmp_path, then):
    path = tmp_path / "db"
    path.mkdir()
    fs = FaultFS(str(path))
    with fs:
        db = lsmdb.open(str(path))
        other = db.create_table("other")
        with db.batch() as b:
            b.put(b"d", b"default half")
            b.put(b"o", b"other half", table="other")
        other.put(b"o2", b"not flushed either")
        db.flush("default")           # a new WAL segment; the old one holds "other"'s writes
        if then == "sync":
            db.sync()
            image = power_loss(fs, tmp_path / "image")
            db.close()
        else:
            db.close()
            image = power_loss(fs, tmp_path / "image")
    fs.cleanup()
    assert errors_of(image) == []
    with lsmdb.open(image) as db:
        assert db.get(b"d") == b"default half"
        assert db.table("other").get(b"o") == b"other half"
        assert db.table("other").get(b"o2") == b"not flushed either"


def test_a_flush_of_an_empty_table_makes_every_earlier_write_durable(tmp_path):
    path = tmp_path / "db"
    path.mkdir()
    fs = FaultFS(str(path))
    with fs:
        db = lsmdb.open(str(path))
        db.create_table("other").put(b"o", b"unflushed")
        db.flush("default")           # nothing to flush in "default"
        image = power_loss(fs, tmp_path / "image")
        db.close()
    fs.cleanup()
    with lsmdb.open(image) as db:
        assert db.table("other").get(b"o") == b"unflushed"


def test_writes_survive_a_power_loss_after_sync_while_automatic_flushes_fail(tmp_path, caplog):
    path = tmp_path / "db"
    path.mkdir()
    fs = FaultFS(str(path))
    rows = {}
    with fs, Faults(str(path)) as faults, caplog.at_level(logging.CRITICAL, logger="lsmdb"):
        db = lsmdb.open(str(path), auto_compaction=False)
        db.create_table("t", **SMALL)
        db.create_table("other")
        faults.fail("fsync", lambda n: n.endswith(".sst"), errno.ENOSPC, times=None)
        for i in range(100):
            key = b"k%03d" % i
            value = b"v%03d-" % i + b"x" * 300
            try:  # each full memtable: a WAL rotation, a failing flush
                with db.batch() as b:
                    b.put(key, value, table="t")
                    b.put(key, value, table="other")
            except OSError as exc:  # two frozen memtables already: refused
                assert exc.errno == errno.ENOSPC
                continue
            rows[key] = value
        assert faults.hits, "no automatic flush was tried"
        assert len(rows) > 10
        db.sync()
        image = power_loss(fs, tmp_path / "image")
        faults.clear()
        db.close()
    fs.cleanup()
    with lsmdb.open(image) as db:
        for name in ("t", "other"):
            got = {k: db.table(name).get(k) for k in rows}
            lost = [k for k, v in rows.items() if got[k] != v]
            assert not lost, f"{name}: {len(lost)} of {len(rows)} acknowledged writes lost"


def test_sync_while_a_flush_writes_its_sstable_covers_every_write(tmp_path, monkeypatch):
    """sync() in the window between a flush's WAL rotation and its manifest switch."""
    path = tmp_path / "db"
    path.mkdir()
    fs = FaultFS(str(path))
    images = []
    real = lsmdb.db.write_sstable

    def sync_meanwhile(*args: Any, **kwargs: Any) -> Any:
        done = threading.Event()

        def other_thread() -> None:
            db.sync()
            images.append(power_loss(fs, tmp_path / f"image-{len(images)}"))
            done.set()

        threading.Thread(target=other_thread).start()
        assert done.wait(30)
        return real(*args, **kwargs)

    with fs:
        db = lsmdb.open(str(path), auto_compaction=False)
        db.create_table("other")
        for i in range(24):
            db.put(b"d%02d" % i, b"v%02d" % i)
            db.table("other").put(b"o%02d" % i, b"w%02d" % i)
        monkeypatch.setattr(lsmdb.db, "write_sstable", sync_meanwhile)
        db.flush("default")
        monkeypatch.setattr(lsmdb.db, "write_sstable", real)
        db.close()
    fs.cleanup()
    assert images
    with lsmdb.open(images[0]) as db:
        assert [db.get(b"d%02d" % i) for i in range(24)] == [b"v%02d" % i for i in range(24)]
        assert [db.table("other").get(b"o%02d" % i) for i in range(24)] == \
            [b"w%02d" % i for i in range(24)]


# --------------------------------------------------------------- a read-only open racing a flush

def test_read_only_open_racing_a_flush_sees_every_write_acknowledged_before(tmp_path,
                                                                             monkeypatch):
    """The reader reads the MANIFEST; before it reads the WAL, the writer flushes
    and retires the segment that manifest names.  The reader must notice (the
    segment is gone) and read the new manifest, not lose the writes."""
    path = str(tmp_path / "db")
    writer = lsmdb.open(path, auto_compaction=False)
    try:
        for i in range(23):
            writer.put(b"k%02d" % i, b"acknowledged before the open")
        real_read = lsmdb.recovery.read_manifest_bytes
        fired = []

        def read_then_writer_flushes(p: str) -> bytes:
            data = real_read(p)
            if not fired:
                fired.append(p)
                writer.flush()                 # rotates, writes an SSTable, retires the WAL
                writer.put(b"later", b"after the open began")
            return data

        monkeypatch.setattr(lsmdb.recovery, "read_manifest_bytes", read_then_writer_flushes)
        ro = lsmdb.open(path, read_only=True)
        monkeypatch.undo()
        try:
            assert fired
            assert [ro.get(b"k%02d" % i) for i in range(23)] == \
                [b"acknowledged before the open"] * 23
        finally:
            ro.close()
    finally:
        writer.close()


# --------------------------------------------------------------- failed appends

def test_a_partial_wal_append_then_a_failed_rotation_leaves_an_openable_database(tmp_path):
    path = str(tmp_path / "db")
    db = lsmdb.open(path)
    acked = {}
    for i in range(10):
        db.put(b"k%02d" % i, b"v%02d" % i)
        acked[b"k%02d" % i] = b"v%02d" % i
    with Faults(path) as faults:
        faults.fail("write", lambda n: n.startswith("wal-"), errno.ENOSPC, partial=True)
        faults.fail("open", lambda n: n.startswith("wal-"), errno.EMFILE, times=3)
        with pytest.raises(OSError) as first:
            db.put(b"torn", b"x" * 500)
        assert first.value.errno == errno.ENOSPC, "the caller must see the first error"
        for i in range(3):            # each tries to start a new segment, and cannot
            with pytest.raises(OSError) as later:
                db.put(b"after%d" % i, b"y")
            assert later.value.errno == errno.EMFILE
        assert db.get(b"torn") is None
        db.put(b"then", b"works")       # the next segment starts: flushed first, then appended
        acked[b"then"] = b"works"
    assert [(op, e) for op, _n, e in faults.hits] == [("write", errno.ENOSPC)] + \
        [("open", errno.EMFILE)] * 3
    for key, value in acked.items():
        assert db.get(key) == value
    db.close()
    assert errors_of(path) == []
    with lsmdb.open(path) as again:
        assert {k: again.get(k) for k in acked} == acked
        assert again.get(b"torn") is None and again.get(b"after0") is None


def test_a_failed_wal_append_is_never_followed_by_another_in_that_segment(tmp_path):
    """Without the next segment (it cannot be created), the database is reopened
    as it stands: it opens, with every acknowledged write and none that failed."""
    path = str(tmp_path / "db")
    db = lsmdb.open(path)
    db.put(b"a", b"1")
    with Faults(path) as faults:
        faults.fail("write", lambda n: n.startswith("wal-"), errno.EIO, partial=True)
        faults.fail("open", lambda n: n.startswith("wal-"), errno.EMFILE, times=None)
        faults.fail("fsync", lambda n: n.endswith(".sst"), errno.EIO, times=None)
        with pytest.raises(OSError):
            db.put(b"b", b"2" * 1000)
        for _ in range(5):
            with pytest.raises(OSError):
                db.put(b"c", b"3")
        shutil.copytree(path, str(tmp_path / "crashed"))  # a process crash, right here
        with pytest.raises(OSError):
            db.close()                 # cannot make the writes durable: says so
    with lsmdb.open(str(tmp_path / "crashed")) as again:
        assert (again.get(b"a"), again.get(b"c")) == (b"1", None)
    with lsmdb.open(path) as again:
        assert (again.get(b"a"), again.get(b"c")) == (b"1", None)


# --------------------------------------------------------------- the WAL is bounded

def _wal_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path)
               if n.startswith("wal-"))


@pytest.mark.parametrize("limit", [None, 1 << 20])
def test_one_unflushed_write_does_not_pin_the_whole_wal(tmp_path, limit):
    path = str(tmp_path / "db")
    memtable = 64 * 1024
    with lsmdb.open(path, auto_compaction=False, max_total_wal_size_bytes=limit) as db:
        quiet = db.create_table("quiet", memtable_size_bytes=memtable)
        busy = db.create_table("busy", memtable_size_bytes=memtable)
        db.alter_table("default", memtable_size_bytes=memtable)
        quiet.put(b"one", b"write")
        bound = limit if limit is not None else 4 * 3 * memtable
        peak = 0
        for i in range(3000):                     # ~3 MB through "busy"
            busy.put(b"k%05d" % i, b"v" * 1000)
            peak = max(peak, _wal_bytes(path))
        assert peak <= bound + 2 * memtable, (peak, bound)
        assert db.sstables("quiet"), "the table pinning the oldest segment was not flushed"
    with lsmdb.open(path) as db:
        assert db.table("quiet").get(b"one") == b"write"
        assert db.table("busy").get(b"k02999") == b"v" * 1000


def test_max_total_wal_size_is_validated(tmp_path):
    for bad, exc in ((1000, ValueError), ("1 MiB", TypeError), (True, TypeError)):
        with pytest.raises(exc, match="max_total_wal_size_bytes"):
            lsmdb.open(str(tmp_path / "db"), max_total_wal_size_bytes=bad)
    assert not (tmp_path / "db").exists()


# --------------------------------------------------------------- symbolic links

def test_symbolic_links_planted_in_the_directory_are_never_written_through(tmp_path):
    path = tmp_path / "db"
    with lsmdb.open(str(path)) as db:
        db.put(b"k", b"v")
        db.flush()
        next_number = db._next_file
    victims = {}
    names = ["MANIFEST.tmp", "STATS.tmp", *(f"{next_number + i:06d}.sst" for i in range(4)),
             *(f"wal-{next_number + i:06d}.log" for i in range(4))]
    for name in names:
        target = tmp_path / f"victim-{name}"
        target.write_bytes(b"precious " + name.encode())
        (path / name).symlink_to(target)
        victims[target] = target.read_bytes()
    with lsmdb.open(str(path)) as db:
        for i in range(3):
            db.put(b"k%d" % i, b"v" * 100)
            db.flush()
        db.compact()
        assert db.get(b"k2") == b"v" * 100
    for target, content in victims.items():
        assert target.read_bytes() == content, f"{target.name} was written through"
    assert not (path / "MANIFEST").is_symlink() and not (path / "STATS").is_symlink()
    with lsmdb.open(str(path)) as db:
        assert db.get(b"k") == b"v"


def test_a_manifest_replaced_by_a_symbolic_link_is_not_followed(tmp_path):
    path = tmp_path / "db"
    with lsmdb.open(str(path)) as db:
        db.put(b"k", b"v")
    real = tmp_path / "real-manifest"
    os.replace(path / "MANIFEST", real)
    (path / "MANIFEST").symlink_to(real)
    with pytest.raises(lsmdb.CorruptionError, match="symbolic link"):
        lsmdb.open(str(path))
    assert real.exists()


# --------------------------------------------------------------- fork

@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_holds_no_lock_and_cannot_use_the_parents_handle(tmp_path):
    path = str(tmp_path / "db")
    db = lsmdb.open(path)
    db.put(b"parent", b"1")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(r)
            try:
                db.put(b"child", b"2")
                code = 1
            except lsmdb.DatabaseForkedError:
                pass
            try:
                db.get(b"parent")
                code = 2
            except lsmdb.DatabaseForkedError:
                pass
            db.close()                      # a no-op in the child
            os.write(w, b"ready")
            os.read(os.open(os.devnull, os.O_RDONLY), 1)
            import time
            time.sleep(3)                   # still alive while the parent reopens
        except BaseException:
            code = 3
        os._exit(code)
    os.close(w)
    assert os.read(r, 5) == b"ready"
    db.put(b"parent2", b"3")               # the parent's handle works on
    db.close()
    with lsmdb.open(path) as again:          # the child, still alive, holds no lock
        assert (again.get(b"parent"), again.get(b"parent2"), again.get(b"child")) == (
            b"1", b"3", None)
    _pid, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert errors_of(path) == []


def test_a_second_open_in_the_same_process_is_refused(tmp_path):
    path = str(tmp_path / "db")
    with lsmdb.open(path):
        with pytest.raises(lsmdb.DatabaseLockedError, match="this process"):
            lsmdb.open(path)
        with lsmdb.open(path, read_only=True) as ro:
            assert ro.get(b"x") is None
    lsmdb.open(path).close()


# --------------------------------------------------------------- failing flushes stall writes

def test_while_flushes_fail_frozen_memtables_stop_at_the_bound(tmp_path, caplog):
    path = str(tmp_path / "db")
    db = lsmdb.open(path, auto_compaction=False)
    t = db.create_table("t", **SMALL)
    acked = {}
    with Faults(path) as faults, caplog.at_level(logging.CRITICAL, logger="lsmdb"):
        faults.fail("fsync", lambda n: n.endswith(".sst"), errno.ENOSPC, times=None)
        refused = 0
        for i in range(200):
            try:
                t.put(b"k%03d" % i, b"v" * 400)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                refused += 1
                continue
            acked[b"k%03d" % i] = b"v" * 400
            assert len(db._tables["t"].imms) <= lsmdb.db.MAX_FROZEN_MEMTABLES
        assert refused > 150
    for key, value in acked.items():
        assert t.get(key) == value
    t.put(b"after", b"the disk has room again")
    acked[b"after"] = b"the disk has room again"
    db.close()
    with lsmdb.open(path) as again:
        assert {k: again.table("t").get(k) for k in acked} == acked


def test_a_torn_unsynced_segment_ends_the_replay(tmp_path, caplog):
    """A flush that fails leaves the segment its rotation closed unsynced (no other
    table had records in it) while writes go on in the next one.  If a crash then
    tears the unsynced segment, the later segment is not replayed: what survives is
    a prefix of the writes, never later ones without earlier ones."""
    path = str(tmp_path / "db")
    db = lsmdb.open(path, auto_compaction=False)
    db.alter_table("default", **SMALL)
    with Faults(path) as faults, caplog.at_level(logging.CRITICAL, logger="lsmdb"):
        faults.fail("fsync", lambda n: n.endswith(".sst"), errno.ENOSPC)
        n = 0
        while not faults.hits:                      # until a flush was tried and failed
            db.put(b"k%03d" % n, b"v" * 300)
            n += 1
    wal = lsmdb.manifest.Manifest.read(os.path.join(path, "MANIFEST")).wal
    assert wal is not None and len(wal.unsynced) == 1 and wal.closed == []
    assert wal.live is not None
    older, newer = (os.path.join(path, lsmdb.files.wal_name(x))
                    for x in (wal.unsynced[0][0], wal.live))
    db.put(b"later", b"in the newer segment")
    crashed = tmp_path / "crashed"
    shutil.copytree(path, crashed)                   # a crash...
    db.close()
    torn = crashed / os.path.basename(older)
    os.truncate(torn, os.path.getsize(torn) - 50)   # ... that tore the unsynced segment
    assert os.path.getsize(crashed / os.path.basename(newer)) > 16
    with caplog.at_level(logging.WARNING, logger="lsmdb"), lsmdb.open(str(crashed)) as again:
        got = [again.get(b"k%03d" % i) is not None for i in range(n)]
        assert got == sorted(got, reverse=True) and not all(got)   # a prefix, torn short
        assert again.get(b"later") is None
    assert any("written after a torn WAL segment" in r.getMessage() for r in caplog.records)
    assert errors_of(str(crashed)) == []
