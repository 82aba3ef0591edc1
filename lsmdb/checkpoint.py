"""Checkpoints: a consistent, openable copy of a live database (``db.checkpoint(dest)``).

The copy holds every table, its options and counters, as of the call --
every write acknowledged before it, none after -- and opens read-write as a
database of its own.  Writes go on while it is made; they wait only while
step 1 holds the database's lock.

1. Under the database's lock (a read-only handle first catches up, as
   ``refresh()`` does): a reference on each table's current version, so its
   SSTables stay on disk (lsmdb.version); the manifest's record of the
   tables and the counters, as of the last acknowledged write; and each WAL
   segment that holds a record not yet in an SSTable *pinned* -- hard
   linked into the new directory, so a flush that retires it cannot take it
   away -- with the length of its whole records then (for the live segment,
   where the last acknowledged record ends).  Where the file system refuses
   a hard link, those bytes are copied here instead.
2. Without the lock: each SSTable hard linked into the new directory (an
   SSTable never changes once written; the copy's compactions write new
   files of their own), or copied from the open file where no link can be
   made; each pinned segment's records copied into a segment of its own (a
   closed one, fsynced and never written again, keeps its link); ``STATS``
   and ``FILTER_KEY`` copied; a MANIFEST naming all of it, every segment
   closed at its length; every file fsynced.
3. The directory is built under a temporary name beside ``dest``
   (``.NAME.checkpoint-tmp``), fsynced, renamed to ``dest``, and the parent
   directory fsynced before the call returns: a crash or a power loss
   leaves either no ``dest`` or the whole checkpoint.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
from typing import TYPE_CHECKING, Any

from . import stats as _stats
from .files import (
    MANIFEST_NAME,
    SECRET_NAME,
    STATS_NAME,
    create,
    fsync_dir,
    open_for_reading,
    sst_name,
    wal_name,
    write_all,
    write_file_durably,
)
from .logset import LogSet, WalState
from .wal import SEGMENT_FORMAT

if TYPE_CHECKING:
    from .version import Version
    from .versions import Versions

#: Bytes copied per read.
COPY_CHUNK_BYTES = 1 << 20

#: Errors of os.link that mean "this file system makes no link here": copy instead.
_NO_LINK = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP,
            errno.EACCES)


class _Retry(Exception):
    """A read-only handle's view lost a file to the writer meanwhile: catch up, again."""


def temp_name(dest: str) -> str:
    return os.path.join(os.path.dirname(dest), f".{os.path.basename(dest)}.checkpoint-tmp")


def check_dest(source: str, dest: str | os.PathLike[str]) -> str:
    """``dest`` as an absolute path, or the error that refuses it: it exists, its
    parent does not, or it lies inside the database."""
    where = os.path.abspath(os.fsdecode(os.fspath(dest)))
    if os.path.lexists(where):
        raise FileExistsError(errno.EEXIST, "the checkpoint's destination exists", where)
    parent = os.path.dirname(where)
    if not os.path.isdir(parent):
        raise FileNotFoundError(errno.ENOENT, "the checkpoint's parent directory is missing",
                                parent)
    real_source = os.path.realpath(source)
    if os.path.commonpath([real_source, os.path.realpath(parent)]) == real_source:
        raise ValueError(f"a checkpoint cannot be made inside the database ({where})")
    return where


def copy_range(src_fd: int, dst: str, length: int, mode: int = 0o644) -> None:
    """A new file ``dst`` holding bytes [0, length) of ``src_fd``, fsynced."""
    fd = create(dst, mode)
    try:
        offset = 0
        while offset < length:
            chunk = os.pread(src_fd, min(COPY_CHUNK_BYTES, length - offset), offset)
            if not chunk:
                raise OSError(errno.EIO, f"file ended at {offset} of {length} bytes", dst)
            write_all(fd, chunk)
            offset += len(chunk)
        os.fsync(fd)
    finally:
        os.close(fd)


def copy_path(src: str, dst: str, length: int, mode: int = 0o644) -> None:
    fd = open_for_reading(src)
    try:
        copy_range(fd, dst, length, mode)
    finally:
        os.close(fd)


def link(src: str, dst: str) -> bool:
    """Hard link ``src`` as ``dst``: whether the file system made one."""
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in _NO_LINK:
            return False
        raise
    return True


class _Plan:
    """What step 1 took: the versions held, the manifest, the counters, the segments."""

    def __init__(self) -> None:
        self.versions: list[Version] = []
        self.manifest: Any = None
        self.stats = b""
        #: (number, length, format, how): how "link" (pinned as NAME.pin), "copied" (done).
        self.segments: list[tuple[int, int, int, str]] = []
        self.synced: set[int] = set()


def _segments(versions: Versions) -> tuple[list[tuple[int, int, int]], set[int]]:
    """Each WAL segment holding a record not yet in an SSTable, (number, length of
    its whole records, format), oldest first; and which of them are closed and
    fsynced (never written again).  The lock held."""
    if versions.read_only:
        tail = versions.live_tail
        out = []
        for number, size, fmt in versions.replayed_wal:
            if tail is not None and number == tail[0]:
                size = tail[1]
            out.append((number, size, fmt))
        return out, set()
    log = versions.log
    low = versions.low_seq()
    closed = LogSet._needed(log.closed, low)
    out = [(s.number, s.size, s.format) for s in closed]
    out += [(s.number, s.size, s.format) for s in LogSet._needed(log.unsynced, low)]
    if log.live is not None and log.writer is not None:
        out.append((log.live.number, log.writer.size, SEGMENT_FORMAT))
    return out, {s.number for s in closed}


def _take(versions: Versions, tmp: str, plan: _Plan) -> None:
    """Step 1, the lock held."""
    for state in versions.tables.values():
        plan.versions.append(state.version.acquire())
    plan.manifest = versions.manifest(versions.low_seq(), WalState())
    plan.stats = _stats.encode_stats(versions.readers(), list(versions.tables.values()))
    segments, plan.synced = _segments(versions)
    for number, size, fmt in segments:
        src = versions.log.path(number)
        pin = os.path.join(tmp, wal_name(number) + ".pin")
        try:
            linked = link(src, pin)
        except FileNotFoundError:
            raise _Retry() from None  # a read-only view: the writer retired it
        if linked:
            plan.segments.append((number, size, fmt, "link"))
        else:
            try:
                copy_path(src, os.path.join(tmp, wal_name(number)), size)
            except FileNotFoundError:
                raise _Retry() from None
            plan.segments.append((number, size, fmt, "copied"))


def _build(versions: Versions, tmp: str, plan: _Plan) -> None:
    """Step 2, without the lock."""
    for version in plan.versions:
        for reader in version.files:
            dst = os.path.join(tmp, sst_name(reader.number))
            same = False
            try:
                if link(reader.path, dst):
                    same = os.stat(dst).st_ino == os.fstat(reader.fd).st_ino
                    if not same:  # not the file this view reads: copy that one
                        os.unlink(dst)
            except FileNotFoundError:
                pass  # a read-only view's file the writer retired: its open file serves
            if not same:
                copy_range(reader.fd, dst, reader.size_bytes)
    closed = []
    for number, size, fmt, how in plan.segments:
        final = os.path.join(tmp, wal_name(number))
        if how == "link":
            pin = final + ".pin"
            if number in plan.synced:
                os.rename(pin, final)  # closed and fsynced: it never changes again
            else:
                copy_path(pin, final, size)
                os.unlink(pin)
        closed.append((number, size, fmt))
    write_file_durably(os.path.join(tmp, STATS_NAME), plan.stats)
    secret = os.path.join(versions.path, SECRET_NAME)
    if os.path.lexists(secret):
        copy_path(secret, os.path.join(tmp, SECRET_NAME), os.lstat(secret).st_size, 0o600)
    manifest = dataclasses.replace(plan.manifest, wal=WalState(closed, [], None))
    manifest.write(os.path.join(tmp, MANIFEST_NAME))
    for name in os.listdir(tmp):  # linked files were fsynced where they came from; again
        fd = open_for_reading(os.path.join(tmp, name))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_dir(tmp)


def checkpoint(versions: Versions, dest: str | os.PathLike[str], catch_up: Any = None) -> str:
    """Make the checkpoint of ``versions``'s database at ``dest`` (module
    docstring); returns ``dest`` as an absolute path.  ``catch_up()``, for a
    read-only handle: brings it to what the writer acknowledged (the lock held)."""
    versions.check_open()
    where = check_dest(versions.path, dest)
    tmp = temp_name(where)
    # What a checkpoint that did not finish left (an empty directory is reused).
    if os.path.islink(tmp) or (os.path.lexists(tmp) and not os.path.isdir(tmp)):
        os.unlink(tmp)
    elif os.path.isdir(tmp) and os.listdir(tmp):
        shutil.rmtree(tmp)
    if not os.path.isdir(tmp):
        os.mkdir(tmp)
    plan = _Plan()
    try:
        for _attempt in range(100):
            with versions.lock:
                versions.check_open()
                if catch_up is not None:
                    catch_up()
                try:
                    _take(versions, tmp, plan)
                    break
                except _Retry:
                    for v in plan.versions:
                        v.release()
                    plan = _Plan()
                    for name in os.listdir(tmp):
                        os.unlink(os.path.join(tmp, name))
        else:
            raise OSError(errno.EAGAIN, "the writer kept retiring the files of this view")
        _build(versions, tmp, plan)
        os.rename(tmp, where)
        fsync_dir(os.path.dirname(where))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        for v in plan.versions:
            v.release()
    return where
