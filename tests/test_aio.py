"""lsmdb.aio: the API from asyncio, gets from memory without a thread hop, and an event
loop that never waits on the disk.

* Every call of the async handle against the synchronous one's answers.
* A get that memory answers (a memtable, a filter's "no", a cached block)
  submits nothing to the database's threads; one that needs a block does,
  and the counters count it once, as a synchronous get would (C and Python).
* The latency probe: a coroutine ticking every millisecond while others do
  ``sync=True`` writes, flushes, compactions and gets of blocks that must be
  read -- with every fsync and (on the Python path) every block read made
  30 ms slow -- is never late by more than 20 ms.
"""

from __future__ import annotations

import asyncio
import gc
import os
import pickle
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import lsmdb
import lsmdb.aio
from lsmdb import sstable_reader
from tests.conftest import SMALL


def run(coro):
    return asyncio.run(coro)


class CountingExecutor(ThreadPoolExecutor):
    def __init__(self) -> None:
        super().__init__(2)
        self.submitted = 0

    def submit(self, *args, **kwargs):
        self.submitted += 1
        return super().submit(*args, **kwargs)


def test_the_async_api_answers_as_the_sync_one(tmp_path, impl):
    path = str(tmp_path / "db")

    async def main():
        async with await lsmdb.aio.open(path) as db:
            await db.put(b"a", b"1")
            await db.put(b"b", b"2", sync=True)
            await db.delete(b"b")
            assert await db.get(b"a") == b"1" and await db.get(b"b", b"-") == b"-"
            assert await db.contains(b"a") and not await db.contains(b"b")
            async with db.batch() as b:
                for i in range(300):
                    b.put(b"k%03d" % i, b"v%d" % i)
                b.delete(b"a")
            assert await db.get_many([b"k001", b"a", b"k299"]) == [b"v1", None, b"v299"]
            await db.flush()
            await db.compact()
            items = [kv async for kv in db.scan(prefix=b"k")]
            assert items == [(b"k%03d" % i, b"v%d" % i) for i in range(300)]
            it = db.scan(prefix=b"k", reverse=True)
            await it.seek(b"k100")
            assert [kv async for kv in it][:2] == [(b"k100", b"v100"), (b"k099", b"v99")]
            t = await db.create_table("t", **SMALL)
            await t.put(b"x", b"y")
            assert db.tables() == ["default", "t"] and await t.get(b"x") == b"y"
            async with db.snapshot() as snap:
                await t.put(b"x", b"z")
                assert await snap.get(b"x", table="t") == b"y"
                assert [kv async for kv in snap.scan(table="t")] == [(b"x", b"y")]
            assert await t.get(b"x") == b"z"
            await db.alter_table("t", bloom_filter_fp_chance=0.001)
            await db.sync()
            dest = await db.checkpoint(str(tmp_path / "cp"))
            await db.drop_table("t")
            with pytest.raises(TypeError):
                pickle.dumps(db)
            return dest

    dest = run(main())
    with lsmdb.open(dest, read_only=True) as cp:
        assert cp.get(b"k005") == b"v5" and cp.table("t").get(b"x") == b"z"


@pytest.mark.parametrize("block_cache", [True, False])
def test_memory_answers_a_get_without_a_thread_hop(tmp_path, impl, block_cache):
    path = str(tmp_path / "db")
    with lsmdb.open(path) as db:
        for i in range(2000):
            db.put(b"k%05d" % (2 * i), b"v" * 50)
        db.flush()
        db.compact()
        db.put(b"mem", b"m")

    async def main():
        db = await lsmdb.aio.open(path, block_cache_size_bytes=(1 << 20) if block_cache else 0)
        executor = db.executor
        db.executor = counting = CountingExecutor()
        try:
            assert await db.get(b"mem") == b"m"            # the memtable
            assert await db.get(b"zzz") is None             # outside every file's range
            misses = 0
            for i in range(200):                             # absent: mostly the filter's no
                if await db.get(b"k%05d" % (2 * i + 1)) is not None:
                    raise AssertionError
            misses = counting.submitted
            assert misses <= 20                              # false positives at most
            before = counting.submitted
            assert await db.get(b"k00042") == b"v" * 50      # a block to read: a hop
            assert counting.submitted == before + 1
            again = counting.submitted
            assert await db.get(b"k00042") == b"v" * 50      # its block cached now
            assert counting.submitted == again + (0 if block_cache else 1)
            assert await db.get_many([b"mem", b"k00042", b"k00044"]) == [b"m", b"v" * 50,
                                                                          b"v" * 50]
        finally:
            db.executor = executor
            counting.shutdown()
            await db.close()

    run(main())


def test_an_async_get_counts_what_a_sync_get_counts(tmp_path, impl):
    """Two databases made the same way answer the same gets, one through aio and one
    through the synchronous handle: every counter ends equal."""
    keys = [b"k%05d" % i for i in range(0, 3000, 7)] + [b"k%05d" % i for i in range(1, 3000, 7)]
    paths = [str(tmp_path / n) for n in ("sync", "async")]
    for p in paths:
        with lsmdb.open(p, auto_compaction=False) as db:
            db.alter_table("default", **SMALL)
            for i in range(0, 3000, 2):
                db.put(b"k%05d" % i, b"v")
            db.flush()
    with lsmdb.open(paths[0], auto_compaction=False, block_cache_size_bytes=64 << 10) as db:
        want = [db.get(k) for k in keys]
        sync_stats = db.table_stats()

    async def main():
        async with await lsmdb.aio.open(paths[1], auto_compaction=False,
                                        block_cache_size_bytes=64 << 10) as db:
            got = [await db.get(k) for k in keys]
            return got, db.sync_db.table_stats()

    got, async_stats = run(main())
    assert got == want
    assert async_stats == sync_stats


def test_the_event_loop_never_waits_on_the_disk(tmp_path, impl, monkeypatch):
    """The latency probe: every fsync and every block read made 30 ms slow (block
    reads on the Python path), files dropped from the page cache, a block cache
    of 64 KiB; a 1 ms ticker never runs more than 20 ms late while other
    coroutines write with sync=True, flush, compact and read."""
    path = str(tmp_path / "db")
    with lsmdb.open(path) as db:
        db.alter_table("default", memtable_size_bytes=64 << 10)
        for i in range(4000):
            db.put(b"k%05d" % i, os.urandom(60))
        db.flush()
    real_fsync = os.fsync
    slow = 0.03

    def slow_fsync(fd):
        time.sleep(slow)
        return real_fsync(fd)

    real_read_raw = sstable_reader.SSTableReader.read_raw

    def slow_read_raw(self, *args, **kwargs):
        time.sleep(slow)
        return real_read_raw(self, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    monkeypatch.setattr(sstable_reader.SSTableReader, "read_raw", slow_read_raw)
    for name in os.listdir(path):
        if name.endswith(".sst"):
            fd = os.open(os.path.join(path, name), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)

    async def main():
        db = await lsmdb.aio.open(path, block_cache_size_bytes=64 << 10)
        lag = []
        stop = asyncio.Event()

        async def ticker():
            loop = asyncio.get_running_loop()
            while not stop.is_set():
                t = loop.time()
                await asyncio.sleep(0.001)
                lag.append(loop.time() - t - 0.001)

        async def writer():
            for i in range(40):
                await db.put(b"w%03d" % i, b"x" * 100, sync=True)

        async def reader():
            for i in range(0, 4000, 37):
                assert await db.get(b"k%05d" % i) is not None

        async def maintenance():
            for _ in range(3):
                await db.flush()
                await db.compact()

        tick = asyncio.create_task(ticker())
        await asyncio.gather(writer(), reader(), reader(), maintenance())
        stop.set()
        await tick
        await db.close()
        return lag

    # The suite's own heap (every test before this one) is moved out of the
    # collector's reach: a full collection of it is a pause of the test process,
    # not of lsmdb's event loop.
    gc.collect()
    gc.freeze()
    try:
        lag = run(main())
    finally:
        gc.unfreeze()
    assert len(lag) > 50
    assert max(lag) < 0.020, f"the event loop was {max(lag) * 1000:.1f} ms late"


def test_a_stale_table_handle_and_a_closed_database_raise_what_the_sync_ones_raise(tmp_path):
    async def main():
        db = await lsmdb.aio.open(str(tmp_path / "db"))
        old = await db.create_table("t")
        await db.drop_table("t")
        new = await db.create_table("t")
        with pytest.raises(lsmdb.NoSuchTableError):
            await old.put(b"stray", b"x")
        with pytest.raises(lsmdb.NoSuchTableError):
            await old.get(b"stray")
        with pytest.raises(lsmdb.NoSuchTableError):
            db.table("nope")
        assert [kv async for kv in new.scan()] == []
        await db.close()
        await db.close()  # idempotent
        for call in (db.get(b"k"), db.put(b"k", b"v"), db.get_many([b"k"]), db.flush()):
            with pytest.raises(lsmdb.DatabaseClosedError):
                await call
        with pytest.raises(lsmdb.DatabaseClosedError):
            db.tables()

    run(main())


def test_a_cancelled_open_closes_what_it_opened(tmp_path):
    path = str(tmp_path / "db")

    async def main():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(lsmdb.aio.open(path), timeout=0.0001)
        deadline = time.monotonic() + 10
        while True:  # the open finishes on its thread, then is closed there
            try:
                db = await lsmdb.aio.open(path)
                break
            except lsmdb.DatabaseLockedError:
                assert time.monotonic() < deadline, "the cancelled open kept the lock"
                await asyncio.sleep(0.01)
        await db.close()

    run(main())


def test_nothing_a_follower_catches_up_or_a_closed_view_unlinks_runs_on_the_loop(
        tmp_path, monkeypatch):
    import threading

    from lsmdb import follow as follow_module
    from lsmdb import version as version_module

    path = str(tmp_path / "db")
    on_loop = []
    real_catch_up = follow_module.Follower.catch_up
    real_unlink = version_module.unlink_quietly

    def catch_up(self, *args, **kwargs):
        if threading.current_thread() is threading.main_thread():
            on_loop.append("catch_up")
        return real_catch_up(self, *args, **kwargs)

    def unlink(p):  # the aio database's files (the sync writer here runs on this thread)
        if threading.current_thread() is threading.main_thread() and "own" in p:
            on_loop.append("unlink " + os.path.basename(p))
        return real_unlink(p)

    monkeypatch.setattr(follow_module.Follower, "catch_up", catch_up)
    monkeypatch.setattr(version_module, "unlink_quietly", unlink)
    w = lsmdb.open(path)
    w.alter_table("default", **SMALL)

    async def main():
        f = await lsmdb.aio.open(path, read_only=True, follow=True)
        a = await lsmdb.aio.open(str(tmp_path / "own"))
        try:
            for i in range(60):
                w.put(b"k%03d" % i, b"v")
                assert await f.get(b"k%03d" % i) == b"v"
                w.put(b"m%03d" % i, b"v")
                assert (await f.get_many([b"m%03d" % i])) == [b"v"]
                w.put(b"s%03d" % i, b"v")
                assert (b"s%03d" % i, b"v") in [kv async for kv in f.scan(prefix=b"s")]
                w.put(b"n%03d" % i, b"v")
                async with f.snapshot() as snap:
                    assert await snap.get(b"n%03d" % i) == b"v"
                if i % 20 == 0:
                    w.create_table(f"t{i}")
                    await f.refresh()
                    assert f"t{i}" in f.tables()
                    w.compact()
            # this process's own writer: a scan holds files a compaction replaces
            for i in range(200):
                await a.put(b"x%03d" % i, b"v")
            await a.flush()
            it = a.scan()
            await it.__anext__()
            for i in range(200):
                await a.put(b"y%03d" % i, b"v")
            await a.compact()
            await it.aclose()
        finally:
            await f.close()
            await a.close()

    try:
        run(main())
    finally:
        w.close()
    assert on_loop == []


def test_a_memtable_hit_needs_no_thread_in_shadow_mode(tmp_path, impl):
    path = str(tmp_path / "db")
    with lsmdb.open(path) as db:
        db.alter_table("default", bloom_filter_mode="shadow")
        db.put(b"old", b"1")
        db.flush()
        db.put(b"mem", b"2")

    async def main():
        db = await lsmdb.aio.open(path)
        executor = db.executor
        db.executor = counting = CountingExecutor()
        try:
            assert await db.get(b"mem") == b"2"
            assert counting.submitted == 0
            assert await db.get(b"old") == b"1"  # shadow mode reads the files on a thread
            assert counting.submitted == 1
        finally:
            db.executor = executor
            counting.shutdown()
            await db.close()

    run(main())
