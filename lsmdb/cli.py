"""The ``lsmdb`` command (also ``python -m lsmdb``)."""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from typing import Sequence

from . import __version__
from .db import open as open_db


def _fmt_int(n: int) -> str:
    return f"{n:,}"


def cmd_demo(args: argparse.Namespace) -> int:
    """Build two tables, flush several SSTables, read present and absent keys."""
    path = args.path or tempfile.mkdtemp(prefix="lsmdb-demo-")
    out = sys.stdout
    rng = random.Random(args.seed)
    specs = [("users", args.keys * 2 // 3, 0.01), ("events", args.keys // 3, 0.001)]
    print(f"lsmdb demo: database at {path}", file=out)
    with open_db(path) as db:
        for name, n, fp in specs:
            if name in db.tables():
                db.drop_table(name)
            table = db.create_table(name, bloom_filter_fp_chance=fp)
            start = time.perf_counter()
            per_file = max(1, n // args.sstables)
            # Present keys are the even numbers; odd numbers inside the range are absent.
            # Loaded in random order, so every SSTable spans the whole key range and
            # only its filter can turn an absent key away.
            order = list(range(n))
            rng.shuffle(order)
            for lo in range(0, n, per_file):
                with db.batch() as b:
                    for i in order[lo:lo + per_file]:
                        b.put(b"%s:%010d" % (name.encode(), 2 * i), b"value-%d" % i, table=name)
                table.flush()
            elapsed = time.perf_counter() - start
            print(f"  loaded {_fmt_int(n)} keys into {name!r} (fp chance {fp}) in {elapsed:.1f}s "
                  f"-> {len(db.sstables(name))} SSTables", file=out)
        print(file=out)
        header = (f"  {'table':<8} {'reads':>8} {'found':>8} {'absent':>8} {'files checked':>14} "
                  f"{'filter no':>10} {'false pos':>10} {'block reads':>12} {'skipped':>8} "
                  f"{'meas FPR':>9} {'pred FPR':>9}")
        print(header, file=out)
        for name, n, fp in specs:
            table = db.table(name)
            before = {i.file: i for i in db.sstables(name)}
            queries = args.queries
            found = 0
            start = time.perf_counter()
            for _ in range(queries):
                present = rng.random() < 0.5
                i = rng.randrange(n)
                key = b"%s:%010d" % (name.encode(), 2 * i + (0 if present else 1))
                if table.get(key) is not None:
                    found += 1
            elapsed = time.perf_counter() - start
            after = db.sstables(name)
            d = {f: sum(getattr(i, f) - getattr(before[i.file], f) for i in after)
                 for f in ("filter_negatives", "false_positives", "true_positives", "block_reads",
                           "range_skips")}
            checked = d["filter_negatives"] + d["false_positives"] + d["true_positives"]
            absent_checks = d["filter_negatives"] + d["false_positives"]
            skipped = d["filter_negatives"]
            meas = d["false_positives"] / absent_checks if absent_checks else float("nan")
            pred = sum(i.predicted_fpr for i in after) / len(after)
            print(f"  {name:<8} {queries:>8,} {found:>8,} {queries - found:>8,} {checked:>14,} "
                  f"{d['filter_negatives']:>10,} {d['false_positives']:>10,} "
                  f"{d['block_reads']:>12,} {skipped / checked:>8.1%} {meas:>9.4%} {pred:>9.4%}"
                  f"   ({queries / elapsed:,.0f} gets/s)", file=out)
        print(file=out)
        total_skipped = sum(i.filter_negatives for i in db.sstables())
        total_reads = sum(i.block_reads for i in db.sstables())
        print(f"  The filters skipped {total_skipped:,} disk reads; {total_reads:,} data blocks "
              f"were read.", file=out)
        print("  'filter no' = a disk read skipped; 'false pos' = a block read for nothing.",
              file=out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lsmdb",
        description="lsmdb: an embedded LSM key-value store with per-SSTable Bloom filters.",
        epilog="example: lsmdb demo /tmp/demo-db",
    )
    parser.add_argument("--version", action="version", version=f"lsmdb {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo", help="build a sample database and show the disk reads the filters skip",
        description="Builds a database with two tables and several SSTables each, reads back "
                    "present and absent keys, and prints how many disk reads the filters skipped.",
        epilog="example: lsmdb demo /tmp/demo-db --keys 300000")
    demo.add_argument("path", nargs="?", help="database directory (default: a new temporary one)")
    demo.add_argument("--keys", type=int, default=300_000, help="keys over both tables (default 300000)")
    demo.add_argument("--sstables", type=int, default=4, help="SSTables per table (default 4)")
    demo.add_argument("--queries", type=int, default=100_000, help="gets per table (default 100000)")
    demo.add_argument("--seed", type=int, default=1, help="random seed for the queries")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
