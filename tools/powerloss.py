"""Power-loss torture: a seeded random workload under the simulated power loss of
tests/support/powerloss.py, and every crash image it leaves checked against a model.

A seed drives a random workload on the public API: puts and deletes (values
of ~1 KB among small ones, so 4 KiB memtables flush on their own), batches
across tables, writes with ``sync=True`` and ``sync=False``, ``db.sync()``,
``db.flush()`` and ``db.flush(name)``, ``db.compact(name)``,
``alter_table``, ``create_table``, ``drop_table``, close and reopen, and
power cuts after which the run goes on with a crash image; one size-tiered,
one leveled and one keyed-filter table, background compaction on or off
(and, when on, waited for after each operation or not) per seed.  Crash
images are taken at every fsync point, just before and just after it takes
effect (the layer's observer, in whichever thread -- background
compaction's too), and between operations.  Each is written to a fresh
directory, opened, and checked by :mod:`tools.powerloss_model`: the rows
must be those of a prefix of the acknowledged writes that reaches at least
the durable point (the last write a ``sync``, ``close``, flush, compaction
or ``sync=True`` write covered), tables as acknowledged, ``verify`` clean,
``get`` equal to ``scan``, a second open the same.

Usage::

    python tools/powerloss.py --seeds 20 [--seed 1] [--ops 250] [--images-per-point 3]
                              [--sync-writes] [--shrink] [--verbose]

It prints how many crash images it checked and the first problems of each
kind (seed, operation, fsync point, how the image was chosen, which rule
failed and the rows that differ); exit code 1 on any problem.  ``--shrink``
cuts each failing seed's operations down to a short list that still fails
the same way.  The test suite runs a short version (tests/test_powerloss.py)
through :func:`run_seed`.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import logging
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if __name__ == "__main__":  # run as a script: use the lsmdb of this checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import lsmdb  # noqa: E402
import lsmdb.stats  # noqa: E402
from lsmdb.wal import PWRITE_MIN_BYTES  # noqa: E402
from tools import load_test_layer  # noqa: E402
from tools.powerloss_model import (  # noqa: E402
    Bounds,
    Found,
    Model,
    check_image,
)

if TYPE_CHECKING:
    from tests.support import faultinject
    from tests.support import powerloss as layer
else:
    layer = load_test_layer("powerloss")
    faultinject = load_test_layer("faultinject")

Crash = layer.Crash
PowerLoss = layer.PowerLoss

SMALL: dict[str, Any] = {"memtable_size_bytes": 4096, "block_size_bytes": 512}
#: The tables a run creates (and may drop and create again), with their options.
TABLES: dict[str, dict[str, Any]] = {
    "tiered": {**SMALL, "min_threshold": 2},
    "leveled": {**SMALL, "compaction": "leveled", "target_file_size_bytes": 65536},
    "keyed": {**SMALL, "bloom_filter_hash": "keyed", "min_threshold": 3},
    "extra": {**SMALL, "compaction": "leveled", "target_file_size_bytes": 65536,
              "bloom_filter_fp_chance": 0.05},
}
KEYS = [b"k%02d" % i for i in range(18)] + [b"", b"\x00", b"\xff\xff"]
FP_CHANCES = (0.001, 0.01, 0.1, 0.5, 1.0)
#: The time to live of the workload's expiring puts: they expire long after a
#: run ends, so the model's answers hold while their WAL records ([value,
#: expires]) and SSTables (format 3) go through the power cuts.
LONG_TTL = 30 * 24 * 3600
WEIGHTS = {"put": 30, "delete": 8, "batch": 10, "sync": 4, "flush": 3, "flush_all": 1,
           "compact": 1.5, "alter": 1, "create": 1, "drop": 1, "reopen": 1.5, "powercut": 1,
           "failed_flush": 1.5}


# ------------------------------------------------------------------ operations
@dataclass(frozen=True)
class Op:
    """One step of a workload (plain data, so a plan can be printed and cut down)."""

    kind: str
    table: str = ""
    key: bytes = b""
    size: int | None = None                            # value size; None: a delete
    sync: bool | None = None
    items: tuple[tuple[str, bytes, int | None], ...] = ()   # a batch: (table, key, size)
    options: tuple[tuple[str, Any], ...] = ()          # create_table / alter_table

    def __str__(self) -> str:
        sync = "" if self.sync is None else f" sync={self.sync}"
        if self.kind in ("put", "delete"):
            size = f" {self.size}B" if self.size is not None else ""
            return f"{self.kind} {self.table} {self.key!r}{size}{sync}"
        if self.kind == "batch":
            parts = [f"{'put' if s is not None else 'del'} {t} {k!r}" for t, k, s in self.items]
            return f"batch[{', '.join(parts)}]{sync}"
        args = ", ".join([repr(self.table)] * bool(self.table)
                         + [f"{k}={v!r}" for k, v in self.options])
        return f"{self.kind}({args})"


@dataclass
class Plan:
    seed: int
    auto_compaction: bool    # background compaction on
    concurrent: bool         # ... and not waited for after each operation
    ops: list[Op]
    compaction_process: bool = True  # merges in lsmdb's worker process


def generate(seed: int, n_ops: int, sync_writes: bool = False) -> Plan:
    """The random workload of ``seed``: ``n_ops`` operations (mostly valid when run).

    ``sync_writes`` makes every write ``sync=True``.
    """
    rng = random.Random(seed)
    live = {"default"}
    ops: list[Op] = []
    if rng.random() < 0.5:
        ops.append(Op("alter", "default", options=(("memtable_size_bytes", 4096),)))
    for name in ("tiered", "leveled", "keyed"):
        ops.append(Op("create", name, options=tuple(TABLES[name].items())))
        live.add(name)

    def value_size() -> int:
        roll = rng.random()
        if roll < 0.02:  # a record the WAL writes with pwrite (lsmdb.wal.PWRITE_MIN_BYTES)
            return rng.randint(PWRITE_MIN_BYTES, PWRITE_MIN_BYTES + 8192)
        return rng.randint(900, 1100) if roll < 0.4 else rng.randint(1, 120)

    def a_sync() -> bool | None:
        choice = rng.choice((True, False, False, False, None))
        return True if sync_writes else choice

    kinds, weights = list(WEIGHTS), list(WEIGHTS.values())
    while len(ops) < n_ops:
        kind = rng.choices(kinds, weights)[0]
        tables = sorted(live)
        droppable = sorted(live - {"default"})
        if kind == "put":
            ops.append(Op("put", rng.choice(tables), rng.choice(KEYS), value_size(), a_sync()))
        elif kind == "delete":
            ops.append(Op("delete", rng.choice(tables), rng.choice(KEYS), None, a_sync()))
        elif kind == "batch":
            chosen = rng.sample(tables, min(len(tables), rng.randint(1, 3)))
            items = tuple((rng.choice(chosen), rng.choice(KEYS),
                           value_size() if rng.random() < 0.8 else None)
                          for _ in range(rng.randint(2, 6)))
            ops.append(Op("batch", items=items, sync=a_sync()))
        elif kind in ("sync", "flush_all"):
            ops.append(Op(kind))
        elif kind in ("flush", "compact", "failed_flush"):
            ops.append(Op(kind, rng.choice(tables)))
        elif kind == "alter":
            ops.append(Op("alter", rng.choice(tables),
                          options=(("bloom_filter_fp_chance", rng.choice(FP_CHANCES)),)))
        elif kind == "create":
            free = sorted(set(TABLES) - live)
            if free:
                name = rng.choice(free)
                ops.append(Op("create", name, options=tuple(TABLES[name].items())))
                live.add(name)
        elif kind == "drop":
            if droppable:
                name = rng.choice(droppable)
                ops.append(Op("drop", name))
                live.discard(name)
        else:
            ops.append(Op(kind))
    ops.append(Op("close"))
    auto = rng.random() < 0.6
    concurrent = auto and rng.random() < 0.4
    return Plan(seed, auto, concurrent, ops, rng.random() < 0.5)


def value_of(op_index: int, item: int, size: int) -> bytes:
    """A value naming the operation (and batch item) that wrote it."""
    tag = b"w%d.%d|" % (op_index, item)
    return tag + b"v" * max(0, size - len(tag))


# ------------------------------------------------------------------- running
@dataclass
class Problem:
    seed: int
    op_index: int
    op: str
    point: str
    recipe: str
    kind: str           # the rule that failed, without the particulars
    detail: str

    @property
    def group(self) -> str:
        return self.kind

    def __str__(self) -> str:
        return (f"seed {self.seed}, op {self.op_index} ({self.op}), {self.point}:\n"
                f"    {self.kind}: {self.detail}\n    image: {self.recipe}")


@dataclass
class SeedResult:
    seed: int
    ops_run: int = 0
    points: int = 0                # fsync points seen
    power_cuts: int = 0            # times the run went on with a crash image
    images_taken: int = 0
    images_checked: int = 0        # distinct (image, bounds) pairs opened and checked
    problems: list[Problem] = field(default_factory=list)   # the first few of each kind
    counts: dict[str, int] = field(default_factory=dict)     # group -> failing images
    labels: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class _Point:
    where: str
    op_index: int
    images: list[Any]
    bounds: Bounds


#: Problems of one kind kept per seed; later ones are only counted (a bug that
#: loses data at one point usually does at many).
KEEP_PER_KIND = 3


def default_scratch() -> str:
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No background counter saves on a timer (fsync points must not follow the
    clock), and no log noise from the images' recoveries."""
    interval = lsmdb.stats.STATS_INTERVAL_SECONDS
    lsmdb.stats.STATS_INTERVAL_SECONDS = 1e9
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)
        lsmdb.stats.STATS_INTERVAL_SECONDS = interval


class _Runner:
    """One seed's run: the database under the layer, the model, the checks."""

    def __init__(self, plan: Plan, base: str, images_per_point: int,
                 stop: Callable[[Problem], bool] | None) -> None:
        self.plan = plan
        self.base = base
        self.path = os.path.join(base, "db")
        self.n = images_per_point
        self.stop = stop
        self.model = Model()
        self.result = SeedResult(plan.seed)
        self.queue: list[_Point] = []
        self.queue_lock = threading.Lock()   # the observer runs in any thread
        self.verdicts: dict[tuple[Any, ...], int | None] = {}   # image -> k if it passed
        self.op_index = -1
        self.op = "open"
        self.muted = False                   # no images while a power-cut database closes
        self.layer = PowerLoss(self.path, observer=self._observe)

    # -- taking images
    def _observe(self, pl: Any, when: str) -> None:
        if self.muted:
            return
        where = (f"{when} fsync #{self.result.points + pl.count} ({pl.labels[-1]}; "
                 f"{threading.current_thread().name})")
        self._take(pl, where, f"{self.result.points + pl.count}/{when}")

    def _between(self) -> None:
        self._take(self.layer, "after the call returned", f"op{self.op_index}")

    def _take(self, pl: Any, where: str, tag: str) -> _Point:
        lower = self.model.lower()
        moment = pl.moment()
        images = moment.images(random.Random(f"{self.plan.seed}/{tag}"), self.n)
        point = _Point(where, self.op_index, images, self.model.bounds(lower))
        with self.queue_lock:
            self.queue.append(point)
        return point

    # -- checking them
    def _check(self, image: dict[str, bytes], bounds: Bounds) -> tuple[list[Found], int | None]:
        self.result.images_checked += 1
        dest = os.path.join(self.base, f"image-{self.result.images_checked}")
        layer.materialize(dest, image)
        try:
            return check_image(dest, image, bounds, self.model)
        finally:
            shutil.rmtree(dest, ignore_errors=True)

    def _drain(self) -> bool:
        """Check the queued images; False when told to stop."""
        with self.queue_lock:
            queue, self.queue = self.queue, []
        for point in queue:
            for image in point.images:
                self.result.images_taken += 1
                key = self._key(image, point.bounds)
                if key in self.verdicts:
                    continue
                found, k = self._check(image, point.bounds)
                self.verdicts[key] = None if found else k
                if not found:
                    continue
                if not self._report_all(point, image, found):
                    return False
                break   # one failure per point is enough
        return True

    @staticmethod
    def _key(image: dict[str, bytes], bounds: Bounds) -> tuple[Any, ...]:
        files = tuple((name, len(data), hash(data)) for name, data in sorted(image.items()))
        return files, bounds.key()

    def _report_all(self, point: _Point, image: Any, found: list[Found]) -> bool:
        op = str(self.plan.ops[point.op_index]) if point.op_index >= 0 else "open"
        for kind, detail in found:
            problem = Problem(self.plan.seed, point.op_index, op, point.where, image.recipe,
                              kind, detail)
            self._report(problem)
            if self.stop is not None and self.stop(problem):
                return False
        return True

    def _report(self, problem: Problem) -> None:
        counts = self.result.counts
        counts[problem.group] = counts.get(problem.group, 0) + 1
        if counts[problem.group] <= KEEP_PER_KIND:
            self.result.problems.append(problem)

    # -- running
    def run(self) -> SeedResult:
        start = time.monotonic()
        os.makedirs(self.path)
        db: lsmdb.DB | None = None
        try:
            with _quiet():
                self.layer.install()
                try:
                    self.model.begin("open")
                    db = self._open()
                    with self.model.lock:
                        self.model.opened = True
                    self.model.ack()
                    if not self._drain():
                        return self.result
                    for i, op in enumerate(self.plan.ops):
                        self.op_index, self.op = i, str(op)
                        if db is not None and self.plan.concurrent \
                                and op.kind in ("reopen", "close", "powercut"):
                            db.wait_for_compactions()   # raises what the background met
                        db = self._execute(db, op, i)
                        if db is not None and self.plan.auto_compaction \
                                and not self.plan.concurrent:
                            db.wait_for_compactions()
                        self.layer._check()
                        self._between()
                        self.result.ops_run += 1
                        if not self._drain():
                            break
                except Exception as exc:
                    self.model.abort()
                    self._report(Problem(
                        self.plan.seed, self.op_index, self.op, "the workload itself", "",
                        f"operation raised {type(exc).__name__}", str(exc)))
                finally:
                    if db is not None:
                        with contextlib.suppress(Exception):
                            db.close()
                    self._drain()
                    self.layer.uninstall()
        finally:
            self.result.points += self.layer.count
            self.result.labels += self.layer.labels
            self.layer.cleanup()
            self.result.seconds = time.monotonic() - start
        return self.result

    def _open(self) -> lsmdb.DB:
        return lsmdb.open(self.path, sync=False, auto_compaction=self.plan.auto_compaction,
                          compaction_process=self.plan.compaction_process)

    def _power_cut(self, db: lsmdb.DB, i: int) -> lsmdb.DB:
        """Replace the database by one of its crash images that passes its check, as a
        machine that lost power would find it, and reopen it: its recovery must be
        sound under later power losses too.  (No image passes: nothing happens; the
        failures are reported.)"""
        self._drain()
        point = self._take(self.layer, "at a power cut (an image the run may go on with)",
                           f"cut{i}")
        self._drain()   # every image of it checked, and reported if it fails
        rng = random.Random(f"{self.plan.seed}/cut{i}")
        rng.shuffle(point.images)
        for image in point.images:
            k = self.verdicts.get(self._key(image, point.bounds))
            if k is None:
                continue
            self.muted = True
            try:
                db.close()
            finally:
                self.muted = False
            self.layer.uninstall()
            self.result.points += self.layer.count
            self.result.labels += self.layer.labels
            self.layer.cleanup()
            shutil.rmtree(self.path)
            layer.materialize(self.path, image)
            self.model.recovered(k, f"op {i}: power cut, image {image.recipe[:60]}...")
            self.result.power_cuts += 1
            self.layer = PowerLoss(self.path, observer=self._observe)
            self.layer.install()
            self.model.begin(f"op {i}: open after the power cut")
            db = self._open()
            self.model.ack()
            return db
        return db

    def _execute(self, db: lsmdb.DB | None, op: Op, i: int) -> lsmdb.DB | None:
        """Run ``op`` (skipped when it names a table that does not exist now)."""
        model, desc = self.model, f"op {i}: {op}"
        assert db is not None
        live = model.schema
        if op.kind in ("put", "delete"):
            if op.table not in live:
                return db
            value = None if op.size is None else value_of(i, 0, op.size)
            model.begin_write(desc, [(op.table, op.key, value)])
            if value is None:
                db.table(op.table).delete(op.key, sync=op.sync)
            else:  # every other put expiring, long after the run: WAL [value, expires]
                db.table(op.table).put(op.key, value, sync=op.sync, ttl=LONG_TTL if i % 2 else None)
            model.ack(durable="a sync=True write" if op.sync else "")
        elif op.kind == "batch":
            items = [(t, k, None if s is None else value_of(i, j, s))
                     for j, (t, k, s) in enumerate(op.items) if t in live]
            if not items:
                return db
            model.begin_write(desc, items)
            with db.batch(sync=op.sync) as b:
                for j, (t, k, v) in enumerate(items):
                    if v is None:
                        b.delete(k, table=t)
                    else:
                        b.put(k, v, table=t, ttl=LONG_TTL if (i + j) % 3 == 0 else None)
            model.ack(durable="a sync=True batch" if op.sync else "")
        elif op.kind in ("sync", "flush", "flush_all", "compact"):
            if op.table and op.table not in live:
                return db
            model.begin(desc)
            if op.kind == "sync":
                db.sync()
            elif op.kind == "flush":
                db.flush(op.table)
            elif op.kind == "flush_all":
                db.flush()
            else:
                db.compact(op.table)
            rule = {"flush": "flush(name)", "flush_all": "flush()",
                    "compact": "compact(name)"}.get(op.kind, op.kind)
            model.ack(durable=rule, why=desc)
        elif op.kind == "failed_flush":
            # A flush whose SSTable cannot be fsynced (the disk full): the memtable
            # stays frozen, the segment its rotation closed unsynced, and the
            # writes after it go to the next one.
            if op.table not in live:
                return db
            model.begin(desc)
            with faultinject.Faults(self.path) as faults:
                faults.fail("fsync", lambda name: name.endswith(".sst"), errno.ENOSPC)
                try:
                    db.flush(op.table)
                except OSError:
                    model.abort()
                else:
                    model.ack(durable="flush(name)", why=desc)  # nothing was left to flush
        elif op.kind == "create":
            if op.table in live:
                return db
            model.begin_table(desc, op.table, dict(op.options), create=True)
            db.create_table(op.table, **dict(op.options))
            model.ack()
        elif op.kind == "alter":
            if op.table not in live:
                return db
            model.begin_table(desc, op.table, dict(op.options))
            db.alter_table(op.table, **dict(op.options))
            model.ack()
        elif op.kind == "drop":
            if op.table not in live or op.table == "default":
                return db
            model.begin_table(desc, op.table, None)
            db.drop_table(op.table)
            model.ack()
        elif op.kind in ("reopen", "close"):
            model.begin(desc)
            db.close()
            model.ack(durable="close")
            if op.kind == "close":
                return None
            model.begin(f"op {i}: open")
            db = self._open()
            model.ack()
        elif op.kind == "powercut":
            return self._power_cut(db, i)
        else:
            raise ValueError(f"unknown operation {op.kind!r}")
        return db


def run_seed(seed: int, ops: int = 250, images_per_point: int = 3, scratch: str | None = None,
             plan: Plan | None = None, stop: Callable[[Problem], bool] | None = None,
             sync_writes: bool = False) -> SeedResult:
    """Run the workload of ``seed`` (or ``plan``) and check its crash images.

    ``stop(problem)`` returning True ends the run at that problem.
    """
    plan = plan if plan is not None else generate(seed, ops, sync_writes)
    base = tempfile.mkdtemp(prefix=f"lsmdb-powerloss-{seed}-", dir=scratch or default_scratch())
    try:
        return _Runner(plan, base, images_per_point, stop).run()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _in_group(group: str, problem: Problem) -> bool:
    return problem.group == group


def shrink(plan: Plan, group: str, images_per_point: int, scratch: str | None = None,
           out: Callable[[str], None] = print) -> Plan:
    """A shorter plan whose run still has a problem of ``group`` (greedy: background
    compaction off, then cutting chunks, then single operations; each try stops at
    the first such problem, and the plan is cut after the operation it was at)."""
    def fails(candidate: Plan) -> int | None:
        if not candidate.ops:
            return None
        result = run_seed(candidate.seed, plan=candidate, images_per_point=images_per_point,
                          scratch=scratch, stop=functools.partial(_in_group, group))
        hits = [p for p in result.problems if p.group == group]
        return hits[0].op_index if hits else None

    at = fails(plan)
    if at is None:
        return plan
    best = replace(plan, ops=plan.ops[:at + 1])
    if best.auto_compaction:
        quiet = replace(best, auto_compaction=False, concurrent=False)
        at = fails(quiet)
        if at is not None:
            best = replace(quiet, ops=quiet.ops[:at + 1])
    chunk = max(1, len(best.ops) // 2)
    while chunk >= 1:
        i = 0
        while i < len(best.ops):
            candidate = replace(best, ops=best.ops[:i] + best.ops[i + chunk:])
            at = fails(candidate)
            if at is not None:
                best = replace(candidate, ops=candidate.ops[:at + 1])
                out(f"  shrink: {len(best.ops)} operations")
            else:
                i += chunk
        chunk //= 2
    return best


# ----------------------------------------------------------------------- CLI
def summary_text(results: list[SeedResult]) -> str:
    """The totals, and per kind of problem the failing images, seeds and first example."""
    groups: dict[str, list[Problem]] = {}
    counts: dict[str, int] = {}
    for r in results:
        for p in r.problems:
            groups.setdefault(p.group, []).append(p)
        for group, n in r.counts.items():
            counts[group] = counts.get(group, 0) + n
    lines = [f"{len(results)} seeds, {sum(r.ops_run for r in results)} operations, "
             f"{sum(r.power_cuts for r in results)} power cuts gone on from, "
             f"{sum(r.points for r in results)} fsync points, "
             f"{sum(r.images_checked for r in results)} crash images checked "
             f"({sum(r.images_taken for r in results)} taken, duplicates skipped), "
             f"{sum(counts.values())} problems in {sum(bool(r.counts) for r in results)} seeds"]
    for group, found in sorted(groups.items()):
        seeds = sorted({p.seed for p in found})
        lines.append(f"  {counts[group]} x {group} (seeds {seeds[:10]}"
                     f"{' ...' if len(seeds) > 10 else ''}); first:\n    {found[0]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="how many seeds to run")
    parser.add_argument("--seed", type=int, default=None, help="first seed (default: random)")
    parser.add_argument("--ops", type=int, default=250, help="operations per seed")
    parser.add_argument("--images-per-point", type=int, default=3,
                        help="crash images per fsync point and between operations (>= 2: "
                             "the two extremes first)")
    parser.add_argument("--scratch", default=None, help="where to build the databases")
    parser.add_argument("--shrink", action="store_true",
                        help="cut each failing seed's plan down to a short list of operations")
    parser.add_argument("--sync-writes", action="store_true",
                        help="every write with sync=True (nothing acknowledged is only in "
                             "an unsynced WAL tail)")
    parser.add_argument("--verbose", action="store_true", help="every problem, not the first")
    args = parser.parse_args(argv)
    first = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"powerloss: seeds {first}..{first + args.seeds - 1}, {args.ops} operations each, "
          f"{args.images_per_point} images per point")
    results = []
    for seed in range(first, first + args.seeds):
        result = run_seed(seed, args.ops, args.images_per_point, args.scratch,
                          sync_writes=args.sync_writes)
        results.append(result)
        print(f"seed {seed}: {result.ops_run} ops, {result.points} fsync points, "
              f"{result.images_checked} images checked, {sum(result.counts.values())} "
              f"problems ({result.seconds:.1f} s)",
              flush=True)
        for p in result.problems if args.verbose else result.problems[:1]:
            print(f"  {p}")
        for group in sorted({p.group for p in result.problems}) if args.shrink else ():
            plan = shrink(generate(seed, args.ops, args.sync_writes), group,
                          args.images_per_point, args.scratch)
            failing = run_seed(seed, plan=plan, images_per_point=args.images_per_point,
                               scratch=args.scratch, stop=functools.partial(_in_group, group))
            print(f"  shrunk to {len(plan.ops)} operations (auto_compaction="
                  f"{plan.auto_compaction}, concurrent={plan.concurrent}, compaction_process="
                  f"{plan.compaction_process}) still failing with "
                  f"{group}:")
            for i, op in enumerate(plan.ops):
                print(f"    {i}: {op}")
            print("  " + "\n  ".join(str(p) for p in failing.problems if p.group == group))
    print(summary_text(results))
    return 1 if any(r.problems for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
