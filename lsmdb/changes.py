"""The ``CHANGES`` file: how a writer tells readers in other processes that something changed.

A writer keeps two counters in a small shared file of the database
directory (docs/FORMAT.md §11), mapped into its memory:

* ``seq``, the sequence number of the last record written to the WAL -- set
  after the record is in the log, so before its write is acknowledged;
* ``epoch``, bumped after every manifest switch (a flush, a compaction, a
  WAL rotation, a table created, altered or dropped) and at each writer's
  open and close.

A following reader (``lsmdb.open(path, read_only=True, follow=True)``) maps
the same file and compares the two counters with the ones it last caught up
to before each read: two loads, so a read of an idle database costs nearly
nothing more.  When they differ it catches up (:mod:`lsmdb.follow`).  The
counters are hints, never data: the file is not fsynced and holds nothing a
reopen needs; any value in it only makes a follower look again.  ``seq`` is
read before ``epoch``, and the writer stores ``epoch`` before any record of
the new layout's ``seq``: a follower that sees a record's ``seq`` also sees
the manifest switch that came before it.

The writer never replaces the file (a follower's mapping would go stale):
it creates it when missing and mends its header in place.
:class:`ChangeWatch` is a follower's view; its C twin is
``lsmdb._speedups.ChangeWatch`` (lsmdb/csrc/changes.c), which the C getters
check.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from collections.abc import Callable
from typing import Any

from .files import CHANGES_NAME, clear_for_file

_store: Callable[[Any, int, int], None] | None
try:  # a release store: what was written before it is seen by whoever sees it
    from ._speedups import changes_store as _store
except ImportError:  # pragma: no cover - built without a C compiler
    _store = None

CHANGES_MAGIC = b"LSMDBCHG"   # DO NOT CHANGE: on disk.
CHANGES_FORMAT = 1            # DO NOT CHANGE: on disk.
CHANGES_SIZE = 4096           # the file's size: one page
HEADER = struct.Struct("<8sII")
SEQ_OFFSET = 16
EPOCH_OFFSET = 24
_U64 = struct.Struct("<Q")


def changes_path(directory: str) -> str:
    return os.path.join(directory, CHANGES_NAME)


def store(board_map: mmap.mmap, offset: int, value: int) -> None:
    """``value`` as a u64 at ``offset`` of the writer's mapping: in C a release
    store (on x86 any aligned 8-byte store is one; elsewhere the WAL record
    written before must not be seen after it)."""
    if _store is not None:
        _store(board_map, offset, value)
    else:
        _U64.pack_into(board_map, offset, value)


def note_seq(board_map: mmap.mmap, seq: int) -> None:
    """Store ``seq`` as the last record written (the C put does the same)."""
    store(board_map, SEQ_OFFSET, seq)


class ChangeBoard:
    """A writer's side of ``CHANGES``: created when missing, its header mended in
    place, mapped shared; ``note_seq`` after each WAL record, ``bump_epoch``
    after each manifest switch.  ``map`` is what the C put stores ``seq`` into."""

    __slots__ = ("path", "map")

    def __init__(self, directory: str) -> None:
        self.path = changes_path(directory)
        clear_for_file(self.path)  # a directory, a FIFO or a link planted there: lost/
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                     | os.O_NONBLOCK, 0o644)
        try:
            if os.fstat(fd).st_size < CHANGES_SIZE:
                os.ftruncate(fd, CHANGES_SIZE)  # grows with zeros, never shrinks
            self.map: mmap.mmap | None = mmap.mmap(fd, CHANGES_SIZE, mmap.MAP_SHARED,
                                                   mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        head = HEADER.pack(CHANGES_MAGIC, CHANGES_FORMAT, 0)
        if self.map[:HEADER.size] != head:
            self.map[:HEADER.size] = head

    def note_seq(self, seq: int) -> None:
        if self.map is not None:
            note_seq(self.map, seq)

    def bump_epoch(self) -> None:
        m = self.map
        if m is not None:
            store(m, EPOCH_OFFSET, (_U64.unpack_from(m, EPOCH_OFFSET)[0] + 1)
                  & 0xFFFFFFFFFFFFFFFF)

    def close(self) -> None:
        m, self.map = self.map, None
        if m is not None:
            try:
                m.close()
            except BufferError:  # a C put holds it this instant: the collector frees it
                pass


class ChangeWatch:
    """A follower's read-only view of ``CHANGES`` (Python twin of the C one).

    ``attach()`` maps the file if it is not mapped yet (whether it is now: a
    file missing, short or of another format is not mapped); ``read()`` the
    counters, ``seq`` first (None while not mapped); ``seen`` the pair last
    caught up to; ``changed()`` whether they differ -- always True while not
    mapped, so that the follower checks the directory itself.
    """

    __slots__ = ("path", "_map", "seen")

    def __init__(self, path: str) -> None:
        self.path = path
        self._map: mmap.mmap | None = None
        self.seen: tuple[int, int] = (-1, -1)
        self.attach()

    def attach(self) -> bool:
        if self._map is not None:
            return True
        try:  # O_NONBLOCK: a FIFO planted there must not block
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size < CHANGES_SIZE:
                return False
            m = mmap.mmap(fd, CHANGES_SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)
        magic, fmt, _ = HEADER.unpack_from(m)
        if magic != CHANGES_MAGIC or fmt != CHANGES_FORMAT:
            m.close()
            return False
        self._map = m
        return True

    def read(self) -> tuple[int, int] | None:
        """(seq, epoch) as the writer left them, ``seq`` read first; None unmapped."""
        m = self._map
        if m is None:
            return None
        seq = _U64.unpack_from(m, SEQ_OFFSET)[0]
        return seq, _U64.unpack_from(m, EPOCH_OFFSET)[0]

    def changed(self) -> bool:
        m = self._map
        return m is None or self.read() != self.seen

    def close(self) -> None:
        m, self._map = self._map, None
        if m is not None:
            m.close()


def new_watch(directory: str, use_c: bool = True) -> ChangeWatch:
    """The :class:`ChangeWatch` of ``directory``'s ``CHANGES``: the C one where
    built and ``use_c``, else the Python one."""
    path = changes_path(directory)
    if use_c:
        try:
            from ._speedups import ChangeWatch as CWatch
        except ImportError:
            pass
        else:
            return CWatch(path)  # type: ignore[return-value]
    return ChangeWatch(path)
