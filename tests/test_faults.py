"""Fault injection: simulated crashes that keep only what was fsynced, and I/O errors.

* Crash at every fsync point.  A deterministic workload -- sync writes,
  batches, deletes, flushes (automatic and explicit), background compaction,
  ``db.compact``, ``rebuild_filters``, create/alter/drop table, keyed
  filters, close and reopen with a recovery flush -- runs under
  :class:`faultfs.FaultFS`, which raises :class:`faultfs.Crash` at its n-th
  fsync (before or after it takes effect).  The directory a power cut would
  leave is rebuilt and opened: it must hold exactly the acknowledged writes
  (the one in-flight call may be there too, whole), and ``verify`` must be
  clean.  Every n is tried.
* I/O errors (ENOSPC, EIO) in flush, compaction and the manifest switch: the
  caller gets the OSError, the old files keep serving every read, a retry
  succeeds, and a reopen finds everything.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import lsmdb
import lsmdb.stats
from lsmdb.files import SwitchedButNotSynced
from lsmdb.verify import verify_database
from tests.conftest import SMALL
from tools import load_test_layer

if TYPE_CHECKING:
    from tests.support.faultfs import Crash, FaultFS, IOFaults
else:
    faultfs = load_test_layer("faultfs")
    Crash, FaultFS, IOFaults = faultfs.Crash, faultfs.FaultFS, faultfs.IOFaults

# Two runs of one workload must write the same bytes: one database id for all.
pytestmark = [pytest.mark.skipif(not os.path.isdir("/proc/self/fd"),
                                 reason="the fault layer reads descriptors through /proc"),
              pytest.mark.usefixtures("fixed_db_id")]



@pytest.fixture(autouse=True)
def _no_timed_counter_saves(monkeypatch):
    # The background thread saves STATS every few seconds; a save at a random
    # moment would make the sequence of fsync points depend on the clock.
    monkeypatch.setattr(lsmdb.stats, "STATS_INTERVAL_SECONDS", 1e9)


def errors_of(path: str) -> list[str]:
    return [str(p) for p in verify_database(path) if p.severity == "error"]


# ------------------------------------------------------------------ the model
class Recorder:
    """Acknowledged state of the workload: tables and their rows, plus the call in flight."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[bytes, bytes | None]] = {"default": {}}
        self.inflight: tuple[str, str | None, list[tuple[str, bytes, bytes | None]]] | None = None
        self.acked = 0

    def begin(self, kind: str, table: str | None = None,
              writes: Iterable[tuple[str, bytes, bytes | None]] = ()) -> None:
        self.inflight = (kind, table, list(writes))

    def ack(self) -> None:
        assert self.inflight is not None
        self._apply(self.tables, self.inflight)
        self.inflight = None
        self.acked += 1

    @staticmethod
    def _apply(tables: dict[str, dict[bytes, bytes | None]], op: Any) -> None:
        kind, table, writes = op
        if kind == "create":
            tables[table] = {}
        elif kind == "drop":
            del tables[table]
        for t, key, value in writes:
            tables[t][key] = value

    def allowed(self) -> list[dict[str, dict[bytes, bytes]]]:
        """The states a crash may leave: acknowledged, and acknowledged + in flight."""
        states = [self.tables]
        if self.inflight is not None:
            alt = {t: dict(rows) for t, rows in self.tables.items()}
            self._apply(alt, self.inflight)
            states.append(alt)
        return [{t: {k: v for k, v in rows.items() if v is not None}
                 for t, rows in s.items()} for s in states]


def read_all(db: lsmdb.DB, rec: Recorder) -> dict[str, dict[bytes, bytes]]:
    """Every table's rows by scan, after checking that get() agrees with the scan."""
    out = {}
    for name in db.tables():
        table = db.table(name)
        rows = dict(table.scan())
        keys = set(rows) | set(rec.tables.get(name, {}))
        if rec.inflight is not None:
            keys |= {k for t, k, _v in rec.inflight[2] if t == name}
        for key in keys:
            assert table.get(key) == rows.get(key), (name, key)
        out[name] = rows
    return out


# --------------------------------------------------------------- the workload
def value(tag: str, size: int = 1000) -> bytes:
    return tag.encode() + b"=" + bytes([len(tag) % 251]) * size


def workload(path: str, rec: Recorder) -> None:
    """Writes, flushes, compactions and table changes whose fsyncs come in a fixed order.

    Values of about 1 KB fill a 4 KiB memtable in four writes.  Background
    compaction runs only while the main thread waits for it, so the order of
    fsync points does not depend on thread timing.
    """
    def put(db: lsmdb.DB, table: str, key: bytes, val: bytes) -> None:
        rec.begin("write", writes=[(table, key, val)])
        db.table(table).put(key, val)
        rec.ack()

    def delete(db: lsmdb.DB, table: str, key: bytes) -> None:
        rec.begin("write", writes=[(table, key, None)])
        db.table(table).delete(key)
        rec.ack()

    def call(kind: str, table: str | None, fn: Callable[[], Any]) -> Any:
        rec.begin(kind, table)
        result = fn()
        rec.ack()
        return result

    # Phase 1: automatic flushes, background compaction.
    db = call("open", None, lambda: lsmdb.open(path, sync=True))
    try:
        call("create", "tiered", lambda: db.create_table("tiered", min_threshold=2, **SMALL))
        call("create", "lev", lambda: db.create_table(
            "lev", compaction="leveled", target_file_size_bytes=65536, **SMALL))
        for i in range(9):     # two automatic flushes of "tiered", then a compaction
            put(db, "tiered", b"t%03d" % (i % 6), value(f"p1.{i}"))
            db.wait_for_compactions()
        delete(db, "tiered", b"t003")
        batch = [("tiered", b"t004", None), ("lev", b"l1", value("b1", 50)),
                 ("default", b"d1", value("b1", 60))]
        rec.begin("write", writes=batch)
        with db.batch() as b:
            for t, k, v in batch:
                if v is None:
                    b.delete(k, table=t)
                else:
                    b.put(k, v, table=t)
        rec.ack()
        for i in range(5):
            put(db, "lev", b"l%03d" % (i * 7 % 5), value(f"p1.lev.{i}"))
            db.wait_for_compactions()
    finally:
        _close(db, rec)

    # Phase 2: explicit flush and compactions, filter rebuild, table changes.
    db = call("open", None, lambda: lsmdb.open(path, sync=True, auto_compaction=False))
    try:
        for i in range(3):
            put(db, "default", b"d%03d" % i, value(f"p2.{i}", 300))
        call("flush", None, db.flush)
        delete(db, "default", b"d002")
        call("compact", "default", lambda: db.compact("default"))
        call("alter", "tiered", lambda: db.alter_table("tiered", bloom_filter_fp_chance=0.001))
        call("rebuild", "tiered", lambda: db.rebuild_filters("tiered"))
        call("create", "keyed", lambda: db.create_table("keyed", bloom_filter_hash="keyed",
                                                        **SMALL))
        for i in range(4):     # the first flush of a keyed table creates FILTER_KEY
            put(db, "keyed", b"k%03d" % i, value(f"p2.k.{i}"))
        call("compact", None, db.compact)
        call("drop", "lev", lambda: db.drop_table("lev"))
        for i in range(5):     # 5 KB in the default 4 MiB memtable: no flush yet
            put(db, "default", b"r%03d" % i, value(f"p2.r.{i}"))
        call("alter", "default", lambda: db.alter_table("default", memtable_size_bytes=4096))
    finally:
        _close(db, rec)

    # Phase 3: the open replays the WAL and flushes the oversized memtable.
    db = call("open", None, lambda: lsmdb.open(path, sync=True, auto_compaction=False))
    try:
        put(db, "default", b"d001", value("p3.0"))
        delete(db, "tiered", b"t005")
    finally:
        _close(db, rec)


def _close(db: lsmdb.DB, rec: Recorder) -> None:
    """Close as an acknowledged call -- or, while a crash is on its way out of the
    workload (a call still in flight), quietly: the crash must not be replaced."""
    if rec.inflight is not None:
        try:
            db.close()
        except Crash:
            pass
        return
    db.close()  # a close writes nothing of its own: not "in flight" while it runs
    rec.begin("close")
    rec.ack()


def run_under(fs: FaultFS, path: str, rec: Recorder | None = None) -> Recorder:
    rec = Recorder() if rec is None else rec
    logging.disable(logging.CRITICAL)   # the background thread logs the Crash it met
    urandom = os.urandom
    os.urandom = lambda n: bytes(range(n))   # the same FILTER_KEY (and keyed filters) each run
    try:
        with fs:
            try:
                workload(path, rec)
            except Crash:
                pass
    finally:
        os.urandom = urandom
        logging.disable(logging.NOTSET)
    return rec


def check_image(image: str, rec: Recorder) -> None:
    """Open the rebuilt directory: the acknowledged state, or that plus the call in flight."""
    if os.path.exists(os.path.join(image, "MANIFEST")):
        assert errors_of(image) == []
    else:
        assert rec.acked == 0, "the first open was acknowledged but no MANIFEST survived"
    with lsmdb.open(image, auto_compaction=False) as db:
        found = read_all(db, rec)
    allowed = rec.allowed()
    assert found in allowed, _diff(found, allowed)
    assert errors_of(image) == []
    with lsmdb.open(image, auto_compaction=False) as db:   # recovery's own writes were sound
        assert read_all(db, rec) == found


def _diff(found: dict[str, dict[bytes, bytes]],
          allowed: list[dict[str, dict[bytes, bytes]]]) -> str:
    want = allowed[0]
    lines = [f"tables found {sorted(found)}, acknowledged {sorted(want)}"
             + (f" or {sorted(allowed[1])}" if len(allowed) > 1 else "")]
    for t in sorted(set(found) & set(want)):
        for k in sorted(set(found[t]) | set(want[t])):
            if found[t].get(k) != want[t].get(k):
                lines.append(f"  {t} {k!r}: found {_short(found[t].get(k))}, "
                             f"acknowledged {_short(want[t].get(k))}")
    return "\n".join(lines[:12])


def _short(v: bytes | None) -> str:
    return "nothing" if v is None else repr(v.split(b"=")[0])


# ------------------------------------------------------------------- the layer
def test_faultfs_keeps_only_what_was_synced(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    fs = FaultFS(str(d))
    with fs:
        (d / "old").write_bytes(b"old")
        fd = os.open(d / "old", os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        with open(d / "old", "ab") as f:
            f.write(b" appended, never synced")        # dropped
        with open(d / "new.tmp", "wb") as f:
            f.write(b"synced, then renamed")
            f.flush()
            os.fsync(f.fileno())
        os.replace(d / "new.tmp", d / "renamed")
        (d / "unsynced").write_bytes(b"x")              # name synced below, data never
        dfd = os.open(d, os.O_RDONLY)
        os.fsync(dfd)                                   # listing: old, renamed, unsynced
        os.close(dfd)
        os.unlink(d / "renamed")                        # no directory fsync after these:
        os.replace(d / "old", d / "moved")              # both undone by a crash
        (d / "late").write_bytes(b"y")
        assert fs.labels == ["file old", "file new.tmp", "dir"]
        assert fs.crash_image() == {"old": b"old", "renamed": b"synced, then renamed",
                                    "unsynced": b""}
        # A journal that keeps names (but not data): the names of now, synced contents.
        assert fs.crash_image(names_now=True) == {"moved": b"old", "unsynced": b"",
                                                  "late": b""}
    fs.cleanup()


def test_faultfs_crash_raises_and_stays_crashed(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    for when, synced in (("before", b""), ("after", b"1")):
        fs = FaultFS(str(d), crash_at=2, when=when)
        with fs:
            with open(d / f"f-{when}", "wb") as f:
                f.write(b"1")
                f.flush()
                dfd = os.open(d, os.O_RDONLY)
                os.fsync(dfd)
                with pytest.raises(Crash):
                    os.fsync(f.fileno())
                with pytest.raises(Crash):                 # every later fsync too
                    os.fsync(dfd)
                os.close(dfd)
        assert fs.crash_image()[f"f-{when}"] == synced
        fs.cleanup()


def test_fault_layers_pass_late_calls_through_after_they_are_removed(tmp_path):
    """A background thread may hold a wrapper fetched while a layer was in place."""
    d = tmp_path / "d"
    d.mkdir()
    for layer in (FaultFS(str(d)), IOFaults(str(d))):
        with layer:
            late_fsync, late_write = os.fsync, os.write
            if isinstance(layer, IOFaults):
                layer.fail_fsync(lambda name: True, errno.EIO, times=None)
        assert os.fsync is not late_fsync
        fd = os.open(d / "f", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        assert late_write(fd, b"abc") == 3
        late_fsync(fd)                                   # no KeyError, no injected fault
        os.close(fd)
    assert (d / "f").read_bytes() == b"abcabc"


# ------------------------------------------------------------ crash at every fsync
@dataclass
class Point:
    """What a crash at one fsync point leaves, and what had been acknowledged by then."""

    n: int
    label: str
    when: str                       # "before" or "after" the fsync took effect
    thread: str
    image: dict[str, bytes]         # names of the last synced listing
    image_now: dict[str, bytes]     # names of the moment (a journal that keeps names)
    tables: dict[str, dict[bytes, bytes | None]]
    inflight: Any
    acked: int

    def recorder(self) -> Recorder:
        rec = Recorder()
        rec.tables = {t: dict(rows) for t, rows in self.tables.items()}
        rec.inflight, rec.acked = self.inflight, self.acked
        return rec

    def __str__(self) -> str:
        doing = self.inflight[:2] if self.inflight else None
        return f"crash {self.when} fsync #{self.n} ({self.label}; {self.thread}; in flight {doing})"


@pytest.fixture(scope="module")
def scratch():
    """A directory for many small databases: tmpfs when there is one (the fault
    layer simulates durability, so the real medium only costs time)."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    d = tempfile.mkdtemp(prefix="lsmdb-faults-", dir=base)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def points(scratch):
    """Every fsync point of one run of the workload, as seen just before and just after it.

    A crash raised at an fsync point leaves exactly what the observer sees
    there (the durable state and the acknowledged calls cannot change
    between the two), so one run covers every point;
    ``test_crash_by_exception`` checks that equivalence by really raising.
    """
    captured: list[Point] = []
    rec = Recorder()

    def observe(fs: FaultFS, when: str) -> None:
        captured.append(Point(fs.count, fs.labels[-1], when, threading.current_thread().name,
                              fs.crash_image(), fs.crash_image(names_now=True),
                              {t: dict(rows) for t, rows in rec.tables.items()},
                              rec.inflight, rec.acked))

    mp = pytest.MonkeyPatch()
    mp.setattr(lsmdb.stats, "STATS_INTERVAL_SECONDS", 1e9)
    try:
        path = str(scratch / "capture" / "db")
        fs = FaultFS(path, observer=observe)
        run_under(fs, path, rec)
        fs.cleanup()
    finally:
        mp.undo()
    assert not fs.crashed and rec.inflight is None
    return captured


def check_points(points: list[Point], scratch: Path, names_now: bool) -> list[str]:
    """Check the image of each point (each distinct image and model once); the failures."""
    failures: dict[str, list[str]] = {}
    seen = set()
    for i, point in enumerate(points):
        image = point.image_now if names_now else point.image
        key = (tuple(sorted((name, id(data)) for name, data in image.items())),
               repr(point.recorder().allowed()), point.acked == 0)
        if key in seen:
            continue
        seen.add(key)
        dest = scratch / f"{'now' if names_now else 'synced'}-{i}"
        os.makedirs(dest)
        for name, data in image.items():
            (dest / name).write_bytes(data)
        try:
            check_image(str(dest), point.recorder())
        except Exception as exc:
            why = f"{type(exc).__name__}: " + "\n    ".join(str(exc).splitlines()[:4])
            failures.setdefault(why.replace(str(dest), "<db>"), []).append(str(point))
        shutil.rmtree(dest)
    return [f"{why}\n    at {len(where)} points, first: {where[0]}"
            for why, where in failures.items()]


def test_workload_covers_every_kind_of_fsync(points):
    labels = [p.label for p in points if p.when == "before"]
    kinds = {label.rsplit(".", 1)[-1] for label in labels}
    assert {"dir", "sst", "tmp", "log"} <= kinds
    assert {"file FILTER_KEY", "file MANIFEST.tmp", "file STATS.tmp"} <= set(labels)
    assert any(p.thread == "lsmdb-compaction" and p.label.endswith(".sst") for p in points), \
        "no background compaction"
    assert 100 < len(labels) < 300


def test_crash_at_every_fsync_point(points, scratch):
    """Names as of the last directory fsync, contents as of each file's last fsync."""
    failures = check_points(points, scratch, names_now=False)
    assert not failures, "\n".join(failures)


def test_crash_at_every_fsync_point_names_journaled(points, scratch):
    """Names as they were at the crash (a journal keeps them), contents only as synced."""
    failures = check_points(points, scratch, names_now=True)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("k", range(12))
def test_crash_by_exception(points, scratch, k):
    """Really raise Crash at a sample of points: four in the background thread's
    compaction, eight spread over the whole run; before and after the fsync."""
    befores = [p for p in points if p.when == "before"]
    background = [p for p in befores if p.thread != "MainThread"]
    sample = background[k * len(background) // 4] if k < 4 \
        else befores[(k - 4) * len(befores) // 8 + k % 3]
    n, when = sample.n, ("before", "after")[k % 2]
    point = next(p for p in points if p.n == n and p.when == when)
    path = str(scratch / f"exc-{k}" / "db")
    fs = FaultFS(path, crash_at=n, when=when)
    rec = run_under(fs, path)
    fs.cleanup()
    assert fs.crashed
    assert fs.labels == [p.label for p in befores][:n], "the workload took another path"
    assert (rec.tables, rec.inflight, rec.acked) == (point.tables, point.inflight, point.acked)
    for names_now in (False, True):
        dest = str(scratch / f"exc-{k}" / f"image-{names_now}")
        image = fs.materialize(dest, names_now=names_now)
        assert image == (point.image_now if names_now else point.image)
        if not names_now:
            check_image(dest, rec)


def test_empty_filter_key_left_by_a_crash(tmp_path):
    """FILTER_KEY is created, then written and fsynced: a crash in between (a journal
    that keeps the name) leaves it empty.  Keyed filters then fail open, but the
    table must still flush and read."""
    path = str(tmp_path / "db")
    with lsmdb.open(path) as db:
        db.create_table("t", bloom_filter_hash="keyed")
        db.table("t").put(b"k", b"v")
    Path(path, "FILTER_KEY").write_bytes(b"")
    with lsmdb.open(path) as db:
        db.flush("t")
        assert db.table("t").get(b"k") == b"v"
    assert errors_of(path) == []


def test_crash_inside_the_first_open_leaves_an_openable_directory(tmp_path):
    """Killed inside the very first open(), after MANIFEST.tmp was created and before
    the rename: nothing was acknowledged, and the directory holds only lsmdb's own
    files, so opening it again must create the database."""
    path = tmp_path / "db"
    path.mkdir()
    (path / "LOCK").write_bytes(b"")
    (path / "MANIFEST.tmp").write_bytes(b"")
    with lsmdb.open(str(path)) as db:
        db.put(b"k", b"v")
    with lsmdb.open(str(path)) as db:
        assert db.get(b"k") == b"v"


# ----------------------------------------------------------------- I/O errors
def is_sst(name: str) -> bool:
    return name.endswith(".sst")


def sst_files(path: str) -> set[str]:
    return {n for n in os.listdir(path) if is_sst(n)}


def fill(db: lsmdb.DB, table: str, prefix: bytes, n: int, size: int = 100) -> dict[bytes, bytes]:
    rows = {}
    for i in range(n):
        key = prefix + b"%04d" % i
        rows[key] = prefix + b"-v%d-" % i + b"x" * size
        db.table(table).put(key, rows[key])
    return rows


def assert_rows(db: lsmdb.DB, table: str, rows: dict[bytes, bytes]) -> None:
    t = db.table(table)
    for key, val in rows.items():
        assert t.get(key) == val, key
    assert dict(t.scan()) == rows


FLUSH_FAULTS = {
    "sst-fsync-ENOSPC": lambda f: f.fail_fsync(is_sst, errno.ENOSPC),
    "sst-fsync-EIO": lambda f: f.fail_fsync(is_sst, errno.EIO),
    "sst-write-ENOSPC": lambda f: f.fail_write(is_sst, errno.ENOSPC, after_bytes=700),
    "manifest-write-ENOSPC": lambda f: f.fail_write(lambda n: n == "MANIFEST.tmp",
                                                    errno.ENOSPC, after_bytes=10),
    "manifest-fsync-EIO": lambda f: f.fail_fsync(lambda n: n == "MANIFEST.tmp", errno.EIO),
    # A flush fsyncs the directory for its new WAL segment, then for the manifest.
    "wal-dir-fsync-EIO": lambda f: f.fail_fsync(lambda n: n == ".", errno.EIO),
    "manifest-dir-fsync-EIO": lambda f: f.fail_fsync(lambda n: n == ".", errno.EIO, skip=1),
}


@pytest.mark.parametrize("fault", sorted(FLUSH_FAULTS))
@pytest.mark.parametrize("then", ["retry", "reopen"])
def test_flush_error_keeps_the_database_consistent(tmp_path, fault, then):
    path = str(tmp_path / "db")
    with lsmdb.open(path, auto_compaction=False) as db:
        db.create_table("t", block_size_bytes=256)
        old = fill(db, "t", b"a", 40)
        db.flush()
        new = fill(db, "t", b"b", 40)
        files = sst_files(path)
        with IOFaults(path) as faults:
            FLUSH_FAULTS[fault](faults)
            with pytest.raises(OSError) as info:
                db.flush("t")
            assert faults.hits == 1
        assert info.value.errno in (errno.ENOSPC, errno.EIO)
        assert_rows(db, "t", {**old, **new})          # memtable data still served
        if fault == "manifest-dir-fsync-EIO":
            # The new manifest was already in place: the flush happened and
            # must be kept (rolling back would delete a file it names).
            assert isinstance(info.value, SwitchedButNotSynced)
            assert len(sst_files(path)) == len(files) + 1
            assert len(db.sstables("t")) == 2
        else:
            assert sst_files(path) == files           # no half-written file left
            assert len(db.sstables("t")) == 1
        if then == "retry":
            db.flush("t")
            assert len(db.sstables("t")) == 2, "the retried flush wrote no SSTable"
            db.table("t").put(b"after", b"the error")
            new[b"after"] = b"the error"
            assert_rows(db, "t", {**old, **new})
    assert errors_of(path) == []
    with lsmdb.open(path, auto_compaction=False) as db:
        assert_rows(db, "t", {**old, **new})
        db.flush("t")
        more = fill(db, "t", b"c", 10)
    with lsmdb.open(path) as db:
        assert_rows(db, "t", {**old, **new, **more})
    assert errors_of(path) == []


def test_flush_error_inside_a_write(tmp_path, caplog):
    """A write whose automatic flush fails: every write stays readable, a later flush works.

    (Whether the write that triggered the flush reports the error is lsmdb's
    choice; either way it is durable in the WAL and applied.)
    """
    path = str(tmp_path / "db")
    rows = {}
    with lsmdb.open(path, auto_compaction=False) as db:
        db.create_table("t", **SMALL)
        with IOFaults(path) as faults, caplog.at_level(logging.ERROR, logger="lsmdb"):
            faults.fail_fsync(is_sst, errno.ENOSPC)
            for i in range(30):
                key = b"k%03d" % i
                rows[key] = b"v%d" % i + b"y" * 200
                try:
                    db.table("t").put(key, rows[key])
                except OSError:
                    pass
                if faults.hits:
                    break
            assert faults.hits == 1
        assert not db.sstables("t")
        assert_rows(db, "t", rows)
        for i in range(30, 50):        # the next automatic flush succeeds
            key = b"k%03d" % i
            rows[key] = b"v%d" % i + b"y" * 200
            db.table("t").put(key, rows[key])
        assert db.sstables("t")
        assert_rows(db, "t", rows)
    with lsmdb.open(path) as db:
        assert_rows(db, "t", rows)
    assert errors_of(path) == []


COMPACTION_FAULTS = {
    "sst-write-ENOSPC": lambda f: f.fail_write(is_sst, errno.ENOSPC, after_bytes=1000),
    "sst-fsync-ENOSPC": lambda f: f.fail_fsync(is_sst, errno.ENOSPC),
    "second-output-sst-write-EIO": lambda f: f.fail_write(is_sst, errno.EIO, after_bytes=1000,
                                                          skip=1),
    "manifest-fsync-ENOSPC": lambda f: f.fail_fsync(lambda n: n == "MANIFEST.tmp",
                                                    errno.ENOSPC),
    "manifest-dir-fsync-EIO": lambda f: f.fail_fsync(lambda n: n == ".", errno.EIO),
}


@pytest.mark.parametrize("strategy,fault", [
    (strategy, fault) for strategy in ("size_tiered", "leveled")
    for fault in sorted(COMPACTION_FAULTS)
    if strategy == "leveled" or not fault.startswith("second-output")])   # one output only
def test_compaction_error_keeps_the_database_consistent(tmp_path, fault, strategy):
    path = str(tmp_path / "db")
    # Uncompressed: the sizes below (a write cut after 1000 bytes, two leveled outputs)
    # are of the data as written.
    options = {"compaction": strategy, "block_size_bytes": 1024, "compression": "none"}
    if strategy == "leveled":
        options["target_file_size_bytes"] = 65536
    # The faults reach this process's calls: the merge runs here (the worker
    # process's failures: tests/test_worker.py).
    with lsmdb.open(path, auto_compaction=False, compaction_process=False) as db:
        db.create_table("t", **options)
        rows: dict[bytes, bytes] = {}
        for part in range(4):        # > 64 KiB after the merge: two leveled outputs
            rows.update(fill(db, "t", b"k", 600, size=100 + part))   # overwrites
            rows.update(fill(db, "t", b"p%d" % part, 50))
            db.table("t").delete(b"k%04d" % part)
            rows.pop(b"k%04d" % part)
            db.flush()
        files = sst_files(path)
        with IOFaults(path) as faults:
            COMPACTION_FAULTS[fault](faults)
            with pytest.raises(OSError) as info:
                db.compact("t")
            assert faults.hits == 1
        if fault == "manifest-dir-fsync-EIO":
            # The switch is visible: outputs served, inputs kept on disk until
            # the switch is known durable (the next open sweeps them).
            assert isinstance(info.value, SwitchedButNotSynced)
            assert files < sst_files(path)
            assert len(db.sstables("t")) < 4
        else:
            assert sst_files(path) == files             # inputs kept, outputs removed
            assert len(db.sstables("t")) == 4
        assert_rows(db, "t", rows)
    assert errors_of(path) == []
    with lsmdb.open(path, auto_compaction=False) as db:
        assert_rows(db, "t", rows)
        db.compact("t")
        assert len(db.sstables("t")) < 4
        assert_rows(db, "t", rows)
    with lsmdb.open(path) as db:
        assert_rows(db, "t", rows)
    assert errors_of(path) == []


@pytest.mark.parametrize("fault", ["write", "fsync"])
def test_background_compaction_error_is_reported_and_retried(tmp_path, caplog, fault):
    path = str(tmp_path / "db")

    def background(thread: threading.Thread) -> bool:
        return thread.name == "lsmdb-compaction"  # a compaction's thread, not the flush one

    with lsmdb.open(path, compaction_process=fault == "fsync") as db:  # writes: merged here
        db.create_table("t", min_threshold=2, **SMALL)
        with IOFaults(path) as faults:
            # Every attempt fails while the faults are in place (a retry that came
            # before the count below would otherwise leave nothing to retry).
            if fault == "write":
                faults.fail_write(is_sst, errno.ENOSPC, after_bytes=500, thread=background,
                                  times=None)
            else:
                faults.fail_fsync(is_sst, errno.ENOSPC, thread=background, times=None)
            with caplog.at_level(logging.ERROR, logger="lsmdb"):
                rows = fill(db, "t", b"k", 60, size=150)      # two flushes or more
                with pytest.raises(OSError) as info:
                    db.wait_for_compactions(timeout=30)
            assert info.value.errno == errno.ENOSPC
            assert faults.hits >= 1
            assert_rows(db, "t", rows)
            before = len(db.sstables("t"))
            assert before >= 2
        assert any(r.name == "lsmdb" and r.levelno >= logging.ERROR and r.exc_info
                   and isinstance(r.exc_info[1], OSError) for r in caplog.records), \
            "the background error was not logged"
        with contextlib.suppress(OSError):  # a failure of the faults' last moments, if any
            db.wait_for_compactions(timeout=30)
        db.wait_for_compactions(timeout=30)               # retried, succeeds
        assert len(db.sstables("t")) < before
        assert_rows(db, "t", rows)
        more = fill(db, "t", b"m", 60, size=150)
        db.wait_for_compactions(timeout=30)
        assert_rows(db, "t", {**rows, **more})
    assert errors_of(path) == []
    with lsmdb.open(path) as db:
        assert_rows(db, "t", {**rows, **more})


def test_a_flush_threads_error_is_reported_and_retried(tmp_path, caplog):
    """A flush that fails on the flush thread: the memtable stays frozen and
    served, wait_for_compactions raises the error, the next round writes it."""
    path = str(tmp_path / "db")

    def flush_thread(thread: threading.Thread) -> bool:
        return thread.name == "lsmdb-flush"

    with lsmdb.open(path) as db:
        db.create_table("t", **SMALL)
        with IOFaults(path) as faults:
            faults.fail_write(is_sst, errno.ENOSPC, after_bytes=500, thread=flush_thread)
            with caplog.at_level(logging.ERROR, logger="lsmdb"):
                rows = fill(db, "t", b"k", 60, size=150)      # a flush or more
                with pytest.raises(OSError) as info:
                    db.wait_for_compactions(timeout=30)
            assert info.value.errno == errno.ENOSPC and faults.hits == 1
            assert_rows(db, "t", rows)
        db.wait_for_compactions(timeout=30)               # retried, succeeds
        assert not db._versions.tables["t"].imms and db.sstables("t")
        assert_rows(db, "t", rows)
    assert errors_of(path) == []
    with lsmdb.open(path) as db:
        assert_rows(db, "t", rows)
