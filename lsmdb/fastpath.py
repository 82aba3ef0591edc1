"""What a point read takes of a table in one step, and the C read path's view of it.

``TableState.publish`` flattens a table's memtables and files into one
:class:`FastPath` per change, so that a get takes its whole state with one
attribute load and never sees half a change.  Each SSTable there is a
:class:`FileProbe`: its key range, its filter (the object, and what the C
probe reads of it: its family id, buffer and parameters, lsmdb.filters'
ProbeSpec), the hash it probes with, its index, its counters and its block
cache keys.  The Python read path (lsmdb/readpath.py) walks the FileProbes;
the C one (lsmdb/csrc/) reads the same named tuples -- NamedTuples are
tuples -- by the index macros of fastpath.h (``FILE_FILTER_DATA``,
``FAST_PROBES``, ...), and counts into the slots of :mod:`lsmdb.stats`.

The C module exports the field names of each structure and the counter
names in the order its macros number them (``_speedups.FILE_PROBE_FIELDS``,
``LEVEL_FIELDS``, ``FAST_PATH_FIELDS``, ``FILE_COUNTERS``,
``TABLE_COUNTERS``).  At import they are compared with the definitions
here and in stats.py: on a mismatch -- an extension built from other sources
than this Python, which would read the wrong fields or count into the wrong
slots -- the C read path is refused with a warning and reads take the
Python path (same answers, slower); ``LAYOUT_ERRORS`` says why.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

from .filters import FAMILIES, FAMILY_NONE, Filter
from .filters.hashing import key_hash
from .stats import c_counter_errors

if TYPE_CHECKING:
    from .memtable import Memtable
    from .sstable_reader import SSTableReader
    from .version import Version

_speedups: ModuleType | None
try:
    from . import _speedups
except ImportError:  # pragma: no cover - built without a C compiler
    _speedups = None

log = logging.getLogger("lsmdb")


class FileProbe(NamedTuple):
    """What a point read needs of one SSTable (``probe_of``): the Python
    getter reads its fields by name, the C Probes by the ``FILE_*`` macros."""

    reader: SSTableReader          # reads the data block after a "maybe"
    min_key: bytes                 # the file's key range
    max_key: bytes
    counts: array[int]             # the file's counters (stats.FILE_COUNTERS)
    hash_fn: Callable[[bytes], int] | None  # the filter's hash; None: hashing.key_hash
    filter: Filter                 # the filter (lsmdb.filters; FailOpen: every key "maybe")
    filter_family: int             # its ProbeSpec: FAMILY_NONE, nothing to probe ...
    filter_data: Any               # ... the buffer the probe reads ...
    filter_params: tuple[int, ...]  # ... and the family's integers
    index_keys: list[bytes]        # the last key of each data block
    index_offsets: list[int]       # where each data block starts in the file
    index_sizes: list[int]         # and its payload's size
    cache_base: int                # block i is cached under cache_base + i
    format_version: int = 2        # the file's layout (1, 2 or 3): its blocks' trailer and shape
    max_seq: int = 0               # the newest sequence number in the file


class Level(NamedTuple):
    """One level below level 0: its files in key order, and their max keys
    (a key's file is the first whose max key is at or above it)."""

    max_keys: tuple[bytes, ...]
    files: tuple[FileProbe, ...]


#: The read bound of a read that sees every write (the largest sequence number).
LATEST = (1 << 64) - 1


class FastPath(NamedTuple):
    """A table's read state, newest data first (``fast_path``): what
    ``lsmdb.readpath.lookup`` reads (its view)."""

    data: dict[bytes, bytes | None]               # the memtable's dict
    imm_datas: tuple[dict[bytes, bytes | None], ...]  # the frozen memtables' dicts
    l0: tuple[FileProbe, ...]                     # level-0 files, newest first
    deeper: tuple[Level, ...]                     # levels 1, 2, ...
    probes: Any                                   # the C Probes of l0 and deeper, or None
    files: tuple[FileProbe, ...]                  # l0, then deeper's files: the C probes' order
    filters: tuple[Any, ...]                      # the memtables' key filters (C), or Nones
    cache: Any                                    # the block cache, or None
    shadow: bool                                  # shadow mode: read what the filter rejects
    version: Version                              # the files, as lsmdb.version has them
    now_us: Callable[[], int]                     # the clock expiring values expire by
    seq_overlap: bool = False                     # level-0 files overlap in sequence numbers
    bound: int = LATEST                           # a snapshot's: no entry above this number


def probe_of(reader: SSTableReader) -> FileProbe:
    """``reader``'s FileProbe, as its filter and cache keys are now."""
    handle = reader.filter
    active = handle.active
    family, data, params = active.probe_spec()
    return FileProbe(reader, reader.min_key, reader.max_key, reader.counts, handle.hash_fn,
                     active, family, data, params, reader.index_keys, reader.index_offsets,
                     reader.index_sizes, reader.cache_base, reader.version, reader.max_seq)


def fast_path(mem: Memtable, imms: Sequence[Memtable], version: Version, cache: Any,
              shadow: bool, with_c: bool, now_us: Callable[[], int]) -> FastPath:
    """The FastPath of these memtables (newest first) and ``version``'s files
    (level 0 newest first, then each deeper level's files in key order), read
    through ``cache``; with the C Probes of the files when ``with_c``."""
    l0_probes = tuple(probe_of(r) for r in version.l0)
    levels = tuple(Level(keys, tuple(probe_of(r) for r in readers))
                   for keys, readers in version.levels)
    files = l0_probes + tuple(p for level in levels for p in level.files)
    return FastPath(mem.data, tuple(m.data for m in imms), l0_probes, levels,
                    _c_probes(l0_probes, levels) if with_c else None, files,
                    (mem.filter, *(m.filter for m in imms)), cache, shadow, version, now_us,
                    seq_overlap(version.l0))


def seq_overlap(l0: Sequence[SSTableReader]) -> bool:
    """Whether level-0 files (newest first) overlap in sequence numbers -- what a
    merge of files not adjacent in age leaves -- so that a key found in one
    may have a newer version in a later one: a read then compares sequence
    numbers (lsmdb.readpath).  Disjoint ranges, newest first, need only the
    first file that holds a key."""
    return any(a.min_seq <= b.max_seq for a, b in zip(l0, l0[1:], strict=False))


def _c_probes(l0: tuple[FileProbe, ...], deeper: tuple[Level, ...]) -> Any:
    """The C Probes of these files, or None (then the Python path serves): also
    when a file's filter is of a family the C read path does not probe, so that
    both paths count the same."""
    assert Probes is not None
    families = {p.filter_family for p in l0} | {p.filter_family for lv in deeper
                                                for p in lv.files}
    if not families <= C_FILTER_FAMILIES:
        return None
    try:
        return Probes(l0, deeper, key_hash)
    except (TypeError, ValueError, OverflowError) as exc:  # should not happen: be slow, not wrong
        log.warning("C read path unavailable for these files (%s); using the Python path", exc)
        return None


def py_constants() -> dict[str, int]:
    """The constants the C read path shares with Python, as Python defines them:
    the SSTable's block trailer (lsmdb.sstable_format), the cached form of a
    block (lsmdb.block) and the cache's admission bitmap (lsmdb.cache)."""
    from . import block, cache, sstable_format
    return {"BLOCK_TRAILER_SIZE": sstable_format.BLOCK_TRAILER_SIZE,
            "DATA_TRAILER_V2_SIZE": sstable_format.DATA_TRAILER_V2_SIZE,
            "CRC32_RESIDUE": sstable_format.CRC32_RESIDUE,
            "CACHE_ENTRY_TAIL": block.CACHE_ENTRY_TAIL.size,
            "CACHE_ENTRY_OFFSET": block.CACHE_ENTRY_OFFSET.size,
            "ADMISSION_BITS_PER_KEY": cache.BITS_PER_REMEMBERED,
            "ADMISSION_MAX_BITS": cache.MAX_ADMISSION_BITS}


#: The structures the C read path reads, by the name of the tuple of their
#: field names it exports.
_EXPORTS: dict[str, type[Any]] = {"FILE_PROBE_FIELDS": FileProbe, "LEVEL_FIELDS": Level,
                                  "FAST_PATH_FIELDS": FastPath}


def layout_errors(module: ModuleType | None) -> list[str]:
    """What the C read path of ``module`` (lsmdb._speedups, or None: not built)
    reads or counts otherwise than the Python definitions; [] when nothing.

    >>> layout_errors(None)
    []
    """
    if module is None:
        return []
    errors = []
    for export, structure in _EXPORTS.items():
        fields = getattr(module, export, None)
        if fields != structure._fields:
            errors.append(f"{structure.__name__} fields {fields} are not {structure._fields}")
    c_constants = getattr(module, "CONSTANTS", {})
    for name, value in py_constants().items():
        if c_constants.get(name) != value:
            errors.append(f"{name} is {c_constants.get(name)} in C, {value} here")
    c_families = getattr(module, "FILTER_FAMILIES", {})
    for family, name in sorted(c_families.items()):
        known = FAMILIES.get(family)
        if known is None or known.name != name:
            errors.append(f"filter family {family} is {name!r} in C, "
                          f"{known.name if known else 'unknown'!r} here")
    file_slots = getattr(module, "FILE_COUNTERS", None)
    table_slots = getattr(module, "TABLE_COUNTERS", None)
    if file_slots is None or table_slots is None:
        return [*errors, "it exports no counter slots"]
    return errors + c_counter_errors(file_slots, table_slots)


#: Why the C read path is refused ([] when it is in use, or not built).
LAYOUT_ERRORS = layout_errors(_speedups)
#: Whether the C getter and probes may serve reads.
C_READ_PATH = _speedups is not None and not LAYOUT_ERRORS
if LAYOUT_ERRORS:
    log.warning("lsmdb._speedups does not match this lsmdb (%s): reads take the Python "
                "path; rebuild the extension (pip install .)", "; ".join(LAYOUT_ERRORS))
#: The C Probes type, where the C read path serves.
Probes: Any = _speedups.Probes if C_READ_PATH and _speedups is not None else None
#: The filter families the C read path probes (and FAMILY_NONE, nothing to probe).
C_FILTER_FAMILIES = frozenset(getattr(_speedups, "FILTER_FAMILIES", {})) | {FAMILY_NONE}
