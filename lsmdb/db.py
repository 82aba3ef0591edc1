"""The ``DB`` facade: open and close, tables, reads, writes, flushes, compactions.

The state a DB coordinates has one owner each: :mod:`lsmdb.versions` (the
tables, their files and numbers, the manifest, the WAL's segments),
:mod:`lsmdb.writepath` (writes), :mod:`lsmdb.flush` (flushes, sync, making a
failed WAL whole again), :mod:`lsmdb.compactor` with :mod:`lsmdb.compaction`
(compactions, on the thread of :mod:`lsmdb.background`), :mod:`lsmdb.readpath`
(gets, get_many, scans), :mod:`lsmdb.recovery` (opening), :mod:`lsmdb.lockfile`
(the LOCK).  Files in a database directory: :mod:`lsmdb.files`
(docs/FORMAT.md §2); the layout of the code: docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from . import checkpoint as _checkpoint
from . import stats as _stats
from . import worker as _worker
from .background import Background
from .cache import DEFAULT_BLOCK_CACHE_SIZE_BYTES, BlockCache
from .compactor import Compactor
from .errors import LsmdbError, NoSuchTableError, TableExistsError
from .files import SwitchedButNotSynced
from .flush import Flusher
from .follow import Follower
from .handles import Table, WriteBatch
from .keys import as_key
from .lockfile import DatabaseLock
from .mapping import ScanMapping
from .options import (
    DEFAULT_TABLE,
    validate_bool,
    validate_max_total_wal_size,
    validate_table_name,
    validate_table_options,
)
from .readpath import get_many, state_getter
from .recovery import open_database
from .scan import ScanIterator, scan
from .snapshot import Snapshot
from .table import SSTableInfo, TableState
from .trace import trace_read
from .ttl import clock_us
from .versions import Versions
from .writepath import WritePath

try:
    from ._speedups import Contains as _Contains
except ImportError:
    _Contains = None  # type: ignore[assignment,misc]

log = logging.getLogger("lsmdb")

#: Every DB open in this process, so that a fork() child can disown them.
_OPEN_DBS: weakref.WeakSet[DB] = weakref.WeakSet()


def _disown_after_fork() -> None:
    for db in list(_OPEN_DBS):
        db._disown()


os.register_at_fork(after_in_child=_disown_after_fork)


class DB(ScanMapping):
    """An open lsmdb database.  Create with :func:`lsmdb.open`.

    The DB acts on the table ``"default"``; other tables through
    :meth:`table`.  Thread-safe: writes are serialised by one lock, reads take
    no lock.  Iterates like a mapping of the default table
    (:class:`lsmdb.mapping.ScanMapping`): ``for key in db`` in key order,
    ``keys()``, ``values()``, ``items()`` lazily over a scan, and ``len(db)``,
    which counts the live keys with a scan (O(n)).

    Example:
        >>> import lsmdb, tempfile
        >>> with lsmdb.open(tempfile.mkdtemp()) as db:
        ...     db[b"k"] = b"v"
        ...     db.delete(b"gone")
        ...     (db.get(b"k"), db.get(b"gone", b"?"), list(db.scan()))
        (b'v', b'?', [(b'k', b'v')])
    """

    def __init__(self, path: str | os.PathLike[str], *, create_if_missing: bool = True,
                 sync: bool = False, read_only: bool = False,
                 auto_compaction: bool = True,
                 block_cache_size_bytes: int = DEFAULT_BLOCK_CACHE_SIZE_BYTES,
                 mmap_reads: bool = True, max_total_wal_size_bytes: int | None = None,
                 clock: Callable[[], float] | None = None,
                 compaction_process: bool = True, follow: bool = False) -> None:
        for name, flag in (("create_if_missing", create_if_missing), ("sync", sync),
                           ("read_only", read_only), ("follow", follow),
                           ("auto_compaction", auto_compaction),
                           ("mmap_reads", mmap_reads),
                           ("compaction_process", compaction_process)):
            validate_bool(name, flag, "option")
        if follow and not read_only:
            raise ValueError("follow=True is for read-only handles: open with read_only=True "
                             "(a writer sees its own writes)")
        self.path = os.path.abspath(os.fsdecode(os.fspath(path)))
        max_wal = validate_max_total_wal_size(max_total_wal_size_bytes)
        if isinstance(block_cache_size_bytes, bool) or not isinstance(block_cache_size_bytes, int):
            raise TypeError("block_cache_size_bytes must be an int")
        if block_cache_size_bytes < 0:
            raise ValueError("block_cache_size_bytes must be >= 0 (0 disables the cache)")
        cache = BlockCache(block_cache_size_bytes) if block_cache_size_bytes else None
        self._read_only = read_only
        self._auto_compaction = auto_compaction
        versions = self._versions = Versions(self.path, read_only=self._read_only,
                                             block_cache=cache, mmap_reads=mmap_reads,
                                             now_us=clock_us(clock),
                                             compaction_process=compaction_process)
        self._flusher = Flusher(versions, self._flushed)
        self._compactor = Compactor(versions, self._save_counters)
        self._stats_lock = threading.Lock()
        self._stats_saved_at = time.monotonic()
        self._bg: Background | None = None
        self._follower: Follower | None = None
        board = None
        if read_only:
            follower = self._follower = Follower(versions, follow, self._tables_changed)
            board = follower.watch.read()  # before the open reads anything
        self._recovered = open_database(versions, self._flusher, create_if_missing)
        if self._follower is not None:
            if board is not None:
                self._follower.watch.seen = board
            if follow:
                versions.follower = self._follower  # before any getter is made
        self._dblock: DatabaseLock | None = self._recovered.lock
        self._writes = WritePath(versions, self._flusher, sync=sync,
                                 max_total_wal_size_bytes=max_wal)
        self._handles = {name: self._handle(state) for name, state in versions.tables.items()}
        versions.closed = False
        _OPEN_DBS.add(self)
        self._default = self._handles[DEFAULT_TABLE]
        self._default_state = versions.tables[DEFAULT_TABLE]
        self._put_one = self._default._put_one
        putter = self._writes.bind_db_put(self._default_state, self._default.put)
        if putter is not None:  # the same as DB.put, without its Python frame
            setattr(self, "put", putter)
        # The hot path: an instance attribute, so db.get(k) is one closure call.
        setattr(self, "get", state_getter(versions, self._default_state))
        self._flush_bg: Background | None = None
        if not self._read_only:
            self._bg = Background("lsmdb-background", self._background)
            if self._auto_compaction:
                self._writes.stall = self._bg
                # Full memtables are written off the writers' threads.
                self._flush_bg = Background("lsmdb-flush", self._flush_round)
                self._writes.flush_thread = self._flush_bg
                self._flush_bg.start()
            self._bg.start()

    def _handle(self, state: TableState) -> Table:
        return Table(state, self._versions, self._writes, self.flush)

    def _tables_changed(self, added: list[TableState], dropped: list[TableState]) -> None:
        """A read-only handle caught up with tables created or dropped by the writer."""
        for state in dropped:
            handle = self._handles.get(state.name)
            if handle is not None and handle._state is state:
                del self._handles[state.name]
        for state in added:
            self._handles[state.name] = self._handle(state)

    def refresh(self) -> None:
        """Catch a read-only handle up with the writer: afterwards it sees every
        write the writer had acknowledged when ``refresh()`` began -- new files
        and the WAL records not yet flushed -- and tables created, altered or
        dropped since.  Scans, iterators and snapshots already open keep the
        view they took.  The work is proportional to what was written since
        the last catch-up, plus a reread of the unflushed WAL when the
        manifest changed (a flush, a compaction).  A handle opened with
        ``follow=True`` does this by itself before each read.  On a writable
        handle it does nothing: a writer always sees its own writes.
        """
        self._versions.check_open()
        if self._follower is not None:
            self._follower.catch_up(refresh=True)

    def checkpoint(self, dest: str | os.PathLike[str]) -> str:
        """A consistent, openable copy of the whole database at ``dest`` (which must
        not exist; its parent must): every table, its options and counters, with
        every write acknowledged before the call and none after, while writes go
        on.  SSTables are hard linked where the file system allows (copied
        otherwise), the WAL's unflushed records copied; the copy is fsynced and
        renamed into place before this returns, so it survives a power loss
        (lsmdb.checkpoint).  It opens read-write as a database of its own.  On a
        read-only handle it first catches up, as ``refresh()``.  Returns
        ``dest`` as an absolute path."""
        follower = self._follower
        catch_up = None if follower is None else (lambda: follower.catch_up(refresh=True))
        return _checkpoint.checkpoint(self._versions, dest, catch_up)

    @property
    def following(self) -> bool:
        """True for a handle opened with ``follow=True``."""
        return self._versions.follower is not None

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(f"an lsmdb.DB handle cannot be pickled or sent to another process: "
                        f"open the path ({self.path!r}) there, with read_only=True (and "
                        f"follow=True to see new writes) while this process writes")

    def _disown(self) -> None:
        """In a fork() child: this handle is the parent's.  Every later call raises
        DatabaseForkedError; nothing is written, and the parent's lock stays its own."""
        versions = self._versions
        versions.forked = True
        versions.closed = True
        self._bg = None
        self._flush_bg = None
        # Another thread may have held them at the fork.
        versions.lock = threading.RLock()
        self._flusher.mutex = threading.Lock()
        self._flusher.progress = threading.Condition(threading.Lock())
        self._stats_lock = threading.Lock()
        if self._dblock is not None:
            self._dblock.disown()
            self._dblock = None
        versions.log.changes = None  # the parent's board: not written from here
        versions.changes = None
        versions.log.close()
        versions.close_readers()

    def _table_state(self, name: str | None) -> TableState:
        versions = self._versions
        versions.check_open()
        if name is None:
            return self._default_state
        state = versions.tables.get(name)
        if state is None:
            if not isinstance(name, str):
                raise TypeError(f"table name must be a str, got {type(name).__name__}")
            raise NoSuchTableError(f"no table named {name!r}")
        return state

    def _states(self, table: str | None) -> list[TableState]:
        if table is not None:
            return [self._table_state(table)]
        return [self._versions.tables[n] for n in sorted(self._versions.tables)]

    # ---------------------------------------------------------------- writes
    def put(self, key: Any, value: Any, sync: bool | None = None, ttl: Any = None) -> None:
        """Set ``key`` to ``value`` in the default table (fsync first if ``sync``).
        ``ttl``: seconds until it reads as absent everywhere (None: the table's
        ``default_time_to_live``; 0: never expires).

        (Replaced per instance by a compiled twin where the C put is built,
        which does the same: see :meth:`lsmdb.writepath.WritePath.bind_db_put`.)"""
        if sync is None and ttl is None and self._put_one(key, value):
            return
        self._default.put(key, value, sync, ttl)

    def delete(self, key: Any, sync: bool | None = None) -> None:
        """Delete ``key`` from the default table (a tombstone; no error if absent)."""
        self._default.delete(key, sync)

    def batch(self, sync: bool | None = None) -> WriteBatch:
        """A :class:`WriteBatch`: ``with db.batch() as b: b.put(k, v, table=...)``."""
        self._versions.check_writable()
        return WriteBatch(self._writes, self._table_state, sync)

    def sync(self) -> None:
        """Make every write so far durable: it survives a machine crash.

        Usually one fsync of the live WAL segment; after a WAL failure, a flush
        of every memtable.
        """
        self._flusher.sync()

    def flush(self, table: str | None = None) -> None:
        """Write the memtable of ``table`` (None: every table) to an SSTable now.

        Like :meth:`sync`, it makes every write so far durable -- those to
        other tables too, and also when the memtable was empty.
        """
        with self._versions.lock:
            self._versions.check_writable()
            states = self._states(table)
        for state in states:
            self._flusher.flush_table(state)
        self.sync()

    # ----------------------------------------------------------------- reads
    def get(self, key: Any, default: Any = None) -> Any:
        """The value of ``key`` in the default table, or ``default``.

        (Replaced per instance by the table's compiled getter, which does the
        same: see :func:`lsmdb.readpath.make_getter`.)
        """
        return state_getter(self._versions, self._default_state)(key, default)

    def snapshot(self) -> Snapshot:
        """A :class:`lsmdb.Snapshot`: every table as of now, unchanged by later
        writes, deletes, flushes, compactions and ``drop_table``/``alter_table``;
        use it as a context manager, or ``close()`` it (see lsmdb.snapshot for
        what a live one costs)."""
        return Snapshot(self._versions)

    def get_many(self, keys: Iterable[Any]) -> list[bytes | None]:
        """Values of many keys of the default table at once (None where absent).

        Hashes each key once, visits each file once and reads each distinct
        data block once per call: cheaper per key than a loop of ``get``.
        """
        return get_many(self._versions, self._default_state, keys)

    def __getitem__(self, key: Any) -> bytes:
        return self._default[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._default.put(key, value)

    def __delitem__(self, key: Any) -> None:
        del self._default[key]

    def __contains__(self, key: Any) -> bool:
        return self.get(key) is not None  # the compiled getter, as db.get

    def scan(self, start: Any = None, end: Any = None, prefix: Any = None,
             reverse: bool = False) -> ScanIterator:
        """(key, value) pairs of the default table with start <= key < end, in key order.

        ``prefix`` narrows the range to keys starting with it; ``reverse``
        walks it backwards.  The iterator reads a consistent snapshot taken
        when it is created, one data block per SSTable in memory at a time;
        ``seek(key)`` moves it to the first key at or after ``key`` (at or
        before, reversed) in its range and view (lsmdb.scan.ScanIterator).
        """
        return scan(self._versions, self._default_state, start, end, prefix, reverse)

    # ---------------------------------------------------------------- tables
    def table(self, name: str) -> Table:
        """The :class:`Table` called ``name`` (NoSuchTableError if missing)."""
        self._versions.check_open()
        handle = self._handles.get(name)
        if handle is None:
            validate_table_name(name)
            raise NoSuchTableError(f"no table named {name!r}")
        return handle

    def tables(self) -> list[str]:
        """Names of every table, sorted; always includes ``"default"``."""
        self._versions.check_open()
        return sorted(self._versions.tables)

    def create_table(self, name: str, exist_ok: bool = False, **table_options: Any) -> Table:
        """Create a table with its own options.

        If it exists: TableExistsError, or with ``exist_ok`` the existing table,
        its options unchanged (change them with :meth:`alter_table`).
        """
        validate_table_name(name)
        explicit = validate_table_options(table_options)
        versions = self._versions
        with versions.lock:
            versions.check_writable()
            if name in versions.tables:
                if exist_ok:
                    return self._handles[name]
                raise TableExistsError(f"table {name!r} already exists")
            try:
                state = versions.create_table(name, explicit)
            except SwitchedButNotSynced:
                self._handles[name] = self._handle(versions.tables[name])
                raise
            finally:
                self._writes.update_wal_limit()
            handle = self._handles[name] = self._handle(state)
            return handle

    def alter_table(self, name: str, **table_options: Any) -> None:
        """Change options of ``name``; they apply to SSTables written from now on."""
        validate_table_name(name)
        changes = validate_table_options(table_options)
        with self._versions.lock:
            self._versions.check_writable()
            try:
                self._versions.alter_table(self._table_state(name), changes)
            finally:
                self._writes.update_wal_limit()

    def drop_table(self, name: str) -> None:
        """Remove ``name`` and its files.  The default table cannot be dropped."""
        validate_table_name(name)
        if name == DEFAULT_TABLE:
            raise ValueError("the default table cannot be dropped")
        versions = self._versions
        with versions.lock:
            versions.check_writable()
            state = self._table_state(name)
            try:
                versions.drop_table(state)
            finally:
                if state.dropped:
                    del self._handles[name]
                    self._flusher.progressed()  # writers waiting for its flush
                self._writes.update_wal_limit()

    # ----------------------------------------------------------- observing
    def sstables(self, table: str | None = None) -> list[SSTableInfo]:
        """One :class:`SSTableInfo` per SSTable of ``table`` (None: every table).

        Files come in the order a read consults them: level 0 newest first,
        then each deeper level by key range.
        """
        self._versions.check_open()
        out = []
        for state in self._states(table):
            fp = state.options.bloom_filter_fp_chance
            for reader in state.readers_in_order():
                out.append(SSTableInfo.from_reader(
                    state.name, reader, self._compactor.filter_spec(state, reader), fp))
        return out

    def trace(self, key: Any, table: str | None = None) -> dict[str, Any]:
        """How ``get(key)`` would be answered, file by file (no counter changes).

        See :func:`lsmdb.trace.trace_read` for the fields.
        """
        return trace_read(self._table_state(table), as_key(key))

    def table_stats(self, name: str | None = None) -> dict[str, Any]:
        """Totals of one table's filters and reads (``name`` None: the default table).

        ``absent_share`` is the share of point reads that found nothing: a
        filter pays only when it is a real share of the reads.
        """
        state = self._table_state(name)
        return _stats.table_totals(state, self.sstables(state.name))

    # ------------------------------------------------------------ compaction
    def compact(self, table: str | None = None) -> None:
        """Merge every SSTable of ``table`` (None: every table) now; returns when done.

        Flushes the memtables first, so afterwards each table's data sits in
        freshly written files with filters built at the current fp chance.
        """
        self.flush(table)
        for state in self._states(table):
            self._compactor.compact_all(state)

    def wait_for_compactions(self, timeout: float | None = None) -> None:
        """Block until background compaction has nothing left to do.

        Re-raises an error the background thread met since the last call.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._versions.check_open()
            bg = self._bg
            if bg is None or not self._auto_compaction:
                return
            error = bg.take_error()
            if error is not None:
                raise error
            fbg = self._flush_bg
            if fbg is not None:
                error = fbg.take_error()
                if error is not None:
                    raise error
                if fbg.busy or any(s.imms for s in list(self._versions.tables.values())):
                    fbg.wait_round(0.05)
                    if deadline is not None and time.monotonic() > deadline:
                        raise TimeoutError("flushes still running")
                    continue
            if not bg.busy and not self._compactor.pending():
                return
            bg.wait_round(0.05)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("compactions still running")

    def rebuild_filters(self, table: str | None = None, only_stale: bool = True) -> int:
        """Rewrite the filter of each SSTable built otherwise than the table's options say.

        Stale means another fp chance than the table's current one (or the
        last level's under ``bloom_filter_skip_last_level``), another hash, or
        a keyed filter whose secret is gone.  Data blocks and index are
        copied byte for byte; a new filter, properties block and footer are
        written, and the new file replaces the old one through the manifest.
        ``only_stale=False`` rewrites every file.  Returns the number of
        files rewritten.
        """
        self._versions.check_writable()
        return sum(self._compactor.rebuild_filters(state, only_stale)
                   for state in self._states(table))

    # ------------------------------------------------------------ background
    def _flushed(self) -> None:
        """After each flush: the counters saved -- but not on the flush
        thread, which goes on to the next frozen memtable (the background
        thread saves them every STATS_INTERVAL_SECONDS) -- and compaction
        woken (and, the first time, a compaction worker started for it:
        lsmdb.worker.warm)."""
        flush_bg = getattr(self, "_flush_bg", None)  # None while the open recovers
        if flush_bg is None or not flush_bg.is_current():
            self._save_counters()
        if self._bg is not None:
            if self._auto_compaction and self._versions.compaction_process:
                _worker.warm()
            self._bg.wake()

    def _flush_round(self, should_stop: Callable[[], bool]) -> None:
        """One round of the flush thread: every frozen memtable written."""
        if not should_stop():
            self._flusher.flush_frozen()

    def _background(self, should_stop: Callable[[], bool]) -> None:
        """One background round: counters when due, then every pending compaction."""
        if time.monotonic() - self._stats_saved_at >= _stats.STATS_INTERVAL_SECONDS:
            self._save_counters()
        if self._auto_compaction:
            self._compactor.run_pending(should_stop)

    def _save_counters(self) -> None:
        if self._read_only:
            return
        with self._stats_lock:
            versions = self._versions
            try:
                _stats.save_stats(self.path, versions.readers(), list(versions.tables.values()))
            except OSError as exc:
                log.warning("could not save filter counters: %s", exc)
            self._stats_saved_at = time.monotonic()

    # ----------------------------------------------------------------- close
    def close(self) -> None:
        """Stop background work, save counters, make every write durable, release the lock.

        Every WAL segment is fsynced and the live one sealed (the manifest
        records every segment's size), so the next open reads each to a known
        size.  After a WAL failure that cannot be repaired (every memtable
        flushed), the error is raised once the database is closed: the writes
        since the last successful fsync may not be durable.  Idempotent.
        """
        if self._writes.flush_thread is not None:
            self._writes.flush_thread = None  # writers flush on their own thread from here
            if self._flush_bg is not None:
                self._flush_bg.stop()
        if self._bg is not None:
            self._compactor.cancel()  # a running compaction is redone after the next open
            self._bg.stop()
        versions = self._versions
        wal = versions.log
        error: OSError | None = None
        # A snapshot ends with its database (before the lock: a snapshot's close takes
        # its own lock, then the database's).
        for snap in list(versions.snapshots):
            snap.close()
        with self._flusher.mutex, versions.lock:  # no flush is half done past this point
            if versions.closed:
                return
            try:
                self._save_counters()
                if not self._read_only:
                    if wal.failed is not None:
                        try:
                            self._flusher.recover_log_held(closing=True)
                        except OSError as exc:
                            error = exc
                    if wal.failed is None:
                        wal.seal(versions.write_manifest)
                    else:
                        wal.sync_failed_quietly()
                        error = error or wal.failed
            finally:
                versions.closed = True
                self._flusher.progressed()  # writers waiting for the flush thread
                wal.changes = None
                if self._follower is not None:
                    self._follower.close()
                if versions.changes is not None:
                    versions.changes.close()
                    versions.changes = None
                wal.close()
                versions.close_readers()
                if self._dblock is not None:
                    self._dblock.release()
                    self._dblock = None
        if error is not None:
            raise error

    def _check(self) -> None:
        """Check the engine's invariants (AssertionError naming the first broken one):
        for tests and debugging, not needed in use."""
        self._versions._check()

    @property
    def recovery(self) -> dict[str, Any]:
        """What this open recovered: WAL ``segments`` and ``records`` replayed,
        ``torn`` tails dropped (``[path, offset]``: writes never fsynced that a
        crash cut short), leftover files ``removed``, segments ``set_aside`` in
        ``lost/`` and tables ``flushed`` because the replay filled them."""
        r = self._recovered
        return {"segments": r.segments, "records": r.records,
                "torn": [list(t) for t in r.torn], "removed": list(r.removed),
                "set_aside": list(r.set_aside), "flushed": list(r.flushed)}

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._versions.closed

    def __enter__(self) -> DB:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<lsmdb.DB {self.path!r}{' closed' if self.closed else ''}>"


if _Contains is not None:  # `key in db` as the method above, without its Python frame
    setattr(DB, "__contains__", _Contains("get"))


def open(path: str | os.PathLike[str], create_if_missing: bool = True, sync: bool = False,
         read_only: bool = False, auto_compaction: bool = True,
         block_cache_size_bytes: int = DEFAULT_BLOCK_CACHE_SIZE_BYTES,
         mmap_reads: bool = True, max_total_wal_size_bytes: int | None = None,
         clock: Callable[[], float] | None = None, compaction_process: bool = True,
         follow: bool = False) -> DB:
    """Open (or create) the database in directory ``path``.

    ``sync=True`` fsyncs the WAL before every write returns (per call:
    ``put(..., sync=...)``).  ``read_only=True`` takes no lock, so it can read
    a database another process has open; it sees every write acknowledged
    before it began, and after ``refresh()`` every one acknowledged before
    that began.  ``follow=True`` (with ``read_only=True``) makes a handle
    that catches up by itself: a read that begins after the writer
    acknowledged a write sees it (lsmdb.follow).  ``auto_compaction`` runs
    compactions on a background thread after flushes.
    ``block_cache_size_bytes`` bounds the shared cache of data blocks, their
    payloads as on disk (0 disables it; cache hits are counted apart from
    disk reads).  ``mmap_reads`` maps each SSTable
    read-only so that a get copies the data block it reads out of the mapping
    instead of asking the kernel for it (a system call); a file cut short
    under the mapping still raises CorruptionError.  Without the C speedups,
    or with ``mmap_reads=False``, every block is read with ``pread`` (the
    kernel's count of read calls then equals the files' ``block_reads``).
    ``max_total_wal_size_bytes`` bounds the WAL segments kept on disk (and
    replayed at the next open): past it, the tables whose memtables hold
    records of the oldest segment are flushed.  None: four times the sum of
    every table's ``memtable_size_bytes``.  ``clock``, what expiring values
    (``put(..., ttl=...)``) expire by: a callable returning seconds since the
    epoch (None: ``time.time``; tests give their own).  ``compaction_process``
    runs each compaction's merge -- reading its inputs, writing and fsyncing
    its outputs -- in a worker process (a Python started from
    ``sys.executable``, shared by the process's databases), so that it does
    not hold this process's interpreter lock while writers and readers run;
    False merges on the compacting thread.  Either way the outputs are
    installed here, through the manifest.
    """
    return DB(path, create_if_missing=create_if_missing, sync=sync, read_only=read_only,
              auto_compaction=auto_compaction, block_cache_size_bytes=block_cache_size_bytes,
              mmap_reads=mmap_reads, max_total_wal_size_bytes=max_total_wal_size_bytes,
              clock=clock, compaction_process=compaction_process, follow=follow)


__all__ = ["DB", "open", "LsmdbError"]
