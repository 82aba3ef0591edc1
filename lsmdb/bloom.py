"""Partitioned Bloom filter with double hashing, serialisable into an SSTable.

Sizing (n keys, target false-positive chance p)::

    m = ceil(-n * ln(p) / ln(2)**2)      bits
    k = max(1, round(m / n * ln(2)))     probes
    predicted FPR after n adds = (1 - exp(-k*n/m)) ** k

Each extra bit per key multiplies the rate by about 0.62.  ``p == 1.0`` means
"no filter": ``m == k == 0`` and every probe answers "maybe".

Probes: a key is hashed once to a 64-bit value ``h`` (algorithm 1:
``xxh3_64(key, seed=0)``); ``h1 = h & 0xFFFFFFFF``, ``h2 = h >> 32`` and
``g_i = (h1 + i*h2) mod 2**32``.  Filter format 2 (written now) splits the m
bits into k partitions of ``s = m // k`` bits and probe ``i`` (0 <= i < k)
tests bit ``i*s + (g_i * s >> 32)`` of partition i; format 1 (still read)
tests bit ``(h1 + i*h2) mod m`` of the whole array.  Same false-positive rate,
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
    >>> b"apple" in g and g.m == f.m
    True
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Callable, Iterable

import xxhash

from .errors import CorruptionError, UnsupportedFormatError

# Filter format versions.  DO NOT CHANGE: on disk.
FILTER_VERSION_WHOLE = 1        # probe i at (h1 + i*h2) mod m
FILTER_VERSION_PARTITIONED = 2  # probe i in partition i of m // k bits
KNOWN_FILTER_VERSIONS = (FILTER_VERSION_WHOLE, FILTER_VERSION_PARTITIONED)
#: What new filters are written as (format 1 is only read).
FILTER_FORMAT_VERSION = FILTER_VERSION_PARTITIONED
#: Largest partition a format-2 filter may have (s * 2**32 fits 64 bits).
MAX_PARTITION_BITS = 2**32 - 1

# Hash algorithm ids.  DO NOT CHANGE: on disk.  Retired ids stay reserved.
HASH_XXH3_64 = 1          # xxh3_64(key, seed=0): fast, computable by anyone
HASH_BLAKE2B_KEYED = 2    # blake2b(key, digest_size=8, key=secret) as little-endian u64
KNOWN_HASH_ALGORITHMS = {HASH_XXH3_64: "xxh3_64", HASH_BLAKE2B_KEYED: "blake2b_keyed"}

FILTER_HEADER = struct.Struct("<BBHIQQdI")
FILTER_HEADER_SIZE = FILTER_HEADER.size
assert FILTER_HEADER_SIZE == 36

LN2_SQUARED = math.log(2) ** 2
#: Most probes a filter may use (p = 1e-19 would need 64); more is a corrupt header.
MAX_HASHES = 64
MASK32 = 0xFFFFFFFF

try:  # optional C speedups (lsmdb/csrc/bloom.c)
    from ._speedups import bloom_add as _bloom_add
    from ._speedups import xxh3_64 as _c_xxh3_64
except ImportError:  # pragma: no cover - built without a C compiler
    _bloom_add = None  # type: ignore[assignment]
    _c_xxh3_64 = None  # type: ignore[assignment]

#: The 64-bit key hash every filter of algorithm 1 probes with: xxhash's
#: xxh3_64_intdigest, or the same function computed in lsmdb._speedups (equal
#: bit for bit; the C probes then hash without a call).
key_hash = _c_xxh3_64 if _c_xxh3_64 is not None else xxhash.xxh3_64_intdigest


class Hasher:
    """Which 64-bit hash a filter probes with: algorithm id, key id, function."""

    __slots__ = ("algorithm", "key_id", "fn")

    def __init__(self, algorithm: int, key_id: int, fn: Callable[[bytes], int]) -> None:
        self.algorithm = algorithm
        self.key_id = key_id
        self.fn = fn

    def __repr__(self) -> str:
        return f"Hasher({KNOWN_HASH_ALGORITHMS.get(self.algorithm)!r}, key_id={self.key_id})"


FAST_HASHER = Hasher(HASH_XXH3_64, 0, key_hash)


def keyed_hasher(secret: bytes) -> Hasher:
    """A blake2b hasher keyed with ``secret``: positions nobody without it can predict.

    The key id stored in filter headers is the first 4 bytes (little-endian)
    of blake2b(secret, digest_size=4, person=b"lsmdb-id"), so a filter built
    under another secret is recognised (and fails open) instead of
    answering wrongly.
    """
    if not 16 <= len(secret) <= 64:
        raise ValueError("secret must be 16 to 64 bytes")
    key_id = int.from_bytes(hashlib.blake2b(secret, digest_size=4, person=b"lsmdb-id").digest(),
                            "little")
    # Keying blake2b costs a compression of the key block: do it once and copy
    # the keyed state per lookup (same digests, about half the time).
    keyed = hashlib.blake2b(digest_size=8, key=secret)
    copy = keyed.copy
    from_bytes = int.from_bytes

    def fn(key: bytes) -> int:
        h = copy()
        h.update(key)
        return from_bytes(h.digest(), "little")
    return Hasher(HASH_BLAKE2B_KEYED, key_id, fn)


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


class BloomFilter:
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
        if isinstance(capacity, bool) or not isinstance(capacity, int):
            raise TypeError("capacity must be an int")
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        if isinstance(fp_chance, bool) or not isinstance(fp_chance, (int, float)):
            raise TypeError("fp_chance must be a float")
        if math.isnan(fp_chance) or not 0.0 < fp_chance <= 1.0:
            raise ValueError("fp_chance must satisfy 0 < fp_chance <= 1")
        m, k = filter_shape(capacity, float(fp_chance))
        if k > MAX_HASHES:
            raise ValueError(f"fp_chance {fp_chance:g} needs {k} hashes; at most {MAX_HASHES}")
        if version not in KNOWN_FILTER_VERSIONS:
            raise ValueError(f"filter format version must be one of {KNOWN_FILTER_VERSIONS}")
        self._init(m, k, float(fp_chance), version)
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
    def __contains__(self, key: bytes) -> bool:
        h = key_hash(key)
        return self.may_contain_hash(h & MASK32, h >> 32)

    def may_contain_hash(self, h1: int, h2: int) -> bool:
        """False only if the key was certainly never added.  O(k), early exit."""
        return may_contain(self._bits, self.m, self.k, self.part, h1, h2)

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

        Raises UnsupportedFormatError for an unknown version or hash algorithm
        and CorruptionError for inconsistent sizes; an SSTable reader turns
        either into a filter that always answers "maybe".
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
