"""Per-SSTable filter counters and per-table read counters.

Every expectation here is exact on a constructed database: one table, no
background compaction, one SSTable whose key range, filter and contents are
known, so each ``get`` lands in exactly one counter.  The filter's answer for
each probed key is recomputed independently from the filter block's bytes as
documented (``h = xxh3_64(key)``; in filter format 2 probe ``i`` tests bit
``i*s + ((h1 + i*h2) mod 2^32) * s >> 32`` with ``s = m // k``, in format 1 bit
``(h1 + i*h2) mod m``),
so the split between filter negatives and false positives is exact too.  The
one statistical check -- measured FPR against the predicted FPR -- uses an
exact binomial bound that a correct filter violates with probability < 1e-6.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import shutil
import struct
import time
import zlib

import pytest
import xxhash

import lsmdb
import lsmdb.stats
from lsmdb.sstable_reader import SSTableReader

TABLE = "t"
N = 20_000                  # entries in the one SSTable (tombstones included)
STRIDE = 10                 # present keys are k{10*i}; k{10*i + r} (1 <= r <= 9) are absent
Q_ABSENT = 50_000           # absent, in-range gets for the FPR check
FP_CHANCE = 0.01
TOMBSTONE_EVERY = 1000      # every 1000th key is written as a tombstone
COUNTERS = ("range_skips", "filter_negatives", "true_positives", "false_positives",
            "false_negatives", "block_reads")
BIG_MEMTABLE = 64 * 1024 * 1024


def open_db(path, **kw):
    """lsmdb.open, with any block cache disabled so ``block_reads`` counts every data block
    a get reads (a cache, where present, would serve repeats without a read)."""
    if "block_cache_size_bytes" in inspect.signature(lsmdb.open).parameters:
        kw.setdefault("block_cache_size_bytes", 0)
    return lsmdb.open(path, **kw)


def key(n: int) -> bytes:
    return b"k%09d" % n


def value(i: int) -> bytes:
    return b"value-%d" % i


def is_tombstone(i: int) -> bool:
    return i % TOMBSTONE_EVERY == 7


PRESENT_IDX = [i for i in range(N) if not is_tombstone(i)]
TOMBSTONE_IDX = [i for i in range(N) if is_tombstone(i)]
ABSENT_IN_RANGE = [key(STRIDE * i + r) for i in range(N - 1) for r in (1, 2, 3)][:Q_ABSENT]
BELOW_RANGE = [b"a%06d" % i for i in range(300)] + [b"", b"k", b"k00000000"]
ABOVE_RANGE = [b"z%06d" % i for i in range(300)] + [b"k999999999", b"l"]


def counters(info) -> dict[str, int]:
    return {c: getattr(info, c) for c in COUNTERS}


def only_info(db, table=TABLE):
    infos = db.sstables(table)
    assert len(infos) == 1, infos
    return infos[0]


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {c: after[c] - before[c] for c in COUNTERS}


def zero(**nonzero: int) -> dict[str, int]:
    out = {c: 0 for c in COUNTERS}
    out.update(nonzero)
    return out


# --------------------------------------------------------------------- filter model
class FilterModel:
    """The filter of one SSTable, decoded from the file's bytes per docs/FORMAT.md."""

    HEADER = struct.Struct("<BBHIQQdI")

    def __init__(self, sst_path: str) -> None:
        reader = SSTableReader(sst_path)
        try:
            off, size = reader.filter_handle
        finally:
            reader.close()
        with open(sst_path, "rb") as f:
            f.seek(off)
            block = f.read(size)
        (self.version, self.algorithm, _flags, self.k, self.m, self.n, self.fp,
         _key_id) = self.HEADER.unpack_from(block, 0)
        self.bits = block[self.HEADER.size:]
        assert len(self.bits) == (self.m + 7) // 8

    def positions(self, k: bytes) -> list[int]:
        """The bits key k's probes test, in probe order."""
        h = xxhash.xxh3_64_intdigest(k)
        h1, h2 = h & 0xFFFFFFFF, h >> 32
        if self.version == 2:
            s = self.m // self.k
            return [i * s + (((h1 + i * h2) % 2**32) * s >> 32) for i in range(self.k)]
        assert self.version == 1
        return [(h1 + i * h2) % self.m for i in range(self.k)]

    def may_contain(self, k: bytes) -> bool:
        if self.m == 0:
            return True
        return all(self.bits[pos >> 3] & (1 << (pos & 7)) for pos in self.positions(k))


# --------------------------------------------------------------------- binomial bound
def binomial_bounds(n: int, p: float, alpha: float) -> tuple[int, int]:
    """(lo, hi) with P(X < lo) <= alpha/2 and P(X > hi) <= alpha/2 for X ~ Bin(n, p)."""
    logp, logq = math.log(p), math.log1p(-p)
    lgn = math.lgamma(n + 1)

    def pmf(x: int) -> float:
        return math.exp(lgn - math.lgamma(x + 1) - math.lgamma(n - x + 1) + x * logp
                        + (n - x) * logq)
    mean = int(n * p)
    lo, tail = 0, 0.0
    for x in range(0, mean + 1):
        tail += pmf(x)
        if tail > alpha / 2:
            lo = x
            break
    hi, tail = n, 0.0
    for x in range(n, mean - 1, -1):
        tail += pmf(x)
        if tail > alpha / 2:
            hi = x
            break
    return lo, hi


def test_binomial_bounds_helper_is_sane():
    lo, hi = binomial_bounds(50_000, 0.01, 1e-6)
    # mean 500, sd ~22.2: a 1e-6 two-sided band is roughly +-5 sd
    assert 380 < lo < 420 and 580 < hi < 625


# --------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A closed database: table 't' with exactly one SSTable of N entries."""
    path = str(tmp_path_factory.mktemp("stats") / "db")
    with open_db(path, auto_compaction=False) as db:
        t = db.create_table(TABLE, bloom_filter_fp_chance=FP_CHANCE,
                            memtable_size_bytes=BIG_MEMTABLE)
        with db.batch() as b:
            for i in range(N):
                if is_tombstone(i):
                    b.delete(key(STRIDE * i), table=TABLE)
                else:
                    b.put(key(STRIDE * i), value(i), table=TABLE)
        t.flush()
        infos = db.sstables(TABLE)
        assert len(infos) == 1 and infos[0].entries == N
    return path


@pytest.fixture
def dbpath(template, tmp_path):
    path = str(tmp_path / "db")
    shutil.copytree(template, path)
    return path


@pytest.fixture
def db(dbpath):
    d = open_db(dbpath, auto_compaction=False)
    yield d
    d.close()


# --------------------------------------------------------------------- the file itself
def test_constructed_file_is_what_the_tests_assume(db):
    info = only_info(db)
    assert info.table == TABLE and info.level == 0
    assert info.entries == N and info.tombstones == len(TOMBSTONE_IDX)
    assert info.min_key == key(0) and info.max_key == key(STRIDE * (N - 1))
    assert info.filter_fp_chance == FP_CHANCE
    m = math.ceil(-N * math.log(FP_CHANCE) / math.log(2) ** 2)
    k = max(1, round(m / N * math.log(2)))
    assert k == 7
    assert info.filter_bits == m and info.filter_hashes == k
    assert info.bits_per_key == pytest.approx(m / N)
    assert info.predicted_fpr == pytest.approx((1 - math.exp(-k * N / m)) ** k, rel=1e-12)
    model = FilterModel(info.path)
    assert (model.m, model.k, model.n) == (m, k, N)
    # the independent model has no false negatives on this file (else the oracle is wrong)
    assert all(model.may_contain(key(STRIDE * i)) for i in range(0, N, 97))
    assert all(info.min_key <= k_ <= info.max_key for k_ in ABSENT_IN_RANGE)
    assert not any(info.min_key <= k_ <= info.max_key for k_ in BELOW_RANGE + ABOVE_RANGE)


def test_fresh_counters_are_zero_and_rates_none(db):
    info = only_info(db)
    assert counters(info) == zero()
    assert info.measured_fpr is None and info.false_ratio is None
    st = db.table_stats(TABLE)
    assert st["gets"] == 0 and st["gets_absent"] == 0 and st["absent_share"] is None
    assert st["measured_fpr"] is None and st["false_ratio"] is None

    # Present keys and out-of-range keys are no absent probe: measured_fpr stays None.
    t = db.table(TABLE)
    for i in PRESENT_IDX[:50]:
        assert t.get(key(STRIDE * i)) == value(i)
    for k_ in BELOW_RANGE[:20]:
        assert t.get(k_) is None
    info = only_info(db)
    assert info.true_positives == 50 and info.range_skips == 20
    assert info.measured_fpr is None
    assert db.table_stats(TABLE)["measured_fpr"] is None
    assert info.false_ratio == 0.0


# --------------------------------------------------------------------- exact counts
def test_absent_in_range_gets_split_exactly_between_filter_no_and_false_positive(db):
    t = db.table(TABLE)
    before = only_info(db)
    model = FilterModel(before.path)
    expected_fp = sum(1 for k_ in ABSENT_IN_RANGE if model.may_contain(k_))

    for k_ in ABSENT_IN_RANGE:
        assert t.get(k_) is None

    after = only_info(db)
    d = delta(counters(after), counters(before))
    q = len(ABSENT_IN_RANGE)
    assert q == Q_ABSENT
    assert d["filter_negatives"] + d["false_positives"] == q
    assert d["range_skips"] == 0
    assert d["true_positives"] == 0
    assert d["false_negatives"] == 0
    assert d["block_reads"] == d["false_positives"]
    # exact, against the filter decoded independently from the file's bytes
    assert d["false_positives"] == expected_fp
    assert d["filter_negatives"] == q - expected_fp

    # derived rates
    assert after.measured_fpr == pytest.approx(expected_fp / q)
    assert after.false_ratio == pytest.approx(expected_fp / q)   # tp == 0 here
    lo, hi = binomial_bounds(q, after.predicted_fpr, 1e-6)
    assert lo <= after.false_positives <= hi, (
        f"measured FPR {after.measured_fpr:.5f} ({after.false_positives}/{q}) outside the "
        f"1e-6 binomial band [{lo}, {hi}] around predicted {after.predicted_fpr:.5f}")

    st = db.table_stats(TABLE)
    assert st["gets"] == q and st["gets_absent"] == q and st["absent_share"] == 1.0
    assert st["reads_skipped"] == st["filter_negatives"] == q - expected_fp
    assert st["false_positives"] == expected_fp and st["block_reads"] == expected_fp
    assert st["measured_fpr"] == pytest.approx(expected_fp / q)
    assert st["false_negatives"] == 0


def test_default_open_counts_every_maybe_as_one_block_served(dbpath):
    """With lsmdb.open's defaults: each "maybe" is exactly one data block, read from disk
    (block_reads) or -- where a block cache exists -- served from it (block_cache_hits)."""
    model = FilterModel(os.path.join(dbpath, sorted(n for n in os.listdir(dbpath)
                                                    if n.endswith(".sst"))[0]))
    absent = ABSENT_IN_RANGE[:5000]
    present = [key(STRIDE * i) for i in PRESENT_IDX[:1000]]
    fp = sum(1 for k_ in absent if model.may_contain(k_))
    with lsmdb.open(dbpath, auto_compaction=False) as db:
        t = db.table(TABLE)
        for k_ in absent + present + absent + present:
            t.get(k_)
        info = only_info(db)
        assert info.filter_negatives == 2 * (len(absent) - fp)
        assert info.false_positives == 2 * fp
        assert info.true_positives == 2 * len(present)
        assert info.range_skips == 0 and info.false_negatives == 0
        served = info.block_reads + getattr(info, "block_cache_hits", 0)
        assert served == 2 * (fp + len(present))
        assert info.block_reads >= 1


def test_present_gets_are_true_positives_with_one_block_read_each(db):
    t = db.table(TABLE)
    before = counters(only_info(db))
    sample = PRESENT_IDX[::7]
    for i in sample:
        assert t.get(key(STRIDE * i)) == value(i)
    d = delta(counters(only_info(db)), before)
    assert d == zero(true_positives=len(sample), block_reads=len(sample))
    st = db.table_stats(TABLE)
    assert (st["gets"], st["gets_absent"], st["absent_share"]) == (len(sample), 0, 0.0)


def test_tombstone_found_in_block_is_a_true_positive_and_an_absent_read(db):
    t = db.table(TABLE)
    before = counters(only_info(db))
    for i in TOMBSTONE_IDX:
        assert t.get(key(STRIDE * i)) is None
    d = delta(counters(only_info(db)), before)
    assert d == zero(true_positives=len(TOMBSTONE_IDX), block_reads=len(TOMBSTONE_IDX))
    st = db.table_stats(TABLE)
    assert st["gets"] == st["gets_absent"] == len(TOMBSTONE_IDX)


def test_out_of_range_gets_are_range_skips_only(db):
    t = db.table(TABLE)
    before = counters(only_info(db))
    keys = BELOW_RANGE + ABOVE_RANGE
    for k_ in keys:
        assert t.get(k_) is None
    d = delta(counters(only_info(db)), before)
    assert d == zero(range_skips=len(keys))
    assert only_info(db).measured_fpr is None


def test_memtable_hits_touch_no_file_counter_but_count_as_gets(db):
    t = db.table(TABLE)
    t.put(b"k000000001", b"in-memtable")     # inside the file's range, not in the file
    t.delete(key(0))                          # shadows a present key
    before = counters(only_info(db))
    assert t.get(b"k000000001") == b"in-memtable"
    assert t.get(key(0)) is None
    assert counters(only_info(db)) == before
    st = db.table_stats(TABLE)
    assert (st["gets"], st["gets_absent"], st["absent_share"]) == (2, 1, 0.5)


def test_mixed_workload_table_stats_exact(db):
    t = db.table(TABLE)
    model = FilterModel(only_info(db).path)
    present = [key(STRIDE * i) for i in PRESENT_IDX[:3000]]
    tombs = [key(STRIDE * i) for i in TOMBSTONE_IDX]
    absent = ABSENT_IN_RANGE[:4000]
    outside = BELOW_RANGE + ABOVE_RANGE
    for k_ in present + tombs + absent + outside:
        t.get(k_)
    fp = sum(1 for k_ in absent if model.may_contain(k_))
    info = only_info(db)
    assert counters(info) == zero(
        range_skips=len(outside), filter_negatives=len(absent) - fp,
        true_positives=len(present) + len(tombs), false_positives=fp,
        block_reads=len(present) + len(tombs) + fp)
    tp, tn = len(present) + len(tombs), len(absent) - fp
    assert info.measured_fpr == pytest.approx(fp / len(absent))
    assert info.false_ratio == pytest.approx(fp / (tp + fp + tn))
    gets = len(present) + len(tombs) + len(absent) + len(outside)
    gets_absent = len(tombs) + len(absent) + len(outside)
    st = db.table_stats(TABLE)
    assert st["gets"] == gets and st["gets_absent"] == gets_absent
    assert st["absent_share"] == pytest.approx(gets_absent / gets)
    assert st["false_ratio"] == pytest.approx(fp / (tp + fp + tn))
    assert st["range_skips"] == len(outside)
    assert st["files"] == 1 and st["entries"] == N
    # reading the counters never resets them
    assert counters(only_info(db)) == counters(info)
    assert db.table_stats(TABLE) == st


def test_trace_touches_no_counter(db):
    t = db.table(TABLE)
    t.get(ABSENT_IN_RANGE[0])
    before = counters(only_info(db))
    st_before = db.table_stats(TABLE)
    for k_ in ABSENT_IN_RANGE[:200] + [key(0), key(STRIDE * 5)] + BELOW_RANGE[:5]:
        db.trace(k_, TABLE)
    assert counters(only_info(db)) == before
    assert db.table_stats(TABLE) == st_before


# --------------------------------------------------------------------- several files
def build_three_files(db) -> None:
    """Two more SSTables in 't', with key ranges disjoint from the first file's."""
    t = db.table(TABLE)
    for prefix in (b"m", b"p"):
        with db.batch() as b:
            for i in range(500):
                b.put(prefix + b"%06d" % (2 * i), b"x%d" % i, table=TABLE)
        t.flush()
    assert len(db.sstables(TABLE)) == 3


def mixed_gets(t, seed_offset: int = 0) -> None:
    for i in range(0, 2000, 3):
        t.get(key(STRIDE * PRESENT_IDX[i + seed_offset]))
    for k_ in ABSENT_IN_RANGE[seed_offset:seed_offset + 3000]:
        t.get(k_)
    for i in range(1000):
        t.get(b"m%06d" % (i + seed_offset))      # even: present, odd: absent
    for i in range(0, 1000, 2):
        t.get(b"p%06d" % (i + 1 + seed_offset))  # odd: absent
    for k_ in BELOW_RANGE + ABOVE_RANGE:
        t.get(k_)


def snapshot(db) -> dict[str, dict[str, int]]:
    """Every persisted counter of every file."""
    return {i.file: {c: getattr(i, c) for c in lsmdb.stats.FILE_COUNTERS}
            for i in db.sstables(TABLE)}


def test_three_files_exact_range_skips(db):
    build_three_files(db)
    t = db.table(TABLE)
    before = snapshot(db)
    infos = {i.min_key[:1]: i.file for i in db.sstables(TABLE)}
    # a present key of the oldest file: both newer files skip it by range
    for i in PRESENT_IDX[:100]:
        assert t.get(key(STRIDE * i)) == value(i)
    after = snapshot(db)
    assert delta(after[infos[b"k"]], before[infos[b"k"]]) == zero(true_positives=100,
                                                                  block_reads=100)
    assert delta(after[infos[b"m"]], before[infos[b"m"]]) == zero(range_skips=100)
    assert delta(after[infos[b"p"]], before[infos[b"p"]]) == zero(range_skips=100)


def test_counters_equal_after_close_and_reopen_and_keep_growing(dbpath):
    db = open_db(dbpath, auto_compaction=False)
    build_three_files(db)
    t = db.table(TABLE)
    mixed_gets(t)
    snap = snapshot(db)
    st = db.table_stats(TABLE)
    assert len(snap) == 3
    assert all(sum(c.values()) > 0 for c in snap.values()), snap
    assert any(c["range_skips"] for c in snap.values())
    assert any(c["false_positives"] for c in snap.values())
    assert any(c["filter_negatives"] for c in snap.values())
    assert any(c["true_positives"] for c in snap.values())
    db.close()

    # the STATS file holds exactly these numbers
    files, tables = lsmdb.stats.load_stats(dbpath)
    by_number = {f"{n:06d}.sst": dict(zip(lsmdb.stats.FILE_COUNTERS, v, strict=True))
                 for n, v in files.items()}
    for name, c in snap.items():
        assert by_number[name] == c
    assert [st["gets"], st["gets_absent"]] in [v[:2] for v in tables.values()]

    db = open_db(dbpath, auto_compaction=False)
    try:
        assert snapshot(db) == snap
        st2 = db.table_stats(TABLE)
        for f in ("gets", "gets_absent", "absent_share", "range_skips", "filter_negatives",
                  "true_positives", "false_positives", "block_reads", "measured_fpr",
                  "false_ratio"):
            assert st2[f] == st[f], f
        # a read-only open sees the same persisted counters
        ro = open_db(dbpath, read_only=True)
        try:
            assert snapshot(ro) == snap
            assert ro.table_stats(TABLE)["gets"] == st["gets"]
        finally:
            ro.close()

        # monotonic: the same workload again adds exactly what it added the first time
        t = db.table(TABLE)
        mixed_gets(t)
        snap2 = snapshot(db)
        for name in snap:
            for c in COUNTERS:
                assert snap2[name][c] == 2 * snap[name][c], (name, c)
        st3 = db.table_stats(TABLE)
        assert st3["gets"] == 2 * st["gets"] and st3["gets_absent"] == 2 * st["gets_absent"]
    finally:
        db.close()

    db = open_db(dbpath, auto_compaction=False)
    try:
        assert snapshot(db) == snap2
        assert db.table_stats(TABLE)["gets"] == 2 * st["gets"]
    finally:
        db.close()


# --------------------------------------------------------------------- when STATS is written
def current_file_lists(db) -> dict[str, list[int]]:
    return {i.file: [getattr(i, c) for c in lsmdb.stats.FILE_COUNTERS] for i in db.sstables()}


def stats_on_disk(path: str) -> tuple[dict[str, list[int]], dict[int, list[int]]]:
    files, tables = lsmdb.stats.load_stats(path)
    return {f"{n:06d}.sst": v for n, v in files.items()}, tables


def test_counters_persisted_by_periodic_save_without_close(dbpath, monkeypatch):
    monkeypatch.setattr(lsmdb.stats, "STATS_INTERVAL_SECONDS", 0.2)
    db = open_db(dbpath, auto_compaction=False)
    try:
        t = db.table(TABLE)
        for k_ in ABSENT_IN_RANGE[:2000] + [key(STRIDE * i) for i in PRESENT_IDX[:300]] \
                + BELOW_RANGE:
            t.get(k_)
        want_files = current_file_lists(db)
        st = db.table_stats(TABLE)
        want_table = [st["gets"], st["gets_absent"]]
        assert st["gets"] > 0 and sum(next(iter(want_files.values()))) > 0
        deadline = time.monotonic() + 8.0
        while True:
            files, tables = stats_on_disk(dbpath)
            ok = all(files.get(name) == v for name, v in want_files.items()) \
                and want_table in [v[:2] for v in tables.values()]
            if ok or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert ok, (f"STATS not saved periodically: on disk {files} {tables}, "
                    f"in memory {want_files} {want_table}")
        assert not db.closed
    finally:
        db.close()


def test_counters_persisted_at_flush(db, dbpath):
    t = db.table(TABLE)
    for k_ in ABSENT_IN_RANGE[:1000] + BELOW_RANGE:
        t.get(k_)
    want = current_file_lists(db)
    st = db.table_stats(TABLE)
    t.put(b"x", b"y")
    t.flush()
    files, tables = stats_on_disk(dbpath)
    for name, v in want.items():
        assert files[name] == v
    assert [st["gets"], st["gets_absent"]] in [v[:2] for v in tables.values()]


def test_counters_persisted_at_compaction(db, dbpath):
    t = db.table(TABLE)
    for k_ in ABSENT_IN_RANGE[:1000] + [key(STRIDE * i) for i in PRESENT_IDX[:100]]:
        t.get(k_)
    st = db.table_stats(TABLE)
    old = {i.file for i in db.sstables(TABLE)}
    db.compact(TABLE)   # memtable empty: no flush, only the compaction saves
    new = {i.file for i in db.sstables(TABLE)}
    assert new and not (new & old)
    files, tables = stats_on_disk(dbpath)
    assert [st["gets"], st["gets_absent"]] in [v[:2] for v in tables.values()]
    for name in new:
        assert files[name] == [0] * len(lsmdb.stats.FILE_COUNTERS)
    # a compaction output starts from zero; the table's read counters carry on
    assert all(sum(counters(i).values()) == 0 for i in db.sstables(TABLE))
    assert db.table_stats(TABLE)["gets"] == st["gets"]


@pytest.mark.parametrize("damage", ["garbage", "truncated", "flipped_payload_byte", "bad_magic",
                                    "empty"])
def test_corrupt_stats_file_is_ignored_with_a_warning(dbpath, caplog, damage):
    db = open_db(dbpath, auto_compaction=False)
    t = db.table(TABLE)
    for k_ in ABSENT_IN_RANGE[:500] + BELOW_RANGE:
        t.get(k_)
    db.close()
    stats_path = os.path.join(dbpath, lsmdb.stats.STATS_NAME)
    with open(stats_path, "rb") as f:
        data = bytearray(f.read())
    assert lsmdb.stats.load_stats(dbpath)[0]  # sound before the damage
    if damage == "garbage":
        data = bytearray(b"this is not a stats file at all" * 3)
    elif damage == "truncated":
        data = data[:len(data) - 3]
    elif damage == "flipped_payload_byte":
        data[-1] ^= 0x40
    elif damage == "bad_magic":
        data[0] ^= 0xFF
    elif damage == "empty":
        data = bytearray()
    with open(stats_path, "wb") as f:
        f.write(bytes(data))

    caplog.set_level(logging.WARNING, logger="lsmdb")
    db = open_db(dbpath, auto_compaction=False)
    try:
        assert any(r.levelno >= logging.WARNING and "STATS" in r.getMessage()
                   for r in caplog.records), [r.getMessage() for r in caplog.records]
        assert counters(only_info(db)) == zero()
        st = db.table_stats(TABLE)
        assert st["gets"] == 0 and st["gets_absent"] == 0 and st["absent_share"] is None
        # the data is intact and counting restarts from zero
        t = db.table(TABLE)
        assert t.get(key(STRIDE * PRESENT_IDX[0])) == value(PRESENT_IDX[0])
        for k_ in BELOW_RANGE:
            t.get(k_)
        assert counters(only_info(db)) == zero(true_positives=1, block_reads=1,
                                               range_skips=len(BELOW_RANGE))
    finally:
        db.close()
    # close rewrote a sound STATS file
    db = open_db(dbpath, auto_compaction=False)
    try:
        assert counters(only_info(db)) == zero(true_positives=1, block_reads=1,
                                               range_skips=len(BELOW_RANGE))
    finally:
        db.close()


# --------------------------------------------------------------------- shadow mode
def test_shadow_mode_reads_the_block_anyway_and_answers_correctly(db):
    db.alter_table(TABLE, bloom_filter_mode="shadow")
    assert db.table(TABLE).options.bloom_filter_mode == "shadow"
    t = db.table(TABLE)
    model = FilterModel(only_info(db).path)
    absent = ABSENT_IN_RANGE[:6000]
    expected_fp = sum(1 for k_ in absent if model.may_contain(k_))
    before = counters(only_info(db))
    for k_ in absent:
        assert t.get(k_) is None
    d = delta(counters(only_info(db)), before)
    assert d["block_reads"] == len(absent)              # every in-range get read a block
    assert d["filter_negatives"] == len(absent) - expected_fp
    assert d["false_positives"] == expected_fp
    assert d["filter_negatives"] > 0.9 * len(absent)
    assert d["false_negatives"] == 0 and d["true_positives"] == 0 and d["range_skips"] == 0

    before = counters(only_info(db))
    for i in PRESENT_IDX[:2000]:
        assert t.get(key(STRIDE * i)) == value(i)
    for i in TOMBSTONE_IDX:
        assert t.get(key(STRIDE * i)) is None
    for k_ in BELOW_RANGE:
        assert t.get(k_) is None
    d = delta(counters(only_info(db)), before)
    n = 2000 + len(TOMBSTONE_IDX)
    assert d == zero(true_positives=n, block_reads=n, range_skips=len(BELOW_RANGE))
    st = db.table_stats(TABLE)
    assert st["false_negatives"] == 0

    # the mode is a persisted table option
    db.close()
    with open_db(db.path, auto_compaction=False) as again:
        assert again.table(TABLE).options.bloom_filter_mode == "shadow"
        before = counters(only_info(again))
        assert again.table(TABLE).get(ABSENT_IN_RANGE[-1]) is None
        assert delta(counters(only_info(again)), before)["block_reads"] == 1


def test_active_mode_does_not_read_blocks_the_filter_rejects(db):
    assert db.table(TABLE).options.bloom_filter_mode == "active"
    t = db.table(TABLE)
    model = FilterModel(only_info(db).path)
    rejected = [k_ for k_ in ABSENT_IN_RANGE[:3000] if not model.may_contain(k_)]
    before = counters(only_info(db))
    for k_ in rejected:
        assert t.get(k_) is None
    assert delta(counters(only_info(db)), before) == zero(filter_negatives=len(rejected))


def clear_filter_bit_of(sst_path: str, k: bytes) -> None:
    """Clear the first probed bit of ``k`` in the filter and re-seal the block's CRC."""
    reader = SSTableReader(sst_path)
    off, size = reader.filter_handle
    reader.close()
    model = FilterModel(sst_path)
    pos = model.positions(k)[0]
    with open(sst_path, "r+b") as f:
        f.seek(off)
        payload = bytearray(f.read(size))
        byte = FilterModel.HEADER.size + (pos >> 3)
        assert payload[byte] & (1 << (pos & 7))
        payload[byte] &= ~(1 << (pos & 7)) & 0xFF
        f.seek(off)
        f.write(bytes(payload) + zlib.crc32(bytes(payload)).to_bytes(4, "little"))


def test_shadow_mode_counts_a_false_negative_of_a_broken_filter(tmp_path):
    path = str(tmp_path / "db")
    with open_db(path, auto_compaction=False) as db:
        t = db.create_table(TABLE, bloom_filter_fp_chance=FP_CHANCE)
        with db.batch() as b:
            for i in range(500):
                b.put(key(STRIDE * i), value(i), table=TABLE)
        t.flush()
        sst = only_info(db).path
    victim = key(STRIDE * 250)
    clear_filter_bit_of(sst, victim)
    assert not FilterModel(sst).may_contain(victim)

    with open_db(path, auto_compaction=False) as db:
        info = only_info(db)
        assert info.filter_error is None          # CRC is sound: the filter is in use
        db.alter_table(TABLE, bloom_filter_mode="shadow")
        before = counters(only_info(db))
        assert db.table(TABLE).get(victim) == value(250)   # shadow: answer still correct
        d = delta(counters(only_info(db)), before)
        assert d["false_negatives"] == 1
        assert d["block_reads"] == 1
        assert d["filter_negatives"] == 0 and d["false_positives"] == 0
        assert db.table_stats(TABLE)["false_negatives"] == 1
    with open_db(path, auto_compaction=False, read_only=True) as db:
        assert only_info(db).false_negatives == 1   # persisted


# --------------------------------------------------------------------- no filter
def test_fp_chance_one_means_no_filter_and_every_in_range_get_reads_a_block(tmp_path):
    path = str(tmp_path / "db")
    n = 2000
    with open_db(path, auto_compaction=False) as db:
        t = db.create_table("nf", bloom_filter_fp_chance=1.0, memtable_size_bytes=BIG_MEMTABLE)
        with db.batch() as b:
            for i in range(n):
                b.put(key(STRIDE * i), value(i), table="nf")
        t.flush()
        info = only_info(db, "nf")
        assert info.filter_bits == 0 and info.filter_hashes == 0
        assert info.filter_fp_chance == 1.0 and info.bits_per_key == 0.0
        assert info.predicted_fpr == 1.0
        absent = [key(STRIDE * i + 5) for i in range(n - 1)]
        for k_ in absent:
            assert t.get(k_) is None
        for i in range(0, n, 2):
            assert t.get(key(STRIDE * i)) == value(i)
        outside = [b"a", b"zz"]
        for k_ in outside:
            assert t.get(k_) is None
        info = only_info(db, "nf")
        assert info.filter_negatives == 0
        assert info.block_reads == len(absent) + n // 2
        assert info.false_positives == len(absent)
        assert info.true_positives == n // 2
        assert info.range_skips == len(outside)
        assert info.measured_fpr == 1.0


def test_index_bytes_in_memory_grow_with_the_index(tmp_path):
    """A table's index memory: the sum over its files, each at least the bytes
    of its index keys, and about twice as large for twice the blocks."""
    sizes = []
    for n in (4000, 8000):
        with lsmdb.open(str(tmp_path / str(n)), auto_compaction=False) as db:
            db.create_table("t", block_size_bytes=512, compression="none")
            t = db.table("t")
            for i in range(n):
                t.put(b"key%08d" % i, b"v" * 40)
            db.flush("t")
            reader = db._versions.tables["t"].files[0]
            st = db.table_stats("t")
            assert st["index_bytes_in_memory"] == reader.index_memory_bytes
            assert st["index_bytes_in_memory"] > sum(map(len, reader.index_keys))
            sizes.append(st["index_bytes_in_memory"])
    assert 1.8 < sizes[1] / sizes[0] < 2.2
