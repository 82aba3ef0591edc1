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
  ``MAX_FROZEN_MEMTABLES`` (writes raise instead);
* an unsynced segment a crash cut short (torn, lost whole, or cut at a
  record boundary) ends the replay; one ``sync()`` fsynced is read strictly;
  segments of an older lsmdb are each read to their own torn tail;
* a manifest switch whose directory fsync failed is made durable before a
  later promise, and a table id the WAL names is never handed out again;
* ``close()`` racing a WAL recovery or a failing write: no recovery runs
  after it, and it never returns with an acknowledged write not durable;
* a refused second open keeps the process's lock; a FIFO or a directory
  under a WAL name neither blocks nor breaks an open;
* ``lsmdb repair`` interrupted by a crash, and after a failed segment that
  could not be unlinked, keeps what one repair keeps and nothing more.

Power losses are simulated with :mod:`faultfs` (only fsynced data and
fsynced directory entries survive), I/O errors with :mod:`faultinject`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack
import pytest

import lsmdb
import lsmdb.db
import lsmdb.flush
import lsmdb.manifest
import lsmdb.recovery
import lsmdb.stats
import lsmdb.writepath
from lsmdb.coding import WAL_HEADER, crc32
from lsmdb.files import SwitchedButNotSynced
from lsmdb.logset import encode_record
from lsmdb.manifest import MANIFEST_HEADER, MANIFEST_MAGIC
from lsmdb.repair import repair_database
from lsmdb.sstable_reader import SSTableReader
from lsmdb.verify import verify_database
from lsmdb.wal import PWRITE_MIN_BYTES, read_segment
from tests.conftest import SMALL
from tools import load_test_layer

if TYPE_CHECKING:
    from tests.support.faultfs import FaultFS
    from tests.support.faultinject import Faults
    from tests.support.powerloss import PowerLoss
else:
    FaultFS = load_test_layer("faultfs").FaultFS
    Faults = load_test_layer("faultinject").Faults
    PowerLoss = load_test_layer("powerloss").PowerLoss

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"),
                                reason="the fault layers read descriptors through /proc")

#: A value whose record is written with pwrite (lsmdb.wal.PWRITE_MIN_BYTES),
#: where an injected "write" fault then strikes, part of it written.
GROWS = b"x" * PWRITE_MIN_BYTES


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
    real = lsmdb.flush.write_memtable

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
        monkeypatch.setattr(lsmdb.flush, "write_memtable", sync_meanwhile)
        db.flush("default")
        monkeypatch.setattr(lsmdb.flush, "write_memtable", real)
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
            db.put(b"torn", GROWS)
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
            db.put(b"b", GROWS)
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


def test_a_batch_whose_pwrite_fails_part_way_leaves_a_torn_tail(tmp_path):
    """A batch large enough to be written with pwrite that fails after part of
    it reached the file (a disk filling up): the write raises
    and no read sees it; a process crash right then leaves the segment with
    the failed record as a torn tail, which a reopen drops; the database goes
    on in a new segment."""
    path = str(tmp_path / "db")
    db = lsmdb.open(path)
    acked = {b"first": b"1"}
    db.put(b"first", b"1")
    for half in range(2):      # ~600 KB each
        with db.batch() as b:
            for i in range(half * 5000, half * 5000 + 5000):
                b.put(b"big%05d" % i, b"v" * 100)
                acked[b"big%05d" % i] = b"v" * 100
    [segment] = [n for n in os.listdir(path) if n.startswith("wal-")]
    with Faults(path) as faults:
        faults.fail("write", lambda n: n.startswith("wal-"), errno.EIO, partial=True)
        with pytest.raises(OSError) as raised:
            with db.batch() as b:   # ~120 KB
                for i in range(1000):
                    b.put(b"lost%04d" % i, b"w" * 100)
        assert raised.value.errno == errno.EIO
        assert faults.hits == [("write", segment, errno.EIO)]
        assert db.get(b"lost0000") is None and db.get(b"lost0999") is None
        crashed = str(tmp_path / "crashed")
        shutil.copytree(path, crashed)  # a process crash, right here
        db.put(b"then", b"works")   # a new segment
    with open(os.path.join(crashed, segment), "rb") as f:
        read = read_segment(f.read(), int(segment[4:10]))
    assert read.torn and len(read.records) == 3  # the put and two batches; the tail cut
    assert errors_of(crashed) == []
    with lsmdb.open(crashed) as again:
        assert {k: again.get(k) for k in acked} == acked
        assert again.get(b"lost0000") is None and again.get(b"lost0999") is None
    acked[b"then"] = b"works"
    db.close()
    with lsmdb.open(path) as again:
        assert {k: again.get(k) for k in acked} == acked
        assert again.get(b"lost0000") is None and again.get(b"lost0999") is None


def test_small_records_after_a_pwrite_batch_where_nothing_allocates_ahead(tmp_path, monkeypatch):
    """Where the file system cannot allocate ahead (no posix_fallocate: zeros
    are written instead), the space a small record reserves after a batch
    written with pwrite starts past that batch: nothing acknowledged is zeroed."""
    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "test: no fallocate here")

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    path = str(tmp_path / "db")
    acked = {}
    with lsmdb.open(path) as db:
        for round_ in range(3):
            with db.batch(sync=True) as b:     # ~113 KB: written with pwrite
                for i in range(1000):
                    b.put(b"big%d-%04d" % (round_, i), b"v" * 100)
                    acked[b"big%d-%04d" % (round_, i)] = b"v" * 100
            for i in range(200):                # mapped records after it
                db.put(b"small%d-%03d" % (round_, i), b"s" * 200)
                acked[b"small%d-%03d" % (round_, i)] = b"s" * 200
        db.sync()
        shutil.copytree(path, str(tmp_path / "crashed"))  # a process crash, right here
    for where in (path, str(tmp_path / "crashed")):
        assert errors_of(where) == []
        with lsmdb.open(where) as again:
            assert {k: again.get(k) for k in acked} == acked, where


@pytest.mark.parametrize("zeroed", [0, 1])
def test_a_batch_taken_back_after_a_failed_fsync_is_zeroed_from_its_end(tmp_path, zeroed):
    """A batch written with pwrite whose fsync fails is taken back (unwrite)
    with zeros from its end backwards, 1 MiB at a time.  When that zeroing
    fails too, after ``zeroed`` chunks: with none, the batch is still whole
    in the file (a reopen may find it, whole, as the guarantees allow for a
    write that raised); with one, it is cut short -- a torn tail, dropped --
    and never its start gone with later fragments in place (damage)."""
    path = str(tmp_path / "db")
    db = lsmdb.open(path)
    db.put(b"first", b"1", sync=True)
    with Faults(path) as faults:
        faults.fail("fsync", lambda n: n.startswith("wal-"), errno.EIO)
        faults.fail("write", lambda n: n.startswith("wal-"), errno.EIO, skip=1 + zeroed)
        with pytest.raises(OSError):
            with db.batch(sync=True) as b:     # ~1.2 MB: two chunks of zeros to write
                for i in range(10_000):
                    b.put(b"lost%05d" % i, b"w" * 100)
        assert [op for op, _n, _e in faults.hits] == ["fsync", "write"]
        assert db.get(b"lost00000") is None
        crashed = str(tmp_path / "crashed")
        shutil.copytree(path, crashed)  # a process crash, right here
    with contextlib.suppress(OSError):
        db.close()
    assert errors_of(crashed) == []
    with lsmdb.open(crashed) as again:
        assert again.get(b"first") == b"1"
        found = [again.get(b"lost%05d" % i) for i in (0, 5000, 9999)]
        assert found == ([b"w" * 100] * 3 if zeroed == 0 else [None] * 3)


def test_a_wal_append_interrupted_part_way_fails_the_log(tmp_path, monkeypatch):
    """A KeyboardInterrupt while a batch is written (part of it in the file):
    the log is failed like an I/O error, so nothing is appended after the
    partial record in that segment; the next write starts a new one."""
    path = str(tmp_path / "db")
    db = lsmdb.open(path)
    db.put(b"first", b"1")
    real = os.pwrite

    def interrupted(fd, data, offset):
        real(fd, memoryview(data)[:len(data) // 2], offset)
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "pwrite", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with db.batch() as b:
            for i in range(1000):
                b.put(b"lost%04d" % i, b"w" * 100)
    monkeypatch.setattr(os, "pwrite", real)
    assert isinstance(db._versions.log.failed, OSError)
    crashed = str(tmp_path / "crashed")
    shutil.copytree(path, crashed)  # a process crash, right here
    db.put(b"then", b"2")           # a new segment
    db.close()
    for where in (path, crashed):
        assert errors_of(where) == []
        with lsmdb.open(where) as again:
            assert again.get(b"first") == b"1" and again.get(b"lost0000") is None
    with lsmdb.open(path) as again:
        assert again.get(b"then") == b"2"


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
        next_number = db._versions.next_file
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
    for i in range(3000):                  # in the WAL file the child let go of, past
        db.put(b"more%05d" % i, b"m" * 100)  # the page it was at
    db.close()
    with lsmdb.open(path) as again:          # the child, still alive, holds no lock
        assert (again.get(b"parent"), again.get(b"parent2"), again.get(b"child")) == (
            b"1", b"3", None)
        assert all(again.get(b"more%05d" % i) == b"m" * 100 for i in range(3000))
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

@pytest.mark.parametrize("flush_thread", [False, True], ids=["writer flushes", "flush thread"])
def test_while_flushes_fail_frozen_memtables_stop_at_the_bound(tmp_path, caplog, flush_thread):
    """Without a flush thread (auto_compaction=False) the writer flushes and
    gets the error; with one, a writer at the bound waits for the thread only
    while its flushes succeed, then flushes itself and gets the error."""
    path = str(tmp_path / "db")
    db = lsmdb.open(path, auto_compaction=flush_thread)
    assert (db._writes.flush_thread is not None) == flush_thread
    t = db.create_table("t", **SMALL)
    acked = {}
    start = time.monotonic()
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
            assert len(db._versions.tables["t"].imms) <= lsmdb.writepath.MAX_FROZEN_MEMTABLES
        assert refused > 150
        # a refused write does not sit out FLUSH_WAIT_SECONDS first
        assert time.monotonic() - start < 0.1 * refused * lsmdb.writepath.FLUSH_WAIT_SECONDS
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
    os.truncate(torn, wal.unsynced[0][1] - 50)      # ... that tore the unsynced segment
    assert os.path.getsize(crashed / os.path.basename(newer)) > 16
    with caplog.at_level(logging.WARNING, logger="lsmdb"), lsmdb.open(str(crashed)) as again:
        got = [again.get(b"k%03d" % i) is not None for i in range(n)]
        assert got == sorted(got, reverse=True) and not all(got)   # a prefix, torn short
        assert again.get(b"later") is None
        rec = again.recovery
        assert rec["set_aside"] == [os.path.basename(newer)]
        assert [os.path.basename(p) for p, _ in rec["torn"]] == [os.path.basename(older)]
        assert rec["segments"] >= 1 and 0 < rec["records"] < n
    assert any("written after a torn WAL segment" in r.getMessage() for r in caplog.records)
    assert errors_of(str(crashed)) == []


# --------------------------------------------------------------- what a crash leaves of the WAL

def _wal_names(path: str | Path) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.startswith("wal-"))


def _fail_a_flush(db: lsmdb.DB, faults: Faults) -> list[bytes]:
    """Fill the default table until a flush of it was tried and failed (its SSTable
    cannot be created): its rotation closed a segment, left unsynced since only the
    memtable being flushed needs it.  Returns the keys written, in order."""
    faults.fail("open", lambda n: n.endswith(".sst"), errno.ENOSPC, times=None)
    keys: list[bytes] = []
    while not faults.hits:
        keys.append(b"k%04d" % len(keys))
        db.put(keys[-1], b"x" * 200)
    faults.clear()
    return keys


@pytest.mark.parametrize("cut", ["lost whole", "at a record boundary"])
def test_an_unsynced_segment_cut_short_cleanly_ends_the_replay(tmp_path, caplog, cut):
    """A power loss keeps every append to the live segment but drops the last records of
    the unsynced closed segment before it (all of them, or from a record boundary on):
    the live segment is not replayed, so what survives is a prefix of the writes."""
    path = tmp_path / "db"
    path.mkdir()
    layer = PowerLoss(str(path))
    with layer, caplog.at_level(logging.CRITICAL, logger="lsmdb"):
        db = lsmdb.open(str(path), auto_compaction=False)
        db.alter_table("default", **SMALL)
        with Faults(str(path)) as faults:
            keys = _fail_a_flush(db, faults)
        older, newer = _wal_names(path)
        db.put(b"later", b"in the live segment")
        keys.append(b"later")
        moment = layer.moment()
        db.close()
    layer.cleanup()
    image = {}
    for name, ino in moment.names(len(moment.ops)).items():
        data = moment.current[ino]
        if name == older:
            if cut == "lost whole":
                data = moment.synced.get(ino, b"")
            else:
                number = int(name.removeprefix("wal-").removesuffix(".log"))
                data = data[:read_segment(data, number).records[-1][0]]
        image[name] = data
    crashed = str(tmp_path / "crashed")
    layer.materialize(crashed, image)
    with caplog.at_level(logging.CRITICAL, logger="lsmdb"), lsmdb.open(crashed) as again:
        got = [again.get(k) is not None for k in keys]
    assert not got[-1], "a write in the live segment survived earlier ones lost"
    assert got == sorted(got, reverse=True)


def test_a_segment_sync_fsynced_is_read_strictly(tmp_path, caplog):
    """sync() fsyncs the unsynced closed segment a failed flush left; a byte changed in
    it afterwards is corruption, not a torn tail that would drop the later segment and
    the write sync() made durable."""
    path = str(tmp_path / "db")
    db = lsmdb.open(path, auto_compaction=False)
    db.alter_table("default", **SMALL)
    with Faults(path) as faults, caplog.at_level(logging.CRITICAL, logger="lsmdb"):
        _fail_a_flush(db, faults)
    older, newer = _wal_names(path)
    db.put(b"durable", b"made durable by sync()")
    db.sync()
    crashed = tmp_path / "crashed"
    shutil.copytree(path, crashed)                   # a crash, then a damaged byte
    db.close()
    damaged = bytearray((crashed / older).read_bytes())
    damaged[-5] ^= 0x40
    (crashed / older).write_bytes(bytes(damaged))
    with caplog.at_level(logging.CRITICAL, logger="lsmdb"), \
            pytest.raises(lsmdb.CorruptionError):
        lsmdb.open(str(crashed))
    assert (crashed / newer).exists()


def _format1_manifest() -> bytes:
    """The MANIFEST of an empty database as an lsmdb before format 2 wrote it (no "wal")."""
    payload = msgpack.packb({"next_file_number": 1, "next_table_id": 2, "last_seq": 0,
                             "tables": {"default": {"id": 1, "options": {}, "flushed_seq": 0,
                                                    "files": []}}}, use_bin_type=True)
    return MANIFEST_HEADER.pack(MANIFEST_MAGIC, 1, crc32(payload), len(payload)) + payload


def _format1_record(seq: int, key: bytes, value: bytes) -> bytes:
    """One WAL record of the default table as a headerless (format-1) segment holds it."""
    payload = encode_record(seq, [(1, key, value)])
    return WAL_HEADER.pack(crc32(payload), len(payload)) + payload


def test_segments_of_an_older_lsmdb_are_each_read_to_their_own_torn_tail(tmp_path):
    """An lsmdb before format 2 never fsynced a segment it closed: after a power loss an
    older segment may end torn while a newer one holds writes made durable with
    sync=True.  That lsmdb replayed every segment; so must the open that upgrades it."""
    path = tmp_path / "db"
    path.mkdir()
    (path / "MANIFEST").write_bytes(_format1_manifest())
    (path / "LOCK").write_bytes(b"")
    (path / "wal-000001.log").write_bytes(
        _format1_record(1, b"a", b"1") + _format1_record(2, b"b", b"2")
        + _format1_record(3, b"c", b"torn")[:9])
    (path / "wal-000002.log").write_bytes(_format1_record(4, b"d", b"synced"))
    for _ in range(2):                               # the upgrade, then the current format
        with lsmdb.open(str(path)) as db:
            assert [db.get(k) for k in (b"a", b"b", b"c", b"d")] == [b"1", b"2", None, b"synced"]


# --------------------------------------------------------------- a switch not known durable

def test_a_table_whose_creation_was_not_known_durable_keeps_its_synced_writes(tmp_path):
    """create_table raises SwitchedButNotSynced (its directory fsync failed) and a retry
    returns the table.  A write to it with sync=True, and sync(), survive a power loss;
    a write not yet durable, whose table a power loss took, never shows up in a table
    created after it."""
    path = tmp_path / "db"
    path.mkdir()
    layer = PowerLoss(str(path))
    with layer:
        db = lsmdb.open(str(path), auto_compaction=False)
        db.put(b"base", b"1", sync=True)
        with Faults(str(path)) as faults:
            faults.fail("fsync", lambda n: n == ".", errno.EIO)
            with pytest.raises(SwitchedButNotSynced):
                db.create_table("t")
        t = db.create_table("t", exist_ok=True)
        t.put(b"early", b"not durable")
        early = layer.image(dir_ops=0, tails="all")  # the old manifest, the record on disk
        t.put(b"k", b"v", sync=True)
        db.sync()
        synced = layer.image(tails="none")
        db.close()
    layer.cleanup()
    for name, image in (("early", early), ("synced", synced)):
        layer.materialize(str(tmp_path / name), image)
    with lsmdb.open(str(tmp_path / "synced")) as again:
        assert "t" in again.tables(), "the table of an acknowledged sync=True write is gone"
        assert (again.get(b"base"), again.table("t").get(b"k")) == (b"1", b"v")
    with lsmdb.open(str(tmp_path / "early")) as again:
        assert again.tables() == ["default"]
        assert list(again.create_table("other").scan()) == []
    with lsmdb.open(str(tmp_path / "early")) as again:
        assert list(again.table("other").scan()) == []


# --------------------------------------------------------------- close() racing the WAL

class _GatedLock:
    """Stands in for a lock: the thread named ``name`` sets ``arrived`` and waits for
    ``go`` before it acquires the lock; any other thread takes it at once."""

    def __init__(self, lock: Any, name: str) -> None:
        self._lock = lock
        self._name = name
        self.arrived = threading.Event()
        self.go = threading.Event()

    def __enter__(self) -> Any:
        if threading.current_thread().name == self._name:
            self.arrived.set()
            assert self.go.wait(30)
        return self._lock.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self._lock.__exit__(*exc)


def _gate_flush_mutex(db: lsmdb.DB, name: str) -> _GatedLock:
    """Gate the mutex that serialises flushes, WAL recoveries and close() for thread
    ``name``."""
    flusher = db._flusher
    gate = flusher.mutex = _GatedLock(flusher.mutex, name)
    return gate


@contextlib.contextmanager
def _sstable_creation_paused(name: str, started: threading.Event,
                             go: threading.Event) -> Iterator[None]:
    """The thread named ``name`` sets ``started`` and waits for ``go`` when it creates
    an SSTable: a flush that holds the flush mutex while its SSTable is written."""
    real_open = os.open

    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if threading.current_thread().name == name and flags & os.O_CREAT \
                and os.fsdecode(path).endswith(".sst"):
            started.set()
            assert go.wait(30)
        return real_open(path, flags, *args, **kwargs)

    os.open = open_
    try:
        yield
    finally:
        os.open = real_open


def test_a_wal_recovery_waiting_while_close_runs_writes_nothing(tmp_path):
    """A sync() that found the WAL failed waits for the flush mutex while close() runs
    (and fails to recover the WAL itself).  Once close() is done, that recovery raises
    DatabaseClosedError and leaves the directory alone: a manifest written from the
    closed handle's state would name none of the flushed SSTables."""
    path = str(tmp_path / "db")
    db = lsmdb.open(path, auto_compaction=False)
    rows = {b"k%03d" % i: b"flushed" for i in range(100)}
    for key, value in rows.items():
        db.put(key, value)
    db.flush()
    rows[b"m"] = b"in the WAL"
    db.put(b"m", b"in the WAL")
    gate = _gate_flush_mutex(db, "syncer")
    errors: list[BaseException] = []

    def syncer() -> None:
        try:
            db.sync()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=syncer, name="syncer")
    with Faults(path) as faults:
        faults.fail("write", lambda n: n.startswith("wal-"), errno.ENOSPC)
        with pytest.raises(OSError):
            db.put(b"b", GROWS)                       # the WAL has failed
        faults.fail("open", lambda n: n.endswith(".sst"), errno.ENOSPC, times=None)
        thread.start()
        assert gate.arrived.wait(30)                  # sync() waits to recover the WAL
        with pytest.raises(OSError):
            db.close()                                # cannot recover the WAL either
        faults.clear()                                # the disk has room again
    listing = sorted(os.listdir(path))
    manifest = Path(path, "MANIFEST").read_bytes()
    gate.go.set()
    thread.join(30)
    assert [type(e) for e in errors] == [lsmdb.DatabaseClosedError]
    assert sorted(os.listdir(path)) == listing
    assert Path(path, "MANIFEST").read_bytes() == manifest
    with lsmdb.open(path) as again:
        assert {k: again.get(k) for k in rows} == rows


def test_close_waiting_for_a_flush_while_a_write_fails_the_wal_keeps_earlier_writes(
        tmp_path, caplog):
    """close() waits for an automatic flush; meanwhile a sync=True write fails the WAL,
    whose fsyncs go on failing.  A write acknowledged before close() was called survives
    a power loss after close()."""
    path = tmp_path / "db"
    path.mkdir()
    layer = PowerLoss(str(path))
    in_flush, go = threading.Event(), threading.Event()
    with layer, caplog.at_level(logging.CRITICAL, logger="lsmdb"), \
            _sstable_creation_paused("filler", in_flush, go):
        db = lsmdb.open(str(path), auto_compaction=False)
        t = db.create_table("t", **SMALL)

        def filler() -> None:                         # until t's automatic flush starts
            for i in range(1000):
                if in_flush.is_set():
                    return
                t.put(b"t%04d" % i, b"y" * 300)

        fill = threading.Thread(target=filler, name="filler")
        fill.start()
        assert in_flush.wait(30)                      # the flush holds the flush mutex
        db.put(b"a", b"acknowledged before close()")
        gate = _gate_flush_mutex(db, "closer")
        gate.go.set()                                 # only announce the closer
        outcome: list[BaseException | None] = []

        def closer() -> None:
            try:
                db.close()
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        close = threading.Thread(target=closer, name="closer")
        close.start()
        assert gate.arrived.wait(30)                  # close() waits for the flush mutex
        with Faults(str(path)) as faults:
            faults.fail("fsync", lambda n: n.startswith("wal-"), errno.EIO, times=None)
            with pytest.raises(OSError):
                db.put(b"x", b"fails the WAL", sync=True)
            go.set()
            fill.join(30)
            close.join(30)
        assert len(outcome) == 1 and (outcome[0] is None or isinstance(outcome[0], OSError))
        image = layer.image(tails="none")
    layer.cleanup()
    layer.materialize(str(tmp_path / "image"), image)
    with lsmdb.open(str(tmp_path / "image")) as again:
        assert again.get(b"a") == b"acknowledged before close()"


# --------------------------------------------------------------- the lock; foreign files

def _lock_refused_to_another_process(path: str) -> bool:
    """Whether another process is refused the POSIX lock on the database's LOCK."""
    probe = ("import fcntl, os, sys\n"
             "fd = os.open(sys.argv[1], os.O_RDWR)\n"
             "try:\n"
             "    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
             "except OSError:\n"
             "    sys.exit(3)\n")
    code = subprocess.run([sys.executable, "-c", probe, os.path.join(path, "LOCK")],
                          timeout=60).returncode
    assert code in (0, 3), code
    return code == 3


def test_a_refused_second_open_in_the_same_process_keeps_the_lock(tmp_path):
    """A second open of a database this process holds is refused; refusing it must not
    drop the process's lock, so another process is still refused too."""
    path = str(tmp_path / "db")
    with lsmdb.open(path) as db:
        assert _lock_refused_to_another_process(path)
        with pytest.raises(lsmdb.DatabaseLockedError, match="this process"):
            lsmdb.open(path)
        assert _lock_refused_to_another_process(path)
        db.put(b"k", b"v")
    assert not _lock_refused_to_another_process(path)


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_fifo_or_directory_under_a_wal_name_neither_blocks_nor_breaks_the_open(tmp_path,
                                                                                  kind):
    """A FIFO or a directory planted under a WAL segment's name numbered past the
    manifest's next file number: the open neither blocks on it nor fails."""
    path = tmp_path / "db"
    with lsmdb.open(str(path)) as db:
        db.put(b"k", b"v")
    planted = path / "wal-000999.log"
    if kind == "fifo":
        os.mkfifo(planted)
    else:
        planted.mkdir()
    outcome: list[Any] = []

    def open_it() -> None:
        try:
            with lsmdb.open(str(path)) as again:
                outcome.append(again.get(b"k"))
        except Exception as exc:
            outcome.append(exc)

    opener = threading.Thread(target=open_it, daemon=True)
    opener.start()
    opener.join(10)
    blocked = opener.is_alive()
    if blocked:                                       # in open() of the FIFO: release it
        os.close(os.open(planted, os.O_WRONLY | os.O_NONBLOCK))
        opener.join(10)
    assert not blocked, "the open blocked on the FIFO"
    assert outcome == [b"v"]


@pytest.mark.parametrize("name", ["LOCK", "MANIFEST.tmp", "STATS.tmp", "STATS"])
@pytest.mark.parametrize("kind", ["directory", "fifo", "symlink"])
def test_a_non_file_planted_where_lsmdb_keeps_a_file_of_its_own_is_set_aside(tmp_path, name,
                                                                            kind):
    """A directory, FIFO or link where lsmdb creates a file of its own -- LOCK, a
    temp file -- or renames one over a directory (STATS) neither blocks a
    read-write open nor a write: it is moved into lost/ as it is, and the
    database goes on; a link or FIFO a rename replaces is replaced itself."""
    path = tmp_path / "db"
    with lsmdb.open(str(path)) as db:
        db.put(b"k", b"v")
    planted = path / name
    if planted.exists():
        planted.unlink()
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    if kind == "directory":
        planted.mkdir()
        (planted / "inside").write_bytes(b"kept")
    elif kind == "fifo":
        os.mkfifo(planted)
    else:
        planted.symlink_to(outside)
    with lsmdb.open(str(path)) as db:
        assert db.get(b"k") == b"v"
        db.put(b"k2", b"v2")
        db.flush()
    with lsmdb.open(str(path), read_only=True) as db:
        assert (db.get(b"k"), db.get(b"k2")) == (b"v", b"v2")
    with lsmdb.open(str(path)) as db:
        assert db.get(b"k2") == b"v2"
    lost = path / "lost" / name
    if kind == "symlink" or (name == "STATS" and kind == "fifo"):
        # a rename over STATS replaces a link or FIFO itself; a leftover link
        # under a temp name is removed (the open's sweep), or set aside
        assert not os.path.lexists(lost) or lost.is_symlink()
    else:
        assert os.path.lexists(lost) and not lost.is_symlink()
    if kind == "directory":
        assert (lost / "inside").read_bytes() == b"kept"
    assert outside.read_bytes() == b"precious"
    assert not (path / name).is_symlink()
    assert not (path / name).exists() or (path / name).is_file()


# --------------------------------------------------------------- lsmdb repair

class _RepairCrash(BaseException):
    """A crash inside repair (a BaseException: nothing may catch it)."""


def test_repair_interrupted_by_a_crash_then_run_again_keeps_what_one_repair_keeps(
        tmp_path, monkeypatch, caplog):
    """lsmdb repair crashes after it set a damaged SSTable aside and before its manifest
    switch; run again, it keeps every entry that still reads, as one uninterrupted repair
    does, instead of setting the salvaged copy aside as a crash's leftover."""
    path = tmp_path / "db"
    rows = {b"k%03d" % i: b"v%03d" % i for i in range(120)}
    with lsmdb.open(str(path), auto_compaction=False) as db:
        db.alter_table("default", block_size_bytes=256)
        for key, value in rows.items():
            db.put(key, value)
        db.flush()
    (victim,) = path.glob("*.sst")
    reader = SSTableReader(str(victim))
    damaged_at = reader.index_offsets[1] + 3        # the second data block
    reader.close()
    data = bytearray(victim.read_bytes())
    data[damaged_at] ^= 0xFF
    victim.write_bytes(bytes(data))
    once = tmp_path / "once"
    shutil.copytree(path, once)

    def crash(self: Any, p: str) -> None:
        raise _RepairCrash

    with caplog.at_level(logging.CRITICAL, logger="lsmdb"):
        repair_database(str(once))
        monkeypatch.setattr(lsmdb.manifest.Manifest, "write", crash)
        with pytest.raises(_RepairCrash):
            repair_database(str(path))
        monkeypatch.undo()
        repair_database(str(path))
    with lsmdb.open(str(once)) as db:
        kept = dict(db.scan())
    assert 0 < len(rows) - len(kept) < 40 and kept.items() <= rows.items()
    with lsmdb.open(str(path)) as db:
        assert dict(db.scan()) == kept


def test_repair_replays_only_the_wal_segments_the_manifest_names(tmp_path, caplog):
    """A sync=True write raises (its segment's fsync failed); the recovery retires that
    segment, but cannot unlink it.  lsmdb repair must not bring the write that raised
    back, after a write acknowledged later."""
    path = str(tmp_path / "db")
    db = lsmdb.open(path, auto_compaction=False)
    db.put(b"a", b"1")
    db.flush()
    with Faults(path) as faults, caplog.at_level(logging.CRITICAL, logger="lsmdb"):
        faults.fail("fsync", lambda n: n.startswith("wal-"), errno.EIO)
        with pytest.raises(OSError):
            db.put(b"k2", b"raised", sync=True)
        (failed,) = _wal_names(path)
        faults.fail("unlink", lambda n: n == failed, errno.EIO)
        db.put(b"k3", b"acknowledged later", sync=True)
    db.close()
    assert failed in os.listdir(path)
    with caplog.at_level(logging.CRITICAL, logger="lsmdb"):
        repair_database(path)
    with lsmdb.open(path) as again:
        assert (again.get(b"a"), again.get(b"k2"), again.get(b"k3")) == (
            b"1", None, b"acknowledged later")


def test_recovery_says_what_an_open_replayed_and_removed(tmp_path):
    path = str(tmp_path / "db")
    with lsmdb.open(path) as db:
        assert db.recovery == {"segments": 0, "records": 0, "torn": [], "removed": [],
                               "set_aside": [], "flushed": []}
        for i in range(5):
            db.put(b"k%d" % i, b"v")
        db.sync()
        crashed = tmp_path / "crashed"
        shutil.copytree(path, crashed)                  # the process dies here
    (crashed / "sst-999999.sst.tmp").write_bytes(b"half a file")
    with lsmdb.open(str(crashed)) as again:
        rec = again.recovery
        assert rec["records"] == 5 and rec["segments"] == 1 and rec["torn"] == []
        assert rec["removed"] == ["sst-999999.sst.tmp"]
        again.flush()
    with lsmdb.open(str(crashed)) as clean:                # flushed: nothing to replay
        assert clean.recovery["records"] == 0 and clean.get(b"k4") == b"v"
