"""The ``lsmdb`` commands that write: put, delete, import, create-table, compact, rebuild-filters.

They open the database with :func:`writable`: a database that does not exist
is created only with ``--create`` (put, import, create-table), and a command
that fails after creating it removes what it created -- nothing is left
behind -- and only that.  :mod:`lsmdb.cli` parses the command line.
"""

from __future__ import annotations

import argparse
import builtins
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields

from .cli_report import CliError, missing_database
from .db import DB
from .db import open as open_db
from .errors import NotADatabaseError
from .options import OPTION_CHOICES, OPTION_HELP, TableOptions, validate_table_name
from .ttl import validate_ttl

builtins_open = builtins.open

#: What a command that can create its database adds to "no database at PATH".
CREATE_HINT = ": pass --create to create one"


@contextmanager
def writable(path: str, create: bool = False, hint: str = "",
             bulk: bool = False) -> Iterator[DB]:
    """The database at ``path`` for writing (background compaction only when ``bulk``);
    every write durable when it is closed.

    Without ``create`` a missing database is a CliError ending in ``hint``.  With
    it the database is created if missing, and if the command then fails, what
    it created is removed: the directories the open made, or the files made in
    a directory that was empty.
    """
    made = _outermost_missing(path) if create else None
    was_empty = create and made is None and os.path.isdir(path) and not os.listdir(path)
    db: DB | None = None
    try:
        try:
            db = open_db(path, create_if_missing=create, auto_compaction=bulk)
        except NotADatabaseError:
            missing = None if create else missing_database(path, hint)
            if missing is None:
                raise
            raise missing from None
        yield db
        db.close()
    except BaseException:
        try:
            if db is not None:
                db.close()  # idempotent: a close that failed above is not tried twice
        finally:
            _remove_created(path, made, was_empty)
        raise


def _outermost_missing(path: str) -> str | None:
    """The outermost of ``path`` and its parents that does not exist -- what an open
    creating ``path`` makes -- or None when ``path`` exists."""
    path = os.path.abspath(path)
    outermost = None
    while not os.path.lexists(path):
        outermost = path
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return outermost


def _remove_created(path: str, made: str | None, was_empty: bool) -> None:
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
    elif was_empty:
        for name in os.listdir(path):
            full = os.path.join(path, name)
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full, ignore_errors=True)
            else:
                os.unlink(full)


def bytes_arg(text: str, hex_: bool, what: str) -> bytes:
    if not hex_:
        return os.fsencode(text) if isinstance(text, str) else text
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise CliError(f"{what} is not valid hex: {text!r}") from None


def progress_callback(label: str) -> Callable[[int], None] | None:
    """A progress callback printing to stderr when it is a terminal (else None)."""
    if not sys.stderr.isatty():
        return None
    started = time.monotonic()

    def report(done: int) -> None:
        print(f"\r{label}: {done:,} ({time.monotonic() - started:.1f}s)", end="",
              file=sys.stderr, flush=True)
    return report


# ----------------------------------------------------------------- keys
def cmd_put(args: argparse.Namespace) -> int:
    """Set one key to a value (durable when the command returns)."""
    key = bytes_arg(args.key, args.hex, "KEY")
    value = bytes_arg(args.value, args.hex, "VALUE")
    if args.ttl is not None:
        validate_ttl(args.ttl, "--ttl")  # before anything is created
    with writable(args.path, create=args.create, hint=CREATE_HINT) as db:
        db.table(args.table).put(key, value, sync=True, ttl=args.ttl)
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    """Delete one key (no error when it is absent; durable when the command returns)."""
    key = bytes_arg(args.key, args.hex, "KEY")
    with writable(args.path) as db:
        db.table(args.table).delete(key, sync=True)
    return 0


# ----------------------------------------------------------------- tables
def table_option_arguments(p: argparse.ArgumentParser) -> None:
    """``--OPTION-NAME VALUE`` for every table option, typed as the option is."""
    for f in fields(TableOptions):
        flag = "--" + f.name.replace("_", "-")
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        if f.name in OPTION_CHOICES:
            p.add_argument(flag, choices=OPTION_CHOICES[f.name], help=OPTION_HELP[f.name])
        elif kind == "bool":
            p.add_argument(flag, type=_bool_text, metavar="{true,false}",
                           help=OPTION_HELP[f.name])
        elif kind in ("int", "float"):
            p.add_argument(flag, type=int if kind == "int" else float, metavar=kind.upper(),
                           help=OPTION_HELP[f.name])
        else:  # pragma: no cover - a new option of a new type needs a parser here
            raise TypeError(f"table option {f.name!r} of type {kind} has no command line form")


def _bool_text(text: str) -> bool:
    lowered = text.lower()
    if lowered not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return lowered == "true"


def cmd_create_table(args: argparse.Namespace) -> int:
    """Create a table with the options given (the others at their defaults)."""
    options = {f.name: getattr(args, f.name) for f in fields(TableOptions)
               if getattr(args, f.name) is not None}
    validate_table_name(args.name)
    TableOptions.resolve(options)  # a bad value is refused before anything is created
    with writable(args.path, create=args.create, hint=CREATE_HINT) as db:
        db.create_table(args.name, **options)
    shown = " ".join(f"{k}={v!r}" for k, v in options.items())
    print(f"created table {args.name!r}" + (f" ({shown})" if shown else ""))
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """Load a JSONL export (lsmdb export), with the options of its tables.

    Without --table each row goes back to the table its line names (an export
    of every table), or to the default table.  Tables are created as needed,
    with the export's options; a table that exists keeps its own options
    unless it is empty with every option at its default (a note says which
    options it kept)."""
    from .transfer import import_jsonl

    def note(text: str) -> None:
        print(f"lsmdb: note: {text}", file=sys.stderr)

    with builtins_open(args.file, "rb") as infile, \
            writable(args.path, create=args.create, hint=CREATE_HINT, bulk=True) as db:
        n = import_jsonl(db, args.table, infile, progress=progress_callback("imported"),
                         create_tables=True, note=note)
    print(f"imported {n:,} rows", file=sys.stderr)
    return 0


# ----------------------------------------------------------------- maintenance
def cmd_rebuild_filters(args: argparse.Namespace) -> int:
    """Rewrite stale filters (data blocks copied byte for byte)."""
    tty = sys.stderr.isatty()
    n = 0
    with writable(args.path) as db:
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
    with writable(args.path) as db:
        before = len(db.sstables(args.table))
        started = time.monotonic()
        if sys.stderr.isatty():
            print("compacting...", file=sys.stderr)
        db.compact(args.table)
        after = len(db.sstables(args.table))
    print(f"compacted {before} SSTables into {after} in {time.monotonic() - started:.1f}s")
    return 0
