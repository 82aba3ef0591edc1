"""What ``lsmdb`` prints about a database: inspect, sstable, trace and advise.

:mod:`lsmdb.cli` parses the command line and runs the commands that read or
change data; this module holds the reports and the helpers that format them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from . import SPEEDUPS
from .db import DB
from .db import open as open_db
from .errors import NotADatabaseError
from .fastpath import LAYOUT_ERRORS
from .files import LOCK_NAME, MANIFEST_NAME, TMP_SUFFIX


class CliError(Exception):
    """A command's failure, said in one line (``lsmdb: ...``) with exit status 1."""


def speedups_line() -> str:
    """Whether the C speedups are on, as the headers of the demo and the benches say it."""
    if SPEEDUPS:
        return "C speedups: on"
    if LAYOUT_ERRORS:
        return ("C speedups: OFF (lsmdb._speedups was built from other sources: rebuild it; "
                "the same code runs in Python, absent-key gets many times slower)")
    return ("C speedups: OFF (built without a C compiler: the same code runs in Python, "
            "absent-key gets about 30x slower; see README, How a read works)")


def open_read_only(path: str) -> DB:
    """The database at ``path`` for reading (no lock: another process may be writing)."""
    try:
        return open_db(path, create_if_missing=False, read_only=True)
    except NotADatabaseError:
        missing = missing_database(path)
        if missing is None:
            raise
        raise missing from None


def _entries(path: str) -> list[str]:
    """A directory's entries, less what a crash in a database's very first open leaves."""
    return [n for n in os.listdir(path) if n not in (LOCK_NAME, MANIFEST_NAME + TMP_SUFFIX)]


def missing_database(path: str, hint: str = "") -> CliError | None:
    """"no database at PATH" (with ``hint``) if ``path`` holds no database yet -- it does
    not exist, or is an empty directory -- else None (the open's own error says why)."""
    if not os.path.lexists(path):
        return CliError(f"no database at {path} (it does not exist){hint}")
    if os.path.isdir(path) and not _entries(path):
        return CliError(f"no database at {path} (an empty directory){hint}")
    return None


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


def dump_json(obj: object) -> None:
    json.dump(_clean_floats(obj), sys.stdout, indent=2, default=_json_default)
    print()


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


def _keys_from_fill(f: dict[str, Any]) -> str:
    keys = f["estimated_keys_from_fill"]
    return "-" if keys is None else f"{keys:,.0f}"


#: The columns of ``lsmdb inspect``: (header, cell of one SSTable, shown without --wide:
#: True, False -- or None: only without).
INSPECT_COLUMNS: list[tuple[str, Any, bool | None]] = [
    ("lvl", lambda f: str(f["level"]), True),
    ("file", lambda f: f["file"], True),
    ("entries", lambda f: f"{f['entries']:,}", True),
    ("tombs", lambda f: f"{f['tombstones']:,}", False),
    ("ttl'd", lambda f: f"{f['expiring_entries']:,}", False),
    ("size", lambda f: _fmt_size(f["size_bytes"]), True),
    ("comp", lambda f: f["compression"], False),
    ("data", lambda f: _fmt_size(f["data_bytes"]), False),
    ("raw data", lambda f: _fmt_size(f["uncompressed_bytes"]), False),
    ("ratio", lambda f: f"{f['compression_ratio']:.2f}", True),
    ("filter", lambda f: _fmt_size(f["filter_bytes"]), False),
    ("bits/key", lambda f: f"{f['bits_per_key']:.2f}", True),
    ("k", lambda f: str(f["filter_hashes"]), False),
    ("fmt", lambda f: "-" if f["filter_version"] is None else str(f["filter_version"]), False),
    ("fp built", lambda f: f"{f['filter_fp_chance']:g}", False),
    ("fp now", lambda f: f"{f['table_fp_chance']:g}" + (" STALE" if f["filter_stale"] else ""),
     False),
    ("fp", lambda f: f"{f['filter_fp_chance']:g}" + ("!" if f["filter_stale"] else ""), None),
    ("fill", lambda f: f"{f['fill_ratio']:.3f}", False),
    ("pred FPR", lambda f: _fmt_rate(f["predicted_fpr"]), True),
    ("FPR(fill)", lambda f: _fmt_rate(f["estimated_fpr_from_fill"]), False),
    ("keys(fill)", _keys_from_fill, False),
    ("range skip", lambda f: f"{f['range_skips']:,}", False),
    ("skipped", lambda f: f"{f['filter_negatives']:,}", True),
    ("true pos", lambda f: f"{f['true_positives']:,}", False),
    ("false pos", lambda f: f"{f['false_positives']:,}", True),
    ("disk reads", lambda f: f"{f['block_reads']:,}", False),
    ("cache hits", lambda f: f"{f['block_cache_hits']:,}", False),
    ("meas FPR", lambda f: _fmt_rate(f["measured_fpr"]), True),
]


def cmd_inspect(args: argparse.Namespace) -> int:
    """Per-SSTable filter statistics and per-table totals."""
    db = open_read_only(args.path)
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
        dump_json(report)
        return 0
    for name, t in report["tables"].items():  # type: ignore[attr-defined]
        opts, totals, files = t["options"], t["totals"], t["sstables"]
        print(f"table {name!r}: compaction={opts['compaction']} "
              f"{opts['filter_family']} fp_chance={opts['bloom_filter_fp_chance']} "
              f"mode={opts['bloom_filter_mode']}  ({len(files)} SSTables)")
        columns = [c for c in INSPECT_COLUMNS if c[2] is not (None if args.wide else False)]
        rows = []
        for f in files:
            rows.append([cell(f) for _name, cell, _narrow in columns])
            if f.get("filter_error"):
                rows[-1][1] += " (FILTER FAILS OPEN)"
        header = [name for name, _cell, _narrow in columns]
        if rows:
            _print_table(rows, header)
        if not args.wide and any(f["filter_stale"] for f in files):
            print("  !: filter built with another fp chance than the table's "
                  "(lsmdb rebuild-filters)")
        share = totals["absent_share"]
        stored = sum(f["data_bytes"] for f in files)
        raw = sum(f["uncompressed_bytes"] for f in files)
        if files:
            print(f"  data: {_fmt_size(stored)} stored, {_fmt_size(raw)} uncompressed "
                  f"(ratio {stored / raw if raw else 1.0:.2f}); compression now "
                  f"{opts['compression']}")
        print(f"  totals: filter {_fmt_size(totals['filter_bytes_on_disk'])} on disk, "
              f"{_fmt_size(totals['filter_bytes_in_memory'])} in memory; reads skipped "
              f"{totals['reads_skipped']:,}; false positives {totals['false_positives']:,}\n"
              f"          measured FPR {_fmt_rate(totals['measured_fpr'])}; point reads "
              f"{totals['gets']:,}, absent share {_fmt_rate(share)}")
        if totals["write_stalls"]:
            print(f"  write stalls: {totals['write_stalls']:,}, "
                  f"{totals['write_stall_seconds']:.3f} s in all (level 0 full)")
        if totals["write_slowdowns"]:
            print(f"  write slowdowns: {totals['write_slowdowns']:,} pauses, "
                  f"{totals['write_slowdown_seconds']:.3f} s in all (level 0 filling)")
        if totals["false_negatives"]:
            print(f"  ERROR: {totals['false_negatives']} false negatives measured in shadow mode")
        if share is not None and share < 0.05:
            print("  note: fewer than 5% of point reads are for absent keys; the filter saves\n"
                  "        little here (consider bloom_filter_fp_chance=1.0 or\n"
                  "        bloom_filter_skip_last_level=True)")
        print()
    return 0


def _shown_properties(props: dict[str, Any]) -> dict[str, Any]:
    """A file's properties as ``lsmdb sstable`` shows them: its dictionary by
    its size (``compression_dict_bytes``), not its bytes."""
    shown = {k: v for k, v in props.items() if k != "compression_dict"}
    if "compression_dict" in props:
        shown["compression_dict_bytes"] = len(props["compression_dict"])
    return shown


def cmd_sstable(args: argparse.Namespace) -> int:
    """One SSTable file, offline: properties, filter header and derived statistics."""
    from .errors import LsmdbError
    from .scan import items as scan_items
    from .sstable_reader import SSTableReader
    from .table import SSTableInfo
    try:
        reader = SSTableReader(args.file)
    except (LsmdbError, OSError) as exc:
        print(f"lsmdb: {exc}", file=sys.stderr)
        return 1
    try:
        info = SSTableInfo.from_reader(str(reader.properties.get("table", "")), reader)
        report = {
            "file": args.file,
            "properties": _shown_properties(reader.properties),
            "filter": reader.filter.describe(),
            "stats": info.to_dict(),
            "handles": {"index": reader.index_handle, "filter": reader.filter_handle,
                        "properties": reader.props_handle},
        }
        keys = []
        if args.keys:
            for key, value in scan_items(reader):
                keys.append((key, value))
    finally:
        reader.close()
    if args.json:
        if args.keys:
            report["entries"] = [_entry_json(k, v) for k, v in keys]
        dump_json(report)
        return 0
    print(f"SSTable {args.file}")
    for k, v in report["properties"].items():
        print(f"  {k:<16} {v!r}")
    f = report["filter"]
    error = f"  ERROR: {f['error']}" if f["error"] else ""
    shape = f"m={f['m']} bits, k={f['k']}, " if "m" in f else ""
    print(f"  filter: version {f['version']}, {shape}n={f['n']}, built with "
          f"fp {f['fp_chance']:g}, hash algorithm {f['hash_algorithm']}, family {f['family']}"
          f"{error}")
    st = report["stats"]
    pieces = (f" (in pieces against a {st['compression_dict_bytes']:,}-byte dictionary)"
              if st["compression_dict_bytes"] else "")
    print(f"  data blocks: {st['compression']}{pieces}, {st['data_bytes']:,} bytes stored, "
          f"{st['uncompressed_bytes']:,} uncompressed (ratio {st['compression_ratio']:.3f})")
    print(f"  bits/key {st['bits_per_key']:.2f}  fill {st['fill_ratio']:.4f}  "
          f"predicted FPR {_fmt_rate(st['predicted_fpr'])}  "
          f"FPR from fill {_fmt_rate(st['estimated_fpr_from_fill'])}  "
          f"keys from fill {st['estimated_keys_from_fill'] or 0:,.0f}")
    for key, value in keys:
        if type(value) is tuple:  # an expiring value: (value, expires)
            print(f"  {key!r} -> {value[0]!r} (expires {_expiry_text(value[1])})")
        else:
            print(f"  {key!r} -> {'<tombstone>' if value is None else repr(value)}")
    return 0


def _entry_json(key: bytes, value: Any) -> dict[str, Any]:
    """One entry of ``lsmdb sstable --keys --json``: hex key and value (None: a
    tombstone), and for an expiring value ``expires`` (microseconds since the epoch)."""
    if type(value) is tuple:
        return {"key": key.hex(), "value": value[0].hex(), "expires": value[1]}
    return {"key": key.hex(), "value": None if value is None else value.hex()}


def _expiry_text(expires_us: int) -> str:
    """An expiry as UTC time (microseconds since the epoch past what datetime holds: as is)."""
    import datetime
    try:
        when = datetime.datetime.fromtimestamp(expires_us / 1e6, datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return f"at {expires_us} us since the epoch"
    return when.isoformat(timespec="microseconds")


def cmd_trace(args: argparse.Namespace) -> int:
    """Explain one point read, file by file."""
    try:
        key = bytes.fromhex(args.key) if args.hex else args.key.encode()
    except ValueError:
        print("lsmdb: KEY is not valid hex", file=sys.stderr)
        return 2
    db = open_read_only(args.path)
    try:
        result = db.trace(key, args.table)
    finally:
        db.close()
    if args.json:
        dump_json(result)
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


def cmd_advise(args: argparse.Namespace) -> int:
    """The price list of Bloom filters for N keys, of each family asked for."""
    n = args.keys
    if n < 1:
        raise CliError(f"--keys must be >= 1, got {n}")
    for p in args.fp or []:
        if not 0 < p < 1:
            raise CliError(f"--fp must be between 0 and 1 (both excluded), got {p:g}")
    b = args.bits_per_key
    if b is not None and not (0 < b and math.isfinite(b)):
        raise CliError(f"--bits-per-key must be a number > 0, got {b:g}")
    for i, family in enumerate(dict.fromkeys(args.family or ["bloom"])):
        if i:
            print()
        _advise_family(family, n, args.fp or [0.1, 0.01, 0.001, 0.0001], b)
    return 0


def _advise_family(family: str, n: int, fps: list[float], b: float | None) -> None:
    """``cmd_advise``'s tables for one filter family (a table's ``filter_family``)."""
    if family == "blocked_bloom":
        from .filters import blocked_bloom as bb

        def shape(p: float) -> tuple[int, int, float]:
            try:
                m, k = bb.filter_shape(n, p)
            except ValueError as exc:
                raise CliError(str(exc)) from None
            return m, k, bb.predicted_fpr_at(n / (m // bb.BLOCK_BITS), k)

        def bits_at(m: int) -> int:  # whole blocks
            return max(1, math.ceil(m / bb.BLOCK_BITS)) * bb.BLOCK_BITS

        def rates(m: int) -> list[tuple[int, float]]:
            blocks = m // bb.BLOCK_BITS
            return [(k, bb.predicted_fpr_at(n / blocks, k)) for k in range(1, 21)]

        title = (f"Blocked Bloom filter price list for {n:,} keys (512-bit blocks, each key's "
                 "k probes in one; sized by docs/FORMAT.md section 5):")
        theory = ""
    else:
        from .filters.bloom import optimal_bits, optimal_hashes, predicted_fpr_for

        def shape(p: float) -> tuple[int, int, float]:
            m = optimal_bits(n, p)
            k = optimal_hashes(n, m)
            return m, k, predicted_fpr_for(n, m, k)

        def bits_at(m: int) -> int:
            return m

        def rates(m: int) -> list[tuple[int, float]]:
            return [(k, predicted_fpr_for(n, m, k)) for k in range(1, 21)]

        title = (f"Bloom filter price list for {n:,} keys "
                 "(m = ceil(-n ln p / ln(2)^2), k = round(m/n ln 2)):")
        theory = f" (theory: {b:g} * ln 2 = {b * math.log(2):.2f})" if b is not None else ""
    rows = []
    for p in fps:
        m, k, fpr = shape(p)
        rows.append([f"{p:g}", f"{m / n:.2f}", str(k), _fmt_size((m + 7) // 8), _fmt_rate(fpr)])
    print(title)
    _print_table(rows, ["fp chance", "bits/key", "k", "filter size", "predicted FPR"])
    if b is not None:
        m = bits_at(max(1, round(b * n)))
        print(f"\nAt {b:g} bits/key ({m:,} bits for {n:,} keys):")
        listed = rates(m)
        best = min(listed, key=lambda r: r[1])
        _print_table([[str(k), _fmt_rate(r) + ("  <- best" if k == best[0] else "")]
                      for k, r in listed], ["k", "predicted FPR"])
        print(f"best k = {best[0]}{theory}")
