"""lsmdb against the stores a user would pick instead, on the same keys and queries.

    python -m bench.peers [--keys N] [--stores NAME ...] [--json PATH]

Every store gets the same N keys (``b"user:%010d" % 2i``, 100-byte values)
in the same random order, is closed and reopened, and then answers the same
query sets: every present key, absent keys between present ones (odd
numbers: inside the key range), absent keys above the largest key (outside
it), and one full ordered scan.  Found counts are checked against what each
query set must find and the scan against the exact expected contents; a store
that answers wrongly is reported, not timed.

Stores: lsmdb (its defaults), sqlite3 (stdlib: WITHOUT ROWID table, blob
primary key, WAL, one transaction for the load) and, when installed with
``pip install 'lsmdb[peers]'``, LevelDB (plyvel, 10 bits/key filter), RocksDB
(rocksdict, 10 bits/key filter, options passed again at reopen) and lmdb.
A store that is not installed is skipped with a line saying so.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import random
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import lsmdb

from .common import (SLICES, Progress, Timer, describe_machine, fmt_rate, fmt_ratio,
                     load_average, machine_info, per_second, print_section, time_gets,
                     write_json)

KEY_FORMAT = b"user:%010d"
VALUE_BYTES = 100
DEFAULT_KEYS = 200_000
BATCH_KEYS = 10_000          # write-batch size for the stores that load through batches
FILTER_BITS_PER_KEY = 10     # LevelDB and RocksDB
VALUE_SAMPLE = 1_000         # present keys whose values are compared byte for byte
FILTER_CHECK_GETS = 1_000    # absent gets of the RocksDB filter check
SEED = 7
WORKLOADS = ("bulk_load", "get_present", "get_absent_in_range", "get_absent_out_of_range",
             "scan")
WORKLOAD_TITLES = {"bulk_load": "bulk load", "get_present": "get present",
                   "get_absent_in_range": "get absent in range",
                   "get_absent_out_of_range": "get absent out of range",
                   "scan": "ordered scan"}

Getter = Callable[[bytes], "bytes | None"]


def key_of(number: int) -> bytes:
    return KEY_FORMAT % number


def value_of(number: int) -> bytes:
    return (b"%010d" % number) * (VALUE_BYTES // 10)


def batches(items: Sequence[tuple[bytes, bytes]]) -> Iterator[Sequence[tuple[bytes, bytes]]]:
    for lo in range(0, len(items), BATCH_KEYS):
        yield items[lo:lo + BATCH_KEYS]


def package_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


# -------------------------------------------------------------------- stores
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
                f"filter (given again at reopen); loaded through batches of {BATCH_KEYS:,}")

    def _open(self, create: bool) -> Any:
        import plyvel
        return plyvel.DB(self.path, create_if_missing=create,
                         bloom_filter_bits=FILTER_BITS_PER_KEY)

    def load(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        db = self._open(create=True)
        try:
            for chunk in batches(items):
                with db.write_batch() as batch:
                    for key, value in chunk:
                        batch.put(key, value)
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
                f"loaded through batches of {BATCH_KEYS:,}")

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

    def _env(self) -> Any:
        import lmdb
        return lmdb.open(self.path, map_size=(64 << 20) + self.keys * 1024)

    def load(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        env = self._env()
        try:
            with env.begin(write=True) as txn:
                put = txn.put
                for key, value in items:
                    put(key, value)
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


# ----------------------------------------------------------------- workloads
class Data:
    """The keys, their load order and the query sets, the same for every store."""

    def __init__(self, keys: int) -> None:
        rng = random.Random(SEED)
        order = list(range(keys))
        rng.shuffle(order)
        self.keys = keys
        self.items = [(key_of(2 * i), value_of(2 * i)) for i in order]
        self.present = [key for key, _ in self.items]
        rng.shuffle(self.present)
        absent_in = [key_of(2 * i + 1) for i in range(keys - 1)]   # between present keys
        rng.shuffle(absent_in)
        self.absent_in_range = absent_in
        absent_out = [key_of(2 * keys + i) for i in range(keys)]   # above the largest key
        rng.shuffle(absent_out)
        self.absent_out_of_range = absent_out
        self.sample = rng.sample(range(keys), min(keys, VALUE_SAMPLE))

    def get_sets(self) -> list[tuple[str, list[bytes], int]]:
        """(workload, keys, how many of them must be found)."""
        return [("get_present", self.present, len(self.present)),
                ("get_absent_in_range", self.absent_in_range, 0),
                ("get_absent_out_of_range", self.absent_out_of_range, 0)]


def timed_scan(store: Store) -> tuple[int, float]:
    count = 0
    with Timer() as t:
        for _ in store.scan():
            count += 1
    return count, t.seconds


def check_values(store: Store, data: Data) -> str | None:
    """Untimed: the values of the sampled present keys, byte for byte."""
    get = store.getter()
    for i in data.sample:
        key, value = data.items[i]
        got = get(key)
        if got != value:
            return f"get({key!r}) returned {got!r:.60}, expected {value!r:.60}"
    return None


def check_scan(store: Store, data: Data) -> str | None:
    """Untimed: the full scan, item by item, against the expected sorted contents."""
    expected = iter(sorted(data.items))
    count = 0
    for key, value in store.scan():
        want = next(expected, None)
        if want is None or (bytes(key), bytes(value)) != want:
            expected_key = want[0] if want else "the end"
            return f"scan item {count} is {bytes(key)!r}, expected {expected_key!r}"
        count += 1
    if count != data.keys:
        return f"scan returned {count:,} items, expected {data.keys:,}"
    return None


def result(ops: int, seconds: float, found: int, expected: int,
           rate: float | None = None) -> dict[str, Any]:
    """One workload's entry; a wrong answer keeps its counts but loses its timing.

    ``rate`` defaults to ops / seconds; gets pass the median of their slices.
    """
    correct = found == expected
    return {"ops": ops, "seconds": seconds if correct else None,
            "ops_per_s": (per_second(ops, seconds) if rate is None else rate) if correct else None,
            "found": found, "expected_found": expected, "correct": correct,
            "error": None if correct else f"found {found:,}, expected {expected:,}"}


def mark_wrong(r: dict[str, Any], problem: str) -> None:
    r.update(correct=False, seconds=None, ops_per_s=None, error=problem)


def bench_store(cls: type[Store], data: Data, progress: Progress) -> dict[str, Any]:
    """Load, reopen, run every workload, verify; one store's entry of the report."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{cls.name}-") as path:
        store = cls(path, data.keys)
        entry: dict[str, Any] = {"store": cls.name, "label": cls.label, "available": True,
                                 "config": store.describe(), "skipped": None, "notes": []}
        start = time.perf_counter()
        store.load(data.items)
        load_seconds = time.perf_counter() - start
        progress(f"{cls.label}: loaded {data.keys:,} keys in {load_seconds:.1f}s")
        workloads = {"bulk_load": result(data.keys, load_seconds, data.keys, data.keys)}
        store.open()
        try:
            for name, keys, expected in data.get_sets():
                timing = time_gets(store.getter(), keys)
                workloads[name] = result(timing.gets, timing.seconds, timing.found, expected,
                                         timing.per_second)
                progress(f"{cls.label}: {WORKLOAD_TITLES[name]}: "
                         f"{fmt_rate(timing.per_second)} ops/s")
            count, seconds = timed_scan(store)
            workloads["scan"] = result(count, seconds, count, data.keys)
            bad_values = check_values(store, data)
            bad_scan = check_scan(store, data)
            if isinstance(store, LsmdbStore):
                entry["notes"].append(f"lsmdb: {store.files()} SSTables after reopen")
        finally:
            store.close()
        if bad_values:
            mark_wrong(workloads["get_present"], bad_values)
        if bad_scan:
            mark_wrong(workloads["scan"], bad_scan)
        if bad_values or bad_scan:  # the load is only as right as what reads back
            mark_wrong(workloads["bulk_load"], "the contents read back are wrong")
        for name in WORKLOADS:
            r = workloads[name]
            if not r["correct"]:
                entry["notes"].append(f"{cls.label}: WRONG ANSWER in {WORKLOAD_TITLES[name]}: "
                                      f"{r['error']} (not timed)")
        check = store.check(data.absent_in_range)
        if check:
            entry["notes"].append(check)
        entry["workloads"] = {name: workloads[name] for name in WORKLOADS}
    return entry


def add_ratios(entries: list[dict[str, Any]]) -> None:
    """Each store's ops/s divided by lsmdb's, per workload (None when either is missing)."""
    base = next((e for e in entries if e["store"] == "lsmdb" and e["available"]), None)
    for e in entries:
        for name, r in e.get("workloads", {}).items():
            ref = base["workloads"][name]["ops_per_s"] if base else None
            r["ratio_to_lsmdb"] = (r["ops_per_s"] / ref if r["ops_per_s"] and ref else None)


def print_report(report: dict[str, Any]) -> None:
    c = report["config"]
    print(f"lsmdb vs peers: {c['keys']:,} keys ({c['key_format']} % 2i, {c['value_bytes']}-byte "
          f"values, loaded in random order), each store closed and reopened before reads")
    print(f"machine: {describe_machine(report['machine'])}")
    print()
    ran = [e for e in report["stores"] if e["available"]]
    headers = ["store"] + [WORKLOAD_TITLES[w] for w in WORKLOADS]

    def cell(r: dict[str, Any], key: str, fmt: Callable[[float | None], str]) -> str:
        return fmt(r[key]) if r["correct"] else "WRONG"

    print_section(f"ops/s (gets: median rate of {SLICES} slices of the loop; scan: items/s; "
                  "load: keys/s until closed)", headers,
                  [[e["label"]] + [cell(e["workloads"][w], "ops_per_s", fmt_rate)
                                   for w in WORKLOADS] for e in ran])
    print_section("ratio to lsmdb (above 1: faster than lsmdb)", headers,
                  [[e["label"]] + [cell(e["workloads"][w], "ratio_to_lsmdb", fmt_ratio)
                                   for w in WORKLOADS] for e in ran])
    if ran:
        print("operations per workload: " + ", ".join(
            f"{WORKLOAD_TITLES[w]} {r['ops']:,}" for w, r in ran[0]["workloads"].items()))
    for e in report["stores"]:
        if e["available"]:
            print(f"  {e['config']}")
        else:
            print(f"  {e['skipped']}")
    for e in ran:
        for note in e["notes"]:
            print(f"  {note}")
    print()
    print(f"total {report['seconds']:.1f}s")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers",
        description="lsmdb against sqlite3, LevelDB, RocksDB and lmdb on the same keys and "
                    "queries (optional peers: pip install 'lsmdb[peers]').",
        epilog="example: python -m bench.peers --keys 200000 --stores lsmdb sqlite3 leveldb")
    parser.add_argument("--keys", type=int, default=DEFAULT_KEYS, metavar="N",
                        help=f"keys loaded into every store (default {DEFAULT_KEYS:,})")
    parser.add_argument("--stores", nargs="+", choices=STORE_NAMES, default=list(STORE_NAMES),
                        metavar="NAME",
                        help=f"stores to run, from {', '.join(STORE_NAMES)} (default: all); "
                             "ratios are to lsmdb, so it runs whenever it is listed")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.keys < 2:
        parser.error("--keys must be at least 2")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    progress = Progress()
    machine = machine_info()
    data = Data(args.keys)
    entries = []
    failed = False
    for cls in STORES:
        if cls.name not in args.stores:
            continue
        reason = cls.missing()
        if reason is not None:
            progress(reason)
            entries.append({"store": cls.name, "label": cls.label, "available": False,
                            "skipped": reason})
            continue
        try:
            entries.append(bench_store(cls, data, progress))
        except Exception as exc:  # noqa: BLE001 -- one store failing must not hide the others
            reason = f"{cls.label}: FAILED: {type(exc).__name__}: {exc}"
            progress(reason)
            entries.append({"store": cls.name, "label": cls.label, "available": False,
                            "skipped": reason})
            failed = True
    add_ratios(entries)
    report = {
        "benchmark": "peers",
        "config": {"keys": args.keys, "stores": args.stores, "key_format": KEY_FORMAT.decode(),
                   "value_bytes": VALUE_BYTES, "batch_keys": BATCH_KEYS,
                   "filter_bits_per_key": FILTER_BITS_PER_KEY, "seed": SEED},
        "machine": machine,
        "load_average_at_end": load_average(),
        "stores": entries,
        "seconds": progress.elapsed(),
    }
    print_report(report)
    if args.json:
        write_json(args.json, report)
        progress(f"wrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
