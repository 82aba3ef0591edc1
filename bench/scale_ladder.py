"""``bench.scale --sizes``: lsmdb loaded to growing sizes, what each size costs.

    python -m bench.scale --sizes 1000000 10000000 50000000 [--queries Q] [--json P] [--plot P]
                          [--filter-family NAME]

For each size N (ascending; each in a new directory, deleted afterwards):

* **Load**: N keys ``b"user:%010d" % 2i`` (100-byte values, as bench.peers)
  in a scrambled order (an affine permutation of 0..N-1: every key once,
  nothing held in memory), through batches of 10,000, the database's
  defaults (size-tiered, background compactions; ``--filter-family``
  blocked_bloom sets that table option), then
  ``wait_for_compactions()``.  Reported: the load rate until the last
  commit, the seconds until compactions settle, the longest commit (a batch
  that waited on a write stall shows here), and the write stalls
  ``table_stats()`` counted and timed.
* **At rest**: bytes on disk (after the close), files (after the reopen).
* **Reopened in a new process** (so that its memory is the database's):
  the page cache dropped for the files (``posix_fadvise(DONTNEED)``), the
  open timed, the process's anonymous memory (``RssAnon``: not mapped file
  pages) after the open and after the gets, the filters' and the indexes'
  bytes in memory (``table_stats()``); then Q absent gets (odd keys, inside
  the range) and Q/4 present gets, cold (right after the open: the first
  half of each set), then warm (every file read once into the page cache
  first: the second half).

The memory budget the issue sets: anonymous memory at most filters + index +
block cache + 150 MB.  A size the disk cannot hold (twice the data, for the
last merge) is skipped with a line saying so.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

import lsmdb

from .common import Progress, describe_machine, machine_info, write_json
from .keys import VALUE_BYTES, key_of, value_of
from .stores import BATCH_KEYS

#: Bytes per key a load needs on disk at its peak (the last full merge holds
#: its inputs and its output): twice the data, rounded up.
DISK_BYTES_PER_KEY = 2 * (16 + VALUE_BYTES + 24)
HEADROOM_BYTES = 150 << 20


def scrambled(n: int, seed: int) -> Iterator[int]:
    """0..n-1, each once, in an order that looks random: i -> (a*i + c) mod n
    with a coprime to n."""
    rng = random.Random(seed)
    a = rng.randrange(n // 3 + 1, n) | 1 if n > 2 else 1
    while math.gcd(a, n) != 1:
        a += 2
    c = rng.randrange(n)
    return ((a * i + c) % n for i in range(n))


def load(path: str, n: int, progress: Progress, filter_family: str = "bloom") -> dict[str, Any]:
    db = lsmdb.open(path)
    longest = 0.0
    try:
        if filter_family != "bloom":
            db.alter_table("default", filter_family=filter_family)
        order = scrambled(n, seed=n)
        start = time.perf_counter()
        done = 0
        while done < n:
            batch = db.batch()
            put = batch.put
            for _ in range(min(BATCH_KEYS, n - done)):
                j = next(order)
                put(key_of(2 * j), value_of(2 * j))
            t = time.perf_counter()
            batch.commit()
            longest = max(longest, time.perf_counter() - t)
            done += BATCH_KEYS
            if done % (BATCH_KEYS * 500) == 0:
                progress(f"{n:,} keys: {done:,} written")
        loaded = time.perf_counter() - start
        db.wait_for_compactions()
        settled = time.perf_counter() - start - loaded
        st = db.table_stats("default")
    finally:
        db.close()
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    return {"keys": n, "load_seconds": loaded, "load_per_s": n / loaded,
            "settle_seconds": settled, "longest_commit_seconds": longest,
            "write_stalls": st["write_stalls"], "write_stall_seconds": st["write_stall_seconds"],
            "write_slowdowns": st["write_slowdowns"],
            "write_slowdown_seconds": st["write_slowdown_seconds"], "bytes_on_disk": size}


CHILD = r"""
import json, os, random, sys, time
import lsmdb
from bench.keys import key_of

path, n, q = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def rss_anon():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return None

def files():
    return [os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith(".sst")]

for name in files():
    fd = os.open(name, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
rng = random.Random(n)
absent = [key_of(2 * rng.randrange(n - 1) + 1) for _ in range(q)]
present = [key_of(2 * rng.randrange(n)) for _ in range(q // 4)]
anon_before = rss_anon()
t = time.perf_counter()
db = lsmdb.open(path, auto_compaction=False)
open_s = time.perf_counter() - t
anon_open = rss_anon()
st = db.table_stats("default")

def rate(keys, want):
    get = db.get
    t = time.perf_counter()
    found = sum(1 for k in keys if get(k) is not None)
    s = time.perf_counter() - t
    assert found == (len(keys) if want else 0), (found, len(keys), want)
    return len(keys) / s

out = {"open_seconds": open_s, "files": st["files"], "rss_anon_before_open": anon_before,
       "rss_anon_after_open": anon_open,
       "filter_bytes_in_memory": st["filter_bytes_in_memory"],
       "index_bytes_in_memory": st["index_bytes_in_memory"],
       "block_cache_bytes": 32 << 20,
       "filter_families": sorted({i.filter_version for i in db.sstables()})}
out["cold_absent_per_s"] = rate(absent[:q // 2], False)
out["cold_present_per_s"] = rate(present[:len(present) // 2], True)
for name in files():
    with open(name, "rb") as f:
        while f.read(1 << 20):
            pass
out["warm_absent_per_s"] = rate(absent[q // 2:], False)
out["warm_present_per_s"] = rate(present[len(present) // 2:], True)
out["rss_anon_after_gets"] = rss_anon()
db.close()
print(json.dumps(out))
"""


def reopened(path: str, n: int, queries: int) -> dict[str, Any]:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", CHILD, path, str(n), str(queries)],
                          capture_output=True, text=True, env=env, check=True, timeout=3600)
    got: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    budget = (got["filter_bytes_in_memory"] + got["index_bytes_in_memory"]
              + got["block_cache_bytes"] + HEADROOM_BYTES)
    got["memory_budget_bytes"] = budget
    got["within_budget"] = got["rss_anon_after_gets"] <= budget
    return got


def run(sizes: Sequence[int], queries: int, progress: Progress,
        root: str | None = None, filter_family: str = "bloom") -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for n in sorted(sizes):
        with tempfile.TemporaryDirectory(prefix="bench-scale-", dir=root) as tmp:
            free = shutil.disk_usage(tmp).free
            if n * DISK_BYTES_PER_KEY > free:
                rows.append({"keys": n, "skipped": f"{n:,} keys need about "
                             f"{n * DISK_BYTES_PER_KEY / 1e9:.1f} GB of disk, "
                             f"{free / 1e9:.1f} GB free"})
                progress(rows[-1]["skipped"])
                continue
            path = os.path.join(tmp, "db")
            row = load(path, n, progress, filter_family)
            progress(f"{n:,} keys: loaded at {row['load_per_s'] / 1e3:,.0f}k/s, settled "
                     f"{row['settle_seconds']:.1f}s later")
            row.update(reopened(path, n, queries))
            rows.append(row)
    base = next((r for r in rows if "skipped" not in r), None)
    for r in rows:
        if base is not None and "skipped" not in r:
            for name in ("warm_absent_per_s", "warm_present_per_s", "cold_absent_per_s",
                         "cold_present_per_s"):
                r[name.replace("_per_s", "_slowdown")] = base[name] / r[name]
    return rows


def print_rows(rows: list[dict[str, Any]], report: dict[str, Any]) -> None:
    family = report.get("filter_family", "bloom")
    options = "default options" + (f" but filter_family={family}" if family != "bloom" else "")
    print(f"lsmdb at growing sizes ({options}, loaded in batches of {BATCH_KEYS:,} in a "
          f"scrambled order; gets in a new process: {report['queries']:,} absent and "
          f"{report['queries'] // 4:,} present, half cold, half warm)")
    print(f"machine: {describe_machine(report['machine'])}")
    mb = 1 << 20
    for r in rows:
        if "skipped" in r:
            print(f"{r['keys']:>12,} keys: skipped: {r['skipped']}")
            continue
        print(f"{r['keys']:>12,} keys: load {r['load_per_s'] / 1e3:,.0f}k keys/s, compactions "
              f"settled {r['settle_seconds']:.1f}s later; longest commit "
              f"{r['longest_commit_seconds']:.2f}s, {r['write_stalls']} write stalls "
              f"({r['write_stall_seconds']:.2f}s), {r['write_slowdowns']:,} slowdown pauses "
              f"({r['write_slowdown_seconds']:.2f}s); {r['files']} files, "
              f"{r['bytes_on_disk'] / mb:,.0f} MiB on disk")
        print(f"{'':>19}open {r['open_seconds']:.2f}s; RssAnon {r['rss_anon_after_open'] / mb:,.0f}"
              f" MiB after the open, {r['rss_anon_after_gets'] / mb:,.0f} MiB after the gets "
              f"(filters {r['filter_bytes_in_memory'] / mb:,.1f} MiB, index "
              f"{r['index_bytes_in_memory'] / mb:,.1f} MiB; budget "
              f"{r['memory_budget_bytes'] / mb:,.0f} MiB: "
              f"{'within' if r['within_budget'] else 'OVER'})")
        print(f"{'':>19}gets/s absent warm {r['warm_absent_per_s'] / 1e3:,.0f}k, cold "
              f"{r['cold_absent_per_s'] / 1e3:,.0f}k; present warm "
              f"{r['warm_present_per_s'] / 1e3:,.0f}k, cold {r['cold_present_per_s'] / 1e3:,.0f}k"
              + (f"; slower than at the first size: absent {r['warm_absent_slowdown']:.2f}x, "
                 f"present {r['warm_present_slowdown']:.2f}x (warm)"
                 if "warm_absent_slowdown" in r else ""))


def write_plot(path: str, rows: list[dict[str, Any]]) -> None:
    """Rates and memory against the key count, log axes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if "skipped" not in r]
    keys = [r["keys"] for r in done]
    fig, (ax_rate, ax_mem) = plt.subplots(1, 2, figsize=(11, 4.5))
    for name, label in (("warm_absent_per_s", "absent gets, warm"),
                        ("cold_absent_per_s", "absent gets, cold"),
                        ("warm_present_per_s", "present gets, warm"),
                        ("cold_present_per_s", "present gets, cold"),
                        ("load_per_s", "load (keys/s)")):
        ax_rate.plot(keys, [r[name] for r in done], marker="o", label=label)
    for name, label in (("rss_anon_after_gets", "RssAnon after gets"),
                        ("memory_budget_bytes", "budget"),
                        ("filter_bytes_in_memory", "filters"),
                        ("index_bytes_in_memory", "index")):
        ax_mem.plot(keys, [r[name] / (1 << 20) for r in done], marker="o", label=label)
    for ax, ylabel, title in ((ax_rate, "operations per second", "rates"),
                              (ax_mem, "MiB", "memory of an open database")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("keys")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(sizes: Sequence[int], queries: int, json_path: str | None,
         plot_path: str | None, filter_family: str = "bloom") -> int:
    progress = Progress()
    rows = run(sizes, queries, progress, filter_family=filter_family)
    report = {"benchmark": "scale_sizes", "machine": machine_info(), "speedups": lsmdb.SPEEDUPS,
              "queries": queries, "sizes": list(sizes), "filter_family": filter_family,
              "rows": rows, "seconds": progress.elapsed()}
    print_rows(rows, report)
    if json_path:
        write_json(json_path, report)
    if plot_path:
        write_plot(plot_path, rows)
    return 0
