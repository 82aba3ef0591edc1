"""The write path: a single put's line under the lock (put_locked) against commit."""

from __future__ import annotations

import errno
import functools
import gc
import os
import time
import weakref

import pytest

import lsmdb
import lsmdb.wal
from lsmdb import writepath


def _wal_bytes(path: str) -> bytes:
    names = sorted(n for n in os.listdir(path) if n.startswith("wal-"))
    out = b""
    for n in names:
        with open(os.path.join(path, n), "rb") as f:
            out += f.read()
    return out


def _run(path: str, single: bool) -> tuple[bytes, dict, dict, int, int | None, int]:
    db = lsmdb.open(path, auto_compaction=False)
    db.alter_table("default", memtable_size_bytes=1 << 24)
    state = db._versions.tables["default"]
    writes = db._writes
    ops = [(b"k%03d" % (i % 150), None if i % 7 == 3 else b"v%d" % i * (i % 5))
           for i in range(600)]
    with db.snapshot() as snap:  # its undo map takes the old values either way
        for key, value in ops:
            if single:
                writes.put(state, key, value)
            else:
                writes.write_columns(state, [key], [value], False)
        assert snap.get(b"k001") is None
    mem = state.mem
    out = (dict(mem.data), dict(mem.tags), mem.size_bytes, mem.min_seq, mem.max_seq)
    db.close()
    return (_wal_bytes(path), *out)


def test_a_single_put_writes_what_commit_writes(tmp_path, fixed_db_id):
    """The same ops one at a time through put_locked and through commit: the
    same WAL bytes, the same memtable (values, tags, size, sequence range)."""
    assert _run(str(tmp_path / "a"), True) == _run(str(tmp_path / "b"), False)


def test_put_locked_declines_what_is_not_its_case(tmp_path):
    db = lsmdb.open(str(tmp_path / "db"), auto_compaction=False)
    versions = db._versions
    state = versions.tables["default"]
    with versions.lock:
        seq = versions.last_seq
        versions.log.failed = OSError("test: a failed log")
        try:
            assert writepath.put_locked(versions, state, b"k", b"v", 1 << 40) == \
                writepath.PUT_DECLINED
        finally:
            versions.log.failed = None
        assert versions.last_seq == seq  # nothing done
        assert writepath.put_locked(versions, state, b"k", b"v", 0) == writepath.PUT_WAL_OVER
        assert versions.last_seq == seq + 1
    db.alter_table("default", memtable_size_bytes=4096)
    with versions.lock:
        assert writepath.put_locked(versions, state, b"k2", b"x" * 5000, 1 << 40) == \
            writepath.PUT_FULL
    db.close()
    with lsmdb.open(str(tmp_path / "db")) as again:
        assert again.get(b"k") == b"v" and again.get(b"k2") == b"x" * 5000


def _hold_flushes(db):
    """The flush thread's rounds held until the returned event is set; the
    threads that wrote each SSTable are recorded in the returned list."""
    import threading

    release = threading.Event()
    entered = threading.Event()
    real_round = db._flusher.flush_frozen
    real_write = db._flusher.write_frozen
    writers: list[str] = []

    def held() -> None:
        entered.set()
        release.wait(30)
        real_round()

    def write_frozen(state, mem):
        writers.append(threading.current_thread().name)
        return real_write(state, mem)

    db._flusher.flush_frozen = held
    db._flusher.write_frozen = write_frozen
    return release, entered, writers


def _held_db(tmp_path):
    """A database with 4 KiB memtables and its flush thread held (_hold_flushes):
    (path, db, the default table's state, release, entered, writers)."""
    path = str(tmp_path / "db")
    db = lsmdb.open(path)
    db.alter_table("default", memtable_size_bytes=4096)
    return (path, db, db._versions.tables["default"], *_hold_flushes(db))


def _fill_until(db, state, frozen: int, written: dict, i: int) -> int:
    while len(state.imms) < frozen:
        written[b"k%05d" % i] = b"v" * 100
        db.put(b"k%05d" % i, b"v" * 100)
        i += 1
    return i


def test_a_full_memtable_is_written_by_the_flush_thread_and_writers_wait_at_two(
        tmp_path, monkeypatch):
    """With auto_compaction, a put that fills the memtable freezes it and returns;
    the flush thread writes it.  While that thread is held, frozen memtables pile
    up to two; the next writer then waits for the thread (it does not flush them
    itself) and goes on once the oldest is installed.  Nothing is lost."""
    import threading

    monkeypatch.setattr(writepath, "FLUSH_WAIT_SECONDS", 60.0)  # a loaded machine
    path, db, state, release, entered, writers = _held_db(tmp_path)
    written: dict[bytes, bytes] = {}
    i = _fill_until(db, state, 1, written, 0)  # the first full memtable: frozen, not written
    assert entered.wait(10) and not db.sstables()
    i = _fill_until(db, state, 2, written, i)
    assert not db.sstables()
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (db.put(b"last", b"x"), done.set()))
    waiter.start()
    assert not done.wait(0.3)  # two frozen: the writer waits ...
    assert len(state.imms) == 2 and not db.sstables()
    release.set()  # ... for the flush thread
    assert done.wait(10)
    waiter.join()
    written[b"last"] = b"x"
    db.wait_for_compactions()
    assert not state.imms and len(db.sstables()) >= 2
    assert writers and set(writers) == {"lsmdb-flush"}
    assert dict(db.scan()) == written
    db.close()
    with lsmdb.open(path) as again:
        assert dict(again.scan()) == written


def test_a_writer_flushes_itself_when_the_flush_thread_does_not_come(tmp_path, monkeypatch):
    """The flush thread held past FLUSH_WAIT_SECONDS: the writer at two frozen
    memtables flushes them on its own thread, and writes go on."""
    monkeypatch.setattr(writepath, "FLUSH_WAIT_SECONDS", 0.2)
    path, db, state, release, entered, writers = _held_db(tmp_path)
    written: dict[bytes, bytes] = {}
    i = _fill_until(db, state, 2, written, 0)
    assert entered.wait(10) and not db.sstables()
    start = time.monotonic()
    db.put(b"last", b"x")
    written[b"last"] = b"x"
    assert time.monotonic() - start >= 0.2
    assert len(db.sstables()) == 2 and not state.imms
    assert writers == ["MainThread", "MainThread"]
    _fill_until(db, state, 1, written, i)
    release.set()
    db.wait_for_compactions()
    assert not state.imms and writers[2:] and set(writers[2:]) == {"lsmdb-flush"}
    assert dict(db.scan()) == written
    db.close()
    with lsmdb.open(path) as again:
        assert dict(again.scan()) == written


def test_a_writer_waiting_for_the_flush_thread_learns_of_a_drop_at_once(tmp_path, monkeypatch):
    """A table dropped while its writer waits for the flush thread: the writer
    gets NoSuchTableError as the drop happens, not after FLUSH_WAIT_SECONDS."""
    import threading

    monkeypatch.setattr(writepath, "FLUSH_WAIT_SECONDS", 60.0)
    db = lsmdb.open(str(tmp_path / "db"))
    t = db.create_table("t", memtable_size_bytes=4096)
    state = db._versions.tables["t"]
    release, entered, _writers = _hold_flushes(db)
    i = 0
    while len(state.imms) < 2:
        t.put(b"k%05d" % i, b"v" * 100)
        i += 1
    assert entered.wait(10)
    outcome: list[BaseException | None] = []

    def write() -> None:
        try:
            t.put(b"late", b"x")
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 -- what the writer got
            outcome.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    time.sleep(0.2)
    assert not outcome  # waiting
    start = time.monotonic()
    db.drop_table("t")
    writer.join(10)
    assert time.monotonic() - start < 5
    assert len(outcome) == 1 and isinstance(outcome[0], lsmdb.NoSuchTableError)
    release.set()
    db.close()


def _held_compactions(db):
    """Compactions of ``db`` held back until the returned event is set."""
    import threading

    go = threading.Event()
    real = db._compactor.run_pending

    def held(should_stop):
        go.wait(30)
        real(should_stop)

    db._compactor.run_pending = held  # type: ignore[method-assign]
    return go


def test_write_stalls_are_counted_timed_and_shown_by_inspect(tmp_path, monkeypatch, lsmdb_cli):
    """Writes held while level 0 is full (a compaction held back here) are
    counted and timed in table_stats, kept in STATS, shown by lsmdb inspect."""
    import threading

    from lsmdb import compaction

    monkeypatch.setattr(compaction, "L0_STALL_FILES", 2)
    path = str(tmp_path / "db")
    db = lsmdb.open(path)
    db.alter_table("default", min_threshold=2)
    go = _held_compactions(db)
    db.put(b"a", b"1")
    db.flush()
    db.put(b"b", b"2")
    db.flush()  # two files in level 0: the next write stalls until compaction runs
    threading.Timer(0.3, go.set).start()
    db.put(b"c", b"3")
    stats = db.table_stats()
    assert stats["write_stalls"] == 1 and 0.2 <= stats["write_stall_seconds"] < 10
    db.put(b"d", b"4")  # the compaction ran: no stall
    assert db.table_stats()["write_stalls"] == 1
    db.close()
    out = lsmdb_cli("inspect", path)
    assert out.returncode == 0 and "write stalls: 1," in out.stdout
    with lsmdb.open(path, read_only=True) as again:
        assert again.table_stats()["write_stalls"] == 1


def test_level_0_filling_slows_writes_in_short_pauses_counted_and_shown(
        tmp_path, monkeypatch, lsmdb_cli, impl):
    """From L0_SLOWDOWN_FILES files in level 0 (a compaction possible) each
    write -- a single put, C or Python, and a batch -- owes a pause for its
    bytes at SLOWDOWN_BYTES_PER_SECOND halved per file past the bound; the
    pauses are taken, counted and timed (table_stats, STATS, lsmdb inspect),
    and no write is lost or held past SLOWDOWN_MAX_PAUSE."""
    from lsmdb import compaction, writepath

    monkeypatch.setattr(compaction, "L0_SLOWDOWN_FILES", 2)
    monkeypatch.setattr(compaction, "SLOWDOWN_BYTES_PER_SECOND", 1000)  # 10 bytes: 10 ms
    path = str(tmp_path / "db")
    db = lsmdb.open(path)
    db.alter_table("default", min_threshold=2)
    go = _held_compactions(db)
    for i in range(2):
        db.put(b"f%d" % i, b"1")
        db.flush()
    assert len(db.sstables()) == 2
    t = time.monotonic()
    db.put(b"k0000", b"v0000")  # 10 bytes of record payload and more: at least 10 ms owed
    took = time.monotonic() - t
    stats = db.table_stats()
    assert stats["write_slowdowns"] == 1 and stats["write_stalls"] == 0
    assert 0.009 <= stats["write_slowdown_seconds"] <= took
    with db.batch() as b:
        for i in range(50):
            b.put(b"b%02d" % i, b"x" * 20)
    assert db.table_stats()["write_slowdowns"] == 2
    db.put(b"f9", b"1")
    assert db.table_stats()["write_slowdowns"] == 3
    db.flush()  # three files: half the rate, and a pause is capped
    t = time.monotonic()
    with db.batch() as b:
        b.put(b"big", b"y" * 5000)  # owes 10 s at half the rate: paused SLOWDOWN_MAX_PAUSE
    took = time.monotonic() - t
    assert writepath.SLOWDOWN_MAX_PAUSE <= took < writepath.SLOWDOWN_MAX_PAUSE + 0.5
    assert db.table_stats()["write_slowdowns"] == 4
    go.set()
    db.wait_for_compactions()
    assert len(db.sstables()) == 1
    db.put(b"after", b"1")  # level 0 below the bound again: no pause
    assert db.table_stats()["write_slowdowns"] == 4
    assert db.get(b"k0000") == b"v0000" and db.get(b"big") == b"y" * 5000
    db.close()
    out = lsmdb_cli("inspect", path)
    assert out.returncode == 0 and "write slowdowns: 4 pauses" in out.stdout
    with lsmdb.open(path, read_only=True) as again:
        assert again.table_stats()["write_slowdowns"] == 4


def test_slowed_writers_together_keep_to_the_rate(tmp_path, monkeypatch):
    """Several writer threads share one timeline: together, not each, they go
    no faster than the slowdown rate."""
    import threading

    from lsmdb import compaction

    rate = 40_000
    monkeypatch.setattr(compaction, "L0_SLOWDOWN_FILES", 2)
    monkeypatch.setattr(compaction, "SLOWDOWN_BYTES_PER_SECOND", rate)
    db = lsmdb.open(str(tmp_path / "db"))
    db.alter_table("default", min_threshold=2)
    go = _held_compactions(db)
    for i in range(2):
        db.put(b"f%d" % i, b"1")
        db.flush()
    written = [0] * 4
    stop = time.monotonic() + 0.8

    def writer(n: int) -> None:
        i = 0
        while time.monotonic() < stop:
            db.put(b"t%d-%06d" % (n, i), b"v" * 40)
            written[n] += 50  # key and value bytes: fewer than the record's
            i += 1

    started = time.monotonic()
    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    # what the rate allows in the time, and a turn's worth of slack per thread
    assert sum(written) <= rate * (elapsed + 4 * 0.1), (sum(written), elapsed)
    assert db.table_stats()["write_slowdowns"] > 0
    go.set()
    db.close()


def test_no_pause_while_no_compaction_could_reduce_level_0(tmp_path, monkeypatch):
    from lsmdb import compaction

    monkeypatch.setattr(compaction, "L0_SLOWDOWN_FILES", 2)
    monkeypatch.setattr(compaction, "SLOWDOWN_BYTES_PER_SECOND", 1000)
    db = lsmdb.open(str(tmp_path / "db"))  # min_threshold 4: two files make no compaction
    for i in range(2):
        db.put(b"f%d" % i, b"1")
        db.flush()
    t = time.monotonic()
    for i in range(20):
        db.put(b"k%04d" % i, b"v%04d" % i)
    assert time.monotonic() - t < 0.15
    assert db.table_stats()["write_slowdowns"] == 0
    db.close()


# -- the C put (lsmdb/csrc/writepath.c) against its Python twin -----------------

def _put_workload(path: str, c: bool, monkeypatch) -> tuple:
    """Single puts and deletes through put_one's common case and every case it
    hands on (a live snapshot, a record in fragments, an expiring value
    overwritten, a bytearray key); what they leave: WAL bytes, memtable, log state."""
    import random

    monkeypatch.setattr(writepath, "USE_SPEEDUPS", c)
    rng = random.Random(5)
    db = lsmdb.open(path, auto_compaction=False, clock=lambda: 1000.0)
    db.alter_table("default", memtable_size_bytes=1 << 26)
    assert (db._writes.put_locked is not writepath.put_locked) == c
    sizes = [0, 1, 100, 255, 256, 4000, 65535, 65536, 70000]
    for i in range(900):
        key = b"k%04d" % rng.randrange(300) + bytes(rng.randrange(3) * 100)
        if i == 300:
            snap = db.snapshot()      # its undo map: the Python apply
        if i == 500:
            snap.close()
        if i % 97 == 5:
            db.put(key, b"e" * 20, ttl=60)          # an expiring value, overwritten later
        elif i % 11 == 0:
            db.delete(key)
        elif i % 53 == 0:
            db.put(bytearray(key), b"x")  # not bytes: the general path converts it
        else:
            db.put(key, bytes([i % 256]) * rng.choice(sizes))
    db.table("default").put(b"via-table", b"t")
    versions = db._versions
    state = versions.tables["default"]
    mem, log = state.mem, versions.log
    out = (dict(mem.data), dict(mem.tags), mem.size_bytes, mem.min_seq, mem.max_seq,
           sorted(mem.keys), versions.last_seq, log.writer.size, log.live.min_seq,
           log.live.max_seq, log.total_bytes)
    db.close()
    return (_wal_bytes(path), *out)


def test_the_c_put_leaves_what_the_python_put_leaves(tmp_path, fixed_db_id, monkeypatch):
    if not writepath.USE_SPEEDUPS:
        pytest.skip("built without a C compiler")
    c = _put_workload(str(tmp_path / "c"), True, monkeypatch)
    py = _put_workload(str(tmp_path / "py"), False, monkeypatch)
    assert c == py
    assert len(c[0]) > 3 * 32768  # records crossed WAL blocks (fragments)


def _use_twin(c: bool, monkeypatch) -> None:
    """Puts from here on through the C put (``c``; skipped where it is not
    built) or its Python twin."""
    if c and not writepath.USE_SPEEDUPS:
        pytest.skip("built without a C compiler")
    monkeypatch.setattr(writepath, "USE_SPEEDUPS", c)


@pytest.mark.parametrize("c", [False, True])
def test_put_one_declines_what_is_not_its_case(tmp_path, c, monkeypatch):
    """put_one does nothing and answers False where the general path must
    check, convert or raise; the handle's put then does what it always did."""
    _use_twin(c, monkeypatch)
    from lsmdb.keys import MAX_KEY_SIZE_BYTES, MAX_VALUE_SIZE_BYTES

    db = lsmdb.open(str(tmp_path / "db"), auto_compaction=False)
    state = db._versions.tables["default"]
    put_one = db._writes.bind_put(state)
    seq = db._versions.last_seq
    for key, value in [("k", b"v"), (b"k", "v"), (bytearray(b"k"), b"v"), (b"k", None),
                       (b"k" * (MAX_KEY_SIZE_BYTES + 1), b"v"), (b"k", memoryview(b"v"))]:
        assert put_one(key, value) is False
    big = b"v" * (MAX_VALUE_SIZE_BYTES + 1)
    assert put_one(b"k", big) is False
    assert db._versions.last_seq == seq and not state.mem.data
    with pytest.raises(TypeError):
        db.put("k", b"v")
    with pytest.raises(ValueError):
        db.put(b"k", big)
    assert put_one(b"k", b"v") is True and db.get(b"k") == b"v"
    t = db.create_table("t", default_time_to_live=60)
    t_state = db._versions.tables["t"]
    assert db._writes.bind_put(t_state)(b"k", b"v") is False  # expiring: the general path
    t.put(b"k", b"v")
    assert t.get(b"k") == b"v" and type(t_state.mem.data[b"k"]) is tuple
    db.drop_table("t")
    assert db._writes.bind_put(t_state)(b"k", b"v") is False
    with pytest.raises(lsmdb.NoSuchTableError):
        t.put(b"k", b"v")
    db.close()
    with lsmdb.open(str(tmp_path / "s"), sync=True) as synced:
        s_state = synced._versions.tables["default"]
        assert synced._writes.bind_put(s_state)(b"k", b"v") is False
        synced.put(b"k", b"v")
        assert synced.get(b"k") == b"v"


@pytest.mark.parametrize("c", [False, True])
def test_a_failed_wal_write_fails_the_log_and_applies_nothing(tmp_path, c, monkeypatch):
    """The WAL segment growing (os.posix_fallocate, looked up at each call, so
    this wrapper sees the C put's growth too) fails: the put raises it, the log
    is failed, the memtable untouched; the next put mends the log.  Where the
    file system cannot allocate ahead, zeros are written instead."""
    _use_twin(c, monkeypatch)
    path = str(tmp_path / "db")
    db = lsmdb.open(path, auto_compaction=False)
    state = db._versions.tables["default"]
    db.put(b"a", b"1")
    real = os.posix_fallocate
    calls = []

    def failing(fd, offset, length):
        calls.append(length)
        raise OSError(errno.ENOSPC, "test: ENOSPC")

    # Mapped records (under PWRITE_MIN_BYTES), two more than the first room allocated ahead.
    big = b"2" * (lsmdb.wal.PWRITE_MIN_BYTES - 4096)
    db.put(b"a2", big)
    assert len(db._versions.log.writer._map) < db._versions.log.writer.size + len(big)
    monkeypatch.setattr(os, "posix_fallocate", failing)
    with pytest.raises(OSError, match="ENOSPC"):
        db.put(b"b", big)
    monkeypatch.setattr(os, "posix_fallocate", real)
    assert calls and isinstance(db._versions.log.failed, OSError)
    assert b"b" not in state.mem.data and db.get(b"b") is None

    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "test: not here")

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    db.put(b"c", b"3" * 50)       # mends the log: a new segment, zeros written ahead
    db.put(b"d", big)
    monkeypatch.setattr(os, "posix_fallocate", real)
    assert db._versions.log.failed is None
    db.close()
    with lsmdb.open(path) as again:
        assert [again.get(k) for k in (b"a", b"a2", b"b", b"c", b"d")] == \
            [b"1", big, None, b"3" * 50, big]


@pytest.mark.parametrize("c", [False, True])
def test_a_put_at_the_end_of_the_allocated_space_grows_the_segment_or_fails_whole(
        tmp_path, c, monkeypatch):
    """Small puts up to the end of the space the live segment allocated ahead:
    the one that does not fit grows it (both twins through LogWriter.reserve),
    and where growing fails that put raises and leaves nothing behind."""
    _use_twin(c, monkeypatch)
    path = str(tmp_path / "db")
    db = lsmdb.open(path, auto_compaction=False)
    state = db._versions.tables["default"]
    writer = db._versions.log.writer
    i = 0
    while writer.size + 400 < len(writer._map):
        db.put(b"k%06d" % i, b"v" * 100)
        i += 1
    real = os.posix_fallocate
    failed = []

    def failing(fd, offset, length):
        failed.append(length)
        raise OSError(errno.ENOSPC, "test: ENOSPC")

    monkeypatch.setattr(os, "posix_fallocate", failing)
    acked = []
    for j in range(10):
        key, size = b"x%d" % j, writer.size
        try:
            db.put(key, b"w" * 100)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
            break
        acked.append(key)
    else:
        pytest.fail("no put needed the segment to grow")
    assert acked and failed and isinstance(db._versions.log.failed, OSError)
    assert writer.size == size and key not in state.mem.data and db.get(key) is None
    assert bytes(writer._map[size:]) == bytes(len(writer._map) - size)  # nothing stored
    monkeypatch.setattr(os, "posix_fallocate", real)
    db.put(b"after", b"1")        # mends the log: a new segment
    assert db._versions.log.failed is None and db._versions.log.writer is not writer
    db.close()
    with lsmdb.open(path) as again:
        assert all(again.get(k) == b"w" * 100 for k in acked)
        assert again.get(key) is None and again.get(b"after") == b"1"
        assert again.get(b"k%06d" % (i - 1)) == b"v" * 100


@pytest.mark.parametrize("c", [False, True])
def test_the_c_put_follows_a_class_changed_after_it_ran(tmp_path, c, monkeypatch):
    """The C put reads slots at offsets it remembers per type; a class attribute
    patched in later (here read_only, made a property answering True) is seen
    at the next put, as the Python put sees it, and the original again after."""
    _use_twin(c, monkeypatch)
    from lsmdb.versions import Versions

    with lsmdb.open(str(tmp_path / "db"), auto_compaction=False) as db:
        db.put(b"a", b"1")                    # the offsets are resolved
        with monkeypatch.context() as m:
            m.setattr(Versions, "read_only", property(lambda self: True))
            with pytest.raises(lsmdb.ReadOnlyError):
                db.put(b"b", b"2")
        assert db.get(b"b") is None
        db.put(b"c", b"3")                    # the slot again
        assert [db.get(k) for k in (b"a", b"b", b"c")] == [b"1", None, b"3"]


@pytest.mark.parametrize("use_c", [True, False], ids=["C sum", "Python sum"])
def test_a_batch_past_the_size_limit_is_refused_and_changes_nothing(tmp_path, monkeypatch,
                                                                    use_c):
    """The batch's keys and values (tombstones none, expiring values their
    bytes) summed against MAX_BATCH_SIZE_BYTES: at the limit it commits, one
    byte past it raises ValueError and nothing is written."""
    if use_c and writepath._c_batch_bytes is None:
        pytest.skip("built without the C speedups")
    monkeypatch.setattr(writepath, "USE_SPEEDUPS", use_c and writepath.USE_SPEEDUPS)
    monkeypatch.setattr(writepath, "MAX_BATCH_SIZE_BYTES", 1000)
    path = str(tmp_path / "db")
    with lsmdb.open(path) as db:
        with db.batch() as b:  # 10 keys of 10 bytes, 8 values of 99, two deletes: 892
            for i in range(10):
                if i < 2:
                    b.delete(b"key%07d" % i)
                else:
                    b.put(b"key%07d" % i, b"v" * 99, ttl=100 if i == 5 else None)
            b.put(b"other", b"x" * 103)  # 5 + 103: exactly 1000
        assert db.get(b"other") == b"x" * 103
        b = db.batch()
        b.put(b"k2", b"y" * 500)
        b.put(b"k3", b"z" * 496)  # 1000 ... and one byte more:
        b.delete(b"k")
        with pytest.raises(ValueError, match="exceeds 1000 bytes"):
            b.commit()
        assert db.get(b"k2") is None and db.get(b"other") == b"x" * 103
    with lsmdb.open(path) as again:
        assert again.get(b"k2") is None and again.get(b"key0000005") == b"v" * 99


def test_batch_bytes_in_c_agrees_with_the_python_sum():
    if writepath._c_batch_bytes is None:
        pytest.skip("built without the C speedups")
    import random

    rng = random.Random(3)
    for _ in range(200):
        n = rng.randrange(50)
        keys = [rng.randbytes(rng.randrange(20)) for _ in range(n)]
        values = [rng.choice([None, rng.randbytes(rng.randrange(40)),
                              (rng.randbytes(rng.randrange(40)), rng.randrange(1, 2**40))])
                  for _ in range(n)]
        want = sum(map(len, keys)) + sum(len(v[0]) if type(v) is tuple else len(v)
                                         for v in values if v is not None)
        assert writepath._c_batch_bytes(keys, values) == want
    with pytest.raises(TypeError):
        writepath._c_batch_bytes([b"k", "s"], [b"", b""])
    with pytest.raises(TypeError):
        writepath._c_batch_bytes([b"k"], [3])


@pytest.mark.parametrize("c", [False, True])
def test_db_put_and_its_compiled_twin_agree(tmp_path, c, monkeypatch):
    """db.put is the C Putter where the C put is built, DB.put otherwise: the
    same rows, the same errors, every way of calling it; the Putter does not
    keep a closed database alive."""
    _use_twin(c, monkeypatch)
    results = []
    for twin in ("instance", "class"):
        db = lsmdb.open(str(tmp_path / f"{twin}-{c}"), auto_compaction=False,
                        clock=lambda: 1000.0)
        put = db.put if twin == "instance" else functools.partial(lsmdb.DB.put, db)
        assert (type(db.put).__name__ == "Putter") == c
        put(b"a", b"1")
        put(b"b", b"2", True)
        put(b"c", b"3", sync=False, ttl=50)
        put(key=b"d", value=b"4")
        put(b"e", b"5", ttl=0)
        errors = []
        for args, kwargs in [(("k", b"v"), {}), ((b"k", "v"), {}), ((b"k",), {}),
                             ((b"k", b"v"), {"bad": 1}), ((b"k", b"v", None, -1), {})]:
            try:
                put(*args, **kwargs)
                errors.append(None)
            except (TypeError, ValueError) as exc:
                errors.append(type(exc).__name__)
        rows = list(db.scan())
        expiring = type(db._versions.tables["default"].mem.data[b"c"]).__name__
        db.close()
        with pytest.raises(lsmdb.DatabaseClosedError):
            put(b"z", b"1")
        ref = weakref.ref(db)
        del db, put
        gc.collect()
        assert ref() is None
        results.append((rows, errors, expiring))
    assert results[0] == results[1]
    assert results[0][1][:3] == ["TypeError"] * 3
