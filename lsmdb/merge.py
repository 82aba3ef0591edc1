"""K-way merge of sorted sources: newest version of each key wins, tombstones hidden.

Sources are given newest first; each yields ``(key, value|None)`` in key
order (descending when ``reverse``).  Complexity: O(N log S) for N entries
over S sources, one entry per source in memory.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator


def merge_newest(sources: list[Iterable[tuple[bytes, bytes | None]]], reverse: bool = False,
                 keep_tombstones: bool = False) -> Iterator[tuple[bytes, bytes | None]]:
    """Merge ``sources`` (newest first) into one stream of live (key, value) pairs."""
    if reverse:
        # Descending on (key, -age): for equal keys the newest (age 0) comes first.
        tagged = [_tag(src, -age) for age, src in enumerate(sources)]
        merged = heapq.merge(*tagged, reverse=True)
    else:
        tagged = [_tag(src, age) for age, src in enumerate(sources)]
        merged = heapq.merge(*tagged)
    last = None
    first = True
    for key, _age, value in merged:
        if not first and key == last:
            continue  # an older version of a key already emitted
        first = False
        last = key
        if value is None and not keep_tombstones:
            continue
        yield key, value


def _tag(src: Iterable[tuple[bytes, bytes | None]],
         age: int) -> Iterator[tuple[bytes, int, bytes | None]]:
    for key, value in src:
        yield key, age, value
