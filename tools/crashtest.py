"""Crash torture: SIGKILL a writing lsmdb process at random moments, reopen, check.

A child process opens the database with ``sync=True``, a 4 KiB memtable and
background compaction on, and writes random puts, deletes and batches over
several tables (one size-tiered table per default options, one leveled table
with ``target_file_size_bytes=65536``, one with keyed filters).  Before each
write it tells the parent what it is about to do (``B``), and only after the
call returned that it was acknowledged (``A``).  It also reports when a
flush, a compaction or a manifest switch starts and ends (``F``/``C``/``M``
markers, from thin wrappers that only observe).  Messages are lines on a
pipe::

    B <op id> <json>     about to call (the write is "in flight")
    A <op id>            the call returned
    F+ F- C+ C- M+ M-    flush / compaction / manifest switch started, ended
    R                    the database is open
    E <error>            the child met an exception (a problem)

The parent SIGKILLs the child at a random moment -- after a random time, a
random number of acknowledged writes, or a moment after a flush, compaction
or manifest switch started -- and then checks the directory:

* ``verify_database`` finds no error in the crashed state (and once, at the
  end, the ``lsmdb verify`` command agrees);
* it opens, every table created and acknowledged exists with its options;
* every table reads (scan and get) exactly the acknowledged state, or that
  state plus the one write in flight (applied whole: a batch is atomic).

Values carry the id of the write that stored them, so "an older value came
back" cannot hide behind an equal one.  The model then absorbs the in-flight
write if it was applied, and the next child continues on the same database.

Usage::

    python tools/crashtest.py --iterations 200 [--seed 7] [--path DIR] [--keep]

The test suite runs a short version (tests/test_crash.py) through :func:`run`.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

if __name__ == "__main__":  # run as a script: use the lsmdb of this checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import lsmdb  # noqa: E402
from lsmdb.verify import verify_database  # noqa: E402

#: Tables the child creates when missing ("default" is altered instead).
TABLES: dict[str, dict[str, Any]] = {
    "default": {"memtable_size_bytes": 4096, "block_size_bytes": 512},
    "tiered": {"memtable_size_bytes": 4096, "block_size_bytes": 1024,
               "compaction": "size_tiered", "min_threshold": 4},
    "leveled": {"memtable_size_bytes": 4096, "block_size_bytes": 1024,
                "compaction": "leveled", "target_file_size_bytes": 65536},
    "keyed": {"memtable_size_bytes": 4096, "bloom_filter_hash": "keyed", "min_threshold": 2},
}
KEYS_PER_TABLE = 1500
SPECIAL_KEYS = [b"", b"\x00", b"\xff", b"\xff\xff\xff", b"k\x00"]
MAX_CHILD_SECONDS = 8.0   # kill anyway when the chosen moment never comes
KILL_MODES = ("time", "time", "acks", "flush", "flush", "compaction", "compaction", "manifest")

Data = dict[str, dict[bytes, "bytes | None"]]


# ---------------------------------------------------------------------- child
class _Pipe:
    """Line messages to the parent; one lock so threads never interleave a line."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.lock = threading.Lock()

    def send(self, line: str) -> None:
        data = (line + "\n").encode()
        with self.lock:
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view):]


def _observe(cls: Any, name: str, pipe: _Pipe, mark: str,
             only_if: Callable[..., bool] = lambda *a: True) -> None:
    """Wrap ``cls.name`` to report ``mark+``/``mark-`` around it (observation only)."""
    original = getattr(cls, name, None)
    if original is None:  # renamed in lsmdb: the markers are lost, nothing else
        return

    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        report = only_if(*args)
        if report:
            pipe.send(mark + "+")
        try:
            return original(self, *args, **kwargs)
        finally:
            if report:
                pipe.send(mark + "-")

    setattr(cls, name, wrapper)


def child_main(path: str, seed: int, fd: int, tag: str) -> int:
    """Write random operations to ``path`` forever (until killed), reporting on ``fd``."""
    pipe = _Pipe(fd)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(levelname)s %(message)s"))
    logger = logging.getLogger("lsmdb")
    logger.handlers = [handler]
    logger.propagate = False   # not into handlers a forking parent had installed
    logger.setLevel(logging.INFO)
    from lsmdb import compactor as compmod
    from lsmdb import flush as flushmod
    from lsmdb import versions as versionsmod
    _observe(flushmod.Flusher, "_flush_frozen", pipe, "F")
    _observe(compmod.Compactor, "run", pipe, "C")
    _observe(versionsmod.Versions, "write_manifest", pipe, "M")
    rng = random.Random(seed)
    counter = 0

    def begin(op: dict[str, Any]) -> str:
        nonlocal counter
        counter += 1
        opid = f"{tag}.{counter}"
        pipe.send(f"B {opid} {json.dumps(op)}")
        return opid

    def next_value(opid: str) -> bytes:
        size = rng.choice((0, 10, 40, 80, 150, 300, 300, 600, 1200))
        return opid.encode() + b":" + rng.randbytes(size)

    def random_key() -> bytes:
        if rng.random() < 0.02:
            return rng.choice(SPECIAL_KEYS)
        return b"key%05d" % rng.randrange(KEYS_PER_TABLE)

    try:
        db = lsmdb.open(path, sync=True)
        pipe.send("R")
        for name, options in TABLES.items():
            if name == "default":
                current = db.table(name).options
                if all(getattr(current, k) == v for k, v in options.items()):
                    continue
                opid = begin({"kind": "alter", "table": name, "options": options})
                db.alter_table(name, **options)
            elif name in db.tables():
                continue
            else:
                opid = begin({"kind": "create", "table": name, "options": options})
                db.create_table(name, **options)
            pipe.send(f"A {opid}")
        names = list(TABLES)
        while True:
            r = rng.random()
            if r < 0.005:
                db.flush(rng.choice((None, rng.choice(names))))
                continue
            if r < 0.007:
                db.compact(rng.choice(names))
                continue
            counter_next = f"{tag}.{counter + 1}"
            if r < 0.62:
                table, key = rng.choice(names), random_key()
                value = next_value(counter_next)
                opid = begin({"kind": "write", "ops": [[table, key.hex(), value.hex()]]})
                db.table(table).put(key, value)
            elif r < 0.80:
                table, key = rng.choice(names), random_key()
                opid = begin({"kind": "write", "ops": [[table, key.hex(), None]]})
                db.table(table).delete(key)
            else:
                ops: dict[tuple[str, bytes], bytes | None] = {}
                for _ in range(rng.randint(1, 6)):
                    ops[(rng.choice(names), random_key())] = \
                        None if rng.random() < 0.25 else next_value(counter_next)
                opid = begin({"kind": "write", "ops": [
                    [t, k.hex(), None if v is None else v.hex()] for (t, k), v in ops.items()]})
                with db.batch() as b:
                    for (t, k), v in ops.items():
                        if v is None:
                            b.delete(k, table=t)
                        else:
                            b.put(k, v, table=t)
            pipe.send(f"A {opid}")
    except BaseException as exc:
        traceback.print_exc()
        try:
            pipe.send("E " + repr(exc).replace("\n", " ")[:500])
        except OSError:
            pass
        return 2


# --------------------------------------------------------------------- parent
@dataclass
class Summary:
    iterations: int = 0
    acked_writes: int = 0        # write calls acknowledged by the children
    keys_checked: int = 0        # (table, key) reads compared with the model
    inflight_applied: int = 0    # killed during a write that turned out to be durable
    inflight_dropped: int = 0    # ... that turned out not to be
    flushes: int = 0             # completed (F-)
    compactions: int = 0         # completed (C-)
    compaction_log_lines: int = 0
    manifest_switches: int = 0
    sstables_seen: set[int] = field(default_factory=set)
    kills_in_flush: int = 0
    kills_in_compaction: int = 0
    kills_in_manifest: int = 0
    kills_before_open: int = 0
    kill_modes: dict[str, int] = field(default_factory=dict)
    cli_verify_runs: int = 0
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def text(self) -> str:
        lines = [
            f"iterations:              {self.iterations}  ({self.seconds:.1f} s)",
            f"acknowledged writes:     {self.acked_writes}  (keys checked: {self.keys_checked})",
            f"in-flight at kill:       {self.inflight_applied} applied, "
            f"{self.inflight_dropped} dropped",
            f"flushes completed:       {self.flushes}",
            f"compactions completed:   {self.compactions}  "
            f"(log lines: {self.compaction_log_lines})",
            f"manifest switches:       {self.manifest_switches}",
            f"SSTable numbers seen:    {len(self.sstables_seen)}",
            f"kills inside flush:      {self.kills_in_flush}",
            f"kills inside compaction: {self.kills_in_compaction}",
            f"kills inside manifest:   {self.kills_in_manifest}",
            f"kills before open done:  {self.kills_before_open}",
            f"kill modes:              {dict(sorted(self.kill_modes.items()))}",
            f"lsmdb verify (CLI) runs: {self.cli_verify_runs}",
            f"problems:                {len(self.problems)}",
        ]
        lines += [f"  - {p}" for p in self.problems[:20]]
        return "\n".join(lines)


class Model:
    """What the database must hold: acknowledged writes, plus at most one in flight."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[str, Any]] = {"default": {}}   # name -> acked options
        self.data: Data = {}
        self.inflight: dict[str, Any] | None = None

    def begin(self, op: dict[str, Any]) -> None:
        self.inflight = op

    def ack(self) -> None:
        op, self.inflight = self.inflight, None
        if op is not None:
            self.apply(op)

    def apply(self, op: dict[str, Any]) -> None:
        if op["kind"] in ("create", "alter"):
            self.tables[op["table"]] = op["options"]
            return
        for table, key, value in op["ops"]:
            self.data.setdefault(table, {})[bytes.fromhex(key)] = \
                None if value is None else bytes.fromhex(value)

    def expected(self, with_inflight: bool) -> dict[str, dict[bytes, bytes]]:
        data: Data = {t: dict(d) for t, d in self.data.items()}
        op = self.inflight
        if with_inflight and op is not None and op["kind"] == "write":
            for table, key, value in op["ops"]:
                data.setdefault(table, {})[bytes.fromhex(key)] = \
                    None if value is None else bytes.fromhex(value)
        return {t: {k: v for k, v in d.items() if v is not None} for t, d in data.items()}


@dataclass
class ChildRun:
    mode: str
    markers: dict[str, int] = field(default_factory=dict)   # F/C/M: depth at kill
    opened: bool = False
    error: str | None = None
    returncode: int | None = None


def _plan(rng: random.Random) -> tuple[str, float, int]:
    """(mode, delay after the trigger or total time, trigger count)."""
    mode = rng.choice(KILL_MODES)
    if mode == "time":
        return mode, rng.uniform(0.0, 1.2), 0
    if mode == "acks":
        return mode, rng.uniform(0, 0.002), rng.randint(1, 300)
    if mode == "flush":
        return mode, rng.uniform(0, 0.01), rng.randint(1, 4)
    if mode == "compaction":
        return mode, rng.uniform(0, 0.08), 1
    return mode, rng.uniform(0, 0.004), rng.randint(1, 6)


def _start_child(path: str, seed: int, rfd: int, wfd: int, tag: str, log_path: str,
                 use_fork: bool) -> int:
    """Start the writer; returns its pid.  Its stderr (and lsmdb's log) go to ``log_path``.

    A fork saves the half second an interpreter needs to import lsmdb; the
    parent holds no open database (and so no LOCK descriptor) when it forks.
    """
    if not use_fork:
        with open(log_path, "wb") as log_file:
            return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", path,
                                     str(seed), str(wfd), tag],
                                    pass_fds=(wfd,), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=log_file).pid
    pid = os.fork()
    if pid:
        return pid
    code = 3
    try:
        os.close(rfd)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 2)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        code = child_main(path, seed, wfd, tag)
    finally:
        os._exit(code)


def run_child(path: str, seed: int, tag: str, plan: tuple[str, float, int], model: Model,
              summary: Summary, log_path: str, use_fork: bool = True) -> ChildRun:
    """Start a child on ``path``, kill it as ``plan`` says, feed its messages to ``model``."""
    mode, delay, count = plan
    result = ChildRun(mode, {"F": 0, "C": 0, "M": 0})
    rfd, wfd = os.pipe()
    pid = _start_child(path, seed, rfd, wfd, tag, log_path, use_fork)
    os.close(wfd)
    started = time.monotonic()
    kill_at = started + delay if mode == "time" else None
    seen = {"A": 0, "F": 0, "C": 0, "M": 0}
    buf = b""

    def handle(line: str) -> None:
        nonlocal kill_at
        kind, _, rest = line.partition(" ")
        if kind == "B":
            _opid, _, payload = rest.partition(" ")
            if model.inflight is not None:
                summary.problems.append(f"{tag}: protocol: two writes in flight")
            model.begin(json.loads(payload))
        elif kind == "A":
            if model.inflight is not None and model.inflight["kind"] == "write":
                summary.acked_writes += 1
            model.ack()
            seen["A"] += 1
        elif kind == "R":
            result.opened = True
        elif kind == "E":
            result.error = rest
        elif kind[:1] in "FCM" and kind[1:] in ("+", "-"):
            mark = kind[0]
            if kind[1] == "+":
                result.markers[mark] += 1
                seen[mark] += 1
            else:
                result.markers[mark] -= 1
                summary.flushes += mark == "F"
                summary.compactions += mark == "C"
                summary.manifest_switches += mark == "M"
        trigger = {"acks": "A", "flush": "F", "compaction": "C", "manifest": "M"}.get(mode)
        if trigger and kill_at is None and seen[trigger] >= count:
            kill_at = time.monotonic() + delay

    def feed(data: bytes) -> None:
        nonlocal buf
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            handle(line.decode())

    try:
        deadline = started + MAX_CHILD_SECONDS
        while True:
            now = time.monotonic()
            until = min(deadline, kill_at) if kill_at is not None else deadline
            if now >= until:
                break
            ready, _, _ = select.select([rfd], [], [], until - now)
            if ready:
                data = os.read(rfd, 1 << 16)
                if not data:
                    break   # the child exited by itself
                feed(data)
        os.kill(pid, signal.SIGKILL)   # not reaped yet, so the pid is still ours
        result.returncode = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        pid = 0
        while data := os.read(rfd, 1 << 16):   # what it wrote before dying
            feed(data)
    finally:
        os.close(rfd)
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    # A line cut by the kill (no newline) was a message never completed: a
    # "B" cut short means the call was never made.
    return result


def check_database(path: str, model: Model, summary: Summary, tag: str,
                   run_cli: bool = False) -> bool:
    """Check the crashed database against ``model``; False when it cannot be opened."""
    problems = summary.problems
    for problem in verify_database(path):
        if problem.severity == "error":
            problems.append(f"{tag}: verify after the crash: {problem}")
    if run_cli:
        summary.cli_verify_runs += 1
        cli = subprocess.run([sys.executable, "-m", "lsmdb", "verify", path],
                             capture_output=True, text=True)
        if cli.returncode != 0:
            problems.append(f"{tag}: `lsmdb verify` exited {cli.returncode}: "
                            f"{(cli.stdout + cli.stderr).strip()[-500:]}")
    for name in os.listdir(path):
        if name.endswith(".sst") and name[:-4].isdigit():
            summary.sstables_seen.add(int(name[:-4]))
    try:
        db = lsmdb.open(path)
    except Exception as exc:
        problems.append(f"{tag}: reopen failed: {exc!r}")
        return False
    try:
        _compare(db, model, summary, tag)
    finally:
        db.close()
    return True


def _compare(db: lsmdb.DB, model: Model, summary: Summary, tag: str) -> None:
    problems = summary.problems
    op = model.inflight
    present = set(db.tables())
    for name, options in model.tables.items():
        if name not in present:
            problems.append(f"{tag}: acknowledged table {name!r} is missing")
            continue
        current = db.table(name).options
        for option, setting in options.items():
            if getattr(current, option) != setting:
                problems.append(f"{tag}: table {name!r} option {option} is "
                                f"{getattr(current, option)!r}, acknowledged {setting!r}")
    if op is not None and op["kind"] in ("create", "alter") and op["table"] in present:
        current = db.table(op["table"]).options
        if op["kind"] == "create" or all(getattr(current, k) == v
                                         for k, v in op["options"].items()):
            model.apply(op)
    for name in present - set(model.tables):
        model.tables[name] = {}   # only an in-flight create_table can add one
    observed = {name: dict(db.table(name).scan()) for name in present}
    for name, rows in observed.items():
        keys = set(model.data.get(name, {})) | set(rows)
        if op is not None and op["kind"] == "write":
            keys |= {bytes.fromhex(k) for t, k, _v in op["ops"] if t == name}
        table = db.table(name)
        for key in keys:
            summary.keys_checked += 1
            got = table.get(key)
            if got != rows.get(key):
                problems.append(f"{tag}: table {name!r} key {key!r}: get() gives {_short(got)}, "
                                f"scan gives {_short(rows.get(key))}")
    base, alt = model.expected(False), model.expected(True)
    tables = sorted(present | set(base) | set(alt))
    match_base = all(observed.get(t, {}) == base.get(t, {}) for t in tables)
    match_alt = all(observed.get(t, {}) == alt.get(t, {}) for t in tables)
    if op is not None and op["kind"] == "write":
        if match_alt and not match_base:
            summary.inflight_applied += 1
            model.ack()
        elif match_base:
            summary.inflight_dropped += 1
    if not (match_base or match_alt):
        shown = 0
        for t in tables:
            have, want, maybe = observed.get(t, {}), base.get(t, {}), alt.get(t, {})
            for key in sorted(set(have) | set(want) | set(maybe)):
                if have.get(key) not in (want.get(key), maybe.get(key)) and shown < 5:
                    shown += 1
                    problems.append(f"{tag}: table {t!r} key {key!r}: "
                                    f"found {_short(have.get(key))}, "
                                    f"acknowledged {_short(want.get(key))}"
                                    + (f" (or in flight {_short(maybe.get(key))})"
                                       if maybe.get(key) != want.get(key) else ""))
        if shown == 0:
            problems.append(f"{tag}: the in-flight batch was applied only in part")
        # Continue from what is there, so one loss is not reported again and again.
        model.data = {t: dict(observed.get(t, {})) for t in tables}
    model.inflight = None


def _short(value: bytes | None) -> str:
    if value is None:
        return "nothing"
    return repr(value.split(b":", 1)[0]) + f"+{len(value)}B"


def run(iterations: int, seed: int = 0, path: str | None = None, keep: bool = False,
        out: Callable[[str], None] = print, verbose: bool = False,
        use_fork: bool = hasattr(os, "fork")) -> Summary:
    """Run ``iterations`` kill-and-check rounds; returns the :class:`Summary`.

    ``use_fork=False`` starts each writer as a fresh interpreter instead.
    """
    made = path is None
    if path is None:
        path = os.path.join(tempfile.mkdtemp(prefix="lsmdb-crash-"), "db")
    path = os.path.abspath(path)
    if os.path.exists(path) and os.listdir(path):
        raise SystemExit(f"{path} is not empty: the crash test needs a fresh database")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    log_path = path.rstrip(os.sep) + ".child.log"
    rng = random.Random(seed)
    model = Model()
    summary = Summary()
    started = time.monotonic()
    for it in range(iterations):
        tag = f"i{it}"
        plan = _plan(rng)
        summary.kill_modes[plan[0]] = summary.kill_modes.get(plan[0], 0) + 1
        child = run_child(path, rng.getrandbits(32), tag, plan, model, summary, log_path,
                          use_fork)
        summary.iterations += 1
        with open(log_path, "rb") as f:
            summary.compaction_log_lines += f.read().count(b" compacted ")
        summary.kills_in_flush += child.markers["F"] > 0
        summary.kills_in_compaction += child.markers["C"] > 0
        summary.kills_in_manifest += child.markers["M"] > 0
        summary.kills_before_open += not child.opened
        if child.error is not None:
            summary.problems.append(f"{tag}: child error: {child.error} (log {log_path})")
        elif child.returncode != -signal.SIGKILL:
            summary.problems.append(f"{tag}: child exited with {child.returncode} "
                                    f"(log {log_path})")
        if verbose:
            out(f"{tag}: mode={plan[0]} markers={child.markers} opened={child.opened} "
                f"inflight={model.inflight is not None}")
        before = len(summary.problems)
        ok = check_database(path, model, summary, tag, run_cli=it == iterations - 1)
        if len(summary.problems) > before:
            shutil.copy(log_path, f"{log_path}.{tag}")
        if not ok:
            break
    summary.seconds = time.monotonic() - started
    if keep or summary.problems:
        out(f"database kept at {path}")
    elif made:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    else:
        shutil.rmtree(path, ignore_errors=True)
        if os.path.exists(log_path):
            os.unlink(log_path)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--path", default=None, help="database directory (must be new or empty)")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--exec", action="store_true",
                        help="start each writer as a new interpreter instead of a fork")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"crashtest: seed {seed}, {args.iterations} iterations")
    summary = run(args.iterations, seed, args.path, args.keep, verbose=args.verbose,
                  use_fork=not args.exec and hasattr(os, "fork"))
    print(summary.text())
    return 1 if summary.problems else 0


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        sys.exit(child_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]))
    sys.exit(main())
