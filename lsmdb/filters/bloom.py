"""The Bloom filter: the first filter family (ids 1 and 2; docs/FORMAT.md §5).

Sizing (n keys, target false-positive chance p)::

    m = ceil(-n * ln(p) / ln(2)**2)      bits
    k = max(1, round(m / n * ln(2)))     probes
    predicted FPR after n adds = (1 - exp(-k*n/m)) ** k

Each extra bit per key multiplies the rate by about 0.62.  ``p == 1.0`` means
"no filter": ``m == k == 0`` and every probe answers "maybe".

Probes: a key is hashed once to a 64-bit value ``h`` (:mod:`lsmdb.filters.hashing`);
``h1 = h & 0xFFFFFFFF``, ``h2 = h >> 32`` and ``g_i = (h1 + i*h2) mod 2**32``.
Family 2 (``FAMILY_BLOOM_PARTITIONED``, written now) splits the m bits into k
partitions of ``s = m // k`` bits and probe ``i`` (0 <= i < k) tests bit
``i*s + (g_i * s >> 32)`` of partition i; family 1 (``FAMILY_BLOOM_WHOLE``,
still read) tests bit ``(h1 + i*h2) mod m`` of the whole array.  The family
id is the filter's "version" byte; ``version`` below says which layout.  Same false-positive rate,
same bits: partitions only change where the probes land.  Every absent key
meets the first two partitions of each filter in its way, 2/k of the bits,
which stay in the CPU's caches where the whole filters of a large table
would not.  Bit ``b`` lives in byte ``b >> 3`` under mask ``1 << (b & 7)``.
The hash of a key is computed once per lookup and reused for every filter;
:func:`probe_bit` is where a probe falls, :func:`may_contain` the test the
read paths make of each filter (``BloomFilter.may_contain_hash``).

Serialised form (docs/FORMAT.md, "Filter block")::

    version u8 | hash_algorithm u8 | flags u16 | k u32 | m u64 | n u64 |
    fp_chance f64 | key_id u32 | bits: ceil(m/8) bytes

Example:
    >>> f = BloomFilter(1000, 0.01)
    >>> f.add(b"apple")
    >>> b"apple" in f
    True
    >>> (f.m, f.k)
    (9586, 7)
    >>> g = BloomFilter.from_bytes(f.to_bytes())
    >>> g.may_contain(key_hash(b"apple")) and g.m == f.m
    True
"""

from __future__ import annotations

import math
import struct
from array import array
from collections.abc import Iterable
from typing import Any

from ..errors import CorruptionError, UnsupportedFormatError
from . import NO_PROBE, Family, FilterStats, ProbeSpec, checked_sizing, register
from . import Filter as _Filter
from .hashing import HASH_XXH3_64, KNOWN_HASH_ALGORITHMS, Hasher, key_hash

# Layouts, which are this family's ids (the filter block's first byte).
# DO NOT CHANGE: on disk.
FILTER_VERSION_WHOLE = 1        # probe i at (h1 + i*h2) mod m
FILTER_VERSION_PARTITIONED = 2  # probe i in partition i of m // k bits
FAMILY_BLOOM_WHOLE = FILTER_VERSION_WHOLE
FAMILY_BLOOM_PARTITIONED = FILTER_VERSION_PARTITIONED
KNOWN_FILTER_VERSIONS = (FILTER_VERSION_WHOLE, FILTER_VERSION_PARTITIONED)
#: What new filters are written as (layout 1 is only read).
FILTER_FORMAT_VERSION = FILTER_VERSION_PARTITIONED
#: Largest partition a format-2 filter may have (s * 2**32 fits 64 bits).
MAX_PARTITION_BITS = 2**32 - 1

FILTER_HEADER = struct.Struct("<BBHIQQdI")
FILTER_HEADER_SIZE = FILTER_HEADER.size
assert FILTER_HEADER_SIZE == 36

LN2_SQUARED = math.log(2) ** 2
#: Most probes a filter may use (p = 1e-19 would need 64); more is a corrupt header.
MAX_HASHES = 64
MASK32 = 0xFFFFFFFF

try:  # optional C speedups (lsmdb/csrc/bloom.c)
    from .._speedups import bloom_add as _bloom_add
except ImportError:  # pragma: no cover - built without a C compiler
    _bloom_add = None  # type: ignore[assignment]


def split_hash(h: int) -> tuple[int, int]:
    """The two double-hashing values (h1, h2) of a 64-bit hash."""
    return h & MASK32, h >> 32


# -- where the probes fall: the one Python statement of both layouts --------
# (lsmdb/csrc/bloom.c and speedups.h compute the same bits in C; the tests
# compare the two.)

def probe_bit(i: int, m: int, part: int, h1: int, h2: int) -> int:
    """The bit probe ``i`` of a key of hash halves (h1, h2) tests in a filter of
    ``m`` bits: ``i*s + (g_i * s >> 32)`` with ``g_i = (h1 + i*h2) mod 2**32``
    when ``part`` is the partition size s (format 2), ``(h1 + i*h2) mod m``
    when it is 0 (format 1).  O(1).

    >>> probe_bit(1, 100, 50, 2**31, 2**31)  # partition 1, g_1 = 0
    50
    >>> probe_bit(1, 100, 0, 7, 40)          # format 1
    47
    """
    if part:
        return i * part + (((h1 + i * h2) & MASK32) * part >> 32)
    return (h1 + i * h2) % m


def positions(m: int, k: int, part: int, h1: int, h2: int) -> list[int]:
    """The bits the k probes of a key test, in probe order (see probe_bit).  O(k)."""
    return [probe_bit(i, m, part, h1, h2) for i in range(k)]


def may_contain(bits: bytearray | bytes | None, m: int, k: int, part: int,
                h1: int, h2: int) -> bool:
    """False only if no key of hash halves (h1, h2) was added to the filter whose
    bit array is ``bits`` (m bits, k probes, partition size ``part``; 0 for
    format 1).  ``m == 0`` is no filter: always True.  O(k), stopping at the
    first bit that is not set -- for most absent keys the first or second.

    The read paths call it once per file they probe, with the hash halves
    computed once per key."""
    if not m:
        return True
    assert bits is not None
    for i in range(k):
        b = probe_bit(i, m, part, h1, h2)
        if not bits[b >> 3] >> (b & 7) & 1:
            return False
    return True


def optimal_bits(n: int, fp_chance: float) -> int:
    """Bits for ``n`` keys at false-positive chance ``fp_chance`` (0 when p >= 1)."""
    if fp_chance >= 1.0 or n <= 0:
        return 0
    return max(1, math.ceil(-n * math.log(fp_chance) / LN2_SQUARED))


def optimal_hashes(n: int, m: int) -> int:
    """Best probe count for ``n`` keys in ``m`` bits: max(1, round(m/n * ln 2))."""
    if m <= 0:
        return 0
    if n <= 0:
        return 1
    return max(1, round(m / n * math.log(2)))


def partitionable(m: int, k: int) -> bool:
    """Whether m bits make k partitions of format 2: at least one bit each
    (m < k happens only with ``with_size``) and under 2**32 bits each (over
    about 3 billion keys in one filter; :func:`filter_shape` then takes more
    probes)."""
    return 0 < k <= m and m // k <= MAX_PARTITION_BITS


def filter_shape(capacity: int, fp_chance: float) -> tuple[int, int]:
    """(m, k) of a filter for ``capacity`` keys at ``fp_chance``: m from the
    formula, k = round(m/n ln 2) -- or, for a filter so large that partitions of
    m // k bits would reach 2**32, the fewest probes that keep them under it."""
    n = max(capacity, 1)
    m = optimal_bits(n, fp_chance)
    k = optimal_hashes(n, m)
    if k and m // k > MAX_PARTITION_BITS:
        k = -(-m // MAX_PARTITION_BITS)
    return m, k


def partition_bits(version: int, m: int, k: int) -> int:
    """s = m // k for a format-2 filter (its partition size); 0 for format 1."""
    return m // k if version == FILTER_VERSION_PARTITIONED and k else 0


def predicted_fpr_for(n: int, m: int, k: int) -> float:
    """(1 - e^(-k n / m))^k; 1.0 for an empty (no-filter) bit array."""
    if m <= 0 or k <= 0:
        return 1.0
    return (1.0 - math.exp(-k * n / m)) ** k


class BloomFilter(_Filter):
    """A Bloom filter, partitioned by probe.  It cannot delete: compaction rebuilds filters.

    ``BloomFilter(capacity, fp_chance)`` sizes the filter for ``capacity`` keys.
    ``add`` and ``in`` cost one hash plus k bit operations (O(k)).  ``version``
    picks the probe layout (docs/FORMAT.md section 5): 2, partitioned, is what
    lsmdb writes; 1, double hashing over the whole array, is what older files
    hold.
    """

    __slots__ = ("m", "k", "n", "fp_chance", "hash_algorithm", "key_id", "version", "part",
                 "_bits", "_capacity")

    def __init__(self, capacity: int, fp_chance: float = 0.01,
                 version: int = FILTER_FORMAT_VERSION) -> None:
        fp_chance = checked_sizing(capacity, fp_chance)
        m, k = filter_shape(capacity, fp_chance)
        if k > MAX_HASHES:
            raise ValueError(f"fp_chance {fp_chance:g} needs {k} hashes; at most {MAX_HASHES}")
        if version not in KNOWN_FILTER_VERSIONS:
            raise ValueError(f"filter format version must be one of {KNOWN_FILTER_VERSIONS}")
        self._init(m, k, fp_chance, version)
        self._capacity = capacity

    def _init(self, m: int, k: int, fp_chance: float,
              version: int = FILTER_FORMAT_VERSION) -> None:
        if version == FILTER_VERSION_PARTITIONED and m and not partitionable(m, k):
            raise ValueError(f"a partitioned filter needs k <= m and partitions under 2**32 "
                             f"bits: m={m}, k={k} (format 1 takes any m >= 1)")
        self.m = m
        self.k = k
        self.version = version
        self.part = partition_bits(version, m, k)
        self.n = 0
        self.fp_chance = fp_chance
        self.hash_algorithm = HASH_XXH3_64
        self.key_id = 0
        self._bits = bytearray((m + 7) // 8)
        self._capacity = 0

    @classmethod
    def with_size(cls, m: int, k: int, version: int = FILTER_FORMAT_VERSION) -> BloomFilter:
        """A filter of exactly ``m`` bits probed ``k`` times (for experiments).

        ``version`` picks the probe layout: 2 (partitioned, the default: it
        needs ``partitionable(m, k)``, ValueError otherwise) or 1 (double
        hashing over the whole array, as older files hold).
        """
        if m < 1 or not 1 <= k <= MAX_HASHES:
            raise ValueError(f"need m >= 1 and 1 <= k <= {MAX_HASHES}")
        if version not in KNOWN_FILTER_VERSIONS:
            raise ValueError(f"filter format version must be one of {KNOWN_FILTER_VERSIONS}")
        f = cls.__new__(cls)
        f._init(m, k, 0.0, version)
        return f

    # -- building ---------------------------------------------------------
    def add(self, key: bytes) -> None:
        """Add ``key`` (hashed with xxh3-64).  O(k)."""
        self.add_hash(key_hash(key))

    def add_hash(self, h: int) -> None:
        """Add a key by its precomputed 64-bit hash (see ``key_hash``).  O(k)."""
        self.n += 1
        if not self.m:
            return
        bits = self._bits
        for b in self.positions(h & MASK32, h >> 32):
            bits[b >> 3] |= 1 << (b & 7)

    def add_hashes(self, hashes: Iterable[int]) -> None:
        """``add_hash`` for many hashes (the SSTable writer's path): the same
        bits, set in C (``bloom_add``) where the speedups are built.  O(k) each."""
        if type(hashes) is not array or hashes.typecode != "Q":  # an array("Q") as it is
            hashes = list(hashes)
        self.n += len(hashes)
        m = self.m
        if not m or not hashes:
            return
        bits = self._bits
        if _bloom_add is not None:
            _bloom_add(bits, m, self.k, hashes, self.part)
            return
        k, part = self.k, self.part
        for h in hashes:
            for b in positions(m, k, part, h & MASK32, h >> 32):
                bits[b >> 3] |= 1 << (b & 7)

    def update(self, keys: Iterable[bytes]) -> None:
        """Add every key of ``keys``."""
        for key in keys:
            self.add_hash(key_hash(key))

    # -- probing ----------------------------------------------------------
    @property
    def family(self) -> int:  # type: ignore[override]
        """Its family id on disk: the layout's version (1 or 2)."""
        return self.version

    def __contains__(self, key: bytes) -> bool:
        return self.may_contain(key_hash(key))

    def may_contain(self, h: int) -> bool:
        """False only if no key of 64-bit hash ``h`` was added.  O(k), early exit."""
        return may_contain(self._bits, self.m, self.k, self.part, h & MASK32, h >> 32)

    def may_contain_hash(self, h1: int, h2: int) -> bool:
        """``may_contain`` from the hash halves (h1, h2) of :func:`split_hash`."""
        return may_contain(self._bits, self.m, self.k, self.part, h1, h2)

    def probe_spec(self) -> ProbeSpec:
        """(family, bit array, (m, k, s)); no probe without bits (m == 0): every key
        "maybe".  The C probe (lsmdb/csrc/bloom.h) reads the same three integers."""
        if not self.m:
            return NO_PROBE
        return ProbeSpec(self.version, self._bits, (self.m, self.k, self.part))

    def explain(self, h: int) -> dict[str, Any]:
        """The filter's size and, when it says "absent", the first probe whose bit is
        0 (``probe``, ``bit``): what ``lsmdb trace`` prints."""
        out: dict[str, Any] = {"filter_bits": self.m, "filter_hashes": self.k}
        if self.m:
            for i, pos, is_set in self.probes(h & MASK32, h >> 32):
                if not is_set:
                    out.update(probe=i, bit=pos)
                    break
        return out

    def describe(self) -> dict[str, Any]:
        return {"m": self.m, "k": self.k}

    def positions(self, h1: int, h2: int) -> list[int]:
        """The k bits a key of hash halves (h1, h2) probes, in probe order
        (docs/FORMAT.md section 5; :func:`probe_bit`)."""
        return positions(self.m, self.k, self.part, h1, h2)

    def probes(self, h1: int, h2: int) -> list[tuple[int, int, bool]]:
        """Every probe as (i, bit position, bit set) -- for tracing a read."""
        bits = self._bits
        return [(i, b, bool(bits[b >> 3] >> (b & 7) & 1))
                for i, b in enumerate(self.positions(h1, h2))]

    @property
    def bits(self) -> bytearray:
        """The bit array itself (bit ``b`` in byte ``b >> 3`` under mask
        ``1 << (b & 7)``), shared, not copied: what the read paths probe.
        Changing it changes the filter."""
        return self._bits

    # -- statistics -------------------------------------------------------
    @property
    def size_bytes(self) -> int:
        """Bytes of the bit array (ceil(m / 8))."""
        return len(self._bits)

    @property
    def memory_bytes(self) -> int:
        return len(self._bits)

    def statistics(self) -> FilterStats:
        """m, k, the fill ratio and what it implies (the bits never change once built)."""
        if not self.m:
            return FilterStats(0, self.k, 0.0, 1.0, 0.0)
        return FilterStats(self.m, self.k, self.fill_ratio, self.estimated_fpr_from_fill(),
                           self.estimated_keys_from_fill())

    @property
    def bits_set(self) -> int:
        """Number of bits set among the m filter bits (a popcount of the bit
        array; the padding bits of the last byte, which no probe reads, are
        not counted even when a damaged file has them set)."""
        count = int.from_bytes(self._bits, "little").bit_count()
        padding = len(self._bits) * 8 - self.m
        if padding > 0:
            count -= (self._bits[-1] >> (8 - padding)).bit_count()
        return count

    @property
    def fill_ratio(self) -> float:
        """Share of bits set (0.5 at the optimal k and design load)."""
        return self.bits_set / self.m if self.m else 0.0

    def predicted_fpr(self, n: int | None = None) -> float:
        """(1 - e^(-k n / m))^k for ``n`` keys (default: the keys added)."""
        return predicted_fpr_for(self.n if n is None else n, self.m, self.k)

    def estimated_fpr_from_fill(self) -> float:
        """fill^k: the false-positive rate the actual bit pattern gives."""
        return self.fill_ratio ** self.k if self.m else 1.0

    def estimated_keys_from_fill(self) -> float:
        """-m/k * ln(1 - fill): the key count the bit pattern suggests."""
        if not self.m:
            return 0.0
        fill = self.fill_ratio
        if fill >= 1.0:
            return math.inf
        return -self.m / self.k * math.log(1.0 - fill)

    def bits_per_key(self, n: int | None = None) -> float:
        """m / n for ``n`` keys (default: the keys added); 0 when there are none."""
        count = self.n if n is None else n
        return self.m / count if count else 0.0

    # -- serialisation ----------------------------------------------------
    def to_bytes(self) -> bytes:
        """The serialised filter: 36-byte header, then the bit array (docs/FORMAT.md)."""
        header = FILTER_HEADER.pack(
            self.version, self.hash_algorithm, 0, self.k, self.m, self.n,
            self.fp_chance, self.key_id,
        )
        return header + bytes(self._bits)

    @classmethod
    def from_bytes(cls, data: bytes, path: str | None = None,
                   offset: int | None = None) -> BloomFilter:
        """Decode ``to_bytes`` output.

        Raises UnsupportedFormatError for an unknown layout or hash algorithm
        and CorruptionError for inconsistent sizes; an SSTable reader turns
        either into a filter that always answers "maybe" (lsmdb.filters.FailOpen).
        """
        if len(data) < FILTER_HEADER_SIZE:
            raise CorruptionError("filter block shorter than its header", path, offset)
        version, algo, _flags, k, m, n, fp, key_id = FILTER_HEADER.unpack_from(data, 0)
        if version not in KNOWN_FILTER_VERSIONS:
            raise UnsupportedFormatError(f"unknown filter format version {version}")
        if algo not in KNOWN_HASH_ALGORITHMS:
            raise UnsupportedFormatError(f"unknown filter hash algorithm {algo}")
        if len(data) - FILTER_HEADER_SIZE != (m + 7) // 8:
            raise CorruptionError(
                f"filter of {m} bits needs {(m + 7) // 8} bytes, block holds "
                f"{len(data) - FILTER_HEADER_SIZE}", path, offset)
        if (m == 0) != (k == 0) or k > MAX_HASHES:
            raise CorruptionError(f"filter header has m={m}, k={k}", path, offset)
        if version == FILTER_VERSION_PARTITIONED and m and not partitionable(m, k):
            raise CorruptionError(f"partitioned filter header has m={m}, k={k}: no "
                                  f"partitions of 1 to 2**32 - 1 bits", path, offset)
        f = cls.__new__(cls)
        f.m, f.k, f.n, f.fp_chance = m, k, n, fp
        f.hash_algorithm, f.key_id = algo, key_id
        f.version, f.part = version, partition_bits(version, m, k)
        f._bits = bytearray(data[FILTER_HEADER_SIZE:])
        f._capacity = n
        return f

    def _check(self) -> None:
        """Invariants: the header's shape, a bit array of ceil(m / 8) bytes and the
        partition size of its layout.  (The padding bits past m are not checked:
        no probe reads them, and a damaged file may have them set.)"""
        if self.version not in KNOWN_FILTER_VERSIONS:
            raise AssertionError(f"filter format {self.version}")
        if self.m < 0 or self.n < 0 or (self.m == 0) != (self.k == 0) or self.k > MAX_HASHES:
            raise AssertionError(f"filter m={self.m} k={self.k} n={self.n}")
        if len(self._bits) != (self.m + 7) // 8:
            raise AssertionError(f"filter of {self.m} bits holds {len(self._bits)} bytes")
        if self.part != partition_bits(self.version, self.m, self.k):
            raise AssertionError(f"filter partition size {self.part}")
        if self.version == FILTER_VERSION_PARTITIONED and self.m and \
                not partitionable(self.m, self.k):
            raise AssertionError(f"partitioned filter m={self.m} k={self.k}")


def _builder(version: int) -> Any:
    def build(n: int, fp_chance: float, hashes: list[int], hasher: Hasher) -> BloomFilter:
        """A filter of layout ``version`` sized for ``n`` keys at ``fp_chance``
        (none below 1.0 means no bits), holding ``hashes``, built with ``hasher``."""
        bloom = BloomFilter(n, fp_chance, version) if n and fp_chance < 1.0 \
            else BloomFilter(0, 1.0, version)
        bloom.hash_algorithm = hasher.algorithm
        bloom.key_id = hasher.key_id
        if bloom.m:
            bloom.add_hashes(hashes)
        bloom.n = n
        return bloom
    return build


def _decode(data: bytes, path: str | None, offset: int | None) -> BloomFilter:
    return BloomFilter.from_bytes(data, path, offset)


register(Family(FAMILY_BLOOM_WHOLE, "bloom", _decode,
                _builder(FILTER_VERSION_WHOLE)))
register(Family(FAMILY_BLOOM_PARTITIONED, "bloom", _decode,
                _builder(FILTER_VERSION_PARTITIONED)))
