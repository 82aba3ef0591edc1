"""The in-memory table: newest value (or tombstone) of each key, sorted bytewise.

A memtable is mutable until it is frozen for a flush; a frozen memtable is
never changed again, so readers and iterators may use it without locks.
Tombstones are stored as ``None``.
"""

from __future__ import annotations

from collections.abc import Iterator

from sortedcontainers import SortedDict

# Rough per-entry bookkeeping cost (dict slot, sorted-list slot, objects).
ENTRY_OVERHEAD_BYTES = 64


class Memtable:
    """Sorted map ``key -> value | None`` with size accounting.

    ``put``/``delete`` are O(log n); ``get`` is a dict lookup, O(1).
    """

    __slots__ = ("data", "size_bytes", "min_seq", "max_seq", "frozen")

    def __init__(self) -> None:
        self.data: SortedDict = SortedDict()
        self.size_bytes = 0
        self.min_seq: int | None = None  # smallest WAL sequence number held
        self.max_seq = 0
        self.frozen = False

    def __len__(self) -> int:
        return len(self.data)

    def apply(self, seq: int, key: bytes, value: bytes | None) -> None:
        """Record ``value`` (None = tombstone) for ``key`` at sequence ``seq``."""
        data = self.data
        old = data.get(key, _MISSING)
        if old is _MISSING:
            self.size_bytes += len(key) + ENTRY_OVERHEAD_BYTES
        elif old is not None:
            self.size_bytes -= len(old)
        if value is not None:
            self.size_bytes += len(value)
        data[key] = value
        if self.min_seq is None:
            self.min_seq = seq
        if seq > self.max_seq:
            self.max_seq = seq

    def apply_many(self, seq: int, items: dict[bytes, bytes | None]) -> None:
        """``apply`` for many keys at once (one batch): a large batch is merged
        into the sorted keys with one sort instead of one insertion per key."""
        if len(items) < 64:
            for key, value in items.items():
                self.apply(seq, key, value)
            return
        data = self.data
        grow = 0
        missing = _MISSING
        for key, value in items.items():
            old = data.get(key, missing)
            if old is missing:
                grow += len(key) + ENTRY_OVERHEAD_BYTES
            elif old is not None:
                grow -= len(old)
            if value is not None:
                grow += len(value)
        data.update(items)
        self.size_bytes += grow
        if self.min_seq is None:
            self.min_seq = seq
        if seq > self.max_seq:
            self.max_seq = seq

    def items_range(self, start: bytes | None, end: bytes | None,
                    reverse: bool = False) -> Iterator[tuple[bytes, bytes | None]]:
        """(key, value|None) for start <= key < end, in order."""
        data = self.data
        keys = data.irange(start, end, inclusive=(True, False), reverse=reverse)
        return ((k, data[k]) for k in keys)

    def snapshot_range(self, start: bytes | None, end: bytes | None,
                       reverse: bool = False) -> list[tuple[bytes, bytes | None]]:
        return list(self.items_range(start, end, reverse))

    def _check(self) -> None:
        keys = list(self.data.keys())
        if keys != sorted(keys):
            raise AssertionError("memtable keys out of order")


class _Missing:
    __slots__ = ()


_MISSING = _Missing()
