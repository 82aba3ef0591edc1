"""The ``lsmdb`` command (also ``python -m lsmdb``).

Every command's ``--help`` shows an example, and every argument has a help
text.  An error is one line on stderr (``lsmdb: ...``) and exit status 1 (2
for a command line that does not parse), never a traceback.  The reports
(``demo``, ``inspect``, ``sstable``, ``trace``, ``advise``) are in
:mod:`lsmdb.cli_report`; the commands that write (``put``, ``delete``,
``import``, ``create-table``, ``compact``, ``rebuild-filters``) in
:mod:`lsmdb.cli_write`.
"""

from __future__ import annotations

import argparse
import builtins
import dataclasses
import os
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from . import __version__
from .cli_demo import cmd_demo
from .cli_report import (
    CliError,
    cmd_advise,
    cmd_inspect,
    cmd_sstable,
    cmd_trace,
    dump_json,
    open_read_only,
    speedups_line,
)
from .cli_write import (
    bytes_arg,
    cmd_compact,
    cmd_create_table,
    cmd_delete,
    cmd_import,
    cmd_put,
    cmd_rebuild_filters,
    progress_callback,
    table_option_arguments,
)
from .errors import LsmdbError
from .options import OPTION_CHOICES

builtins_open = builtins.open


def _show(data: bytes, hex_: bool) -> str:
    """Bytes as text: hex, or UTF-8 with undecodable bytes and unprintable characters
    escaped (``\\xff``, ``\\x00``, ``\\t``): one pair a line, whatever the data."""
    if hex_:
        return data.hex()
    text = data.decode("utf-8", "backslashreplace")
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


# ----------------------------------------------------------------- quick looks
def cmd_get(args: argparse.Namespace) -> int:
    """Print the value of one key (exit status 1 when it is absent)."""
    key = bytes_arg(args.key, args.hex, "KEY")
    with open_read_only(args.path) as db:
        value = db.table(args.table).get(key)
    if value is None:
        raise CliError(f"no key {_show(key, args.hex)!r} in table {args.table!r}")
    print(_show(value, args.hex))
    return 0


def cmd_scan(args: argparse.Namespace) -> int:
    """Print keys and values in key order, one pair a line (KEY, a tab, VALUE)."""
    bounds = {name: bytes_arg(getattr(args, name), args.hex, f"--{name}")
              for name in ("start", "end", "prefix") if getattr(args, name) is not None}
    if args.limit is not None and args.limit < 0:
        raise CliError("--limit must be >= 0")
    with open_read_only(args.path) as db:
        for n, (key, value) in enumerate(db.table(args.table).scan(reverse=args.reverse,
                                                                     **bounds)):
            if args.limit is not None and n >= args.limit:
                break
            print(f"{_show(key, args.hex)}\t{_show(value, args.hex)}")
    return 0


# ----------------------------------------------------------------- maintenance
def cmd_verify(args: argparse.Namespace) -> int:
    """Check every checksum, every key against its filter, and the WAL against the manifest."""
    from .verify import verify_database
    problems = verify_database(args.path)
    for p in problems:
        print(p)
    errors = [p for p in problems if p.severity == "error"]
    print(f"verify {args.path}: {len(errors)} errors, {len(problems) - len(errors)} warnings")
    return 1 if errors else 0


def cmd_repair(args: argparse.Namespace) -> int:
    """Rebuild a database that does not open from what still reads; set the rest aside in lost/."""
    from .repair import repair_database
    from .verify import verify_database
    report = repair_database(args.path, dry_run=args.dry_run)
    if args.json:
        dump_json(dataclasses.asdict(report))
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


def cmd_checkpoint(args: argparse.Namespace) -> int:
    """A consistent, openable copy of the database at DEST, taken while another process may
    write: SSTables hard linked where the file system allows, the unflushed WAL copied, all of
    it fsynced before the command returns."""
    with open_read_only(args.path) as db:
        dest = db.checkpoint(args.dest)
    print(f"checkpoint of {args.path} at {dest}")
    return 0


# ----------------------------------------------------------------- export / import
def cmd_export(args: argparse.Namespace) -> int:
    """Every live key and value of a table (or, without --table, of every table), in key order."""
    from .transfer import export_table, export_tables

    def run(out: TextIO) -> int:
        progress = progress_callback("exported")
        if args.table is None:
            return export_tables(db, args.format, out, progress=progress)
        return export_table(db, args.table, args.format, out, progress=progress)

    if args.table is None and args.format == "csv":
        raise CliError("a CSV export holds one table: name it with --table")
    with open_read_only(args.path) as db:
        if args.out:
            with builtins_open(args.out, "w", newline="", encoding="utf-8") as out:
                n = run(out)
        else:
            n = run(sys.stdout)
    if sys.stderr.isatty():
        print(f"\nexported {n:,} rows", file=sys.stderr)
    return 0


# ----------------------------------------------------------------- the parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lsmdb",
        description="lsmdb: an embedded LSM key-value store with per-SSTable Bloom filters.",
        epilog="example: lsmdb demo /tmp/demo-db",
    )
    parser.add_argument("--version", action="version",
                        version=f"lsmdb {__version__} ({speedups_line()})",
                        help="show the version and whether the C speedups are on")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND",
                                help="what to do (lsmdb COMMAND --help: its arguments)")

    def add(name: str, func: Callable[[argparse.Namespace], int], help_text: str,
            example: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=(func.__doc__ or help_text).strip(),
                           epilog=f"example: {example}")
        p.set_defaults(func=func)
        return p

    def path(p: argparse.ArgumentParser) -> None:
        p.add_argument("path", help="the database directory")

    def table(p: argparse.ArgumentParser, default: str | None = None,
              help_text: str = "only this table (default: every table)") -> None:
        if default is not None:
            help_text = f"the table (default: {default})"
        p.add_argument("--table", default=default, help=help_text)

    def create(p: argparse.ArgumentParser) -> None:
        p.add_argument("--create", action="store_true",
                       help="create the database if it does not exist (removed again if the "
                       "command fails)")

    def json_out(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", action="store_true", help="machine-readable output")

    def key_args(p: argparse.ArgumentParser, value: bool = False) -> None:
        path(p)
        p.add_argument("key", help="the key, as UTF-8 text (or hex with --hex)")
        if value:
            p.add_argument("value", help="the value, as UTF-8 text (or hex with --hex)")
        table(p, "default")
        p.add_argument("--hex", action="store_true", help="keys and values in hexadecimal")

    p = add("demo", cmd_demo, "build a sample database and show the disk reads the filters skip",
            "lsmdb demo /tmp/demo-db --keys 300000")
    p.add_argument("path", nargs="?", help="database directory: new, empty, or one an earlier "
                   "demo built (default: a new temporary one)")
    p.add_argument("--keys", type=int, default=300_000,
                   help="keys over both tables (default 300000)")
    p.add_argument("--sstables", type=int, default=4, help="SSTables per table (default 4)")
    p.add_argument("--queries", type=int, default=100_000, help="gets per table (default 100000)")
    p.add_argument("--seed", type=int, default=1, help="random seed for the queries")
    p.add_argument("--force", action="store_true", help="build in a database the demo did not "
                   "build, replacing its tables 'users' and 'events'")

    p = add("get", cmd_get, "print the value of one key", "lsmdb get /tmp/demo-db user:1")
    key_args(p)
    p = add("put", cmd_put, "set one key", "lsmdb put /tmp/new-db user:1 alice --create")
    key_args(p, value=True)
    p.add_argument("--ttl", type=float, metavar="SECONDS",
                   help="seconds until the value reads as absent (default: the table's "
                        "default_time_to_live; 0: never)")
    create(p)
    p = add("delete", cmd_delete, "delete one key", "lsmdb delete /tmp/demo-db user:1")
    key_args(p)
    p = add("scan", cmd_scan, "print keys and values in key order",
            "lsmdb scan /tmp/demo-db --table users --prefix users: --limit 10")
    path(p)
    table(p, "default")
    p.add_argument("--prefix", help="only keys starting with this")
    p.add_argument("--start", help="from this key on (included)")
    p.add_argument("--end", help="up to this key (excluded)")
    p.add_argument("--limit", type=int, help="at most this many pairs")
    p.add_argument("--reverse", action="store_true", help="in descending key order")
    p.add_argument("--hex", action="store_true", help="keys and values in hexadecimal")

    p = add("create-table", cmd_create_table, "create a table with its options",
            "lsmdb create-table /tmp/new-db events --bloom-filter-fp-chance 0.001 --create")
    path(p)
    p.add_argument("name", help="the new table's name (1-64 letters, digits, '_', '-')")
    create(p)
    table_option_arguments(p)

    p = add("inspect", cmd_inspect, "per-SSTable filter statistics and table totals",
            "lsmdb inspect /tmp/demo-db --table users --json")
    path(p)
    table(p)
    p.add_argument("--wide", action="store_true", help="every column (default: those that fit "
                   "in 100 columns)")
    json_out(p)

    p = add("sstable", cmd_sstable, "one SSTable file offline: properties, filter, statistics",
            "lsmdb sstable /tmp/demo-db/000003.sst --keys")
    p.add_argument("file", help="the SSTable file (NNNNNN.sst)")
    json_out(p)
    p.add_argument("--keys", action="store_true", help="also dump every entry")

    p = add("trace", cmd_trace, "explain one point read file by file",
            "lsmdb trace /tmp/demo-db users:0000000001 --table users")
    path(p)
    p.add_argument("key", help="the key, as UTF-8 text (or hex with --hex)")
    table(p, help_text="the table (default: the default table)")
    p.add_argument("--hex", action="store_true", help="KEY is hexadecimal")
    json_out(p)

    p = add("verify", cmd_verify, "check every checksum, every key against its filter, the WAL",
            "lsmdb verify /tmp/demo-db")
    path(p)

    p = add("repair", cmd_repair, "rebuild a database that does not open; set aside what "
            "does not read in lost/", "lsmdb repair /tmp/demo-db")
    path(p)
    p.add_argument("--dry-run", action="store_true", help="report what would be done, change "
                   "nothing")
    json_out(p)

    p = add("checkpoint", cmd_checkpoint, "a consistent copy of a live database that opens as "
            "a database of its own", "lsmdb checkpoint /tmp/demo-db /backups/demo-copy")
    path(p)
    p.add_argument("dest", help="the new directory (must not exist; its parent must)")

    p = add("advise", cmd_advise, "Bloom filter price list for N keys, per filter family",
            "lsmdb advise --keys 1000000 --fp 0.01 0.001 --bits-per-key 8 "
            "--family bloom blocked_bloom")
    p.add_argument("--keys", type=int, required=True, help="the number of keys, >= 1")
    p.add_argument("--fp", type=float, nargs="+", help="fp chances, each between 0 and 1 "
                   "(default 0.1 0.01 0.001 0.0001)")
    p.add_argument("--bits-per-key", type=float, help="also show the FPR for k = 1..20 at this "
                   "many bits per key (> 0)")
    p.add_argument("--family", nargs="+", choices=OPTION_CHOICES["filter_family"],
                   help="the filter families to price, one table each (default bloom; a "
                   "table's filter_family option)")

    p = add("rebuild-filters", cmd_rebuild_filters,
            "rewrite filters built with another fp chance than the table's current one",
            "lsmdb rebuild-filters /tmp/demo-db --table users")
    path(p)
    table(p)
    p.add_argument("--all", action="store_true", help="rewrite every filter, not only stale ones")

    p = add("compact", cmd_compact, "full compaction of one table or all",
            "lsmdb compact /tmp/demo-db --table users")
    path(p)
    table(p)

    p = add("export", cmd_export, "dump tables (and their options) as jsonl, csv or Cassandra "
            "CREATE TABLEs", "lsmdb export /tmp/demo-db --table users --format jsonl --out "
            "users.jsonl")
    path(p)
    table(p, help_text="only this table (default: every table; csv needs one)")
    p.add_argument("--format", choices=["jsonl", "csv", "cql"], default="jsonl",
                   help="jsonl: rows and table options, for lsmdb import; csv: rows as CQL "
                   "blobs; cql: CREATE TABLE statements (default jsonl)")
    p.add_argument("--out", help="output file (default: stdout)")

    p = add("import", cmd_import, "load a jsonl export, with its tables' options",
            "lsmdb import /tmp/other-db users.jsonl --table users --create")
    path(p)
    p.add_argument("file", help="the JSONL file (lsmdb export --format jsonl)")
    p.add_argument("--table", help="load every row into this table (default: the table each "
                   "line names)")
    create(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except BrokenPipeError:  # e.g. `lsmdb scan PATH | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print("lsmdb: interrupted", file=sys.stderr)
        return 130
    except (CliError, LsmdbError, OSError, ValueError, TypeError) as exc:
        print(f"lsmdb: {_one_line(exc)}", file=sys.stderr)
        return 1


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, OSError) and exc.filename and str(exc.filename) not in text:
        text = f"{text}: {exc.filename}"
    return text


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
