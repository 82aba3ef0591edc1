"""The read path: compiled per-table getters, ``get_many`` and scans.

A get consults the memtables, then every level-0 file newest first, then at
most one file per deeper level (bisect on the level's key ranges).  Per file:
the key range, then the Bloom filter (``bloom.may_contain``, from one hash per
get reused for every file) and only on a "maybe" exactly one data block or a
block-cache hit (``SSTableReader.lookup``).  Every step is counted on the file
(SSTableInfo).  A scan
merges the memtables and files whose range it meets, newest first
(:mod:`lsmdb.merge`), over a snapshot taken when it starts.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from . import table
from .fastpath import C_READ_PATH, FileProbe
from .filters.hashing import key_hash as _key_hash
from .keys import MAX_KEY_SIZE_BYTES, as_key
from .merge import merge_newest
from .sstable_format import MISSING
from .sstable_reader import SSTableReader
from .stats import FILTER_NEGATIVES, RANGE_SKIPS
from .table import TableState

try:
    from ._speedups import Cache, Getter
    USE_C_GETTER = C_READ_PATH
except ImportError:  # pragma: no cover - built without a C compiler
    USE_C_GETTER = False

if TYPE_CHECKING:
    from .versions import Versions

log = logging.getLogger("lsmdb")


def state_getter(db: Versions, state: TableState) -> Any:
    """The compiled getter of ``state`` (made once per table state)."""
    getter = state.getter
    if getter is None:
        getter = state.getter = make_getter(db, state)
    return getter


def make_getter(db: Versions, state: TableState) -> Any:
    """Compile the point-read path of one table into a closure.

    ``get(key, default=None)``: memtables, then level-0 files newest first,
    then at most one file per deeper level (bisect on key ranges).  Per file:
    key range check, then the filter (``bloom.may_contain``) from a hash
    computed at most once per get (one fast and at most one keyed hash), then
    on a "maybe" exactly one data block or a cache hit
    (``SSTableReader.lookup``).  Every step is counted on the file (see
    SSTableInfo).
    """
    missing = MISSING
    key_hash = _key_hash
    cache = db.block_cache
    max_key = MAX_KEY_SIZE_BYTES
    _bisect = bisect_left

    def get(key: Any, default: Any = None) -> Any:
        if type(key) is not bytes or len(key) > max_key:
            key = as_key(key)
        if db.closed:
            db.check_open()
        fast = state.fast
        state.gets += 1
        value = fast.data.get(key, missing)
        if value is missing and fast.imm_datas:
            for imm in fast.imm_datas:
                value = imm.get(key, missing)
                if value is not missing:
                    break
        if value is not missing:
            if value is None:
                state.gets_absent += 1
                return default
            return value
        probes = fast.probes
        if probes is not None and not state.shadow:
            # C: range checks and filter probes (counted there) up to the
            # first file that may hold the key; resumed after a false positive.
            f = probes.first(key, 0)
            while f >= 0:
                value = fast.files[f].reader.lookup(key)
                if value is not missing:
                    if value is None:
                        break
                    return value
                f = probes.first(key, f + 1)
            state.gets_absent += 1
            return default
        files: Any = fast.l0
        if fast.deeper:
            files = list(files)
            for level in fast.deeper:
                i = _bisect(level.max_keys, key)
                if i < len(level.files):
                    files.append(level.files[i])
        hashes: dict[Any, int] = {}  # one hash per hash function per get
        for p in files:
            if key < p.min_key or key > p.max_key:
                p.counts[RANGE_SKIPS] += 1
                continue
            if p.filter_family:
                h = hashes.get(p.hash_fn)
                if h is None:
                    h = hashes[p.hash_fn] = (key_hash if p.hash_fn is None else p.hash_fn)(key)
                if not p.filter.may_contain(h):
                    if state.shadow:
                        value = _shadow_check(p.reader, key)
                        if value is not missing:
                            if value is None:
                                state.gets_absent += 1
                                return default
                            return value
                    p.counts[FILTER_NEGATIVES] += 1
                    continue
            value = p.reader.lookup(key)
            if value is missing:
                continue
            if value is None:
                break
            return value
        state.gets_absent += 1
        return default

    if USE_C_GETTER and table.USE_SPEEDUPS and (cache is None or isinstance(cache, Cache)):
        # The same read with the per-file steps and the bookkeeping in C;
        # unusual calls (non-bytes keys, keywords, closed database, shadow
        # mode) go to ``get`` above.  It looks blocks up in the cache's C
        # books, marks hits and puts the blocks it reads there itself, as
        # ``lookup``/``touch``/``admit``/``put`` do; a block it cannot serve
        # goes to SSTableReader.lookup.
        return Getter(db, state, missing, SSTableReader.lookup, get, max_key, cache)
    return get


def _shadow_check(reader: SSTableReader, key: bytes) -> Any:
    """Shadow mode: read the block the filter would have skipped."""
    value = reader.find(key)
    if value is not MISSING:
        reader.false_negatives += 1
        log.error("%s: Bloom filter false negative for key %r -- the filter said absent "
                  "but the key is in the file (answer still correct: shadow mode)",
                  reader.path, key)
    return value


def get_many(db: Versions, state: TableState, keys: Iterable[Any]) -> list[Any]:
    """Values of ``keys`` (None where absent), in the order given.

    Each key is hashed once; files are visited once each, in read order, with
    every still-unanswered key that falls in their range; keys the filter
    lets through are grouped by data block so each distinct block is read
    (or fetched from the cache) once per call.  Counters are kept exactly as
    for ``get``.
    """
    # The C getter takes a list as it is (it makes its own copy where it needs
    # one, and returns the keys it answered as ks); anything else is listed here.
    given = keys if type(keys) is list else list(keys)
    many = getattr(state_getter(db, state), "many", None)
    if many is not None:  # the C getter: memtables and filters for every key in one call
        res = many(given)
        if res is None:
            # raises on a bad key; C declines only odd ones
            res = many([as_key(k) for k in given])
        if res is not None:
            answers, maybes, fast, ks = res
            if maybes:
                _files_many_c(ks, maybes, answers, fast.probes, fast.files)
                absent = 0
                for _f, i, _seed in maybes:
                    if answers[i] is MISSING or answers[i] is None:
                        answers[i] = None
                        absent += 1
                state.gets_absent += absent
            return answers
    ks = [k if type(k) is bytes and len(k) <= MAX_KEY_SIZE_BYTES else as_key(k) for k in given]
    if db.closed:
        db.check_open()
    fast = state.fast
    n = len(ks)
    state.gets += n
    out: list[Any] = [fast.data.get(key, MISSING) for key in ks]
    for imm in fast.imm_datas:
        for i in range(n):
            if out[i] is MISSING:
                out[i] = imm.get(ks[i], MISSING)
    pending = [i for i in range(n) if out[i] is MISSING]
    hashes: dict[Any, list[int]] = {}

    def hashes_of(kf: Any) -> list[int]:
        """Every key's hash under one hash function, computed once per call."""
        hv = hashes.get(kf)
        if hv is None:
            fn = _key_hash if kf is None else kf
            hv = hashes[kf] = [fn(key) for key in ks]
        return hv

    def visit(p: FileProbe, idx: list[int]) -> list[int]:
        """Answer what ``p``'s file can; returns the indexes still open."""
        reader, lo, hi, flt = p.reader, p.min_key, p.max_key, p.filter
        maybe: list[int] = []
        still: list[int] = []
        skipped = 0
        negatives: list[int] = []
        if p.filter_family:
            hv = hashes_of(p.hash_fn)
        for i in idx:
            key = ks[i]
            if key < lo or key > hi:
                skipped += 1
                still.append(i)
                continue
            if p.filter_family and not flt.may_contain(hv[i]):
                negatives.append(i)
                continue
            maybe.append(i)
        reader.range_skips += skipped
        if negatives:
            if state.shadow:
                return _shadow_many(reader, ks, negatives, maybe, still, out)
            reader.filter_negatives += len(negatives)
            still += negatives
        if maybe:
            _read_blocks(reader, ks, maybe, still, out)
        return still

    for p in fast.l0:
        if not pending:
            break
        pending = visit(p, pending)
    for level in fast.deeper:
        if not pending:
            break
        groups: dict[int, list[int]] = {}
        rest: list[int] = []
        for i in pending:
            f = bisect_left(level.max_keys, ks[i])
            if f < len(level.files):
                groups.setdefault(f, []).append(i)
            else:
                rest.append(i)
        for f, idx in groups.items():
            rest += visit(level.files[f], idx)
        pending = rest
    absent = 0
    for i in range(n):
        if out[i] is MISSING or out[i] is None:
            out[i] = None
            absent += 1
    state.gets_absent += absent
    return out


def _files_many_c(ks: list[bytes], maybes: list[tuple[int, int, Any]], out: list[Any],
                  probes: Any, files: tuple[FileProbe, ...]) -> None:
    """get_many's block reads after the C probes: ``maybes`` holds (file, key
    index, hash seed) per key some filter let through.  File by file in read
    order, each distinct block is read once for all the keys that need it;
    the keys it did not hold resume at the following files with their hashes
    carried over (seeds), so no key is hashed twice.  Answers go to ``out``
    (MISSING stays where no file holds the key)."""
    waiting: dict[int, list[int]] = {}   # file -> keys (indexes into ks) it must answer
    seed_of: dict[int, Any] = {}
    for f, i, seed in maybes:
        waiting.setdefault(f, []).append(i)
        seed_of[i] = seed
    for f in range(len(files)):  # resumes only go forward: one pass in read order
        idx = waiting.pop(f, None)
        if not idx:
            continue
        idx.sort()
        still: list[int] = []
        _read_blocks(files[f].reader, ks, idx, still, out)
        if still:
            rseeds = [seed_of[i] for i in still]
            nexts = probes.first_many([ks[i] for i in still], [f + 1] * len(still), rseeds)
            for g, i, seed in zip(nexts, still, rseeds, strict=True):
                if g >= 0:
                    waiting.setdefault(g, []).append(i)
                    seed_of[i] = seed


def _read_blocks(reader: SSTableReader, ks: list[bytes], maybe: list[int], still: list[int],
                 out: list[Any]) -> None:
    """Look the ``maybe`` keys up in ``reader`` (``lookup_many``: one read per
    distinct block): their values into ``out``, the keys it does not hold
    onto ``still`` in the order given, as the C getter hands them on."""
    for i, value in zip(maybe, reader.lookup_many([ks[i] for i in maybe]), strict=True):
        if value is MISSING:
            still.append(i)
        else:
            out[i] = value


def _shadow_many(reader: SSTableReader, ks: list[bytes], negatives: list[int], maybe: list[int],
                 still: list[int], out: list[Any]) -> list[int]:
    """Shadow mode: read what the filter rejected too, and count its mistakes."""
    if maybe:
        _read_blocks(reader, ks, maybe, still, out)
    for i in negatives:
        value = _shadow_check(reader, ks[i])
        if value is MISSING:
            reader.filter_negatives += 1
            still.append(i)
        else:
            out[i] = value
    return still


def prefix_end(prefix: bytes) -> bytes | None:
    """Smallest key greater than every key starting with ``prefix`` (None: no bound)."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return None
    p[-1] += 1
    return bytes(p)


def scan(versions: Versions, state: TableState, start: Any, end: Any, prefix: Any,
         reverse: bool) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) pairs of ``state`` with start <= key < end (and ``prefix``), in key
    order (``reverse``: descending), over a snapshot taken now: later writes,
    flushes and compactions do not change what it returns.  One data block per
    SSTable is in memory at a time."""
    versions.check_open()
    lo = None if start is None else as_key(start)
    hi = None if end is None else as_key(end)
    if prefix is not None:
        p = as_key(prefix)
        if lo is None or lo < p:
            lo = p
        pe = prefix_end(p)
        if pe is not None and (hi is None or hi > pe):
            hi = pe
    if lo is not None and hi is not None and lo >= hi:
        return iter(())
    with versions.lock:  # a consistent snapshot of the active memtable (age 0)
        mem, imms, l0, deeper = state.view
        snapshot = mem.chunk_range(lo, hi, reverse)
    sources: list[Any] = [snapshot] if snapshot else []
    for imm in imms:  # frozen: they never change
        if len(imm):
            sources.append(imm.chunk_range(lo, hi, reverse))
    files = list(l0)
    for _keys, readers in deeper:
        files.extend(readers)
    for r in files:  # newest first, as the merge wants them
        if (hi is None or r.min_key < hi) and (lo is None or r.max_key >= lo):
            sources.append(r.chunks(lo, hi, reverse))
    if not sources:
        return iter(())
    return merge_newest(sources, reverse)  # type: ignore[return-value]
