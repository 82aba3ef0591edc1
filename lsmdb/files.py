"""The files of a database directory: their names, and how lsmdb creates, reads and syncs them.

Names (docs/FORMAT.md §2)::

    LOCK              held (a POSIX record lock) while a process has the database open
    MANIFEST          tables, options, SSTables, WAL segments (switched atomically)
    STATS             filter and read counters
    FILTER_KEY        the secret of keyed filter hashing (mode 0600; only if used)
    CHANGES           counters a writer keeps for readers that follow it (lsmdb.changes)
    NNNNNN.sst        an SSTable
    wal-NNNNNN.log    a write-ahead-log segment
    NAME.tmp          a MANIFEST or STATS being written
    lost/             what ``lsmdb repair`` set aside

Every file lsmdb writes is a new one, created with ``O_CREAT | O_EXCL |
O_NOFOLLOW``: a name planted in the directory -- a symbolic link to a file
elsewhere, or anything left over -- is never written through, and a file
to be replaced (``MANIFEST``, ``STATS``) is replaced by renaming a new file
over it, which replaces a link itself rather than its target.  Files are
read with ``O_NOFOLLOW`` too, so no link inside the directory is followed.
Data reaches files through ``os.write`` and disks through ``os.fsync``.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat

from .errors import NotADatabaseError

log = logging.getLogger("lsmdb")

LOCK_NAME = "LOCK"
MANIFEST_NAME = "MANIFEST"
STATS_NAME = "STATS"
SECRET_NAME = "FILTER_KEY"
CHANGES_NAME = "CHANGES"
LOST_NAME = "lost"
TMP_SUFFIX = ".tmp"

SST_RE = re.compile(r"(\d{6,})\.sst\Z")
WAL_RE = re.compile(r"wal-(\d{6,})\.log\Z")

#: Every name lsmdb itself creates in a database directory (``lost/`` aside).
OWN_NAME_RE = re.compile(
    r"(?:LOCK|MANIFEST|STATS|CHANGES|FILTER_KEY(?:\.damaged)?|\d{6,}\.sst|wal-\d{6,}\.log)(?:\.tmp)?\Z")

_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO planted under a file's name must not block the open.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def sst_name(number: int) -> str:
    return f"{number:06d}.sst"


def wal_name(number: int) -> str:
    return f"wal-{number:06d}.log"


class SwitchedButNotSynced(OSError):
    """The new file replaced the old one, but fsyncing the directory failed.

    The switch is visible (and is what a reopen reads unless the machine
    crashes), so the caller must keep the new state -- never roll back to a
    state that deletes files the new file names -- and must keep anything the
    old state needs, since a machine crash could still bring it back.
    """


def create(path: str, mode: int = 0o644, readable: bool = False) -> int:
    """A descriptor of the new file ``path``, open for writing (and reading,
    if ``readable``: what a shared memory mapping of it needs).

    FileExistsError if anything (a file, a symbolic link) has that name.
    """
    flags = _CREATE_FLAGS if not readable else (_CREATE_FLAGS & ~os.O_WRONLY) | os.O_RDWR
    return os.open(path, flags, mode)


def preallocate(fd: int, offset: int, length: int) -> None:
    """Allocate disk space for ``length`` bytes of the file at ``offset`` (the
    file grows to cover them, reading as zeros): ENOSPC is raised here, not
    when the bytes are later stored through a memory mapping.  Through
    ``os.posix_fallocate`` (looked up at each call), or zeros written where
    it does not exist or the file system refuses it."""
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is not None:
        try:
            fallocate(fd, offset, length)
            return
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
    zeros = bytes(min(length, 1 << 20))
    done = 0
    while done < length:
        done += os.pwrite(fd, zeros[:length - done], offset + done)


def open_for_reading(path: str) -> int:
    """A read-only descriptor of the regular file ``path``: OSError (ELOOP) if it is a
    symbolic link, (EINVAL) if it is not a regular file (a directory, a FIFO)."""
    return open_regular(path)[0]


def open_regular(path: str) -> tuple[int, os.stat_result]:
    """``open_for_reading`` and the file's ``fstat``."""
    fd = os.open(path, _READ_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_file(path: str) -> bytes:
    """The whole content of ``path`` (never through a symbolic link)."""
    fd = open_for_reading(path)
    try:
        chunks: list[bytes] = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def is_regular(path: str) -> bool:
    """Whether ``path`` names a regular file itself (not a link, a directory, a FIFO)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def free_name(directory: str, name: str) -> str:
    """``directory``/``name``, or with the first numeric suffix (``name.1``, ...)
    that names nothing there yet."""
    target = os.path.join(directory, name)
    n = 0
    while os.path.lexists(target):
        n += 1
        target = os.path.join(directory, f"{name}.{n}")
    return target


def set_aside(directory: str, names: list[str], why: str) -> list[str]:
    """Move entries of ``directory`` into its ``lost/`` (never deleted), logging
    each; returns where each went.  A name already taken there gets a numeric
    suffix; a name gone meanwhile is skipped.  Both directories are fsynced."""
    if not names:
        return []
    lost = os.path.join(directory, LOST_NAME)
    os.makedirs(lost, exist_ok=True)
    if os.path.islink(lost) or not os.path.isdir(lost):
        raise NotADatabaseError(f"{lost} is not a directory")
    moved = []
    for name in names:
        target = free_name(lost, name)
        try:
            os.rename(os.path.join(directory, name), target)
        except FileNotFoundError:
            continue
        log.warning("%s: %s; set aside in %s", os.path.join(directory, name), why, target)
        moved.append(target)
    fsync_dir(lost)
    fsync_dir(directory)
    return moved


def clear_for_file(path: str) -> None:
    """Make room for a regular file lsmdb creates or renames to ``path``:
    anything else under that name -- a directory, a FIFO, a socket, a
    symbolic link -- is set aside in ``lost/`` (a planted name must neither
    block the database nor be written through); a regular file stays."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        set_aside(os.path.dirname(path) or ".", [os.path.basename(path)],
                  "not a regular file where lsmdb keeps one of its own")


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write every byte of ``data`` (``os.write`` may write fewer than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def exists(path: str) -> bool:
    """Whether the name exists in its directory (a dangling link counts)."""
    return os.path.lexists(path)


def unlink_quietly(path: str) -> None:
    """Remove a file no state needs any more, if it is there.

    An error is logged, not raised: every caller either has switched to a
    state without the file (which a read-write open sweeps if it is still
    there) or is cleaning up after another error, which must stay the one
    reported.
    """
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove %s: %s (a later open removes it)", path, exc)


def fsync_file(path: str) -> None:
    """fsync the regular file ``path`` (one another process wrote)."""
    fd = open_for_reading(path)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    """fsync a directory so that entries created, renamed or removed in it persist."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileWriter:
    """Writes a new file through ``os.write``, ``buffer_bytes`` at a time.

    ``write`` collects; the file sees the bytes once ``buffer_bytes`` are
    collected, at ``flush`` and at ``sync`` (flush, then fsync); a write of
    ``buffer_bytes`` or more goes out at once, after what was collected.  ``close``
    does not flush: a file abandoned half written is unlinked by its owner.
    """

    __slots__ = ("path", "fd", "_buffer", "_limit")

    def __init__(self, path: str, buffer_bytes: int = 0) -> None:
        self.path = path
        self.fd = create(path)
        self._buffer = bytearray()
        self._limit = buffer_bytes

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._limit and len(data) >= self._limit:  # a large write goes straight out
            self.flush()
            write_all(self.fd, data)
        elif self._limit:
            self._buffer += data
            if len(self._buffer) >= self._limit:
                self.flush()
        else:
            write_all(self.fd, data)
        return len(data)

    def flush(self) -> None:
        if self._buffer:
            write_all(self.fd, self._buffer)
            self._buffer = bytearray()

    def sync(self) -> None:
        self.flush()
        os.fsync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> FileWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_file_durably(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically: new temp file, fsync, rename, fsync dir.

    A leftover temp file is removed first, and anything else under either
    name (a directory, a FIFO, a link) set aside in ``lost/``
    (:func:`clear_for_file`): the temp file is always a new file.  Raises
    SwitchedButNotSynced when only the last step failed.
    """
    directory = os.path.dirname(path) or "."
    tmp = path + TMP_SUFFIX
    if exists(tmp):
        clear_for_file(tmp)
        unlink_quietly(tmp)
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            clear_for_file(path)  # a rename over a directory fails; over a link replaces the link
    except FileNotFoundError:
        pass
    with FileWriter(tmp) as f:
        try:
            f.write(data)
            f.sync()
        except BaseException:
            unlink_quietly(tmp)
            raise
    os.replace(tmp, path)
    try:
        fsync_dir(directory)
    except OSError as exc:
        raise SwitchedButNotSynced(exc.errno, f"{path} replaced, but fsync of its directory "
                                              f"failed: {exc.strerror}") from exc
