"""Mapping-style iteration for anything with a ``scan``: a DB, a Table.

:class:`ScanMapping` turns an object's ``scan(start=None, end=None,
prefix=None, reverse=False)`` into ``for key in obj``, ``keys()``,
``values()``, ``items()``, ``reversed(obj)`` and ``len(obj)``.  It needs
nothing else of the object, so any reader with that ``scan`` (a DB, a Table,
a view of a database as of a moment) gets the same behaviour by inheriting
it.  Each call takes its own scan: a consistent snapshot taken when it is
made, read lazily, one data block per SSTable in memory at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class ScanMapping:
    """Iteration in key order over ``self.scan()`` (the default table of a DB).

    ``keys()``, ``values()`` and ``items()`` return iterators, not views: each
    reads the snapshot taken when it is called, so the data may change while
    it is walked.  ``len()`` walks a whole scan: O(n) in the live keys.  The
    object stays true even when empty (``bool`` does not scan).

        >>> import lsmdb, tempfile
        >>> with lsmdb.open(tempfile.mkdtemp()) as db:
        ...     db[b"b"] = b"2"; db[b"a"] = b"1"; db[b"c"] = b"3"; del db[b"c"]
        ...     (list(db), list(db.values()), list(db.items()), list(reversed(db)), len(db))
        ([b'a', b'b'], [b'1', b'2'], [(b'a', b'1'), (b'b', b'2')], [b'b', b'a'], 2)
    """

    __slots__ = ()

    def scan(self, start: Any = None, end: Any = None, prefix: Any = None,
             reverse: bool = False) -> Iterator[tuple[bytes, bytes]]:
        raise NotImplementedError  # pragma: no cover - every user defines its own

    def __iter__(self) -> Iterator[bytes]:
        """Every live key in key order (bytewise)."""
        return _keys(self.scan())

    def __reversed__(self) -> Iterator[bytes]:
        """Every live key in descending key order."""
        return _keys(self.scan(reverse=True))

    def keys(self) -> Iterator[bytes]:
        """Every live key in key order, lazily (as ``iter(obj)``)."""
        return _keys(self.scan())

    def values(self) -> Iterator[bytes]:
        """The value of every live key, in key order, lazily."""
        return _values(self.scan())

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` of every live key in key order, lazily (``scan()`` itself)."""
        return self.scan()

    def __len__(self) -> int:
        """The number of live keys: a whole scan, O(n) -- not a stored count."""
        n = 0
        for _ in self.scan():
            n += 1
        return n

    def __bool__(self) -> bool:
        return True


def _keys(rows: Iterator[tuple[bytes, bytes]]) -> Iterator[bytes]:
    for key, _value in rows:
        yield key


def _values(rows: Iterator[tuple[bytes, bytes]]) -> Iterator[bytes]:
    for _key, value in rows:
        yield value
