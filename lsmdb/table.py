"""Per-table state, the ``Table`` handle, write batches and ``SSTableInfo``."""

from __future__ import annotations

import logging
import math
import os
from array import array
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from .bloom import key_hash, predicted_fpr_for
from .errors import NoSuchTableError
from .keys import MAX_KEY_SIZE_BYTES, MAX_VALUE_SIZE_BYTES, as_key, as_value
from .memtable import Memtable
from .options import TableOptions
from .stats import TABLE_COUNTERS, ArrayCounter

if TYPE_CHECKING:
    from .db import DB
    from .sstable import SSTableReader

try:  # optional C speedups for the per-file steps of a get (lsmdb/csrc/bloom_probes.c)
    from ._speedups import Probes
except ImportError:  # pragma: no cover - no C compiler when installed
    Probes = None  # type: ignore[assignment,misc]

log = logging.getLogger("lsmdb")

#: Whether the read path uses lsmdb._speedups (tests switch it off to run the
#: Python path; both give the same answers and counts).
USE_SPEEDUPS = Probes is not None


class TableState:
    """Everything the DB keeps for one table.

    ``files`` holds every SSTable reader of the table.  ``view`` is the
    tuple (memtable, frozen memtables newest first, level-0 readers newest
    first, deeper levels) that readers take in one step, where each deeper
    level is (list of max keys, list of readers) sorted by key range.
    Writers replace it whole under the DB lock, so a reader never sees half a
    change.
    """

    __slots__ = ("name", "id", "explicit", "options", "mem", "imms", "files", "flushed_seq",
                 "view", "dropped", "counts", "shadow", "compact_pointer", "fast",
                 "fast_cell", "getter", "__weakref__")

    gets = ArrayCounter(0)         # point reads answered
    gets_absent = ArrayCounter(1)  # ... that found nothing

    def __init__(self, name: str, table_id: int, explicit: dict[str, Any]) -> None:
        self.name = name
        self.id = table_id
        self.mem = Memtable()
        self.imms: tuple[Memtable, ...] = ()
        self.files: tuple[SSTableReader, ...] = ()
        self.flushed_seq = 0
        self.dropped = False
        self.counts = array("Q", bytes(8 * len(TABLE_COUNTERS)))  # gets, gets_absent
        self.compact_pointer: dict[int, bytes] = {}  # leveled: last key compacted per level
        self.getter: Any = None  # the compiled point-read closure (readpath.make_getter)
        #: [fast], what the C getter reads instead of two attribute lookups a
        #: get; [None] once the database is closed (DB.close), which sends
        #: the C getter to the Python one, and so to DatabaseClosedError.
        self.fast_cell: list[Any] = [None]
        self.set_options(explicit)  # publishes

    def set_options(self, explicit: dict[str, Any]) -> None:
        options = TableOptions.resolve(explicit)  # raises before anything changes
        self.explicit = dict(explicit)
        self.options = options
        self.shadow = options.bloom_filter_mode == "shadow"
        self.publish()  # shadow mode decides the read path

    def publish(self) -> None:
        l0 = sorted((r for r in self.files if r.level == 0),
                    key=lambda r: (r.max_seq, r.number), reverse=True)
        depth = max((r.level for r in self.files), default=0)
        deeper = []
        for level in range(1, depth + 1):
            readers = sorted((r for r in self.files if r.level == level), key=lambda r: r.min_key)
            deeper.append(([r.max_key for r in readers], readers))
        self.view = (self.mem, self.imms, tuple(l0), tuple(deeper))
        # The same, flattened for the get fast path: per file one tuple (_probe),
        # and -- with the C speedups -- the files' range and filter steps in one
        # Probes object (None: the Python path; always in shadow mode) plus, by
        # its flat file index, what a block read needs, and the memtables' key
        # filters (memtable first, like the dicts; None without the C speedups).
        probes = (_c_probes(l0, deeper) if USE_SPEEDUPS and not self.shadow
                  else None)
        flat = [*l0, *(r for _keys, readers in deeper for r in readers)]
        self.fast = self.fast_cell[0] = (self.mem.data, tuple(m.data for m in self.imms),
                     tuple(_probe(r) for r in l0),
                     tuple((keys, tuple(_probe(r) for r in readers)) for keys, readers in deeper),
                     probes,
                     tuple((r, r.index_keys, r.cache_base, r.counts) for r in flat),
                     (self.mem.filter, *(m.filter for m in self.imms)))

    def readers_in_order(self) -> list[SSTableReader]:
        """Every reader, newest data first (level 0 newest first, then by level and key)."""
        _mem, _imms, l0, deeper = self.view
        out = list(l0)
        for _keys, readers in deeper:
            out.extend(readers)
        return out


def _probe(r: SSTableReader) -> tuple[Any, ...]:
    """What the read path needs of one file, flattened: (reader, min_key, max_key,
    filter bits, m, range(k - 1) -- the probes after the first --, keyed hash fn,
    index keys, the file's block-cache key base, its counters array, the
    filter's partition size s: 0 for a format-1 filter)."""
    bloom = r.bloom
    m = bloom.m
    return (r, r.min_key, r.max_key, bloom._bits if m else None, m, range(max(0, bloom.k - 1)),
            r.keyed_fn, r.index_keys, r.cache_base, r.counts, bloom.part)


def _c_entry(r: SSTableReader) -> tuple[Any, ...]:
    bloom = r.bloom
    m = bloom.m
    return (r.counts, r.min_key, r.max_key, bloom._bits if m else None, m, bloom.k, r.keyed_fn,
            r.index_keys, r.index_offsets, r.index_sizes, bloom.part)


def _c_probes(l0: list[SSTableReader], deeper: list[tuple[list[bytes], list[SSTableReader]]]
              ) -> Any:
    """The C Probes of these files, or None (then the Python path serves)."""
    try:
        return Probes([_c_entry(r) for r in l0],
                      [(keys, [_c_entry(r) for r in readers]) for keys, readers in deeper],
                      key_hash)
    except (TypeError, ValueError, OverflowError) as exc:  # should not happen: be slow, not wrong
        log.warning("C read path unavailable for these files (%s); using the Python path", exc)
        return None


@dataclass(frozen=True)
class SSTableInfo:
    """What one SSTable holds, what its filter costs, and what it saved.

    The counters are cumulative since the file was written, persisted across
    clean restarts, and never reset by reading them.
    """

    table: str
    file: str
    path: str
    level: int
    entries: int
    tombstones: int
    size_bytes: int
    min_key: bytes
    max_key: bytes
    filter_fp_chance: float      # the fp chance the filter was built with (1.0: no filter)
    filter_bits: int             # m
    filter_hashes: int           # k
    filter_bytes: int            # size of the filter block on disk
    bits_per_key: float          # m / entries
    table_fp_chance: float = 0.0  # the table's current bloom_filter_fp_chance
    filter_stale: bool = False   # built with a different fp chance than the current one
    filter_error: str | None = None  # why the filter fails open, if it does
    filter_version: int | None = None  # the filter block's format (FORMAT.md §5); None: fails open
    fill_ratio: float = 0.0
    predicted_fpr: float = 1.0            # (1 - e^(-k n / m))^k
    estimated_fpr_from_fill: float = 1.0  # fill^k
    estimated_keys_from_fill: float = 0.0  # -m/k ln(1 - fill)
    range_skips: int = 0
    filter_negatives: int = 0    # filter said no: a disk read skipped
    true_positives: int = 0
    false_positives: int = 0
    false_negatives: int = 0     # shadow mode only; must stay 0
    block_reads: int = 0         # data blocks read from disk
    block_cache_hits: int = 0    # data blocks served by the block cache

    @property
    def measured_fpr(self) -> float | None:
        """false_positives / (false_positives + filter_negatives); None before any absent probe."""
        absent = self.false_positives + self.filter_negatives
        return self.false_positives / absent if absent else None

    @property
    def false_ratio(self) -> float | None:
        """Cassandra's fp / (tp + fp + tn); None before any probe."""
        total = self.true_positives + self.false_positives + self.filter_negatives
        return self.false_positives / total if total else None

    def to_dict(self) -> dict[str, Any]:
        """Every field plus the derived rates (keys stay bytes; the CLI prints them as hex)."""
        d = asdict(self)
        d["measured_fpr"] = self.measured_fpr
        d["false_ratio"] = self.false_ratio
        if math.isinf(d["estimated_keys_from_fill"]):
            d["estimated_keys_from_fill"] = None
        return d

    @classmethod
    def from_reader(cls, table: str, reader: SSTableReader,
                    table_fp_chance: float | None = None) -> SSTableInfo:
        bloom = reader.bloom
        stats = reader.filter_stats()
        current = reader.fp_chance if table_fp_chance is None else table_fp_chance
        return cls(
            table=table, file=os.path.basename(reader.path), path=reader.path,
            level=reader.level, entries=reader.entries, tombstones=reader.tombstones,
            size_bytes=reader.size_bytes, min_key=reader.min_key, max_key=reader.max_key,
            filter_fp_chance=reader.fp_chance, filter_bits=bloom.m, filter_hashes=bloom.k,
            filter_bytes=reader.filter_handle[1],
            bits_per_key=bloom.m / reader.entries if reader.entries else 0.0,
            table_fp_chance=current, filter_stale=reader.fp_chance != current,
            filter_error=reader.filter_error, filter_version=getattr(bloom, "version", None),
            fill_ratio=stats["fill_ratio"],
            predicted_fpr=predicted_fpr_for(reader.entries, bloom.m, bloom.k),
            estimated_fpr_from_fill=stats["estimated_fpr_from_fill"],
            estimated_keys_from_fill=stats["estimated_keys_from_fill"],
            **reader.counters(),
        )


class Table:
    """A named table of a database.  ``db.table(name)`` returns one.

    Example:
        >>> import lsmdb, tempfile
        >>> with lsmdb.open(tempfile.mkdtemp()) as db:
        ...     users = db.create_table("users", bloom_filter_fp_chance=0.001)
        ...     users[b"alice"] = b"1"
        ...     (users[b"alice"], b"bob" in users)
        (b'1', False)
    """

    __slots__ = ("_db", "_state", "name")

    def __init__(self, db: DB, state: TableState) -> None:
        self._db = db
        self._state = state
        self.name = state.name

    def _live(self) -> TableState:
        state = self._state
        if state.dropped:
            raise NoSuchTableError(f"table {self.name!r} was dropped")
        return state

    @property
    def options(self) -> TableOptions:
        """The table's effective options (defaults resolved)."""
        return self._live().options

    def put(self, key: Any, value: Any, sync: bool | None = None) -> None:
        """Set ``key`` to ``value`` (fsync the WAL first if ``sync``)."""
        self._db._write_columns(self._live(), [as_key(key)], [as_value(value)], sync)

    def delete(self, key: Any, sync: bool | None = None) -> None:
        """Delete ``key`` (a tombstone; no error when it is absent)."""
        self._db._write_columns(self._live(), [as_key(key)], [None], sync)

    def get(self, key: Any, default: Any = None) -> Any:
        """The value of ``key``, or ``default`` when it is absent."""
        return self._db._get(self._live(), key, default)

    def get_many(self, keys: Any) -> list[bytes | None]:
        """Values of many keys at once, None where absent (see ``DB.get_many``)."""
        from .readpath import get_many
        return get_many(self._db, self._live(), keys)

    def scan(self, start: Any = None, end: Any = None, prefix: Any = None,
             reverse: bool = False) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs with start <= key < end in key order (see ``DB.scan``)."""
        return self._db._scan(self._live(), start, end, prefix, reverse)

    def flush(self) -> None:
        """Write this table's memtable to an SSTable now."""
        self._db.flush(self.name)

    def __getitem__(self, key: Any) -> bytes:
        value = self._db._get(self._live(), key)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        self.put(key, value)

    def __delitem__(self, key: Any) -> None:
        if self._db._get(self._live(), key) is None:
            raise KeyError(key)
        self.delete(key)

    def __contains__(self, key: Any) -> bool:
        return self._db._get(self._live(), key) is not None

    def __repr__(self) -> str:
        return f"<lsmdb.Table {self.name!r}>"


class WriteBatch:
    """Writes collected and applied atomically -- one WAL record -- on ``commit``.

    Use as ``with db.batch() as b:``; the batch commits on normal exit and is
    discarded if the block raises.  Keys and values are kept in two lists
    (and, once a second table appears, the table of each op in a third), so
    a put is two appends.
    """

    def __init__(self, db: DB, sync: bool | None = None) -> None:
        self._db = db
        self._sync = sync
        self._keys: list[bytes] = []
        self._values: list[bytes | None] = []
        self._states: list[TableState] | None = None  # None: every op is on the default table
        self._done = False
        self._default = db._table_state(None)

    def put(self, key: Any, value: Any, table: str | None = None) -> None:
        """Add a put of ``key`` in ``table`` (None: the default table) to the batch."""
        if self._done:
            self._check()
        if type(key) is not bytes or len(key) > MAX_KEY_SIZE_BYTES:
            key = as_key(key)
        if type(value) is not bytes or len(value) > MAX_VALUE_SIZE_BYTES:
            value = as_value(value)
        if table is None and self._states is None:
            self._keys.append(key)
            self._values.append(value)
        else:
            self._add(table, key, value)

    def delete(self, key: Any, table: str | None = None) -> None:
        """Add a delete of ``key`` in ``table`` (None: the default table) to the batch."""
        self._check()
        self._add(table, as_key(key), None)

    def _add(self, table: str | None, key: bytes, value: bytes | None) -> None:
        state = self._default if table is None else self._db._table_state(table)
        if self._states is None:
            if state is self._default:
                self._keys.append(key)
                self._values.append(value)
                return
            self._states = [self._default] * len(self._keys)
        self._states.append(state)
        self._keys.append(key)
        self._values.append(value)

    def __len__(self) -> int:
        return len(self._keys)

    def _check(self) -> None:
        if self._done:
            raise ValueError("this batch was already committed or discarded")

    def commit(self) -> None:
        """Apply every operation as one WAL record; the batch cannot be reused."""
        self._check()
        self._done = True
        if not self._keys:
            return
        if self._states is None:
            self._db._write_columns(self._default, self._keys, self._values, self._sync)
        else:
            self._db._write(list(zip(self._states, self._keys, self._values, strict=True)),
                            self._sync)

    def discard(self) -> None:
        """Drop every operation; nothing is written."""
        self._done = True
        self._keys = []
        self._values = []
        self._states = None

    def __enter__(self) -> WriteBatch:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.discard()
