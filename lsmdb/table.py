"""Per-table state (``TableState``: memtables, files, the published version and fast
path) and ``SSTableInfo``."""

from __future__ import annotations

import logging
import math
import os
from array import array
from collections.abc import Callable
from dataclasses import asdict, dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from .fastpath import Probes, fast_path
from .filters import FailOpen, FilterSpec, is_stale
from .memtable import Memtable
from .options import TableOptions
from .stats import TABLE_COUNTERS, ArrayCounter
from .ttl import system_now_us
from .version import Version, VersionSet

if TYPE_CHECKING:
    from .sstable_reader import SSTableReader


log = logging.getLogger("lsmdb")

#: Whether the read path uses lsmdb._speedups (tests switch it off to run the
#: Python path; both give the same answers and counts).
USE_SPEEDUPS = Probes is not None


class TableState:
    """Everything the DB keeps for one table.

    ``files`` holds every SSTable reader of the table, as the manifest names
    them; ``publish()`` makes them, with the memtables, what reads see:
    ``version`` (an immutable :class:`~lsmdb.version.Version` of the files,
    level 0 newest first, then each deeper level in key order) and ``fast``
    (the same flattened for a get, :mod:`lsmdb.fastpath`).  Writers change
    and publish under the DB lock; readers take ``fast``, or ``version`` with a
    reference, in one step, so a reader never sees half a change.
    """

    __slots__ = ("name", "id", "explicit", "options", "mem", "imms", "files", "flushed_seq",
                 "version", "dropped", "counts", "shadow", "compact_pointer", "fast",
                 "fast_cell", "getter", "cache", "now_us", "_versions", "__weakref__")

    gets = ArrayCounter(TABLE_COUNTERS)
    gets_absent = ArrayCounter(TABLE_COUNTERS)
    write_stalls = ArrayCounter(TABLE_COUNTERS)
    write_stall_us = ArrayCounter(TABLE_COUNTERS)
    write_slowdowns = ArrayCounter(TABLE_COUNTERS)
    write_slowdown_us = ArrayCounter(TABLE_COUNTERS)

    def __init__(self, name: str, table_id: int, explicit: dict[str, Any],
                 versions: VersionSet | None = None, cache: Any = None,
                 now_us: Callable[[], int] = system_now_us) -> None:
        self.name = name
        #: The database's clock (lsmdb.ttl), which reads of expiring values ask.
        self.now_us = now_us
        self.id = table_id
        self.mem = Memtable()
        self.imms: tuple[Memtable, ...] = ()
        self.files: tuple[SSTableReader, ...] = ()
        self._versions = versions
        #: The block cache its reads go through (the database's), or None.
        self.cache = cache
        self.version = versions.new(()) if versions is not None else Version(())
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
        """Make ``files`` and the memtables what reads see: a new version when the
        files changed (the one before released), and a new fast path."""
        old = self.version
        if set(old.files) != set(self.files):  # a reader's level never changes
            self.version = (self._versions.new(self.files) if self._versions is not None
                            else Version(self.files))
        version = self.version
        # The fast path: the files' range and filter steps in one C Probes
        # object where the C speedups serve (not in shadow mode: there the
        # Python path reads what the filter rejected too).
        self.fast = self.fast_cell[0] = fast_path(self.mem, self.imms, version, self.cache,
                                                  self.shadow, USE_SPEEDUPS and not self.shadow,
                                                  self.now_us)
        if version is not old:
            old.release()

    def may_expire(self) -> bool:
        """Whether a value of the table may expire: its ``default_time_to_live``
        is set, or a memtable or file holds an expiring value (lsmdb.ttl)."""
        return bool(self.options.default_time_to_live or self.mem.expiring
                    or any(m.expiring for m in self.imms)
                    or any(r.expiring for r in self.files))

    def readers_in_order(self) -> list[SSTableReader]:
        """Every reader, newest data first (level 0 newest first, then by level and key)."""
        return self.version.in_read_order()

    def _check(self) -> None:
        """Invariants: the published version is the table's files -- level 0 newest
        first, each deeper level in key order without overlaps -- and the fast
        path is its memtables and the same files in the same order; every
        memtable and reader keeps its own invariants."""
        mem, imms, version = self.mem, self.imms, self.version
        if mem.frozen or not all(m.frozen for m in imms):
            raise AssertionError(f"table {self.name!r}: memtables frozen otherwise")
        numbers = [r.number for r in self.files]
        flat = version.in_read_order()
        if len(set(numbers)) != len(numbers) or sorted(numbers) != sorted(r.number for r in flat):
            raise AssertionError(f"table {self.name!r}: version of other files")
        l0 = version.l0
        if any(r.level != 0 for r in l0) or \
                [(r.max_seq, r.number) for r in l0] != sorted(
                    ((r.max_seq, r.number) for r in l0), reverse=True):
            raise AssertionError(f"table {self.name!r}: level 0 not newest first")
        for level, (keys, readers) in enumerate(version.levels, 1):
            if any(r.level != level for r in readers) or keys != tuple(r.max_key
                                                                       for r in readers):
                raise AssertionError(f"table {self.name!r}: level {level} misfiled")
            if any(a.max_key >= b.min_key for a, b in pairwise(readers)):
                raise AssertionError(f"table {self.name!r}: level {level} overlaps")
        fast = self.fast
        if fast.data is not mem.data or fast.imm_datas != tuple(m.data for m in imms) or \
                fast.version is not version or [p.reader for p in fast.l0] != list(l0) or \
                [p.reader for lv in fast.deeper for p in lv.files] != flat[len(l0):] or \
                [p.reader for p in fast.files] != flat or \
                [lv.max_keys for lv in fast.deeper] != [k for k, _r in version.levels]:
            raise AssertionError(f"table {self.name!r}: fast path out of date")
        if version.refs < 1:
            raise AssertionError(f"table {self.name!r}: its version was released")
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
    format_version: int = 2      # the file's SSTable format, 1 to 5 (docs/FORMAT.md §4)
    compression: str = "none"    # how its data blocks were compressed when written
    data_bytes: int = 0          # its data blocks as stored (compressed), trailers excluded
    uncompressed_bytes: int = 0  # the same blocks' payloads decompressed
    compression_dict_bytes: int = 0  # its lz4 blocks' dictionary (0: none; FORMAT.md §4.1)
    expiring_entries: int = 0    # entries with a time to live (format 3), expired or not

    @property
    def compression_ratio(self) -> float:
        """data_bytes / uncompressed_bytes: 1.0 uncompressed, below 1 the share kept."""
        return self.data_bytes / self.uncompressed_bytes if self.uncompressed_bytes else 1.0

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
        d["compression_ratio"] = self.compression_ratio
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
            format_version=reader.file_version, compression=reader.compression,
            data_bytes=sum(reader.index_sizes), uncompressed_bytes=reader.uncompressed_bytes,
            compression_dict_bytes=len(reader.compression_dict or b""),
            expiring_entries=reader.expiring,
            **reader.counters(),
        )
