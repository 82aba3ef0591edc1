"""Offline consistency check of a database directory (``lsmdb verify``).

Checks every checksum of every file the manifest names (footer, index,
properties, filter, each data block), the structure of every block, that the
properties agree with the data, and that every key of each SSTable passes
its own filter (a false negative is a lost key).  Also reads every WAL
segment and the STATS file.  Opens nothing for writing and takes no lock.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

from . import block as blk
from .bloom import BloomFilter, Hasher, key_hash, split_hash
from .errors import CorruptionError, LsmdbError
from .manifest import MANIFEST_NAME, Manifest
from .secret import load_secret
from .sstable import SSTableReader
from .stats import STATS_NAME, decode_stats
from .wal import read_log_file

_WAL_RE = re.compile(r"wal-(\d{6,})\.log\Z")


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
        if reader.filter_error:
            yield Problem(path, reader.filter_handle[0],
                          f"filter unusable, reads fail open to 'maybe': {reader.filter_error}")
        bloom = reader.bloom if isinstance(reader.bloom, BloomFilter) else None
        entries = tombstones = 0
        prev = None
        for i, last in enumerate(reader.index_keys):
            offset = reader.index_offsets[i]
            try:
                keys, values = reader.read_data_block(i, count=False)
                blk.validate_data_block(keys, values, path, offset)
            except CorruptionError as exc:
                yield Problem(path, exc.offset, str(exc).split(" [")[0])
                continue
            if not keys or keys[-1] != last or (prev is not None and keys[0] <= prev):
                yield Problem(path, offset, "data block does not match its index entry")
            prev = keys[-1] if keys else prev
            entries += len(keys)
            tombstones += sum(1 for v in values if v is None)
            if bloom is not None and bloom.m:
                hash_fn = reader.keyed_fn or key_hash
                for key in keys:
                    if not bloom.may_contain_hash(*split_hash(hash_fn(key))):
                        yield Problem(path, reader.filter_handle[0],
                                      f"filter false negative for key {key!r} (a lost key)")
        if entries != reader.entries or tombstones != reader.tombstones:
            yield Problem(path, reader.props_handle[0],
                          f"properties say {reader.entries} entries / {reader.tombstones} "
                          f"tombstones, data blocks hold {entries} / {tombstones}")
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
    keyed = load_secret(path)
    for name, table in sorted(manifest.tables.items()):
        for fm in table.files:
            file_path = os.path.join(path, f"{fm.number:06d}.sst")
            if not os.path.exists(file_path):
                problems.append(Problem(file_path, None,
                                        f"named by the manifest (table {name!r}) but missing"))
                continue
            found = list(verify_sstable(file_path, fm.number, keyed))
            problems.extend(found)
            if not found and os.path.getsize(file_path) != fm.size:
                problems.append(Problem(file_path, None, "size differs from the manifest's"))
    for entry in sorted(os.listdir(path)):
        if _WAL_RE.match(entry):
            seg = os.path.join(path, entry)
            try:
                result = read_log_file(seg)
            except LsmdbError as exc:
                problems.append(Problem(seg, getattr(exc, "offset", None), str(exc).split(" [")[0]))
                continue
            if result.torn:
                problems.append(Problem(seg, result.valid_length,
                                        "torn last record (an unacknowledged write; dropped at "
                                        "open)", "warning"))
    stats_path = os.path.join(path, STATS_NAME)
    if os.path.exists(stats_path):
        try:
            with open(stats_path, "rb") as f:
                decode_stats(f.read())
        except Exception as exc:
            problems.append(Problem(stats_path, None,
                                    f"counters unreadable ({exc}); they restart at zero",
                                    "warning"))
    return problems
