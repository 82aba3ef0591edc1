"""Expiring values: ``ttl=`` and ``default_time_to_live``, on an injected clock.

An expired value reads as absent everywhere the moment it expires -- in the
memtable, in files, through both read paths, in snapshots, scans and exports
-- hides every older version of its key, survives the WAL and a reopen, and
compaction drops it only where nothing older can lie below.  Tests do not
wait for time to pass: the database's clock is a :class:`Clock` the test
moves (one test checks the system clock, a millisecond past an expiry).
"""

from __future__ import annotations

import io
import math

import pytest

import lsmdb
from lsmdb import block as blk
from lsmdb.errors import CorruptionError
from lsmdb.sstable_format import KIND_BITS, KIND_EXPIRING, KIND_TOMBSTONE, KIND_VALUE
from lsmdb.sstable_reader import SSTableReader
from lsmdb.transfer import export_table, export_tables, import_jsonl
from lsmdb.ttl import MAX_EXPIRES, MAX_TTL_SECONDS
from tests.support.clock import T0, Clock


@pytest.fixture
def clock() -> Clock:
    return Clock()


def open_db(path, clock, **kw):
    kw.setdefault("auto_compaction", False)
    return lsmdb.open(path, clock=clock, **kw)


def every_read(db, key, table=None):
    """What each read of ``key`` says: get, get_many, in, scan, iteration,
    a snapshot's get and scan (all must agree)."""
    t = db if table is None else db.table(table)
    with db.snapshot() as snap:
        snap_get = snap.get(key, table=table)
        snap_scan = dict(snap.scan(table=table)).get(key)
        snap_many = snap.get_many([key], table=table)[0]
    return {
        "get": t.get(key),
        "get_many": t.get_many([key])[0],
        "in": key in t,
        "scan": dict(t.scan()).get(key),
        "iter": key in list(t),
        "snapshot.get": snap_get,
        "snapshot.get_many": snap_many,
        "snapshot.scan": snap_scan,
    }


def present(value):
    return {"get": value, "get_many": value, "in": True, "scan": value, "iter": True,
            "snapshot.get": value, "snapshot.get_many": value, "snapshot.scan": value}


ABSENT = {"get": None, "get_many": None, "in": False, "scan": None, "iter": False,
          "snapshot.get": None, "snapshot.get_many": None, "snapshot.scan": None}


@pytest.mark.parametrize("where", ["memtable", "frozen", "file", "compacted"])
def test_a_value_reads_as_absent_from_the_moment_it_expires(tmp_path, clock, impl, where):
    db = open_db(tmp_path / "db", clock)
    db.put(b"k", b"old")
    db.flush()  # an older version below: an expired value must hide it
    db.put(b"k", b"v", ttl=10)
    db.put(b"other", b"x")
    if where == "frozen":
        state = db._default_state
        with db._versions.lock:  # frozen but not flushed: what a slow flush leaves
            state.mem.freeze()
            state.imms = (state.mem,) + state.imms
            state.mem = type(state.mem)()
            state.publish()
    elif where == "file":
        db.flush()
    elif where == "compacted":
        db.compact()
    clock.t = T0 + 9.999999
    assert every_read(db, b"k") == present(b"v")
    clock.t = T0 + 10
    assert every_read(db, b"k") == ABSENT
    assert every_read(db, b"other") == present(b"x")
    assert len(db) == 1
    db.close()


def test_table_and_batch_puts_take_a_ttl_and_the_table_default(tmp_path, clock, impl):
    db = open_db(tmp_path / "db", clock)
    sessions = db.create_table("sessions", default_time_to_live=60)
    sessions.put(b"s1", b"a")                # the table's 60 s
    sessions.put(b"s2", b"b", ttl=5)         # its own
    sessions.put(b"s3", b"c", ttl=0)         # never
    with db.batch() as batch:
        batch.put(b"b1", b"x", table="sessions")           # 60 s
        batch.put(b"b2", b"y", table="sessions", ttl=1.5)  # a float
        batch.put(b"d1", b"z", ttl=2)                      # the default table
        batch.put(b"d2", b"w")                             # never (default 0)
    clock.t = T0 + 1.4
    assert sessions.get(b"b2") == b"y"
    clock.t = T0 + 1.5
    assert sessions.get(b"b2") is None
    clock.t = T0 + 2
    assert db.get(b"d1") is None and db.get(b"d2") == b"w"
    clock.t = T0 + 5
    assert sessions.get(b"s2") is None and sessions.get(b"s1") == b"a"
    clock.t = T0 + 60
    assert [k for k, _ in sessions.scan()] == [b"s3"]
    clock.t = T0 + MAX_TTL_SECONDS
    assert sessions.get(b"s3") == b"c" and db.get(b"d2") == b"w"
    db.close()


def test_changing_the_default_ttl_affects_later_puts_only(tmp_path, clock):
    db = open_db(tmp_path / "db", clock)
    db.put(b"before", b"1")
    db.alter_table("default", default_time_to_live=30)
    db.put(b"after", b"2")
    db.alter_table("default", default_time_to_live=0)
    db.put(b"later", b"3")
    clock.t = T0 + 30
    assert list(db.scan()) == [(b"before", b"1"), (b"later", b"3")]
    db.close()


def test_an_overwrite_and_a_delete_replace_an_expiring_value(tmp_path, clock, impl):
    db = open_db(tmp_path / "db", clock)
    db.put(b"a", b"1", ttl=10)
    db.put(b"a", b"2")            # no longer expires
    db.put(b"b", b"1", ttl=100)
    db.flush()
    db.put(b"b", b"2", ttl=10)    # a shorter life replaces the longer
    db.put(b"c", b"1", ttl=10)
    db.delete(b"c")
    clock.t = T0 + 10
    assert (db.get(b"a"), db.get(b"b"), db.get(b"c")) == (b"2", None, None)
    db.close()


def test_expiring_values_survive_the_wal_and_a_reopen(tmp_path, clock, impl):
    path = tmp_path / "db"
    db = open_db(path, clock)
    db.put(b"wal", b"1", ttl=10, sync=True)
    with db.batch(sync=True) as batch:
        batch.put(b"batch", b"2", ttl=20)
        batch.put(b"plain", b"3")
    db.put(b"file", b"4", ttl=30)
    db.flush()
    db.put(b"wal2", b"5", ttl=40, sync=True)
    db._versions.log.close()  # no flush at close: the WAL is all the memtable has
    db._versions.closed = True
    db._dblock.release()
    again = open_db(path, clock)
    assert [v for _k, v in again.scan()] == [b"2", b"4", b"3", b"1", b"5"]
    expected = {b"wal": 10, b"batch": 20, b"file": 30, b"wal2": 40}
    for key, ttl in expected.items():
        clock.t = T0 + ttl - 0.5
        assert again.get(key) is not None, key
        clock.t = T0 + ttl
        assert again.get(key) is None, key
    assert again.get(b"plain") == b"3"
    again.close()


def test_files_with_expiring_values_are_format_3_the_others_stay_format_2(tmp_path, clock):
    db = open_db(tmp_path / "db", clock)
    db.put(b"a", b"1")
    db.flush()
    db.put(b"b", b"2", ttl=10)
    db.put(b"c", b"3")
    db.flush()
    files = sorted(db.sstables(), key=lambda s: s.file)
    assert [s.format_version for s in files] == [2, 3]
    assert [s.expiring_entries for s in files] == [0, 1]
    r = SSTableReader(files[1].path)
    assert r.version == 3
    keys, values, tags = r.decode_full(0, r.read_raw(0))
    assert keys == [b"b", b"c"]
    assert values[0] == (b"2", round((T0 + 10) * 1e6)) and values[1] == b"3"
    assert [t & 0xFF for t in tags] == [KIND_EXPIRING, KIND_VALUE]
    r.close()
    db.close()


# -- compaction -------------------------------------------------------------

def _tombstones(db):
    return sum(s.tombstones for s in db.sstables())


def test_compaction_above_older_data_keeps_a_tombstone_and_at_the_bottom_drops_it(
        tmp_path, clock, impl):
    db = open_db(tmp_path / "db", clock)
    db.alter_table("default", min_threshold=2, min_sstable_size_bytes=0)
    db.put(b"k", b"old")
    for i in range(500):
        db.put(b"filler%04d" % i, b"x" * 50)
    db.flush()                                   # the big, old file holding k's old value
    db.put(b"k", b"new", ttl=10)
    db.put(b"a", b"1")
    db.flush()
    db.put(b"b", b"2")
    db.put(b"c", b"3")
    db.flush()
    assert len(db.sstables()) == 3
    clock.t = T0 + 10
    db._compactor.run_pending(lambda: False)     # the two small files: not the bottom
    assert len(db.sstables()) == 2
    assert _tombstones(db) == 1                  # k's expired value, now a tombstone
    assert db.get(b"k") is None and b"k" not in dict(db.scan())
    db.compact()                                 # everything: the bottom
    assert _tombstones(db) == 0
    assert sum(s.entries for s in db.sstables()) == 503
    assert db.get(b"k") is None
    assert [s.format_version for s in db.sstables()] == [2]  # nothing expiring is left
    db.close()


def test_compaction_keeps_values_not_yet_expired_with_their_expiry(tmp_path, clock, impl):
    db = open_db(tmp_path / "db", clock)
    for i in range(200):
        db.put(b"k%03d" % i, b"v", ttl=10 + i)
    db.compact()
    clock.t = T0 + 100
    db.compact()
    assert sum(s.entries for s in db.sstables()) == 109  # k000..k090 had expired
    assert db.get(b"k090") is None and db.get(b"k091") == b"v"
    clock.t = T0 + 208.5
    assert list(db.scan()) == [(b"k199", b"v")]
    db.close()


# -- snapshots and scans ------------------------------------------------------

def test_a_snapshot_reads_expiry_on_the_clock_not_as_of_its_moment(tmp_path, clock, impl):
    db = open_db(tmp_path / "db", clock)
    db.put(b"a", b"1", ttl=10)
    db.put(b"b", b"1", ttl=10)
    db.flush()
    with db.snapshot() as snap:
        db.put(b"a", b"2")                       # after the snapshot: not seen
        assert snap.get(b"a") == b"1"
        clock.t = T0 + 10
        assert snap.get(b"a") is None and snap.get(b"b") is None
        assert list(snap.scan()) == [] and b"b" not in snap
    assert db.get(b"a") == b"2"
    db.close()


def test_a_scan_reads_expiry_as_of_its_view(tmp_path, clock):
    db = open_db(tmp_path / "db", clock)
    db.put(b"a", b"1", ttl=10)
    db.put(b"b", b"2", ttl=10)
    it = db.scan()
    clock.t = T0 + 10
    assert list(it) == [(b"a", b"1"), (b"b", b"2")]  # taken before they expired
    assert list(db.scan()) == []
    db.close()


def test_reverse_and_seek_skip_expired_values(tmp_path, clock, impl):
    db = open_db(tmp_path / "db", clock)
    for i in range(100):
        db.put(b"k%03d" % i, b"v%d" % i, ttl=5 if i % 2 else 0)
        if i == 50:
            db.flush()
    clock.t = T0 + 5
    want = [(b"k%03d" % i, b"v%d" % i) for i in range(0, 100, 2)]
    assert list(db.scan()) == want
    assert list(db.scan(reverse=True)) == want[::-1]
    it = db.scan()
    it.seek(b"k051")
    assert next(it) == (b"k052", b"v52")
    db.close()


# -- validation -----------------------------------------------------------------

@pytest.mark.parametrize("ttl,error", [(-1, ValueError), (math.nan, ValueError),
                                       (math.inf, ValueError),
                                       (MAX_TTL_SECONDS + 1, ValueError),
                                       (True, TypeError), ("10", TypeError)])
def test_a_bad_ttl_is_refused_and_writes_nothing(tmp_path, clock, ttl, error):
    db = open_db(tmp_path / "db", clock)
    with pytest.raises(error, match="ttl"):
        db.put(b"k", b"v", ttl=ttl)
    with pytest.raises(error, match="ttl"):
        with db.batch() as batch:
            batch.put(b"k2", b"v")
            batch.put(b"k", b"v", ttl=ttl)
    assert list(db.scan()) == []
    db.close()


@pytest.mark.parametrize("value,error", [(-1, ValueError), (MAX_TTL_SECONDS + 1, ValueError),
                                         (1.5, TypeError), ("60", TypeError)])
def test_a_bad_default_time_to_live_is_refused(tmp_path, clock, value, error):
    db = open_db(tmp_path / "db", clock)
    with pytest.raises(error, match="default_time_to_live"):
        db.create_table("t", default_time_to_live=value)
    assert db.tables() == ["default"]
    db.close()


def test_a_clock_that_is_not_one_is_refused(tmp_path):
    with pytest.raises(TypeError, match="clock"):
        lsmdb.open(tmp_path / "db", clock=5)
    db = lsmdb.open(tmp_path / "db2", clock=lambda: "noon")
    with pytest.raises(TypeError, match="clock"):
        db.put(b"k", b"v", ttl=1)
    db.close()


@pytest.mark.parametrize("where", ["memtable", "file"])
def test_on_the_system_clock_both_paths_expire_alike(tmp_path, impl, where):
    """The C getter reads the system clock itself (CLOCK_REALTIME), Python through
    time.time_ns: a value a microsecond from expiry is gone, one an hour away is not."""
    import time
    db = lsmdb.open(tmp_path / "db", auto_compaction=False)
    db.put(b"soon", b"1", ttl=1e-6)
    db.put(b"later", b"2", ttl=3600)
    db.put(b"plain", b"3")
    if where == "file":
        db.flush()
    time.sleep(0.001)  # past the microsecond (the one wait in this file: the real clock)
    assert [db.get(k) for k in (b"soon", b"later", b"plain")] == [None, b"2", b"3"]
    assert db.get_many([b"soon", b"later", b"plain"]) == [None, b"2", b"3"]
    db.close()


def test_the_system_clock_by_default(tmp_path):
    import time
    db = lsmdb.open(tmp_path / "db")
    db.put(b"k", b"v", ttl=3600)
    (value, expires), = db._default_state.mem.data.values()
    assert abs(expires / 1e6 - (time.time() + 3600)) < 60
    db.close()


# -- export and import ----------------------------------------------------------

def test_export_carries_the_time_left_and_import_restores_it(tmp_path, clock):
    db = open_db(tmp_path / "src", clock)
    db.create_table("cache", default_time_to_live=60)
    db.table("cache").put(b"k", b"v")
    db.table("cache").put(b"forever", b"f", ttl=0)
    db.put(b"a", b"1", ttl=10)
    db.put(b"gone", b"x", ttl=1)
    db.put(b"b", b"2")
    clock.t = T0 + 4
    out = io.StringIO()
    export_tables(db, "jsonl", out)
    text = out.getvalue()
    assert '"ttl": 6.0' in text and '"ttl": 56.0' in text and "Z29uZQ==" not in text
    cql = io.StringIO()
    export_table(db, "cache", "cql", cql)
    assert "AND default_time_to_live = 60;" in cql.getvalue()
    db.close()

    later = Clock(T0 + 1000)
    dst = open_db(tmp_path / "dst", later)
    assert import_jsonl(dst, None, io.StringIO(text), create_tables=True) == 4
    cache = dst.table("cache")
    assert cache.options.default_time_to_live == 60
    later.t = T0 + 1000 + 5.9
    assert dst.get(b"a") == b"1"
    later.t = T0 + 1000 + 6
    assert dst.get(b"a") is None
    later.t = T0 + 1000 + 56
    assert cache.get(b"k") is None
    later.t = T0 + 1000 + MAX_TTL_SECONDS
    assert cache.get(b"forever") == b"f" and dst.get(b"b") == b"2"  # no default applied
    dst.close()


@pytest.mark.parametrize("ttl", ["-3", '"soon"', "true", "1e300"])
def test_import_of_a_bad_ttl_names_its_line(tmp_path, clock, ttl):
    db = open_db(tmp_path / "db", clock)
    lines = ['{"key": "YQ==", "value": "MQ=="}\n', f'{{"key": "Yg==", "value": "Mg==", '
                                                   f'"ttl": {ttl}}}\n']
    with pytest.raises(ValueError, match="line 2: field 'ttl'"):
        import_jsonl(db, "default", lines)
    assert list(db.scan()) == [(b"a", b"1")]
    db.close()


# -- the block rule of format 3, both paths ------------------------------------

def _payload(values, tags=None, version=3):
    keys = [b"k%d" % i for i in range(len(values))]
    if tags is None:
        tags = blk.tags_for(values, 7)
    return keys, blk.encode_data_payload(keys, values, tags, version)


GOOD = [b"plain", None, (b"exp", 1_700_000_000_000_000), (b"", 1), (b"max", MAX_EXPIRES)]


def test_c_and_python_read_a_format_3_block_alike():
    try:
        from lsmdb import _speedups as sp
    except ImportError:
        pytest.skip("built without the C speedups")
    keys, payload = _payload(GOOD)
    py_keys, py_values = blk.decode_data_block(payload, "f", 0, None, keys[-1], 3)
    assert (py_keys, py_values) == (keys, GOOD)
    assert sp.block_lists(payload, None, keys[-1], 3) == (keys, GOOD)
    full = sp.block_full(payload, None, keys[-1], 3)
    assert full == (keys, GOOD, blk.tags_for(GOOD, 7))
    py_entry = blk.cache_entry(payload, (keys, GOOD))
    c_entry = sp.block_entry(payload, None, keys[-1], 3)
    assert py_entry == c_entry
    for key, value in zip(keys, GOOD, strict=True):
        assert sp.entry_find(c_entry, key, "missing") == value == blk.entry_find(c_entry, key)
    assert sp.entry_find(c_entry, b"zz", "missing") == "missing"
    assert sp.entry_lists(c_entry) == blk.entry_lists(c_entry) == (keys, GOOD)
    assert blk.entry_tagged(c_entry) == (keys, GOOD, blk.tags_for(GOOD, 7))


def _refused_by_both(payload, last, version):
    with pytest.raises(CorruptionError):
        blk.decode_data_block(payload, "f", 0, None, last, version)
    try:
        from lsmdb import _speedups as sp
    except ImportError:
        return
    with pytest.raises(ValueError):
        sp.block_lists(payload, None, last, version)
    with pytest.raises(ValueError):
        sp.block_entry(payload, None, last, version)


def _raw(keys, values, tags, expiries):
    import msgpack
    return msgpack.packb([keys, values, tags, expiries], use_bin_type=True)


@pytest.mark.parametrize("case", ["kind 2 in format 2", "expiry of 0 on kind 2",
                                  "expiry on a plain value", "expiries but no kind 2",
                                  "kind 2 without expiries", "expiries too few",
                                  "expiry past the largest", "kind 2 on a tombstone",
                                  "kind 3"])
def test_format_3_blocks_that_break_the_rule_are_refused_by_both(case):
    keys = [b"a", b"b"]
    values = [b"1", b"2"]
    tags = [1 << KIND_BITS | KIND_VALUE, 2 << KIND_BITS | KIND_EXPIRING]
    expiries = [0, 5]
    version = 3
    if case == "kind 2 in format 2":
        version = 2
    elif case == "expiry of 0 on kind 2":
        expiries = [0, 0]
    elif case == "expiry on a plain value":
        expiries = [3, 5]
    elif case == "expiries but no kind 2":
        tags = [1 << KIND_BITS | KIND_VALUE] * 2
    elif case == "kind 2 without expiries":
        expiries = []
    elif case == "expiries too few":
        expiries = [5]
    elif case == "expiry past the largest":
        expiries = [0, MAX_EXPIRES + 1]
    elif case == "kind 2 on a tombstone":
        values = [b"1", None]
    elif case == "kind 3":
        tags = [1 << KIND_BITS | KIND_VALUE, 2 << KIND_BITS | 3]
    _refused_by_both(_raw(keys, values, tags, expiries), keys[-1], version)


def test_the_good_raw_block_is_accepted_by_both():
    keys = [b"a", b"b"]
    payload = _raw(keys, [b"1", b"2"], [1 << KIND_BITS | KIND_VALUE,
                                        2 << KIND_BITS | KIND_EXPIRING], [0, 5])
    assert blk.decode_data_block(payload, "f", 0, None, b"b", 3) == (keys, [b"1", (b"2", 5)])
    try:
        from lsmdb import _speedups as sp
    except ImportError:
        return
    assert sp.block_lists(payload, None, b"b", 3) == (keys, [b"1", (b"2", 5)])


def test_a_tombstone_from_an_expired_value_keeps_the_sequence_number():
    from lsmdb.compaction import expired_as_tombstones
    tags = [5 << KIND_BITS | KIND_EXPIRING, 6 << KIND_BITS | KIND_EXPIRING,
            7 << KIND_BITS | KIND_VALUE]
    (keys, values, out_tags), = expired_as_tombstones(
        iter([([b"a", b"b", b"c"], [(b"1", 100), (b"2", 101), b"3"], tags)]), 101)
    assert values == [None, None, b"3"]
    assert out_tags == [5 << KIND_BITS | KIND_TOMBSTONE, 6 << KIND_BITS | KIND_TOMBSTONE,
                        7 << KIND_BITS | KIND_VALUE]


def test_the_wal_record_of_an_expiring_value_is_the_same_bytes_in_c_and_python():
    from lsmdb import logset
    keys = [b"a", b"b", b"c"]
    values = [b"1", None, (b"3", 1_700_000_000_000_000)]
    ops = [(4, k, v) for k, v in zip(keys, values, strict=True)]
    py = logset.encode_record(9, ops)
    assert logset.decode_record(py, "wal", 0) == (9, ops)
    try:
        from lsmdb import _speedups as sp
    except ImportError:
        return
    assert sp.encode_ops(9, 4, keys, values) == py


@pytest.mark.parametrize("bad", [[b"v"], [b"v", 0], [b"v", -1], [b"v", "x"], [1, 5],
                                 [b"v", MAX_EXPIRES + 1], [b"v", 1, 2]])
def test_a_wal_record_with_a_malformed_expiring_value_is_corruption(bad):
    import msgpack

    from lsmdb import logset
    payload = msgpack.packb([3, [[1, b"k", bad]]], use_bin_type=True)
    with pytest.raises(CorruptionError):
        logset.decode_record(payload, "wal", 0)


# -- what an adversarial review found ------------------------------------------

def test_get_many_with_a_clock_that_changes_the_keys_list_answers_not_crashes(tmp_path):
    """A clock of the caller's runs Python code in the middle of the C get_many,
    which must not read the caller's list after that code changed it (a
    subprocess: the failure was a segfault)."""
    import subprocess
    import sys
    import textwrap
    code = textwrap.dedent(f"""
        import lsmdb
        keys, armed = [], [False]
        def clock():
            if armed[0]:
                armed[0] = False
                keys.clear()
            return {T0}
        db = lsmdb.open({str(tmp_path / 'db')!r}, clock=clock, auto_compaction=False)
        db.put(b"k0000", b"v", ttl=100)
        db.put(b"k0001", b"w")
        keys[:] = [b"k%04d" % i for i in range(2000)]
        armed[0] = True
        out = db.get_many(keys)
        assert out[:3] == [b"v", b"w", None] and len(out) == 2000, out[:3]
        db.flush()
        db.get(b"k0000")  # the block is cached
        keys[:] = [b"k%04d" % i for i in range(2000)]
        armed[0] = True
        out = db.get_many(keys)
        assert out[:3] == [b"v", b"w", None] and len(out) == 2000, out[:3]
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and "ok" in r.stdout, (r.returncode, r.stderr[-500:])


def test_overwriting_expiring_values_keeps_the_memtable_size_honest(tmp_path, clock):
    db = open_db(tmp_path / "db", clock, max_total_wal_size_bytes=1 << 30)
    db.alter_table("default", memtable_size_bytes=4096)
    state = db._default_state
    for _ in range(5_000):
        db.put(b"k", b"", ttl=30)       # the README's remembered miss, refreshed
    one = len(b"k") + 64 + 88  # one key, an expiring empty value (its tuple and int: 88)
    assert state.mem.size_bytes == one
    with db.batch() as batch:
        for _ in range(100):
            batch.put(b"k", b"", ttl=30)
    for _ in range(100):
        with db.batch() as batch:
            batch.put(b"k", b"x" * 10, ttl=30)
    assert state.mem.size_bytes == one + 10
    n = 0
    while not db.sstables():            # the memtable flushes at its size, not 16 times it
        db.put(b"key%06d" % n, b"x" * 100)
        n += 1
    assert n * 109 < 2 * 4096, n
    db.close()


def test_a_hot_expiring_key_flushes_no_more_often_than_a_plain_one(tmp_path, clock):
    files = {}
    for ttl in (None, 100):
        db = open_db(tmp_path / f"db{ttl}", clock)
        db.alter_table("default", memtable_size_bytes=64 * 1024)
        for _ in range(2000):
            db.put(b"session", b"v" * 1000, ttl=ttl)
        files[ttl] = len(db.sstables())
        db.close()
    assert files[100] == files[None], files


def test_lsmdb_sstable_keys_shows_expiring_values(tmp_path, clock, lsmdb_cli):
    import json
    db = open_db(tmp_path / "db", clock)
    db.put(b"a", b"1", ttl=10)
    db.put(b"b", b"2")
    db.flush()
    path = db.sstables()[0].path
    db.close()
    r = lsmdb_cli("sstable", path, "--keys", "--json")
    assert r.returncode == 0, r.stderr
    entries = json.loads(r.stdout)["entries"]
    assert entries == [{"key": "61", "value": "31", "expires": round((T0 + 10) * 1e6)},
                       {"key": "62", "value": "32"}]
    r = lsmdb_cli("sstable", path, "--keys")
    assert r.returncode == 0 and "b'a' -> b'1' (expires 2023-11-14T22:13:30" in r.stdout


def test_dbm_len_follows_expiry(tmp_path, clock):
    import lsmdb.dbm
    db = open_db(tmp_path / "db", clock)
    db.alter_table("default", default_time_to_live=1)
    d = lsmdb.dbm.Database(db, read_only=False)
    assert len(d) == 0
    d[b"a"] = b"1"
    assert len(d) == 1
    clock.t = T0 + 1
    assert len(d) == 0 and d.keys() == []
    d.close()


def test_an_export_after_the_clock_went_back_still_imports(tmp_path, clock):
    db = open_db(tmp_path / "a", clock)
    db.put(b"k", b"v", ttl=MAX_TTL_SECONDS)
    clock.t -= 1                         # the clock set back (NTP)
    out = io.StringIO()
    export_table(db, None, "jsonl", out, options=False)
    assert f'"ttl": {float(MAX_TTL_SECONDS)}' in out.getvalue()
    dst = open_db(tmp_path / "b", clock)
    assert import_jsonl(dst, None, io.StringIO(out.getvalue())) == 1
    db.close()
    dst.close()


def test_trace_of_an_expired_value_in_a_file_says_tombstone(tmp_path, clock, impl):
    db = open_db(tmp_path / "db", clock)
    db.put(b"k", b"new", ttl=10)
    db.flush()
    clock.t = T0 + 10
    out = db.trace(b"k")
    assert out["result"] == "deleted"
    assert out["steps"][-1]["result"] == "tombstone", out["steps"]
    db.close()


def test_a_clock_that_fails_does_not_touch_a_database_without_ttl(tmp_path):
    """Scans and compactions ask the clock only where a value may expire."""
    def broken() -> float:
        raise RuntimeError("no clock")
    db = lsmdb.open(tmp_path / "db", clock=broken, auto_compaction=False)
    for i in range(50):
        db.put(b"k%02d" % i, b"v")
        if i % 10 == 9:
            db.flush()
    assert len(list(db.scan())) == 50
    db.compact()
    assert db.get(b"k07") == b"v"
    with pytest.raises(RuntimeError, match="no clock"):
        db.put(b"t", b"v", ttl=5)
    db.close()


def test_verify_counts_the_expiring_entries_against_the_properties(tmp_path, clock):
    from lsmdb.verify import verify_database
    db = open_db(tmp_path / "db", clock)
    db.put(b"a", b"1", ttl=10)
    db.put(b"b", b"2")
    db.flush()
    db.close()
    assert verify_database(str(tmp_path / "db")) == []


def test_lsmdb_put_takes_a_ttl(tmp_path, lsmdb_cli):
    path = str(tmp_path / "db")
    assert lsmdb_cli("put", path, "k", "v", "--ttl", "3600", "--create").returncode == 0
    assert lsmdb_cli("put", path, "plain", "v").returncode == 0
    bad = lsmdb_cli("put", path, "k2", "v", "--ttl", "-1")
    assert bad.returncode == 1 and "--ttl must be between 0" in bad.stderr
    with lsmdb.open(path) as db:
        assert (db.get(b"k"), db.get(b"plain"), db.get(b"k2")) == (b"v", b"v", None)
        db.flush()
        (info,) = db.sstables()
        assert (info.entries, info.expiring_entries) == (2, 1)
