"""Versions kept for live snapshots: what a compaction keeps besides each key's
newest version, where it keeps it, and how a snapshot reads it back.

A snapshot (lsmdb.snapshot) reads the database as of its sequence number S:
for each key, the version with the highest sequence number not above S --
the snapshot's *stripe* of that key (RocksDB's word).  A compaction that
merges files while snapshots are live keeps, for each key, its newest version
(in its outputs, as ever) and, for each live snapshot, that snapshot's
version where it differs (``kept_versions`` in lsmdb.merge); every other version goes,
as without snapshots.  So a snapshot no longer needs the files it started
with: once the compaction is installed, each live snapshot reads the table's
new files and the history files, taking of each key the version with the
highest number not above its own (``FastPath.bound``: lsmdb.readpath's
``lookup_by_seq``, and the C getter), and gives the old files back.

**History files.**  The versions kept besides the newest go to the
compaction's *history files*: the second version kept of a key to the first
history file, the third to the second, and so on, so that each holds at most
one version of a key, like any SSTable (the same format, filters and
checksums), in level 0 whatever the strategy.  No MANIFEST names them and
no read but a snapshot's consults them: the snapshots live when the
compaction started (and still live at its install) hold them
(:class:`HistoryFile`), and the last one to let go deletes the file.
Nothing after a restart needs them -- snapshots end with their database --
so an open sweeps any a crash left behind, as it sweeps every file its
MANIFEST does not name.

**Tombstones.**  While any snapshot is live, compactions keep tombstones
(an expired value, turned into one, too) even at the bottom of the tree: a
snapshot whose version of a key is a delete must keep finding the delete, or
an older version kept for an older snapshot would answer it instead.
Released snapshots let the next compaction drop them as usual.

Cost: a compaction with live snapshots older than some of its input keeps
each such version once more, in a history file; its merge is the same one
(lsmdb.merge, ``snapshots=`` and ``kept=``), which tells the kept versions
apart as it passes them.  Reads that do not use a snapshot never consult
history files.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .files import FileWriter, unlink_quietly
from .sstable_format import KIND_BITS, MAX_SEQ
from .sstable_writer import WRITE_BUFFER_BYTES

if TYPE_CHECKING:
    from .sstable_reader import SSTableReader
    from .sstable_writer import SSTableBuilder


class HistoryWriter:
    """The history files of one compaction, written as a merge keeps versions
    for snapshots (lsmdb.merge): file ``d`` takes the ``d + 2``-th version kept
    of each key.  ``make(number)`` gives a builder for a new file and its
    writer; ``seal`` finishes one into a reader."""

    def __init__(self, alloc_number: Callable[[], int], path_for: Callable[[int], str],
                 make: Callable[[FileWriter, int], SSTableBuilder],
                 seal: Callable[[SSTableBuilder, FileWriter, str, int], SSTableReader]) -> None:
        self._alloc = alloc_number
        self._path_for = path_for
        self._make = make
        self._seal = seal
        self._open: list[tuple[SSTableBuilder, FileWriter, str, int, list[int]]] = []
        self.paths: list[str] = []

    def take(self, kept: list[tuple[int, bytes, Any, int]]) -> None:
        """Write the versions a merge kept, (depth, key, value, tag) in key order
        per depth, and empty the list."""
        by_depth: dict[int, tuple[list[bytes], list[Any], list[int]]] = {}
        for depth, key, value, tag in kept:
            part = by_depth.get(depth)
            if part is None:
                part = by_depth[depth] = ([], [], [])
            part[0].append(key)
            part[1].append(value)
            part[2].append(tag)
        kept.clear()
        for depth in sorted(by_depth):
            while len(self._open) <= depth:
                number = self._alloc()
                path = self._path_for(number)
                self.paths.append(path)
                f = FileWriter(path, WRITE_BUFFER_BYTES)
                self._open.append((self._make(f, number), f, path, number, [MAX_SEQ, 0]))
            builder, _f, _path, _n, seqs = self._open[depth]
            keys, values, tags = by_depth[depth]
            seqs[0] = min(seqs[0], min(tags) >> KIND_BITS)
            seqs[1] = max(seqs[1], max(tags) >> KIND_BITS)
            builder.add_chunk(keys, values, None, tags)

    def finish(self) -> list[SSTableReader]:
        """Seal every file; their readers (on an error, those sealed are closed
        and ``abandon`` deletes every file)."""
        out: list[SSTableReader] = []
        try:
            while self._open:
                builder, f, path, number, (lo, hi) = self._open[0]
                builder.note_seq(lo, hi)
                out.append(self._seal(builder, f, path, number))
                del self._open[0]
        except BaseException:
            for r in out:
                r.close()
            raise
        return out

    def abandon(self) -> None:
        """A failed compaction: close and delete what was written."""
        for _b, f, _p, _n, _s in self._open:
            f.close()
        self._open = []
        for p in self.paths:
            unlink_quietly(p)


class HistoryFile:
    """A history file and the snapshots holding it: deleted when the last of
    them lets go (``release``).  Readers still in a read keep their open
    descriptor (as for any file that leaves the disk)."""

    __slots__ = ("reader", "_holders", "_lock")

    def __init__(self, reader: SSTableReader) -> None:
        self.reader = reader
        self._holders = 0
        self._lock = threading.Lock()

    def hold(self) -> HistoryFile:
        with self._lock:
            self._holders += 1
        return self

    def release(self) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders:
                return
        self.delete()

    def delete(self) -> None:
        self.reader.drop_cached()
        unlink_quietly(self.reader.path)

    @property
    def holders(self) -> int:
        return self._holders


def release_all(files: Iterable[HistoryFile]) -> None:
    for h in files:
        h.release()
