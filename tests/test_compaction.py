"""Compaction: size-tiered and leveled strategies, fresh filters, rebuild_filters,
tombstone dropping, the background thread, crash safety and leftover files.

Every test compares the database with a dict model; the structural checks
(file counts, levels, filter sizes, counters) are on top of that.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict

import pytest

import lsmdb
from lsmdb.options import TableOptions
from lsmdb.sstable_format import MISSING
from lsmdb.sstable_reader import SSTableReader
from tests.support.reading import find

# fsync dominates the run time on a real disk (every flush and compaction fsyncs the
# SSTable, the manifest and the directory); a tmpfs makes those free when there is one.
# The crash test runs on the ordinary temporary directory.
FAST_TMP = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crash_child_compaction.py")
VALUE = b"v" * 200
WAIT = 60  # seconds: a compaction that never finishes fails instead of hanging
# Uncompressed: repeated values shrink tenfold under lz4, and these tests need levels.
LEVELED = {"compaction": "leveled", "memtable_size_bytes": 64 * 1024,
           "target_file_size_bytes": 65536, "block_size_bytes": 1024, "compression": "none"}


@pytest.fixture
def path(monkeypatch):
    """A fresh database path; databases a failing test left open are closed afterwards."""
    d = tempfile.mkdtemp(prefix="lsmdb-compaction-", dir=FAST_TMP)
    opened = []
    real_open = lsmdb.open

    def tracking_open(*args, **kwargs):
        db = real_open(*args, **kwargs)
        opened.append(db)
        return db

    monkeypatch.setattr(lsmdb, "open", tracking_open)
    yield os.path.join(d, "db")
    for db in opened:
        db.close()
    shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------------- helpers
def bits_per_key_for(p: float) -> float:
    return -math.log(p) / math.log(2) ** 2


def check_content(t, model: dict[bytes, bytes]) -> None:
    """Scan (both directions) and point reads agree with ``model``."""
    want = sorted(model.items())
    assert list(t.scan()) == want
    assert list(t.scan(reverse=True)) == want[::-1]
    for key, value in model.items():
        assert t.get(key) == value, key


def by_level(infos) -> dict[int, list]:
    out: dict[int, list] = defaultdict(list)
    for info in infos:
        out[info.level].append(info)
    return dict(out)


def assert_levels_do_not_overlap(infos) -> None:
    for level, files in by_level(infos).items():
        if level == 0:
            continue
        files = sorted(files, key=lambda i: i.min_key)
        for a, b in zip(files, files[1:], strict=False):
            assert a.max_key < b.min_key, (
                f"L{level}: {a.file} [{a.min_key!r}, {a.max_key!r}] overlaps "
                f"{b.file} [{b.min_key!r}, {b.max_key!r}]")


def probes(db, table: str) -> tuple[int, int]:
    """(filter probes, files consulted) summed over the table's files."""
    infos = db.sstables(table)
    asked = sum(i.filter_negatives + i.false_positives + i.true_positives for i in infos)
    return asked, asked + sum(i.range_skips for i in infos)


def versions(db, table: str, key: bytes) -> list[tuple[str, bytes | None]]:
    """(file, value or None for a tombstone) of every file holding ``key``, in read order."""
    out = []
    for info in db.sstables(table):
        if info.min_key <= key <= info.max_key:
            reader = SSTableReader(info.path)
            try:
                value = find(reader, key)
            finally:
                reader.close()
            if value is not MISSING:
                out.append((info.file, value))
    return out


def sst_files_on_disk(path: str) -> set[str]:
    return {n for n in os.listdir(path) if n.endswith(".sst")}


def load_sequential(t, n: int, tag: bytes = b"") -> dict[bytes, bytes]:
    """Keys k00000000, k00000002, ... (even numbers: odd ones are absent but in range)."""
    model = {}
    for i in range(n):
        key = b"k%08d" % (2 * i)
        value = tag + b"%d-" % i + VALUE
        t.put(key, value)
        model[key] = value
    return model


def ensure_level0_files(db, t, model, name: str, rng: random.Random) -> None:
    """Leave 1-3 files in L0 (writes spread over the whole key range, flushed)."""
    while not by_level(db.sstables(name)).get(0):
        for _ in range(30):
            key = b"k%08d" % (2 * rng.randrange(len(model)))
            t.put(key, b"l0-" + key)
            model[key] = b"l0-" + key
        t.flush()
        db.wait_for_compactions(timeout=WAIT)


# ---------------------------------------------------------------------- size-tiered
def test_size_tiered_merges_four_similar_flushes(path):
    db = lsmdb.open(path)
    t = db.create_table("st", memtable_size_bytes=1 << 20, block_size_bytes=256)
    assert t.options.compaction == "size_tiered"
    assert t.options.min_threshold == 4 and t.options.max_threshold == 32
    rng = random.Random(7)
    model: dict[bytes, bytes] = {}
    written = set()

    def one_flush(no: int) -> None:
        for i in range(150):
            key = b"k%04d" % rng.randrange(400)
            written.add(key)
            if rng.random() < 0.2:
                t.delete(key)
                model.pop(key, None)
            else:
                value = b"f%d-%d-" % (no, i) + b"x" * 50
                t.put(key, value)
                model[key] = value
        t.flush()
        db.wait_for_compactions(timeout=WAIT)

    for no in range(3):
        one_flush(no)
    first = db.sstables("st")
    assert len(first) == 3, "three files are below min_threshold: nothing to merge"
    check_content(t, model)

    one_flush(3)
    infos = db.sstables("st")
    assert len(infos) == 1, [(i.file, i.size_bytes) for i in infos]
    assert infos[0].file not in {i.file for i in first}
    assert infos[0].level == 0
    # the bucket held the oldest file: the output is the bottom, tombstones are gone
    assert infos[0].tombstones == 0
    assert infos[0].entries == len(model) < len(written)
    assert sst_files_on_disk(path) == {infos[0].file}
    check_content(t, model)

    # a fifth similar flush stays on its own until three more arrive
    one_flush(4)
    assert len(db.sstables("st")) == 2
    check_content(t, model)
    db.close()
    with lsmdb.open(path) as db:
        check_content(db.table("st"), model)


def test_size_tiered_partial_compaction_keeps_tombstones(path):
    """One big old file, four small newer ones deleting its keys: only the small ones merge,
    and their tombstones must survive, or the big file's values would come back."""
    db = lsmdb.open(path)
    # Files below min_sstable_size_bytes (where the option exists) share one bucket
    # whatever their sizes: keep it below the small files so that sizes decide.
    small = ({"min_sstable_size_bytes": 0}
             if "min_sstable_size_bytes" in TableOptions.__dataclass_fields__ else {})
    t = db.create_table("p", memtable_size_bytes=1 << 20, block_size_bytes=1024, **small)
    model = {}
    for i in range(2000):
        key = b"big%05d" % i
        model[key] = b"old-%d-" % i + b"x" * 100
        t.put(key, model[key])
    t.flush()
    [big] = db.sstables("p")
    rng = random.Random(3)
    victims = rng.sample(sorted(model), 80)
    for round_no in range(4):
        for key in victims[round_no * 20:(round_no + 1) * 20]:
            t.delete(key)
            del model[key]
        for j in range(5):
            key = b"new%d-%d" % (round_no, j)
            model[key] = b"n" * 40
            t.put(key, model[key])
        t.flush()
        db.wait_for_compactions(timeout=WAIT)
        if round_no < 3:
            assert len(db.sstables("p")) == round_no + 2, "no bucket of 4 similar files yet"
    infos = db.sstables("p")
    assert len(infos) == 2, [(i.file, i.size_bytes) for i in infos]
    assert big.file in {i.file for i in infos}, "the big old file must not have been merged"
    [merged] = [i for i in infos if i.file != big.file]
    assert merged.tombstones == 80, "tombstones over an older file must be kept"
    assert merged.entries == 100
    for key in victims:
        assert t.get(key) is None
    check_content(t, model)
    db.close()

    db = lsmdb.open(path)
    t = db.table("p")
    check_content(t, model)
    db.compact("p")
    [full] = db.sstables("p")
    assert full.tombstones == 0 and full.entries == len(model)
    check_content(t, model)
    db.close()


# ---------------------------------------------------------------------- leveled
def test_leveled_levels_tombstones_and_point_read_cost(path):
    db = lsmdb.open(path)
    t = db.create_table("lv", **LEVELED)
    model = load_sequential(t, 8000)
    db.wait_for_compactions(timeout=WAIT)
    levels = by_level(db.sstables("lv"))
    assert 1 in levels and 2 in levels, {lv: len(f) for lv, f in levels.items()}
    for level in (1, 2):
        for info in levels[level]:
            assert info.size_bytes <= 2 * 65536, info
    assert_levels_do_not_overlap(db.sstables("lv"))
    assert sum(i.size_bytes for i in levels[1]) <= 10 * 65536 + 2 * 65536

    # Delete and overwrite keys that sit in the deepest level; compactions into L1
    # (which overlaps L2) must keep the tombstones.
    deep = sorted(levels[max(levels)], key=lambda i: i.min_key)[0]
    lo = int(deep.min_key[1:]) // 2
    deleted = [b"k%08d" % (2 * i) for i in range(lo, lo + 300, 3)]
    for n in range(4):
        for key in deleted[n::4]:
            t.delete(key)
            del model[key]
        for i in range(lo + 1, lo + 300, 6):  # never a deleted key
            key = b"k%08d" % (2 * i)
            model[key] = b"new-%d-" % n + key
            t.put(key, model[key])
        t.flush()
    db.wait_for_compactions(timeout=WAIT)
    infos = db.sstables("lv")
    assert_levels_do_not_overlap(infos)
    kept = 0
    for key in deleted:
        assert t.get(key) is None
        found = versions(db, "lv", key)
        if found:  # an older value still on disk must sit under a tombstone
            assert found[0][1] is None, (key, found)
            kept += len(found) > 1
    assert kept, "the scenario must leave tombstones over older values"
    check_content(t, model)

    ensure_level0_files(db, t, model, "lv", random.Random(5))
    infos = db.sstables("lv")
    levels = by_level(infos)
    bound = len(levels[0]) + sum(1 for lv, files in levels.items() if lv >= 1 and files)
    assert len(infos) > 3 * bound, "the bound must be well below the number of files"
    rng = random.Random(11)
    for _ in range(300):
        key = b"k%08d" % (2 * rng.randrange(8000) + 1)  # odd: absent, inside the range
        asked0, consulted0 = probes(db, "lv")
        assert t.get(key) is None
        asked1, consulted1 = probes(db, "lv")
        assert asked1 - asked0 <= bound, (key, asked1 - asked0, bound)
        assert consulted1 - consulted0 <= bound, (key, consulted1 - consulted0, bound)
        trace = db.trace(key, table="lv")
        assert trace["result"] == "absent"
        assert trace["files_consulted"] <= bound
        deeper_files = [s for s in trace["steps"] if "file" in s and s["level"] >= 1]
        assert len({s["level"] for s in deeper_files}) == len(deeper_files), \
            "at most one file per deeper level"
    for key in deleted[:50]:
        asked0, _ = probes(db, "lv")
        assert t.get(key) is None
        assert probes(db, "lv")[0] - asked0 <= bound

    # a full compaction puts everything in the bottom level without tombstones
    db.compact("lv")
    db.wait_for_compactions(timeout=WAIT)
    infos = db.sstables("lv")
    assert {i.level for i in infos} == {max(levels)}
    assert sum(i.tombstones for i in infos) == 0
    assert sum(i.entries for i in infos) == len(model)
    assert_levels_do_not_overlap(infos)
    check_content(t, model)
    db.close()
    with lsmdb.open(path) as db:
        check_content(db.table("lv"), model)
        assert_levels_do_not_overlap(db.sstables("lv"))


def test_switching_leveled_to_size_tiered_keeps_the_newest_values(path):
    """Files from a leveled history (L1 newer than L2) under size-tiered compaction:
    a read must still return the newest value of every key."""
    db = lsmdb.open(path)
    t = db.create_table("sw", compaction="leveled", memtable_size_bytes=4 << 20,
                        target_file_size_bytes=65536)
    model = {}
    for i in range(10000):    # 30+ files: more than one size-tiered compaction takes
        key = b"k%06d" % i
        model[key] = b"old" + VALUE
        t.put(key, model[key])
    db.compact("sw")              # everything into L1, then L1 overflows into L2
    db.wait_for_compactions(timeout=WAIT)
    for j in range(4):            # 4 L0 files -> one small L1 file over L2's keys
        key = b"k%06d" % (100 + j)
        model[key] = b"new"
        t.put(key, model[key])
        t.flush()
    db.wait_for_compactions(timeout=WAIT)
    check_content(t, model)
    db.alter_table("sw", compaction="size_tiered")
    db.wait_for_compactions(timeout=WAIT)
    check_content(t, model)
    db.close()
    with lsmdb.open(path) as db:
        check_content(db.table("sw"), model)


# ---------------------------------------------------------------------- fp chance defaults
def test_default_fp_chance_follows_the_strategy(path):
    db = lsmdb.open(path)
    assert db.table("default").options.bloom_filter_fp_chance == 0.01
    st = db.create_table("st")
    lv = db.create_table("lv", compaction="leveled")
    ex_lv = db.create_table("ex_lv", compaction="leveled", bloom_filter_fp_chance=0.01)
    ex_st = db.create_table("ex_st", compaction="size_tiered", bloom_filter_fp_chance=0.1)
    assert st.options.compaction == "size_tiered"
    assert st.options.bloom_filter_fp_chance == 0.01
    assert lv.options.bloom_filter_fp_chance == 0.1
    assert ex_lv.options.bloom_filter_fp_chance == 0.01
    assert ex_st.options.bloom_filter_fp_chance == 0.1
    for t in (st, lv, ex_lv, ex_st):
        for i in range(200):
            t.put(b"k%d" % i, b"v")
        t.flush()
    want = {"st": 0.01, "lv": 0.1, "ex_lv": 0.01, "ex_st": 0.1}
    for name, fp in want.items():
        [info] = db.sstables(name)
        assert info.filter_fp_chance == fp
        assert abs(info.bits_per_key - bits_per_key_for(fp)) <= 0.01 * bits_per_key_for(fp)
    db.close()

    db = lsmdb.open(path)
    for name, fp in want.items():
        assert db.table(name).options.bloom_filter_fp_chance == fp
    # never set: the default follows a change of strategy; set explicitly: it stays
    db.alter_table("st", compaction="leveled")
    db.alter_table("lv", compaction="size_tiered")
    db.alter_table("ex_lv", compaction="size_tiered")
    db.alter_table("ex_st", compaction="leveled")
    want = {"st": 0.1, "lv": 0.01, "ex_lv": 0.01, "ex_st": 0.1}
    for name, fp in want.items():
        assert db.table(name).options.bloom_filter_fp_chance == fp
    db.close()
    with lsmdb.open(path) as db:
        for name, fp in want.items():
            assert db.table(name).options.bloom_filter_fp_chance == fp


# ---------------------------------------------------------------------- filters
def check_filter_built_at(info, p: float) -> None:
    assert info.filter_fp_chance == p, info
    assert not info.filter_stale, info
    want = bits_per_key_for(p)
    assert abs(info.bits_per_key - want) <= 0.01 * want, (info.bits_per_key, want)
    assert info.filter_hashes == max(1, round(info.filter_bits / info.entries * math.log(2)))


def fill(t, n: int, seed: int) -> dict[bytes, bytes]:
    rng = random.Random(seed)
    model = {}
    for i in range(n):
        key = b"key%06d" % rng.randrange(4 * n)
        if rng.random() < 0.1:
            t.delete(key)
            model.pop(key, None)
        else:
            model[key] = b"%d-" % i + b"x" * rng.randrange(80)
            t.put(key, model[key])
    return model


def at_least_two_files(db, t, model) -> None:
    """Settle background compaction, with two files or more left (new flushes if needed)."""
    db.wait_for_compactions(timeout=WAIT)
    n = 0
    while len(db.sstables(t.name)) < 2:
        for i in range(200):
            key = b"more%d-%03d" % (n, i)
            model[key] = b"m" * 30
            t.put(key, model[key])
        t.flush()
        db.wait_for_compactions(timeout=WAIT)
        n += 1
    assert len(db.sstables(t.name)) >= 2


@pytest.mark.parametrize("strategy", ["size_tiered", "leveled"])
def test_compact_builds_every_filter_at_the_current_fp_chance(path, strategy):
    db = lsmdb.open(path)
    t = db.create_table("f", compaction=strategy, memtable_size_bytes=16 * 1024,
                        block_size_bytes=256, target_file_size_bytes=65536)
    model = fill(t, 4000, 1)
    at_least_two_files(db, t, model)
    db.alter_table("f", bloom_filter_fp_chance=0.001)
    assert all(i.filter_stale for i in db.sstables("f"))
    db.compact("f")
    db.wait_for_compactions(timeout=WAIT)
    infos = db.sstables("f")
    assert infos
    for info in infos:
        check_filter_built_at(info, 0.001)
        assert info.table_fp_chance == 0.001
    check_content(t, model)
    assert db.rebuild_filters("f") == 0
    db.close()
    with lsmdb.open(path) as db:
        for info in db.sstables("f"):
            check_filter_built_at(info, 0.001)
        check_content(db.table("f"), model)


def data_prefix(path: str) -> tuple[tuple[int, int], bytes]:
    reader = SSTableReader(path)
    try:
        idx_off, idx_size = reader.index_handle
    finally:
        reader.close()
    with open(path, "rb") as f:
        return (idx_off, idx_size), f.read(idx_off + idx_size + 4)


@pytest.mark.parametrize("strategy", ["size_tiered", "leveled"])
def test_rebuild_filters_copies_data_blocks_and_index_byte_for_byte(path, strategy):
    db = lsmdb.open(path)
    t = db.create_table("r", compaction=strategy, memtable_size_bytes=16 * 1024,
                        block_size_bytes=256, target_file_size_bytes=65536)
    other = db.create_table("other", bloom_filter_fp_chance=0.05)
    other.put(b"x", b"y")
    other.flush()
    model = fill(t, 3000, 2)
    at_least_two_files(db, t, model)
    before = db.sstables("r")
    assert not any(i.filter_stale for i in db.sstables())
    old = {}
    for info in before:
        old[(info.min_key, info.max_key, info.entries)] = (info, data_prefix(info.path))
    assert len(old) == len(before)

    db.alter_table("r", bloom_filter_fp_chance=0.001)
    assert all(i.filter_stale for i in db.sstables("r"))
    assert not any(i.filter_stale for i in db.sstables("other"))
    assert db.rebuild_filters("r") == len(before)
    after = db.sstables("r")
    assert len(after) == len(before)
    for info in after:
        was, (handle, prefix) = old[(info.min_key, info.max_key, info.entries)]
        assert info.file != was.file
        assert not os.path.exists(was.path), "the replaced file is deleted"
        assert (info.level, info.tombstones) == (was.level, was.tombstones)
        new_handle, new_prefix = data_prefix(info.path)
        assert new_handle == handle
        assert new_prefix == prefix, f"{info.file}: data blocks/index differ from {was.file}"
        check_filter_built_at(info, 0.001)
    assert db.rebuild_filters("r") == 0
    assert db.rebuild_filters() == 0
    check_content(t, model)

    # only_stale=False rewrites every file, again without touching the data
    files = {i.file for i in after}
    assert db.rebuild_filters("r", only_stale=False) == len(after)
    assert not files & {i.file for i in db.sstables("r")}

    # fp 1.0: no filter at all
    db.alter_table("r", bloom_filter_fp_chance=1.0)
    assert db.rebuild_filters() == len(after)
    for info in db.sstables("r"):
        assert (info.filter_bits, info.filter_fp_chance, info.filter_stale) == (0, 1.0, False)
    check_content(t, model)
    [o] = db.sstables("other")
    assert o.filter_fp_chance == 0.05
    db.close()
    with lsmdb.open(path) as db:
        check_content(db.table("r"), model)
        assert db.rebuild_filters() == 0


def test_skip_last_level_leaves_bottom_files_without_a_filter(path):
    db = lsmdb.open(path)
    t = db.create_table("s", bloom_filter_skip_last_level=True, **LEVELED)
    model = load_sequential(t, 6000)
    db.wait_for_compactions(timeout=WAIT)
    infos = db.sstables("s")
    bottom = max(i.level for i in infos)
    assert bottom >= 2
    bottom_files = [i for i in infos if i.level == bottom]
    assert bottom_files
    for info in bottom_files:
        assert info.filter_bits == 0 and info.filter_fp_chance == 1.0, info
        assert not info.filter_stale
    check_content(t, model)
    for i in range(0, 6000, 7):
        assert t.get(b"k%08d" % (2 * i + 1)) is None

    # a full compaction writes the bottom level: no filter anywhere
    db.compact("s")
    infos = db.sstables("s")
    assert {i.level for i in infos} == {bottom}
    assert all(i.filter_bits == 0 for i in infos)
    assert db.rebuild_filters("s") == 0
    check_content(t, model)
    # new flushes (L0) still get the table's filter
    t.put(b"k00000001", b"odd")
    model[b"k00000001"] = b"odd"
    t.flush()
    l0 = by_level(db.sstables("s"))[0]
    assert [i.filter_fp_chance for i in l0] == [0.1]
    check_content(t, model)
    db.close()
    with lsmdb.open(path) as db:
        check_content(db.table("s"), model)


def test_skip_last_level_files_above_the_bottom_keep_a_filter(path):
    """Only the last level goes without a filter: a file compacted into L1 while L2
    exists is not in the last level, even when L2 holds nothing of its key range."""
    db = lsmdb.open(path)
    t = db.create_table("s", bloom_filter_skip_last_level=True, **LEVELED)
    model = load_sequential(t, 6000)
    db.wait_for_compactions(timeout=WAIT)
    db.rebuild_filters("s")
    rebuilt = {i.file for i in db.sstables("s")}
    for i in range(4):        # a key range past everything: no overlap with L2
        for j in range(40):
            key = b"z%04d" % (i * 40 + j)
            model[key] = VALUE
            t.put(key, VALUE)
        t.flush()
    db.wait_for_compactions(timeout=WAIT)
    infos = db.sstables("s")
    bottom = max(i.level for i in infos)
    assert bottom >= 2
    assert [i for i in infos if 1 <= i.level < bottom and i.file not in rebuilt], \
        "an L0 -> L1 compaction wrote new L1 files"
    for info in infos:
        if info.level < bottom:
            assert info.filter_bits > 0 and info.filter_fp_chance == 0.1, info
        else:
            assert info.filter_bits == 0, info
    assert not any(i.filter_stale for i in infos)
    check_content(t, model)
    db.close()


# ---------------------------------------------------------------------- tombstones
@pytest.mark.parametrize("strategy", ["size_tiered", "leveled"])
def test_full_compaction_drops_tombstones(path, strategy):
    db = lsmdb.open(path)
    t = db.create_table("d", compaction=strategy, memtable_size_bytes=1 << 20,
                        block_size_bytes=256)
    model = {}
    for i in range(600):
        key = b"d%05d" % i
        model[key] = b"v%d" % i
        t.put(key, model[key])
    t.flush()
    deleted = [b"d%05d" % i for i in range(0, 600, 3)]
    for key in deleted:
        t.delete(key)
        del model[key]
    for i in range(1000, 1050):           # deletes of keys that never existed
        t.delete(b"d%05d" % i)
    t.put(deleted[0], b"back")            # deleted in an older file, alive again
    model[deleted[0]] = b"back"
    t.flush()
    assert sum(i.tombstones for i in db.sstables("d")) == len(deleted) - 1 + 50
    db.compact("d")
    db.wait_for_compactions(timeout=WAIT)
    infos = db.sstables("d")
    assert sum(i.tombstones for i in infos) == 0
    assert sum(i.entries for i in infos) == len(model)
    for key in deleted[1:]:
        assert t.get(key) is None
    check_content(t, model)
    db.close()
    with lsmdb.open(path) as db:
        check_content(db.table("d"), model)
        assert sum(i.tombstones for i in db.sstables("d")) == 0


# ---------------------------------------------------------------------- threads
@pytest.mark.parametrize("strategy", ["size_tiered", "leveled"])
def test_concurrent_writers_readers_and_background_compaction(path, strategy):
    db = lsmdb.open(path)
    t = db.create_table("c", compaction=strategy, memtable_size_bytes=4096,
                        block_size_bytes=256, target_file_size_bytes=65536)
    writers, ops_per_writer, keys_per_writer = 3, 700, 120
    written: list[dict[bytes, set[bytes]]] = [defaultdict(set) for _ in range(writers)]
    finals: list[dict[bytes, bytes]] = [{} for _ in range(writers)]
    observed: list[tuple[bytes, bytes]] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    files_seen = []

    def writer(w: int) -> None:
        try:
            rng = random.Random(100 + w)
            model = finals[w]
            for n in range(ops_per_writer):
                key = b"w%d-%03d" % (w, rng.randrange(keys_per_writer))
                r = rng.random()
                if r < 0.2:
                    t.delete(key)
                    model.pop(key, None)
                elif r < 0.3:
                    pairs = [(b"w%d-%03d" % (w, rng.randrange(keys_per_writer)),
                              b"b%d" % n) for _ in range(3)]
                    with db.batch() as b:
                        for k, v in pairs:
                            v = k + b"=" + v
                            written[w][k].add(v)
                            b.put(k, v, table="c")
                            model[k] = v
                else:
                    value = key + b"=%d" % n + b"." * rng.choice([0, 50, 300])
                    written[w][key].add(value)
                    t.put(key, value)
                    model[key] = value
                if n % 10 == 0:  # a writer reads its own writes
                    assert t.get(key) == model.get(key), (key, n)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def reader(r: int) -> None:
        try:
            rng = random.Random(200 + r)
            while not stop.is_set():
                if rng.random() < 0.1:
                    w = rng.randrange(writers)
                    items = list(t.scan(prefix=b"w%d-" % w))
                    keys = [k for k, _ in items]
                    assert keys == sorted(set(keys)), "scan out of order or duplicated"
                    observed.extend(items)
                    files_seen.append(len(db.sstables("c")))
                else:
                    key = b"w%d-%03d" % (rng.randrange(writers), rng.randrange(keys_per_writer))
                    value = t.get(key)
                    if value is not None:
                        observed.append((key, value))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    wt = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    rt = [threading.Thread(target=reader, args=(r,)) for r in range(2)]
    for th in wt + rt:
        th.start()
    for th in wt:
        th.join(60)
    stop.set()
    for th in rt:
        th.join(60)
    assert not errors, errors
    assert not any(th.is_alive() for th in wt + rt)

    for key, value in observed:
        w = int(key[1:2])
        assert value in written[w][key], (key, value)
    assert len(observed) > 100
    db.wait_for_compactions(timeout=WAIT)
    model = {k: v for m in finals for k, v in m.items()}
    check_content(t, model)
    infos = db.sstables("c")
    assert len(infos) <= 12, "background compaction kept the file count down"
    if strategy == "leveled":
        assert_levels_do_not_overlap(infos)
        assert len(by_level(infos).get(0, [])) < 4
    assert sst_files_on_disk(path) == {i.file for i in db.sstables()}
    db.close()
    with lsmdb.open(path) as db:
        check_content(db.table("c"), model)


# ---------------------------------------------------------------------- crash safety
def read_log(out_path: str) -> tuple[list[list], list | None]:
    """(acknowledged writes, the write that may have been in flight)."""
    with open(out_path, "rb") as f:
        data = f.read().decode()
    lines = data.split("\n")
    lines.pop()  # "" after the last newline, or a torn last line
    assert lines and lines[0] == "READY", data[:200]
    acked, pending = [], None
    for line in lines[1:]:
        if line.startswith("W "):
            assert pending is None
            pending = json.loads(line[2:])
        else:
            assert line == "A" and pending is not None, line
            acked.append(pending)
            pending = None
    return acked, pending


def apply_ops(models: dict[str, dict[bytes, bytes]], ops: list) -> None:
    for table, key, value in ops:
        if value is None:
            models[table].pop(bytes.fromhex(key), None)
        else:
            models[table][bytes.fromhex(key)] = bytes.fromhex(value)


def snapshot(db) -> dict[str, dict[bytes, bytes]]:
    return {name: dict(db.table(name).scan()) for name in ("st", "lv")}


def test_sigkill_during_writes_and_compactions(tmp_path):
    path = str(tmp_path / "db")
    rng = random.Random(20240603)
    models: dict[str, dict[bytes, bytes]] = {"st": {}, "lv": {}}
    total_acked = 0
    for round_no in range(8):
        out_path = str(tmp_path / f"child-{round_no}.out")
        err_path = str(tmp_path / f"child-{round_no}.err")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen([sys.executable, CHILD, path, str(round_no), str(round_no)],
                                    stdout=out, stderr=err)
        try:
            deadline = time.monotonic() + 30
            while True:  # wait for READY so that the delay counts writing time
                with open(out_path, "rb") as f:
                    if f.read(6) == b"READY\n":
                        break
                assert proc.poll() is None, open(err_path).read()
                assert time.monotonic() < deadline, "child did not start"
                time.sleep(0.02)
            time.sleep(rng.uniform(0.3, 2.0))
            assert proc.poll() in (None, -signal.SIGKILL), \
                "child died on its own:\n" + open(err_path).read()
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert proc.returncode == -signal.SIGKILL
        acked, pending = read_log(out_path)
        total_acked += len(acked)
        for ops in acked:
            apply_ops(models, ops)

        db = lsmdb.open(path, auto_compaction=False)
        try:
            got = snapshot(db)
            if pending is not None and got != models:
                # the write in flight may have made it -- all of it (a batch is atomic)
                with_pending = {name: dict(m) for name, m in models.items()}
                apply_ops(with_pending, pending)
                if got == with_pending:
                    models = with_pending
            for name in ("st", "lv"):
                want = models[name]
                have = got[name]
                missing = {k: v for k, v in want.items() if have.get(k) != v}
                extra = {k: v for k, v in have.items() if k not in want}
                assert not missing and not extra, (
                    f"round {round_no}, table {name}: acknowledged writes lost "
                    f"{list(missing.items())[:3]} / deleted keys back {list(extra.items())[:3]}")
                t = db.table(name)
                for key, value in want.items():
                    assert t.get(key) == value
            live = {i.file for i in db.sstables()}
            assert sst_files_on_disk(path) == live, "leftover SSTables after reopen"
            assert not [n for n in os.listdir(path) if n.endswith(".tmp")]
            for name in ("st", "lv"):
                assert_levels_do_not_overlap(db.sstables(name))
        finally:
            db.close()
    assert total_acked > 100, "the children hardly wrote anything"

    with lsmdb.open(path) as db:
        db.wait_for_compactions(timeout=WAIT)
        assert snapshot(db) == models
        assert sst_files_on_disk(path) == {i.file for i in db.sstables()}


# ---------------------------------------------------------------------- leftovers
def test_leftover_sstable_is_removed_at_open(path):
    db = lsmdb.open(path)
    t = db.create_table("t", memtable_size_bytes=1 << 20)
    model = {}
    for i in range(300):
        model[b"k%d" % i] = b"v%d" % i
        t.put(b"k%d" % i, b"v%d" % i)
    t.flush()
    t.put(b"k0", b"changed")
    model[b"k0"] = b"changed"
    [info] = db.sstables("t")
    db.close()

    # what a compaction killed before its manifest switch leaves behind: a complete,
    # valid SSTable (here a copy, holding stale values) that the manifest does not name
    stray = os.path.join(path, "987654.sst")
    shutil.copyfile(info.path, stray)
    junk = os.path.join(path, "987655.sst")
    with open(junk, "wb") as f:
        f.write(b"half-written compaction output")
    db = lsmdb.open(path)
    assert not os.path.exists(stray) and not os.path.exists(junk)
    assert sst_files_on_disk(path) == {i.file for i in db.sstables()}
    t = db.table("t")
    check_content(t, model)
    for i in range(300, 400):
        model[b"k%d" % i] = b"v%d" % i
        t.put(b"k%d" % i, b"v%d" % i)
    t.flush()
    db.compact("t")
    check_content(t, model)
    assert sst_files_on_disk(path) == {i.file for i in db.sstables()}
    db.close()
    with lsmdb.open(path) as db:
        check_content(db.table("t"), model)


@pytest.mark.parametrize("process", [False, True])
def test_small_files_merge_while_a_large_merge_runs(tmp_path, monkeypatch, process):
    """Size-tiered: while the background merges two large files, a second job
    merges the flushes that pile up meanwhile, on other files; both install."""
    import lsmdb.compaction as compaction
    import lsmdb.worker as worker
    gate = threading.Event()
    big_started = threading.Event()
    started: list[int] = []

    def held(inputs_bytes: int) -> None:
        started.append(inputs_bytes)
        if inputs_bytes > 200_000:   # the large merge waits for the test
            big_started.set()
            assert gate.wait(30)

    real_run, real_merge = compaction.run, worker.merge

    def run(job, *args, **kwargs):
        held(sum(r.size_bytes for r in job.inputs))
        return real_run(job, *args, **kwargs)

    def merge(spec, *args, **kwargs):
        held(sum(os.path.getsize(p) for p, _n, _l in spec.inputs))
        return real_merge(spec, *args, **kwargs)

    monkeypatch.setattr(compaction, "run", run)
    monkeypatch.setattr(worker, "merge", merge)
    model: dict[bytes, bytes] = {}
    with lsmdb.open(str(tmp_path / "db"), compaction_process=process) as db:
        db.create_table("t", min_threshold=2, compression="none",
                        min_sstable_size_bytes=1 << 20)
        t = db.table("t")
        for part in range(2):           # two large files (~300 KB), similar sizes
            for i in range(2500):
                key = b"big%06d" % i
                model[key] = b"%d" % part * 100
                t.put(key, model[key])
            db.flush("t")
        assert big_started.wait(30)
        for part in range(2):           # two small flushes while the large merge waits
            key = b"small%d" % part
            model[key] = b"s"
            t.put(key, b"s")
            db.flush("t")
        deadline = time.monotonic() + 30
        while len(db.sstables("t")) > 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(db.sstables("t")) == 3     # the small ones merged; the large wait
        assert len(started) == 2 and started[1] < 200_000
        gate.set()
        db.wait_for_compactions()
        assert len(db.sstables("t")) == 1
        check_content(t, model)
