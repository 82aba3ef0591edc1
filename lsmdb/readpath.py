"""The point read, written once: :func:`lookup`, which ``get``, each file's step of
``get_many`` and ``lsmdb trace`` all run; the C getter (lsmdb/csrc/readpath.c,
readpath_many.c) is its one accelerator.

A read consults the memtables, then every level-0 file newest first, then at
most one file per deeper level (:func:`files_for`: bisect on the level's max
keys).  Per file (:func:`file_filter`, then :func:`file_blocks`):

1. the key range: outside it, ``range_skips``, next file;
2. the filter, probed with one hash per hash function per key, reused for
   every file: a "no" is ``filter_negatives``, next file;
3. on a "maybe" (or with no filter), the one data block that can hold the key:
   the block cache's copy (``block_cache_hits``) or one read from disk
   (``block_reads``), believed only once the data block rule accepts it
   (:mod:`lsmdb.block`); found, ``true_positives``, else ``false_positives``,
   next file.  A block read from disk is offered to the cache
   (``BlockCache.offer``: as a get's block when it held the key, as a false
   positive's when not).

Every entry found goes to :func:`visible`, the one place that decides what
it answers for a read bounded by a sequence number.  Counters are kept on
the files (``FileProbe.counts``) -- unless an *observer* is given: then each
step is told to it instead, and no counter, no mark of the block cache and no
admission changes (``lsmdb trace``).

The C getter does the same steps in the same order and counts the same; a
block it cannot serve (a short read, a bad checksum, a block the rule
refuses, a reader in memory) it hands to :func:`file_blocks` for that file,
which reads it again and raises what it should.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from . import block as blk
from . import table
from .fastpath import C_READ_PATH, LATEST, FastPath, FileProbe
from .filters.hashing import key_hash
from .keys import MAX_KEY_SIZE_BYTES, as_key
from .sstable_format import KIND_BITS, MISSING
from .stats import (
    BLOCK_CACHE_HITS,
    BLOCK_READS,
    FALSE_NEGATIVES,
    FALSE_POSITIVES,
    FILTER_NEGATIVES,
    GETS,
    GETS_ABSENT,
    RANGE_SKIPS,
    TRUE_POSITIVES,
)
from .table import TableState
from .ttl import system_now_us

_c_entry_find: Callable[[bytes, bytes, object], Any] | None
try:
    from ._speedups import Cache, ChangeWatch, Getter, set_entry_seq, set_system_clock
    from ._speedups import entry_find as _c_entry_find
    set_system_clock(system_now_us)  # the C getter reads that clock itself (CLOCK_REALTIME)
    USE_C_GETTER = C_READ_PATH
except ImportError:  # pragma: no cover - built without a C compiler
    USE_C_GETTER = False
    _c_entry_find = None

if TYPE_CHECKING:
    from .versions import Versions

log = logging.getLogger("lsmdb")


def visible(value: Any, bound: int, view: FastPath) -> Any:
    """What an entry found for a key answers a read bounded by sequence number
    ``bound`` in ``view``: the value, None (a tombstone, or an expiring value
    past its time on the view's clock: the key is deleted), or MISSING (no
    version visible here: the read goes on to older data).  Every entry a
    read finds, in a memtable or a file, comes here.  Files keep one version
    per key: each answers as it is, unless it has expired (lsmdb.ttl).
    """
    if type(value) is tuple:
        return value[0] if view.now_us() < value[1] else None
    return value


def entry_find(entry: bytes, key: bytes) -> Any:
    """``key``'s value in a cached block (lsmdb.block.entry_find; in C where built)."""
    if _c_entry_find is not None:
        return _c_entry_find(entry, key, MISSING)
    return blk.entry_find(entry, key)


class ReadObserver(Protocol):
    """What :func:`lookup` tells of each step when given an observer (and then
    counts nothing): ``lsmdb trace`` records them."""

    def memtable(self, age: int | None, value: Any) -> None:
        """Memtable ``age`` (0 the live one, 1.. the frozen ones newest first)
        held the key (``value``: None a tombstone); ``age`` None: none did."""

    def level_miss(self, level: int, files: int) -> None:
        """No file of ``level`` (of ``files`` files) can hold the key."""

    def range_skip(self, p: FileProbe) -> None:
        """The key is outside ``p``'s range."""

    def filter_absent(self, p: FileProbe, h: int) -> None:
        """``p``'s filter says "no" to the key of hash ``h``."""

    def filter_maybe(self, p: FileProbe, h: int | None) -> None:
        """``p``'s filter says "maybe" (``h`` None: it has no filter)."""

    def block(self, p: FileProbe, i: int, cached: bool, value: Any) -> None:
        """Block ``i`` of ``p`` (from the cache when ``cached``) was read for the
        key and answers ``value`` (MISSING: a false positive)."""


class KeyHashes:
    """One key's hashes, each computed once, for every file of that hash."""

    __slots__ = ("key", "by_fn")

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.by_fn: dict[Any, int] = {}

    def __call__(self, fn: Callable[[bytes], int] | None) -> int:
        h = self.by_fn.get(fn)
        if h is None:
            h = self.by_fn[fn] = (key_hash if fn is None else fn)(self.key)
        return h


#: What file_filter answers: the file cannot hold the key; it may (read the
#: block); the filter said no but shadow mode reads the block anyway.
NO, MAYBE, SHADOW = 0, 1, 2


def lookup(view: FastPath, key: bytes, bound: int = LATEST,
           observer: ReadObserver | None = None) -> Any:
    """The point read of ``key`` in a table's ``view`` (see the module docstring):
    its value, None (deleted) or MISSING (in no memtable and no file).  O(files)."""
    for age, data in enumerate((view.data, *view.imm_datas)):
        value = data.get(key, MISSING)
        if value is not MISSING:
            value = visible(value, bound, view)
            if value is not MISSING:
                if observer is not None:
                    observer.memtable(age, value)
                return value
    if observer is not None:
        observer.memtable(None, MISSING)
    hashes = KeyHashes(key)
    if view.seq_overlap:
        return lookup_by_seq(view, key, hashes, min(bound, view.bound), observer)
    for p in files_for(view, key, observer):
        kind = file_filter(view, p, key, hashes, observer)
        if kind:
            value = file_blocks(view, p, [key], bound, observer, kind == SHADOW)[0]
            if value is not MISSING:
                return value
    return MISSING


def lookup_by_seq(view: FastPath, key: bytes, hashes: KeyHashes, bound: int,
                  observer: ReadObserver | None) -> Any:
    """``lookup``'s files when level-0 files overlap in sequence numbers (a merge
    of files not adjacent in age; FastPath.seq_overlap): of the level-0 files
    that hold the key, the version with the highest sequence number not above
    ``bound`` answers.  The files are newest first by their highest sequence
    number, so the walk stops at the first whose highest is not above the best
    found; only when level 0 holds no version do the deeper levels answer, the
    first as ever -- unless the read is bounded (a snapshot's view,
    lsmdb.history): then every level's file is compared the same way."""
    best: Any = MISSING
    best_seq = -1
    for p in view.l0:
        if best is not MISSING and p.max_seq <= best_seq:
            break
        kind = file_filter(view, p, key, hashes, observer)
        if kind:
            value = file_blocks(view, p, [key], bound, observer, kind == SHADOW)[0]
            if value is not MISSING:
                seq = entry_seq(view, p, key)
                if best_seq < seq <= bound:
                    best, best_seq = value, seq
    if best is not MISSING and bound == LATEST:
        return best
    for p in files_for(view, key, observer, deeper_only=True):
        kind = file_filter(view, p, key, hashes, observer)
        if kind and (best is MISSING or p.max_seq > best_seq):
            value = file_blocks(view, p, [key], bound, observer, kind == SHADOW)[0]
            if value is not MISSING:
                if bound == LATEST:
                    return value
                seq = entry_seq(view, p, key)
                if best_seq < seq <= bound:
                    best, best_seq = value, seq
    return best


def entry_seq(view: FastPath, p: FileProbe, key: bytes) -> int:
    """The sequence number of ``key``'s entry in file ``p`` (which holds it): from
    its block's tags, in the block cache or read again (not counted: the read
    that found it was); a format-1 file's entries all take its ``max_seq``."""
    reader = p.reader
    if reader.version < 2:
        return reader.max_seq
    b = bisect_left(p.index_keys, key)
    entry = view.cache.lookup(p.cache_base + b) if view.cache is not None else None
    if entry is not None:
        keys, _values, tags = blk.entry_tagged(entry)
    else:
        keys, _values, tags = reader.decode_full(b, reader.read_raw(b))
    return int(tags[bisect_left(keys, key)]) >> KIND_BITS


if USE_C_GETTER:
    set_entry_seq(entry_seq)  # what the C getter asks of a block it handed over


def files_for(view: FastPath, key: bytes, observer: ReadObserver | None = None,
              deeper_only: bool = False) -> Iterator[FileProbe]:
    """The files a read of ``key`` consults, in order: every level-0 file, newest
    first (unless ``deeper_only``), then in each deeper level the first file
    whose max key is at or above ``key`` (the only one that can hold it)."""
    if not deeper_only:
        yield from view.l0
    for level, lv in enumerate(view.deeper, 1):
        i = bisect_left(lv.max_keys, key)
        if i < len(lv.files):
            yield lv.files[i]
        elif observer is not None and lv.files:
            observer.level_miss(level, len(lv.files))


def file_filter(view: FastPath, p: FileProbe, key: bytes, hashes: Callable[[Any], int],
                observer: ReadObserver | None = None) -> int:
    """The range check and the filter of file ``p`` for ``key`` (``hashes(fn)``:
    its hash under ``fn``): NO (counted), MAYBE, or -- in shadow mode, where a
    block the filter rejected is read anyway to check it -- SHADOW."""
    if key < p.min_key or key > p.max_key:
        if observer is None:
            p.counts[RANGE_SKIPS] += 1
        else:
            observer.range_skip(p)
        return NO
    if not p.filter_family:
        if observer is not None:
            observer.filter_maybe(p, None)
        return MAYBE
    h = hashes(p.hash_fn)
    if p.filter.may_contain(h):
        if observer is not None:
            observer.filter_maybe(p, h)
        return MAYBE
    if observer is not None:
        observer.filter_absent(p, h)
        return NO
    if view.shadow:
        return SHADOW  # counted by file_blocks: a false negative if the block holds it
    p.counts[FILTER_NEGATIVES] += 1
    return NO


def file_blocks(view: FastPath, p: FileProbe, keys: list[bytes], bound: int = LATEST,
                observer: ReadObserver | None = None, said_no: bool = False) -> list[Any]:
    """After file ``p``'s filter let ``keys`` through: each key's value there
    (None: a tombstone) or MISSING, each distinct block taken from the cache
    or read from disk once for all the keys it can hold -- every block looked
    up in the cache first, then those it does not hold read in file order, so
    that what the cache holds afterwards does not depend on the keys' order.
    Counted per key as a true or a false positive (``said_no``: the filter had
    said no, shadow mode: a false negative or a filter negative), a cache hit
    per key a cached block answers, a block read per block read from disk; a
    block read is offered to the cache once (``BlockCache.offer``), as a get's
    block when it held one of its keys."""
    out: list[Any] = [MISSING] * len(keys)
    by_block: dict[int, list[int]] = {}
    index_keys = p.index_keys
    for n, key in enumerate(keys):
        by_block.setdefault(bisect_left(index_keys, key), []).append(n)
    counts = p.counts
    cache = view.cache
    hit, miss = (FALSE_NEGATIVES, FILTER_NEGATIVES) if said_no else (TRUE_POSITIVES,
                                                                     FALSE_POSITIVES)

    def answer(b: int, entry: bytes | None, members: list[int], cached: bool,
               held: dict[bytes, Any] | None = None) -> bool:
        """Look ``members`` up in block ``b`` (None: past the last block; or in
        ``held``, the values a partial read found); whether one was there."""
        found = False
        for n in members:
            if held is not None:
                value = held.get(keys[n], MISSING)
            else:
                value = MISSING if entry is None else entry_find(entry, keys[n])
            if value is not MISSING:
                found = True
                if said_no:
                    log.error("%s: filter false negative for key %r -- the filter said "
                              "absent but the key is in the file (answer still correct: "
                              "shadow mode)", p.reader.path, keys[n])
                out[n] = visible(value, bound, view)
            if observer is None:
                counts[hit if value is not MISSING else miss] += 1
            else:
                observer.block(p, b if entry is not None else -1, cached,
                               out[n] if value is not MISSING else MISSING)
        return found

    from_disk = []
    for b, members in by_block.items():
        if b == len(index_keys):  # past the last key: no block can hold them
            answer(b, None, members, False)
            continue
        entry = None
        if cache is not None:
            cache_key = p.cache_base + b
            entry = cache.get(cache_key) if observer is None else cache.lookup(cache_key)
        if entry is None:
            from_disk.append(b)
            continue
        if observer is None:
            counts[BLOCK_CACHE_HITS] += len(members)
        answer(b, entry, members, True)
    for b in sorted(from_disk):
        raw = p.reader.read_raw(b, check=False)
        members = by_block[b]
        if observer is None:
            counts[BLOCK_READS] += 1  # a read, whatever it holds
            # A block the cache would not take answers from its first arrays
            # (FORMAT.md §4.2), the admission told as the offer would tell it:
            # none of these among its keys, not there; in format 2, where
            # the cache would not take a get's block either (none, or full),
            # from the keys and the values up to theirs.  The C getter
            # decompresses an LZ4 block no further.
            if cache is None or not cache.admission.rereads(p.cache_base + b):
                wanted = [keys[n] for n in members]
                if p.reader.version == 2 and (cache is None or cache.admission.full):
                    held = p.reader.values_among(b, raw, wanted)
                    found = answer(b, None, members, False, held)
                    if cache is not None:
                        (cache.admission.admit if found
                         else cache.admission.admit_reread)(p.cache_base + b)
                    continue
                if not p.reader.keys_among(b, raw, wanted):
                    counts[miss] += len(members)
                    if cache is not None:
                        cache.admission.admit_reread(p.cache_base + b)
                    continue
        entry = p.reader.entry_of(b, raw)  # CorruptionError unless it holds together
        found = answer(b, entry, members, False)
        if cache is not None and observer is None:
            cache.offer(p.cache_base + b, entry, found)
    return out


def state_getter(db: Versions, state: TableState) -> Any:
    """The compiled getter of ``state`` (made once per table state)."""
    getter = state.getter
    if getter is None:
        getter = state.getter = make_getter(db, state)
    return getter


def make_getter(db: Versions, state: TableState) -> Any:
    """``get(key, default=None)`` of one table: :func:`lookup` over the table's
    current view, counted (``gets``, ``gets_absent``) -- or, where the C
    speedups serve, the C getter doing the same."""
    max_key = MAX_KEY_SIZE_BYTES
    missing = MISSING
    counts = state.counts
    follower = db.follower  # a following handle's (lsmdb.follow), set before any getter

    def get(key: Any, default: Any = None) -> Any:
        if type(key) is not bytes or len(key) > max_key:
            key = as_key(key)
        if follower is not None:
            follower.check()
        if db.closed:
            db.check_open()
        counts[GETS] += 1
        value = lookup(state.fast, key)
        if value is missing or value is None:
            counts[GETS_ABSENT] += 1
            return default
        return value

    cache = db.block_cache
    if USE_C_GETTER and table.USE_SPEEDUPS and (cache is None or isinstance(cache, Cache)) \
            and (follower is None or isinstance(follower.watch, ChangeWatch)):
        # The same read in C: unusual calls (non-bytes keys, keywords, a closed
        # database, shadow mode, a filter family C does not probe) go to ``get``
        # above; a block it cannot serve to file_blocks (_c_blocks).  A
        # following handle's checks the writer's counters first, as ``get``.
        getter = Getter(db, state, missing, _c_blocks, get, max_key, cache)
        if follower is not None:
            getter.follow(follower.watch, follower.catch_up)
        return getter
    return get


def make_nodisk(db: Versions, state: TableState
                ) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """``(nodisk, resume, python_nodisk)`` of one table, for a caller that must
    not wait on the disk (lsmdb.aio): ``nodisk(key, default=None)`` is the get
    when memory answers it -- a memtable, the filters' "no", the block cache --
    counted as a get; otherwise a *pause* ``(MISSING, view, i, ...)``, and
    ``resume(key, default, *pause[1:])``, run where waiting is fine, reads the
    rest from file ``i`` of the view on (``view`` None, ``i`` -1: the whole
    get, nothing counted before).  A get so split counts what one ``get``
    counts.  ``nodisk`` is the C getter's where it serves; a pause whose ``i``
    is -2 says its view has no C path (shadow mode): ``python_nodisk``, the
    Python twin, may still answer from memory."""
    getter = state_getter(db, state)
    max_key = MAX_KEY_SIZE_BYTES
    counts = state.counts
    follower = db.follower
    whole = (MISSING, None, -1, True)

    def nodisk(key: Any, default: Any = None) -> Any:
        if type(key) is not bytes or len(key) > max_key or db.closed or \
                (follower is not None and follower.watch.changed()):
            return whole
        view = state.fast
        for data in (view.data, *view.imm_datas):
            value = data.get(key, MISSING)
            if value is not MISSING:
                value = visible(value, LATEST, view)
                if value is not MISSING:
                    counts[GETS] += 1
                    if value is None:
                        counts[GETS_ABSENT] += 1
                        return default
                    return value
        if view.seq_overlap or view.shadow:
            return whole  # files compared by sequence number, or read after a "no"
        counts[GETS] += 1
        return files_from(view, key, default, 0, True)

    def files_from(view: FastPath, key: bytes, default: Any, start: int, no_disk: bool) -> Any:
        hashes = KeyHashes(key)
        for i, p in enumerate(files_for(view, key)):
            if i < start:
                continue  # counted before the pause
            if file_filter(view, p, key, hashes):  # a "maybe" is not counted: asked again
                if no_disk:
                    value = cached_answer(view, p, key)
                    if value is NOT_CACHED:
                        return (MISSING, view, i, True)
                else:
                    value = file_blocks(view, p, [key])[0]
                if value is not MISSING:
                    if value is None:
                        break
                    return value
        counts[GETS_ABSENT] += 1
        return default

    c_nodisk = getattr(getter, "nodisk", None)
    c_resume = getattr(getter, "resume", None)

    def resume(key: Any, default: Any, view: Any, i: int, python: bool = False) -> Any:
        if i < 0:
            return getter(key, default)
        if python or c_resume is None:  # a pause of the Python twin's
            return files_from(view, key, default, i, False)
        return c_resume(key, default, view, i)

    return (nodisk if c_nodisk is None else c_nodisk), resume, nodisk


#: cached_answer's "the block is not in the cache".
NOT_CACHED = object()


def cached_answer(view: FastPath, p: FileProbe, key: bytes) -> Any:
    """:func:`file_blocks` of one key when its block needs no read from disk (past
    the last block, or in the cache: taken once, so that no other thread's
    eviction can send it to the disk meanwhile), counted the same; else
    NOT_CACHED, nothing counted."""
    b = bisect_left(p.index_keys, key)
    if b == len(p.index_keys):
        return file_blocks(view, p, [key])[0]
    entry = view.cache.get(p.cache_base + b) if view.cache is not None else None
    if entry is None:
        return NOT_CACHED
    p.counts[BLOCK_CACHE_HITS] += 1
    value = entry_find(entry, key)
    if value is MISSING:
        p.counts[FALSE_POSITIVES] += 1
        return MISSING
    p.counts[TRUE_POSITIVES] += 1
    return visible(value, LATEST, view)


def _c_blocks(fast: Any, f: int, keys: list[bytes]) -> list[Any]:
    """The C getter's hand-over: :func:`file_blocks` of file ``f`` (an index into
    ``fast.files``) for ``keys``, whose block the C path did not serve."""
    return file_blocks(fast, fast.files[f], keys)


def get_many(db: Versions, state: TableState, keys: Iterable[Any]) -> list[Any]:
    """Values of ``keys`` (None where absent), in the order given.

    Each key is hashed once per hash function; files are visited once each, in
    read order, with every still-unanswered key that falls in their range
    (:func:`file_filter`) -- level 0 newest first, then each deeper level's
    files in key order; the keys a file's filter lets through go to
    :func:`file_blocks` together, so each distinct block is read (or taken
    from the cache) once per call.  Counters are kept as for ``get``, and the
    C getter takes the same steps in the same order, so both count the same
    whatever the keys' order.
    """
    given = keys if type(keys) is list else list(keys)
    if db.follower is not None:
        db.follower.check()
    getter = state_getter(db, state)
    many = getattr(getter, "many", None)
    if many is not None:  # the C getter: the whole call in C
        answers = many(given)
        if answers is None:  # C declines odd keys: as_key raises on a bad one
            answers = many([as_key(k) for k in given])
        if answers is not None:
            return answers
        if state.fast.seq_overlap:  # overlapping files, the C call declined: C gets
            return [getter(k) for k in given]
    ks = [k if type(k) is bytes and len(k) <= MAX_KEY_SIZE_BYTES else as_key(k) for k in given]
    if db.closed:
        db.check_open()
    return many_python(state, state.fast, ks)


def many_python(state: TableState, view: FastPath, ks: list[bytes]) -> list[Any]:
    """get_many's reference in Python: the memtables for every key, then each
    file in read order for the keys still open (see :func:`get_many`)."""
    n = len(ks)
    state.counts[GETS] += n
    out: list[Any] = [MISSING] * n
    for data in (view.data, *view.imm_datas):
        for i in range(n):
            if out[i] is MISSING:
                out[i] = visible(data.get(ks[i], MISSING), LATEST, view)
    pending = [i for i in range(n) if out[i] is MISSING]
    if view.seq_overlap:  # each key compares versions across files (lookup_by_seq)
        for i in pending:
            out[i] = lookup_by_seq(view, ks[i], KeyHashes(ks[i]), view.bound, None)
        state.counts[GETS_ABSENT] += sum(v is MISSING or v is None for v in out)
        return [None if v is MISSING else v for v in out]
    hashes: dict[Any, list[int]] = {}

    def hash_of(i: int) -> Callable[[Any], int]:
        def of(fn: Any) -> int:
            hv = hashes.get(fn)
            if hv is None:  # every key's hash under fn, once per call
                h = key_hash if fn is None else fn
                hv = hashes[fn] = [h(k) for k in ks]
            return hv[i]
        return of

    def visit(p: FileProbe, idx: list[int]) -> list[int]:
        """Answer what ``p``'s file can of ``idx``; returns the indexes still open."""
        groups: tuple[list[int], list[int], list[int]] = ([], [], [])  # NO, MAYBE, SHADOW
        for i in idx:
            groups[file_filter(view, p, ks[i], hash_of(i))].append(i)
        still = groups[NO]
        for kind in (MAYBE, SHADOW):
            if groups[kind]:
                values = file_blocks(view, p, [ks[i] for i in groups[kind]], LATEST, None,
                                     kind == SHADOW)
                for i, value in zip(groups[kind], values, strict=True):
                    if value is MISSING:
                        still.append(i)
                    else:
                        out[i] = value
        return still

    for p in view.l0:
        if not pending:
            break
        pending = visit(p, pending)
    for lv in view.deeper:
        if not pending:
            break
        by_file: dict[int, list[int]] = {}
        rest: list[int] = []
        for i in pending:
            f = bisect_left(lv.max_keys, ks[i])
            if f < len(lv.files):
                by_file.setdefault(f, []).append(i)
            else:
                rest.append(i)
        for f in sorted(by_file):  # the level's files in key order
            rest += visit(lv.files[f], by_file[f])
        pending = rest
    absent = 0
    for i in range(n):
        if out[i] is MISSING or out[i] is None:
            out[i] = None
            absent += 1
    state.counts[GETS_ABSENT] += absent
    return out
