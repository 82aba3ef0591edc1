"""``lsmdb demo``: a sample database built, and the disk reads its filters skip shown.

The demo builds two tables, ``users`` and ``events``, in a new directory, an
empty one, or a database an earlier demo built (it knows one by a marker key
in the default table); any other database only with ``--force``.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time

from .cli_report import CliError, missing_database, open_read_only, speedups_line
from .db import open as open_db
from .errors import NotADatabaseError

#: The key in the default table by which the demo knows a database it built (and may
#: rebuild): written first, so that a demo cut short is recognised too.
DEMO_MARKER_KEY = b"lsmdb-demo"
DEMO_MARKER_VALUE = b"built by lsmdb demo, which may rebuild its tables 'users' and 'events'"
DEMO_TABLES = ("users", "events")


def _check_demo_path(path: str, force: bool) -> None:
    """CliError unless the demo may build in ``path``: new, an empty directory, a
    database the demo built, or (``force``) any database."""
    if missing_database(path) is not None:
        return
    try:
        db = open_read_only(path)
    except NotADatabaseError as exc:
        raise CliError(f"{exc}: lsmdb demo needs a new or empty directory, or a database it "
                       "built") from None
    with db:
        if force or db.get(DEMO_MARKER_KEY) == DEMO_MARKER_VALUE:
            return
        mine = [t for t in db.tables() if t in DEMO_TABLES]
        replaced = (f"would replace its table{'s' if len(mine) > 1 else ''} "
                    f"{' and '.join(map(repr, mine))}" if mine
                    else "would add its tables 'users' and 'events'")
        raise CliError(f"{path} holds a database lsmdb demo did not build (tables: "
                       f"{', '.join(db.tables())}); the demo {replaced}: pass --force to go on, "
                       "or give it a new directory")


def cmd_demo(args: argparse.Namespace) -> int:
    """Build two tables, flush several SSTables, read present and absent keys.

    PATH must be new, an empty directory, or a database an earlier demo built
    (its tables 'users' and 'events' are built again); --force builds them in
    any database, replacing tables of those names."""
    for name in ("keys", "sstables", "queries"):
        if getattr(args, name) < 1:
            raise CliError(f"--{name} must be >= 1")
    path = args.path or tempfile.mkdtemp(prefix="lsmdb-demo-")
    _check_demo_path(path, args.force)
    out = sys.stdout
    rng = random.Random(args.seed)
    specs = [("users", max(1, args.keys * 2 // 3), 0.01), ("events", max(1, args.keys // 3),
                                                           0.001)]
    print(f"lsmdb demo: database at {path} ({speedups_line()})", file=out)
    # No background compaction: each absent key should meet every SSTable's filter.
    with open_db(path, auto_compaction=False) as db:
        db.put(DEMO_MARKER_KEY, DEMO_MARKER_VALUE, sync=True)
        for name, n, fp in specs:
            if name in db.tables():
                db.drop_table(name)
            table = db.create_table(name, bloom_filter_fp_chance=fp)
            start = time.perf_counter()
            per_file = max(1, -(-n // args.sstables))  # ceil: exactly --sstables files
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
            print(f"  loaded {n:,} keys into {name!r} (fp chance {fp}) in {elapsed:.1f}s "
                  f"-> {len(db.sstables(name))} SSTables", file=out)
        print(file=out)
        header = (f"  {'table':<8} {'reads':>8} {'found':>8} {'absent':>8} {'files checked':>14} "
                  f"{'filter no':>10} {'false pos':>10} {'disk reads':>11} {'cache hits':>11} "
                  f"{'skipped':>8} {'meas FPR':>9} {'pred FPR':>9}")
        print(header, file=out)
        for name, n, _fp in specs:
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
                           "block_cache_hits", "range_skips")}
            checked = d["filter_negatives"] + d["false_positives"] + d["true_positives"]
            absent_checks = d["filter_negatives"] + d["false_positives"]
            skipped = d["filter_negatives"]
            meas = d["false_positives"] / absent_checks if absent_checks else float("nan")
            pred = sum(i.predicted_fpr for i in after) / len(after)
            print(f"  {name:<8} {queries:>8,} {found:>8,} {queries - found:>8,} {checked:>14,} "
                  f"{d['filter_negatives']:>10,} {d['false_positives']:>10,} "
                  f"{d['block_reads']:>11,} {d['block_cache_hits']:>11,} "
                  f"{skipped / checked:>8.1%} {meas:>9.4%} {pred:>9.4%}"
                  f"   ({queries / elapsed:,.0f} gets/s)", file=out)
        print(file=out)
        total_skipped = sum(i.filter_negatives for i in db.sstables())
        total_reads = sum(i.block_reads for i in db.sstables())
        total_hits = sum(i.block_cache_hits for i in db.sstables())
        print(f"  The filters skipped {total_skipped:,} block reads; {total_reads:,} data blocks "
              f"were read from disk and {total_hits:,} served by the block cache.", file=out)
        print("  'filter no' = a block read skipped; 'false pos' = a block read for nothing.",
              file=out)
    return 0
