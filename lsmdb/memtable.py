"""The in-memory table: newest value (or tombstone) of each key, sorted bytewise.

Two structures: a plain ``dict`` (``data``) that point reads use without any
lock, and a ``SortedList`` of the keys (``keys``) that scans walk in order
(they hold the database lock, or use a frozen memtable); a flush sorts the
dict itself.  A batch becomes visible to point reads at once -- in one
``dict.update``, a single C call under the GIL, or in the C
``apply_columns``, one loop that lets no other thread run -- so no reader
sees half of it.  New keys join the sorted
list lazily: writes only remember them (``_pending``) and the first ordered
read after them sorts them in, in one ``SortedList.update`` -- so a bulk load
pays for ordering once per flush instead of once per batch, and a memtable
that is flushed without being scanned never pays for it (the flush sorts the
dict in C, without the GIL).  A memtable is mutable until frozen for a flush;
a frozen memtable's entries never change again.  Tombstones are stored as ``None``, expiring
values as ``(value, expires)`` tuples (lsmdb.ttl), which readers resolve.

With the C speedups a memtable also keeps a Bloom filter of its keys
(``filter``, in memory only), through which the C get skips the dict lookup
for a key the memtable does not hold.  Every new key enters the filter before
it enters the dict, so a key a reader can find in the dict is always in the
filter, and a batch still becomes visible in one ``dict.update``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from itertools import filterfalse
from typing import Any

from sortedcontainers import SortedList

from .sstable_format import KIND_BITS, KIND_EXPIRING, KIND_TOMBSTONE, KIND_VALUE, MISSING

assert (KIND_BITS, KIND_TOMBSTONE, KIND_VALUE) == (8, 0, 1)  # apply's literals

try:  # optional C speedups (lsmdb/csrc/memtable.c): the key filter, apply_columns
    from ._speedups import MemFilter
    from ._speedups import apply_columns as _c_apply_columns
except ImportError:  # pragma: no cover - no C compiler when installed
    MemFilter = None  # type: ignore[assignment,misc]
    _c_apply_columns = None  # type: ignore[assignment]

#: Whether apply_columns takes its C step (tests switch it off to compare).
USE_SPEEDUPS = _c_apply_columns is not None

#: Held by the one reader that sorts a frozen memtable's pending keys in.
_SORTING = threading.Lock()

# Rough per-entry bookkeeping cost (dict slot, sorted-list slot, objects).
ENTRY_OVERHEAD_BYTES = 64
# What an expiring value holds besides its bytes: its tuple and its int.
EXPIRING_OVERHEAD_BYTES = 88


def value_size(value: Any) -> int:
    """The bytes a value (not a tombstone) counts for in a memtable's size."""
    if type(value) is tuple:
        return len(value[0]) + EXPIRING_OVERHEAD_BYTES
    return len(value)


class Memtable:
    """Sorted map ``key -> value | None | (value, expires)`` with size accounting.

    ``apply`` is O(log n); a point lookup is ``data.get(key)``, O(1).
    """

    __slots__ = ("data", "tags", "filter", "_keys", "_pending", "size_bytes", "min_seq",
                 "max_seq", "frozen", "flush_seq", "undos", "expiring")

    def __init__(self) -> None:
        self.data: dict[bytes, bytes | None] = {}
        #: The tag of each key's write in ``data``: ``seq << 8 | kind`` (lsmdb.block),
        #: what a flush writes.
        self.tags: dict[bytes, int] = {}
        #: A Bloom filter of data's keys for the C get (None without the C speedups).
        self.filter = MemFilter(self.data) if MemFilter is not None else None
        self._keys: SortedList = SortedList()
        self._pending: list[bytes] = []  # keys in data but not yet in _keys
        self.size_bytes = 0
        self.min_seq: int | None = None  # smallest WAL sequence number held
        self.max_seq = 0
        self.frozen = False
        self.flush_seq = 0  # set when frozen: every record of the table up to it is here or older
        #: One undo map per live snapshot of this (active) memtable (lsmdb.snapshot):
        #: what each key written since held before, recorded by the first write.
        self.undos: list[dict[bytes, Any]] = []
        #: Whether an expiring value was ever written here (scans then resolve them).
        self.expiring = False

    def __len__(self) -> int:
        return len(self.data)

    @property
    def keys(self) -> SortedList:
        """Every key, sorted (pending new keys are sorted in first).  Call it
        where writes cannot run: under the database lock, or frozen (readers
        of a frozen memtable hold no lock, so the first of them sorts under
        ``_SORTING``, and ``_pending`` empties only once the keys are in)."""
        if self._pending:
            if not self.frozen:  # the database lock is held: no other reader
                self._keys.update(self._pending)
                self._pending = []
                return self._keys
            with _SORTING:
                if self._pending:
                    self._keys.update(self._pending)
                    self._pending = []
        return self._keys

    def freeze(self) -> None:
        """No more writes.  What is pending is sorted in by the first ordered
        read (a scan); a flush needs no order of the memtable's own (it sorts
        the dict, lsmdb.sstable_writer.memtable_section), so the writer that
        fills a memtable does not pay for sorting it."""
        self.frozen = True

    def _note_seq(self, seq: int) -> None:
        if self.min_seq is None:
            self.min_seq = seq
        if seq > self.max_seq:
            self.max_seq = seq

    def _remember(self, keys: Iterable[bytes]) -> None:
        """Before a write: each live snapshot's undo map records what ``keys``
        held (MISSING: nothing), unless it already has."""
        data = self.data
        for undo in self.undos:
            for key in keys:
                if key not in undo:
                    undo[key] = data.get(key, MISSING)

    def apply(self, seq: int, key: bytes, value: Any) -> None:
        """Record ``value`` (None = tombstone, a tuple an expiring value) for
        ``key`` at sequence ``seq``."""
        if self.undos:
            self._remember((key,))
        data = self.data
        tag = seq << 8  # seq << KIND_BITS | KIND_TOMBSTONE: literals, a put's hot path
        if key not in data:
            if self.filter is not None:
                self.filter.add(key)  # before the dict: see the module's docstring
            self.size_bytes += len(key) + ENTRY_OVERHEAD_BYTES
            self._pending.append(key)
        else:
            old = data[key]
            if old is not None:
                self.size_bytes -= len(old) if type(old) is not tuple else value_size(old)
        if value is not None:
            if type(value) is tuple:  # an expiring value
                self.size_bytes += value_size(value)
                self.expiring = True
                tag |= KIND_EXPIRING
            else:
                self.size_bytes += len(value)
                tag |= 1  # KIND_VALUE
        self.tags[key] = tag
        data[key] = value
        if self.min_seq is None:
            self.min_seq = seq
        if seq > self.max_seq:
            self.max_seq = seq

    def apply_many(self, seq: int, items: dict[bytes, Any], expiring: bool = False) -> None:
        """``apply`` for every key of one batch, made visible to point reads at once
        (``expiring``: some of its values may be expiring tuples).

        New keys join the sorted list at the next ordered read, all at once.
        """
        if self.undos:
            self._remember(items)
        data = self.data
        # filter/map over the batch run in C, in time proportional to the batch.
        new_keys = list(filterfalse(data.__contains__, items))
        # (An expiring value's len() is its tuple's, 2: new ones are corrected
        # below, old ones counted by value_size once the memtable holds one.)
        grow = (sum(map(len, new_keys)) + ENTRY_OVERHEAD_BYTES * len(new_keys)
                + sum(map(len, filter(None, items.values()))))
        if len(new_keys) < len(items):  # overwrites: their old values leave
            grow -= sum(map(value_size if self.expiring else len,
                            filter(None, map(data.__getitem__, filter(data.__contains__, items)))))
        if new_keys and self.filter is not None:
            self.filter.add_many(new_keys)  # before the dict: see the module's docstring
        tags = self.tags
        tags.update(dict.fromkeys(items, seq << KIND_BITS | KIND_VALUE))
        if None in items.values():  # (a scan in C) tombstones: their own kind
            tomb = seq << KIND_BITS | KIND_TOMBSTONE
            for key, value in items.items():
                if value is None:
                    tags[key] = tomb
        if expiring:  # expiring values: their own kind, and their bytes counted
            exp_tag = seq << KIND_BITS | KIND_EXPIRING
            for key, value in items.items():
                if type(value) is tuple:
                    tags[key] = exp_tag
                    grow += value_size(value) - 2
                    self.expiring = True
        data.update(items)  # the whole batch, atomically for lock-free readers
        if new_keys:
            self._pending += new_keys
        self.size_bytes += grow
        self._note_seq(seq)

    def apply_columns(self, seq: int, keys: list[bytes], values: list[Any],
                      expiring: bool = False) -> None:
        """``apply_many`` of ``dict(zip(keys, values))``: keys[i] -> values[i],
        a later op on a key winning, the whole batch visible to point reads at
        once.  The C step (lsmdb/csrc/memtable.c) makes no dict of the batch:
        it looks each key up once and sets it, in a loop that lets no other
        thread run; it also marks the memtable ``expiring`` where a value it
        was given expires, even one a later op on its key replaced.  Should
        it fail part way (MemoryError), each op is applied whole or not at
        all, and the size is counted again."""
        if _c_apply_columns is None or not USE_SPEEDUPS or self.undos or self.filter is None:
            self.apply_many(seq, dict(zip(keys, values, strict=True)), expiring)
            return
        try:
            grow, saw_expiring = _c_apply_columns(self.data, self.tags, self.filter,
                                                  self._pending, seq, keys, values)
        except BaseException:  # the ops before the one that failed are applied
            self._note_seq(seq)
            self.expiring = self.expiring or expiring
            self.size_bytes = sum(len(k) + ENTRY_OVERHEAD_BYTES + (0 if v is None else
                                                                   value_size(v))
                                  for k, v in self.data.items())
            raise
        if saw_expiring:
            self.expiring = True
        self.size_bytes += grow
        self._note_seq(seq)

    def chunk_range(self, start: bytes | None, end: bytes | None,
                    reverse: bool = False) -> list[tuple[list[bytes], list[Any]]]:
        """The entries with start <= key < end as one (keys, values) chunk --
        what :func:`lsmdb.merge.merge_newest` takes, expiring values as they
        are (the scan resolves them) -- copied now (the active memtable is
        read under the DB lock); [] when there are none."""
        keys = list(self.keys.irange(start, end, inclusive=(True, False), reverse=reverse))
        return [(keys, list(map(self.data.__getitem__, keys)))] if keys else []

    def flush_chunks(self) -> list[tuple[list[bytes], list[bytes | None], list[int]]]:
        """Every entry as one (keys, values, tags) chunk for an SSTable: each
        tag ``seq << 8 | kind`` of the key's write (lsmdb.block).  Frozen only."""
        keys = list(self.keys)
        if not keys:
            return []
        return [(keys, list(map(self.data.__getitem__, keys)),
                 list(map(self.tags.__getitem__, keys)))]

    def _check(self) -> None:
        """Invariants: the sorted keys are exactly the dict's keys, in order,
        each with the sequence number of its write."""
        keys = list(self.keys)
        if keys != sorted(self.data):
            raise AssertionError("memtable sorted keys and dict disagree")
        if self.tags.keys() != self.data.keys():
            raise AssertionError("memtable tags and dict disagree")
        data = self.data

        def kind_of(value: Any) -> int:
            return KIND_TOMBSTONE if value is None else \
                KIND_EXPIRING if type(value) is tuple else KIND_VALUE

        if any(t & 0xFF != kind_of(data[k]) for k, t in self.tags.items()):
            raise AssertionError("memtable tag kinds and values disagree")

