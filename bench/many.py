"""``db.get_many`` against a loop of ``db.get`` on the same keys.

Used by :mod:`bench.peers` on its lsmdb store after the timed gets: the same
keys answered both ways, slices interleaved (loop, many, many, loop, ...) so
both meet the same background load; get_many answers chunks of
:data:`CHUNK_KEYS` keys per call.  Each rate is per key; the ratio is the
median over slices of many / loop.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from typing import Any

from .common import SLICES, Timer, per_second

CHUNK_KEYS = 1_000


def time_get_many(db: Any, keys: Sequence[bytes], expected_found: int,
                  slices: int = SLICES) -> dict[str, Any]:
    """Loop of get vs get_many over ``keys``; found counts checked against ``expected_found``.

    Example:
        >>> import lsmdb, tempfile
        >>> db = lsmdb.open(tempfile.mkdtemp())
        >>> db.put(b"a", b"1")
        >>> r = time_get_many(db, [b"a", b"b"] * 50, 50)
        >>> (r["found_loop"], r["found_many"], r["correct"])
        (50, 50, True)
        >>> db.close()
    """
    n = len(keys)
    cuts = [n * i // slices for i in range(slices + 1)]
    rates: dict[str, list[float]] = {"loop": [], "many": []}
    found = {"loop": 0, "many": 0}
    get, get_many = db.get, db.get_many
    for s, (lo, hi) in enumerate(itertools.pairwise(cuts)):
        if lo == hi:
            continue
        part = keys[lo:hi]
        chunks = [list(part[i:i + CHUNK_KEYS]) for i in range(0, len(part), CHUNK_KEYS)]
        for way in (("loop", "many") if s % 2 == 0 else ("many", "loop")):
            hits = 0
            if way == "loop":
                with Timer() as t:
                    for key in part:
                        if get(key) is not None:
                            hits += 1
            else:
                with Timer() as t:
                    for chunk in chunks:
                        hits += len(chunk) - get_many(chunk).count(None)
            found[way] += hits
            rates[way].append(per_second(hi - lo, t.seconds))
    correct = found["loop"] == found["many"] == expected_found
    return {"keys": n, "chunk_keys": CHUNK_KEYS, "found_loop": found["loop"],
            "found_many": found["many"], "expected_found": expected_found, "correct": correct,
            "loop_ops_per_s": statistics.median(rates["loop"]),
            "many_ops_per_s": statistics.median(rates["many"]),
            "ratio": statistics.median(m / g for m, g in zip(rates["many"], rates["loop"],
                                                             strict=True)),
            "slice_rates": rates}
