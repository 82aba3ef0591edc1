"""The cache-line blocked Bloom filter: family 3 (docs/FORMAT.md §5).

A Bloom filter whose ``m`` bits are cut into blocks of 512 bits, 64 bytes,
one cache line: a key's ``k`` probes all fall in one block, chosen by its
hash.  A lookup in a large filter then waits on one cache miss instead of
up to ``k``: what matters once a table's filters outgrow the CPU caches,
where every probe of the other layouts is a miss of its own.

The price is a higher false-positive rate for the same bits: blocks hold
more or fewer keys than the average (their load is about Poisson), and the
crowded ones answer "maybe" more often.  So the filter is sized by that
rate, not by the standard formula: for ``n`` keys and a target ``p`` it
takes the fewest bits per key ``c`` (and the best ``k`` for them) at which
the predicted rate is at most ``p``::

    λ = 512 / c                       keys per block, on average
    e1 = (1 - 1/512)^(j·k), e2 = (1 - 2/512)^(j·k)     (a block of j keys)
    μ_j = 1 - e1,  σ²_j = e1/512 + (1 - 1/512)·e2 - e1²  (its fill: mean, variance)
    FPR(λ, k) = Σ_j Pois(j; λ) · (μ_j^k + k(k-1)/2 · μ_j^(k-2) · σ²_j)

The second term is the spread of a block's fill (E[F^k] to second order):
without it the rate would come out 1% (p = 0.01) to 7% (p = 1e-6) low.
Bits per key at p = 0.1, 0.01, 0.001, 1e-4, 1e-6: 4.84, 9.92, 15.55, 22.03,
38.82 -- a standard Bloom filter's 4.79, 9.59, 14.38, 19.17, 28.76, so 1%,
3%, 8%, 15% and 35% more.

Probes (the one Python statement of where they fall; lsmdb/csrc/
filters_blocked_bloom.h computes the same bits, and the tests compare the two)::

    block   = ((h >> 32) * blocks) >> 32
    x_0     = h & 0xFFFFFFFF
    x_i+1   = x_i * 0x9E3779B9 mod 2**32
    probe i tests bit  block * 512 + (x_i >> 23)

Bit ``b`` of the array is bit ``b & 7`` of byte ``b >> 3``, as in the Bloom
family.  The block is picked by a multiply rather than a modulo: any block
count up to 2**32 - 1 works, with no division.

The bit array is held 64-byte aligned in memory, so that a block is one
cache line rather than two.

Serialised form: the Bloom family's 36-byte header (family byte 3) and
``m / 8`` bytes of bits, ``m`` a multiple of 512.
"""

from __future__ import annotations

import ctypes
import functools
import math
from array import array
from collections.abc import Iterable
from typing import Any

from ..errors import CorruptionError, UnsupportedFormatError
from . import NO_PROBE, Family, FilterStats, ProbeSpec, checked_sizing, register
from . import Filter as _Filter
from .bloom import FILTER_HEADER, FILTER_HEADER_SIZE, LN2_SQUARED, MASK32, MAX_HASHES
from .hashing import HASH_XXH3_64, KNOWN_HASH_ALGORITHMS, Hasher, key_hash

#: The family id (the filter block's first byte).  DO NOT CHANGE: on disk.
FAMILY_BLOCKED_BLOOM = 3
#: Bits in a block: one 64-byte cache line.  DO NOT CHANGE: on disk.
BLOCK_BITS = 512
BLOCK_BYTES = BLOCK_BITS // 8
#: The multiplier from one probe's 32-bit value to the next (odd, so every
#: value has one successor and one predecessor).  DO NOT CHANGE: on disk.
PROBE_MULTIPLIER = 0x9E3779B9
#: Most blocks a filter may have (the block pick multiplies by a 32-bit count).
MAX_BLOCKS = 2**32 - 1
#: Probe counts the sizing considers.
_K_RANGE = range(1, 41)

try:  # optional C speedups (lsmdb/csrc/filters_blocked_bloom.c)
    from .._speedups import blocked_bloom_add as _c_add
    from .._speedups import blocked_bloom_fill as _c_fill
except ImportError:  # pragma: no cover - built without a C compiler
    _c_add = _c_fill = None  # type: ignore[assignment]


# -- where the probes fall ----------------------------------------------------

def block_of(h: int, blocks: int) -> int:
    """The block a key of 64-bit hash ``h`` probes in a filter of ``blocks`` blocks."""
    return ((h >> 32) * blocks) >> 32


def block_positions(h: int, k: int) -> list[int]:
    """The k bits (0..511) a key of hash ``h`` probes inside its block, in probe order.

    >>> block_positions(0x0080_0001, 3)  # x_0 >> 23 = 1, then x_1 = x_0 * 0x9E3779B9 ...
    [1, 245, 375]
    """
    x = h & MASK32
    out = []
    for _ in range(k):
        out.append(x >> 23)
        x = (x * PROBE_MULTIPLIER) & MASK32
    return out


def positions(blocks: int, k: int, h: int) -> list[int]:
    """The k bits of the whole array a key of hash ``h`` probes, in probe order."""
    base = block_of(h, blocks) * BLOCK_BITS
    return [base + p for p in block_positions(h, k)]


def may_contain(bits: Any, blocks: int, k: int, h: int) -> bool:
    """False only if no key of hash ``h`` was added to the filter of these
    ``bits`` (``blocks`` blocks, k probes).  ``blocks == 0`` is no filter:
    always True."""
    if not blocks:
        return True
    for b in positions(blocks, k, h):
        if not bits[b >> 3] >> (b & 7) & 1:
            return False
    return True


# -- sizing -------------------------------------------------------------------

def predicted_fpr_at(load: float, k: int) -> float:
    """The false-positive rate of a blocked filter whose blocks hold ``load``
    keys on average (Poisson), k probes per key: for a block of j keys (jk
    probes set), the mean of its fill F to the k-th power, to second order,
    ``E[F]^k + C(k, 2) E[F]^(k-2) Var(F)`` (the mean fill alone to the k-th
    power would be 1-7% low at p = 0.01 to 1e-6)."""
    if k <= 0:
        return 1.0
    if load <= 0:
        return 0.0
    spread = 12 * math.sqrt(load) + 30
    total = 0.0
    for j in range(max(0, int(load - spread)), int(load + spread) + 1):
        weight = math.exp(j * math.log(load) - load - math.lgamma(j + 1))  # Pois(j; load)
        e1 = (1.0 - 1.0 / BLOCK_BITS) ** (j * k)   # a bit's chance to stay 0
        e2 = (1.0 - 2.0 / BLOCK_BITS) ** (j * k)   # two given bits' chance to both stay 0
        mean = 1.0 - e1
        var = max(0.0, e1 / BLOCK_BITS + (1.0 - 1.0 / BLOCK_BITS) * e2 - e1 * e1)
        second = k * (k - 1) / 2 * mean ** (k - 2) * var if k > 1 else 0.0
        total += weight * (mean ** k + second)
    return total


def best_hashes(load: float) -> int:
    """The k that gives the lowest predicted rate at this load."""
    return min(_K_RANGE, key=lambda k: predicted_fpr_at(load, k))


@functools.lru_cache(maxsize=64)
def bits_per_key(fp_chance: float) -> float:
    """The fewest bits per key (to 1/1024 of a bit) at which the best k
    predicts a rate of at most ``fp_chance``."""
    def ok(c: float) -> bool:
        load = BLOCK_BITS / c
        return predicted_fpr_at(load, best_hashes(load)) <= fp_chance
    lo = -math.log(fp_chance) / LN2_SQUARED  # a standard filter's: never enough here
    hi = 2 * lo + 4
    while not ok(hi):
        hi *= 2
    while hi - lo > max(1 / 1024, hi * 1e-12):  # (relative: floats at tiny p)
        mid = (lo + hi) / 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def filter_shape(capacity: int, fp_chance: float) -> tuple[int, int]:
    """(m, k) for ``capacity`` keys at ``fp_chance``: (0, 0) without a filter
    (p >= 1); else m bits in whole blocks, at least one, and the best k for
    the load they give."""
    if fp_chance >= 1.0:
        return 0, 0
    n = max(capacity, 1)
    blocks = max(1, math.ceil(n * bits_per_key(fp_chance) / BLOCK_BITS))
    if blocks > MAX_BLOCKS:
        raise ValueError(f"{capacity} keys at fp chance {fp_chance:g} need more than "
                         f"{MAX_BLOCKS} blocks")
    return blocks * BLOCK_BITS, best_hashes(n / blocks)


def aligned_bits(size: int) -> Any:
    """A zeroed writable buffer of ``size`` bytes whose first byte lies on a
    64-byte boundary (a memoryview into a slightly larger bytearray)."""
    raw = bytearray(size + BLOCK_BYTES)
    address = ctypes.addressof(ctypes.c_char.from_buffer(raw)) if size else 0
    start = -address % BLOCK_BYTES
    return memoryview(raw)[start:start + size]


class BlockedBloomFilter(_Filter):
    """A Bloom filter whose probes of a key share one 64-byte block.

    ``BlockedBloomFilter(capacity, fp_chance)`` sizes it for ``capacity``
    keys (see the module docstring).  ``add`` and ``in`` cost one hash and k
    bit operations in one cache line.
    """

    __slots__ = ("m", "k", "n", "fp_chance", "hash_algorithm", "key_id", "blocks", "_bits",
                 "_fill")

    family = FAMILY_BLOCKED_BLOOM

    def __init__(self, capacity: int, fp_chance: float = 0.01) -> None:
        fp_chance = checked_sizing(capacity, fp_chance)
        m, k = filter_shape(capacity, fp_chance)
        self._init(m, k, fp_chance, aligned_bits(m // 8))

    def _init(self, m: int, k: int, fp_chance: float, bits: Any) -> None:
        self.m, self.k, self.n, self.fp_chance = m, k, 0, fp_chance
        self.blocks = m // BLOCK_BITS
        self.hash_algorithm, self.key_id = HASH_XXH3_64, 0
        self._bits = bits
        self._fill: tuple[int, float] | None = None

    @classmethod
    def with_size(cls, m: int, k: int) -> BlockedBloomFilter:
        """A filter of exactly ``m`` bits (a multiple of 512) probed k times (for experiments)."""
        if m < BLOCK_BITS or m % BLOCK_BITS or m // BLOCK_BITS > MAX_BLOCKS \
                or not 1 <= k <= MAX_HASHES:
            raise ValueError(f"need m a multiple of {BLOCK_BITS} (at least one block, at most "
                             f"{MAX_BLOCKS}) and 1 <= k <= {MAX_HASHES}")
        f = cls.__new__(cls)
        f._init(m, k, 0.0, aligned_bits(m // 8))
        return f

    # -- building -------------------------------------------------------------
    def add(self, key: bytes) -> None:
        """Add ``key`` (hashed with xxh3-64).  O(k)."""
        self.add_hashes([key_hash(key)])

    def add_hash(self, h: int) -> None:
        """Add a key by its 64-bit hash.  O(k)."""
        self.add_hashes([h])

    def add_hashes(self, hashes: Iterable[int]) -> None:
        """Add keys by their 64-bit hashes: in C (``blocked_bloom_add``) where
        the speedups are built, else here; the same bits.  O(k) each."""
        if type(hashes) is not array or hashes.typecode != "Q":
            hashes = list(hashes)
        self.n += len(hashes)
        if not self.blocks or not hashes:
            return
        self._fill = None
        bits, blocks, k = self._bits, self.blocks, self.k
        if _c_add is not None:
            _c_add(bits, blocks, k, hashes)
            return
        for h in hashes:
            for b in positions(blocks, k, h):
                bits[b >> 3] |= 1 << (b & 7)

    # -- probing --------------------------------------------------------------
    def __contains__(self, key: bytes) -> bool:
        return self.may_contain(key_hash(key))

    def may_contain(self, h: int) -> bool:
        """False only if no key of 64-bit hash ``h`` was added.  O(k)."""
        return may_contain(self._bits, self.blocks, self.k, h)

    def probe_spec(self) -> ProbeSpec:
        """(family, bit array, (blocks, k)); no probe without bits."""
        if not self.blocks:
            return NO_PROBE
        return ProbeSpec(FAMILY_BLOCKED_BLOOM, self._bits, (self.blocks, self.k))

    def explain(self, h: int) -> dict[str, Any]:
        """Its size, the block a key of hash ``h`` probes (``filter_block``) and, when it says
        "absent", the first probe whose bit is 0 (``lsmdb trace``)."""
        out: dict[str, Any] = {"filter_bits": self.m, "filter_hashes": self.k}
        if self.blocks:
            out["filter_block"] = block_of(h, self.blocks)
            bits = self._bits
            for i, b in enumerate(positions(self.blocks, self.k, h)):
                if not bits[b >> 3] >> (b & 7) & 1:
                    out.update(probe=i, bit=b)
                    break
        return out

    def describe(self) -> dict[str, Any]:
        return {"m": self.m, "k": self.k, "blocks": self.blocks}

    @property
    def bits(self) -> Any:
        """The bit array itself (shared, not copied)."""
        return self._bits

    # -- statistics -----------------------------------------------------------
    @property
    def memory_bytes(self) -> int:
        return len(self._bits)

    def _fill_counts(self) -> tuple[int, float]:
        """(bits set, mean over blocks of (bits set in the block / 512)^k), once."""
        if self._fill is None:
            if _c_fill is not None:
                self._fill = _c_fill(self._bits, self.blocks, self.k)
            else:
                total, rate = 0, 0.0
                data = bytes(self._bits)
                for b in range(self.blocks):
                    ones = int.from_bytes(data[b * BLOCK_BYTES:(b + 1) * BLOCK_BYTES],
                                          "little").bit_count()
                    total += ones
                    rate += (ones / BLOCK_BITS) ** self.k
                self._fill = (total, rate / self.blocks if self.blocks else 1.0)
        return self._fill

    def statistics(self) -> FilterStats:
        """m, k, the fill ratio and what it implies.  The rate from the fill is
        the mean over blocks of (the block's fill)^k: the chance that an
        absent key finds all its bits set, for this very bit pattern."""
        if not self.blocks:
            return FilterStats(0, self.k, 0.0, 1.0, 0.0)
        ones, rate = self._fill_counts()
        fill = ones / self.m
        keys = math.inf if fill >= 1.0 else -self.m / self.k * math.log(1.0 - fill)
        return FilterStats(self.m, self.k, fill, rate, keys)

    def predicted_fpr(self, n: int | None = None) -> float:
        """The rate the module docstring's formula predicts for ``n`` keys
        (default: those added)."""
        if not self.blocks:
            return 1.0
        return predicted_fpr_at((self.n if n is None else n) / self.blocks, self.k)

    # -- serialisation --------------------------------------------------------
    def to_bytes(self) -> bytes:
        """The filter block's payload: the 36-byte header, then the bits."""
        return FILTER_HEADER.pack(FAMILY_BLOCKED_BLOOM, self.hash_algorithm, 0, self.k, self.m,
                                  self.n, self.fp_chance, self.key_id) + bytes(self._bits)

    @classmethod
    def from_bytes(cls, data: bytes, path: str | None = None,
                   offset: int | None = None) -> BlockedBloomFilter:
        """Decode ``to_bytes`` output (docs/FORMAT.md §5 gives the rules, in order)."""
        if len(data) < FILTER_HEADER_SIZE:
            raise CorruptionError("filter block shorter than its header", path, offset)
        family, algo, _flags, k, m, n, fp, key_id = FILTER_HEADER.unpack_from(data, 0)
        if family != FAMILY_BLOCKED_BLOOM:
            raise UnsupportedFormatError(f"filter family {family} is not the blocked Bloom's")
        if algo not in KNOWN_HASH_ALGORITHMS:
            raise UnsupportedFormatError(f"unknown filter hash algorithm {algo}")
        if m % BLOCK_BITS or m // BLOCK_BITS > MAX_BLOCKS:
            raise CorruptionError(f"blocked filter of {m} bits: not whole blocks of "
                                  f"{BLOCK_BITS}, or more than {MAX_BLOCKS}", path, offset)
        if len(data) - FILTER_HEADER_SIZE != m // 8:
            raise CorruptionError(f"filter of {m} bits needs {m // 8} bytes, block holds "
                                  f"{len(data) - FILTER_HEADER_SIZE}", path, offset)
        if (m == 0) != (k == 0) or k > MAX_HASHES:
            raise CorruptionError(f"filter header has m={m}, k={k}", path, offset)
        f = cls.__new__(cls)
        bits = aligned_bits(m // 8)
        bits[:] = memoryview(data)[FILTER_HEADER_SIZE:]
        f._init(m, k, fp, bits)
        f.n, f.hash_algorithm, f.key_id = n, algo, key_id
        return f

    def _check(self) -> None:
        """Invariants: whole blocks, a bit array of m / 8 bytes, k within range."""
        if self.m < 0 or self.m % BLOCK_BITS or self.blocks != self.m // BLOCK_BITS:
            raise AssertionError(f"blocked filter m={self.m} blocks={self.blocks}")
        if (self.m == 0) != (self.k == 0) or self.k > MAX_HASHES or self.n < 0:
            raise AssertionError(f"blocked filter m={self.m} k={self.k} n={self.n}")
        if len(self._bits) != self.m // 8:
            raise AssertionError(f"filter of {self.m} bits holds {len(self._bits)} bytes")


def _build(n: int, fp_chance: float, hashes: list[int], hasher: Hasher) -> BlockedBloomFilter:
    """A filter sized for ``n`` keys at ``fp_chance`` (none below 1.0 means no
    bits), holding ``hashes``, built with ``hasher``."""
    f = BlockedBloomFilter(n, fp_chance) if n and fp_chance < 1.0 \
        else BlockedBloomFilter(0, 1.0)
    f.hash_algorithm, f.key_id = hasher.algorithm, hasher.key_id
    if f.blocks:
        f.add_hashes(hashes)
    f.n = n
    return f


def _decode(data: bytes, path: str | None, offset: int | None) -> BlockedBloomFilter:
    return BlockedBloomFilter.from_bytes(data, path, offset)


register(Family(FAMILY_BLOCKED_BLOOM, "blocked_bloom", _decode, _build))
