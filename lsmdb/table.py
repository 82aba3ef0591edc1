"""Per-table state, the ``Table`` handle, write batches and ``SSTableInfo``."""

from __future__ import annotations

import logging
import math
import os
from array import array
from dataclasses import asdict, dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from .fastpath import Probes, fast_path
from .filters import FailOpen, FilterSpec, is_stale
from .memtable import Memtable
from .options import TableOptions
from .stats import TABLE_COUNTERS, ArrayCounter

if TYPE_CHECKING:
    from .sstable_reader import SSTableReader


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

    gets = ArrayCounter(TABLE_COUNTERS)
    gets_absent = ArrayCounter(TABLE_COUNTERS)

    def __init__(self, name: str, table_id: int, explicit: dict[str, Any]) -> None:
        self.name = name
        self.id = table_id
        self.mem = Memtable()
        self.imms: tuple[Memtable, ...] = ()
        self.files: tuple[SSTableReader, ...] = ()
        self.flushed_seq = 0
        self.dropped = False
        self.counts = array("Q", bytes(8 * len(TABLE_COUNTERS)))
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
        # The same, flattened for the get fast path (lsmdb/fastpath.py), with
        # the files' range and filter steps in one C Probes object where the
        # C speedups serve (not in shadow mode: there the Python path reads
        # what the filter rejected too).
        self.fast = self.fast_cell[0] = fast_path(self.mem, self.imms, l0, deeper,
                                                  USE_SPEEDUPS and not self.shadow)

    def readers_in_order(self) -> list[SSTableReader]:
        """Every reader, newest data first (level 0 newest first, then by level and key)."""
        _mem, _imms, l0, deeper = self.view
        out = list(l0)
        for _keys, readers in deeper:
            out.extend(readers)
        return out

    def _check(self) -> None:
        """Invariants: the published view is the table's memtables and files --
        level 0 newest first, each deeper level in key order without overlaps --
        and the fast path's tuples are the same files in the same order; every
        memtable and reader keeps its own invariants."""
        mem, imms, l0, deeper = self.view
        if mem is not self.mem or imms != self.imms or mem.frozen \
                or not all(m.frozen for m in imms):
            raise AssertionError(f"table {self.name!r}: view of other memtables")
        numbers = [r.number for r in self.files]
        flat = [*l0, *(r for _keys, readers in deeper for r in readers)]
        if len(set(numbers)) != len(numbers) or sorted(numbers) != sorted(r.number for r in flat):
            raise AssertionError(f"table {self.name!r}: view of other files")
        if any(r.level != 0 for r in l0) or \
                [(r.max_seq, r.number) for r in l0] != sorted(
                    ((r.max_seq, r.number) for r in l0), reverse=True):
            raise AssertionError(f"table {self.name!r}: level 0 not newest first")
        for level, (keys, readers) in enumerate(deeper, 1):
            if any(r.level != level for r in readers) or keys != [r.max_key for r in readers]:
                raise AssertionError(f"table {self.name!r}: level {level} misfiled")
            if any(a.max_key >= b.min_key for a, b in pairwise(readers)):
                raise AssertionError(f"table {self.name!r}: level {level} overlaps")
        fast = self.fast
        if fast.data is not mem.data or [p.reader for p in fast.l0] != list(l0) or \
                [p.reader for level in fast.deeper for p in level.files] != flat[len(l0):] or \
                [p.reader for p in fast.files] != flat or \
                [level.max_keys for level in fast.deeper] != [tuple(k) for k, _r in deeper]:
            raise AssertionError(f"table {self.name!r}: fast path out of date")
        for m in (mem, *imms):
            m._check()
        for r in self.files:
            r._check()


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
    filter_version: int | None = None  # the filter's family (FORMAT.md §5); None: fails open
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
    def from_reader(cls, table: str, reader: SSTableReader, want: FilterSpec | None = None,
                    table_fp_chance: float | None = None) -> SSTableInfo:
        """The info of ``reader``'s file; ``want``: the filter a file of its table
        written now gets (``filter_stale`` by lsmdb.filters.is_stale; None: the
        table is not known, only a filter failing open is stale);
        ``table_fp_chance``: the table's bloom_filter_fp_chance (None: the file's)."""
        active = reader.filter.active
        stats = active.statistics()
        return cls(
            table=table, file=os.path.basename(reader.path), path=reader.path,
            level=reader.level, entries=reader.entries, tombstones=reader.tombstones,
            size_bytes=reader.size_bytes, min_key=reader.min_key, max_key=reader.max_key,
            filter_fp_chance=reader.fp_chance, filter_bits=stats.bits,
            filter_hashes=stats.hashes, filter_bytes=reader.filter_handle[1],
            bits_per_key=stats.bits / reader.entries if reader.entries else 0.0,
            table_fp_chance=reader.fp_chance if table_fp_chance is None else table_fp_chance,
            filter_stale=is_stale(reader.filter, reader.fp_chance, want),
            filter_error=reader.filter.error,
            filter_version=None if isinstance(active, FailOpen) else active.family,
            fill_ratio=stats.fill_ratio,
            predicted_fpr=active.predicted_fpr(reader.entries),
            estimated_fpr_from_fill=stats.estimated_fpr_from_fill,
            estimated_keys_from_fill=stats.estimated_keys_from_fill,
            **reader.counters(),
        )
