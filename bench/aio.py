"""Gets from asyncio (lsmdb.aio) against the same gets from the synchronous handle.

    python -m bench.aio [--keys N] [--gets N] [--json PATH]

N keys (``bench.keys``, 100-byte values) are loaded and compacted, and the
database opened once through ``lsmdb.aio``.  Gets of present keys and of
absent keys then run in 10 slices, each slice twice, the order alternating:
once as ``db.get`` of the synchronous handle underneath (``sync_db``) in a
plain loop, and once as ``await db.get`` in a coroutine (memory answers on
the event loop; a block read from the file goes to the database's threads).
The ratio is the median of the per-slice ratios; the hops column counts the
gets that went to a thread.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import lsmdb
import lsmdb.aio

from .common import (
    Progress,
    describe_machine,
    fmt_rate,
    fmt_ratio,
    machine_info,
    print_section,
    write_json,
)
from .keys import key_of, load_shuffled


class _Counting(ThreadPoolExecutor):
    hops = 0

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        self.hops += 1
        return super().submit(*args, **kwargs)


async def _measure(path: str, present: list[bytes], absent: list[bytes],
                   slices: int = 10) -> dict[str, Any]:
    db = await lsmdb.aio.open(path)
    old, db.executor = db.executor, _Counting(lsmdb.aio.EXECUTOR_THREADS)
    old.shutdown()
    out: dict[str, Any] = {}
    try:
        sync_get = db.sync_db.get
        for label, keys in (("present", present), ("absent", absent)):
            rates: dict[str, list[float]] = {"sync": [], "async": []}
            n = len(keys) // slices
            hops = 0
            for sl in range(slices):
                part = keys[sl * n:(sl + 1) * n]
                for kind in (("sync", "async") if sl % 2 == 0 else ("async", "sync")):
                    t0 = time.perf_counter()
                    if kind == "sync":
                        for k in part:
                            sync_get(k)
                    else:
                        before = db.executor.hops
                        for k in part:
                            await db.get(k)
                        hops += db.executor.hops - before
                    rates[kind].append(n / (time.perf_counter() - t0))
            out[label] = {"sync": statistics.median(rates["sync"]),
                          "async": statistics.median(rates["async"]),
                          "ratio": statistics.median(a / s for s, a in
                                                     zip(rates["sync"], rates["async"],
                                                         strict=True)),
                          "hops": hops, "gets": n * slices}
    finally:
        await db.close()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000, help="keys to load")
    parser.add_argument("--gets", type=int, default=200_000, help="gets per query set")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if min(args.keys, args.gets) < 1000:
        parser.error("--keys and --gets must be at least 1000")
    progress = Progress()
    root = tempfile.mkdtemp(prefix="lsmdb-bench-aio-")
    report: dict[str, Any] = {"keys": args.keys, "machine": machine_info()}
    try:
        progress(f"loading {args.keys:,} keys")
        rng = random.Random(5)
        with lsmdb.open(root) as db:
            load_shuffled(db, args.keys, rng)
            db.compact()
        present = [key_of(2 * rng.randrange(args.keys)) for _ in range(args.gets)]
        absent = [key_of(2 * rng.randrange(args.keys) + 1) for _ in range(args.gets)]
        progress("timing sync and async gets, taking turns")
        report["gets"] = asyncio.run(_measure(root, present, absent))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    print_section("Gets through lsmdb.aio against the synchronous handle (taking turns)",
                  ["keys", "sync gets/s", "async gets/s", "async / sync", "thread hops"],
                  [[k, fmt_rate(v["sync"]), fmt_rate(v["async"]), fmt_ratio(v["ratio"]),
                    f"{v['hops']:,} of {v['gets']:,}"] for k, v in report["gets"].items()],
                  [describe_machine(report["machine"])])
    if args.json:
        write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
