"""A read-only handle catching up with the writer: ``refresh()`` and ``follow=True``.

A read-only handle reads the directory as it was at its open.  Catching up
(:class:`Follower`) brings it to everything the writer had acknowledged when
the catch-up began, in one of two ways:

* **the tail**: while the manifest is the one last read, everything new is
  in the live WAL segment after where the last catch-up stopped reading
  (:func:`lsmdb.wal.read_records_from`); those records are applied to the
  memtables, as the writer applied them (a batch's part in a table at once)
  -- the work is what was written since;
* **a reload**: when the manifest changed (a flush, a compaction, a WAL
  rotation, a table created, altered or dropped, another writer's open), the
  state it describes is read (:func:`lsmdb.recovery.read_state_with_retry`),
  keeping every open SSTable reader the new manifest still names, the WAL
  read on from where the handle stopped (and each memtable keeping only what
  the new files do not hold), or -- when that cannot be done -- all of it
  again; each table's files and memtable are swapped in one step
  (``TableState.publish``).  Scans, snapshots and iterators already open
  keep the view they took.

Only records up to the sequence number the writer last published in
``CHANGES`` are taken from the tail: a record after it is not acknowledged
yet, or belongs to a write that failed.

``refresh()`` catches up once.  A following handle (``follow=True``) checks
the writer's ``CHANGES`` counters (:mod:`lsmdb.changes`) before every read
and catches up when they moved: a read that begins after the writer
acknowledged a write sees it.  Without the file (no writer has opened the
database since it was made), it reads the manifest and the live segment's
tail before every read instead: correct, slower.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .changes import new_watch
from .files import MANIFEST_NAME
from .logset import ReplayedLog, decode_record
from .manifest import Manifest
from .manifest import read_bytes as read_manifest_bytes
from .memtable import KIND_BITS, Memtable
from .recovery import DirectoryState, live_tail, read_state_with_retry
from .secret import load_secret
from .wal import SEGMENT_FORMAT, SEGMENT_HEADER_SIZE, read_records_from

if TYPE_CHECKING:
    from .sstable_reader import SSTableReader
    from .table import TableState
    from .versions import Versions

log = logging.getLogger("lsmdb")

#: Whether a following handle watches through the C ChangeWatch (and so its C
#: getters check in C); tests switch it off to run the Python twin.
USE_C_WATCH = True

#: Reads of the whole state before a follower takes records of a table no
#: manifest it read names (a creation that never became durable).
RELOAD_ATTEMPTS = 5


class Follower:
    """Catches a read-only ``Versions`` up with the writer (module docstring).

    ``tables_changed(added, dropped)`` is called (the database's lock held)
    after a reload that created or dropped tables, for the handle to update
    its table handles.  ``follow``: check before every read (``check``), with
    ``watch`` the ``CHANGES`` view the C getters check too.
    """

    def __init__(self, versions: Versions, follow: bool,
                 tables_changed: Callable[[list[TableState], list[TableState]], None]
                 ) -> None:
        self.versions = versions
        self.follow = follow
        self.tables_changed = tables_changed
        #: The CHANGES counters, for a following handle's checks and, for any
        #: read-only handle, the last sequence number the writer says it wrote.
        self.watch: Any = new_watch(versions.path, USE_C_WATCH)
        #: The board a reload left the handle short of (the record it names not
        #: found): not reloaded for again.
        self._short: Any = None
        #: Catch-ups done: (tails, reloads), for tests and ``lsmdb inspect``.
        self.tails = 0
        self.reloads = 0

    def check(self) -> None:
        """Before a read of a following handle: catch up if the writer changed anything."""
        if self.follow and self.watch.changed():
            self.catch_up()

    def catch_up(self, refresh: bool = False) -> None:
        """Bring the handle to what the writer had acknowledged when this began
        (``refresh``: whatever the watch says)."""
        versions = self.versions
        with versions.lock:
            if versions.closed:
                return
            watch = self.watch
            board = None
            if watch.attach():
                board = watch.read()  # before anything is read: the catch-up covers it
                if not refresh and board == watch.seen:
                    return  # another thread caught up meanwhile
            limit = None if board is None else board[0]
            if board is not None and not refresh and board[1] == watch.seen[1]:
                # No manifest switch since the last catch-up: the live segment's tail.
                ok = self._tail(limit)
            else:
                data = read_manifest_bytes(os.path.join(versions.path, MANIFEST_NAME))
                ok = data == versions.manifest_bytes and self._tail(limit)
            if not ok or (board is not None and versions.last_seq < board[0]
                          and self._short != board):
                self._reload(limit)
                if board is not None and versions.last_seq < board[0]:
                    self._short = board  # not reloaded for this board again
            if board is not None:
                # Short of the writer's last record (its bytes not seen yet): the next
                # read looks at the tail again.
                watch.seen = (min(board[0], versions.last_seq), board[1])

    def _tail(self, limit: int | None) -> bool:
        """Apply the live segment's records written since the last catch-up (up to
        sequence number ``limit``, the last the writer said it wrote: a record
        after it is not acknowledged yet -- or never will be, its write having
        failed); False when only a reload can catch up (the segment is gone, a
        record names a table not known here)."""
        versions = self.versions
        tail = versions.live_tail
        if tail is None:
            return True  # no live segment: nothing is written without a manifest switch
        number, start = tail
        try:
            records, end = read_records_from(versions.log.path(number), number, start)
        except FileNotFoundError:
            return False
        decoded = decode_all(versions.log.path(number), records)
        if limit is not None:
            keep = count_upto(decoded, limit)
            if keep < len(decoded):
                end = records[keep][0]  # read on from there next time
                decoded = decoded[:keep]
        if not decoded:
            return True
        self.tails += 1
        if unknown_table(decoded, versions.by_id, versions.next_table_id):
            return False  # a table created since: its manifest switch is due
        self._apply(decoded, versions.by_id)
        versions.live_tail = (number, end)
        return True

    def _apply(self, decoded: list[tuple[int, list[Any]]], by_id: dict[int, TableState]
               ) -> None:
        """Apply decoded records to the memtables of ``by_id``'s tables, as the
        writer did: a record of a table flushed since, or dropped, is skipped."""
        versions = self.versions
        top = versions.last_seq
        for seq, ops in decoded:
            if len(ops) == 1:
                tid, key, value = ops[0]
                state = by_id.get(tid)
                if state is not None and seq > state.flushed_seq:
                    state.mem.apply(seq, key, value)
            else:  # a batch: each table's part visible at once, as the writer made it
                parts: dict[int, tuple[list[bytes], list[Any]]] = {}
                for tid, key, value in ops:
                    keys, values = parts.setdefault(tid, ([], []))
                    keys.append(key)
                    values.append(value)
                for tid, (keys, values) in parts.items():
                    state = by_id.get(tid)
                    if state is not None and seq > state.flushed_seq:
                        state.mem.apply_columns(seq, keys, values,
                                                any(type(v) is tuple for v in values))
            if seq > top:
                top = seq
        versions.last_seq = top

    def _reload(self, limit: int | None = None) -> None:
        """Make the state the current manifest describes the handle's, keeping the
        readers it still names (the lock held): the WAL read on from where the
        handle's reading of it stopped when it can (up to ``limit``, as
        ``_tail``), else all of it again."""
        versions = self.versions
        self.reloads += 1
        if versions.keyed is None:  # a secret made since the open: keyed filters work
            versions.keyed = load_secret(versions.path)
            if versions.keyed is not None:
                for state in versions.tables.values():
                    for reader in state.files:
                        reader.attach_hasher(versions.keyed)
        current = {r.number: r for s in versions.tables.values() for r in s.files}
        path = os.path.join(versions.path, MANIFEST_NAME)
        if versions.live_tail is not None:
            data, manifest, new, _ = read_state_with_retry(versions, path, reuse=current,
                                                           replay=False)
            try:
                plan = self._wal_since(manifest, new, limit)
            except BaseException:
                new.close()
                raise
            if plan is not None:
                self._swap(data, manifest, new, plan, None)
                return
            new.close()
        for attempt in range(RELOAD_ATTEMPTS):
            data, manifest, new, replayed = read_state_with_retry(versions, path, reuse=current)
            # The WAL, read after the manifest, may hold records of a table created
            # since: read the newer manifest that names it (unless a crash left such
            # records of a table whose creation never became durable).
            if new.next_table_id <= manifest.next_table_id or attempt == RELOAD_ATTEMPTS - 1:
                break
            new.close()
        self._swap(data, manifest, new, None, replayed)

    def _wal_since(self, manifest: Manifest, new: DirectoryState, limit: int | None
                   ) -> tuple[list[tuple[int, list[Any]]], list[tuple[int, int, int]]] | None:
        """The records (decoded) of ``manifest``'s WAL segments past where the handle
        stopped reading (``live_tail``), and every segment's (number, length of its
        whole records, format); None when they cannot be read that way (a legacy
        segment, one vanished meanwhile, a record of a table ``new`` does not
        know: the whole WAL is read again)."""
        versions = self.versions
        tail = versions.live_tail
        wal = manifest.wal
        if tail is None or wal is None:
            return None
        listed = [(n, size, fmt) for n, size, fmt in wal.closed]
        listed += [(n, size, SEGMENT_FORMAT) for n, size in wal.unsynced]
        if wal.live is not None:
            listed.append((wal.live, -1, SEGMENT_FORMAT))
        reads = []
        lengths = []
        for number, size, fmt in listed:
            if number < tail[0]:
                lengths.append((number, size, fmt))  # every record of it read before
                continue
            if fmt != SEGMENT_FORMAT:
                return None
            start = tail[1] if number == tail[0] else SEGMENT_HEADER_SIZE
            try:
                records, end = read_records_from(versions.log.path(number), number, start)
            except FileNotFoundError:
                return None
            if size >= 0 and end < size:
                return None  # a closed segment reads short: the whole WAL says why
            decoded = decode_all(versions.log.path(number), records)
            if limit is not None and size < 0:  # the live segment: as _tail reads it
                keep = count_upto(decoded, limit)
                if keep < len(decoded):
                    end = records[keep][0]
                    decoded = decoded[:keep]
            reads.extend(decoded)
            lengths.append((number, end, fmt))
        by_id = {t.id: t for t in new.tables.values()}
        if unknown_table(reads, by_id, new.next_table_id):
            return None
        return reads, lengths

    def _swap(self, data: bytes, manifest: Manifest, new: DirectoryState,
              plan: tuple[list[tuple[int, list[Any]]], list[tuple[int, int, int]]] | None,
              replayed: ReplayedLog | None) -> None:
        """Make ``new`` the handle's: each table that stays keeps its state object
        (handles and getters hold it) and takes the new files, options and
        memtable -- ``replayed``: the new one; ``plan``: its own, less what the
        new files hold, plus the planned records."""
        versions = self.versions
        added: list[TableState] = []
        dropped: list[TableState] = []
        retired: list[SSTableReader] = []
        kept: list[tuple[TableState, TableState]] = []
        for name, fresh in new.tables.items():
            state = versions.tables.get(name)
            if state is None or state.id != fresh.id:
                if state is not None:
                    dropped.append(state)
                added.append(fresh)
            else:
                kept.append((state, fresh))
        dropped.extend(s for n, s in versions.tables.items() if n not in new.tables)
        mems = {}
        if plan is not None:
            for state, fresh in kept:
                mems[state.id] = (state.mem if fresh.flushed_seq <= state.flushed_seq
                                  else unflushed(state.mem, fresh.flushed_seq))
                fresh.mem = mems[state.id]
            self._apply(plan[0], {s.id: s for s in new.tables.values()})
        for state, fresh in kept:
            files = set(fresh.files)
            retired.extend(r for r in state.files if r not in files)
            if state.explicit != fresh.explicit:
                state.set_options(fresh.explicit)
            state.flushed_seq = fresh.flushed_seq
            state.mem, state.imms, state.files = fresh.mem, (), fresh.files
            state.publish()
            fresh.files = ()
            fresh.publish()  # the temporary state's version goes
        for state in dropped:
            retired.extend(state.files)
            state.dropped = True
            state.mem = Memtable()  # as Versions.drop_table leaves a dropped table
            state.imms = ()
            state.files = ()
            state.publish()
            del versions.tables[state.name]
            versions.by_id.pop(state.id, None)
        for state in added:
            versions.add(state)
        versions.next_file = max(versions.next_file, new.next_file)
        versions.next_table_id = max(versions.next_table_id, new.next_table_id)
        versions.last_seq = max(versions.last_seq, new.last_seq)
        versions.manifest_bytes = data
        if plan is not None:
            lengths = plan[1]
            versions.replayed_wal = lengths
            versions.live_tail = lengths[-1][:2] if lengths else None
        else:
            assert replayed is not None
            versions.live_tail = live_tail(manifest, replayed)
            versions.replayed_wal = [(seg.number, seg.size, seg.format)
                                     for seg in replayed.segments]
        versions.retire(retired)
        if added or dropped:
            self.tables_changed(added, dropped)

    def close(self) -> None:
        self.watch.close()


def decode_all(path: str, records: list[tuple[int, bytes]]) -> list[tuple[int, list[Any]]]:
    """Each (offset, payload) record of the segment at ``path`` as (seq, ops)."""
    return [decode_record(payload, path, offset) for offset, payload in records]


def count_upto(decoded: list[tuple[int, list[Any]]], limit: int) -> int:
    """How many of the decoded records, in order, have sequence numbers up to
    ``limit`` (a segment's records are in sequence order)."""
    n = 0
    for seq, _ops in decoded:
        if seq > limit:
            break
        n += 1
    return n


def unknown_table(decoded: list[tuple[int, list[Any]]], by_id: dict[int, TableState],
                  next_table_id: int) -> bool:
    """Whether a record names a table created after the manifest that gave
    ``by_id`` and ``next_table_id`` (a dropped table's id is below it)."""
    return any(tid >= next_table_id and tid not in by_id
               for _seq, ops in decoded for tid, _k, _v in ops)


def unflushed(mem: Memtable, flushed_seq: int) -> Memtable:
    """A new memtable of ``mem``'s entries written after ``flushed_seq`` (the rest
    is in the table's files now)."""
    out = Memtable()
    tags = mem.tags
    for key, value in mem.data.items():
        seq = tags[key] >> KIND_BITS
        if seq > flushed_seq:
            out.apply(seq, key, value)
    return out
