"""Compaction: choosing inputs, merging them, writing outputs with fresh filters.

Two strategies (table option ``compaction``):

* ``size_tiered`` -- every file lives in level 0.  Files whose sizes are
  within 0.5x-1.5x of their bucket's average (or all below
  ``min_sstable_size_bytes``) form a bucket, whatever their age (as in
  Cassandra); a bucket of ``min_threshold`` files (at most ``max_threshold``
  taken) is merged into one file.  Past ``SIZE_TIERED_MAX_FILES`` files the
  cheapest run adjacent in age is merged anyway.  The merge keeps each key's
  version with the highest sequence number; a file merged from files not
  adjacent in age overlaps the ones between them in sequence numbers, and
  reads of the table then compare sequence numbers
  (``FastPath.seq_overlap``).
* ``leveled`` -- flushes land in L0; when L0 holds ``L0_COMPACTION_TRIGGER``
  files they are merged with the overlapping L1 files into L1.  Level L >= 1
  holds non-overlapping files of about ``target_file_size_bytes`` and at
  most ``10**L * target_file_size_bytes`` bytes; past that, one file (round
  robin over the key space) is merged with the files it overlaps in L+1.

Every output gets a new filter sized from its exact entry count and the
table's *current* ``bloom_filter_fp_chance``.  Tombstones are dropped only
when the output is the bottom of the tree for its key range (size_tiered:
every file left out is newer than every input, ``is_bottom``).  A value that
has expired when the compaction starts (lsmdb.ttl) becomes a tombstone
first: dropped at the bottom, kept above it, where it still hides the key's
older versions.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .files import FileWriter, unlink_quietly
from .filters import WRITTEN_FAMILIES, FilterSpec
from .filters.hashing import FAST_HASHER, Hasher
from .history import HistoryWriter
from .merge import Chunks, merge_newest
from .scan import chunks
from .sstable_format import KIND_BITS, KIND_TOMBSTONE
from .sstable_reader import SSTableReader
from .sstable_writer import WRITE_BUFFER_BYTES, SSTableBuilder, take_tagged
from .ttl import has_expiring

if TYPE_CHECKING:
    from .table import TableState

L0_COMPACTION_TRIGGER = 4
#: Writes to a table stall while its level 0 holds this many files and a
#: compaction that would reduce them is possible (auto_compaction only).
L0_STALL_FILES = 24
#: From this many files in a table's level 0 (while a compaction could reduce
#: them) writes to it are slowed: the database's writers together go no
#: faster than SLOWDOWN_BYTES_PER_SECOND halved for each file past this bound,
#: in short pauses after their commits (lsmdb.writepath), so that compaction
#: catches up in many small pauses rather than one long stall at L0_STALL_FILES.
L0_SLOWDOWN_FILES = 16
SLOWDOWN_BYTES_PER_SECOND = 16 << 20
LEVEL_SIZE_MULTIPLIER = 10
#: size_tiered: past this many files, adjacent files are merged even when no
#: bucket of similar sizes has filled.
SIZE_TIERED_MAX_FILES = 12


class CompactionCancelled(Exception):
    """A background compaction stopped part way because its database is
    closing: what it wrote is deleted, its inputs stay, and the next open
    compacts them again."""


class Cancel:
    """How a database's close stops its running background compactions:
    :meth:`fire` makes each in-process merge raise CompactionCancelled at its
    next chunk and calls the stop of each merge running elsewhere (a worker
    process: killed) registered with :meth:`watch`.  Once fired, it stays fired."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.fired = False
        self._stops: dict[int, Callable[[], None]] = {}

    def fire(self) -> None:
        with self._lock:
            self.fired = True
            stops = list(self._stops.values())
        for stop in stops:
            stop()

    def check(self) -> None:
        """Raise CompactionCancelled once fired."""
        if self.fired:
            raise CompactionCancelled("the database is closing")

    @contextlib.contextmanager
    def watch(self, stop: Callable[[], None]) -> Iterator[None]:
        """While the block runs, :meth:`fire` calls ``stop()``; entering a fired
        one raises CompactionCancelled."""
        with self._lock:
            self.check()
            key = id(stop)
            self._stops[key] = stop
        try:
            yield
        finally:
            with self._lock:
                self._stops.pop(key, None)


@dataclass
class CompactionJob:
    state: TableState
    inputs: list[SSTableReader]
    output_level: int
    bottom: bool                 # no older data outside the inputs for this key range
    split_bytes: int | None      # cut outputs near this size (leveled)
    reason: str
    outputs: list[SSTableReader] = field(default_factory=list)
    pointer: tuple[int, bytes] | None = None  # leveled round robin: (level, last key)
    history: list[SSTableReader] = field(default_factory=list)  # lsmdb.history


def _age_key(r: SSTableReader) -> tuple[int, int]:
    return (r.max_seq, r.number)


def bottom_level_of(state: TableState) -> int:
    return max((r.level for r in state.files), default=0)


def target_fp_chance(state: TableState, bottom: bool) -> float:
    """The fp chance a file written now should get (1.0: no filter)."""
    if bottom and state.options.bloom_filter_skip_last_level:
        return 1.0
    return state.options.bloom_filter_fp_chance


def target_spec(state: TableState, bottom: bool, hasher: Hasher) -> FilterSpec:
    """The filter a file of ``state`` written now gets (in the last level when
    ``bottom``), built with ``hasher``."""
    return FilterSpec(WRITTEN_FAMILIES[state.options.filter_family],
                      target_fp_chance(state, bottom), hasher)


def reader_is_bottom(state: TableState, reader: SSTableReader) -> bool:
    """Is ``reader`` in the last level (size_tiered: does it hold the oldest data)?"""
    if state.options.compaction == "leveled":
        depth = bottom_level_of(state)
        return depth >= 1 and reader.level == depth
    oldest = min(state.files, key=_age_key, default=None)
    return oldest is reader


def slow_path_files() -> int:
    """The level-0 file count from which writes take the path that slows or
    stalls them (the put's C twin reads the same two bounds)."""
    return min(L0_SLOWDOWN_FILES, L0_STALL_FILES)


def pick(state: TableState, busy: frozenset[int] = frozenset()) -> CompactionJob | None:
    """The next compaction this table needs, or None.  ``busy``: the ids of
    files other compactions are merging: a size_tiered job then takes its
    inputs among the others (leveled: none while any is busy)."""
    if state.options.compaction == "leveled":
        if busy and any(id(r) in busy for r in state.files):
            return None
        return _pick_leveled(state)
    return _pick_size_tiered(state, busy)


def _pick_size_tiered(state: TableState, busy: frozenset[int] = frozenset()
                      ) -> CompactionJob | None:
    opts = state.options
    deeper = [r for r in state.files if r.level > 0]
    if deeper and busy and any(id(r) in busy for r in state.files):
        return None
    if deeper:
        # Levels left by a switch from leveled: their data is older than every
        # L0 file, but their seq ranges interleave, so they cannot be ordered
        # by age among themselves.  Merge them all into one oldest L0 file.
        return CompactionJob(state, deeper, 0, True, None,
                             f"size_tiered: merging {len(deeper)} files left in levels >= 1")
    every = sorted(state.files, key=_age_key)  # oldest first
    files = [r for r in every if id(r) not in busy]
    if len(files) < opts.min_threshold:
        return None
    small = opts.min_sstable_size_bytes
    buckets: list[list[SSTableReader]] = []
    current: list[SSTableReader] = []
    total = 0
    # By size, whatever their age (Cassandra's buckets): reads compare sequence
    # numbers where the merged file then overlaps others in age.
    for reader in sorted(files, key=lambda r: (r.size_bytes, _age_key(r))):
        if current:
            avg = total / len(current)
            # Files below min_sstable_size_bytes all count as one size (as in
            # Cassandra), so flushes of varied small sizes still gather.
            if (reader.size_bytes < small and avg < small) or \
                    0.5 * avg <= reader.size_bytes <= 1.5 * avg:
                current.append(reader)
                total += reader.size_bytes
                continue
            buckets.append(current)
        current = [reader]
        total = reader.size_bytes
    if current:
        buckets.append(current)
    eligible = [b for b in buckets if len(b) >= opts.min_threshold]
    if not eligible:
        if len(every) < SIZE_TIERED_MAX_FILES or len(files) < opts.min_threshold:
            return None
        # Sizes interleave so that no bucket fills: merge the cheapest run of
        # adjacent files anyway, so the file count (and the filters an absent
        # key meets) stays bounded.
        width = opts.min_threshold
        start = min(range(len(files) - width + 1),
                    key=lambda i: sum(r.size_bytes for r in files[i:i + width]))
        inputs = files[start:start + width]
        return CompactionJob(state, inputs, 0, is_bottom(every, inputs), None,
                             f"size_tiered: {len(files)} files, merging the {width} cheapest "
                             "adjacent ones")
    # The bucket of the smallest files first: it is the cheapest to merge and
    # removes the most files per byte written (as Cassandra prefers).
    bucket = min(eligible, key=lambda b: sum(r.size_bytes for r in b) / len(b))
    inputs = sorted(bucket[:opts.max_threshold], key=_age_key)
    return CompactionJob(state, inputs, 0, is_bottom(every, inputs), None,
                         f"size_tiered: {len(inputs)} files of similar size")


def is_bottom(files: list[SSTableReader], inputs: list[SSTableReader]) -> bool:
    """Whether no older data than ``inputs``' can lie outside them: every other
    file is newer than all of their entries (then a tombstone or an expired
    value among them hides nothing that stays, and may go)."""
    newest = max(r.max_seq for r in inputs)
    chosen = set(map(id, inputs))
    return all(r.min_seq > newest for r in files if id(r) not in chosen)


def _overlapping(readers: list[SSTableReader], lo: bytes, hi: bytes) -> list[SSTableReader]:
    return [r for r in readers if not (r.max_key < lo or r.min_key > hi)]


def _finish_leveled(state: TableState, inputs: list[SSTableReader], out_level: int,
                    reason: str) -> CompactionJob:
    lo = min(r.min_key for r in inputs)
    hi = max(r.max_key for r in inputs)
    deeper = [r for r in state.files if r.level > out_level]
    bottom = not _overlapping(deeper, lo, hi)
    return CompactionJob(state, inputs, out_level, bottom,
                         state.options.target_file_size_bytes, reason)


def _pick_leveled(state: TableState) -> CompactionJob | None:
    opts = state.options
    l0 = [r for r in state.files if r.level == 0]
    if len(l0) >= L0_COMPACTION_TRIGGER:
        lo = min(r.min_key for r in l0)
        hi = max(r.max_key for r in l0)
        l1 = _overlapping([r for r in state.files if r.level == 1], lo, hi)
        return _finish_leveled(state, l0 + l1, 1, f"leveled: {len(l0)} files in L0")
    depth = bottom_level_of(state)
    for level in range(1, depth + 1):
        readers = sorted((r for r in state.files if r.level == level), key=lambda r: r.min_key)
        size = sum(r.size_bytes for r in readers)
        limit = LEVEL_SIZE_MULTIPLIER ** level * opts.target_file_size_bytes
        if size <= limit:
            continue
        # Round robin over the key space: the first file after the last one compacted.
        pointer = state.compact_pointer.get(level, b"")
        chosen = next((r for r in readers if r.min_key > pointer), readers[0])
        below = _overlapping([r for r in state.files if r.level == level + 1],
                             chosen.min_key, chosen.max_key)
        job = _finish_leveled(state, [chosen] + below, level + 1,
                              f"leveled: L{level} holds {size} bytes > {limit}")
        job.pointer = (level, chosen.max_key)
        return job
    return None


def full_compaction(state: TableState) -> CompactionJob | None:
    """Merge every file of the table; the output is the bottom of the tree."""
    if not state.files:
        return None
    if state.options.compaction == "leveled":
        level = max(1, bottom_level_of(state))
        return CompactionJob(state, list(state.files), level, True,
                             state.options.target_file_size_bytes, "full compaction")
    return CompactionJob(state, list(state.files), 0, True, None, "full compaction")


def _output_in_last_level(job: CompactionJob) -> bool:
    """Do the outputs land in the last level (what bloom_filter_skip_last_level means)?

    Not the same as ``job.bottom`` (no older data for the key range, which is
    what lets tombstones go): an L0 -> L1 merge over keys no L2 file holds is
    the bottom for those keys, but L1 is not the last level.
    """
    if job.state.options.compaction == "leveled":
        return job.output_level >= max(1, bottom_level_of(job.state))
    return job.bottom


def newest_first(inputs: list[SSTableReader]) -> list[SSTableReader]:
    """Inputs in the order a read would consult them."""
    l0 = sorted((r for r in inputs if r.level == 0), key=_age_key, reverse=True)
    deeper = sorted((r for r in inputs if r.level > 0), key=lambda r: r.level)
    return l0 + deeper


def expired_as_tombstones(source: Iterator[tuple[list[bytes], list[Any], list[int]]],
                          now_us: int) -> Iterator[tuple[list[bytes], list[Any], list[int]]]:
    """A compaction's tagged chunks with every value expired at ``now_us`` a
    tombstone of the same sequence number: the merge then drops it where no
    older data of its key can lie below (``job.bottom``) and keeps it where
    some may, so that an older value never comes back (lsmdb.ttl)."""
    for keys, values, tags in source:
        if has_expiring(values):
            values = list(values)
            tags = list(tags)
            for j, v in enumerate(values):
                if type(v) is tuple and now_us >= v[1]:
                    values[j] = None
                    tags[j] = tags[j] >> KIND_BITS << KIND_BITS | KIND_TOMBSTONE
        yield keys, values, tags


@dataclass(frozen=True)
class MergeSpec:
    """Everything a compaction's merge needs besides its input files, in plain
    values: a worker process (lsmdb.worker) runs it as this process would."""

    table: str
    directory: str
    #: (path, file number, level) of each input, in the order a read consults them.
    inputs: tuple[tuple[str, int, int], ...]
    output_level: int
    keep_tombstones: bool
    split_bytes: int | None
    fp_chance: float
    family: int
    hash_algorithm: int
    hash_key_id: int
    block_size: int
    compression: str
    db_id: str
    #: What expiring values expire by (0: no input can hold one).
    now_us: int
    #: The live snapshots older than some input, newest first: each keeps a
    #: version of its own of every key (lsmdb.history).
    stripes: tuple[int, ...]
    min_seq: int
    max_seq: int


def merge_spec(job: CompactionJob, directory: str, hasher: Hasher = FAST_HASHER,
               db_id: str = "", snapshots: Sequence[int] = ()) -> MergeSpec:
    """The merge ``job`` stands for, as of now (its clock, the live snapshots'
    numbers ``snapshots``)."""
    state = job.state
    opts = state.options
    spec = target_spec(state, _output_in_last_level(job), hasher)
    min_seq = min(r.min_seq for r in job.inputs)
    max_seq = max(r.max_seq for r in job.inputs)
    return MergeSpec(
        table=state.name, directory=directory,
        inputs=tuple((r.path, r.number, r.level) for r in newest_first(job.inputs)),
        output_level=job.output_level,
        # While any snapshot lives, tombstones stay (lsmdb.history).
        keep_tombstones=not job.bottom or bool(snapshots),
        split_bytes=job.split_bytes, fp_chance=spec.fp_chance, family=spec.family,
        hash_algorithm=hasher.algorithm, hash_key_id=hasher.key_id,
        block_size=opts.block_size_bytes, compression=opts.compression, db_id=db_id,
        now_us=state.now_us() if any(r.version >= 3 for r in job.inputs) else 0,
        stripes=tuple(sorted({s for s in snapshots if min_seq <= s < max_seq}, reverse=True)),
        min_seq=min_seq, max_seq=max_seq)


def run(job: CompactionJob, alloc_number: Callable[[], int], path_for: Callable[[int], str],
        hasher: Hasher = FAST_HASHER, db_id: str = "",
        snapshots: Sequence[int] = (), cancel: Cancel | None = None) -> list[SSTableReader]:
    """Merge ``job.inputs`` into new fsynced files, in this process; returns
    readers of the outputs (CompactionCancelled, nothing left behind, once
    ``cancel`` fires).

    ``snapshots``: the sequence numbers of the live snapshots.  While any is
    live, tombstones stay; the versions a snapshot older than some input needs
    besides each key's newest go to history files, left in ``job.history``
    (lsmdb.history).  Only reads the inputs and writes new files: nothing the
    database serves changes until the caller installs the outputs through the
    manifest.
    """
    spec = merge_spec(job, os.path.dirname(path_for(0)), hasher, db_id, snapshots)
    outputs, job.history = write_merged(spec, newest_first(job.inputs), alloc_number, path_for,
                                        hasher, open_output, cancel)
    return outputs


def write_merged(spec: MergeSpec, readers: list[SSTableReader],
                 alloc_number: Callable[[], int], path_for: Callable[[int], str],
                 hasher: Hasher, seal: Callable[[str, int, int], Any],
                 cancel: Cancel | None = None) -> tuple[list[Any], list[Any]]:
    """Merge ``readers`` (``spec.inputs``, opened) into new fsynced files: the
    outputs and the history files, each as ``seal(path, number, level)`` gives
    it once the file is complete and fsynced (an object with ``close()``).  On
    an error, everything written is closed and deleted; so too, at the next
    chunk, once ``cancel`` fires."""
    sources: list[Chunks] = [
        chunks(r, None, None, tagged=True) if r.version < 3 else
        expired_as_tombstones(chunks(r, None, None, tagged=True), spec.now_us)
        for r in readers]

    def make(f: FileWriter, number: int) -> SSTableBuilder:
        return SSTableBuilder(f, fp_chance=spec.fp_chance, block_size=spec.block_size,
                              table=spec.table, hasher=hasher, family=spec.family,
                              compression=spec.compression, file_number=number,
                              db_id=spec.db_id)

    def finish(builder: SSTableBuilder, f: FileWriter, path: str, number: int,
               level: int) -> Any:
        builder.finish()
        f.sync()
        f.close()
        return seal(path, number, level)

    history = HistoryWriter(alloc_number, path_for, make,
                            lambda b, f, p, n: finish(b, f, p, n, 0))
    kept: list[tuple[int, bytes, Any, int]] = []  # versions kept for the snapshots
    entries: Iterator[Any] = iter(merge_newest(
        sources, keep_tombstones=spec.keep_tombstones,
        snapshots=list(spec.stripes) if spec.stripes else None,
        kept=kept if spec.stripes else None))
    split_bytes = spec.split_bytes
    outputs: list[Any] = []
    held: list[Any] = []
    paths: list[str] = []
    f = None
    keys: list[bytes] = []
    values: list[bytes | None] = []
    tags: list[int] = []
    try:
        while True:
            if not keys:  # the next chunk of the merged stream
                if cancel is not None:
                    cancel.check()
                keys, values, tags = take_tagged(entries)
                history.take(kept)
                if not keys:
                    break
            number = alloc_number()
            path = path_for(number)
            paths.append(path)
            f = FileWriter(path, WRITE_BUFFER_BYTES)
            builder = make(f, number)
            builder.note_seq(spec.min_seq, spec.max_seq)
            while True:  # fill this output until it is full or the input ends
                added = builder.add_chunk(keys, values, split_bytes, tags)
                keys, values, tags = keys[added:], values[added:], tags[added:]
                if keys or (split_bytes is not None and builder.file_size >= split_bytes):
                    break  # full: the rest starts the next file
                if cancel is not None:
                    cancel.check()
                keys, values, tags = take_tagged(entries)
                history.take(kept)
                if not keys:
                    break
            outputs.append(finish(builder, f, path, number, spec.output_level))
            f = None
        held = history.finish()
    except BaseException:
        if f is not None:
            f.close()
        history.abandon()
        for r in outputs:
            r.close()
        for p in paths:
            unlink_quietly(p)
        raise
    return outputs, held


def open_output(path: str, number: int, level: int) -> SSTableReader:
    """A reader of a compaction's complete output file, in ``level``."""
    reader = SSTableReader(path, number)
    reader.level = level
    return reader
