"""The power-loss layer (tests/support/powerloss.py) and a randomized power-loss test of the
database.

* The layer, by exact enumeration where it is small: every image the model
  allows is listed and compared with the expected set, so a model that
  allowed too much or too little would fail.
* The database: the seeded random workload of ``tools/powerloss.py`` (the
  long version: ``python tools/powerloss.py --seeds N``), crash images at
  every fsync point and between operations, each opened and checked against
  the acknowledged writes.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import threading

import pytest

import lsmdb
from lsmdb.files import fsync_dir
from tools import powerloss as tool

Crash = tool.layer.Crash
DirOp = tool.layer.DirOp
PowerLoss = tool.layer.PowerLoss

# Two runs of one workload must write the same bytes: one database id for all.
pytestmark = [pytest.mark.skipif(not os.path.isdir("/proc/self/fd"),
                                 reason="the layer reads descriptors through /proc"),
              pytest.mark.usefixtures("fixed_db_id")]


@pytest.fixture
def d(tmp_path):
    path = tmp_path / "d"
    path.mkdir()
    return path


@pytest.fixture(scope="module")
def scratch():
    """A directory for many small databases: tmpfs when there is one (the layer
    simulates durability, so the real medium only costs time)."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    path = tempfile.mkdtemp(prefix="lsmdb-powerloss-", dir=base)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def write(path, data: bytes, mode: str = "wb", sync: bool = False) -> None:
    with open(path, mode) as f:
        f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())


def as_set(images) -> set[tuple[tuple[str, bytes], ...]]:
    return {tuple(sorted(image.items())) for image in images}


def img(**files: bytes) -> tuple[tuple[str, bytes], ...]:
    return tuple(sorted(files.items()))


def tails(synced: bytes, extension: bytes) -> list[bytes]:
    """Every content the model allows a file synced at ``synced`` and appended ``extension``."""
    n = len(extension)
    return [synced + extension[:a] + b"\0" * (b - a) for a in range(n + 1) for b in range(a, n + 1)]


# ------------------------------------------------------------------- the layer
def test_synced_data_and_names_survive_whole(d):
    with PowerLoss(d) as pl:
        write(d / "f", b"durable", sync=True)
        fsync_dir(str(d))
        assert pl.labels == ["file f", "dir"]
        assert as_set(pl.all_images()) == {img(f=b"durable")}
    pl.cleanup()


def test_unsynced_append_survives_as_any_prefix_maybe_zero_filled(d):
    with PowerLoss(d) as pl:
        write(d / "f", b"ab", sync=True)
        fsync_dir(str(d))
        write(d / "f", b"cd", mode="ab")
        expected = {b"ab", b"abc", b"abcd", b"ab\0", b"ab\0\0", b"abc\0"}
        assert set(tails(b"ab", b"cd")) == expected
        assert as_set(pl.all_images()) == {img(f=c) for c in expected}
        assert pl.image() == {"f": b"ab"}
        assert pl.image(tails="all") == {"f": b"abcd"}
        write(d / "f", b"", mode="ab", sync=True)     # an fsync of the file makes it all durable
        assert as_set(pl.all_images()) == {img(f=b"abcd")}
    pl.cleanup()


def test_bytes_written_in_place_over_zeros_allocated_ahead_survive_as_any_prefix(d):
    """A file given space ahead (zeros), synced, then filled in place through a
    memory mapping -- how a WAL segment is written: what was written since
    survives as any prefix, maybe zero-filled, the file never shorter than synced."""
    import mmap
    with PowerLoss(d) as pl:
        fd = os.open(d / "f", os.O_RDWR | os.O_CREAT, 0o644)
        os.posix_fallocate(fd, 0, 6)
        m = mmap.mmap(fd, 6)
        m[0:2] = b"ab"
        os.fsync(fd)
        fsync_dir(str(d))
        m[2:4] = b"cd"
        expected = {c.ljust(6, b"\0") for c in tails(b"ab", b"cd\0\0")}
        assert b"ab\0\0\0\0" in expected and b"abcd\0\0" in expected
        assert as_set(pl.all_images()) == {img(f=c) for c in expected}
        assert pl.image() == {"f": b"ab\0\0\0\0"}
        assert pl.image(tails="all") == {"f": b"abcd\0\0"}
        m.close()
        os.close(fd)
    pl.cleanup()


def test_never_synced_file_has_synced_content_empty(d):
    with PowerLoss(d) as pl:
        write(d / "f", b"xy")
        fsync_dir(str(d))                             # the name is durable, the data is not
        assert as_set(pl.all_images()) == {img(f=c) for c in tails(b"", b"xy")}
    pl.cleanup()


def test_rewritten_file_is_either_synced_or_current_content(d):
    with PowerLoss(d) as pl:
        write(d / "f", b"hello", sync=True)
        fsync_dir(str(d))
        write(d / "f", b"X")                          # truncated and rewritten, not synced
        assert as_set(pl.all_images()) == {img(f=b"hello"), img(f=b"X")}
    pl.cleanup()


def test_listing_at_install_counts_as_durable(d):
    write(d / "old", b"there before")
    (d / "sub").mkdir()                               # subdirectories are not watched
    write(d / "sub" / "inner", b"x")
    with PowerLoss(d) as pl:
        os.unlink(d / "old")
        write(d / "sub" / "other", b"y")
        os.unlink(d / "sub" / "inner")
        assert pl.dir_ops == [DirOp("unlink", "old", pl.moment().listing["old"])]
        assert as_set(pl.all_images()) == {img(old=b"there before"), img()}
    pl.cleanup()


def test_rename_survives_whole_or_not_at_all(d):
    with PowerLoss(d) as pl:
        write(d / "a.tmp", b"content", sync=True)
        fsync_dir(str(d))
        os.replace(d / "a.tmp", d / "a")
        assert [str(op) for op in pl.dir_ops] == ["rename a.tmp -> a"]
        assert as_set(pl.all_images()) == {img(**{"a.tmp": b"content"}), img(a=b"content")}
        fsync_dir(str(d))
        assert as_set(pl.all_images()) == {img(a=b"content")}
    pl.cleanup()


def test_rename_over_an_existing_name_replaces_it_atomically(d):
    with PowerLoss(d) as pl:
        write(d / "new", b"NEW", sync=True)
        write(d / "cur", b"OLD", sync=True)
        fsync_dir(str(d))
        os.rename(d / "new", d / "cur")
        assert as_set(pl.all_images()) == {img(new=b"NEW", cur=b"OLD"), img(cur=b"NEW")}
    pl.cleanup()


def test_directory_operations_survive_as_ordered_prefixes(d):
    with PowerLoss(d) as pl:
        fsync_dir(str(d))
        for name in ("1", "2", "3"):
            os.close(os.open(d / name, os.O_WRONLY | os.O_CREAT, 0o644))   # empty: one content
        os.rename(d / "1", d / "one")
        os.unlink(d / "2")
        assert [str(op) for op in pl.dir_ops] == [
            "create 1", "create 2", "create 3", "rename 1 -> one", "unlink 2"]
        names = {tuple(sorted(image)) for image in pl.all_images()}
        assert names == {(), ("1",), ("1", "2"), ("1", "2", "3"), ("2", "3", "one"),
                         ("3", "one")}
    pl.cleanup()


def test_unlinked_file_comes_back_until_the_directory_is_synced(d):
    with PowerLoss(d) as pl:
        write(d / "f", b"data", sync=True)
        fsync_dir(str(d))
        os.remove(d / "f")
        assert not (d / "f").exists()
        assert as_set(pl.all_images()) == {img(f=b"data"), img()}
        fsync_dir(str(d))
        assert as_set(pl.all_images()) == {img()}
    pl.cleanup()


def test_o_creat_on_an_existing_file_is_not_a_creation(d):
    with PowerLoss(d) as pl:
        write(d / "f", b"x", sync=True)
        fsync_dir(str(d))
        os.close(os.open(d / "f", os.O_WRONLY | os.O_CREAT, 0o644))
        write(d / "f", b"", mode="ab")
        with open(d / "f", "r+b"):
            pass
        assert pl.dir_ops == []
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with pytest.raises(FileExistsError):
            os.open(d / "f", flags, 0o644)
        assert pl.dir_ops == []
        fd = os.open(d / "g", flags, 0o644)
        os.close(fd)
        assert [str(op) for op in pl.dir_ops] == ["create g"]
        pl._check()
    pl.cleanup()


def test_relative_paths_and_moves_across_the_directory_boundary(d, monkeypatch):
    outside = d.parent / "outside"
    outside.mkdir()
    monkeypatch.chdir(d)
    with PowerLoss("../d") as pl:
        write("a", b"1", sync=True)
        write(outside / "b", b"2", sync=True)
        os.rename(outside / "b", "b")                 # moved in: a creation
        os.rename("a", outside / "a")                 # moved out: an unlink
        assert [str(op) for op in pl.dir_ops] == ["create a", "create b", "unlink a"]
        assert pl.labels == ["file a"]                # "b" was not in the directory then
        # "b" was fsynced before it was the directory's: its data counts as unsynced
        moved_in = tails(b"", b"2")
        assert as_set(pl.all_images()) == {img(), img(a=b"1")} | {
            img(a=b"1", b=c) for c in moved_in} | {img(b=c) for c in moved_in}
        pl._check()
    pl.cleanup()


def test_a_spelling_of_the_directory_through_a_symlink_is_the_directory(d):
    link = d.parent / "link"
    link.symlink_to(d)
    with PowerLoss(d) as pl:
        write(link / "f", b"x", sync=True)
        os.replace(link / "f", d / "g")
        fsync_dir(str(link))
        assert [str(op) for op in pl.dir_ops] == []
        assert pl.labels == ["file f", "dir"]
        assert as_set(pl.all_images()) == {img(g=b"x")}
        pl._check()
    pl.cleanup()


def test_fdatasync_and_directory_descriptors_are_fsync_points(d):
    with PowerLoss(d) as pl:
        fd = os.open(d / "f", os.O_RDWR | os.O_CREAT, 0o644)
        os.write(fd, b"abc")
        os.fdatasync(fd)
        dfd = os.open(d, os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)
        os.close(fd)
        assert (pl.count, pl.labels) == (2, ["file f", "dir"])
        assert as_set(pl.all_images()) == {img(f=b"abc")}
        other = d.parent / "other"                    # not ours: no point
        other.mkdir()
        fsync_dir(str(other))
        write(other / "x", b"x", sync=True)
        assert pl.count == 2
    pl.cleanup()


def test_inodes_are_kept_so_numbers_are_not_reused(d):
    with PowerLoss(d) as pl:
        seen = set()
        for _ in range(20):
            write(d / "f", b"x")
            seen.add(os.stat(d / "f").st_ino)
            os.unlink(d / "f")
        assert len(seen) == 20
        assert len(os.listdir(pl.keep_dir)) == 20
    pl.cleanup()
    assert not os.path.exists(pl.keep_dir)


def test_images_are_the_extremes_then_allowed_random_ones(d):
    with PowerLoss(d) as pl:
        write(d / "a", b"synced", sync=True)
        fsync_dir(str(d))
        write(d / "a", b"+more", mode="ab")
        write(d / "b.tmp", b"bbbb", sync=True)
        os.replace(d / "b.tmp", d / "b")
        write(d / "c", b"cc")
        allowed = as_set(pl.all_images())
        images = pl.images(random.Random(1), 60)
        assert images[0] == {"a": b"synced"}
        assert images[1] == {"a": b"synced+more", "b": b"bbbb", "c": b"cc"}   # as it is now
        assert as_set(images) <= allowed
        assert len(as_set(images)) > 10
        assert img(a=b"synced", b=b"bbbb", c=b"") in as_set(images)         # names, no data
        assert any(0 < len(image["a"]) - 6 < 5 for image in images)         # part of a tail
        assert any(b"\0" in image["a"] for image in images)                 # zero-filled
        assert all(image.recipe for image in images)
    pl.cleanup()


def test_materialize_writes_an_image(d, tmp_path):
    with PowerLoss(d) as pl:
        write(d / "f", b"data", sync=True)
        pl.materialize(str(tmp_path / "img"), {"f": b"da", "g": b""})
    assert sorted(os.listdir(tmp_path / "img")) == ["f", "g"]
    assert (tmp_path / "img" / "f").read_bytes() == b"da"
    pl.cleanup()


@pytest.mark.parametrize("when, survives", [("before", b""), ("after", b"1")])
def test_crash_at_raises_there_and_at_every_later_fsync(d, when, survives):
    pl = PowerLoss(d, crash_at=2, when=when)
    with pl:
        with open(d / "f", "wb") as f:
            fsync_dir(str(d))                              # point 1
            f.write(b"1")
            f.flush()
            with pytest.raises(Crash, match=f"{when} fsync #2"):
                os.fsync(f.fileno())                       # point 2
            f.write(b"2")                                  # after the crash: not in any image
            f.flush()
            with pytest.raises(Crash):
                os.fsync(f.fileno())
            caught = []

            def other_thread() -> None:
                try:
                    fsync_dir(str(d))
                except Crash as exc:
                    caught.append(exc)
            t = threading.Thread(target=other_thread)
            t.start()
            t.join()
            assert len(caught) == 1
        write(d / "late", b"z")
    assert pl.crashed and pl.count == 2 and pl.labels == ["dir", "file f"]
    assert as_set(pl.all_images()) == {img(f=c) for c in tails(survives, b"1"[len(survives):])}
    pl.cleanup()


def test_observer_sees_each_point_before_and_after(d):
    seen = []

    def observe(layer, when: str) -> None:
        seen.append((layer.count, when, layer.labels[-1], layer.image()))

    with PowerLoss(d, observer=observe):
        fsync_dir(str(d))
        write(d / "f", b"x", sync=True)
        fsync_dir(str(d))
    assert seen == [(1, "before", "dir", {}), (1, "after", "dir", {}),
                    (2, "before", "file f", {}), (2, "after", "file f", {}),
                    (3, "before", "dir", {}), (3, "after", "dir", {"f": b"x"})]


def test_threads_never_see_half_an_operation(d):
    """Threads create, fsync, rename and unlink at once; the model's listing stays the
    real one and every image is one the enumeration allows."""
    with PowerLoss(d) as pl:
        errors = []

        def worker(n: int) -> None:
            try:
                for i in range(30):
                    tmp, final = d / f"{n}-{i}.tmp", d / f"{n}-{i % 3}"
                    write(tmp, b"%d" % i, sync=i % 2 == 0)
                    os.replace(tmp, final)
                    if i % 5 == 0:
                        fsync_dir(str(d))
                    if i % 7 == 0:
                        os.unlink(final)
            except Exception as exc:   # reported below, not lost in the thread
                errors.append(exc)
        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        pl._check()
        moment = pl.moment()
        for image in moment.images(random.Random(3), 20):
            names = {name for name in image}
            assert any(names == set(moment.names(n)) for n in range(len(moment.ops) + 1))
    pl.cleanup()


# ------------------------------------------------ the database, crash by exception
def small_workload(path) -> None:
    """Flushes, a compaction, a table change, sync and close, in a fixed order."""
    db = lsmdb.open(path, sync=False, auto_compaction=False)
    try:
        db.create_table("t", memtable_size_bytes=4096, block_size_bytes=512)
        for i in range(10):
            db.table("t").put(b"k%d" % (i % 4), b"%d" % i * 900, sync=i % 3 == 0)
        db.sync()
        db.compact("t")
        db.alter_table("t", bloom_filter_fp_chance=0.1)
    finally:
        try:
            db.close()
        except Crash:
            pass


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_crash_leaves_what_the_observer_saw_there(tmp_path, when):
    """Raising Crash at fsync point n leaves the images the observer took at n:
    so one observed run stands for a crash at every point."""
    seen = {}

    def observe(layer, at: str) -> None:
        seen[layer.count, at] = (layer.image(), layer.image(tails="all"),
                                 [str(op) for op in layer.dir_ops])

    base = PowerLoss(tmp_path / "observed", observer=observe)
    with base:
        small_workload(tmp_path / "observed")
    base.cleanup()
    assert base.count > 20
    for n in range(1, base.count + 1, 4):
        path = tmp_path / f"crash-{n}"
        pl = PowerLoss(path, crash_at=n, when=when)
        with pl:
            try:
                small_workload(path)
            except Crash:
                pass
        assert pl.crashed and pl.labels == base.labels[:n]
        ops = [str(op) for op in pl.dir_ops]
        assert (pl.image(), pl.image(tails="all"), ops) == seen[n, when], n
        pl.cleanup()


# ------------------------------------------------------------- the database
@pytest.mark.parametrize("finish", ["sync", "close"])
def test_batch_across_tables_survives_a_flush_then_sync(tmp_path, finish):
    """A batch over two tables (sync=False), a flush of one of them, then
    ``db.sync()`` (or ``close()``), then the power cut: both halves survive.  The
    flush started a new WAL segment, so the other table's half sits only in the
    segment the flush closed, which the sync must have made durable too."""
    path = tmp_path / "db"
    path.mkdir()
    with PowerLoss(path) as pl:
        db = lsmdb.open(path, sync=False, auto_compaction=False)
        db.create_table("other")
        with db.batch() as b:
            b.put(b"a", b"default half", table="default")
            b.put(b"b", b"other half", table="other")
        db.flush("default")
        if finish == "sync":
            db.sync()
        else:
            db.close()
        image = pl.image()                       # the power cut: nothing unsynced survives
        if finish == "sync":
            db.close()
    pl.cleanup()
    dest = str(tmp_path / "image")
    pl.materialize(dest, image)
    with lsmdb.open(dest, auto_compaction=False) as db:
        assert db.get(b"a") == b"default half"
        assert db.table("other").get(b"b") == b"other half", image.recipe


def test_flush_of_an_empty_table_makes_earlier_writes_durable(tmp_path):
    """``db.flush(name)`` makes every earlier write durable, whichever table it
    went to -- also when ``name`` had nothing to flush."""
    path = tmp_path / "db"
    path.mkdir()
    with PowerLoss(path) as pl:
        with lsmdb.open(path, sync=False, auto_compaction=False) as db:
            db.create_table("other")
            db.table("other").put(b"k", b"v")
            db.flush("default")                  # nothing in the default table
            image = pl.image()
    pl.cleanup()
    dest = str(tmp_path / "image")
    pl.materialize(dest, image)
    with lsmdb.open(dest, auto_compaction=False) as db:
        assert db.table("other").get(b"k") == b"v", image.recipe


# ---------------------------------------------------- the database, randomized
def test_randomized_power_loss_with_every_write_synced(scratch):
    """Every write sync=True: nothing acknowledged is only in an unsynced WAL tail,
    so what is checked here is flushes, compactions, manifest switches, table
    changes, power cuts the run goes on from, and recovery, at every fsync point."""
    results = [tool.run_seed(seed, ops=180, scratch=scratch, sync_writes=True)
               for seed in (101, 102, 103, 104)]
    text = tool.summary_text(results)
    print(text)
    assert not any(r.counts for r in results), text
    assert sum(r.images_checked for r in results) > 2400, text
    assert sum(r.power_cuts for r in results) >= 2, text
    labels = {label for r in results for label in r.labels}
    assert {"dir", "file MANIFEST.tmp", "file STATS.tmp", "file FILTER_KEY"} <= labels, text


@pytest.fixture(scope="module")
def mixed(scratch):
    """The mixed workload: sync=True and sync=False writes, db.sync(), flushes of one
    table and of all, compactions, table changes, reopen, power cuts."""
    results = [tool.run_seed(seed, ops=180, scratch=scratch) for seed in (1, 2, 3, 4, 5, 6)]
    print(tool.summary_text(results))
    return results


def test_randomized_power_loss(mixed):
    text = tool.summary_text(mixed)
    assert not any(r.counts for r in mixed), text
    assert sum(r.images_checked for r in mixed) > 4000, text
    assert sum(r.power_cuts for r in mixed) >= 2, text
