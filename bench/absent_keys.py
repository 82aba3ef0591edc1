"""What lsmdb's Bloom filters guarantee, cost and save -- measured against the formulas.

    python -m bench.absent_keys [--keys N] [--sstables T] [--queries Q] [--quick]
                                [--json PATH] [--plot PATH]

Builds a real database in a temporary directory: one table per
``bloom_filter_fp_chance`` in the price list, each holding the same N keys
(``b"user:%010d" % 2i``, 100-byte values) loaded in random order and flushed
every N/T keys, so each of the T SSTables spans the whole key range and an
absent key inside it can only be turned away by the file's filter.  No
compaction runs until the last step.  Then five parts:

1. guarantee     -- absent gets find nothing, present gets find everything
                    (false negatives must be 0); measured FPR vs predicted;
                    again after a full compaction when the engine has one.
2. price_list    -- per fp chance: bits/key, filter bytes, data-block reads
                    (engine counter and the kernel's read syscalls), reads
                    skipped, FPR with its 99 % interval, gets per second.
3. k_sweep       -- a standalone BloomFilter at 8 bits/key probed with
                    k = 1 ... 20: the optimum seen from both sides.
4. overfill      -- a filter sized for n keys loaded with n, 2n, 3n keys.
5. absent_share  -- gets/s with and without a filter as the share of
                    absent keys grows: where the filter stops paying.

Tables go to stdout, progress to stderr; ``--json`` writes one object per
part (every row with its measured and predicted values), ``--plot`` a figure
(needs matplotlib: ``pip install 'lsmdb[plot]'``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .common import Progress, ReadSyscalls, describe_machine, load_average, machine_info, write_json
from .db_parts import (
    absent_share_rows,
    guarantee_row,
    part_absent_share,
    part_guarantee,
    part_price_list,
    print_absent_share,
    print_guarantee,
    print_price_list,
)
from .filter_db import (
    GUARANTEE_FP_CHANCE,
    SEED,
    Fixture,
    build_database,
    check_layout,
    compact_tables,
    open_db,
    pick_queries,
)
from .keys import KEY_FORMAT, VALUE_BYTES
from .plot import require_matplotlib, write_plot
from .standalone_parts import part_k_sweep, part_overfill, print_k_sweep, print_overfill

DEFAULT_KEYS = 1_000_000
QUICK_KEYS = 100_000
DEFAULT_QUERIES = 100_000
QUICK_QUERIES = 20_000
DEFAULT_SSTABLES = 8


@dataclass
class Config:
    keys: int
    sstables: int
    queries: int
    quick: bool
    json_path: str | None
    plot_path: str | None


def positive_int(text: str) -> int:
    try:
        value = int(text.replace(",", "").replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_args(argv: Sequence[str] | None) -> Config:
    parser = argparse.ArgumentParser(
        prog="python -m bench.absent_keys",
        description="What lsmdb's Bloom filters guarantee, cost and save in a real database, "
                    "measured against the formulas that predict it.",
        epilog="example: python -m bench.absent_keys --quick --json out.json --plot out.png")
    parser.add_argument("--keys", type=positive_int, metavar="N",
                        help=f"keys in each table (default {DEFAULT_KEYS:,}; {QUICK_KEYS:,} "
                             "with --quick)")
    parser.add_argument("--sstables", type=positive_int, default=DEFAULT_SSTABLES, metavar="T",
                        help=f"SSTables the keys are spread over (default {DEFAULT_SSTABLES})")
    parser.add_argument("--queries", type=positive_int, metavar="Q",
                        help=f"absent and present gets per measurement (default "
                             f"{DEFAULT_QUERIES:,}; {QUICK_QUERIES:,} with --quick)")
    parser.add_argument("--quick", action="store_true",
                        help="a smaller run (under a minute on 2 cores)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--plot", metavar="PATH",
                        help="also draw measured vs predicted as a PNG (needs matplotlib)")
    args = parser.parse_args(argv)
    if args.plot:
        require_matplotlib(parser)
    keys = args.keys or (QUICK_KEYS if args.quick else DEFAULT_KEYS)
    if keys < 10 * args.sstables:
        parser.error(f"--keys {keys} is too few for {args.sstables} SSTables "
                     f"(need at least {10 * args.sstables})")
    queries = args.queries or (QUICK_QUERIES if args.quick else DEFAULT_QUERIES)
    return Config(keys, args.sstables, queries, args.quick, args.json, args.plot)


def run(config: Config, progress: Progress) -> dict[str, Any]:
    """Every part; returns the report (what --json writes)."""
    machine = machine_info()
    syscalls = ReadSyscalls()
    with tempfile.TemporaryDirectory(prefix="lsmdb-bench-") as path:
        tables = build_database(path, config.keys, config.sstables, progress)
        with open_db(path) as db:   # reopened: every filter read back from its file
            check_layout(db, tables, config.sstables)
            absent, present = pick_queries(db, config.keys, config.queries)
            fx = Fixture(db, config.keys, config.sstables, tables, absent, present, syscalls,
                         progress)
            guarantee = [guarantee_row(fx, f"{config.sstables} SSTables")]
            price_list = part_price_list(fx)
            shares = absent_share_rows(fx, f"{config.sstables} SSTables")
            missing = compact_tables(
                db, [tables[GUARANTEE_FP_CHANCE], tables[1.0]], progress)
            if missing is None:
                guarantee.append(guarantee_row(fx, "after full compaction"))
                shares += absent_share_rows(fx, "after full compaction")
            else:
                print(missing, file=sys.stderr)
    compaction_notes = [] if missing is None else [missing]
    filter_keys = max(1, config.keys // config.sstables)
    probes = config.queries * config.sstables
    report: dict[str, Any] = {
        "benchmark": "absent_keys",
        "config": {"keys": config.keys, "sstables": config.sstables, "queries": config.queries,
                   "quick": config.quick, "key_format": KEY_FORMAT.decode(),
                   "value_bytes": VALUE_BYTES, "seed": SEED,
                   "standalone_filter_keys": filter_keys, "standalone_probes": probes},
        "machine": machine,
        "guarantee": part_guarantee(guarantee, config.queries, compaction_notes),
        "price_list": price_list,
        "k_sweep": part_k_sweep(filter_keys, probes, progress),
        "overfill": part_overfill(filter_keys, probes, progress),
        "absent_share": part_absent_share(shares, compaction_notes),
    }
    report["price_list"]["syscr_available"] = syscalls.available
    report["load_average_at_end"] = load_average()
    report["seconds"] = progress.elapsed()
    return report


def print_report(report: dict[str, Any]) -> None:
    c = report["config"]
    print(f"lsmdb absent-key benchmark: {c['keys']:,} keys ({c['key_format']} % 2i, "
          f"{c['value_bytes']}-byte values) in {c['sstables']} SSTables per table, "
          f"{c['queries']:,} queries")
    print(f"machine: {describe_machine(report['machine'])}")
    print()
    print_guarantee(report["guarantee"])
    print_price_list(report["price_list"])
    print_k_sweep(report["k_sweep"])
    print_overfill(report["overfill"])
    print_absent_share(report["absent_share"])
    print(f"total {report['seconds']:.1f}s")


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    progress = Progress()
    report = run(config, progress)
    print_report(report)
    if config.json_path:
        write_json(config.json_path, report)
        progress(f"wrote {config.json_path}")
    if config.plot_path:
        write_plot(config.plot_path, report["price_list"])
        progress(f"wrote {config.plot_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
