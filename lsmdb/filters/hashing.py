"""The 64-bit key hashes filters are built and probed with (docs/FORMAT.md §5).

Every filter family turns a key into positions from one 64-bit hash, computed
once per lookup and reused for every file of the same hash.  Which hash a
filter was built with is stored in its block (the hash algorithm id, and for
a keyed hash the id of the secret), so a reader probes it with that hash or
not at all: probing with any other would answer "absent" for keys the file
holds.

* Algorithm 1, ``xxh3_64(key, seed=0)``: fast, and anyone can compute it.
* Algorithm 2, ``blake2b(key, digest_size=8, key=secret)`` read as a
  little-endian u64: positions nobody without the database's secret
  (``FILTER_KEY``, :mod:`lsmdb.secret`) can predict, so crafted keys cannot
  aim at set bits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import xxhash

# Hash algorithm ids.  DO NOT CHANGE: on disk.  Retired ids stay reserved.
HASH_XXH3_64 = 1          # xxh3_64(key, seed=0): fast, computable by anyone
HASH_BLAKE2B_KEYED = 2    # blake2b(key, digest_size=8, key=secret) as little-endian u64
KNOWN_HASH_ALGORITHMS = {HASH_XXH3_64: "xxh3_64", HASH_BLAKE2B_KEYED: "blake2b_keyed"}

try:  # optional C speedups (lsmdb/csrc/bloom.c)
    from .._speedups import xxh3_64 as _c_xxh3_64
except ImportError:  # pragma: no cover - built without a C compiler
    _c_xxh3_64 = None  # type: ignore[assignment]

#: The 64-bit key hash of algorithm 1: xxhash's xxh3_64_intdigest, or the same
#: function computed in lsmdb._speedups (equal bit for bit; the C read path
#: then hashes without a call).
key_hash: Callable[[bytes], int] = (_c_xxh3_64 if _c_xxh3_64 is not None
                                    else xxhash.xxh3_64_intdigest)


class Hasher:
    """Which 64-bit hash a filter is built and probed with: algorithm id, key id
    (the secret's, 0 for algorithm 1) and the function itself."""

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
