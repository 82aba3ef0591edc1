"""Per-table state, the ``Table`` handle, write batches and ``SSTableInfo``."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Iterator

from .bloom import predicted_fpr_for
from .errors import NoSuchTableError
from .keys import as_key, as_value
from .memtable import Memtable
from .options import TableOptions

if TYPE_CHECKING:
    from .db import DB
    from .sstable import SSTableReader


class TableState:
    """Everything the DB keeps for one table.

    ``view`` is the tuple (memtable, frozen memtables newest first, SSTable
    readers newest first) that readers take in one step; writers replace it
    whole under the DB lock, so a reader never sees half a change.
    """

    __slots__ = ("name", "id", "explicit", "options", "mem", "imms", "files", "flushed_seq",
                 "view", "dropped", "gets", "gets_absent", "__weakref__")

    def __init__(self, name: str, table_id: int, explicit: dict[str, Any]) -> None:
        self.name = name
        self.id = table_id
        self.explicit = dict(explicit)
        self.options = TableOptions.resolve(explicit)
        self.mem = Memtable()
        self.imms: tuple[Memtable, ...] = ()
        self.files: tuple[SSTableReader, ...] = ()
        self.flushed_seq = 0
        self.dropped = False
        self.gets = 0          # point reads answered
        self.gets_absent = 0   # ... that found nothing
        self.publish()

    def publish(self) -> None:
        self.view = (self.mem, self.imms, self.files)


@dataclass(frozen=True)
class SSTableInfo:
    """What one SSTable holds and what its filter costs and saves."""

    table: str
    file: str
    path: str
    level: int
    entries: int
    tombstones: int
    size_bytes: int
    min_key: bytes
    max_key: bytes
    filter_fp_chance: float      # the fp chance the filter was built with
    filter_bits: int
    filter_hashes: int
    filter_bytes: int
    bits_per_key: float
    # Counters since the file was written (cumulative, never reset on read).
    range_skips: int = 0
    filter_negatives: int = 0
    true_positives: int = 0
    false_positives: int = 0
    false_negatives: int = 0
    block_reads: int = 0

    @property
    def predicted_fpr(self) -> float:
        return predicted_fpr_for(self.entries, self.filter_bits, self.filter_hashes)

    @property
    def measured_fpr(self) -> float | None:
        """false_positives / (false_positives + filter_negatives); None before any absent probe."""
        absent = self.false_positives + self.filter_negatives
        return self.false_positives / absent if absent else None

    @property
    def false_ratio(self) -> float | None:
        """Cassandra's fp / (tp + fp + tn)."""
        total = self.true_positives + self.false_positives + self.filter_negatives
        return self.false_positives / total if total else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["predicted_fpr"] = self.predicted_fpr
        d["measured_fpr"] = self.measured_fpr
        d["false_ratio"] = self.false_ratio
        return d

    @classmethod
    def from_reader(cls, table: str, reader: "SSTableReader", level: int) -> "SSTableInfo":
        bloom = reader.bloom
        import os
        return cls(
            table=table, file=os.path.basename(reader.path), path=reader.path, level=level,
            entries=reader.entries, tombstones=reader.tombstones, size_bytes=reader.size_bytes,
            min_key=reader.min_key, max_key=reader.max_key,
            filter_fp_chance=reader.fp_chance, filter_bits=bloom.m, filter_hashes=bloom.k,
            filter_bytes=reader.filter_handle[1], bits_per_key=bloom.m / reader.entries
            if reader.entries else math.nan,
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

    def __init__(self, db: "DB", state: TableState) -> None:
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
        return self._live().options

    def put(self, key: Any, value: Any, sync: bool | None = None) -> None:
        self._db._write([(self._live(), as_key(key), as_value(value))], sync)

    def delete(self, key: Any, sync: bool | None = None) -> None:
        self._db._write([(self._live(), as_key(key), None)], sync)

    def get(self, key: Any, default: Any = None) -> Any:
        value = self._db._get(self._live(), key)
        return default if value is None else value

    def scan(self, start: Any = None, end: Any = None, prefix: Any = None,
             reverse: bool = False) -> Iterator[tuple[bytes, bytes]]:
        return self._db._scan(self._live(), start, end, prefix, reverse)

    def flush(self) -> None:
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
    discarded if the block raises.
    """

    def __init__(self, db: "DB", sync: bool | None = None) -> None:
        self._db = db
        self._sync = sync
        self._ops: list[tuple[TableState, bytes, bytes | None]] = []
        self._done = False

    def put(self, key: Any, value: Any, table: str | None = None) -> None:
        self._check()
        self._ops.append((self._db._table_state(table), as_key(key), as_value(value)))

    def delete(self, key: Any, table: str | None = None) -> None:
        self._check()
        self._ops.append((self._db._table_state(table), as_key(key), None))

    def __len__(self) -> int:
        return len(self._ops)

    def _check(self) -> None:
        if self._done:
            raise ValueError("this batch was already committed or discarded")

    def commit(self) -> None:
        self._check()
        self._done = True
        if self._ops:
            self._db._write(self._ops, self._sync)

    def discard(self) -> None:
        self._done = True
        self._ops = []

    def __enter__(self) -> "WriteBatch":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.discard()
