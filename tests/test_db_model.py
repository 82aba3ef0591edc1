"""Model-based test: a real lsmdb database against a dict of dicts.

Hypothesis drives puts, deletes, batches, reads, scans, flushes, reopens,
snapshots, puts with a time to live on a clock it moves, and table
creation/dropping; every read is compared with the model.  Tables use
tiny memtables and blocks so that automatic flushes, multi-block SSTables and
several layers of files happen within a few steps, and keys come from a small
alphabet so that overwrites and deletes collide with older versions.
"""

from __future__ import annotations

import shutil
import tempfile
from unittest import mock

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import lsmdb
from tests.conftest import SMALL
from tests.support.clock import Clock

EXTRA_TABLES = ["t1", "t2", "t3"]

SPECIAL_KEYS = [b"", b"\x00", b"a", b"ab", b"b", b"\xff", b"\xff\xff", b"\xff\xff\xff",
                b"\xff\x00"]
keys = st.one_of(
    st.sampled_from(SPECIAL_KEYS),
    st.lists(st.sampled_from([0x00, 0x61, 0x62, 0xFE, 0xFF]), max_size=3).map(bytes),
)
# Mostly short values, sometimes long ones that fill a 4 KiB memtable quickly.
values = st.builds(lambda tag, pad: tag + b"." * pad,
                   st.binary(max_size=6), st.sampled_from([0, 0, 0, 1, 100, 400, 700, 1500]))
bounds = st.one_of(st.none(), keys)
#: Every compression kind: a table's data blocks stored as each (values padded up to 1,500
#: bytes of one byte shrink; short ones do not, and are stored as they are).
COMPRESSION = st.sampled_from(["lz4", "zstd", "none"])
#: Times to live and clock steps, halves of a second: exact in a float, so the model's
#: "expired" is the engine's to the microsecond.
TTLS = st.sampled_from([0.5, 1.0, 2.0, 5.0])
STEPS = st.sampled_from([0.5, 1.0, 3.0])


class DBMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # fsync only matters for power loss, which this test does not simulate;
        # skipping it keeps hundreds of flushes and reopens fast on busy disks.
        self._no_fsync = mock.patch("os.fsync")
        self._no_fsync.start()
        self.dir = tempfile.mkdtemp(prefix="lsmdb-model-")
        try:
            # Compaction only when a rule asks for it, so a failing run replays exactly.
            self.clock = Clock()
            self.db = lsmdb.open(self.dir, auto_compaction=False, clock=self.clock)
        except BaseException:
            self._no_fsync.stop()
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        self.db.alter_table("default", **SMALL)
        self.model: dict[str, dict[bytes, bytes]] = {"default": {}}
        # every key ever written (put or deleted) per table: the keys whose
        # older versions or tombstones sit in files and must not resurface
        self.written: dict[str, set[bytes]] = {"default": set()}
        # when each expiring value of the model expires (clock seconds), per table
        self.expiry: dict[str, dict[bytes, float]] = {"default": {}}
        # live snapshots, what every table held when each was taken, and its expiries
        self.snaps: list[tuple[lsmdb.Snapshot, dict[str, dict[bytes, bytes]]]] = []
        self.snap_expiry: list[dict[str, dict[bytes, float]]] = []

    def teardown(self) -> None:
        try:
            for snap, _m in self.snaps:
                snap.close()
            self.db.close()
        finally:
            self._no_fsync.stop()
            shutil.rmtree(self.dir, ignore_errors=True)

    # -------------------------------------------------------------- helpers
    def _table(self, data) -> str:
        return data.draw(st.sampled_from(sorted(self.model)), label="table")

    def _set(self, name: str, key: bytes, value: bytes | None, ttl: float | None = None) -> None:
        self.written[name].add(key)
        self.expiry[name].pop(key, None)
        if value is None:
            self.model[name].pop(key, None)
        else:
            self.model[name][key] = value
            if ttl:
                self.expiry[name][key] = self.clock.t + ttl

    def _check_everything(self) -> None:
        """Every table: a point read of every key ever written, and full scans."""
        for name, m in self.model.items():
            t = self.db.table(name)
            probe = sorted(self.written[name] | set(SPECIAL_KEYS))
            for key in probe:
                assert t.get(key) == m.get(key), (name, key)
            assert t.get_many(probe) == [m.get(k) for k in probe]
            want = sorted(m.items())
            assert list(t.scan()) == want
            assert list(t.scan(reverse=True)) == want[::-1]

    # -------------------------------------------------------------- tables
    @initialize(fp=st.sampled_from([0.01, 0.1, 1.0]), compression=COMPRESSION,
                default_compression=COMPRESSION)
    def start_with_a_table(self, fp, compression, default_compression):
        self.db.alter_table("default", compression=default_compression)
        self.db.create_table("t1", bloom_filter_fp_chance=fp, compression=compression, **SMALL)
        self.model["t1"] = {}
        self.written["t1"] = set()
        self.expiry["t1"] = {}

    @rule(name=st.sampled_from(EXTRA_TABLES), fp=st.sampled_from([0.001, 0.01, 0.1, 1.0]),
          compression=COMPRESSION)
    def create_table(self, name, fp, compression):
        if name in self.model:
            try:
                self.db.create_table(name, bloom_filter_fp_chance=fp, **SMALL)
            except lsmdb.TableExistsError:
                return
            raise AssertionError(f"create_table({name!r}) twice did not raise")
        t = self.db.create_table(name, bloom_filter_fp_chance=fp, compression=compression,
                                 **SMALL)
        self.model[name] = {}
        self.written[name] = set()
        self.expiry[name] = {}
        # a table created (possibly re-created after a drop) starts empty
        assert list(t.scan()) == []
        assert self.db.sstables(name) == []

    @precondition(lambda self: len(self.model) > 1)
    @rule(data=st.data())
    def drop_table(self, data):
        name = data.draw(st.sampled_from(sorted(set(self.model) - {"default"})), label="drop")
        self.db.drop_table(name)
        del self.model[name]
        del self.written[name]
        del self.expiry[name]
        try:
            self.db.table(name)
        except lsmdb.NoSuchTableError:
            pass
        else:
            raise AssertionError(f"table {name!r} still there after drop_table")

    # -------------------------------------------------------------- writes
    @rule(data=st.data(), key=keys, value=values)
    def put(self, data, key, value):
        name = self._table(data)
        self.db.table(name).put(key, value)
        self._set(name, key, value)

    @rule(data=st.data(), batch=st.lists(st.tuples(keys, values), min_size=1, max_size=25))
    def put_many(self, data, batch):
        """Many single puts to one table: fills memtables, so flushes happen on their own."""
        name = self._table(data)
        t = self.db.table(name)
        for key, value in batch:
            t.put(key, value)
            self._set(name, key, value)

    @rule(data=st.data(), key=keys, value=values, ttl=TTLS)
    def put_with_ttl(self, data, key, value, ttl):
        name = self._table(data)
        if data.draw(st.booleans(), label="in a batch"):
            with self.db.batch() as b:
                b.put(key, value, table=name, ttl=ttl)
        else:
            self.db.table(name).put(key, value, ttl=ttl)
        self._set(name, key, value, ttl)

    @rule(step=STEPS)
    def time_passes(self, step):
        """The clock moves on: what expired reads as absent at once, everywhere."""
        self.clock.t += step
        for model, expiry in [(self.model, self.expiry)] + [
                (m, e) for (_s, m), e in zip(self.snaps, self.snap_expiry, strict=True)]:
            for name, when in expiry.items():
                for key in [k for k, t in when.items() if self.clock.t >= t]:
                    del when[key]
                    model[name].pop(key, None)

    @rule(data=st.data(), key=keys)
    def delete(self, data, key):
        name = self._table(data)
        self.db.table(name).delete(key)
        self._set(name, key, None)

    @rule(data=st.data())
    def delete_existing(self, data):
        """Delete a key that is certainly present (perhaps only in an SSTable)."""
        name = self._table(data)
        present = sorted(self.model[name])
        if not present:
            return
        key = data.draw(st.sampled_from(present), label="existing key")
        self.db.table(name).delete(key)
        self._set(name, key, None)

    @rule(data=st.data(), n=st.integers(0, 6), same_key=st.sampled_from([None, "put-del",
                                                                         "del-put"]))
    def batch(self, data, n, same_key):
        ops = []
        for _ in range(n):
            name = self._table(data)
            key = data.draw(keys, label="key")
            if data.draw(st.booleans(), label="is_put"):
                ops.append((name, key, data.draw(values, label="value")))
            else:
                ops.append((name, key, None))
        if same_key is not None:
            name = self._table(data)
            key = data.draw(keys, label="same key")
            value = data.draw(values, label="same value")
            pair = [(name, key, value), (name, key, None)]
            ops += pair if same_key == "put-del" else pair[::-1]
        with self.db.batch() as b:
            for name, key, value in ops:
                table = None if name == "default" and key[:1] == b"a" else name
                if value is None:
                    b.delete(key, table=table)
                else:
                    b.put(key, value, table=table)
        for name, key, value in ops:
            self._set(name, key, value)

    @rule(data=st.data())
    def aborted_batch(self, data):
        name = self._table(data)
        key = data.draw(keys, label="key")
        try:
            with self.db.batch() as b:
                b.put(key, b"never", table=name)
                b.delete(data.draw(keys, label="key2"), table=name)
                raise RuntimeError("abort")
        except RuntimeError:
            pass

    # -------------------------------------------------------------- reads
    @rule(data=st.data(), key=keys)
    def get(self, data, key):
        name = self._table(data)
        t = self.db.table(name)
        want = self.model[name].get(key)
        assert t.get(key) == want
        assert (key in t) == (want is not None)
        sentinel = b"<absent>"
        assert t.get(key, sentinel) == (sentinel if want is None else want)

    @rule(data=st.data())
    def get_written(self, data):
        """A key written before: present, or deleted with its older versions in files."""
        name = self._table(data)
        if not self.written[name]:
            return
        key = data.draw(st.sampled_from(sorted(self.written[name])), label="written key")
        t = self.db.table(name)
        assert t.get(key) == self.model[name].get(key)
        assert (key in t) == (key in self.model[name])

    @rule(data=st.data())
    def get_present(self, data):
        name = self._table(data)
        present = sorted(self.model[name])
        if not present:
            return
        key = data.draw(st.sampled_from(present), label="present key")
        assert self.db.table(name)[key] == self.model[name][key]

    @rule(data=st.data(), start=bounds, end=bounds, prefix=bounds, reverse=st.booleans())
    def scan(self, data, start, end, prefix, reverse):
        name = self._table(data)
        got = list(self.db.table(name).scan(start=start, end=end, prefix=prefix,
                                            reverse=reverse))
        want = sorted((k, v) for k, v in self.model[name].items()
                      if (start is None or k >= start) and (end is None or k < end)
                      and (prefix is None or k.startswith(prefix)))
        if reverse:
            want.reverse()
        assert got == want

    @rule(data=st.data(), reverse=st.booleans(),
          then=st.sampled_from([None, "flush", "compact"]))
    def scan_is_a_snapshot(self, data, reverse, then):
        name = self._table(data)
        t = self.db.table(name)
        it = t.scan(reverse=reverse)
        want = sorted(self.model[name].items())
        if reverse:
            want.reverse()
        key = data.draw(keys, label="key")
        value = data.draw(values, label="value")
        t.put(key, value)
        self._set(name, key, value)
        gone = data.draw(keys, label="deleted key")
        t.delete(gone)
        self._set(name, gone, None)
        if then == "flush":
            t.flush()
        elif then == "compact":
            self.db.compact(name)
        assert list(it) == want

    # -------------------------------------------------------------- flush and reopen
    @rule(data=st.data(), everything=st.booleans(), then_reopen=st.booleans())
    def flush(self, data, everything, then_reopen):
        if everything:
            self.db.flush()
        else:
            self.db.flush(self._table(data))
        self._check_everything()
        if then_reopen:  # what the flush left in the WAL and the manifest must suffice
            self.reopen()

    @rule(data=st.data(), everything=st.booleans())
    def compact(self, data, everything):
        self.db.compact(None if everything else self._table(data))
        self._check_everything()

    @rule()
    def compact_pending(self):
        """What background compaction would do now: buckets of files, not all of them."""
        self.db._compactor.run_pending(lambda: False)
        self._check_everything()

    @rule()
    def reopen(self):
        self.db.close()
        for snap, _m in self.snaps:  # a snapshot ends with its database
            try:
                snap.get(b"k")
            except lsmdb.DatabaseClosedError:
                pass
            else:
                raise AssertionError("a snapshot read its closed database")
            snap.close()
        self.snaps = []
        self.snap_expiry = []
        self.db = lsmdb.open(self.dir, auto_compaction=False, clock=self.clock)
        self._check_everything()

    # -------------------------------------------------------------- snapshots
    @precondition(lambda self: len(self.snaps) < 3)
    @rule()
    def take_snapshot(self):
        self.snaps.append((self.db.snapshot(), {t: dict(m) for t, m in self.model.items()}))
        self.snap_expiry.append({t: dict(e) for t, e in self.expiry.items()})

    @precondition(lambda self: self.snaps)
    @rule(data=st.data())
    def close_snapshot(self, data):
        i = data.draw(st.integers(0, len(self.snaps) - 1), label="snapshot")
        snap, _m = self.snaps.pop(i)
        self.snap_expiry.pop(i)
        snap.close()

    @precondition(lambda self: self.snaps)
    @rule(data=st.data(), start=keys, reverse=st.booleans())
    def seek_in_a_snapshot(self, data, start, reverse):
        snap, m = data.draw(st.sampled_from(self.snaps), label="snapshot")
        name = data.draw(st.sampled_from(sorted(m)), label="table")
        it = snap.scan(table=name, reverse=reverse)
        it.seek(start)
        want = sorted(m[name].items(), reverse=reverse)
        want = [(k, v) for k, v in want if (k <= start if reverse else k >= start)]
        assert list(it) == want

    @invariant()
    def snapshots_hold(self):
        for snap, m in self.snaps:
            for name, want in m.items():
                assert list(snap.scan(table=name)) == sorted(want.items()), name
                probe = sorted(self.written.get(name, set()) | set(want) | set(SPECIAL_KEYS))
                assert snap.get_many(probe, table=name) == [want.get(k) for k in probe]

    # -------------------------------------------------------------- invariants
    @invariant()
    def engine_invariants(self):
        self.db._check()   # tables, memtables, readers, filters, WAL set, block cache

    @invariant()
    def full_scans_agree(self):
        for name, m in self.model.items():
            t = self.db.table(name)
            want = sorted(m.items())
            assert list(t.scan()) == want
            assert list(t.scan(reverse=True)) == want[::-1]

    @invariant()
    def same_tables(self):
        assert self.db.tables() == sorted(self.model)

    @invariant()
    def options_kept(self):
        for name in self.model:
            o = self.db.table(name).options
            assert o.memtable_size_bytes == SMALL["memtable_size_bytes"]
            assert o.block_size_bytes == SMALL["block_size_bytes"]
            for info in self.db.sstables(name):  # written with the table's compression
                assert info.compression == o.compression
                assert info.format_version in (2, 3)  # 3: it holds an expiring value


DBMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestDBModel = DBMachine.TestCase
