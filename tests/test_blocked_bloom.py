"""lsmdb.filters.blocked_bloom: the cache-line blocked Bloom filter (family 3).

Its sizing against the formula, its false-positive rate against binomial
bounds, its probes and bit setting in C against the Python reference, its
block format and decoding rules, and the table option that picks it.

The statistical tests use keys from the ``--bloom-seed`` RNG; each bound is
set so that a correct filter fails this module with probability below about
one in a million, whatever the seed.
"""

from __future__ import annotations

import hashlib
import math
import random
import struct
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lsmdb
import lsmdb.filters.blocked_bloom as bb
from lsmdb import filters
from lsmdb.errors import CorruptionError, UnsupportedFormatError
from lsmdb.filters import NO_PROBE, FilterSpec, is_stale
from lsmdb.filters.blocked_bloom import (
    BLOCK_BITS,
    FAMILY_BLOCKED_BLOOM,
    BlockedBloomFilter,
    best_hashes,
    bits_per_key,
    block_of,
    block_positions,
    positions,
    predicted_fpr_at,
)
from lsmdb.filters.bloom import FILTER_HEADER
from lsmdb.filters.hashing import key_hash, keyed_hasher
from tests.support.binomial import binom_lower, binom_upper
from tests.support.impls import use_python

needs_c = pytest.mark.skipif(bb._c_add is None, reason="built without a C compiler")

PROBES = 200_000
CASES = [(p, n) for p in (0.1, 0.01, 0.001) for n in (1_000, 10_000, 50_000)]
#: Each case makes two binomial tests, each with tails of ALPHA on both sides.
ALPHA = 1e-6 / (4 * len(CASES))


@pytest.fixture(scope="module")
def rng_seed(pytestconfig: pytest.Config) -> int:
    return int(pytestconfig.getoption("--bloom-seed"))


@pytest.fixture(scope="module")
def absent_hashes(rng_seed: int) -> list[int]:
    """PROBES hashes of keys never added (first byte 0x02: the added ones start 0x01)."""
    rng = random.Random(rng_seed + 1)
    return [key_hash(b"\x02" + rng.randbytes(15)) for _ in range(PROBES)]


def added_hashes(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [key_hash(b"\x01" + rng.randbytes(15)) for _ in range(n)]


# -- sizing -------------------------------------------------------------------

@pytest.mark.parametrize("p", [0.5, 0.1, 0.01, 0.001, 1e-4, 1e-6])
def test_bits_per_key_are_the_fewest_that_predict_the_target(p):
    c = bits_per_key(p)
    load = BLOCK_BITS / c
    assert predicted_fpr_at(load, best_hashes(load)) <= p
    fewer = BLOCK_BITS / (c - 2 / 1024)
    assert predicted_fpr_at(fewer, best_hashes(fewer)) > p
    # A blocked filter needs more bits than a standard one for the same rate, never fewer.
    assert c > -math.log(p) / math.log(2) ** 2


def test_the_poisson_sum_is_the_formula():
    """Against the documented sum at a small load, every term by hand."""
    load, k, b = 3.0, 4, 512
    want = 0.0
    for j in range(80):
        e1, e2 = (1 - 1 / b) ** (j * k), (1 - 2 / b) ** (j * k)
        mean, var = 1 - e1, e1 / b + (1 - 1 / b) * e2 - e1 * e1
        want += (math.exp(-load) * load ** j / math.factorial(j)
                 * (mean ** k + k * (k - 1) / 2 * mean ** (k - 2) * var))
    assert predicted_fpr_at(load, k) == pytest.approx(want, rel=1e-12)
    assert predicted_fpr_at(0.0, 3) == 0.0 and predicted_fpr_at(5.0, 0) == 1.0


def _exact_rate(load: float, k: int) -> float:
    """The exact mean rate for independent probe positions: the distribution of
    a block's set bits after j keys' j*k throws, step by step, mixed over
    j ~ Poisson(load), each block's chance (set / 512)^k."""
    dist = [1.0] + [0.0] * BLOCK_BITS
    total = 0.0
    for j in range(int(load + 12 * math.sqrt(load) + 30) + 1):
        weight = math.exp(j * math.log(load) - load - math.lgamma(j + 1))
        total += weight * sum(d * (x / BLOCK_BITS) ** k for x, d in enumerate(dist) if d)
        for _ in range(k):
            new = [0.0] * (BLOCK_BITS + 1)
            for x, d in enumerate(dist):
                if d > 1e-300:
                    new[x] += d * x / BLOCK_BITS
                    if x < BLOCK_BITS:
                        new[x + 1] += d * (BLOCK_BITS - x) / BLOCK_BITS
            dist = new
    return total


@pytest.mark.parametrize("p", [0.1, 0.01])
def test_the_formula_is_the_exact_rate_to_a_thousandth(p):
    """At the load the sizing picks, the second-order formula against the exact
    mean; the mean fill alone to the k-th power falls short of it (the reason
    for the variance term)."""
    load = BLOCK_BITS / bits_per_key(p)
    k = best_hashes(load)
    exact = _exact_rate(load, k)
    assert predicted_fpr_at(load, k) == pytest.approx(exact, rel=1e-3)
    assert exact <= p * 1.001
    first_order = sum(math.exp(j * math.log(load) - load - math.lgamma(j + 1))
                      * (1 - (1 - 1 / BLOCK_BITS) ** (j * k)) ** k for j in range(200))
    assert first_order < exact * (0.999 if p < 0.1 else 1.0)


@pytest.mark.parametrize(("n", "p"), [(1, 0.01), (1_000, 0.01), (10_000, 0.1),
                                      (123_457, 0.001)])
def test_sizing_whole_blocks_and_the_target_met(n, p):
    f = BlockedBloomFilter(n, p)
    assert f.m % BLOCK_BITS == 0 and f.blocks == f.m // BLOCK_BITS >= 1
    assert f.blocks == max(1, math.ceil(n * bits_per_key(p) / BLOCK_BITS))
    assert f.k == best_hashes(n / f.blocks)
    assert f.predicted_fpr(n) <= p
    assert len(f.bits) == f.m // 8


def test_no_filter_at_fp_chance_one():
    f = BlockedBloomFilter(1000, 1.0)
    assert f.m == f.k == f.blocks == 0 and f.probe_spec() == NO_PROBE
    assert f.may_contain(123) and f.predicted_fpr() == 1.0
    f.add(b"x")
    assert BlockedBloomFilter.from_bytes(f.to_bytes()).m == 0


@pytest.mark.parametrize("bad", [0, -0.1, 1.5, float("nan")])
def test_fp_chance_out_of_range(bad):
    with pytest.raises(ValueError):
        BlockedBloomFilter(10, bad)


# -- false positives --------------------------------------------------------------

@pytest.mark.parametrize(("p", "n"), CASES)
def test_false_positive_rate_at_design_load(p, n, rng_seed, absent_hashes):
    """No false negative; the false positives of PROBES absent keys within the
    binomial bounds of the rate this very bit pattern gives (each block's
    share of set bits, to the k: independent probes); and that rate near the
    formula's prediction, which is at most p."""
    f = BlockedBloomFilter(n, p)
    hashes = added_hashes(rng_seed, n)
    f.add_hashes(hashes)
    assert all(f.may_contain(h) for h in hashes), "a filter said no to a key it holds"
    # The rate of this pattern: between the chance that k distinct bits of the
    # key's block are set and that k independent ones are (the probes of a
    # key are nearly always distinct).
    data = bytes(f.bits)
    ones = [int.from_bytes(data[b * 64:(b + 1) * 64], "little").bit_count()
            for b in range(f.blocks)]
    q_distinct = sum(math.comb(o, f.k) for o in ones) / math.comb(BLOCK_BITS, f.k) / f.blocks
    q_independent = sum((o / BLOCK_BITS) ** f.k for o in ones) / f.blocks
    stats = f.statistics()
    assert stats.estimated_fpr_from_fill == pytest.approx(q_independent, rel=1e-9)
    assert stats.fill_ratio == sum(ones) / f.m
    count = sum(1 for h in absent_hashes if f.may_contain(h))
    lo, hi = binom_lower(PROBES, q_distinct, ALPHA), binom_upper(PROBES, q_independent, ALPHA)
    assert lo <= count <= hi, (count, lo, hi, f.m, f.k)
    # The pattern's rate against the formula: blocks' loads vary from filter
    # to filter, by less the more blocks there are.
    predicted = f.predicted_fpr()
    assert predicted <= p
    assert q_independent == pytest.approx(predicted, rel=0.6 if n < 10_000 else 0.2)
    assert stats.estimated_keys_from_fill == pytest.approx(n, rel=0.1)


def test_the_rate_follows_the_formula_when_overfilled(rng_seed, absent_hashes):
    """Twice the keys it was sized for: the rate rises as the formula says."""
    f = BlockedBloomFilter(10_000, 0.01)
    f.add_hashes(added_hashes(rng_seed + 5, 20_000))
    predicted = f.predicted_fpr()
    assert predicted > 0.05
    count = sum(1 for h in absent_hashes if f.may_contain(h))
    lo = binom_lower(PROBES, predicted * 0.8, ALPHA)
    hi = binom_upper(PROBES, predicted * 1.2, ALPHA)
    assert lo <= count <= hi


# -- probes ---------------------------------------------------------------------

def test_probe_positions_by_hand():
    """The documented vector (docs/FORMAT.md §5)."""
    h = 0x0123456789ABCDEF
    assert block_of(h, 1000) == (0x01234567 * 1000) >> 32 == 4
    x, want = 0x89ABCDEF, []
    for _ in range(6):
        want.append(x >> 23)
        x = x * 0x9E3779B9 % 2**32
    assert block_positions(h, 6) == want == [275, 227, 436, 48, 130, 237]
    assert positions(1000, 6, h) == [4 * 512 + b for b in want]
    f = BlockedBloomFilter.with_size(1000 * 512, 6)
    f.add_hash(h)
    assert [i for i, byte in enumerate(bytes(f.bits)) if byte] == sorted(
        {(4 * 512 + b) >> 3 for b in want})
    assert all(f.bits[(4 * 512 + b) >> 3] >> (b & 7) & 1 for b in want)
    assert f.may_contain(h) and f.explain(h) == {"filter_bits": 512_000, "filter_hashes": 6,
                                                 "filter_block": 4}


def test_every_block_is_reachable_and_the_last_is_used():
    f = BlockedBloomFilter.with_size(3 * 512, 2)
    hashes = [h << 32 | 0x12345678 for h in (0, 2**32 // 3 + 1, 2**32 - 1)]
    assert [block_of(h, 3) for h in hashes] == [0, 1, 2]
    for i, h in enumerate(hashes):
        f.add_hash(h)
        used = {b // 64 for b, byte in enumerate(bytes(f.bits)) if byte}
        assert sorted(used) == list(range(i + 1))


def test_the_bits_are_aligned_to_cache_lines():
    import ctypes
    for size in (64, 640, 1 << 16):
        view = bb.aligned_bits(size)
        assert len(view) == size and not any(view)
        address = ctypes.addressof(ctypes.c_char.from_buffer(view))
        assert address % 64 == 0


@needs_c
@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=300), st.integers(1, 40),
       st.integers(1, 16), st.booleans())
def test_c_add_sets_the_bits_python_sets(hashes, blocks, k, as_array):
    c = BlockedBloomFilter.with_size(blocks * 512, k)
    c.add_hashes(array("Q", hashes) if as_array else hashes)
    py = BlockedBloomFilter.with_size(blocks * 512, k)
    for h in hashes:
        for b in positions(blocks, k, h):
            py.bits[b >> 3] |= 1 << (b & 7)
    assert bytes(c.bits) == bytes(py.bits)
    assert c.n == len(hashes)
    ones, rate = bb._c_fill(c.bits, blocks, k)
    assert ones == sum(bin(b).count("1") for b in bytes(c.bits))
    data = bytes(c.bits)
    assert rate == pytest.approx(sum(
        (int.from_bytes(data[i * 64:(i + 1) * 64], "little").bit_count() / 512) ** k
        for i in range(blocks)) / blocks, rel=1e-12)


def test_the_python_add_sets_the_bits_the_c_add_sets(monkeypatch, rng_seed):
    hashes = added_hashes(rng_seed, 2_000)
    want = BlockedBloomFilter(2_000, 0.01)
    want.add_hashes(hashes)
    monkeypatch.setattr(bb, "_c_add", None)
    monkeypatch.setattr(bb, "_c_fill", None)
    got = BlockedBloomFilter(2_000, 0.01)
    for h in hashes[:10]:
        got.add_hash(h)
    got.add_hashes(hashes[10:])
    assert bytes(got.bits) == bytes(want.bits)
    assert got.statistics() == pytest.approx(want.statistics())


@needs_c
def test_c_add_refuses_bad_input():
    bits = bb.aligned_bits(128)
    with pytest.raises(ValueError):
        bb._c_add(bits, 3, 2, [1])            # 3 blocks in 2 blocks' bytes
    with pytest.raises(ValueError):
        bb._c_add(bits, 0, 2, [1])
    with pytest.raises(ValueError):
        bb._c_add(bits, 2, 0, [1])
    with pytest.raises(TypeError):
        bb._c_add(bits, 2, 2, array("d", [1.0]))
    with pytest.raises(BufferError):
        bb._c_add(bytes(128), 2, 2, [1])      # read-only
    with pytest.raises(OverflowError):
        bb._c_add(bits, 2, 2, [-1])


# -- the block --------------------------------------------------------------------

def test_round_trip_and_golden_bytes():
    f = BlockedBloomFilter(100, 0.01)
    for i in range(100):
        f.add(b"key%03d" % i)
    data = f.to_bytes()
    assert FILTER_HEADER.unpack_from(data) == (3, 1, 0, f.k, f.m, 100, 0.01, 0)
    assert (f.m, f.k, len(data)) == (1024, 7, 36 + 128)
    assert hashlib.sha256(data).hexdigest()[:32] == "78045aacec50229ccbc6c262856b325c"
    g = filters.decode(data)
    assert isinstance(g, BlockedBloomFilter) and g.to_bytes() == data
    assert all(g.may_contain(key_hash(b"key%03d" % i)) for i in range(100))
    assert g.describe() == {"m": 1024, "k": 7, "blocks": 2}
    g._check()


def _block(k=3, m=1024, n=5, algo=1, family=3, extra=0, bits=None):
    return FILTER_HEADER.pack(family, algo, 0, k, m, n, 0.01, 0) + (
        bytes(m // 8 + extra) if bits is None else bits)


@pytest.mark.parametrize(("data", "error", "match"), [
    (b"\x03" * 10, CorruptionError, "shorter than its header"),
    (_block(algo=9), UnsupportedFormatError, "hash algorithm"),
    (_block(m=1000), CorruptionError, "whole blocks"),
    (_block(m=512 * 2**32, bits=b""), CorruptionError, "whole blocks"),
    (_block(extra=1), CorruptionError, "needs 128 bytes"),
    (_block(extra=-1), CorruptionError, "needs 128 bytes"),
    (_block(k=0), CorruptionError, "m=1024, k=0"),
    (_block(k=65), CorruptionError, "k=65"),
    (_block(k=2, m=0), CorruptionError, "m=0, k=2"),
])
def test_decoding_rules(data, error, match):
    with pytest.raises(error, match=match):
        filters.decode(data)


def test_a_keyed_blocked_filter_waits_for_its_secret():
    secret = keyed_hasher(b"s" * 32)
    flt = filters.build(FilterSpec(FAMILY_BLOCKED_BLOOM, 0.01, secret), 2,
                        [secret.fn(b"a"), secret.fn(b"b")])
    handle = filters.FilterHandle(filters.decode(flt.to_bytes()))
    assert handle.error and not handle.active.probe_spec().family
    handle.attach_hasher(secret)
    assert handle.active is handle.stored and handle.active.may_contain(secret.fn(b"a"))


def test_staleness_by_family_name():
    bloom = filters.FilterHandle(filters.build(FilterSpec(2, 0.01), 10, list(range(10))))
    blocked = filters.FilterHandle(filters.build(FilterSpec(3, 0.01), 10, list(range(10))))
    assert is_stale(bloom, 0.01, FilterSpec(3, 0.01))
    assert is_stale(blocked, 0.01, FilterSpec(2, 0.01))
    assert not is_stale(blocked, 0.01, FilterSpec(3, 0.01))
    assert filters.WRITTEN_FAMILIES == {"bloom": 2, "blocked_bloom": 3}
    assert lsmdb.options.OPTION_CHOICES["filter_family"] == tuple(filters.WRITTEN_FAMILIES)


# -- in a database ----------------------------------------------------------------

def _families(db, table="default"):
    return {i.filter_version for i in db.sstables(table)}


def test_the_table_option_picks_the_family_of_new_files_and_a_rebuild_converts(tmp_path):
    path = str(tmp_path / "db")
    with lsmdb.open(path, auto_compaction=False) as db:
        for i in range(0, 2000, 2):
            db.put(b"k%05d" % i, b"v%d" % i)
        db.flush()
        assert _families(db) == {2}
        db.alter_table("default", filter_family="blocked_bloom")
        assert [i.filter_stale for i in db.sstables()] == [True]
        for i in range(1, 2000, 4):
            db.put(b"k%05d" % i, b"w%d" % i)
        db.flush()
        assert sorted(i.filter_version for i in db.sstables()) == [2, 3]
        assert db.rebuild_filters() == 1
        assert _families(db) == {3} and not any(i.filter_stale for i in db.sstables())
        with pytest.raises(ValueError, match="filter_family"):
            db.alter_table("default", filter_family="cuckoo")
        with pytest.raises(ValueError, match="filter_family"):
            db.create_table("t", filter_family="")
    with lsmdb.open(path) as db:
        assert db.table("default").options.filter_family == "blocked_bloom"
        db.compact()
        [info] = db.sstables()
        assert info.filter_version == 3 and info.entries == 1500
        assert info.predicted_fpr <= 0.01
        for i in range(2000):
            want = (b"w%d" % i if i % 4 == 1 else None) if i % 2 else b"v%d" % i
            assert db.get(b"k%05d" % i) == want


@pytest.mark.parametrize("options", [
    {"compaction": "size_tiered"},
    {"compaction": "leveled", "target_file_size_bytes": 65536},
    {"bloom_filter_hash": "keyed"},
])
def test_c_and_python_read_paths_agree_on_blocked_filters(tmp_path, monkeypatch, options):
    """Files of both families in one table, read by get and get_many on both
    paths: the same answers, the same counters, and the answers right."""
    path = str(tmp_path / "db")
    rng = random.Random(7)
    model: dict[bytes, bytes | None] = {}
    with lsmdb.open(path, auto_compaction=False) as db:
        db.alter_table("default", block_size_bytes=512, **options)
        for f in range(5):
            db.alter_table("default", filter_family=("blocked_bloom", "bloom")[f % 2],
                           bloom_filter_fp_chance=rng.choice([0.3, 0.01]))
            with db.batch() as b:
                for _ in range(400):
                    key = b"k%05d" % rng.randrange(6000)
                    if rng.random() < 0.1:
                        b.delete(key)
                        model[key] = None
                    else:
                        model[key] = b"v%d" % f
                        b.put(key, model[key])
            db.flush()
        assert _families(db) == {2, 3}
    keys = [b"k%05d" % rng.randrange(7000) for _ in range(1500)] + [b"a", b"z"]
    results = {}
    for impl in ("c", "python") if lsmdb.SPEEDUPS else ("python",):
        with monkeypatch.context() as m:
            if impl == "python":
                use_python(m)
            with lsmdb.open(path, read_only=True, block_cache_size_bytes=4096) as db:
                answers = [db.get(k) for k in keys] + db.get_many(keys[::2])
                counters = sorted((i.file, i.range_skips, i.filter_negatives, i.true_positives,
                                   i.false_positives, i.block_reads) for i in db.sstables())
                results[impl] = (answers, counters)
    answers, counters = results["python"]
    assert answers == [model.get(k) for k in keys] + [model.get(k) for k in keys[::2]]
    assert sum(c[2] for c in counters) > 1000  # the filters said no
    assert results.get("c", results["python"]) == results["python"]


def test_a_damaged_blocked_filter_fails_open(tmp_path):
    """A blocked filter block whose header lies, under a right checksum: the
    file still opens and answers right, its filter failing open."""
    import zlib
    path = str(tmp_path / "db")
    with lsmdb.open(path, auto_compaction=False) as db:
        db.alter_table("default", filter_family="blocked_bloom")
        for i in range(300):
            db.put(b"k%04d" % i, b"v")
        db.flush()
        [info] = db.sstables()
    from lsmdb.sstable_reader import SSTableReader
    reader = SSTableReader(info.path)
    offset, size = reader.filter_handle
    reader.close()
    with open(info.path, "r+b") as fh:
        fh.seek(offset)
        payload = bytearray(fh.read(size))
        struct.pack_into("<Q", payload, 8, 1000)  # m: not whole blocks
        fh.seek(offset)
        fh.write(payload + struct.pack("<I", zlib.crc32(payload)))  # the trailer: CRC-32
    with lsmdb.open(path, read_only=True) as db:
        [info] = db.sstables()
        assert "whole blocks" in info.filter_error
        assert db.get(b"k0007") == b"v" and db.get(b"k9999") is None
