"""Compactions merged in a worker process (lsmdb.worker): same files as a merge
in this process, errors and deaths of the worker, a parent that dies first."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

import lsmdb
import lsmdb.compaction
import lsmdb.compactor
import lsmdb.versions
import lsmdb.worker
from lsmdb.errors import CorruptionError
from lsmdb.verify import verify_database

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fill(db: lsmdb.DB, table: str, rounds: int = 4, n: int = 3000) -> dict[bytes, bytes | None]:
    """``rounds`` flushed files of overwrites and deletes; the rows they leave."""
    rows: dict[bytes, bytes | None] = {}
    t = db.table(table)
    for r in range(rounds):
        for i in range(r, n, 1 + r):
            key = b"key%06d" % i
            value = b"%d-%d-" % (r, i) * 8
            t.put(key, value)
            rows[key] = value
        for i in range(r, n, 7 + r):
            t.delete(b"key%06d" % i)
            rows[b"key%06d" % i] = None
        db.flush(table)
    return rows


def check(db: lsmdb.DB, table: str, rows: dict[bytes, bytes | None]) -> None:
    t = db.table(table)
    for key, value in rows.items():
        assert t.get(key) == value, key
    assert [k for k, _ in t.scan()] == sorted(k for k, v in rows.items() if v is not None)


def sst_names(path: str) -> set[str]:
    return {n for n in os.listdir(path) if n.endswith(".sst")}


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


@pytest.mark.parametrize("strategy", ["size_tiered", "leveled"])
def test_the_worker_writes_the_files_this_process_would(tmp_path, strategy):
    """The same database compacted with and without the worker: the same files,
    byte for byte (history files of a live snapshot included)."""
    options = {"compaction": strategy, "block_size_bytes": 1024, "target_file_size_bytes": 65536}
    made = {}
    for mode in (True, False):
        path = str(tmp_path / f"db-{mode}")
        if made:
            shutil.copytree(str(tmp_path / "db-True-before"), path)
        else:
            with lsmdb.open(path, auto_compaction=False) as db:
                db.create_table("t", **options)
                fill(db, "t", rounds=3)
            shutil.copytree(path, str(tmp_path / "db-True-before"))
        with lsmdb.open(path, auto_compaction=False, compaction_process=mode) as db:
            rows = fill(db, "t", rounds=1)   # newer than the snapshot
            with db.snapshot() as snap:
                before = {k: snap.get(k, table="t") for k in rows}
                db.table("t").put(b"key000001", b"after")
                db.compact("t")
                assert {k: snap.get(k, table="t") for k in rows} == before
                made[mode] = {n: open(os.path.join(path, n), "rb").read()
                              for n in sst_names(path)}
    assert len(made[True]) >= 2   # outputs and at least one history file
    assert made[True] == made[False]


def test_an_error_in_the_worker_is_raised_here_and_leaves_the_database_unchanged(tmp_path):
    path = str(tmp_path / "db")
    with lsmdb.open(path, auto_compaction=False) as db:
        db.create_table("t", compression="none", block_size_bytes=1024)
        rows = fill(db, "t")
        victim = db.sstables("t")[-1].path
        with open(victim, "r+b") as f:   # a byte of the first data block
            f.seek(40)
            byte = f.read(1)
            f.seek(40)
            f.write(bytes([byte[0] ^ 0x55]))
        files = sst_names(path)
        with pytest.raises(CorruptionError) as info:
            db.compact("t")
        assert info.value.path == victim   # named across the process boundary
        assert sst_names(path) == files    # nothing left behind, nothing replaced
        assert len(db.sstables("t")) == 4
        with open(victim, "r+b") as f:     # repaired: the next compaction goes through
            f.seek(40)
            f.write(byte)
        db.compact("t")
        assert len(db.sstables("t")) == 1
        check(db, "t", rows)
    assert [p for p in verify_database(path) if p.severity == "error"] == []


def test_a_worker_killed_mid_merge_fails_that_compaction_only(tmp_path):
    path = str(tmp_path / "db")
    with lsmdb.open(path, auto_compaction=False) as db:
        db.create_table("t")
        rows = fill(db, "t")
        files = sst_names(path)
        versions = db._versions
        real_alloc = versions.alloc_file_number
        killed = []

        def alloc() -> int:   # the worker waits for this answer: kill it now
            if not killed:
                for pid in children_of(os.getpid()):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            return real_alloc()

        versions.alloc_file_number = alloc  # type: ignore[method-assign]
        with pytest.raises(lsmdb.worker.WorkerError, match="exited mid-merge"):
            db.compact("t")
        assert killed
        assert sst_names(path) == files
        check(db, "t", rows)
        versions.alloc_file_number = real_alloc  # type: ignore[method-assign]
        db.compact("t")                     # a new worker
        assert len(db.sstables("t")) == 1
        check(db, "t", rows)
        assert lsmdb.worker.available()


def test_without_a_worker_compactions_run_here(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(sys, "executable", "")
    monkeypatch.setattr(lsmdb.worker, "_idle", [])
    monkeypatch.setattr(lsmdb.worker, "_broken", None)
    path = str(tmp_path / "db")
    with lsmdb.open(path, auto_compaction=False) as db:
        db.create_table("t")
        rows = fill(db, "t")
        with caplog.at_level(logging.WARNING, logger="lsmdb"):
            db.compact("t")
        assert len(db.sstables("t")) == 1
        check(db, "t", rows)
    assert not lsmdb.worker.available()
    assert any("compactions run in this process" in r.getMessage() for r in caplog.records)


CHILD = textwrap.dedent("""
    import os, sys, time
    import lsmdb
    db = lsmdb.open(sys.argv[1], auto_compaction=False)
    db.create_table("t")
    t = db.table("t")
    for r in range(4):
        for i in range(2000):
            t.put(b"key%06d" % i, b"v%d" % r * 20)
        db.flush("t")
    versions = db._versions
    real = versions.alloc_file_number
    def alloc():
        number = real()
        print("merging", file=sys.stdout, flush=True)
        time.sleep(60)   # killed here, the worker waiting for this number
        return number
    versions.alloc_file_number = alloc
    db.compact("t")
""")


def test_the_worker_exits_with_its_parent_and_touches_nothing(tmp_path):
    path = str(tmp_path / "db")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = subprocess.Popen([sys.executable, "-c", CHILD, path], stdout=subprocess.PIPE,
                             env=env)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"merging\n"
        workers = children_of(child.pid)
        assert len(workers) == 1
        child.kill()
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(f"/proc/{workers[0]}"):
        with open(f"/proc/{workers[0]}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break   # exited (a zombie until init reaps it)
        time.sleep(0.01)
    else:
        assert not os.path.exists(f"/proc/{workers[0]}"), "the worker outlived its parent"
    with lsmdb.open(path, auto_compaction=False) as db:
        assert len(db.sstables("t")) == 4
        for i in range(0, 2000, 97):
            assert db.table("t").get(b"key%06d" % i) == b"v3" * 20
        db.compact("t")
        assert len(db.sstables("t")) == 1
    assert [p for p in verify_database(path) if p.severity == "error"] == []


def test_an_idle_worker_that_died_is_replaced(tmp_path):
    path = str(tmp_path / "db")
    with lsmdb.open(path, auto_compaction=False) as db:
        db.create_table("t")
        rows = fill(db, "t", rounds=2)
        db.compact("t")                       # leaves a worker idle
        assert lsmdb.worker._idle
        for pid in children_of(os.getpid()):
            os.kill(pid, signal.SIGKILL)
        for w in lsmdb.worker._idle:
            w.proc.wait()
        rows.update(fill(db, "t", rounds=2))
        db.compact("t")                       # a new worker, no error
        assert len(db.sstables("t")) == 1
        check(db, "t", rows)


def test_a_worker_is_started_after_the_first_flush_and_the_first_merge_takes_it(
        tmp_path, monkeypatch):
    """After a database's first flush a worker starts in the background
    (lsmdb.worker.warm); the first compaction then takes it, starting none."""
    monkeypatch.setattr(lsmdb.worker, "_idle", [])
    monkeypatch.setattr(lsmdb.worker, "_broken", None)
    started = []
    real_init = lsmdb.worker.Worker.__init__

    def counting_init(self):
        started.append(1)
        real_init(self)

    monkeypatch.setattr(lsmdb.worker.Worker, "__init__", counting_init)
    path = str(tmp_path / "db")
    with lsmdb.open(path) as db:
        db.alter_table("default", min_threshold=8)   # no compaction from these flushes
        assert not started
        db.put(b"a", b"1")
        db.flush()
        deadline = time.monotonic() + 30
        while not lsmdb.worker._idle and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(lsmdb.worker._idle) == 1 and started == [1]
        db.flush()                                   # nothing more is started
        for i in range(3):
            db.put(b"k%d" % i, b"v")
            db.flush()
        time.sleep(0.1)
        assert started == [1]
        db.compact()
        assert started == [1] and len(db.sstables()) == 1
        assert db.get(b"a") == b"1"
    lsmdb.worker.close_idle()
    monkeypatch.setattr(lsmdb.worker, "_broken", None)


def test_no_worker_is_started_ahead_without_compaction_processes(tmp_path, monkeypatch):
    monkeypatch.setattr(lsmdb.worker, "_idle", [])
    monkeypatch.setattr(lsmdb.worker, "_broken", None)
    for kwargs in ({"compaction_process": False}, {"auto_compaction": False}):
        with lsmdb.open(str(tmp_path / str(len(kwargs))), **kwargs) as db:
            db.put(b"a", b"1")
            db.flush()
            time.sleep(0.05)
            assert not lsmdb.worker._warming and not lsmdb.worker._idle, kwargs


def test_a_forked_child_lets_go_of_the_parents_idle_workers(tmp_path, monkeypatch):
    """A child forked while a worker is idle closes its copies of the worker's
    pipes at once, so the parent letting the worker go does not wait for it
    (nor kill it) while the child lives."""
    monkeypatch.setattr(lsmdb.worker, "_idle", [])
    monkeypatch.setattr(lsmdb.worker, "_broken", None)
    lsmdb.worker.warm()
    deadline = time.monotonic() + 30
    while not lsmdb.worker._idle and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lsmdb.worker._idle
    pid = os.fork()
    if pid == 0:  # the child: holds on for a while, touching nothing
        try:
            time.sleep(3 if not lsmdb.worker._idle else 0)
        finally:
            os._exit(0 if not lsmdb.worker._idle else 1)
    try:
        start = time.monotonic()
        lsmdb.worker.close_idle()
        took = time.monotonic() - start
    finally:
        _, status = os.waitpid(pid, 0)
        monkeypatch.setattr(lsmdb.worker, "_broken", None)
    assert os.waitstatus_to_exitcode(status) == 0  # the child kept no worker
    assert took < 1.5


def _closing_mid_merge(path: str, started: threading.Event, compaction_process: bool
                       ) -> tuple[dict[bytes, bytes | None], set[str]]:
    """A database whose background compaction of four files is held part way
    (the caller's hook sets ``started`` there, then waits for the close):
    closed mid-merge.  The rows and the files from before the compaction."""
    db = lsmdb.open(path, compaction_process=compaction_process)
    try:
        db.create_table("t", block_size_bytes=1024)
        rows = fill(db, "t", rounds=3, n=12000)
        db.table("t").put(b"last", b"x")
        rows[b"last"] = b"x"
        db.flush("t")                      # the fourth file: a compaction starts
        assert started.wait(60), "no compaction started"
        files = {os.path.basename(r.path) for r in db.sstables("t")}
        assert len(files) == 4
    finally:
        db.close()
    return rows, files


HOLD_SECONDS = 60


def _held_until_cancelled(db_compactor_holder: list[Any], started: threading.Event) -> None:
    started.set()
    deadline = time.monotonic() + HOLD_SECONDS
    while not db_compactor_holder or not db_compactor_holder[0]._cancel.fired:
        assert time.monotonic() < deadline, "close never cancelled the compaction"
        time.sleep(0.005)


@pytest.fixture
def compactors(monkeypatch) -> list[Any]:
    """Every Compactor made while the test runs, in order."""
    made: list[Any] = []
    real_init = lsmdb.compactor.Compactor.__init__

    def keep(self: Any, *args: Any) -> None:
        real_init(self, *args)
        made.append(self)

    monkeypatch.setattr(lsmdb.compactor.Compactor, "__init__", keep)
    return made


def test_close_stops_a_merge_running_in_the_worker(tmp_path, monkeypatch, caplog, compactors):
    """close() does not wait for a background compaction: it kills the worker
    merging, whose files are deleted; the inputs stay, and the next open
    compacts them."""
    path = str(tmp_path / "db")
    started = threading.Event()
    holder = compactors
    real_alloc = lsmdb.versions.Versions.alloc_file_number

    def alloc(self: Any) -> int:   # the worker waits for this answer while the hook waits
        number = real_alloc(self)
        if not started.is_set() and threading.current_thread().name == "lsmdb-compaction":
            _held_until_cancelled(holder, started)
        return number

    monkeypatch.setattr(lsmdb.versions.Versions, "alloc_file_number", alloc)
    with caplog.at_level(logging.INFO, logger="lsmdb"):
        rows, files = _closing_mid_merge(path, started, compaction_process=True)
    assert "the database is closing" in caplog.text
    assert "failed" not in caplog.text
    assert sst_names(path) == files        # nothing of the merge left, no input gone
    monkeypatch.undo()
    assert lsmdb.worker.available()
    with lsmdb.open(path) as db:           # the inputs are compacted again
        assert len(db.sstables("t")) == 4
        db.wait_for_compactions()
        assert len(db.sstables("t")) == 1
        check(db, "t", rows)
    assert [p for p in verify_database(path) if p.severity == "error"] == []


def test_close_stops_a_merge_running_in_this_process(tmp_path, monkeypatch, caplog,
                                                     compactors):
    """With compaction_process=False the merge stops at its next chunk: the
    output it had begun is deleted, the inputs stay."""
    path = str(tmp_path / "db")
    started = threading.Event()
    holder = compactors
    real_take = lsmdb.compaction.take_tagged
    calls = []

    def take(entries: Any) -> Any:
        chunk = real_take(entries)
        calls.append(len(chunk[0]))
        if len(calls) == 2:            # an output file is open, a chunk written to it
            _held_until_cancelled(holder, started)
        return chunk

    monkeypatch.setattr(lsmdb.compaction, "take_tagged", take)
    with caplog.at_level(logging.INFO, logger="lsmdb"):
        rows, files = _closing_mid_merge(path, started, compaction_process=False)
    assert calls[1] > 0                    # it was mid-merge, more to come
    assert "the database is closing" in caplog.text
    assert "failed" not in caplog.text
    assert sst_names(path) == files
    monkeypatch.undo()
    with lsmdb.open(path, compaction_process=False) as db:
        assert len(db.sstables("t")) == 4
        db.wait_for_compactions()
        assert len(db.sstables("t")) == 1
        check(db, "t", rows)
    assert [p for p in verify_database(path) if p.severity == "error"] == []


def test_a_worker_runs_at_a_lower_priority():
    """The worker lowers its scheduling priority by WORKER_NICE before it says it is ready."""
    worker = lsmdb.worker.Worker()
    try:
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        expected = min(19, mine + lsmdb.worker.WORKER_NICE)
        assert lsmdb.worker.WORKER_NICE > 0
        assert os.getpriority(os.PRIO_PROCESS, worker.proc.pid) == expected
    finally:
        worker.close()


def test_a_worker_a_closing_database_may_still_kill_is_never_reused(tmp_path, monkeypatch):
    """close() fires the cancel of a merge that is just finishing: the kill the
    fire took may land after the merge returned.  That worker must not go back to
    the idle pool, where another database's merge would take it and die."""
    import contextlib

    collected: list[Any] = []
    real_watch = lsmdb.compaction.Cancel.watch

    @contextlib.contextmanager
    def racing_watch(self, stop):
        with real_watch(self, stop):
            yield
            with self._lock:  # a close fires here, taking the stop it calls later
                self.fired = True
            collected.append(stop)

    monkeypatch.setattr(lsmdb.compaction.Cancel, "watch", racing_watch)
    path = str(tmp_path / "db")
    db = lsmdb.open(path)
    try:
        db.create_table("t", min_threshold=2, memtable_size_bytes=4096, block_size_bytes=512)
        deadline = time.monotonic() + 30
        i = 0
        while not collected:
            db.table("t").put(b"k%06d" % i, b"v" * 100)
            i += 1
            assert time.monotonic() < deadline, "no background merge ran"
        time.sleep(0.2)  # the merge's end: the worker back in the pool, or not
        killed = [stop.__self__ for stop in collected]
        assert not [w for w in lsmdb.worker._idle if any(w is k for k in killed)]
        for stop in collected:
            stop()  # the late kill: lands in no one's merge
    finally:
        db.close()
    with lsmdb.open(str(tmp_path / "other")) as other:  # the pool's workers still serve
        other.create_table("t")
        rows = fill(other, "t", rounds=2)
        other.compact("t")
        check(other, "t", rows)


def test_a_worker_imports_this_lsmdb_whatever_the_working_directory_holds(tmp_path,
                                                                          monkeypatch):
    """``python -c`` puts the working directory first on the path: another lsmdb
    there (a checkout) must not be what the worker imports, or every merge would
    fall back to this process."""
    decoy = tmp_path / "lsmdb"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise ImportError('the decoy lsmdb was imported')\n")
    (decoy / "worker.py").write_text("raise ImportError('the decoy lsmdb was imported')\n")
    monkeypatch.chdir(tmp_path)
    worker = lsmdb.worker.Worker()
    try:
        assert worker.proc.poll() is None
    finally:
        worker.close()
