"""Export a table to JSON Lines, CSV or a CQL schema, and import JSON Lines back.

Formats of :func:`export_table`:

``jsonl``
    one JSON object per line, ``{"key": "<base64>", "value": "<base64>"}``
    (standard base64 with padding); :func:`import_jsonl` reads it back, byte
    for byte.  An export of every table (:func:`export_tables`) adds
    ``"table": "<name>"`` to each line, and the import puts each row back in
    its table.  Before its rows, each table has one line of its options,
    ``{"options": {...}}`` (every option of :class:`lsmdb.TableOptions`; with
    ``"table"`` in an export of every table), which the import restores
    (:func:`import_jsonl` says when); an export without them (``options=False``,
    or an older lsmdb's) imports as before.  A value that expires has
    ``"ttl"``: its seconds left when the export began; the import gives it
    that time to live again, and a row without ``"ttl"`` never expires (the
    table's ``default_time_to_live`` does not apply to it).  Values expired
    when the export began are not exported.
``csv``
    a header line ``key,value``, then one line per row with key and value as
    CQL blob literals (``0x`` followed by lowercase hex; the empty value is
    ``0x``), ready for ``cqlsh``'s ``COPY ... FROM ... WITH HEADER = true`` or
    DSBulk.  It carries no time to live: expiring values are written as they
    are, live ones only.
``cql``
    the ``CREATE TABLE`` statement of a Cassandra table to load that CSV into:
    ``key blob PRIMARY KEY, value blob``, with the table's
    ``bloom_filter_fp_chance`` and its compaction strategy mapped to
    Cassandra's.  Schema only: it writes no rows.

Lines end with ``\\n``.  Exports stream: one data block per SSTable is in
memory at a time, whatever the size of the table, and they read a snapshot
of the table taken when the export starts.

    >>> import io, lsmdb, tempfile
    >>> from lsmdb.transfer import export_table, import_jsonl
    >>> src, dst = tempfile.TemporaryDirectory(), tempfile.TemporaryDirectory()
    >>> with lsmdb.open(src.name) as db:
    ...     db[b"k\\x00"] = b"\\xff"
    ...     db[b""] = b""
    ...     out = io.StringIO()
    ...     export_table(db, "default", "jsonl", out)
    2
    >>> print(out.getvalue(), end="")  # doctest: +ELLIPSIS
    {"options": {"bloom_filter_fp_chance": 0.01, ...}}
    {"key": "", "value": ""}
    {"key": "awA=", "value": "/w=="}
    >>> with lsmdb.open(dst.name) as db:
    ...     import_jsonl(db, "default", io.StringIO(out.getvalue()))
    ...     list(db.scan())
    2
    [(b'', b''), (b'k\\x00', b'\\xff')]
    >>> src.cleanup(); dst.cleanup()
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterable
from typing import Any, TextIO

from .db import DB
from .handles import Table
from .keys import MAX_KEY_SIZE_BYTES, MAX_VALUE_SIZE_BYTES
from .options import DEFAULT_TABLE, TableOptions, validate_table_name
from .ttl import remaining_seconds, validate_ttl

__all__ = ["FORMATS", "cql_create_table", "export_table", "export_tables", "import_jsonl"]

#: The formats :func:`export_table` writes.
FORMATS = ("jsonl", "csv", "cql")

#: Default number of rows between two calls of a ``progress`` callback.
DEFAULT_PROGRESS_EVERY = 10_000

#: lsmdb compression -> Cassandra's compression map (CQL).
CASSANDRA_COMPRESSION = {"lz4": "{'class': 'LZ4Compressor'}",
                         "zstd": "{'class': 'ZstdCompressor'}",
                         "none": "{'enabled': 'false'}"}

#: lsmdb compaction strategy -> Cassandra compaction class.
CASSANDRA_COMPACTION = {
    "size_tiered": "SizeTieredCompactionStrategy",
    "leveled": "LeveledCompactionStrategy",
}

#: Cassandra refuses a ``bloom_filter_fp_chance`` at or below this (the best
#: its Bloom filter calculations support); lsmdb accepts down to 1e-6.
CASSANDRA_MIN_FP_CHANCE = 6.71e-05
#: What a lower lsmdb value is exported as: Cassandra's best filter.
CASSANDRA_LOWEST_FP_CHANCE = 6.72e-05

# An import batch is committed at this many bytes of keys and values even
# before ``batch_size`` rows (an lsmdb batch may hold at most 512 MiB).
_IMPORT_BATCH_BYTES = 64 * 1024 * 1024

ProgressCallback = Callable[[int], Any]
NoteCallback = Callable[[str], Any]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _jsonl_lines(rows: Iterable[tuple[bytes, Any]], table: str | None = None,
                 now_us: int = 0) -> Iterable[str]:
    """A JSONL export's row lines: an expiring value (value, expires) with
    ``"ttl"``, its seconds left at ``now_us``."""
    named = "" if table is None else f', "table": {json.dumps(table)}'
    for key, value in rows:
        if type(value) is tuple:
            left = remaining_seconds(value, now_us)
            yield (f'{{"key": "{_b64(key)}", "value": "{_b64(value[0])}", '
                   f'"ttl": {json.dumps(left)}{named}}}\n')
            continue
        yield f'{{"key": "{_b64(key)}", "value": "{_b64(value)}"{named}}}\n'


def _options_line(options: TableOptions, table: str | None = None) -> str:
    """The line of a table's options that comes before its rows in a JSONL export."""
    named = "" if table is None else f'"table": {json.dumps(table)}, '
    return f'{{{named}"options": {json.dumps(options.to_dict())}}}\n'


def _csv_lines(rows: Iterable[tuple[bytes, bytes]]) -> Iterable[str]:
    for key, value in rows:
        yield f"0x{key.hex()},0x{value.hex()}\n"


def _jsonl_rows(handle: Table, table: str | None = None) -> Iterable[str]:
    """A JSONL export's row lines of ``handle`` (``table``: named in each line),
    expiring values with their time left."""
    rows, now_us = handle._scan_expiring()
    return _jsonl_lines(rows, table, now_us)


def _cql_identifier(name: str) -> str:
    """``name`` as a quoted CQL identifier (quoted: case kept, no keyword clash)."""
    return '"' + name.replace('"', '""') + '"'


def cql_create_table(table_name: str, options: Any) -> str:
    """The Cassandra ``CREATE TABLE`` statement for a table named ``table_name``.

    ``options`` is a :class:`lsmdb.TableOptions` (or any object with a
    ``bloom_filter_fp_chance`` attribute and optionally ``compaction``,
    ``min_threshold``, ``max_threshold``).  The compaction strategy maps to
    Cassandra's class of the same idea (``size_tiered`` ->
    ``SizeTieredCompactionStrategy``, ``leveled`` ->
    ``LeveledCompactionStrategy``; anything else is a ``ValueError``); size
    tiered's ``min_threshold``/``max_threshold`` mean the same in both and are
    written when they differ from the common defaults 4 and 32.  The name is
    double-quoted (so it keeps its case and may be a CQL keyword such as
    ``default``); ``-``, which Cassandra does not allow in table names,
    becomes ``_``, and an fp chance below what Cassandra supports becomes the
    lowest it does; both changes are noted in a ``--`` comment.

        >>> import lsmdb
        >>> print(cql_create_table("events", lsmdb.TableOptions(bloom_filter_fp_chance=0.001)))
        CREATE TABLE "events" (
            key blob PRIMARY KEY,
            value blob
        ) WITH bloom_filter_fp_chance = 0.001
            AND compaction = {'class': 'SizeTieredCompactionStrategy'}
            AND compression = {'class': 'LZ4Compressor'}
            AND default_time_to_live = 0;

    ``compression`` maps to Cassandra's compressor of the same algorithm
    (``lz4`` -> ``LZ4Compressor``, ``zstd`` -> ``ZstdCompressor``, ``none`` ->
    ``{'enabled': 'false'}``); ``default_time_to_live`` means the same in both.
    """
    compaction = getattr(options, "compaction", "size_tiered")
    try:
        compaction_class = CASSANDRA_COMPACTION[compaction]
    except (KeyError, TypeError):
        raise ValueError(f"no Cassandra equivalent for compaction strategy {compaction!r}; "
                         f"known: {', '.join(CASSANDRA_COMPACTION)}") from None
    notes = []
    cass_name = table_name.replace("-", "_")
    if cass_name != table_name:
        notes.append(f"-- lsmdb table {table_name!r}: Cassandra table names allow only letters, "
                     "digits and '_'")
    fp_chance = float(options.bloom_filter_fp_chance)
    if fp_chance <= CASSANDRA_MIN_FP_CHANCE:
        notes.append(f"-- lsmdb bloom_filter_fp_chance {fp_chance!r} is below what Cassandra "
                     f"supports (> {CASSANDRA_MIN_FP_CHANCE!r}); using its lowest")
        fp_chance = CASSANDRA_LOWEST_FP_CHANCE
    strategy = [f"'class': '{compaction_class}'"]
    if compaction == "size_tiered":
        lo = getattr(options, "min_threshold", 4)
        hi = getattr(options, "max_threshold", 32)
        if (lo, hi) != (4, 32):
            strategy += [f"'min_threshold': '{int(lo)}'", f"'max_threshold': '{int(hi)}'"]
    lines = notes + [
        f"CREATE TABLE {_cql_identifier(cass_name)} (",
        "    key blob PRIMARY KEY,",
        "    value blob",
        f") WITH bloom_filter_fp_chance = {fp_chance!r}",
        f"    AND compaction = {{{', '.join(strategy)}}}",
        f"    AND compression = {CASSANDRA_COMPRESSION[getattr(options, 'compression', 'lz4')]}",
        f"    AND default_time_to_live = {int(getattr(options, 'default_time_to_live', 0))};",
    ]
    return "\n".join(lines)


def export_table(db: DB, table: str | None, fmt: str, out: TextIO, *,
                 progress: ProgressCallback | None = None,
                 progress_every: int = DEFAULT_PROGRESS_EVERY, options: bool = True) -> int:
    """Write every live row of ``table`` to the text stream ``out`` in key order.

    ``table`` is a table name (None: ``"default"``); ``fmt`` is ``"jsonl"``,
    ``"csv"`` or ``"cql"`` (see the module documentation).  Returns the number
    of rows written (0 for ``"cql"``, which writes the schema only).  Memory
    use does not grow with the table.  JSONL begins with the line of the
    table's options unless ``options`` is False.

    ``progress``, if given, is called with the number of rows written so far
    after every ``progress_every`` rows, and once at the end with the total
    (unless the last call already reported it).

    Cassandra does not accept every lsmdb row: a partition key may not be
    empty (lsmdb's empty key is valid) nor longer than 65535 bytes.  Such
    rows are exported as they are; loading them into Cassandra fails.

        >>> import io, lsmdb, tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> with lsmdb.open(tmp.name) as db:
        ...     db[b"a"] = b"\\x01\\x02"
        ...     db[b"b"] = b""
        ...     out = io.StringIO()
        ...     export_table(db, None, "csv", out, progress=print, progress_every=1)
        1
        2
        2
        >>> print(out.getvalue(), end="")
        key,value
        0x61,0x0102
        0x62,0x
        >>> tmp.cleanup()
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
    if isinstance(progress_every, bool) or not isinstance(progress_every, int) \
            or progress_every < 1:
        raise ValueError(f"progress_every must be a positive int, got {progress_every!r}")
    handle = db.table(DEFAULT_TABLE if table is None else table)
    if fmt == "cql":
        out.write(cql_create_table(handle.name, handle.options) + "\n")
        if progress is not None:
            progress(0)
        return 0
    if fmt == "csv":
        out.write("key,value\n")
        lines = _csv_lines(handle.scan())
    else:
        lines = _jsonl_rows(handle)  # the view first: writes during the export are not in it
        if options:
            out.write(_options_line(handle.options))
    count = _write_lines(lines, out, 0, progress, progress_every)
    if progress is not None and count % progress_every:
        progress(count)
    return count


def _write_lines(lines: Iterable[str], out: TextIO, count: int,
                 progress: ProgressCallback | None, progress_every: int) -> int:
    write = out.write
    for line in lines:
        write(line)
        count += 1
        if progress is not None and count % progress_every == 0:
            progress(count)
    return count


def export_tables(db: DB, fmt: str, out: TextIO, *, progress: ProgressCallback | None = None,
                  progress_every: int = DEFAULT_PROGRESS_EVERY, options: bool = True) -> int:
    """Every table of ``db``, in name order: JSON Lines whose lines name their table
    (each table's rows after the line of its options, unless ``options`` is False), or
    (``"cql"``) one ``CREATE TABLE`` per table.  CSV holds one table only: ValueError.

        >>> import io, lsmdb, tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> with lsmdb.open(tmp.name) as db:
        ...     db.create_table("t").put(b"k", b"v")
        ...     out = io.StringIO()
        ...     export_tables(db, "jsonl", out, options=False)
        1
        >>> print(out.getvalue(), end="")
        {"key": "aw==", "value": "dg==", "table": "t"}
        >>> tmp.cleanup()
    """
    if fmt == "csv":
        raise ValueError("a CSV export holds one table: name it (--table)")
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
    count = 0
    for name in db.tables():
        handle = db.table(name)
        if fmt == "cql":
            out.write(cql_create_table(name, handle.options) + "\n")
            continue
        lines = _jsonl_rows(handle, name)
        if options:
            out.write(_options_line(handle.options, name))
        count = _write_lines(lines, out, count, progress, progress_every)
    if progress is not None and (fmt == "cql" or count % progress_every):
        progress(count)
    return count


def _decode_field(obj: dict, name: str, lineno: int) -> bytes:
    text = obj.get(name)
    if not isinstance(text, str):
        what = "missing" if name not in obj else f"not a string but {type(text).__name__}"
        raise ValueError(f"line {lineno}: field {name!r} is {what}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"line {lineno}: field {name!r} is not valid base64: {exc}") from None


def import_jsonl(db: DB, table: str | None, infile: Iterable[str | bytes],
                 batch_size: int = 10_000,
                 progress: ProgressCallback | None = None, *,
                 create_tables: bool = False, note: NoteCallback | None = None) -> int:
    """Load a JSON Lines export (see :func:`export_table`) into ``table``; returns rows loaded.

    ``infile`` is a text stream or a binary one (UTF-8), or any iterable of
    lines (``str`` or ``bytes``).  Each line must be a JSON object with
    base64 strings ``"key"`` and ``"value"`` (other fields are ignored; blank
    lines are skipped), or a line of table options (``"options"`` and no
    ``"key"``).  ``table`` None: each row goes to the table its line names
    (``"table"``; ``"default"`` when it names none), which must exist unless
    ``create_tables``.  Rows are written in atomic batches (``db.batch()``) of
    ``batch_size`` rows -- fewer if they reach 64 MiB -- and ``progress``, if
    given, is called with the number of rows loaded so far after each batch.
    Existing keys are overwritten; keys not in the file are left alone.

    Table options: a table the import creates (``create_tables``) gets the
    options of its line, and so does a table that exists but is as new --
    empty, every option at its default (the default table of a new
    database).  A table with data or options of its own keeps its options;
    ``note``, if given, is called with a line naming those that differ.  A
    line of options naming no table (an export of one table) applies to the
    table its rows go to; with ``table`` given, lines naming a table are
    ignored (their rows all go to ``table``).

    A bad line raises ``ValueError`` naming its line number, after the rows
    before it were written: re-running the import from that line resumes it.

        >>> import io, lsmdb, tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> data = io.StringIO('{"key": "YQ==", "value": "MQ=="}\\n{"key": "Yg=="}\\n')
        >>> with lsmdb.open(tmp.name) as db:
        ...     import_jsonl(db, None, data)
        Traceback (most recent call last):
        ...
        ValueError: line 2: field 'value' is missing
        >>> with lsmdb.open(tmp.name) as db:
        ...     db.get(b"a")
        b'1'
        >>> tmp.cleanup()
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if table is not None and not (create_tables and table not in db.tables()):
        db.table(table)  # NoSuchTableError now rather than at the first row
    known = set(db.tables())
    with_rows: set[str] = set()   # the tables this import wrote (or is about to write) rows to
    loaded = 0
    pending: list[tuple[bytes, bytes, str, float]] = []
    pending_bytes = 0

    def commit() -> None:
        nonlocal loaded, pending_bytes
        if not pending:
            return
        with db.batch() as batch:
            for key, value, name, ttl in pending:
                batch.put(key, value, table=name, ttl=ttl)
        loaded += len(pending)
        pending.clear()
        pending_bytes = 0
        if progress is not None:
            progress(loaded)

    def target(name: Any, lineno: int, options: TableOptions | None = None) -> str:
        """The table a line's rows (or options) go to, created if it may be."""
        if not isinstance(name, str) or name not in known:
            if not create_tables or not isinstance(name, str):
                raise ValueError(f"line {lineno}: no table {name!r} in the database")
            try:
                validate_table_name(name)
            except ValueError as exc:
                raise ValueError(f"line {lineno}: {exc}") from None
            db.create_table(name, **_explicit(options or TableOptions()))
            known.add(name)
        return name

    lineno = 0
    try:
        for lineno, line in enumerate(infile, 1):
            if isinstance(line, (bytes, bytearray)):
                try:
                    line = line.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise ValueError(f"line {lineno}: not valid UTF-8: {exc}") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except RecursionError:
                raise ValueError(f"line {lineno}: not an export line: JSON nested too "
                                 "deeply to read") from None
            except ValueError as exc:
                raise ValueError(f"line {lineno}: not valid JSON: {exc}") from None
            if not isinstance(obj, dict):
                raise ValueError(f"line {lineno}: expected a JSON object, got "
                                 f"{type(obj).__name__}")
            if "options" in obj and "key" not in obj:
                if table is not None and "table" in obj:
                    continue
                options = _options_of(obj["options"], lineno)
                name = table if table is not None else obj.get("table", DEFAULT_TABLE)
                if not isinstance(name, str) or name not in known:
                    target(name, lineno, options)
                else:
                    _restore(db.table(name), options, name in with_rows, db, note)
                continue
            key = _decode_field(obj, "key", lineno)
            value = _decode_field(obj, "value", lineno)
            if len(key) > MAX_KEY_SIZE_BYTES:
                raise ValueError(f"line {lineno}: key of {len(key)} bytes exceeds the limit of "
                                 f"{MAX_KEY_SIZE_BYTES} bytes")
            if len(value) > MAX_VALUE_SIZE_BYTES:
                raise ValueError(f"line {lineno}: value of {len(value)} bytes exceeds the limit "
                                 f"of {MAX_VALUE_SIZE_BYTES} bytes")
            ttl = _ttl_of(obj, lineno)
            name = target(table if table is not None else obj.get("table", DEFAULT_TABLE),
                          lineno)
            with_rows.add(name)
            pending.append((key, value, name, ttl))
            pending_bytes += len(key) + len(value)
            if len(pending) >= batch_size or pending_bytes >= _IMPORT_BATCH_BYTES:
                commit()
    except UnicodeDecodeError as exc:
        commit()
        # A text stream decodes a whole chunk ahead of the line being read.
        raise ValueError(f"line {lineno + 1} or a later one: not valid text ({exc}); open the "
                         "file in binary mode to have the exact line named") from None
    except ValueError:
        commit()
        raise
    commit()
    return loaded


def _ttl_of(obj: dict, lineno: int) -> float:
    """A row's time to live: its ``"ttl"`` (seconds left when it was exported),
    or 0 -- it never expired there, so it never expires here either, whatever
    the table's ``default_time_to_live``."""
    if "ttl" not in obj:
        return 0
    try:
        return validate_ttl(obj["ttl"])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"line {lineno}: field 'ttl': {exc}") from None


def _options_of(raw: Any, lineno: int) -> TableOptions:
    """The table options of an options line (ValueError naming the line if they are not)."""
    if not isinstance(raw, dict):
        raise ValueError(f"line {lineno}: table options must be a JSON object, got "
                         f"{type(raw).__name__}")
    try:
        return TableOptions.resolve(raw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"line {lineno}: {exc}") from None


def _explicit(options: TableOptions) -> dict[str, Any]:
    """The options that differ from the defaults: what to set for ``options`` to resolve."""
    defaults = TableOptions().to_dict()
    return {k: v for k, v in options.to_dict().items() if defaults[k] != v}


def _restore(handle: Table, options: TableOptions, has_rows: bool, db: DB,
             note: NoteCallback | None) -> None:
    """Give an existing table the options of the export if it is as new; else say so."""
    current = handle.options
    if current == options:
        return
    if current == TableOptions() and not has_rows and _is_empty(handle):
        db.alter_table(handle.name, **_explicit(options))
        return
    if note is not None:
        theirs, ours = options.to_dict(), current.to_dict()
        changed = ", ".join(f"{k}={theirs[k]!r} (kept {ours[k]!r})"
                            for k in theirs if theirs[k] != ours[k])
        note(f"table {handle.name!r} exists with options of its own, kept: the export has "
             f"{changed}")


def _is_empty(handle: Table) -> bool:
    rows = handle.scan()
    try:
        return next(rows, None) is None
    finally:
        close = getattr(rows, "close", None)
        if close is not None:
            close()
