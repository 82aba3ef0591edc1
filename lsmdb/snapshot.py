"""Snapshots: every table of a database as it was at one moment, while writes go on.

``db.snapshot()`` takes, under the database lock (which every write holds
while it applies), each table's memtables and its current
:class:`~lsmdb.version.Version` -- a reference that keeps the version's
SSTables on disk and open while the snapshot reads them.  Frozen memtables
never change, so they are read as they are.  The one thing that does change
is each table's active memtable: while a snapshot is live, a write to it
first records in the snapshot's *undo* map what the key held before (its
value, its tombstone, or that it was absent), once per key.  A snapshot's
read of that memtable asks the undo map first.

Files change by compaction.  A compaction that runs while the snapshot is
live keeps the versions the snapshot reads (lsmdb.history); once it is
installed the snapshot *follows* (:meth:`Snapshot.follow`): it gives back
the files it held and reads the table's current ones and the compaction's
history files, each read taking, of the versions of a key not above the
snapshot's sequence number, the highest (``FastPath.bound``).  Its point
reads take the table's getter (the C one where it serves) over the files it
holds, as any get does.

The cost of a live snapshot: writes to a memtable it covers pay one dict
lookup per key per live snapshot (the undo map's); it holds the old values
and the memtables it covers in memory (after they are flushed too) until it
is closed; compactions keep its versions (and every tombstone) on disk, in
their history files, until it is closed, and its own reads consult each of
those files (one or more per compaction it lived through: a snapshot held
across many compactions reads slower).  Reads and writes of tables no
snapshot covers, and gets that do not use a snapshot, pay nothing.  Close
snapshots you are done with (``with db.snapshot() as snap:``); one that is
garbage collected is closed then.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .errors import NoSuchTableError
from .fastpath import fast_path
from .history import HistoryFile, release_all
from .keys import as_key
from .mapping import ScanMapping
from .memtable import Memtable
from .readpath import make_getter, many_python
from .scan import ScanIterator, bounds_of, view_scan
from .sstable_format import MISSING
from .stats import GETS, GETS_ABSENT
from .table import USE_SPEEDUPS
from .ttl import live
from .version import Version

if TYPE_CHECKING:
    from .table import TableState
    from .versions import Versions


class MemView:
    """A table's active memtable as it was when a snapshot was taken: its
    dict, under the snapshot's undo map (key -> value, None, or MISSING for a
    key it did not hold)."""

    __slots__ = ("mem", "undo")

    def __init__(self, mem: Memtable, undo: dict[bytes, Any]) -> None:
        self.mem = mem
        self.undo = undo

    def get(self, key: bytes, default: Any = None) -> Any:
        undo = self.undo
        if key in undo:
            value = undo[key]
            return default if value is MISSING else value
        return self.mem.data.get(key, default)

    def chunk_range(self, lo: bytes | None, hi: bytes | None,
                    reverse: bool = False) -> list[tuple[list[bytes], list[bytes | None]]]:
        """The entries with lo <= key < hi then, as one (keys, values) chunk
        ([] if none); called under the database lock (the memtable may be the
        active one)."""
        undo = self.undo
        now = self.mem.keys.irange(lo, hi, inclusive=(True, False))
        keys = set(now)
        keys.update(k for k in undo if (lo is None or k >= lo) and (hi is None or k < hi))
        out_keys: list[bytes] = []
        out_values: list[bytes | None] = []
        data = self.mem.data
        for key in sorted(keys, reverse=reverse):
            value = undo[key] if key in undo else data[key]
            if value is not MISSING:
                out_keys.append(key)
                out_values.append(value)
        return [(out_keys, out_values)] if out_keys else []


class _Files:
    """The files one table of a snapshot reads, swapped whole when it follows a
    compaction: a version it holds, the history files it holds, and whether
    the version is the one it was taken with (then no file holds a version
    above the snapshot, and reads take the newest version they find)."""

    __slots__ = ("version", "history", "exact", "view", "getter")

    def __init__(self, version: Version, history: tuple[HistoryFile, ...] = (),
                 exact: bool = True) -> None:
        self.version = version
        self.history = history
        self.exact = exact
        self.view: Any = None  # the FastPath its point reads walk, made at the first
        self.getter: Any = None  # get(key, default) of its frozen memtables and files

    def files(self) -> Version:
        """What its reads walk: the version, with the history files in level 0
        (not counted: the version and the history files are held already)."""
        if not self.history:
            return self.version
        return Version((*self.version.files, *(h.reader for h in self.history)))


class _Table:
    """One table in a snapshot: its state object, what it held, the files it reads."""

    __slots__ = ("state", "mem", "imms", "files")

    def __init__(self, state: TableState, mem: MemView, imms: tuple[Memtable, ...],
                 version: Version) -> None:
        self.state = state
        self.mem = mem
        self.imms = imms
        self.files = _Files(version)


class _NoFilterMem:
    """What fast_path takes of a memtable, for a MemView (no key filter)."""

    __slots__ = ("data", "filter")

    def __init__(self, data: Any) -> None:
        self.data = data
        self.filter = None


class _FrozenPart:
    """What a table's getter (lsmdb.readpath.make_getter, the C Getter too) reads
    of its state, for a snapshot's frozen memtables and files: their view, its
    cell, the table's counters."""

    __slots__ = ("fast", "fast_cell", "counts")

    def __init__(self, view: Any, counts: Any) -> None:
        self.fast = view
        self.fast_cell = [view]
        self.counts = counts


class Snapshot(ScanMapping):
    """Every table of the database as it was when ``db.snapshot()`` returned.

    ``get``, ``get_many`` and ``scan`` take ``table=`` (None: the default
    table); tables created later are not in it (NoSuchTableError), tables
    dropped later still are.  Iterates like a mapping of the default table
    (:class:`lsmdb.mapping.ScanMapping`).  ``close()`` (or leaving a ``with``
    block, or closing the database) releases it; reads after that raise
    ValueError.  Thread-safe.
    """

    def __init__(self, versions: Versions) -> None:
        self._versions = versions
        self._lock = threading.Lock()
        self._tables: dict[str, _Table] | None = {}
        with versions.lock:
            versions.check_open()
            #: The sequence number of the last write the snapshot sees.
            self.seq = versions.last_seq
            for name, state in versions.tables.items():
                undo: dict[bytes, Any] = {}
                state.mem.undos.append(undo)
                self._tables[name] = _Table(state, MemView(state.mem, undo), state.imms,
                                            state.version.acquire())
            versions.snapshots.add(self)

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError("an lsmdb Snapshot cannot be pickled or sent to another process: "
                        "open the database's path there and take a snapshot of its own")

    # -- reads -------------------------------------------------------------------
    def _table(self, name: str | None) -> _Table:
        self._versions.check_open()  # after the database closed: DatabaseClosedError
        tables = self._tables
        if tables is None:
            raise ValueError("the snapshot is closed")
        t = tables.get("default" if name is None else name)
        if t is None:
            raise NoSuchTableError(f"no table {name!r} in this snapshot")
        return t

    def _fast(self, t: _Table, files: _Files, mem: Any, with_c: bool) -> Any:
        """A view of ``mem``, ``t``'s frozen memtables and ``files``; once the
        snapshot followed a compaction, bounded by its sequence number."""
        view = fast_path(mem, t.imms, files.files(), t.state.cache, False, with_c,
                         t.state.now_us)
        return view if files.exact else view._replace(seq_overlap=True, bound=self.seq)

    def _view(self, t: _Table, files: _Files) -> Any:
        """The Python view of ``t``: the active memtable as it was, the frozen ones,
        the files."""
        view = files.view
        if view is None:
            view = files.view = self._fast(t, files, _NoFilterMem(t.mem), False)
        return view

    def _getter(self, t: _Table, files: _Files) -> Any:
        """The getter of ``t``'s frozen memtables and files: the table's own kind
        (the C getter where it serves) over a view of them alone."""
        g = files.getter
        if g is None:
            view = self._fast(t, files, _NoFilterMem({}), USE_SPEEDUPS)
            g = files.getter = make_getter(self._versions, _FrozenPart(view, t.state.counts))  # type: ignore[arg-type]
        return g

    def get(self, key: Any, default: Any = None, table: str | None = None) -> Any:
        """``key``'s value in ``table`` as of the snapshot, or ``default``: the
        active memtable as it was (its undo map, then its dict), then the
        frozen memtables and files through the table's getter."""
        t = self._table(table)
        if type(key) is not bytes:
            key = as_key(key)
        value = t.mem.get(key, MISSING)
        if value is MISSING:
            return self._getter(t, t.files)(key, default)
        if type(value) is tuple:  # an expiring value: read now (lsmdb.ttl)
            value = live(value, t.state.now_us())
        counts = t.state.counts
        counts[GETS] += 1
        if value is None:
            counts[GETS_ABSENT] += 1
            return default
        return value

    def get_many(self, keys: Iterable[Any], table: str | None = None) -> list[bytes | None]:
        """The values of ``keys`` in ``table`` as of the snapshot (None where absent)."""
        t = self._table(table)
        return many_python(t.state, self._view(t, t.files), [as_key(k) for k in keys])

    def __contains__(self, key: Any) -> bool:
        return self.get(key, MISSING) is not MISSING

    def __getitem__(self, key: Any) -> bytes:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def scan(self, start: Any = None, end: Any = None, prefix: Any = None,
             reverse: bool = False, table: str | None = None) -> ScanIterator:
        """(key, value) pairs of ``table`` as of the snapshot with start <= key <
        end (and ``prefix``), in key order (``reverse``: descending); the
        iterator keeps the snapshot's files even if the snapshot is closed
        before it ends."""
        t = self._table(table)
        lo, hi = bounds_of(start, end, prefix)
        reverse = bool(reverse)
        if lo is not None and hi is not None and lo >= hi:
            return view_scan([], (), None, lo, hi, reverse)
        with self._lock, self._versions.lock:  # not while it closes; the memtable may change
            if self._tables is None:
                raise ValueError("the snapshot is closed")
            files = t.files
            version = files.version.acquire()
            try:
                first = t.mem.chunk_range(lo, hi)
                now_us = t.state.now_us()
            except BaseException:
                version.release()
                raise
        if files.exact:
            return view_scan(first, t.imms, version, lo, hi, reverse, now_us)
        return view_scan(first, t.imms, version, lo, hi, reverse, now_us,
                         bound=self.seq, extra=[h.reader for h in files.history])

    def tables(self) -> list[str]:
        """The names of the tables in the snapshot, sorted."""
        tables = self._tables
        if tables is None:
            raise ValueError("the snapshot is closed")
        return sorted(tables)

    # -- following compactions ---------------------------------------------------
    def follow(self, state: TableState, history: list[HistoryFile]) -> list[Version]:
        """A compaction of ``state`` was installed (the database lock held): read
        its current files from now on, and hold ``history`` (the compaction's
        history files, when the snapshot was live as it began).  Returns the
        version given back, for the caller to release outside the lock."""
        tables = self._tables
        if tables is None:
            return []
        for t in tables.values():
            if t.state is state:
                old = t.files
                for h in history:
                    h.hold()
                t.files = _Files(state.version.acquire(), old.history + tuple(history), False)
                return [old.version]
        return []

    # -- its end -----------------------------------------------------------------
    def close(self) -> None:
        """Release the snapshot: its undo maps stop growing, its files may go.
        Idempotent; scans already taken keep their own view."""
        with self._lock:
            with self._versions.lock:  # not while a compaction's install swaps its files
                tables, self._tables = self._tables, None
                if not tables:
                    return
                self._versions.snapshots.discard(self)
                for t in tables.values():
                    undos = t.mem.mem.undos
                    for i, undo in enumerate(undos):
                        if undo is t.mem.undo:
                            del undos[i]
                            break
            for t in tables.values():
                t.files.version.release()
                release_all(t.files.history)

    @property
    def closed(self) -> bool:
        return self._tables is None

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - a finaliser must not raise
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"seq {self.seq}"
        return f"<lsmdb.Snapshot of {self._versions.path!r}, {state}>"
