"""Exceptions raised by lsmdb.

Every error lsmdb raises on purpose is an :class:`LsmdbError` (or a plain
``TypeError``/``ValueError`` for bad arguments).  Errors about data read from
disk name the file and, where it is known, the byte offset.
"""

from __future__ import annotations


class LsmdbError(Exception):
    """Base class of every lsmdb-specific error."""


class CorruptionError(LsmdbError):
    """Data on disk failed a checksum or could not be decoded.

    ``path`` is the file and ``offset`` the byte offset where the bad data
    starts (``None`` when the whole file is affected).
    """

    def __init__(self, message: str, path: str | None = None, offset: int | None = None) -> None:
        where = ""
        if path is not None:
            where = f" [{path}" + (f" @ offset {offset}" if offset is not None else "") + "]"
        super().__init__(message + where)
        self.message = message
        self.path = path
        self.offset = offset

    def __reduce__(self) -> tuple[type, tuple[str, str | None, int | None]]:
        return (type(self), (self.message, self.path, self.offset))


class UnsupportedFormatError(LsmdbError):
    """A file was written by a newer (or unknown) lsmdb format version."""


class NotADatabaseError(LsmdbError):
    """The directory exists but does not hold an lsmdb database."""


class DatabaseLockedError(LsmdbError):
    """Another ``lsmdb.open`` (in this or another process) holds the database."""


class DatabaseClosedError(LsmdbError):
    """The database (or an object bound to it) was used after ``close()``."""


class DatabaseForkedError(DatabaseClosedError):
    """A handle opened before ``fork()`` was used in the child: open the database there."""


class TableExistsError(LsmdbError):
    """``create_table`` was asked for a name that already exists."""


class NoSuchTableError(LsmdbError, KeyError):
    """The named table does not exist."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "no such table"


class ReadOnlyError(LsmdbError):
    """A write was attempted on a database opened with ``read_only=True``."""
