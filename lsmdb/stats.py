"""Per-SSTable filter counters and per-table read counters, persisted in ``STATS``.

Counters are cumulative and monotonic; reading them never resets them.  The
file is rewritten atomically at flush, compaction, close and every
``STATS_INTERVAL_SECONDS`` while the database is open, so a crash loses at
most one interval of counts::

    magic b"LSMDBSTA" | format_version u32 | crc32 u32 | length u32 | payload

payload (msgpack): ``{"files": {number: [range_skips, filter_negatives,
true_positives, false_positives, false_negatives, block_reads,
block_cache_hits]},
"tables": {table_id: [gets, gets_absent]}}``.

Counters are statistics, not data: a STATS file that fails its checksum is
ignored with a warning (every counter restarts at zero), never an error.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterable
from typing import Any

import msgpack

from .coding import crc32
from .files import STATS_NAME, read_file, write_file_durably

log = logging.getLogger("lsmdb")

STATS_MAGIC = b"LSMDBSTA"  # DO NOT CHANGE: on disk.
STATS_FORMAT_VERSION = 1   # DO NOT CHANGE: on disk.
STATS_HEADER = struct.Struct("<8sIII")
STATS_INTERVAL_SECONDS = 10.0

#: Order of the per-file counters on disk and in ``SSTableReader.counts``.
#: DO NOT CHANGE: on disk (append only); the C read path counts by the same slots
#: (lsmdb/csrc/speedups.h).
FILE_COUNTERS = ("range_skips", "filter_negatives", "true_positives", "false_positives",
                 "false_negatives", "block_reads", "block_cache_hits")
#: Order of the per-table read counters (``TableState.counts``, STATS); the C getter
#: counts into both.
TABLE_COUNTERS = ("gets", "gets_absent")


class ArrayCounter:
    """A counter attribute kept in slot ``index`` of the object's ``counts``
    array('Q'), so the read path (Python or C) increments an array slot."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __get__(self, obj: Any, owner: Any = None) -> int:
        return int(obj.counts[self.index])

    def __set__(self, obj: Any, value: int) -> None:
        obj.counts[self.index] = value



def encode_stats(readers: Iterable[Any], tables: Iterable[Any]) -> bytes:
    payload = msgpack.packb({
        "files": {r.number: [getattr(r, c) for c in FILE_COUNTERS] for r in readers},
        "tables": {t.id: [t.gets, t.gets_absent] for t in tables},
    }, use_bin_type=True)
    return STATS_HEADER.pack(STATS_MAGIC, STATS_FORMAT_VERSION, crc32(payload),
                             len(payload)) + payload


def decode_stats(data: bytes) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """(file counters by number, table counters by id); raises ValueError when unusable."""
    if len(data) < STATS_HEADER.size:
        raise ValueError("truncated")
    magic, version, crc, length = STATS_HEADER.unpack_from(data, 0)
    payload = data[STATS_HEADER.size:]
    if magic != STATS_MAGIC or version != STATS_FORMAT_VERSION or len(payload) != length \
            or crc32(payload) != crc:
        raise ValueError("bad header or checksum")
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        files = {int(k): [int(x) for x in v] for k, v in obj["files"].items()}
        tables = {int(k): [int(x) for x in v] for k, v in obj["tables"].items()}
        for counts in (*files.values(), *tables.values()):
            if any(x < 0 or x >= 1 << 64 for x in counts):
                raise ValueError("counter out of range")
    except Exception as exc:  # any shape msgpack can produce
        raise ValueError(f"undecodable counters ({type(exc).__name__})") from None
    return files, tables


def load_stats(directory: str) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    path = os.path.join(directory, STATS_NAME)
    try:
        return decode_stats(read_file(path))
    except FileNotFoundError:
        return {}, {}
    except Exception as exc:  # statistics only: never a reason to refuse to open
        log.warning("%s: ignoring unreadable counters (%s); they restart at zero", path, exc)
        return {}, {}


def apply_file_counters(reader: Any, values: list[int]) -> None:
    for name, value in zip(FILE_COUNTERS, values):  # noqa: B905 (older files: fewer counters)
        setattr(reader, name, value)


def save_stats(directory: str, readers: Iterable[Any], tables: Iterable[Any]) -> None:
    write_file_durably(os.path.join(directory, STATS_NAME), encode_stats(readers, tables))
