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
``admit``, called on every block a get reads from disk, takes no lock: it
changes only its own set and ring of turned-away blocks, one operation at a
time, and it keeps the ring at least ``MIN_GHOSTS`` long, so two threads
never both trim it empty; a race between two admits can at worst misjudge
one block's admission.  (The lock cost more than the rest of ``admit``.)
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

DEFAULT_BLOCK_CACHE_SIZE_BYTES = 32 * 1024 * 1024
_BLOCK_BITS = 24  # block index bits in a cache key: 16M blocks per file
#: admit remembers at least this many blocks it turned away.
MIN_GHOSTS = 1024


def cache_key(number: int, block: int) -> int:
    return (number << _BLOCK_BITS) | block


class BlockCache:
    """Map cache key -> cached block (bytes), bounded by ``capacity_bytes``.

    ``lookup(key)`` (a bound ``dict.get``) is what the read path calls;
    ``touch(key)`` marks a hit.
    """

    __slots__ = ("capacity_bytes", "used_bytes", "_map", "_sizes", "_marked", "_ring", "_lock",
                 "_ghosts", "_ghost_ring", "lookup", "touch")

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self._map: dict[int, Any] = {}
        self._sizes: dict[int, int] = {}
        self._marked: set[int] = set()
        self._ring: deque[int] = deque()  # the cached keys, oldest first
        self._lock = threading.Lock()
        self._ghosts: set[int] = set()  # blocks read but not admitted (admit), and their order:
        self._ghost_ring: deque[int] = deque()
        self.lookup = self._map.get
        self.touch = self._marked.add

    def get(self, key: int) -> Any:
        """The cached block or None; a hit is marked as recently used."""
        block = self._map.get(key)
        if block is not None:
            self._marked.add(key)
        return block

    def admit(self, key: int) -> bool:
        """Whether a get that read block ``key`` from disk should cache it.

        Yes while a block of the cached blocks' average size fits without an
        eviction.  A full cache admits a block only if it was read, and not
        admitted, among the last reads of as many blocks as it holds: a block
        read once in a table far larger than the cache would be evicted before
        it is read again, having cost a copy, the cache's books and an
        eviction for nothing.
        """
        held = len(self._sizes)
        used = self.used_bytes
        if not held or used + used // held <= self.capacity_bytes:
            return True
        ghosts = self._ghosts
        if key in ghosts:
            ghosts.discard(key)
            return True
        ghosts.add(key)
        ring = self._ghost_ring
        ring.append(key)
        limit = held if held > MIN_GHOSTS else MIN_GHOSTS
        while len(ring) > limit:
            ghosts.discard(ring.popleft())
        return False

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

    def __len__(self) -> int:
        return len(self._map)
