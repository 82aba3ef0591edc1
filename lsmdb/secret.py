"""The per-database secret behind keyed filter hashing (``bloom_filter_hash="keyed"``).

``FILTER_KEY`` holds 32 random bytes, created with mode 0600 the first time
a table asks for keyed hashing.  It is never written into an SSTable: filter
headers record only the hash algorithm and a 4-byte key id derived from it.
Losing or replacing the file makes keyed filters fail open ("maybe"), never
answer wrongly.
"""

from __future__ import annotations

import errno
import logging
import os

from .bloom import Hasher, keyed_hasher
from .files import SECRET_NAME, create, fsync_dir, read_file, write_all

log = logging.getLogger("lsmdb")

SECRET_SIZE_BYTES = 32


def load_secret(directory: str) -> Hasher | None:
    """The keyed hasher of the database at ``directory``, or None if it has no secret."""
    path = os.path.join(directory, SECRET_NAME)
    try:
        secret = read_file(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            # Not "no secret": a transient error must not make the next keyed
            # table replace a good secret.
            raise
        log.warning("%s is a symbolic link (never followed); keyed filters fail open", path)
        return None
    if len(secret) != SECRET_SIZE_BYTES:
        log.warning("%s: filter secret has %d bytes, expected %d; keyed filters fail open",
                    path, len(secret), SECRET_SIZE_BYTES)
        return None
    return keyed_hasher(secret)


def create_secret(directory: str) -> Hasher:
    """Create ``FILTER_KEY`` (mode 0600, fsynced) and return its hasher.

    An unusable one already there is moved aside to ``FILTER_KEY.damaged``
    first: filters built with it fail open either way.
    """
    path = os.path.join(directory, SECRET_NAME)
    if os.path.lexists(path):
        log.warning("%s: replacing an unusable filter secret (kept as %s.damaged)", path,
                    SECRET_NAME)
        os.replace(path, path + ".damaged")
    secret = os.urandom(SECRET_SIZE_BYTES)
    fd = create(path, 0o600)
    try:
        write_all(fd, secret)
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(directory)
    return keyed_hasher(secret)
