"""The write path: one WAL record per write or batch, then the memtables.

``commit`` logs a batch (one record, so it is atomic across tables) and
applies it to the memtables under the database's lock, then -- outside the
lock -- freezes the memtables it filled for the flush thread.  A table
with ``MAX_FROZEN_MEMTABLES`` frozen memtables takes no more writes until
the flush thread installs the oldest (or, when flushes fail, until the
writer's own flush of them succeeds); WAL segments past ``max_total_wal_size_bytes``
get the tables that pin the oldest of them flushed; level 0 filling up
(``L0_SLOWDOWN_FILES``) slows writers with short pauses in proportion to the
bytes they write, and level 0 past its bound (``L0_STALL_FILES``) holds them,
while compaction can reduce it.  An OSError from the WAL
means the write is not applied: its record may be in the failed segment, but
nothing is ever appended after it, and the next write first makes the log
whole again (:meth:`lsmdb.flush.Flusher.recover_log`).

A single put takes a shorter line: :func:`put_locked`, the same steps for
one op in line, and before it :meth:`WritePath.put_one`, a put's common
case whole; both have a C twin (lsmdb/csrc/writepath.c), which a handle's
put calls first where the extension is built.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from operator import itemgetter
from typing import Any

from . import compaction as _compaction
from .errors import LsmdbError, NoSuchTableError
from .flush import Flusher
from .keys import MAX_BATCH_SIZE_BYTES, MAX_KEY_SIZE_BYTES, MAX_VALUE_SIZE_BYTES
from .logset import encode_record, encode_table_record
from .memtable import ENTRY_OVERHEAD_BYTES, EXPIRING_OVERHEAD_BYTES
from .sstable_format import KIND_VALUE, MAX_SEQ
from .stats import WRITE_SLOWDOWN_US, WRITE_SLOWDOWNS, WRITE_STALL_US, WRITE_STALLS
from .table import TableState
from .versions import Versions
from .wal import BLOCK_SIZE_BYTES, FRAGMENT_HEADER_SIZE, FULL

try:  # optional C speedups (lsmdb/csrc/writepath.c): put_one and put_locked in C
    from ._speedups import WRITE_PATH_CONSTANTS as _C_CONSTANTS
    from ._speedups import put_locked as _c_put_locked
    from ._speedups import put_one as _c_put_one
except ImportError:  # pragma: no cover - no C compiler when installed
    _c_put_one = _c_put_locked = None  # type: ignore[assignment]
    _C_CONSTANTS = {}
try:  # ... and db.put without a Python frame (an extension built before it: DB.put)
    from ._speedups import Putter as _CPutter
except ImportError:  # pragma: no cover - an older build
    _CPutter = None  # type: ignore[assignment,misc]
try:  # ... and a batch's size (an extension built before it: the Python sum)
    from ._speedups import batch_bytes as _c_batch_bytes
except ImportError:  # pragma: no cover - no C compiler when installed
    _c_batch_bytes = None  # type: ignore[assignment]

log = logging.getLogger("lsmdb")

#: A table with this many frozen memtables waiting for their flush takes no
#: more writes until one is flushed (each write tries; while flushes fail, it
#: raises their error and writes nothing).
MAX_FROZEN_MEMTABLES = 2
#: How long a writer waits for the flush thread to take a frozen memtable
#: before it flushes them itself.
FLUSH_WAIT_SECONDS = 1.0
#: A slowed commit pauses once its turn ends at least this many seconds ahead
#: (a sleep much shorter than a millisecond costs more than it lasts) ...
SLOWDOWN_MIN_PAUSE = 0.002
#: ... and never for longer than this at once.
SLOWDOWN_MAX_PAUSE = 0.1
#: ``max_total_wal_size_bytes=None``: this many times the memtables' total size.
WAL_SIZE_MEMTABLE_MULTIPLE = 4
#: What put_locked answers: bits (the memtable it wrote is full; the WAL is past
#: its limit), or PUT_DECLINED (not its case: nothing was done).
PUT_FULL = 1
PUT_WAL_OVER = 2
PUT_DECLINED = -1

_first = itemgetter(0)
_second = itemgetter(1)
_third = itemgetter(2)


def put_locked(versions: Versions, state: TableState, key: bytes, value: bytes | None,
               wal_limit: int) -> int:
    """The part under the database lock (held by the caller) of one put of
    ``key`` (``value`` None: a delete) in ``state``, in its common case -- the
    database open for writes, the table live, the log healthy: the next
    sequence number, its WAL record appended (no fsync), the memtable
    applied.  What :meth:`WritePath.commit` does for one op, its steps in
    line (no closures, no per-op lists).  Returns PUT_FULL | PUT_WAL_OVER
    bits, or PUT_DECLINED (nothing done) in any other case: the caller then
    takes ``commit``, which raises or mends the log."""
    wal = versions.log
    if versions.closed or versions.read_only or state.dropped or wal.failed is not None:
        return PUT_DECLINED
    seq = versions.last_seq = versions.last_seq + 1
    wal.append(seq, encode_table_record(seq, state.id, [key], [value]), False)
    if wal.promoted:
        versions.promote_segments()
    mem = state.mem
    mem.apply(seq, key, value)
    out = PUT_FULL if mem.size_bytes >= state.options.memtable_size_bytes else 0
    if wal.total_bytes > wal_limit:
        out |= PUT_WAL_OVER
    return out


#: What the C put_locked was built with, against this Python's definitions.
WRITE_PATH_CONSTANTS = {
    "BLOCK_SIZE_BYTES": BLOCK_SIZE_BYTES, "FRAGMENT_HEADER_SIZE": FRAGMENT_HEADER_SIZE,
    "FULL": FULL, "ENTRY_OVERHEAD_BYTES": ENTRY_OVERHEAD_BYTES,
    "EXPIRING_OVERHEAD_BYTES": EXPIRING_OVERHEAD_BYTES, "KIND_VALUE": KIND_VALUE,
    "MAX_SEQ": MAX_SEQ, "PUT_FULL": PUT_FULL, "PUT_WAL_OVER": PUT_WAL_OVER,
    "PUT_DECLINED": PUT_DECLINED, "MAX_FROZEN_MEMTABLES": MAX_FROZEN_MEMTABLES,
    "MAX_BATCH_SIZE_BYTES": MAX_BATCH_SIZE_BYTES, "MAX_KEY_SIZE_BYTES": MAX_KEY_SIZE_BYTES,
    "MAX_VALUE_SIZE_BYTES": MAX_VALUE_SIZE_BYTES}
#: Why the C put_locked is not used ([] when it is, or when it is not built).
WRITE_PATH_ERRORS = [f"{name} is {_C_CONSTANTS.get(name)} in C, {value} here"
                     for name, value in WRITE_PATH_CONSTANTS.items()
                     if _c_put_locked is not None and _C_CONSTANTS.get(name) != value]
if WRITE_PATH_ERRORS:
    log.warning("lsmdb._speedups does not match this lsmdb (%s): puts take the Python "
                "path; rebuild the extension (pip install .)", "; ".join(WRITE_PATH_ERRORS))
#: Whether databases opened from now on put through the C put_locked (tests
#: switch it off to compare the two).
USE_SPEEDUPS = _c_put_locked is not None and not WRITE_PATH_ERRORS


def check_batch_size(keys: Iterable[bytes], values: Iterable[Any], expiring: bool = False) -> None:
    """ValueError if the keys and values (tombstones none, expiring values
    their bytes) pass MAX_BATCH_SIZE_BYTES; lists are summed in C where built."""
    if USE_SPEEDUPS and _c_batch_bytes is not None and type(keys) is list \
            and type(values) is list:
        total = _c_batch_bytes(keys, values)
    else:
        if expiring:
            values = [v[0] if type(v) is tuple else v for v in values]
        total = sum(map(len, keys)) + sum(map(len, filter(None, values)))
    if total > MAX_BATCH_SIZE_BYTES:
        raise ValueError(f"batch of {total} bytes exceeds {MAX_BATCH_SIZE_BYTES} bytes")


class WritePath:
    """Writes to one database (see the module docstring).

    ``stall`` is the background worker writers wait on while level 0 is
    full (None: no background compaction).
    """

    # What a put reads, in slots (the C put, lsmdb/csrc/writepath.c, reads them
    # at their offsets); the rest in the instance's dict.
    __slots__ = ("stall", "versions", "wal_limit", "sync_default", "__dict__")

    def __init__(self, versions: Versions, flusher: Flusher, *, sync: bool,
                 max_total_wal_size_bytes: int | None) -> None:
        self.versions = versions
        self.flusher = flusher
        self.sync_default = sync
        self.max_wal = max_total_wal_size_bytes
        self.wal_limit = 0
        self.stall: Any = None
        #: Where the timeline of slowed commits is free again (time.monotonic),
        #: under slowdown_lock (_slow_down).
        self.slowdown_next = 0.0
        self.slowdown_lock = threading.Lock()
        #: The flush thread (lsmdb.db), woken after a memtable is frozen for it;
        #: None: a full memtable is flushed on the writer's thread.
        self.flush_thread: Any = None
        #: put_locked, or its C twin
        self.put_locked: Callable[..., int] = _c_put_locked if USE_SPEEDUPS else put_locked
        self._c_put_one = USE_SPEEDUPS
        self.update_wal_limit()

    def update_wal_limit(self) -> None:
        """After a table's options changed: the WAL size that sets off flushes."""
        self.wal_limit = self.max_wal if self.max_wal is not None else \
            WAL_SIZE_MEMTABLE_MULTIPLE * self.versions.memtable_bytes()

    def write(self, ops: list[tuple[TableState, bytes, Any]], sync: bool | None,
              expiring: bool = False) -> None:
        """Apply (table, key, value) ops atomically: one WAL record.  A value is
        bytes, None (a delete) or, where ``expiring``, may be (bytes, expires)."""
        states = set(map(_first, ops))
        if len(states) == 1:
            (state,) = states
            self.write_columns(state, list(map(_second, ops)), list(map(_third, ops)), sync,
                               expiring)
            return
        check_batch_size(map(_second, ops), map(_third, ops), expiring)

        def encode(seq: int) -> bytes:
            return encode_record(seq, [(s.id, k, v) for s, k, v in ops])

        def apply(seq: int) -> list[TableState]:
            # Per table, the batch becomes visible to point reads at once.
            per_table: dict[TableState, dict[bytes, Any]] = {}
            for state, key, value in ops:
                items = per_table.get(state)
                if items is None:
                    items = per_table[state] = {}
                items[key] = value  # later ops of the batch win
            for state, items in per_table.items():
                state.mem.apply_many(seq, items, expiring)
            return list(per_table)

        self.commit(states, encode, apply, sync)

    def bind_put(self, state: TableState) -> Callable[[Any, Any], bool]:
        """``put_one`` with this WritePath and ``state`` bound: what a handle's
        put calls first -- the C twin (lsmdb/csrc/writepath.c) where it is built."""
        if self._c_put_one:
            return partial(_c_put_one, self, state)
        return partial(self.put_one, state)

    def bind_db_put(self, state: TableState, slow_put: Callable[..., None]
                    ) -> Callable[..., None] | None:
        """A put(key, value, sync=None, ttl=None) for ``state`` with no Python
        frame: the C put_one for two positional arguments, ``slow_put`` (the
        handle's put) for the rest -- what DB.put does; None without the C put."""
        if self._c_put_one and _CPutter is not None:
            return _CPutter(self, state, slow_put)
        return None

    def put_one(self, state: TableState, key: Any, value: Any) -> bool:
        """A put in its common case, whole: ``key`` and ``value`` bytes within
        their limits, the table live with no default time to live, writes not
        synced by default -- then :meth:`put`, and True.  Otherwise False,
        nothing done: the caller takes the general path, which checks,
        converts or raises."""
        if type(key) is not bytes or len(key) > MAX_KEY_SIZE_BYTES \
                or type(value) is not bytes or len(value) > MAX_VALUE_SIZE_BYTES \
                or state.dropped or state.options.default_time_to_live or self.sync_default:
            return False
        self.put(state, key, value)
        return True

    def put(self, state: TableState, key: bytes, value: bytes | None) -> None:
        """One put (``value`` None: a delete) of a checked key and value, not
        synced: :func:`put_locked` under the lock, then the flushes it calls
        for -- or ``write_columns`` where that is not its case (level 0 at its
        slowdown or stall bound, frozen memtables piling up, a failed log, a
        closed database or table)."""
        if (self.stall is not None and len(state.version.l0) >= _compaction.slow_path_files()) \
                or len(state.imms) >= MAX_FROZEN_MEMTABLES \
                or len(key) + (len(value) if value is not None else 0) > MAX_BATCH_SIZE_BYTES:
            self.write_columns(state, [key], [value], False)
            return
        versions = self.versions
        with versions.lock:
            done = self.put_locked(versions, state, key, value, self.wal_limit)
        if done == PUT_DECLINED:
            self.write_columns(state, [key], [value], False)
            return
        if done & PUT_FULL:
            self._flush_full([state])
        if done & PUT_WAL_OVER:
            self._flush_wal_pinners()

    def write_columns(self, state: TableState, keys: list[bytes], values: list[Any],
                      sync: bool | None, expiring: bool = False) -> None:
        """Set keys[i] to values[i] (None: delete; where ``expiring``, maybe an
        expiring (bytes, expires)) in one table, atomically: one WAL record; a
        later op on the same key wins.  (The per-op work -- sizes, the WAL
        ops, the batch dict -- runs in C: map/zip/sum.)"""
        check_batch_size(keys, values, expiring)
        n = len(keys)

        def encode(seq: int) -> bytes:
            return encode_table_record(seq, state.id, keys, values)

        def apply(seq: int) -> list[TableState]:
            if n == 1:
                state.mem.apply(seq, keys[0], values[0])
            else:
                state.mem.apply_columns(seq, keys, values, expiring)
            return [state]

        self.commit({state}, encode, apply, sync)

    def commit(self, states: set[TableState], encode: Callable[[int], bytes],
               apply: Callable[[int], list[TableState]], sync: bool | None) -> None:
        """Log a batch (``encode(seq)``) and apply it (``apply(seq)``) under the
        lock; then flush whatever memtable it filled, outside the lock."""
        do_sync = self.sync_default if sync is None else bool(sync)
        if self.stall is not None:
            self._maybe_stall(states)
        flusher = self.flusher
        for state in states:
            if len(state.imms) >= MAX_FROZEN_MEMTABLES:
                self._wait_for_flush(state)
        versions = self.versions
        wal = versions.log
        while True:
            with versions.lock:
                self.versions.check_writable()
                for state in states:
                    if state.dropped:
                        raise NoSuchTableError(f"table {state.name!r} was dropped")
                if wal.failed is None:
                    if do_sync and versions.manifest_unsynced:
                        versions.sync_manifest()
                    seq = versions.last_seq = versions.last_seq + 1
                    record = encode(seq)
                    wal.append(seq, record, do_sync)
                    if wal.promoted:
                        versions.promote_segments()
                    touched = apply(seq)
                    full = [s for s in touched
                            if s.mem.size_bytes >= s.options.memtable_size_bytes]
                    wal_over = wal.total_bytes > self.wal_limit
                    break
            flusher.recover_log()  # outside the lock: it writes SSTables
        self._flush_full(full)
        if wal_over:
            self._flush_wal_pinners()
        if self.stall is not None:
            self._slow_down(states, len(record))

    def _wait_for_flush(self, state: TableState) -> None:
        """The table's frozen memtables are at MAX_FROZEN_MEMTABLES: wait until
        the flush thread installs the oldest (the writer goes on as soon as
        one is gone, while the next is written).  Without a flush thread, or
        when a flush fails or the wait passes FLUSH_WAIT_SECONDS, the frozen
        memtables are flushed here (which raises while flushes fail)."""
        if self.flush_thread is not None and self.flusher.wait_frozen(
                state, MAX_FROZEN_MEMTABLES, FLUSH_WAIT_SECONDS):
            return
        self.flusher.flush_table(state, freeze=False)

    def _flush_full(self, full: list[TableState]) -> None:
        """Flush the full memtables: frozen here and written by the flush thread
        where there is one (a writer then waits only once MAX_FROZEN_MEMTABLES
        pile up), else written here, outside the lock."""
        thread = self.flush_thread
        for state in full:
            try:
                if thread is None:
                    self.flusher.flush_table(state)
                elif self.flusher.freeze_table(state):
                    thread.wake()
            except OSError as exc:
                # The write itself is applied (and in the WAL); the flush is
                # retried by the next write (or an explicit flush()).
                log.error("automatic flush of table %r failed: %s", state.name, exc)

    def _flush_wal_pinners(self) -> None:
        """The WAL is past ``max_total_wal_size_bytes``: flush every table whose
        memtables hold a record of the oldest segment, so that segment can go."""
        versions = self.versions
        with versions.lock:
            oldest = versions.log.oldest_max_seq()
            if oldest is None or versions.log.total_bytes <= self.wal_limit:
                return
            pinning = [s for s in versions.tables.values()
                       if any(m.min_seq is not None and m.min_seq <= oldest
                              for m in (s.mem,) + s.imms)]
        for state in pinning:
            try:
                self.flusher.flush_table(state)
            except OSError as exc:
                log.error("flush of table %r for max_total_wal_size_bytes failed: %s",
                          state.name, exc)

    def _slow_down(self, states: set[TableState], nbytes: int) -> None:
        """After a commit of ``nbytes``: where a table it wrote has
        L0_SLOWDOWN_FILES or more files in level 0, the commit takes its turn
        on one timeline shared by every writer of the database, ``nbytes``
        long at SLOWDOWN_BYTES_PER_SECOND halved for each file past that bound
        (the fullest such table's), and pauses until its turn ends -- so the
        database's writers together, however many, go no faster than that
        rate.  A pause shorter than SLOWDOWN_MIN_PAUSE is put off (the
        timeline keeps it for the next commit), none lasts more than
        SLOWDOWN_MAX_PAUSE, and none is taken while no compaction could
        reduce level 0.  Each pause counts, with its time, for every table it
        slowed (write_slowdowns, write_slowdown_us)."""
        bound = _compaction.L0_SLOWDOWN_FILES
        filling = [s for s in states if len(s.version.l0) >= bound]
        if not filling:
            return
        past = min(max(len(s.version.l0) for s in filling) - bound, 30)
        turn = nbytes * 2.0 ** past / _compaction.SLOWDOWN_BYTES_PER_SECOND
        with self.slowdown_lock:
            now = time.monotonic()
            start = min(max(now, self.slowdown_next), now + SLOWDOWN_MAX_PAUSE)
            self.slowdown_next = start + turn
            pause = min(self.slowdown_next - now, SLOWDOWN_MAX_PAUSE)
        if pause < SLOWDOWN_MIN_PAUSE:
            return
        slowed = [s for s in filling if not s.dropped and _compaction.pick(s) is not None]
        if not slowed:
            with self.slowdown_lock:  # nothing to wait for: the turn is not owed
                self.slowdown_next = min(self.slowdown_next, now)
            return
        time.sleep(pause)
        took = int((time.monotonic() - now) * 1e6)
        for state in slowed:
            state.counts[WRITE_SLOWDOWNS] += 1
            state.counts[WRITE_SLOWDOWN_US] += took

    def _maybe_stall(self, states: set[TableState]) -> None:
        """Hold a writer while level 0 is past its bound and compaction can reduce it."""
        bg = self.stall
        for state in states:
            announced = False
            started = 0.0
            try:
                while (len(state.version.l0) >= _compaction.L0_STALL_FILES
                       and not state.dropped and _compaction.pick(state) is not None):
                    self.versions.check_writable()
                    if bg.error is not None:
                        raise LsmdbError(f"writes to table {state.name!r} are stalled and "
                                         f"background compaction is failing: {bg.error}")
                    if not announced:
                        log.warning("write stall: table %r has %d files in level 0; waiting "
                                    "for compaction", state.name, len(state.version.l0))
                        announced = True
                        started = time.monotonic()
                    bg.wait_round(0.05)
            finally:
                if announced:  # counted (lsmdb.stats: write_stalls, write_stall_us)
                    state.counts[WRITE_STALLS] += 1
                    state.counts[WRITE_STALL_US] += int((time.monotonic() - started) * 1e6)


__all__ = ["WritePath", "MAX_FROZEN_MEMTABLES", "WAL_SIZE_MEMTABLE_MULTIPLE"]
