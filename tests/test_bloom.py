"""lsmdb.filters.bloom.BloomFilter: sizing, statistics, serialisation, the filter in an SSTable.

The statistical tests use keys from a fixed-seed RNG, but they do not rely on
the seed being lucky: every bound is derived below so that a correct filter
fails this whole module with probability below ``ALPHA_MODULE`` (one in a
million) *whatever the seed*.  ``pytest --bloom-seed N`` runs them with other
keys.
"""

from __future__ import annotations

import io
import math
import random
import statistics
import struct
import zlib
from array import array
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lsmdb
import lsmdb.fastpath
import lsmdb.filters.bloom as bloom_mod
import lsmdb.readpath
import lsmdb.table
from lsmdb.filters import hashing as hashing_mod
from lsmdb.filters.bloom import (
    FILTER_HEADER,
    FILTER_HEADER_SIZE,
    BloomFilter,
    predicted_fpr_for,
    split_hash,
)
from lsmdb.filters.hashing import key_hash
from lsmdb.sstable_format import MISSING
from lsmdb.sstable_reader import SSTableReader
from lsmdb.sstable_writer import SSTableBuilder
from tests.support.binomial import binom_lower, binom_upper
from tests.support.reading import find

LN2 = math.log(2)

FP_CHANCES = (0.1, 0.01, 0.001)
SIZES = (1_000, 10_000, 50_000)
PROBES = 200_000          # distinct keys known to be absent, probed per filter
OVERFILL_CAPACITY = 10_000

DESIGN_CASES = [(p, n) for p in FP_CHANCES for n in SIZES]
OVERFILL_CASES = list(FP_CHANCES)


# ---------------------------------------------------------------------------
# The statistical bound
#
# Failure budget.  A correct filter may fail this module with probability at
# most ALPHA_MODULE = 1e-6 per run.  The budget is split evenly (Bonferroni)
# over the statistical cases (9 at design load, 3 overfilled); within a case,
# half goes to "the filter's bit pattern is atypical" and a quarter to each
# tail of the false-positive count.
#
# Why not a plain binomial bound around predicted_fpr()?  Given one filter,
# each absent key is a false positive independently with the *filter's* rate
# q, so the count is Binomial(PROBES, q) exactly.  But q itself varies from
# filter to filter with the fraction of bits that happen to be set, and for
# small filters that spread is larger than the binomial noise: at n = 1000,
# p = 0.1 (m = 4793, k = 3) the sd of q is ~2.5e-3 against a binomial sd of
# ~6.7e-4 for 200k probes, so a binomial-only bound at 5 sigma would fail a
# correct filter in several percent of seeds.  Hence two steps:
#
# 1. The fill ratio F (bits set / m).  After T = k*n probe writes into m bits
#    the number of zero bits has mean m(1-1/m)^T and the classical occupancy
#    variance m(1-1/m)^T + m(m-1)(1-2/m)^T - m^2(1-1/m)^(2T).  It is a sum
#    of m weakly dependent indicators with fill near 1/2 (skew ~0), so a
#    normal approximation holds far into the tail; we still widen the sd by
#    FILL_SD_SAFETY = 1.25 to cover that approximation (and a key's k probes
#    being distinct, which only shrinks the variance).  The centre is the
#    fill predicted_fpr() implies, predicted_fpr()**(1/k) = 1 - e^(-kn/m),
#    widened to also cover the exact finite-m means.
#
# 2. The false-positive rate q of a filter with fill F.  With double hashing
#    a probe walks h1, h1+s, h1+2s, ... mod m; when s has additive order
#    d < k in Z_m the walk revisits bits and tests only d distinct ones.  The
#    number of s in [0, m) of order d is phi(d) (d | m), so
#        q(F) = sum over d | m of phi(d)/m * F^min(k, d)
#    -- F^k plus an exactly computed excess (5 % of q at m = 14378, k = 10:
#    m = 2 * 7189 makes s = 0 and s = m/2 degenerate).  Two second-order
#    effects are bounded rather than modelled: (a) a query that meets two of
#    an inserted key's probe positions (probability <= k^2 (k-1)^2 n / m^2,
#    a union bound over index pairs and gcd cases) then needs only k-2 more
#    set bits: add k^2 (k-1)^2 n / m^2 * F^(k-2) to the upper end; (b) bits of
#    a real filter are not independent (for a given number of set bits,
#    P(k given bits set) = prod (Fm-i)/(m-i), slightly below F^k): widen q
#    by a relative k^2 / (F m) both ways.
#
# The count must then lie in [L, U] where P(Binomial(PROBES, q_lo) < L) and
# P(Binomial(PROBES, q_hi) > U) are each <= the tail budget, computed
# exactly (log-space pmf summed term by term, no normal approximation).
#
# The bound was checked against hundreds of filters built from other seeds:
# the standardised residuals have sd ~1 and sit well inside it.
#
# Format 2 (partitioned, what lsmdb writes) is the same model with k
# partitions of s = m // k bits, each receiving one probe write per key: the
# zero bits are k independent occupancies of n throws into s bins (mean
# k*s*(1-1/s)^n, variance k times the one-partition variance), and a probe
# tests one bit of each partition, so q(F) = F^k with F the fill inside the
# partitions (no degenerate steps: equal g_i land in different partitions).
# The same relative widening and pair slack apply.
# ---------------------------------------------------------------------------

VERSIONS = (1, 2)
ALPHA_MODULE = 1e-6
ALPHA_CASE = ALPHA_MODULE / (len(VERSIONS) * (len(DESIGN_CASES) + len(OVERFILL_CASES)))
ALPHA_FILL = ALPHA_CASE / 2            # two-sided, on the fill ratio
ALPHA_TAIL = ALPHA_CASE / 4            # each tail of the binomial count
Z_FILL = statistics.NormalDist().inv_cdf(1 - ALPHA_FILL / 2)   # ~5.6
FILL_SD_SAFETY = 1.25


def _divisors(m: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(m) + 1) if m % d == 0]
    return sorted(set(small + [m // d for d in small]))


def _totient(n: int) -> int:
    result, rest, p = n, n, 2
    while p * p <= rest:
        if rest % p == 0:
            while rest % p == 0:
                rest //= p
            result -= result // p
        p += 1
    if rest > 1:
        result -= result // rest
    return result


def double_hashing_fpr(m: int, k: int, fill: float) -> float:
    """False-positive rate of a filter with this fill ratio, degenerate steps included."""
    return sum(_totient(d) * fill ** min(k, d) for d in _divisors(m)) / m


def fill_interval(m: int, k: int, n: int, predicted: float) -> tuple[float, float]:
    """Where the fill ratio of a correct filter with n keys lies, but with prob. ALPHA_FILL."""
    throws = k * n
    log_e1 = throws * math.log1p(-1 / m)
    e1 = math.exp(log_e1)
    e2 = math.exp(throws * math.log1p(-2 / m))
    var_zero = m * e1 + m * (m - 1) * e2 - (m * e1) ** 2
    sd = math.sqrt(max(var_zero, 0.0)) / m
    centres = (predicted ** (1 / k),          # the fill predicted_fpr() stands for
               1 - e1,                          # k*n independent probe writes
               1 - (1 - k / m) ** n)            # k distinct bits per key
    width = Z_FILL * FILL_SD_SAFETY * sd
    return max(0.0, min(centres) - width), min(1.0, max(centres) + width)


def fill_interval_partitioned(m: int, k: int, n: int, predicted: float) -> tuple[float, float]:
    """fill_interval for format 2: k partitions of s = m // k bits, n throws each
    (the fill is over all m bits, the m - k*s past the partitions staying 0)."""
    s = m // k
    e1 = math.exp(n * math.log1p(-1 / s))
    e2 = math.exp(n * math.log1p(-2 / s))
    var_zero = k * (s * e1 + s * (s - 1) * e2 - (s * e1) ** 2)
    sd = math.sqrt(max(var_zero, 0.0)) / m
    centres = (predicted ** (1 / k), k * s * (1 - e1) / m)
    width = Z_FILL * FILL_SD_SAFETY * sd
    return max(0.0, min(centres) - width), min(1.0, max(centres) + width)


def fpr_interval_partitioned(m: int, k: int, n: int, fill_lo: float,
                             fill_hi: float) -> tuple[float, float]:
    """fpr_interval for format 2: q = F^k, F the fill inside the partitions."""
    inside = m / (k * (m // k))
    f_lo, f_hi = min(1.0, fill_lo * inside), min(1.0, fill_hi * inside)
    rel = k * k / (max(f_lo, 1e-9) * m)
    pair_slack = k * k * (k - 1) ** 2 * n / (m * m) * f_hi ** max(k - 2, 0)
    return max(f_lo ** k * (1 - rel), 0.0), min(f_hi ** k * (1 + rel) + pair_slack, 1.0)


def fpr_interval(m: int, k: int, n: int, fill_lo: float, fill_hi: float) -> tuple[float, float]:
    """Range of the false-positive rate of a filter whose fill lies in [fill_lo, fill_hi]."""
    rel = k * k / (max(fill_lo, 1e-9) * m)
    pair_slack = k * k * (k - 1) ** 2 * n / (m * m) * fill_hi ** max(k - 2, 0)
    lo = double_hashing_fpr(m, k, fill_lo) * (1 - rel)
    hi = double_hashing_fpr(m, k, fill_hi) * (1 + rel) + pair_slack
    return max(lo, 0.0), min(hi, 1.0)


def _exact_binomial_bounds(trials: int, q: Fraction, alpha: Fraction) -> tuple[int, int]:
    """The same bounds in exact rational arithmetic (math.comb): slow, small cases only."""
    pmf = [math.comb(trials, x) * q ** x * (1 - q) ** (trials - x) for x in range(trials + 1)]
    lower, cdf = 0, Fraction(0)
    while cdf + pmf[lower] <= alpha:
        cdf += pmf[lower]
        lower += 1
    upper, tail = trials, Fraction(0)
    while tail + pmf[upper] <= alpha:
        tail += pmf[upper]
        upper -= 1
    return lower, upper


@pytest.mark.parametrize(("trials", "q", "alpha"), [
    (10, Fraction(1, 2), Fraction(1, 1024)),
    (10, Fraction(1, 2), Fraction(1, 2048)),
    (400, Fraction(1, 50), Fraction(1, 10 ** 6)),
    (300, Fraction(3, 10), Fraction(1, 10 ** 7)),
])
def test_binomial_bounds_are_exact(trials, q, alpha):
    assert (binom_lower(trials, float(q), float(alpha)),
            binom_upper(trials, float(q), float(alpha))) == _exact_binomial_bounds(trials, q, alpha)


def test_binomial_bounds_are_skewed_like_the_binomial():
    lo, hi = binom_lower(200_000, 0.01, 1e-7), binom_upper(200_000, 0.01, 1e-7)
    sd = math.sqrt(200_000 * 0.01 * 0.99)
    # A normal bound would sit 5.2 sd out on both sides; the exact one is
    # tighter below and wider above (the right tail is heavier).
    assert 5.0 < (2000 - lo) / sd < 5.2 < (hi - 2000) / sd < 5.4


# ---------------------------------------------------------------------------
# Keys

def _distinct(rng: random.Random, count: int, prefix: bytes) -> list[bytes]:
    keys: dict[bytes, None] = {}
    while len(keys) < count:
        keys[prefix + rng.randbytes(15)] = None
    return list(keys)


@pytest.fixture(scope="module")
def seed(pytestconfig: pytest.Config) -> int:
    """The seed the keys are drawn with (``--bloom-seed``)."""
    return int(pytestconfig.getoption("--bloom-seed"))


@pytest.fixture(scope="module")
def present_keys(seed: int) -> list[bytes]:
    """Distinct keys to add (first byte 0x01), enough for the largest case."""
    need = max(max(SIZES), 2 * OVERFILL_CAPACITY)
    return _distinct(random.Random(seed), need, b"\x01")


@pytest.fixture(scope="module")
def absent_keys(seed: int) -> list[bytes]:
    """PROBES distinct keys never added to any filter (first byte 0x02)."""
    return _distinct(random.Random(seed + 1), PROBES, b"\x02")


def _check_count(f: BloomFilter, n_added: int, absent: list[bytes]) -> tuple[int, float, float]:
    """Count false positives and assert the bound; returns (count, fill_lo, fill_hi)."""
    m, k = f.m, f.k
    predicted = f.predicted_fpr()
    assert predicted == f.predicted_fpr(n_added) == predicted_fpr_for(n_added, m, k)
    assert predicted == pytest.approx((1 - math.exp(-k * n_added / m)) ** k, rel=1e-12)
    if f.version == 2:
        fill_lo, fill_hi = fill_interval_partitioned(m, k, n_added, predicted)
        q_lo, q_hi = fpr_interval_partitioned(m, k, n_added, fill_lo, fill_hi)
    else:
        fill_lo, fill_hi = fill_interval(m, k, n_added, predicted)
        q_lo, q_hi = fpr_interval(m, k, n_added, fill_lo, fill_hi)
    lower = binom_lower(len(absent), q_lo, ALPHA_TAIL)
    upper = binom_upper(len(absent), q_hi, ALPHA_TAIL)
    count = sum(1 for key in absent if key in f)
    assert lower <= count <= upper, (
        f"{count} false positives in {len(absent)} probes (rate {count / len(absent):.5g}); "
        f"a correct filter (m={m}, k={k}, n={n_added}, predicted {predicted:.5g}) gives "
        f"{lower}..{upper}")
    return count, fill_lo, fill_hi


# ---------------------------------------------------------------------------
# Sizing

# (n, p) -> (m, k), worked out by hand from m = ceil(-n ln p / (ln 2)^2),
# k = max(1, round(m/n ln 2)); none of these sits near a rounding boundary.
SIZING_TABLE = {
    (1, 0.5): (2, 1),
    (1, 0.01): (10, 7),
    (10, 0.1): (48, 3),
    (100, 0.05): (624, 4),
    (1_000, 0.1): (4_793, 3),
    (1_000, 0.01): (9_586, 7),
    (1_000, 0.001): (14_378, 10),
    (1_000, 1e-4): (19_171, 13),
    (1_000, 1e-6): (28_756, 20),
    (10_000, 0.01): (95_851, 7),
    (50_000, 0.001): (718_880, 10),
    (1_000_000, 0.01): (9_585_059, 7),
}


@pytest.mark.parametrize(("n", "p"), sorted(SIZING_TABLE))
def test_sizing_formula(n, p):
    f = BloomFilter(n, p)
    m = math.ceil(-n * math.log(p) / LN2 ** 2)
    k = max(1, round(m / n * LN2))
    assert (f.m, f.k) == (m, k) == SIZING_TABLE[(n, p)]
    assert f.size_bytes == (m + 7) // 8
    assert (f.n, f.fp_chance) == (0, p)
    assert f.bits_per_key(n) == m / n
    assert bloom_mod.optimal_bits(n, p) == m
    assert bloom_mod.optimal_hashes(n, m) == k


def test_sizing_at_capacity_zero_uses_one_key():
    assert (BloomFilter(0, 0.01).m, BloomFilter(0, 0.01).k) == SIZING_TABLE[(1, 0.01)]


def test_fp_chance_one_means_no_filter(present_keys, absent_keys):
    f = BloomFilter(1000, 1.0)
    assert (f.m, f.k, f.size_bytes) == (0, 0, 0)
    f.update(present_keys[:100])
    assert f.n == 100
    assert all(key in f for key in present_keys[:100])
    assert all(key in f for key in absent_keys[:1000])          # everything is "maybe"
    assert f.may_contain_hash(0, 0) and f.may_contain_hash(123, 456)
    assert f.predicted_fpr() == 1.0
    assert f.estimated_fpr_from_fill() == 1.0
    assert f.fill_ratio == 0.0
    data = f.to_bytes()
    assert len(data) == FILTER_HEADER_SIZE
    g = BloomFilter.from_bytes(data)
    assert (g.m, g.k, g.n, g.fp_chance) == (0, 0, 100, 1.0)
    assert all(key in g for key in absent_keys[:100])


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.5, float("nan")])
def test_fp_chance_out_of_range(bad):
    with pytest.raises(ValueError):
        BloomFilter(10, bad)


# ---------------------------------------------------------------------------
# False negatives and false positives at design load

@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("p", "n"), DESIGN_CASES)
def test_false_positive_rate_at_design_load(p, n, version, present_keys, absent_keys):
    f = BloomFilter(n, p, version)
    assert f.version == version
    keys = present_keys[:n]
    f.update(keys)
    assert f.n == n
    # No false negatives, ever.
    missing = [key for key in keys if key not in f]
    assert not missing, f"{len(missing)} added keys answer 'absent'"
    # At design load the predicted rate is the target (k is rounded, so not exactly).
    assert f.predicted_fpr() == pytest.approx(p, rel=0.02)

    _count, fill_lo, fill_hi = _check_count(f, n, absent_keys)

    # The bit pattern: half the bits set at the optimal k (loosely: k is an
    # integer), and exactly where the occupancy model says.
    fill = f.fill_ratio
    assert abs(fill - 0.5) < 0.07
    assert fill_lo <= fill <= fill_hi
    assert f.bits_set == round(fill * f.m)
    # What the fill implies, from the same interval.
    m, k = f.m, f.k
    est_keys = f.estimated_keys_from_fill()
    keys_lo = -m / k * math.log(1 - fill_lo)
    keys_hi = -m / k * math.log(1 - fill_hi)
    assert keys_lo <= est_keys <= keys_hi
    assert abs(est_keys / n - 1) < (0.09 if n < 10_000 else 0.03)
    assert fill_lo ** k <= f.estimated_fpr_from_fill() <= fill_hi ** k
    assert f.estimated_fpr_from_fill() == pytest.approx(
        f.predicted_fpr(), rel=0.25 if n < 10_000 else 0.08)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("p", OVERFILL_CASES)
def test_overfilled_filter_degrades_as_predicted(p, version, present_keys, absent_keys):
    n = OVERFILL_CAPACITY
    f = BloomFilter(n, p, version)
    keys = present_keys[:2 * n]
    f.update(keys)
    assert all(key in f for key in keys)
    assert f.predicted_fpr() == f.predicted_fpr(2 * n)
    count, fill_lo, fill_hi = _check_count(f, 2 * n, absent_keys)
    measured = count / len(absent_keys)
    # Twice the design load: far above the design chance (3.6x at p=0.1,
    # 16x at 0.01, 57x at 0.001), and the bound itself says so.
    assert f.predicted_fpr() > 3.5 * p
    assert measured > 3 * p
    assert fill_lo <= f.fill_ratio <= fill_hi
    assert f.fill_ratio > 0.7
    assert f.estimated_keys_from_fill() == pytest.approx(2 * n, rel=0.03)


# ---------------------------------------------------------------------------
# Probing: the documented hash split, probe sequence and bit numbering

def _closed_form(f: BloomFilter, h1: int, h2: int) -> list[int]:
    """Probe positions from docs/FORMAT.md section 5, per format version."""
    if f.version == 1:
        return [(h1 + i * h2) % f.m for i in range(f.k)]
    s = f.m // f.k
    return [i * s + ((h1 + i * h2) % 2**32 * s >> 32) for i in range(f.k)]


@pytest.mark.parametrize("version", [1, 2])
def test_may_contain_hash_agrees_with_in(present_keys, absent_keys, version):
    f = BloomFilter(2000, 0.05, version)
    assert (f.version, f.part) == (version, f.m // f.k if version == 2 else 0)
    f.update(present_keys[:2000])
    answers = set()
    for key in present_keys[:2000] + absent_keys[:5000]:
        h1, h2 = split_hash(key_hash(key))
        assert (h1, h2) == (key_hash(key) & 0xFFFFFFFF, key_hash(key) >> 32)
        answer = f.may_contain_hash(h1, h2)
        assert answer == (key in f)
        # probes() uses the closed form; the fast path walks it.
        probes = f.probes(h1, h2)
        assert [pos for _i, pos, _set in probes] == _closed_form(f, h1, h2)
        assert answer == all(is_set for _i, _pos, is_set in probes)
        answers.add(answer)
    assert answers == {True, False}


def test_partitioned_probe_i_lands_in_partition_i(present_keys):
    f = BloomFilter(1000, 0.01)
    assert f.version == 2 and (f.m, f.k, f.part) == (9586, 7, 9586 // 7)
    for key in present_keys[:3000]:
        for i, pos, _set in f.probes(*split_hash(key_hash(key))):
            assert i * f.part <= pos < (i + 1) * f.part
    f.update(present_keys[:1000])
    tail = int.from_bytes(f.bits, "little") >> (f.k * f.part)
    assert tail == 0  # the m - k*s bits past the last partition are never set


def test_bit_numbering_and_probe_positions():
    # One key in a 1000-bit filter of format 1: exactly the bits (h1 + i*h2) mod m
    # are set, bit b being byte b >> 3 under mask 1 << (b & 7).
    f = BloomFilter.with_size(1000, 4, version=1)
    key = b"hello"
    f.add(key)
    h1, h2 = split_hash(key_hash(key))
    expected = bytearray(125)
    for i in range(4):
        b = (h1 + i * h2) % 1000
        expected[b >> 3] |= 1 << (b & 7)
    assert f.to_bytes()[FILTER_HEADER_SIZE:] == bytes(expected)
    assert f.bits_set == len({(h1 + i * h2) % 1000 for i in range(4)})


def test_bit_numbering_and_probe_positions_partitioned():
    # Format 2, 1003 bits and 4 probes: partitions of 250 bits; bit
    # i*250 + ((h1 + i*h2) mod 2^32) * 250 >> 32 for each i; bits 1000..1002 unused.
    f = BloomFilter.with_size(1003, 4)
    assert (f.version, f.part) == (2, 250)
    key = b"hello"
    f.add(key)
    h1, h2 = split_hash(key_hash(key))
    expected = bytearray(126)
    for i in range(4):
        b = i * 250 + (((h1 + i * h2) & 0xFFFFFFFF) * 250 >> 32)
        expected[b >> 3] |= 1 << (b & 7)
    assert f.to_bytes()[FILTER_HEADER_SIZE:] == bytes(expected)
    assert f.bits_set == 4  # one per partition, never shared


def test_degenerate_step_sets_one_bit():
    # Format 1, h2 a multiple of m: every probe lands on h1 mod m.
    f = BloomFilter.with_size(100, 5, version=1)
    f.add_hash((300 << 32) | 1234)
    assert f.bits_set == 1
    assert f.may_contain_hash(34, 0)
    assert not f.may_contain_hash(35, 0)
    # Format 2: h2 == 0 gives the same offset in each of the 5 partitions of 20 bits.
    g = BloomFilter.with_size(100, 5)
    g.add_hash(1 << 31)  # offset (2^31 * 20) >> 32 = 10
    assert g.bits_set == 5
    assert [pos for _i, pos, _s in g.probes(1 << 31, 0)] == [10, 30, 50, 70, 90]
    assert g.may_contain_hash(1 << 31, 0) and not g.may_contain_hash(0, 0)


def test_format_2_is_always_written_and_format_1_still_read():
    with pytest.raises(ValueError, match="m=3, k=5"):
        BloomFilter.with_size(3, 5)              # too few bits for 5 partitions
    for capacity, fp in ((0, 1.0), (1, 0.5), (1, 1e-6), (2, 0.01), (10**6, 0.01)):
        f = BloomFilter(capacity, fp)            # what SSTables get, no filter included
        assert f.version == 2, (capacity, fp)
        assert BloomFilter.from_bytes(f.to_bytes()).version == 2
    # Partitions of 2**32 bits or more: more probes keep them under (m is unchanged).
    m, k = bloom_mod.filter_shape(4 * 10**9, 0.01)
    assert m == bloom_mod.optimal_bits(4 * 10**9, 0.01) and k > 7
    assert bloom_mod.partitionable(m, k) and not bloom_mod.partitionable(m, k - 1)
    assert bloom_mod.filter_shape(10**6, 0.01) == (9585059, 7)
    f = BloomFilter.with_size(3, 5, version=1)   # an older file's layout
    assert (f.version, f.part) == (1, 0)
    f.add(b"x")
    g = BloomFilter.from_bytes(f.to_bytes())
    assert g.version == 1 and b"x" in g
    data = bytearray(f.to_bytes())
    data[0] = 2  # a partitioned filter cannot have m < k
    with pytest.raises(lsmdb.CorruptionError, match="m=3, k=5"):
        BloomFilter.from_bytes(bytes(data))
    # Partitions must stay under 2**32 bits (g_i * s fits 64 bits); beyond, format 1.
    assert bloom_mod.partitionable(7 * (2**32 - 1), 7)
    assert not bloom_mod.partitionable(7 * 2**32, 7)
    assert not bloom_mod.partitionable(6, 7) and not bloom_mod.partitionable(0, 0)
    with pytest.raises(ValueError):
        BloomFilter(10, 0.01, version=3)
    with pytest.raises(ValueError):
        BloomFilter.with_size(100, 3, version=0)


def test_with_size(present_keys, absent_keys):
    f = BloomFilter.with_size(5000, 4)
    assert (f.m, f.k, f.n, f.fp_chance, f.size_bytes) == (5000, 4, 0, 0.0, 625)
    f.update(present_keys[:500])
    assert f.n == 500
    assert all(key in f for key in present_keys[:500])
    assert f.predicted_fpr() == predicted_fpr_for(500, 5000, 4)
    assert sum(key in f for key in absent_keys[:20_000]) < 20_000 * 0.05  # ~0.0118 expected
    g = BloomFilter.from_bytes(f.to_bytes())
    assert (g.m, g.k, g.n, g.fp_chance) == (5000, 4, 500, 0.0)
    for m, k in ((0, 1), (1, 0), (-5, 3)):
        with pytest.raises(ValueError):
            BloomFilter.with_size(m, k)


# ---------------------------------------------------------------------------
# Serialisation

def test_round_trip_preserves_everything(present_keys, absent_keys):
    f = BloomFilter(3000, 0.02)
    f.update(present_keys[:2500])
    data = f.to_bytes()
    g = BloomFilter.from_bytes(data)
    assert (g.m, g.k, g.n, g.fp_chance) == (f.m, f.k, 2500, 0.02)
    assert (g.hash_algorithm, g.key_id) == (hashing_mod.HASH_XXH3_64, 0)
    assert g.to_bytes() == data
    assert g.bits_set == f.bits_set
    for key in present_keys[:2500] + absent_keys[:10_000]:
        assert (key in g) == (key in f)
    assert all(key in g for key in present_keys[:2500])


def test_header_layout():
    f = BloomFilter(100, 0.01)
    f.update([b"a", b"b", b"c"])
    data = f.to_bytes()
    assert FILTER_HEADER.format == "<BBHIQQdI" and FILTER_HEADER_SIZE == 36
    assert data[0] == 2                                        # version u8 @0 (partitioned)
    assert data[1] == 1                                        # hash algorithm u8 @1
    assert data[2:4] == b"\x00\x00"                            # flags u16 @2
    assert struct.unpack_from("<I", data, 4)[0] == f.k == 7    # k u32 @4
    assert struct.unpack_from("<Q", data, 8)[0] == f.m == 959  # m u64 @8
    assert struct.unpack_from("<Q", data, 16)[0] == 3          # n u64 @16
    assert struct.unpack_from("<d", data, 24)[0] == 0.01       # fp_chance f64 @24
    assert struct.unpack_from("<I", data, 32)[0] == 0          # key_id u32 @32
    assert len(data) == 36 + (959 + 7) // 8                    # bits @36


def _with_header_byte(data: bytes, offset: int, value: int) -> bytes:
    out = bytearray(data)
    out[offset] = value
    return bytes(out)


@pytest.mark.parametrize("version", [0, 3, 255])
def test_unknown_version_is_unsupported(version):
    data = BloomFilter(100, 0.01).to_bytes()
    with pytest.raises(lsmdb.UnsupportedFormatError, match="version"):
        BloomFilter.from_bytes(_with_header_byte(data, 0, version))


@pytest.mark.parametrize("algorithm", [0, 3, 200, 255])
def test_unknown_hash_algorithm_is_unsupported(algorithm):
    assert algorithm not in hashing_mod.KNOWN_HASH_ALGORITHMS
    data = BloomFilter(100, 0.01).to_bytes()
    with pytest.raises(lsmdb.UnsupportedFormatError, match="hash algorithm"):
        BloomFilter.from_bytes(_with_header_byte(data, 1, algorithm))


@pytest.mark.parametrize("length", [0, 1, 20, 35])
def test_shorter_than_header_is_corruption(length):
    data = BloomFilter(100, 0.01).to_bytes()
    with pytest.raises(lsmdb.CorruptionError) as info:
        BloomFilter.from_bytes(data[:length], "some.sst", 1234)
    assert (info.value.path, info.value.offset) == ("some.sst", 1234)


@pytest.mark.parametrize("change", ["drop_last", "drop_half", "extra_byte", "no_bits"])
def test_wrong_bit_array_length_is_corruption(change):
    data = BloomFilter(100, 0.01).to_bytes()   # m = 959: 120 bytes of bits
    bad = {"drop_last": data[:-1], "drop_half": data[:36 + 60], "extra_byte": data + b"\x00",
           "no_bits": data[:36]}[change]
    with pytest.raises(lsmdb.CorruptionError) as info:
        BloomFilter.from_bytes(bad, "x.sst", 99)
    assert info.value.offset == 99


def test_inconsistent_header_is_corruption():
    good = BloomFilter(100, 0.01).to_bytes()
    m_zero_k_set = FILTER_HEADER.pack(1, 1, 0, 3, 0, 0, 0.01, 0)
    k_zero_m_set = FILTER_HEADER.pack(1, 1, 0, 0, 959, 0, 0.01, 0) + good[36:]
    k_too_big = FILTER_HEADER.pack(1, 1, 0, 65, 959, 0, 0.01, 0) + good[36:]
    for bad in (m_zero_k_set, k_zero_m_set, k_too_big):
        with pytest.raises(lsmdb.CorruptionError):
            BloomFilter.from_bytes(bad)


# ---------------------------------------------------------------------------
# The filter inside an SSTable

N_SST = 3000


def _sst_items(rng: random.Random) -> list[tuple[bytes, bytes | None]]:
    keys = sorted(_distinct(rng, N_SST, b"k:"))
    return [(key, None if i % 10 == 3 else b"v%d" % i * (1 + i % 4)) for i, key in enumerate(keys)]


def _build_sst(items, fp_chance=0.01, block_size=512) -> bytes:
    out = io.BytesIO()
    builder = SSTableBuilder(out, fp_chance=fp_chance, block_size=block_size, table="t")
    for key, value in items:
        builder.add(key, value)
    builder.note_seq(1, len(items))
    builder.finish()
    return out.getvalue()


@pytest.fixture(scope="module")
def sst(seed):
    items = _sst_items(random.Random(seed + 2))
    absent = _distinct(random.Random(seed + 3), 5000, b"k:")
    present = {key for key, _ in items}
    absent = [key for key in absent if key not in present]
    return items, _build_sst(items), absent


def _open(data: bytes) -> SSTableReader:
    return SSTableReader("mem.sst", 0, data=data)


def test_sstable_every_key_found_and_absent_keys_missing(sst):
    items, data, absent = sst
    reader = _open(data)
    assert reader.filter.error is None
    assert len(reader.index_keys) > 10          # several data blocks
    for key, value in items:
        assert find(reader, key) == value        # None: a tombstone
    for key in absent:
        assert find(reader, key) is MISSING
    assert reader.entries == N_SST
    assert reader.tombstones == sum(1 for _, v in items if v is None)


def test_sstable_filter_has_the_documented_sizing(sst):
    items, data, absent = sst
    reader = _open(data)
    f = reader.filter.active
    n, p = N_SST, 0.01
    m = math.ceil(-n * math.log(p) / LN2 ** 2)
    k = max(1, round(m / n * LN2))
    assert (f.m, f.k, f.n, f.fp_chance) == (m, k, n, p)
    assert (reader.properties["filter_bits"], reader.properties["filter_hashes"],
            reader.properties["fp_chance"]) == (m, k, p)
    # The same numbers straight from the bytes of the filter block.
    flt_off, flt_size = reader.filter_handle
    assert flt_size == FILTER_HEADER_SIZE + (m + 7) // 8
    header = FILTER_HEADER.unpack_from(data, flt_off)
    assert header == (2, 1, 0, k, m, n, p, 0)  # format 2: partitioned
    crc = int.from_bytes(data[flt_off + flt_size:flt_off + flt_size + 4], "little")
    assert crc == zlib.crc32(data[flt_off:flt_off + flt_size])
    # Every key is in the filter, tombstones too (else an older value resurfaces).
    for key, _value in items:
        assert f.may_contain_hash(*split_hash(key_hash(key)))
    # ... and it filters (loosely: 0.01 expected, ~50 of 5000).
    maybes = sum(f.may_contain_hash(*split_hash(key_hash(key))) for key in absent)
    assert maybes < 0.03 * len(absent)


def test_sstable_without_filter():
    items = [(b"a", b"1"), (b"b", None), (b"c", b"3")]
    reader = _open(_build_sst(items, fp_chance=1.0))
    assert (reader.filter.active.m, reader.filter.active.k) == (0, 0)
    assert reader.properties["fp_chance"] == 1.0
    assert reader.filter.active.may_contain(1 | 2 << 32)
    assert [find(reader, k) for k, _ in items] == [b"1", None, b"3"]


def _flip(data: bytes, offset: int) -> bytes:
    out = bytearray(data)
    out[offset] ^= 0x10
    return bytes(out)


@pytest.mark.parametrize("where", ["header", "first_bit_byte", "middle", "last_byte", "trailer"])
def test_corrupt_filter_block_fails_open(sst, where):
    items, data, absent = sst
    flt_off, flt_size = _open(data).filter_handle
    offset = {"header": flt_off + 4, "first_bit_byte": flt_off + FILTER_HEADER_SIZE,
              "middle": flt_off + flt_size // 2, "last_byte": flt_off + flt_size - 1,
              "trailer": flt_off + flt_size + 2}[where]
    reader = _open(_flip(data, offset))
    assert reader.filter.error and "checksum" in reader.filter.error
    assert reader.filter.active.may_contain(0)                       # always "maybe"
    assert all(reader.filter.active.may_contain(key_hash(k)) for k in absent[:200])
    for key, value in items:
        assert find(reader, key) == value
    for key in absent[:500]:
        assert find(reader, key) is MISSING


@pytest.mark.parametrize(("offset", "value", "error"), [
    (0, 9, "version"), (1, 77, "hash algorithm"), (4, 0, "m="),
])
def test_undecodable_filter_with_valid_checksum_fails_open(sst, offset, value, error):
    items, data, _absent = sst
    flt_off, flt_size = _open(data).filter_handle
    payload = bytearray(data[flt_off:flt_off + flt_size])
    payload[offset] = value
    if offset == 4:
        payload[4:8] = b"\x00\x00\x00\x00"  # k = 0 with m > 0
    patched = (data[:flt_off] + bytes(payload) + zlib.crc32(payload).to_bytes(4, "little")
               + data[flt_off + flt_size + 4:])
    reader = _open(patched)
    assert reader.filter.error and error in reader.filter.error
    assert reader.filter.active.may_contain(0)
    for key, value in items[::7]:
        assert find(reader, key) == value


@pytest.mark.parametrize("which", ["first", "middle", "last"])
@pytest.mark.parametrize("part", ["payload", "trailer"])
def test_corrupt_data_block_raises_with_its_offset(sst, which, part):
    items, data, _absent = sst
    clean = _open(data)
    nblocks = len(clean.index_keys)
    i = {"first": 0, "middle": nblocks // 2, "last": nblocks - 1}[which]
    off, size = clean.index_offsets[i], clean.index_sizes[i]
    target = off + size // 2 if part == "payload" else off + size + 1
    reader = _open(_flip(data, target))
    assert reader.filter.error is None            # the filter and index are intact
    with pytest.raises(lsmdb.CorruptionError) as info:
        reader.read_block(i)
    assert info.value.offset == off
    assert info.value.path == "mem.sst"
    # Every key of that block hits the corruption; keys of other blocks do not.
    for key in clean.read_block(i)[0]:
        with pytest.raises(lsmdb.CorruptionError) as info:
            find(reader, key)
        assert info.value.offset == off
    values = dict(items)
    other = (i + 1) % nblocks
    for key in clean.read_block(other)[0]:
        assert find(reader, key) == values[key]


def test_corrupt_data_block_on_disk(sst, tmp_path):
    items, data, _absent = sst
    clean = _open(data)
    i = 3
    off = clean.index_offsets[i]
    path = tmp_path / "000001.sst"
    path.write_bytes(_flip(data, off + 1))
    reader = SSTableReader(str(path), 1)          # the os.pread path
    try:
        with pytest.raises(lsmdb.CorruptionError) as info:
            find(reader, clean.index_keys[i])
        assert info.value.offset == off and info.value.path == str(path)
        assert find(reader, items[0][0]) == items[0][1]
    finally:
        reader.close()


@pytest.mark.parametrize("m", [1, 5, 8, 13])
def test_padding_bits_of_a_damaged_filter_are_not_counted(m):
    """Bits at or above m in the last byte are written as 0 and read by no
    probe; a file that has them set (damage the checksum did not catch, or a
    fuzzed block) must not report more than m bits set."""
    f = BloomFilter.with_size(m, 1)
    data = bytearray(f.to_bytes())
    data[-1] = 0xFF
    g = BloomFilter.from_bytes(bytes(data))
    assert g.bits_set == m - 8 * ((m - 1) // 8)  # the filter bits of the last byte
    assert 0.0 <= g.fill_ratio <= 1.0


def test_may_contain_and_positions_are_the_filters_probes():
    """bloom.may_contain and bloom.positions (the read paths' one statement of
    the probes) answer as the filter does, in both layouts; no filter (m == 0)
    answers "maybe" without bits."""
    rng = random.Random(11)
    keys = [b"k%06d" % rng.randrange(10**6) for _ in range(400)]
    for version in (1, 2):
        f = BloomFilter(200, 0.05, version)
        f.update(keys[:200])
        for key in keys:
            h1, h2 = split_hash(key_hash(key))
            bits = bloom_mod.positions(f.m, f.k, f.part, h1, h2)
            assert bits == f.positions(h1, h2) == [b for _i, b, _s in f.probes(h1, h2)]
            assert bits == [bloom_mod.probe_bit(i, f.m, f.part, h1, h2) for i in range(f.k)]
            answer = bloom_mod.may_contain(f.bits, f.m, f.k, f.part, h1, h2)
            assert answer == all(f.bits[b >> 3] >> (b & 7) & 1 for b in bits)
            assert answer == f.may_contain_hash(h1, h2) == (key in f)
        assert all(key in f for key in keys[:200])
    assert bloom_mod.may_contain(None, 0, 0, 0, 1, 2)
    assert BloomFilter(10, 1.0).may_contain_hash(1, 2)


try:
    from lsmdb import _speedups as speedups
except ImportError:  # pragma: no cover - built without a C compiler
    speedups = None  # type: ignore[assignment]
needs_c = pytest.mark.skipif(speedups is None, reason="built without a C compiler")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=200), st.integers(1, 5000),
       st.integers(1, 20), st.sampled_from([1, 2]))
@needs_c
def test_bloom_add_sets_the_bits_add_hash_sets(hashes, m, k, version):
    if version == 2 and m < k:
        version = 1  # too few bits for k partitions: only format 1 takes them
    ref = BloomFilter.with_size(m, k, version)
    c_bits = bytearray((m + 7) // 8)
    speedups.bloom_add(c_bits, m, k, hashes, ref.part)
    if not ref.part:
        four = bytearray((m + 7) // 8)
        speedups.bloom_add(four, m, k, hashes)  # 4 arguments: format 1
        assert four == c_bits
    words = bytearray((m + 7) // 8)  # the hashes as an array("Q"): the GIL-free loop
    speedups.bloom_add(words, m, k, array("Q", hashes), ref.part)
    assert words == c_bits
    for h in hashes:
        ref.add_hash(h)
    assert c_bits == ref.bits
    for typecode in ("Q", "L"):  # add_hashes takes any array of them
        via = BloomFilter.with_size(m, k, version)
        via.add_hashes(array(typecode, hashes))
        assert via.bits == ref.bits
    py = BloomFilter.with_size(m, k, version)
    monkey = bloom_mod._bloom_add
    try:  # the pure-Python add_hashes sets the same bits
        bloom_mod._bloom_add = None
        py.add_hashes(hashes)
    finally:
        bloom_mod._bloom_add = monkey
    assert py.bits == ref.bits


@needs_c
def test_bloom_add_refuses_bad_input():
    # buffers of other than native unsigned 64-bit words go as sequences: the same bits
    for words in (array("I", [1, 2]), array("L", [3, 2**63]), memoryview(bytes(16)).cast("q"),
                  memoryview(bytearray(b"\x01" * 33))[1:].cast("Q")):  # unaligned
        bits, want = bytearray(20), bytearray(20)
        speedups.bloom_add(bits, 100, 3, words)
        speedups.bloom_add(want, 100, 3, list(words))
        assert bits == want and any(bits)
    with pytest.raises(TypeError):
        speedups.bloom_add(bytearray(20), 100, 3, array("d", [1.0]))
    with pytest.raises(ValueError):
        speedups.bloom_add(bytearray(1), 100, 3, array("Q", [1]))
    with pytest.raises(BufferError):
        speedups.bloom_add(b"\x00" * 20, 100, 3, array("Q", [1]))  # read-only
    with pytest.raises(ValueError):
        speedups.bloom_add(bytearray(1), 100, 3, [1])     # too few bytes for m
    with pytest.raises(ValueError):
        speedups.bloom_add(bytearray(1), 0, 3, [1])
    with pytest.raises(BufferError):
        speedups.bloom_add(b"\x00" * 20, 100, 3, [1])     # read-only
    with pytest.raises(OverflowError):
        speedups.bloom_add(bytearray(20), 100, 3, [-1])
    with pytest.raises(ValueError):
        speedups.bloom_add(bytearray(20), 100, -1, [1])
    with pytest.raises(ValueError):
        speedups.bloom_add(bytearray(20), 100, 3, [1], 34)  # 3 partitions of 34 > 100 bits
    bits = bytearray(20)
    speedups.bloom_add(bits, 100, 3, [1], 33)
    assert sum(map(int.bit_count, bits)) == 3
    with pytest.raises(ValueError, match="2\\^32"):  # partitions of 2^32 bits: format 1 only
        speedups.bloom_add(bytearray(20), 7 * 2**32, 7, [1], 2**32)



@settings(max_examples=2000, deadline=None)
@given(st.integers(0, 2**32 - 1) | st.sampled_from([0, 1, 2**31, 2**32 - 1]),
       st.integers(1, 2**32 - 1) | st.sampled_from([1, 2, 3, 2**31 - 1, 2**31, 2**32 - 1]))
@needs_c
def test_the_division_free_modulo_is_exact(a, d):
    assert speedups._fastmod(a, d) == a % d


@needs_c
def test_the_modulo_beyond_32_bits_divides():
    for a, d in [(2**40 + 7, 3), (2**63 + 5, 2**33 + 1), (5, 2**40)]:
        assert speedups._fastmod(a, d) == a % d


# -- crc32, xxh3_64 and block_may_hold: drop-ins for what the format names ----

