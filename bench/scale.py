"""Gets at two sizes, timed side by side: absent keys, then present ones.

    python -m bench.scale [--small N] [--large N] [--queries Q] [--compaction NAME ...]
                          [--peers NAME ...]
    python -m bench.scale --sizes N [N ...] [--queries Q] [--json PATH] [--plot PATH]
                          [--filter-family NAME]

(The second form: bench/scale_ladder.py.)

For each compaction strategy (default: size_tiered, the default, then
leveled), loads two lsmdb databases the way ``bench.peers`` does (keys
``b"user:%010d" % 2i`` in random order, 100-byte values, batches of 10,000,
filter fp chance 0.01, waiting for compactions), closes and reopens both,
then times Q absent gets inside each key range (odd numbers), the two
databases taking turns slice by slice so both meet the same background load.
Reports each rate, the files each database has (and their levels), and the
median over slices of small-rate / large-rate: how much slower an absent get
is at the larger size.  Beside each rate, from the files' own counters over
the timed gets: the filters each get probed, the files it skipped by their
key range and the data blocks it read (false positives), and the filters'
bytes in all -- whether a key meets more filters at the larger size, or the
same number of larger ones.  Then, the same way, Q/4 gets of present keys
(even numbers): at 2,000,000 keys the data outgrows the 32 MiB block cache,
so most of them read a block from disk.

Size-tiered compaction leaves files that each span the whole key range, so
every file costs a filter probe (and 1% of the time a block read) per absent
key, and how many files a load leaves (1 to 6 at 2,000,000 keys) depends on
where the tiers stand.  Leveled compaction keeps one file per level in the
way of a key, plus the level-0 files.

Then the same test for each peer store installed (default: every one
``bench.peers`` knows but lsmdb; ``--peers`` alone for none): loaded with
the same keys in the same order through its ``bench.stores`` adapter,
reopened, and given until its directory has not changed for
``SETTLE_QUIET_SECONDS`` (at most ``SETTLE_MAX_SECONDS``) to finish its
background compactions before the timed gets.  It shows what the same
growth costs the stores a user would pick instead, on the same machine.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import lsmdb

from . import scale_ladder
from .common import (
    SLICES,
    DeviceReads,
    Progress,
    Timer,
    describe_machine,
    machine_info,
    per_second,
    write_json,
)
from .keys import key_of, value_of
from .plot import require_matplotlib
from .stores import BATCH_KEYS, STORES, Store

PEERS = tuple(s for s in STORES if s.name != "lsmdb")
PEER_NAMES = tuple(s.name for s in PEERS)
#: A peer's load is settled when its directory has not changed for this long.
SETTLE_QUIET_SECONDS = 2.0
SETTLE_MAX_SECONDS = 120.0

FP_CHANCE = 0.01
STRATEGIES = ("size_tiered", "leveled")


def load(path: str, n: int, seed: int, compaction: str = "size_tiered") -> None:
    order = list(range(n))
    random.Random(seed).shuffle(order)
    db = lsmdb.open(path)
    try:
        db.alter_table("default", compaction=compaction, bloom_filter_fp_chance=FP_CHANCE)
        for start in range(0, n, BATCH_KEYS):
            with db.batch() as batch:
                for i in order[start:start + BATCH_KEYS]:
                    batch.put(key_of(2 * i), value_of(2 * i))
        db.wait_for_compactions()
    finally:
        db.close()


class Items(Sequence[tuple[bytes, bytes]]):
    """The (key, value) pairs ``load`` writes, in its order, made as they are read
    (2,000,000 of them built up front would take about half a gigabyte)."""

    def __init__(self, n: int, seed: int) -> None:
        self.order = list(range(n))
        random.Random(seed).shuffle(self.order)

    def __len__(self) -> int:
        return len(self.order)

    @overload
    def __getitem__(self, i: int) -> tuple[bytes, bytes]: ...

    @overload
    def __getitem__(self, i: slice) -> list[tuple[bytes, bytes]]: ...

    def __getitem__(self, i: int | slice) -> tuple[bytes, bytes] | list[tuple[bytes, bytes]]:
        if isinstance(i, slice):
            return [(key_of(2 * j), value_of(2 * j)) for j in self.order[i]]
        j = self.order[i]
        return key_of(2 * j), value_of(2 * j)

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        for j in self.order:
            yield key_of(2 * j), value_of(2 * j)


#: Present gets are timed over queries // PRESENT_SHARE keys.
PRESENT_SHARE = 4


def absent_keys(n: int, q: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [key_of(2 * rng.randrange(n - 1) + 1) for _ in range(q)]


def present_keys(n: int, q: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [key_of(2 * rng.randrange(n)) for _ in range(q)]


def timed(sizes: Sequence[int], getters: Sequence[Callable[[bytes], Any]],
          queries: Sequence[Sequence[bytes]], slices: int = SLICES,
          present: bool = False, device: list[int | None] | None = None) -> list[list[float]]:
    """Per database, the rate of each slice; databases take turns (A B, B A, ...).
    Every key must be absent (or, with ``present``, found).  ``device``, one
    item per database: set to the bytes the process read from the storage
    device during that database's slices (None where that is not measured)."""
    reads = DeviceReads()
    if device is not None:
        device[:] = [0 if reads.available else None for _ in getters]
    rates: list[list[float]] = [[] for _ in getters]
    q = len(queries[0])
    cuts = [q * i // slices for i in range(slices + 1)]
    for s in range(slices):
        order = list(range(len(getters)))
        for d in (order if s % 2 == 0 else order[::-1]):
            get = getters[d]
            part = queries[d][cuts[s]:cuts[s + 1]]
            found = 0
            before = reads.snapshot() if device is not None else None
            with Timer() as t:
                for key in part:
                    if get(key) is not None:
                        found += 1
            so_far = device[d] if device is not None else None
            if device is not None and so_far is not None:
                device[d] = so_far + (reads.delta(before) or 0)
            if found != (len(part) if present else 0):
                raise AssertionError(f"{found} of {len(part)} {'present' if present else 'absent'}"
                                     f" keys found at {sizes[d]:,} keys")
            rates[d].append(per_second(len(part), t.seconds))
    return rates


def small_over_large(rates: Sequence[Sequence[float]]) -> float:
    """The median over slices of the smaller database's rate over the larger one's
    (``timed``'s rates of the two sizes)."""
    return statistics.median(a / b for a, b in zip(rates[0], rates[1], strict=True))


def per_key(totals: Sequence[int | None], gets: int) -> list[float | None]:
    """Each database's total (``timed``'s ``device``) per get; None stays None."""
    return [None if t is None else t / gets for t in totals]


def device_note(per_get: Sequence[float | None]) -> str:
    """How much the timed gets read from the storage device, per get, for each size."""
    if any(x is None for x in per_get):
        return "device reads not measured (no /proc/self/io read_bytes here)"
    return "from the device: " + ", ".join(f"{x:,.1f}" for x in per_get if x is not None) \
        + " bytes a get"


#: The per-file counters summed over a database's SSTables (``SSTableInfo`` fields).
COUNTERS = ("range_skips", "filter_negatives", "true_positives", "false_positives",
            "block_reads", "block_cache_hits")


def counters(db: Any) -> dict[str, int]:
    """Each of ``COUNTERS`` summed over the database's SSTables."""
    infos = db.sstables()
    return {c: sum(getattr(i, c) for i in infos) for c in COUNTERS}


def per_get(before: dict[str, int], after: dict[str, int], gets: int) -> dict[str, float]:
    """What the gets between two ``counters`` readings did, per get: filters probed
    (a "no" or a "maybe"), files skipped by key range, blocks read from disk or the
    block cache."""
    d = {c: after[c] - before[c] for c in COUNTERS}
    return {"filters_probed": (d["filter_negatives"] + d["true_positives"]
                               + d["false_positives"]) / gets,
            "range_skips": d["range_skips"] / gets,
            "block_reads": d["block_reads"] / gets,
            "block_cache_hits": d["block_cache_hits"] / gets}


def describe_files(infos: Sequence[Any]) -> str:
    """How many SSTables (``db.sstables()``), and how many in each level: "112 SSTables
    (L0 3, L1 10, L2 99)"."""
    per_level = Counter(i.level for i in infos)
    levels = ", ".join(f"L{level} {per_level[level]}" for level in sorted(per_level))
    return f"{len(infos)} SSTables ({levels or 'none'})"


def run_strategy(compaction: str, sizes: Sequence[int], queries: int,
                 progress: Progress) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as root:
        paths = [f"{root}/db{n}" for n in sizes]
        for path, n in zip(paths, sizes, strict=True):
            load(path, n, seed=n, compaction=compaction)
            progress(f"{compaction}: loaded {n:,} keys")
        dbs = [lsmdb.open(p) for p in paths]
        try:
            infos = [db.sstables() for db in dbs]
            files = [len(i) for i in infos]
            layout = [describe_files(i) for i in infos]
            filter_bytes = [sum(f.filter_bytes for f in i) for i in infos]
            qs = [absent_keys(n, queries, seed=n + 1) for n in sizes]
            before = [counters(db) for db in dbs]
            device: list[int | None] = []
            rates = timed(sizes, [db.get for db in dbs], qs, device=device)
            work = [per_get(b, counters(db), queries) for b, db in zip(before, dbs, strict=True)]
            pq = queries // PRESENT_SHARE
            ps = [present_keys(n, pq, seed=n + 2) for n in sizes]
            before = [counters(db) for db in dbs]
            present_device: list[int | None] = []
            present = timed(sizes, [db.get for db in dbs], ps, present=True,
                            device=present_device)
            present_work = [per_get(b, counters(db), pq)
                            for b, db in zip(before, dbs, strict=True)]
        finally:
            for db in dbs:
                db.close()
    ratio = small_over_large(rates)
    return {"compaction": compaction, "files": files, "layout": layout,
            "filter_bytes": filter_bytes, "per_get": work,
            "absent_in_range_per_s": [statistics.median(r) for r in rates],
            "slice_rates": rates, "small_over_large": ratio,
            "device_bytes_per_get": per_key(device, queries),
            "present_per_s": [statistics.median(r) for r in present],
            "present_slice_rates": present, "present_per_get": present_work,
            "present_device_bytes_per_get": per_key(present_device, pq),
            "present_small_over_large": small_over_large(present)}


def directory_state(path: str) -> list[tuple[str, int]]:
    out = []
    for root, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            try:
                out.append((full, os.path.getsize(full)))
            except OSError:  # removed while listed: the store is still at work
                out.append((full, -1))
    return sorted(out)


def settle(path: str, quiet: float = SETTLE_QUIET_SECONDS,
           limit: float = SETTLE_MAX_SECONDS) -> float:
    """Wait until the files under path have not changed for ``quiet`` seconds (a
    store's background compactions done), at most ``limit``; the seconds waited."""
    start = time.monotonic()
    last, since = directory_state(path), start
    while time.monotonic() - since < quiet and time.monotonic() - start < limit:
        time.sleep(0.25)
        now = directory_state(path)
        if now != last:
            last, since = now, time.monotonic()
    return time.monotonic() - start


def run_peer(cls: type[Store], sizes: Sequence[int], queries: int,
             progress: Progress) -> dict[str, Any]:
    """The test for one peer store: both sizes loaded as lsmdb's, reopened, settled."""
    entry: dict[str, Any] = {"store": cls.name, "label": cls.label}
    reason = cls.missing()
    if reason is not None:
        progress(reason)
        return {**entry, "available": False, "skipped": reason}
    with tempfile.TemporaryDirectory(prefix=f"bench-scale-{cls.name}-") as root:
        stores = []
        for n in sizes:
            path = os.path.join(root, f"db{n}")
            os.mkdir(path)
            store = cls(path, n)
            store.load(Items(n, seed=n))
            stores.append(store)
            progress(f"{cls.name}: loaded {n:,} keys")
        opened: list[Store] = []
        try:
            waits = []
            for store in stores:
                store.open()
                opened.append(store)
                waits.append(settle(store.path))
            qs = [absent_keys(n, queries, seed=n + 1) for n in sizes]
            device: list[int | None] = []
            rates = timed(sizes, [s.getter() for s in opened], qs, device=device)
            pq = queries // PRESENT_SHARE
            ps = [present_keys(n, pq, seed=n + 2) for n in sizes]
            present_device: list[int | None] = []
            present = timed(sizes, [s.getter() for s in opened], ps, present=True,
                            device=present_device)
            describe = stores[0].describe()
        finally:
            for store in opened:
                store.close()
    ratio = small_over_large(rates)
    return {**entry, "available": True, "describe": describe, "settle_seconds": waits,
            "absent_in_range_per_s": [statistics.median(r) for r in rates],
            "slice_rates": rates, "small_over_large": ratio,
            "device_bytes_per_get": per_key(device, queries),
            "present_per_s": [statistics.median(r) for r in present],
            "present_slice_rates": present,
            "present_device_bytes_per_get": per_key(present_device, pq),
            "present_small_over_large": small_over_large(present)}


def run_peer_or_failure(cls: type[Store], sizes: Sequence[int], queries: int,
                        progress: Progress) -> dict[str, Any]:
    """run_peer; a peer that raises is reported as failed (as bench.peers does), not fatal."""
    try:
        return run_peer(cls, sizes, queries, progress)
    except Exception as exc:  # a peer's own error: report it, go on with the others
        reason = f"{cls.label}: FAILED: {type(exc).__name__}: {exc}"
        progress(reason)
        return {"store": cls.name, "label": cls.label, "available": False, "skipped": reason,
                "failed": True}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split(
        "\n\n")[0], epilog="example: python -m bench.scale --small 200000 --large 2000000")
    parser.add_argument("--small", type=int, default=200_000, metavar="N")
    parser.add_argument("--large", type=int, default=2_000_000, metavar="N")
    parser.add_argument("--queries", type=int, default=200_000, metavar="Q")
    parser.add_argument("--compaction", nargs="+", choices=STRATEGIES, default=list(STRATEGIES),
                        metavar="NAME", help="strategies to run: size_tiered, leveled "
                        "(default: both)")
    parser.add_argument("--peers", nargs="*", choices=PEER_NAMES, default=list(PEER_NAMES),
                        metavar="NAME", help=f"peer stores to run the same test on, from "
                        f"{', '.join(PEER_NAMES)} (default: every one installed; none if given "
                        "without names)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--sizes", type=int, nargs="+", metavar="N",
                        help="instead: load lsmdb to each of these sizes and report load, "
                             "stalls, settling, disk, open time, memory and warm and cold get "
                             "rates (bench/scale_ladder.py), e.g. 1000000 10000000 50000000")
    parser.add_argument("--plot", metavar="PATH",
                        help="with --sizes: draw rates and memory against the key count, a PNG "
                             "(needs matplotlib: pip install 'lsmdb[plot]')")
    parser.add_argument("--filter-family", choices=lsmdb.options.OPTION_CHOICES["filter_family"],
                        default="bloom", help="with --sizes: the table option filter_family "
                        "(default bloom)")
    args = parser.parse_args(argv)
    if args.plot:
        require_matplotlib(parser)
    if args.sizes is not None:
        if min(args.sizes) < 2 or args.queries < 8:
            parser.error("sizes must be at least 2 and queries at least 8")
        return scale_ladder.main(args.sizes, args.queries, args.json, args.plot,
                                 args.filter_family)
    if args.plot:
        parser.error("--plot draws a --sizes run")
    if args.filter_family != "bloom":
        parser.error("--filter-family goes with --sizes")
    if min(args.small, args.large) < 2 or args.queries < PRESENT_SHARE * SLICES:
        parser.error(f"sizes must be at least 2 and queries at least {PRESENT_SHARE * SLICES}")
    progress = Progress()
    sizes = [args.small, args.large]
    runs = [run_strategy(c, sizes, args.queries, progress) for c in args.compaction]
    peers = [run_peer_or_failure(cls, sizes, args.queries, progress)
             for cls in PEERS if cls.name in args.peers]
    report = {"benchmark": "scale", "machine": machine_info(), "speedups": lsmdb.SPEEDUPS,
              "sizes": sizes, "queries": args.queries, "fp_chance": FP_CHANCE, "runs": runs,
              "peers": peers}
    print(f"lsmdb absent gets inside the key range at two sizes ({args.queries:,} gets each, "
          f"slices interleaved; fp chance {FP_CHANCE:g}; C speedups "
          f"{'on' if lsmdb.SPEEDUPS else 'off'})")
    print(f"machine: {describe_machine(report['machine'])}")
    for run in runs:
        print(f"{run['compaction']} compaction:")
        for n, layout, r, work, fb in zip(sizes, run["layout"], run["absent_in_range_per_s"],
                                          run["per_get"], run["filter_bytes"], strict=True):
            print(f"  {n:>10,} keys, {layout}: {r / 1e3:,.0f}k gets/s")
            print(f"  {'':>16}per get: {work['filters_probed']:.2f} filters probed, "
                  f"{work['range_skips']:.2f} files skipped by range, "
                  f"{work['block_reads'] + work['block_cache_hits']:.3f} blocks read "
                  f"({work['block_cache_hits']:.3f} from the cache); filters: {fb:,} bytes")
        print(f"  {args.small:,}-key rate / {args.large:,}-key rate: "
              f"{run['small_over_large']:.2f}x (median over slices); "
              f"{device_note(run['device_bytes_per_get'])}")
        for n, r, work in zip(sizes, run["present_per_s"], run["present_per_get"], strict=True):
            print(f"  present keys, {n:>10,} keys: {r / 1e3:,.0f}k gets/s; per get "
                  f"{work['block_reads']:.3f} blocks read from disk, "
                  f"{work['block_cache_hits']:.3f} from the cache")
        print(f"  present keys, {args.small:,}-key rate / {args.large:,}-key rate: "
              f"{run['present_small_over_large']:.2f}x; "
              f"{device_note(run['present_device_bytes_per_get'])}")
    if peers:
        print("the same test on the peer stores (loaded alike, reopened, background work "
              "settled):")
    for peer in peers:
        if not peer["available"]:
            print(f"  {peer['label']}: skipped ({peer['skipped']})")
            continue
        rates = peer["absent_in_range_per_s"]
        print(f"  {peer['label']}: {rates[0] / 1e3:,.0f}k gets/s at {sizes[0]:,} keys, "
              f"{rates[1] / 1e3:,.0f}k at {sizes[1]:,}: {peer['small_over_large']:.2f}x; "
              f"{device_note(peer['device_bytes_per_get'])}")
        rates = peer["present_per_s"]
        print(f"  {'':>{len(peer['label'])}}  present keys: {rates[0] / 1e3:,.0f}k gets/s at "
              f"{sizes[0]:,} keys, {rates[1] / 1e3:,.0f}k at {sizes[1]:,}: "
              f"{peer['present_small_over_large']:.2f}x; "
              f"{device_note(peer['present_device_bytes_per_get'])}")
    if args.json:
        write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
