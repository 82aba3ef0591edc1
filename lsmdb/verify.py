"""Offline consistency check of a database directory (``lsmdb verify``).

Checks every checksum of every file the manifest names (footer, index,
properties, filter, each data block), the structure of every block, that the
properties agree with the data, and that every key of each SSTable passes
its own filter (a false negative is a lost key).  Reads every WAL segment
the manifest names -- a closed one must hold every byte of its recorded
size, the live one may end in a torn tail (a warning) -- and the STATS file,
and reports files the manifest does not name.  Opens nothing for writing
and takes no lock.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from .errors import CorruptionError, LsmdbError
from .files import (
    CHANGES_NAME,
    LOCK_NAME,
    LOST_NAME,
    MANIFEST_NAME,
    OWN_NAME_RE,
    SECRET_NAME,
    SST_RE,
    STATS_NAME,
    TMP_SUFFIX,
    WAL_RE,
    read_file,
    sst_name,
    wal_name,
)
from .filters.hashing import Hasher, key_hash
from .logset import read_unsynced_segment
from .manifest import FileMeta, Manifest
from .secret import load_secret
from .sstable_reader import SSTableReader
from .stats import decode_stats
from .wal import SEGMENT_FORMAT, read_segment_file


@dataclass
class Problem:
    path: str
    offset: int | None
    message: str
    severity: str = "error"   # "error" makes verify fail; "warning" does not

    def __str__(self) -> str:
        where = self.path + (f" @ offset {self.offset}" if self.offset is not None else "")
        return f"{self.severity.upper()}: {where}: {self.message}"


def verify_sstable(path: str, number: int = 0, keyed: Hasher | None = None) -> Iterator[Problem]:
    """Problems of one SSTable file (nothing when it is sound)."""
    try:
        reader = SSTableReader(path, number)
        reader.attach_hasher(keyed)
    except LsmdbError as exc:
        yield Problem(path, getattr(exc, "offset", None), str(exc))
        return
    except OSError as exc:
        yield Problem(path, None, f"cannot open: {exc}")
        return
    try:
        handle = reader.filter
        if handle.error:
            yield Problem(path, reader.filter_handle[0],
                          f"filter unusable, reads fail open to 'maybe': {handle.error}")
        flt = handle.active if handle.active.probe_spec().family else None
        entries = tombstones = expiring = 0
        for i in range(len(reader.index_keys)):
            try:  # the checksum, then the data block rule (lsmdb.block)
                keys, values = reader.read_block(i)
            except CorruptionError as exc:
                yield Problem(path, exc.offset, str(exc).split(" [")[0])
                continue
            entries += len(keys)
            tombstones += sum(1 for v in values if v is None)
            expiring += sum(1 for v in values if type(v) is tuple)
            if flt is not None:
                hash_fn = handle.hash_fn or key_hash
                for key in keys:
                    if not flt.may_contain(hash_fn(key)):
                        yield Problem(path, reader.filter_handle[0],
                                      f"filter false negative for key {key!r} (a lost key)")
        if entries != reader.entries or tombstones != reader.tombstones:
            yield Problem(path, reader.props_handle[0],
                          f"properties say {reader.entries} entries / {reader.tombstones} "
                          f"tombstones, data blocks hold {entries} / {tombstones}")
        if expiring != reader.expiring:
            yield Problem(path, reader.props_handle[0],
                          f"properties say {reader.expiring} expiring entries, data blocks "
                          f"hold {expiring}")
        if reader.index_keys and (reader.min_key > reader.max_key):
            yield Problem(path, reader.props_handle[0], "min_key > max_key")
    finally:
        reader.close()


def verify_database(path: str) -> list[Problem]:
    """Every problem found in the database at ``path``."""
    problems: list[Problem] = []
    manifest_path = os.path.join(path, MANIFEST_NAME)
    try:
        manifest = Manifest.read(manifest_path)
    except FileNotFoundError:
        return [Problem(manifest_path, None, "no MANIFEST: not an lsmdb database")]
    except LsmdbError as exc:
        return [Problem(manifest_path, getattr(exc, "offset", None), str(exc))]
    except OSError as exc:
        return [Problem(manifest_path, None, f"cannot read: {exc}")]
    keyed = load_secret(path)
    named_ssts = set()
    for name, table in sorted(manifest.tables.items()):
        for fm in table.files:
            named_ssts.add(fm.number)
            file_path = os.path.join(path, sst_name(fm.number))
            if not _is_file(file_path):
                problems.append(Problem(file_path, None, f"named by the manifest (table "
                                        f"{name!r}) but missing or not a regular file"))
                continue
            found = list(verify_sstable(file_path, fm.number, keyed))
            problems.extend(found)
            if not found:
                why = _identity(file_path, fm, manifest.db_id)
                if why:
                    problems.append(Problem(file_path, None,
                                            f"not the file the manifest names: {why}"))
    named_wals = _verify_wal(path, manifest, problems)
    stats_path = os.path.join(path, STATS_NAME)
    if os.path.lexists(stats_path):
        try:
            decode_stats(read_file(stats_path))
        except Exception as exc:
            problems.append(Problem(stats_path, None,
                                    f"counters unreadable ({exc}); they restart at zero",
                                    "warning"))
    problems.extend(_orphans(path, manifest, named_ssts, named_wals))
    return problems


def _identity(file_path: str, fm: FileMeta, db_id: str) -> str:
    """How the SSTable at ``file_path`` differs from the manifest's record of it
    (lsmdb.recovery.identity_mismatch, what an open checks); "" if it does not."""
    from .recovery import identity_mismatch
    try:
        reader = SSTableReader(file_path, fm.number)
    except (LsmdbError, OSError) as exc:
        return str(exc)
    try:
        return identity_mismatch(reader, fm, db_id)
    finally:
        reader.close()


def _is_file(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _verify_wal(path: str, manifest: Manifest, problems: list[Problem]) -> set[int]:
    """Check the WAL segments the manifest names; returns their numbers."""
    wal = manifest.wal
    # (number, how it is read: "closed" to its size, "unsynced" within its size,
    # "live" to its end; size, format)
    segments: list[tuple[int, str, int | None, int | None]]
    if wal is None:  # a format-1 manifest: its segments are those on disk
        numbers = sorted(int(m.group(1)) for n in os.listdir(path) if (m := WAL_RE.match(n)))
        segments = [(n, "live", None, None) for n in numbers]
    else:
        segments = [(n, "closed", size, fmt) for n, size, fmt in wal.closed]
        segments += [(n, "unsynced", size, SEGMENT_FORMAT) for n, size in wal.unsynced]
        if wal.live is not None:
            segments.append((wal.live, "live", None, SEGMENT_FORMAT))
    torn = False
    for number, how, size, fmt in segments:
        seg = os.path.join(path, wal_name(number))
        if torn:
            problems.append(Problem(seg, None, "WAL segment after a torn one: written after "
                                    "the tear, ignored at open (and set aside in lost/)",
                                    "warning"))
            continue
        if not _is_file(seg):
            problems.append(Problem(seg, None, f"{how} WAL segment named by the manifest is "
                                    "missing or not a regular file (its writes are lost)"))
            continue
        try:
            if how == "unsynced":
                assert size is not None
                result = read_unsynced_segment(seg, number, size)
            else:
                result = read_segment_file(seg, number, size if how == "closed" else None, fmt)
        except LsmdbError as exc:
            problems.append(Problem(seg, getattr(exc, "offset", None), str(exc).split(" [")[0]))
            continue
        except OSError as exc:
            problems.append(Problem(seg, None, f"cannot read: {exc}"))
            continue
        if result.torn:
            torn = wal is not None
            problems.append(Problem(seg, result.valid_length,
                                    "torn tail (writes a crash cut short; not fsynced, they are "
                                    "dropped at open)", "warning"))
    return {n for n, _how, _s, _f in segments}


def _orphans(path: str, manifest: Manifest, named_ssts: set[int],
             named_wals: set[int]) -> Iterator[Problem]:
    """Files the manifest does not name: what a crash leaves (a read-write open deletes
    them), what it cannot explain (errors), and anything that is not lsmdb's."""
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if name in (MANIFEST_NAME, LOCK_NAME, STATS_NAME, SECRET_NAME, CHANGES_NAME):
            if os.path.islink(full):
                yield Problem(full, None, "is a symbolic link (lsmdb never follows one)")
            continue
        if name == LOST_NAME and os.path.isdir(full) and not os.path.islink(full):
            yield Problem(full, None, "holds what lsmdb repair set aside", "warning")
            continue
        if os.path.islink(full):
            yield Problem(full, None, "symbolic link in the database directory "
                          "(lsmdb never follows one)", "warning")
            continue
        if not _is_file(full):
            yield Problem(full, None, "not a regular file (lsmdb leaves it alone)", "warning")
            continue
        m, w = SST_RE.match(name), WAL_RE.match(name)
        if m and int(m.group(1)) not in named_ssts:
            yield Problem(full, None, "orphan SSTable: the manifest does not name it (a crash "
                          "left it, or it is a history file a live snapshot of the writing "
                          "process holds; the next read-write open deletes it)", "warning")
        elif w and int(w.group(1)) not in named_wals:
            number = int(w.group(1))
            if manifest.wal is not None and number >= manifest.next_file_number:
                try:
                    held = read_segment_file(full, number).records
                except (LsmdbError, OSError) as exc:
                    yield Problem(full, None, f"unnamed WAL segment unreadable: {exc}", "warning")
                    continue
                if held:
                    yield Problem(full, held[0][0], "WAL segment newer than the manifest's live "
                                  "one holds records (the open refuses it; see lsmdb repair)")
                    continue
            yield Problem(full, None, "orphan WAL segment: the manifest does not name it (the "
                          "next read-write open deletes it)", "warning")
        elif name.endswith(TMP_SUFFIX) and OWN_NAME_RE.match(name):
            yield Problem(full, None, "leftover temporary file (the next read-write open "
                          "deletes it)", "warning")
        elif not OWN_NAME_RE.match(name):
            yield Problem(full, None, "not a file lsmdb writes", "warning")
