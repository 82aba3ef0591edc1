"""The database lock: one writing process at a time, one read-write open per process.

``LOCK`` carries a POSIX record lock (``fcntl`` ``F_SETLK``, what
``fcntl.lockf`` takes) while a read-write open holds the database.  Unlike
an ``flock``, such a lock is not inherited by a ``fork()`` child, so a child
that never touches the database holds nothing once its parent closes it.

POSIX locks belong to a process: a second lock from the same process always
succeeds, and closing *any* descriptor of the file drops the process's lock.
So this module keeps the opens of this process in a table keyed by the LOCK
file's identity (device, inode), looks a path up there before it opens the
file (a refused open never opens, and so never closes, a descriptor of a
LOCK this process holds), and it is the only code that opens LOCK.  A forked
child starts with an empty table: it holds no lock of its parent's.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading

from .errors import DatabaseLockedError
from .files import LOCK_NAME, clear_for_file

_held: dict[tuple[int, int], str] = {}
_guard = threading.Lock()
#: Descriptors of a LOCK this process holds that were opened anyway (the file
#: was replaced between the look-up and the open): never closed, since closing
#: one would drop the lock.
_parked: list[int] = []


def _forget_after_fork() -> None:
    global _guard
    _held.clear()
    _parked.clear()
    _guard = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_forget_after_fork)


class DatabaseLock:
    """The exclusive lock on the database in ``directory``; ``release()`` gives it back."""

    def __init__(self, directory: str) -> None:
        path = os.path.join(directory, LOCK_NAME)
        with _guard:
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                pass
            else:
                if (st.st_dev, st.st_ino) in _held:
                    raise DatabaseLockedError(f"{directory} is already open in this process")
            # A directory, FIFO or link planted as LOCK is no lock of anyone's
            # (lsmdb locks a regular file): it goes to lost/ rather than keep the
            # database from opening.
            clear_for_file(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            st = os.fstat(fd)
            ident = (st.st_dev, st.st_ino)
            with _guard:
                if ident in _held:
                    _parked.append(fd)
                    fd = -1
                    raise DatabaseLockedError(f"{directory} is already open in this process")
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    if exc.errno in (errno.EAGAIN, errno.EACCES):
                        raise DatabaseLockedError(
                            f"{directory} is open in another process") from None
                    raise
                _held[ident] = directory
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise
        self._fd = fd
        self._ident = ident

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        if self._fd < 0:
            return
        with _guard:
            if _held.get(self._ident) is not None:
                del _held[self._ident]
            os.close(self._fd)
            self._fd = -1

    def disown(self) -> None:
        """In a forked child: forget the descriptor without touching the parent's lock
        (closing it there is harmless: the child holds no POSIX lock)."""
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = -1
