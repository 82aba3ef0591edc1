"""lsmdb from asyncio: the same database, and nothing that waits on the disk runs on the event loop.

    import lsmdb.aio

    async with await lsmdb.aio.open(path) as db:
        await db.put(b"k", b"v")
        value = await db.get(b"k")
        async with db.batch() as b:
            b.put(b"a", b"1")
        async for key, value in db.scan(prefix=b"a"):
            ...

A get runs on the event loop when memory answers it -- a memtable, the
filters' "no", the block cache -- and completes without a thread hop
(``readpath.make_nodisk``); when it needs a block from a file, the rest of
it runs on the database's threads and the coroutine awaits it.  Counters
count such a get once, as ``DB.get`` does.  Everything else that may wait
on the disk -- writes (a WAL segment's growth, an fsync with ``sync=True``,
a write stall), flushes, compactions, checkpoints, scans' block reads,
snapshot reads, opening and closing -- runs on those threads
(``AsyncDB.executor``, a thread pool of the database's own).  A batch is
filled on the event loop (``put`` and ``delete`` only record) and committed
on a thread.

The handle is the synchronous one underneath (``AsyncDB.sync_db``), and
sharing it between threads stays safe; a following handle (``follow=True``)
catches up on a thread too.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from typing import Any, NoReturn, TypeVar

from . import db as _db
from .handles import WriteBatch
from .readpath import make_nodisk
from .scan import ScanIterator
from .snapshot import Snapshot
from .sstable_format import MISSING
from .table import TableState

T = TypeVar("T")

#: Threads of a database's executor.
EXECUTOR_THREADS = 4
#: Items a scan takes from its iterator per trip to a thread.
SCAN_CHUNK = 256


async def open(path: str | os.PathLike[str], **options: Any) -> AsyncDB:  # noqa: A001
    """Open (or create) the database at ``path`` off the event loop; the options
    are :func:`lsmdb.open`'s.  Use the result with ``async with``, or ``await
    db.close()``."""
    executor = ThreadPoolExecutor(EXECUTOR_THREADS, thread_name_prefix="lsmdb-aio")
    loop = asyncio.get_running_loop()
    opening = loop.run_in_executor(executor, functools.partial(_db.open, path, **options))
    try:
        sync_db = await asyncio.shield(opening)
    except asyncio.CancelledError:
        # The open goes on on its thread: close what it opens, then the threads.
        def close_it(fut: asyncio.Future[_db.DB]) -> None:
            if not fut.cancelled() and fut.exception() is None:
                executor.submit(fut.result().close)
            executor.shutdown(wait=False)

        opening.add_done_callback(close_it)
        raise
    except BaseException:
        executor.shutdown(wait=False)
        raise
    return AsyncDB(sync_db, executor)


def raise_missing(sync_db: _db.DB, name: str) -> NoReturn:
    """NoSuchTableError for ``name`` (DatabaseClosedError once closed), without a
    following handle's catch-up."""
    from .errors import NoSuchTableError
    from .options import validate_table_name
    if sync_db.closed:
        sync_db._versions.check_open()
    validate_table_name(name)
    raise NoSuchTableError(f"no table named {name!r}")


def _marker(value: Any) -> bool:
    return type(value) is tuple and 3 <= len(value) <= 4 and value[0] is MISSING


class _Reads:
    """What a database and a table share: gets, get_many, scans, writes."""

    def __init__(self, owner: AsyncDB, state: TableState, table: str | None,
                 handle: Any) -> None:
        self._owner = owner
        self._state = state
        self._table = table
        #: The synchronous DB or Table this acts through (a dropped table's
        #: handle raises NoSuchTableError, as the synchronous one does).
        self._handle = handle
        self._nodisk, self._resume, self._py_nodisk = make_nodisk(owner.sync_db._versions,
                                                                   state)

    async def get(self, key: Any, default: Any = None) -> Any:
        """The value of ``key``, or ``default``: on the event loop when memory
        answers, else the block read on a thread."""
        if self._state.dropped:  # (a closed database: nodisk sends the get to a thread)
            return await self._owner._run(self._handle.get, key, default)
        value = self._nodisk(key, default)
        if _marker(value):
            if value[2] == -2:  # no C path for this view: the Python twin's memory
                value = self._py_nodisk(key, default)
                if not _marker(value):
                    return value
            return await self._owner._run(self._resume, key, default, *value[1:])
        return value

    async def contains(self, key: Any) -> bool:
        """``key in db``, as a coroutine."""
        return await self.get(key) is not None

    async def get_many(self, keys: Iterable[Any]) -> list[bytes | None]:
        """Values of many keys (None where absent): those memory answers at once,
        the rest in one trip to a thread."""
        given = list(keys)
        if self._state.dropped:
            return await self._owner._run(self._handle.get_many, given)
        out: list[Any] = []
        later: list[tuple[int, Any, Any]] = []
        for n, key in enumerate(given):
            value = self._nodisk(key)
            if _marker(value) and value[2] == -2:
                value = self._py_nodisk(key)
            if _marker(value):
                later.append((n, key, value))
                value = None
            out.append(value)
        if later:
            resume = self._resume

            def rest() -> list[Any]:
                return [resume(key, None, *m[1:]) for _n, key, m in later]

            for (n, _key, _m), value in zip(later, await self._owner._run(rest), strict=True):
                out[n] = value
        return out

    async def put(self, key: Any, value: Any, sync: bool | None = None, ttl: Any = None) -> None:
        """Set ``key`` (on a thread: the WAL may grow, fsync or stall)."""
        await self._owner._run(self._handle.put, key, value, sync, ttl)

    async def delete(self, key: Any, sync: bool | None = None) -> None:
        await self._owner._run(self._handle.delete, key, sync)

    def scan(self, start: Any = None, end: Any = None, prefix: Any = None,
             reverse: bool = False) -> AsyncScan:
        """An async iterator of (key, value), as the synchronous ``scan``; its view
        is taken when it is created (a following handle's: at its first item,
        once caught up on a thread); ``await it.seek(key)``."""
        handle = self._handle
        return AsyncScan(self._owner, lambda: handle.scan(start, end, prefix, reverse))

    async def flush(self) -> None:
        await self._owner._run(self._handle.flush)

    async def compact(self) -> None:
        await self._owner._run(self._owner.sync_db.compact, self._table)


class AsyncTable(_Reads):
    """A table of an :class:`AsyncDB` (``db.table(name)``)."""

    @property
    def name(self) -> str:
        assert self._table is not None
        return self._table


class AsyncDB(_Reads):
    """An open database for asyncio; see the module docstring.  Acts on the
    table ``"default"``; others through :meth:`table`."""

    def __init__(self, sync_db: _db.DB, executor: ThreadPoolExecutor) -> None:
        #: The synchronous handle underneath.
        self.sync_db = sync_db
        #: The threads that do what may wait on the disk.
        self.executor = executor
        self._tables: dict[str, AsyncTable] = {}
        self._closing = False
        super().__init__(self, sync_db._default_state, None, sync_db)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closing:
            self.sync_db._versions.check_open()  # DatabaseClosedError, as the sync handle
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args))

    def _later(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on a thread without waiting for it (an iterator's or a
        snapshot's close: the files it held may leave the disk then)."""
        try:
            self.executor.submit(fn)
        except RuntimeError:  # the threads are gone (closed): here, then
            fn()

    @property
    def path(self) -> str:
        return self.sync_db.path

    @property
    def closed(self) -> bool:
        return self.sync_db.closed

    def table(self, name: str) -> AsyncTable:
        """The table ``name`` (NoSuchTableError if missing; a following handle knows
        the tables of its last catch-up: ``await db.refresh()``)."""
        handle = self.sync_db._handles.get(name)
        if handle is None or self.sync_db.closed:
            raise_missing(self.sync_db, name)
        cached = self._tables.get(name)
        if cached is None or cached._handle is not handle:
            cached = self._tables[name] = AsyncTable(self, handle._state, name, handle)
        return cached

    def tables(self) -> list[str]:
        """Every table's name (a following handle's as of its last catch-up)."""
        if self.sync_db.closed:
            self.sync_db._versions.check_open()
        return sorted(self.sync_db._versions.tables)

    async def create_table(self, name: str, exist_ok: bool = False,
                           **options: Any) -> AsyncTable:
        await self._run(functools.partial(self.sync_db.create_table, name, exist_ok, **options))
        return self.table(name)

    async def alter_table(self, name: str, **options: Any) -> None:
        await self._run(functools.partial(self.sync_db.alter_table, name, **options))

    async def drop_table(self, name: str) -> None:
        await self._run(self.sync_db.drop_table, name)
        self._tables.pop(name, None)

    def batch(self, sync: bool | None = None) -> AsyncBatch:
        """``async with db.batch() as b: b.put(k, v, table=...)``: filled here,
        committed on a thread when the block ends (discarded if it raises)."""
        return AsyncBatch(self, self.sync_db.batch(sync))

    def snapshot(self) -> AsyncSnapshot:
        """Every table as of now (taken here, from memory; a following handle's at
        its first read, once caught up on a thread); its reads run on a thread.
        ``async with`` or ``close()``."""
        return AsyncSnapshot(self, self.sync_db.snapshot)

    async def sync(self) -> None:
        await self._run(self.sync_db.sync)

    async def flush(self, table: str | None = None) -> None:
        await self._run(self.sync_db.flush, table)

    async def compact(self, table: str | None = None) -> None:
        await self._run(self.sync_db.compact, table)

    async def wait_for_compactions(self, timeout: float | None = None) -> None:
        await self._run(self.sync_db.wait_for_compactions, timeout)

    async def checkpoint(self, dest: str | os.PathLike[str]) -> str:
        return await self._run(self.sync_db.checkpoint, dest)

    async def refresh(self) -> None:
        await self._run(self.sync_db.refresh)

    async def close(self) -> None:
        """Close the database (on a thread), then its threads; idempotent."""
        if self._closing:
            return
        self._closing = True
        try:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self.executor, self.sync_db.close)
        finally:
            self.executor.shutdown(wait=False)

    async def __aenter__(self) -> AsyncDB:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.sync_db.__reduce_ex__(protocol)

    def __repr__(self) -> str:
        return f"<lsmdb.aio.AsyncDB {self.path!r}{' closed' if self.closed else ''}>"


class AsyncBatch:
    """A :class:`lsmdb.handles.WriteBatch` for ``async with``."""

    def __init__(self, owner: AsyncDB, batch: WriteBatch) -> None:
        self._owner = owner
        self.batch = batch

    def put(self, key: Any, value: Any, table: str | None = None, ttl: Any = None) -> None:
        self.batch.put(key, value, table, ttl)

    def delete(self, key: Any, table: str | None = None) -> None:
        self.batch.delete(key, table)

    def __len__(self) -> int:
        return len(self.batch)

    async def commit(self) -> None:
        await self._owner._run(self.batch.commit)

    def discard(self) -> None:
        self.batch.discard()

    async def __aenter__(self) -> AsyncBatch:
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            await self.commit()
        else:
            self.discard()


class AsyncScan:
    """An async iterator over a synchronous scan, its items fetched on a thread
    ``SCAN_CHUNK`` at a time; ``await seek(key)``, ``close()``."""

    def __init__(self, owner: AsyncDB, make: Callable[[], ScanIterator]) -> None:
        self._owner = owner
        self._make: Callable[[], ScanIterator] | None = make
        self._it: ScanIterator | None = None
        if owner.sync_db._versions.follower is None:
            self._start()  # the view as of now: memory only
        self._buffer: list[tuple[bytes, bytes]] = []
        self._pos = 0
        self._done = False

    def _start(self) -> ScanIterator:
        if self._it is None:
            assert self._make is not None
            self._it, self._make = self._make(), None
        return self._it

    async def _ready(self) -> ScanIterator:
        if self._it is None:
            await self._owner._run(self._start)  # a following handle: it may catch up
        assert self._it is not None
        return self._it

    def __aiter__(self) -> AsyncScan:
        return self

    async def __anext__(self) -> tuple[bytes, bytes]:
        await self._ready()
        if self._pos >= len(self._buffer):
            if self._done:
                raise StopAsyncIteration
            self._buffer = await self._owner._run(self._chunk)
            self._pos = 0
            if not self._buffer:
                self._done = True
                raise StopAsyncIteration
        item = self._buffer[self._pos]
        self._pos += 1
        return item

    def _chunk(self) -> list[tuple[bytes, bytes]]:
        return builtins.list(islice(self._start(), SCAN_CHUNK))

    async def seek(self, key: Any) -> None:
        """The next item is the first with key >= ``key`` (<= reversed) in the scan's
        range and view."""
        it = await self._ready()
        await self._owner._run(it.seek, key)
        self._buffer, self._pos, self._done = [], 0, False

    def close(self) -> None:
        """Let the scan's view go (on a thread: its files may leave the disk then)."""
        if self._it is not None:
            self._owner._later(self._it.close)
            self._it = None
        self._make = None
        self._buffer, self._pos, self._done = [], 0, True

    async def aclose(self) -> None:
        """``close()``, waiting for it."""
        it, self._it = self._it, None
        self.close()
        if it is not None:
            await self._owner._run(it.close)


class AsyncSnapshot:
    """A :class:`lsmdb.Snapshot` whose reads run on the database's threads."""

    def __init__(self, owner: AsyncDB, make: Callable[[], Snapshot]) -> None:
        self._owner = owner
        self._make: Callable[[], Snapshot] | None = make
        self._snapshot: Snapshot | None = None
        if owner.sync_db._versions.follower is None:
            self._start()

    def _start(self) -> Snapshot:
        if self._snapshot is None:
            if self._make is None:
                raise ValueError("the snapshot is closed")
            self._snapshot, self._make = self._make(), None
        return self._snapshot

    async def _ready(self) -> Snapshot:
        if self._snapshot is None:
            await self._owner._run(self._start)  # a following handle: it may catch up
        return self._start()

    @property
    def snapshot(self) -> Snapshot:
        """The synchronous snapshot underneath."""
        return self._start()

    @property
    def seq(self) -> int:
        return self._start().seq

    async def get(self, key: Any, default: Any = None, table: str | None = None) -> Any:
        snap = await self._ready()
        return await self._owner._run(snap.get, key, default, table)

    async def get_many(self, keys: Iterable[Any], table: str | None = None) -> list[Any]:
        snap = await self._ready()
        return await self._owner._run(snap.get_many, list(keys), table)

    def scan(self, start: Any = None, end: Any = None, prefix: Any = None,
             reverse: bool = False, table: str | None = None) -> AsyncScan:
        return AsyncScan(self._owner,
                         lambda: self._start().scan(start, end, prefix, reverse, table))

    def close(self) -> None:
        """Release the snapshot (on a thread: files it kept may leave the disk then)."""
        if self._snapshot is not None:
            self._owner._later(self._snapshot.close)
        self._make = None

    async def aclose(self) -> None:
        """Release the snapshot, waiting for it."""
        snap, self._snapshot, self._make = self._snapshot, None, None
        if snap is not None:
            await self._owner._run(snap.close)

    async def __aenter__(self) -> AsyncSnapshot:
        await self._ready()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


__all__ = ["AsyncBatch", "AsyncDB", "AsyncScan", "AsyncSnapshot", "AsyncTable", "open"]
