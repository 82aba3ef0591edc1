"""Checkpoints: ``db.checkpoint(dest)`` and ``lsmdb checkpoint PATH DEST``.

A checkpoint holds every write acknowledged before the call and none
acknowledged after it returned, every table with its options and counters;
it opens read-write as a database of its own; SSTables are hard links where
the file system allows them and copies otherwise; a flush or compaction of
the source between the two steps takes nothing from it; a checkpoint that
returned survives a power loss (the power-loss layer over the directory it
is built in); a failed one leaves nothing behind.
"""

from __future__ import annotations

import errno
import os
import random
import threading

import pytest

import lsmdb
from lsmdb import checkpoint as _checkpoint
from lsmdb.cli import main as cli_main
from tests.conftest import SMALL
from tools import powerloss as tool

PowerLoss = tool.layer.PowerLoss


def _no_temp_dirs(dest):
    prefix = _checkpoint.temp_prefix(dest)
    return not [n for n in os.listdir(os.path.dirname(dest)) if n.startswith(prefix)]


def _fill(db, n, table=None, prefix=b"k"):
    t = db.table(table or "default")
    rows = {}
    for i in range(n):
        key, value = prefix + b"%05d" % i, b"v%d" % i
        t.put(key, value)
        rows[key] = value
    return rows


def test_a_checkpoint_holds_every_table_as_of_the_call(tmp_path, impl):
    src, dest = str(tmp_path / "db"), str(tmp_path / "cp")
    with lsmdb.open(src) as db:
        db.alter_table("default", **SMALL)
        rows = _fill(db, 500)
        db.delete(b"k00007")
        del rows[b"k00007"]
        db.create_table("t", bloom_filter_fp_chance=0.001, bloom_filter_hash="keyed", **SMALL)
        trows = _fill(db, 300, "t", b"t")
        for key in list(rows)[:50]:
            assert db.get(key) is not None  # counters to carry over
        counts = {i.file: i.true_positives for i in db.sstables()}
        assert db.checkpoint(dest) == dest
        db.put(b"after", b"x")
        db.table("t").delete(b"t00001")
    with lsmdb.open(dest, auto_compaction=False) as cp:
        assert dict(cp.scan()) == rows
        assert dict(cp.table("t").scan()) == trows
        assert cp.table("t").options.bloom_filter_fp_chance == 0.001
        carried = {i.file: i.true_positives for i in cp.sstables() if i.file in counts}
        assert carried == counts and sum(counts.values()) > 0
        cp.put(b"its-own", b"1")  # a database of its own
        cp._check()
    with lsmdb.open(dest, read_only=True) as cp:
        assert cp.get(b"its-own") == b"1" and cp.get(b"after") is None
    with lsmdb.open(src, read_only=True) as db:
        assert db.get(b"its-own") is None and db.get(b"after") == b"x"
    assert cli_main(["verify", dest]) == 0


def test_sstables_are_hard_links_where_the_file_system_allows(tmp_path, monkeypatch):
    src = str(tmp_path / "db")
    with lsmdb.open(src) as db:
        rows = _fill(db, 200)
        db.flush()
        db.checkpoint(str(tmp_path / "linked"))
        real_link = os.link

        def no_links(a, b, **kw):
            if str(b).endswith(".sst"):
                raise OSError(errno.EXDEV, "cross-device link", b)
            return real_link(a, b, **kw)

        monkeypatch.setattr(os, "link", no_links)
        db.checkpoint(str(tmp_path / "copied"))
        ssts = [i.file for i in db.sstables()]
    for name in ssts:
        source = os.stat(os.path.join(src, name))
        assert os.stat(tmp_path / "linked" / name).st_ino == source.st_ino
        copied = os.stat(tmp_path / "copied" / name)
        assert copied.st_ino != source.st_ino and copied.st_size == source.st_size
    for cp in ("linked", "copied"):
        with lsmdb.open(str(tmp_path / cp)) as db:
            assert dict(db.scan()) == rows


def test_a_flush_or_compaction_between_the_steps_takes_nothing(tmp_path, monkeypatch):
    """Step 1 pins the files and WAL segments: the source flushing (its WAL rotated
    and retired) and compacting (its SSTables replaced and deleted) before step 2
    copies them changes nothing in the checkpoint."""
    src, dest = str(tmp_path / "db"), str(tmp_path / "cp")
    db = lsmdb.open(src)
    db.alter_table("default", **SMALL)
    rows = _fill(db, 300)
    unflushed = {b"u%d" % i: b"w" for i in range(20)}
    for k, v in unflushed.items():
        db.put(k, v)
    real_build = _checkpoint._build

    def build_after_the_source_moved_on(versions, tmp, plan):
        db.put(b"later", b"x")
        db.flush()
        db.compact()
        return real_build(versions, tmp, plan)

    monkeypatch.setattr(_checkpoint, "_build", build_after_the_source_moved_on)
    db.checkpoint(dest)
    db.close()
    with lsmdb.open(dest) as cp:
        assert dict(cp.scan()) == {**rows, **unflushed}
    assert _no_temp_dirs(dest)


def test_a_checkpoint_under_concurrent_writes_is_a_prefix_of_them(tmp_path):
    src, dest = str(tmp_path / "db"), str(tmp_path / "cp")
    db = lsmdb.open(src)
    db.alter_table("default", memtable_size_bytes=16384)
    acked = [0]
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            db.put(b"w%07d" % i, b"%d" % i)
            i += 1
            acked[0] = i

    t = threading.Thread(target=writer)
    t.start()
    try:
        while acked[0] < 3000:
            pass
        before = acked[0]
        db.checkpoint(dest)
        after = acked[0]
    finally:
        stop.set()
        t.join()
        db.close()
    with lsmdb.open(dest) as cp:
        keys = [k for k, _ in cp.scan()]
    n = len(keys)
    assert before <= n <= after + 1
    assert keys == [b"w%07d" % i for i in range(n)]  # a prefix: no write without the earlier


def test_a_read_only_handle_and_the_command_checkpoint_a_database_another_handle_writes(
        tmp_path):
    src = str(tmp_path / "db")
    with lsmdb.open(src) as db:
        rows = _fill(db, 100)
        with lsmdb.open(src, read_only=True) as r:
            rows.update(_fill(db, 50, prefix=b"m"))  # after the read-only open
            r.checkpoint(str(tmp_path / "ro"))      # catches up first
        rows.update(_fill(db, 10, prefix=b"n"))
        assert cli_main(["checkpoint", src, str(tmp_path / "cli")]) == 0
        assert cli_main(["checkpoint", src, str(tmp_path / "cli")]) == 1  # exists
    with lsmdb.open(str(tmp_path / "ro")) as cp:
        assert len(cp) == 150
    with lsmdb.open(str(tmp_path / "cli")) as cp:
        assert dict(cp.scan()) == rows


def test_bad_destinations_are_refused_and_leave_nothing(tmp_path):
    src = str(tmp_path / "db")
    with lsmdb.open(src) as db:
        db.put(b"k", b"v")
        (tmp_path / "taken").mkdir()
        with pytest.raises(FileExistsError):
            db.checkpoint(str(tmp_path / "taken"))
        with pytest.raises(FileNotFoundError):
            db.checkpoint(str(tmp_path / "no" / "such" / "parent"))
        with pytest.raises(ValueError, match="inside the database"):
            db.checkpoint(os.path.join(src, "inner"))
        before = sorted(os.listdir(tmp_path))
        assert sorted(os.listdir(src)) == sorted(os.listdir(src))
    assert sorted(os.listdir(tmp_path)) == before


def test_a_failed_checkpoint_leaves_nothing_and_the_source_intact(tmp_path, monkeypatch):
    src, dest = str(tmp_path / "db"), str(tmp_path / "cp")
    with lsmdb.open(src) as db:
        rows = _fill(db, 200)
        db.flush()
        rows.update(_fill(db, 20, prefix=b"u"))
        real = _checkpoint.write_file_durably

        def full(path, data):
            raise OSError(errno.ENOSPC, "No space left on device (injected)", path)

        monkeypatch.setattr(_checkpoint, "write_file_durably", full)
        with pytest.raises(OSError):
            db.checkpoint(dest)
        monkeypatch.setattr(_checkpoint, "write_file_durably", real)
        assert not os.path.exists(dest) and _no_temp_dirs(dest)
        assert dict(db.scan()) == rows
        db.checkpoint(dest)
    with lsmdb.open(dest) as cp:
        assert dict(cp.scan()) == rows


@pytest.mark.usefixtures("fixed_db_id")
def test_a_checkpoint_that_returned_survives_a_power_loss(tmp_path, monkeypatch):
    """The power-loss layer watches the directory the checkpoint is built in: once
    the call returned, every image a power cut may leave of it -- nothing unsynced,
    everything, random ones -- opens with every row."""
    src, dest = str(tmp_path / "db"), str(tmp_path / "cp")
    with lsmdb.open(src) as db:
        db.alter_table("default", **SMALL)
        rows = _fill(db, 400)
        rows.update(_fill(db, 15, prefix=b"u"))  # in the WAL only
        tmp = str(tmp_path / ".cp.checkpoint-watched")
        os.mkdir(tmp)
        monkeypatch.setattr(_checkpoint, "make_temp_dir", lambda where: tmp)
        layer = PowerLoss(tmp)
        try:
            with layer:
                db.checkpoint(dest)
                images = layer.images(random.Random(3), 6)
        finally:
            layer.cleanup()
    assert layer.count > 0
    for n, image in enumerate(images):
        where = str(tmp_path / f"image{n}")
        PowerLoss.materialize(where, image)
        with lsmdb.open(where) as cp:
            assert dict(cp.scan()) == rows, image.recipe


def test_a_filter_key_the_database_tolerates_does_not_stop_a_checkpoint(tmp_path):
    """FILTER_KEY that is not a regular file: the database's keyed filters fail
    open, and so do the copy's; the checkpoint is made."""
    src, dest = str(tmp_path / "db"), str(tmp_path / "cp")
    with lsmdb.open(src) as db:
        db.create_table("t", bloom_filter_hash="keyed")
        rows = _fill(db, 50, "t")
        db.flush()
    os.unlink(os.path.join(src, "FILTER_KEY"))
    os.mkdir(os.path.join(src, "FILTER_KEY"))
    with lsmdb.open(src, read_only=True) as db:
        db.checkpoint(dest)
    assert not os.path.lexists(os.path.join(dest, "FILTER_KEY"))
    with lsmdb.open(dest, read_only=True) as cp:
        assert dict(cp.table("t").scan()) == rows


def test_two_checkpoints_at_once_never_mix(tmp_path):
    src = str(tmp_path / "db")
    with lsmdb.open(src) as db:
        rows = _fill(db, 300)
        db.flush()
        outcomes = []

        def one(dest):
            try:
                outcomes.append(db.checkpoint(dest))
            except FileExistsError:
                outcomes.append("exists")

        threads = [threading.Thread(target=one, args=(str(tmp_path / name),))
                   for name in ("cp", "cp", "other")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(outcomes, key=str) == sorted([str(tmp_path / "cp"), str(tmp_path / "other"),
                                                "exists"], key=str)
    for name in ("cp", "other"):
        with lsmdb.open(str(tmp_path / name), read_only=True) as cp:
            assert dict(cp.scan()) == rows
    assert _no_temp_dirs(str(tmp_path / "cp"))


def test_a_destination_made_after_the_last_check_is_file_exists(tmp_path, monkeypatch):
    """Another checkpoint's rename lands between this one's last look at its
    destination and its own rename: FileExistsError, the other's checkpoint
    kept, no temporary directory left."""
    src, dest = str(tmp_path / "db"), str(tmp_path / "cp")
    with lsmdb.open(src) as db:
        rows = _fill(db, 50)
        db.flush()
        db.checkpoint(dest)
        monkeypatch.setattr(_checkpoint.os.path, "lexists", lambda path: False)
        with pytest.raises(FileExistsError):
            db.checkpoint(dest)
        monkeypatch.undo()
    with lsmdb.open(dest, read_only=True) as cp:
        assert dict(cp.scan()) == rows
    assert _no_temp_dirs(dest)


def test_a_failure_after_the_rename_leaves_no_destination(tmp_path, monkeypatch):
    src, dest = str(tmp_path / "db"), str(tmp_path / "cp")
    with lsmdb.open(src) as db:
        _fill(db, 20)
        real = _checkpoint.fsync_dir

        def fail_parent(path):
            if os.path.abspath(path) == str(tmp_path):
                raise OSError(errno.EIO, "Input/output error (injected)", path)
            return real(path)

        monkeypatch.setattr(_checkpoint, "fsync_dir", fail_parent)
        with pytest.raises(OSError):
            db.checkpoint(dest)
    assert not os.path.exists(dest) and _no_temp_dirs(dest)
