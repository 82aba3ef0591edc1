"""Where the extra time of an absent get goes at the larger size.

    python tools/profile_scale.py [--small N] [--large N] [--queries Q] [--rounds R]
                                  [--compaction NAME] [--paths SMALL LARGE]

Run from the repository root.  Loads two databases with ``bench.scale``'s loader (default:
leveled compaction, 200,000 and 2,000,000 keys), reads their files once so that false-positive
block reads hit the page cache, then times, in ns per key over ``bench.scale``'s absent
in-range keys (Q keys a timing a round, default 200,000), the median over R rounds of 5 slices
(of 40,000 keys by default, as ``bench.scale``'s), the two sizes taking turns at each timing:

* the whole ``db.get``, and ``Probes.first``: the C filter step of a get (the hash, each
  level's pick, the range checks, the filter probes and their counters);
* ``Probes.first`` over a part of the files: none (the call and the hash), the level-0 files
  only, each level alone, and each level alone without its filters (its pick and range check);
* ``Probes.first`` over 500 keys repeated, whose filter lines stay in the CPU caches;
* the share of the keys that fall inside one of each level's files (the others are range skips
  there: no filter probe);
* by outcome, a get of a key no filter lets through and one of a key that meets a false
  positive; from them, what a false positive adds to a get, and the whole get rebuilt from the
  two weighed by their shares;
* over the timed ``db.get`` of all keys: blocks read from disk and from the block cache, and
  the process's minor page faults (a block's first read out of a file's mapping), per key.

No timing runs on keys another just ran on: every absent key number in a random order is handed
out in turn (half of them to the timings over all keys, the other half, split by outcome, to the
two by outcome), each chunk as new ``bytes`` objects, and the keys are used again only once all
have been (the report says how many times over them each went).  And each timing runs on one
size, then the other, before the next timing, so that every timing follows the same work on the
other database (whose gets push the smaller table's filters out of the L2 cache: a slice of
40,000 keys, as ``bench.scale``'s, pays that about as often as its gets do).  Timed on the same
keys one after the other, all of one database's timings in a row, a timing would find the larger
table's filter lines and false-positive blocks in the CPU caches where the one before it had left
them: the parts of a get would measure smaller than the get, and a false positive would seem to
cost no more at the larger size.

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
import random
import resource
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
from bench.keys import key_of  # noqa: E402
from bench.scale import counters, load  # noqa: E402
from lsmdb.fastpath import FileProbe, Level, probe_of  # noqa: E402
from lsmdb.filters.hashing import key_hash  # noqa: E402
from lsmdb.stats import FILE_COUNTERS  # noqa: E402

HOT_KEYS = 500
SLICES = 5


def read_files(path: str) -> None:
    """Read every file once: false-positive reads then hit the page cache."""
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if os.path.isfile(full):
            with open(full, "rb") as f:
                while f.read(1 << 20):
                    pass


def entry(reader: Any, with_filter: bool = True) -> FileProbe:
    """The file's FileProbe with fresh counters (and, if asked, no filter)."""
    p = probe_of(reader)._replace(counts=array("Q", bytes(8 * len(FILE_COUNTERS))))
    return p if with_filter else p._replace(filter_family=0, filter_data=None, filter_params=())


def parts(db: Any) -> tuple[list[tuple[str, Any]], str, int]:
    """(name, Probes) for each part of the table's files; its files per level; its filter
    bytes."""
    probes_type = lsmdb.table.Probes
    version = db._default_state.version
    l0, deeper = version.l0, version.levels

    def probes(l0s: Sequence[Any], levels: Sequence[tuple[Any, Sequence[Any]]],
               with_filter: bool = True) -> Any:
        return probes_type([entry(r, with_filter) for r in l0s],
                           [Level(tuple(keys), tuple(entry(r, with_filter) for r in rs))
                            for keys, rs in levels],
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


class Pool:
    """Absent key numbers handed out in chunks, in order, wrapping round at the end.  Each
    chunk is made of new ``bytes`` objects, laid out in memory in the order they are used,
    as a list of keys made for a run of gets is."""

    def __init__(self, numbers: list[int]) -> None:
        self.numbers = numbers
        self.taken = 0

    def take(self, count: int) -> list[bytes]:
        numbers, at, size = self.numbers, self.taken, len(self.numbers)
        self.taken += count
        return [key_of(numbers[(at + i) % size]) for i in range(count)]

    def passes(self) -> float:
        """How many times over its keys the pool has been taken."""
        return self.taken / len(self.numbers)


def first_from_start(probes: Any) -> Callable[[bytes], Any]:
    """``probes.first(key, 0)`` as a one-argument function."""
    first = probes.first
    return lambda key: first(key, 0)


#: One timing: its name, the call per key, the pool its keys come from, and the share of a
#: slice's keys it takes (the false positives' timing takes their share, so that it spends
#: about as long as the others).
Run = tuple[str, Callable[[bytes], Any], Pool, float]


def setup(db: Any, n: int, seed: int, info: dict[str, Any]) -> list[Run]:
    """What to time for one database of ``n`` keys; into info its layout, filter bytes,
    share of keys meeting a false positive and, per level, of keys inside one of its files.

    Every absent in-range key number (odd, below 2n - 2, as ``bench.scale`` draws them) in a
    random order, cut in two: the first half feeds the timings over all keys (one pool,
    handed round them in turn: no timing runs on keys the one before it just ran on, whose
    filter lines and blocks it would find in the CPU caches); the second, split into the keys
    no filter lets through and those that meet a false positive, the two timings by
    outcome."""
    named, layout, filter_bytes = parts(db)
    first = named[0][1].first
    info["layout"], info["filter bytes"] = layout, filter_bytes
    numbers = [2 * i + 1 for i in range(n - 1)]
    random.Random(seed).shuffle(numbers)
    everyone = Pool(numbers[::2])
    neg: list[int] = []
    fp: list[int] = []
    for x in numbers[1::2]:
        (fp if first(key_of(x), 0) >= 0 else neg).append(x)
    share = len(fp) / max(1, len(fp) + len(neg))
    info["fp share"], info["pools"] = share, {"all keys": everyone}
    runs: list[Run] = [("db.get", db.get, everyone, 1.0)]
    for name, p in named:
        runs.append((name, first_from_start(p), everyone, 1.0))
    hot = Pool(everyone.numbers[:HOT_KEYS])
    runs.append((f"Probes.first, {HOT_KEYS} keys repeated (lines cached)",
                 first_from_start(named[0][1]), hot, 1.0))
    sample = everyone.numbers[:20_000]
    info["in range"] = {}
    for name, p in named:
        if name.endswith("no filters (pick + range check)"):
            level = name.split(",")[0].strip()
            info["in range"][level] = sum(p.first(key_of(x), 0) >= 0 for x in sample) / len(sample)
    if neg:
        info["pools"]["no filter lets through"] = pool = Pool(neg)
        runs.append(("db.get, keys no filter lets through", db.get, pool, 1.0))
    if fp:
        info["pools"]["meet a false positive"] = pool = Pool(fp)
        runs.append(("db.get, keys that meet a false positive", db.get, pool, share))
    return runs


def measure(dbs: Sequence[Any], sizes: Sequence[int], queries: int, rounds: int,
            infos: Sequence[dict[str, Any]]) -> list[dict[str, list[float]]]:
    """ns per key of every timing, by database: ``queries`` keys a timing a round, in SLICES
    slices; in each slice every timing runs on both databases in turn before the next timing
    (the orders turning each time), so that a slow phase of the machine falls on all of them
    alike.
    Into infos, over the timed ``db.get`` of all keys: the blocks it read from disk and from
    the block cache, and the process's minor page faults (first touches of the files'
    mapped pages), per key."""
    runs = [setup(db, n, n + 1, info) for db, n, info in zip(dbs, sizes, infos, strict=True)]
    results: list[dict[str, list[float]]] = [{}, {}]
    seen = [{"gets": 0, "block_reads": 0, "block_cache_hits": 0, "faults": 0} for _ in dbs]
    chunk = max(1, queries // SLICES)
    names = [r[0] for r in runs[0]] + [r[0] for r in runs[1] if r[0] not in
                                       {q[0] for q in runs[0]}]
    by_name = [{r[0]: r for r in rs} for rs in runs]
    turn = 0
    for _ in range(rounds):
        for _s in range(SLICES):
            for name in names if turn % 2 == 0 else names[::-1]:
                for d in (0, 1) if turn % 2 == 0 else (1, 0):
                    if name not in by_name[d]:
                        continue
                    _name, fn, pool, share = by_name[d][name]
                    keys = pool.take(max(1, round(chunk * share)))
                    whole = name == "db.get"
                    if whole:
                        before, faults = counters(dbs[d]), minor_faults()
                    start = time.perf_counter()
                    for key in keys:
                        fn(key)
                    took = time.perf_counter() - start
                    if whole:
                        faults = minor_faults() - faults
                        after = counters(dbs[d])
                        seen[d]["gets"] += len(keys)
                        seen[d]["faults"] += faults
                        for c in ("block_reads", "block_cache_hits"):
                            seen[d][c] += after[c] - before[c]
                    results[d].setdefault(name, []).append(took / len(keys) * 1e9)
            turn += 1
    for info, s in zip(infos, seen, strict=True):
        info["reads per key"] = s["block_reads"] / s["gets"]
        info["hits per key"] = s["block_cache_hits"] / s["gets"]
        info["faults per key"] = s["faults"] / s["gets"]
    return results


def minor_faults() -> int:
    """The process's minor page faults so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


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
            infos: list[dict[str, Any]] = [{}, {}]
            results = measure(dbs, sizes, args.queries, args.rounds, infos)
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
          f"{args.rounds} rounds of {SLICES} slices, {args.queries:,} keys a timing a round, "
          f"new keys for each; C speedups on)")
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
    rows = []
    for m, info in zip(medians, infos, strict=True):
        neg = m.get("db.get, keys no filter lets through")
        fp = m.get("db.get, keys that meet a false positive")
        f = info["fp share"]
        extra = None if neg is None or fp is None else fp - neg
        whole = None if neg is None or fp is None else (1 - f) * neg + f * fp
        rows.append((f, extra, None if extra is None else f * extra, whole))

    def cells(values: Sequence[float | None], fmt: str) -> list[str]:
        return [format(v, fmt) if v is not None else "-" for v in values]

    def diff(values: Sequence[float | None]) -> str:
        a, b = values
        return f"{b - a:+,.0f}" if a is not None and b is not None else ""

    row("keys that meet a false positive", *cells([r[0] for r in rows], ".2%"))
    row("a get that meets one costs more by", *cells([r[1] for r in rows], ",.0f"),
        diff([r[1] for r in rows]))
    row("false positives, per key (share x extra)", *cells([r[2] for r in rows], ",.0f"),
        diff([r[2] for r in rows]))
    row("db.get from its parts (by outcome, weighed by share)",
        *cells([r[3] for r in rows], ",.0f"), diff([r[3] for r in rows]))
    row("db.get: blocks read per key from disk", *(f"{i['reads per key']:.4f}" for i in infos))
    row("db.get: blocks per key from the block cache", *(f"{i['hits per key']:.4f}" for i in infos))
    row("db.get: minor page faults per 1,000 keys",
        *(f"{1000 * i['faults per key']:.1f}" for i in infos))
    for pool in infos[0]["pools"]:
        row(f"times over the keys: {pool}",
            *(f"{i['pools'][pool].passes():.2f}" if pool in i["pools"] else "-" for i in infos))
    a, b = medians[0]["db.get"], medians[1]["db.get"]
    print(f"db.get, {sizes[0]:,}-key rate / {sizes[1]:,}-key rate: {b / a:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
