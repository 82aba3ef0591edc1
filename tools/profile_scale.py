"""Where the extra time of an absent get goes at the larger size (issue #7's scale goal).

    python tools/profile_scale.py [--small N] [--large N] [--queries Q] [--rounds R]
                                  [--compaction NAME] [--paths SMALL LARGE]

Run from the repository root.  Loads two databases with ``bench.scale``'s loader (default:
leveled compaction, 200,000 and 2,000,000 keys), reads their files once so that false-positive
block reads hit the page cache, then times, in ns per key over ``bench.scale``'s absent
in-range keys, the median over R rounds of 20 slices, every timing of both sizes run on one slice
before the next:

* the whole ``db.get``, and ``Probes.first``: the C filter step of a get (the hash, each
  level's pick, the range checks, the filter probes and their counters);
* ``Probes.first`` over a part of the files: none (the call and the hash), the level-0 files
  only, each level alone, and each level alone without its filters (its pick and range check);
* ``Probes.first`` over 500 keys repeated, whose filter lines stay in the CPU caches;
* the share of the keys that fall inside one of each level's files (the others are range skips
  there: no filter probe);
* a get of a key no filter lets through, and the false positives: block reads per key, times
  what a get that meets one costs more.

``--paths SMALL LARGE`` profiles two databases already loaded (by ``bench.scale``'s loader,
with ``--small`` and ``--large`` keys; opened read-only, so another copy can be timed against
them) instead of loading new ones: a size-tiered load leaves 2 to 6 files at 2,000,000 keys,
so comparing like with like can take a few loads.

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
from bench.scale import absent_keys, counters, load  # noqa: E402
from lsmdb.bloom import key_hash  # noqa: E402
from lsmdb.stats import FILE_COUNTERS  # noqa: E402

HOT_KEYS = 500
SLICES = 20


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


def first_from_start(probes: Any) -> Callable[[bytes], Any]:
    """``probes.first(key, 0)`` as a one-argument function."""
    first = probes.first
    return lambda key: first(key, 0)


def setup(db: Any, keys: list[bytes], info: dict[str, Any]
          ) -> list[tuple[str, Callable[[Any], Any], list[bytes]]]:
    """What to time for one database, as (name, call per key, its keys); into info its
    layout, filter bytes and false-positive block reads per key (one pass of gets)."""
    named, layout, filter_bytes = parts(db)
    first = named[0][1].first
    info["layout"], info["filter bytes"] = layout, filter_bytes
    before = counters(db)["block_reads"]
    for key in keys:
        db.get(key)
    info["reads per key"] = (counters(db)["block_reads"] - before) / len(keys)
    runs: list[tuple[str, Callable[[Any], Any], list[bytes]]] = [("db.get", db.get, keys)]
    for name, p in named:
        runs.append((name, first_from_start(p), keys))
    hot = keys[:HOT_KEYS] * max(1, len(keys) // HOT_KEYS)
    runs.append((f"Probes.first, {HOT_KEYS} keys repeated (lines cached)",
                 first_from_start(named[0][1]), hot))
    info["in range"] = {}
    for name, p in named:
        if name.endswith("no filters (pick + range check)"):
            level = name.split(",")[0].strip()
            info["in range"][level] = sum(p.first(k, 0) >= 0 for k in keys) / len(keys)
    found = [first(k, 0) >= 0 for k in keys]
    neg = [k for k, f in zip(keys, found, strict=True) if not f]
    fp = [k for k, f in zip(keys, found, strict=True) if f]
    if neg:
        runs.append(("db.get, keys no filter lets through", db.get, neg))
    if fp:
        runs.append(("db.get, keys that meet a false positive", db.get, fp))
    return runs


def measure(dbs: Sequence[Any], keys: Sequence[list[bytes]], rounds: int,
            infos: Sequence[dict[str, Any]]) -> list[dict[str, list[float]]]:
    """ns per key of every timing, by database: each key list in SLICES slices, every
    timing of both databases run on one slice before the next (the order turning each
    time), so that a slow phase of the machine falls on all of them alike."""
    runs = [setup(db, k, info) for db, k, info in zip(dbs, keys, infos, strict=True)]
    results: list[dict[str, list[float]]] = [{}, {}]
    turn = 0
    for _ in range(rounds):
        for s in range(SLICES):
            for d in (0, 1) if turn % 2 == 0 else (1, 0):
                for name, fn, ks in runs[d] if turn % 2 == 0 else runs[d][::-1]:
                    part = ks[len(ks) * s // SLICES:len(ks) * (s + 1) // SLICES]
                    if part:
                        results[d].setdefault(name, []).append(ns_per_key(fn, part))
            turn += 1
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/profile_scale.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=200_000, metavar="N")
    parser.add_argument("--large", type=int, default=2_000_000, metavar="N")
    parser.add_argument("--queries", type=int, default=200_000, metavar="Q")
    parser.add_argument("--rounds", type=int, default=5, metavar="R")
    parser.add_argument("--compaction", choices=("leveled", "size_tiered"), default="leveled")
    parser.add_argument("--paths", nargs=2, metavar=("SMALL", "LARGE"),
                        help="profile these two databases (loaded with --small and --large keys) "
                             "instead of loading new ones")
    args = parser.parse_args(argv)
    if lsmdb.table.Probes is None:
        print("the C speedups are not built: nothing to profile", file=sys.stderr)
        return 1
    if min(args.small, args.large) < 2 or args.queries < HOT_KEYS or args.rounds < 1:
        parser.error(f"sizes must be at least 2, queries at least {HOT_KEYS}, rounds at least 1")
    sizes = [args.small, args.large]
    with tempfile.TemporaryDirectory(prefix="lsmdb-profile-scale-") as root:
        if args.paths:
            paths = list(args.paths)
        else:
            paths = [os.path.join(root, f"db{n}") for n in sizes]
            for path, n in zip(paths, sizes, strict=True):
                load(path, n, seed=n, compaction=args.compaction)
        for path in paths:
            read_files(path)
        dbs = [lsmdb.open(p, read_only=bool(args.paths)) for p in paths]
        if args.paths:  # the strategy the databases were loaded with
            args.compaction = "/".join(sorted({db._default_state.options.compaction
                                               for db in dbs}))
        try:
            if any(not db.sstables() for db in dbs):
                print("a database has no SSTables at this size: nothing to profile",
                      file=sys.stderr)
                return 1
            keys = [absent_keys(n, args.queries, seed=n + 1) for n in sizes]
            infos: list[dict[str, Any]] = [{}, {}]
            results = measure(dbs, keys, args.rounds, infos)
        finally:
            for db in dbs:
                db.close()
    report(sizes, args, results, infos)
    return 0


def report(sizes: Sequence[int], args: argparse.Namespace,
           results: Sequence[dict[str, list[float]]], infos: Sequence[dict[str, Any]]) -> None:
    width = 2 + max(16, *(len(info["layout"]) for info in infos))

    def row(name: str, *cells: str) -> None:
        """A line: name, the two sizes' cells, then the difference (if given)."""
        a, b, diff = (*cells, "")[:3]
        print(f"{name:<58}{a:>{width}}{b:>{width}}{diff:>12}")

    print(f"absent in-range keys, {args.compaction} compaction, ns per key (median over "
          f"{args.rounds} rounds of {SLICES} slices of {args.queries:,} keys; C speedups on)")
    row("", *(f"{n:,} keys" for n in sizes), "difference")
    row("SSTables per level", infos[0]["layout"], infos[1]["layout"])
    row("filter bytes", *(f"{info['filter bytes']:,}" for info in infos))
    names = list(results[0]) + [n for n in results[1] if n not in results[0]]
    medians = [{k: statistics.median(v) for k, v in r.items()} for r in results]
    for name in names:
        a, b = medians[0].get(name), medians[1].get(name)
        row(name, *(f"{x:,.0f}" if x is not None else "-" for x in (a, b)),
            f"{b - a:+,.0f}" if a is not None and b is not None else "")
    for level in list(infos[0]["in range"]) + [x for x in infos[1]["in range"]
                                               if x not in infos[0]["in range"]]:
        row(f"keys inside one of the files of {level.replace(' only', '')}",
            *(f"{info['in range'][level]:.1%}" if level in info["in range"] else "-"
              for info in infos))
    fp_cost = []
    for m, info in zip(medians, infos, strict=True):
        extra = (m.get("db.get, keys that meet a false positive", 0.0)
                 - m.get("db.get, keys no filter lets through", 0.0))
        fp_cost.append((info["reads per key"], extra, info["reads per key"] * extra))
    row("false-positive block reads per key", *(f"{c[0]:.4f}" for c in fp_cost))
    row("a get that meets one costs more by", *(f"{c[1]:,.0f}" for c in fp_cost))
    row("false positives, per key (reads x extra)", *(f"{c[2]:,.0f}" for c in fp_cost),
        f"{fp_cost[1][2] - fp_cost[0][2]:+,.0f}")
    a, b = medians[0]["db.get"], medians[1]["db.get"]
    print(f"db.get, {sizes[0]:,}-key rate / {sizes[1]:,}-key rate: {b / a:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
