"""A data-block cache with a byte budget, shared by every SSTable of a DB.

Entries are keyed by an int, ``cache_key(file number, block index)``, and
hold the block as one ``bytes``: its payload as on disk (checksum verified
and read whole once without a fault), then, with the C speedups, its
entries' offsets (``_speedups.block_entry``; a lookup bisects the keys
through them, ``entry_find``).  The budget counts those bytes.  Decoded
``(keys, values)`` lists, which the cache held before, took about twice the
budget in Python objects, and a full cache spent more decoding and freeing
them than the disk reads they saved.
Eviction is second-chance ("CLOCK"): a hit only marks the entry, so the hot
path is one dict lookup; when room is needed the oldest entries go first,
except marked ones, which are unmarked and moved to the back once.  The order
is a deque of keys beside the dict (the clock's ring): taking the oldest is
O(1).  (Taking it as ``next(iter(dict))`` is not: a dict keeps the slots of
the keys popped from its front until it next resizes, and iteration walks
over them, so a full cache spent microseconds per eviction.)  The block being
put is never the one evicted to make its room.  ``evict_file``, which walks
every key anyway, rebuilds the ring without the file's blocks.  Hits are
counted per SSTable as ``block_cache_hits``, apart from ``block_reads`` (disk
reads).

Thread safety: a lookup and a hit's mark are one dict or set operation each
under the GIL; ``put`` and ``evict_file``, which change the ring as well,
hold the cache's lock (they come after a disk read, or a compaction).  A
race between a lookup and an eviction can at worst turn a hit into a miss.
``admit``, asked about every block a get reads from disk, takes no lock:
with the C speedups it is ``_speedups.Admission``, one call that never lets
the GIL go (the C getter asks it without a call at all); without them its
Python twin, whose race between two threads can at worst misjudge one
block's admission.

Admission.  A full cache takes a block read from disk only if the same block
was read and turned away not long before (``Admission``): a table larger
than the cache read at random would otherwise have each block it reads put
in and another evicted, for a hit rate that no choice of blocks raises above
the cache's share of the table.  In Python those puts and evictions cost
more than the hits brought (issue #7: at 2,000,000 keys, 232 MB of blocks
against the default 32 MiB, present gets took 1.6 times as long with the
cache as without one).  The turned-away blocks are remembered in a bitmap
of 64 bits per block remembered, cleared after a window of turned-away reads
of a quarter as many blocks as the cache holds (``WINDOW_DIVISOR``; at least
``MIN_GHOSTS``, at most one per ``BYTES_PER_REMEMBERED`` bytes of the
budget): a block is remembered for between none and that many later reads,
and one never read before is let in with a chance of at most 1/64.  (A
window as long as the cache held blocks let in twice as many blocks of a
uniform random read for the same hit rate, within half a point in
simulated Zipf workloads.)
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

try:  # optional C speedups (lsmdb/_speedups.c)
    from ._speedups import Admission as _CAdmission
except ImportError:  # pragma: no cover - no C compiler when installed
    _CAdmission = None  # type: ignore[assignment,misc]

DEFAULT_BLOCK_CACHE_SIZE_BYTES = 32 * 1024 * 1024
_BLOCK_BITS = 24  # block index bits in a cache key: 16M blocks per file
#: admit remembers at least this many blocks it turned away ...
MIN_GHOSTS = 1024
#: ... otherwise the reads of 1/WINDOW_DIVISOR as many blocks as it holds,
#: and at most one per BYTES_PER_REMEMBERED bytes of the cache's budget.
WINDOW_DIVISOR = 4
BYTES_PER_REMEMBERED = 8192
_BITS_PER_REMEMBERED = 64
_MAX_ADMISSION_BITS = 1 << 26
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
        want, bits = window * _BITS_PER_REMEMBERED, 64
        while bits < want and bits < _MAX_ADMISSION_BITS:
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
        if not 1 <= value <= self.bits // _BITS_PER_REMEMBERED:
            raise ValueError("window must be >= 1 and within the bits made at creation")
        self._window = value
        if self.count >= value:  # the window is spent: forget
            self._map = bytearray(self.bits // 8)
            self.count = 0

    def admit(self, key: int) -> bool:
        if not isinstance(key, int):
            raise TypeError("a cache key must be an int")
        if not self.full:
            return True
        b = _mix(key & _MASK64) & (self.bits - 1)
        m, byte, bit = self._map, b >> 3, 1 << (b & 7)
        if m[byte] & bit:
            m[byte] &= ~bit
            return True
        m[byte] |= bit
        self.count += 1
        if self.count >= self._window:
            self._map = bytearray(self.bits // 8)
            self.count = 0
        return False


def new_admission(window: int) -> Any:
    """The C Admission where the speedups are built, else PyAdmission."""
    return _CAdmission(window) if _CAdmission is not None else PyAdmission(window)


def cache_key(number: int, block: int) -> int:
    return (number << _BLOCK_BITS) | block


class BlockCache:
    """Map cache key -> cached block (bytes), bounded by ``capacity_bytes``.

    ``lookup(key)`` (a bound ``dict.get``) is what the read path calls;
    ``touch(key)`` marks a hit.
    """

    __slots__ = ("capacity_bytes", "used_bytes", "_map", "_sizes", "_marked", "_ring", "_lock",
                 "admission", "_max_window", "lookup", "touch", "admit")

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self._map: dict[int, Any] = {}
        self._sizes: dict[int, int] = {}
        self._marked: set[int] = set()
        self._ring: deque[int] = deque()  # the cached keys, oldest first
        self._lock = threading.Lock()
        self._max_window = max(MIN_GHOSTS, capacity_bytes // BYTES_PER_REMEMBERED)
        #: which blocks read from disk a full cache takes in (the C getter asks it)
        self.admission = new_admission(self._max_window)
        self.admission.window = MIN_GHOSTS
        self.lookup = self._map.get
        self.touch = self._marked.add
        #: ``admit(key)``: whether a get that read block ``key`` from disk
        #: should cache it: yes while a block of the cached blocks' average
        #: size fits without an eviction; when full, only on the block's
        #: second read among the last reads of as many blocks as the cache
        #: holds (see the module's docstring).
        self.admit = self.admission.admit

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

    def evict_file(self, number: int) -> None:
        """Drop every block of a file that left the database."""
        with self._lock:
            gone = [k for k in self._sizes if k >> _BLOCK_BITS == number]
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
