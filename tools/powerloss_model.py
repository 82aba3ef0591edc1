"""The model behind tools/powerloss.py: what a crash image of lsmdb may hold, and the check
of one image against it.

The rules, as :func:`check_image` applies them to a crash image written to a
directory:

* ``verify_database`` reports no error, before opening and after (a
  directory without ``MANIFEST`` is allowed only before the first open
  returned);
* it opens, and ``get`` agrees with ``scan`` on every key either knows of; a
  read-only open before it (which repairs nothing) reads the same rows;
* tables: every acknowledged create, drop and alter took effect, with the
  options it set (each is durable when its call returns); the one in flight
  may or may not have;
* data: writes are numbered in the order they were acknowledged.  The
  *durable point* is the last acknowledged write covered by a later
  ``db.sync()``, ``db.close()``, ``db.flush(...)`` or ``db.compact(...)``
  (any table: a flush makes every earlier write durable), or by its own
  ``sync=True`` (which covers every earlier write too).  The rows must be
  exactly those of writes 1..k applied, for some k from the durable point to
  the last acknowledged write -- or the write in flight too, whole.  That one
  rule keeps every covered write, makes batches all-or-nothing, keeps
  deletes deleted, and lets no older or unacknowledged value replace a newer
  acknowledged one (each value names the operation that wrote it);
* a second open of the same image reads the same rows.

The upper bound (acknowledged, in flight) is read after an image is taken and
the lower (durable) before it, so that an image taken while another thread
writes is judged by bounds that hold for every byte it may contain.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import lsmdb
from lsmdb.verify import verify_database


def tag_of(value: bytes | None) -> str:
    return "nothing" if value is None else value.split(b"|", 1)[0].decode()


# ----------------------------------------------------------------------- model
Schema = dict[str, tuple[int, dict[str, Any]]]    # table -> (epoch, explicit options)


@dataclass(frozen=True)
class Durable:
    """A durable point: writes 1..point must survive, since the call ``why``."""

    point: int = 0
    why: str = "nothing yet"
    rule: str = "nothing yet"     # the kind of call: "sync", "flush(name)", "close", ...


@dataclass(frozen=True)
class Bounds:
    """What an image of one moment may hold."""

    durable: Durable      # what must survive
    acked: int            # writes acknowledged (the largest k, without the one in flight)
    pending_write: bool   # a write is in flight (k may be acked + 1)
    inflight: str         # the call in flight, "" for none
    schemas: tuple[Schema, ...]   # the tables: as acknowledged, or with the one in flight
    opened: bool          # the first open had returned

    @property
    def top(self) -> int:
        return self.acked + self.pending_write

    def key(self) -> tuple[Any, ...]:
        return (self.durable.point, self.acked, self.pending_write, repr(self.schemas),
                self.opened)


class Model:
    """The acknowledged writes and tables, and the call in flight.

    Writes are numbered 1, 2, ... in acknowledgement order; ``history`` holds,
    per (table, epoch, key), the (write number, value|None) changes, so the
    value after writes 1..k is a short walk away.  A table's epoch counts its
    creations: writes before a drop never belong to the table created again.
    Thread-safe: the observer reads it from whichever thread fsyncs.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked = 0
        self.durable = Durable()
        self.schema: Schema = {"default": (0, {})}
        self.epochs: dict[str, int] = {"default": 0}
        self.history: dict[tuple[str, int, bytes], list[tuple[int, bytes | None]]] = {}
        self.keys_of: dict[str, set[bytes]] = {}              # any epoch
        self.epoch_keys: dict[tuple[str, int], set[bytes]] = {}
        self.writes: list[str] = [""]     # description of write n
        self.writer: dict[bytes, int] = {}  # value -> the write that stored it
        self.opened = False               # the first open returned
        self._inflight = ""
        self._pending: list[tuple[str, int, bytes]] | None = None   # a write's history keys
        self._pending_schema: Schema | None = None                 # a table change's result

    # -- the workload's side
    def begin_write(self, desc: str, ops: list[tuple[str, bytes, bytes | None]]) -> None:
        with self.lock:
            n = self.acked + 1
            touched = []
            for table, key, value in ops:
                hkey = (table, self.epochs[table], key)
                hist = self.history.setdefault(hkey, [])
                if hist and hist[-1][0] == n:
                    hist[-1] = (n, value)      # a later op of the batch wins
                else:
                    hist.append((n, value))
                    touched.append(hkey)
                self.keys_of.setdefault(table, set()).add(key)
                self.epoch_keys.setdefault(hkey[:2], set()).add(key)
                if value is not None:
                    self.writer[value] = n
            self._pending, self._inflight = touched, desc

    def begin_table(self, desc: str, name: str, options: dict[str, Any] | None,
                    create: bool = False) -> None:
        """A create (``create``), alter (``options`` merged) or drop (``options`` None)."""
        with self.lock:
            after = dict(self.schema)
            if options is None:
                del after[name]
            elif create:
                after[name] = (self.epochs.get(name, -1) + 1, dict(options))
            else:
                epoch, old = after[name]
                after[name] = (epoch, {**old, **options})
            self._pending_schema, self._inflight = after, desc

    def begin(self, desc: str) -> None:
        with self.lock:
            self._inflight = desc

    def ack(self, durable: str = "", why: str = "") -> None:
        """The call in flight returned; ``durable`` (the rule, e.g. ``"sync"``): every
        acknowledged write is durable now."""
        with self.lock:
            if self._pending is not None:
                self.acked += 1
                self.writes.append(self._inflight)
            if self._pending_schema is not None:
                self.schema = self._pending_schema
                for name, (epoch, _options) in self.schema.items():
                    self.epochs[name] = epoch
            if durable and self.acked:
                self.durable = Durable(self.acked, why or self._inflight, durable)
            self._pending = self._pending_schema = None
            self._inflight = ""

    def abort(self) -> None:
        """The call in flight failed: forget it."""
        with self.lock:
            for hkey in self._pending or ():
                self.history[hkey].pop()
            self._pending = self._pending_schema = None
            self._inflight = ""

    # -- the checker's side
    def lower(self) -> Durable:
        with self.lock:
            return self.durable

    def bounds(self, lower: Durable | None = None) -> Bounds:
        """The bounds of now; ``lower`` (from :meth:`lower`) taken before the image was.

        (The image may hold what was written while it was taken, so the upper
        bound is read after it; the lower one before, so that it cannot
        claim more than was durable when the image began.)
        """
        with self.lock:
            durable = lower if lower is not None else self.durable
            schemas = (self.schema,) + ((self._pending_schema,) if self._pending_schema else ())
            return Bounds(durable, self.acked, self._pending is not None,
                          self._inflight,
                          tuple({n: (e, dict(o)) for n, (e, o) in s.items()} for s in schemas),
                          self.opened)

    def recovered(self, k: int, why: str) -> None:
        """The database was replaced by a crash image holding writes 1..k: the
        writes after k never happened, and the rest is durable."""
        with self.lock:
            for hist in self.history.values():
                while hist and hist[-1][0] > k:
                    hist.pop()
            self.acked = k
            self.durable = Durable(k, why, "recovery after a power cut")
            del self.writes[k + 1:]

    def value_at(self, table: str, epoch: int, key: bytes, k: int) -> bytes | None:
        value = None
        for n, v in self.history.get((table, epoch, key), ()):
            if n > k:
                break
            value = v
        return value

    def allowed(self, table: str, epoch: int, key: bytes, found: bytes | None,
                lo: int, hi: int) -> list[tuple[int, int]]:
        """The k in [lo, hi] (as intervals) after whose writes ``key`` reads ``found``."""
        out = []
        start, value = 0, None
        for n, v in [*self.history.get((table, epoch, key), []), (hi + 1, None)]:
            if value == found and max(start, lo) <= min(n - 1, hi):
                out.append((max(start, lo), min(n - 1, hi)))
            if n > hi:
                break
            start, value = n, v
        return out

    def describe(self, value: bytes | None) -> str:
        if value is None:
            return "nothing"
        n = self.writer.get(value)
        if n is None:
            return f"{tag_of(value)} (never written)"
        return f"{tag_of(value)} (write #{n}: " + (
            self.writes[n] if n < len(self.writes) else "in flight") + ")"


def _intersect(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for lo1, hi1 in a:
        for lo2, hi2 in b:
            lo, hi = max(lo1, lo2), min(hi1, hi2)
            if lo <= hi:
                out.append((lo, hi))
    return out


# ------------------------------------------------------------------- checking
Rows = dict[str, dict[bytes, bytes]]
Found = tuple[str, str]      # (the rule that failed, the particulars)


def errors_of(path: str) -> list[str]:
    return [str(p) for p in verify_database(path) if p.severity == "error"]


def read_all(db: lsmdb.DB, model: Model) -> tuple[Rows, dict[str, Any], list[Found]]:
    """Every table's rows by scan, their options, and the keys where get disagrees."""
    rows: Rows = {}
    options: dict[str, Any] = {}
    problems = []
    for name in db.tables():
        table = db.table(name)
        scanned = dict(table.scan())
        for key in sorted(set(scanned) | model.keys_of.get(name, set())):
            got = table.get(key)
            if got != scanned.get(key):
                problems.append(("get disagrees with scan", f"{name} {key!r}: get "
                                 f"{tag_of(got)}, scan {tag_of(scanned.get(key))}"))
        rows[name], options[name] = scanned, table.options
    return rows, options, problems


def compare(rows: Rows, options: dict[str, Any], bounds: Bounds,
            model: Model) -> tuple[list[Found], int | None]:
    """Problems of recovered ``rows`` against the model, and the largest k whose
    prefix of writes they are (None: no allowed k fits)."""
    tables: list[Found] = []
    data: list[Found] = []
    for schema in bounds.schemas:
        if set(rows) != set(schema):
            tables.append(("tables differ", f"found {sorted(rows)}, expected {sorted(schema)}"))
            continue
        wrong = [f"{name}.{opt} = {getattr(options[name], opt)!r}, expected {want!r}"
                 for name, (_e, opts) in sorted(schema.items()) for opt, want in opts.items()
                 if getattr(options[name], opt) != want]
        if wrong:
            tables.append(("table options differ", "; ".join(wrong)))
            continue
        fits = _fits(rows, schema, model, bounds.durable.point, bounds.top)
        if fits:
            return [], fits[-1][1]
        data.append(_explain(rows, schema, model, bounds))
    return (data or tables)[:1], None


def _keys(rows: Rows, schema: Schema, model: Model) -> list[tuple[str, int, bytes]]:
    return [(name, epoch, key) for name, (epoch, _options) in sorted(schema.items())
            for key in sorted(set(rows[name]) | model.epoch_keys.get((name, epoch), set()))]


def _fits(rows: Rows, schema: Schema, model: Model, lo: int, hi: int) -> list[tuple[int, int]]:
    """The k in [lo, hi] whose prefix of writes reads exactly ``rows`` (as intervals)."""
    cands = [(lo, hi)]
    for name, epoch, key in _keys(rows, schema, model):
        cands = _intersect(cands, model.allowed(name, epoch, key, rows[name].get(key), lo, hi))
        if not cands:
            break
    return cands


def _explain(rows: Rows, schema: Schema, model: Model, bounds: Bounds) -> Found:
    """Which bound failed, and the rows that differ from the closest allowed prefix."""
    keys = _keys(rows, schema, model)
    head = (f"durable point: write #{bounds.durable.point} ({bounds.durable.why}); "
            f"acknowledged: {bounds.acked}" + (f"; in flight: {bounds.inflight}"
                                               if bounds.inflight else ""))

    def diff(k: int) -> list[str]:
        return [f"{t} {key!r}: found {model.describe(rows[t].get(key))}, "
                f"after writes 1..{k}: {model.describe(model.value_at(t, e, key, k))}"
                for t, e, key in keys if rows[t].get(key) != model.value_at(t, e, key, k)]

    earlier = _fits(rows, schema, model, 0, bounds.top)
    if earlier:
        lines = diff(bounds.durable.point)
        return (f"durable writes lost after {bounds.durable.rule}",
                f"the rows are those of writes 1..{earlier[-1][1]} at most; {head}; "
                f"{len(lines)} rows differ:\n      " + "\n      ".join(lines[:6]))

    span = range(bounds.durable.point, bounds.top + 1)
    sample = sorted(set(span[::max(1, len(span) // 100)]) | {span[-1]})
    best = min(sample, key=lambda k: (len(diff(k)), -k))
    lines = diff(best)
    return ("not a prefix of the acknowledged writes",
            f"{head}; closest: writes 1..{best}, {len(lines)} rows differ:\n      "
            + "\n      ".join(lines[:6]))


def check_image(dest: str, image: dict[str, bytes], bounds: Bounds,
                model: Model) -> tuple[list[Found], int | None]:
    """Problems of the image written at ``dest`` (none: it is sound), and the
    number of writes whose prefix it holds."""
    problems: list[Found] = []
    before: Rows | None = None
    if "MANIFEST" in image:
        problems += [("verify before opening", e) for e in errors_of(dest)[:3]]
        try:  # as another process would read it before the recovering open
            with lsmdb.open(dest, read_only=True) as db:
                before, _options, _mismatches = read_all(db, model)
        except Exception as exc:
            problems.append((f"read-only open failed with {type(exc).__name__}", str(exc)))
    elif bounds.opened:
        problems.append(("MANIFEST lost", "none survived, but the first open had returned"))
    try:
        with lsmdb.open(dest, auto_compaction=False) as db:
            rows, options, mismatches = read_all(db, model)
    except Exception as exc:
        return problems + [(f"open failed with {type(exc).__name__}", str(exc))], None
    problems += mismatches[:3]
    found, k = compare(rows, options, bounds, model)
    problems += found
    if before is not None and before != rows:
        problems.append(("read-only open reads otherwise", f"rows {_changed(before, rows)}"))
    problems += [("verify after opening", e) for e in errors_of(dest)[:3]]
    try:
        with lsmdb.open(dest, auto_compaction=False) as db:
            again, _options, _mismatches = read_all(db, model)
    except Exception as exc:
        return problems + [(f"second open failed with {type(exc).__name__}", str(exc))], k
    if again != rows:
        problems.append(("second open differs", f"rows {_changed(rows, again)}"))
    return problems, k


def _changed(a: Rows, b: Rows) -> list[tuple[str, bytes]]:
    """The first (table, key) pairs whose values differ between ``a`` and ``b``."""
    return sorted((t, key) for t in set(a) | set(b)
                  for key in set(a.get(t, {})) | set(b.get(t, {}))
                  if a.get(t, {}).get(key) != b.get(t, {}).get(key))[:6]
