"""Readers in other processes that follow a writer: what following costs, how far behind.

    python -m bench.follow [--keys N] [--gets N] [--seconds S] [--json PATH]

N keys (``bench.keys``, 100-byte values) are loaded, compacted and the
writer stays open, idle.  Then, in this process:

1. **gets while the writer is idle**: a plain ``read_only=True`` handle and a
   following one (``follow=True``) answer the same gets of present and of
   absent keys, taking turns slice by slice (``bench.common``); the ratio is
   what the following handle's check before each read costs.
2. **lag**: a writer in another process puts new keys at a steady 10,000
   and then 100,000 puts/s for S seconds and records when each put returned
   (``time.monotonic_ns``, one clock for every process); the following
   handle here looks for each key in turn, as soon as it can, and records
   when it first saw it.  Lag = seen - acknowledged: median, 99th
   percentile and maximum (a key seen before its put returned counts 0).
3. **gets while the writer writes**: the following handle's rate of gets of
   present keys while the writer puts at each of those rates, beside its
   rate while the writer is idle (step 1).
4. **four readers and one writer**: four following reader processes do gets
   of present keys for S seconds while a writer process puts at 100,000/s;
   each reader's rate and the writer's achieved put rate.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
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
    median_ratio,
    print_section,
    time_gets_interleaved,
    write_json,
)
from .keys import key_of, load_shuffled

_WRITER = textwrap.dedent("""
    import json, sys, time
    import lsmdb
    path, rate, seconds, out, prefix = (sys.argv[1], float(sys.argv[2]), float(sys.argv[3]),
                                        sys.argv[4], sys.argv[5].encode())
    db = lsmdb.open(path)
    value = b"x" * 100
    acks = []
    print("ready", flush=True)
    sys.stdin.readline()
    period = 1e9 / rate
    start = time.monotonic_ns()
    end = start + seconds * 1e9
    i = 0
    put = db.put
    clock = time.monotonic_ns
    while True:
        now = clock()
        if now >= end:
            break
        target = start + i * period
        if now < target:
            if target - now > 300_000:
                time.sleep((target - now - 200_000) / 1e9)
            continue
        put(prefix + b"%09d" % i, value)
        acks.append(clock())
        i += 1
    db.close()
    with open(out, "w") as fh:
        json.dump({"acks": acks, "seconds": (acks[-1] - start) / 1e9 if acks else 0}, fh)
""")

_READER = textwrap.dedent("""
    import json, random, sys, time
    import lsmdb
    path, keys, seconds, seed = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    from bench.keys import key_of
    db = lsmdb.open(path, read_only=True, follow=True)
    rng = random.Random(seed)
    sample = [key_of(2 * rng.randrange(keys)) for _ in range(100_000)]
    print("ready", flush=True)
    sys.stdin.readline()
    get = db.get
    n = found = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    while time.perf_counter() < end:
        for k in sample[:10_000]:
            if get(k) is not None:
                found += 1
        n += 10_000
        sample = sample[10_000:] + sample[:10_000]
    elapsed = time.perf_counter() - t0
    print(json.dumps({"gets": n, "found": found, "seconds": elapsed}), flush=True)
    db.close()
""")


def _writer(path: str, rate: float, seconds: float, out: str, prefix: str
            ) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, path, str(rate), str(seconds), out,
                             prefix], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError("the writer process did not start")
    return proc


def _go(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def measure_lag(path: str, follower: Any, rate: float, seconds: float, tmp: str,
                prefix: str) -> dict[str, Any]:
    """Step 2: a writer process at ``rate`` puts/s; the follower looks for each key."""
    out = os.path.join(tmp, f"acks-{prefix}.json")
    proc = _writer(path, rate, seconds, out, prefix)
    get = follower.get
    clock = time.monotonic_ns
    seen: list[int] = []
    pre = prefix.encode()
    _go(proc)
    i = 0
    while True:
        if get(pre + b"%09d" % i) is not None:
            seen.append(clock())
            i += 1
        elif proc.poll() is not None:
            follower.refresh()
            if get(pre + b"%09d" % i) is None:
                break
    if proc.wait() != 0:
        raise RuntimeError("the writer process failed")
    with open(out) as fh:
        acks = json.load(fh)["acks"]
    lags = [max(0, s - a) / 1e6 for s, a in zip(seen, acks, strict=False)]  # ms
    return {"rate": rate, "puts": len(acks), "seen": len(seen),
            "achieved_puts_per_second": len(acks) / seconds,
            "lag_ms_median": statistics.median(lags) if lags else None,
            "lag_ms_p99": _pct(lags, 0.99), "lag_ms_max": max(lags, default=0.0)}


def gets_while_writing(path: str, follower: Any, rate: float, seconds: float, tmp: str,
                       prefix: str, keys: list[bytes]) -> dict[str, Any]:
    """Step 3: the follower's gets of present keys while a writer puts at ``rate``."""
    out = os.path.join(tmp, f"acks-{prefix}.json")
    proc = _writer(path, rate, seconds, out, prefix)
    get = follower.get
    _go(proc)
    n = 0
    t0 = time.perf_counter()
    while proc.poll() is None:
        for k in keys[n % len(keys):n % len(keys) + 10_000]:
            get(k)
        n += 10_000
    elapsed = time.perf_counter() - t0
    proc.wait()
    with open(out) as fh:
        puts = len(json.load(fh)["acks"])
    return {"rate": rate, "gets_per_second": n / elapsed, "puts_per_second": puts / seconds}


def readers_and_writer(path: str, keys: int, seconds: float, tmp: str) -> dict[str, Any]:
    """Step 4: four following reader processes and one writer at 100,000 puts/s."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    readers = [subprocess.Popen([sys.executable, "-c", _READER, path, str(keys), str(seconds),
                                 str(r)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, env=env) for r in range(4)]
    for r in readers:
        assert r.stdout is not None
        if r.stdout.readline().strip() != "ready":
            raise RuntimeError("a reader process did not start")
    out = os.path.join(tmp, "acks-four.json")
    writer = _writer(path, 100_000, seconds, out, "four")
    for p in (*readers, writer):
        _go(p)
    results = []
    for r in readers:
        assert r.stdout is not None
        results.append(json.loads(r.stdout.readline()))
        r.wait()
    writer.wait()
    with open(out) as fh:
        puts = len(json.load(fh)["acks"])
    return {"readers": [{"gets_per_second": x["gets"] / x["seconds"],
                         "found_share": x["found"] / x["gets"]} for x in results],
            "writer_puts_per_second": puts / seconds}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000, help="keys to load")
    parser.add_argument("--gets", type=int, default=200_000, help="gets per query set")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per write phase")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if min(args.keys, args.gets) < 1000 or args.seconds <= 0:
        parser.error("--keys and --gets must be at least 1000, --seconds positive")
    progress = Progress()
    tmp = tempfile.mkdtemp(prefix="lsmdb-bench-follow-")
    path = os.path.join(tmp, "db")
    report: dict[str, Any] = {"keys": args.keys, "machine": machine_info()}
    try:
        progress(f"loading {args.keys:,} keys")
        rng = random.Random(5)
        with lsmdb.open(path) as db:
            load_shuffled(db, args.keys, rng)
            db.compact()
        present = [key_of(2 * rng.randrange(args.keys)) for _ in range(args.gets)]
        absent = [key_of(2 * rng.randrange(args.keys) + 1) for _ in range(args.gets)]
        writer = lsmdb.open(path)  # open and idle
        plain = lsmdb.open(path, read_only=True)
        follower = lsmdb.open(path, read_only=True, follow=True)
        idle: dict[str, Any] = {}
        for label, keys in (("present", present), ("absent", absent)):
            progress(f"timing {label} gets: plain read-only and following, taking turns")
            ro, fo = time_gets_interleaved([plain.get, follower.get], keys)
            idle[label] = {"read_only": ro.per_second, "follow": fo.per_second,
                           "ratio": median_ratio(fo, ro)}
        report["idle_gets"] = idle
        plain.close()
        writer.close()
        lag = []
        for rate in (10_000, 100_000):
            progress(f"lag at {rate:,} puts/s for {args.seconds} s")
            lag.append(measure_lag(path, follower, rate, args.seconds, tmp, f"lag{rate}-"))
        report["lag"] = lag
        during = []
        for rate in (10_000, 100_000):
            progress(f"gets while a writer puts {rate:,}/s")
            during.append(gets_while_writing(path, follower, rate, args.seconds, tmp,
                                             f"busy{rate}-", present))
        report["gets_while_writing"] = during
        follower.close()
        progress("four reader processes and one writer")
        report["four_readers"] = readers_and_writer(path, args.keys, args.seconds, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print_section("Gets, the writer open and idle (taking turns slice by slice)",
                  ["keys", "read_only", "follow=True", "follow / read_only"],
                  [[k, fmt_rate(v["read_only"]), fmt_rate(v["follow"]), fmt_ratio(v["ratio"])]
                   for k, v in idle.items()], [describe_machine(report["machine"])])
    print_section("Lag from a put's return (writer process) to a follower's first read "
                  "that sees it", ["puts/s asked", "puts/s done", "median ms", "p99 ms", "max ms"],
                  [[f"{x['rate']:,}", fmt_rate(x["achieved_puts_per_second"]),
                    f"{x['lag_ms_median']:.3f}", f"{x['lag_ms_p99']:.3f}",
                    f"{x['lag_ms_max']:.3f}"] for x in lag])
    print_section("A follower's gets of present keys while a writer process puts",
                  ["puts/s asked", "puts/s done", "gets/s", "vs idle"],
                  [[f"{x['rate']:,}", fmt_rate(x["puts_per_second"]),
                    fmt_rate(x["gets_per_second"]),
                    fmt_ratio(x["gets_per_second"] / idle["present"]["follow"])]
                   for x in during])
    four = report["four_readers"]
    print_section("Four following reader processes and one writer process (100,000 puts/s "
                  "asked)", ["process", "rate"],
                  [*[[f"reader {i + 1}", fmt_rate(r["gets_per_second"]) + " gets/s"]
                     for i, r in enumerate(four["readers"])],
                   ["readers, total", fmt_rate(sum(r["gets_per_second"]
                                                   for r in four["readers"])) + " gets/s"],
                   ["writer", fmt_rate(four["writer_puts_per_second"]) + " puts/s"]])
    if args.json:
        write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
