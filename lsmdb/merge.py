"""K-way merge of sorted sources: newest version of each key wins, tombstones hidden.

Each source yields ``(key, tag, value|None)`` in key order, where ``tag`` is
the source's age (0 = newest) -- or minus its age when ``reverse``, so that
for equal keys the newest version comes first in either direction.  The
sources produce these triples in C (``zip`` over block slices); the merge is
``heapq.merge`` plus one comparison per entry.  Complexity O(N log S) for N
entries over S sources, one block per source in memory.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from typing import Any

_NOTHING = object()


def tag_for(age: int, reverse: bool) -> int:
    """The tag source number ``age`` (0 = newest) must carry."""
    return -age if reverse else age


def merge_newest(sources: list[Iterable[Any]], reverse: bool = False,
                 keep_tombstones: bool = False) -> Iterator[tuple[bytes, bytes | None]]:
    """Merge tagged ``sources`` into one stream of (key, value) pairs, newest version first."""
    if len(sources) == 1:
        only = sources[0]
        if keep_tombstones:
            return ((k, v) for k, _t, v in only)
        return ((k, v) for k, _t, v in only if v is not None)
    return _merge(heapq.merge(*sources, reverse=reverse), keep_tombstones)


def _merge(merged: Iterator[Any], keep_tombstones: bool) -> Iterator[tuple[bytes, bytes | None]]:
    last: Any = _NOTHING
    for key, _tag, value in merged:
        if key == last:
            continue  # an older version of a key already emitted
        last = key
        if value is None and not keep_tombstones:
            continue
        yield key, value
