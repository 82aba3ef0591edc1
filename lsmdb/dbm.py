"""lsmdb behind the interface of the standard library's ``dbm`` modules.

:func:`open` takes the ``dbm`` flags and returns a :class:`Database`, a
mutable mapping from ``bytes`` to ``bytes`` over the default table of an lsmdb
database, so code written for ``dbm.gnu``, ``dbm.ndbm`` or ``dbm.dumb`` (and
``shelve``) can run on lsmdb unchanged.  As in those modules, ``str`` keys and
values are stored UTF-8 encoded, keys come back as ``bytes`` and every failure
of the store itself is an :class:`error`, which is an ``OSError``.

An lsmdb database is a directory, not a file: ``file`` names that directory.

    >>> import lsmdb.dbm, shelve, tempfile, os
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "cache")
    >>> with lsmdb.dbm.open(path, "c") as d:
    ...     d["colour"] = "blue"
    ...     d[b"empty"] = b""
    ...     (d[b"colour"], d.keys(), len(d))
    (b'blue', [b'colour', b'empty'], 2)
    >>> with lsmdb.dbm.open(path, "r") as d:
    ...     d["new"] = "x"  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    lsmdb.dbm.error: ...opened read-only...
    >>> with lsmdb.dbm.open_shelf(os.path.join(tmp.name, "shelf")) as s:
    ...     s["config"] = {"retries": 3}
    >>> with lsmdb.dbm.open_shelf(os.path.join(tmp.name, "shelf"), "r") as s:
    ...     s["config"]
    {'retries': 3}
    >>> tmp.cleanup()
"""

from __future__ import annotations

import errno
import os
import shelve
import stat
import threading
from collections.abc import Iterator, MutableMapping
from typing import Any, Union

from .db import DB
from .db import open as _open_db
from .errors import DatabaseLockedError, LsmdbError
from .files import LOCK_NAME, MANIFEST_NAME, OWN_NAME_RE
from .lockfile import DatabaseLock

__all__ = ["Database", "error", "open", "open_shelf"]

PathArg = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

#: Flag ``"n"`` deletes a directory's contents only when every entry is one
#: of the names lsmdb keeps in a database directory.
_LSMDB_FILE_RE = OWN_NAME_RE

# clear() deletes in batches of at most this many keys / bytes of keys.
_CLEAR_BATCH_KEYS = 10_000
_CLEAR_BATCH_BYTES = 16 * 1024 * 1024


class error(LsmdbError, OSError):
    """Raised for every failure of an :mod:`lsmdb.dbm` database.

    A subclass of ``OSError`` (as the standard library's ``dbm`` errors are
    caught) and of :class:`lsmdb.LsmdbError`.  Opening a database that does
    not exist with flag ``"r"`` or ``"w"`` raises it with ``errno`` set to
    ``ENOENT`` and ``filename`` set to the path.  The lsmdb exception it stands
    for, if any, is its ``__cause__``.

        >>> import lsmdb.dbm, tempfile, os
        >>> tmp = tempfile.TemporaryDirectory()
        >>> try:
        ...     lsmdb.dbm.open(os.path.join(tmp.name, "missing"), "w")
        ... except OSError as exc:
        ...     (type(exc).__name__, exc.errno == errno.ENOENT)
        ('error', True)
        >>> tmp.cleanup()
    """


def _as_bytes(obj: Any, what: str) -> bytes:
    if isinstance(obj, bytes):
        return obj
    if isinstance(obj, str):
        return obj.encode("utf-8")
    if isinstance(obj, (bytearray, memoryview)):
        return bytes(obj)
    raise TypeError(f"lsmdb.dbm {what}s must be bytes or str, not {type(obj).__name__}")


def _wrap(exc: BaseException) -> error:
    """The :class:`error` to raise for ``exc`` (an LsmdbError or OSError)."""
    if isinstance(exc, error):
        return exc
    if isinstance(exc, OSError) and exc.errno is not None:
        return error(exc.errno, exc.strerror or str(exc), exc.filename)
    return error(str(exc))


class Database(MutableMapping):
    """An open :mod:`lsmdb.dbm` database; create it with :func:`lsmdb.dbm.open`.

    A mutable mapping over the default table of an lsmdb database with the
    behaviour of the standard library's ``dbm`` objects:

    * keys and values are ``bytes``; ``str`` is accepted and stored UTF-8
      encoded; anything else is a ``TypeError``;
    * ``d[key]`` and ``del d[key]`` raise ``KeyError`` for an absent key, and
      the empty value ``b""`` is a value like any other (not an absent key);
    * :meth:`keys` returns a list, in key order (iteration is in key order
      too, over a snapshot taken when it starts, so the mapping may be changed
      while iterating);
    * a database opened with flag ``"r"`` raises :class:`error` on every
      write, and every operation after :meth:`close` raises :class:`error`.

    ``len()`` counts the keys with one scan the first time and then keeps the
    count up to date with this object's own writes (nobody else can write:
    a writable database is locked by this process, and a read-only one is a
    view as of opening).  Safe to share between threads.

        >>> import lsmdb.dbm, tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> d = lsmdb.dbm.open(tmp.name + "/db", "c")
        >>> d[b"b"] = b"2"; d["a"] = "1"
        >>> (list(d), b"a" in d, "a" in d, d.get(b"zz"), len(d))
        ([b'a', b'b'], True, True, None, 2)
        >>> del d[b"a"]; d.close(); tmp.cleanup()
    """

    def __init__(self, db: DB, *, read_only: bool) -> None:
        """Wrap an open :class:`lsmdb.DB` (use :func:`lsmdb.dbm.open` instead).

            >>> import lsmdb, lsmdb.dbm, tempfile
            >>> tmp = tempfile.TemporaryDirectory()
            >>> d = lsmdb.dbm.Database(lsmdb.open(tmp.name), read_only=False)
            >>> d[b"k"] = b"v"; d.close(); tmp.cleanup()
        """
        self._db = db
        self._read_only = bool(read_only)
        self._closed = False
        self._count: int | None = None
        self._dirty = False  # written since opening or the last sync()
        # Serialises writes with the bookkeeping of the cached count.
        self._lock = threading.RLock()

    # ------------------------------------------------------------- helpers
    def _check_open(self) -> DB:
        if self._closed:
            raise error("the lsmdb.dbm database has already been closed")
        return self._db

    def _check_writable(self) -> DB:
        db = self._check_open()
        if self._read_only:
            raise error(f"the database {db.path} was opened read-only (flag 'r')")
        return db

    def _lookup(self, key: bytes) -> bytes | None:
        db = self._check_open()
        try:
            return db.get(key)
        except error:
            raise
        except (LsmdbError, OSError) as exc:
            raise _wrap(exc) from exc

    # --------------------------------------------------------------- reads
    def __getitem__(self, key: bytes | str) -> bytes:
        value = self._lookup(_as_bytes(key, "key"))
        if value is None:
            raise KeyError(key)
        return value

    def get(self, key: bytes | str, default: Any = None) -> Any:
        """The value of ``key``, or ``default`` when it is absent.

            >>> import lsmdb.dbm, tempfile
            >>> tmp = tempfile.TemporaryDirectory()
            >>> with lsmdb.dbm.open(tmp.name + "/db", "c") as d:
            ...     d[b"k"] = b""
            ...     (d.get(b"k"), d.get(b"x"), d.get(b"x", b"-"))
            (b'', None, b'-')
            >>> tmp.cleanup()
        """
        value = self._lookup(_as_bytes(key, "key"))
        return default if value is None else value

    def __contains__(self, key: object) -> bool:
        return self._lookup(_as_bytes(key, "key")) is not None

    def __iter__(self) -> Iterator[bytes]:
        db = self._check_open()
        try:
            rows = db.scan()  # the snapshot is taken here, not at the first next()
        except error:
            raise
        except (LsmdbError, OSError) as exc:
            raise _wrap(exc) from exc
        return self._keys_of(rows)

    def _keys_of(self, rows: Iterator[tuple[bytes, bytes]]) -> Iterator[bytes]:
        try:
            for key, _value in rows:
                if self._closed:
                    raise error("the lsmdb.dbm database was closed during iteration")
                yield key
        except error:
            raise
        except (LsmdbError, OSError) as exc:
            raise _wrap(exc) from exc

    def keys(self) -> list[bytes]:  # type: ignore[override]
        """Every key, as a list in key order (as the stdlib ``dbm`` modules return).

            >>> import lsmdb.dbm, tempfile
            >>> tmp = tempfile.TemporaryDirectory()
            >>> with lsmdb.dbm.open(tmp.name + "/db", "c") as d:
            ...     d[b"b"] = b"2"; d[b"a"] = b"1"
            ...     d.keys()
            [b'a', b'b']
            >>> tmp.cleanup()
        """
        return list(self)

    def __len__(self) -> int:
        with self._lock:
            if self._count is None:
                count = 0
                for _key in self:
                    count += 1
                # Kept while writes update it -- unless values may expire,
                # which changes the count without a write.
                expiring = self._db._default_state.may_expire()
                self._count = None if expiring else count
                return count
            self._check_open()
            return self._count

    def __bool__(self) -> bool:
        for _key in self:
            return True
        return False

    # -------------------------------------------------------------- writes
    def __setitem__(self, key: bytes | str, value: bytes | str) -> None:
        k = _as_bytes(key, "key")
        v = _as_bytes(value, "value")
        with self._lock:
            db = self._check_writable()
            self._dirty = True
            try:
                existed = True if self._count is None else db.get(k) is not None
                db.put(k, v)
            except BaseException as exc:
                self._count = None  # the write may or may not have happened
                if isinstance(exc, (LsmdbError, OSError)) and not isinstance(exc, error):
                    raise _wrap(exc) from exc
                raise
            if not existed and self._count is not None:
                self._count += 1

    def __delitem__(self, key: bytes | str) -> None:
        k = _as_bytes(key, "key")
        with self._lock:
            db = self._check_writable()
            if self._lookup(k) is None:
                raise KeyError(key)
            self._dirty = True
            try:
                db.delete(k)
            except BaseException as exc:
                self._count = None
                if isinstance(exc, (LsmdbError, OSError)) and not isinstance(exc, error):
                    raise _wrap(exc) from exc
                raise
            if self._count is not None:
                self._count -= 1

    def setdefault(self, key: bytes | str,  # type: ignore[override]
                   default: bytes | str = b"") -> Any:
        """``d[key]`` if ``key`` is present, else store ``default`` and return it.

            >>> import lsmdb.dbm, tempfile
            >>> tmp = tempfile.TemporaryDirectory()
            >>> with lsmdb.dbm.open(tmp.name + "/db", "c") as d:
            ...     (d.setdefault(b"k", b"first"), d.setdefault(b"k", b"second"), d[b"k"])
            (b'first', b'first', b'first')
            >>> tmp.cleanup()
        """
        k = _as_bytes(key, "key")
        with self._lock:
            value = self._lookup(k)
            if value is not None:
                return value
            self[k] = default
            return default

    def clear(self) -> None:
        """Delete every key.

        Deletes in batches of up to 10,000 keys, each batch atomic; if it fails
        half way, the keys of the batches already written stay deleted.

            >>> import lsmdb.dbm, tempfile
            >>> tmp = tempfile.TemporaryDirectory()
            >>> with lsmdb.dbm.open(tmp.name + "/db", "c") as d:
            ...     d.update({b"a": b"1", b"b": b"2"})
            ...     d.clear()
            ...     (len(d), d.keys())
            (0, [])
            >>> tmp.cleanup()
        """
        with self._lock:
            db = self._check_writable()
            self._dirty = True
            try:
                batch = db.batch()
                size = 0
                for key, _value in db.scan():  # a snapshot: deleting below is safe
                    batch.delete(key)
                    size += len(key) + 16
                    if len(batch) >= _CLEAR_BATCH_KEYS or size >= _CLEAR_BATCH_BYTES:
                        batch.commit()
                        batch = db.batch()
                        size = 0
                batch.commit()
            except BaseException as exc:
                self._count = None
                if isinstance(exc, (LsmdbError, OSError)) and not isinstance(exc, error):
                    raise _wrap(exc) from exc
                raise
            self._count = 0

    def sync(self) -> None:
        """Make every write so far durable: fsync the write-ahead log.

        Writes already survive a crash of the process without it (they are
        in the write-ahead log); ``sync()`` makes them survive a crash of the
        machine too, as ``close()`` does.  A no-op for a read-only database
        and when nothing was written since opening or the last ``sync()``.

            >>> import lsmdb.dbm, tempfile
            >>> tmp = tempfile.TemporaryDirectory()
            >>> with lsmdb.dbm.open(tmp.name + "/db", "c") as d:
            ...     d[b"k"] = b"v"
            ...     d.sync()
            >>> tmp.cleanup()
        """
        with self._lock:
            db = self._check_open()
            if self._read_only or not self._dirty:
                return
            try:
                db.sync()
                self._dirty = False
            except error:
                raise
            except (LsmdbError, OSError) as exc:
                raise _wrap(exc) from exc

    # ----------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Close the database (syncing its log) and release its lock.  Idempotent.

            >>> import lsmdb.dbm, tempfile
            >>> tmp = tempfile.TemporaryDirectory()
            >>> d = lsmdb.dbm.open(tmp.name + "/db", "c")
            >>> d.close(); d.close()
            >>> d.keys()
            Traceback (most recent call last):
            ...
            lsmdb.dbm.error: the lsmdb.dbm database has already been closed
            >>> tmp.cleanup()
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._db.close()
            except error:
                raise
            except (LsmdbError, OSError) as exc:
                raise _wrap(exc) from exc

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    @property
    def path(self) -> str:
        """Absolute path of the database directory."""
        return self._db.path

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Like the stdlib's dbm objects, release the database when dropped
        # without close(): the lock would otherwise be held until exit.
        if getattr(self, "_closed", True):
            return
        try:
            self.close()
        except (LsmdbError, OSError):
            pass  # nothing to report to at garbage collection

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("read-only" if self._read_only else "read-write")
        return f"<lsmdb.dbm.Database {self._db.path!r} {state}>"


_FLAGS = ("r", "w", "c", "n")


def open(file: PathArg, flag: str = "r", mode: int = 0o666) -> Database:
    """Open the lsmdb database in directory ``file`` with a stdlib ``dbm`` flag.

    ``file`` is a ``str``, ``bytes`` or path-like object.  ``flag``:

    ``"r"``
        read-only (the default): every write raises :class:`error`.  Takes no
        lock, so it works while another process has the database open, and
        sees the data as of opening.
    ``"w"``
        read and write an existing database.
    ``"c"``
        read and write, creating the database if the path does not exist.
    ``"n"``
        always start from a new, empty database:

        - nothing at ``file``: it is created;
        - an lsmdb database (or an empty directory), i.e. a directory whose
          entries are all lsmdb's own files (``MANIFEST``, ``LOCK``,
          ``STATS``, ``FILTER_KEY``, ``NNNNNN.sst``, ``wal-NNNNNN.log``, their
          ``.tmp`` files): those files are deleted while holding the
          database's lock, so a database open for writing (in this or another
          process) is left alone and :class:`error` is raised; the directory
          itself is kept;
        - a regular file (a database is a directory; the stdlib modules
          would overwrite the file too): it is removed;
        - a symbolic link: one to a directory counts as that directory (as
          for every flag, lsmdb follows it); any other link is removed itself,
          never what it points to;
        - a directory holding anything else, or any other kind of file (a
          device, a FIFO, a socket): **nothing is deleted**, :class:`error`
          is raised -- "n" will not wipe a directory it did not create.

    Opening with ``"r"`` or ``"w"`` where there is no database raises
    :class:`error` (``errno`` ``ENOENT`` if the path does not exist); an
    unknown flag is a ``ValueError``.

    ``mode`` gives the permission bits of the database directory when this
    call creates it (adding the search bit wherever read is granted, since it
    is a directory), less the process umask; the files inside are created
    with lsmdb's own modes.  As with the stdlib modules, the parent directory
    must exist.

        >>> import lsmdb.dbm, tempfile, pathlib
        >>> tmp = pathlib.Path(tempfile.mkdtemp())
        >>> with lsmdb.dbm.open(tmp / "db", "c") as d:
        ...     d[b"k"] = b"v"
        >>> with lsmdb.dbm.open(tmp / "db", "n") as d:    # starts empty again
        ...     d.keys()
        []
        >>> import shutil; shutil.rmtree(tmp)
    """
    if not isinstance(flag, str) or flag not in _FLAGS:
        raise ValueError(f"flag must be one of 'r', 'w', 'c' or 'n', not {flag!r}")
    if isinstance(mode, bool) or not isinstance(mode, int):
        raise TypeError(f"mode must be an int, not {type(mode).__name__}")
    path = os.fsdecode(os.fspath(file))
    try:
        if flag == "n":
            _make_room(path)
        if flag in ("c", "n") and not os.path.lexists(path):
            dir_mode = (mode | ((mode & 0o444) >> 2)) & 0o7777
            try:
                os.mkdir(path, dir_mode)
            except FileExistsError:
                pass  # created meanwhile: lsmdb.open decides what it is
        elif flag in ("r", "w") and not os.path.lexists(path):
            raise error(errno.ENOENT, "no lsmdb database", path)
        db = _open_db(path, create_if_missing=flag in ("c", "n"), read_only=flag == "r")
    except error:
        raise
    except (LsmdbError, OSError) as exc:
        raise _wrap(exc) from exc
    return Database(db, read_only=flag == "r")


def _make_room(path: str) -> None:
    """Remove what sits at ``path`` so flag "n" starts empty (see :func:`open`)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
        if stat.S_ISLNK(st.st_mode) and os.path.isdir(path):
            _empty_database_dir(path)  # a link to a directory: treat as that directory
        else:
            os.unlink(path)
        return
    if stat.S_ISDIR(st.st_mode):
        _empty_database_dir(path)
        return
    raise error(f"{path} is neither a directory nor a regular file; "
                "flag 'n' will not replace it")


def _empty_database_dir(path: str) -> None:
    names = os.listdir(path)
    foreign = sorted(n for n in names
                     if not _LSMDB_FILE_RE.match(n) or not os.path.isfile(os.path.join(path, n))
                     or os.path.islink(os.path.join(path, n)))
    if foreign:
        shown = ", ".join(repr(n) for n in foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise error(f"{path} is a directory but not an lsmdb database (it holds {shown}); "
                    "flag 'n' does not delete it: remove it yourself or choose another path")
    if not names:
        return
    # Hold the database's lock while deleting, as lsmdb.open would: a database
    # open (for writing) anywhere else makes this fail instead of vanishing.
    try:
        lock = DatabaseLock(path)
    except DatabaseLockedError:
        raise error(f"{path} is open in another lsmdb.open() (this or another "
                    "process); flag 'n' cannot replace it now") from None
    try:
        # MANIFEST first: an interrupted run leaves no half database behind,
        # only lsmdb files that a later "n" deletes.
        for name in sorted(names, key=lambda n: (not n.startswith(MANIFEST_NAME), n)):
            if name != LOCK_NAME:
                try:
                    os.unlink(os.path.join(path, name))
                except FileNotFoundError:
                    pass
    finally:
        lock.release()


def open_shelf(file: PathArg, flag: str = "c", protocol: int | None = None,
               writeback: bool = False) -> shelve.Shelf:
    """A :class:`shelve.Shelf` (values are pickled objects) stored in an lsmdb database.

    The same as ``shelve.Shelf(lsmdb.dbm.open(file, flag), protocol, writeback)``;
    see :func:`open` for ``flag``.  Keys are ``str``.

        >>> import lsmdb.dbm, tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> with lsmdb.dbm.open_shelf(tmp.name + "/shelf") as s:
        ...     s["point"] = (1, 2)
        ...     s["point"], len(s), "point" in s
        ((1, 2), 1, True)
        >>> tmp.cleanup()
    """
    return shelve.Shelf(open(file, flag), protocol=protocol, writeback=writeback)
