"""lsmdb against the stores a user would pick instead, on the same keys and queries.

    python -m bench.peers [--keys N] [--stores NAME ...] [--json PATH] [--plot PATH]

Every store gets the same N keys (``b"user:%010d" % 2i``, 100-byte values)
in the same random order, written one put each (not synced) 3 times into a new
directory, the stores taking turns as below (``single_put``), then loaded 3
times into a new directory (each load alone
on the machine, the stores taking turns round by round, the order reversed
every other round; a store's load rate is the median of its rounds and its
ratio to lsmdb the median of the per-round ratios), is closed and reopened,
and then answers the same query sets: every present key, absent keys between
present ones (odd numbers: inside the key range), absent keys above the
largest key (outside it), and full ordered scans.  The reads run with every
store open, the stores taking turns: each query set in 5 slices (slice 1 of
every store, then slice 2 in reverse order, ...), the scan in 3 rounds.  A
store's rate is the median of its slices (rounds); its ratio to lsmdb the
median of the per-slice (per-round) ratios, so a slow phase of the machine
falls on every store alike.  Found counts are checked against what each query
set must find and the scan against the exact expected contents; a store that
answers wrongly is reported, not timed.

Stores: lsmdb (its defaults), sqlite3 (stdlib: WITHOUT ROWID table, blob
primary key, WAL, one transaction for the load) and, when installed with
``pip install 'lsmdb[peers]'``, LevelDB (plyvel, 10 bits/key filter), RocksDB
(rocksdict, 10 bits/key filter, options passed again at reopen) and lmdb.
A store that is not installed is skipped with a line saying so.

Between the single puts and the loads, each store with a compaction to run
(lsmdb, LevelDB, RocksDB) is loaded with N keys of its own (``zz-background:``
keys; lsmdb: another table), then takes single puts while it compacts them
(lsmdb ``db.compact``, the others ``compact_range``) on a thread, against
the same puts with none running: ``puts_during_compaction``, twice per
store, the stores taking turns.  Then the same stores, loaded again, commit
20 write batches of 5,000 updates and 1,000 deletes each, built first
(``batch_commit``: the commits' total time, twice per store).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from .common import (
    SLICES,
    Progress,
    Timer,
    describe_machine,
    fmt_rate,
    fmt_ratio,
    load_average,
    machine_info,
    median_ratio,
    per_second,
    print_section,
    time_gets_interleaved,
    write_json,
)
from .keys import KEY_FORMAT, VALUE_BYTES, key_of, value_of
from .many import CHUNK_KEYS, time_get_many
from .plot import require_matplotlib, write_peers_plot
from .stores import (
    BATCH_KEYS,
    FILTER_BITS_PER_KEY,
    STORE_NAMES,
    STORES,
    Compacting,
    LsmdbStore,
    Store,
)
from .stores import Getter as Getter  # re-exported: tests wrap a store's getter
from .stores import SqliteStore as SqliteStore  # re-exported: tests subclass it

DEFAULT_KEYS = 200_000
VALUE_SAMPLE = 1_000         # present keys whose values are compared byte for byte
SEED = 7
T = TypeVar("T")
SCAN_ROUNDS = 3              # full ordered scans per store, the stores taking turns
LOAD_ROUNDS = 3              # loads per store, the stores taking turns
COMPACTION_ROUNDS = 2        # puts during a compaction, per store, the stores taking turns
PUT_SLICE = 1_000            # single puts timed together while a compaction runs
BATCH_COMMITS = 20           # batches of updates and deletes (timed_batch_commits)
BATCH_UPDATES = 5_000
BATCH_DELETES = 1_000
BACKGROUND_KEY = b"zz-background:%010d"
WORKLOADS = ("bulk_load", "single_put", "get_present", "get_absent_in_range",
             "get_absent_out_of_range", "scan")
WORKLOAD_TITLES = {"bulk_load": "bulk load", "single_put": "single put",
                   "get_present": "get present",
                   "get_absent_in_range": "get absent in range",
                   "get_absent_out_of_range": "get absent out of range",
                   "scan": "ordered scan"}


# ----------------------------------------------------------------- workloads
class Data:
    """The keys, their load order and the query sets, the same for every store."""

    def __init__(self, keys: int) -> None:
        rng = random.Random(SEED)
        order = list(range(keys))
        rng.shuffle(order)
        self.keys = keys
        self.items = [(key_of(2 * i), value_of(2 * i)) for i in order]
        self.present = [key for key, _ in self.items]
        rng.shuffle(self.present)
        absent_in = [key_of(2 * i + 1) for i in range(keys - 1)]   # between present keys
        rng.shuffle(absent_in)
        self.absent_in_range = absent_in
        absent_out = [key_of(2 * keys + i) for i in range(keys)]   # above the largest key
        rng.shuffle(absent_out)
        self.absent_out_of_range = absent_out
        self.sample = rng.sample(range(keys), min(keys, VALUE_SAMPLE))
        #: Data of its own that a store compacts while single puts go on
        #: (timed_puts_during_compaction): keys that sort after every other.
        self.background = [(BACKGROUND_KEY % i, value_of(i)) for i in order]

    def get_sets(self) -> list[tuple[str, list[bytes], int]]:
        """(workload, keys, how many of them must be found)."""
        return [("get_present", self.present, len(self.present)),
                ("get_absent_in_range", self.absent_in_range, 0),
                ("get_absent_out_of_range", self.absent_out_of_range, 0)]


def check_values(store: Store, data: Data) -> str | None:
    """Untimed: the values of the sampled present keys, byte for byte."""
    get = store.getter()
    for i in data.sample:
        key, value = data.items[i]
        got = get(key)
        if got != value:
            return f"get({key!r}) returned {got!r:.60}, expected {value!r:.60}"
    return None


def check_scan(store: Store, data: Data) -> str | None:
    """Untimed: the full scan, item by item, against the expected sorted contents."""
    expected = iter(sorted(data.items))
    count = 0
    for key, value in store.scan():
        want = next(expected, None)
        if want is None or (bytes(key), bytes(value)) != want:
            expected_key = want[0] if want else "the end"
            return f"scan item {count} is {bytes(key)!r}, expected {expected_key!r}"
        count += 1
    if count != data.keys:
        return f"scan returned {count:,} items, expected {data.keys:,}"
    return None


def result(ops: int, seconds: float, found: int, expected: int,
           rate: float | None = None) -> dict[str, Any]:
    """One workload's entry; a wrong answer keeps its counts but loses its timing.

    ``rate`` defaults to ops / seconds; gets pass the median of their slices.
    """
    correct = found == expected
    return {"ops": ops, "seconds": seconds if correct else None,
            "ops_per_s": (per_second(ops, seconds) if rate is None else rate) if correct else None,
            "found": found, "expected_found": expected, "correct": correct,
            "error": None if correct else f"found {found:,}, expected {expected:,}"}


def mark_wrong(r: dict[str, Any], problem: str) -> None:
    r.update(correct=False, seconds=None, ops_per_s=None, error=problem)


class Running:
    """A loaded, open store and its entry of the report."""

    def __init__(self, store: Store, entry: dict[str, Any]) -> None:
        self.store = store
        self.entry = entry


def failed_entry(entry: dict[str, Any], exc: BaseException) -> str:
    """Turn entry into a skipped one for a store that raised; the reason."""
    reason = f"{entry['label']}: FAILED: {type(exc).__name__}: {exc}"
    for key in ("config", "notes", "workloads", "get_many", "puts_during_compaction",
                "batch_commit"):
        entry.pop(key, None)
    entry.update(available=False, skipped=reason, failed=True)
    return reason


def without_culprit(live: list[Running], exc: Exception, action: Callable[[Store], object],
                    progress: Progress) -> list[Running]:
    """A timed run of several stores raised: find the store that raises when
    ``action`` runs on each alone (untimed), report it as failed, and return
    the others; re-raise ``exc`` when none does (so no store is blamed blindly)."""
    for run in live:
        try:
            action(run.store)
        except Exception as own:  # noqa: BLE001 -- one store failing must not hide the others
            progress(failed_entry(run.entry, own))
            try:
                run.store.close()
            except Exception:  # noqa: BLE001, S110 -- already reported as failed
                pass
            return [r for r in live if r is not run]
    raise exc


def run_all(live: list[Running], timed: Callable[[list[Running]], T],
            action: Callable[[Store], object],
            progress: Progress) -> tuple[list[Running], T | None]:
    """``timed(live)``; when it raises, the store at fault is dropped (see
    :func:`without_culprit`) and it runs again on the others.  The stores
    still running, and the result (None when none is left)."""
    while live:
        try:
            return live, timed(live)
        except Exception as exc:  # noqa: BLE001 -- find the store that raised, go on without it
            live = without_culprit(live, exc, action, progress)
    return live, None


def timed_gets_all(live: list[Running], name: str, keys: Sequence[bytes], expected: int,
                   progress: Progress) -> list[Running]:
    """One get workload on every store, the stores taking turns slice by slice
    (:func:`bench.common.time_gets_interleaved`); each store's rate is the
    median of its slices and its ratio to lsmdb the median of the per-slice
    ratios.  Returns the stores still running."""
    live, timings = run_all(
        live, lambda runs: time_gets_interleaved([run.store.getter() for run in runs], keys),
        lambda store: [store.getter()(k) for k in keys], progress)
    if timings is None:
        return live
    base = next((t for run, t in zip(live, timings, strict=True)
                 if run.store.name == "lsmdb"), None)
    for run, timing in zip(live, timings, strict=True):
        r = result(timing.gets, timing.seconds, timing.found, expected, timing.per_second)
        r["slice_rates"] = timing.slice_rates
        if base is not None and r["correct"] and base.found == expected:
            r["ratio_to_lsmdb"] = median_ratio(timing, base)
        run.entry["workloads"][name] = r
        progress(f"{run.entry['label']}: {WORKLOAD_TITLES[name]}: "
                 f"{fmt_rate(timing.per_second)} ops/s")
    return live


def scan_once(store: Store) -> tuple[int, float]:
    count = 0
    with Timer() as t:
        for _ in store.scan():
            count += 1
    return count, t.seconds


def scan_rounds(live: list[Running]) -> list[list[tuple[int, float]]]:
    """Per store, (items, seconds) of SCAN_ROUNDS full scans, the stores taking turns."""
    rounds: list[list[tuple[int, float]]] = [[] for _ in live]
    for turn in range(SCAN_ROUNDS):
        order = list(enumerate(live))
        for i, run in (order if turn % 2 == 0 else order[::-1]):
            rounds[i].append(scan_once(run.store))
    return rounds


def timed_scans_all(live: list[Running], keys: int, progress: Progress) -> list[Running]:
    """SCAN_ROUNDS full ordered scans of every store, the stores taking turns
    (A B, B A, ...); rate and ratio to lsmdb are medians over the rounds."""
    live, rounds = run_all(live, scan_rounds, scan_once, progress)
    if rounds is None:
        return live
    rates = [[per_second(count, seconds) for count, seconds in rs] for rs in rounds]
    base = next((i for i, run in enumerate(live) if run.store.name == "lsmdb"), None)
    base_ok = base is not None and all(c == keys for c, _ in rounds[base])
    for i, run in enumerate(live):
        found = next((c for c, _ in rounds[i] if c != keys), keys)
        r = result(found, sum(sec for _, sec in rounds[i]), found, keys,
                   statistics.median(rates[i]))
        r["round_rates"] = rates[i]
        if base is not None and base_ok and r["correct"]:
            r["ratio_to_lsmdb"] = statistics.median(
                a / b for a, b in zip(rates[i], rates[base], strict=True))
        run.entry["workloads"]["scan"] = r
        progress(f"{run.entry['label']}: ordered scan: {fmt_rate(r['ops_per_s'])} items/s")
    return live


def bench_stores(classes: Sequence[type[Store]], data: Data,
                 progress: Progress) -> list[dict[str, Any]]:
    """Every store's entry of the report, in the order given.

    Each store is loaded (timed_loads), closed and reopened; then every store
    stays open while each read workload runs on all of them, the stores taking
    turns slice by slice, so that a slow phase of the (shared) machine falls
    on every store's slice rather than on one store's whole row.  Then,
    untimed: values and the full scan are checked, lsmdb's get_many is timed
    against its get, and the stores are closed (and RocksDB's filter
    checked).  A store that raises is reported as failed and the others go on.
    """
    entries: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as root:
        pending: list[tuple[type[Store], dict[str, Any]]] = []
        for cls in classes:
            reason = cls.missing()
            if reason is not None:
                progress(reason)
                entries.append({"store": cls.name, "label": cls.label, "available": False,
                                "skipped": reason})
                continue
            entry: dict[str, Any] = {"store": cls.name, "label": cls.label, "available": True,
                                     "skipped": None, "notes": [], "workloads": {}}
            entries.append(entry)
            pending.append((cls, entry))
        timed_single_puts(pending, data, root, progress)
        timed_puts_during_compaction(pending, data, root, progress)
        timed_batch_commits(pending, data, root, progress)
        live = timed_loads(pending, data, root, progress)
        try:
            for name, keys, expected in data.get_sets():
                live = timed_gets_all(live, name, keys, expected, progress)
            live = timed_scans_all(live, data.keys, progress)
            for run in live:
                try:
                    finish(run, data)
                except Exception as exc:  # noqa: BLE001 -- reported, the others go on
                    progress(failed_entry(run.entry, exc))
        finally:
            for run in live:
                try:
                    run.store.close()
                except Exception as exc:  # noqa: BLE001 -- reported, the others go on
                    if run.entry["available"]:
                        progress(failed_entry(run.entry, exc))
        for run in live:
            if run.entry["available"]:
                try:
                    check = run.store.check(data.absent_in_range)
                except Exception as exc:  # noqa: BLE001 -- reported, the others go on
                    progress(failed_entry(run.entry, exc))
                    continue
                if check:
                    run.entry["notes"].append(check)
    return entries


def rounds_result(data: Data, seconds: dict[str, list[float]], name: str) -> dict[str, Any]:
    """A timed-rounds workload's entry for store ``name``: the median of its
    rounds, all of them (``round_seconds``), and the median of the per-round
    ratios of lsmdb's time to its own."""
    secs, base = seconds[name], seconds.get("lsmdb", [])
    r = result(data.keys, statistics.median(secs), data.keys, data.keys)
    r["round_seconds"] = secs
    if len(base) == len(secs):
        r["ratio_to_lsmdb"] = statistics.median(b / t for b, t in zip(base, secs, strict=True))
    return r


def timed_single_puts(pending: Sequence[tuple[type[Store], dict[str, Any]]], data: Data,
                      root: str, progress: Progress, rounds: int = LOAD_ROUNDS) -> None:
    """Every store writes the keys in their random order, one put each (not
    synced), into a new directory, ``rounds`` times, the stores taking turns
    as in :func:`timed_loads`; its ``single_put`` is the median of its rounds,
    its ``ratio_to_lsmdb`` the median of the per-round ratios.  The copies are
    deleted; what they hold is checked by the loads' reads, not here."""
    seconds: dict[str, list[float]] = {cls.name: [] for cls, _ in pending}
    for r, cls, entry in taking_turns(pending, rounds):
        path, store = new_store(cls, root, f"puts{r}", data)
        try:
            start = time.perf_counter()
            store.put_each(data.items)
            seconds[cls.name].append(time.perf_counter() - start)
        except Exception as exc:  # noqa: BLE001 -- one store failing must not hide the others
            progress(failed_entry(entry, exc))
        finally:
            shutil.rmtree(path, ignore_errors=True)
        if seconds[cls.name]:
            progress(f"{cls.label}: {data.keys:,} single puts in {seconds[cls.name][-1]:.1f}s "
                     f"(round {r + 1} of {rounds})")
    for cls, entry in pending:
        if entry["available"] and seconds[cls.name]:
            entry["workloads"]["single_put"] = rounds_result(data, seconds, cls.name)


def taking_turns(pending: Sequence[tuple[type[Store], dict[str, Any]]], rounds: int
                 ) -> Iterator[tuple[int, type[Store], dict[str, Any]]]:
    """(round, store class, entry) of every store still available, ``rounds``
    times, the order reversed every other round."""
    for r in range(rounds):
        order = [p for p in pending if p[1]["available"]]
        for cls, entry in order if r % 2 == 0 else order[::-1]:
            yield r, cls, entry


def new_store(cls: type[Store], root: str, name: str, data: Data) -> tuple[str, Store]:
    """A store of ``cls`` over a new directory ``root/<store>.<name>``."""
    path = os.path.join(root, f"{cls.name}.{name}")
    os.mkdir(path)
    return path, cls(path, data.keys)


def puts_during_compaction(c: Compacting, items: Sequence[tuple[bytes, bytes]]
                           ) -> dict[str, Any]:
    """Single puts of ``items`` before, during and after ``c.compact()``
    (run on a thread): the rates (puts/s) idle (before and after, together)
    and during (slices of PUT_SLICE puts that ended before the compaction
    did), and the compaction's seconds.  Keys: a quarter of ``items`` idle
    before, the same ones after, the rest during (again from their start if
    the compaction outlasts them)."""
    quarter = max(1, len(items) // 4)
    idle_items, during_items = items[:quarter], items[quarter:] or items
    put = c.put

    def timed(part: Sequence[tuple[bytes, bytes]]) -> float:
        start = time.perf_counter()
        for key, value in part:
            put(key, value)
        return time.perf_counter() - start

    before = timed(idle_items)
    done = threading.Event()
    took: list[float] = []

    def compact() -> None:
        start = time.perf_counter()
        try:
            c.compact()
        finally:
            took.append(time.perf_counter() - start)
            done.set()

    thread = threading.Thread(target=compact, name="bench-compaction")
    thread.start()
    puts, seconds, at = 0, 0.0, 0
    try:
        while not done.is_set():
            part = during_items[at:at + PUT_SLICE]
            at = at + PUT_SLICE if at + PUT_SLICE < len(during_items) else 0
            spent = timed(part)
            if not done.is_set():
                puts += len(part)
                seconds += spent
    finally:
        thread.join()
    after = timed(idle_items)
    idle = 2 * len(idle_items) / (before + after)
    during = puts / seconds if puts else None   # None: over before a slice ended
    return {"idle_ops_per_s": idle, "during_ops_per_s": during,
            "ratio_to_idle": during / idle if during else None,
            "compaction_seconds": took[0], "during_puts": puts}


def timed_puts_during_compaction(pending: Sequence[tuple[type[Store], dict[str, Any]]],
                                 data: Data, root: str, progress: Progress,
                                 rounds: int = COMPACTION_ROUNDS) -> None:
    """For each store with a compaction to run (lsmdb, LevelDB, RocksDB):
    ``data.background`` loaded into a new directory, then single puts of the
    keys while a compaction of the background data runs, against the same
    puts with none running (:func:`puts_during_compaction`), ``rounds``
    times, the stores taking turns.  The store's ``puts_during_compaction``:
    the median of its rounds' ratios and rates."""
    results: dict[str, list[dict[str, Any]]] = {cls.name: [] for cls, _ in pending}
    for r, cls, entry in taking_turns(pending, rounds):
        path, store = new_store(cls, root, f"compacting{r}", data)
        try:
            c = store.compacting(data.background)
            if c is None:
                continue
            try:
                results[cls.name].append(puts_during_compaction(c, data.items))
            finally:
                c.close()
        except Exception as exc:  # noqa: BLE001 -- one store failing must not hide the others
            progress(failed_entry(entry, exc))
            continue
        finally:
            shutil.rmtree(path, ignore_errors=True)
        last = results[cls.name][-1]
        progress(f"{cls.label}: puts during a compaction of {last['compaction_seconds']:.1f}s"
                 f" at {fmt_ratio(last['ratio_to_idle'])} of idle (round {r + 1} of {rounds})")
    for cls, entry in pending:
        got = results[cls.name]
        if entry["available"] and got:
            summary: dict[str, Any] = {}
            for name in got[0]:
                values = [g[name] for g in got if g[name] is not None]
                summary[name] = statistics.median(values) if values else None
            summary["rounds"] = got
            entry["puts_during_compaction"] = summary


def commit_workload(data: Data) -> list[list[tuple[bytes, bytes | None]]]:
    """BATCH_COMMITS batches of BATCH_UPDATES updates and BATCH_DELETES deletes
    of loaded keys, mixed in each batch (the same for every store)."""
    rng = random.Random(SEED + 1)
    keys = [key for key, _ in data.items]
    out: list[list[tuple[bytes, bytes | None]]] = []
    for b in range(BATCH_COMMITS):
        ops: list[tuple[bytes, bytes | None]] = [
            (key, b"%d-" % b + value[3:]) for key, value in
            (data.items[rng.randrange(len(keys))] for _ in range(BATCH_UPDATES))]
        ops += [(keys[rng.randrange(len(keys))], None) for _ in range(BATCH_DELETES)]
        rng.shuffle(ops)
        out.append(ops)
    return out


def timed_batch_commits(pending: Sequence[tuple[type[Store], dict[str, Any]]], data: Data,
                        root: str, progress: Progress, rounds: int = COMPACTION_ROUNDS) -> None:
    """For each store with write batches (lsmdb, LevelDB, RocksDB): the keys
    loaded (untimed), reopened, :func:`commit_workload`'s batches built, then
    committed, the commits timed in total (flushes they set off included), ``rounds``
    times, the stores taking turns.  ``batch_commit``: ops/s, the median of the
    rounds, and ``lsmdb_over_store``, the median of the per-round ratios."""
    batches = commit_workload(data)
    ops = sum(map(len, batches))
    expected: dict[bytes, bytes | None] = dict(data.items[i] for i in data.sample)
    for batch in batches:
        for key, value in batch:
            if key in expected:
                expected[key] = value
    seconds: dict[str, list[float]] = {cls.name: [] for cls, _ in pending}
    wrong: dict[str, str] = {}
    for r, cls, entry in taking_turns(pending, rounds):
        path, store = new_store(cls, root, f"batches{r}", data)
        try:
            store.load(data.items)
            took = store.commit_batches(batches)
            if took is None:
                continue
            seconds[cls.name].append(took)
            store.open()   # untimed: the sampled keys read back as the batches left them
            try:
                get = store.getter()
                bad = [k for k, v in expected.items() if get(k) != v]
            finally:
                store.close()
            if bad:
                wrong[cls.name] = (f"{len(bad)} of {len(expected)} sampled keys wrong, "
                                   f"e.g. {bad[0]!r}")
        except Exception as exc:  # noqa: BLE001 -- one store failing must not hide the others
            progress(failed_entry(entry, exc))
        finally:
            shutil.rmtree(path, ignore_errors=True)
    base = seconds.get("lsmdb", [])
    for cls, entry in pending:
        got = seconds[cls.name]
        if entry["available"] and cls.name in wrong:
            entry["notes"].append(f"{entry['label']}: WRONG ANSWER after the batch commits: "
                                  f"{wrong[cls.name]} (not timed)")
        elif entry["available"] and got:
            entry["batch_commit"] = {
                "ops": ops, "ops_per_s": ops / statistics.median(got), "round_seconds": got,
                "lsmdb_over_store": statistics.median(t / b for b, t in zip(base, got,
                                                                            strict=True))
                if len(base) == len(got) else None}
            progress(f"{cls.label}: {len(batches)} batch commits of {ops // len(batches):,} "
                     f"ops at {entry['batch_commit']['ops_per_s'] / 1e3:,.0f}k ops/s")


def timed_loads(pending: Sequence[tuple[type[Store], dict[str, Any]]], data: Data, root: str,
                progress: Progress, rounds: int = LOAD_ROUNDS) -> list[Running]:
    """Load each store ``rounds`` times, each time into a new directory under
    ``root``, the stores taking turns (one store at a time; the order reversed
    every other round) so that a slow phase of the machine falls on every
    store's load rather than on one store's.  A store's ``bulk_load`` is the
    median of its rounds (``round_seconds`` holds them all); its
    ``ratio_to_lsmdb`` the median of the per-round ratios of lsmdb's time to
    its own.  Each copy but the last round's is deleted; the last is reopened
    and returned, ready for the reads.  A store that raises is reported as
    failed and leaves the rounds."""
    stores: dict[str, Store] = {}
    seconds: dict[str, list[float]] = {cls.name: [] for cls, _ in pending}
    for r, cls, entry in taking_turns(pending, rounds):
        path, store = new_store(cls, root, str(r), data)
        try:
            if "config" not in entry:
                entry["config"] = store.describe()
            start = time.perf_counter()
            store.load(data.items)
            load_seconds = time.perf_counter() - start
        except Exception as exc:  # noqa: BLE001 -- one store failing must not hide the others
            progress(failed_entry(entry, exc))
            shutil.rmtree(path, ignore_errors=True)
            continue
        progress(f"{cls.label}: loaded {data.keys:,} keys in {load_seconds:.1f}s "
                 f"(round {r + 1} of {rounds})")
        seconds[cls.name].append(load_seconds)
        if r == rounds - 1:
            stores[cls.name] = store
        else:
            shutil.rmtree(path)
    live: list[Running] = []
    for cls, entry in pending:
        if not entry["available"]:
            continue
        entry["workloads"]["bulk_load"] = rounds_result(data, seconds, cls.name)
        try:
            stores[cls.name].open()
        except Exception as exc:  # noqa: BLE001 -- one store failing must not hide the others
            progress(failed_entry(entry, exc))
            continue
        live.append(Running(stores[cls.name], entry))
    return live


def finish(run: Running, data: Data) -> None:
    """Untimed checks of one store (values, the full scan) and, for lsmdb,
    get_many against its get; wrong answers mark the workloads they affect."""
    store, entry = run.store, run.entry
    workloads = entry["workloads"]
    bad_values = check_values(store, data)
    bad_scan = check_scan(store, data)
    if isinstance(store, LsmdbStore):
        entry["notes"].append(f"lsmdb: {store.files()} SSTables after reopen")
        entry["get_many"] = {name: time_get_many(store.db, keys, expected)
                             for name, keys, expected in data.get_sets()}
    if bad_values:
        mark_wrong(workloads["get_present"], bad_values)
    if bad_scan:
        mark_wrong(workloads["scan"], bad_scan)
    if bad_values or bad_scan:  # the load is only as right as what reads back
        mark_wrong(workloads["bulk_load"], "the contents read back are wrong")
    for name in WORKLOADS:
        r = workloads[name]
        if not r["correct"]:
            r.pop("ratio_to_lsmdb", None)
            entry["notes"].append(f"{entry['label']}: WRONG ANSWER in {WORKLOAD_TITLES[name]}: "
                                  f"{r['error']} (not timed)")
    entry["workloads"] = {name: workloads[name] for name in WORKLOADS}


def bench_store(cls: type[Store], data: Data, progress: Progress) -> dict[str, Any]:
    """One store alone: its entry of the report (see :func:`bench_stores`)."""
    return bench_stores([cls], data, progress)[0]


def add_ratios(entries: list[dict[str, Any]]) -> None:
    """Each store's ratio to lsmdb per workload: for the reads, the median of
    the per-slice (per-round) ratios set when they ran; for the load, and
    wherever no paired ratio was set, ops/s over lsmdb's ops/s (None when
    either is missing or wrong)."""
    base = next((e for e in entries if e["store"] == "lsmdb" and e["available"]), None)
    for e in entries:
        for name, r in e.get("workloads", {}).items():
            ref = base["workloads"][name]["ops_per_s"] if base else None
            if r["ops_per_s"] and ref:
                r.setdefault("ratio_to_lsmdb", 1.0 if e is base else r["ops_per_s"] / ref)
            else:
                r["ratio_to_lsmdb"] = None
            ratio = r["ratio_to_lsmdb"]
            r["lsmdb_over_store"] = 1.0 / ratio if ratio else None


def print_report(report: dict[str, Any]) -> None:
    c = report["config"]
    print(f"lsmdb vs peers: {c['keys']:,} keys ({c['key_format']} % 2i, {c['value_bytes']}-byte "
          f"values, loaded in random order), each store closed and reopened before reads")
    print(f"machine: {describe_machine(report['machine'])}")
    print()
    ran = [e for e in report["stores"] if e["available"]]
    headers = ["store"] + [WORKLOAD_TITLES[w] for w in WORKLOADS]

    def cell(r: dict[str, Any], key: str, fmt: Callable[[float | None], str]) -> str:
        return fmt(r[key]) if r["correct"] else "WRONG"

    print_section(f"ops/s (gets: median rate of {SLICES} slices of the loop, scan: items/s, "
                  f"median of {SCAN_ROUNDS} rounds, the stores taking turns; load: keys/s until "
                  f"closed, median of {LOAD_ROUNDS} rounds, the stores taking turns, each alone "
                  "on the machine)", headers,
                  [[e["label"]] + [cell(e["workloads"][w], "ops_per_s", fmt_rate)
                                   for w in WORKLOADS] for e in ran])
    print_section("lsmdb's rate over the store's (above 1: lsmdb faster; the README's "
                  "convention; the inverse of the median of the per-slice (reads) or per-round "
                  "(loads, puts, scan) ratios of the store's rate to lsmdb's)", headers,
                  [[e["label"]] + [cell(e["workloads"][w], "lsmdb_over_store", fmt_ratio)
                                   for w in WORKLOADS] for e in ran])
    if ran:
        print("operations per workload: " + ", ".join(
            f"{WORKLOAD_TITLES[w]} {r['ops']:,}" for w, r in ran[0]["workloads"].items()))
    for e in report["stores"]:
        if e["available"]:
            print(f"  {e['config']}")
        else:
            print(f"  {e['skipped']}")
    for e in ran:
        for note in e["notes"]:
            print(f"  {note}")
    during = [e for e in ran if "puts_during_compaction" in e]
    if during:
        print_section(f"single puts while the store compacts {report['config']['keys']:,} "
                      "keys of its own (lsmdb: db.compact of another table; LevelDB, RocksDB: "
                      f"compact_range of their key range), median of {COMPACTION_ROUNDS} rounds",
                      ["store", "idle puts/s", "puts/s during", "during / idle",
                       "compaction s"],
                      [[e["label"], fmt_rate(d["idle_ops_per_s"]),
                        fmt_rate(d["during_ops_per_s"]), fmt_ratio(d["ratio_to_idle"]),
                        f"{d['compaction_seconds']:.2f}"]
                       for e in during for d in [e["puts_during_compaction"]]])
    commits = [e for e in ran if "batch_commit" in e]
    if commits:
        print_section(f"batch commits: {BATCH_COMMITS} batches of {BATCH_UPDATES:,} updates and "
                      f"{BATCH_DELETES:,} deletes of loaded keys, built first, the commits' "
                      "total time, median of "
                      f"{COMPACTION_ROUNDS} rounds", ["store", "ops/s", "lsmdb's rate over it"],
                      [[e["label"], fmt_rate(e["batch_commit"]["ops_per_s"]),
                        fmt_ratio(e["batch_commit"]["lsmdb_over_store"])] for e in commits])
    many = next((e["get_many"] for e in ran if "get_many" in e), None)
    if many:
        print_section(f"lsmdb get_many (chunks of {CHUNK_KEYS:,} keys) against a loop of get, "
                      "same keys, slices interleaved; keys/s", ["query set", "loop of get",
                                                                "get_many", "ratio", "answers"],
                      [[WORKLOAD_TITLES[name], fmt_rate(r["loop_ops_per_s"]),
                        fmt_rate(r["many_ops_per_s"]), fmt_ratio(r["ratio"]),
                        "right" if r["correct"] else "WRONG"] for name, r in many.items()])
    print()
    print(f"total {report['seconds']:.1f}s")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers",
        description="lsmdb against sqlite3, LevelDB, RocksDB and lmdb on the same keys and "
                    "queries (optional peers: pip install 'lsmdb[peers]').",
        epilog="example: python -m bench.peers --keys 200000 --stores lsmdb sqlite3 leveldb")
    parser.add_argument("--keys", type=int, default=DEFAULT_KEYS, metavar="N",
                        help=f"keys loaded into every store (default {DEFAULT_KEYS:,})")
    parser.add_argument("--stores", nargs="+", choices=STORE_NAMES, default=list(STORE_NAMES),
                        metavar="NAME",
                        help=f"stores to run, from {', '.join(STORE_NAMES)} (default: all); "
                             "ratios are to lsmdb, so it runs whenever it is listed")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--plot", metavar="PATH",
                        help="also draw lsmdb's rate over each peer's as grouped bars, a PNG "
                             "(needs matplotlib: pip install 'lsmdb[plot]')")
    args = parser.parse_args(argv)
    if args.plot:
        require_matplotlib(parser)
    if args.keys < 2:
        parser.error("--keys must be at least 2")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    progress = Progress()
    machine = machine_info()
    data = Data(args.keys)
    entries = bench_stores([cls for cls in STORES if cls.name in args.stores], data, progress)
    failed = any(e.pop("failed", False) for e in entries)
    add_ratios(entries)
    report = {
        "benchmark": "peers",
        "config": {"keys": args.keys, "stores": args.stores, "key_format": KEY_FORMAT.decode(),
                   "value_bytes": VALUE_BYTES, "batch_keys": BATCH_KEYS,
                   "filter_bits_per_key": FILTER_BITS_PER_KEY, "seed": SEED},
        "machine": machine,
        "load_average_at_end": load_average(),
        "stores": entries,
        "seconds": progress.elapsed(),
        "workload_titles": WORKLOAD_TITLES,
    }
    print_report(report)
    if args.json:
        write_json(args.json, report)
        progress(f"wrote {args.json}")
    if args.plot:
        write_peers_plot(args.plot, report)
        progress(f"wrote {args.plot}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
