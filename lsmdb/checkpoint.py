"""Checkpoints: a consistent, openable copy of a live database (``db.checkpoint(dest)``).

The copy holds every table, its options and counters, as of the call --
every write acknowledged before it, none after -- and opens read-write as a
database of its own.  Writes go on while it is made; they wait only while
step 1 holds the database's lock.

1. Under the database's lock (a read-only handle first catches up, as
   ``refresh()`` does): a reference on each table's current version, so its
   SSTables stay on disk (lsmdb.version); the manifest's record of the
   tables and the counters, as of the last acknowledged write; and each WAL
   segment that holds a record not yet in an SSTable opened for reading --
   an open descriptor outlives a flush that retires it -- with the length
   of its whole records then (for the live segment, where the last
   acknowledged record ends).  Nothing is copied while the lock is held.
2. Without the lock: each SSTable hard linked into the new directory (an
   SSTable never changes once written; the copy's compactions write new
   files of their own), or copied from the open file where no link can be
   made; each segment's records copied from its descriptor into a segment
   of the copy's own; ``STATS`` and ``FILTER_KEY`` copied; a MANIFEST
   naming all of it, every segment closed at its length; every file fsynced.
3. The directory is built under a temporary name of its own beside
   ``dest`` (``.NAME.checkpoint-XXXXXXXX``), fsynced, renamed to ``dest``,
   and the parent directory fsynced before the call returns: a crash or a
   power loss leaves either no ``dest`` or the whole checkpoint (and at
   most that temporary directory, to delete).
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import shutil
import stat
import tempfile
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

log = logging.getLogger("lsmdb")

#: Bytes copied per read.
COPY_CHUNK_BYTES = 1 << 20

#: Errors of os.link that mean "this file system makes no link here": copy instead.
_NO_LINK = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP,
            errno.EACCES)


class _Retry(Exception):
    """A read-only handle's view lost a file to the writer meanwhile: catch up, again."""


def temp_prefix(dest: str) -> str:
    return f".{os.path.basename(dest)}.checkpoint-"


def make_temp_dir(dest: str) -> str:
    """A new directory beside ``dest`` for one checkpoint to be built in."""
    return tempfile.mkdtemp(prefix=temp_prefix(dest), dir=os.path.dirname(dest))


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
        #: (number, length, format, descriptor open for reading)
        self.segments: list[tuple[int, int, int, int]] = []

    def release(self) -> None:
        for v in self.versions:
            v.release()
        for _n, _size, _fmt, fd in self.segments:
            os.close(fd)
        self.versions, self.segments = [], []


def _segments(versions: Versions) -> list[tuple[int, int, int]]:
    """Each WAL segment holding a record not yet in an SSTable, (number, length of
    its whole records, format), oldest first.  The lock held."""
    if versions.read_only:
        tail = versions.live_tail
        out = []
        for number, size, fmt in versions.replayed_wal:
            if tail is not None and number == tail[0]:
                size = tail[1]
            out.append((number, size, fmt))
        return out
    wal = versions.log
    low = versions.low_seq()
    out = [(s.number, s.size, s.format) for s in LogSet._needed(wal.closed, low)]
    out += [(s.number, s.size, s.format) for s in LogSet._needed(wal.unsynced, low)]
    if wal.live is not None and wal.writer is not None:
        out.append((wal.live.number, wal.writer.size, SEGMENT_FORMAT))
    return out


def _take(versions: Versions, plan: _Plan) -> None:
    """Step 1, the lock held: nothing here waits on more than an open."""
    for state in versions.tables.values():
        plan.versions.append(state.version.acquire())
    plan.manifest = versions.manifest(versions.low_seq(), WalState())
    plan.stats = _stats.encode_stats(versions.readers(), list(versions.tables.values()))
    for number, size, fmt in _segments(versions):
        try:
            fd = open_for_reading(versions.log.path(number))
        except FileNotFoundError:
            raise _Retry() from None  # a read-only view: the writer retired it
        plan.segments.append((number, size, fmt, fd))


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
    for number, size, fmt, fd in plan.segments:
        copy_range(fd, os.path.join(tmp, wal_name(number)), size)
        closed.append((number, size, fmt))
    write_file_durably(os.path.join(tmp, STATS_NAME), plan.stats)
    secret = os.path.join(versions.path, SECRET_NAME)
    try:
        mode = os.lstat(secret).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None:
        if stat.S_ISREG(mode):
            copy_path(secret, os.path.join(tmp, SECRET_NAME), os.lstat(secret).st_size, 0o600)
        else:  # the database's keyed filters fail open without it: so do the copy's
            log.warning("checkpoint: %s is not a regular file; not copied", secret)
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
    tmp = make_temp_dir(where)
    plan = _Plan()
    renamed = False
    try:
        for _attempt in range(100):
            with versions.lock:
                versions.check_open()
                if catch_up is not None:
                    catch_up()
                try:
                    _take(versions, plan)
                    break
                except _Retry:
                    plan.release()
        else:
            raise OSError(errno.EAGAIN, "the writer kept retiring the files of this view")
        _build(versions, tmp, plan)
        if os.path.lexists(where):  # made meanwhile: never replaced
            raise FileExistsError(errno.EEXIST, "the checkpoint's destination exists", where)
        try:
            os.rename(tmp, where)
        except OSError as exc:  # another checkpoint's rename came between
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            raise FileExistsError(errno.EEXIST, "the checkpoint's destination exists",
                                  where) from None
        renamed = True
        fsync_dir(os.path.dirname(where))
    except BaseException:
        shutil.rmtree(where if renamed else tmp, ignore_errors=True)
        raise
    finally:
        plan.release()
    return where
