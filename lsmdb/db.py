"""The ``DB`` facade: tables, reads, writes, flushes (opening: :mod:`lsmdb.recovery`).

Files in a database directory: :mod:`lsmdb.files` (docs/FORMAT.md §2).

Writes: WAL record (fsync if ``sync``) -> memtable.  A full memtable is
flushed: the WAL is rotated (the live segment fsynced and closed, a new one
named by a manifest switch), the memtable frozen, its SSTable written and
fsynced, the manifest switched to name it, and the WAL segments no memtable
needs any more deleted.  A table with ``MAX_FROZEN_MEMTABLES`` frozen
memtables (their flushes failing) takes no more writes until one flushes;
WAL segments past ``max_total_wal_size_bytes`` get the tables that pin the
oldest of them flushed.  A failed WAL append or fsync fails the live
segment; the next write first flushes every memtable (so that nothing
depends on that segment) and starts a new one (:meth:`DB._recover_log`).
Reads: :mod:`lsmdb.readpath`.  Compactions: :mod:`lsmdb.compaction` (what
to merge) and :mod:`lsmdb.compactor` (running and installing them) on the
thread of :mod:`lsmdb.background`.  WAL segments: :mod:`lsmdb.logset`.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from operator import itemgetter
from typing import Any

from . import bloom as _bloom
from . import compaction as _compaction
from . import stats as _stats
from .background import Background
from .cache import DEFAULT_BLOCK_CACHE_SIZE_BYTES, BlockCache
from .compactor import Compactor
from .errors import (
    DatabaseClosedError,
    DatabaseForkedError,
    LsmdbError,
    NoSuchTableError,
    ReadOnlyError,
    TableExistsError,
)
from .files import MANIFEST_NAME, SwitchedButNotSynced, fsync_dir, sst_name, unlink_quietly
from .keys import MAX_BATCH_SIZE_BYTES, as_key
from .lockfile import DatabaseLock
from .logset import LogSet, encode_record, encode_table_record
from .manifest import FileMeta, Manifest, TableMeta
from .memtable import Memtable
from .merge import merge_newest
from .options import (
    DEFAULT_TABLE,
    validate_max_total_wal_size,
    validate_table_name,
    validate_table_options,
)
from .readpath import get_many, state_getter
from .recovery import open_database
from .secret import create_secret
from .sstable import SSTableReader, write_sstable
from .table import SSTableInfo, Table, TableState, WriteBatch
from .trace import trace_read

log = logging.getLogger("lsmdb")

_key_hash = _bloom.key_hash
_MASK32 = _bloom.MASK32

#: A table with this many frozen memtables waiting for their flush takes no
#: more writes until one is flushed (each write tries; while flushes fail, it
#: raises their error and writes nothing).
MAX_FROZEN_MEMTABLES = 2
#: ``max_total_wal_size_bytes=None``: this many times the memtables' total size.
WAL_SIZE_MEMTABLE_MULTIPLE = 4

#: Every DB open in this process, so that a fork() child can disown them.
_OPEN_DBS: weakref.WeakSet[DB] = weakref.WeakSet()


def _disown_after_fork() -> None:
    for db in list(_OPEN_DBS):
        db._disown()


os.register_at_fork(after_in_child=_disown_after_fork)


def _check_batch_size(keys: Iterable[bytes], values: Iterable[bytes | None]) -> None:
    total = sum(map(len, keys)) + sum(map(len, filter(None, values)))
    if total > MAX_BATCH_SIZE_BYTES:
        raise ValueError(f"batch of {total} bytes exceeds {MAX_BATCH_SIZE_BYTES} bytes")


_first = itemgetter(0)
_second = itemgetter(1)
_third = itemgetter(2)


def prefix_end(prefix: bytes) -> bytes | None:
    """Smallest key greater than every key starting with ``prefix`` (None: no bound)."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return None
    p[-1] += 1
    return bytes(p)


class DB:
    """An open lsmdb database.  Create with :func:`lsmdb.open`.

    The DB acts on the table ``"default"``; other tables through
    :meth:`table`.  Thread-safe: writes are serialised by one lock, reads take
    no lock.

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
                 mmap_reads: bool = True, max_total_wal_size_bytes: int | None = None) -> None:
        self.path = os.path.abspath(os.fsdecode(os.fspath(path)))
        self._max_wal = validate_max_total_wal_size(max_total_wal_size_bytes)
        self._sync = bool(sync)
        self._mmap_reads = bool(mmap_reads)
        self._read_only = bool(read_only)
        self._auto_compaction = bool(auto_compaction)
        if isinstance(block_cache_size_bytes, bool) or not isinstance(block_cache_size_bytes, int):
            raise TypeError("block_cache_size_bytes must be an int")
        if block_cache_size_bytes < 0:
            raise ValueError("block_cache_size_bytes must be >= 0 (0 disables the cache)")
        self._block_cache = BlockCache(block_cache_size_bytes) if block_cache_size_bytes else None
        self._lock = threading.RLock()
        self._closed = True
        self._forked = False
        self._dblock: DatabaseLock | None = None
        self._log = LogSet(self.path)
        self._wal_limit = 0
        #: A manifest switch is visible but its directory fsync failed: the next
        #: sync point fsyncs the directory again before it promises anything.
        self._manifest_unsynced = False
        self._tables: dict[str, TableState] = {}
        self._by_id: dict[int, TableState] = {}
        self._handles: dict[str, Table] = {}
        self._last_seq = 0
        self._next_file = 1
        self._next_table_id = 1
        self._compactor = Compactor(self)
        self._flush_mutex = threading.Lock()   # one flush at a time, installed in order
        self._bg: Background | None = None
        self._stats_lock = threading.Lock()
        self._keyed: _bloom.Hasher | None = None
        self._stats_saved_at = time.monotonic()
        open_database(self, create_if_missing)
        self._update_wal_limit()
        self._closed = False
        _OPEN_DBS.add(self)
        self._default = self._handles[DEFAULT_TABLE]
        self._default_state = self._tables[DEFAULT_TABLE]
        # The hot path: an instance attribute, so db.get(k) is one closure call.
        setattr(self, "get", state_getter(self, self._default_state))
        if not self._read_only:
            self._bg = Background("lsmdb-background", self._background)
            self._bg.start()

    def _close_readers(self) -> None:
        """Close every reader and drop the tables' references to them, so each
        is freed (its descriptor number released) once no read holds it; and
        empty the tables' fast cells, which sends the C getters to the Python
        ones (and so to DatabaseClosedError)."""
        for state in self._tables.values():
            for reader in state.files:
                reader.close()
            state.files = ()
            state.publish()
            state.fast_cell[0] = None

    def _rotate_wal(self, flushing: TableState | None = None) -> None:
        """Close the live WAL segment and start a new one, through a manifest switch
        naming both; the caller holds the lock.  The closed segment is fsynced
        unless only ``flushing``'s memtables (about to be flushed) may hold records
        in it and the unsynced ones: then, flushed, it is deleted unsynced.  See
        :meth:`lsmdb.logset.LogSet.rotate`."""
        sync = True
        if flushing is not None:
            others = [(m.min_seq, m.max_seq) for s in self._tables.values() if s is not flushing
                      for m in (s.mem,) + s.imms if m.min_seq is not None]
            sync = self._log.may_hold(others)
        self._log.rotate(self._alloc_file_number(), self._write_manifest, sync)

    def _update_wal_limit(self) -> None:
        self._wal_limit = self._max_wal if self._max_wal is not None else \
            WAL_SIZE_MEMTABLE_MULTIPLE * sum(s.options.memtable_size_bytes
                                             for s in self._tables.values())

    def _disown(self) -> None:
        """In a fork() child: this handle is the parent's.  Every later call raises
        DatabaseForkedError; nothing is written, and the parent's lock stays its own."""
        self._forked = True
        self._closed = True
        self._bg = None
        self._lock = threading.RLock()        # another thread may have held them at the fork
        self._flush_mutex = threading.Lock()
        self._stats_lock = threading.Lock()
        if self._dblock is not None:
            self._dblock.disown()
            self._dblock = None
        self._log.close()
        self._close_readers()

    def _adopt(self, reader: SSTableReader, level: int) -> SSTableReader:
        """Make a freshly opened reader part of this database (level, hash, cache)."""
        reader.level = level
        reader.attach_hasher(self._keyed)
        reader.attach_cache(self._block_cache)
        if self._mmap_reads:
            reader.map_file()
        return reader

    def _hasher_for(self, state: TableState) -> _bloom.Hasher:
        """The hash new filters of ``state`` are built with (creates the secret if needed)."""
        if state.options.bloom_filter_hash != "keyed":
            return _bloom.FAST_HASHER
        if self._keyed is None:
            with self._lock:
                if self._keyed is None:
                    self._keyed = create_secret(self.path)
        return self._keyed

    def _alloc_file_number(self) -> int:
        number = self._next_file
        self._next_file += 1
        return number

    # --------------------------------------------------------------- helpers
    def _check_open(self) -> None:
        if self._closed:
            if self._forked:
                raise DatabaseForkedError(
                    f"database {self.path} was opened by the parent of this forked process; "
                    "open it again in this process")
            raise DatabaseClosedError(f"database {self.path} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self._read_only:
            raise ReadOnlyError(f"database {self.path} was opened read-only")

    def _table_state(self, name: str | None) -> TableState:
        if name is None and not self._closed:
            return self._default_state
        self._check_open()
        if name is None:
            return self._default_state
        state = self._tables.get(name)
        if state is None:
            if not isinstance(name, str):
                raise TypeError(f"table name must be a str, got {type(name).__name__}")
            raise NoSuchTableError(f"no table named {name!r}")
        return state

    def _low_seq(self) -> int | None:
        """The smallest sequence number any memtable holds (None: all are empty)."""
        low = None
        for s in self._tables.values():
            for mem in (s.mem,) + s.imms:
                if mem.min_seq is not None and (low is None or mem.min_seq < low):
                    low = mem.min_seq
        return low

    def _manifest(self, low_seq: int | None) -> Manifest:
        tables = {}
        for name, s in self._tables.items():
            files = [FileMeta(r.number, r.level, r.size_bytes, r.entries, r.min_key, r.max_key,
                              r.min_seq, r.max_seq) for r in s.files]
            tables[name] = TableMeta(s.id, s.explicit, s.flushed_seq, files)
        return Manifest(self._next_file, self._next_table_id, self._last_seq, tables,
                        self._log.state(low_seq))

    def _write_manifest(self) -> None:
        """Switch the manifest to the current state (the caller holds the lock);
        once that is durable, delete the WAL segments no memtable needs.  On
        SwitchedButNotSynced they stay: a crash could bring the old manifest back."""
        low = self._low_seq()
        try:
            self._manifest(low).write(os.path.join(self.path, MANIFEST_NAME))
        except SwitchedButNotSynced:
            self._manifest_unsynced = True
            raise
        self._manifest_unsynced = False
        self._log.retire(low)

    def _promote_segments(self) -> None:
        """``sync()`` or a sync=True write fsynced unsynced segments: a manifest switch
        names them synced.  The writes are durable either way: a failure is logged,
        and the next switch tries again."""
        try:
            self._write_manifest()
        except OSError as exc:
            log.warning("could not record the WAL segments a sync=True write fsynced: %s", exc)

    def _sync_manifest(self) -> None:
        """Make the visible manifest durable if its switch's directory fsync failed
        (the lock held): a table created or a file installed then is no more
        durable than that manifest."""
        if self._manifest_unsynced:
            fsync_dir(self.path)
            self._manifest_unsynced = False

    # ---------------------------------------------------------------- writes
    def _write(self, ops: list[tuple[TableState, bytes, bytes | None]], sync: bool | None) -> None:
        """Apply (table, key, value|None) ops atomically: one WAL record."""
        states = set(map(_first, ops))
        if len(states) == 1:
            (state,) = states
            self._write_columns(state, list(map(_second, ops)), list(map(_third, ops)), sync)
            return
        _check_batch_size(map(_second, ops), map(_third, ops))

        def encode(seq: int) -> bytes:
            return encode_record(seq, [(s.id, k, v) for s, k, v in ops])

        def apply(seq: int) -> list[TableState]:
            # Per table, the batch becomes visible to point reads at once.
            per_table: dict[TableState, dict[bytes, bytes | None]] = {}
            for state, key, value in ops:
                items = per_table.get(state)
                if items is None:
                    items = per_table[state] = {}
                items[key] = value  # later ops of the batch win
            for state, items in per_table.items():
                state.mem.apply_many(seq, items)
            return list(per_table)

        self._commit(states, encode, apply, sync)

    def _write_columns(self, state: TableState, keys: list[bytes], values: list[bytes | None],
                       sync: bool | None) -> None:
        """Set keys[i] to values[i] (None: delete) in one table, atomically:
        one WAL record; a later op on the same key wins.  (The per-op work --
        sizes, the WAL ops, the batch dict -- runs in C: map/zip/sum.)"""
        _check_batch_size(keys, values)
        n = len(keys)

        def encode(seq: int) -> bytes:
            return encode_table_record(seq, state.id, keys, values)

        def apply(seq: int) -> list[TableState]:
            if n == 1:
                state.mem.apply(seq, keys[0], values[0])
            else:
                state.mem.apply_many(seq, dict(zip(keys, values, strict=True)))
            return [state]

        self._commit({state}, encode, apply, sync)

    def _commit(self, states: set[TableState], encode: Callable[[int], bytes],
                apply: Callable[[int], list[TableState]], sync: bool | None) -> None:
        """Log a batch (``encode(seq)``) and apply it (``apply(seq)``) under the
        lock; then flush whatever memtable it filled, outside the lock.

        An OSError from the WAL means the write is not applied (its record
        may be in the failed segment; nothing is ever appended after it, and
        the next write first makes the log whole again).
        """
        do_sync = self._sync if sync is None else bool(sync)
        if self._bg is not None and self._auto_compaction:
            self._maybe_stall(states, self._bg)
        for state in states:
            if len(state.imms) >= MAX_FROZEN_MEMTABLES:
                self._flush_table(state, freeze=False)  # raises while flushes fail
        log_ = self._log
        while True:
            with self._lock:
                self._check_writable()
                for state in states:
                    if state.dropped:
                        raise NoSuchTableError(f"table {state.name!r} was dropped")
                if log_.failed is None:
                    if do_sync and self._manifest_unsynced:
                        self._sync_manifest()
                    seq = self._last_seq = self._last_seq + 1
                    log_.append(seq, encode(seq), do_sync)
                    if log_.promoted:
                        self._promote_segments()
                    touched = apply(seq)
                    full = [s for s in touched
                            if s.mem.size_bytes >= s.options.memtable_size_bytes]
                    wal_over = log_.total_bytes > self._wal_limit
                    break
            self._recover_log()  # outside the lock: it writes SSTables
        for state in full:  # outside the lock: the SSTable is written without it
            try:
                self._flush_table(state)
            except OSError as exc:
                # The write itself is applied (and in the WAL); the flush is
                # retried by the next write (or an explicit flush()).
                log.error("automatic flush of table %r failed: %s", state.name, exc)
        if wal_over:
            self._flush_wal_pinners()

    def _flush_wal_pinners(self) -> None:
        """The WAL is past ``max_total_wal_size_bytes``: flush every table whose
        memtables hold a record of the oldest segment, so that segment can go."""
        with self._lock:
            oldest = self._log.oldest_max_seq()
            if oldest is None or self._log.total_bytes <= self._wal_limit:
                return
            pinning = [s for s in self._tables.values()
                       if any(m.min_seq is not None and m.min_seq <= oldest
                              for m in (s.mem,) + s.imms)]
        for state in pinning:
            try:
                self._flush_table(state)
            except OSError as exc:
                log.error("flush of table %r for max_total_wal_size_bytes failed: %s",
                          state.name, exc)

    def _maybe_stall(self, states: set[TableState], bg: Background) -> None:
        """Hold a writer while level 0 is past its bound and compaction can reduce it."""
        for state in states:
            announced = False
            while (len(state.view[2]) >= _compaction.L0_STALL_FILES and not self._closed
                   and _compaction.pick(state) is not None):
                if bg.error is not None:
                    raise LsmdbError(f"writes to table {state.name!r} are stalled and background "
                                     f"compaction is failing: {bg.error}")
                if not announced:
                    log.warning("write stall: table %r has %d files in level 0; waiting for "
                                "compaction", state.name, len(state.view[2]))
                    announced = True
                bg.wait_round(0.05)

    def put(self, key: Any, value: Any, sync: bool | None = None) -> None:
        """Set ``key`` to ``value`` in the default table (fsync first if ``sync``)."""
        self._default.put(key, value, sync)

    def delete(self, key: Any, sync: bool | None = None) -> None:
        """Delete ``key`` from the default table (a tombstone; no error if absent)."""
        self._default.delete(key, sync)

    def batch(self, sync: bool | None = None) -> WriteBatch:
        """A :class:`WriteBatch`: ``with db.batch() as b: b.put(k, v, table=...)``."""
        self._check_writable()
        return WriteBatch(self, sync)

    def sync(self) -> None:
        """Make every write so far durable: it survives a machine crash.

        Usually one fsync of the live WAL segment (closed segments were
        fsynced when they closed); after a WAL failure, a flush of every
        memtable.
        """
        while True:
            self._check_writable()
            if self._log.failed is not None:
                self._recover_log()
            with self._lock:
                self._check_writable()
                if self._log.failed is None:
                    self._sync_manifest()
                    self._log.sync()
                    if self._log.promoted:  # name the segments it fsynced synced
                        self._promote_segments()
                    return

    # ---------------------------------------------------------------- flush
    def flush(self, table: str | None = None) -> None:
        """Write the memtable of ``table`` (None: every table) to an SSTable now.

        Like :meth:`sync`, it makes every write so far durable -- those to
        other tables too, and also when the memtable was empty.
        """
        with self._lock:
            self._check_writable()
            states = list(self._tables.values()) if table is None else [self._table_state(table)]
        for state in states:
            self._flush_table(state)
        self.sync()

    def _flush_table(self, state: TableState, opening: bool = False, freeze: bool = True) -> None:
        """Freeze the table's memtable (unless ``freeze`` is False) and write every
        frozen memtable to an SSTable.

        The database lock is held only to freeze (a WAL rotation, a new
        memtable) and to install each file (manifest switch); the SSTable is
        written and fsynced without it, so writers and readers go on.
        Flushes are serialised by their own lock and install oldest first.
        A memtable whose flush fails stays frozen -- still served and still
        in the WAL -- and the next flush tries it again.
        """
        with self._flush_mutex:
            with self._lock:
                if (self._closed and not opening) or state.dropped:
                    return
                failed = self._log.failed is not None
                if not failed and freeze and len(state.mem):
                    # The memtable's records then all sit in closed segments.
                    self._rotate_wal(flushing=state)
                    self._freeze(state)
                pending = list(reversed(state.imms))  # oldest first
            if failed:
                self._recover_log_held()  # flushes every table
                return
            for mem in pending:
                self._flush_frozen(state, mem, opening)

    def _freeze(self, state: TableState) -> None:
        """Make the table's memtable a frozen one and give it a new, empty one (lock held)."""
        mem = state.mem
        mem.freeze()
        mem.flush_seq = self._last_seq
        state.mem = Memtable()
        state.imms = (mem,) + state.imms
        state.publish()

    def _recover_log(self) -> None:
        """Make every record of a failed WAL segment durable another way, then start a
        new segment: see :meth:`_recover_log_held`."""
        with self._flush_mutex:
            self._recover_log_held()

    def _recover_log_held(self, closing: bool = False) -> None:
        """The WAL's live segment failed (a write or fsync of it raised): flush every
        memtable, so that no record depends on that segment, then rotate to a new
        one -- the failed segment is deleted with that manifest switch.  The caller
        holds the flush mutex.  Raises, with the log still failed, if any step fails.
        A closed database raises DatabaseClosedError (``closing``: ``close()`` itself).
        """
        with self._lock:
            if self._closed and not closing:
                self._check_open()
            cause = self._log.failed
            if cause is None:
                return
            for state in self._tables.values():
                if len(state.mem):
                    self._freeze(state)
            pending = [(s, m) for s in self._tables.values() for m in reversed(s.imms)]
        written: list[tuple[TableState, Memtable, SSTableReader]] = []
        try:
            for state, mem in pending:
                written.append((state, mem, self._write_frozen(state, mem)))
        except BaseException:
            for _state, _mem, reader in written:
                reader.close()
                unlink_quietly(reader.path)
            raise
        with self._lock:
            # One switch installs every file and starts the new segment: the
            # failed segment may end in a whole record of a write that raised,
            # and a replay must never apply it to some tables and not others.
            for _state, _mem, reader in [w for w in written if w[0].dropped]:
                reader.close()
                unlink_quietly(reader.path)
            self._install_flushed([w for w in written if not w[0].dropped], self._rotate_wal)
        self._save_counters()
        self._wake_background()
        log.warning("WAL segment failed (%s); every memtable was flushed and a new segment "
                    "started", cause)

    def _flush_frozen(self, state: TableState, mem: Memtable, opening: bool = False) -> None:
        reader = self._write_frozen(state, mem)
        with self._lock:
            if state.dropped or (self._closed and not opening):
                reader.close()
                unlink_quietly(reader.path)
                return
            self._install_flushed([(state, mem, reader)], self._write_manifest)
        self._save_counters()
        self._wake_background()

    def _write_frozen(self, state: TableState, mem: Memtable) -> SSTableReader:
        """Write a frozen memtable to a new SSTable (fsynced) and open it; not installed."""
        with self._lock:
            number = self._alloc_file_number()
            hasher = self._hasher_for(state)
            options = state.options
        file_path = os.path.join(self.path, sst_name(number))
        try:
            write_sstable(file_path, (), chunks=mem.chunk_range(None, None),
                          fp_chance=options.bloom_filter_fp_chance,
                          block_size=options.block_size_bytes, table=state.name,
                          min_seq=mem.min_seq, max_seq=mem.max_seq, hasher=hasher)
            return self._adopt(SSTableReader(file_path, number), 0)
        except BaseException:
            unlink_quietly(file_path)  # the memtable stays frozen, served and in the WAL
            raise

    def _install_flushed(self, flushed: list[tuple[TableState, Memtable, SSTableReader]],
                         switch: Callable[[], None]) -> None:
        """Make each new SSTable part of its table in place of its frozen memtable, in
        one manifest switch (``switch()``); the caller holds the lock.  If the switch
        fails, nothing changed and the new files are removed."""
        old = {state: (state.files, state.flushed_seq, state.imms) for state, _m, _r in flushed}
        for state, mem, reader in flushed:
            state.files = (reader,) + state.files
            state.flushed_seq = max(state.flushed_seq, mem.flush_seq)
            state.imms = tuple(m for m in state.imms if m is not mem)
        try:
            switch()  # also retires the WAL segments no memtable needs
        except SwitchedButNotSynced:
            for state in old:
                state.publish()  # the new manifest names the files: keep them
            raise
        except BaseException:
            for state, (files, flushed_seq, imms) in old.items():
                state.files, state.flushed_seq, state.imms = files, flushed_seq, imms
            for _state, _mem, reader in flushed:
                reader.close()
                unlink_quietly(reader.path)
            raise
        for state in old:
            state.publish()

    # ----------------------------------------------------------------- reads
    def get(self, key: Any, default: Any = None) -> Any:
        """The value of ``key`` in the default table, or ``default``.

        (Replaced per instance by the table's compiled getter, which does the
        same: see :func:`make_getter`.)
        """
        return state_getter(self, self._default_state)(key, default)

    def _get(self, state: TableState, key: Any, default: Any = None) -> Any:
        """Newest value of ``key`` in ``state`` or ``default`` (see :func:`make_getter`)."""
        return state_getter(self, state)(key, default)

    def get_many(self, keys: Iterable[Any]) -> list[bytes | None]:
        """Values of many keys of the default table at once (None where absent).

        Hashes each key once, visits each file once and reads each distinct
        data block once per call: cheaper per key than a loop of ``get``.
        """
        return get_many(self, self._default_state, keys)

    def __getitem__(self, key: Any) -> bytes:
        return self._default[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._default.put(key, value)

    def __delitem__(self, key: Any) -> None:
        del self._default[key]

    def __contains__(self, key: Any) -> bool:
        return self.get(key) is not None  # the compiled getter, as db.get

    def scan(self, start: Any = None, end: Any = None, prefix: Any = None,
             reverse: bool = False) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs of the default table with start <= key < end, in key order.

        ``prefix`` narrows the range to keys starting with it; ``reverse``
        walks it backwards.  The iterator reads a consistent snapshot taken
        when it is created, one data block per SSTable in memory at a time.
        """
        return self._scan(self._default_state, start, end, prefix, reverse)

    def _scan(self, state: TableState, start: Any, end: Any, prefix: Any,
              reverse: bool) -> Iterator[tuple[bytes, bytes]]:
        self._check_open()
        lo = None if start is None else as_key(start)
        hi = None if end is None else as_key(end)
        if prefix is not None:
            p = as_key(prefix)
            if lo is None or lo < p:
                lo = p
            pe = prefix_end(p)
            if pe is not None and (hi is None or hi > pe):
                hi = pe
        if lo is not None and hi is not None and lo >= hi:
            return iter(())
        with self._lock:  # a consistent snapshot of the active memtable (age 0)
            mem, imms, l0, deeper = state.view
            snapshot = mem.chunk_range(lo, hi, reverse)
        sources: list[Any] = [snapshot] if snapshot else []
        for imm in imms:  # frozen: they never change
            if len(imm):
                sources.append(imm.chunk_range(lo, hi, reverse))
        files = list(l0)
        for _keys, readers in deeper:
            files.extend(readers)
        for r in files:  # newest first, as the merge wants them
            if (hi is None or r.min_key < hi) and (lo is None or r.max_key >= lo):
                sources.append(r.chunks(lo, hi, reverse))
        if not sources:
            return iter(())
        return merge_newest(sources, reverse)  # type: ignore[return-value]

    # ---------------------------------------------------------------- tables
    def table(self, name: str) -> Table:
        """The :class:`Table` called ``name`` (NoSuchTableError if missing)."""
        self._check_open()
        handle = self._handles.get(name)
        if handle is None:
            validate_table_name(name)
            raise NoSuchTableError(f"no table named {name!r}")
        return handle

    def tables(self) -> list[str]:
        """Names of every table, sorted; always includes ``"default"``."""
        self._check_open()
        return sorted(self._tables)

    def create_table(self, name: str, exist_ok: bool = False, **table_options: Any) -> Table:
        """Create a table with its own options.

        If it exists: TableExistsError, or with ``exist_ok`` the existing table,
        its options unchanged (change them with :meth:`alter_table`).
        """
        validate_table_name(name)
        explicit = validate_table_options(table_options)
        with self._lock:
            self._check_writable()
            if name in self._tables:
                if exist_ok:
                    return self._handles[name]
                raise TableExistsError(f"table {name!r} already exists")
            state = TableState(name, self._next_table_id, explicit)
            self._next_table_id += 1
            self._tables[name] = state
            try:
                self._write_manifest()
            except SwitchedButNotSynced:
                self._register(state)
                raise
            except BaseException:
                del self._tables[name]
                self._next_table_id -= 1
                raise
            finally:
                self._update_wal_limit()
            return self._register(state)

    def _register(self, state: TableState) -> Table:
        self._by_id[state.id] = state
        handle = self._handles[state.name] = Table(self, state)
        return handle

    def alter_table(self, name: str, **table_options: Any) -> None:
        """Change options of ``name``; they apply to SSTables written from now on."""
        validate_table_name(name)
        changes = validate_table_options(table_options)
        with self._lock:
            self._check_writable()
            state = self._table_state(name)
            old = state.explicit
            state.set_options({**state.explicit, **changes})  # validates first
            try:
                self._write_manifest()
            except SwitchedButNotSynced:
                raise  # the new options are on disk: keep them
            except BaseException:
                state.set_options(old)
                raise
            finally:
                self._update_wal_limit()

    def drop_table(self, name: str) -> None:
        """Remove ``name`` and its files.  The default table cannot be dropped."""
        validate_table_name(name)
        if name == DEFAULT_TABLE:
            raise ValueError("the default table cannot be dropped")
        with self._lock:
            self._check_writable()
            state = self._table_state(name)
            del self._tables[name]
            synced = True
            try:
                self._write_manifest()
            except SwitchedButNotSynced:
                synced = False  # dropped on disk; keep its files for the old manifest
            except BaseException:
                self._tables[name] = state
                raise
            finally:
                self._update_wal_limit()
            state.dropped = True
            del self._handles[name]
            self._by_id.pop(state.id, None)
            for reader in state.files:
                reader.drop_cached()  # no read of this database reaches them again
            for reader in state.files if synced else ():
                # Not closed here: a concurrent get may still hold it; the
                # descriptor is released when the last reference goes.
                unlink_quietly(reader.path)
            state.mem = Memtable()
            state.imms = ()
            state.files = ()
            state.publish()
            if not synced:
                raise SwitchedButNotSynced(errno.EIO, f"table {name!r} dropped, but the manifest "
                                                      "switch may not be durable")

    def sstables(self, table: str | None = None) -> list[SSTableInfo]:
        """One :class:`SSTableInfo` per SSTable of ``table`` (None: every table).

        Files come in the order a read consults them: level 0 newest first,
        then each deeper level by key range.
        """
        self._check_open()
        out = []
        for state in self._states(table):
            fp = state.options.bloom_filter_fp_chance
            for reader in state.readers_in_order():
                info = SSTableInfo.from_reader(state.name, reader, fp)
                stale = self._compactor.filter_stale(state, reader)
                if info.filter_stale != stale:
                    info = dataclasses.replace(info, filter_stale=stale)
                out.append(info)
        return out

    def trace(self, key: Any, table: str | None = None) -> dict[str, Any]:
        """How ``get(key)`` would be answered, file by file (no counter changes).

        See :func:`lsmdb.trace.trace_read` for the fields.
        """
        state = self._table_state(table)
        return trace_read(state, as_key(key))

    def _states(self, table: str | None) -> list[TableState]:
        if table is not None:
            return [self._table_state(table)]
        return [self._tables[n] for n in sorted(self._tables)]

    def table_stats(self, name: str | None = None) -> dict[str, Any]:
        """Totals of one table's filters and reads (``name`` None: the default table).

        ``absent_share`` is the share of point reads that found nothing: a
        filter pays only when it is a real share of the reads.
        """
        state = self._table_state(name)
        infos = self.sstables(state.name)
        fp = sum(i.false_positives for i in infos)
        tn = sum(i.filter_negatives for i in infos)
        tp = sum(i.true_positives for i in infos)
        return {
            "files": len(infos),
            "entries": sum(i.entries for i in infos),
            "size_bytes": sum(i.size_bytes for i in infos),
            "filter_bytes_on_disk": sum(i.filter_bytes for i in infos),
            "filter_bytes_in_memory": sum(r.bloom_memory_bytes() for r in state.files),
            "range_skips": sum(i.range_skips for i in infos),
            "reads_skipped": tn,
            "filter_negatives": tn,
            "true_positives": tp,
            "false_positives": fp,
            "false_negatives": sum(i.false_negatives for i in infos),
            "block_reads": sum(i.block_reads for i in infos),
            "measured_fpr": fp / (fp + tn) if fp + tn else None,
            "false_ratio": fp / (tp + fp + tn) if tp + fp + tn else None,
            "gets": state.gets,
            "gets_absent": state.gets_absent,
            "absent_share": state.gets_absent / state.gets if state.gets else None,
        }

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
            self._check_open()
            bg = self._bg
            if bg is None or not self._auto_compaction:
                return
            error = bg.take_error()
            if error is not None:
                raise error
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
        self._check_writable()
        return sum(self._compactor.rebuild_filters(state, only_stale)
                   for state in self._states(table))

    def _locked_alloc(self) -> int:
        with self._lock:
            return self._alloc_file_number()

    def _sst_path(self, number: int) -> str:
        return os.path.join(self.path, sst_name(number))

    # ------------------------------------------------------------ background
    def _wake_background(self) -> None:
        if self._bg is not None:
            self._bg.wake()

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
            readers = [r for s in list(self._tables.values()) for r in s.files]
            try:
                _stats.save_stats(self.path, readers, list(self._tables.values()))
            except OSError as exc:
                log.warning("could not save filter counters: %s", exc)
            self._stats_saved_at = time.monotonic()

    # ----------------------------------------------------------------- close
    def close(self) -> None:
        """Stop background work, save counters, make every write durable, release the lock.

        The live WAL segment is fsynced and sealed (the manifest records its
        size), so the next open reads every segment to a known size.  After a
        WAL failure that cannot be repaired (every memtable flushed), the
        error is raised once the database is closed: the writes since the
        last successful fsync may not be durable.  Idempotent.
        """
        if self._bg is not None:
            self._bg.stop()
        error: OSError | None = None
        with self._flush_mutex, self._lock:  # no flush is half done past this point
            if self._closed:
                return
            try:
                self._save_counters()
                if not self._read_only:
                    if self._log.failed is not None:
                        try:
                            self._recover_log_held(closing=True)
                        except OSError as exc:
                            error = exc
                    if self._log.failed is None:
                        self._log.seal(self._write_manifest)
                    else:
                        self._log.sync_failed_quietly()
                        error = error or self._log.failed
            finally:
                self._closed = True
                self._release()
        if error is not None:
            raise error

    def _release(self) -> None:
        self._log.close()
        self._close_readers()
        if self._dblock is not None:
            self._dblock.release()
            self._dblock = None

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._closed

    def __enter__(self) -> DB:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<lsmdb.DB {self.path!r}{' closed' if self._closed else ''}>"


def open(path: str | os.PathLike[str], create_if_missing: bool = True, sync: bool = False,
         read_only: bool = False, auto_compaction: bool = True,
         block_cache_size_bytes: int = DEFAULT_BLOCK_CACHE_SIZE_BYTES,
         mmap_reads: bool = True, max_total_wal_size_bytes: int | None = None) -> DB:
    """Open (or create) the database in directory ``path``.

    ``sync=True`` fsyncs the WAL before every write returns (per call:
    ``put(..., sync=...)``).  ``read_only=True`` takes no lock, so it can read
    a database another process has open; it sees the data as of opening.
    ``auto_compaction`` runs compactions on a background thread after
    flushes.  ``block_cache_size_bytes`` bounds the shared cache of data
    blocks, their payloads as on disk (0 disables it; cache hits are counted
    apart from disk reads).  ``mmap_reads`` maps each SSTable read-only so
    that a get copies the data block it reads out of the mapping instead of
    asking the kernel for it (a system call); a file cut short under the
    mapping still raises CorruptionError.  Without the C speedups, or with
    ``mmap_reads=False``, every block is read with ``pread`` (the kernel's
    count of read calls then equals the files' ``block_reads``).
    ``max_total_wal_size_bytes`` bounds the WAL segments kept on disk (and
    replayed at the next open): past it, the tables whose memtables hold
    records of the oldest segment are flushed.  None: four times the sum of
    every table's ``memtable_size_bytes``.
    """
    return DB(path, create_if_missing=create_if_missing, sync=sync, read_only=read_only,
              auto_compaction=auto_compaction, block_cache_size_bytes=block_cache_size_bytes,
              mmap_reads=mmap_reads, max_total_wal_size_bytes=max_total_wal_size_bytes)


__all__ = ["DB", "open", "LsmdbError"]
