"""The ``lsmdb`` command (also ``python -m lsmdb``)."""

from __future__ import annotations

import argparse
import builtins
import dataclasses
import json
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Sequence

from . import __version__
from .db import open as open_db

builtins_open = builtins.open


def _fmt_int(n: int) -> str:
    return f"{n:,}"


def cmd_demo(args: argparse.Namespace) -> int:
    """Build two tables, flush several SSTables, read present and absent keys."""
    path = args.path or tempfile.mkdtemp(prefix="lsmdb-demo-")
    out = sys.stdout
    rng = random.Random(args.seed)
    specs = [("users", args.keys * 2 // 3, 0.01), ("events", args.keys // 3, 0.001)]
    print(f"lsmdb demo: database at {path}", file=out)
    # No background compaction: each absent key should meet every SSTable's filter.
    with open_db(path, auto_compaction=False) as db:
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
            print(f"  loaded {_fmt_int(n)} keys into {name!r} (fp chance {fp}) in {elapsed:.1f}s "
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


def _fmt_rate(x: float | None) -> str:
    return "-" if x is None else f"{x:.4%}"


def _fmt_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def _print_table(rows: list[list[str]], header: list[str], out=None) -> None:
    """Aligned columns: text left, numbers right."""
    out = out or sys.stdout
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(header)]
    numeric = [all(_looks_numeric(r[i]) for r in rows) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if num else c.ljust(w)
                         for c, w, num in zip(cells, widths, numeric, strict=True)).rstrip()
    print(line(header), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for r in rows:
        print(line(r), file=out)


def _looks_numeric(text: str) -> bool:
    return bool(text) and (text[0].isdigit() or text[0] in "-.")


def _progress(label: str):
    """A progress callback printing to stderr when it is a terminal (else None)."""
    if not sys.stderr.isatty():
        return None
    started = time.monotonic()

    def report(done: int) -> None:
        print(f"\r{label}: {done:,} ({time.monotonic() - started:.1f}s)", end="",
              file=sys.stderr, flush=True)
    return report


def _open_read_only(path: str):
    from .errors import LsmdbError
    try:
        return open_db(path, create_if_missing=False, read_only=True)
    except LsmdbError as exc:
        print(f"lsmdb: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _json_default(obj: object) -> object:
    if isinstance(obj, bytes):
        return obj.hex()
    raise TypeError(type(obj).__name__)


def _clean_floats(obj: object) -> object:
    """JSON has no NaN/inf: map them to null."""
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return None
    if isinstance(obj, dict):
        return {k: _clean_floats(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean_floats(v) for v in obj]
    return obj


def _dump_json(obj: object) -> None:
    json.dump(_clean_floats(obj), sys.stdout, indent=2, default=_json_default)
    print()


def cmd_inspect(args: argparse.Namespace) -> int:
    """Per-SSTable filter statistics and per-table totals."""
    db = _open_read_only(args.path)
    try:
        names = [args.table] if args.table else db.tables()
        report: dict[str, object] = {"tables": {}}
        for name in names:
            table = db.table(name)
            infos = db.sstables(name)
            report["tables"][name] = {  # type: ignore[index]
                "options": table.options.to_dict(),
                "totals": db.table_stats(name),
                "sstables": [i.to_dict() for i in infos],
            }
    finally:
        db.close()
    if args.json:
        _dump_json(report)
        return 0
    for name, t in report["tables"].items():  # type: ignore[attr-defined]
        opts, totals, files = t["options"], t["totals"], t["sstables"]
        print(f"table {name!r}: compaction={opts['compaction']} "
              f"bloom_filter_fp_chance={opts['bloom_filter_fp_chance']} "
              f"mode={opts['bloom_filter_mode']}  ({len(files)} SSTables)")
        header = ["lvl", "file", "entries", "tombs", "size", "filter", "bits/key", "k", "fmt",
                  "fp built",
                  "fp now", "fill", "pred FPR", "FPR(fill)", "keys(fill)", "range skip",
                  "skipped", "true pos", "false pos", "disk reads", "cache hits", "meas FPR"]
        rows = []
        for f in files:
            keys_fill = f["estimated_keys_from_fill"]
            rows.append([
                str(f["level"]), f["file"], f"{f['entries']:,}", f"{f['tombstones']:,}",
                _fmt_size(f["size_bytes"]), _fmt_size(f["filter_bytes"]),
                f"{f['bits_per_key']:.2f}", str(f["filter_hashes"]),
                "-" if f["filter_version"] is None else str(f["filter_version"]),
                f"{f['filter_fp_chance']:g}",
                f"{f['table_fp_chance']:g}" + (" STALE" if f["filter_stale"] else ""),
                f"{f['fill_ratio']:.3f}", _fmt_rate(f["predicted_fpr"]),
                _fmt_rate(f["estimated_fpr_from_fill"]),
                "-" if keys_fill is None else f"{keys_fill:,.0f}",
                f"{f['range_skips']:,}", f"{f['filter_negatives']:,}",
                f"{f['true_positives']:,}", f"{f['false_positives']:,}", f"{f['block_reads']:,}",
                f"{f['block_cache_hits']:,}",
                _fmt_rate(f["measured_fpr"]),
            ])
            if f.get("filter_error"):
                rows[-1][1] += " (FILTER FAILS OPEN)"
        if rows:
            _print_table(rows, header)
        share = totals["absent_share"]
        print(f"  totals: filter {_fmt_size(totals['filter_bytes_on_disk'])} on disk, "
              f"{_fmt_size(totals['filter_bytes_in_memory'])} in memory; "
              f"reads skipped {totals['reads_skipped']:,}; false positives "
              f"{totals['false_positives']:,}; measured FPR {_fmt_rate(totals['measured_fpr'])}; "
              f"point reads {totals['gets']:,}, absent share {_fmt_rate(share)}")
        if totals["false_negatives"]:
            print(f"  ERROR: {totals['false_negatives']} false negatives measured in shadow mode")
        if share is not None and share < 0.05:
            print("  note: fewer than 5% of point reads are for absent keys; the filter saves "
                  "little here (consider bloom_filter_fp_chance=1.0 or "
                  "bloom_filter_skip_last_level=True)")
        print()
    return 0


def cmd_sstable(args: argparse.Namespace) -> int:
    """One SSTable file, offline: properties, filter header and derived statistics."""
    from .errors import LsmdbError
    from .sstable import SSTableReader
    from .table import SSTableInfo
    try:
        reader = SSTableReader(args.file)
    except (LsmdbError, OSError) as exc:
        print(f"lsmdb: {exc}", file=sys.stderr)
        return 1
    try:
        info = SSTableInfo.from_reader(str(reader.properties.get("table", "")), reader)
        bloom = reader.bloom
        report = {
            "file": args.file,
            "properties": reader.properties,
            "filter": {"version": getattr(bloom, "version", None),
                       "hash_algorithm": getattr(bloom, "hash_algorithm", None),
                       "m": bloom.m, "k": bloom.k, "n": bloom.n, "fp_chance": bloom.fp_chance,
                       "key_id": getattr(bloom, "key_id", None), "error": reader.filter_error},
            "stats": info.to_dict(),
            "handles": {"index": reader.index_handle, "filter": reader.filter_handle,
                        "properties": reader.props_handle},
        }
        keys = []
        if args.keys:
            for key, value in reader.iter_range(None, None):
                keys.append((key, value))
    finally:
        reader.close()
    if args.json:
        if args.keys:
            report["entries"] = [{"key": k.hex(), "value": None if v is None else v.hex()}
                                 for k, v in keys]
        _dump_json(report)
        return 0
    print(f"SSTable {args.file}")
    for k, v in report["properties"].items():
        print(f"  {k:<16} {v!r}")
    f = report["filter"]
    error = f"  ERROR: {f['error']}" if f["error"] else ""
    print(f"  filter: version {f['version']}, m={f['m']} bits, k={f['k']}, n={f['n']}, built with "
          f"fp {f['fp_chance']:g}, hash algorithm {f['hash_algorithm']}{error}")
    st = report["stats"]
    print(f"  bits/key {st['bits_per_key']:.2f}  fill {st['fill_ratio']:.4f}  "
          f"predicted FPR {_fmt_rate(st['predicted_fpr'])}  "
          f"FPR from fill {_fmt_rate(st['estimated_fpr_from_fill'])}  "
          f"keys from fill {st['estimated_keys_from_fill'] or 0:,.0f}")
    for key, value in keys:
        print(f"  {key!r} -> {'<tombstone>' if value is None else repr(value)}")
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    """Explain one point read, file by file."""
    try:
        key = bytes.fromhex(args.key) if args.hex else args.key.encode()
    except ValueError:
        print("lsmdb: KEY is not valid hex", file=sys.stderr)
        return 2
    db = _open_read_only(args.path)
    try:
        result = db.trace(key, args.table)
    finally:
        db.close()
    if args.json:
        _dump_json(result)
        return 0
    print(f"trace of get({key!r}) in table {result['table']!r}  "
          f"(xxh3_64 = {result['hash']:#018x}; h1 = {result['h1']}, h2 = {result['h2']})")
    for step in result["steps"]:
        if "source" in step:
            print(f"  {step['source']}: {step['result']}")
            continue
        if "file" not in step:
            print(f"  level {step['level']}: no file's key range holds the key "
                  f"({step['files_in_level']} files)")
            continue
        where = f"  L{step['level']} {step['file']}:"
        if step["outcome"] == "range_skip":
            print(f"{where} range skip (key outside [{step['min_key']}, {step['max_key']}] hex)")
        elif step["outcome"] == "filter_absent":
            print(f"{where} filter says absent: probe {step['probe']} of "
                  f"{step['filter_hashes']} hit bit {step['bit']} of {step['filter_bits']}, "
                  "which is 0 -> disk read skipped")
        else:
            blk = step.get("block")
            said = "filter says maybe" if step["outcome"] == "filter_maybe" else "no filter"
            block = f"read block {blk['index']} (offset {blk['offset']}, {blk['size']} bytes)" \
                if blk else "no block can hold the key"
            print(f"{where} {said} -> {block} -> {step['result'].replace('_', ' ')}")
    print(f"  result: {result['result']}" +
          (f" ({len(result['value']) // 2} bytes)" if result["value"] else ""))
    print(f"  {result['files_consulted']} files: {result['range_skips']} range skips, "
          f"{result['filter_skips']} filter skips, {result['block_reads']} block reads")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Check every checksum and that every key passes its own filter."""
    from .verify import verify_database
    problems = verify_database(args.path)
    for p in problems:
        print(p)
    errors = [p for p in problems if p.severity == "error"]
    print(f"verify {args.path}: {len(errors)} errors, {len(problems) - len(errors)} warnings")
    return 1 if errors else 0


def cmd_repair(args: argparse.Namespace) -> int:
    """Rebuild a database that does not open from what still reads; set the rest aside in lost/."""
    from .errors import LsmdbError
    from .repair import repair_database
    from .verify import verify_database
    try:
        report = repair_database(args.path, dry_run=args.dry_run)
    except (LsmdbError, OSError) as exc:
        print(f"lsmdb: {exc}", file=sys.stderr)
        return 1
    if args.json:
        _dump_json(dataclasses.asdict(report))
    else:
        for line in report.lines():
            print(line)
    if args.dry_run:
        return 0
    errors = [p for p in verify_database(args.path) if p.severity == "error"]
    for p in errors:
        print(p, file=sys.stderr)
    if not args.json:
        print("verify after repair: " + ("no errors" if not errors else f"{len(errors)} errors"))
    return 1 if errors else 0


def cmd_advise(args: argparse.Namespace) -> int:
    """The price list of Bloom filters for N keys."""
    from .bloom import optimal_bits, optimal_hashes, predicted_fpr_for
    n = args.keys
    rows = []
    for p in args.fp or [0.1, 0.01, 0.001, 0.0001]:
        m = optimal_bits(n, p)
        k = optimal_hashes(n, m)
        rows.append([f"{p:g}", f"{m / n:.2f}", str(k), _fmt_size((m + 7) // 8),
                     _fmt_rate(predicted_fpr_for(n, m, k))])
    print(f"Bloom filter price list for {n:,} keys "
          "(m = ceil(-n ln p / ln(2)^2), k = round(m/n ln 2)):")
    _print_table(rows, ["fp chance", "bits/key", "k", "filter size", "predicted FPR"])
    if args.bits_per_key:
        b = args.bits_per_key
        m = max(1, round(b * n))
        print(f"\nAt {b:g} bits/key ({m:,} bits for {n:,} keys):")
        rates = [(k, predicted_fpr_for(n, m, k)) for k in range(1, 21)]
        best = min(rates, key=lambda r: r[1])
        _print_table([[str(k), _fmt_rate(r) + ("  <- best" if k == best[0] else "")]
                      for k, r in rates], ["k", "predicted FPR"])
        print(f"best k = {best[0]} (theory: {b:g} * ln 2 = {b * math.log(2):.2f})")
    return 0


def _open_rw(path: str, create: bool = False):
    from .errors import LsmdbError
    try:
        return open_db(path, create_if_missing=create, auto_compaction=create)
    except LsmdbError as exc:
        print(f"lsmdb: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def cmd_rebuild_filters(args: argparse.Namespace) -> int:
    """Rewrite stale filters (data blocks copied byte for byte)."""
    tty = sys.stderr.isatty()
    n = 0
    with _open_rw(args.path) as db:
        for name in [args.table] if args.table else db.tables():
            if tty:
                print(f"rebuilding the filters of table {name!r}...", file=sys.stderr)
            done = db.rebuild_filters(name, only_stale=not args.all)
            n += done
            if tty:
                print(f"  {done} SSTables rewritten", file=sys.stderr)
    print(f"rebuilt the filters of {n} SSTables")
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    """Full compaction of a table (or every table)."""
    with _open_rw(args.path) as db:
        before = len(db.sstables(args.table))
        started = time.monotonic()
        if sys.stderr.isatty():
            print("compacting...", file=sys.stderr)
        db.compact(args.table)
        after = len(db.sstables(args.table))
    print(f"compacted {before} SSTables into {after} in {time.monotonic() - started:.1f}s")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Every live key and value of a table, in key order."""
    from .transfer import export_table
    db = _open_read_only(args.path)
    try:
        if args.out:
            with builtins_open(args.out, "w", newline="", encoding="utf-8") as out:
                n = export_table(db, args.table, args.format, out,
                                 progress=_progress("exported"))
        else:
            n = export_table(db, args.table, args.format, sys.stdout,
                             progress=_progress("exported"))
    finally:
        db.close()
    if sys.stderr.isatty():
        print(f"\nexported {n:,} rows", file=sys.stderr)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """Load a JSONL export into a table (the database and table are created if missing)."""
    from .transfer import import_jsonl
    with _open_rw(args.path, create=True) as db:
        if args.table not in db.tables():
            db.create_table(args.table)
        with builtins_open(args.file, "r", encoding="utf-8") as infile:
            n = import_jsonl(db, args.table, infile, progress=_progress("imported"))
    print(f"imported {n:,} rows into {args.table!r}", file=sys.stderr)
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
    demo.add_argument("--keys", type=int, default=300_000,
                      help="keys over both tables (default 300000)")
    demo.add_argument("--sstables", type=int, default=4, help="SSTables per table (default 4)")
    demo.add_argument("--queries", type=int, default=100_000,
                      help="gets per table (default 100000)")
    demo.add_argument("--seed", type=int, default=1, help="random seed for the queries")
    demo.set_defaults(func=cmd_demo)

    def add(name: str, func, help_text: str, example: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=(func.__doc__ or help_text).strip(),
                           epilog=f"example: {example}")
        p.set_defaults(func=func)
        return p

    p = add("inspect", cmd_inspect, "per-SSTable filter statistics and table totals",
            "lsmdb inspect /tmp/demo-db --table users --json")
    p.add_argument("path")
    p.add_argument("--table", help="only this table")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = add("sstable", cmd_sstable, "one SSTable file offline: properties, filter, statistics",
            "lsmdb sstable /tmp/demo-db/000003.sst --keys")
    p.add_argument("file")
    p.add_argument("--json", action="store_true")
    p.add_argument("--keys", action="store_true", help="also dump every entry")

    p = add("trace", cmd_trace, "explain one point read file by file",
            "lsmdb trace /tmp/demo-db users:0000000001 --table users")
    p.add_argument("path")
    p.add_argument("key", help="the key, as UTF-8 text (or hex with --hex)")
    p.add_argument("--table")
    p.add_argument("--hex", action="store_true", help="KEY is hexadecimal")
    p.add_argument("--json", action="store_true")

    p = add("verify", cmd_verify, "check every checksum and every key against its filter",
            "lsmdb verify /tmp/demo-db")
    p.add_argument("path")

    p = add("repair", cmd_repair, "rebuild a database that does not open; set aside what "
            "does not read in lost/", "lsmdb repair /tmp/demo-db")
    p.add_argument("path")
    p.add_argument("--dry-run", action="store_true", help="report what would be done, change "
                   "nothing")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = add("advise", cmd_advise, "Bloom filter price list for N keys",
            "lsmdb advise --keys 1000000 --fp 0.01 0.001 --bits-per-key 8")
    p.add_argument("--keys", type=int, required=True)
    p.add_argument("--fp", type=float, nargs="+", help="fp chances (default 0.1 0.01 0.001 0.0001)")
    p.add_argument("--bits-per-key", type=float, help="also show the FPR for k = 1..20")

    p = add("rebuild-filters", cmd_rebuild_filters,
            "rewrite filters built with another fp chance than the table's current one",
            "lsmdb rebuild-filters /tmp/demo-db --table users")
    p.add_argument("path")
    p.add_argument("--table")
    p.add_argument("--all", action="store_true", help="rewrite every filter, not only stale ones")

    p = add("compact", cmd_compact, "full compaction of one table or all",
            "lsmdb compact /tmp/demo-db --table users")
    p.add_argument("path")
    p.add_argument("--table")

    p = add("export", cmd_export, "dump a table as jsonl, csv or a Cassandra CREATE TABLE",
            "lsmdb export /tmp/demo-db --table users --format jsonl --out users.jsonl")
    p.add_argument("path")
    p.add_argument("--table", default="default")
    p.add_argument("--format", choices=["jsonl", "csv", "cql"], default="jsonl")
    p.add_argument("--out", help="output file (default: stdout)")

    p = add("import", cmd_import, "load a jsonl export into a table",
            "lsmdb import /tmp/other-db --table users users.jsonl")
    p.add_argument("path")
    p.add_argument("--table", default="default")
    p.add_argument("file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from .errors import LsmdbError
    try:
        return int(args.func(args))
    except LsmdbError as exc:  # a clear one-line message, not a traceback
        print(f"lsmdb: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `lsmdb inspect PATH --json | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
