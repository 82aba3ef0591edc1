"""Two lsmdb trees through ``bench.peers``, paired: every workload, taking turns round by round.

    python tools/ab_reads.py OLD_TREE NEW_TREE [--keys N] [--rounds R] [--yardstick STORE]

Each tree is a source checkout with its C extension built in place (``python
setup.py build_ext --inplace``).  Every round runs ``bench.peers`` (this
checkout's) once per tree, in a fresh interpreter that imports that tree's
lsmdb, the order reversed every other round, with one peer store beside it
(``--yardstick``, LevelDB by default).  The report gives, per workload, each
tree's median lsmdb rate, the median of the per-round ratios new/old, and the
same for lsmdb's rate relative to the yardstick's measured in the same run --
a ratio of ratios, which a slow phase of the machine moves least, since
within one run the stores take turns slice by slice.
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

CHILD = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
import lsmdb
assert os.path.dirname(lsmdb.__file__).startswith(sys.argv[1]), lsmdb.__file__
if not lsmdb.SPEEDUPS:
    sys.exit(f"the C speedups are not built in {sys.argv[1]}")
sys.path.insert(0, sys.argv[2])
from bench import peers
with open(os.devnull, "w") as quiet:
    stdout, sys.stdout = sys.stdout, quiet
    try:
        code = peers.main(["--keys", sys.argv[3], "--stores", "lsmdb", sys.argv[4],
                           "--json", sys.argv[5]])
    finally:
        sys.stdout = stdout
sys.exit(code)
"""


def rates(report: dict, store: str) -> dict[str, float]:
    entry = next(e for e in report["stores"] if e["store"] == store)
    out = {w: r["ops_per_s"] for w, r in entry["workloads"].items() if r.get("correct")}
    for name, r in entry.get("get_many", {}).items():
        out[f"get_many {name}"] = r["many_ops_per_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--yardstick", default="leveldb",
                        choices=["sqlite3", "leveldb", "rocksdb", "lmdb"])
    args = parser.parse_args(argv)
    trees = {"old": os.path.abspath(args.old), "new": os.path.abspath(args.new)}
    own: dict[str, dict[str, list[float]]] = {t: {} for t in trees}
    rel: dict[str, dict[str, list[float]]] = {t: {} for t in trees}
    with tempfile.TemporaryDirectory(prefix="lsmdb-ab-reads-") as base:
        for r in range(args.rounds):
            for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
                out = os.path.join(base, f"{name}{r}.json")
                result = subprocess.run([sys.executable, "-c", CHILD, trees[name], str(ROOT),
                                         str(args.keys), args.yardstick, out],
                                        capture_output=True, text=True, check=False)
                if result.returncode:
                    print(result.stderr[-3000:], file=sys.stderr)
                    return 1
                with open(out) as f:
                    report = json.load(f)
                mine = rates(report, "lsmdb")
                peer = rates(report, args.yardstick)
                for w, v in mine.items():
                    own[name].setdefault(w, []).append(v)
                    if w in peer:
                        rel[name].setdefault(w, []).append(v / peer[w])
                print(f"round {r + 1} {name}: " + ", ".join(f"{w} {v:,.0f}/s"
                                                            for w, v in mine.items()),
                      flush=True)
    print(f"\n{'workload':<34} {'old /s':>10} {'new /s':>10} {'new/old':>8} "
          f"{'(range)':>13}  {'vs ' + args.yardstick + ': new/old':>20}")
    for w in own["old"]:
        old, new = own["old"][w], own["new"].get(w, [])
        if len(new) != len(old):
            continue
        ratios = [n / o for o, n in zip(old, new, strict=True)]
        rr = rel["old"].get(w), rel["new"].get(w)
        rel_text = (f"{statistics.median(n / o for o, n in zip(rr[0], rr[1], strict=True)):.3f}"
                    if rr[0] and rr[1] and len(rr[0]) == len(rr[1]) else "-")
        print(f"{w:<34} {statistics.median(old):>10,.0f} {statistics.median(new):>10,.0f} "
              f"{statistics.median(ratios):>8.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
              f"  {rel_text:>20}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
