"""The read path (lsmdb/readpath.py, its C accelerator lsmdb/csrc/readpath*.c): the
same answers and the same counters on both, get and get_many, over tables of
every kind, block caches of every size, blocks the rule refuses; and what the C
getter does that Python does not need to (its fallbacks, its hand-over, the
mapped files, the callers' lists)."""

from __future__ import annotations

import bisect
import collections
import os
import random
import signal
import subprocess
import sys
import threading

import pytest

import lsmdb
import lsmdb.fastpath
import lsmdb.readpath
import lsmdb.table
from lsmdb.errors import DatabaseClosedError
from lsmdb.filters import hashing as hashing_mod
from lsmdb.filters.bloom import BloomFilter
from lsmdb.filters.hashing import key_hash
from lsmdb.stats import FILE_COUNTERS
from tests.support.impls import use_python
from tests.support.reading import data_payload, items, stored_block

try:
    from lsmdb import _speedups as speedups
except ImportError:  # pragma: no cover - built without a C compiler
    speedups = None  # type: ignore[assignment]
needs_c = pytest.mark.skipif(speedups is None, reason="built without a C compiler")

SMALL = {"memtable_size_bytes": 16 * 1024, "block_size_bytes": 512}


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


def run_all(path: str, impl: str, monkeypatch, prefetch_all: bool | None = None,
            **open_options) -> tuple[list, dict]:
    """Gets and get_many calls on every table of build(path) on the ``impl``
    read path ("c" or "python"), and the counters after them; with
    prefetch_all (C path), check that the C probes of each table whose files
    have filters load every probe line up front (Probes.prefetch_all) or not."""
    with monkeypatch.context() as m:
        if impl == "python":
            use_python(m)
        return _run_all(path, impl == "c", prefetch_all, open_options)


def _run_all(path: str, use_c: bool, prefetch_all: bool | None,
             open_options: dict) -> tuple[list, dict]:
    db = lsmdb.open(path, read_only=True, **open_options)
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
            keys = [key for key, _value in items(r)]  # tombstones too
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


@needs_c
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
@needs_c
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
    c_answers, c_counters = run_all(path, "c", monkeypatch, prefetch_all)
    py_answers, py_counters = run_all(path, "python", monkeypatch)
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


@needs_c
@pytest.mark.parametrize("cache_bytes", [0, 8192, 60_000])
def test_c_and_python_paths_agree_with_block_caches_of_every_size(tmp_path, monkeypatch,
                                                                   cache_bytes):
    """No cache, a cache of a few blocks (full after the first reads, where
    what a read admits evicts another block), and one of most blocks: gets
    and get_many agree answer for answer and count for count -- disk reads
    and cache hits included -- on both paths, and answer right."""
    path = str(tmp_path / "db")
    build(path)
    db = lsmdb.open(path, read_only=True)
    try:
        want = {name: dict(db.table(name).scan()) for name in ("keyed", "lev", "nofilter",
                                                                "default")}
    finally:
        db.close()
    results = {impl: run_all(path, impl, monkeypatch, block_cache_size_bytes=cache_bytes)
               for impl in ("c", "python")}
    assert results["c"] == results["python"]
    answers, counters = results["c"]
    for n, name in enumerate(("keyed", "lev", "nofilter", "default")):
        assert answers[3 * n] == [want[name].get(q) for q in queries()], name
        assert answers[3 * n + 1] == answers[3 * n]
    reads = sum(v[5] for k, v in counters.items() if isinstance(k, tuple))
    hits = sum(v[6] for k, v in counters.items() if isinstance(k, tuple))
    assert reads > 100 and (hits > 100) == (cache_bytes > 0)


def _random_table(path: str, seed: int) -> dict[bytes, bytes | None]:
    """A table of random shape -- size-tiered or leveled, 1 to 6 files, each
    file's filter of another fp chance (none included) and family, tombstones,
    keys of varied lengths in varied blocks -- and the model of its contents."""
    rng = random.Random(seed)
    families = random.Random(seed + 77)  # apart: the shapes stay what they were
    leveled = rng.random() < 0.4
    options = dict(block_size_bytes=rng.choice([256, 512, 2048]),
                   memtable_size_bytes=1 << 20,
                   compaction="leveled" if leveled else "size_tiered")
    if leveled:
        options["target_file_size_bytes"] = 65536  # the least: several files per level
    model: dict[bytes, bytes | None] = {}
    with lsmdb.open(path, auto_compaction=False) as db:
        db.alter_table("default", **options)
        for f in range(rng.randint(1, 6)):
            db.alter_table("default", bloom_filter_fp_chance=rng.choice([1.0, 0.5, 0.1, 0.01]),
                           filter_family=families.choice(["bloom", "blocked_bloom"]))
            with db.batch() as b:
                for _ in range(rng.randint(50, 600)):
                    key = b"k%0*d" % (rng.choice([3, 5]), rng.randrange(3000))
                    if rng.random() < 0.15:
                        b.delete(key)
                        model[key] = None
                    else:
                        value = b"v%d." % f * rng.randint(1, 80 if leveled else 20)
                        b.put(key, value)
                        model[key] = value
            db.flush()
            if leveled and f == 2:
                db.compact()
        for key in rng.sample(sorted(model), min(30, len(model))):  # some in the memtable
            db.put(key, b"mem")
            model[key] = b"mem"
    return model


@needs_c
@pytest.mark.parametrize("seed", range(10))
def test_c_and_python_paths_count_the_same_on_random_tables_caches_and_keys(tmp_path, monkeypatch,
                                                                            seed):
    """Random tables, block caches of random size (none, one block, full from
    the start, room to spare) and random mixes of keys -- present, deleted,
    absent inside and outside the files' ranges, repeated, in random order --
    through get and get_many on both read paths: every answer and every
    counter of every file (range_skips, filter_negatives, true_positives,
    false_positives, block_reads, block_cache_hits) and of the table agree."""
    path = str(tmp_path / "db")
    model = _random_table(path, seed)
    rng = random.Random(seed + 1000)
    keys = sorted(model)
    mix = [rng.choice(keys) for _ in range(400)] + [b"k%05d" % rng.randrange(4000)
                                                     for _ in range(400)]
    mix += [b"a", b"zz", b"k", b"k99999"] + [b"k%03dx" % rng.randrange(3000) for _ in range(50)]
    rng.shuffle(mix)
    cache = rng.choice([0, 300, 4096, 1 << 20])
    chunks = [mix[i:i + rng.randint(1, 200)] for i in range(0, len(mix), 150)]
    results = {}
    for impl in ("c", "python"):
        with monkeypatch.context() as m:
            if impl == "python":
                use_python(m)
            db = lsmdb.open(path, read_only=True, block_cache_size_bytes=cache)
            try:
                assert (type(db.get).__name__ == "Getter") == (impl == "c")
                answers = [db.get(k) for k in mix]
                answers += [db.get_many(chunk) for chunk in chunks]
                answers += [db.get(k) for k in mix[::3]]
                counters = sorted((i.file, tuple(getattr(i, c) for c in FILE_COUNTERS))
                                  for i in db.sstables())
                stats = db.table_stats()
                results[impl] = (answers, counters, stats["gets"], stats["gets_absent"])
            finally:
                db.close()
    assert results["c"] == results["python"]
    answers = results["c"][0]
    assert answers[:len(mix)] == [model.get(k) for k in mix]
    assert answers[len(mix):len(mix) + len(chunks)] == [[model.get(k) for k in c] for c in chunks]


@pytest.mark.parametrize("cache", [True, False])
def test_a_false_positive_s_block_is_cached_on_its_second_read_on_both_paths(tmp_path, impl,
                                                                            cache):
    """One SSTable without a filter holding a, k10 and z: three gets of k1 (whose
    bytes the block holds, inside k10, but not as a key) read the block,
    read it again -- its second read caches it -- then find it in the cache:
    2 block reads and 1 cache hit on either path (no cache: 3 reads)."""
    path = str(tmp_path / "db")
    with lsmdb.open(path, auto_compaction=False) as db:
        db.alter_table("default", bloom_filter_fp_chance=1.0)
        for k in (b"a", b"k10", b"z"):
            db.put(k, b"v")
        db.flush()
    with lsmdb.open(path, read_only=True, block_cache_size_bytes=1 << 20 if cache else 0) as db:
        assert (type(db.get).__name__ == "Getter") == (impl == "c")
        assert [db.get(b"k1") for _ in range(3)] == [None] * 3
        [info] = db.sstables()
        assert (info.block_reads, info.block_cache_hits, info.false_positives) == (
            (2, 1, 3) if cache else (3, 0, 3))


@needs_c
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


@needs_c
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


@needs_c
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


def test_get_many_hashes_once_and_reads_each_block_once(tmp_path, monkeypatch, impl):
    """Each key hashed once however many filters it meets (counted on the Python
    path, whose hash is a call; the C path hashes inline, once by construction),
    every block read at most once per call, and a block several keys need read
    once for them."""
    calls: list[bytes] = []

    def counting_hash(key: bytes) -> int:
        calls.append(key)
        return key_hash(key)

    monkeypatch.setattr(lsmdb.readpath, "key_hash", counting_hash)
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
    if impl == "python":
        assert len(calls) == len(set(calls)) == len(absent)   # each key hashed exactly once
    else:
        assert calls == []  # hashed in C
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


@needs_c
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

    monkeypatch.setattr(lsmdb.readpath, "_c_blocks", no_python)  # the C getter's hand-over
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


@needs_c
def test_get_many_on_a_table_of_fast_and_keyed_filters_stays_in_c(tmp_path, monkeypatch):
    """A table whose files use different hashes (the fast one, then a keyed one
    after alter_table): get_many hashes each key once per hash in C and reads
    every block there too -- never handing one over -- answering and counting
    as a loop of get does."""
    def no_python(*_args):
        raise AssertionError("a block went to the Python side")

    monkeypatch.setattr(lsmdb.readpath, "_c_blocks", no_python)
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
        before = db.table_stats()
        expected = [db.get(k) for k in queries]
        loop = db.table_stats()
        assert db.get_many(queries) == expected
        many = db.table_stats()
        assert expected.count(None) == 800
        for c in ("true_positives", "false_positives", "filter_negatives", "range_skips"):
            assert many[c] - loop[c] == loop[c] - before[c], c
        assert 0 < many["block_reads"] - loop["block_reads"] < loop["block_reads"] - before[
            "block_reads"]  # each distinct block once
    finally:
        db.close()


def test_a_block_get_many_reads_for_several_keys_is_admitted_as_its_keys_answer(tmp_path,
                                                                                impl):
    """With room in the cache: a block read once for several keys is cached
    at once when it held one of them (a get's block), and only on its second
    read when it held none (a false positive's block, admit_reread) -- read
    in C, or on the Python side (which serves tables whose filters mix
    hashes, and builds without the C speedups)."""
    db = _no_filter_no_cache_db(str(tmp_path / "db"), 3000)  # no filter: absent keys read
    db.close()
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




@needs_c
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


@needs_c
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




def _even_keys_db(path: str, **options) -> None:
    """key000000.. -> v0.. (even numbers) in small SSTables (``SMALL``, and
    ``options``) of a database at ``path``, closed."""
    db = lsmdb.open(path, auto_compaction=False)
    db.alter_table("default", **SMALL, **options)
    for i in range(0, 4000, 2):
        db.put(b"key%06d" % i, b"v%d" % i)
    db.flush()
    db.close()


def _full_cache_db(path: str) -> lsmdb.DB:
    """key000000.. -> v0.. (even numbers) in 512-byte blocks of one SSTable,
    reopened with a block cache of two blocks' room, filled by reading two
    blocks."""
    if not os.path.exists(path):
        _even_keys_db(path)
    db = lsmdb.open(path, auto_compaction=False)
    sizes = []
    for item in db._default_state.fast.files:
        for i in range(len(item.index_keys)):
            try:
                sizes.append(len(item.reader.read_entry(i)))  # what the cache counts
            except lsmdb.CorruptionError:
                pass  # a block the rule refuses is never cached
    db.close()
    db = lsmdb.open(path, auto_compaction=False, block_cache_size_bytes=2 * max(sizes) + 10)
    assert db.get(b"key%06d" % 0) == b"v0" and db.get(b"key%06d" % 2000) == b"v2000"
    cache = db._versions.block_cache
    assert len(cache) == 2 and not cache.admit(-1)  # full: a first read is turned away
    return db


def test_a_full_cache_takes_a_block_a_get_read_only_on_its_second_read(tmp_path, impl):
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


def test_a_full_cache_takes_a_block_get_many_read_for_several_keys_on_its_second_read(tmp_path,
                                                                                      impl):
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
    _even_keys_db(path, compression="none")
    db = lsmdb.open(path, auto_compaction=False)
    reader = db._default_state.fast.files[0].reader
    i = len(reader.index_keys) - 3
    offset, size, key = reader.index_offsets[i], reader.index_sizes[i], reader.index_keys[i]
    file = reader.path
    with open(file, "r+b") as f:
        f.seek(offset)
        payload = bytearray(f.read(size))
        at = payload.index(b"\xc4\x09" + key)  # the block's last key, a bin 8
        payload[at] = 0xD9  # now a str 8 of the same length
        f.seek(offset)
        f.write(stored_block(reader, bytes(payload)))
    db.close()
    return key, file, offset, i


def test_a_checksum_valid_block_of_the_wrong_shape_is_corruption_with_a_full_cache(tmp_path,
                                                                                   impl):
    """A data block whose checksum is right but whose key is a msgpack str:
    refused by the data block rule before any key answers -- the C getter
    hands it to the Python side, which raises CorruptionError at the block's
    offset."""
    path = str(tmp_path / "db")
    key, file, offset, _i = _str_key_block(path)
    db = _full_cache_db(path)
    try:
        with pytest.raises(lsmdb.CorruptionError) as exc:
            db.get(key)
        assert exc.value.path == file and exc.value.offset == offset
    finally:
        db.close()


def test_a_checksum_valid_block_of_the_wrong_shape_is_never_cached(tmp_path, impl):
    """With room in the cache, which admits every block read, the block of the
    wrong shape is not cached: every get of a key it may hold raises
    CorruptionError at its offset, on both read paths, get_many too (for one
    key, and for two that need the block), one block read counted each (the C
    getter hands a block the rule refuses to the Python side, uncounted)."""
    path = str(tmp_path / "db")
    key, file, offset, i = _str_key_block(path)
    db = lsmdb.open(path, auto_compaction=False)
    try:
        assert (type(db.get).__name__ == "Getter") == (impl == "c")
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


def _damage_block(path: str, how: str) -> tuple[str, int, list[bytes], bytes]:
    """An SSTable of even keys without a filter, its block 1 rewritten in place,
    checksum right: as one bare byte string, or with its keys and values
    swapped (the same size either way).  (the file, the block's offset, the
    keys it held, an absent key it would hold)."""
    import msgpack

    from lsmdb.sstable_reader import SSTableReader
    with lsmdb.open(path, auto_compaction=False) as db:
        db.alter_table("default", bloom_filter_fp_chance=1.0, block_size_bytes=512,
                       compression="none")
        for i in range(0, 4000, 2):
            db.put(b"key%06d" % i, b"v%d" % i)
        db.flush()
    [name] = [n for n in os.listdir(path) if n.endswith(".sst")]
    file = os.path.join(path, name)
    r = SSTableReader(file, 1)
    offset, size = r.index_offsets[1], r.index_sizes[1]
    keys, values, tags = r.decode_full(1, r.read_raw(1))
    if how == "bare bytes":
        payload = msgpack.packb(b"x" * (size - 3), use_bin_type=True)  # a bin 16
    else:
        payload = data_payload(r, values, keys, tags)  # type: ignore[arg-type]
    assert len(payload) == size
    with open(file, "r+b") as f:
        f.seek(offset)
        f.write(stored_block(r, payload))
    r.close()
    absent = keys[0][:-1] + bytes([keys[0][-1] + 1])  # an odd number: between two keys
    return file, offset, keys, absent


def _tag_damaged_lz4_block(path: str, compression: str = "lz4"
                           ) -> tuple[str, int, list[bytes], bytes]:
    """An SSTable of even keys without a filter, LZ4-compressed (or stored as
    they are), its block 1 rewritten in place under a right checksum: one
    entry's tag given kind 7, which the data block rule refuses, its keys as
    they were, stored in the same number of bytes.  (the file, the block's
    offset, the keys it holds, an absent key it would hold)."""
    import lz4.block

    from lsmdb.coding import crc32
    from lsmdb.sstable_reader import SSTableReader
    with lsmdb.open(path, auto_compaction=False) as db:
        db.alter_table("default", bloom_filter_fp_chance=1.0, block_size_bytes=512,
                       compression=compression)
        for i in range(0, 4000, 2):
            db.put(b"key%06d" % i, b"v%d" % i * 20)
        db.flush()
    [name] = [n for n in os.listdir(path) if n.endswith(".sst")]
    file = os.path.join(path, name)
    r = SSTableReader(file, 1)
    offset, size = r.index_offsets[1], r.index_sizes[1]
    raw = r.read_raw(1)
    kind = raw[size:size + 1]
    assert kind == (b"\x01" if compression == "lz4" else b"\x00")  # stored as asked
    keys, values, tags = r.decode_full(1, raw)
    stored = b""
    for j in range(len(tags)):
        damaged = list(tags)
        damaged[j] = tags[j] | 7
        payload = data_payload(r, keys, values, damaged)  # type: ignore[arg-type]
        stored = lz4.block.compress(payload) if compression == "lz4" else payload
        if len(stored) == size:
            break
    assert len(stored) == size, "no tag rewrite is stored in the block's size"
    with open(file, "r+b") as f:
        f.seek(offset)
        f.write(stored + kind + crc32(kind, crc32(stored)).to_bytes(4, "little"))
    r.close()
    absent = keys[0][:-1] + bytes([keys[0][-1] + 1])  # an odd number: between two keys
    return file, offset, keys, absent


def test_a_false_positive_is_decided_from_the_block_keys_alone(tmp_path, impl, monkeypatch):
    """A get of a key a block does not hold reads the block's keys alone
    (docs/FORMAT.md §4.2): a block whose keys hold answers such a key absent
    even though its tags break the rule -- in C without the Python side --
    counted as a block read and a false positive; once the admission would
    cache the block (its second read), the block is read whole and the same
    get is CorruptionError at its offset; a key it holds is, from the start."""
    path = str(tmp_path / "db")
    file, offset, keys, absent = _tag_damaged_lz4_block(path)
    handed: list[list[bytes]] = []
    real = lsmdb.readpath._c_blocks
    monkeypatch.setattr(lsmdb.readpath, "_c_blocks",
                        lambda fast, f, ks: handed.append(list(ks)) or real(fast, f, ks))
    db = lsmdb.open(path, auto_compaction=False)
    try:
        assert (type(db.get).__name__ == "Getter") == (impl == "c")
        before = db.table_stats()
        assert db.get(absent) is None
        after = db.table_stats()
        assert after["block_reads"] == before["block_reads"] + 1
        assert after["false_positives"] == before["false_positives"] + 1
        assert handed == []  # the C getter decided it itself
        with pytest.raises(lsmdb.CorruptionError) as exc:
            db.get(absent)  # the second read: the cache would take the block, read whole
        assert exc.value.path == file and exc.value.offset == offset
        with pytest.raises(lsmdb.CorruptionError) as exc:
            db.get(keys[1])
        assert exc.value.path == file and exc.value.offset == offset
    finally:
        db.close()


@pytest.mark.parametrize("compression", ["lz4", "none"])
def test_a_present_key_is_read_no_further_than_its_value(tmp_path, impl, monkeypatch,
                                                         compression):
    """Where the cache would not take a get's block (no cache here), a format-2
    block's keys and values up to the key's decide (docs/FORMAT.md §4.2): the
    tag-damaged block answers the keys it holds with their values and the
    others absent -- in C without the Python side -- each counted as a block
    read and a true or false positive; a cache with room takes the block, so
    reads it whole and refuses it."""
    path = str(tmp_path / "db")
    file, offset, keys, absent = _tag_damaged_lz4_block(path, compression)
    handed: list[list[bytes]] = []
    real = lsmdb.readpath._c_blocks
    monkeypatch.setattr(lsmdb.readpath, "_c_blocks",
                        lambda fast, f, ks: handed.append(list(ks)) or real(fast, f, ks))
    db = lsmdb.open(path, auto_compaction=False, block_cache_size_bytes=0)
    try:
        assert (type(db.get).__name__ == "Getter") == (impl == "c")
        before = db.table_stats()
        for key in keys:
            assert db.get(key) == b"v%d" % int(key[3:]) * 20
        assert db.get(absent) is None
        after = db.table_stats()
        assert after["block_reads"] == before["block_reads"] + len(keys) + 1
        assert after["true_positives"] == before["true_positives"] + len(keys)
        assert after["false_positives"] == before["false_positives"] + 1
        assert handed == []  # the C getter decided them itself
    finally:
        db.close()
    with lsmdb.open(path, auto_compaction=False) as db, \
            pytest.raises(lsmdb.CorruptionError) as exc:
        db.get(keys[-1])
    assert exc.value.path == file and exc.value.offset == offset


@pytest.mark.parametrize("how", ["bare bytes", "keys and values swapped"])
def test_a_checksum_valid_malformed_block_is_corruption_on_both_paths(tmp_path, impl, how):
    """A data block whose checksum is right but which is not what the writer
    writes -- one bare byte string, or its keys and values swapped -- is
    refused before any key in it answers: get and get_many, of a key it held
    and of an absent key it would hold, raise CorruptionError naming the file
    and the block's offset, on both read paths; the other blocks still read."""
    path = str(tmp_path / "db")
    file, offset, keys, absent = _damage_block(path, how)
    db = lsmdb.open(path, auto_compaction=False)
    try:
        assert (type(db.get).__name__ == "Getter") == (impl == "c")
        for call in (lambda: db.get(keys[1]), lambda: db.get(absent),
                     lambda: db.get_many([keys[2]]), lambda: db.get_many([absent, keys[0]])):
            with pytest.raises(lsmdb.CorruptionError) as exc:
                call()
            assert (exc.value.path, exc.value.offset) == (file, offset)
        assert db.get(b"key%06d" % 0) == b"v0"  # block 0
        assert db.get(b"key%06d" % 3998) == b"v3998"
    finally:
        db.close()


def test_trace_counts_nothing_and_changes_nothing_in_the_cache(tmp_path, impl):
    """lsmdb trace runs the read path's own lookup with an observer: it reports
    each file's step, and no counter, no cache entry, no mark of the clock
    moves."""
    path = str(tmp_path / "db")
    _even_keys_db(path, bloom_filter_fp_chance=0.3)
    db = lsmdb.open(path, auto_compaction=False)
    try:
        for i in range(0, 4000, 3):  # warm the cache, some blocks marked
            db.get(b"key%06d" % i)
        cache = db._versions.block_cache
        books = cache.entries()
        counts = [(i.file, tuple(getattr(i, c) for c in FILE_COUNTERS)) for i in db.sstables()]
        stats = db.table_stats()
        traces = [db.trace(b"key%06d" % i) for i in range(0, 4000, 7)]
        assert cache.entries() == books
        assert [(i.file, tuple(getattr(i, c) for c in FILE_COUNTERS))
                for i in db.sstables()] == counts
        assert (db.table_stats()["gets"], db.table_stats()["gets_absent"]) == (
            stats["gets"], stats["gets_absent"])
        for i, t in zip(range(0, 4000, 7), traces, strict=True):
            assert t["result"] == ("found" if i % 2 == 0 else "absent"), t
            assert t["value"] == ((b"v%d" % i).hex() if i % 2 == 0 else None)
        assert any(s.get("block", {}).get("cached") for t in traces for s in t["steps"])
    finally:
        db.close()


@needs_c
@pytest.mark.parametrize("c_getter", [True, False])
def test_key_in_db_is_the_c_contains_and_answers_as_get(tmp_path, monkeypatch, c_getter):
    """``key in db`` calls db.get through speedups.Contains (no Python frame),
    over the C getter or the Python one: the same answers, the same errors."""
    from lsmdb.db import DB
    if not c_getter:
        use_python(monkeypatch)
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


@pytest.mark.parametrize("order", ["xzy", "xyz", "yzx"])
def test_get_many_counts_the_same_whatever_the_order_of_its_keys(tmp_path, impl, order):
    """In a file, get_many looks every block its keys need up in the cache before
    it reads any from disk, and reads those in file order: what a full cache
    holds, and so what it counts, does not depend on the keys' order.  File A
    (newer, no filter) holds x; y shares x's block in A, z another; only file B
    holds y and z, in two blocks: R (z's) cached, filling the cache, Q (y's)
    turned away once, so its next read is admitted and evicts R.  At B, R is a
    hit and Q is read, in any order of the keys."""
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
        sizes = [len(b.read_entry(b.block_for(k))) for k in (y, z)]
    db = lsmdb.open(path, auto_compaction=False, block_cache_size_bytes=max(sizes) * 3 // 2)
    try:
        assert (type(db.get).__name__ == "Getter") == (impl == "c")
        a, b = db._default_state.readers_in_order()
        assert a.block_for(x) == a.block_for(y) != a.block_for(z)
        r, q = b.block_for(z), b.block_for(y)
        assert r != q
        cache = db._versions.block_cache
        assert cache.offer(b.cache_base + r, b.read_entry(r), True)   # cached: the cache is full
        assert not cache.offer(b.cache_base + q, b.read_entry(q), True)  # turned away, remembered
        assert cache.lookup(b.cache_base + r) is not None and cache.lookup(b.cache_base + q) is None
        reads, hits = b.block_reads, b.block_cache_hits
        keys = {"x": x, "y": y, "z": z}
        values = {"x": b"a" * 60, "y": b"b" * 60, "z": b"b" * 60}
        assert db.get_many([keys[c] for c in order]) == [values[c] for c in order]
        assert (b.block_reads - reads, b.block_cache_hits - hits) == (1, 1)
    finally:
        db.close()


def test_the_cache_holds_each_blocks_payload_as_stored(tmp_path, impl):
    """The block cache keeps a block's checksum-verified payload, the bytes on
    disk, followed by its entries' offsets (lsmdb.block's cached form, as the
    Python reference makes it), whichever path read it (gets, get_many; the C
    or the Python read path), and its budget counts exactly those bytes."""
    from lsmdb import block as blk
    from lsmdb import compression
    path = str(tmp_path / "db")
    _even_keys_db(path)
    db = lsmdb.open(path, auto_compaction=False)
    try:
        assert (type(db.get).__name__ == "Getter") == (impl == "c")
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
                raw = f.read(size + reader.data_trailer)
            kind = raw[size]  # the type byte: the cache holds the payload decompressed
            assert kind == compression.LZ4
            payload = compression.decompress(kind, raw[:size], reader.path, offset)
            after, last = reader.bounds(i)
            reference = blk.cache_entry(payload, blk.decode_data_block(payload, "", 0, after,
                                                                       last, 2))
            assert type(entry) is bytes and entry == reference
        assert cache.used_bytes == sum(size for _ck, size, _marked in cache.entries())
        # hits answer from those bytes, the same again
        for i in range(0, 4000, 5):
            assert db.get(b"key%06d" % i) == (b"v%d" % i if i % 2 == 0 else None)
        assert sum(s.block_cache_hits for s in db.sstables()) > 0
    finally:
        db.close()


@needs_c
@pytest.mark.parametrize("c_getter", [True, False])
@pytest.mark.parametrize("mmap_reads", [False, True])
def test_a_false_positive_is_one_read_counted_and_its_block_cached_on_its_second_read(
        tmp_path, monkeypatch, mmap_reads, c_getter):
    """An uncached block read for a key it does not hold (one pread, or one
    copy out of the file's mapping; checksum, the rule) is one block read and
    one false positive in the counters, one read for the kernel (none from a
    mapping, which only the C getter uses), and is not cached on its first
    read (BlockCache.admit_reread): its second read caches it, and the false
    positives after that are cache hits, with no read.  A true positive
    caches the block it already read.  The C getter and the Python one alike."""
    from bench.common import ReadSyscalls
    if not c_getter:
        use_python(monkeypatch)
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


@needs_c
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
@needs_c
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


@needs_c
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




@needs_c
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


@needs_c
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


@needs_c
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


@needs_c
@pytest.mark.skipif(not MAPS, reason="files are not mapped here")
@pytest.mark.parametrize("how", ["sent", "fault"])
def test_a_sigbus_outside_lsmdbs_copies_still_ends_the_process(tmp_path, how):
    path = str(tmp_path / "db")
    _even_keys_db(path)
    done = subprocess.run([sys.executable, "-c", _SIGBUS_ELSEWHERE, path, how],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGBUS, (done.returncode, done.stdout, done.stderr)
    assert "survived" not in done.stdout


@needs_c
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


@needs_c
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


@needs_c
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
