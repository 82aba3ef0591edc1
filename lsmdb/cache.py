"""A decoded-data-block cache with a byte budget, shared by every SSTable of a DB.

Entries are keyed by (file number, block index) and hold the decoded
``(keys, values)`` lists; the budget counts the block's on-disk payload
size (decoded Python objects take roughly 2-4x that).  Eviction is least
recently used.  Hits are counted per SSTable as ``block_cache_hits``,
separately from ``block_reads`` (disk reads).

Thread safety: every operation is a few dict operations under the GIL; a
race between two threads can at worst turn a hit into a miss.
"""

from __future__ import annotations

from typing import Any

DEFAULT_BLOCK_CACHE_SIZE_BYTES = 32 * 1024 * 1024


class BlockCache:
    """LRU map (file number, block index) -> decoded block, bounded by ``capacity_bytes``."""

    __slots__ = ("capacity_bytes", "used_bytes", "_map")

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self._map: dict[tuple[int, int], tuple[Any, int]] = {}

    def get(self, key: tuple[int, int]) -> Any:
        """The cached block, or None; a hit becomes the most recently used."""
        try:
            entry = self._map.pop(key)
        except KeyError:
            return None
        self._map[key] = entry
        return entry[0]

    def put(self, key: tuple[int, int], block: Any, size: int) -> None:
        if size > self.capacity_bytes:
            return
        m = self._map
        old = m.pop(key, None)
        if old is not None:
            self.used_bytes -= old[1]
        m[key] = (block, size)
        self.used_bytes += size
        while self.used_bytes > self.capacity_bytes and m:
            try:
                oldest = next(iter(m))
                _block, s = m.pop(oldest)
            except (KeyError, StopIteration, RuntimeError):  # raced with another thread
                break
            self.used_bytes -= s

    def evict_file(self, number: int) -> None:
        """Drop every block of a file that left the database."""
        for key in [k for k in list(self._map) if k[0] == number]:
            entry = self._map.pop(key, None)
            if entry is not None:
                self.used_bytes -= entry[1]

    def __len__(self) -> int:
        return len(self._map)
