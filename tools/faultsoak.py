"""Randomized I/O faults under a random workload: errors may reach the caller, data loss may not.

A seeded workload -- puts, deletes, batches across tables, sync and non-sync
writes, ``sync()``, flushes, compactions (explicit and in the background),
alter/create/drop table, close and reopen -- runs while
``tests/support/faultinject.py`` makes random calls on the database's files fail:
``open`` (EMFILE, EIO), ``write`` (ENOSPC, EIO, often after writing part of
the data), ``fsync``/``fdatasync``, ``replace`` and ``unlink``.  Faults come
in bursts with quiet stretches between them.  Checked throughout:

* only ``OSError`` and ``lsmdb.LsmdbError`` reach the caller;
* reads in the same process match the model exactly: a write that raised
  was not applied (and a table operation that raised is resolved by what the
  database then shows);
* after a reopen, the state is the acknowledged one -- or that plus one of
  the writes that raised since the last acknowledged one, whole (its record
  may have reached the WAL before the error; nothing is appended after a
  failed append, and an acknowledged write retires the failed segment);
* once faults stop, the database always closes, reopens with every
  acknowledged write, and ``verify`` finds no error.

Usage::

    python tools/faultsoak.py --seeds 50 [--seed 1] [--ops 400] [--rate 0.03]

The test suite runs a short version (tests/test_io_faults.py) through :func:`run`.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import random
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import lsmdb  # noqa: E402
import lsmdb.stats  # noqa: E402
from lsmdb.verify import verify_database  # noqa: E402
from tools import load_test_layer  # noqa: E402

Rows = dict[bytes, bytes]
Write = list[tuple[str, bytes, "bytes | None"]]
KEYS = [b"k%02d" % i for i in range(40)]
SMALL = {"memtable_size_bytes": 4096, "block_size_bytes": 512}


@dataclass
class Summary:
    seeds: int = 0
    ops: int = 0
    acked_writes: int = 0
    failed_calls: int = 0
    faults: int = 0
    reopens: int = 0
    failed_writes_seen_after_reopen: int = 0
    problems: list[str] = field(default_factory=list)

    def text(self) -> str:
        return "\n".join([
            f"seeds:                   {self.seeds}",
            f"operations:              {self.ops}",
            f"acknowledged writes:     {self.acked_writes}",
            f"calls that raised:       {self.failed_calls}",
            f"faults injected:         {self.faults}",
            f"reopens:                 {self.reopens}",
            f"failed writes kept:      {self.failed_writes_seen_after_reopen}",
            f"problems:                {len(self.problems)}",
            *self.problems[:20]])


class Model:
    """What the database must hold: acknowledged writes, and the writes that raised since."""

    def __init__(self) -> None:
        self.tables: dict[str, Rows] = {"default": {}}
        self.failed: list[Write] = []   # one of them may still surface after a reopen

    def apply(self, write: Write, tables: dict[str, Rows] | None = None) -> None:
        for t, k, v in write:
            rows = (self.tables if tables is None else tables)[t]
            if v is None:
                rows.pop(k, None)
            else:
                rows[k] = v

    def with_failed(self) -> list[dict[str, Rows]]:
        """The states with one of the failed writes applied."""
        out = []
        for w in self.failed:
            if all(t in self.tables for t, _k, _v in w):
                alt = {t: dict(rows) for t, rows in self.tables.items()}
                self.apply(w, alt)
                out.append(alt)
        return out


class Run:
    """One seeded run on one directory."""

    def __init__(self, seed: int, ops: int, rate: float, path: str, summary: Summary) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.n_ops = ops
        self.rate = rate
        self.path = path
        self.summary = summary
        self.model = Model()
        self.db: lsmdb.DB | None = None
        self.op = 0
        self.faults = load_test_layer("faultinject").Faults(path)
        self.tables_made = 0
        self.last_open_error = ""
        self.tracing: list[str] | None = None

    def problem(self, what: str) -> None:
        self.summary.problems.append(f"seed {self.seed} op {self.op}: {what}")

    # -- calls ------------------------------------------------------------------
    def call(self, fn: Callable[[], Any], what: str = "") -> tuple[bool, Any]:
        """(True, result), or (False, None) when fn raised an allowed error."""
        hits = len(self.faults.hits)
        try:
            result = fn()
        except (OSError, lsmdb.LsmdbError) as exc:
            self.summary.failed_calls += 1
            self.trace(f"{what or getattr(fn, '__name__', '?')}: {type(exc).__name__}: {exc}"
                       f"  faults {self.faults.hits[hits:]}")
            return False, None
        if what:
            self.trace(f"{what}: ok  faults {self.faults.hits[hits:]}")
        return True, result

    def trace(self, line: str) -> None:
        if self.tracing is not None:
            self.tracing.append(f"{self.op:4d} {line}")

    def value(self) -> bytes:
        return b"%d:%d:" % (self.seed, self.op) + b"v" * self.rng.choice([10, 200, 900, 1500])

    def write(self) -> None:
        db = self.db
        assert db is not None
        names = sorted(self.model.tables)
        w: Write = []
        for _ in range(self.rng.choice([1, 1, 1, 2, 5])):
            t = self.rng.choice(names)
            k = self.rng.choice(KEYS)
            w.append((t, k, None if self.rng.random() < 0.2 else self.value()))
        sync = self.rng.random() < 0.2

        def do() -> None:
            if len(w) == 1:
                t, k, v = w[0]
                if v is None:
                    db.table(t).delete(k, sync=sync)
                else:
                    db.table(t).put(k, v, sync=sync)
                return
            with db.batch(sync=sync) as b:
                for t, k, v in w:
                    if v is None:
                        b.delete(k, table=t)
                    else:
                        b.put(k, v, table=t)

        ok, _ = self.call(do, f"write {w!r:.200} sync={sync}")
        if ok:
            self.model.apply(w)
            self.model.failed = []
            self.summary.acked_writes += 1
        else:
            self.model.failed.append(w)

    def table_op(self) -> None:
        db = self.db
        assert db is not None
        choice = self.rng.random()
        if choice < 0.4 and len(self.model.tables) < 5:
            self.tables_made += 1
            name = f"t{self.tables_made}"
            opts: dict[str, Any] = dict(SMALL)
            if self.rng.random() < 0.4:
                opts.update(compaction="leveled", target_file_size_bytes=65536)
            if self.rng.random() < 0.2:
                opts["bloom_filter_hash"] = "keyed"
            self.call(lambda: db.create_table(name, **opts))
            if name in db.tables():
                self.model.tables[name] = {}
        elif choice < 0.6 and len(self.model.tables) > 1:
            name = self.rng.choice(sorted(set(self.model.tables) - {"default"}))
            self.call(lambda: db.drop_table(name))
            if name not in db.tables():
                del self.model.tables[name]
        else:
            name = self.rng.choice(sorted(self.model.tables))
            fp = self.rng.choice([0.1, 0.01, 0.001])
            self.call(lambda: db.alter_table(name, bloom_filter_fp_chance=fp))

    def check_reads(self, tables: dict[str, Rows], sample: int | None = 8) -> list[str]:
        db = self.db
        assert db is not None
        wrong = []
        if sorted(db.tables()) != sorted(tables):
            return [f"tables {sorted(db.tables())}, expected {sorted(tables)}"]
        for name in sorted(tables):
            keys = KEYS if sample is None else self.rng.sample(KEYS, sample)
            for k in keys:
                ok, got = self.call(functools.partial(db.table(name).get, k))
                if ok and got != tables[name].get(k):
                    wrong.append(f"{name} {k!r}: got {_short(got)}, "
                                 f"expected {_short(tables[name].get(k))}")
            ok, rows = self.call(functools.partial(_scan, db.table(name)))
            if ok and rows != tables[name]:
                wrong.append(f"{name}: scan differs from the model")
        return wrong

    # -- open and close ---------------------------------------------------------
    def open(self, faults_on: bool) -> bool:
        self.faults.enabled = faults_on
        auto = self.rng.random() < 0.5
        try:
            db = lsmdb.open(self.path, auto_compaction=auto)
        except (OSError, lsmdb.LsmdbError) as exc:
            self.summary.failed_calls += 1
            self.last_open_error = f"{type(exc).__name__}: {exc}"
            return False
        finally:
            self.faults.enabled = True
        self.db = db
        self.summary.reopens += 1
        # One write that raised may be there after a reopen, whole.
        if self.check_reads(self.model.tables, None) == []:
            return True
        for alt in self.model.with_failed():
            if self.check_reads(alt, None) == []:
                self.model.tables = alt
                self.model.failed = []
                self.summary.failed_writes_seen_after_reopen += 1
                return True
        self.problem("after reopen: " + "; ".join(self.check_reads(self.model.tables, None)[:4]))
        return True

    def close(self) -> None:
        if self.db is not None:
            self.call(self.db.close)
            self.db = None

    # -- the run ----------------------------------------------------------------
    def go(self) -> None:
        rng = self.rng
        with self.faults:
            self.faults.random(rng, self.rate, ops=("open", "write", "fsync", "replace",
                                                    "unlink"))
            if not self.open(faults_on=False):
                self.problem("first open failed without faults")
                return
            for op in range(self.n_ops):
                self.op = op
                self.summary.ops += 1
                self.faults.enabled = (self.op // 40) % 2 == 1   # bursts of faults
                db = self.db
                if db is None:
                    if not self.open(faults_on=self.faults.enabled):
                        continue
                    db = self.db
                    assert db is not None
                r = rng.random()
                try:
                    if r < 0.60:
                        self.write()
                    elif r < 0.66:
                        self.call(db.sync)
                    elif r < 0.72:
                        name = rng.choice([None, *sorted(self.model.tables)])
                        self.call(functools.partial(db.flush, name))
                    elif r < 0.75:
                        name = rng.choice(sorted(self.model.tables))
                        self.call(functools.partial(db.compact, name))
                    elif r < 0.79:
                        self.table_op()
                    elif r < 0.84:
                        self.call(functools.partial(db.wait_for_compactions, timeout=10))
                    elif r < 0.88:
                        self.close()
                    else:
                        wrong = self.check_reads(self.model.tables)
                        if wrong:
                            self.problem("in-process reads: " + "; ".join(wrong[:4]))
                except Exception:
                    self.problem("unexpected exception:\n" + traceback.format_exc(limit=6))
                    self.close()
            self.summary.faults += len(self.faults.hits)
            self.faults.enabled = False
            self.close()
            if not self.open(faults_on=False):
                self.problem(f"the database does not open once faults stopped: "
                             f"{self.last_open_error}")
                return
            self.close()
        problems = [str(p) for p in verify_database(self.path) if p.severity == "error"]
        if problems:
            self.problem("verify: " + "; ".join(problems[:3]))


def _scan(table: lsmdb.Table) -> Rows:
    return dict(table.scan())


def _short(v: bytes | None) -> str:
    return "nothing" if v is None else repr(v.split(b":v")[0])


def run(seeds: int, seed: int = 1, ops: int = 400, rate: float = 0.03,
        base: str | None = None, out: Callable[[str], None] = print,
        keep: str | None = None) -> Summary:
    """Run ``seeds`` seeded runs (seed, seed + 1, ...) and return what they found;
    ``keep``: a directory to copy each database that showed a problem into."""
    summary = Summary()
    root = tempfile.mkdtemp(prefix="lsmdb-faultsoak-", dir=base)
    saved = lsmdb.stats.STATS_INTERVAL_SECONDS
    lsmdb.stats.STATS_INTERVAL_SECONDS = 1e9   # no counter saves at random moments
    logging.disable(logging.CRITICAL)          # the injected errors are logged by design
    try:
        for s in range(seed, seed + seeds):
            before = len(summary.problems)
            path = os.path.join(root, f"db-{s}")
            Run(s, ops, rate, path, summary).go()
            summary.seeds += 1
            if len(summary.problems) > before:
                out(f"seed {s}: {len(summary.problems) - before} problem(s)")
                if keep:
                    kept = os.path.join(keep, f"db-{s}")
                    shutil.rmtree(kept, ignore_errors=True)
                    shutil.copytree(path, kept)
                    out(f"  kept as {kept}")
            shutil.rmtree(path, ignore_errors=True)
    finally:
        logging.disable(logging.NOTSET)
        lsmdb.stats.STATS_INTERVAL_SECONDS = saved
        shutil.rmtree(root, ignore_errors=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ops", type=int, default=400)
    parser.add_argument("--rate", type=float, default=0.03)
    parser.add_argument("--keep", help="copy each database that showed a problem here")
    args = parser.parse_args(argv)
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    summary = run(args.seeds, args.seed, args.ops, args.rate, base, keep=args.keep)
    print(summary.text())
    return 1 if summary.problems else 0


if __name__ == "__main__":
    sys.exit(main())
