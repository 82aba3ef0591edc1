"""Files cut short under gets in flight: threads get, the main thread truncates every SSTable.

    python tools/truncate_soak.py [--keys N] [--threads T] [--seconds S] [--rounds R]
                                  [--path DIR]

Each round builds a database of N keys (``key%07d`` -> a value made from the number) in
several SSTables, opens it with a 64 KiB block cache (so most gets read their block from the
file: with the C speedups, out of its read-only mapping), starts T threads getting random keys
(every other thread with ``get_many`` of ``MANY_KEYS`` neighbouring keys, which share blocks: a
block several keys need is read once for them all), and a third of the way into S seconds cuts
every SSTable to a third of its length.  Every get (and every ``get_many``) must either return
each key's own value or raise ``CorruptionError``; anything else -- a wrong value, None for a
key that is there, another exception -- is a problem, and a SIGBUS that the copy's guard misses
ends the process.  It prints, per round, the keys answered, the ``CorruptionError``s and the
problems, and exits 1 if there was any problem.

The test suite runs a short version in a child process (tests/test_speedups.py).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import lsmdb  # noqa: E402
from lsmdb.errors import CorruptionError  # noqa: E402


def value_of(i: int) -> bytes:
    return b"v%d" % i * 8


def build(path: str, keys: int) -> None:
    db = lsmdb.open(path, auto_compaction=False)
    try:
        db.alter_table("default", memtable_size_bytes=max(64 * 1024, keys * 40 // 6))
        for i in range(keys):
            db.put(b"key%07d" % i, value_of(i))
        db.flush()
    finally:
        db.close()


#: Keys a get_many thread asks for at once: neighbours, so that several share a block.
MANY_KEYS = 8


def round_once(path: str, keys: int, threads: int, seconds: float, seed: int) -> dict[str, int]:
    """One round on the database at ``path`` (built, then cut short): the counts."""
    db = lsmdb.open(path, auto_compaction=False, block_cache_size_bytes=64 * 1024)
    counts = {"answered": 0, "corruption": 0, "problems": 0, "files": len(db.sstables())}
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def work(worker: int) -> None:
        rng = random.Random(seed * 1000 + worker)
        answered = corruption = problems = 0
        while time.monotonic() < stop:
            i = rng.randrange(keys)
            numbers = range(i, min(i + MANY_KEYS, keys)) if worker % 2 else range(i, i + 1)
            try:
                if worker % 2:
                    values = db.get_many([b"key%07d" % j for j in numbers])
                else:
                    values = [db.get(b"key%07d" % i)]
            except CorruptionError:
                corruption += 1
                continue
            except Exception as exc:  # anything else is a problem, reported
                print(f"problem: {type(exc).__name__}: {exc}", file=sys.stderr)
                problems += 1
                continue
            for j, value in zip(numbers, values, strict=True):
                if value == value_of(j):
                    answered += 1
                else:
                    print(f"problem: key{j:07d} read {value!r}", file=sys.stderr)
                    problems += 1
        with lock:
            counts["answered"] += answered
            counts["corruption"] += corruption
            counts["problems"] += problems

    workers = [threading.Thread(target=work, args=(w,)) for w in range(threads)]
    try:
        for w in workers:
            w.start()
        time.sleep(seconds / 3)
        for info in db.sstables():
            os.truncate(info.path, info.size_bytes // 3)
        for w in workers:
            w.join()
    finally:
        db.close()
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/truncate_soak.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=200_000, metavar="N")
    parser.add_argument("--threads", type=int, default=4, metavar="T")
    parser.add_argument("--seconds", type=float, default=3.0, metavar="S")
    parser.add_argument("--rounds", type=int, default=3, metavar="R")
    parser.add_argument("--path", help="work here (default: a temporary directory)")
    args = parser.parse_args(argv)
    if args.keys < 1000 or args.threads < 1 or args.seconds <= 0 or args.rounds < 1:
        parser.error("keys at least 1000; threads, seconds and rounds above 0")
    root = args.path or tempfile.mkdtemp(prefix="lsmdb-truncate-soak-")
    problems = 0
    try:
        base = os.path.join(root, "base")
        build(base, args.keys)
        for r in range(args.rounds):
            path = os.path.join(root, f"round{r}")
            shutil.copytree(base, path)
            counts = round_once(path, args.keys, args.threads, args.seconds, seed=r)
            shutil.rmtree(path)
            problems += counts["problems"]
            print(f"round {r + 1}: {counts['files']} SSTables cut to a third under "
                  f"{args.threads} threads: {counts['answered']:,} keys answered, "
                  f"{counts['corruption']:,} CorruptionError, {counts['problems']} problems",
                  flush=True)
    finally:
        if not args.path:
            shutil.rmtree(root, ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
