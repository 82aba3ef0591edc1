"""Versions: immutable sets of a table's SSTables, counted while anything reads them.

A :class:`Version` is the files of one table as a read sees them: level 0
newest first, then each deeper level in key order.  It never changes; a
flush or compaction publishes a new one (``TableState.publish``).  The table
holds a reference to its current version, and so does whatever must go on
reading a set of files after the table moves on -- a scan, and later a
snapshot or a checkpoint: ``version.acquire()`` ... ``version.release()``.

:class:`VersionSet` (one per database) counts, for each file, the live
versions that name it.  A file leaves the disk only once it is *retired* --
a manifest switch without it became durable (``Versions.retire``) -- and no
live version names it: then it is unlinked and its blocks dropped from the
block cache.  So a compaction's inputs stay on disk while a scan reads them,
and never go before the switch that replaced them is durable.  Lock-free
point reads hold no reference: they read through open descriptors, which
an unlink does not close (LevelDB's ``Version`` and its refs, in the same
roles).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .files import unlink_quietly

if TYPE_CHECKING:
    from .sstable_reader import SSTableReader

log = logging.getLogger("lsmdb")


class Version:
    """One table's SSTables, immutable: ``l0`` newest first, ``levels`` the deeper
    levels each as (max keys, files) in key order.  Made by ``VersionSet.new``
    with one reference, its table's."""

    __slots__ = ("files", "l0", "levels", "_refs", "_owner")

    def __init__(self, files: Iterable[SSTableReader], owner: VersionSet | None = None) -> None:
        self.files: tuple[SSTableReader, ...] = tuple(files)
        self.l0 = tuple(sorted((r for r in self.files if r.level == 0),
                               key=lambda r: (r.max_seq, r.number), reverse=True))
        depth = max((r.level for r in self.files), default=0)
        levels = []
        for level in range(1, depth + 1):
            readers = tuple(sorted((r for r in self.files if r.level == level),
                                   key=lambda r: r.min_key))
            levels.append((tuple(r.max_key for r in readers), readers))
        self.levels: tuple[tuple[tuple[bytes, ...], tuple[SSTableReader, ...]], ...] = \
            tuple(levels)
        self._refs = 1
        self._owner = owner

    def in_read_order(self) -> list[SSTableReader]:
        """Every file, newest data first (level 0 newest first, then by level and key)."""
        return [*self.l0, *(r for _keys, readers in self.levels for r in readers)]

    @property
    def refs(self) -> int:
        """References held: the table's while it is current, one per reader holding it."""
        return self._refs

    def acquire(self) -> Version:
        """One more reference (the caller releases it): its files stay on disk."""
        owner = self._owner
        if owner is None:
            self._refs += 1
            return self
        with owner.lock:
            if self._refs <= 0:
                raise RuntimeError("acquire of a released version")
            self._refs += 1
        return self

    def release(self) -> None:
        """Give a reference back; the last one lets its retired files go."""
        owner = self._owner
        if owner is None:
            self._refs -= 1
            return
        with owner.lock:
            self._refs -= 1
            if self._refs == 0:
                owner.released(self)
            elif self._refs < 0:
                raise RuntimeError("version released more often than acquired")


class VersionSet:
    """The live versions of a database's tables, by the files they name, and
    the retired files waiting for their last version to go (module docstring)."""

    def __init__(self, remove: bool = True) -> None:
        #: Held for every count; re-entrant, as a release may run from a
        #: finaliser in a thread that holds it.
        self.lock = threading.RLock()
        self._named: dict[SSTableReader, int] = {}   # live versions naming each file
        self._retired: set[SSTableReader] = set()
        #: Whether retired files are unlinked (False for a read-only handle).
        self.remove = remove
        self.closed = False

    def new(self, files: Iterable[SSTableReader]) -> Version:
        """A new version of these files, with one reference."""
        version = Version(files, self)
        with self.lock:
            for r in version.files:
                self._named[r] = self._named.get(r, 0) + 1
        return version

    def released(self, version: Version) -> None:
        """``version``'s last reference went (the lock held)."""
        gone = []
        for r in version.files:
            left = self._named[r] - 1
            if left:
                self._named[r] = left
            else:
                del self._named[r]
                if r in self._retired:
                    gone.append(r)
        self._remove(gone)

    def retire(self, readers: Iterable[SSTableReader]) -> None:
        """These files left their table through a durable manifest switch: each
        goes once no live version names it (now, if none does)."""
        with self.lock:
            gone = []
            for r in readers:
                if r in self._named and not self.closed:
                    self._retired.add(r)
                else:
                    gone.append(r)
            self._remove(gone)
            if self.closed:  # a switch that landed as the database closed
                for r in gone:
                    r.close()

    def _remove(self, readers: list[SSTableReader]) -> None:
        for r in readers:
            self._retired.discard(r)
            r.drop_cached()
            if self.remove:
                unlink_quietly(r.path)  # readers still holding it keep their descriptor

    def waiting(self) -> list[SSTableReader]:
        """The retired files a live version still names (kept on disk for it)."""
        with self.lock:
            return sorted(self._retired, key=lambda r: r.number)

    def close(self) -> None:
        """The database closed: every retired file goes, whatever still holds it,
        and is closed (a scan of a closed database reads nothing more: it raises
        DatabaseClosedError, as one of its current files does)."""
        with self.lock:
            self.closed = True
            gone = sorted(self._retired, key=lambda r: r.number)
            self._remove(gone)
            for r in gone:
                r.close()

    def _check(self, current: Iterable[Version]) -> None:
        """Invariants: the tables' current versions are live and counted; every
        retired file is named by a live version, and no current one."""
        with self.lock:
            for version in current:
                if version._refs < 1 or version._owner is not self:
                    raise AssertionError("a table's current version is not live here")
                for r in version.files:
                    if self._named.get(r, 0) < 1:
                        raise AssertionError(f"{r.path}: named by a live version, not counted")
                    if r in self._retired:
                        raise AssertionError(f"{r.path}: retired but current")
            if any(r not in self._named for r in self._retired):
                raise AssertionError("a retired file no version names is still on disk")
