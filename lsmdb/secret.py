"""The per-database secret behind keyed filter hashing (``bloom_filter_hash="keyed"``).

``FILTER_KEY`` holds 32 random bytes, created with mode 0600 the first time
a table asks for keyed hashing.  It is never written into an SSTable: filter
headers record only the hash algorithm and a 4-byte key id derived from it.
Losing, replacing or damaging the file -- or anything that keeps it from
being read (it is unreadable, a directory, a FIFO, a link) -- makes keyed
filters fail open ("maybe"), never answer wrongly, and never keeps the
database from opening.
"""

from __future__ import annotations

import errno
import logging
import os

from .files import SECRET_NAME, create, fsync_dir, read_file, set_aside, write_all
from .filters.hashing import Hasher, keyed_hasher

log = logging.getLogger("lsmdb")

SECRET_SIZE_BYTES = 32


def load_secret(directory: str) -> Hasher | None:
    """The keyed hasher of the database at ``directory``, or None if it has no
    usable secret: missing, unreadable, not a regular file, or of the wrong
    size (each but a missing one logged).  Keyed filters then fail open."""
    path = os.path.join(directory, SECRET_NAME)
    try:
        secret = read_file(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        why = ("is a symbolic link (never followed)" if exc.errno == errno.ELOOP
               else f"cannot be read ({exc.strerror or exc})")
        log.warning("%s %s; keyed filters fail open", path, why)
        return None
    if len(secret) != SECRET_SIZE_BYTES:
        log.warning("%s: filter secret has %d bytes, expected %d; keyed filters fail open",
                    path, len(secret), SECRET_SIZE_BYTES)
        return None
    return keyed_hasher(secret)


#: Read errors that say nothing about the file itself (an I/O error, no
#: descriptors or memory left): the secret is not replaced for them.
TRANSIENT_ERRNOS = frozenset({errno.EIO, errno.EMFILE, errno.ENFILE, errno.ENOMEM,
                              errno.EAGAIN, errno.EINTR, errno.ENOSPC})


def create_secret(directory: str) -> Hasher:
    """The hasher of ``FILTER_KEY``: the one there if it reads now (an open that
    could not read it, on a transient error, left the database without it),
    else a new one, created (mode 0600, fsynced).

    An unusable one already there is moved aside to ``FILTER_KEY.damaged``
    first (into ``lost/`` when that name cannot take it): filters built with it
    fail open either way, and the old bytes are kept.  A transient error
    reading it (TRANSIENT_ERRNOS) is raised: a secret that filters were built
    with is never replaced for one.
    """
    path = os.path.join(directory, SECRET_NAME)
    try:
        secret = read_file(path)
    except FileNotFoundError:
        secret = None
    except OSError as exc:
        if exc.errno in TRANSIENT_ERRNOS:
            raise
        secret = None
    if secret is not None and len(secret) == SECRET_SIZE_BYTES:
        # An earlier try may have failed before its fsyncs: make it durable now.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(directory)
        return keyed_hasher(secret)
    if os.path.lexists(path):
        log.warning("%s: replacing an unusable filter secret (kept as %s.damaged)", path,
                    SECRET_NAME)
        try:
            os.replace(path, path + ".damaged")
        except OSError:  # FILTER_KEY.damaged is a directory, or the secret is one
            set_aside(directory, [SECRET_NAME], "unusable filter secret")
    secret = os.urandom(SECRET_SIZE_BYTES)
    fd = create(path, 0o600)
    try:
        write_all(fd, secret)
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(directory)
    return keyed_hasher(secret)
