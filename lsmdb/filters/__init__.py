"""Filters: what each SSTable embeds to answer "certainly not here" without a disk read.

A filter is built once, from the 64-bit hashes of every key of its file
(:mod:`lsmdb.filters.hashing`), serialised into the file's filter block, and
probed by the read paths with one hash per key: ``may_contain(h)`` is False
only if no key of hash ``h`` was added.  A filter's "no" must never be wrong,
so anything a reader cannot use -- a block it cannot decode, a family it does
not know, a keyed filter without its secret -- *fails open*: it is replaced by
:class:`FailOpen`, which says "maybe" to every key.  A filter can make reads
slower, never wrong.

**Families.**  The first byte of every filter block is the id of its family
(docs/FORMAT.md §5), which decides everything after it.  Each family is one
module of this package that registers a :class:`Family` (its id, how to decode
its block and how to build it) when imported; every module here is imported
with the package.  The Bloom filter (:mod:`lsmdb.filters.bloom`, ids 1 and 2)
is the first.  What the read paths take of a filter is its
:class:`ProbeSpec`: the family id, the buffer it probes and a tuple of
integers only the family reads -- the Python read path asks the filter
object itself; the C one (lsmdb/csrc/filters.h) dispatches on the id to the
family's probe, and treats any id it does not know as "maybe".  Adding a
family is a module here, its C probe, and its row in FORMAT.md.

**Staleness.**  :func:`is_stale` is the one rule that says whether a file's
filter differs from what a file written now would get (:class:`FilterSpec`):
``db.sstables()``'s ``filter_stale``, ``lsmdb inspect`` and
``db.rebuild_filters()`` all use it.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, NamedTuple

from ..errors import CorruptionError, LsmdbError, UnsupportedFormatError
from .hashing import FAST_HASHER, HASH_XXH3_64, KNOWN_HASH_ALGORITHMS, Hasher

#: The family id of "no filter" in memory: a file built without one
#: (``bloom_filter_fp_chance=1.0``) or one failing open.  Every probe says
#: "maybe".  Never written to disk.
FAMILY_NONE = 0


class ProbeSpec(NamedTuple):
    """What a read path needs to probe a filter: the family id (FAMILY_NONE:
    every probe "maybe"), the buffer the probe reads (None when it reads
    none), and integers only the family knows the meaning of."""

    family: int
    data: Any
    params: tuple[int, ...]


NO_PROBE = ProbeSpec(FAMILY_NONE, None, ())


def checked_sizing(capacity: Any, fp_chance: Any) -> float:
    """The checks of a filter constructor's ``(capacity, fp_chance)``: an int
    capacity >= 0 and a chance with 0 < p <= 1 (TypeError, ValueError); the
    chance as a float."""
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        raise TypeError("capacity must be an int")
    if capacity < 0:
        raise ValueError("capacity must be >= 0")
    if isinstance(fp_chance, bool) or not isinstance(fp_chance, (int, float)):
        raise TypeError("fp_chance must be a float")
    if math.isnan(fp_chance) or not 0.0 < fp_chance <= 1.0:
        raise ValueError("fp_chance must satisfy 0 < fp_chance <= 1")
    return float(fp_chance)


class FilterStats(NamedTuple):
    """A filter's size and what its bit pattern says (``SSTableInfo``'s fields)."""

    bits: int                        # bits of memory it probes
    hashes: int                      # probes per key
    fill_ratio: float                # share of bits set
    estimated_fpr_from_fill: float   # the false-positive rate the bits give
    estimated_keys_from_fill: float  # the key count the bits suggest (inf: full)


NO_STATS = FilterStats(0, 0, 0.0, 1.0, 0.0)


class Filter(ABC):
    """A filter of some family (see the module docstring).

    Attributes every family sets: ``family`` (its id on disk), ``hash_algorithm``
    and ``key_id`` (which hash it was built with), ``n`` (keys added) and
    ``fp_chance`` (the false-positive chance it was sized for).
    """

    __slots__ = ()

    family: int
    hash_algorithm: int
    key_id: int
    n: int
    fp_chance: float

    @abstractmethod
    def may_contain(self, h: int) -> bool:
        """False only if no key of 64-bit hash ``h`` was added."""

    @abstractmethod
    def probe_spec(self) -> ProbeSpec:
        """What the read paths probe (``NO_PROBE`` when it has nothing to probe)."""

    @abstractmethod
    def to_bytes(self) -> bytes:
        """The filter block's payload (docs/FORMAT.md §5), its family id first."""

    @property
    @abstractmethod
    def memory_bytes(self) -> int:
        """Bytes it holds in memory to answer probes."""

    @abstractmethod
    def predicted_fpr(self, n: int | None = None) -> float:
        """The false-positive rate its design predicts for ``n`` keys (default: those added)."""

    @abstractmethod
    def statistics(self) -> FilterStats:
        """Its size and what its bits say."""

    def explain(self, h: int) -> dict[str, Any]:
        """How it answers hash ``h``, for ``lsmdb trace``: family-defined fields."""
        return {}

    def describe(self) -> dict[str, Any]:
        """Its header, for ``lsmdb sstable``: family-defined fields beside the common ones."""
        return {}

    def _check(self) -> None:  # noqa: B027 (a family without invariants keeps this one)
        """Invariants of its structure (AssertionError naming the first broken one)."""


class FailOpen(Filter):
    """Stands in for a filter that cannot be used: every probe answers "maybe".

    ``hash_algorithm``/``key_id`` are the stored filter's when its header said
    them (a keyed filter waiting for its secret), else algorithm 1's."""

    __slots__ = ("error", "hash_algorithm", "key_id", "n", "fp_chance", "family")

    def __init__(self, error: str, stored: Filter | None = None) -> None:
        self.error = error
        self.family = FAMILY_NONE
        self.hash_algorithm = stored.hash_algorithm if stored is not None else HASH_XXH3_64
        self.key_id = stored.key_id if stored is not None else 0
        self.n = 0
        self.fp_chance = 1.0

    def may_contain(self, h: int) -> bool:
        return True

    def probe_spec(self) -> ProbeSpec:
        return NO_PROBE

    def to_bytes(self) -> bytes:
        raise TypeError("a filter failing open has nothing to serialise")

    @property
    def memory_bytes(self) -> int:
        return 0

    def predicted_fpr(self, n: int | None = None) -> float:
        return 1.0

    def statistics(self) -> FilterStats:
        return NO_STATS


class Family(NamedTuple):
    """A filter family: its id (the first byte of its blocks), its name (two ids
    of one name are two layouts of one structure, as the Bloom filter's), how
    to decode one of its blocks (CorruptionError or UnsupportedFormatError for
    one it cannot use) and how to build one from key hashes."""

    id: int
    name: str
    decode: Callable[[bytes, str | None, int | None], Filter]
    build: Callable[[int, float, list[int], Hasher], Filter]


#: Every family known, by id.
FAMILIES: dict[int, Family] = {}


def register(family: Family) -> Family:
    """Make ``family`` known to readers and writers (its module does, at import)."""
    if family.id == FAMILY_NONE or not 0 < family.id < 256:
        raise ValueError(f"filter family id {family.id} is not a byte above {FAMILY_NONE}")
    if family.id in FAMILIES and FAMILIES[family.id] != family:
        raise ValueError(f"filter family id {family.id} is taken by {FAMILIES[family.id].name}")
    FAMILIES[family.id] = family
    return family


def decode(data: bytes, path: str | None = None, offset: int | None = None) -> Filter:
    """The filter a filter block's payload holds, by its family.

    UnsupportedFormatError for a family this lsmdb does not know,
    CorruptionError (or the family's own errors) for one that does not decode."""
    if not data:
        raise CorruptionError("filter block is empty", path, offset)
    family = FAMILIES.get(data[0])
    if family is None:
        raise UnsupportedFormatError(f"unknown filter family {data[0]} (the filter block's "
                                     "first byte, its version)")
    return family.decode(data, path, offset)


class FilterSpec(NamedTuple):
    """What filter a file written now gets: its family, the false-positive
    chance it is sized for (1.0: none) and the hash it is built with."""

    family: int
    fp_chance: float
    hasher: Hasher = FAST_HASHER


def build(spec: FilterSpec, n: int, hashes: list[int]) -> Filter:
    """The filter ``spec`` asks for over ``n`` keys of these hashes (one per key)."""
    return FAMILIES[spec.family].build(n, spec.fp_chance, hashes, spec.hasher)


class FilterHandle:
    """An SSTable's filter as its reader holds it.

    ``stored`` is what the filter block decodes to (None when it does not);
    ``active`` what reads probe: ``stored``, or a :class:`FailOpen` while it
    cannot be used, ``error`` saying why.  A keyed filter (hash algorithm 2)
    fails open until :meth:`attach_hasher` gives it the secret it was built
    with; ``hash_fn`` is then that hash (None: algorithm 1's ``key_hash``).
    """

    __slots__ = ("stored", "active", "error", "hash_fn")

    def __init__(self, stored: Filter | None, error: str | None = None) -> None:
        self.stored = stored
        self.hash_fn: Callable[[bytes], int] | None = None
        self.error: str | None
        if stored is None:
            self.error = error or "no filter"
            self.active: Filter = FailOpen(self.error)
        elif stored.probe_spec().family != FAMILY_NONE and stored.hash_algorithm != HASH_XXH3_64:
            # Probing with any other hash would give false negatives.
            self.error = "keyed filter: no secret attached yet"
            self.active = FailOpen(self.error, stored)
        else:
            self.error = None
            self.active = stored

    @classmethod
    def load(cls, read: Callable[[], bytes], path: str | None = None,
             offset: int | None = None) -> FilterHandle:
        """The handle of the filter block ``read()`` returns (checksum verified);
        any LsmdbError reading or decoding it makes the filter fail open."""
        try:
            return cls(decode(read(), path, offset))
        except LsmdbError as exc:
            return cls(None, str(exc))

    @property
    def hash_algorithm(self) -> int:
        """The hash the stored filter was built with (algorithm 1 when none is stored)."""
        return self.stored.hash_algorithm if self.stored is not None else HASH_XXH3_64

    def attach_hasher(self, keyed: Hasher | None) -> None:
        """Give a keyed filter its hash function, or leave it failing open.

        A keyed filter answers "maybe" until this is called with the secret
        it was built with: forgetting to attach costs speed, never a key."""
        stored = self.stored
        if stored is None or stored.hash_algorithm == HASH_XXH3_64 \
                or stored.probe_spec().family == FAMILY_NONE:
            return
        if keyed is not None and keyed.algorithm == stored.hash_algorithm \
                and keyed.key_id == stored.key_id:
            self.hash_fn = keyed.fn
            self.active = stored
            self.error = None
            return
        self.error = (f"keyed filter (key id {stored.key_id}) built with a secret this "
                      "database does not have; the filter fails open")
        self.active = FailOpen(self.error, stored)

    def describe(self) -> dict[str, Any]:
        """The stored filter's header, for ``lsmdb sstable`` (None fields when none is)."""
        stored = self.stored
        family = FAMILIES.get(stored.family) if stored is not None else None
        out: dict[str, Any] = {
            "family": family.name if family is not None else None,
            "version": stored.family if stored is not None else None,
            "hash_algorithm": stored.hash_algorithm if stored is not None else None,
            "hash": KNOWN_HASH_ALGORITHMS.get(stored.hash_algorithm) if stored else None,
            "key_id": stored.key_id if stored is not None else None,
            "n": stored.n if stored is not None else 0,
            "fp_chance": stored.fp_chance if stored is not None else 1.0,
            "error": self.error if stored is None or self.error else None,
        }
        if stored is not None:
            out.update(stored.describe())
        return out

    def _check(self) -> None:
        """Invariants: the active filter is the stored one exactly when no error says
        otherwise; each keeps its own invariants."""
        if (self.error is None) != (self.active is self.stored):
            raise AssertionError(f"filter handle: error {self.error!r} with "
                                 f"{type(self.active).__name__} active")
        if self.stored is not None:
            self.stored._check()


def is_stale(handle: FilterHandle, built_fp_chance: float, want: FilterSpec | None) -> bool:
    """Whether a file's filter differs from what a file written now gets
    (``want``; None: the file's own spec, as when the table is not known).

    Stale when it was built for another false-positive chance; or, where a
    filter is wanted, when it fails open (undecodable, of an unknown family, a
    keyed filter whose secret is gone -- a rebuild makes it work again), is of
    another family (by name: another layout of the same family is not stale) or
    was built with another hash.  A file built without a filter, as wanted, is
    not stale.
    """
    want_fp = built_fp_chance if want is None else want.fp_chance
    if built_fp_chance != want_fp:
        return True
    if want_fp >= 1.0:
        return False
    stored = handle.stored
    if stored is None or handle.error is not None:
        return True
    return want is not None and (FAMILIES[stored.family].name != FAMILIES[want.family].name
                                 or stored.hash_algorithm != want.hasher.algorithm)


def _load_families() -> None:
    """Import every family module of this package (each registers itself)."""
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_") and info.name != "hashing":
            importlib.import_module(f"{__name__}.{info.name}")


_load_families()

#: The family id new files are built with, for each value of the table option
#: ``filter_family`` (a family's name; the Bloom filter writes its partitioned
#: layout).
WRITTEN_FAMILIES: dict[str, int] = {
    "bloom": importlib.import_module(f"{__name__}.bloom").FAMILY_BLOOM_PARTITIONED,
    "blocked_bloom": importlib.import_module(f"{__name__}.blocked_bloom").FAMILY_BLOCKED_BLOOM,
}
#: The family new files are built with when no table says otherwise.
DEFAULT_FAMILY: int = WRITTEN_FAMILIES["bloom"]
