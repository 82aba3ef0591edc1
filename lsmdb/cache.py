"""A decoded-data-block cache with a byte budget, shared by every SSTable of a DB.

Entries are keyed by an int, ``cache_key(file number, block index)``, and
hold the decoded ``(keys, values)`` lists; the budget counts the block's
on-disk payload size (decoded Python objects take roughly 2-4x that).
Eviction is second-chance ("CLOCK"): a hit only marks the entry, so the hot
path is one dict lookup; when room is needed the oldest entries go first,
except marked ones, which are unmarked and moved to the back once.  Hits are
counted per SSTable as ``block_cache_hits``, apart from ``block_reads``
(disk reads).

Thread safety: every operation is a few dict and set operations under the
GIL; a race between two threads can at worst turn a hit into a miss or evict
a block early.
"""

from __future__ import annotations

from typing import Any

DEFAULT_BLOCK_CACHE_SIZE_BYTES = 32 * 1024 * 1024
_BLOCK_BITS = 24  # block index bits in a cache key: 16M blocks per file


def cache_key(number: int, block: int) -> int:
    return (number << _BLOCK_BITS) | block


class BlockCache:
    """Map cache key -> decoded block, bounded by ``capacity_bytes``.

    ``lookup(key)`` (a bound ``dict.get``) is what the read path calls;
    ``touch(key)`` marks a hit.
    """

    __slots__ = ("capacity_bytes", "used_bytes", "_map", "_sizes", "_marked", "lookup", "touch")

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self._map: dict[int, Any] = {}
        self._sizes: dict[int, int] = {}
        self._marked: set[int] = set()
        self.lookup = self._map.get
        self.touch = self._marked.add

    def get(self, key: int) -> Any:
        """The cached block or None; a hit is marked as recently used."""
        block = self._map.get(key)
        if block is not None:
            self._marked.add(key)
        return block

    def put(self, key: int, block: Any, size: int) -> None:
        if size > self.capacity_bytes:
            return
        self._drop(key)
        self._map[key] = block
        self._sizes[key] = size
        self.used_bytes += size
        if self.used_bytes > self.capacity_bytes:
            self._evict()

    def _drop(self, key: int) -> None:
        size = self._sizes.pop(key, None)
        if size is not None:
            self.used_bytes -= size
        self._map.pop(key, None)
        self._marked.discard(key)

    def _evict(self) -> None:
        m, marked = self._map, self._marked
        second_chances = len(m)
        while self.used_bytes > self.capacity_bytes and m:
            try:
                oldest = next(iter(m))
            except (StopIteration, RuntimeError):  # raced with another thread
                return
            if oldest in marked and second_chances > 0:
                second_chances -= 1
                marked.discard(oldest)
                block = m.pop(oldest, None)
                if block is not None:
                    m[oldest] = block  # to the back of the line
                continue
            self._drop(oldest)

    def evict_file(self, number: int) -> None:
        """Drop every block of a file that left the database."""
        for key in [k for k in list(self._map) if k >> _BLOCK_BITS == number]:
            self._drop(key)

    def __len__(self) -> int:
        return len(self._map)
