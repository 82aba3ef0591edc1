"""The C probes (lsmdb/csrc/readpath_probes.c) against the Python rule of a file's
step: the range checks and filter tests of the files a get consults, in order,
counted the same -- the gather of their filter lines, the level picks, the
index bisect, one hash per key across resumes, bad construction refused."""

from __future__ import annotations

import bisect
import gc
import random
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lsmdb.fastpath import FileProbe
from lsmdb.filters.blocked_bloom import FAMILY_BLOCKED_BLOOM, BlockedBloomFilter
from lsmdb.filters.bloom import BloomFilter
from lsmdb.filters.hashing import key_hash, keyed_hasher
from lsmdb.stats import FILE_COUNTERS

speedups = pytest.importorskip("lsmdb._speedups", reason="built without a C compiler")

Probes = speedups.Probes

def counts() -> array:
    return array("Q", bytes(8 * len(FILE_COUNTERS)))


def probe(index: list[bytes], bloom: BloomFilter | None = None, kf=None, c=None,
          lo: bytes | None = None, hi: bytes | None = None, reader=None,
          offsets: list[int] | None = None) -> FileProbe:
    """A FileProbe of ``reader`` (None: no reader), with placeholder block
    offsets and sizes (Probes.first never reads them): ``index`` its index
    keys, ``bloom`` its filter (None: no filter)."""
    n = len(index)
    flt = bloom if bloom is not None else BloomFilter(0, 1.0)
    family, data, params = flt.probe_spec()
    return FileProbe(reader, min(index) if lo is None else lo, max(index) if hi is None else hi,
                     counts() if c is None else c, kf, flt, family, data, params, index,
                     [0] * n if offsets is None else offsets, [0] * n, 0)


def entry(keys: list[bytes], fp: float, kf=None, c=None, version: int = 2):
    """A file's FileProbe for Probes and its Python twin (BloomFilter, or
    BlockedBloomFilter for version 3: the family id) for ``keys``."""
    bloom = (BlockedBloomFilter(len(keys), fp) if version == FAMILY_BLOCKED_BLOOM
             else BloomFilter(len(keys), fp, version))
    hash_fn = kf or key_hash
    for key in keys:
        bloom.add_hash(hash_fn(key))
    return probe(sorted(keys), bloom, kf, c), bloom


def reference_first(files, key: bytes, start: int) -> tuple[int, list[list[int]]]:
    """The Python rule: first file from start in range whose filter says maybe."""
    deltas = [[0, 0] for _ in files]
    for i in range(start, len(files)):
        e, bloom = files[i]
        if key < e.min_key or key > e.max_key:
            deltas[i][0] += 1
            continue
        if not e.filter_family:
            return i, deltas
        h = (e.hash_fn or key_hash)(key)
        if bloom.may_contain(h):
            return i, deltas
        deltas[i][1] += 1
    return -1, deltas


def assert_first_matches(probes, files, key: bytes, context=()) -> None:
    """probes.first(key, start) from 0, resumed after each file found, answers
    and counts (range skips, filter negatives) as the Python rule does."""
    start = 0
    while True:
        before = [list(f[0].counts[:2]) for f in files]
        got = probes.first(key, start)
        want, deltas = reference_first(files, key, start)
        assert got == want, (*context, key, start)
        after = [list(f[0].counts[:2]) for f in files]
        assert [[a - b for a, b in zip(x, y, strict=True)]
                for x, y in zip(after, before, strict=True)] == deltas
        if got < 0:
            break
        start = got + 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.binary(min_size=0, max_size=6), min_size=1, max_size=40),
                min_size=1, max_size=5),
       st.lists(st.sampled_from([0.5, 0.1, 0.01, 1.0]), min_size=5, max_size=5),
       st.lists(st.binary(min_size=0, max_size=6), min_size=1, max_size=60),
       st.booleans(), st.lists(st.sampled_from([1, 2, 3]), min_size=5, max_size=5))
def test_probes_match_the_python_filter(file_keys, fps, queries, keyed, versions):
    kf = keyed_hasher(b"k" * 32).fn if keyed else None
    files = [entry(keys, fps[i], kf, version=versions[i]) for i, keys in enumerate(file_keys)]
    probes = Probes([f[0] for f in files], [], key_hash)
    for key in queries + [k for keys in file_keys for k in keys]:
        assert_first_matches(probes, files, key)
    # No false negative: every key is found in (at least) the first file holding it.
    for i, keys in enumerate(file_keys):
        for key in keys:
            f = probes.first(key, 0)
            while f != i:
                assert f >= 0 and f < i, "a filter said no to a key it holds"
                f = probes.first(key, f + 1)


def test_filters_beyond_the_l2_cache_load_every_probe_line_first():
    """A get whose files' filters are larger in all than FILTER_PREFETCH_BYTES
    (the L2 cache's size) starts loading the lines of all k probes of each
    filter before testing any, not just the first two's; it must answer and
    count as the Python rule does, and a table whose filters fit keeps the
    two-line start."""
    assert speedups.FILTER_PREFETCH_BYTES > 0
    rng = random.Random(5)
    stored = [sorted({b"k%07d" % rng.randrange(10**7) for _ in range(400)}) for _ in range(3)]
    small = [entry(keys, 0.01) for keys in stored]
    p = Probes([f[0] for f in small], [], key_hash)
    assert p.filter_bytes == sum((f[1].m + 7) // 8 for f in small)
    assert not p.prefetch_all
    # the threshold can be set per Probes (tests run small tables above it)
    assert Probes([f[0] for f in small], [], key_hash, prefetch_all_bytes=0).prefetch_all
    assert not Probes([f[0] for f in small], [], key_hash,
                      prefetch_all_bytes=p.filter_bytes).prefetch_all
    for bad in (-1, 1.5, 2**70):
        with pytest.raises(ValueError):
            Probes([f[0] for f in small], [], key_hash, prefetch_all_bytes=bad)
    # filters sized for more keys than they hold: large, few bits set
    capacity = speedups.FILTER_PREFETCH_BYTES * 8 // 3 // 9 + 1
    files = []
    for keys in stored:
        bloom = BloomFilter(capacity, 0.01, 2)
        for key in keys:
            bloom.add_hash(key_hash(key))
        files.append((probe(keys, bloom), bloom))
    big = Probes([f[0] for f in files], [], key_hash)
    assert big.filter_bytes == sum((f[1].m + 7) // 8 for f in files)
    assert big.filter_bytes > speedups.FILTER_PREFETCH_BYTES
    assert big.prefetch_all
    queries = [b"k%07d" % rng.randrange(10**7) for _ in range(3000)]
    for key in queries + [k for keys in stored for k in keys]:
        assert_first_matches(big, files, key)


def test_probes_past_the_gather_limit_match_the_python_filter():
    """Up to 64 files a lookup from the start gathers its files and prefetches
    their filters first; past that it tests them one by one.  Both must
    answer and count as the Python rule does (here 70 level-0 files, half of
    them out of the key's range)."""
    rng = random.Random(9)
    for n_files in (63, 64, 65, 70):
        files = [entry(sorted({b"%03d-%05d" % (i % 2, rng.randrange(10**5)) for _ in range(30)}),
                       0.1, version=1 + i % 3) for i in range(n_files)]
        probes = Probes([f[0] for f in files], [], key_hash)
        for key in [b"%03d-%05d" % (rng.randrange(2), rng.randrange(10**5)) for _ in range(300)]:
            assert_first_matches(probes, files, key, (n_files,))


_TRICKY = st.builds(lambda prefix, tail: prefix + bytes(tail),
                    st.sampled_from([b"", b"user:", b"p" * 9, b"user:\x00"]),
                    st.lists(st.sampled_from([0, 1, 0x61, 0xFF]), max_size=12))


@settings(max_examples=80, deadline=None)
@given(st.lists(_TRICKY, min_size=1, max_size=300), st.lists(_TRICKY, max_size=60),
       st.booleans())
def test_index_block_is_bisect_left_over_the_index_keys(keys, queries, unsorted):
    """The block a get reads: bisected on each index key's 8 bytes after the
    prefix they share, in groups of 32, keys compared whole only where the
    words tie -- it must be bisect_left over the keys, for keys that tie in
    their words (zero bytes, a shared run longer than 8 bytes), keys outside
    the shared prefix, and (falling back to the plain bisect) an index out of
    order."""
    index = list(keys) if unsorted else sorted(keys)
    probes = Probes([probe(index, lo=min(keys), hi=max(keys))], [], key_hash)
    for q in queries + keys + [b"", b"\xff" * 20, min(keys) + b"\x00", max(keys) + b"\x00"]:
        assert probes.index_block(0, q) == bisect.bisect_left(index, q), q


def test_index_block_over_a_large_index():
    """Groups of 32 words at both ends and a last group cut short, keys of a
    common form (a shared prefix, then digits): every index key, each key just
    below and just above, and keys past both ends."""
    for n in (1, 31, 32, 33, 64, 1000, 1025):
        index = [b"user:%010d" % (7 * i + 3) for i in range(n)]
        probes = Probes([probe(index)], [], key_hash)
        for i in range(7 * n + 10):
            q = b"user:%010d" % i
            assert probes.index_block(0, q) == bisect.bisect_left(index, q), (n, q)
        for q in (b"", b"user:", b"user;", b"user:" + b"9" * 11, b"zzz"):
            assert probes.index_block(0, q) == bisect.bisect_left(index, q), (n, q)
    with pytest.raises(IndexError):
        probes.index_block(1, b"a")


def test_levels_bisect_and_resume_after_a_level():
    a = [b"a%04d" % i for i in range(0, 100)]
    b = [b"a%04d" % i for i in range(100, 200)]
    c = [b"a%04d" % i for i in range(200, 300)]
    ea, eb, ec = (entry(k, 1.0)[0] for k in (a, b, c))  # no filters: every in-range file is "maybe"
    e0 = entry([b"a0150", b"a0250"], 1.0)[0]
    p = Probes([e0], [([a[-1], b[-1], c[-1]], [ea, eb, ec])], key_hash)
    assert p.first(b"a0150", 0) == 0          # level 0 first
    assert p.first(b"a0150", 1) == 2          # then level 1's second file (flat index 1 + 1)
    assert p.first(b"a0150", 3) == -1         # level 1 was consulted
    assert p.first(b"a0050", 0) == 1          # range skip in level 0, level 1 file 0
    assert e0.counts[0] == 1
    assert p.first(b"z", 0) == -1             # beyond every level's max key: no file at all


@settings(max_examples=150, deadline=None)
@given(st.lists(st.binary(max_size=20), min_size=1, max_size=300, unique=True),
       st.integers(1, 130), st.lists(st.binary(max_size=20), max_size=40))
def test_a_level_pick_is_bisect_left_on_the_max_keys(keys, n_files, queries):
    """A level of up to 130 files (no filters, so the picked file is the
    answer): the file is the first whose max key is >= the key, if the key is
    not below its min key; the keys of every length, the max keys and their
    neighbours among the queries."""
    check_level_pick(sorted(keys), n_files, queries)


def check_level_pick(keys: list[bytes], n_files: int, queries: list[bytes]) -> None:
    n_files = min(n_files, len(keys))
    chunks = [keys[len(keys) * i // n_files:len(keys) * (i + 1) // n_files] for i in range(n_files)]
    maxes = [c[-1] for c in chunks]
    p = Probes([], [(maxes, [entry(c, 1.0)[0] for c in chunks])], key_hash)
    for key in queries + keys + [m + b"\0" for m in maxes] + [m[:-1] for m in maxes]:
        i = bisect.bisect_left(maxes, key)
        want = i if i < len(maxes) and key >= chunks[i][0] else -1
        assert p.first(key, 0) == want, key


def test_a_level_pick_in_levels_of_1_to_200_files():
    """The pick bisects each max key's 8 bytes after the prefix the level's max
    keys share, and compares whole keys only where those 8 bytes tie: levels
    of 1 to 200 files of keys that differ early, late (long shared runs, so
    that every max key ties), or only in length; queries shorter than the
    shared prefix, beside it, and at every max key's neighbours."""
    rng = random.Random(11)
    families = [
        lambda: b"user:%010d" % rng.randrange(10**6),
        lambda: b"user:" + b"x" * 8 + b"%06d" % rng.randrange(10**6),  # all tie after the prefix
        lambda: b"t" + b"\0" * rng.randrange(12) + bytes([rng.randrange(3)]) * rng.randrange(3),
        lambda: bytes(rng.randrange(2) for _ in range(rng.randrange(1, 14))),
        lambda: b"\xff" * rng.randrange(1, 12) + b"%d" % rng.randrange(99),
    ]
    for make in families:
        for n_files in (1, 2, 3, 4, 7, 8, 9, 15, 16, 17, 63, 64, 65, 98, 127, 128, 200):
            keys = sorted({make() for _ in range(3 * n_files + 5)})
            queries = [make() for _ in range(200)] + [b"", b"t", b"user", b"user:", b"\xff" * 20]
            queries += [k[:j] for k in keys[:5] + keys[-5:] for j in range(len(k))]
            check_level_pick(keys, n_files, queries)


def test_a_level_s_max_keys_must_be_in_order():
    a, b = entry([b"a", b"b"], 1.0)[0], entry([b"c", b"d"], 1.0)[0]
    with pytest.raises(ValueError, match="in order"):
        Probes([], [([b"d", b"b"], [b, a])], key_hash)


def test_a_level_s_max_keys_must_be_its_files_max_keys():
    """A picked file's range check compares only its min key (the pick put the key
    at or below its max key), so a max key that is not the file's is refused."""
    a, b = entry([b"a", b"b"], 1.0)[0], entry([b"c", b"d"], 1.0)[0]
    assert Probes([], [([b"b", b"d"], [a, b])], key_hash).first(b"c", 0) == 1
    with pytest.raises(ValueError, match="its files' max keys"):
        Probes([], [([b"b", b"e"], [a, b])], key_hash)
    with pytest.raises(ValueError, match="its files' max keys"):
        Probes([], [([b"a", b"d"], [a, b])], key_hash)  # b"b" would miss file a


def test_hash_computed_once_per_key_across_resumes():
    calls = []

    def counting_hash(key: bytes) -> int:
        calls.append(key)
        return key_hash(key)

    keys = [b"k%03d" % i for i in range(100)]
    files = [entry(keys, 0.5)[0] for _ in range(4)]
    for f in files:  # every bit set: every filter says "maybe"
        f.filter_data[:] = b"\xff" * len(f.filter_data)
    p = Probes(files, [], counting_hash)
    key = b"k050x"
    assert [p.first(key, s) for s in range(5)] == [0, 1, 2, 3, -1]
    assert calls == [key]
    # A different key is hashed afresh (and an equal but distinct object too).
    p.first(b"k051x", 0)
    assert calls == [key, b"k051x"]

    kcalls = []
    kf = keyed_hasher(b"s" * 32).fn

    def counting_kf(key: bytes) -> int:
        kcalls.append(key)
        return kf(key)

    kfiles = [entry(keys, 0.5, counting_kf)[0] for _ in range(3)]
    for f in kfiles:
        f.filter_data[:] = b"\xff" * len(f.filter_data)
    kcalls.clear()
    p = Probes(kfiles + [files[0]], [], counting_hash)
    calls.clear()
    assert [p.first(key, s) for s in range(4)] == [0, 1, 2, 3]
    assert kcalls == [key] and calls == [key]


@pytest.mark.parametrize("bad, error", [
    (lambda e: e._replace(min_key="lo"), TypeError),                      # str key range
    (lambda e: e._replace(filter_data=b"\x00", filter_params=(10_000, 7, 1428)),
     ValueError),                                                          # bits shorter than m
    (lambda e: e._replace(counts=array("l", [0] * 7)), TypeError),        # wrong counter array
    (lambda e: e._replace(counts=array("Q", [0] * 3)), TypeError),        # too few counters
    (lambda e: e._replace(filter_params=(e.filter_params[0], -1, 0)), ValueError),  # k < 0
    (lambda e: e._replace(filter_params=(e.filter_params[0], e.filter_params[1],
                                         e.filter_params[0])), ValueError),  # partitions beyond m
    (lambda e: e._replace(filter_params=e.filter_params[:2]), TypeError),  # too few parameters
    (lambda e: e._replace(filter_family=20), ValueError),                  # a family C lacks
    (lambda e: e._replace(filter_family=1), ValueError),                   # s for family 1
    (lambda e: e._replace(hash_fn=42), TypeError),                         # hash fn not callable
    (lambda e: e._replace(index_keys=["a"]), TypeError),                   # index keys not bytes
    (lambda e: e._replace(index_keys=(b"a",)), TypeError),                 # index keys not a list
    (lambda e: tuple(e)[:5], TypeError),                                   # wrong arity
    (lambda e: list(e), TypeError),                                        # not a tuple
    (lambda e: e._replace(index_offsets=[0], index_sizes=[1, 2]), TypeError),  # unequal
    (lambda e: e._replace(index_offsets=(0, 0)), TypeError),               # offsets not a list
    (lambda e: e._replace(index_offsets=[-1, -1]), OverflowError),         # negative offset
    (lambda e: e._replace(cache_base=-1), OverflowError),                  # negative cache key
    (lambda e: e._replace(format_version=4), ValueError),                  # unknown format
    (lambda e: e._replace(format_version=b"2"), TypeError),                # format not an int
])
def test_bad_entries_are_refused(bad, error):
    e, _ = entry([b"a", b"b"], 0.01)
    with pytest.raises(error):
        Probes([bad(e)], [], key_hash)
    with pytest.raises((TypeError, ValueError)):
        Probes([], [([b"a"], [])], key_hash)       # one max key per file
    with pytest.raises(TypeError):
        Probes([], [(["a"], [e])], key_hash)       # max keys must be bytes
    p = Probes([e], [], key_hash)
    with pytest.raises(TypeError):
        p.first("a", 0)
    with pytest.raises(TypeError):
        p.first(b"a")



def test_the_filters_hash_is_the_c_xxh3_and_the_c_probes_compute_it_inline():
    assert key_hash is speedups.xxh3_64
    # Probes given xxh3_64 hash inline: same answers as through a Python call.
    keys = [b"key-%05d" % i for i in range(0, 2000, 2)]
    native = Probes([entry(keys, 0.01)[0]], [], speedups.xxh3_64)
    called = Probes([entry(keys, 0.01)[0]], [], lambda k: speedups.xxh3_64(k))
    for i in range(2000):
        k = b"key-%05d" % i
        assert native.first(k, 0) == called.first(k, 0)
        if i % 2 == 0:
            assert native.first(k, 0) == 0  # never a false negative



@pytest.mark.parametrize("version", [1, 2])
def test_filters_over_the_prefetch_size_answer_as_the_small_ones(version):
    """Large filters (488 KiB here) next to a small one: every filter in the way
    of a key has its first probe lines prefetched before any is tested; the
    answers and counters must not change."""
    rng = random.Random(5)
    m, k = 4_000_037, 7  # bits: about 488 KiB
    s = m // k if version == 2 else 0
    files = []
    for _ in range(3):
        keys = sorted({b"key-%07d" % rng.randrange(1_000_000) for _ in range(20_000)})
        bits = bytearray((m + 7) // 8)
        speedups.bloom_add(bits, m, k, [key_hash(key) for key in keys], s)
        n = len(keys)
        e = FileProbe(None, keys[0], keys[-1], counts(), None, BloomFilter(0, 1.0), version,
                      bits, (m, k, s), keys, [0] * n, [0] * n, 0)
        files.append((e, set(keys), bits))
    small, small_bloom = entry([b"key-0400000", b"key-0600000"], 0.01)
    probes = Probes([small] + [f[0] for f in files], [], key_hash)

    def reference(key: bytes) -> int:
        if small.min_key <= key <= small.max_key and key in small_bloom:
            return 0
        for i, (e, _keys, bits) in enumerate(files, 1):
            if not e.min_key <= key <= e.max_key:
                continue
            h = key_hash(key)
            h1, h2 = h & 0xFFFFFFFF, h >> 32
            if s:  # format 2, from docs/FORMAT.md
                where = [j * s + (((h1 + j * h2) & 0xFFFFFFFF) * s >> 32) for j in range(k)]
            else:
                where = [(h1 + j * h2) % m for j in range(k)]
            if all(bits[b >> 3] & (1 << (b & 7)) for b in where):
                return i
        return -1

    for _ in range(20_000):
        key = b"key-%07d" % rng.randrange(1_000_000)
        want = reference(key)
        assert probes.first(key, 0) == want
        if any(key in keys for _e, keys, _b in files):
            assert want >= 0  # never a false negative
    negatives = sum(f[0].counts[1] for f in files)
    assert negatives > 0


@pytest.mark.parametrize(("params", "size", "match"), [
    ((3, 2), 128, "shorter than its blocks"), ((0, 2), 128, "1 to 2\\^32 - 1 blocks"),
    ((2**32, 2), 128, "blocks"), ((2, 0), 128, "0 < k"), ((2,), 128, "blocks, k")])
def test_blocked_filters_of_bad_parameters_are_refused(params, size, match):
    bad = FileProbe(None, b"a", b"b", counts(), None, BloomFilter(0, 1.0), FAMILY_BLOCKED_BLOOM,
                    bytearray(size), params, [b"b"], [0], [1], 0)
    with pytest.raises((ValueError, TypeError), match=match):
        Probes([bad], [], key_hash)


def test_partitions_of_2_32_bits_are_refused():
    """A family-2 filter's partitions stay under 2^32 bits (the probes' product
    fits 64 bits): larger parameters are refused, not probed wrongly."""
    big = FileProbe(None, b"a", b"b", counts(), None, BloomFilter(0, 1.0), 2, bytearray(1),
                    (7 * 2**32, 7, 2**32), [b"b"], [0], [1], 0)
    with pytest.raises(ValueError, match="2\\^32"):
        Probes([big], [], key_hash)


class _Reader:
    """Stands for an SSTableReader: where the C Probes keeps a file's compact index."""

    def __init__(self) -> None:
        self._c_index: bytes | None = None


@settings(max_examples=60, deadline=None)
@given(st.lists(_TRICKY, min_size=1, max_size=300), st.lists(_TRICKY, max_size=40),
       st.booleans())
def test_a_reader_s_compact_index_is_made_once_and_shared(keys, queries, unsorted):
    """The first Probes over a reader leaves the file's compact index on it;
    later ones point into that one (no copy of the index lists), answer the
    same, and hold it themselves; something else found there is not used."""
    index = list(keys) if unsorted else sorted(keys)
    offsets = list(range(0, 4096 * len(index), 4096))
    reader = _Reader()

    def new() -> object:
        return Probes([probe(index, lo=min(keys), hi=max(keys), reader=reader,
                             offsets=offsets)], [], key_hash)

    def check(probes) -> None:
        for q in queries + keys + [b"", b"\xff" * 20]:
            assert probes.index_block(0, q) == bisect.bisect_left(index, q), q

    first = new()
    packed = reader._c_index
    assert type(packed) is bytes and len(packed) > 8 * len(index)
    second = new()
    assert reader._c_index is packed       # made once
    check(first)
    check(second)
    reader._c_index = None                 # the probes hold what they point into
    del first, packed
    gc.collect()
    check(second)
    reader._c_index = b"LSMCIDX1" + bytes(40)   # not a compact index of this file
    third = new()
    assert reader._c_index == b"LSMCIDX1" + bytes(40)
    check(third)


def test_a_compact_index_that_does_not_check_out_is_not_used():
    """Header fields the read path trusts -- block count, shared prefix, group
    count -- changed in a real compact index, or one of another file: each is
    refused (the entry builds its own) and every answer stays right."""
    import struct
    index = [b"user:%06d" % (3 * i) for i in range(100)]
    other = [b"user:%06d" % (5 * i) for i in range(64)]
    made = _Reader()
    Probes([probe(index, reader=made)], [], key_hash)
    packed = made._c_index
    assert type(packed) is bytes
    magic, nidx, icp, has_words, ngroups, keys_len = struct.unpack_from("<Qqqqqq", packed)
    assert (nidx, has_words, ngroups) == (100, 1, 4)

    def with_head(**fields) -> bytes:
        head = dict(magic=magic, nidx=nidx, icp=icp, has_words=has_words, ngroups=ngroups,
                    keys_len=keys_len)
        head.update(fields)
        return struct.pack("<Qqqqqq", *head.values()) + packed[48:]

    other_reader = _Reader()
    Probes([probe(other, reader=other_reader)], [], key_hash)
    forged = [with_head(icp=-(1 << 40)), with_head(icp=keys_len + 5), with_head(ngroups=5),
              with_head(ngroups=(1 << 61) - 64), with_head(has_words=2), with_head(nidx=99),
              other_reader._c_index, packed[:-1]]
    for bad in forged:
        reader = _Reader()
        reader._c_index = bad
        probes = Probes([probe(index, reader=reader)], [], key_hash)
        assert reader._c_index is bad
        for i in range(0, 320, 7):
            q = b"user:%06d" % i
            assert probes.index_block(0, q) == bisect.bisect_left(index, q), (bad[:48], q)
