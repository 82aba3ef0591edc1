"""The write path of two lsmdb trees, paired: bulk load and single puts, taking turns.

    python tools/ab_writes.py OLD_TREE NEW_TREE [--keys N] [--puts N] [--rounds R]
                              [--only WORKLOAD ...]

Each tree is a source checkout with its C extension built in place (``python
setup.py build_ext --inplace``).  Every round runs one fresh interpreter per
tree (``PYTHONPATH=TREE``, in TREE: its compaction worker imports that tree's
lsmdb too, even where the worker itself does not see to it), in turn, the
order reversed every other round, so a slow phase of the machine falls on
both; each interpreter times, in a new directory:

* ``bulk``: ``bench.peers``' lsmdb load -- N keys (``bench.keys``, 100-byte
  values, random order) through batches of ``bench.stores.BATCH_KEYS``, waiting
  for background compactions, then ``close()``;
* ``puts``: ``--puts`` single ``db.put`` calls (``sync=False``, random order),
  then ``close()`` (the flushes and compactions they cause included);
* ``two_tables``: ``--puts`` single puts taking turns between two tables (a
  flush of one then leaves the other's records in the WAL segment it closes);
* ``sync_puts``: ``--puts // 20`` single ``db.put(..., sync=True)`` calls;
* ``commits``: ``bench.peers``' batch commits (updates and deletes of the
  loaded keys, built first), their ops per second, flushes they set off
  included.

The report gives, per workload, each tree's median rate and the median,
quartiles and range of the per-round ratios new/old.  The machine's noise is
large: one tree against itself, 16 rounds of ``--only commits`` on an idle
2-core machine, gave a median of 0.98, quartiles 0.91-1.18 and a range of
0.77-1.54, so a change that moves a workload by 10-20% needs ``--only`` that
workload, 16 rounds or more, and nothing else running.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ("bulk", "puts", "two_tables", "sync_puts", "commits")

CHILD = r"""
import json, os, random, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
import lsmdb
sys.path.insert(0, sys.argv[2])
from bench.keys import key_of, value_of
from bench.stores import BATCH_KEYS
keys, puts, base = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
want = sys.argv[6].split(",")
assert os.path.dirname(lsmdb.__file__).startswith(sys.argv[1]), lsmdb.__file__
rng = random.Random(7)
order = list(range(keys)); rng.shuffle(order)
items = [(key_of(2 * i), value_of(2 * i)) for i in order]
out = {"speedups": lsmdb.SPEEDUPS}
def load(path):
    db = lsmdb.open(path)
    for lo in range(0, len(items), BATCH_KEYS):
        with db.batch() as b:
            for k, v in items[lo:lo + BATCH_KEYS]:
                b.put(k, v)
    db.wait_for_compactions()
    db.close()
if "bulk" in want:
    t = time.perf_counter()
    load(tempfile.mkdtemp(dir=base))
    out["bulk"] = keys / (time.perf_counter() - t)
if "puts" in want:
    path = tempfile.mkdtemp(dir=base)
    db = lsmdb.open(path)
    t = time.perf_counter()
    for k, v in items[:puts]:
        db.put(k, v)
    db.close()
    out["puts"] = puts / (time.perf_counter() - t)
if "two_tables" in want:
    path = tempfile.mkdtemp(dir=base)
    db = lsmdb.open(path)
    tables = [db.table("default"), db.create_table("other")]
    t = time.perf_counter()
    for i, (k, v) in enumerate(items[:puts]):
        tables[i & 1].put(k, v)
    db.close()
    out["two_tables"] = puts / (time.perf_counter() - t)
if "sync_puts" in want:
    path = tempfile.mkdtemp(dir=base)
    db = lsmdb.open(path)
    n = max(1, puts // 20)
    t = time.perf_counter()
    for k, v in items[:n]:
        db.put(k, v, sync=True)
    out["sync_puts"] = n / (time.perf_counter() - t)
    db.close()
if "commits" in want:
    from bench.peers import commit_workload
    from bench.stores import timed_commits
    class Data: pass
    data = Data(); data.items = items
    batches = commit_workload(data)
    path = tempfile.mkdtemp(dir=base)
    load(path)
    db = lsmdb.open(path)
    took = timed_commits(batches, db.batch, lambda batch: batch.commit())
    out["commits"] = sum(map(len, batches)) / took
    db.close()
print(json.dumps(out))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--puts", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--only", nargs="+", choices=WORKLOADS, default=list(WORKLOADS),
                        help="the workloads to run (default: all)")
    parser.add_argument("--dir", help="where the databases go (default: a temporary directory "
                        "on the disk, not tmpfs: fsyncs are part of what is measured)")
    args = parser.parse_args(argv)
    trees = {"old": os.path.abspath(args.old), "new": os.path.abspath(args.new)}
    rates: dict[str, dict[str, list[float]]] = {t: {} for t in trees}
    # absolute: each child runs in its tree
    base = os.path.abspath(tempfile.mkdtemp(prefix="lsmdb-ab-", dir=args.dir))
    try:
        for r in range(args.rounds):
            for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
                run_dir = tempfile.mkdtemp(dir=base)
                result = subprocess.run(
                    [sys.executable, "-c", CHILD, trees[name], str(ROOT), str(args.keys),
                     str(args.puts), run_dir, ",".join(args.only)],
                    capture_output=True, text=True, check=False, cwd=trees[name],
                    env={**os.environ, "PYTHONPATH": trees[name]})
                subprocess.run(["rm", "-rf", run_dir], check=False)
                if result.returncode or "compactions run in this process" in result.stderr:
                    # (the second: its merges would take the writer's interpreter lock)
                    print(result.stderr, file=sys.stderr)
                    return 1
                got = json.loads(result.stdout.strip().splitlines()[-1])
                if not got.pop("speedups"):
                    print(f"{name}: the C speedups are not built in {trees[name]}",
                          file=sys.stderr)
                    return 1
                for workload, rate in got.items():
                    rates[name].setdefault(workload, []).append(rate)
                print(f"round {r + 1} {name}: " + ", ".join(f"{w} {v:,.0f}/s"
                                                            for w, v in got.items()),
                      flush=True)
    finally:
        subprocess.run(["rm", "-rf", base], check=False)
    print(f"\n{'workload':<10} {'old /s':>10} {'new /s':>10} {'new/old (median of rounds)':>28}"
          "   quartiles      range")
    for workload in rates["old"]:
        old, new = rates["old"][workload], rates["new"][workload]
        ratios = sorted(n / o for o, n in zip(old, new, strict=True))
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        print(f"{workload:<10} {statistics.median(old):>10,.0f} {statistics.median(new):>10,.0f} "
              f"{statistics.median(ratios):>14.3f}   {quartiles[0]:.3f}-{quartiles[2]:.3f}"
              f"   {ratios[0]:.3f}-{ratios[-1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
