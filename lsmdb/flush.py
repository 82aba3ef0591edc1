"""Flushing memtables to SSTables, making a failed WAL whole again, and ``db.sync()``.

A flush **rotates** the WAL (so every record of the memtable sits in closed
segments), **freezes** the table's memtable (it keeps serving reads; a new
one takes the writes), writes it to a new SSTable and fsyncs it without the
database's lock, then **installs** the file through a manifest switch, which
also drops the WAL segments no memtable needs any more.  Flushes are
serialised by one mutex and install oldest first; a memtable whose flush
fails stays frozen -- still served, still in the WAL -- and the next flush
tries it again.

After a failed WAL append or fsync (:mod:`lsmdb.logset`), :meth:`Flusher.recover_log`
writes every memtable to an SSTable and installs all of them with the new
segment in one switch, so no record depends on the failed segment, and a
replay never applies a batch to some tables and not others.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from .files import SwitchedButNotSynced, unlink_quietly
from .filters import WRITTEN_FAMILIES
from .memtable import Memtable
from .sstable_reader import SSTableReader
from .sstable_writer import write_memtable
from .table import TableState
from .versions import Versions

log = logging.getLogger("lsmdb")

Flushed = tuple[TableState, Memtable, SSTableReader]


class Flusher:
    """Flushes of one database's memtables (see the module docstring).

    A closed database (``versions.closed``) flushes nothing, and a WAL
    recovery there raises DatabaseClosedError.  ``installed()`` runs after
    each installed flush (counters, compaction).
    """

    def __init__(self, versions: Versions, installed: Callable[[], None]) -> None:
        self.versions = versions
        #: One flush at a time (and the WAL recovery, and close): installed in order.
        self.mutex = threading.Lock()
        self._installed = installed
        #: Notified (``progressed``) as each flush of a frozen memtable
        #: installs or fails, and as a table is dropped or the database
        #: closed, for writers in ``wait_frozen``: ``failures`` counts the
        #: failed flushes, ``failing`` holds the tables whose last flush failed.
        self.progress = threading.Condition(threading.Lock())
        self.failures = 0
        self.failing: set[TableState] = set()

    def flush_table(self, state: TableState, opening: bool = False, freeze: bool = True) -> None:
        """Freeze the table's memtable (unless ``freeze`` is False) and write every
        frozen memtable to an SSTable; ``opening``: the database is being opened."""
        versions = self.versions
        with self.mutex:
            with versions.lock:
                if (self.versions.closed and not opening) or state.dropped:
                    return
                failed = versions.log.failed is not None
                if not failed and freeze and len(state.mem):
                    versions.rotate_wal(flushing=state)
                    self.freeze(state)
                pending = list(reversed(state.imms))  # oldest first
            if failed:
                self.recover_log_held()  # flushes every table
                return
            for mem in pending:
                self._flush_frozen(state, mem, opening)

    def freeze_table(self, state: TableState) -> bool:
        """The first half of ``flush_table``, for a flush that runs later (the
        flush thread's, lsmdb.db): the WAL rotated and the table's memtable
        frozen, under the database's lock alone -- not the mutex, so a writer
        does not wait for a flush in progress.  Whether frozen memtables wait
        for a flush.  Nothing is frozen while the log is failed (the next
        write mends it) or the database is closed."""
        versions = self.versions
        with versions.lock:
            if versions.closed or state.dropped or versions.log.failed is not None:
                return False
            if len(state.mem):
                versions.rotate_wal(flushing=state)
                self.freeze(state)
            return bool(state.imms)

    def flush_frozen(self) -> None:
        """Write every table's frozen memtables, oldest first (the flush thread's
        round); raises the first error, the others tried first."""
        error: BaseException | None = None
        for state in list(self.versions.tables.values()):
            if state.imms and not state.dropped:
                try:
                    self.flush_table(state, freeze=False)
                except OSError as exc:
                    error = error or exc
        if error is not None:
            raise error

    def freeze(self, state: TableState) -> None:
        """Make the table's memtable a frozen one and give it a new, empty one (lock held)."""
        mem = state.mem
        mem.freeze()
        mem.flush_seq = self.versions.last_seq
        state.mem = Memtable()
        state.imms = (mem,) + state.imms
        state.publish()

    def sync(self) -> None:
        """Make every write so far durable (``db.sync()``): one fsync of each
        unsynced WAL segment and the live one, after a WAL failure the
        recovery first (every memtable flushed)."""
        versions = self.versions
        wal = versions.log
        while True:
            versions.check_writable()
            if wal.failed is not None:
                self.recover_log()
            with versions.lock:
                versions.check_writable()
                if wal.failed is None:
                    versions.sync_manifest()
                    wal.sync()
                    if wal.promoted:  # name the segments it fsynced synced
                        versions.promote_segments()
                    return

    def recover_log(self) -> None:
        """Make every record of a failed WAL segment durable another way, then start a
        new segment: see :meth:`recover_log_held`."""
        with self.mutex:
            self.recover_log_held()

    def recover_log_held(self, closing: bool = False) -> None:
        """The WAL's live segment failed (a write or fsync of it raised): flush every
        memtable, so that no record depends on that segment, then rotate to a new
        one -- the failed segment is deleted with that manifest switch.  The caller
        holds the mutex.  Raises, with the log still failed, if any step fails.
        A closed database raises DatabaseClosedError (``closing``: ``close()`` itself).
        """
        versions = self.versions
        with versions.lock:
            if self.versions.closed and not closing:
                versions.check_open()
            cause = versions.log.failed
            if cause is None:
                return
            for state in versions.tables.values():
                if len(state.mem):
                    self.freeze(state)
            pending = [(s, m) for s in versions.tables.values() for m in reversed(s.imms)]
        written: list[Flushed] = []
        try:
            for state, mem in pending:
                written.append((state, mem, self.write_frozen(state, mem)))
        except BaseException:
            for _state, _mem, reader in written:
                reader.close()
                unlink_quietly(reader.path)
            self.progressed([s for s, _m in pending], failed=True)
            raise
        try:
            with versions.lock:
                # One switch installs every file and starts the new segment: the
                # failed segment may end in a whole record of a write that raised,
                # and a replay must never apply it to some tables and not others.
                for _state, _mem, reader in [w for w in written if w[0].dropped]:
                    reader.close()
                    unlink_quietly(reader.path)
                self.install([w for w in written if not w[0].dropped], versions.rotate_wal)
        except BaseException:
            self.progressed([s for s, _m in pending], failed=True)
            raise
        self.progressed([s for s, _m in pending])
        self._installed()
        log.warning("WAL segment failed (%s); every memtable was flushed and a new segment "
                    "started", cause)

    def _flush_frozen(self, state: TableState, mem: Memtable, opening: bool) -> None:
        try:
            reader = self.write_frozen(state, mem)
            with self.versions.lock:
                installed = not (state.dropped or (self.versions.closed and not opening))
                if installed:
                    self.install([(state, mem, reader)], self.versions.write_manifest)
                else:
                    reader.close()
                    unlink_quietly(reader.path)
        except BaseException:
            self.progressed([state], failed=True)
            raise
        self.progressed([state], failed=False)
        if installed:
            self._installed()

    def progressed(self, states: Sequence[TableState] = (), failed: bool = False) -> None:
        """Wake the writers in ``wait_frozen``: after a flush of ``states``
        (``failed``: it raised), a table dropped or the database closed."""
        with self.progress:
            if failed:
                self.failures += 1
                self.failing.update(states)
            else:
                self.failing.difference_update(states)
            self.progress.notify_all()

    def wait_frozen(self, state: TableState, limit: int, timeout: float) -> bool:
        """Wait until ``state`` has fewer than ``limit`` frozen memtables, or is
        dropped (True) -- or until a flush fails, the database closes or
        ``timeout`` seconds pass, or at once while the table's last flush
        failed (False): a writer's wait for the flush thread."""
        deadline = time.monotonic() + timeout
        with self.progress:
            failures = self.failures
            while len(state.imms) >= limit and not state.dropped:
                left = deadline - time.monotonic()
                if left <= 0 or state in self.failing or self.failures != failures \
                        or self.versions.closed:
                    return False
                self.progress.wait(left)
        return True

    def write_frozen(self, state: TableState, mem: Memtable) -> SSTableReader:
        """Write a frozen memtable to a new SSTable (fsynced) and open it; not installed."""
        versions = self.versions
        with versions.lock:
            number = versions.alloc_file_number()
            hasher = versions.hasher_for(state)
            options = state.options
        file_path = versions.sst_path(number)
        try:
            write_memtable(file_path, mem.data, mem.tags,
                           fp_chance=options.bloom_filter_fp_chance,
                           block_size=options.block_size_bytes, table=state.name,
                           min_seq=mem.min_seq, max_seq=mem.max_seq, hasher=hasher,
                           compression=options.compression, file_number=number,
                           db_id=versions.db_id,
                           family=WRITTEN_FAMILIES[options.filter_family])
            return versions.adopt(SSTableReader(file_path, number), 0)
        except BaseException:
            unlink_quietly(file_path)  # the memtable stays frozen, served and in the WAL
            raise

    @staticmethod
    def install(flushed: list[Flushed], switch: Callable[[], None]) -> None:
        """Make each new SSTable part of its table in place of its frozen memtable, in
        one manifest switch (``switch()``); the lock held.  If the switch fails,
        nothing changed and the new files are removed."""
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
