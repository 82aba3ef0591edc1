"""Running compactions and filter rebuilds for one database, and installing their outputs.

:mod:`lsmdb.compaction` decides *what* to merge and writes the new files;
the :class:`Compactor` serialises jobs (one at a time per database), hands
the outputs to the database and switches the manifest from inputs to
outputs.  Inputs are retired only after the switch is durable, and leave the
disk once no version names them (:mod:`lsmdb.version`: a scan still reading
them keeps them); point reads that still hold an input keep reading it
through its open descriptor.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import compaction as _compaction
from . import worker as _worker
from .files import SwitchedButNotSynced, fsync_file, unlink_quietly
from .filters import FilterSpec, is_stale
from .history import HistoryFile
from .sstable_reader import SSTableReader
from .sstable_writer import rewrite_filter
from .table import TableState

if TYPE_CHECKING:
    from .version import Version
    from .versions import Versions

log = logging.getLogger("lsmdb")


class Compactor:
    """Compactions, filter rebuilds and their installation for one :class:`DB`."""

    def __init__(self, versions: Versions, installed: Callable[[], None]) -> None:
        self._db = versions
        self._installed = installed  # after each installed job (counters)
        self.lock = threading.Lock()   # one compaction (or rebuild) at a time

    # -- what is due ------------------------------------------------------
    def pending(self) -> bool:
        return any(_compaction.pick(s) is not None for s in list(self._db.tables.values()))

    def filter_spec(self, state: TableState, reader: SSTableReader) -> FilterSpec:
        """The filter a file written now in ``reader``'s place gets."""
        return _compaction.target_spec(state, _compaction.reader_is_bottom(state, reader),
                                       self._db.hasher_for(state, create=False))

    def filter_stale(self, state: TableState, reader: SSTableReader) -> bool:
        """Was ``reader``'s filter built otherwise than a file written now would be
        (lsmdb.filters.is_stale)?"""
        return is_stale(reader.filter, reader.fp_chance, self.filter_spec(state, reader))

    # -- running ----------------------------------------------------------
    def compact_all(self, state: TableState) -> None:
        """Full compaction of one table (synchronous)."""
        with self.lock:
            if state.dropped:
                return
            job = _compaction.full_compaction(state)
            if job is not None:
                self.run(job)

    def run_pending(self, should_stop: Callable[[], bool]) -> None:
        """Every compaction the tables need, until none is due (background thread)."""
        while not should_stop():
            did = False
            for state in list(self._db.tables.values()):
                if should_stop():
                    return
                with self.lock:
                    if state.dropped:
                        continue
                    job = _compaction.pick(state)
                    if job is None:
                        continue
                    self.run(job)
                    did = True
            if not did:
                return

    def rebuild_filters(self, state: TableState, only_stale: bool) -> int:
        """Rewrite the filters of ``state``'s files (see ``DB.rebuild_filters``)."""
        db = self._db
        count = 0
        with self.lock:
            for reader in list(state.files):
                if state.dropped:
                    break
                if only_stale and not self.filter_stale(state, reader):
                    continue
                spec = self.filter_spec(state, reader)
                hasher = db.hasher_for(state)
                number = db.alloc_file_number()
                path = db.sst_path(number)
                new = db.adopt(rewrite_filter(reader, path, number, spec.fp_chance, hasher,
                                              spec.family), reader.level)
                self.install(_compaction.CompactionJob(state, [reader], reader.level, False, None,
                                                       "rebuild filter"), [new])
                count += 1
        return count

    def run(self, job: _compaction.CompactionJob) -> None:
        """Run one compaction (the caller holds ``self.lock``)."""
        db = self._db
        started = time.monotonic()
        with db.lock:
            snapshots = sorted({snap.seq for snap in list(db.snapshots) if not snap.closed})
        hasher = db.hasher_for(job.state)
        done = None
        if db.compaction_process and _worker.available():
            done = _worker.merge(_compaction.merge_spec(job, db.path, hasher, db.db_id, snapshots),
                                 db.alloc_file_number, db.sst_path)
        if done is None:
            outputs = _compaction.run(job, db.alloc_file_number, db.sst_path, hasher, db.db_id,
                                      snapshots)
        else:
            outputs, job.history = self._open_written(*done)
        try:
            for reader in outputs:
                db.adopt(reader, job.output_level)
            for reader in job.history:  # level 0 of the snapshots' views (lsmdb.history)
                db.adopt(reader, 0)
        except BaseException:
            for reader in outputs + job.history:
                reader.close()
                unlink_quietly(reader.path)
            raise
        self.install(job, outputs, snapshots)
        log.info("compacted %d files of %r into %d (L%d) in %.2fs: %s", len(job.inputs),
                 job.state.name, len(outputs), job.output_level, time.monotonic() - started,
                 job.reason)

    @staticmethod
    def _open_written(outputs: list[tuple[str, int, int]], history: list[tuple[str, int, int]]
                      ) -> tuple[list[SSTableReader], list[SSTableReader]]:
        """Readers of the files a worker process wrote, each fsynced here first
        (durable before any manifest names it, whoever wrote it); on an error,
        every file is closed and deleted."""
        opened: list[SSTableReader] = []
        try:
            for path, _number, _level in outputs + history:
                fsync_file(path)
            for path, number, level in outputs + history:
                opened.append(_compaction.open_output(path, number, level))
        except BaseException:
            for reader in opened:
                reader.close()
            for path, _number, _level in outputs + history:
                unlink_quietly(path)
            raise
        return opened[:len(outputs)], opened[len(outputs):]

    def install(self, job: _compaction.CompactionJob, outputs: list[SSTableReader],
                snapshots: list[int] | None = None) -> None:
        """Switch the manifest from the job's inputs to its outputs, then delete
        the inputs.  ``snapshots`` (a compaction's: the live snapshots' numbers
        when it began): every live snapshot then reads the new files, and those
        among them hold the job's history files (lsmdb.history)."""
        db = self._db
        state = job.state
        history = [HistoryFile(r) for r in job.history]
        let_go: list[Version] = []
        try:
            with db.lock:
                inputs = {id(r) for r in job.inputs}
                if state.dropped or db.closed or not all(
                        any(id(r) == i for r in state.files) for i in inputs):
                    for r in outputs + job.history:
                        r.close()
                        unlink_quietly(r.path)
                    return
                old = state.files
                state.files = tuple(r for r in state.files if id(r) not in inputs) + tuple(outputs)
                try:
                    db.write_manifest()
                except SwitchedButNotSynced:
                    # The new manifest names the outputs: serve them, but keep the
                    # inputs on disk (the old manifest may come back after a crash;
                    # the next open sweeps them).
                    state.publish()
                    raise
                except BaseException:
                    state.files = old
                    for r in outputs:
                        r.close()
                        unlink_quietly(r.path)
                    raise
                state.publish()
                if job.pointer is not None:
                    state.compact_pointer[job.pointer[0]] = job.pointer[1]
                if snapshots is not None:
                    wanted = set(snapshots)
                    for snap in list(db.snapshots):
                        let_go += snap.follow(state, history if snap.seq in wanted else [])
        finally:
            for h in history:  # held by no snapshot (or the install failed)
                if not h.holders:
                    h.delete()
        for version in let_go:
            version.release()
        db.retire(job.inputs)
        self._installed()
