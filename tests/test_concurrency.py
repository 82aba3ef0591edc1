"""Concurrency: threads sharing one DB, iterators across file replacement, processes.

* Threads doing put, get, scan, batch, flush and compact at once lose no
  write, and no scan sees half a batch: every batch writes one version
  number to all keys of a table, so a scan (a snapshot) must see one version
  throughout, never older than a version seen before.
* An iterator reads the snapshot of its creation while flushes and
  compactions replace (and unlink) the files under it.
* A second process cannot open the database (DatabaseLockedError); a
  read-only open in another process reads it while this one writes,
  flushes and compacts, and sees at least what was flushed before it opened.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest

import lsmdb
from tests.conftest import SMALL

BATCH_KEYS = [b"b%02d" % j for j in range(12)]
JOIN_SECONDS = 60


@pytest.fixture
def path(tmp_path):
    """A database path, on tmpfs when there is one: flushes here fsync often, and
    durability is not what these tests are about."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        d = tempfile.mkdtemp(prefix="lsmdb-concurrency-", dir=shm)
        yield os.path.join(d, "db")
        shutil.rmtree(d, ignore_errors=True)
    else:
        yield str(tmp_path / "db")


class Workers:
    """Threads that record the first exception each one meets (and stop)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.errors: list[tuple[str, BaseException]] = []
        self.threads: list[threading.Thread] = []

    def start(self, name, fn, *args) -> None:
        def run():
            try:
                fn(*args)
            except BaseException as exc:  # reported by join()
                self.errors.append((name, exc))
                self.stop.set()
        t = threading.Thread(target=run, name=name, daemon=True)
        self.threads.append(t)
        t.start()

    def join(self, finite: list[str]) -> None:
        """Wait for the ``finite`` threads, then stop the looping ones."""
        deadline = time.monotonic() + JOIN_SECONDS
        for t in self.threads:
            if t.name in finite:
                t.join(max(0.0, deadline - time.monotonic()))
        self.stop.set()
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        hung = [t.name for t in self.threads if t.is_alive()]
        assert not hung, f"threads still running after {JOIN_SECONDS}s (deadlock?): {hung}"
        if self.errors:
            name, exc = self.errors[0]
            raise AssertionError(f"thread {name} failed: {exc!r}") from exc


def writer_value(tid: int, i: int) -> bytes:
    return b"value-%d-%d-" % (tid, i) + b"w" * (i % 23)


def test_threads_lose_nothing_and_never_see_half_a_batch(path):
    n_writers, min_puts, min_batches = 3, 600, 150
    db = lsmdb.open(path)
    db.create_table("w", **SMALL)
    db.create_table("b", **SMALL)
    w, b = db.table("w"), db.table("b")
    done = [-1] * n_writers  # highest i each writer has put (and been acknowledged)
    last_version = [0]
    seen = {"scans": 0, "scans_with_data": 0, "gets": 0, "flushes": 0, "compactions": 0}
    workers = Workers()
    started = time.monotonic()

    def enough() -> bool:
        """Writers go on until flushes and compactions have really interleaved with them."""
        elapsed = time.monotonic() - started
        return elapsed > 20 or (elapsed > 1.0 and seen["flushes"] >= 10
                                and seen["compactions"] >= 3)

    def writer(tid):
        i = 0
        while not workers.stop.is_set() and (i < min_puts or not enough()):
            w.put(b"k%d-%05d" % (tid, i), writer_value(tid, i))
            if i % 50 == 49:  # and rewrite an older key: the newest value must win
                w.put(b"k%d-%05d" % (tid, i - 40), writer_value(tid, i - 40) + b"!")
            done[tid] = i
            i += 1

    def batcher():
        version = 0
        while not workers.stop.is_set() and (version < min_batches or not enough()):
            version += 1
            with db.batch() as batch:
                for k in BATCH_KEYS:
                    batch.put(k, b"%08d" % version, table="b")
                batch.put(b"last-batch", b"%08d" % version)  # and one in another table
            last_version[0] = version

    def scanner():
        last = 0
        while not workers.stop.is_set():
            reverse = seen["scans"] % 3 == 1
            rows = list(b.scan(reverse=reverse)) if seen["scans"] % 3 != 2 \
                else list(b.scan(prefix=b"b"))
            seen["scans"] += 1
            if not rows:
                assert last == 0, "batch keys vanished"
                time.sleep(0.001)
                continue
            seen["scans_with_data"] += 1
            keys = [k for k, _v in rows]
            assert keys == (BATCH_KEYS[::-1] if reverse else BATCH_KEYS), keys
            versions = {int(v) for _k, v in rows}
            assert len(versions) == 1, f"scan saw a half-applied batch: {sorted(versions)}"
            version = versions.pop()
            assert version >= last, f"scan went back in time: {version} after {last}"
            last = version
            # The writers' table: a snapshot holds every acknowledged write.
            if seen["scans"] % 10 == 0:
                floor = list(done)
                got = dict(w.scan())
                for tid in range(n_writers):
                    for i in range(floor[tid] + 1):
                        assert b"k%d-%05d" % (tid, i) in got, (tid, i)

    def getter():
        rng = random.Random(7)
        while not workers.stop.is_set():
            tid = rng.randrange(n_writers)
            upto = done[tid]
            if upto >= 0:
                i = rng.randint(0, upto)
                value = w.get(b"k%d-%05d" % (tid, i))
                assert value is not None, f"acknowledged write k{tid}-{i} not found"
                assert value.startswith(writer_value(tid, i)), (tid, i, value)
            # Linearizable reads: each later get sees a version at least as new.
            prev = 0
            for k in BATCH_KEYS:
                v = b.get(k)
                version = 0 if v is None else int(v)
                assert version >= prev, f"{k!r} at {version} after a read of {prev}"
                prev = version
            # get_many: never half a batch, never older than the gets before it.
            many = b.get_many(BATCH_KEYS)
            versions = {0 if v is None else int(v) for v in many}
            assert len(versions) == 1, f"get_many saw a half-applied batch: {sorted(versions)}"
            assert versions.pop() >= prev
            # A snapshot: one version across tables, as a batch wrote it.
            with db.snapshot() as snap:
                inside = {snap.get(k, table="b") for k in BATCH_KEYS}
                inside.add(snap.get(b"last-batch"))
                assert len(inside) == 1, f"a snapshot saw a half-applied batch: {inside}"
            seen["gets"] += 1

    def flusher():
        rng = random.Random(11)
        while not workers.stop.is_set():
            db.flush(rng.choice([None, "w", "b"]))
            seen["flushes"] += 1
            time.sleep(0.002)

    def compacter():
        while not workers.stop.is_set():
            db.compact("b" if seen["compactions"] % 2 else "w")
            seen["compactions"] += 1
            time.sleep(0.005)

    for tid in range(n_writers):
        workers.start(f"writer-{tid}", writer, tid)
    workers.start("batcher", batcher)
    workers.start("scanner", scanner)
    workers.start("getter", getter)
    workers.start("flusher", flusher)
    workers.start("compacter", compacter)
    try:
        workers.join(finite=[f"writer-{t}" for t in range(n_writers)] + ["batcher"])
    finally:
        if workers.errors:
            db.close()

    assert seen["scans_with_data"] > 5 and seen["gets"] > 5, seen
    assert seen["flushes"] >= 1 and seen["compactions"] >= 1, seen

    expected = {}
    for tid in range(n_writers):
        for i in range(done[tid] + 1):
            rewritten = i % 50 == 9 and i + 40 <= done[tid]
            expected[b"k%d-%05d" % (tid, i)] = writer_value(tid, i) + (b"!" if rewritten else b"")
    final = b"%08d" % last_version[0]

    def check(d):
        assert dict(d.table("w").scan()) == expected
        assert dict(d.table("b").scan()) == {k: final for k in BATCH_KEYS}
        assert d.get(b"last-batch") == final
        for k, v in list(expected.items())[::37]:
            assert d.table("w").get(k) == v

    check(db)
    db.wait_for_compactions(timeout=30)
    check(db)
    db.close()
    with lsmdb.open(path) as again:
        check(again)


def test_iterators_keep_their_snapshot_while_files_are_replaced(path):
    db = lsmdb.open(path, auto_compaction=False)
    try:
        t = db.create_table("t", **SMALL)
        model = {}
        for i in range(600):
            k, v = b"key%05d" % i, b"v1-%05d-" % i + b"x" * (i % 17)
            t.put(k, v)
            model[k] = v
            if i % 150 == 149:
                t.flush()  # several files, plus a memtable at the end
        for i in range(0, 600, 9):
            t.delete(b"key%05d" % i)
            del model[b"key%05d" % i]
        assert len(db.sstables("t")) >= 4
        snapshot = sorted(model.items())

        full = t.scan()
        backwards = t.scan(reverse=True)
        ranged = t.scan(start=b"key00100", end=b"key00400")
        prefixed = t.scan(prefix=b"key003")
        partial = t.scan()
        head = [next(partial) for _ in range(25)]  # a block of the first file is loaded

        # Replace everything under the iterators: overwrite, delete, add, flush, compact.
        for i in range(0, 600, 2):
            t.put(b"key%05d" % i, b"v2")
        for i in range(1, 600, 7):
            t.delete(b"key%05d" % i)
        for i in range(600, 700):
            t.put(b"key%05d" % i, b"new")
        t.flush()
        db.compact("t")
        old_files = {i.path for i in db.sstables("t")}
        for i in range(0, 600, 3):
            t.put(b"key%05d" % i, b"v3")
        db.compact("t")
        db.rebuild_filters("t", only_stale=False)
        assert not old_files & {i.path for i in db.sstables("t")}

        assert list(full) == snapshot
        assert list(backwards) == snapshot[::-1]
        assert list(ranged) == [(k, v) for k, v in snapshot if b"key00100" <= k < b"key00400"]
        assert list(prefixed) == [(k, v) for k, v in snapshot if k.startswith(b"key003")]
        assert head + list(partial) == snapshot
        # And a fresh scan sees the new state.
        now = dict(t.scan())
        assert now[b"key00000"] == b"v3" and now[b"key00650"] == b"new"
        assert b"key00001" not in now
    finally:
        db.close()


def test_iterator_snapshot_while_another_thread_writes_and_compacts(path):
    """Each iterator yields exactly the model as it was when the iterator was created."""
    db = lsmdb.open(path)
    try:
        t = db.create_table("t", **SMALL)
        model: dict[bytes, bytes] = {}
        for i in range(400):
            t.put(b"key%05d" % i, b"base-%05d" % i)
            model[b"key%05d" % i] = b"base-%05d" % i
        t.flush()
        mutex = threading.Lock()  # a write and its model update happen together
        workers = Workers()

        def churn():
            n = 0
            while not workers.stop.is_set():
                with mutex:
                    k = b"key%05d" % (n % 500)
                    t.put(k, b"churn-%d" % n)
                    model[k] = b"churn-%d" % n
                    if n % 3 == 0:
                        gone = b"key%05d" % ((n * 7) % 500)
                        t.delete(gone)
                        model.pop(gone, None)
                if n % 150 == 149:
                    db.compact("t")
                n += 1

        workers.start("churn", churn)
        try:
            for _round in range(12):
                with mutex:
                    expected = sorted(model.items())
                    forward, backward = t.scan(), t.scan(reverse=True)
                time.sleep(0.02)  # writes, flushes and compactions go on meanwhile
                assert list(forward) == expected
                assert list(backward) == expected[::-1]
                if workers.stop.is_set():
                    break
        finally:
            workers.join(finite=[])
    finally:
        db.close()


# --------------------------------------------------------------------------- processes

def _child(code: str, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(lsmdb.__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


LOCK_CHILD = """
    import sys, lsmdb
    try:
        lsmdb.open(sys.argv[1]).close()
    except lsmdb.DatabaseLockedError:
        sys.exit(3)
    sys.exit(0)
"""


def test_second_process_gets_database_locked_error(path):
    db = lsmdb.open(path)
    try:
        db.put(b"k", b"v")
        result = _child(LOCK_CHILD, path)
        assert result.returncode == 3, result.stderr
        db.put(b"k2", b"v2")  # the refused open did not disturb this one
    finally:
        db.close()
    assert _child(LOCK_CHILD, path).returncode == 0
    with lsmdb.open(path) as again:
        assert again.get(b"k") == b"v" and again.get(b"k2") == b"v2"


READER_CHILD = """
    import json, sys, time, lsmdb
    path, n_base, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    opened = newest = 0
    for r in range(rounds):
        with lsmdb.open(path, read_only=True) as db:
            opened += 1
            if r % 2:
                time.sleep(0.05)  # the writer compacts files away meanwhile
            t = db.table("t")
            for i in range(n_base):
                v = t.get(b"base%05d" % i)
                assert v == b"base-value-%05d" % i, (i, v)
            base = list(t.scan(prefix=b"base"))
            assert base == [(b"base%05d" % i, b"base-value-%05d" % i) for i in range(n_base)]
            new = list(t.scan(prefix=b"new"))
            for k, v in new:
                assert v == b"new-value-" + k[3:], (k, v)
            try:
                t.put(b"x", b"y")
            except lsmdb.ReadOnlyError:
                pass
            else:
                raise AssertionError("read-only database accepted a write")
            newest = max(newest, len(new))
    print(json.dumps({"opened": opened, "newest": newest}))
"""


def test_read_only_process_reads_while_this_process_writes(path):
    n_base = 500
    db = lsmdb.open(path)
    workers = Workers()
    try:
        t = db.create_table("t", **SMALL)
        for i in range(n_base):
            t.put(b"base%05d" % i, b"base-value-%05d" % i)
        t.flush()
        written = [0]

        def writer():
            n = 0
            while not workers.stop.is_set():
                t.put(b"new%07d" % n, b"new-value-%07d" % n)
                n += 1
                written[0] = n
                if n % 150 == 0:
                    db.compact("t")  # deletes files a reader may be about to open

        workers.start("writer", writer)
        try:
            result = _child(READER_CHILD, path, str(n_base), "12")
        finally:
            workers.join(finite=[])
        assert result.returncode == 0, result.stderr[-3000:]
        summary = json.loads(result.stdout.strip().splitlines()[-1])
        assert summary["opened"] == 12
        assert written[0] > 0
    finally:
        db.close()


ACKED_READER_CHILD = """
    import json, os, sys, time, lsmdb
    path, acked_file, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    opens = short = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with open(acked_file) as f:
            acked = int(f.read() or 0)   # written by the writer after these writes returned
        with lsmdb.open(path, read_only=True) as db:
            opens += 1
            t = db.table("t")
            missing = [i for i in range(acked) if t.get(b"new%07d" % i) is None]
            if missing:
                short += 1
                print(f"open {opens}: {len(missing)} of {acked} acknowledged writes missing",
                      file=sys.stderr)
    print(json.dumps({"opens": opens, "short": short}))
"""


def test_read_only_opens_next_to_a_flushing_writer_see_every_acknowledged_write(path):
    """Another process opens read-only again and again while this one writes and
    flushes (each flush retires WAL segments): every write acknowledged before an
    open began must be there."""
    db = lsmdb.open(path)
    workers = Workers()
    acked_file = os.path.join(os.path.dirname(path), "acked")
    with open(acked_file, "w") as f:
        f.write("0")
    try:
        t = db.create_table("t", **SMALL)

        def writer():
            n = 0
            while not workers.stop.is_set():
                for _ in range(20):
                    t.put(b"new%07d" % n, b"v" * 50)
                    n += 1
                with open(acked_file + ".tmp", "w") as f:
                    f.write(str(n))
                os.replace(acked_file + ".tmp", acked_file)
                if n % 200 == 0:
                    db.flush("t")

        workers.start("writer", writer)
        try:
            result = _child(ACKED_READER_CHILD, path, acked_file, "5")
        finally:
            workers.join(finite=[])
        assert result.returncode == 0, result.stderr[-3000:]
        summary = json.loads(result.stdout.strip().splitlines()[-1])
        assert summary["opens"] > 10
        assert summary["short"] == 0, result.stderr[-2000:]
    finally:
        db.close()


def test_read_only_open_survives_the_writer_retiring_a_wal_segment(path, monkeypatch):
    """The writer (another process, simulated here) flushes right after the reader
    has listed the directory: the WAL segment the reader is about to read is gone.

    The hook is os.listdir, whatever the reader lists it for, so the test does
    not depend on how the open is organised inside.
    """
    writer = lsmdb.open(path)
    try:
        writer.put(b"flushed", b"before the reader opened")
        writer.flush()
        writer.put(b"acknowledged", b"in the WAL when the reader opened")
        real_listdir = os.listdir
        fired = []

        def listdir_then_writer_flushes(p="."):
            names = real_listdir(p)
            if not fired and os.path.abspath(p) == writer.path:
                fired.append(p)
                writer.flush()  # retires the WAL segment the reader just listed
                writer.put(b"later", b"after")
            return names

        monkeypatch.setattr(os, "listdir", listdir_then_writer_flushes)
        ro = lsmdb.open(path, read_only=True)
        monkeypatch.setattr(os, "listdir", real_listdir)
        try:
            assert fired
            assert ro.get(b"flushed") == b"before the reader opened"
            # README: a read-only open "sees the data as of opening".
            assert ro.get(b"acknowledged") == b"in the WAL when the reader opened"
        finally:
            ro.close()
    finally:
        writer.close()


def test_a_read_racing_close_never_reads_a_reused_descriptor(path, tmp_path):
    """A get that fetched a reader's descriptor number before db.close() (the
    C getter lets the GIL go for its pread) must not read whatever file the
    number is reused for: close leaves the number on /dev/null until the
    reader is freed, and a read through a closed reader says so."""
    import weakref

    db = lsmdb.open(path, auto_compaction=False)
    for i in range(200):
        db.put(b"k%04d" % i, b"v" * 100)
    db.flush()
    db.close()
    db = lsmdb.open(path, auto_compaction=False)
    reader = db._default_state.files[0]  # held, as an in-flight get holds it
    number = reader.fd
    db.close()
    other = tmp_path / "other"
    other.write_bytes(b"x" * 8192)
    fds = [os.open(other, os.O_RDONLY) for _ in range(4)]  # would take the freed number
    try:
        assert number not in fds
        assert os.pread(number, 4096, 0) == b""  # /dev/null, not another file
        with pytest.raises(lsmdb.DatabaseClosedError):
            reader.read_block(0)
    finally:
        for fd in fds:
            os.close(fd)
    gone = weakref.ref(reader)
    del reader  # the last holder lets go: the number is released
    assert gone() is None
    try:  # closed now (or, if already reused elsewhere, not our /dev/null)
        target = os.readlink(f"/proc/self/fd/{number}")
    except OSError:
        target = None
    assert target != os.devnull


def test_close_frees_the_readers(path):
    """DB.close drops its references to its SSTable readers, so their
    descriptors go even while the closed DB object is still referenced."""
    import weakref

    db = lsmdb.open(path, auto_compaction=False)
    for i in range(100):
        db.put(b"k%04d" % i, b"v")
    db.flush()
    refs = [weakref.ref(r) for r in db._default_state.files]
    assert refs
    db.close()
    assert all(r() is None for r in refs)
