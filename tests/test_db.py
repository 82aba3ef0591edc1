"""Focused tests of the public database API: reads, writes, deletes, batches,
tables and their options, flushes, WAL segment retirement, locking, recovery
safety and scans."""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys
import textwrap
from itertools import pairwise

import pytest

import lsmdb
from lsmdb.block import entry_lists
from tests.conftest import SMALL


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "db")


@pytest.fixture
def db(path):
    # No background compaction: these tests look at the files flushes write.
    d = lsmdb.open(path, auto_compaction=False)
    yield d
    d.close()


def reopen(d, auto_compaction=False):
    d.close()
    return lsmdb.open(d.path, auto_compaction=auto_compaction)


def wal_files(p: str) -> list[str]:
    return sorted(n for n in os.listdir(p) if n.startswith("wal-") and n.endswith(".log"))


def sst_files(p: str) -> list[str]:
    return sorted(n for n in os.listdir(p) if n.endswith(".sst"))


def dir_digest(p: str, skip=("LOCK",)) -> dict[str, str]:
    out = {}
    for name in sorted(os.listdir(p)):
        if name in skip:
            continue
        full = os.path.join(p, name)
        if os.path.isdir(full):
            out[name] = "<dir>"
        else:
            with open(full, "rb") as f:
                out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


# ------------------------------------------------------------------ deletes and overwrites

def test_delete_after_flush_hides_the_older_value(db):
    db.put(b"a", b"1")
    db.put(b"k", b"old")
    db.put(b"z", b"26")
    db.flush()
    assert len(db.sstables()) == 1
    db.delete(b"k")
    assert db.get(b"k") is None
    assert b"k" not in db
    assert list(db.scan()) == [(b"a", b"1"), (b"z", b"26")]

    db = reopen(db)  # the tombstone comes back from the WAL
    try:
        assert db.get(b"k") is None
        assert list(db.scan()) == [(b"a", b"1"), (b"z", b"26")]

        db.flush()  # now the tombstone itself is in an SSTable
        infos = db.sstables()
        assert len(infos) == 2
        assert [i.tombstones for i in infos] == [1, 0]  # newest first
        assert db.get(b"k") is None
        assert b"k" not in db
        assert list(db.scan()) == [(b"a", b"1"), (b"z", b"26")]
        assert list(db.scan(reverse=True)) == [(b"z", b"26"), (b"a", b"1")]
        assert list(db.scan(prefix=b"k")) == []

        db = reopen(db)
        assert db.get(b"k") is None
        assert list(db.scan()) == [(b"a", b"1"), (b"z", b"26")]
        assert db.get(b"a") == b"1"

        db.compact()  # merging the files must not bring the old value back
        assert db.get(b"k") is None
        assert list(db.scan()) == [(b"a", b"1"), (b"z", b"26")]
        db = reopen(db)
        assert db.get(b"k") is None
        assert list(db.scan(reverse=True)) == [(b"z", b"26"), (b"a", b"1")]
    finally:
        db.close()


def test_delete_then_put_again_across_flushes(db):
    db.put(b"k", b"v1")
    db.flush()
    db.delete(b"k")
    db.flush()
    db.put(b"k", b"v3")
    db.flush()
    assert db.get(b"k") == b"v3"
    db = reopen(db)
    try:
        assert db.get(b"k") == b"v3"
        assert list(db.scan()) == [(b"k", b"v3")]
    finally:
        db.close()


def test_overwrite_newest_wins_across_several_sstables(db):
    for i in range(5):
        db.put(b"k", b"v%d" % i)
        db.put(b"other%d" % i, b"o%d" % i)
        db.flush()
    assert len(db.sstables()) == 5
    assert db.get(b"k") == b"v4"
    db.put(b"k", b"mem")  # the memtable is newer still
    assert db.get(b"k") == b"mem"
    db.delete(b"k")
    db.flush()
    db.put(b"k", b"v6")
    db.flush()
    db = reopen(db)
    try:
        assert db.get(b"k") == b"v6"
        scan = dict(db.scan())
        assert scan[b"k"] == b"v6"
        assert sorted(scan) == [b"k"] + [b"other%d" % i for i in range(5)]
        db.compact()
        assert len(db.sstables()) < 7
        assert db.get(b"k") == b"v6"
        assert dict(db.scan()) == scan
    finally:
        db.close()


# ------------------------------------------------------------------ keys and values

def test_empty_key(db):
    db.put(b"", b"empty")
    db.put(b"\x00", b"nul")
    assert db.get(b"") == b"empty"
    assert b"" in db
    assert db[b""] == b"empty"
    assert list(db.scan())[0] == (b"", b"empty")
    db.flush()
    db = reopen(db)
    try:
        assert db.get(b"") == b"empty"
        assert list(db.scan(end=b"\x00")) == [(b"", b"empty")]
        assert list(db.scan(reverse=True))[-1] == (b"", b"empty")
        db.delete(b"")
        assert db.get(b"") is None
        db.flush()
        assert db.get(b"") is None
        assert list(db.scan()) == [(b"\x00", b"nul")]
    finally:
        db.close()


def test_empty_value_is_not_a_delete(db):
    db.put(b"k", b"")
    assert db.get(b"k") == b""
    assert b"k" in db
    db.flush()
    assert db.get(b"k", b"default") == b""
    assert list(db.scan()) == [(b"k", b"")]


def test_bytearray_and_memoryview_are_accepted_and_copied(db):
    key = bytearray(b"key")
    value = bytearray(b"value")
    db.put(key, value)
    key[0:3] = b"XXX"
    value[0:5] = b"YYYYY"
    assert db.get(b"key") == b"value"
    assert db.get(b"XXX") is None

    buf = bytearray(b"mv-key")
    vbuf = bytearray(b"mv-value")
    db.put(memoryview(buf), memoryview(vbuf))
    buf[0] = ord("Z")
    vbuf[0] = ord("Z")
    assert db.get(b"mv-key") == b"mv-value"
    assert db.get(memoryview(b"mv-key")) == b"mv-value"
    assert db.get(bytearray(b"key")) == b"value"
    assert bytearray(b"key") in db

    with db.batch() as b:
        bk = bytearray(b"batch")
        b.put(bk, bytearray(b"bv"))
        bk[0] = ord("Q")
    assert db.get(b"batch") == b"bv"

    for k, v in db.scan():
        assert type(k) is bytes and type(v) is bytes
    assert type(db.get(b"key")) is bytes
    db.flush()
    db = reopen(db)
    try:
        assert db.get(b"key") == b"value"
        assert db.get(b"mv-key") == b"mv-value"
        assert db.get(b"batch") == b"bv"
    finally:
        db.close()


def test_str_key_is_a_type_error_with_a_hint(db):
    for call in (lambda: db.put("k", b"v"), lambda: db.get("k"), lambda: db.delete("k"),
                 lambda: db["k"], lambda: "k" in db):
        with pytest.raises(TypeError, match=r"\.encode\(\)"):
            call()
    with pytest.raises(TypeError, match=r"\.encode\(\)"):
        db.put(b"k", "v")
    with pytest.raises(TypeError):
        list(db.scan(start="a"))
    assert list(db.scan()) == []


@pytest.mark.parametrize("bad", [1, None, 1.5, [b"a"], object()])
def test_non_bytes_key_is_a_type_error(db, bad):
    with pytest.raises(TypeError):
        db.put(bad, b"v")
    with pytest.raises(TypeError):
        db.get(bad)
    with pytest.raises(TypeError):
        db.delete(bad)
    with pytest.raises(TypeError):
        db.put(b"k", bad)
    assert list(db.scan()) == []


def test_key_size_limit(db):
    db.put(b"keep", b"1")
    big = b"k" * (lsmdb.MAX_KEY_SIZE_BYTES + 1)
    with pytest.raises(ValueError):
        db.put(big, b"v")
    with pytest.raises(ValueError):
        db.delete(big)
    with pytest.raises(ValueError):
        db.get(big)
    with pytest.raises(ValueError):
        with db.batch() as b:
            b.put(b"in-batch", b"x")
            b.put(big, b"v")
    assert list(db.scan()) == [(b"keep", b"1")]
    limit = b"m" * lsmdb.MAX_KEY_SIZE_BYTES  # exactly at the limit is fine
    db.put(limit, b"ok")
    assert db.get(limit) == b"ok"
    db = reopen(db)
    try:
        assert list(db.scan()) == [(b"keep", b"1"), (limit, b"ok")]
    finally:
        db.close()


def test_value_size_limit(db):
    db.put(b"k", b"small")
    big = bytes(lsmdb.MAX_VALUE_SIZE_BYTES + 1)
    with pytest.raises(ValueError):
        db.put(b"k", big)
    with pytest.raises(ValueError):
        with db.batch() as b:
            b.put(b"other", b"x")
            b.put(b"k", big)
    del big
    assert list(db.scan()) == [(b"k", b"small")]
    db = reopen(db)
    try:
        assert list(db.scan()) == [(b"k", b"small")]
    finally:
        db.close()


# ------------------------------------------------------------------ batches

def test_batch_is_discarded_when_the_block_raises(db):
    db.put(b"a", b"1")
    db.put(b"b", b"2")
    with pytest.raises(RuntimeError):
        with db.batch() as b:
            b.put(b"a", b"changed")
            b.delete(b"b")
            b.put(b"c", b"3")
            raise RuntimeError("abort")
    assert list(db.scan()) == [(b"a", b"1"), (b"b", b"2")]
    db = reopen(db)
    try:
        assert list(db.scan()) == [(b"a", b"1"), (b"b", b"2")]
    finally:
        db.close()


def test_batch_with_an_unknown_table_applies_nothing(db):
    db.put(b"a", b"1")
    with pytest.raises(lsmdb.NoSuchTableError):
        with db.batch() as b:
            b.put(b"a", b"changed")
            b.put(b"x", b"y", table="nope")
    assert db.get(b"a") == b"1"


def test_batch_is_atomic_across_tables_and_survives_reopen(db):
    users = db.create_table("users")
    events = db.create_table("events")
    users.put(b"u1", b"old")
    events.put(b"gone", b"x")
    with db.batch() as b:
        b.put(b"d", b"default-value")
        b.put(b"u1", b"alice", table="users")
        b.put(b"u2", b"bob", table="users")
        b.delete(b"gone", table="events")
        b.put(b"e1", b"login", table="events")
        b.put(b"same", b"first", table="events")
        b.delete(b"same", table="events")  # put + delete of one key: the delete wins
        b.delete(b"other", table="events")
        b.put(b"other", b"last", table="events")  # delete + put: the put wins
        assert len(b) == 9
        assert db.get(b"d") is None  # nothing visible before the commit
        assert users.get(b"u1") == b"old"

    def check(d):
        assert d.get(b"d") == b"default-value"
        assert list(d.table("users").scan()) == [(b"u1", b"alice"), (b"u2", b"bob")]
        assert list(d.table("events").scan()) == [(b"e1", b"login"), (b"other", b"last")]

    check(db)
    db = reopen(db)
    try:
        check(db)
        db.flush()
        db = reopen(db)
        check(db)
    finally:
        db.close()


def test_committed_batch_cannot_be_reused(db):
    b = db.batch()
    b.put(b"a", b"1")
    b.commit()
    with pytest.raises(ValueError):
        b.put(b"b", b"2")
    assert list(db.scan()) == [(b"a", b"1")]


# ------------------------------------------------------------------ mapping protocol

def test_mapping_style_access(db):
    with pytest.raises(KeyError):
        db[b"absent"]
    with pytest.raises(KeyError):
        del db[b"absent"]
    db[b"k"] = b"v"
    assert db[b"k"] == b"v"
    del db[b"k"]
    with pytest.raises(KeyError):
        db[b"k"]
    with pytest.raises(KeyError):
        del db[b"k"]
    db[b"k"] = b"v"
    db.flush()
    del db[b"k"]
    db.flush()
    with pytest.raises(KeyError):
        db[b"k"]
    assert db.get(b"k", b"dflt") == b"dflt"
    t = db.create_table("t")
    with pytest.raises(KeyError):
        t[b"x"]
    with pytest.raises(KeyError):
        del t[b"x"]
    t[b"x"] = b"1"
    assert t[b"x"] == b"1" and b"x" in t and db.get(b"x") is None


@pytest.mark.parametrize("which", ["db", "table"])
def test_iterates_like_a_mapping_in_key_order(db, which):
    """``for k in db`` walks the keys (not ``db[0]``, ``db[1]``...), over memtable and
    SSTables, tombstones hidden; keys/values/items lazily; len counts live keys."""
    db.create_table("t", **SMALL)
    obj = db if which == "db" else db.table("t")
    assert (list(obj), len(obj), bool(obj)) == ([], 0, True)
    want = {}
    for i in reversed(range(300)):
        obj[b"k%04d" % i] = b"v%d" % i
        want[b"k%04d" % i] = b"v%d" % i
    db.flush()
    for i in range(0, 300, 3):
        del obj[b"k%04d" % i]
        del want[b"k%04d" % i]
    obj[b"k0001"] = b"new"
    want[b"k0001"] = b"new"
    expected = sorted(want.items())
    assert [k for k in obj] == [k for k, _ in expected]
    assert list(obj.keys()) == [k for k, _ in expected]
    assert list(obj.values()) == [v for _, v in expected]
    assert list(obj.items()) == expected
    assert list(reversed(obj)) == [k for k, _ in reversed(expected)]
    assert len(obj) == len(want) == 200
    assert dict(obj.items()) == want
    keys = obj.keys()              # lazy: a snapshot taken at the call, read as walked
    obj[b"k9999"] = b"later"
    assert next(keys) == b"k0001" and b"k9999" not in list(keys)


def test_iteration_after_close_is_an_error(path):
    db = lsmdb.open(path)
    db.put(b"k", b"v")
    t = db.create_table("t")
    db.close()
    for obj in (db, t):
        with pytest.raises(lsmdb.DatabaseClosedError):
            list(obj)
        with pytest.raises(lsmdb.DatabaseClosedError):
            len(obj)


# ------------------------------------------------------------------ tables

def test_tables_always_include_default(db):
    assert db.tables() == ["default"]
    db.create_table("b")
    db.create_table("a")
    assert db.tables() == ["a", "b", "default"]
    db.drop_table("b")
    assert db.tables() == ["a", "default"]
    db = reopen(db)
    try:
        assert db.tables() == ["a", "default"]
        assert db.table("default").name == "default"
    finally:
        db.close()


def test_create_table_twice_is_an_error(db):
    db.create_table("t", bloom_filter_fp_chance=0.1)
    with pytest.raises(lsmdb.TableExistsError):
        db.create_table("t")
    with pytest.raises(lsmdb.TableExistsError):
        db.create_table("default")
    db = reopen(db)
    try:
        with pytest.raises(lsmdb.TableExistsError):
            db.create_table("t")
        assert db.table("t").options.bloom_filter_fp_chance == 0.1
    finally:
        db.close()


def test_unknown_table_is_no_such_table_and_key_error(db):
    with pytest.raises(lsmdb.NoSuchTableError):
        db.table("nope")
    with pytest.raises(KeyError):
        db.table("nope")
    assert issubclass(lsmdb.NoSuchTableError, KeyError)
    assert issubclass(lsmdb.NoSuchTableError, lsmdb.LsmdbError)
    with pytest.raises(lsmdb.NoSuchTableError):
        db.drop_table("nope")
    with pytest.raises(lsmdb.NoSuchTableError):
        db.alter_table("nope", bloom_filter_fp_chance=0.1)
    with pytest.raises(lsmdb.NoSuchTableError):
        db.flush("nope")
    with pytest.raises(lsmdb.NoSuchTableError):
        db.sstables("nope")


def test_default_table_cannot_be_dropped(db):
    db.put(b"k", b"v")
    with pytest.raises(ValueError):
        db.drop_table("default")
    assert db.get(b"k") == b"v"
    assert "default" in db.tables()


def test_dropped_table_is_gone_and_recreated_empty(db):
    t = db.create_table("t", **SMALL)
    for i in range(200):
        t.put(b"k%03d" % i, b"v" * 50)
    assert db.sstables("t")
    t.put(b"mem", b"only-in-wal")
    files = [i.path for i in db.sstables("t")]
    db.drop_table("t")
    assert "t" not in db.tables()
    assert not any(os.path.exists(f) for f in files)
    with pytest.raises(lsmdb.NoSuchTableError):
        t.get(b"k000")
    with pytest.raises(lsmdb.NoSuchTableError):
        t.put(b"k", b"v")
    t2 = db.create_table("t")
    assert list(t2.scan()) == []
    assert t2.get(b"mem") is None
    db = reopen(db)
    try:
        assert list(db.table("t").scan()) == []
        assert db.table("t").get(b"mem") is None
    finally:
        db.close()


@pytest.mark.parametrize("name", ["a", "A_b-9", "x" * 64, "0", "_", "-"])
def test_valid_table_names(db, name):
    t = db.create_table(name)
    t.put(b"k", b"v")
    db = reopen(db)
    try:
        assert name in db.tables()
        assert db.table(name).get(b"k") == b"v"
    finally:
        db.close()


@pytest.mark.parametrize("name,exc", [
    ("", ValueError), ("x" * 65, ValueError), ("a/b", ValueError), ("..", ValueError),
    (".", ValueError), ("a b", ValueError), ("é", ValueError), ("a\n", ValueError),
    ("a\x00", ValueError), ("/abs", ValueError),
    (1, TypeError), (None, TypeError), (b"a", TypeError),
])
def test_invalid_table_names(db, path, name, exc):
    before = sorted(os.listdir(path))
    with pytest.raises(exc):
        db.create_table(name)
    assert db.tables() == ["default"]
    assert sorted(os.listdir(path)) == before


# ------------------------------------------------------------------ table options

@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.5, math.nan, math.inf, 1e-9, 1e-60])
def test_bad_fp_chance_is_a_value_error_naming_the_option(db, bad):
    with pytest.raises(ValueError, match="bloom_filter_fp_chance"):
        db.create_table("t", bloom_filter_fp_chance=bad)
    assert "t" not in db.tables()
    with pytest.raises(ValueError, match="bloom_filter_fp_chance"):
        db.alter_table("default", bloom_filter_fp_chance=bad)
    assert db.table("default").options.bloom_filter_fp_chance == 0.01


@pytest.mark.parametrize("bad", ["0.01", b"0.01", None, True, [0.01]])
def test_fp_chance_of_the_wrong_type_is_a_type_error(db, bad):
    with pytest.raises(TypeError, match="bloom_filter_fp_chance"):
        db.create_table("t", bloom_filter_fp_chance=bad)
    assert "t" not in db.tables()


def test_unknown_option_is_a_type_error(db):
    with pytest.raises(TypeError, match="bloom_filter_fp_chanse"):
        db.create_table("t", bloom_filter_fp_chanse=0.01)
    with pytest.raises(TypeError):
        db.alter_table("default", compresion="zstd")
    assert db.tables() == ["default"]


@pytest.mark.parametrize("option,bad", [
    ("block_size_bytes", 255), ("block_size_bytes", 0), ("block_size_bytes", -1),
    ("block_size_bytes", 4 * 1024 * 1024 + 1),
    ("memtable_size_bytes", 4095), ("memtable_size_bytes", 0),
    ("memtable_size_bytes", 1024 ** 3 + 1),
])
def test_size_options_out_of_range(db, option, bad):
    with pytest.raises(ValueError, match=option):
        db.create_table("t", **{option: bad})
    with pytest.raises(ValueError, match=option):
        db.alter_table("default", **{option: bad})
    assert db.tables() == ["default"]


@pytest.mark.parametrize("option,bad", [
    ("block_size_bytes", 4096.0), ("block_size_bytes", "4096"), ("block_size_bytes", True),
    ("memtable_size_bytes", 4096.0), ("memtable_size_bytes", None),
])
def test_size_options_of_the_wrong_type(db, option, bad):
    with pytest.raises(TypeError, match=option):
        db.create_table("t", **{option: bad})


@pytest.mark.parametrize("options", [
    {"bloom_filter_fp_chance": 1e-6}, {"bloom_filter_fp_chance": 1.0},
    {"bloom_filter_fp_chance": 1}, {"block_size_bytes": 256},
    {"block_size_bytes": 4 * 1024 * 1024}, {"memtable_size_bytes": 4096},
    {"memtable_size_bytes": 1024 ** 3},
])
def test_options_at_the_limits_are_accepted(db, options):
    t = db.create_table("t", **options)
    for name, value in options.items():
        assert getattr(t.options, name) == value


def test_options_persist_across_reopen(db):
    db.create_table("t", bloom_filter_fp_chance=0.001, block_size_bytes=512,
                    memtable_size_bytes=8192)
    db.create_table("plain")
    db = reopen(db)
    try:
        o = db.table("t").options
        assert (o.bloom_filter_fp_chance, o.block_size_bytes, o.memtable_size_bytes) == \
            (0.001, 512, 8192)
        p = db.table("plain").options
        assert (p.bloom_filter_fp_chance, p.block_size_bytes, p.memtable_size_bytes) == \
            (0.01, 4096, 4 * 1024 * 1024)
        assert db.table("default").options == p
    finally:
        db.close()


def test_alter_table_persists_and_applies_only_to_new_sstables(db):
    t = db.create_table("t", bloom_filter_fp_chance=0.01, block_size_bytes=512)
    for i in range(500):
        t.put(b"k%04d" % i, b"v")
    t.flush()
    [old] = db.sstables("t")
    assert old.filter_fp_chance == 0.01

    db.alter_table("t", bloom_filter_fp_chance=0.001)
    assert db.table("t").options.bloom_filter_fp_chance == 0.001
    assert db.table("t").options.block_size_bytes == 512  # other options kept
    db = reopen(db)
    try:
        t = db.table("t")
        assert t.options.bloom_filter_fp_chance == 0.001
        assert t.options.block_size_bytes == 512
        [still_old] = db.sstables("t")
        assert still_old.file == old.file
        assert still_old.filter_fp_chance == 0.01
        assert still_old.filter_bits == old.filter_bits
        for i in range(500, 1000):
            t.put(b"k%04d" % i, b"v")
        t.flush()
        new, old2 = db.sstables("t")  # newest first
        assert old2.file == old.file and old2.filter_fp_chance == 0.01
        assert new.filter_fp_chance == 0.001
        assert new.bits_per_key > old2.bits_per_key
        assert new.filter_hashes > old2.filter_hashes
        assert all(t.get(b"k%04d" % i) == b"v" for i in range(1000))
    finally:
        db.close()


def test_fp_chance_one_writes_no_filter_and_reads_still_work(db):
    t = db.create_table("nofilter", bloom_filter_fp_chance=1.0, block_size_bytes=256)
    for i in range(300):
        t.put(b"k%03d" % i, b"v%03d" % i)
    t.delete(b"k100")
    t.flush()
    [info] = db.sstables("nofilter")
    assert info.filter_bits == 0
    assert info.filter_fp_chance == 1.0

    def check(tbl):
        assert tbl.get(b"k000") == b"v000"
        assert tbl.get(b"k299") == b"v299"
        assert tbl.get(b"k100") is None
        assert tbl.get(b"k0005") is None
        assert tbl.get(b"zzz") is None
        assert len(list(tbl.scan())) == 299
        assert all(tbl.get(b"k%03d" % i) == b"v%03d" % i for i in range(300) if i != 100)

    check(t)
    db = reopen(db)
    try:
        check(db.table("nofilter"))
        assert db.sstables("nofilter")[0].filter_bits == 0
    finally:
        db.close()


# ------------------------------------------------------------------ flushes and WAL segments

def test_memtable_fills_and_flushes_automatically(db):
    t = db.create_table("t", **SMALL)
    for i in range(300):
        t.put(b"key%04d" % i, b"v" * 40)
    infos = db.sstables("t")
    assert len(infos) >= 3
    assert all(i.level == 0 for i in infos)
    assert 200 <= sum(i.entries for i in infos) <= 300
    assert all(t.get(b"key%04d" % i) == b"v" * 40 for i in range(300))
    assert db.sstables("default") == []
    db = reopen(db)
    try:
        t = db.table("t")
        assert [(k, v) for k, v in t.scan()] == [(b"key%04d" % i, b"v" * 40) for i in range(300)]
    finally:
        db.close()


def test_flush_deletes_wal_segments_no_longer_needed(path):
    with lsmdb.open(path) as db:
        db.put(b"a", b"1")
    with lsmdb.open(path) as db:
        db.put(b"b", b"2")
    db = lsmdb.open(path)
    try:
        assert len(wal_files(path)) >= 3  # two with data + the current one
        assert db.get(b"a") == b"1" and db.get(b"b") == b"2"
        db.flush()
        [current] = wal_files(path)
        db.put(b"c", b"3")
        assert wal_files(path) == [current]  # the current segment takes new writes
        db.close()
        db = lsmdb.open(path)
        assert list(db.scan()) == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]
        db.flush()
        assert len(wal_files(path)) == 1
        assert wal_files(path) != [current]
    finally:
        db.close()
    with lsmdb.open(path) as db:
        assert list(db.scan()) == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]


def test_wal_segment_needed_by_another_table_is_kept(path):
    with lsmdb.open(path) as db:
        db.create_table("x")
        db.table("x").put(b"x1", b"unflushed")
        db.put(b"d1", b"default")
        db.flush("default")  # x's record still lives only in the WAL
        assert db.sstables("x") == []
    with lsmdb.open(path) as db:
        assert db.table("x").get(b"x1") == b"unflushed"
        assert db.get(b"d1") == b"default"
        db.flush("default")
    with lsmdb.open(path) as db:
        assert db.table("x").get(b"x1") == b"unflushed"
        db.flush()
        assert len(wal_files(path)) == 1
    with lsmdb.open(path) as db:
        assert db.table("x").get(b"x1") == b"unflushed"
        assert db.get(b"d1") == b"default"


# ------------------------------------------------------------------ closing

def test_use_after_close_is_an_error(path):
    db = lsmdb.open(path)
    t = db.create_table("t")
    db.put(b"k", b"v")
    db.close()
    assert db.closed
    calls = [
        lambda: db.get(b"k"), lambda: db.put(b"k", b"v"), lambda: db.delete(b"k"),
        lambda: db.scan(), lambda: list(db.scan()), lambda: db.batch(),
        lambda: db.flush(), lambda: db[b"k"], lambda: b"k" in db, lambda: db.tables(),
        lambda: db.table("t"), lambda: db.create_table("u"), lambda: db.sstables(),
        lambda: t.get(b"k"), lambda: t.put(b"k", b"v"), lambda: t.scan(),
    ]
    for call in calls:
        with pytest.raises(lsmdb.DatabaseClosedError):
            call()
    db.close()  # idempotent
    db.close()


def test_batch_committed_after_close_is_an_error(path):
    db = lsmdb.open(path)
    b = db.batch()
    b.put(b"k", b"v")
    db.close()
    with pytest.raises(lsmdb.DatabaseClosedError):
        b.commit()
    with lsmdb.open(path) as db:
        assert db.get(b"k") is None


def test_context_manager_closes(path):
    with lsmdb.open(path) as db:
        db.put(b"k", b"v")
    assert db.closed
    with pytest.raises(lsmdb.DatabaseClosedError):
        db.get(b"k")
    with pytest.raises(ZeroDivisionError):
        with lsmdb.open(path) as db:
            raise ZeroDivisionError
    assert db.closed
    with lsmdb.open(path) as db:  # the lock was released
        assert db.get(b"k") == b"v"


# ------------------------------------------------------------------ locking

CHILD = textwrap.dedent("""
    import sys, lsmdb
    try:
        db = lsmdb.open(sys.argv[1])
    except lsmdb.DatabaseLockedError:
        sys.exit(3)
    db.put(b"child", b"was-here")
    db.close()
""")


def _child_open(p: str) -> int:
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(lsmdb.__file__))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", CHILD, p], env=env, timeout=60).returncode


def test_second_open_in_the_same_process_is_locked(path):
    db = lsmdb.open(path)
    try:
        with pytest.raises(lsmdb.DatabaseLockedError):
            lsmdb.open(path)
        db.put(b"k", b"v")  # the failed open did not disturb the first
        assert db.get(b"k") == b"v"
    finally:
        db.close()
    with lsmdb.open(path) as db2:
        assert db2.get(b"k") == b"v"


def test_open_from_another_process_is_locked(path):
    db = lsmdb.open(path)
    try:
        assert _child_open(path) == 3
    finally:
        db.close()
    assert _child_open(path) == 0
    with lsmdb.open(path) as db:
        assert db.get(b"child") == b"was-here"


# ------------------------------------------------------------------ opening safely

def test_non_empty_directory_that_is_not_a_database(tmp_path):
    p = tmp_path / "mine"
    p.mkdir()
    (p / "notes.txt").write_bytes(b"my notes")
    (p / "000001.sst").write_bytes(b"not an sstable")
    (p / "sub").mkdir()
    before = dir_digest(str(p))
    with pytest.raises(lsmdb.NotADatabaseError):
        lsmdb.open(str(p))
    assert dir_digest(str(p)) == before
    assert not (p / "MANIFEST").exists()
    with pytest.raises(lsmdb.NotADatabaseError):
        lsmdb.open(str(p), create_if_missing=False)
    assert dir_digest(str(p)) == before


def test_failed_open_of_a_foreign_directory_leaves_no_files(tmp_path):
    p = tmp_path / "mine"
    p.mkdir()
    (p / "notes.txt").write_bytes(b"my notes")
    with pytest.raises(lsmdb.NotADatabaseError):
        lsmdb.open(str(p))
    assert sorted(os.listdir(p)) == ["notes.txt"]


def test_path_that_is_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_bytes(b"x")
    with pytest.raises(lsmdb.NotADatabaseError):
        lsmdb.open(str(f))
    assert f.read_bytes() == b"x"


def test_create_if_missing_false(tmp_path):
    missing = tmp_path / "missing"
    with pytest.raises(lsmdb.LsmdbError):
        lsmdb.open(str(missing), create_if_missing=False)
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(lsmdb.LsmdbError):
        lsmdb.open(str(empty), create_if_missing=False)
    assert not (empty / "MANIFEST").exists()
    with lsmdb.open(str(empty)) as db:
        db.put(b"k", b"v")
    with lsmdb.open(str(empty), create_if_missing=False) as db:
        assert db.get(b"k") == b"v"


def test_unreferenced_sstables_are_removed_at_open(path):
    with lsmdb.open(path, auto_compaction=False) as db:
        db.put(b"a", b"1")
        db.flush()
        db.put(b"b", b"2")
        db.flush()
        live = sorted(i.file for i in db.sstables())
    assert sst_files(path) == live
    with open(os.path.join(path, "999999.sst"), "wb") as f:
        f.write(b"leftover of a crashed flush")
    with open(os.path.join(path, "000000.sst"), "wb") as f:
        f.write(b"another one")
    with open(os.path.join(path, "MANIFEST.tmp"), "wb") as f:
        f.write(b"half a manifest")
    with open(os.path.join(path, "notes.txt"), "wb") as f:
        f.write(b"not ours")
    with lsmdb.open(path, auto_compaction=False) as db:
        assert sst_files(path) == live
        assert not os.path.exists(os.path.join(path, "MANIFEST.tmp"))
        assert os.path.exists(os.path.join(path, "notes.txt"))
        assert list(db.scan()) == [(b"a", b"1"), (b"b", b"2")]
        db.put(b"c", b"3")
        db.flush()  # a new file number must not collide with a live file
        assert len(db.sstables()) == 3
    with lsmdb.open(path) as db:
        assert list(db.scan()) == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]


@pytest.mark.parametrize("where", ["magic", "crc", "length", "payload-start", "payload-middle",
                                   "payload-end"])
def test_corrupt_manifest_is_an_error_and_deletes_nothing(path, where):
    with lsmdb.open(path) as db:
        db.create_table("t")
        db.put(b"a", b"1")
        db.flush()
        db.table("t").put(b"x", b"y")
        db.flush()
        db.put(b"b", b"in-wal")
    manifest = os.path.join(path, "MANIFEST")
    with open(manifest, "rb") as f:
        data = bytearray(f.read())
    pos = {"magic": 0, "crc": 12, "length": 17, "payload-start": 20,
           "payload-middle": 20 + (len(data) - 20) // 2, "payload-end": len(data) - 1}[where]
    data[pos] ^= 0xFF
    with open(manifest, "wb") as f:
        f.write(data)
    before = dir_digest(path)
    assert len(sst_files(path)) == 2
    with pytest.raises(lsmdb.CorruptionError) as info:
        lsmdb.open(path)
    assert info.value.path == manifest
    assert dir_digest(path) == before
    # and still nothing deleted on a second attempt
    with pytest.raises(lsmdb.CorruptionError):
        lsmdb.open(path)
    assert dir_digest(path) == before


def test_empty_manifest_is_corruption(path):
    with lsmdb.open(path) as db:
        db.put(b"a", b"1")
        db.flush()
    open(os.path.join(path, "MANIFEST"), "wb").close()
    before = dir_digest(path)
    with pytest.raises(lsmdb.CorruptionError) as info:
        lsmdb.open(path)
    assert info.value.path == os.path.join(path, "MANIFEST")
    assert dir_digest(path) == before


# ------------------------------------------------------------------ scans

KEYS = [b"", b"\x00", b"a", b"a\x00", b"ab", b"abc", b"ac", b"b", b"ba", b"\xfe", b"\xff",
        b"\xff\x00", b"\xff\xfe", b"\xff\xff", b"\xff\xff\x00", b"\xff\xff\xff"]


@pytest.fixture
def filled(db):
    for k in KEYS:
        db.put(k, b"v:" + k)
    return db


def expect(model, start=None, end=None, prefix=None, reverse=False):
    items = sorted((k, v) for k, v in model.items()
                   if (start is None or k >= start) and (end is None or k < end)
                   and (prefix is None or k.startswith(prefix)))
    return items[::-1] if reverse else items


def test_scan_bounds(filled):
    model = {k: b"v:" + k for k in KEYS}
    db = filled
    assert list(db.scan()) == expect(model)
    assert list(db.scan(start=b"a"))[0] == (b"a", b"v:a")  # start inclusive
    assert list(db.scan(start=b"a", end=b"b")) == expect(model, b"a", b"b")
    assert (b"b", b"v:b") not in list(db.scan(end=b"b"))  # end exclusive
    assert list(db.scan(start=b"b", end=b"b")) == []
    assert list(db.scan(start=b"c", end=b"a")) == []
    assert list(db.scan(end=b"")) == []
    assert list(db.scan(start=b"", end=b"\x00")) == [(b"", b"v:")]
    assert list(db.scan(start=b"\xff\xff\xff\xff")) == []
    assert list(db.scan(reverse=True)) == expect(model, reverse=True)
    assert list(db.scan(start=b"a", end=b"b", reverse=True)) == expect(model, b"a", b"b",
                                                                        reverse=True)


@pytest.mark.parametrize("prefix", [b"", b"a", b"ab", b"\xff", b"\xff\xff", b"\xff\xff\xff",
                                    b"zz", b"\x00"])
def test_scan_prefix(filled, prefix):
    model = {k: b"v:" + k for k in KEYS}
    db = filled
    for reverse in (False, True):
        assert list(db.scan(prefix=prefix, reverse=reverse)) == \
            expect(model, prefix=prefix, reverse=reverse)
        assert list(db.scan(prefix=prefix, start=b"ab", reverse=reverse)) == \
            expect(model, start=b"ab", prefix=prefix, reverse=reverse)
        assert list(db.scan(prefix=prefix, end=b"\xff\xff\x00", reverse=reverse)) == \
            expect(model, end=b"\xff\xff\x00", prefix=prefix, reverse=reverse)
    db.flush()
    assert list(db.scan(prefix=prefix)) == expect(model, prefix=prefix)


def test_scan_prefix_ff_ff(filled):
    assert [k for k, _v in filled.scan(prefix=b"\xff\xff")] == \
        [b"\xff\xff", b"\xff\xff\x00", b"\xff\xff\xff"]
    filled.flush()
    assert [k for k, _v in filled.scan(prefix=b"\xff\xff", reverse=True)] == \
        [b"\xff\xff\xff", b"\xff\xff\x00", b"\xff\xff"]


def test_scan_over_memtable_and_several_sstables_with_tombstones(db):
    t = db.create_table("t", block_size_bytes=256)
    model: dict[bytes, bytes] = {}
    keys = [b"%03d" % i for i in range(120)] + [b"", b"\xff", b"\xff\xff"]
    step = 0
    for rnd in range(4):
        for i, k in enumerate(keys):
            step += 1
            if (i + rnd) % 5 == 0:
                t.delete(k)
                model.pop(k, None)
            elif (i * 7 + rnd) % 3 == 0:
                v = b"r%d-%d-" % (rnd, step) + b"x" * (i % 40)
                t.put(k, v)
                model[k] = v
        t.flush()
    for i, k in enumerate(keys[::4]):  # an unflushed layer on top
        if i % 2:
            t.delete(k)
            model.pop(k, None)
        else:
            t.put(k, b"mem")
            model[k] = b"mem"
    assert len(db.sstables("t")) == 4
    assert sum(i.tombstones for i in db.sstables("t")) > 0
    bounds = [None, b"", b"0", b"050", b"050\x00", b"119", b"\xff", b"\xff\xff\x00"]

    def check(tbl):
        for start in bounds:
            for end in bounds:
                for reverse in (False, True):
                    assert list(tbl.scan(start=start, end=end, reverse=reverse)) == \
                        expect(model, start, end, reverse=reverse), (start, end, reverse)
        for prefix in (b"0", b"05", b"11", b"\xff", b"\xff\xff", b"x"):
            for reverse in (False, True):
                assert list(tbl.scan(prefix=prefix, reverse=reverse)) == \
                    expect(model, prefix=prefix, reverse=reverse)
        for k in keys:
            assert tbl.get(k) == model.get(k), k

    check(t)
    db = reopen(db)
    try:
        check(db.table("t"))
    finally:
        db.close()


def test_scan_iterator_is_a_snapshot(db):
    for i in range(10):
        db.put(b"k%d" % i, b"old")
    db.flush()
    db.put(b"k5", b"mem")
    expected = [(b"k%d" % i, b"mem" if i == 5 else b"old") for i in range(10)]

    it = db.scan()
    rev = db.scan(reverse=True)
    partly = db.scan()
    first = next(partly)
    # writes after the iterators were created ...
    db.put(b"k0a", b"new")       # a new key in the middle
    db.put(b"k3", b"changed")    # an overwrite
    db.delete(b"k7")             # a delete
    db.put(b"z", b"new")         # a new key at the end
    db.flush()                   # ... and a flush that moves the memtable
    db.put(b"k8", b"after-flush")
    db.compact()                 # ... and a compaction that deletes the files it read
    assert len(db.sstables()) == 1
    assert list(it) == expected
    assert list(rev) == expected[::-1]
    assert [first] + list(partly) == expected
    # a new iterator sees everything
    now = dict(db.scan())
    assert now[b"k3"] == b"changed" and b"k7" not in now and now[b"k0a"] == b"new"
    assert now[b"k8"] == b"after-flush" and now[b"z"] == b"new"


# ------------------------------------------------------------------ sstables()

FIELDS = ["table", "file", "path", "level", "entries", "tombstones", "size_bytes", "min_key",
          "max_key", "filter_fp_chance", "filter_bits", "filter_hashes", "filter_bytes",
          "bits_per_key"]


def test_sstables_fields(db):
    t = db.create_table("t")
    t.put(b"b", b"1")
    t.put(b"a", b"2")
    t.delete(b"c")
    t.flush()
    db.put(b"x", b"y")
    db.flush()
    infos = db.sstables()
    assert [i.table for i in infos] == ["default", "t"]
    assert db.sstables("t") == [infos[1]]
    info = infos[1]
    for name in FIELDS:
        assert hasattr(info, name), name
    assert info.table == "t"
    assert info.file.endswith(".sst") and os.path.basename(info.path) == info.file
    assert os.path.getsize(info.path) == info.size_bytes
    assert os.path.dirname(info.path) == db.path
    assert info.level == 0
    assert info.entries == 3
    assert info.tombstones == 1
    assert (info.min_key, info.max_key) == (b"a", b"c")
    assert info.filter_fp_chance == 0.01
    assert info.filter_bits > 0 and info.filter_hashes > 0
    assert info.filter_bytes >= info.filter_bits // 8
    assert info.bits_per_key == pytest.approx(info.filter_bits / info.entries)
    d = info.to_dict()
    for name in FIELDS:
        assert d[name] == getattr(info, name)


@pytest.mark.parametrize("p", [0.1, 0.01, 0.001])
def test_bits_per_key_matches_the_formula(db, p):
    n = 5000
    t = db.create_table("t", bloom_filter_fp_chance=p)
    with db.batch() as b:
        for i in range(n):
            b.put(b"key-%06d" % i, b"v", table="t")
    t.flush()
    [info] = db.sstables("t")
    assert info.entries == n
    assert info.filter_fp_chance == p
    ideal = -math.log(p) / math.log(2) ** 2
    assert abs(info.bits_per_key - ideal) / ideal < 0.01
    assert info.filter_bits == math.ceil(-n * math.log(p) / math.log(2) ** 2)
    assert info.filter_hashes == max(1, round(info.filter_bits / n * math.log(2)))
    # the filter does its job: absent keys are rejected about as often as promised
    for i in range(4000):
        assert t.get(b"key-%06d-absent" % i) is None  # inside the file's key range
    [after] = db.sstables("t")
    assert after.false_positives + after.filter_negatives == 4000
    assert after.false_positives <= max(10, 3 * p * 4000)


def _cache_books_match_the_files(d: lsmdb.DB, gone: list[tuple[int, int]] = ()) -> None:
    """Each open file's range of block-cache keys is its own; every cached
    block lies in the range of exactly one open file and is that file's block
    as on disk; none lies in a range of ``gone`` (files that left)."""
    cache = d._versions.block_cache
    readers = [r for state in d._versions.tables.values() for r in state.files]
    ranges = sorted((r.cache_base, r.cache_base + len(r.index_keys)) for r in readers)
    assert all(hi <= lo for (_lo, hi), (lo, _hi) in pairwise(ranges))
    entries = cache.entries()
    assert entries
    for key, _size, _marked in entries:
        assert not any(lo <= key < hi for lo, hi in gone)
        [reader] = [r for r in readers if 0 <= key - r.cache_base < len(r.index_keys)]
        i = key - reader.cache_base
        assert entry_lists(cache.lookup(key)) == reader.read_block(i)


@pytest.mark.parametrize("c_getter", [True, False])
def test_the_block_cache_never_serves_one_files_block_for_another(path, monkeypatch, c_getter):
    """Three tables hold the same keys in files of the same shape, each file
    its own values, every block in one cache: each get, get_many and scan
    answers from its own table's newest file, and the cache's books match the
    files, through flushes, cache hits, a compaction and a dropped table
    (whose files' blocks leave the cache) and a reopen -- on the C and the
    Python read paths."""
    if not c_getter:
        monkeypatch.setattr(lsmdb.readpath, "USE_C_GETTER", False)
    names = ["t1", "t2", "t3"]
    keys = [b"key%05d" % i for i in range(600)]
    model: dict[str, dict[bytes, bytes]] = {name: {} for name in names}

    def check(d: lsmdb.DB, gone: list[tuple[int, int]] = ()) -> None:
        assert (type(d.get).__name__ == "Getter") == (c_getter and lsmdb.SPEEDUPS)
        for _ in range(2):  # cached on the first pass, hits on the second
            for name in names:
                t, want = d.table(name), model[name]
                assert [t.get(k) for k in keys] == [want.get(k) for k in keys]
                assert t.get_many(keys[::3]) == [want.get(k) for k in keys[::3]]
                assert list(t.scan()) == sorted(want.items())
        assert sum(r.block_cache_hits for r in d.sstables()) > 0
        _cache_books_match_the_files(d, gone)

    d = lsmdb.open(path, auto_compaction=False)
    try:
        for name in names:
            d.create_table(name, block_size_bytes=256)
        for gen in range(4):  # four files a table, the newest holding every other key
            for name in names:
                t = d.table(name)
                for i, k in enumerate(keys):
                    if gen == 0 or i % 2 == gen % 2:
                        t.put(k, b"%s-%d-%05d" % (name.encode(), gen, i))
                        model[name][k] = b"%s-%d-%05d" % (name.encode(), gen, i)
            d.flush()
            check(d)
        assert all(len(r.index_keys) > 10 for s in d._versions.tables.values() for r in s.files)
        inputs = [(r.cache_base, r.cache_base + len(r.index_keys))
                  for r in d._versions.tables["t2"].files]
        d.compact("t2")
        check(d, gone=inputs)
        dropped = [(r.cache_base, r.cache_base + len(r.index_keys))
                   for r in d._versions.tables["t3"].files]
        d.drop_table("t3")
        names.remove("t3")
        _cache_books_match_the_files(d, gone=inputs + dropped)
        check(d)
    finally:
        d.close()
    d = lsmdb.open(path, auto_compaction=False)
    try:
        check(d)
    finally:
        d.close()


def test_create_table_exist_ok_returns_the_existing_table_unchanged(tmp_path):
    with lsmdb.open(str(tmp_path / "db")) as db:
        t = db.create_table("events", bloom_filter_fp_chance=0.001)
        t.put(b"k", b"v")
        with pytest.raises(lsmdb.TableExistsError):
            db.create_table("events")
        again = db.create_table("events", exist_ok=True, bloom_filter_fp_chance=0.1)
        assert again.get(b"k") == b"v"
        assert again.options.bloom_filter_fp_chance == 0.001  # not altered
        with pytest.raises(ValueError):
            db.create_table("events", exist_ok=True, bloom_filter_fp_chance=7)
