"""Where an absent in-range get spends its time (3 SSTables, as after bench.peers' load).

Run from the repository root: ``python tools/profile_get.py``.  Each line is the best of five
passes over 100,000 absent keys that fall inside every file's key range.  "C Probes.first" is the
C part of a get with lsmdb._speedups (hash, range checks, filter probes, counters); the last line
is the floor a pure-Python read path can reach for this layout: the hash, the range checks and
the filter probes (``bloom.may_contain``), without any counter or check.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable

import lsmdb
import lsmdb.table
from lsmdb.filters.hashing import key_hash

N_KEYS = 200_000
N_QUERIES = 100_000
N_FILES = 3


def build(path: str) -> str:
    db = lsmdb.open(path, auto_compaction=False)
    order = list(range(N_KEYS))
    random.Random(1).shuffle(order)
    per_file = N_KEYS // N_FILES
    for part in range(N_FILES):
        with db.batch() as b:
            for i in order[part * per_file:(part + 1) * per_file]:
                b.put(b"user:%010d" % (2 * i), b"x" * 100)
        db.flush()
    db.close()
    return path


def best_rate(fn: Callable[[], None], n: int) -> float:
    best = 0.0
    for _ in range(5):
        start = time.perf_counter()
        fn()
        best = max(best, n / (time.perf_counter() - start))
    return best


def main() -> None:
    path = build(tempfile.mkdtemp(prefix="lsmdb-profile-"))
    lsmdb.table.USE_SPEEDUPS = False
    pydb = lsmdb.open(path, auto_compaction=False, read_only=True)
    lsmdb.table.USE_SPEEDUPS = lsmdb.table.Probes is not None
    db = lsmdb.open(path, auto_compaction=False)
    rng = random.Random(2)
    queries = [b"user:%010d" % (2 * rng.randrange(N_KEYS) + 1) for _ in range(N_QUERIES)]
    get = db.get
    pyget = pydb.get
    fast = db._default_state.fast
    data = fast.data
    c_probes = fast.probes

    def full() -> None:
        for key in queries:
            get(key)

    def python_path() -> None:
        for key in queries:
            pyget(key)

    def c_first() -> None:
        assert c_probes is not None  # only timed when the C speedups are built
        first = c_probes.first
        for key in queries:
            first(key, 0)

    def call_only() -> None:
        def f(key: bytes, default: object = None) -> object:
            return default
        for key in queries:
            f(key)

    def dict_only() -> None:
        for key in queries:
            data.get(key)

    def hash_only() -> None:
        for key in queries:
            key_hash(key)

    def hash_probe() -> None:
        for key in queries:
            h = key_hash(key)
            for p in fast.l0:
                if p.min_key <= key <= p.max_key:
                    p.filter.may_contain(h)

    runs = [(f"db.get ({N_FILES} files)", full),
            (f"db.get, Python read path ({N_FILES} files)", python_path)]
    if c_probes is not None:
        runs.append(("C Probes.first alone", c_first))
    for name, fn in [*runs,
                     ("a Python call returning default", call_only),
                     ("memtable dict lookup", dict_only),
                     ("xxh3_64 hash", hash_only),
                     (f"hash + {N_FILES} range checks + {N_FILES} filter probes, no counters",
                      hash_probe)]:
        rate = best_rate(fn, len(queries))
        print(f"{name:<55} {rate / 1e3:8.0f}k/s  {1e9 / rate:6.0f} ns/get")
    db.close()
    pydb.close()


if __name__ == "__main__":
    main()
