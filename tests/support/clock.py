"""A clock a test sets, for expiring values (``lsmdb.open(path, clock=Clock())``)."""

from __future__ import annotations

#: Where a test clock starts: seconds since the epoch (November 2023).
T0 = 1_700_000_000.0


class Clock:
    """Seconds since the epoch, as ``time.time`` returns, at ``t``: the test moves it
    (in steps that are exact in a float, halves of a second, where it compares
    expiry to the microsecond)."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t
