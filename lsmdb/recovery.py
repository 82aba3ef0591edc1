"""Opening a database directory: lock, manifest, SSTables, WAL replay, leftover sweep.

``open_database(db, create_if_missing)`` brings a fresh :class:`~lsmdb.db.DB`
to the state its files describe:

1. refuse a directory that is not a database before creating anything in it;
2. take the ``LOCK`` (not for ``read_only``);
3. create the first ``MANIFEST`` if the directory is empty;
4. read the manifest and open every SSTable it names (a read-only open that
   races the writer's compactions reads the new manifest and tries again);
5. replay the WAL segments into the memtables (a torn last record is cut off);
6. load the filter counters;
7. only then -- after a valid manifest was read -- remove files a crash left
   behind, start a new WAL segment and flush memtables that are already full.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import time
from typing import TYPE_CHECKING

from . import stats as _stats
from .errors import CorruptionError, DatabaseLockedError, NotADatabaseError
from .logset import LogSet
from .manifest import MANIFEST_NAME, Manifest, TableMeta
from .options import DEFAULT_TABLE
from .secret import load_secret
from .sstable import SSTableReader
from .table import Table, TableState

if TYPE_CHECKING:
    from .db import DB

log = logging.getLogger("lsmdb")

LOCK_NAME = "LOCK"
SST_RE = re.compile(r"(\d{6,})\.sst\Z")


def sst_name(number: int) -> str:
    return f"{number:06d}.sst"


class _Vanished(Exception):
    """A file the manifest named was deleted by a concurrent writer (read-only open)."""


def open_database(db: DB, create_if_missing: bool) -> None:
    path = db.path
    if not os.path.isdir(path):
        if os.path.exists(path):
            raise NotADatabaseError(f"{path} exists and is not a directory")
        if not create_if_missing or db._read_only:
            raise NotADatabaseError(f"no database at {path} (create_if_missing=False)")
        os.makedirs(path, exist_ok=True)
    manifest_path = os.path.join(path, MANIFEST_NAME)
    if not os.path.exists(manifest_path):
        # Refuse before creating anything (not even LOCK) in a foreign directory.
        check_creatable(db, create_if_missing)
    if not db._read_only:
        acquire_lock(db)
    try:
        if not os.path.exists(manifest_path):
            create(db, manifest_path, create_if_missing)
        db._keyed = load_secret(db.path)
        manifest = load_with_retry(db, manifest_path)
        load_counters(db)
        if not db._read_only:
            sweep(db, manifest)
            db._new_segment()
            # Segments whose every record is in an SSTable (or that hold none,
            # like the one an open without writes leaves) go now, so opening
            # again and again does not pile them up.
            db._retire_segments()
            for state in list(db._tables.values()):
                if state.mem.size_bytes >= state.options.memtable_size_bytes:
                    db._flush_table(state, opening=True)
    except BaseException:
        db._release()
        raise

def acquire_lock(db: DB) -> None:
    fd = os.open(os.path.join(db.path, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise DatabaseLockedError(
                f"{db.path} is open in another lsmdb.open() (this or another process)"
            ) from None
        raise
    db._lock_fd = fd

def check_creatable(db: DB, create_if_missing: bool) -> None:
    # LOCK and MANIFEST.tmp are what a crash inside the very first open leaves.
    entries = [n for n in os.listdir(db.path)
               if n not in (LOCK_NAME, MANIFEST_NAME + ".tmp")]
    if entries:
        raise NotADatabaseError(
            f"{db.path} is not an lsmdb database (no {MANIFEST_NAME}, directory not empty)")
    if not create_if_missing or db._read_only:
        raise NotADatabaseError(f"no database at {db.path} (create_if_missing=False)")

def create(db: DB, manifest_path: str, create_if_missing: bool) -> None:
    check_creatable(db, create_if_missing)
    manifest = Manifest(next_file_number=1, next_table_id=2,
                        tables={DEFAULT_TABLE: TableMeta(id=1, options={})})
    manifest.write(manifest_path)

def load_with_retry(db: DB, manifest_path: str) -> Manifest:
    """Read the manifest, open its files and replay the WAL.

    A read-only open races with the writer, whose flushes and compactions
    may delete a file or WAL segment between our reading the manifest and
    opening it: then everything is read again from the new manifest.
    """
    attempts = 20 if db._read_only else 1
    for attempt in range(attempts):
        manifest = Manifest.read(manifest_path)
        try:
            load(db, manifest, vanished_ok=attempt < attempts - 1)
            recover_wal(db)
            return manifest
        except (_Vanished, FileNotFoundError):
            if attempt == attempts - 1:
                raise
            db._close_readers()
            db._tables.clear()
            db._handles.clear()
            db._log = LogSet(db.path)
            time.sleep(0.01)
    raise AssertionError("unreachable")  # pragma: no cover

def load_counters(db: DB) -> None:
    files, tables = _stats.load_stats(db.path)
    for state in db._tables.values():
        if state.id in tables and len(tables[state.id]) == 2:
            state.gets, state.gets_absent = tables[state.id]
        for reader in state.files:
            if reader.number in files:
                _stats.apply_file_counters(reader, files[reader.number])

def load(db: DB, manifest: Manifest, vanished_ok: bool = False) -> None:
    db._last_seq = manifest.last_seq
    db._next_file = manifest.next_file_number
    db._next_table_id = manifest.next_table_id
    if DEFAULT_TABLE not in manifest.tables:
        raise CorruptionError("manifest has no default table",
                              os.path.join(db.path, MANIFEST_NAME))
    for name, meta in manifest.tables.items():
        try:
            state = TableState(name, meta.id, meta.options)
        except (TypeError, ValueError) as exc:
            raise CorruptionError(f"manifest options of table {name!r} invalid: {exc}",
                                  os.path.join(db.path, MANIFEST_NAME)) from None
        state.flushed_seq = meta.flushed_seq
        readers = []
        for fm in meta.files:
            file_path = os.path.join(db.path, sst_name(fm.number))
            try:
                reader = SSTableReader(file_path, fm.number)
            except FileNotFoundError:
                if db._read_only and vanished_ok:
                    raise _Vanished(file_path) from None
                raise CorruptionError("SSTable listed in the manifest is missing",
                                      file_path) from None
            db._adopt(reader, fm.level)
            readers.append(reader)
            db._next_file = max(db._next_file, fm.number + 1)
        state.files = tuple(readers)
        state.publish()
        db._tables[name] = state
        db._handles[name] = Table(db, state)
    db._by_id = {s.id: s for s in db._tables.values()}

def recover_wal(db: DB) -> None:
    by_id = db._by_id

    def apply(seq: int, ops: list[tuple[int, bytes, bytes | None]]) -> None:
        for tid, key, value in ops:
            state = by_id.get(tid)  # records of dropped tables are ignored
            if state is not None and seq > state.flushed_seq:
                state.mem.apply(seq, key, value)

    top_seq, top_number = db._log.replay(apply, repair=not db._read_only)
    db._last_seq = max(db._last_seq, top_seq)
    db._next_file = max(db._next_file, top_number + 1)
    for state in db._tables.values():
        state.publish()

def sweep(db: DB, manifest: Manifest) -> None:
    """Remove files a crash left behind: only ever after a valid manifest was read."""
    live = {fm.number for t in manifest.tables.values() for fm in t.files}
    for name in os.listdir(db.path):
        m = SST_RE.match(name)
        if (m and int(m.group(1)) not in live) or name.endswith(".tmp"):
            log.info("removing leftover file %s", name)
            os.unlink(os.path.join(db.path, name))
            if m:
                db._next_file = max(db._next_file, int(m.group(1)) + 1)

