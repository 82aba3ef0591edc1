"""Per-SSTable filter counters and per-table read counters, persisted in ``STATS``.

Counters are cumulative and monotonic; reading them never resets them.  The
file is rewritten atomically at each compaction, at each flush but the flush
thread's (a write load's), at close, and every ``STATS_INTERVAL_SECONDS`` the
background thread is between compactions while the database is open; a crash
loses the counts since the last save::

    magic b"LSMDBSTA" | format_version u32 | crc32 u32 | length u32 | payload

payload (msgpack): ``{"files": {number: [range_skips, filter_negatives,
true_positives, false_positives, false_negatives, block_reads,
block_cache_hits]},
"tables": {table_id: [gets, gets_absent, write_stalls, write_stall_us,
write_slowdowns, write_slowdown_us]}}``.

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
#: DO NOT CHANGE: on disk (append only).
FILE_COUNTERS = ("range_skips", "filter_negatives", "true_positives", "false_positives",
                 "false_negatives", "block_reads", "block_cache_hits")
#: Order of the per-table counters (``TableState.counts``, STATS).
#: DO NOT CHANGE: on disk (append only).
TABLE_COUNTERS = ("gets", "gets_absent", "write_stalls", "write_stall_us", "write_slowdowns",
                  "write_slowdown_us")

# The slots the read paths count into (``counts[RANGE_SKIPS] += 1``), taken
# from the tuples above.  The C read path counts into the same slots: its
# module exports the names of its slots in slot order, which
# ``c_counter_errors`` compares with these tuples at import.
RANGE_SKIPS = FILE_COUNTERS.index("range_skips")
FILTER_NEGATIVES = FILE_COUNTERS.index("filter_negatives")  # the filter said no: a read skipped
TRUE_POSITIVES = FILE_COUNTERS.index("true_positives")
FALSE_POSITIVES = FILE_COUNTERS.index("false_positives")
FALSE_NEGATIVES = FILE_COUNTERS.index("false_negatives")    # shadow mode only; must stay 0
BLOCK_READS = FILE_COUNTERS.index("block_reads")            # data blocks read from disk
BLOCK_CACHE_HITS = FILE_COUNTERS.index("block_cache_hits")  # data blocks served by the cache
GETS = TABLE_COUNTERS.index("gets")                # point reads answered
GETS_ABSENT = TABLE_COUNTERS.index("gets_absent")  # ... that found nothing
WRITE_STALLS = TABLE_COUNTERS.index("write_stalls")      # writes held while level 0 was full
WRITE_STALL_US = TABLE_COUNTERS.index("write_stall_us")  # ... and for how long, in all
WRITE_SLOWDOWNS = TABLE_COUNTERS.index("write_slowdowns")      # pauses of slowed writers
WRITE_SLOWDOWN_US = TABLE_COUNTERS.index("write_slowdown_us")  # ... and their time, in all


def c_counter_errors(file_slots: tuple[str, ...], table_slots: tuple[str, ...]) -> list[str]:
    """What is wrong with the C read path's counter slots (the names it exports
    in slot order, lsmdb/csrc/speedups.h) against FILE_COUNTERS and
    TABLE_COUNTERS: [] when each counter it counts has the slot it has here.

    >>> c_counter_errors(FILE_COUNTERS, TABLE_COUNTERS)
    []
    >>> c_counter_errors(("filter_negatives", "range_skips"), TABLE_COUNTERS)
    ['file counter slots (filter_negatives, range_skips) are not (range_skips, filter_negatives)']
    """
    errors = []
    for what, c_names, names in (("file", file_slots, FILE_COUNTERS),
                                 ("table", table_slots, TABLE_COUNTERS)):
        if tuple(c_names) != names[:len(c_names)]:
            errors.append(f"{what} counter slots ({', '.join(c_names)}) are not "
                          f"({', '.join(names[:len(c_names)])})")
    return errors


class ArrayCounter:
    """A counter attribute kept in the object's ``counts`` array('Q'), in the
    slot its name has in ``names`` (FILE_COUNTERS or TABLE_COUNTERS), so the
    read path (Python or C) increments an array slot::

        class SSTableReader:
            range_skips = ArrayCounter(FILE_COUNTERS)   # counts[RANGE_SKIPS]
    """

    __slots__ = ("names", "index")

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.index = -1  # set when the class is made (__set_name__)

    def __set_name__(self, owner: Any, name: str) -> None:
        self.index = self.names.index(name)

    def __get__(self, obj: Any, owner: Any = None) -> int:
        return int(obj.counts[self.index])

    def __set__(self, obj: Any, value: int) -> None:
        obj.counts[self.index] = value



def encode_stats(readers: Iterable[Any], tables: Iterable[Any]) -> bytes:
    payload = msgpack.packb({
        "files": {r.number: [getattr(r, c) for c in FILE_COUNTERS] for r in readers},
        "tables": {t.id: [getattr(t, c) for c in TABLE_COUNTERS] for t in tables},
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


def table_totals(state: Any, infos: list[Any]) -> dict[str, Any]:
    """``db.table_stats``: a table's files (``SSTableInfo`` each) and gets, summed."""
    fp = sum(i.false_positives for i in infos)
    tn = sum(i.filter_negatives for i in infos)
    tp = sum(i.true_positives for i in infos)
    return {
        "files": len(infos),
        "entries": sum(i.entries for i in infos),
        "size_bytes": sum(i.size_bytes for i in infos),
        "filter_bytes_on_disk": sum(i.filter_bytes for i in infos),
        "filter_bytes_in_memory": sum(r.filter.active.memory_bytes for r in state.files),
        "index_bytes_in_memory": sum(r.index_memory_bytes for r in state.files),
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
        "write_stalls": state.write_stalls,
        "write_stall_seconds": state.write_stall_us / 1e6,
        "write_slowdowns": state.write_slowdowns,
        "write_slowdown_seconds": state.write_slowdown_us / 1e6,
    }
