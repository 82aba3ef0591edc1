"""Helpers shared by the benchmarks: timing, the kernel's read count, intervals, output.

Nothing here knows about lsmdb's internals; the benchmarks own what they measure.
"""

from __future__ import annotations

import datetime
import gc
import itertools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Two-sided 99 % standard normal quantile (z such that P(|Z| <= z) = 0.99).
Z99 = 2.5758293035489004

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------ progress
class Progress:
    """Progress lines on stderr, stamped with the seconds since the run started."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def __call__(self, message: str) -> None:
        if self.enabled:
            print(f"[{self.elapsed():7.1f}s] {message}", file=sys.stderr, flush=True)


# -------------------------------------------------------------------- timing
class Timer:
    """Wall-clock seconds of a ``with`` block, the cyclic garbage collector paused.

    Pausing the collector (as ``timeit`` does) keeps a collection triggered by
    an earlier step from landing in the measured loop.

    Example:
        >>> with Timer() as t:
        ...     _ = sum(range(1000))
        >>> t.seconds > 0
        True
    """

    seconds: float = 0.0

    def __enter__(self) -> Timer:
        self._gc_was_enabled = gc.isenabled()
        gc.disable()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._start
        if self._gc_was_enabled:
            gc.enable()


def per_second(ops: int, seconds: float) -> float:
    """ops / seconds (inf for a zero-length interval, which only a clock can produce)."""
    return ops / seconds if seconds > 0 else math.inf


#: A timed loop of gets runs as this many equal slices; its rate is their median.
SLICES = 5


@dataclass
class GetTiming:
    """A timed loop of gets: how many found, and how fast.

    The loop runs as :data:`SLICES` consecutive slices; :attr:`per_second` is
    the median of their rates, so a burst of load from another process that
    hits one slice does not move the result (the machines are shared).
    """

    gets: int
    found: int
    seconds: float                      # the whole loop
    slice_rates: list[float] = field(default_factory=list)

    @property
    def per_second(self) -> float:
        return statistics.median(self.slice_rates) if self.slice_rates else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {"gets": self.gets, "found": self.found, "seconds": self.seconds,
                "per_second": self.per_second, "per_second_whole_loop":
                per_second(self.gets, self.seconds), "slice_rates": self.slice_rates}


def time_gets(get: Callable[[bytes], Any], keys: Sequence[bytes],
              slices: int = SLICES) -> GetTiming:
    """Call ``get`` on every key, timed in ``slices`` slices; count the non-None answers.

    Example:
        >>> t = time_gets({b"a": 1}.get, [b"a", b"b"] * 50)
        >>> (t.gets, t.found, len(t.slice_rates))
        (100, 50, 5)
    """
    return time_gets_interleaved([get], keys, slices)[0]


def time_gets_interleaved(getters: Sequence[Callable[[bytes], Any]], keys: Sequence[bytes],
                          slices: int = SLICES) -> list[GetTiming]:
    """Like :func:`time_gets` for several getters, their slices taken in turn.

    Slice 1 of every getter, then slice 2 of every getter in reverse order,
    and so on (A B, B A, A B, ...): getters being compared meet the same
    background load and neither always goes first, so the ratio of their
    rates in one slice is a fair comparison (see :func:`median_ratio`).
    """
    n = len(keys)
    cuts = [n * i // slices for i in range(slices + 1)]
    found = [0] * len(getters)
    seconds = [0.0] * len(getters)
    rates: list[list[float]] = [[] for _ in getters]
    for s, (lo, hi) in enumerate(itertools.pairwise(cuts)):
        if lo == hi:
            continue
        part = keys[lo:hi]
        order = list(enumerate(getters))
        for g, get in (order if s % 2 == 0 else order[::-1]):
            hits = 0
            with Timer() as t:
                for key in part:
                    if get(key) is not None:
                        hits += 1
            found[g] += hits
            seconds[g] += t.seconds
            rates[g].append(per_second(hi - lo, t.seconds))
    return [GetTiming(n, found[g], seconds[g], rates[g]) for g in range(len(getters))]


def median_ratio(a: GetTiming, b: GetTiming) -> float:
    """Median over slices of a's rate / b's rate (timings from :func:`time_gets_interleaved`).

    Example:
        >>> fast = GetTiming(6, 0, 1.0, [4.0, 6.0, 9.0])
        >>> slow = GetTiming(6, 0, 3.0, [2.0, 2.0, 3.0])
        >>> median_ratio(fast, slow)
        3.0
    """
    return statistics.median(x / y for x, y in zip(a.slice_rates, b.slice_rates, strict=True))


# ---------------------------------------------------------- kernel read count
class ProcIoCounter:
    """One field of this process's I/O accounting (/proc/self/io), read on demand.

    Where the file is missing (not Linux) or unreadable (some containers),
    or has no such field, :attr:`available` is False and every delta is
    None; :attr:`unavailable_reason` says why.  With ``calibrate``, the
    counter's own change from one reading to the next (reading the file is
    itself one read system call) is measured at construction and
    :meth:`delta` subtracts it.
    """

    PATH = "/proc/self/io"

    def __init__(self, field: str, calibrate: bool = False) -> None:
        self.field = field
        self.unavailable_reason: str | None = None
        self.overhead = 0
        first = self._read()
        if first is None or not calibrate:
            return
        gaps = []
        for _ in range(5):
            a = self._read()
            b = self._read()
            assert a is not None and b is not None
            gaps.append(b - a)
        self.overhead = min(gaps)

    @property
    def available(self) -> bool:
        return self.unavailable_reason is None

    def _read(self) -> int | None:
        if self.unavailable_reason is not None:
            return None
        try:
            fd = os.open(self.PATH, os.O_RDONLY)
            try:
                text = os.read(fd, 4096).decode("ascii", "replace")  # one read(2)
            finally:
                os.close(fd)
        except OSError as exc:
            self.unavailable_reason = f"{self.PATH} is not readable here ({exc.strerror})"
            return None
        for line in text.splitlines():
            name, _, value = line.partition(":")
            if name.strip() == self.field:
                return int(value)
        self.unavailable_reason = f"{self.PATH} has no {self.field} field"
        return None

    def snapshot(self) -> int | None:
        """The current count (None when unavailable); pass it to :meth:`delta` later."""
        return self._read()

    def delta(self, start: int | None) -> int | None:
        """The change since ``start``, less the cost of reading the counter."""
        end = self._read()
        if start is None or end is None:
            return None
        return end - start - self.overhead


class ReadSyscalls(ProcIoCounter):
    """The kernel's count of read system calls of this process (``syscr``).

    ``pread`` counts as a read, so around a loop of gets the delta is the
    number of data blocks the engine really asked the kernel for -- an
    independent check of the engine's own ``block_reads`` counter.
    """

    def __init__(self) -> None:
        super().__init__("syscr", calibrate=True)


class DeviceReads(ProcIoCounter):
    """Bytes this process caused to be read from the storage device (``read_bytes``).

    A read the page cache serves adds nothing; one that goes to the device
    adds what the kernel fetched (read-ahead included), whichever thread
    asked.  Around timed gets it says whether they were timed on data in the
    page cache: a machine can page out file pages that sat unused for a while
    (this one's kernel runs a DAMON scheme that pages out page-cache pages
    not accessed for about a minute, free memory or not).
    """

    def __init__(self) -> None:
        super().__init__("read_bytes")


# ------------------------------------------------------------------- statistics
def wilson_interval(successes: int, trials: int, z: float = Z99) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (default: 99 %).

    Better than the normal approximation for the tiny rates a Bloom filter
    is measured at, and never leaves [0, 1].

    Example:
        >>> lo, hi = wilson_interval(100, 10_000)
        >>> round(lo, 4), round(hi, 4)
        (0.0077, 0.0129)
        >>> wilson_interval(0, 0)
        (0.0, 1.0)
    """
    if trials <= 0:
        return 0.0, 1.0
    p = successes / trials
    z2 = z * z
    denom = 1.0 + z2 / trials
    centre = (p + z2 / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / denom
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == trials else min(1.0, centre + half)
    return lo, hi


# ------------------------------------------------------------------- formatting
def fmt_int(n: int | None) -> str:
    return "n/a" if n is None else f"{n:,}"


def fmt_rate(x: float | None) -> str:
    """Operations per second, three significant digits: 812, 45.6k, 1.99M."""
    if x is None or math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "inf"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= scale:
            return f"{x / scale:.3g}{suffix}"
    return f"{x:.3g}"


def fmt_pct(p: float | None, digits: int = 3) -> str:
    """A rate as a percentage with ``digits`` significant digits; never rounds up to 100%.

    Example:
        >>> [fmt_pct(p) for p in (0.01, 0.000094, 0.9995, 1.0, 0.0)]
        ['1.00%', '0.00940%', '>99.9%', '100%', '0%']
    """
    if p is None or math.isnan(p):
        return "n/a"
    if p == 0:
        return "0%"
    if p >= 1:
        return f"{100 * p:.0f}%"
    text = f"{100 * p:#.{digits}g}".removesuffix(".")
    if float(text) >= 100:
        return f">{100 - 10.0 ** (2 - digits):.{digits - 2}f}%"
    return text + "%"


def fmt_ratio(r: float | None) -> str:
    if r is None or math.isnan(r):
        return "n/a"
    return f"{r:.3g}x"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Aligned text table: first column left-aligned, the others right-aligned.

    Example:
        >>> print(format_table(["name", "n"], [["a", "1"], ["bb", "22"]]))
        name   n
        ----  --
        a      1
        bb    22
    """
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        parts = [cells[0].ljust(widths[0])]
        parts += [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join(parts).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(row) for row in rows]
    return "\n".join(out)


def print_section(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]],
                  notes: Sequence[str] = ()) -> None:
    """A titled table and its notes on stdout."""
    print(title)
    print()
    print(format_table(headers, rows))
    if notes:
        print()
        for note in notes:
            print(f"  {note}")
    print()


# ----------------------------------------------------------------- provenance
def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", REPO_ROOT, *args], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or None


def machine_info() -> dict[str, Any]:
    """Date, cores, CPU, Python, the lsmdb commit the numbers belong to and whether
    its C speedups ran."""
    import lsmdb

    status = _git("status", "--porcelain", "--", "lsmdb")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "lsmdb_version": getattr(lsmdb, "__version__", None),
        "lsmdb_commit": _git("rev-parse", "--short", "HEAD"),
        "lsmdb_uncommitted_changes": None if status is None else bool(status),
        "lsmdb_speedups": bool(getattr(lsmdb, "SPEEDUPS", False)),
        "load_average_at_start": load_average(),
    }


def load_average() -> list[float] | None:
    """1, 5 and 15-minute load averages: above the core count, other work shared the CPU."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def describe_machine(info: dict[str, Any]) -> str:
    commit = info["lsmdb_commit"] or "unknown commit"
    if info["lsmdb_uncommitted_changes"]:
        commit += " + uncommitted changes in lsmdb/"
    load = info.get("load_average_at_start")
    load_text = f"; load average {load[0]:.2f} at start" if load else ""
    speedups = "on" if info.get("lsmdb_speedups") else "off"
    return (f"{info['date']}; {info['cores']} cores ({info['cpu'] or 'unknown CPU'}); "
            f"{info['python']}; {info['platform']}; lsmdb {info['lsmdb_version']} ({commit}; "
            f"C speedups {speedups}){load_text}")


# ----------------------------------------------------------------------- JSON
def _json_safe(obj: Any) -> Any:
    """Replace NaN and infinities (not JSON) by None, recursively."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def write_json(path: str, obj: Any) -> None:
    """Write ``obj`` as indented, strict JSON (no NaN) to ``path``."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(_json_safe(obj), f, indent=2, allow_nan=False)
        f.write("\n")
