"""Exact binomial bounds, for the statistical tests of probabilistic structures."""

from __future__ import annotations

import math


def _binom_logpmf(x: int, trials: int, q: float) -> float:
    return (math.lgamma(trials + 1) - math.lgamma(x + 1) - math.lgamma(trials - x + 1)
            + x * math.log(q) + (trials - x) * math.log1p(-q))


def binom_lower(trials: int, q: float, alpha: float) -> int:
    """Largest L with P(X < L) <= alpha for X ~ Binomial(trials, q) (exact)."""
    if q <= 0.0:
        return 0
    sd = math.sqrt(trials * q * (1 - q))
    x = max(0, int(trials * q - 40 * sd - 50))  # the mass below is < 1e-300
    cdf = 0.0
    while x <= trials:
        p = math.exp(_binom_logpmf(x, trials, q))
        if cdf + p > alpha:
            return x
        cdf += p
        x += 1
    return trials


def binom_upper(trials: int, q: float, alpha: float) -> int:
    """Smallest U with P(X > U) <= alpha for X ~ Binomial(trials, q) (exact)."""
    if q >= 1.0:
        return trials
    sd = math.sqrt(trials * q * (1 - q))
    x = min(trials, int(trials * q + 40 * sd + 50))  # the mass above is < 1e-300
    tail = 0.0
    while x >= 0:
        p = math.exp(_binom_logpmf(x, trials, q)) if q > 0 else float(x == 0)
        if tail + p > alpha:
            return x
        tail += p
        x -= 1
    return 0
