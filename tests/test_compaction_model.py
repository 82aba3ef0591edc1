"""Model-based test of compaction: a real lsmdb table against a dict, for both strategies.

Hypothesis drives writes (some with a time to live, on a clock it moves),
reads, scans, flushes, full compactions, fp-chance changes, filter rebuilds,
reopens and waits for the background compaction thread (which runs on its
own after every flush, and so meets expired values above older data).  Every read is compared
with the model; after every step the leveled invariant "levels >= 1 never
overlap" is checked, and after a full compaction or a filter rebuild every
file must carry a filter built at the table's current fp chance.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import lsmdb
from tests.support.clock import Clock

TABLE = "t"
OPTIONS = {"memtable_size_bytes": 4096, "block_size_bytes": 256,
           "target_file_size_bytes": 65536}
FP_CHOICES = [0.1, 0.01, 0.001, 1.0]
WAIT = 60  # seconds: a compaction that never finishes fails instead of hanging

SPECIAL_KEYS = [b"", b"\x00", b"a", b"ab", b"b", b"\xff", b"\xff\xff", b"\xff\x00"]
keys = st.one_of(
    st.sampled_from(SPECIAL_KEYS),
    st.lists(st.sampled_from([0x00, 0x61, 0x62, 0x63, 0xFE, 0xFF]), max_size=3).map(bytes),
)
# Mostly short values, sometimes long ones that fill the 4 KiB memtable within a few puts.
values = st.builds(lambda tag, pad: tag + b"." * pad,
                   st.binary(max_size=6), st.sampled_from([0, 0, 1, 100, 700, 1500]))
bounds = st.one_of(st.none(), keys)


# fsync dominates the run time on a real disk (every flush and compaction fsyncs the
# SSTable, the manifest and the directory); a tmpfs makes those free when there is one.
FAST_TMP = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def bits_per_key_for(p: float) -> float:
    return -math.log(p) / math.log(2) ** 2


def check_levels_do_not_overlap(infos) -> None:
    by_level: dict[int, list] = {}
    for info in infos:
        by_level.setdefault(info.level, []).append(info)
    for level, files in by_level.items():
        if level == 0:
            continue
        files.sort(key=lambda i: i.min_key)
        for a, b in zip(files, files[1:], strict=False):
            assert a.max_key < b.min_key, (
                f"L{level}: {a.file} [{a.min_key!r}, {a.max_key!r}] overlaps "
                f"{b.file} [{b.min_key!r}, {b.max_key!r}]")


class CompactionMachine(RuleBasedStateMachine):
    STRATEGY = "size_tiered"

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="lsmdb-compaction-model-", dir=FAST_TMP)
        self.clock = Clock()
        self.db = lsmdb.open(self.dir, clock=self.clock)
        self.db.create_table(TABLE, compaction=self.STRATEGY, **OPTIONS)
        self.model: dict[bytes, bytes] = {}
        self.expiry: dict[bytes, float] = {}  # when the model's expiring values expire
        self.fp = 0.1 if self.STRATEGY == "leveled" else 0.01
        assert self.t.options.bloom_filter_fp_chance == self.fp

    @property
    def t(self):
        return self.db.table(TABLE)

    def teardown(self) -> None:
        try:
            self.db.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -------------------------------------------------------------- writes
    @rule(key=keys, value=values)
    def put(self, key, value):
        self.t.put(key, value)
        self.model[key] = value
        self.expiry.pop(key, None)

    @rule(start=st.integers(0, 400), n=st.integers(10, 120), step=st.sampled_from([1, 2, 5]),
          size=st.sampled_from([200, 1000, 2500]), tag=st.binary(max_size=3))
    def put_range(self, start, n, step, size, tag):
        """Many keys at once: dozens of flushes, and enough data for several L1 files."""
        for i in range(n):
            key = b"r%04d" % (start + i * step)
            value = tag + b"%d:" % i + b"#" * size
            self.t.put(key, value)
            self.model[key] = value
            self.expiry.pop(key, None)

    @rule(start=st.integers(0, 400), n=st.integers(1, 120), step=st.sampled_from([1, 3]),
          size=st.sampled_from([200, 1000]), ttl=st.sampled_from([0.5, 1.0, 2.0]))
    def put_range_expiring(self, start, n, step, size, ttl):
        """Keys with a time to live, over older versions of theirs in files."""
        for i in range(n):
            key = b"r%04d" % (start + i * step)
            value = b"ttl%d:" % i + b"#" * size
            self.t.put(key, value, ttl=ttl)
            self.model[key] = value
            self.expiry[key] = self.clock.t + ttl

    @rule(step=st.sampled_from([0.5, 1.0, 3.0]))
    def time_passes(self, step):
        self.clock.t += step
        for key in [k for k, t in self.expiry.items() if self.clock.t >= t]:
            del self.expiry[key]
            self.model.pop(key, None)
        self.check_all()

    @rule(start=st.integers(0, 400), n=st.integers(1, 120), step=st.sampled_from([1, 3]))
    def delete_range(self, start, n, step):
        for i in range(n):
            key = b"r%04d" % (start + i * step)
            self.t.delete(key)
            self.model.pop(key, None)
            self.expiry.pop(key, None)

    @rule(key=keys)
    def delete(self, key):
        self.t.delete(key)
        self.model.pop(key, None)
        self.expiry.pop(key, None)

    @rule(data=st.data())
    def delete_existing(self, data):
        if not self.model:
            return
        key = data.draw(st.sampled_from(sorted(self.model)), label="existing key")
        self.t.delete(key)
        del self.model[key]
        self.expiry.pop(key, None)

    @rule(ops=st.lists(st.tuples(keys, st.one_of(st.none(), values)), max_size=8))
    def batch(self, ops):
        with self.db.batch() as b:
            for key, value in ops:
                if value is None:
                    b.delete(key, table=TABLE)
                else:
                    b.put(key, value, table=TABLE)
        for key, value in ops:
            self.expiry.pop(key, None)
            if value is None:
                self.model.pop(key, None)
            else:
                self.model[key] = value

    # -------------------------------------------------------------- reads
    @rule(key=keys)
    def get(self, key):
        assert self.t.get(key) == self.model.get(key)

    @rule(data=st.data())
    def get_present(self, data):
        if not self.model:
            return
        key = data.draw(st.sampled_from(sorted(self.model)), label="present key")
        assert self.t.get(key) == self.model[key]

    @rule(start=bounds, end=bounds, reverse=st.booleans())
    def scan(self, start, end, reverse):
        got = list(self.t.scan(start=start, end=end, reverse=reverse))
        want = sorted((k, v) for k, v in self.model.items()
                      if (start is None or k >= start) and (end is None or k < end))
        if reverse:
            want.reverse()
        assert got == want

    # -------------------------------------------------------------- maintenance
    @rule()
    def flush(self):
        self.t.flush()

    @rule()
    def wait_for_compactions(self):
        self.db.wait_for_compactions(timeout=WAIT)
        self.check_all()

    @rule()
    def compact(self):
        self.db.compact(TABLE)
        self.db.wait_for_compactions(timeout=WAIT)
        infos = self.db.sstables(TABLE)
        if not self.model:
            assert sum(i.entries for i in infos) == 0
        else:
            # a full compaction leaves the bottom of the tree: no tombstone survives
            assert sum(i.tombstones for i in infos) == 0
            assert sum(i.entries for i in infos) == len(self.model)
            assert len({i.level for i in infos}) == 1
            if self.STRATEGY == "size_tiered":
                assert len(infos) == 1
            else:
                assert infos[0].level >= 1
        self.check_filters_current(infos)
        self.check_all()

    @rule(fp=st.sampled_from(FP_CHOICES))
    def alter_table(self, fp):
        self.db.alter_table(TABLE, bloom_filter_fp_chance=fp)
        self.fp = fp
        assert self.t.options.bloom_filter_fp_chance == fp
        for info in self.db.sstables(TABLE):
            assert info.table_fp_chance == fp
            assert info.filter_stale == (info.filter_fp_chance != fp)

    @rule()
    def rebuild_filters(self):
        self.db.wait_for_compactions(timeout=WAIT)
        before = self.db.sstables(TABLE)
        stale = [i for i in before if i.filter_stale]
        fresh = {i.file for i in before if not i.filter_stale}
        n = self.db.rebuild_filters(TABLE)
        assert n == len(stale)
        after = self.db.sstables(TABLE)
        assert len(after) == len(before)
        # files that were not stale are untouched; stale ones were replaced
        assert fresh <= {i.file for i in after}
        assert not ({i.file for i in stale} & {i.file for i in after})
        self.check_filters_current(after)
        assert self.db.rebuild_filters(TABLE) == 0
        self.check_all()

    @rule()
    def reopen(self):
        self.db.close()
        self.db = lsmdb.open(self.dir, clock=self.clock)
        assert self.t.options.bloom_filter_fp_chance == self.fp
        assert self.t.options.compaction == self.STRATEGY
        self.check_all()

    # -------------------------------------------------------------- checks
    def check_filters_current(self, infos) -> None:
        for info in infos:
            assert not info.filter_stale, info
            assert info.filter_fp_chance == self.fp, info
            if self.fp == 1.0:
                assert info.filter_bits == 0, info
            else:
                assert info.filter_bits >= info.entries * bits_per_key_for(self.fp) - 1e-9, info
                assert info.filter_bits <= math.ceil(info.entries * bits_per_key_for(self.fp)), \
                    info

    def check_all(self) -> None:
        assert list(self.t.scan()) == sorted(self.model.items())
        for key, value in self.model.items():
            assert self.t.get(key) == value

    @invariant()
    def engine_invariants(self):
        self.db._check()   # tables, memtables, readers, filters, WAL set, block cache

    @invariant()
    def levels_do_not_overlap(self):
        infos = self.db.sstables(TABLE)
        if self.STRATEGY == "leveled":
            check_levels_do_not_overlap(infos)
        else:
            assert all(i.level == 0 for i in infos)


class SizeTieredMachine(CompactionMachine):
    STRATEGY = "size_tiered"


class LeveledMachine(CompactionMachine):
    STRATEGY = "leveled"


_settings = settings(max_examples=30, stateful_step_count=40, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow,
                                            HealthCheck.filter_too_much])
SizeTieredMachine.TestCase.settings = _settings
LeveledMachine.TestCase.settings = _settings

TestSizeTieredCompactionModel = SizeTieredMachine.TestCase
TestLeveledCompactionModel = LeveledMachine.TestCase
