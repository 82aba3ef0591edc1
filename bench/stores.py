"""The stores ``bench.peers`` compares: one adapter class per store, the same small API.

Each :class:`Store` loads the benchmark's items into a fresh directory,
reopens, and answers gets and an ordered scan as cheaply as its Python API
allows: lsmdb (its defaults), sqlite3 (stdlib) and, when installed with
``pip install 'lsmdb[peers]'``, LevelDB (plyvel), RocksDB (rocksdict) and lmdb.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import lsmdb

BATCH_KEYS = 10_000          # write-batch size for the stores that load through batches
FILTER_BITS_PER_KEY = 10     # LevelDB and RocksDB
FILTER_CHECK_GETS = 1_000    # absent gets of the RocksDB filter check

Getter = Callable[[bytes], "bytes | None"]


def batches(items: Sequence[tuple[bytes, bytes]]) -> Iterator[Sequence[tuple[bytes, bytes]]]:
    for lo in range(0, len(items), BATCH_KEYS):
        yield items[lo:lo + BATCH_KEYS]


def put_all(db: Any, items: Sequence[tuple[bytes, bytes]]) -> None:
    """``db.put(key, value)`` for each item, one call each, then ``db.close()``."""
    try:
        put = db.put
        for key, value in items:
            put(key, value)
    finally:
        db.close()


def timed_commits(batches: Sequence[Sequence[tuple[bytes, bytes | None]]],
                  new_batch: Callable[[], Any], commit: Callable[[Any], object]) -> float:
    """Build one write batch per item of ``batches`` (``new_batch()``, its
    ``put`` and ``delete``; value None: a delete), then ``commit`` each in
    order: the seconds the commits took."""
    built = []
    for ops in batches:
        batch = new_batch()
        for key, value in ops:
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        built.append(batch)
    start = time.perf_counter()
    for batch in built:
        commit(batch)
    return time.perf_counter() - start


def package_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


class Compacting:
    """A store holding data of its own to compact: ``compact()`` compacts all
    of it (returns when done); ``put(key, value)`` is the store's single put,
    into other keys (or another table)."""

    def __init__(self, put: Callable[[bytes, bytes], object], compact: Callable[[], object],
                 close: Callable[[], object]) -> None:
        self.put = put
        self.compact = compact
        self.close = close


class Store:
    """One store under test: ``load`` into a fresh directory, then ``open`` for reads.

    Subclasses set ``name`` (the --stores name), ``label`` (shown in tables)
    and, for optional peers, ``module`` (what must import) and ``extra``.
    """

    name = ""
    label = ""
    module: str | None = None

    def __init__(self, path: str, keys: int) -> None:
        self.path = path
        self.keys = keys

    @classmethod
    def missing(cls) -> str | None:
        """Why this store cannot run here (None: it can)."""
        if cls.module is None:
            return None
        try:
            __import__(cls.module)
        except ImportError as exc:
            return (f"{cls.label}: skipped, {cls.module} is not installed "
                    f"(pip install 'lsmdb[peers]'; import said: {exc})")
        return None

    def describe(self) -> str:
        return self.label

    def load(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        """Create the store, write ``items`` in the given order, close it."""
        raise NotImplementedError

    def put_each(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        """Create the store, write ``items`` one put each (the store's own
        single-key write, not synced), close it."""
        raise NotImplementedError

    def open(self) -> None:
        raise NotImplementedError

    def getter(self) -> Getter:
        """A callable key -> value or None, as cheap as the store's API allows."""
        raise NotImplementedError

    def scan(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) in key order."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def check(self, absent: Sequence[bytes]) -> str | None:
        """A store-specific check after the timed runs (None: nothing to say)."""
        return None

    def compacting(self, background: Sequence[tuple[bytes, bytes]]) -> Compacting | None:
        """Create the store holding ``background`` (keys of their own), ready
        to compact it (None: the store has no compaction to run)."""
        return None

    def commit_batches(self, batches: Sequence[Sequence[tuple[bytes, bytes | None]]]
                       ) -> float | None:
        """Open the loaded store, build one write batch per item of ``batches``
        (value None: a delete), then commit them in order: the seconds the
        commits took (building and closing not counted; flushes they set off
        counted), or None: no write batches to compare."""
        return None


class LsmdbStore(Store):
    name = "lsmdb"
    label = "lsmdb"

    def describe(self) -> str:
        defaults = lsmdb.TableOptions()
        return (f"lsmdb {lsmdb.__version__}, default options (fp chance "
                f"{defaults.bloom_filter_fp_chance:g}, {defaults.memtable_size_bytes >> 20} MiB "
                f"memtable); loaded through batches of {BATCH_KEYS:,}; load time includes "
                "waiting for background compactions")

    def load(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        db = lsmdb.open(self.path)
        try:
            for chunk in batches(items):
                with db.batch() as batch:
                    for key, value in chunk:
                        batch.put(key, value)
            wait = getattr(db, "wait_for_compactions", None)
            if wait is not None:
                wait()
        finally:
            db.close()

    def put_each(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        put_all(lsmdb.open(self.path), items)

    def compacting(self, background: Sequence[tuple[bytes, bytes]]) -> Compacting | None:
        db = lsmdb.open(self.path)
        db.create_table("background")
        for chunk in batches(background):
            with db.batch() as batch:
                for key, value in chunk:
                    batch.put(key, value, table="background")
        db.wait_for_compactions()
        return Compacting(db.put, lambda: db.compact("background"), db.close)

    def commit_batches(self, batches: Sequence[Sequence[tuple[bytes, bytes | None]]]
                       ) -> float | None:
        db = lsmdb.open(self.path)
        try:
            return timed_commits(batches, db.batch, lambda batch: batch.commit())
        finally:
            db.close()

    def open(self) -> None:
        self.db = lsmdb.open(self.path)

    def getter(self) -> Getter:
        get: Getter = self.db.get
        return get

    def scan(self) -> Iterator[tuple[bytes, bytes]]:
        return self.db.scan()

    def close(self) -> None:
        wait = getattr(self.db, "wait_for_compactions", None)
        if wait is not None:
            wait()
        self.db.close()

    def files(self) -> int:
        return len(self.db.sstables())


class SqliteStore(Store):
    name = "sqlite3"
    label = "sqlite3"
    _GET = "SELECT v FROM kv WHERE k = ?"

    def describe(self) -> str:
        return (f"sqlite3 (SQLite {sqlite3.sqlite_version}): WITHOUT ROWID table with a blob "
                "primary key, WAL, one transaction for the load")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(os.path.join(self.path, "kv.sqlite"))

    def load(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        conn = self._connect()
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("CREATE TABLE kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID")
            with conn:  # one transaction
                conn.executemany("INSERT INTO kv VALUES (?, ?)", items)
        finally:
            conn.close()

    def put_each(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        conn = self._connect()
        try:
            conn.isolation_level = None  # autocommit: a transaction per put
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")  # WAL mode: no fsync per commit
            conn.execute("CREATE TABLE kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID")
            execute = conn.execute
            for item in items:
                execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", item)
        finally:
            conn.close()

    def open(self) -> None:
        self.conn = self._connect()

    def getter(self) -> Getter:
        execute = self.conn.execute
        sql = self._GET

        def get(key: bytes) -> bytes | None:
            row = execute(sql, (key,)).fetchone()
            return None if row is None else row[0]
        return get

    def scan(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(self.conn.execute("SELECT k, v FROM kv ORDER BY k"))

    def close(self) -> None:
        self.conn.close()


class LevelDBStore(Store):
    name = "leveldb"
    label = "LevelDB (plyvel)"
    module = "plyvel"

    def describe(self) -> str:
        return (f"LevelDB via plyvel {package_version('plyvel')}, {FILTER_BITS_PER_KEY} bits/key "
                f"filter (given again at reopen); loaded through batches of {BATCH_KEYS:,}, "
                "then compact_range() (compactions settled, as lsmdb's load waits for them)")

    def _open(self, create: bool) -> Any:
        plyvel = importlib.import_module("plyvel")  # ships no type information for mypy
        return plyvel.DB(self.path, create_if_missing=create,
                         bloom_filter_bits=FILTER_BITS_PER_KEY)

    def load(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        db = self._open(create=True)
        try:
            for chunk in batches(items):
                with db.write_batch() as batch:
                    for key, value in chunk:
                        batch.put(key, value)
            db.compact_range()
        finally:
            db.close()

    def put_each(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        put_all(self._open(create=True), items)

    def compacting(self, background: Sequence[tuple[bytes, bytes]]) -> Compacting | None:
        db = self._open(create=True)
        for chunk in batches(background):
            with db.write_batch() as batch:
                for key, value in chunk:
                    batch.put(key, value)
        lo, hi = min(k for k, _ in background), max(k for k, _ in background)
        return Compacting(db.put, lambda: db.compact_range(start=lo, stop=hi + b"\0"),
                          db.close)

    def commit_batches(self, batches: Sequence[Sequence[tuple[bytes, bytes | None]]]
                       ) -> float | None:
        db = self._open(create=False)
        try:
            return timed_commits(batches, db.write_batch, lambda batch: batch.write())
        finally:
            db.close()

    def open(self) -> None:
        self.db = self._open(create=False)

    def getter(self) -> Getter:
        get: Getter = self.db.get
        return get

    def scan(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(self.db.iterator())

    def close(self) -> None:
        self.db.close()


class RocksDBStore(Store):
    name = "rocksdb"
    label = "RocksDB (rocksdict)"
    module = "rocksdict"

    def describe(self) -> str:
        return (f"RocksDB via rocksdict {package_version('rocksdict')}, {FILTER_BITS_PER_KEY} "
                f"bits/key full filter, options passed again per column family at reopen; "
                f"loaded through batches of {BATCH_KEYS:,}, then compact_range() (compactions "
                "settled)")

    @staticmethod
    def _options(statistics: bool = False) -> Any:
        from rocksdict import BlockBasedOptions, Options
        options = Options(raw_mode=True)
        table = BlockBasedOptions()
        table.set_bloom_filter(FILTER_BITS_PER_KEY, False)
        options.set_block_based_table_factory(table)
        options.create_if_missing(True)
        if statistics:
            options.enable_statistics()
        return options

    def _open(self, statistics: bool = False) -> tuple[Any, Any]:
        from rocksdict import Rdict
        options = self._options(statistics)
        # Without the per-column-family options, a reopened database uses
        # default table options: no filter, silently.
        return Rdict(self.path, options, column_families={"default": options}), options

    def load(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        from rocksdict import WriteBatch
        db, _ = self._open()
        try:
            for chunk in batches(items):
                batch = WriteBatch(raw_mode=True)
                for key, value in chunk:
                    batch.put(key, value)
                db.write(batch)
            db.compact_range(None, None)
        finally:
            db.close()

    def put_each(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        put_all(self._open()[0], items)

    def compacting(self, background: Sequence[tuple[bytes, bytes]]) -> Compacting | None:
        from rocksdict import WriteBatch
        db, _ = self._open()
        for chunk in batches(background):
            batch = WriteBatch(raw_mode=True)
            for key, value in chunk:
                batch.put(key, value)
            db.write(batch)
        lo, hi = min(k for k, _ in background), max(k for k, _ in background)
        return Compacting(db.put, lambda: db.compact_range(lo, hi + b"\0"), db.close)

    def commit_batches(self, batches: Sequence[Sequence[tuple[bytes, bytes | None]]]
                       ) -> float | None:
        from rocksdict import WriteBatch
        db, _ = self._open()
        try:
            return timed_commits(batches, lambda: WriteBatch(raw_mode=True), db.write)
        finally:
            db.close()

    def open(self) -> None:
        self.db, _ = self._open()

    def getter(self) -> Getter:
        get: Getter = self.db.get
        return get

    def scan(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(self.db.items())

    def close(self) -> None:
        self.db.close()

    def check(self, absent: Sequence[bytes]) -> str | None:
        """Reopen with statistics on and count the absent gets the filter answered."""
        db, options = self._open(statistics=True)
        try:
            get = db.get
            for key in absent[:FILTER_CHECK_GETS]:
                get(key)
            stats = options.get_statistics()
        finally:
            db.close()
        useful = None
        for line in stats.splitlines():
            if line.startswith("rocksdb.bloom.filter.useful "):
                useful = int(line.rsplit(":", 1)[1])
        probes = min(len(absent), FILTER_CHECK_GETS)
        if useful is None:
            return f"{self.label}: filter check inconclusive (no bloom statistics)"
        verdict = "filter in use after reopen" if useful else "FILTER NOT IN USE after reopen"
        return (f"{self.label}: {verdict}: it answered {useful:,} of {probes:,} absent gets "
                "(rocksdb.bloom.filter.useful)")


class LmdbStore(Store):
    name = "lmdb"
    label = "lmdb"
    module = "lmdb"

    def describe(self) -> str:
        import lmdb
        version = ".".join(map(str, lmdb.version()))
        return (f"lmdb {package_version('lmdb')} (LMDB {version}): one write transaction for "
                "the load, one read transaction for each workload")

    def _env(self, sync: bool = True) -> Any:
        import lmdb
        return lmdb.open(self.path, map_size=(64 << 20) + self.keys * 1024, sync=sync)

    def load(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        env = self._env()
        try:
            with env.begin(write=True) as txn:
                put = txn.put
                for key, value in items:
                    put(key, value)
        finally:
            env.close()

    def put_each(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        env = self._env(sync=False)  # as the others' single puts: no fsync each
        try:
            begin = env.begin
            for key, value in items:
                with begin(write=True) as txn:  # lmdb's single write: a transaction
                    txn.put(key, value)
        finally:
            env.close()

    def open(self) -> None:
        self.env = self._env()
        self.txn = self.env.begin()

    def getter(self) -> Getter:
        get: Getter = self.txn.get
        return get

    def scan(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(self.txn.cursor())

    def close(self) -> None:
        self.txn.abort()
        self.env.close()


STORES: tuple[type[Store], ...] = (LsmdbStore, SqliteStore, LevelDBStore, RocksDBStore, LmdbStore)
STORE_NAMES = tuple(s.name for s in STORES)
