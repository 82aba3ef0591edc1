"""A data-block cache with a byte budget, shared by every SSTable of a DB.

Entries are keyed by an int that no other block in the same cache shares,
whatever the size of the files: each SSTable reader attached to the cache
takes a range of keys of its own, one per data block, ``base =
cache.reserve(nblocks)``, and its block ``i`` is cached under ``base + i``.
The ranges come from a counter the cache owns, which only goes up: a file's
range is never handed out again, so its blocks can be dropped when it leaves
the database (``evict_range(base, base + nblocks)``) or left to age out.
Keys stay below 2**64, as the C books store them: ``reserve`` refuses
(OverflowError) a range that would reach 2**64 rather than wrap.  That
cannot happen in practice: every key reserved is one index entry a reader
read from disk, and at a billion of them a second, 2**64 would take some
585 years.

Entries hold the block as one ``bytes``: its payload as on disk (checksum
verified and read whole once without a fault), then, with the C speedups,
its entries' offsets (``_speedups.block_entry``; a lookup bisects the keys
through them, ``entry_find``).  The budget counts those bytes.  Decoded
``(keys, values)`` lists, which the cache held before, took about twice the
budget in Python objects, and a full cache spent more decoding and freeing
them than the disk reads they saved.
Eviction is second-chance ("CLOCK"): a hit only marks the entry; when room
is needed the oldest entries go first, except marked ones, which are
unmarked and moved to the back once.  The block being put is never the one
evicted to make its room.  A block put again keeps its place and takes its
new size.  Hits are counted per SSTable as ``block_cache_hits``, apart from
``block_reads`` (disk reads).

Two implementations keep these books, alike to the order of the blocks and
their marks (a test runs them side by side):

* ``CBlockCache`` (``_speedups.Cache``, what a DB makes where the C speedups
  are built): an open-addressing table and a ring of keys in C.  The C
  getter looks blocks up, marks hits, asks the admission and puts the blocks
  it read without a call into Python, and every method runs under the GIL
  without letting it go, so threads need no lock.  (Kept in Python, the
  books cost more than the hits saved at 2,000,000 keys: a put, in a stream
  of gets whose memory is cold, took 9-18 us.)
* ``PyBlockCache``: a dict, a set of marks and a deque of keys (the clock's
  ring: taking the oldest is O(1); ``next(iter(dict))`` is not, since a dict
  keeps the slots of keys popped from its front until it next resizes).  A
  lookup and a hit's mark are one dict or set operation each under the GIL;
  ``put``, ``reserve`` and ``evict_range`` hold the cache's lock; a race between a lookup
  and an eviction can at worst turn a hit into a miss, and one between two
  admits misjudge one block's admission.

Admission.  A full cache takes a block read from disk only if the same block
was read and turned away not long before (``Admission``): a table larger
than the cache read at random would otherwise have each block it reads put
in and another evicted, for a hit rate that no choice of blocks raises above
the cache's share of the table.  Without it, those puts and evictions can
cost more than the hits bring: on a table of 232 MB of blocks against the
default 32 MiB, present gets read at random would take longer with the cache
than without one.  The turned-away blocks are remembered in a bitmap
of 64 bits per block remembered, cleared after a window of turned-away reads
of a quarter as many blocks as the cache holds (``WINDOW_DIVISOR``; at least
``MIN_GHOSTS``, at most one per ``BYTES_PER_REMEMBERED`` bytes of the
budget): a block is remembered for between none and that many later reads,
and one never read before is let in with a chance of at most 1/64.  (A
window as long as the cache holds blocks, simulated, let in three to six
times as many blocks of a uniform random read for the same hit rate, and
reached hit rates at most two points higher under Zipf workloads:
bench/README.md.)

A block read for a key it does not hold (a false positive of the filter) is
taken only on its second read within the window, whether the cache is full
or not (``admit_reread``): the false positives of a key looked up again and
again then stop reading the disk, and those of keys looked up once, which a
cache with room would otherwise fill up with, are not cached.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

try:  # optional C speedups (lsmdb/csrc/cache.c)
    from ._speedups import Admission as _CAdmission
    from ._speedups import Cache as _CCache
except ImportError:  # pragma: no cover - no C compiler when installed
    _CAdmission = None  # type: ignore[assignment,misc]
    _CCache = None  # type: ignore[assignment,misc]

DEFAULT_BLOCK_CACHE_SIZE_BYTES = 32 * 1024 * 1024
#: admit remembers at least this many blocks it turned away ...
MIN_GHOSTS = 1024
#: ... otherwise the reads of 1/WINDOW_DIVISOR as many blocks as it holds,
#: and at most one per BYTES_PER_REMEMBERED bytes of the cache's budget.
WINDOW_DIVISOR = 4
BYTES_PER_REMEMBERED = 8192
#: The admission's bitmap: bits per turned-away read it remembers, and at most
#: (8 MiB of bits).  The C twin's are checked against these at import.
BITS_PER_REMEMBERED = 64
MAX_ADMISSION_BITS = 1 << 26
_MASK64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser, as the C Admission computes it."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


class PyAdmission:
    """``_speedups.Admission`` in Python (the same decisions, bit for bit):
    which blocks read from disk a full cache takes in.  See the module's
    docstring."""

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        want, bits = window * BITS_PER_REMEMBERED, 64
        while bits < want and bits < MAX_ADMISSION_BITS:
            bits <<= 1
        self.bits = bits
        self._map = bytearray(bits // 8)
        self._window = window
        self.count = 0
        self.full = False

    @property
    def window(self) -> int:
        return self._window

    @window.setter
    def window(self, value: int) -> None:
        if not 1 <= value <= self.bits // BITS_PER_REMEMBERED:
            raise ValueError("window must be >= 1 and within the bits made at creation")
        self._window = value
        if self.count >= value:
            self._forget()

    def _forget(self) -> None:
        """Every turned-away read forgotten: a new window starts."""
        self._map = bytearray(self.bits // 8)
        self.count = 0

    def admit(self, key: int) -> bool:
        """Whether to cache a block a lookup found its key in: every one while
        the cache has room, then on its second read (``admit_reread``)."""
        if self.full:
            return self.admit_reread(key)
        if not isinstance(key, int):
            raise TypeError("a cache key must be an int")
        return True

    def rereads(self, key: int) -> bool:
        """Whether ``admit_reread(key)`` would say yes now (nothing remembered)."""
        if not isinstance(key, int):
            raise TypeError("a cache key must be an int")
        b = _mix(key & _MASK64) & (self.bits - 1)
        return bool(self._map[b >> 3] & (1 << (b & 7)))

    def admit_reread(self, key: int) -> bool:
        """Whether block ``key`` was read and turned away within the window
        (then forgotten: its next read is a first one again); if not, it is
        remembered now.  What a full cache admits a block on, and any cache a
        false positive's block."""
        if not isinstance(key, int):
            raise TypeError("a cache key must be an int")
        b = _mix(key & _MASK64) & (self.bits - 1)
        m, byte, bit = self._map, b >> 3, 1 << (b & 7)
        if m[byte] & bit:
            m[byte] &= ~bit
            return True
        m[byte] |= bit
        self.count += 1
        if self.count >= self._window:
            self._forget()
        return False


def max_window(capacity_bytes: int) -> int:
    """The longest window of turned-away reads a cache of this budget remembers."""
    return max(MIN_GHOSTS, capacity_bytes // BYTES_PER_REMEMBERED)


class PyBlockCache:
    """Map cache key -> cached block (bytes), bounded by ``capacity_bytes``:
    the books in Python, for builds without the C speedups (``BlockCache``
    is ``CBlockCache`` where they are built; the two behave alike).

    ``lookup(key)`` (a bound ``dict.get``) is what the read path calls;
    ``touch(key)`` marks a hit.  A reader's keys come from ``reserve``.
    """

    __slots__ = ("capacity_bytes", "used_bytes", "_map", "_sizes", "_marked", "_ring", "_lock",
                 "_next_key", "admission", "_max_window", "lookup", "touch", "admit",
                 "admit_reread")


    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self._map: dict[int, Any] = {}
        self._sizes: dict[int, int] = {}
        self._marked: set[int] = set()
        self._ring: deque[int] = deque()  # the cached keys, oldest first
        self._lock = threading.Lock()
        self._next_key = 0  # the first key no reader has reserved
        self._max_window = max_window(capacity_bytes)
        #: which blocks read from disk a full cache takes in
        self.admission = PyAdmission(self._max_window)
        self.admission.window = MIN_GHOSTS
        self.lookup = self._map.get
        self.touch = self._marked.add
        #: ``admit(key)``: whether a get that read block ``key`` from disk
        #: should cache it: yes while a block of the cached blocks' average
        #: size fits without an eviction; when full, only on the block's
        #: second read within a window of recent reads (see the module's
        #: docstring).
        self.admit = self.admission.admit
        #: ``admit_reread(key)``: whether a get that read block ``key`` from
        #: disk and did not find its key there (a false positive of the
        #: filter) should cache it: only on the block's second read within
        #: the window, full or not.
        self.admit_reread = self.admission.admit_reread

    def offer(self, key: int, block: bytes, found: bool) -> bool:
        """A block a read just took from disk (its cached form, ``block``): cache it
        if the admission takes it -- as a get's block (``admit``) when the read
        found its key there, as a false positive's (``admit_reread``) when not.
        Whether it was cached.  The read paths' one way into the cache."""
        if not (self.admit(key) if found else self.admit_reread(key)):
            return False
        self.put(key, block, len(block))
        return True

    def get(self, key: int) -> Any:
        """The cached block or None; a hit is marked as recently used."""
        block = self._map.get(key)
        if block is not None:
            self._marked.add(key)
        return block

    def put(self, key: int, block: Any, size: int) -> None:
        if size > self.capacity_bytes:
            return
        with self._lock:
            if key in self._sizes:  # already cached (two readers raced): replace, keep its place
                self.used_bytes -= self._sizes[key]
            else:
                self._ring.append(key)
                self._marked.discard(key)  # a touch while it was not cached: no mark
            self._map[key] = block
            self._sizes[key] = size
            self.used_bytes += size
            if self.used_bytes > self.capacity_bytes:
                self._evict(key)
            self._tell_admission()

    def _tell_admission(self) -> None:
        """Full: a block of the cached blocks' average size no longer fits
        without an eviction.  The window: reads of a quarter as many blocks as
        it holds (at least MIN_GHOSTS)."""
        held, used = len(self._sizes), self.used_bytes
        admission = self.admission
        admission.full = held > 0 and used + used // held > self.capacity_bytes
        window = min(max(held // WINDOW_DIVISOR, MIN_GHOSTS), self._max_window)
        if window != admission.window:
            admission.window = window

    def _drop(self, key: int) -> None:
        size = self._sizes.pop(key, None)
        if size is not None:
            self.used_bytes -= size
        self._map.pop(key, None)
        self._marked.discard(key)

    def _evict(self, keep: int) -> None:
        """Free room down to the budget, ``keep`` (the block just put) aside."""
        ring, marked = self._ring, self._marked
        second_chances = len(self._sizes)
        while self.used_bytes > self.capacity_bytes and ring:
            oldest = ring.popleft()
            if oldest == keep:
                ring.append(oldest)
                continue
            if oldest in marked and second_chances > 0:
                second_chances -= 1
                marked.discard(oldest)
                ring.append(oldest)  # to the back of the line
                continue
            self._drop(oldest)

    def reserve(self, nblocks: int) -> int:
        """The first of ``nblocks`` keys no other caller of this cache got nor
        will get: a reader's block ``i`` is cached under the answer plus ``i``.
        OverflowError, reserving nothing, if the range would reach 2**64 (see
        the module's docstring).  O(1).

        >>> cache = PyBlockCache(1 << 20)
        >>> cache.reserve(3), cache.reserve(2), cache.reserve(1)
        (0, 3, 5)
        """
        if not isinstance(nblocks, int):
            raise TypeError("nblocks must be an int")
        if not 0 <= nblocks <= _MASK64:
            raise ValueError("nblocks must be >= 0 and < 2**64")
        with self._lock:
            base = self._next_key
            if nblocks > _MASK64 - base:
                raise OverflowError("the block cache's keys are spent (2**64 reserved)")
            self._next_key = base + nblocks
            return base

    def evict_range(self, lo: int, hi: int) -> None:
        """Drop every cached block with a key in ``[lo, hi)``: the blocks of a
        file that left the database.  O(cached blocks)."""
        for bound in (lo, hi):
            if not isinstance(bound, int):
                raise TypeError("a cache key must be an int")
            if not 0 <= bound <= _MASK64:
                raise ValueError("a cache key must be >= 0 and < 2**64")
        with self._lock:
            gone = [k for k in self._sizes if lo <= k < hi]
            if not gone:
                return
            for key in gone:
                self._drop(key)
            sizes = self._sizes
            live = [k for k in self._ring if k in sizes]
            self._ring.clear()
            self._ring.extend(live)
            self._tell_admission()

    def __len__(self) -> int:
        return len(self._map)

    def entries(self) -> list[tuple[int, int, bool]]:
        """(key, size, marked) of each cached block, oldest first."""
        with self._lock:
            return [(k, self._sizes[k], k in self._marked) for k in self._ring]

    def _check(self) -> None:
        check_books(self)
        if set(self._map) != set(self._sizes):
            raise AssertionError("block cache map and sizes disagree")


def check_books(cache: PyBlockCache | Any) -> None:
    """Invariants of either block cache: each cached block once in the ring, the
    bytes used their sum and within the budget, each one found by ``lookup``,
    and the admission's window within its bounds."""
    entries = cache.entries()
    keys = [k for k, _size, _marked in entries]
    if len(set(keys)) != len(keys) or len(keys) != len(cache):
        raise AssertionError("block cache ring holds a block twice or misses one")
    used = sum(size for _k, size, _marked in entries)
    if used != cache.used_bytes or used > cache.capacity_bytes:
        raise AssertionError(f"block cache uses {cache.used_bytes} bytes, holds {used}, "
                             f"budget {cache.capacity_bytes}")
    if any(cache.lookup(k) is None for k in keys):
        raise AssertionError("a block in the cache's ring is not in its map")
    window = cache.admission.window
    if not MIN_GHOSTS <= window <= max(MIN_GHOSTS, max_window(cache.capacity_bytes)):
        raise AssertionError(f"admission window {window}")


if _CCache is not None:
    class CBlockCache(_CCache):
        """``PyBlockCache`` with its books in C (``_speedups.Cache``): the C
        getter looks blocks up, marks hits, asks the admission and puts the
        blocks it read without a call into Python."""

        __slots__ = ()

        def __init__(self, capacity_bytes: int) -> None:
            super().__init__(capacity_bytes, _CAdmission(max_window(capacity_bytes)),
                             MIN_GHOSTS, WINDOW_DIVISOR)

        def _check(self) -> None:
            check_books(self)

    #: The block cache a DB makes: the C books where the speedups are built.
    BlockCache: type[PyBlockCache] | type[CBlockCache] = CBlockCache
else:  # pragma: no cover - no C compiler when installed
    BlockCache = PyBlockCache
