"""Read-only handles that catch up with the writer: ``refresh()`` and ``follow=True``.

In this process (a read-only handle takes no lock, so it may sit next to
the writer) every read is checked against a model of the writes
acknowledged before it began: puts, deletes, batches, expiring values,
tables created, altered and dropped, flushes, compactions, the writer's
close and another writer's open -- with the C twins and the Python ones.
Across processes, a writer in a subprocess acknowledges each write on a
pipe, and the follower here must see it on its next read, through flushes,
compactions, a crash and the next writer.  The ``CHANGES`` file, the WAL
tail reader and the refusals (pickling, ``follow`` without ``read_only``)
are checked on their own.
"""

from __future__ import annotations

import os
import pickle
import random
import subprocess
import sys
import textwrap

import pytest

import lsmdb
from lsmdb import changes as _changes
from lsmdb import follow as follow_module
from lsmdb import recovery as recovery_module
from lsmdb.wal import read_records_from, read_segment_file
from tests.conftest import SMALL


def _open_pair(path, **writer_options):
    writer = lsmdb.open(path, **writer_options)
    follower = lsmdb.open(path, read_only=True, follow=True)
    return writer, follower


def test_follow_needs_read_only_and_takes_a_bool(tmp_path):
    path = str(tmp_path / "db")
    lsmdb.open(path).close()
    with pytest.raises(ValueError, match="read_only=True"):
        lsmdb.open(path, follow=True)
    with pytest.raises(TypeError):
        lsmdb.open(path, read_only=True, follow="yes")
    with lsmdb.open(path, read_only=True) as plain, lsmdb.open(path, read_only=True,
                                                                follow=True) as f:
        assert not plain.following and f.following


def test_handles_refuse_pickling_with_a_clear_message(tmp_path):
    path = str(tmp_path / "db")
    with lsmdb.open(path) as db:
        for obj in (db, db.table("default"), db.snapshot()):
            with pytest.raises(TypeError, match="open the .*path"):
                pickle.dumps(obj)


def test_refresh_sees_what_was_acknowledged_before_it(tmp_path, impl):
    path = str(tmp_path / "db")
    with lsmdb.open(path) as w:
        w.put(b"a", b"1")
        with lsmdb.open(path, read_only=True) as r:
            w.put(b"b", b"2")
            w.delete(b"a")
            assert r.get(b"a") == b"1" and r.get(b"b") is None  # frozen at its open
            r.refresh()
            assert r.get(b"a") is None and r.get(b"b") == b"2"
            t = w.create_table("t", **SMALL)
            for i in range(300):
                t.put(b"k%03d" % i, b"v%d" % i)
            w.flush()
            w.compact()
            w.alter_table("t", bloom_filter_fp_chance=0.001)
            with pytest.raises(lsmdb.NoSuchTableError):
                r.table("t")
            r.refresh()
            assert r.table("t").options.bloom_filter_fp_chance == 0.001
            assert [k for k, _ in r.table("t").scan()] == [b"k%03d" % i for i in range(300)]
            w.drop_table("t")
            r.refresh()
            assert r.tables() == ["default"]
            r._check()
    with lsmdb.open(path) as w:
        w.put(b"c", b"3")  # refresh on a writer: nothing to do
        w.refresh()
        assert w.get(b"c") == b"3"


def test_a_follower_sees_each_write_on_its_next_read(tmp_path, impl):
    path = str(tmp_path / "db")
    w, f = _open_pair(path)
    with w, f:
        w.alter_table("default", **SMALL)
        for i in range(200):
            key = b"k%04d" % i
            w.put(key, b"v%d" % i)
            assert f.get(key) == b"v%d" % i
            if i % 7 == 0:
                w.delete(key)
                assert key not in f
            if i % 50 == 49:
                with w.batch() as b:
                    b.put(b"batch", b"%d" % i)
                    b.delete(b"k%04d" % (i - 1))
                assert f.get_many([b"batch", b"k%04d" % (i - 1)]) == [b"%d" % i, None]
        expected = {b"k%04d" % i: b"v%d" % i for i in range(200) if i % 7 and i % 50 != 48}
        expected[b"batch"] = b"199"
        assert dict(f.scan()) == expected
        assert f._follower.tails > 0  # mostly the WAL's tail, not a reread of everything
        f._check()


def test_catching_up_costs_what_was_written_since(tmp_path):
    """With no manifest switch in between, a catch-up reads the WAL from where the
    last one stopped: no reload, and the records it applies are the new ones."""
    path = str(tmp_path / "db")
    w, f = _open_pair(path)
    with w, f:
        w.put(b"first", b"1")
        assert f.get(b"first") == b"1"
        reloads = f._follower.reloads
        start = f._versions.live_tail
        for i in range(100):
            w.put(b"k%d" % i, b"v")
        assert f.get(b"k99") == b"v"
        assert f._follower.reloads == reloads
        number, end = f._versions.live_tail
        assert start[0] == number and end > start[1]
        records, _ = read_records_from(f._versions.log.path(number), number, start[1])
        assert len(records) == 100


def test_scans_and_snapshots_keep_their_view_while_a_follower_catches_up(tmp_path, impl):
    path = str(tmp_path / "db")
    w, f = _open_pair(path)
    with w, f:
        w.alter_table("default", **SMALL)
        for i in range(100):
            w.put(b"k%03d" % i, b"old")
        it = f.scan()
        first = next(it)
        snap = f.snapshot()
        for i in range(100):
            w.put(b"k%03d" % i, b"new")  # the tail ...
        w.flush()
        w.compact()  # ... and a reload
        assert f.get(b"k050") == b"new"
        assert [first, *it] == [(b"k%03d" % i, b"old") for i in range(100)]
        assert snap.get(b"k050") == b"old" and len(list(snap.scan())) == 100
        snap.close()


def test_a_follower_follows_a_writer_that_closes_and_the_next_one(tmp_path, impl):
    path = str(tmp_path / "db")
    w, f = _open_pair(path)
    with f:
        with w:
            w.put(b"a", b"1")
        assert f.get(b"a") == b"1"
        with lsmdb.open(path) as w2:
            w2.put(b"b", b"2")
            assert f.get(b"b") == b"2"
            w2.put(b"a", b"3")
            assert f.get(b"a") == b"3"


def test_expiring_values_reach_a_follower_with_their_time(tmp_path):
    path = str(tmp_path / "db")
    now = [1_000_000.0]
    with lsmdb.open(path, clock=lambda: now[0]) as w, \
            lsmdb.open(path, read_only=True, follow=True, clock=lambda: now[0]) as f:
        w.put(b"k", b"v", ttl=10)
        assert f.get(b"k") == b"v"
        now[0] += 11
        assert f.get(b"k") is None


def test_a_follower_without_the_changes_file_still_sees_every_write(tmp_path, impl):
    """No CHANGES file (a database no writer has opened since it was made, or one
    deleted): the follower reads the manifest and the WAL's tail before each read,
    and takes the file once a writer makes it."""
    path = str(tmp_path / "db")
    with lsmdb.open(path) as w:
        w.put(b"a", b"1")
    os.unlink(os.path.join(path, "CHANGES"))
    with lsmdb.open(path, read_only=True, follow=True) as f:
        assert f.get(b"a") == b"1"
        assert f._follower.watch.read() is None
        with lsmdb.open(path) as w:
            w.put(b"b", b"2")
            assert f.get(b"b") == b"2"
            assert f._follower.watch.read() is not None  # mapped now
            w.put(b"c", b"3")
            assert f.get(b"c") == b"3"


@pytest.mark.parametrize("seed", range(4))
def test_a_follower_agrees_with_a_model_through_random_work(tmp_path, impl, seed):
    rng = random.Random(seed)
    path = str(tmp_path / "db")
    model: dict[str, dict[bytes, bytes]] = {"default": {}}
    w = lsmdb.open(path, auto_compaction=rng.random() < 0.5)
    w.alter_table("default", **SMALL)
    f = lsmdb.open(path, read_only=True, follow=True)
    try:
        for step in range(400):
            op = rng.random()
            name = rng.choice(sorted(model))
            table = w.table(name)
            key = b"k%02d" % rng.randrange(60)
            if op < 0.45:
                value = b"%d-%d" % (step, rng.randrange(1000))
                table.put(key, value)
                model[name][key] = value
            elif op < 0.6:
                table.delete(key)
                model[name].pop(key, None)
            elif op < 0.7:
                with w.batch() as b:
                    for _ in range(rng.randrange(1, 6)):
                        k = b"k%02d" % rng.randrange(60)
                        b.put(k, b"b%d" % step, table=name)
                        model[name][k] = b"b%d" % step
            elif op < 0.75:
                w.flush(name)
            elif op < 0.78:
                w.compact(name)
            elif op < 0.8 and len(model) < 4:
                new = f"t{step}"
                w.create_table(new, **SMALL)
                model[new] = {}
            elif op < 0.82 and name != "default":
                w.drop_table(name)
                del model[name]
            elif op < 0.84:
                w.close()
                w = lsmdb.open(path)
            # every read begins after the writes above were acknowledged
            check = rng.choice(sorted(model))
            probe = b"k%02d" % rng.randrange(60)
            assert f.table(check).get(probe) == model[check].get(probe), (step, check, probe)
            if step % 25 == 0:
                assert sorted(f.tables()) == sorted(model)
                for n in model:
                    assert dict(f.table(n).scan()) == model[n], (step, n)
        f._check()
    finally:
        f.close()
        w.close()


def test_the_changes_file_twins_agree(tmp_path):
    if not lsmdb.SPEEDUPS:
        pytest.skip("built without a C compiler")
    path = str(tmp_path / "db")
    c = _changes.new_watch(path, use_c=True)
    py = _changes.new_watch(path, use_c=False)
    os.makedirs(path)
    for watch in (c, py):
        assert watch.read() is None and watch.changed() and not watch.attach()
    board = _changes.ChangeBoard(path)
    try:
        for watch in (c, py):
            assert watch.attach() and watch.read() == (0, 0)
            watch.seen = (0, 0)
            assert not watch.changed()
        board.note_seq(5)
        board.bump_epoch()
        assert c.read() == py.read() == (5, 1)
        assert c.changed() and py.changed()
        c.seen = py.seen = (5, 1)
        assert not c.changed() and not py.changed() and c.seen == py.seen == (5, 1)
        # a file that is not a CHANGES file is never mapped
        other = str(tmp_path / "other")
        with open(other, "wb") as fh:
            fh.write(b"x" * 4096)
        assert _changes.new_watch(other, use_c=True).read() is None
        assert _changes.ChangeWatch(other).read() is None
    finally:
        board.close()


def test_the_writer_mends_a_damaged_changes_file_in_place(tmp_path):
    path = str(tmp_path / "db")
    lsmdb.open(path).close()
    changes = os.path.join(path, "CHANGES")
    with open(changes, "r+b") as fh:
        fh.write(b"garbage!")
    inode = os.stat(changes).st_ino
    with lsmdb.open(path) as w:
        w.put(b"k", b"v")
        assert os.stat(changes).st_ino == inode  # a follower's mapping stays good
        watch = _changes.ChangeWatch(changes)
        assert watch.read() is not None and watch.read()[0] == w._versions.last_seq


def test_the_wal_tail_reader_stops_at_a_record_being_written(tmp_path):
    path = str(tmp_path / "db")
    with lsmdb.open(path) as w:
        start_tail = None
        w.put(b"a", b"1")
        versions = w._versions
        number = versions.log.live.number
        seg = versions.log.path(number)
        start_tail = read_segment_file(seg, number).valid_length
        for i in range(50):
            w.put(b"k%d" % i, b"x" * (i * 300))  # some records cross 32 KiB blocks
        full = read_segment_file(seg, number)
        records, end = read_records_from(seg, number, start_tail)
        assert records == [r for r in full.records if r[0] >= start_tail]
        assert end == full.valid_length
        # the last record cut short (as if being written): it is not returned
        with open(seg, "rb") as fh:
            data = fh.read()
        cut = str(tmp_path / "cut.log")
        last = full.records[-1][0]
        with open(cut, "wb") as fh:
            fh.write(data[:last + 10] + bytes(len(data) - last - 10))
        records, end = read_records_from(cut, number, start_tail)
        assert records == [r for r in full.records if start_tail <= r[0] < last]
        assert end == last


_WRITER = textwrap.dedent("""
    import os, sys
    import lsmdb
    path, first, count, crash = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    db = lsmdb.open(path)
    db.alter_table("default", memtable_size_bytes=8192)
    for i in range(first, first + count):
        db.put(b"k%06d" % i, b"v%d" % i)
        if i % 97 == 0:
            db.delete(b"k%06d" % (i - 1))
        if i % 400 == 399:
            db.compact()
        sys.stdout.write("%d\\n" % i)
        sys.stdout.flush()
        if sys.stdin.readline() != "go\\n":
            break
    if crash == "crash":
        os._exit(0)
    db.close()
""")


@pytest.mark.parametrize("how", ["follow", "refresh"])
def test_a_reader_in_another_process_sees_each_acknowledged_write(tmp_path, how):
    """The writer runs in a subprocess and says when each put returned; every read
    the follower begins after that sees it (a plain read-only handle: after a
    refresh()) -- through flushes, compactions, the writer's crash and the next
    writer's recovery."""
    path = str(tmp_path / "db")
    lsmdb.open(path).close()
    expected: dict[bytes, bytes] = {}
    with lsmdb.open(path, read_only=True, follow=how == "follow") as f:
        for first, crash in ((0, "crash"), (900, "close")):
            proc = subprocess.Popen([sys.executable, "-c", _WRITER, path, str(first), "900",
                                     crash], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    text=True)
            try:
                for _ in range(900):
                    i = int(proc.stdout.readline())
                    if how == "refresh":
                        f.refresh()
                    expected[b"k%06d" % i] = b"v%d" % i
                    if i % 97 == 0:
                        expected.pop(b"k%06d" % (i - 1), None)
                    assert f.get(b"k%06d" % i) == b"v%d" % i, i
                    if i % 97 == 0:
                        assert f.get(b"k%06d" % (i - 1)) is None
                    if i % 150 == 0:
                        assert dict(f.scan()) == expected
                    proc.stdin.write("go\n")
                    proc.stdin.flush()
            finally:
                proc.stdin.close()
                assert proc.wait(timeout=60) == 0
        if how == "refresh":
            f.refresh()
        assert dict(f.scan()) == expected
        assert f._follower.reloads > 2 and f._follower.tails > 100


def test_a_reload_reads_only_the_wal_written_since(tmp_path):
    """After a flush (a manifest switch) the follower keeps the memtable entries
    the flush did not take and reads the WAL on from where it stopped: its
    memtable holds what is not in an SSTable, and nothing is read twice."""
    path = str(tmp_path / "db")
    w, f = _open_pair(path, auto_compaction=False)
    with w, f:
        for i in range(500):
            w.put(b"a%03d" % i, b"v")
        assert f.get(b"a499") == b"v"
        w.flush()
        for i in range(7):
            w.put(b"b%d" % i, b"v")
        calls = []
        real = follow_module.decode_all

        def counting(seg_path, records):
            calls.append(len(records))
            return real(seg_path, records)

        follow_module.decode_all = counting
        try:
            assert f.get(b"b6") == b"v"
        finally:
            follow_module.decode_all = real
        assert sum(calls) == 7  # the seven records written since, not the 500 flushed
        mem = f._versions.tables["default"].mem
        assert sorted(mem.data) == [b"b%d" % i for i in range(7)]
        assert f.get(b"a123") == b"v" and len(f) == 507


@pytest.mark.parametrize("full", [False, True])
def test_a_table_created_between_reading_the_manifest_and_the_wal(tmp_path, monkeypatch,
                                                                    full):
    """The follower read the manifest, then the writer created a table and wrote
    to it, then the follower read the WAL: the records of the table it does not
    know yet are not dropped -- it reads the manifest again."""
    path = str(tmp_path / "db")
    w, f = _open_pair(path)
    with w, f:
        w.put(b"k", b"v")
        assert f.get(b"k") == b"v"
        done = []
        if full:  # no place to read on from: the whole WAL, after the manifest
            f._versions.live_tail = None
            module, name = recovery_module, "_replay_wal"
        else:     # the manifest and files, then the WAL from where it stopped
            module, name = follow_module, "read_state_with_retry"
        real = getattr(module, name)

        def racing(*args, **kwargs):
            if full and not done:
                done.append(1)
                w.create_table("late").put(b"x", b"y")
            out = real(*args, **kwargs)
            if not done:
                done.append(1)
                w.create_table("late").put(b"x", b"y")
            return out

        monkeypatch.setattr(module, name, racing)
        w.put(b"k2", b"v2")
        w.flush()  # a manifest switch: the follower reloads
        assert f.get(b"k2") == b"v2"
        assert done
        assert f.table("late").get(b"x") == b"y"
        w.table("late").put(b"x2", b"y2")
        assert f.table("late").get(b"x2") == b"y2"


def test_threads_sharing_a_follower_each_see_what_was_acknowledged(tmp_path):
    """Four threads read one following handle while the writer (here, in this
    process) writes, flushes and compacts: each read that begins after a put
    returned sees it; catch-ups race each other and the reads of other threads."""
    import threading

    path = str(tmp_path / "db")
    w, f = _open_pair(path)
    w.alter_table("default", **SMALL)
    acked = [-1]
    stop = threading.Event()
    errors = []

    def reader(seed):
        rng = random.Random(seed)
        try:
            while not stop.is_set():
                upto = acked[0]
                if upto < 0:
                    continue
                i = rng.randint(max(0, upto - 50), upto)
                if rng.random() < 0.5:
                    got = f.get(b"k%05d" % i)
                else:
                    got = f.get_many([b"k%05d" % i])[0]
                assert got == b"v%d" % i, (i, got)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    try:
        for i in range(600):
            w.put(b"k%05d" % i, b"v%d" % i)
            acked[0] = i
            if i % 200 == 199:
                w.compact()
    finally:
        stop.set()
        for t in threads:
            t.join()
        f.close()
        w.close()
    assert not errors, errors[0]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_follower_used_in_a_forked_child_raises_database_forked_error(tmp_path):
    path = str(tmp_path / "db")
    w, f = _open_pair(path)
    with w, f:
        w.put(b"k", b"v")
        assert f.get(b"k") == b"v"
        r, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: every read of the parent's handle refuses
            code = 0
            for read in (lambda: f.get(b"k"), lambda: f.get_many([b"k"]), lambda: b"k" in f,
                         lambda: list(f.scan()), f.refresh, f.snapshot):
                try:
                    read()
                    code = 1
                except lsmdb.DatabaseForkedError:
                    pass
                except BaseException:  # noqa: BLE001 - any other outcome fails the test
                    code = 2
            os.write(wfd, bytes([code]))
            os._exit(0)
        os.close(wfd)
        assert os.read(r, 1) == b"\0"
        os.waitpid(pid, 0)
        os.close(r)
        w.put(b"k2", b"v2")
        assert f.get(b"k2") == b"v2"  # the parent's handle goes on


def test_a_table_dropped_by_the_writer_is_gone_for_a_followers_old_handle(tmp_path):
    path = str(tmp_path / "db")
    w, f = _open_pair(path)
    with w, f:
        w.create_table("t").put(b"k", b"old")
        t = f.table("t")
        assert t.get(b"k") == b"old"
        w.drop_table("t")
        for read in (lambda: t.get(b"k"), lambda: t.get_many([b"k"]), lambda: b"k" in t,
                     lambda: list(t.scan()), lambda: t[b"k"]):
            with pytest.raises(lsmdb.NoSuchTableError):
                read()
        w.create_table("t").put(b"k2", b"new")
        assert f.table("t").get(b"k") is None and f.table("t").get(b"k2") == b"new"


@pytest.mark.parametrize("how", ["refresh", "follow"])
def test_another_thread_never_sees_half_a_batch_while_a_handle_catches_up(tmp_path, how):
    import threading

    path = str(tmp_path / "db")
    keys = [b"b%03d" % i for i in range(300)]
    w = lsmdb.open(path)
    r = lsmdb.open(path, read_only=True, follow=how == "follow")
    stop = threading.Event()
    torn = []

    def reader():
        while not stop.is_set():
            got = set(r.get_many(keys))
            if len(got) > 1:
                torn.append(sorted(v or b"" for v in got)[:2])

    t = threading.Thread(target=reader)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads take turns often: a half batch would show
    t.start()
    try:
        for version in range(60):
            with w.batch() as b:
                for k in keys:
                    b.put(k, b"%d" % version)
            if how == "refresh":
                r.refresh()
    finally:
        sys.setswitchinterval(switch)
        stop.set()
        t.join()
        r.close()
        w.close()
    assert not torn, torn[:3]


def test_a_write_whose_fsync_failed_never_reaches_a_follower(tmp_path, monkeypatch):
    import errno

    path = str(tmp_path / "db")
    w, f = _open_pair(path)
    with f:
        w.put(b"k", b"old", sync=True)
        assert f.get(b"k") == b"old"
        real = os.fsync
        calls = []

        def failing(fd):
            if not calls:
                calls.append(fd)
                raise OSError(errno.EIO, "Input/output error (injected)")
            return real(fd)

        monkeypatch.setattr(os, "fsync", failing)
        with pytest.raises(OSError):
            w.put(b"k", b"bad", sync=True)
        monkeypatch.setattr(os, "fsync", real)
        assert w.get(b"k") == b"old"
        assert f.get(b"k") == b"old"
        f._versions.live_tail = None  # the whole WAL read again: the record is not there
        f._versions.manifest_bytes = b""
        f.refresh()
        assert f.get(b"k") == b"old"
        w.put(b"other", b"1")  # the writer mends its log: a manifest switch
        assert f.get(b"other") == b"1" and f.get(b"k") == b"old"
        w.close()
        assert f.get(b"k") == b"old"


@pytest.mark.parametrize("planted", ["fifo", "directory", "symlink"])
def test_a_planted_changes_name_blocks_no_follower_and_no_writer(tmp_path, planted):
    path = str(tmp_path / "db")
    with lsmdb.open(path) as w:
        w.put(b"k", b"v")
    target = os.path.join(path, "CHANGES")
    os.unlink(target)
    if planted == "fifo":
        os.mkfifo(target)
    elif planted == "directory":
        os.mkdir(target)
    else:
        os.symlink(str(tmp_path / "elsewhere"), target)
    with lsmdb.open(path, read_only=True, follow=True) as f:  # must not hang
        assert f.get(b"k") == b"v"
        with lsmdb.open(path) as w:  # sets the planted name aside
            w.put(b"k2", b"v2")
            assert f.get(b"k2") == b"v2"
    assert os.path.isfile(target) and not os.path.islink(target)
    assert os.listdir(os.path.join(path, "lost"))


def test_a_filter_secret_made_after_a_follower_opened_serves_its_filters(tmp_path):
    path = str(tmp_path / "db")
    w, f = _open_pair(path)
    with w, f:
        w.create_table("t", bloom_filter_hash="keyed")
        for i in range(500):
            w.table("t").put(b"k%04d" % (2 * i), b"v")
        w.flush()  # the first keyed filter: FILTER_KEY is made now
        for i in range(500):
            assert f.table("t").get(b"k%04d" % (2 * i + 1)) is None
        stats = f.table_stats("t")
        assert stats["filter_negatives"] > 400, stats
