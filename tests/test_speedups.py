"""The optional C read path (lsmdb/csrc/) against the Python one.

Both must give the same answers and the same counters, read for read: the
range checks and filter probes (``Probes``) and the whole get (``Getter``).
Also: a key is hashed once per get even across the calls that resume after a
false positive, bad construction input is refused, unusual calls fall back
to the Python getter, and threads sharing a getter never see another key's
hash.
"""

from __future__ import annotations

import bisect
import collections
import os
import random
import signal
import subprocess
import sys
import threading
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lsmdb
import lsmdb.fastpath
import lsmdb.filters.bloom as bloom_mod
import lsmdb.readpath
import lsmdb.table
from lsmdb.errors import DatabaseClosedError
from lsmdb.fastpath import FileProbe
from lsmdb.filters import hashing as hashing_mod
from lsmdb.filters.bloom import BloomFilter
from lsmdb.filters.hashing import key_hash, keyed_hasher
from lsmdb.stats import FILE_COUNTERS

speedups = pytest.importorskip("lsmdb._speedups", reason="built without a C compiler")
Probes = speedups.Probes

SMALL = {"memtable_size_bytes": 16 * 1024, "block_size_bytes": 512}


def counts() -> array:
    return array("Q", bytes(8 * len(FILE_COUNTERS)))


def probe(index: list[bytes], bloom: BloomFilter | None = None, kf=None, c=None,
          lo: bytes | None = None, hi: bytes | None = None) -> FileProbe:
    """A FileProbe of no reader, with placeholder block offsets and sizes
    (Probes.first never reads them): ``index`` its index keys, ``bloom`` its
    filter (None: no filter)."""
    n = len(index)
    flt = bloom if bloom is not None else BloomFilter(0, 1.0)
    family, data, params = flt.probe_spec()
    return FileProbe(None, min(index) if lo is None else lo, max(index) if hi is None else hi,
                     counts() if c is None else c, kf, flt, family, data, params, index,
                     [0] * n, [0] * n, 0)


def entry(keys: list[bytes], fp: float, kf=None, c=None, version: int = 2):
    """A file's FileProbe for Probes and its Python twin (BloomFilter) for ``keys``."""
    bloom = BloomFilter(len(keys), fp, version)
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
        if bloom.may_contain_hash(h & 0xFFFFFFFF, h >> 32):
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
       st.booleans(), st.lists(st.sampled_from([1, 2]), min_size=5, max_size=5))
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
                       0.1, version=1 + i % 3 % 2) for i in range(n_files)]
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


# ----------------------------------------------------------------- whole DB
def build(path: str) -> None:
    """A database whose tables exercise every branch of a get."""
    rng = random.Random(7)
    db = lsmdb.open(path, auto_compaction=False)
    db.create_table("keyed", bloom_filter_hash="keyed", **SMALL)
    db.create_table("lev", compaction="leveled", target_file_size_bytes=65536,
                    memtable_size_bytes=65536, block_size_bytes=1024)
    db.create_table("nofilter", bloom_filter_fp_chance=1.0, **SMALL)
    for name in ("keyed", "lev", "nofilter", None):
        t = db.table(name) if name else None
        pad = 300 if name == "lev" else 0
        for round_ in range(6):
            with db.batch() as b:
                for _ in range(300):
                    i = rng.randrange(2000)
                    if rng.random() < 0.15:
                        b.delete(b"key%05d" % i, table=name)
                    else:
                        b.put(b"key%05d" % i, b"v%d-%d" % (i, round_) + b"." * pad, table=name)
            db.flush(name)
        if name == "lev":
            db.compact(name)
            assert len({i.level for i in db.sstables(name)} - {0}) >= 1
            # and newer level-0 files on top of the levels
            for j in range(2):
                with db.batch() as b:
                    for _ in range(200):
                        b.put(b"key%05d" % rng.randrange(2000), b"new%d" % j, table=name)
                db.flush(name)
        assert t is None or len(db.sstables(name)) >= 2
    # leave something in the memtable too
    for i in range(0, 2000, 97):
        db.put(b"key%05d" % i, b"mem")
    db.close()


def queries() -> list[bytes]:
    rng = random.Random(8)
    qs = [b"key%05d" % rng.randrange(2000) for _ in range(1500)]      # present or deleted
    qs += [b"key%05d5" % rng.randrange(2000) for _ in range(1500)]    # absent, in range
    qs += [b"zz%d" % i for i in range(200)] + [b"", b"a"]             # out of range
    return qs


def middle_queries() -> list[bytes]:
    """Present, deleted and absent keys from the middle of the key space only:
    inside every level-0 file's range, so get_many skips the per-key range
    checks of those files."""
    return [b"key%05d" % i for i in range(900, 1100)] + [b"key%05d5" % i for i in range(900, 1100)]


def run_all(path: str, use_c: bool, monkeypatch,
            prefetch_all: bool | None = None) -> tuple[list, dict]:
    """Gets and get_many calls on every table of build(path), and the
    counters after them; with prefetch_all (C path), check that the C probes
    of each table whose files have filters load every probe line up front
    (Probes.prefetch_all) or not."""
    monkeypatch.setattr(lsmdb.table, "USE_SPEEDUPS", use_c)
    db = lsmdb.open(path, read_only=True)
    try:
        getter_kind = type(db.get).__name__
        assert (getter_kind == "Getter") == use_c
        if prefetch_all is not None:
            for name in ("keyed", "lev", "default"):
                assert db._table_state(name).fast.probes.prefetch_all == prefetch_all, name
        answers = []
        for name in ("keyed", "lev", "nofilter", None):
            get = db.get if name is None else db.table(name).get
            answers.append([get(q) for q in queries()])
            answers.append((db if name is None else db.table(name)).get_many(queries()))
            answers.append((db if name is None else db.table(name)).get_many(middle_queries()))
            level0 = [i for i in db.sstables(name or "default") if i.level == 0]
            assert level0 and all(i.min_key < b"key00900" and b"key010995" < i.max_key
                                  for i in level0)
        counters = {(i.table, i.file): tuple(getattr(i, c) for c in FILE_COUNTERS)
                    for i in db.sstables()}
        for name in ("keyed", "lev", "nofilter", "default"):
            s = db.table_stats(name)
            counters[name] = (s["gets"], s["gets_absent"])
        return answers, counters
    finally:
        db.close()


def downgrade_filters(path: str, every: int = 2) -> int:
    """Rewrite the xxh3 filter of every ``every``-th SSTable under ``path`` in
    filter format 1, as lsmdb wrote it before format 2: same header but the
    version byte, same size, probes over the whole array; the block's CRC is
    recomputed.  Returns the number of files rewritten."""
    import glob
    import zlib

    from lsmdb.sstable_reader import SSTableReader
    done = 0
    for i, name in enumerate(sorted(glob.glob(os.path.join(path, "*.sst")))):
        r = SSTableReader(name)
        try:
            old = r.filter.stored
            if i % every or old is None or not old.m \
                    or old.hash_algorithm != hashing_mod.HASH_XXH3_64:
                continue
            keys = [key for key, _value in r.iter_range(None, None)]  # tombstones too
            off, size = r.filter_handle
        finally:
            r.close()
        f = BloomFilter.with_size(old.m, old.k, version=1)
        f.fp_chance = old.fp_chance
        f.add_hashes([key_hash(key) for key in keys])
        assert f.n == old.n
        block = f.to_bytes()
        assert len(block) == size and block[1:36] == old.to_bytes()[1:36]
        with open(name, "r+b") as fh:
            fh.seek(off)
            fh.write(block + zlib.crc32(block).to_bytes(4, "little"))
        done += 1
    return done


def test_inspect_shows_each_file_s_filter_format_and_a_full_rebuild_upgrades_it(tmp_path):
    """SSTableInfo.filter_version (and so `lsmdb inspect`) says which files still
    have format-1 filters; rebuild_filters(only_stale=False) rewrites them in
    format 2, and every key is still found."""
    path = str(tmp_path / "db")
    db = lsmdb.open(path, auto_compaction=False)
    for f in range(4):
        with db.batch() as b:
            for i in range(f, 4000, 4):
                b.put(b"key%05d" % i, b"v%d" % i)
        db.flush()
    db.close()
    assert downgrade_filters(path) == 2
    db = lsmdb.open(path, auto_compaction=False)
    try:
        assert sorted(i.filter_version for i in db.sstables()) == [1, 1, 2, 2]
        assert not any(i.filter_stale for i in db.sstables())
        assert db.rebuild_filters() == 0              # same fp chance: not stale
        assert db.rebuild_filters(only_stale=False) == 4
        assert [i.filter_version for i in db.sstables()] == [2, 2, 2, 2]
        assert all(db.get(b"key%05d" % i) == b"v%d" % i for i in range(4000))
    finally:
        db.close()


@pytest.mark.parametrize("old_filters,prefetch_all", [(False, False), (True, False),
                                                      (False, True)])
def test_c_and_python_paths_agree_answer_for_answer_and_count_for_count(tmp_path, monkeypatch,
                                                                         old_filters,
                                                                         prefetch_all):
    """With old_filters, every other SSTable has a format-1 filter (as written
    before format 2): files of both layouts side by side in one table.  With
    prefetch_all, the C probes take these small tables' filters for larger
    than the L2 cache (prefetch_all_bytes=0): gets load every probe line up
    front, and get_many's pass over a file or a level loads the lines of the
    keys ahead of the one it tests."""
    path = str(tmp_path / "db")
    build(path)
    if old_filters:
        assert downgrade_filters(path) >= 5
        db = lsmdb.open(path, read_only=True)
        try:
            layouts = {r.filter.active.version for state in db._versions.tables.values()
                       for r in state.files if r.filter.active.m}
            assert layouts == {1, 2}
            assert not [i for i in db.sstables() if i.filter_error]
        finally:
            db.close()
    if prefetch_all:
        probes = lsmdb.fastpath.Probes
        monkeypatch.setattr(lsmdb.fastpath, "Probes",
                            lambda *args: probes(*args, prefetch_all_bytes=0))
    c_answers, c_counters = run_all(path, True, monkeypatch, prefetch_all)
    py_answers, py_counters = run_all(path, False, monkeypatch)
    assert c_answers == py_answers
    assert c_counters == py_counters
    # and the answers are right: against a fresh read of every file's contents
    db = lsmdb.open(path, read_only=True)
    try:
        expected = dict(db.scan())
    finally:
        db.close()
    assert c_answers[9] == [expected.get(q) for q in queries()]
    assert c_answers[11] == [expected.get(q) for q in middle_queries()]
    # the counters moved: the read path did count
    assert sum(v[1] for k, v in c_counters.items() if isinstance(k, tuple)) > 0


def test_c_and_python_paths_agree_with_a_full_block_cache(tmp_path, monkeypatch):
    """A cache of a few blocks, full after the first reads: both getters turn
    a block's first read away and admit its second (BlockCache.admit), so a
    loop of gets agrees answer for answer and count for count -- disk reads
    and cache hits included -- and answers right.  get_many answers right on
    both paths too; its disk reads and cache hits may split differently,
    since the C path reads the blocks only one key needs before the others
    (with a full cache the order decides what is cached, admission or not)."""
    path = str(tmp_path / "db")
    build(path)
    db = lsmdb.open(path, read_only=True)
    try:
        expected = dict(db.scan())
        expected_tables = {name: dict(db.table(name).scan()) for name in ("keyed", "lev",
                                                                           "nofilter")}
    finally:
        db.close()
    results = []
    for use_c in (True, False):
        monkeypatch.setattr(lsmdb.table, "USE_SPEEDUPS", use_c)
        db = lsmdb.open(path, read_only=True, block_cache_size_bytes=8192)
        try:
            assert (type(db.get).__name__ == "Getter") == use_c
            answers = {name: [db.table(name).get(q) for q in queries()]
                       for name in expected_tables}
            answers["default"] = [db.get(q) for q in queries()]
            counters = {(i.table, i.file): tuple(getattr(i, c) for c in FILE_COUNTERS)
                        for i in db.sstables()}
            many = {name: db.table(name).get_many(queries()) for name in expected_tables}
            many["default"] = db.get_many(queries())
        finally:
            db.close()
        results.append((answers, counters))
        for name, want in list(expected_tables.items()) + [("default", expected)]:
            assert answers[name] == [want.get(q) for q in queries()], (use_c, name)
            assert many[name] == [want.get(q) for q in queries()], (use_c, name)
    assert results[0] == results[1]
    reads = sum(v[5] for v in results[0][1].values())
    hits = sum(v[6] for v in results[0][1].values())
    assert reads > 1000 and hits > 100  # the cache was full, and still served some


@pytest.mark.parametrize("use_c", [True, False])
def test_a_table_with_no_files_yet_answers_and_counts_on_either_path(tmp_path, monkeypatch,
                                                                     use_c):
    """Before its first flush a table has only its memtable: the C getter serves
    it too (Probes over no files), and both paths answer as a dict of the writes
    would -- puts, overwrites, deletes (tombstones in the memtable), absent keys,
    get and get_many -- and count every get and every absent one."""
    path = str(tmp_path / "db")
    db = lsmdb.open(path, auto_compaction=False)
    db.create_table("keyed", bloom_filter_hash="keyed")
    rng = random.Random(3)
    model: dict[str | None, dict[bytes, bytes]] = {None: {}, "keyed": {}}
    for name in (None, "keyed"):
        for round_ in range(10):
            with db.batch() as b:
                for _ in range(300):
                    key = b"k%04d" % rng.randrange(1000)
                    if rng.random() < 0.2:
                        b.delete(key, table=name)
                        model[name].pop(key, None)
                    else:
                        b.put(key, b"v%d" % round_, table=name)
                        model[name][key] = b"v%d" % round_
    db.close()
    monkeypatch.setattr(lsmdb.table, "USE_SPEEDUPS", use_c)
    db = lsmdb.open(path, read_only=True)
    try:
        assert not db.sstables()
        assert (type(db.get).__name__ == "Getter") == use_c
        assert (db._default_state.fast.probes is not None) == use_c
        qs = [b"k%04d" % i for i in range(1000)] + [b"k%04d5" % i for i in range(300)]
        qs += [b"", b"zz"]
        for name in (None, "keyed"):
            handle = db if name is None else db.table(name)
            want = [model[name].get(q) for q in qs]
            assert [handle.get(q) for q in qs] == want
            assert handle.get_many(qs) == want
            stats = db.table_stats(name or "default")
            assert (stats["gets"], stats["gets_absent"]) == (2 * len(qs),
                                                             2 * want.count(None))
    finally:
        db.close()


def test_getter_falls_back_for_unusual_calls(tmp_path):
    db = lsmdb.open(str(tmp_path / "db"), auto_compaction=False)
    db.put(b"a", b"1")
    db.flush()
    db.put(b"b", b"2")
    assert type(db.get).__name__ == "Getter"
    assert db.get(b"a") == b"1" and db.get(b"b") == b"2"
    assert db.get(b"c", b"dflt") == b"dflt"
    assert db.get(key=b"a") == b"1"
    assert db.get(b"zz", default=3) == 3
    assert db.get(bytearray(b"a")) == b"1"
    assert db.get(memoryview(b"b")) == b"2"
    with pytest.raises(TypeError):
        db.get("a")
    with pytest.raises(TypeError):
        db.get()
    with pytest.raises(ValueError):
        db.get(b"x" * (64 * 1024 + 1))
    assert db.get_many([b"a", bytearray(b"b"), b"c"]) == [b"1", b"2", None]
    assert db.get_many(k for k in (b"b", b"a")) == [b"2", b"1"]   # any iterable
    with pytest.raises(TypeError):
        db.get_many([b"a", "b"])
    db.alter_table("default", bloom_filter_mode="shadow")  # shadow: the Python path serves
    assert db.get(b"a") == b"1" and db.get(b"q") is None
    assert db.get_many(k for k in (b"q", b"a")) == [None, b"1"]
    db.close()
    with pytest.raises(DatabaseClosedError):
        db.get(b"a")
    with pytest.raises(DatabaseClosedError):
        db.get_many(k for k in (b"a",))


def test_threads_sharing_a_keyed_getter_get_their_own_hashes(tmp_path):
    """Keyed hashing of long keys releases the GIL inside blake2b: another
    thread's get runs in between; each must still use its own key's hash."""
    db = lsmdb.open(str(tmp_path / "db"), auto_compaction=False)
    db.create_table("k", bloom_filter_hash="keyed", bloom_filter_fp_chance=0.01)
    t = db.table("k")
    present = [b"%06d" % i + b"p" * 5000 for i in range(300)]
    for part in range(3):
        for key in present[part::3]:
            t.put(key, key[:6])
        db.flush("k")
    errors: list[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(1500):
            key = rng.choice(present)
            if t.get(key) != key[:6]:
                errors.append(f"lost {key[:6]!r}")
            absent = b"%06d" % rng.randrange(300) + b"q" * 5000
            if t.get(absent) is not None:
                errors.append("phantom")

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    db.close()
    assert errors == []


def test_get_many_hashes_once_and_reads_each_block_once(tmp_path, monkeypatch):
    calls: list[bytes] = []

    def counting_hash(key: bytes) -> int:
        calls.append(key)
        return key_hash(key)

    monkeypatch.setattr(lsmdb.fastpath, "key_hash", counting_hash)
    path = str(tmp_path / "db")
    db = lsmdb.open(path, auto_compaction=False, block_cache_size_bytes=0)
    db.create_table("t", bloom_filter_fp_chance=0.5, block_size_bytes=4096)
    t = db.table("t")
    for part in range(4):  # 4 overlapping files: absent keys meet 4 filters
        with db.batch() as b:
            for i in range(part, 2000, 4):
                b.put(b"k%05d" % (2 * i), b"v", table="t")
        db.flush("t")
    before = {i.file: i.block_reads for i in db.sstables("t")}
    absent = [b"k%05d" % (2 * i + 1) for i in range(1999)]
    calls.clear()
    assert t.get_many(absent) == [None] * len(absent)
    assert len(calls) == len(set(calls)) == len(absent)   # each key hashed exactly once
    infos = db.sstables("t")
    assert sum(i.false_positives for i in infos) > 100      # so keys did resume
    blocks = {os.path.basename(r.path): len(r.index_keys) for r in db._table_state("t").files}
    for i in infos:  # every block of a file read at most once by the one call
        assert 0 < i.block_reads - before[i.file] <= blocks[i.file]
    # present keys of one block: one read of that block, not one per key
    same_block = [b"k%05d" % (2 * i) for i in range(3, 43, 4)]  # newest file, adjacent
    reads = sum(i.block_reads for i in db.sstables("t"))
    assert t.get_many(same_block) == [b"v"] * len(same_block)
    assert sum(i.block_reads for i in db.sstables("t")) - reads == 1
    db.close()


@pytest.mark.parametrize("hash_name", ["fast", "keyed"])
def test_get_many_reads_a_block_several_keys_need_once_in_c_counted_as_gets_are(tmp_path,
                                                                                monkeypatch,
                                                                                hash_name):
    """A block that several keys of one get_many need, and the cache does not
    hold, is read once in C for all of them (the Python side is never
    called), whether the filters use the fast hash or all one keyed hash:
    the answers are a loop of get's -- values, absent keys (false positives
    inside a block others were found in) and tombstones -- each key counts
    the true or false positives its gets count, and the blocks read are
    exactly the distinct blocks the gets' traces read."""
    def no_python(*_args):
        raise AssertionError("a block several keys need went to the Python side")

    monkeypatch.setattr(lsmdb.readpath, "_files_many_c", no_python)
    db = lsmdb.open(str(tmp_path / "db"), auto_compaction=False, block_cache_size_bytes=0)
    try:
        db.alter_table("default", bloom_filter_fp_chance=0.3, bloom_filter_hash=hash_name,
                       **SMALL)
        for part in range(3):  # three files over the whole range: keys resume after a "maybe"
            with db.batch() as b:
                for i in range(part, 900, 3):
                    b.put(b"key%06d" % (2 * i), b"v%d" % i)
            db.flush()
        for i in range(0, 900, 7):
            db.delete(b"key%06d" % (2 * i))
        db.flush()
        assert type(db.get).__name__ == "Getter" and len(db.sstables()) == 4
        queries = [b"key%06d" % i for i in range(0, 1800, 1)]  # present, absent, deleted
        blocks = {(step["file"], step["block"]["index"])
                  for k in queries for step in db.trace(k)["steps"] if "block" in step}
        before = db.table_stats()
        expected = [db.get(k) for k in queries]
        loop = db.table_stats()
        assert db.get_many(queries) == expected
        many = db.table_stats()
        assert b"v0" not in expected and expected.count(None) > 900  # tombstones, absent
        for c in ("true_positives", "false_positives", "filter_negatives", "range_skips"):
            assert many[c] - loop[c] == loop[c] - before[c], c
        assert loop["false_positives"] - before["false_positives"] > 100
        assert many["block_reads"] - loop["block_reads"] == len(blocks)
        assert len(blocks) < loop["block_reads"] - before["block_reads"]  # shared blocks
    finally:
        db.close()


def test_get_many_on_a_table_of_fast_and_keyed_filters_answers_as_gets_do(tmp_path,
                                                                          monkeypatch):
    """A table whose files use different hashes (the fast one, then a keyed
    one after alter_table) cannot hash each key once for all its filters:
    its get_many leaves the blocks to the Python side, and answers as a loop
    of get does."""
    calls = []
    real = lsmdb.readpath._files_many_c

    def counting(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(lsmdb.readpath, "_files_many_c", counting)
    db = lsmdb.open(str(tmp_path / "db"), auto_compaction=False, block_cache_size_bytes=0)
    try:
        db.alter_table("default", bloom_filter_fp_chance=0.3, **SMALL)
        for part, hash_name in enumerate(("fast", "keyed", "fast", "keyed")):
            db.alter_table("default", bloom_filter_hash=hash_name)
            with db.batch() as b:
                for i in range(part, 800, 4):
                    b.put(b"key%06d" % (2 * i), b"v%d" % i)
            db.flush()
        queries = [b"key%06d" % i for i in range(1600)]
        expected = [db.get(k) for k in queries]
        assert db.get_many(queries) == expected
        assert expected.count(None) == 800 and calls  # the Python side read blocks
    finally:
        db.close()


@pytest.mark.parametrize("side", ["c", "python"])
def test_a_block_get_many_reads_for_several_keys_is_admitted_as_its_keys_answer(tmp_path,
                                                                                monkeypatch,
                                                                                side):
    """With room in the cache: a block read once for several keys is cached
    at once when it held one of them (a get's block), and only on its second
    read when it held none (a false positive's block, admit_reread) -- read
    in C, or on the Python side (which serves tables whose filters mix
    hashes, and builds without the C speedups)."""
    db = _no_filter_no_cache_db(str(tmp_path / "db"), 3000)  # no filter: absent keys read
    db.close()
    if side == "python":  # no C getter for get_many: the Python side reads every block
        monkeypatch.setattr(lsmdb.readpath, "state_getter", lambda _db, _state: None)
    db = lsmdb.open(str(tmp_path / "db"), auto_compaction=False)
    try:
        cache = db._versions.block_cache

        def block(key: bytes) -> tuple[object, int]:
            """The file whose range holds key, and its block that may."""
            [reader] = [p.reader for p in db._default_state.fast.files
                        if p.min_key <= key <= p.max_key]
            return reader, reader.block_for(key)

        def cached(key: bytes) -> bool:
            reader, i = block(key)
            return cache.lookup(reader.cache_base + i) is not None

        absent = [b"key%06dx" % i for i in (1000, 1001)]  # in one block, neither there
        present = [b"key%06d" % i for i in (2000, 2001)]
        assert block(absent[0]) == block(absent[1]) and block(present[0]) == block(present[1])
        reads = db.table_stats()["block_reads"]
        assert db.get_many(present) == [b"v2000", b"v2001"]
        assert cached(present[0])  # held the keys: cached on its first read
        assert db.get_many(absent) == [None, None]
        assert not cached(absent[0])  # held neither: not yet
        assert db.table_stats()["block_reads"] == reads + 2
        assert db.get_many(absent) == [None, None]
        assert cached(absent[0])  # its second read
        assert db.get_many(absent + present) == [None, None, b"v2000", b"v2001"]
        assert db.table_stats()["block_reads"] == reads + 3  # both from the cache now
    finally:
        db.close()


# ------------------------------------------------------------------- merge
def chunked(entries: dict[bytes, bytes | None], reverse: bool, size: int) -> list[tuple]:
    keys = sorted(entries, reverse=reverse)
    return [(keys[i:i + size], [entries[k] for k in keys[i:i + size]])
            for i in range(0, len(keys), size)]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.dictionaries(st.binary(max_size=3), st.one_of(st.none(), st.binary(max_size=3)),
                                max_size=30), max_size=6),
       st.booleans(), st.booleans(), st.integers(1, 7))
def test_c_merge_matches_the_python_merge(sources, reverse, keep, size):
    import lsmdb.merge
    chunks = [chunked(src, reverse, size) for src in sources]
    want = list(lsmdb.merge._merge(
        __import__("heapq").merge(*[lsmdb.merge._tagged(c, lsmdb.merge.tag_for(age, reverse))
                                   for age, c in enumerate(chunks)], reverse=reverse), keep))
    got = list(speedups.Merge([iter(c) for c in chunks], reverse, keep))
    assert got == want
    # and what that is: the newest version of every key, in order
    newest: dict[bytes, bytes | None] = {}
    for src in reversed(sources):
        newest.update(src)
    expect = [(k, v) for k, v in sorted(newest.items(), reverse=reverse) if keep or v is not None]
    assert got == expect


def test_c_merge_errors_end_the_iteration():
    def broken():
        yield [b"a"], [b"1"]
        raise OSError("disk gone")

    m = speedups.Merge([broken(), iter([([b"b", b"c"], [b"2", b"3"])])])
    assert next(m) == (b"a", b"1")
    with pytest.raises(OSError):
        next(m)
    assert list(m) == []  # finished, never a partial answer after the error
    with pytest.raises(TypeError):
        list(speedups.Merge([iter([(["a"], [b"1"])])]))          # str key
    with pytest.raises(TypeError):
        list(speedups.Merge([iter([([b"a"], [b"1", b"2"])])]))   # lengths differ
    with pytest.raises(TypeError):
        list(speedups.Merge([iter([[b"a"]])]))                   # not a (keys, values) pair
    assert list(speedups.Merge([])) == []
    assert list(speedups.Merge([iter([([], [])]), iter([([b"x"], [None])])], False, True)) \
        == [(b"x", None)]


def test_scans_and_compactions_agree_between_the_c_and_python_merges(tmp_path, monkeypatch):
    import lsmdb.merge
    results = []
    for use_c in (True, False):
        monkeypatch.setattr(lsmdb.merge, "USE_SPEEDUPS", use_c)
        path = str(tmp_path / f"db-{use_c}")
        build(path)  # its compactions merge with this merge too
        db = lsmdb.open(path, read_only=True)
        try:
            got = []
            for name in ("keyed", "lev", "nofilter", "default"):
                t = db.table(name)
                got.append(list(t.scan()))
                got.append(list(t.scan(reverse=True)))
                got.append(list(t.scan(b"key00500", b"key01500")))
                got.append(list(t.scan(prefix=b"key010", reverse=True)))
            results.append(got)
        finally:
            db.close()
    assert results[0] == results[1]
    assert len(results[0][6]) > 100


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=200), st.integers(1, 5000),
       st.integers(1, 20), st.sampled_from([1, 2]))
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
    for h in hashes:
        ref.add_hash(h)
    assert c_bits == ref.bits
    py = BloomFilter.with_size(m, k, version)
    monkey = bloom_mod._bloom_add
    try:  # the pure-Python add_hashes sets the same bits
        bloom_mod._bloom_add = None
        py.add_hashes(hashes)
    finally:
        bloom_mod._bloom_add = monkey
    assert py.bits == ref.bits


def test_bloom_add_refuses_bad_input():
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
    flt = BloomFilter(0, 1.0)
    big = FileProbe(None, b"a", b"b", counts(), None, flt, 2, bytearray(1), (7 * 2**32, 7, 2**32),
                    [b"b"], [0], [1], 0)
    with pytest.raises(ValueError, match="2\\^32"):
        Probes([big], [], key_hash)


def test_a_closed_database_is_freed(tmp_path):
    """db.get is a C Getter holding the DB: the cycle collector must free both."""
    import gc
    import weakref
    db = lsmdb.open(str(tmp_path / "db"), auto_compaction=False)
    db.put(b"k", b"v")
    db.flush()
    assert db.get(b"k") == b"v" and db.get_many([b"k", b"x"]) == [b"v", None]
    ref = weakref.ref(db)
    db.close()
    del db
    gc.collect()
    assert ref() is None


def test_the_c_getter_reads_the_states_cell_which_close_empties(tmp_path):
    """The C getter takes the table's read path from state.fast_cell, which
    every publish fills with state.fast (a flush's file is read at once) and
    close empties (a get then raises DatabaseClosedError, get_many too); it
    refuses a state without such a cell."""
    db = lsmdb.open(str(tmp_path / "db"), auto_compaction=False)
    state = db._default_state
    assert type(db.get).__name__ == "Getter"
    db.put(b"k", b"v")
    assert state.fast_cell == [state.fast] and db.get(b"k") == b"v"
    db.flush()  # the value now only in a file
    assert state.fast_cell[0] is state.fast and state.fast.data == {}
    assert db.get(b"k") == b"v" and db.get_many([b"k", b"x"]) == [b"v", None]
    getter = db.get
    with pytest.raises(TypeError, match="fast_cell"):
        type(getter)(db, type("State", (), {"counts": state.counts, "fast_cell": ()})(),
                     object(), print, print, 10, None)
    db.close()
    assert state.fast_cell == [None]
    for call in (lambda: getter(b"k"), lambda: db.get_many([b"k"])):
        with pytest.raises(lsmdb.DatabaseClosedError):
            call()


@settings(max_examples=2000, deadline=None)
@given(st.integers(0, 2**32 - 1) | st.sampled_from([0, 1, 2**31, 2**32 - 1]),
       st.integers(1, 2**32 - 1) | st.sampled_from([1, 2, 3, 2**31 - 1, 2**31, 2**32 - 1]))
def test_the_division_free_modulo_is_exact(a, d):
    assert speedups._fastmod(a, d) == a % d


def test_the_modulo_beyond_32_bits_divides():
    for a, d in [(2**40 + 7, 3), (2**63 + 5, 2**33 + 1), (5, 2**40)]:
        assert speedups._fastmod(a, d) == a % d


# -- crc32, xxh3_64 and block_may_hold: drop-ins for what the format names ----

def test_crc32_equals_zlib_on_every_length_alignment_and_start_value():
    import zlib
    rng = random.Random(7)
    for n in [*range(0, 700), 4095, 4096, 4100, 65_536, 65_537, 1_000_003]:
        data = bytes(rng.getrandbits(8) for _ in range(n + 3)) if n < 5000 else os.urandom(n + 3)
        for off in range(3):
            view = memoryview(data)[off:off + n]
            value = rng.getrandbits(32)
            assert speedups.crc32(view) == zlib.crc32(view), (n, off)
            assert speedups.crc32(view, value) == zlib.crc32(view, value), (n, off)
    assert speedups.crc32(bytearray(b"abc"), 2**40 + 5) == zlib.crc32(b"abc", 2**40 + 5)
    with pytest.raises(TypeError):
        speedups.crc32("text")


_CRC_LENGTHS = [*range(0, 1100, 7), *range(250, 300), 4095, 4096, 4100, 65_536, 1_000_003]


@pytest.mark.parametrize("wide", [True, False])
def test_crc32_equals_zlib_with_either_fold(wide):
    """The fold on 256-bit lanes (VPCLMULQDQ, where the CPU has it) and the
    one on 128-bit lanes (set_crc32_wide(False) keeps it) both give zlib's
    value, from the lengths each takes on."""
    import zlib
    rng = random.Random(9)
    assert speedups.CRC32_VPCLMUL <= speedups.CRC32_CLMUL
    try:
        assert speedups.set_crc32_wide(wide) is (wide and bool(speedups.CRC32_VPCLMUL))
        for n in _CRC_LENGTHS:
            data = os.urandom(n + 3)
            for off in range(3):
                view = memoryview(data)[off:off + n]
                value = rng.getrandbits(32)
                assert speedups.crc32(view, value) == zlib.crc32(view, value), (n, off)
    finally:
        speedups.set_crc32_wide(True)
    assert speedups.set_crc32_wide(True) is bool(speedups.CRC32_VPCLMUL)


def test_the_crc32_fold_is_chosen_by_a_bool():
    with pytest.raises(TypeError):
        speedups.set_crc32_wide(0)
    with pytest.raises(TypeError):
        speedups.set_crc32_wide("no")


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=3000), st.integers(0, 2**32 - 1))
def test_crc32_equals_zlib_on_any_input(data, value):
    import zlib
    assert speedups.crc32(data, value) == zlib.crc32(data, value)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=5000))
def test_the_crc32_residue_checks_payload_and_trailer_in_one_pass(payload):
    from lsmdb.coding import CRC32_RESIDUE, crc32
    good = payload + crc32(payload).to_bytes(4, "little")
    assert crc32(good) == CRC32_RESIDUE
    for bad_trailer in (crc32(payload) ^ 1, crc32(payload) ^ 0x80000000):
        assert crc32(payload + bad_trailer.to_bytes(4, "little")) != CRC32_RESIDUE
    if payload:
        flipped = bytes([payload[0] ^ 0x10]) + payload[1:]
        assert crc32(flipped + crc32(payload).to_bytes(4, "little")) != CRC32_RESIDUE


def test_the_c_crc32_is_used_where_it_is_faster():
    import zlib

    import lsmdb.coding
    assert lsmdb.coding.crc32 is (speedups.crc32 if speedups.CRC32_CLMUL else zlib.crc32)


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


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=300))
def test_xxh3_64_equals_the_xxhash_package_on_any_input(data):
    import xxhash
    assert speedups.xxh3_64(data) == xxhash.xxh3_64_intdigest(data)


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


def encoded_block(keys: list[bytes], values: list) -> bytes:
    from lsmdb.block import encode_block
    return encode_block([keys, values])


@settings(max_examples=500, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=40, unique=True),
       st.lists(st.binary(max_size=300), max_size=5), st.integers(0, 70_000))
def test_block_may_hold_answers_exactly_for_well_formed_blocks(keys, others, big):
    keys.sort()
    raw = encoded_block(keys, [b"v" if i % 3 else None for i in range(len(keys))])
    for k in keys:
        assert speedups.block_may_hold(raw, k)
    for k in others:
        assert speedups.block_may_hold(raw, k) == (k in keys)
    # array16/array32 headers and bin16 keys
    many = [b"k%07d" % i for i in range(0, big, 7)]
    raw = encoded_block(many, many)
    for probe in (0, big // 2, big - 1, big + 1):
        assert speedups.block_may_hold(raw, b"k%07d" % probe) == (probe % 7 == 0 and probe < big)
    long_key = b"L" * 70_000
    assert speedups.block_may_hold(encoded_block([long_key], [b""]), long_key)
    assert not speedups.block_may_hold(encoded_block([long_key], [b""]), long_key + b"!")


def _mutated_block(keys: list[bytes], at: int, xor: int) -> bytes:
    import msgpack
    payload = bytearray(msgpack.packb([sorted(keys), [b"v"] * len(keys)], use_bin_type=True))
    payload[at % len(payload)] ^= xor
    return bytes(payload)


#: Data block payloads: random bytes, or a well-formed block with one byte changed.
GARBAGE_OR_MUTATED_BLOCKS = (
    st.binary(max_size=200)
    | st.builds(_mutated_block, st.lists(st.binary(max_size=4), max_size=8, unique=True),
                st.integers(0, 200), st.integers(1, 255)))


@settings(max_examples=2000, deadline=None)
@given(GARBAGE_OR_MUTATED_BLOCKS, st.binary(max_size=4))
def test_block_may_hold_never_denies_a_key_a_decodable_block_holds(payload, key):
    """Garbage never crashes the walk, and when msgpack decodes a block to
    sorted bytes keys (the shape lsmdb writes), no key among them is answered
    "certainly not"."""
    import msgpack
    raw = payload + b"\0\0\0\0"
    answer = speedups.block_may_hold(raw, key)
    try:
        obj = msgpack.unpackb(payload)
    except Exception:
        return
    if type(obj) is not list or not obj or type(obj[0]) is not list:
        return
    keys = obj[0]
    if not all(type(k) is bytes for k in keys) or keys != sorted(set(keys)):
        return
    if key in keys:
        assert answer
    for k in keys:
        assert speedups.block_may_hold(raw, k)


MISSING = object()


def decoded_answer(payload: bytes, key: bytes):
    """What the Python read path answers for key from a data block payload
    (CorruptionError when it refuses the block)."""
    from lsmdb.block import decode_data_block
    keys, values = decode_data_block(payload, "<test>", 0)
    j = bisect.bisect_left(keys, key)
    return values[j] if j < len(keys) and keys[j] == key else MISSING


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=40, unique=True),
       st.lists(st.binary(max_size=300) | st.none(), max_size=40),
       st.lists(st.binary(max_size=300), max_size=5), st.integers(0, 70_000))
def test_block_find_answers_as_the_decoder_for_well_formed_blocks(keys, values, others, big):
    keys.sort()
    values = (values + [b"x"] * len(keys))[:len(keys)]
    payload = encoded_block(keys, values)[:-4]
    for k in keys + others:
        assert speedups.block_find(payload, k, MISSING) is decoded_answer(payload, k) \
            or speedups.block_find(payload, k, MISSING) == decoded_answer(payload, k)
    # array16/array32 headers, bin16 keys and values
    many = [b"k%07d" % i for i in range(0, big, 7)]
    payload = encoded_block(many, [m * 40 for m in many])[:-4]
    for probe in (0, big // 2, big - 1, big + 1):
        key = b"k%07d" % probe
        want = key * 40 if probe % 7 == 0 and probe < big else MISSING
        assert speedups.block_find(payload, key, MISSING) == want or want is MISSING
        assert (speedups.block_find(payload, key, MISSING) is MISSING) == (want is MISSING)


@settings(max_examples=2000, deadline=None)
@given(GARBAGE_OR_MUTATED_BLOCKS, st.binary(max_size=4))
def test_block_find_refuses_every_block_the_decoder_refuses(payload, key):
    """The C getter takes a value from the bytes read (block_find) only from a
    block the Python decoder would accept: whatever it refuses (ValueError)
    goes to the decoder, which raises CorruptionError.  Where the decoder
    accepts a block in the shape lsmdb writes, both give the same answer."""
    from lsmdb.errors import CorruptionError
    try:
        want = decoded_answer(payload, key)
    except CorruptionError:
        with pytest.raises(ValueError):
            speedups.block_find(payload, key, MISSING)
        return
    try:
        got = speedups.block_find(payload, key, MISSING)
    except ValueError:
        return  # a shape the writer never uses (e.g. an array 16 of two): the decoder reads it
    from lsmdb.block import decode_data_block
    keys = decode_data_block(payload, "<test>", 0)[0]
    if keys == sorted(set(keys)):
        assert got is want or got == want


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=40, unique=True),
       st.lists(st.binary(max_size=300) | st.none(), max_size=40),
       st.lists(st.binary(max_size=300), max_size=5), st.integers(0, 70_000))
def test_a_cached_block_answers_as_block_find(keys, values, others, big):
    """The cache holds a block as block_entry makes it (the payload, then its
    entries' offsets); entry_find, which bisects the keys through them,
    answers what block_find answers on the payload, for every key, and
    entry_lists decodes it as the decoder decodes the payload."""
    from lsmdb.block import decode_data_block
    keys.sort()
    values = (values + [b"x"] * len(keys))[:len(keys)]
    many = [b"k%07d" % i for i in range(0, big, 7)]  # array16/array32 headers, bin16 values
    for ks, vs in ((keys, values), (many, [m * 40 for m in many])):
        payload = encoded_block(ks, vs)[:-4]
        entry = speedups.block_entry(payload)
        assert entry[:len(payload)] == payload and len(entry) == len(payload) + 8 * len(ks) + 8
        assert speedups.entry_lists(entry) == decode_data_block(payload, "<test>", 0)
        for k in ks + others + [k + b"\x00" for k in ks] + [k[:-1] for k in ks if k]:
            want = speedups.block_find(payload, k, MISSING)
            got = speedups.entry_find(entry, k, MISSING)
            assert got is want or got == want


@settings(max_examples=2000, deadline=None)
@given(GARBAGE_OR_MUTATED_BLOCKS, st.binary(max_size=4))
def test_block_entry_refuses_what_block_find_refuses(payload, key):
    """Only a payload block_find reads whole is cached: block_entry refuses
    (ValueError) exactly the payloads block_find refuses."""
    try:
        speedups.block_find(payload, key, MISSING)
    except ValueError:
        with pytest.raises(ValueError):
            speedups.block_entry(payload)
        return
    entry = speedups.block_entry(payload)
    want = speedups.block_find(payload, key, MISSING)
    from lsmdb.block import decode_data_block
    ks = decode_data_block(payload, "<test>", 0)[0]
    if ks == sorted(set(ks)):
        got = speedups.entry_find(entry, key, MISSING)
        assert got is want or got == want


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.binary(max_size=6), min_size=1, max_size=8, unique=True),
       st.integers(0, 10_000), st.integers(0, 255), st.binary(max_size=6))
def test_entry_find_stays_inside_any_entry(keys, at, byte, key):
    """An entry with any byte changed (its offsets, counts or payload) makes
    entry_find and entry_lists answer with bytes of the entry, or refuse
    (ValueError): every offset and header is checked against the payload's
    end."""
    keys.sort()
    entry = bytearray(speedups.block_entry(encoded_block(keys, keys)[:-4]))
    entry[at % len(entry)] = byte
    entry = bytes(entry)
    for k in (key, *keys):
        try:
            got = speedups.entry_find(entry, k, MISSING)
        except ValueError:
            continue
        assert got is MISSING or got is None or got in entry
    try:
        ks, vs = speedups.entry_lists(entry)
    except ValueError:
        pass
    else:
        assert len(ks) == len(vs) and all(k in entry for k in ks)
        assert all(v is None or v in entry for v in vs)
    for cut in (0, 1, 7, 8, len(entry) - 1):
        with pytest.raises(ValueError):
            speedups.entry_find(entry[:cut], keys[0], MISSING)
        with pytest.raises(ValueError):
            speedups.entry_lists(entry[:cut])


def test_block_find_refuses_leftover_bytes_unequal_arrays_and_wrong_types():
    import msgpack
    good = msgpack.packb([[b"a", b"b"], [b"1", None]], use_bin_type=True)
    assert speedups.block_find(good, b"a", MISSING) == b"1"
    assert speedups.block_find(good, b"b", MISSING) is None
    assert speedups.block_find(good, b"c", MISSING) is MISSING
    for bad in (good + b"\x00",
                msgpack.packb([[b"a", b"b"], [b"1"]], use_bin_type=True),
                msgpack.packb([["a", b"b"], [b"1", b"2"]], use_bin_type=True),
                msgpack.packb([[b"a", b"b"], [b"1", 2]], use_bin_type=True),
                msgpack.packb([[b"a", b"b"], [b"1", b"2"], []], use_bin_type=True),
                good[:-1], b"", b"\x92"):
        with pytest.raises(ValueError):
            speedups.block_find(bad, b"a", MISSING)


def _even_keys_db(path: str, **options) -> None:
    """key000000.. -> v0.. (even numbers) in small SSTables (``SMALL``, and
    ``options``) of a database at ``path``, closed."""
    db = lsmdb.open(path, auto_compaction=False)
    db.alter_table("default", **SMALL, **options)
    for i in range(0, 4000, 2):
        db.put(b"key%06d" % i, b"v%d" % i)
    db.flush()
    db.close()


def _cached_size(payload: bytes) -> int:
    """What the block cache counts for a block: its block_entry (or, for one
    the cache never takes, its payload)."""
    try:
        return len(speedups.block_entry(payload))
    except ValueError:
        return len(payload)


def _full_cache_db(path: str) -> lsmdb.DB:
    """key000000.. -> v0.. (even numbers) in 512-byte blocks of one SSTable,
    reopened with a block cache of two blocks' room, filled by reading two
    blocks."""
    if not os.path.exists(path):
        _even_keys_db(path)
    db = lsmdb.open(path, auto_compaction=False)
    sizes = [_cached_size(item.reader._read_raw(i, count=False)[:-4])
             for item in db._default_state.fast.files for i in range(len(item.index_keys))]
    db.close()
    db = lsmdb.open(path, auto_compaction=False, block_cache_size_bytes=2 * max(sizes) + 10)
    assert type(db.get).__name__ == "Getter"
    assert db.get(b"key%06d" % 0) == b"v0" and db.get(b"key%06d" % 2000) == b"v2000"
    cache = db._versions.block_cache
    assert len(cache) == 2 and not cache.admit(-1)  # full: a first read is turned away
    return db


def test_a_full_cache_takes_a_block_a_get_read_only_on_its_second_read(tmp_path):
    """Once the cache is full, a get that reads a block takes the value from
    the bytes read (one read, one true positive, nothing cached); a block
    read again soon after is cached; either way the answers are right,
    tombstones included."""
    db = _full_cache_db(str(tmp_path / "db"))
    try:
        cache = db._versions.block_cache
        db.delete(b"key%06d" % 3000)
        db.flush()
        before = db.table_stats()
        cached_before = {k for k, _size, _marked in cache.entries()}
        assert db.get(b"key%06d" % 3600) == b"v3600"
        after = db.table_stats()
        assert after["block_reads"] == before["block_reads"] + 1
        assert after["true_positives"] == before["true_positives"] + 1
        assert {k for k, _size, _marked in cache.entries()} == cached_before  # not cached
        assert db.get(b"key%06d" % 3602) == b"v3602"  # the same block again: now cached
        assert db.table_stats()["block_reads"] == before["block_reads"] + 2
        assert {k for k, _size, _marked in cache.entries()} - cached_before
        assert db.get(b"key%06d" % 3604) == b"v3604"  # a cache hit: no read
        assert db.table_stats()["block_reads"] == before["block_reads"] + 2
        assert db.get(b"key%06d" % 3000) is None  # the tombstone, in the newer file
        for i in range(0, 4000, 37):
            assert db.get(b"key%06d" % i) == (b"v%d" % i if i % 2 == 0 and i != 3000 else None)
    finally:
        db.close()


def test_a_full_cache_takes_a_block_get_many_read_for_several_keys_on_its_second_read(tmp_path):
    """A block get_many reads once for several keys goes through the same
    admission as a get's: a full cache turns its first read away (one read,
    its keys answered, nothing cached or evicted) and takes it on its second;
    after that its keys are cache hits."""
    db = _full_cache_db(str(tmp_path / "db"))
    try:
        cache = db._versions.block_cache
        reader = db._default_state.fast.files[0].reader
        keys = [b"key%06d" % i for i in (3600, 3602, 3604)]
        assert len({reader.block_for(k) for k in keys}) == 1  # one block for all three
        values = [b"v3600", b"v3602", b"v3604"]
        before = db.table_stats()
        hits_before = sum(i.block_cache_hits for i in db.sstables())
        cached_before = {k for k, _size, _marked in cache.entries()}
        assert db.get_many(keys) == values
        assert db.table_stats()["block_reads"] == before["block_reads"] + 1
        assert {k for k, _size, _marked in cache.entries()} == cached_before  # not cached
        assert db.get_many(keys) == values  # the same block again: now cached
        assert db.table_stats()["block_reads"] == before["block_reads"] + 2
        assert {k for k, _size, _marked in cache.entries()} - cached_before
        assert db.get_many(keys) == values  # cache hits: no read
        assert db.table_stats()["block_reads"] == before["block_reads"] + 2
        assert sum(i.block_cache_hits for i in db.sstables()) == hits_before + 3
    finally:
        db.close()


def _str_key_block(path: str) -> tuple[bytes, str, int, int]:
    """Rewrite a data block of _full_cache_db's SSTable with its last key as a
    msgpack str, under a right checksum: (that key, the file, the block's
    offset, its index)."""
    from lsmdb.coding import crc32
    db = _full_cache_db(path)
    reader = db._default_state.fast.files[0].reader
    i = len(reader.index_keys) - 3
    offset, size, key = reader.index_offsets[i], reader.index_sizes[i], reader.index_keys[i]
    file = reader.path
    db.close()
    with open(file, "r+b") as f:
        f.seek(offset)
        payload = bytearray(f.read(size))
        at = payload.index(b"\xc4\x09" + key)  # the block's last key, a bin 8
        payload[at] = 0xD9  # now a str 8 of the same length
        f.seek(offset)
        f.write(bytes(payload) + crc32(bytes(payload)).to_bytes(4, "little"))
    return key, file, offset, i


def test_a_checksum_valid_block_of_the_wrong_shape_is_corruption_with_a_full_cache(tmp_path):
    """A data block whose checksum is right but whose key is a msgpack str: the
    C getter, not caching, cannot take a value from it and hands it to the
    decoder, which raises CorruptionError at the block's offset."""
    path = str(tmp_path / "db")
    key, file, offset, _i = _str_key_block(path)
    db = _full_cache_db(path)
    try:
        with pytest.raises(lsmdb.CorruptionError) as exc:
            db.get(key)
        assert exc.value.path == file and exc.value.offset == offset
    finally:
        db.close()


@pytest.mark.parametrize("c_getter", [True, False])
def test_a_checksum_valid_block_of_the_wrong_shape_is_never_cached(tmp_path, monkeypatch,
                                                                    c_getter):
    """With room in the cache, which admits every block read, the block of the
    wrong shape is not cached: every get of a key it may hold raises
    CorruptionError at its offset, on both read paths, get_many too (for one
    key, and for two that need the block), one block read counted each (the C
    getter leaves a block it cannot walk to SSTableReader.lookup, uncounted)."""
    path = str(tmp_path / "db")
    key, file, offset, i = _str_key_block(path)
    if not c_getter:
        monkeypatch.setattr(lsmdb.readpath, "USE_C_GETTER", False)
    db = lsmdb.open(path, auto_compaction=False)
    try:
        assert (type(db.get).__name__ == "Getter") == c_getter
        reader = db._default_state.fast.files[0].reader
        base = reader.cache_base
        other = b"key%06d" % (int(key[3:]) - 2)  # the key before it, in the same block
        assert reader.block_for(other) == reader.block_for(key) == i
        for call in (db.get, db.get, lambda k: db.get_many([k]),
                     lambda k: db.get_many([other, k])):
            reads = reader.block_reads
            with pytest.raises(lsmdb.CorruptionError) as exc:
                call(key)
            assert exc.value.path == file and exc.value.offset == offset
            assert db._versions.block_cache.lookup(base + i) is None
            assert reader.block_reads == reads + 1  # one read counted, whoever read it
    finally:
        db.close()


@pytest.mark.parametrize("c_getter", [True, False])
def test_key_in_db_is_the_c_contains_and_answers_as_get(tmp_path, monkeypatch, c_getter):
    """``key in db`` calls db.get through speedups.Contains (no Python frame),
    over the C getter or the Python one: the same answers, the same errors."""
    from lsmdb.db import DB
    if not c_getter:
        monkeypatch.setattr(lsmdb.readpath, "USE_C_GETTER", False)
    assert type(DB.__dict__["__contains__"]) is speedups.Contains
    db = lsmdb.open(str(tmp_path / "db"), auto_compaction=False)
    try:
        assert (type(db.get).__name__ == "Getter") == c_getter
        for i in range(300):
            db.put(b"k%03d" % i, b"v")
        db.flush()
        db.delete(b"k007")
        db.put(b"mem", b"")                      # an empty value is present
        keys = [b"k%03d" % i for i in range(0, 320, 7)] + [b"mem", b"", b"zz"]
        assert [k in db for k in keys] == [db.get(k) is not None for k in keys]
        assert b"k007" not in db and b"mem" in db and b"k008" in db
        assert db.__contains__(b"k008") is True and DB.__contains__(db, b"zz") is False
        for bad in (1, "text", None):
            with pytest.raises(TypeError):
                bad in db  # noqa: B015
        with pytest.raises(TypeError):
            speedups.Contains("get")(db)
        with pytest.raises(TypeError):
            speedups.Contains("get")(db, b"k", b"extra")
        with pytest.raises(AttributeError):
            speedups.Contains("no_such_attribute")(db, b"k")
        before = sys.getallocatedblocks()
        for _ in range(3):
            for k in keys * 200:
                k in db  # noqa: B015
        assert sys.getallocatedblocks() - before < 100
    finally:
        db.close()
    with pytest.raises(DatabaseClosedError):
        b"k001" in db  # noqa: B015


@pytest.mark.parametrize("c_getter", [True, False])
def test_get_many_hands_a_files_misses_on_in_the_order_given(tmp_path, monkeypatch, c_getter):
    """The keys a file does not hold go on to the next file in the order they
    were given, on both read paths, so that with a full cache both count the
    same reads and hits.  File A (newer, no filter) holds x; y shares x's block
    in A, z another; only file B holds y and z, in two blocks: R (z's) cached,
    filling the cache, Q (y's) turned away once, so its next read is admitted
    and evicts R.  In the order given (z, y): R is a hit, then Q is read."""
    if not c_getter:
        monkeypatch.setattr(lsmdb.readpath, "USE_C_GETTER", False)
    path = str(tmp_path / "db")
    with lsmdb.open(path, auto_compaction=False) as db:
        db.alter_table("default", block_size_bytes=256, bloom_filter_fp_chance=1.0)
        for i in range(300):                                    # B
            db.put(b"k%03d" % i, b"b" * 60)
        db.flush()
        for k in (b"k005", b"k010", b"k012", b"k190", b"k210"):  # A
            db.put(k, b"a" * 60)
        db.flush()
    x, y, z = b"k010", b"k011", b"k200"
    with lsmdb.open(path, auto_compaction=False) as probe:
        _a, b = probe._default_state.readers_in_order()
        sizes = []
        for k in (y, z):
            b.block_entries(b.block_for(k))
            sizes.append(len(probe._versions.block_cache.lookup(b.cache_base + b.block_for(k))))
    db = lsmdb.open(path, auto_compaction=False, block_cache_size_bytes=max(sizes) * 3 // 2)
    try:
        assert (type(db.get).__name__ == "Getter") == c_getter
        a, b = db._default_state.readers_in_order()
        assert a.block_for(x) == a.block_for(y) != a.block_for(z)
        r, q = b.block_for(z), b.block_for(y)
        assert r != q
        b.block_entries(r)                                       # cached: the cache is full
        b.block_entries(q)                                       # turned away, remembered
        cache = db._versions.block_cache
        assert cache.lookup(b.cache_base + r) is not None and cache.lookup(b.cache_base + q) is None
        reads, hits = b.block_reads, b.block_cache_hits
        assert db.get_many([x, z, y]) == [b"a" * 60, b"b" * 60, b"b" * 60]
        assert (b.block_reads - reads, b.block_cache_hits - hits) == (1, 1)
    finally:
        db.close()


@pytest.mark.parametrize("c_getter", [True, False])
def test_the_cache_holds_each_blocks_payload_as_stored(tmp_path, monkeypatch, c_getter):
    """The block cache keeps a block's checksum-verified payload, the bytes on
    disk, followed by its entries' offsets (block_entry), whichever path read
    it (gets, get_many; the C or the Python read path), and its budget counts
    exactly those bytes."""
    if not c_getter:
        monkeypatch.setattr(lsmdb.readpath, "USE_C_GETTER", False)
    path = str(tmp_path / "db")
    _even_keys_db(path)
    db = lsmdb.open(path, auto_compaction=False)
    try:
        assert (type(db.get).__name__ == "Getter") == c_getter
        for i in range(0, 2000, 7):
            assert db.get(b"key%06d" % i) == (b"v%d" % i if i % 2 == 0 else None)
        keys = [b"key%06d" % i for i in range(1990, 4000, 3)]
        assert db.get_many(keys) == [b"v%d" % i if i % 2 == 0 else None
                                     for i in range(1990, 4000, 3)]
        cache = db._versions.block_cache
        readers = [p.reader for p in db._default_state.fast.files]
        assert len(readers) > 1 and len(cache) > 10
        for ck, size, _marked in cache.entries():
            entry = cache.lookup(ck)
            assert size == len(entry)
            # the one file whose range of keys holds ck (the ranges never overlap)
            [reader] = [r for r in readers if 0 <= ck - r.cache_base < len(r.index_keys)]
            i = ck - reader.cache_base
            offset, size = reader.index_offsets[i], reader.index_sizes[i]
            with open(reader.path, "rb") as f:
                f.seek(offset)
                payload = f.read(size)
            assert type(entry) is bytes and entry == speedups.block_entry(payload)
        assert cache.used_bytes == sum(size for _ck, size, _marked in cache.entries())
        # hits answer from those bytes, the same again
        for i in range(0, 4000, 5):
            assert db.get(b"key%06d" % i) == (b"v%d" % i if i % 2 == 0 else None)
        assert sum(s.block_cache_hits for s in db.sstables()) > 0
    finally:
        db.close()


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


@settings(max_examples=3000, deadline=None)
@given(st.binary(max_size=40), st.binary(max_size=40), st.binary(max_size=20))
def test_the_c_key_order_is_bytes_order(a, b, prefix):
    for x, y in ((a, b), (prefix + a, prefix + b), (a, a + b), (prefix + a, prefix)):
        assert speedups._cmp(x, y) == (x > y) - (x < y)


def test_the_c_key_order_at_every_length_and_position():
    """Keys of 0 to 33 bytes that differ in one byte, either way, at every
    position, or only in length: the compare takes 8 bytes at a time and the
    last, overlapping 8 bytes of the shorter key at once."""
    rng = random.Random(5)
    for n in range(34):
        base = bytes(rng.randrange(1, 255) for _ in range(n))
        others = [base[:j] + bytes([(base[j] + d) % 256]) + base[j + 1:]
                  for j in range(n) for d in (1, -1, 128)]
        others += [base[:j] for j in range(n)] + [base + b"\0", base + b"\xff"]
        for other in others:
            for x, y in ((base, other), (other, base), (base, base)):
                assert speedups._cmp(x, y) == (x > y) - (x < y), (x, y)


@pytest.mark.parametrize("c_getter", [True, False])
@pytest.mark.parametrize("mmap_reads", [False, True])
def test_a_false_positive_is_one_read_counted_and_its_block_cached_on_its_second_read(
        tmp_path, monkeypatch, mmap_reads, c_getter):
    """An uncached block read for a key it does not hold (one pread, or one
    copy out of the file's mapping; checksum, key walk) is one block read and
    one false positive in the counters, one read for the kernel (none from a
    mapping, which only the C getter uses), and is not cached on its first
    read (BlockCache.admit_reread): its second read caches it, and the false
    positives after that are cache hits, with no read.  A true positive
    caches the block it already read.  The C getter and the Python one alike."""
    from bench.common import ReadSyscalls
    if not c_getter:
        monkeypatch.setattr(lsmdb.readpath, "USE_C_GETTER", False)
    path = str(tmp_path / "db")
    _even_keys_db(path, bloom_filter_fp_chance=0.2)
    db = lsmdb.open(path, auto_compaction=False, mmap_reads=mmap_reads)
    try:
        assert (type(db.get).__name__ == "Getter") == c_getter
        mapped = mmap_reads and MAPS
        readers = _readers(db)
        assert len(readers) > 1 and all((r.mapped is not None) == mapped for r in readers)
        cache = db._versions.block_cache

        def tally():
            return [(r.block_reads, r.block_cache_hits, r.false_positives) for r in readers]

        disk_reads: collections.Counter = collections.Counter()  # cache key -> times read from disk
        syscalls = ReadSyscalls()
        start = syscalls.snapshot()
        for i in list(range(1, 4000, 2)) * 2:
            key = b"key%06d" % i
            before = tally()
            assert db.get(key) is None
            moved = [(r, a, b) for r, a, b in zip(readers, before, tally(), strict=True) if a != b]
            assert len(moved) <= 1  # the files' key ranges do not overlap
            if not moved:
                continue
            r, (reads0, hits0, fps0), (reads1, hits1, fps1) = moved[0]
            assert fps1 == fps0 + 1 and (reads1 - reads0) + (hits1 - hits0) == 1
            ck = r.cache_base + bisect.bisect_left(r.index_keys, key)
            if reads1 > reads0:
                disk_reads[ck] += 1
                assert disk_reads[ck] <= 2  # cached on its second read: never read a third time
            else:
                assert disk_reads[ck] == 2  # a hit only once it was read twice
        kernel = syscalls.delta(start)
        stats = db.table_stats()
        assert stats["false_positives"] > 400  # fp 0.2 over 2 x 2,000 absent keys
        assert stats["block_reads"] == sum(disk_reads.values())
        assert sum(r.block_cache_hits for r in readers) > 100 and stats["true_positives"] == 0
        assert {ck for ck, _size, _marked in cache.entries()} == {
            ck for ck, n in disk_reads.items() if n == 2}
        if kernel is not None:  # (the Python read path does not use the mapping)
            assert kernel == (0 if mapped and c_getter else stats["block_reads"])
        for i in range(2000, 4000, 2):  # a present key of a block no false positive cached
            key = b"key%06d" % i
            r = next(r for r in readers if r.min_key <= key <= r.max_key)
            if cache.lookup(r.cache_base + bisect.bisect_left(r.index_keys, key)) is None:
                break
        else:
            pytest.fail("every block cached")
        held = len(cache)
        assert db.get(b"key%06d" % i) == b"v%d" % i
        assert db.table_stats()["block_reads"] == stats["block_reads"] + 1
        assert len(cache) == held + 1
        assert db.get(b"key%06d" % i) == b"v%d" % i  # now a cache hit: no read
        assert db.table_stats()["block_reads"] == stats["block_reads"] + 1
    finally:
        db.close()


def test_a_damaged_block_read_by_the_c_getter_is_corruption_at_its_offset(tmp_path):
    path = str(tmp_path / "db")
    db = lsmdb.open(path, auto_compaction=False)
    db.alter_table("default", **SMALL)
    for i in range(2000):
        db.put(b"key%06d" % i, b"v%d" % i)
    db.flush()
    reader = db._default_state.fast.files[0].reader
    offset = reader.index_offsets[3]
    key = reader.index_keys[3]
    name = os.path.basename(reader.path)
    db.close()
    with open(os.path.join(path, name), "r+b") as f:
        f.seek(offset + 5)
        byte = f.read(1)
        f.seek(offset + 5)
        f.write(bytes([byte[0] ^ 0x40]))
    db = lsmdb.open(path, auto_compaction=False)
    try:
        assert type(db.get).__name__ == "Getter"
        with pytest.raises(lsmdb.CorruptionError) as exc:
            db.get(key)
        assert exc.value.path == os.path.join(path, name) and exc.value.offset == offset
    finally:
        db.close()


def _no_filter_no_cache_db(path: str, n: int, **options) -> lsmdb.DB:
    """A database of keys key000000.. -> v0.. in SSTables without filters (or
    with what ``options`` ask), reopened without a block cache: every key a
    get_many asks reads a block."""
    db = lsmdb.open(path, auto_compaction=False)
    db.alter_table("default", **{"bloom_filter_fp_chance": 1.0, **SMALL, **options})
    for i in range(n):
        db.put(b"key%06d" % i, b"v%d" % i)
    db.flush()
    db.close()
    return lsmdb.open(path, auto_compaction=False, block_cache_size_bytes=0)


@pytest.mark.parametrize("options", [{}, {"bloom_filter_fp_chance": 0.01,
                                          "bloom_filter_hash": "keyed"}],
                         ids=["fast-no-filter", "keyed-filter"])
def test_get_many_survives_the_callers_list_changing_under_it(tmp_path, monkeypatch,
                                                               options):
    """get_many's C part holds the keys by borrowed reference; Python code run
    by a garbage collection one of its allocations starts (here: a gc callback
    clearing the caller's list at the k-th collection of the call, for many k)
    must not pull them out from under it: the answer is for the list as it
    was when get_many took it, or for the emptied list.  With the fast hash
    every block is read in C (blocks several keys need
    too), and no collection starts after the C part took the list; with a
    keyed filter each key's hash is a Python call, here one that allocates a
    list, so collections start while the call runs."""
    import gc

    import lsmdb.secret
    real = lsmdb.secret.keyed_hasher

    def allocating(secret: bytes) -> object:
        hasher = real(secret)

        def fn(key: bytes) -> int:
            return hasher.fn((lambda: key)())  # a new function object: with threshold 1,
            # a collection (lists and dicts come from free lists, which do not count)
        return type(hasher)(hasher.algorithm, hasher.key_id, fn)

    monkeypatch.setattr(lsmdb.secret, "keyed_hasher", allocating)
    db = _no_filter_no_cache_db(str(tmp_path / "db"), 3000, **options)
    query = [b"key%06d" % i for i in range(0, 3000, 3)] + [b"key%06dx" % i for i in range(500)]
    expected = [b"v%d" % i for i in range(0, 3000, 3)] + [None] * 500
    state = {"keys": [], "left": 0}

    def clear_at_kth(phase: str, _info: dict) -> None:
        if phase == "start":
            state["left"] -= 1
            if state["left"] == 0:
                state["keys"].clear()

    old = gc.get_threshold()
    gc.callbacks.append(clear_at_kth)
    cleared_inside = 0
    try:
        for k in range(1, 40):
            keys = list(query)
            state.update(keys=keys, left=k)
            gc.set_threshold(1)  # every allocation of a container collects
            got = db.get_many(keys)
            gc.set_threshold(*old)
            assert got in (expected, []), k
            cleared_inside += got == expected and keys == []
    finally:
        gc.callbacks.remove(clear_at_kth)
        gc.set_threshold(*old)
        db.close()
    if options:
        assert cleared_inside > 0  # the list really was cleared while get_many ran


def test_get_many_answers_the_list_it_was_given_while_another_thread_changes_it(tmp_path):
    """get_many reads blocks with the GIL let go; another thread swapping the
    contents of the caller's list meanwhile must not mix two lists' answers:
    each call answers the keys it was given (all of one list or the other)."""
    import sys
    db = _no_filter_no_cache_db(str(tmp_path / "db"), 6000)
    present = [b"key%06d" % i for i in range(0, 6000, 40)]  # a block of their own each
    absent = [k + b"x" for k in present]
    want = {id(present): [b"v%d" % i for i in range(0, 6000, 40)],
            id(absent): [None] * len(present)}
    keys = list(present)
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():  # a call between the two: the thread may stop at either
            keys[:] = absent
            if stop.is_set():
                break
            keys[:] = present

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    t = threading.Thread(target=swap)
    t.start()
    seen: set[int] = set()
    calls = 0
    try:
        # Until both lists were answered (the swaps reached get_many), and at least 200 calls.
        while calls < 200 or (len(seen) < 2 and calls < 20_000):
            got = db.get_many(keys)
            assert got in want.values(), got
            seen.add(next(k for k, w in want.items() if w == got))
            calls += 1
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
        db.close()
    assert len(seen) == 2, f"only one list seen in {calls} calls"


_UINTS = st.sampled_from([0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1]) \
    | st.integers(0, 2**64 - 1)


@settings(max_examples=500, deadline=None)
@given(_UINTS, _UINTS,
       st.lists(st.tuples(st.binary(max_size=300), st.none() | st.binary(max_size=300)),
                max_size=40))
def test_encode_ops_writes_what_msgpack_writes(seq, table_id, ops):
    import msgpack

    from lsmdb.logset import encode_record, encode_table_record
    keys, values = [k for k, _ in ops], [v for _, v in ops]
    want = msgpack.packb([seq, [[table_id, k, v] for k, v in ops]], use_bin_type=True)
    assert speedups.encode_ops(seq, table_id, keys, values) == want
    assert encode_table_record(seq, table_id, keys, values) == want
    assert encode_record(seq, [(table_id, k, v) for k, v in ops]) == want


def test_encode_ops_on_long_batches_and_long_values_and_bad_input():
    import msgpack
    for n in (15, 16, 65535, 65536):  # fixarray, array16 and array32 headers
        keys = [b"k%d" % i for i in range(n)]
        values = [None if i % 3 == 0 else b"v" for i in range(n)]
        want = msgpack.packb([7, [[2, k, v] for k, v in zip(keys, values, strict=True)]],
                             use_bin_type=True)
        assert speedups.encode_ops(7, 2, keys, values) == want
    for size in (255, 256, 65535, 65536, 70000):  # bin8, bin16 and bin32
        value = b"x" * size
        assert speedups.encode_ops(1, 1, [value], [value]) == msgpack.packb(
            [1, [[1, value, value]]], use_bin_type=True)
    with pytest.raises(TypeError):
        speedups.encode_ops(1, 1, [b"k"], ["str"])
    with pytest.raises(TypeError):
        speedups.encode_ops(1, 1, (b"k",), [b"v"])
    with pytest.raises(ValueError):
        speedups.encode_ops(1, 1, [b"k"], [])
    with pytest.raises(OverflowError):
        speedups.encode_ops(-1, 1, [], [])


# ------------------------------------------------------------------ MemFilter
MemFilter = speedups.MemFilter


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.binary(max_size=260), max_size=300), max_size=12),
       st.lists(st.binary(max_size=260), max_size=50))
def test_memfilter_never_denies_a_key_of_its_dict(batches, start):
    """Built from a dict, then fed batches (add_many before the dict update, as
    Memtable does, growing past its capacity on the way): every key of the
    dict, long keys included, is always a maybe."""
    data = dict.fromkeys(start)
    mf = MemFilter(data)
    for batch in batches:
        new = [k for k in dict.fromkeys(batch) if k not in data]
        if len(new) == 1:
            mf.add(new[0])
        else:
            mf.add_many(new)
        data.update(dict.fromkeys(batch))
        assert all(mf.may_hold(k) for k in data)
    assert mf.capacity >= len(data)


def test_memfilter_false_positive_rate_at_full_design_load():
    """Filled to its capacity (10 bits per key, 6 bits in one 512-bit line per
    key) it should answer maybe for about 0.96 % of absent keys; the bound,
    2 %, is 33 standard deviations above that, so only a broken layout (all
    keys in a few lines, bits not set or not tested) fails it."""
    rng = random.Random(5)
    first = {rng.randbytes(16): None for _ in range(20_000)}
    mf = MemFilter(first)
    assert mf.capacity == 40_000
    more = [rng.randbytes(16) for _ in range(20_000)]
    mf.add_many(more)
    assert mf.capacity == 40_000  # exactly full: no resize
    assert all(mf.may_hold(k) for k in [*first, *more])
    probes = 100_000
    fp = sum(mf.may_hold(rng.randbytes(17)) for _ in range(probes))
    assert fp / probes < 0.02
    assert mf.nbytes == 64 * -(-40_000 * 10 // 512)


def test_memfilter_bad_input_changes_nothing():
    mf = MemFilter({})
    with pytest.raises(TypeError):
        MemFilter([b"a"])
    with pytest.raises(TypeError):
        mf.add_many((b"a",))
    with pytest.raises(TypeError):
        mf.add_many([b"a", "b"])
    with pytest.raises(TypeError):
        mf.add("a")
    with pytest.raises(TypeError):
        mf.may_hold("a")
    assert not mf.may_hold(b"a")  # the rejected batch left no bit behind
    assert mf.may_hold(b"x" * 241)  # too long to hash inline: always a maybe
    uninitialised = MemFilter.__new__(MemFilter)
    with pytest.raises(TypeError):
        uninitialised.may_hold(b"a")
    with pytest.raises(TypeError):
        uninitialised.add_many([b"a"])


def test_memtables_keep_their_keys_in_their_filters(tmp_path):
    """Every write path (put, delete, batches, recovery from the log, frozen
    memtables) leaves each key of each memtable in that memtable's filter, and
    the getter's state pairs each dict with its own filter."""
    db = lsmdb.open(str(tmp_path), auto_compaction=False)
    db.put(b"one", b"1")
    db.delete(b"two")
    with db.batch() as b:
        for i in range(3000):
            b.put(b"k%06d" % i, b"v")
    state = db._default_state
    assert state.mem.filter is not None
    db.close()
    db = lsmdb.open(str(tmp_path), auto_compaction=False)  # the memtable from the log
    db.put(b"three", b"3")
    state = db._default_state
    data, imms, filters = state.fast.data, state.fast.imm_datas, state.fast.filters
    assert filters[0].may_hold(b"three")
    for d, f in zip((data, *imms), filters, strict=True):
        assert len(d) >= 3002
        assert all(f.may_hold(k) for k in d)
    assert db.get(b"k001234") == b"v" and db.get(b"two") is None
    db.close()


def test_the_c_get_skips_the_dict_when_the_memtable_filter_says_no(tmp_path, monkeypatch):
    """A key planted in the memtable's dict behind its filter's back is not
    seen by the C get or get_many (the filter said no, so the dict was not
    asked) but is by the Python read path -- which shows the C path uses the
    filter.  (The engine never writes a key this way.)"""
    db = lsmdb.open(str(tmp_path), auto_compaction=False)
    db.put(b"a", b"1")
    db.flush()
    db.put(b"b", b"2")
    mf = db._default_state.mem.filter
    planted = next(k for k in (b"p%d" % i for i in range(1000)) if not mf.may_hold(k))
    db._default_state.mem.data[planted] = b"x"
    assert db.get(planted) is None
    assert db.get_many([planted, b"a", b"b"]) == [None, b"1", b"2"]
    monkeypatch.setattr(lsmdb.readpath, "USE_C_GETTER", False)
    db.close()
    db2 = lsmdb.open(str(tmp_path), auto_compaction=False)
    db2._default_state.mem.data[planted] = b"x"
    assert db2.get(planted) == b"x"
    db2.close()


MAPS = os.name == "posix" and sys.maxsize > 2 ** 32  # where a database maps its files
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readers(db) -> list:
    return [p.reader for p in db._default_state.fast.files]


def test_mmap_reads_maps_each_file_and_a_closed_reader_lets_its_mapping_go(tmp_path):
    """Each file a database takes on is mapped whole (with mmap_reads, where
    files are mapped at all); closing the database lets the mappings go."""
    path = str(tmp_path / "db")
    _even_keys_db(path)
    db = lsmdb.open(path, auto_compaction=False, mmap_reads=False)
    try:
        readers = _readers(db)
        assert len(readers) > 1 and all(r.mapped is None for r in readers)
        assert db.get(b"key%06d" % 2) == b"v2" and db.get(b"key%06d" % 3) is None
    finally:
        db.close()
    db = lsmdb.open(path, auto_compaction=False)
    try:
        readers = _readers(db)
        assert all((r.mapped is not None) == MAPS for r in readers)
        if MAPS:
            for r in readers:  # the whole file, byte for byte
                with open(r.path, "rb") as f:
                    assert bytes(memoryview(r.mapped)) == f.read()
                assert r.mapped.size == os.path.getsize(r.path)
        db.compact()  # the inputs are deleted; a get that still holds one reads on
        assert not any(os.path.exists(r.path) for r in readers)
        assert all((r.mapped is not None) == MAPS for r in readers)  # freed with the reader
        [out] = _readers(db)
        assert (out.mapped is not None) == MAPS
        assert db.get(b"key%06d" % 3998) == b"v3998" and db.get(b"key%06d" % 3) is None
    finally:
        db.close()
    assert out.mapped is None


_CUT_SHORT = r"""
import os, sys
import lsmdb
from bench.common import ReadSyscalls
from lsmdb.errors import CorruptionError
db = lsmdb.open(sys.argv[1], auto_compaction=False)
[item] = db._default_state.fast.files
reader = item.reader
assert reader.mapped is not None and type(db.get).__name__ == "Getter"
first, last = reader.index_keys[0], reader.index_keys[-1]
syscalls = ReadSyscalls()
start = syscalls.snapshot()
assert db.get(first) is not None  # copied out of the mapping (no read call), then cached
print("read calls", syscalls.delta(start))
reads = db.table_stats()["block_reads"]
os.truncate(reader.path, reader.index_offsets[len(reader.index_offsets) // 2])
before_last = b"key%06d" % (int(last[3:]) - 1)  # in the last block too
assert reader.block_for(before_last) == reader.block_for(last) == len(reader.index_keys) - 1
try:
    if sys.argv[2] == "get":
        db.get(last)  # past the cut: the copy faults (SIGBUS), pread finds the file short
    else:  # one copy for both keys faults; the Python side's pread finds the file short
        db.get_many([last, before_last])
except CorruptionError as exc:
    print("CorruptionError:", exc)
else:
    print("no error")
assert db.get(first) is not None  # from the cache
print("offset", reader.index_offsets[-1], "reads", db.table_stats()["block_reads"] - reads)
"""


@pytest.mark.skipif(not MAPS, reason="files are not mapped here")
@pytest.mark.parametrize("how", ["get", "get_many"])
def test_a_file_cut_short_under_its_mapping_is_corruption_not_sigbus(tmp_path, how):
    """A page of a mapping past the end of its (since truncated) file raises
    SIGBUS; the copy out of it is guarded, so the get (or get_many, for a
    block two keys need) reads the block again with pread, which reports the
    file short at the block's offset, and the process goes on.  In a child
    process: unguarded, the child dies."""
    path = str(tmp_path / "db")
    db = lsmdb.open(path, auto_compaction=False)
    for i in range(20000):
        db.put(b"key%06d" % i, b"v%d" % i * 5)
    db.flush()
    db.close()
    done = subprocess.run([sys.executable, "-c", _CUT_SHORT, path, how], capture_output=True,
                          text=True, timeout=120, cwd=REPO)  # REPO: bench.common
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] in ("read calls 0", "read calls None")  # None: no /proc/self/io
    offset = int(lines[2].split()[1])
    assert lines[1].startswith("CorruptionError: data block truncated")
    assert f".sst @ offset {offset}]" in lines[1]
    assert lines[2].endswith("reads 1")  # the pread that found the file short; the copy
    # that faulted is not a read


_SIGBUS_ELSEWHERE = r"""
import mmap, os, signal, sys
import lsmdb
db = lsmdb.open(sys.argv[1], auto_compaction=False)
assert db._default_state.fast.files[0].reader.mapped is not None  # lsmdb's handler is installed
if sys.argv[2] == "sent":
    os.kill(os.getpid(), signal.SIGBUS)
else:  # a fault in a mapping of someone else's: Python's mmap of a file cut short
    other = sys.argv[1] + "-other"
    with open(other, "wb") as f:
        f.write(b"x" * 65536)
    fd = os.open(other, os.O_RDONLY)
    m = mmap.mmap(fd, 65536, access=mmap.ACCESS_READ)
    os.truncate(other, 0)
    m[40000]
print("survived")
"""


@pytest.mark.skipif(not MAPS, reason="files are not mapped here")
@pytest.mark.parametrize("how", ["sent", "fault"])
def test_a_sigbus_outside_lsmdbs_copies_still_ends_the_process(tmp_path, how):
    path = str(tmp_path / "db")
    _even_keys_db(path)
    done = subprocess.run([sys.executable, "-c", _SIGBUS_ELSEWHERE, path, how],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGBUS, (done.returncode, done.stdout, done.stderr)
    assert "survived" not in done.stdout


@pytest.mark.skipif(not MAPS, reason="files are not mapped here")
def test_a_database_without_a_block_cache_reads_its_blocks_in_c(tmp_path):
    """With no block cache the C getter still reads a block itself, out of the
    file's mapping: no read call for the kernel (the Python read path, which
    served such gets before, reads with pread), every read counted."""
    from bench.common import ReadSyscalls
    path = str(tmp_path / "db")
    _even_keys_db(path, bloom_filter_fp_chance=0.2)
    db = lsmdb.open(path, auto_compaction=False, block_cache_size_bytes=0)
    try:
        syscalls = ReadSyscalls()
        start = syscalls.snapshot()
        for i in range(4000):
            assert db.get(b"key%06d" % i) == (b"v%d" % i if i % 2 == 0 else None)
        kernel = syscalls.delta(start)
        stats = db.table_stats()
        assert stats["true_positives"] == 2000 and stats["false_positives"] > 100
        assert stats["block_reads"] == stats["true_positives"] + stats["false_positives"]
        if kernel is not None:
            assert kernel == 0
    finally:
        db.close()


@pytest.mark.skipif(not MAPS, reason="files are not mapped here")
def test_files_cut_short_under_threads_getting_give_right_values_or_corruption():
    """tools/truncate_soak.py, short: threads get while every SSTable is cut to
    a third; each get answers its key's value or raises CorruptionError, and
    the process lives (in a child: a SIGBUS the guard missed would end it)."""
    done = subprocess.run([sys.executable, os.path.join(REPO, "tools", "truncate_soak.py"),
                           "--keys", "20000", "--threads", "3", "--seconds", "1.5",
                           "--rounds", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    [line] = done.stdout.splitlines()
    answered, corruption = (int(line.split(": ")[2].split()[i].replace(",", "")) for i in (0, 3))
    assert line.endswith(" 0 problems") and answered > 100 and corruption > 100, line
