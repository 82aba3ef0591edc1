"""lsmdb.filters: the interface every filter family fills, families by id, failing
open, the one staleness rule -- and a family added without touching anything
but its own module."""

from __future__ import annotations

import random
import struct
from array import array
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lsmdb
import lsmdb.compaction
import lsmdb.fastpath
import lsmdb.readpath
import lsmdb.sstable_writer
import lsmdb.table
from lsmdb import filters
from lsmdb.errors import CorruptionError, UnsupportedFormatError
from lsmdb.filters import (
    FAMILIES,
    FAMILY_NONE,
    NO_PROBE,
    FailOpen,
    Family,
    Filter,
    FilterHandle,
    FilterSpec,
    FilterStats,
    ProbeSpec,
    is_stale,
)
from lsmdb.filters.bloom import BloomFilter
from lsmdb.filters.hashing import FAST_HASHER, HASH_BLAKE2B_KEYED, key_hash, keyed_hasher
from lsmdb.stats import FILE_COUNTERS
from lsmdb.verify import verify_database
from tests.support.binomial import binom_lower, binom_upper

EXACT = 250  # a family id no lsmdb uses: the tests' own


class ExactFilter(Filter):
    """A test family: the set of its keys' hashes itself (no false positives)."""

    __slots__ = ("family", "hash_algorithm", "key_id", "n", "fp_chance", "hashes")

    def __init__(self, hashes: set[int], fp_chance: float, hash_algorithm: int = 1,
                 key_id: int = 0) -> None:
        self.family = EXACT
        self.hash_algorithm = hash_algorithm
        self.key_id = key_id
        self.hashes = hashes
        self.n = len(hashes)
        self.fp_chance = fp_chance

    def may_contain(self, h: int) -> bool:
        return h in self.hashes

    def probe_spec(self) -> ProbeSpec:
        return ProbeSpec(EXACT, None, ())

    def to_bytes(self) -> bytes:
        return struct.pack("<BBId", EXACT, self.hash_algorithm, self.key_id,
                           self.fp_chance) + b"".join(
            h.to_bytes(8, "little") for h in sorted(self.hashes))

    @property
    def memory_bytes(self) -> int:
        return 8 * len(self.hashes)

    def predicted_fpr(self, n: int | None = None) -> float:
        return 0.0

    def statistics(self) -> FilterStats:
        return FilterStats(64 * len(self.hashes), 1, 1.0, 0.0, float(len(self.hashes)))


def _decode_exact(data: bytes, path: str | None, offset: int | None) -> ExactFilter:
    if (len(data) - 14) % 8:
        raise CorruptionError("exact filter of a partial hash", path, offset)
    _family, algorithm, key_id, fp = struct.unpack_from("<BBId", data)
    return ExactFilter({int.from_bytes(data[i:i + 8], "little") for i in range(14, len(data), 8)},
                       fp, algorithm, key_id)


def _build_exact(n: int, fp: float, hashes: list[int], hasher: Any) -> ExactFilter:
    return ExactFilter(set(hashes), fp, hasher.algorithm, hasher.key_id)


@pytest.fixture
def exact_family(monkeypatch):
    """The test family registered, and new files built with it."""
    family = filters.register(Family(EXACT, "exact", _decode_exact, _build_exact))
    monkeypatch.setitem(filters.WRITTEN_FAMILIES, "bloom", EXACT)  # what filter_family writes
    yield family
    FAMILIES.pop(EXACT, None)


def test_the_bloom_filter_is_the_first_family_under_two_layouts():
    assert FAMILIES[1].name == FAMILIES[2].name == "bloom"
    assert filters.DEFAULT_FAMILY == 2
    f = BloomFilter(100, 0.01)
    f.add(b"x")
    assert isinstance(f, Filter) and f.family == f.version == 2
    g = filters.decode(f.to_bytes())
    assert isinstance(g, BloomFilter) and g.may_contain(key_hash(b"x"))
    assert g.probe_spec() == (2, g.bits, (g.m, g.k, g.part))
    assert BloomFilter(0, 1.0).probe_spec() == NO_PROBE  # no bits: nothing to probe


def test_decode_dispatches_on_the_first_byte():
    with pytest.raises(CorruptionError):
        filters.decode(b"")
    with pytest.raises(UnsupportedFormatError, match="unknown filter family 77"):
        filters.decode(bytes([77]) + b"\x00" * 40)
    with pytest.raises(ValueError):
        filters.register(Family(FAMILY_NONE, "none", _decode_exact, _build_exact))
    with pytest.raises(ValueError, match="taken by bloom"):
        filters.register(Family(2, "other", _decode_exact, _build_exact))


def test_fail_open_says_maybe_to_everything_and_has_nothing_to_probe():
    f = FailOpen("why")
    assert all(f.may_contain(h) for h in (0, 1, 2**64 - 1))
    assert f.probe_spec() == NO_PROBE and f.memory_bytes == 0 and f.predicted_fpr() == 1.0
    with pytest.raises(TypeError):
        f.to_bytes()


def test_a_handle_fails_open_on_what_it_cannot_use_and_keyed_filters_wait_for_their_secret():
    broken = FilterHandle.load(lambda: bytes([77, 0, 0]), "f.sst", 10)
    assert broken.stored is None and isinstance(broken.active, FailOpen)
    assert "unknown filter family 77" in broken.error
    secret = keyed_hasher(b"s" * 32)
    flt = filters.build(FilterSpec(2, 0.01, secret), 3, [secret.fn(k) for k in (b"a", b"b")])
    keyed = FilterHandle(filters.decode(flt.to_bytes()))
    assert isinstance(keyed.active, FailOpen) and keyed.error and keyed.hash_fn is None
    assert keyed.hash_algorithm == HASH_BLAKE2B_KEYED
    keyed.attach_hasher(keyed_hasher(b"t" * 32))       # another secret: still open
    assert isinstance(keyed.active, FailOpen) and "does not have" in keyed.error
    keyed.attach_hasher(secret)
    assert keyed.active is keyed.stored and keyed.error is None and keyed.hash_fn is secret.fn
    keyed._check()


def test_one_staleness_rule():
    bloom = FilterHandle(filters.build(FilterSpec(2, 0.01), 10, list(range(10))))
    spec = FilterSpec(2, 0.01, FAST_HASHER)
    assert not is_stale(bloom, 0.01, spec)
    assert is_stale(bloom, 0.01, spec._replace(fp_chance=0.001))      # another fp chance
    assert is_stale(bloom, 0.01, spec._replace(hasher=keyed_hasher(b"s" * 32)))  # another hash
    assert not is_stale(bloom, 0.01, spec._replace(family=1))         # another Bloom layout
    assert not is_stale(bloom, 0.01, None)                            # table not known
    none = FilterHandle(filters.build(FilterSpec(2, 1.0), 10, []))
    assert not is_stale(none, 1.0, spec._replace(fp_chance=1.0))     # no filter, none wanted
    assert is_stale(none, 1.0, spec)                                   # one wanted now
    failing = FilterHandle(None, "checksum mismatch")
    assert is_stale(failing, 0.01, spec) and is_stale(failing, 0.01, None)  # a rebuild fixes it
    assert not is_stale(failing, 1.0, None)


def test_a_new_family_is_a_module_of_its_own(tmp_path, exact_family):
    """A family registered from outside lsmdb: files are built with it, read back
    through it (no false positives: every absent key in range is a filter
    negative), staleness sees it, and the C read path -- which has no probe for
    it -- leaves the table to the Python path, which counts the same."""
    path = str(tmp_path / "db")
    with lsmdb.open(path, auto_compaction=False) as db:
        for i in range(0, 400, 2):
            db.put(b"k%04d" % i, b"v%d" % i)
        db.flush()
        [info] = db.sstables()
        assert info.filter_version == EXACT and not info.filter_stale
        assert db._default_state.fast.probes is None  # no C probe for this family
        assert all(db.get(b"k%04d" % i) == b"v%d" % i for i in range(0, 400, 2))
        assert all(db.get(b"k%04d" % i) is None for i in range(1, 400, 2))
        assert db.get_many([b"k%04d" % i for i in range(10)]) == [
            b"v%d" % i if i % 2 == 0 else None for i in range(10)]
        [info] = db.sstables()
        assert (info.range_skips, info.filter_negatives, info.false_positives,
                info.true_positives) == (1, 204, 0, 205)  # k0399 is past the last key
    with lsmdb.open(path, read_only=True) as db:
        assert db.get(b"k0010") == b"v10"
    FAMILIES.pop(EXACT)  # a reader that does not know the family: fails open, answers right
    with lsmdb.open(path, read_only=True) as db:
        [info] = db.sstables()
        assert "unknown filter family 250" in info.filter_error and info.filter_stale
        assert db.get(b"k0010") == b"v10" and db.get(b"k0011") is None
    [problem] = [p for p in verify_database(path) if p.severity == "error"]
    assert "unknown filter family 250" in problem.message


try:
    from lsmdb import _speedups as speedups
except ImportError:  # pragma: no cover - built without a C compiler
    speedups = None  # type: ignore[assignment]
needs_c = pytest.mark.skipif(speedups is None, reason="built without a C compiler")


@needs_c
def test_xxh3_64_equals_the_xxhash_package_on_every_length():
    import xxhash
    rng = random.Random(11)
    for n in range(0, 301):  # native up to 240 bytes, the package beyond
        for _ in range(40):
            data = bytes(rng.getrandbits(8) for _ in range(n))
            assert speedups.xxh3_64(data) == xxhash.xxh3_64_intdigest(data), n
        for fill in (b"\x00", b"\xff"):
            assert speedups.xxh3_64(fill * n) == xxhash.xxh3_64_intdigest(fill * n), n
    # Other buffers go to the package.
    assert speedups.xxh3_64(bytearray(b"abc")) == xxhash.xxh3_64_intdigest(b"abc")
    assert speedups.xxh3_64(memoryview(b"abcd")) == xxhash.xxh3_64_intdigest(b"abcd")
    with pytest.raises(TypeError):
        speedups.xxh3_64("text")


@needs_c
@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=300))
def test_xxh3_64_equals_the_xxhash_package_on_any_input(data):
    import xxhash
    assert speedups.xxh3_64(data) == xxhash.xxh3_64_intdigest(data)




# ------------------------------------------- the contract every family keeps
CONTRACT_KEYS = 4000
CONTRACT_ABSENT = 40_000


@pytest.mark.parametrize("family_id", sorted(FAMILIES))
@pytest.mark.parametrize("fp_chance", [0.1, 0.01])
def test_every_family_keeps_the_filter_contract(family_id, fp_chance):
    """Built from hashes: no false negatives; its false-positive rate on absent
    hashes within exact binomial bounds (1e-7 each side) of what it predicts; the
    same answers after a round trip through its bytes; damaged bytes fail open
    through a handle; and, where the C read path probes the family, C answers
    as Python does for every hash."""
    rng = random.Random(family_id * 1000 + int(1 / fp_chance))
    present = [rng.getrandbits(64) for _ in range(CONTRACT_KEYS)]
    absent = [rng.getrandbits(64) for _ in range(CONTRACT_ABSENT)]
    built = FAMILIES[family_id].build(len(present), fp_chance, present, FAST_HASHER)
    assert built.family == family_id and built.n == len(present)
    assert all(built.may_contain(h) for h in present)
    predicted = built.predicted_fpr()
    fps = sum(built.may_contain(h) for h in absent)
    assert binom_lower(CONTRACT_ABSENT, predicted, 1e-7) <= fps \
        <= binom_upper(CONTRACT_ABSENT, predicted, 1e-7), (fps, predicted)
    assert 0.5 * fp_chance < predicted < 1.5 * fp_chance

    data = built.to_bytes()
    assert data[0] == family_id
    again = filters.decode(data)
    assert type(again) is type(built) and again.predicted_fpr() == predicted
    assert [again.may_contain(h) for h in absent[:5000]] == \
        [built.may_contain(h) for h in absent[:5000]]
    handle = FilterHandle.load(lambda: data[:len(data) // 2])
    assert isinstance(handle.active, FailOpen) and handle.active.may_contain(absent[0])

    speedups = pytest.importorskip("lsmdb._speedups", reason="built without a C compiler")
    if family_id not in speedups.FILTER_FAMILIES:
        return
    words = [b"w%07d" % i for i in range(3000)]  # C hashes keys itself: a filter over keys
    over_keys = FAMILIES[family_id].build(1000, fp_chance, [key_hash(w) for w in words[:1000]],
                                          FAST_HASHER)
    spec = over_keys.probe_spec()
    counters = array("Q", bytes(8 * len(FILE_COUNTERS)))
    probe = lsmdb.fastpath.FileProbe(None, b"", b"\xff" * 8, counters, None, over_keys,
                                     spec.family, spec.data, spec.params, [b"x"], [0], [0], 0)
    c_probes = speedups.Probes([probe], [], key_hash)
    for w in words:
        assert (c_probes.first(w, 0) == 0) == over_keys.may_contain(key_hash(w)), w
