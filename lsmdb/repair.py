"""Rebuilding a database from what still reads (``lsmdb repair``).

For a database whose open raises CorruptionError (LevelDB's ``RepairDB`` is
the model).  Nothing is deleted that did not read whole: what the rebuilt
database leaves out is moved into ``lost/`` inside the database directory.

1. Take the lock.  Read the MANIFEST if it reads: the tables, their ids and
   options, each SSTable's level.  If it does not, set it aside and rebuild
   the table list from the SSTables' properties (every table gets default
   options; WAL records of a table id no SSTable names go to a table called
   ``recovered_<id>``).
2. Every SSTable is read block by block.  A sound one is kept.  One with
   damaged data blocks is copied without them into a new SSTable and set
   aside; one whose footer, index or properties do not read is set aside.
   With a readable manifest, an SSTable it does not name (a crash's
   leftover, which an open would delete) is set aside too; without one,
   every SSTable that reads is taken, newest data first -- a file a
   compaction had replaced, if its deletion never reached the disk, may then
   bring back keys that compaction had found deleted.
3. Every WAL segment the manifest names (and any created after it; without a
   manifest, every one on disk), oldest first: each record that still reads
   (past damage, from the next 32 KiB block that starts a record; a segment
   written before format 2 only up to its first defect) is replayed, if it
   is newer than its table's SSTables, into memtables that are written out as
   new SSTables.  A segment the manifest no longer names was retired: its
   records are in SSTables, or were never acknowledged.  A segment read
   whole is deleted once the new manifest is durable; one with damage is
   set aside.
4. The new MANIFEST -- every table with its files, no WAL segment -- is
   switched in atomically.

:func:`repair_database` returns a :class:`RepairReport`; ``dry_run`` reports
what would be done and changes nothing.
"""

from __future__ import annotations

import errno
import os
import stat
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from . import manifest as _manifest
from .errors import CorruptionError, LsmdbError, NotADatabaseError
from .files import (
    LOST_NAME,
    MANIFEST_NAME,
    SST_RE,
    WAL_RE,
    FileWriter,
    free_name,
    fsync_dir,
    read_file,
    sst_name,
    unlink_quietly,
    wal_name,
)
from .filters import WRITTEN_FAMILIES
from .lockfile import DatabaseLock
from .logset import WalState, decode_record
from .manifest import FileMeta, Manifest, TableMeta
from .memtable import Memtable
from .options import DEFAULT_TABLE, TableOptions
from .secret import load_secret
from .sstable_reader import SSTableReader
from .sstable_writer import write_sstable
from .wal import LEGACY_FORMAT, read_legacy_log, salvage_segment, segment_format


@dataclass
class RepairReport:
    """What ``lsmdb repair`` found, kept, rebuilt and set aside."""

    path: str
    manifest_read: bool = True
    manifest_problem: str | None = None
    tables: dict[str, int] = field(default_factory=dict)        # name -> files after repair
    kept: list[str] = field(default_factory=list)               # SSTables kept as they are
    salvaged: list[str] = field(default_factory=list)           # "old -> new (n of m entries)"
    wal: list[str] = field(default_factory=list)                # per segment, what it gave
    written: list[str] = field(default_factory=list)            # SSTables made from the WAL
    set_aside: list[tuple[str, str]] = field(default_factory=list)  # (name, why)
    missing: list[tuple[str, str]] = field(default_factory=list)    # named but not there
    records_replayed: int = 0
    dry_run: bool = False

    def lines(self) -> list[str]:
        out = [f"{'would repair' if self.dry_run else 'repaired'} {self.path}"]
        out.append("  manifest: read" if self.manifest_read else
                   f"  manifest: unreadable ({self.manifest_problem}); rebuilt from the "
                   "SSTables and WAL segments (tables get default options)")
        out.append("  tables: " + ", ".join(f"{n} ({c} SSTables)" for n, c in
                                             sorted(self.tables.items())))
        out.append(f"  SSTables kept as they are: {len(self.kept)}")
        out += [f"  salvaged: {s}" for s in self.salvaged]
        out += [f"  WAL {w}" for w in self.wal]
        out += [f"  written from the WAL: {w}" for w in self.written]
        out += [f"  missing: {n} ({why})" for n, why in self.missing]
        out += [f"  set aside in {LOST_NAME}/: {n} ({why})" for n, why in self.set_aside]
        if not (self.salvaged or self.set_aside or self.missing or not self.manifest_read):
            out.append("  nothing was damaged")
        return out


class _Table:
    def __init__(self, name: str, table_id: int, options: dict[str, Any],
                 flushed_seq: int) -> None:
        self.name = name
        self.id = table_id
        self.options = options
        self.flushed_seq = flushed_seq
        self.files: list[FileMeta] = []
        self.mem = Memtable()


def repair_database(path: str, dry_run: bool = False) -> RepairReport:
    """Rebuild the database at ``path`` from what still reads (see the module docstring)."""
    path = os.path.abspath(path)
    if not os.path.isdir(path):
        raise NotADatabaseError(f"no database at {path}")
    # Refused before the LOCK is made: a directory that is no database is left as it was.
    _check_repairable(sorted(os.listdir(path)), path)
    lock = DatabaseLock(path)
    try:
        return _Repair(path, dry_run).run()
    finally:
        lock.release()


def _check_repairable(names: list[str], path: str) -> None:
    """NotADatabaseError unless ``names`` (a directory's entries) hold a MANIFEST,
    an SSTable or a WAL segment: something repair can rebuild from."""
    if MANIFEST_NAME not in names and not any(SST_RE.match(n) or WAL_RE.match(n)
                                              for n in names):
        raise NotADatabaseError(f"{path} holds no MANIFEST, SSTable or WAL segment: "
                                "nothing to repair")


class _Repair:
    def __init__(self, path: str, dry_run: bool) -> None:
        self.path = path
        self.report = RepairReport(path, dry_run=dry_run)
        self.dry_run = dry_run
        self.tables: dict[str, _Table] = {}
        self.by_id: dict[int, _Table] = {}
        self.levels: dict[int, tuple[str, int]] = {}   # manifest: number -> (table, level)
        self.next_number = 1
        self.last_seq = 0
        self.db_id = ""  # the database's identity: the manifest's, or its files'
        self.to_delete: list[str] = []
        self.pending: list[tuple[_Table, Any]] = []    # new SSTables: (table, what to write)
        self.free_id = 2

    def join(self, name: str) -> str:
        return os.path.join(self.path, name)

    # -- the steps ------------------------------------------------------------
    def run(self) -> RepairReport:
        names = sorted(os.listdir(self.path))
        manifest = self.read_manifest(names)
        for name in names:
            if (m := SST_RE.match(name)) or (w := WAL_RE.match(name)):
                number = int((m or w).group(1))  # type: ignore[union-attr]
                self.next_number = max(self.next_number, number + 1)
        records = self.read_wal(names, manifest)
        # Without a manifest, a table found in an SSTable gets an id no WAL
        # record uses: a record is never applied to a table it did not name.
        self.free_id = max([1, *(tid for _seq, ops in records for tid, _k, _v in ops)]) + 1
        self.sstables(names, manifest)
        self.apply_wal(records)
        if manifest is not None:
            for number, (table, _level) in sorted(self.levels.items()):
                if not os.path.lexists(self.join(sst_name(number))):
                    self.report.missing.append((sst_name(number), f"an SSTable of table "
                                                f"{table!r}; its data is lost"))
            for number in (manifest.wal.numbers() if manifest.wal else ()):
                if not os.path.lexists(self.join(wal_name(number))):
                    self.report.missing.append((wal_name(number), "a WAL segment; its writes "
                                                "are lost"))
        if not self.dry_run:
            self.commit(manifest)
        self.report.tables = {t.name: len(t.files) for t in self.tables.values()}
        return self.report

    def read_manifest(self, names: list[str]) -> Manifest | None:
        try:
            manifest = Manifest.read(self.join(MANIFEST_NAME))
        except FileNotFoundError:
            _check_repairable([n for n in names if n != MANIFEST_NAME], self.path)
            self.report.manifest_read = False
            self.report.manifest_problem = "missing"
            return None
        except (LsmdbError, OSError) as exc:
            self.report.manifest_read = False
            self.report.manifest_problem = str(exc).split(" [")[0]
            self.set_aside(MANIFEST_NAME, f"unreadable: {self.report.manifest_problem}")
            return None
        for name, meta in manifest.tables.items():
            try:
                TableOptions.resolve(meta.options)
                options = dict(meta.options)
            except (TypeError, ValueError):
                options = {}
            self.add_table(name, meta.id, options, meta.flushed_seq)
            for fm in meta.files:
                self.levels[fm.number] = (name, fm.level)
        if DEFAULT_TABLE not in self.tables:
            self.add_table(DEFAULT_TABLE, 1, {}, 0)
        self.next_number = manifest.next_file_number
        self.last_seq = manifest.last_seq
        self.db_id = manifest.db_id
        return manifest

    def add_table(self, name: str, table_id: int, options: dict[str, Any],
                  flushed_seq: int) -> _Table:
        table = self.tables[name] = self.by_id[table_id] = _Table(name, table_id, options,
                                                                  flushed_seq)
        return table

    def table_named(self, name: str) -> _Table:
        table = self.tables.get(name)
        if table is None:
            if name == DEFAULT_TABLE:
                table = self.add_table(name, 1, {}, 0)
            else:
                self.free_id = max([self.free_id, *self.by_id]) + 1
                table = self.add_table(name, self.free_id - 1, {}, 0)
        return table

    def sstables(self, names: list[str], manifest: Manifest | None) -> None:
        keyed = load_secret(self.path)
        if not self.db_id:
            self.db_id = self.majority_id(names)
        for name in names:
            m = SST_RE.match(name)
            if not m:
                continue
            number = int(m.group(1))
            full = self.join(name)
            if not stat.S_ISREG(os.lstat(full).st_mode):
                self.set_aside(name, "not a regular file")
                continue
            if manifest is not None and number not in self.levels:
                self.set_aside(name, "an SSTable the manifest does not name (a crash's "
                               "leftover)")
                continue
            try:
                reader = SSTableReader(full, number)
            except LsmdbError as exc:  # an OSError (EMFILE, EIO) stops the repair instead
                self.set_aside(name, f"unreadable: {str(exc).split(' [')[0]}")
                continue
            try:
                why = self.identity_problem(reader, number)
                if why:
                    self.set_aside(name, why)
                    continue
                reader.attach_hasher(keyed)
                self.sstable(reader, name, number)
            finally:
                reader.close()
        if manifest is None:  # no levels known: every file in level 0, newest data first
            for table in self.tables.values():
                table.files.sort(key=lambda f: (f.max_seq, f.number), reverse=True)

    def majority_id(self, names: list[str]) -> str:
        """With no manifest to say it: the database id most of the format-2 files
        that record their own number record ("" when none does)."""
        ids: Counter[str] = Counter()
        for name in names:
            m = SST_RE.match(name)
            full = self.join(name)
            if not m or not stat.S_ISREG(os.lstat(full).st_mode):
                continue
            try:
                reader = SSTableReader(full, int(m.group(1)))
            except (LsmdbError, OSError):
                continue
            if reader.version >= 2 and reader.file_number == int(m.group(1)) and reader.db_id:
                ids[reader.db_id] += 1
            reader.close()
        return ids.most_common(1)[0][0] if ids else ""

    def identity_problem(self, reader: SSTableReader, number: int) -> str:
        """Why a format-2 file is not this database's file ``number`` ("" if it
        is): the number or the database id it records (the manifest's, or with
        none the one most files record: majority_id)."""
        if reader.version < 2:
            return ""
        if reader.file_number != number:
            return f"it records file number {reader.file_number} (a misplaced file)"
        if self.db_id and reader.db_id != self.db_id:
            return f"it belongs to another database ({reader.db_id})"
        return ""

    def sstable(self, reader: SSTableReader, name: str, number: int) -> None:
        table_name, level = self.levels.get(number, (reader.table or DEFAULT_TABLE, 0))
        table = self.table_named(table_name)
        keys: list[bytes] = []
        values: list[bytes | None] = []
        bad = 0
        for i in range(len(reader.index_keys)):
            try:
                k, v = reader.read_block(i)  # the checksum and the data block rule
                if keys and k and k[0] <= keys[-1]:
                    raise CorruptionError("block out of order", reader.path)
            except (LsmdbError, OSError):
                bad += 1
                continue
            keys.extend(k)
            values.extend(v)
        meta = FileMeta(number, level, reader.size_bytes, reader.entries, reader.min_key,
                        reader.max_key, reader.min_seq, reader.max_seq)
        self.last_seq = max(self.last_seq, reader.max_seq)
        if not bad and len(keys) == reader.entries:
            table.files.append(meta)
            self.report.kept.append(name)
            return
        self.set_aside(name, f"{bad} damaged data block(s) of {len(reader.index_keys)}")
        if not keys:
            return
        new = self.allocate()
        self.report.salvaged.append(f"{name} -> {sst_name(new)} ({len(keys):,} of "
                                    f"{reader.entries:,} entries)")
        self.pending.append((table, (new, level, keys, values, reader.min_seq, reader.max_seq)))

    def read_wal(self, names: list[str], manifest: Manifest | None
                 ) -> list[tuple[int, list[tuple[int, bytes, bytes | None]]]]:
        """Every WAL record that still reads, as (seq, ops): of the segments the
        manifest names and of those created after it (an open refuses one that
        holds records); without a manifest, of every segment on disk.  A segment
        the manifest no longer names was retired: its records are in SSTables,
        or were never acknowledged."""
        numbers = sorted(int(w.group(1)) for n in names if (w := WAL_RE.match(n)))
        if manifest is not None and manifest.wal is not None:
            named = set(manifest.wal.numbers())
            numbers = [n for n in numbers if n in named or n >= manifest.next_file_number]
        records: list[tuple[int, list[tuple[int, bytes, bytes | None]]]] = []
        for number in numbers:
            name = wal_name(number)
            full = self.join(name)
            try:
                if not stat.S_ISREG(os.lstat(full).st_mode):
                    raise OSError(errno.ELOOP, "not a regular file")
                data = read_file(full)
            except OSError as exc:
                self.set_aside(name, f"unreadable: {exc}")
                continue
            damaged: list[tuple[int, int]]
            if data[:8] and segment_format(data) == LEGACY_FORMAT and any(data[:16]):
                try:
                    got = read_legacy_log(data, full).records
                    damaged = []
                except CorruptionError as exc:
                    assert exc.offset is not None
                    got = read_legacy_log(data[:exc.offset], full).records
                    damaged = [(exc.offset, len(data))]
            else:
                got, damaged = salvage_segment(data, number)
            count = 0
            for offset, payload in got:
                try:
                    records.append(decode_record(payload, full, offset))
                    count += 1
                except CorruptionError:
                    damaged.append((offset, offset + len(payload)))
            if damaged:
                lost = sum(b - a for a, b in damaged)
                self.set_aside(name, f"{lost:,} bytes unreadable, from offset {damaged[0][0]:,}")
            else:
                self.to_delete.append(name)
            self.report.wal.append(f"{name}: {count:,} records read" +
                                   (f", {len(damaged)} damaged stretch(es) skipped"
                                    if damaged else ""))
        return records

    def apply_wal(self, records: list[tuple[int, list[tuple[int, bytes, bytes | None]]]]
                  ) -> None:
        """Replay the records newer than their table's SSTables into memtables."""
        newest = {t.id: max([t.flushed_seq, *(f.max_seq for f in t.files)])
                  for t in self.tables.values()}
        for seq, ops in sorted(records, key=lambda r: r[0]):
            self.last_seq = max(self.last_seq, seq)
            for tid, key, value in ops:
                table = self.by_id.get(tid)
                if table is None:
                    if self.report.manifest_read:
                        continue  # a table dropped since
                    table = self.add_table(f"recovered_{tid}", tid, {}, 0)
                    newest[tid] = 0
                if seq > newest[tid]:
                    table.mem.apply(seq, key, value)
                    self.report.records_replayed += 1
        for table in self.tables.values():
            if len(table.mem):
                new = self.allocate()
                self.report.written.append(f"{sst_name(new)} (table {table.name!r}, "
                                           f"{len(table.mem):,} entries)")
                self.pending.append((table, (new, 0, None, table.mem, None, None)))

    def allocate(self) -> int:
        number = self.next_number
        self.next_number += 1
        return number

    def set_aside(self, name: str, why: str) -> None:
        self.report.set_aside.append((name, why))

    # -- writing --------------------------------------------------------------
    def commit(self, manifest: Manifest | None) -> None:
        if not self.db_id:
            self.db_id = _manifest.new_db_id()
        for table, (number, level, keys, values, min_seq, max_seq) in self.pending:
            options = TableOptions.resolve(table.options)
            full = self.join(sst_name(number))
            if keys is None:  # a memtable replayed from the WAL
                mem: Memtable = values
                props = write_sstable(full, (), chunks=mem.flush_chunks(),
                                      fp_chance=options.bloom_filter_fp_chance,
                                      block_size=options.block_size_bytes, table=table.name,
                                      min_seq=mem.min_seq, max_seq=mem.max_seq,
                                      compression=options.compression, file_number=number,
                                      db_id=self.db_id,
                                      family=WRITTEN_FAMILIES[options.filter_family])
            else:
                props = write_sstable(full, zip(keys, values, strict=True),
                                      fp_chance=options.bloom_filter_fp_chance,
                                      block_size=options.block_size_bytes, table=table.name,
                                      min_seq=min_seq, max_seq=max_seq,
                                      compression=options.compression, file_number=number,
                                      db_id=self.db_id,
                                      family=WRITTEN_FAMILIES[options.filter_family])
            table.files.insert(0, FileMeta(number, level, props["size_bytes"], props["entries"],
                                           props["min_key"], props["max_key"], props["min_seq"],
                                           props["max_seq"]))
        if self.report.set_aside:
            lost = self.join(LOST_NAME)
            if os.path.lexists(lost) and not (os.path.isdir(lost) and not os.path.islink(lost)):
                raise NotADatabaseError(f"{lost} exists and is not a directory")
            os.makedirs(lost, exist_ok=True)
            for name, _why in self.report.set_aside:
                target = free_name(lost, name)
                # A second name in lost/ (a hard link, else a copy) before the new
                # manifest is switched in; the old name goes only after that.  A
                # crash in between leaves the old manifest and every file it names
                # as they were -- repair again -- and a crash after it leaves the
                # file in lost/ even when an open sweeps the old name.
                try:
                    os.link(self.join(name), target, follow_symlinks=False)
                except OSError:
                    with FileWriter(target) as f:
                        f.write(read_file(self.join(name)))
                        f.sync()
            fsync_dir(lost)
        fsync_dir(self.path)
        next_table_id = max([manifest.next_table_id if manifest else 2,
                             *(t.id + 1 for t in self.tables.values())])
        Manifest(self.next_number, next_table_id, self.last_seq,
                 {t.name: TableMeta(t.id, t.options, self.last_seq, t.files)
                  for t in self.tables.values()},
                 WalState(), self.db_id).write(self.join(MANIFEST_NAME))
        for name in self.to_delete + [n for n, _why in self.report.set_aside
                                      if n != MANIFEST_NAME]:
            unlink_quietly(self.join(name))
        fsync_dir(self.path)
