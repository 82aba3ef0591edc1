"""The tables of a database and the files that make them up: the one writer of the manifest.

A :class:`Versions` holds each table's state (:class:`lsmdb.table.TableState`:
memtables, SSTable readers, options), the file and table numbers handed out,
the last sequence number, the WAL's :class:`lsmdb.logset.LogSet` and the
:class:`lsmdb.version.VersionSet` that keeps a file on disk while a version
names it.  It is the only code that writes the MANIFEST (docs/FORMAT.md §6)
and names the files (:mod:`lsmdb.files`).  Every change to it is made holding
its ``lock`` -- the database's lock, also taken by the write path for each WAL
append -- and readers take whole per-table views (``TableState.fast``,
``TableState.version``) that it replaces in one step.  Opening reads a
directory's state (:mod:`lsmdb.recovery`) and ``install`` makes it this
object's.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from .changes import ChangeBoard
from .errors import DatabaseClosedError, DatabaseForkedError, ReadOnlyError
from .files import MANIFEST_NAME, SwitchedButNotSynced, fsync_dir, sst_name
from .filters import hashing as _hashing
from .logset import LogSet, WalState
from .manifest import FileMeta, Manifest, TableMeta
from .memtable import Memtable
from .secret import create_secret
from .sstable_reader import SSTableReader
from .table import TableState
from .ttl import system_now_us
from .version import VersionSet

log = logging.getLogger("lsmdb")


class Versions:
    """The tables, their files and numbers, and the manifest (see the module docstring)."""

    # What a put reads, in slots (the C put, lsmdb/csrc/writepath.c, reads them
    # at their offsets); the rest in the instance's dict.
    __slots__ = ("log", "closed", "read_only", "last_seq", "lock", "__dict__")

    def __init__(self, path: str, *, read_only: bool = False, block_cache: Any = None,
                 mmap_reads: bool = True, now_us: Callable[[], int] = system_now_us,
                 compaction_process: bool = True) -> None:
        self.path = path
        #: The database's clock in microseconds (lsmdb.ttl): what expiring values expire by.
        self.now_us = now_us
        self.read_only = read_only
        #: False once the database is open; True again once it is closed.
        self.closed = True
        #: The handle was opened by the parent of this forked process.
        self.forked = False
        self.log = LogSet(path)
        #: The database's lock: held for every change here and for each WAL append.
        self.lock = threading.RLock()
        self.tables: dict[str, TableState] = {}
        self.by_id: dict[int, TableState] = {}
        self.next_file = 1
        self.next_table_id = 1
        self.last_seq = 0
        #: The database's identity (lsmdb.manifest), which each new SSTable records.
        self.db_id = ""
        #: The keyed filters' hasher (FILTER_KEY), None when the database has none.
        self.keyed: _hashing.Hasher | None = None
        #: A manifest switch is visible but its directory fsync failed: the next
        #: sync point fsyncs the directory again before it promises anything.
        self.manifest_unsynced = False
        self.block_cache = block_cache
        self.mmap_reads = mmap_reads
        #: Merges of compactions run in a worker process (lsmdb.worker).
        self.compaction_process = compaction_process
        #: The live versions of every table, and the files retired from them.
        self.version_set = VersionSet(remove=not read_only)
        #: The live snapshots (lsmdb.snapshot), closed with the database.
        self.snapshots: weakref.WeakSet[Any] = weakref.WeakSet()
        #: A writer's CHANGES board (lsmdb.changes), None for a read-only handle.
        self.changes: ChangeBoard | None = None
        #: A following read-only handle's catching up (lsmdb.follow), or None.
        self.follower: Any = None
        #: The manifest as last read (a read-only handle compares it to catch up).
        self.manifest_bytes = b""
        #: (number, end of its last whole record) of the live WAL segment as last
        #: read, or None: where a read-only handle's catch-up reads on from.
        self.live_tail: tuple[int, int] | None = None
        #: (number, length of its whole records, format) of each WAL segment a
        #: read-only handle replayed as last read (a checkpoint of it copies them).
        self.replayed_wal: list[tuple[int, int, int]] = []

    def new_table(self, name: str, table_id: int, explicit: dict[str, Any]) -> TableState:
        """A table's state, its versions counted here, its reads through the cache."""
        return TableState(name, table_id, explicit, self.version_set, self.block_cache,
                          self.now_us)

    def install(self, tables: dict[str, TableState], next_file: int, next_table_id: int,
                last_seq: int, log: LogSet) -> None:
        """Take what an open read from the directory (recovery.open_database)."""
        self.tables = dict(tables)
        self.by_id = {s.id: s for s in tables.values()}
        self.next_file = next_file
        self.next_table_id = next_table_id
        self.last_seq = last_seq
        self.log = log

    def retire(self, readers: list[SSTableReader]) -> None:
        """These files left their table through a durable manifest switch: each
        leaves the disk once no version names it (lsmdb.version)."""
        self.version_set.retire(readers)

    def check_open(self) -> None:
        """DatabaseClosedError (DatabaseForkedError in a fork child) once closed; for a
        following handle, catch up with the writer first (every read begins here or in
        a getter, which checks the same)."""
        follower = self.follower
        if follower is not None and not self.closed:
            follower.check()
        if self.closed:
            if self.forked:
                raise DatabaseForkedError(
                    f"database {self.path} was opened by the parent of this forked process; "
                    "open it again in this process")
            raise DatabaseClosedError(f"database {self.path} is closed")

    def check_writable(self) -> None:
        self.check_open()
        if self.read_only:
            raise ReadOnlyError(f"database {self.path} was opened read-only")

    # -- files ------------------------------------------------------------------
    def alloc_file_number(self) -> int:
        with self.lock:
            number = self.next_file
            self.next_file += 1
            return number

    def sst_path(self, number: int) -> str:
        return os.path.join(self.path, sst_name(number))

    def adopt(self, reader: SSTableReader, level: int) -> SSTableReader:
        """Make a freshly opened reader part of this database (level, hash, cache, mapping)."""
        reader.level = level
        reader.attach_hasher(self.keyed)
        reader.attach_cache(self.block_cache)
        if self.mmap_reads:
            reader.map_file()
        return reader

    def hasher_for(self, state: TableState, create: bool = True) -> _hashing.Hasher:
        """The hash new filters of ``state`` are built with (creates the secret if
        needed, unless ``create`` is False: then, with no secret yet, a keyed hasher
        of no secret -- what a file written now would be built with, for its id)."""
        if state.options.bloom_filter_hash != "keyed":
            return _hashing.FAST_HASHER
        if self.keyed is None and not create:
            return _hashing.Hasher(_hashing.HASH_BLAKE2B_KEYED, 0, _hashing.key_hash)
        if self.keyed is None:
            with self.lock:
                if self.keyed is None:
                    self.keyed = create_secret(self.path)
        return self.keyed

    def readers(self) -> list[SSTableReader]:
        return [r for s in list(self.tables.values()) for r in s.files]

    def close_readers(self) -> None:
        """Close every reader and drop the tables' references to them, so each
        is freed (its descriptor number released) once no read holds it; and
        empty the tables' fast cells, which sends the C getters to the Python
        ones (and so to DatabaseClosedError).  Retired files a scan still held
        leave the disk now."""
        for state in self.tables.values():
            for reader in state.files:
                reader.close()
            state.files = ()
            state.publish()
            state.fast_cell[0] = None
        self.version_set.close()

    # -- the manifest -------------------------------------------------------------
    def low_seq(self) -> int | None:
        """The smallest sequence number any memtable holds (None: all are empty)."""
        low = None
        for s in self.tables.values():
            for mem in (s.mem,) + s.imms:
                if mem.min_seq is not None and (low is None or mem.min_seq < low):
                    low = mem.min_seq
        return low

    def manifest(self, low_seq: int | None, wal: WalState | None = None) -> Manifest:
        """The manifest of the current state; ``wal``: its WAL record instead of the
        log's (a checkpoint's, whose segments are its own)."""
        tables = {}
        for name, s in self.tables.items():
            files = [FileMeta(r.number, r.level, r.size_bytes, r.entries, r.min_key, r.max_key,
                              r.min_seq, r.max_seq) for r in s.files]
            tables[name] = TableMeta(s.id, s.explicit, s.flushed_seq, files)
        return Manifest(self.next_file, self.next_table_id, self.last_seq, tables,
                        self.log.state(low_seq) if wal is None else wal, self.db_id)

    def write_manifest(self) -> None:
        """Switch the manifest to the current state (the lock held); once that is
        durable, delete the WAL segments no memtable needs.  On
        SwitchedButNotSynced they stay: a crash could bring the old manifest back."""
        low = self.low_seq()
        try:
            self.manifest(low).write(os.path.join(self.path, MANIFEST_NAME))
        except SwitchedButNotSynced:
            self.manifest_unsynced = True
            raise
        finally:
            if self.changes is not None:  # followers look at the manifest again
                self.changes.bump_epoch()
        self.manifest_unsynced = False
        self.log.retire(low)

    def promote_segments(self) -> None:
        """``sync()`` or a sync=True write fsynced unsynced segments: a manifest switch
        names them synced.  The writes are durable either way: a failure is logged,
        and the next switch tries again."""
        try:
            self.write_manifest()
        except OSError as exc:
            log.warning("could not record the WAL segments a sync fsynced: %s", exc)

    def sync_manifest(self) -> None:
        """Make the visible manifest durable if its switch's directory fsync failed
        (the lock held): a table created or a file installed then is no more
        durable than that manifest."""
        if self.manifest_unsynced:
            fsync_dir(self.path)
            self.manifest_unsynced = False

    def rotate_wal(self, flushing: TableState | None = None) -> None:
        """Close the live WAL segment and start a new one, through a manifest switch
        naming both; the lock held.  The closed segment is fsynced unless only
        ``flushing``'s memtables (about to be flushed) may hold records in it and
        the unsynced ones: then, flushed, it is deleted unsynced.  See
        :meth:`lsmdb.logset.LogSet.rotate`."""
        sync = True
        if flushing is not None:
            others = [(m.min_seq, m.max_seq) for s in self.tables.values() if s is not flushing
                      for m in (s.mem,) + s.imms if m.min_seq is not None]
            sync = self.log.may_hold(others)
        self.log.rotate(self.alloc_file_number(), self.write_manifest, sync)

    # -- tables -------------------------------------------------------------------
    def add(self, state: TableState) -> None:
        """Take a table read from the manifest."""
        self.tables[state.name] = state
        self.by_id[state.id] = state

    def create_table(self, name: str, explicit: dict[str, Any]) -> TableState:
        """A new table, named by a manifest switch (the lock held).  On
        SwitchedButNotSynced the table exists (the visible manifest names it)."""
        state = self.new_table(name, self.next_table_id, explicit)
        self.next_table_id += 1
        self.tables[name] = state
        try:
            self.write_manifest()
        except SwitchedButNotSynced:
            self.by_id[state.id] = state
            raise
        except BaseException:
            del self.tables[name]
            self.next_table_id -= 1
            raise
        self.by_id[state.id] = state
        return state

    def alter_table(self, state: TableState, changes: dict[str, Any]) -> None:
        """New options for a table, through a manifest switch (the lock held)."""
        old = state.explicit
        state.set_options({**state.explicit, **changes})  # validates first
        try:
            self.write_manifest()
        except SwitchedButNotSynced:
            raise  # the new options are on disk: keep them
        except BaseException:
            state.set_options(old)
            raise

    def drop_table(self, state: TableState) -> None:
        """Remove a table through a manifest switch, then its files (the lock held).
        On SwitchedButNotSynced it is gone but its files stay: the old manifest
        could come back."""
        del self.tables[state.name]
        synced = True
        try:
            self.write_manifest()
        except SwitchedButNotSynced:
            synced = False  # dropped on disk; keep its files for the old manifest
        except BaseException:
            self.tables[state.name] = state
            raise
        state.dropped = True
        self.by_id.pop(state.id, None)
        files = list(state.files)
        state.mem = Memtable()
        state.imms = ()
        state.files = ()
        state.publish()
        if synced:
            # Not closed here: a concurrent get may still hold one; its
            # descriptor is released when the last reference goes.
            self.retire(files)
        else:
            for reader in files:
                reader.drop_cached()  # no read of this database reaches them again
        if not synced:
            raise SwitchedButNotSynced(errno.EIO, f"table {state.name!r} dropped, but the "
                                                  "manifest switch may not be durable")

    def _check(self) -> None:
        """Invariants: every table by name and by id once; no file in two tables,
        none at or past the next file number; every table, the WAL set and the
        block cache keep their own invariants.  Takes the lock."""
        with self.lock:
            self._check_held()

    def _check_held(self) -> None:
        if sorted(id(s) for s in self.tables.values()) != sorted(id(s) for s in
                                                                 self.by_id.values()):
            raise AssertionError("tables by name and by id disagree")
        if any(self.by_id[s.id] is not s or s.name != name for name, s in self.tables.items()):
            raise AssertionError("a table filed under another name or id")
        if any(s.id >= self.next_table_id for s in self.tables.values()):
            raise AssertionError("a table id at or past the next one")
        numbers = [r.number for s in self.tables.values() for r in s.files]
        if len(set(numbers)) != len(numbers) or any(n >= self.next_file for n in numbers):
            raise AssertionError(f"file numbers {sorted(numbers)} (next {self.next_file})")
        for state in self.tables.values():
            state._check()
        self.version_set._check(s.version for s in self.tables.values())
        self.log._check()
        if self.block_cache is not None:
            self.block_cache._check()

    def memtable_bytes(self) -> int:
        """The sum of every table's ``memtable_size_bytes``."""
        return sum(s.options.memtable_size_bytes for s in self.tables.values())
