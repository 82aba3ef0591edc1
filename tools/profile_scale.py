"""Where the extra time of an absent get goes at the larger size (issue #7's scale goal).

    python tools/profile_scale.py [--small N] [--large N] [--queries Q] [--rounds R]
                                  [--compaction NAME]

Run from the repository root.  Loads two databases with ``bench.scale``'s loader (default:
leveled compaction, 200,000 and 2,000,000 keys), reads their files once so that false-positive
block reads hit the page cache, then times, in ns per key over ``bench.scale``'s absent
in-range keys, the two sizes taking turns, the median of R rounds:

* the whole ``db.get``, and ``Probes.first``: the C filter step of a get (the hash, each
  level's pick, the range checks, the filter probes and their counters);
* ``Probes.first`` over a part of the files: none (the call and the hash), the level-0 files
  only, each level alone, and each level alone without its filters (its pick and range check);
* ``Probes.first`` over 500 keys repeated, whose filter lines stay in the CPU caches;
* a get of a key no filter lets through, and the false positives: block reads per key, times
  what a get that meets one costs more.

Needs the C speedups.  The parts are timed with Probes built over the same files and filters
but with counters of their own, so the databases' counters see only the gets.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import lsmdb  # noqa: E402
import lsmdb.table  # noqa: E402
from bench.scale import absent_keys, load  # noqa: E402
from lsmdb.bloom import key_hash  # noqa: E402
from lsmdb.stats import FILE_COUNTERS  # noqa: E402

HOT_KEYS = 500


def read_files(path: str) -> None:
    """Read every file once: false-positive reads then hit the page cache."""
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if os.path.isfile(full):
            with open(full, "rb") as f:
                while f.read(1 << 20):
                    pass


def entry(reader: Any, with_filter: bool = True) -> tuple[Any, ...]:
    """The file's C Probes entry with fresh counters (and, if asked, no filter)."""
    e = list(lsmdb.table._c_entry(reader))
    e[0] = array("Q", bytes(8 * len(FILE_COUNTERS)))
    if not with_filter:
        e[3], e[4], e[10] = None, 0, 0
    return tuple(e)


def parts(db: Any) -> tuple[list[tuple[str, Any]], str, int]:
    """(name, Probes) for each part of the table's files; its files per level; its filter
    bytes."""
    probes_type = lsmdb.table.Probes
    _mem, _imms, l0, deeper = db._default_state.view

    def probes(l0s: Sequence[Any], levels: Sequence[tuple[Any, Sequence[Any]]],
               with_filter: bool = True) -> Any:
        return probes_type([entry(r, with_filter) for r in l0s],
                           [(keys, [entry(r, with_filter) for r in rs]) for keys, rs in levels],
                           key_hash)

    out = [("Probes.first, all files", probes(l0, deeper)),
           ("  none (the call and the hash)", probes([], [])),
           ("  level-0 files only", probes(l0, []))]
    for i, (keys, rs) in enumerate(deeper):
        out.append((f"  level {i + 1} only", probes([], [(keys, rs)])))
        out.append((f"  level {i + 1} only, no filters (pick + range check)",
                    probes([], [(keys, rs)], with_filter=False)))
    layout = ", ".join([f"L0 {len(l0)}"]
                       + [f"L{i + 1} {len(rs)}" for i, (_k, rs) in enumerate(deeper)])
    filter_bytes = sum(i.filter_bytes for i in db.sstables())
    return out, layout, filter_bytes


def ns_per_key(fn: Callable[[Any], Any], keys: Sequence[bytes]) -> float:
    start = time.perf_counter()
    for key in keys:
        fn(key)
    return (time.perf_counter() - start) / len(keys) * 1e9


def block_reads(db: Any) -> int:
    return sum(i.block_reads for i in db.sstables())


def profile(db: Any, keys: list[bytes], results: dict[str, list[float]],
            info: dict[str, Any], first_round: bool) -> None:
    """One round of every timing for one database, into results (name -> ns per key)."""
    named, layout, filter_bytes = parts(db)
    first = named[0][1].first
    if first_round:
        info["layout"], info["filter bytes"] = layout, filter_bytes
        info["fp keys"] = [k for k in keys if first(k, 0) >= 0]
        info["negative keys"] = [k for k in keys if first(k, 0) < 0]
        before = block_reads(db)
        results.setdefault("db.get", []).append(ns_per_key(db.get, keys))
        info["reads per key"] = (block_reads(db) - before) / len(keys)
    else:
        results.setdefault("db.get", []).append(ns_per_key(db.get, keys))
    for name, p in named:
        f = p.first
        results.setdefault(name, []).append(ns_per_key(lambda k, f=f: f(k, 0), keys))
    hot = keys[:HOT_KEYS] * max(1, len(keys) // HOT_KEYS)
    results.setdefault(f"Probes.first, {HOT_KEYS} keys repeated (lines cached)", []).append(
        ns_per_key(lambda k: first(k, 0), hot))
    neg, fp = info["negative keys"], info["fp keys"]
    if neg:
        results.setdefault("db.get, keys no filter lets through", []).append(
            ns_per_key(db.get, neg))
    if fp:
        results.setdefault("db.get, keys that meet a false positive", []).append(
            ns_per_key(db.get, fp))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/profile_scale.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=200_000, metavar="N")
    parser.add_argument("--large", type=int, default=2_000_000, metavar="N")
    parser.add_argument("--queries", type=int, default=200_000, metavar="Q")
    parser.add_argument("--rounds", type=int, default=5, metavar="R")
    parser.add_argument("--compaction", choices=("leveled", "size_tiered"), default="leveled")
    args = parser.parse_args(argv)
    if lsmdb.table.Probes is None:
        print("the C speedups are not built: nothing to profile", file=sys.stderr)
        return 1
    if min(args.small, args.large) < 2 or args.queries < HOT_KEYS or args.rounds < 1:
        parser.error(f"sizes must be at least 2, queries at least {HOT_KEYS}, rounds at least 1")
    sizes = [args.small, args.large]
    with tempfile.TemporaryDirectory(prefix="lsmdb-profile-scale-") as root:
        paths = [os.path.join(root, f"db{n}") for n in sizes]
        for path, n in zip(paths, sizes, strict=True):
            load(path, n, seed=n, compaction=args.compaction)
            read_files(path)
        dbs = [lsmdb.open(p) for p in paths]
        try:
            if any(not db.sstables() for db in dbs):
                print("a database has no SSTables at this size: nothing to profile",
                      file=sys.stderr)
                return 1
            keys = [absent_keys(n, args.queries, seed=n + 1) for n in sizes]
            results: list[dict[str, list[float]]] = [{}, {}]
            infos: list[dict[str, Any]] = [{}, {}]
            for r in range(args.rounds):
                for d in (0, 1) if r % 2 == 0 else (1, 0):
                    profile(dbs[d], keys[d], results[d], infos[d], r == 0)
        finally:
            for db in dbs:
                db.close()
    report(sizes, args, results, infos)
    return 0


def report(sizes: Sequence[int], args: argparse.Namespace,
           results: Sequence[dict[str, list[float]]], infos: Sequence[dict[str, Any]]) -> None:
    print(f"absent in-range keys, {args.compaction} compaction, ns per key "
          f"(median of {args.rounds} rounds of {args.queries:,} keys; C speedups on)")
    head = [f"{n:,} keys" for n in sizes]
    print(f"{'':<58}{head[0]:>22}{head[1]:>22}{'difference':>12}")
    print(f"{'SSTables per level':<58}{infos[0]['layout']:>22}{infos[1]['layout']:>22}")
    print(f"{'filter bytes':<58}{infos[0]['filter bytes']:>22,}{infos[1]['filter bytes']:>22,}")
    names = list(results[0]) + [n for n in results[1] if n not in results[0]]
    medians = [{k: statistics.median(v) for k, v in r.items()} for r in results]
    for name in names:
        a, b = medians[0].get(name), medians[1].get(name)
        cells = [f"{x:,.0f}" if x is not None else "-" for x in (a, b)]
        diff = f"{b - a:+,.0f}" if a is not None and b is not None else ""
        print(f"{name:<58}{cells[0]:>22}{cells[1]:>22}{diff:>12}")
    fp_cost = []
    for m, info in zip(medians, infos, strict=True):
        extra = (m.get("db.get, keys that meet a false positive", 0.0)
                 - m.get("db.get, keys no filter lets through", 0.0))
        fp_cost.append((info["reads per key"], extra, info["reads per key"] * extra))
    print(f"{'false-positive block reads per key':<58}"
          f"{fp_cost[0][0]:>22.4f}{fp_cost[1][0]:>22.4f}")
    print(f"{'a get that meets one costs more by':<58}"
          f"{fp_cost[0][1]:>22,.0f}{fp_cost[1][1]:>22,.0f}")
    print(f"{'false positives, per key (reads x extra)':<58}"
          f"{fp_cost[0][2]:>22,.0f}{fp_cost[1][2]:>22,.0f}{fp_cost[1][2] - fp_cost[0][2]:>+12,.0f}")
    a, b = medians[0]["db.get"], medians[1]["db.get"]
    print(f"db.get, {sizes[0]:,}-key rate / {sizes[1]:,}-key rate: {b / a:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
