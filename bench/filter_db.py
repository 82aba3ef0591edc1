"""The absent-key benchmark's database: one table per fp chance, its query sets, timed gets.

Every table holds the same N keys in T SSTables that each span the whole key
range (see :func:`build_database`); :class:`Fixture` carries the open
database and the query sets the parts share, and :func:`run_gets` times a
loop of gets together with what the engine and the kernel counted during it.
"""

from __future__ import annotations

import inspect
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import lsmdb

from .common import GetTiming, Progress, ReadSyscalls, time_gets
from .keys import key_of, number_of, value_of

PRICE_LIST_FP_CHANCES = (1.0, 0.1, 0.01, 0.001, 0.0001)
GUARANTEE_FP_CHANCE = 0.01      # lsmdb's default
BATCH_KEYS = 10_000
MEMTABLE_BYTES = 1 << 30        # the maximum: only our explicit flushes cut files
SEED = 5
COUNTER_FIELDS = ("range_skips", "filter_negatives", "false_positives", "true_positives",
                  "block_reads", "block_cache_hits")   # a field the engine lacks counts 0


def table_name(fp_chance: float) -> str:
    """fp 0.001 -> "fp_0_001" (table names allow letters, digits, '_' and '-')."""
    return "fp_" + f"{fp_chance:f}".rstrip("0").rstrip(".").replace(".", "_")


# --------------------------------------------------------------- the database
def open_db(path: str) -> lsmdb.DB:
    """Open without compaction, without a block cache and reading blocks with
    ``pread`` rather than out of a mapping, where the engine has those options.

    Without the cache every "maybe" from a filter costs a real read of the
    file (from the page cache: a system call, not a seek), which is what the
    filter is there to save and what the kernel's read count can confirm; a
    block copied out of a mapping is no read call, so the kernel could not.
    """
    options: dict[str, Any] = {"auto_compaction": False}
    parameters = inspect.signature(lsmdb.open).parameters
    if "block_cache_size_bytes" in parameters:
        options["block_cache_size_bytes"] = 0
    if "mmap_reads" in parameters:
        options["mmap_reads"] = False
    return lsmdb.open(path, **options)


@dataclass
class Fixture:
    """The open database and the query sets every part shares."""

    db: lsmdb.DB
    keys: int
    sstables: int
    tables: dict[float, str]       # fp chance -> table name
    absent: list[bytes]            # absent keys inside every file's key range
    present: list[bytes]
    syscalls: ReadSyscalls
    progress: Progress


def build_database(path: str, keys: int, sstables: int, progress: Progress) -> dict[float, str]:
    """One table per price-list fp chance, each with the same keys in ``sstables`` files."""
    order = list(range(keys))
    random.Random(SEED).shuffle(order)
    cuts = [round(f * keys / sstables) for f in range(sstables + 1)]
    tables = {}
    progress(f"building {len(PRICE_LIST_FP_CHANCES)} tables of {keys:,} keys in {sstables} "
             f"SSTables each under {path}")
    with open_db(path) as db:
        for fp in PRICE_LIST_FP_CHANCES:
            name = table_name(fp)
            tables[fp] = name
            db.create_table(name, bloom_filter_fp_chance=fp, memtable_size_bytes=MEMTABLE_BYTES)
            start = time.perf_counter()
            for f in range(sstables):
                file_order = order[cuts[f]:cuts[f + 1]]
                for lo in range(0, len(file_order), BATCH_KEYS):
                    with db.batch() as batch:
                        for i in file_order[lo:lo + BATCH_KEYS]:
                            batch.put(key_of(2 * i), value_of(2 * i), table=name)
                db.flush(name)
            progress(f"loaded table {name} (bloom_filter_fp_chance {fp:g}): {keys:,} keys, "
                     f"{sstables} SSTables in {time.perf_counter() - start:.1f}s")
    return tables


def pick_queries(db: lsmdb.DB, keys: int, queries: int) -> tuple[list[bytes], list[bytes]]:
    """(absent, present): absent odd keys strictly inside every file's key range."""
    infos = db.sstables()
    lo = number_of(max(i.min_key for i in infos))
    hi = number_of(min(i.max_key for i in infos))
    rng = random.Random(SEED + 1)
    absent_pool = range(lo + 1, hi, 2)
    if not absent_pool:
        raise SystemExit("the SSTables share no key range: use more keys per SSTable")
    absent = (rng.sample(absent_pool, queries) if queries <= len(absent_pool)
              else rng.choices(absent_pool, k=queries))
    present_pool = range(0, 2 * keys, 2)
    present = (rng.sample(present_pool, queries) if queries <= len(present_pool)
               else rng.choices(present_pool, k=queries))
    return [key_of(n) for n in absent], [key_of(n) for n in present]


def check_layout(db: lsmdb.DB, tables: dict[float, str], sstables: int) -> None:
    for name in tables.values():
        files = len(db.sstables(name))
        if files != sstables:
            raise SystemExit(f"table {name} has {files} SSTables, expected {sstables} "
                             "(a memtable filled up before the planned flush: use fewer keys "
                             "per SSTable)")


def compact_tables(db: lsmdb.DB, names: Sequence[str], progress: Progress) -> str | None:
    """Fully compact ``names``; returns None when done, else why it could not."""
    compact = getattr(db, "compact", None)
    if compact is None:
        return ("compaction is not available in this lsmdb yet: the rows after a full "
                "compaction are omitted")
    start = time.perf_counter()
    if "table" in inspect.signature(compact).parameters:
        for name in names:
            compact(name)
    else:
        compact()
    progress(f"full compaction of {', '.join(names)} in {time.perf_counter() - start:.1f}s")
    return None


# --------------------------------------------------------------- measurement
@dataclass
class FilterShape:
    """The filters of one table's SSTables, summed or averaged over its files."""

    files: int
    entries: int
    filter_bits: int
    filter_hashes: list[int]
    filter_bytes: int
    predicted_fpr: float    # mean over files: every absent key probes each file once

    @property
    def bits_per_key(self) -> float:
        return self.filter_bits / self.entries if self.entries else 0.0


def filter_shape(db: lsmdb.DB, table: str) -> FilterShape:
    infos = db.sstables(table)
    return FilterShape(
        files=len(infos), entries=sum(i.entries for i in infos),
        filter_bits=sum(i.filter_bits for i in infos),
        filter_hashes=sorted({i.filter_hashes for i in infos}),
        filter_bytes=sum(i.filter_bytes for i in infos),
        predicted_fpr=sum(i.predicted_fpr for i in infos) / len(infos))


def table_counters(db: lsmdb.DB, table: str) -> dict[str, int]:
    infos = db.sstables(table)
    return {f: sum(getattr(i, f, 0) for i in infos) for f in COUNTER_FIELDS}


@dataclass
class GetRun:
    """One timed loop of gets and what the engine and the kernel counted during it."""

    timing: GetTiming
    counters: dict[str, int]          # engine counter deltas over the loop
    read_syscalls: int | None         # kernel read(2)/pread(2) calls over the loop

    @property
    def gets(self) -> int:
        return self.timing.gets

    @property
    def found(self) -> int:
        return self.timing.found

    @property
    def seconds(self) -> float:
        return self.timing.seconds

    @property
    def per_second(self) -> float:
        return self.timing.per_second

    @property
    def filter_probes(self) -> int:
        """Filter answers for keys the file does not hold: false positives + negatives."""
        return self.counters["false_positives"] + self.counters["filter_negatives"]


def run_gets(fx: Fixture, table: str, keys: Sequence[bytes]) -> GetRun:
    """Get every key once, timed; engine counters and read syscalls as deltas."""
    before = table_counters(fx.db, table)
    start = fx.syscalls.snapshot()
    timing = time_gets(fx.db.table(table).get, keys)
    reads = fx.syscalls.delta(start)
    after = table_counters(fx.db, table)
    return GetRun(timing, {f: after[f] - before[f] for f in COUNTER_FIELDS}, reads)
