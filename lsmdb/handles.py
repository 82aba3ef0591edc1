"""What a user holds besides the DB: a :class:`Table`, and a :class:`WriteBatch`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .errors import NoSuchTableError
from .keys import MAX_KEY_SIZE_BYTES, MAX_VALUE_SIZE_BYTES, as_key, as_value
from .mapping import ScanMapping
from .options import TableOptions
from .readpath import get_many, state_getter
from .scan import ScanIterator, scan
from .table import TableState
from .ttl import MAX_TTL_SECONDS, expires_at, validate_ttl
from .versions import Versions
from .writepath import WritePath


def with_ttl(state: TableState, value: bytes, ttl: Any) -> Any:
    """``value`` as a put with ``ttl`` stores it in ``state``'s table: itself, or
    (value, expires) when it expires -- after ``ttl`` seconds, or (``ttl``
    None) the table's ``default_time_to_live``; 0 never (lsmdb.ttl)."""
    if ttl is None:
        ttl = state.options.default_time_to_live
    elif (type(ttl) is not int and type(ttl) is not float) or not 0 <= ttl <= MAX_TTL_SECONDS:
        validate_ttl(ttl)  # raises: the common case costs two type checks and a range
    if not ttl:
        return value
    return value, expires_at(state.now_us(), ttl)


class Table(ScanMapping):
    """A named table of a database.  ``db.table(name)`` returns one.

    Iterates like a mapping (:class:`lsmdb.mapping.ScanMapping`): keys in key
    order, ``keys()``, ``values()``, ``items()`` lazily, ``len()`` by a scan (O(n)).

    Example:
        >>> import lsmdb, tempfile
        >>> with lsmdb.open(tempfile.mkdtemp()) as db:
        ...     users = db.create_table("users", bloom_filter_fp_chance=0.001)
        ...     users[b"alice"] = b"1"
        ...     (users[b"alice"], b"bob" in users, list(users), len(users))
        (b'1', False, [b'alice'], 1)
    """

    __slots__ = ("_state", "_versions", "_writes", "_flush", "name", "_put_one")

    def __init__(self, state: TableState, versions: Versions, writes: WritePath,
                 flush: Callable[[str], None]) -> None:
        self._state = state
        self._versions = versions
        self._writes = writes
        self._flush = flush
        self.name = state.name
        #: A put's common case whole (WritePath.put_one): False where it is not.
        self._put_one = writes.bind_put(state)

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(f"an lsmdb Table handle ({self.name!r}) cannot be pickled or sent to "
                        f"another process: open the database's path there and take the table "
                        f"with db.table({self.name!r})")

    def _live(self) -> TableState:
        follower = self._versions.follower
        if follower is not None:  # a following handle: a drop since is seen first
            follower.check()
        state = self._state
        if state.dropped:
            raise NoSuchTableError(f"table {self.name!r} was dropped")
        return state

    @property
    def options(self) -> TableOptions:
        """The table's effective options (defaults resolved)."""
        return self._live().options

    def put(self, key: Any, value: Any, sync: bool | None = None, ttl: Any = None) -> None:
        """Set ``key`` to ``value`` (fsync the WAL first if ``sync``).  ``ttl``:
        seconds until it reads as absent (None: the table's
        ``default_time_to_live``; 0: never)."""
        if sync is None and ttl is None and self._put_one(key, value):
            return
        state = self._live()
        if type(value) is not bytes or len(value) > MAX_VALUE_SIZE_BYTES:
            value = as_value(value)
        if type(key) is not bytes or len(key) > MAX_KEY_SIZE_BYTES:
            key = as_key(key)
        writes = self._writes
        if ttl is not None or state.options.default_time_to_live:
            stored = with_ttl(state, value, ttl)
            writes.write_columns(state, [key], [stored], sync, True)
        elif sync or (sync is None and writes.sync_default):
            writes.write_columns(state, [key], [value], sync)
        else:
            writes.put(state, key, value)

    def delete(self, key: Any, sync: bool | None = None) -> None:
        """Delete ``key`` (a tombstone; no error when it is absent)."""
        state = self._live()
        if type(key) is not bytes or len(key) > MAX_KEY_SIZE_BYTES:
            key = as_key(key)
        writes = self._writes
        if sync or (sync is None and writes.sync_default):
            writes.write_columns(state, [key], [None], sync)
        else:
            writes.put(state, key, None)

    def get(self, key: Any, default: Any = None) -> Any:
        """The value of ``key``, or ``default`` when it is absent."""
        state = self._state
        getter = state.getter
        if getter is None or state.dropped or self._versions.follower is not None:
            getter = state_getter(self._versions, self._live())
        return getter(key, default)

    def get_many(self, keys: Any) -> list[bytes | None]:
        """Values of many keys at once, None where absent (see ``DB.get_many``)."""
        return get_many(self._versions, self._live(), keys)

    def scan(self, start: Any = None, end: Any = None, prefix: Any = None,
             reverse: bool = False) -> ScanIterator:
        """(key, value) pairs with start <= key < end in key order (see ``DB.scan``)."""
        return scan(self._versions, self._live(), start, end, prefix, reverse)

    def _scan_expiring(self) -> tuple[ScanIterator, int]:
        """Every live entry, expiring values as (value, expires) tuples (an
        export's), and the clock when the scan's view was taken."""
        state = self._live()
        now_us = state.now_us()
        it = scan(self._versions, state, None, None, None, False, keep_expiring=True,
                  now_us=now_us)
        return it, now_us

    def flush(self) -> None:
        """Write this table's memtable to an SSTable now."""
        self._flush(self.name)

    def __getitem__(self, key: Any) -> bytes:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        self.put(key, value)

    def __delitem__(self, key: Any) -> None:
        if self.get(key) is None:
            raise KeyError(key)
        self.delete(key)

    def __contains__(self, key: Any) -> bool:
        state = self._state
        getter = state.getter
        if getter is None or state.dropped or self._versions.follower is not None:
            getter = state_getter(self._versions, self._live())
        return getter(key) is not None

    def __repr__(self) -> str:
        return f"<lsmdb.Table {self.name!r}>"


class WriteBatch:
    """Writes collected and applied atomically -- one WAL record -- on ``commit``.

    Use as ``with db.batch() as b:``; the batch commits on normal exit and is
    discarded if the block raises.  Keys and values are kept in two lists
    (and, once a second table appears, the table of each op in a third), so
    a put is two appends.  A put's time to live is counted from the put
    call, not the commit.
    """

    def __init__(self, writes: WritePath, resolve: Callable[[str | None], TableState],
                 sync: bool | None = None) -> None:
        self._writes = writes
        self._resolve = resolve  # table name (None: the default table) -> its state
        self._sync = sync
        self._keys: list[bytes] = []
        self._values: list[Any] = []
        self._states: list[TableState] | None = None  # None: every op is on the default table
        self._done = False
        self._expiring = False  # whether a value in it expires
        self._default = resolve(None)

    def put(self, key: Any, value: Any, table: str | None = None, ttl: Any = None) -> None:
        """Add a put of ``key`` in ``table`` (None: the default table) to the
        batch; ``ttl`` as for ``Table.put``."""
        if self._done:
            self._check()
        if type(key) is not bytes or len(key) > MAX_KEY_SIZE_BYTES:
            key = as_key(key)
        if type(value) is not bytes or len(value) > MAX_VALUE_SIZE_BYTES:
            value = as_value(value)
        if ttl is not None or table is not None or self._default.options.default_time_to_live:
            state = self._default if table is None else self._resolve(table)
            if ttl is not None or state.options.default_time_to_live:
                value = with_ttl(state, value, ttl)
                if type(value) is tuple:
                    self._expiring = True
        if table is None and self._states is None:
            self._keys.append(key)
            self._values.append(value)
        else:
            self._add(table, key, value)

    def delete(self, key: Any, table: str | None = None) -> None:
        """Add a delete of ``key`` in ``table`` (None: the default table) to the batch."""
        self._check()
        self._add(table, as_key(key), None)

    def _add(self, table: str | None, key: bytes, value: Any) -> None:
        state = self._default if table is None else self._resolve(table)
        if self._states is None:
            if state is self._default:
                self._keys.append(key)
                self._values.append(value)
                return
            self._states = [self._default] * len(self._keys)
        self._states.append(state)
        self._keys.append(key)
        self._values.append(value)

    def __len__(self) -> int:
        return len(self._keys)

    def _check(self) -> None:
        if self._done:
            raise ValueError("this batch was already committed or discarded")

    def commit(self) -> None:
        """Apply every operation as one WAL record; the batch cannot be reused."""
        self._check()
        self._done = True
        if not self._keys:
            return
        if self._states is None:
            self._writes.write_columns(self._default, self._keys, self._values, self._sync,
                                       self._expiring)
        else:
            self._writes.write(list(zip(self._states, self._keys, self._values, strict=True)),
                               self._sync, self._expiring)

    def discard(self) -> None:
        """Drop every operation; nothing is written."""
        self._done = True
        self._keys = []
        self._values = []
        self._states = None

    def __enter__(self) -> WriteBatch:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.discard()
