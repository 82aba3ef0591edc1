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
"""

from __future__ import annotations

import argparse
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
    print_section(f"A live snapshot: {args.keys:,} keys, 2,000 overwritten since it was taken",
                  ["workload", "no snapshot", "live snapshot", "with / without"], rows,
                  [describe_machine(report["machine"])])
    if args.json:
        write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
