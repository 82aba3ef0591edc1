"""Opening a database directory: lock, manifest, SSTables, WAL replay, leftover sweep.

``open_database(versions, flusher, create_if_missing)`` brings a fresh
:class:`~lsmdb.versions.Versions` to the state its directory's files
describe -- :func:`read_state` reads it, changing nothing, and
``Versions.install`` takes it -- and returns what it recovered
(:class:`Recovered`: the lock it took, the WAL records replayed, the torn
tails dropped, the files removed or set aside):

1. refuse a directory that is not a database before creating anything in it;
2. take the ``LOCK`` (not for ``read_only``);
3. create the first ``MANIFEST`` if the directory is empty;
4. read the manifest and open every SSTable it names;
5. replay the WAL segments it names into the memtables: closed ones to
   their recorded size (a segment missing or short is corruption), the live
   one to its last whole record (a torn tail is dropped).  A read-only open
   that races the writer -- a file it was about to read retired meanwhile --
   reads the new manifest and tries again;
6. load the filter counters;
7. only then -- after a valid manifest was read -- remove files a crash left
   behind, fsync the replayed segments, start a new live segment (a
   manifest switch) and flush memtables that are already full.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import manifest as _manifest
from . import stats as _stats
from .changes import ChangeBoard
from .errors import CorruptionError, NotADatabaseError
from .files import (
    LOCK_NAME,
    MANIFEST_NAME,
    SST_RE,
    TMP_SUFFIX,
    WAL_RE,
    exists,
    set_aside,
    sst_name,
    unlink_quietly,
    wal_name,
)
from .lockfile import DatabaseLock
from .logset import LogSet, ReplayedLog
from .manifest import FileMeta, Manifest, TableMeta
from .manifest import read_bytes as read_manifest_bytes
from .options import DEFAULT_TABLE
from .secret import load_secret
from .sstable_reader import SSTableReader
from .table import TableState
from .wal import read_segment_file

if TYPE_CHECKING:
    from .flush import Flusher
    from .versions import Versions

log = logging.getLogger("lsmdb")


@dataclass
class Recovered:
    """What :func:`open_database` found and did."""

    lock: DatabaseLock | None          # None for a read-only open
    segments: int = 0                  # WAL segments replayed
    records: int = 0                   # WAL records applied to memtables
    torn: list[tuple[str, int]] = field(default_factory=list)  # (path, offset) dropped
    removed: list[str] = field(default_factory=list)    # leftover files deleted
    set_aside: list[str] = field(default_factory=list)  # segments moved into lost/
    flushed: list[str] = field(default_factory=list)    # tables flushed while opening


class _Vanished(Exception):
    """A file the manifest named was deleted by a concurrent writer (read-only open)."""


def open_database(db: Versions, flusher: Flusher, create_if_missing: bool) -> Recovered:
    """Open the database in ``db.path`` into ``db`` (see the module docstring).
    On failure everything is let go."""
    path = db.path
    if not os.path.isdir(path):
        if os.path.lexists(path):
            raise NotADatabaseError(f"{path} exists and is not a directory")
        if not create_if_missing or db.read_only:
            raise NotADatabaseError(f"no database at {path} (create_if_missing=False)")
        os.makedirs(path, exist_ok=True)
    manifest_path = os.path.join(path, MANIFEST_NAME)
    if not exists(manifest_path):
        # Refuse before creating anything (not even LOCK) in a foreign directory.
        check_creatable(db, create_if_missing)
    lock = None if db.read_only else DatabaseLock(path)
    try:
        if not exists(manifest_path):
            create(db, manifest_path, create_if_missing)
        db.keyed = load_secret(db.path)
        manifest, replayed = load_with_retry(db, manifest_path)
        load_counters(db)
        recovered = Recovered(lock, segments=len(replayed.segments), records=replayed.records,
                              torn=list(replayed.torn))
        if not db.read_only:
            # Followers in other processes watch this (lsmdb.changes): the
            # rotation below bumps its epoch.
            db.changes = ChangeBoard(db.path)
            db.changes.note_seq(db.last_seq)
            db.log.changes = db.changes.map
            for seg_path, offset in replayed.torn:
                log.warning("%s: ignoring a torn tail from offset %d: a write cut short by a "
                            "crash (writes not yet fsynced can be lost this way)",
                            seg_path, offset)
            recovered.removed = sweep(db, manifest, replayed)
            db.log.adopt(replayed.segments)
            with db.lock:
                db.rotate_wal()
            recovered.set_aside = [wal_name(n) for n in replayed.ignored]
            set_aside(db.path, recovered.set_aside,
                      "written after a torn WAL segment: not replayed")
            for state in list(db.tables.values()):
                if state.mem.size_bytes >= state.options.memtable_size_bytes:
                    flusher.flush_table(state, opening=True)
                    recovered.flushed.append(state.name)
    except BaseException:
        db.log.close()
        db.close_readers()
        if db.changes is not None:
            db.changes.close()
            db.changes = None
        if lock is not None:
            lock.release()
        raise
    return recovered


def check_creatable(db: Versions, create_if_missing: bool) -> None:
    # LOCK and MANIFEST.tmp are what a crash inside the very first open leaves.
    entries = [n for n in os.listdir(db.path)
               if n not in (LOCK_NAME, MANIFEST_NAME + TMP_SUFFIX)]
    if entries:
        raise NotADatabaseError(
            f"{db.path} is not an lsmdb database (no {MANIFEST_NAME}, directory not empty)")
    if not create_if_missing or db.read_only:
        raise NotADatabaseError(f"no database at {db.path} (create_if_missing=False)")


def create(db: Versions, manifest_path: str, create_if_missing: bool) -> None:
    check_creatable(db, create_if_missing)
    manifest = Manifest(next_file_number=1, next_table_id=2,
                        tables={DEFAULT_TABLE: TableMeta(id=1, options={})},
                        db_id=_manifest.new_db_id())
    manifest.write(manifest_path)


def wal_numbers_on_disk(path: str) -> list[int]:
    return sorted(int(m.group(1)) for n in os.listdir(path) if (m := WAL_RE.match(n)))


@dataclass
class DirectoryState:
    """What a directory's MANIFEST and WAL describe, read by :func:`read_state`
    and made a database's by ``Versions.install``: the tables (SSTables opened,
    memtables filled by the WAL replay), the numbers handed out, the WAL's
    segments."""

    tables: dict[str, TableState]
    next_file: int
    next_table_id: int
    last_seq: int
    log: LogSet
    #: Readers taken over from the database's current state (a follower's
    #: catch-up): never closed here.
    reused: set[int] = field(default_factory=set)

    def close(self) -> None:
        """Let go of an attempt that did not become a database's: its readers (but
        those it reused), their versions and its log."""
        self.log.close()
        for state in self.tables.values():
            for reader in state.files:
                if id(reader) not in self.reused:
                    reader.close()
            state.files = ()
            state.publish()


def identity_mismatch(reader: SSTableReader, fm: FileMeta, db_id: str) -> str:
    """How an opened SSTable differs from the manifest's record of it ("" when
    it does not): its size, its entry count and key range, and for a format-2
    file the number and the database id it records -- a misdirected write or a
    bad restore (another SSTable of this or another database in its place)
    passes every checksum but not these."""
    if reader.size_bytes != fm.size:
        return f"it is {reader.size_bytes} bytes, the manifest says {fm.size}"
    if reader.version >= 2:
        if reader.file_number != fm.number:
            return f"it records file number {reader.file_number}, not {fm.number}"
        if db_id and reader.db_id != db_id:
            return f"it belongs to database {reader.db_id}, not {db_id}"
    if (reader.entries, reader.min_key, reader.max_key) != (fm.entries, fm.min_key, fm.max_key):
        return "its entry count or key range differs from the manifest's"
    return ""


def load_with_retry(db: Versions, manifest_path: str) -> tuple[Manifest, ReplayedLog]:
    """Read the manifest, open its files and replay the WAL (:func:`read_state`),
    then install what was read into ``db``.

    A read-only open races with the writer, whose flushes and compactions
    may delete a file or WAL segment between our reading the manifest and
    opening it: then everything is read again from the new manifest.  A file
    still missing under the same manifest is missing for good: corruption.
    """
    data, manifest, state, replayed = read_state_with_retry(db, manifest_path)
    db.install(state.tables, state.next_file, state.next_table_id, state.last_seq, state.log)
    # A database made before databases had ids gets one: recorded by the next
    # manifest switch, before any file that carries it is named there.
    db.db_id = manifest.db_id or _manifest.new_db_id()
    db.manifest_bytes = data
    db.live_tail = live_tail(manifest, replayed)
    db.replayed_wal = [(seg.number, seg.size, seg.format) for seg in replayed.segments]
    return manifest, replayed


def read_state_with_retry(db: Versions, manifest_path: str,
                          reuse: dict[int, SSTableReader] | None = None, replay: bool = True
                          ) -> tuple[bytes, Manifest, DirectoryState, ReplayedLog]:
    """The manifest's bytes, the manifest, and :func:`read_state` of it, read
    again from a new manifest while a read-only handle races the writer (see
    :func:`load_with_retry`)."""
    previous = None
    while True:
        data = read_manifest_bytes(manifest_path)
        manifest = Manifest.decode(data, manifest_path)
        # The writer moved on if the manifest changed since the last attempt.
        racing = db.read_only and data != previous
        previous = data
        try:
            state, replayed = read_state(db, manifest, vanished_ok=racing, reuse=reuse,
                                         replay=replay)
        except _Vanished:
            time.sleep(0.005)
            continue
        return data, manifest, state, replayed


def live_tail(manifest: Manifest, replayed: ReplayedLog) -> tuple[int, int] | None:
    """(number, where its last whole record ends) of the live segment as replayed,
    or None (no live segment, or the replay stopped before it)."""
    live = manifest.wal.live if manifest.wal is not None else None
    if live is None or not replayed.segments or replayed.segments[-1].number != live:
        return None
    return live, replayed.segments[-1].size


def load_counters(db: Versions) -> None:
    files, tables = _stats.load_stats(db.path)
    for state in db.tables.values():
        for name, value in zip(_stats.TABLE_COUNTERS, tables.get(state.id, ())):  # noqa: B905
            setattr(state, name, value)  # older files: fewer counters
        for reader in state.files:
            if reader.number in files:
                _stats.apply_file_counters(reader, files[reader.number])


def read_state(db: Versions, manifest: Manifest, vanished_ok: bool = False,
               reuse: dict[int, SSTableReader] | None = None, replay: bool = True
               ) -> tuple[DirectoryState, ReplayedLog]:
    """The state ``manifest`` and the WAL segments it names describe: every
    table with its SSTables opened (adopted by ``db``: hash, cache, mapping)
    and its memtable filled by the replay.  Changes nothing in ``db``; on any
    error what it opened is let go.  _Vanished (``vanished_ok``, a read-only
    open) when a file it names is gone: a writer moved on.  ``reuse``: open
    readers by file number, taken instead of opening a file again where the
    manifest names the same file at the same level (a follower's catch-up);
    ``replay=False``: the memtables are left empty (the caller reads the WAL)."""
    state = DirectoryState({}, manifest.next_file_number, manifest.next_table_id,
                           manifest.last_seq, LogSet(db.path))
    try:
        _open_tables(db, manifest, state, vanished_ok, reuse or {})
        replayed = (_replay_wal(db, manifest, state, vanished_ok) if replay
                    else ReplayedLog([], 0, []))
    except BaseException:
        state.close()
        raise
    return state, replayed


def _open_tables(db: Versions, manifest: Manifest, state: DirectoryState,
                 vanished_ok: bool, reuse: dict[int, SSTableReader]) -> None:
    if DEFAULT_TABLE not in manifest.tables:
        raise CorruptionError("manifest has no default table",
                              os.path.join(db.path, MANIFEST_NAME))
    for name, meta in manifest.tables.items():
        try:
            table = db.new_table(name, meta.id, meta.options)
        except (TypeError, ValueError) as exc:
            raise CorruptionError(f"manifest options of table {name!r} invalid: {exc}",
                                  os.path.join(db.path, MANIFEST_NAME)) from None
        table.flushed_seq = meta.flushed_seq
        state.tables[name] = table
        readers = []
        try:
            for fm in meta.files:
                file_path = os.path.join(db.path, sst_name(fm.number))
                known = reuse.get(fm.number)
                if known is not None and known.level == fm.level and known.size_bytes == fm.size:
                    state.reused.add(id(known))
                    readers.append(known)
                    state.next_file = max(state.next_file, fm.number + 1)
                    continue
                try:
                    reader = SSTableReader(file_path, fm.number)
                except FileNotFoundError:
                    if db.read_only and vanished_ok:
                        raise _Vanished(file_path) from None
                    raise CorruptionError("SSTable listed in the manifest is missing",
                                          file_path) from None
                except OSError as exc:
                    if exc.errno != errno.ELOOP:
                        raise
                    raise CorruptionError("SSTable listed in the manifest is a symbolic "
                                          "link (never followed)", file_path) from None
                why = identity_mismatch(reader, fm, manifest.db_id)
                if why:
                    reader.close()
                    raise CorruptionError(f"SSTable is not the file the manifest names: {why}",
                                          file_path)
                readers.append(db.adopt(reader, fm.level))
                state.next_file = max(state.next_file, fm.number + 1)
        finally:
            table.files = tuple(readers)
        table.publish()


def _replay_wal(db: Versions, manifest: Manifest, state: DirectoryState,
                vanished_ok: bool) -> ReplayedLog:
    """Replay the manifest's WAL segments into the state's memtables."""
    by_id = {t.id: t for t in state.tables.values()}
    top_tid = 0
    records = 0

    def apply(seq: int, ops: list[tuple[int, bytes, bytes | None]]) -> None:
        nonlocal top_tid, records
        records += 1
        for tid, key, value in ops:
            table = by_id.get(tid)  # records of dropped tables are ignored
            if table is not None and seq > table.flushed_seq:
                table.mem.apply(seq, key, value)
            elif tid > top_tid:
                top_tid = tid

    on_disk = wal_numbers_on_disk(db.path)
    try:
        replayed = state.log.replay(manifest.wal, on_disk, apply)
    except FileNotFoundError as exc:
        if db.read_only and vanished_ok:
            raise _Vanished(exc.filename) from None
        raise CorruptionError("WAL segment named by the manifest is missing",
                              exc.filename) from None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise CorruptionError("WAL segment named by the manifest is a symbolic link "
                              "(never followed)", exc.filename) from None
    state.last_seq = max(state.last_seq, replayed.top_seq)
    # A table id the WAL names but the manifest does not (a table whose creation
    # never became durable) is never handed out again: its records stay its own.
    state.next_table_id = max(state.next_table_id, top_tid + 1)
    state.next_file = max([state.next_file, *(n + 1 for n in on_disk)])
    for table in state.tables.values():
        table.publish()
    replayed.records = records
    return replayed


def sweep(db: Versions, manifest: Manifest, replayed: ReplayedLog) -> list[str]:
    """Remove files a crash left behind (returned): only ever after a valid manifest
    was read.

    That is every SSTable the manifest does not name, every ``.tmp`` file,
    and every WAL segment it does not name: one numbered below the
    manifest's ``next_file_number`` existed when the manifest was written
    and was retired (every record in it is in an SSTable); one numbered from
    there on was created for a rotation whose manifest switch never became
    durable, and holds no record -- one that does is corruption, and is left
    for ``lsmdb repair``.
    """
    live = {fm.number for t in manifest.tables.values() for fm in t.files}
    listed = {seg.number for seg in replayed.segments} | set(replayed.ignored)
    removed = []
    for name in sorted(os.listdir(db.path)):
        path = os.path.join(db.path, name)
        m = SST_RE.match(name)
        w = WAL_RE.match(name)
        mode = os.lstat(path).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            continue  # a directory, a FIFO: not a file lsmdb made, left alone
        if m and int(m.group(1)) not in live:
            db.next_file = max(db.next_file, int(m.group(1)) + 1)
        elif w and int(w.group(1)) not in listed:
            number = int(w.group(1))
            if number >= manifest.next_file_number and manifest.wal is not None \
                    and not os.path.islink(path):
                result = read_segment_file(path, number)
                if result.records:
                    raise CorruptionError("WAL segment the manifest does not name holds records",
                                          path, result.records[0][0])
        elif not name.endswith(TMP_SUFFIX):
            continue
        log.info("removing leftover file %s", name)
        unlink_quietly(path)
        removed.append(name)
    return removed
