"""Expiring values: a time to live, the clock it is counted on, and what an expired entry is.

A put with a time to live (``ttl=`` seconds, or the table option
``default_time_to_live``) stores an *expiring value*: inside lsmdb, wherever
values travel -- memtables, WAL records, decoded blocks, merges, compaction
-- it is the tuple ``(value, expires)``, ``expires`` the microsecond
(since the Unix epoch, on the database's clock) from which it reads as
absent.  Plain values stay ``bytes`` and tombstones ``None``, so data that
never expires pays nothing for the tuple: every reader tests for it only
where a value is not bytes.

An expired value is a tombstone: it hides every older version of its key,
as a delete would, whether or not a compaction has run.  Reads decide with
:func:`live` (a point read, at the moment it runs) or :func:`resolve` (a
scan's chunk, at the moment the scan took its view).  Compaction turns an
expired value into a tombstone, which it drops only where no older data of
the key can lie below (lsmdb.compaction).

The clock is the database's (``lsmdb.open(path, clock=...)``: a callable
returning seconds since the epoch, as ``time.time`` does); tests inject one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

#: The longest time to live (seconds): twenty years, Cassandra's bound.
MAX_TTL_SECONDS = 20 * 365 * 24 * 3600

#: ``expires`` values lie in [1, MAX_EXPIRES]: they are u64 on disk, 0 meaning "never".
MAX_EXPIRES = (1 << 63) - 1

#: An expiring value inside lsmdb: (value, expires in microseconds since the epoch).
Expiring = tuple[bytes, int]


def system_now_us() -> int:
    """The system clock in microseconds since the epoch (the default clock)."""
    return time.time_ns() // 1000


def clock_us(clock: Callable[[], float] | None) -> Callable[[], int]:
    """The microsecond clock of a database opened with ``clock`` (None: the system's)."""
    if clock is None:
        return system_now_us
    if not callable(clock):
        raise TypeError(f"option 'clock' must be a callable returning seconds, got "
                        f"{type(clock).__name__}")

    def now_us() -> int:
        t = clock()
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            raise TypeError(f"the database's clock must return seconds (an int or a float), "
                            f"got {t!r}")
        return round(t * 1_000_000)

    return now_us


def validate_ttl(ttl: Any, name: str = "ttl") -> float:
    """A time to live in seconds: 0 (never expires) up to MAX_TTL_SECONDS."""
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(ttl).__name__}")
    if not (0 <= ttl <= MAX_TTL_SECONDS):  # NaN fails too
        raise ValueError(f"{name} must be between 0 (never expires) and {MAX_TTL_SECONDS} "
                         f"seconds, got {ttl!r}")
    return ttl


def expires_at(now_us: int, ttl: float) -> int:
    """The microsecond a value written at ``now_us`` with ``ttl`` seconds expires."""
    expires = now_us + round(ttl * 1_000_000)
    if 0 < expires <= MAX_EXPIRES:
        return expires
    return 1 if expires < 1 else MAX_EXPIRES


def live(value: Any, now_us: int) -> Any:
    """What ``value`` (bytes, None, or an expiring tuple) reads as at ``now_us``:
    the bytes, or None (a tombstone) once it has expired."""
    if type(value) is tuple:
        return value[0] if now_us < value[1] else None
    return value


def resolve(values: list[Any], now_us: int, keep: bool = False) -> list[Any]:
    """``values`` with every expiring one read at ``now_us`` (see :func:`live`;
    ``keep``: one still live stays a tuple, for an export of its time left);
    the list itself when none is expiring."""
    if not has_expiring(values):
        return values
    if keep:
        return [None if type(v) is tuple and now_us >= v[1] else v for v in values]
    return [live(v, now_us) for v in values]


def has_expiring(values: list[Any]) -> bool:
    """Whether any of ``values`` is an expiring tuple (the type scan runs in C)."""
    return tuple in set(map(type, values))


def remaining_seconds(value: Any, now_us: int) -> float | None:
    """An expiring value's time left at ``now_us`` (seconds, at least a
    microsecond -- 0 would mean "never" -- and at most MAX_TTL_SECONDS, what a
    put takes: a clock set back since may make it more), or None for one
    that never expires."""
    if type(value) is not tuple:
        return None
    return min(max(value[1] - now_us, 1) / 1_000_000, float(MAX_TTL_SECONDS))


def payload_len(value: Any) -> int:
    """The bytes a value holds (0 for a tombstone), expiring or not."""
    if value is None:
        return 0
    if type(value) is tuple:
        return len(value[0])
    return len(value)
