"""Running compactions and filter rebuilds for one database, and installing their outputs.

:mod:`lsmdb.compaction` decides *what* to merge and writes the new files;
the :class:`Compactor` runs jobs -- in the background up to two at once on
disjoint files (the second a small one), a full compaction or a filter
rebuild alone on its table -- hands the outputs to the database and switches
the manifest from inputs to outputs; the merge itself runs in a worker
process (:mod:`lsmdb.worker`) unless ``compaction_process=False``.  Inputs
are retired only after the switch is durable, and leave the disk once no
version names them (:mod:`lsmdb.version`: a scan still reading
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

#: Background compactions running at once per database (on disjoint files).
MAX_CONCURRENT_COMPACTIONS = 2
#: A compaction starts beside a running one only if its inputs are at most
#: this large: flushes piling up are merged while a large merge runs, but two
#: large merges do not share the machine with the writers.
BESIDE_MAX_INPUT_BYTES = 256 << 20


class Compactor:
    """Compactions, filter rebuilds and their installation for one :class:`DB`."""

    def __init__(self, versions: Versions, installed: Callable[[], None]) -> None:
        self._db = versions
        self._installed = installed  # after each installed job (counters)
        #: Held to pick a job, and by the work that needs a table's files to
        #: itself (a full compaction, a filter rebuild) for all of it.
        self.lock = threading.Lock()
        self._done = threading.Condition(self.lock)   # notified as a job finishes
        #: ids of the files the running background jobs merge.
        self._busy: set[int] = set()
        #: Fired by :meth:`cancel`: stops the running background jobs.
        self._cancel = _compaction.Cancel()

    # -- what is due ------------------------------------------------------
    def pending(self) -> bool:
        busy = frozenset(self._busy)
        return bool(busy) or any(_compaction.pick(s, busy) is not None
                                 for s in list(self._db.tables.values()))

    def _wait_idle(self, state: TableState) -> None:
        """With ``self.lock`` held: until no background job merges ``state``'s files."""
        while any(id(r) in self._busy for r in state.files):
            self._done.wait()

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
            self._wait_idle(state)
            if state.dropped:
                return
            job = _compaction.full_compaction(state)
            if job is not None:
                self.run(job)

    def run_pending(self, should_stop: Callable[[], bool]) -> None:
        """Every compaction the tables need, until none is due (background
        thread): up to MAX_CONCURRENT_COMPACTIONS at once, each on a thread of
        its own, on files no other is merging, the second a small one -- so
        flushes piling up are merged while a large merge runs.  Returns once none runs and none
        is due (or ``should_stop``); raises the first error a job met."""
        running: list[threading.Thread] = []
        errors: list[BaseException] = []
        try:
            while not should_stop() and not errors and not self._cancel.fired:
                running = [t for t in running if t.is_alive()]
                job = self._pick_free() if len(running) < MAX_CONCURRENT_COMPACTIONS else None
                if job is None:
                    if not running:
                        return
                    with self._done:  # a job finishing may free files or make work
                        self._done.wait(0.05)
                    continue
                thread = threading.Thread(target=self._run_job, args=(job, errors),
                                          name="lsmdb-compaction", daemon=True)
                thread.start()
                running.append(thread)
        finally:
            for thread in running:
                thread.join()
            if errors:
                raise errors[0]

    def _pick_free(self) -> _compaction.CompactionJob | None:
        """The next job on files no running job merges, marked busy; or None.
        Beside a running job, only a small one (BESIDE_MAX_INPUT_BYTES)."""
        with self.lock:
            busy = frozenset(self._busy)
            for state in list(self._db.tables.values()):
                if state.dropped:
                    continue
                job = _compaction.pick(state, busy)
                if job is not None and busy and \
                        sum(r.size_bytes for r in job.inputs) > BESIDE_MAX_INPUT_BYTES:
                    continue
                if job is not None:
                    self._busy.update(id(r) for r in job.inputs)
                    return job
        return None

    def cancel(self) -> None:
        """Stop the running background compactions (the database is closing):
        each deletes what it wrote and leaves its inputs as they are; none
        starts from here on.  Compactions a caller runs (``compact``,
        ``rebuild_filters``) are not stopped."""
        self._cancel.fire()

    def _run_job(self, job: _compaction.CompactionJob, errors: list[BaseException]) -> None:
        try:
            if not job.state.dropped:
                self.run(job, self._cancel)
        except _compaction.CompactionCancelled:
            log.info("compaction of %r stopped: the database is closing", job.state.name)
        except BaseException as exc:  # noqa: BLE001 -- handed to the background thread
            errors.append(exc)
        finally:
            with self._done:
                self._busy.difference_update(id(r) for r in job.inputs)
                self._done.notify_all()

    def rebuild_filters(self, state: TableState, only_stale: bool) -> int:
        """Rewrite the filters of ``state``'s files (see ``DB.rebuild_filters``)."""
        db = self._db
        count = 0
        with self.lock:
            self._wait_idle(state)
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

    def run(self, job: _compaction.CompactionJob,
            cancel: _compaction.Cancel | None = None) -> None:
        """Run one compaction (the caller holds ``self.lock``, or has marked the
        job's inputs busy); CompactionCancelled, nothing installed or left
        behind, once ``cancel`` fires."""
        db = self._db
        started = time.monotonic()
        with db.lock:
            snapshots = sorted({snap.seq for snap in list(db.snapshots) if not snap.closed})
        hasher = db.hasher_for(job.state)
        done = None
        if db.compaction_process and _worker.available():
            done = _worker.merge(_compaction.merge_spec(job, db.path, hasher, db.db_id, snapshots),
                                 db.alloc_file_number, db.sst_path, cancel)
        if done is None:
            outputs = _compaction.run(job, db.alloc_file_number, db.sst_path, hasher, db.db_id,
                                      snapshots, cancel)
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
