"""What lsmdb's Bloom filters guarantee, cost and save -- measured against the formulas.

    python -m bench.absent_keys [--keys N] [--sstables T] [--queries Q] [--quick]
                                [--json PATH] [--plot PATH]

Builds a real database in a temporary directory: one table per
``bloom_filter_fp_chance`` in the price list, each holding the same N keys
(``b"user:%010d" % 2i``, 100-byte values) loaded in random order and flushed
every N/T keys, so each of the T SSTables spans the whole key range and an
absent key inside it can only be turned away by the file's filter.  No
compaction runs until the last step.  Then five parts:

1. guarantee     -- absent gets find nothing, present gets find everything
                    (false negatives must be 0); measured FPR vs predicted;
                    again after a full compaction when the engine has one.
2. price_list    -- per fp chance: bits/key, filter bytes, data-block reads
                    (engine counter and the kernel's read syscalls), reads
                    skipped, FPR with its 99 % interval, gets per second.
3. k_sweep       -- a standalone BloomFilter at 8 bits/key probed with
                    k = 1 ... 20: the optimum seen from both sides.
4. overfill      -- a filter sized for n keys loaded with n, 2n, 3n keys.
5. absent_share  -- gets/s with and without a filter as the share of
                    absent keys grows: where the filter stops paying.

Tables go to stdout, progress to stderr; ``--json`` writes one object per
part (every row with its measured and predicted values), ``--plot`` a figure
(needs matplotlib: ``pip install 'lsmdb[plot]'``).
"""

from __future__ import annotations

import argparse
import inspect
import math
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import lsmdb
from lsmdb.bloom import BloomFilter, key_hash, predicted_fpr_for

from .common import (SLICES, GetTiming, Progress, ReadSyscalls, Timer, describe_machine,
                     fmt_int, fmt_pct, fmt_rate, fmt_ratio, load_average, machine_info,
                     median_ratio, print_section, time_gets, time_gets_interleaved,
                     wilson_interval, write_json)

KEY_FORMAT = b"user:%010d"     # key number i -> key; present keys are even, absent odd
KEY_PREFIX_LEN = len(b"user:")
VALUE_BYTES = 100
DEFAULT_KEYS = 1_000_000
QUICK_KEYS = 100_000
DEFAULT_QUERIES = 100_000
QUICK_QUERIES = 20_000
DEFAULT_SSTABLES = 8
PRICE_LIST_FP_CHANCES = (1.0, 0.1, 0.01, 0.001, 0.0001)
GUARANTEE_FP_CHANCE = 0.01      # lsmdb's default
K_SWEEP_BITS_PER_KEY = 8
K_SWEEP = (1, 2, 4, 6, 8, 12, 20)
OVERFILL_LOADS = (1, 2, 3)
ABSENT_SHARES = (0.0, 0.5, 0.9, 0.99)
SHARE_SLICES = 10               # part 5 alternates the two tables slice by slice
BATCH_KEYS = 10_000
MEMTABLE_BYTES = 1 << 30        # the maximum: only our explicit flushes cut files
SEED = 5
COUNTER_FIELDS = ("range_skips", "filter_negatives", "false_positives", "true_positives",
                  "block_reads", "block_cache_hits")   # a field the engine lacks counts 0


def key_of(number: int) -> bytes:
    return KEY_FORMAT % number


def value_of(number: int) -> bytes:
    """The 100-byte value stored under ``key_of(number)``."""
    return (b"%010d" % number) * (VALUE_BYTES // 10)


def number_of(key: bytes) -> int:
    return int(key[KEY_PREFIX_LEN:])


def table_name(fp_chance: float) -> str:
    """fp 0.001 -> "fp_0_001" (table names allow letters, digits, '_' and '-')."""
    return "fp_" + f"{fp_chance:f}".rstrip("0").rstrip(".").replace(".", "_")


# --------------------------------------------------------------- the database
def open_db(path: str) -> lsmdb.DB:
    """Open without compaction and without a block cache, where the engine has one.

    Without the cache every "maybe" from a filter costs a real read of the
    file (from the page cache: a system call, not a seek), which is what the
    filter is there to save and what the kernel's read count can confirm.
    """
    options: dict[str, Any] = {"auto_compaction": False}
    if "block_cache_size_bytes" in inspect.signature(lsmdb.open).parameters:
        options["block_cache_size_bytes"] = 0
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


def fpr_fields(false_positives: int, probes: int, predicted: float) -> dict[str, Any]:
    """Measured rate, its 99 % Wilson interval, the prediction, and whether it lies inside."""
    lo, hi = wilson_interval(false_positives, probes)
    return {
        "false_positives": false_positives,
        "filter_probes": probes,
        "measured_fpr": false_positives / probes if probes else None,
        "ci99_low": lo,
        "ci99_high": hi,
        "predicted_fpr": predicted,
        "predicted_in_ci99": lo <= predicted <= hi,
    }


def fmt_ci(row: dict[str, Any]) -> str:
    return f"[{fmt_pct(row['ci99_low'])}, {fmt_pct(row['ci99_high'])}]"


def fmt_predicted(row: dict[str, Any]) -> str:
    """The prediction, with "!" when it falls outside the measured 99 % interval."""
    return fmt_pct(row["predicted_fpr"]) + ("" if row["predicted_in_ci99"] else " !")


OUTSIDE_NOTE = "! = the predicted FPR lies outside the measured 99% interval"
RATE_NOTE = (f"get/s: the median rate of {SLICES} equal slices of the loop (a burst of load from "
             "another process moves one slice, not the result)")


# -------------------------------------------------------------- 1. guarantee
def guarantee_row(fx: Fixture, layout: str) -> dict[str, Any]:
    """Absent gets must find nothing; present gets must find their own value."""
    table = fx.tables[GUARANTEE_FP_CHANCE]
    db_table = fx.db.table(table)
    shape = filter_shape(fx.db, table)
    absent = run_gets(fx, table, fx.absent)
    false_negatives = wrong_values = 0
    for key in fx.present:
        value = db_table.get(key)
        if value is None:
            false_negatives += 1
        elif value != value_of(number_of(key)):
            wrong_values += 1
    return {
        "layout": layout, "files": shape.files, "fp_chance": GUARANTEE_FP_CHANCE,
        "bits_per_key": shape.bits_per_key,
        "absent_gets": absent.gets, "absent_found": absent.found,
        "range_skips": absent.counters["range_skips"],
        "present_gets": len(fx.present), "present_found": len(fx.present) - false_negatives,
        "false_negatives": false_negatives, "predicted_false_negatives": 0,
        "wrong_values": wrong_values,
        **fpr_fields(absent.counters["false_positives"], absent.filter_probes,
                     shape.predicted_fpr),
    }


def print_guarantee(part: dict[str, Any]) -> None:
    rows = [[r["layout"], str(r["files"]), fmt_int(r["absent_gets"]), fmt_int(r["absent_found"]),
             fmt_int(r["present_gets"]), fmt_int(r["present_found"]),
             fmt_int(r["false_negatives"]), fmt_int(r["filter_probes"]),
             fmt_int(r["false_positives"]), fmt_pct(r["measured_fpr"]), fmt_ci(r),
             fmt_predicted(r)] for r in part["rows"]]
    print_section(part["title"], ["layout", "files", "absent gets", "absent found",
                                  "present gets", "present found", "false neg", "filter probes",
                                  "false pos", "measured FPR", "99% interval", "predicted FPR"],
                  rows, part["notes"])


# ------------------------------------------------------------- 2. price list
def part_price_list(fx: Fixture) -> dict[str, Any]:
    """Per fp chance: what the filter costs in memory and saves in block reads."""
    rows = []
    for fp in PRICE_LIST_FP_CHANCES:
        table = fx.tables[fp]
        shape = filter_shape(fx.db, table)
        absent = run_gets(fx, table, fx.absent)
        present = run_gets(fx, table, fx.present)
        reads = absent.counters["block_reads"]
        rows.append({
            "fp_chance": fp, "files": shape.files, "bits_per_key": shape.bits_per_key,
            "filter_hashes": shape.filter_hashes, "filter_bytes": shape.filter_bytes,
            "absent_gets": absent.gets, "absent_found": absent.found,
            "range_skips": absent.counters["range_skips"], "block_reads": reads,
            "read_syscalls": absent.read_syscalls,
            "block_cache_hits": absent.counters["block_cache_hits"],
            "predicted_block_reads": absent.gets * shape.files * shape.predicted_fpr,
            **fpr_fields(absent.counters["false_positives"], absent.filter_probes,
                         shape.predicted_fpr),
            "absent_gets_per_s": absent.per_second,
            "present_gets": present.gets, "present_found": present.found,
            "present_block_reads": present.counters["block_reads"],
            "present_gets_per_s": present.per_second,
        })
        fx.progress(f"price list: fp {fp:g} done "
                    f"({absent.seconds + present.seconds:.1f}s of gets)")
    baseline = rows[0]["block_reads"]
    for row in rows:
        row["reads_skipped"] = 1 - row["block_reads"] / baseline if baseline else None
    notes = [OUTSIDE_NOTE,
             ("block reads: data blocks the engine read for the absent gets (its block_reads "
              "counter); kernel reads: read system calls the kernel counted meanwhile (syscr)."),
             ("predicted reads: absent gets x files x predicted FPR; skipped: block reads saved "
              "against the fp 1.0 row"),
             RATE_NOTE]
    if not fx.syscalls.available:
        notes.append(f"kernel reads unavailable: {fx.syscalls.unavailable_reason}")
    else:
        off = [r["fp_chance"] for r in rows if r["read_syscalls"] != r["block_reads"]]
        notes.append("kernel reads equal the engine's block reads in every row" if not off else
                     f"kernel reads differ from block reads at fp {', '.join(map(str, off))}")
    notes += wrong_answer_notes(rows, fx)
    return {"title": f"2. Price list: {len(fx.absent):,} absent gets (inside every file's key "
                     f"range) and {len(fx.present):,} present gets per row, "
                     f"{fx.sstables} SSTables", "rows": rows, "notes": notes}


def wrong_answer_notes(rows: list[dict[str, Any]], fx: Fixture) -> list[str]:
    notes = []
    for r in rows:
        if r["absent_found"] or r["present_found"] != len(fx.present):
            notes.append(f"WRONG ANSWERS at fp {r['fp_chance']:g}: {r['absent_found']} absent keys "
                         f"found, {r['present_found']} of {len(fx.present)} present keys found")
    return notes


def print_price_list(part: dict[str, Any]) -> None:
    rows = [[f"{r['fp_chance']:g}", f"{r['bits_per_key']:.2f}",
             ",".join(map(str, r["filter_hashes"])), fmt_int(r["filter_bytes"]),
             fmt_int(r["block_reads"]), fmt_int(r["read_syscalls"]),
             f"{r['predicted_block_reads']:,.0f}", fmt_pct(r["reads_skipped"]),
             fmt_pct(r["measured_fpr"]), fmt_ci(r), fmt_predicted(r),
             fmt_rate(r["absent_gets_per_s"]), fmt_rate(r["present_gets_per_s"])]
            for r in part["rows"]]
    print_section(part["title"], ["fp chance", "bits/key", "k", "filter bytes", "block reads",
                                  "kernel reads", "predicted reads", "skipped", "measured FPR",
                                  "99% interval", "predicted FPR", "absent get/s",
                                  "present get/s"], rows, part["notes"])


# ---------------------------------------------------------------- 3. k sweep
def key_hashes(numbers: range) -> list[int]:
    """The 64-bit hash every lsmdb filter probes ``key_of(n)`` with."""
    return [key_hash(key_of(n)) for n in numbers]


def split_hashes(hashes: list[int]) -> tuple[list[int], list[int]]:
    """(h1 list, h2 list): the double-hashing halves of each 64-bit hash."""
    return [h & 0xFFFFFFFF for h in hashes], [h >> 32 for h in hashes]


def count_hits(bloom: BloomFilter, h1s: list[int], h2s: list[int]) -> int:
    probe = bloom.may_contain_hash
    return sum(1 for a, b in zip(h1s, h2s, strict=True) if probe(a, b))


def part_k_sweep(n: int, probes: int, progress: Progress) -> dict[str, Any]:
    """A standalone filter of 8 bits/key for ``n`` keys, probed with each k in K_SWEEP."""
    m = K_SWEEP_BITS_PER_KEY * n
    added = key_hashes(range(0, 2 * n, 2))           # even keys are added ...
    added_h1, added_h2 = split_hashes(added)
    probe_h1, probe_h2 = split_hashes(key_hashes(range(1, 2 * probes, 2)))  # ... odd probed
    rows = []
    with Timer() as t:
        for k in K_SWEEP:
            bloom = BloomFilter.with_size(m, k)
            for h in added:
                bloom.add_hash(h)
            false_negatives = n - count_hits(bloom, added_h1, added_h2)
            rows.append({
                "k": k, "keys": n, "bits": m, "bits_per_key": m / n,
                "fill_ratio": bloom.fill_ratio,
                "predicted_from_fill": bloom.estimated_fpr_from_fill(),
                "false_negatives": false_negatives,
                **fpr_fields(count_hits(bloom, probe_h1, probe_h2), probes, bloom.predicted_fpr()),
            })
    progress(f"k sweep: {len(K_SWEEP)} filters of {n:,} keys, {probes:,} probes each, "
             f"in {t.seconds:.1f}s")
    best_predicted = min(rows, key=lambda r: r["predicted_fpr"])["k"]
    best_measured = min(rows, key=lambda r: r["measured_fpr"])["k"]
    k_star = K_SWEEP_BITS_PER_KEY * math.log(2)
    for r in rows:
        r["side_of_optimum"] = "below" if r["k"] < k_star else "above"
    notes = [OUTSIDE_NOTE,
             (f"optimum in theory k* = {K_SWEEP_BITS_PER_KEY} ln 2 = {k_star:.2f}; lowest "
              f"predicted FPR here at k = {best_predicted}, lowest measured at "
              f"k = {best_measured}"),
             "fill^k: the rate the filter's actual bit pattern gives (fill = share of bits set)"]
    if any(r["false_negatives"] for r in rows):
        notes.append("FALSE NEGATIVES in the standalone filter: see the false_negatives column")
    return {"title": f"3. k sweep: standalone BloomFilter, {K_SWEEP_BITS_PER_KEY} bits/key, "
                     f"{n:,} keys, {probes:,} absent probes per k",
            "k_optimal_theory": k_star, "k_best_predicted": best_predicted,
            "k_best_measured": best_measured, "rows": rows, "notes": notes}


def print_k_sweep(part: dict[str, Any]) -> None:
    marks = {part["k_best_predicted"]: "predicted", part["k_best_measured"]: "measured"}
    if part["k_best_predicted"] == part["k_best_measured"]:
        marks = {part["k_best_predicted"]: "predicted + measured"}
    rows = [[str(r["k"]), f"{r['bits_per_key']:g}", f"{r['fill_ratio']:.3f}",
             fmt_int(r["false_negatives"]), fmt_int(r["false_positives"]),
             fmt_pct(r["measured_fpr"]), fmt_ci(r), fmt_predicted(r),
             fmt_pct(r["predicted_from_fill"]), f"{r['side_of_optimum']} k*",
             marks.get(r["k"], "")] for r in part["rows"]]
    print_section(part["title"], ["k", "bits/key", "fill", "false neg", "false pos",
                                  "measured FPR", "99% interval", "predicted FPR", "fill^k",
                                  "side", "lowest"], rows, part["notes"])


# --------------------------------------------------------------- 4. overfill
def part_overfill(n: int, probes: int, progress: Progress) -> dict[str, Any]:
    """A filter sized for ``n`` keys at the default fp chance, loaded with 1x, 2x, 3x n."""
    bloom = BloomFilter(n, GUARANTEE_FP_CHANCE)
    added = key_hashes(range(0, 2 * n * max(OVERFILL_LOADS), 2))
    probe_h1, probe_h2 = split_hashes(key_hashes(range(1, 2 * probes, 2)))
    rows = []
    loaded = 0
    with Timer() as t:
        for load in OVERFILL_LOADS:
            for h in added[loaded:load * n]:
                bloom.add_hash(h)
            loaded = load * n
            added_h1, added_h2 = split_hashes(added[:loaded])
            rows.append({
                "load": load, "keys": loaded, "capacity": n, "bits": bloom.m,
                "hashes": bloom.k, "bits_per_key": bloom.m / loaded,
                "fill_ratio": bloom.fill_ratio,
                "predicted_from_fill": bloom.estimated_fpr_from_fill(),
                "false_negatives": loaded - count_hits(bloom, added_h1, added_h2),
                **fpr_fields(count_hits(bloom, probe_h1, probe_h2), probes,
                             predicted_fpr_for(loaded, bloom.m, bloom.k)),
            })
    progress(f"overfill: {len(OVERFILL_LOADS)} loads, {probes:,} probes each, in {t.seconds:.1f}s")
    return {"title": f"4. Overfill: a filter sized for {n:,} keys at fp chance "
                     f"{GUARANTEE_FP_CHANCE:g} ({rows[0]['bits']:,} bits, "
                     f"k = {rows[0]['hashes']}), "
                     f"{probes:,} absent probes per row",
            "rows": rows, "notes": [OUTSIDE_NOTE]}


def print_overfill(part: dict[str, Any]) -> None:
    rows = [[f"{r['load']}x", fmt_int(r["keys"]), f"{r['bits_per_key']:.2f}",
             f"{r['fill_ratio']:.3f}", fmt_int(r["false_negatives"]),
             fmt_pct(r["measured_fpr"]), fmt_ci(r), fmt_predicted(r),
             fmt_pct(r["predicted_from_fill"])] for r in part["rows"]]
    print_section(part["title"], ["load", "keys", "bits/key", "fill", "false neg", "measured FPR",
                                  "99% interval", "predicted FPR", "fill^k"], rows, part["notes"])


# ----------------------------------------------------------- 5. absent share
def predicted_reads_per_get(share: float, files: int, fpr: float) -> float:
    """Block reads per get: an absent key pays fpr in every file; a present key one read
    plus fpr in each of the (files - 1) / 2 newer files it passes on average."""
    return share * files * fpr + (1 - share) * (1 + (files - 1) / 2 * fpr)


def absent_share_rows(fx: Fixture, layout: str) -> list[dict[str, Any]]:
    """Gets/s without a filter (fp 1.0) and with the default one, per absent share.

    The two tables are timed slice by slice in turn; the speedup is the
    median of the per-slice ratios, each measured under the same load.
    """
    queries = len(fx.absent)
    variants = (("no_filter", 1.0), ("filter", GUARANTEE_FP_CHANCE))
    rows = []
    for share in ABSENT_SHARES:
        n_absent = round(share * queries)
        keys = fx.absent[:n_absent] + fx.present[:queries - n_absent]
        random.Random(SEED + n_absent).shuffle(keys)
        names = [fx.tables[fp] for _label, fp in variants]
        shapes = [filter_shape(fx.db, name) for name in names]
        before = [table_counters(fx.db, name) for name in names]
        timings = time_gets_interleaved([fx.db.table(name).get for name in names], keys,
                                        SHARE_SLICES)
        row: dict[str, Any] = {"layout": layout, "files": shapes[0].files, "absent_share": share,
                               "gets": len(keys), "absent_gets": n_absent,
                               "expected_found": len(keys) - n_absent}
        for (label, fp), name, shape, start, timing in zip(variants, names, shapes, before,
                                                           timings, strict=True):
            reads = table_counters(fx.db, name)["block_reads"] - start["block_reads"]
            row[f"{label}_fp_chance"] = fp
            row[f"{label}_files"] = shape.files
            row[f"{label}_found"] = timing.found
            row[f"{label}_gets_per_s"] = timing.per_second
            row[f"{label}_block_reads_per_get"] = reads / len(keys)
            row[f"{label}_predicted_block_reads_per_get"] = predicted_reads_per_get(
                share, shape.files, shape.predicted_fpr)
        row["speedup"] = median_ratio(timings[1], timings[0])
        rows.append(row)
    fx.progress(f"absent shares ({layout}) done")
    return rows


def share_verdict(rows: list[dict[str, Any]]) -> str:
    """Where the filter stops paying: the absent shares at which it is slower than none."""
    layout = rows[0]["layout"]
    losing = [f"{r['absent_share']:.0%}" for r in rows if r["speedup"] < 1]
    if not losing:
        return (f"{layout}: the filter pays at every absent share measured "
                f"({rows[0]['absent_share']:.0%} to {rows[-1]['absent_share']:.0%})")
    return f"{layout}: the filter costs more than it saves at {', '.join(losing)} absent gets"


def part_absent_share(rows: list[dict[str, Any]], notes: list[str]) -> dict[str, Any]:
    layouts = list(dict.fromkeys(r["layout"] for r in rows))
    verdicts = [share_verdict([r for r in rows if r["layout"] == lay]) for lay in layouts]
    wrong = [r for r in rows if r["no_filter_found"] != r["expected_found"]
             or r["filter_found"] != r["expected_found"]]
    notes = verdicts + notes + [
        ("reads/get: data blocks read per get, measured (engine counter) / predicted "
         "(absent: files x FPR; present: 1 + (files - 1)/2 x FPR)"),
        (f"get/s: median of {SHARE_SLICES} slices, the two tables taking turns slice by slice; "
         "speedup: the median of the per-slice ratios (filter / no filter)")]
    if wrong:
        notes.append(f"WRONG ANSWERS in {len(wrong)} rows: found counts differ from expected")
    return {"title": f"5. Absent share: gets/s without a filter (fp 1.0) and with fp "
                     f"{GUARANTEE_FP_CHANCE:g}, {rows[0]['gets']:,} gets per row",
            "verdicts": verdicts, "rows": rows, "notes": notes}


def print_absent_share(part: dict[str, Any]) -> None:
    rows = [[r["layout"], str(r["files"]), f"{r['absent_share']:.0%}",
             fmt_rate(r["no_filter_gets_per_s"]), fmt_rate(r["filter_gets_per_s"]),
             fmt_ratio(r["speedup"]),
             (f"{r['no_filter_block_reads_per_get']:.3f} / "
              f"{r['no_filter_predicted_block_reads_per_get']:.3f}"),
             (f"{r['filter_block_reads_per_get']:.3f} / "
              f"{r['filter_predicted_block_reads_per_get']:.3f}")] for r in part["rows"]]
    print_section(part["title"], ["layout", "files", "absent", "no filter get/s",
                                  "filter get/s", "speedup", "reads/get no filter",
                                  "reads/get filter"], rows, part["notes"])


# ------------------------------------------------------------------- the plot
def write_plot(path: str, price: dict[str, Any]) -> None:
    """Measured vs predicted FPR, and block reads per absent get, against bits/key."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = price["rows"]
    bits = [r["bits_per_key"] for r in rows]
    fig, (ax_fpr, ax_reads) = plt.subplots(1, 2, figsize=(11, 4.5))
    curve_x = [b / 10 for b in range(1, 221)]
    curve_y = []
    for b in curve_x:
        k = max(1, round(b * math.log(2)))
        curve_y.append((1 - math.exp(-k / b)) ** k)
    ax_fpr.plot(curve_x, curve_y, color="0.6", label="predicted, optimal k: (1-e^(-k/b))^k")
    ax_fpr.scatter(bits, [r["predicted_fpr"] for r in rows], marker="x", color="C1",
                   label="predicted for the files", zorder=3)
    seen = [r for r in rows if r["false_positives"]]
    ax_fpr.errorbar([r["bits_per_key"] for r in seen], [r["measured_fpr"] for r in seen],
                    yerr=[[r["measured_fpr"] - r["ci99_low"] for r in seen],
                          [r["ci99_high"] - r["measured_fpr"] for r in seen]],
                    fmt="o", color="C0", capsize=3, label="measured, 99% interval", zorder=4)
    unseen = [r for r in rows if not r["false_positives"]]
    if unseen:
        ax_fpr.scatter([r["bits_per_key"] for r in unseen], [r["ci99_high"] for r in unseen],
                       marker="v", color="C0", zorder=4,
                       label="no false positive seen: 99% upper bound")
    ax_fpr.set_yscale("log")
    ax_fpr.set_xlabel("filter bits per key")
    ax_fpr.set_ylabel("false-positive rate")
    ax_fpr.set_title("False-positive rate")
    ax_fpr.grid(True, which="both", alpha=0.3)
    ax_fpr.legend(fontsize=8)

    ax_reads.plot(bits, [r["predicted_block_reads"] / r["absent_gets"] for r in rows],
                  marker="x", color="C1", label="predicted: files x FPR")
    # A row without a single read cannot sit on a log axis: a line of text names it.
    read_rows = [r for r in rows if r["block_reads"]]
    ax_reads.plot([r["bits_per_key"] for r in read_rows],
                  [r["block_reads"] / r["absent_gets"] for r in read_rows],
                  marker="o", linestyle="none", color="C0", label="engine block_reads")
    kernel_rows = [r for r in rows if r["read_syscalls"]]
    if kernel_rows:
        ax_reads.plot([r["bits_per_key"] for r in kernel_rows],
                      [r["read_syscalls"] / r["absent_gets"] for r in kernel_rows],
                      marker="+", markersize=12, linestyle="none", color="C2",
                      label="kernel read syscalls")
    zero = [f"{r['bits_per_key']:.1f}" for r in rows if not r["block_reads"]]
    if zero:
        ax_reads.text(0.98, 0.02, f"no block read at {', '.join(zero)} bits/key",
                      transform=ax_reads.transAxes, ha="right", va="bottom", fontsize=8)
    ax_reads.set_yscale("log")
    ax_reads.set_xlabel("filter bits per key (0 = no filter)")
    ax_reads.set_ylabel("data-block reads per absent get")
    ax_reads.set_title("Block reads per absent get")
    ax_reads.grid(True, which="both", alpha=0.3)
    ax_reads.legend(fontsize=8)
    fig.suptitle(price["title"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------- main
@dataclass
class Config:
    keys: int
    sstables: int
    queries: int
    quick: bool
    json_path: str | None
    plot_path: str | None


def positive_int(text: str) -> int:
    try:
        value = int(text.replace(",", "").replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_args(argv: Sequence[str] | None) -> Config:
    parser = argparse.ArgumentParser(
        prog="python -m bench.absent_keys",
        description="What lsmdb's Bloom filters guarantee, cost and save in a real database, "
                    "measured against the formulas that predict it.",
        epilog="example: python -m bench.absent_keys --quick --json out.json --plot out.png")
    parser.add_argument("--keys", type=positive_int, metavar="N",
                        help=f"keys in each table (default {DEFAULT_KEYS:,}; {QUICK_KEYS:,} "
                             "with --quick)")
    parser.add_argument("--sstables", type=positive_int, default=DEFAULT_SSTABLES, metavar="T",
                        help=f"SSTables the keys are spread over (default {DEFAULT_SSTABLES})")
    parser.add_argument("--queries", type=positive_int, metavar="Q",
                        help=f"absent and present gets per measurement (default "
                             f"{DEFAULT_QUERIES:,}; {QUICK_QUERIES:,} with --quick)")
    parser.add_argument("--quick", action="store_true",
                        help="a smaller run (under a minute on 2 cores)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--plot", metavar="PATH",
                        help="also draw measured vs predicted as a PNG (needs matplotlib)")
    args = parser.parse_args(argv)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error("--plot needs matplotlib, which is not installed: "
                         "pip install 'lsmdb[plot]'")
    keys = args.keys or (QUICK_KEYS if args.quick else DEFAULT_KEYS)
    if keys < 10 * args.sstables:
        parser.error(f"--keys {keys} is too few for {args.sstables} SSTables "
                     f"(need at least {10 * args.sstables})")
    queries = args.queries or (QUICK_QUERIES if args.quick else DEFAULT_QUERIES)
    return Config(keys, args.sstables, queries, args.quick, args.json, args.plot)


def run(config: Config, progress: Progress) -> dict[str, Any]:
    """Every part; returns the report (what --json writes)."""
    machine = machine_info()
    syscalls = ReadSyscalls()
    with tempfile.TemporaryDirectory(prefix="lsmdb-bench-") as path:
        tables = build_database(path, config.keys, config.sstables, progress)
        with open_db(path) as db:   # reopened: every filter read back from its file
            check_layout(db, tables, config.sstables)
            absent, present = pick_queries(db, config.keys, config.queries)
            fx = Fixture(db, config.keys, config.sstables, tables, absent, present, syscalls,
                         progress)
            guarantee = [guarantee_row(fx, f"{config.sstables} SSTables")]
            price_list = part_price_list(fx)
            shares = absent_share_rows(fx, f"{config.sstables} SSTables")
            missing = compact_tables(
                db, [tables[GUARANTEE_FP_CHANCE], tables[1.0]], progress)
            if missing is None:
                guarantee.append(guarantee_row(fx, "after full compaction"))
                shares += absent_share_rows(fx, "after full compaction")
            else:
                print(missing, file=sys.stderr)
    compaction_notes = [] if missing is None else [missing]
    filter_keys = max(1, config.keys // config.sstables)
    probes = config.queries * config.sstables
    report: dict[str, Any] = {
        "benchmark": "absent_keys",
        "config": {"keys": config.keys, "sstables": config.sstables, "queries": config.queries,
                   "quick": config.quick, "key_format": KEY_FORMAT.decode(),
                   "value_bytes": VALUE_BYTES, "seed": SEED,
                   "standalone_filter_keys": filter_keys, "standalone_probes": probes},
        "machine": machine,
        "guarantee": {
            "title": f"1. Guarantee: table with bloom_filter_fp_chance {GUARANTEE_FP_CHANCE:g}, "
                     f"{config.queries:,} absent keys inside every file's key range and "
                     f"{config.queries:,} present keys",
            "rows": guarantee,
            "notes": [OUTSIDE_NOTE, "false neg = present keys the get did not find (must be 0)"]
            + compaction_notes + [f"WRONG VALUES returned for {r['wrong_values']} present keys "
                                  f"({r['layout']})" for r in guarantee if r["wrong_values"]]},
        "price_list": price_list,
        "k_sweep": part_k_sweep(filter_keys, probes, progress),
        "overfill": part_overfill(filter_keys, probes, progress),
        "absent_share": part_absent_share(shares, compaction_notes),
    }
    report["price_list"]["syscr_available"] = syscalls.available
    report["load_average_at_end"] = load_average()
    report["seconds"] = progress.elapsed()
    return report


def print_report(report: dict[str, Any]) -> None:
    c = report["config"]
    print(f"lsmdb absent-key benchmark: {c['keys']:,} keys ({c['key_format']} % 2i, "
          f"{c['value_bytes']}-byte values) in {c['sstables']} SSTables per table, "
          f"{c['queries']:,} queries")
    print(f"machine: {describe_machine(report['machine'])}")
    print()
    print_guarantee(report["guarantee"])
    print_price_list(report["price_list"])
    print_k_sweep(report["k_sweep"])
    print_overfill(report["overfill"])
    print_absent_share(report["absent_share"])
    print(f"total {report['seconds']:.1f}s")


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    progress = Progress()
    report = run(config, progress)
    print_report(report)
    if config.json_path:
        write_json(config.json_path, report)
        progress(f"wrote {config.json_path}")
    if config.plot_path:
        write_plot(config.plot_path, report["price_list"])
        progress(f"wrote {config.plot_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
