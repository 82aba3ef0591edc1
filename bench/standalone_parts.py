"""Parts 3 and 4 of the absent-key benchmark: a standalone BloomFilter, no database.

3. k_sweep   -- a filter at 8 bits/key probed with k = 1 ... 20: the optimum
                seen from both sides.
4. overfill  -- a filter sized for n keys loaded with n, 2n, 3n keys.
"""

from __future__ import annotations

import math
from typing import Any

from lsmdb.filters.bloom import BloomFilter, predicted_fpr_for
from lsmdb.filters.hashing import key_hash

from .common import Progress, Timer, fmt_int, fmt_pct, print_section
from .filter_db import GUARANTEE_FP_CHANCE
from .fpr import OUTSIDE_NOTE, fmt_ci, fmt_predicted, fpr_fields
from .keys import key_of

K_SWEEP_BITS_PER_KEY = 8
K_SWEEP = (1, 2, 4, 6, 8, 12, 20)
OVERFILL_LOADS = (1, 2, 3)


# ---------------------------------------------------------------- 3. k sweep
def key_hashes(numbers: range) -> list[int]:
    """The 64-bit hash every lsmdb filter probes ``key_of(n)`` with."""
    return [key_hash(key_of(n)) for n in numbers]


def split_hashes(hashes: list[int]) -> tuple[list[int], list[int]]:
    """(h1 list, h2 list): the double-hashing halves of each 64-bit hash."""
    return [h & 0xFFFFFFFF for h in hashes], [h >> 32 for h in hashes]


def count_hits(bloom: BloomFilter, h1s: list[int], h2s: list[int]) -> int:
    probe = bloom.may_contain_hash
    return sum(1 for a, b in zip(h1s, h2s, strict=True) if probe(a, b))


def part_k_sweep(n: int, probes: int, progress: Progress) -> dict[str, Any]:
    """A standalone filter of 8 bits/key for ``n`` keys, probed with each k in K_SWEEP."""
    m = K_SWEEP_BITS_PER_KEY * n
    added = key_hashes(range(0, 2 * n, 2))           # even keys are added ...
    added_h1, added_h2 = split_hashes(added)
    probe_h1, probe_h2 = split_hashes(key_hashes(range(1, 2 * probes, 2)))  # ... odd probed
    rows = []
    with Timer() as t:
        for k in K_SWEEP:
            bloom = BloomFilter.with_size(m, k)
            for h in added:
                bloom.add_hash(h)
            false_negatives = n - count_hits(bloom, added_h1, added_h2)
            rows.append({
                "k": k, "keys": n, "bits": m, "bits_per_key": m / n,
                "fill_ratio": bloom.fill_ratio,
                "predicted_from_fill": bloom.estimated_fpr_from_fill(),
                "false_negatives": false_negatives,
                **fpr_fields(count_hits(bloom, probe_h1, probe_h2), probes, bloom.predicted_fpr()),
            })
    progress(f"k sweep: {len(K_SWEEP)} filters of {n:,} keys, {probes:,} probes each, "
             f"in {t.seconds:.1f}s")
    best_predicted = min(rows, key=lambda r: r["predicted_fpr"])["k"]
    best_measured = min(rows, key=lambda r: r["measured_fpr"])["k"]
    k_star = K_SWEEP_BITS_PER_KEY * math.log(2)
    for r in rows:
        r["side_of_optimum"] = "below" if r["k"] < k_star else "above"
    notes = [OUTSIDE_NOTE,
             (f"optimum in theory k* = {K_SWEEP_BITS_PER_KEY} ln 2 = {k_star:.2f}; lowest "
              f"predicted FPR here at k = {best_predicted}, lowest measured at "
              f"k = {best_measured}"),
             "fill^k: the rate the filter's actual bit pattern gives (fill = share of bits set)"]
    if any(r["false_negatives"] for r in rows):
        notes.append("FALSE NEGATIVES in the standalone filter: see the false_negatives column")
    return {"title": f"3. k sweep: standalone BloomFilter, {K_SWEEP_BITS_PER_KEY} bits/key, "
                     f"{n:,} keys, {probes:,} absent probes per k",
            "k_optimal_theory": k_star, "k_best_predicted": best_predicted,
            "k_best_measured": best_measured, "rows": rows, "notes": notes}


def print_k_sweep(part: dict[str, Any]) -> None:
    marks = {part["k_best_predicted"]: "predicted", part["k_best_measured"]: "measured"}
    if part["k_best_predicted"] == part["k_best_measured"]:
        marks = {part["k_best_predicted"]: "predicted + measured"}
    rows = [[str(r["k"]), f"{r['bits_per_key']:g}", f"{r['fill_ratio']:.3f}",
             fmt_int(r["false_negatives"]), fmt_int(r["false_positives"]),
             fmt_pct(r["measured_fpr"]), fmt_ci(r), fmt_predicted(r),
             fmt_pct(r["predicted_from_fill"]), f"{r['side_of_optimum']} k*",
             marks.get(r["k"], "")] for r in part["rows"]]
    print_section(part["title"], ["k", "bits/key", "fill", "false neg", "false pos",
                                  "measured FPR", "99% interval", "predicted FPR", "fill^k",
                                  "side", "lowest"], rows, part["notes"])


# --------------------------------------------------------------- 4. overfill
def part_overfill(n: int, probes: int, progress: Progress) -> dict[str, Any]:
    """A filter sized for ``n`` keys at the default fp chance, loaded with 1x, 2x, 3x n."""
    bloom = BloomFilter(n, GUARANTEE_FP_CHANCE)
    added = key_hashes(range(0, 2 * n * max(OVERFILL_LOADS), 2))
    probe_h1, probe_h2 = split_hashes(key_hashes(range(1, 2 * probes, 2)))
    rows = []
    loaded = 0
    with Timer() as t:
        for load in OVERFILL_LOADS:
            for h in added[loaded:load * n]:
                bloom.add_hash(h)
            loaded = load * n
            added_h1, added_h2 = split_hashes(added[:loaded])
            rows.append({
                "load": load, "keys": loaded, "capacity": n, "bits": bloom.m,
                "hashes": bloom.k, "bits_per_key": bloom.m / loaded,
                "fill_ratio": bloom.fill_ratio,
                "predicted_from_fill": bloom.estimated_fpr_from_fill(),
                "false_negatives": loaded - count_hits(bloom, added_h1, added_h2),
                **fpr_fields(count_hits(bloom, probe_h1, probe_h2), probes,
                             predicted_fpr_for(loaded, bloom.m, bloom.k)),
            })
    progress(f"overfill: {len(OVERFILL_LOADS)} loads, {probes:,} probes each, in {t.seconds:.1f}s")
    return {"title": f"4. Overfill: a filter sized for {n:,} keys at fp chance "
                     f"{GUARANTEE_FP_CHANCE:g} ({rows[0]['bits']:,} bits, "
                     f"k = {rows[0]['hashes']}), "
                     f"{probes:,} absent probes per row",
            "rows": rows, "notes": [OUTSIDE_NOTE]}


def print_overfill(part: dict[str, Any]) -> None:
    rows = [[f"{r['load']}x", fmt_int(r["keys"]), f"{r['bits_per_key']:.2f}",
             f"{r['fill_ratio']:.3f}", fmt_int(r["false_negatives"]),
             fmt_pct(r["measured_fpr"]), fmt_ci(r), fmt_predicted(r),
             fmt_pct(r["predicted_from_fill"])] for r in part["rows"]]
    print_section(part["title"], ["load", "keys", "bits/key", "fill", "false neg", "measured FPR",
                                  "99% interval", "predicted FPR", "fill^k"], rows, part["notes"])

