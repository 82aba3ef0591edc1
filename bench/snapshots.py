"""What a live snapshot costs the reads and writes that do not use it.

    python -m bench.snapshots [--keys N] [--gets N] [--puts N] [--json PATH]

N keys (``bench.keys``, 100-byte values) are loaded and flushed.  Then, in
one process, gets of present keys and of absent keys run in 10 slices, each
slice twice, the order alternating: once with no snapshot and once with a
live one; before each, the same 2,000 keys are overwritten (so a live
snapshot's undo map holds 2,000 entries).  The ratio is the median of the
per-slice ratios.  Single puts run the same way, in 10 rounds taking turns
(a memtable large enough that none is flushed meanwhile): into the database
with no snapshot, and with one live (each put then records the old value
once in the snapshot's undo map).

Then compactions, each in a database of its own: N keys loaded and flushed, a
quarter of them overwritten and flushed, and a full compaction timed -- with
no snapshot, and with one taken before the overwrites, which the compaction
keeps the old versions for (in history files; lsmdb.history), in 3 rounds
taking turns.  Reported: the compaction's rate with over without, the bytes
on disk while the snapshot lives against after it is closed, and the
snapshot's gets of present keys before the compaction (its files as taken,
the C getter) and after it (the current files and the history files, by
sequence number).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import lsmdb

from .common import (
    Progress,
    describe_machine,
    fmt_rate,
    fmt_ratio,
    machine_info,
    print_section,
    write_json,
)
from .keys import key_of, value_of


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000, help="keys to load")
    parser.add_argument("--gets", type=int, default=200_000, help="gets per query set")
    parser.add_argument("--puts", type=int, default=100_000, help="puts per side")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if min(args.keys, args.gets, args.puts) < 1000:
        parser.error("--keys, --gets and --puts must be at least 1000")
    progress = Progress()
    root = tempfile.mkdtemp(prefix="lsmdb-bench-snapshots-")
    report: dict[str, Any] = {"keys": args.keys, "machine": machine_info()}
    try:
        db = lsmdb.open(root)
        rng = random.Random(5)
        order = list(range(args.keys))
        rng.shuffle(order)
        for chunk in range(0, args.keys, 10_000):
            with db.batch() as b:
                for i in order[chunk:chunk + 10_000]:
                    b.put(key_of(2 * i), value_of(2 * i))
        db.wait_for_compactions()
        db.flush()
        present = [key_of(2 * rng.randrange(args.keys)) for _ in range(args.gets)]
        absent = [key_of(2 * rng.randrange(args.keys) + 1) for _ in range(args.gets)]
        overwrite = [key_of(2 * i) for i in order[:2000]]
        gets: dict[str, Any] = {}
        slices = 10
        for label, keys in (("present", present), ("absent", absent)):
            progress(f"timing {label} gets, without and with a live snapshot")
            rates: dict[bool, list[float]] = {False: [], True: []}
            n = len(keys) // slices
            for sl in range(slices):
                part = keys[sl * n:(sl + 1) * n]
                for live in ((False, True) if sl % 2 == 0 else (True, False)):
                    snap = db.snapshot() if live else None
                    for k in overwrite:  # the same writes either way: an undo map of 2,000
                        db.put(k, b"new" + k)
                    get = db.get
                    t0 = time.perf_counter()
                    for k in part:
                        get(k)
                    rates[live].append(n / (time.perf_counter() - t0))
                    if snap is not None:
                        snap.close()
            gets[label] = {"without_snapshot": statistics.median(rates[False]),
                           "with_snapshot": statistics.median(rates[True]),
                           "ratio": statistics.median(b / a for a, b in
                                                      zip(rates[False], rates[True],
                                                          strict=True))}
        report["gets"] = gets

        def put_rate(n: int, live: bool) -> float:
            s = db.snapshot() if live else None
            base = rng.randrange(1 << 30)
            t0 = time.perf_counter()
            for j in range(n):
                db.put(key_of(2 * ((base + j * 7919) % args.keys)), b"p" * 100)
            seconds = time.perf_counter() - t0
            if s is not None:
                s.close()
            return n / seconds

        # no flush while puts are timed: what a put itself pays, not where flushes fall
        db.alter_table("default", memtable_size_bytes=1 << 30)
        rounds = 10
        per = args.puts // rounds
        rates = {False: [], True: []}
        progress("timing puts, without and with a live snapshot")
        for r in range(rounds):
            for live in ((False, True) if r % 2 == 0 else (True, False)):
                rates[live].append(put_rate(per, live))
        report["puts"] = {"without_snapshot": statistics.median(rates[False]),
                          "with_snapshot": statistics.median(rates[True]),
                          "ratio": statistics.median(b / a for a, b in
                                                     zip(rates[False], rates[True],
                                                         strict=True))}
        db.close()
        report["compaction"] = compactions(root, args.keys, args.gets, progress)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    for label in ("present", "absent"):
        g = report["gets"][label]
        rows.append([f"{label} get", fmt_rate(g["without_snapshot"]),
                     fmt_rate(g["with_snapshot"]), fmt_ratio(g["ratio"])])
    p = report["puts"]
    rows.append(["single put", fmt_rate(p["without_snapshot"]), fmt_rate(p["with_snapshot"]),
                 fmt_ratio(p["ratio"])])
    c = report["compaction"]
    rows.append(["full compaction, 1/4 overwritten", f"{c['seconds_without']:.2f} s",
                 f"{c['seconds_with']:.2f} s", fmt_ratio(c["ratio"])])
    print_section(f"A live snapshot: {args.keys:,} keys, 2,000 overwritten since it was taken",
                  ["workload", "no snapshot", "live snapshot", "with / without"], rows,
                  [describe_machine(report["machine"])])
    print_section("A snapshot through a compaction (1/4 of the keys overwritten after it)",
                  ["measure", "value"],
                  [["bytes on disk, snapshot live / closed", fmt_ratio(c["disk_ratio"])],
                   ["history files, bytes", f"{c['history_bytes']:,}"],
                   ["snapshot present gets, its own files", fmt_rate(c["snap_get_before"])],
                   ["snapshot present gets, after the compaction", fmt_rate(c["snap_get_after"])],
                   ["db present gets (no snapshot)", fmt_rate(c["db_get"])]], [])
    if args.json:
        write_json(args.json, report)
    return 0


def sst_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path)
               if n.endswith(".sst"))


def compactions(root: str, keys: int, gets: int, progress: Progress) -> dict[str, Any]:
    """The compaction rounds of the module docstring."""
    rng = random.Random(9)
    order = list(range(keys))
    rng.shuffle(order)
    probe = [key_of(2 * rng.randrange(keys)) for _ in range(min(gets, 50_000))]
    seconds: dict[bool, list[float]] = {False: [], True: []}
    out: dict[str, Any] = {}

    def get_rate(get: Any) -> float:
        t0 = time.perf_counter()
        for k in probe:
            get(k)
        return len(probe) / (time.perf_counter() - t0)

    for r in range(3):
        for live in ((False, True) if r % 2 == 0 else (True, False)):
            progress(f"compaction round {r + 1}, {'with' if live else 'without'} a snapshot")
            path = os.path.join(root, f"c{r}{int(live)}")
            db = lsmdb.open(path, auto_compaction=False)
            for chunk in range(0, keys, 10_000):
                with db.batch() as b:
                    for i in order[chunk:chunk + 10_000]:
                        b.put(key_of(2 * i), value_of(2 * i))
            db.flush()
            db.compact()
            snap = db.snapshot() if live else None
            for chunk in range(0, keys // 4, 10_000):
                with db.batch() as b:
                    for i in order[chunk:min(chunk + 10_000, keys // 4)]:
                        b.put(key_of(2 * i), b"new" + value_of(2 * i))
            db.flush()
            if snap is not None:
                out["snap_get_before"] = get_rate(snap.get)
            t0 = time.perf_counter()
            db.compact()
            seconds[live].append(time.perf_counter() - t0)
            if snap is not None:
                out["snap_get_after"] = get_rate(snap.get)
                out["db_get"] = get_rate(db.get)
                live_bytes = sst_bytes(path)
                current = sum(i.size_bytes for i in db.sstables())
                out["history_bytes"] = live_bytes - current
                snap.close()
                out["disk_ratio"] = live_bytes / sst_bytes(path)
            db.close()
            shutil.rmtree(path, ignore_errors=True)
    out["seconds_without"] = statistics.median(seconds[False])
    out["seconds_with"] = statistics.median(seconds[True])
    out["ratio"] = out["seconds_without"] / out["seconds_with"]  # of rates, as the others
    return out


if __name__ == "__main__":
    sys.exit(main())
