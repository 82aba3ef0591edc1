"""Bad input at every public entry point: a clear error, and nothing changed.

Wrong types, empty and over-limit keys and values, invalid table options and
names, use after close, directories that are not databases, databases
written by a newer format, and writes to a read-only database.  Where a call
is refused, the test also checks that the database (its contents and its
files) is exactly as before.
"""

from __future__ import annotations

import hashlib
import math
import os
import pathlib
import shutil
import struct

import pytest

import lsmdb
from lsmdb.coding import crc32
from lsmdb.manifest import MANIFEST_FORMAT_VERSION, MANIFEST_NAME
from lsmdb.sstable_format import FOOTER_SIZE, READABLE_VERSIONS
from lsmdb.sstable_reader import SSTableReader
from lsmdb.verify import verify_database

MAX_KEY = lsmdb.MAX_KEY_SIZE_BYTES
MAX_VALUE = lsmdb.MAX_VALUE_SIZE_BYTES


# --------------------------------------------------------------------------- helpers

@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "db")


@pytest.fixture
def db(path):
    d = lsmdb.open(path, auto_compaction=False)
    d.create_table("t")
    d.put(b"a", b"1")
    d.put(b"b", b"2")
    d.flush()
    d.put(b"c", b"3")
    d.table("t").put(b"x", b"in t")
    yield d
    d.close()


def digest(p: str, skip: tuple[str, ...] = ()) -> dict[str, str]:
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


def contents(d: lsmdb.DB) -> dict[str, dict[bytes, bytes]]:
    return {name: dict(d.table(name).scan()) for name in d.tables()}


BAD_TYPES = ["text", 7, 1.5, True, [b"k"], (b"k",), {b"k": 1}, object()]
BAD_TYPE_IDS = ["str", "int", "float", "bool", "list", "tuple", "dict", "object"]


def key_calls(d: lsmdb.DB):
    """Every way to hand the database a key: name -> fn(key)."""
    t = d.table("t")

    def in_batch(op):
        def run(k):
            with d.batch() as b:
                b.put(b"ok-in-batch", b"must not land")
                op(b, k)
        return run

    def delitem(m, k):
        del m[k]

    return {
        "put": lambda k: d.put(k, b"v"),
        "get": lambda k: d.get(k),
        "get-default": lambda k: d.get(k, b"dflt"),
        "delete": lambda k: d.delete(k),
        "getitem": lambda k: d[k],
        "setitem": lambda k: d.__setitem__(k, b"v"),
        "delitem": lambda k: delitem(d, k),
        "contains": lambda k: k in d,
        "scan-start": lambda k: list(d.scan(start=k)),
        "scan-end": lambda k: list(d.scan(end=k)),
        "scan-prefix": lambda k: list(d.scan(prefix=k)),
        "trace": lambda k: d.trace(k),
        "batch-put": in_batch(lambda b, k: b.put(k, b"v")),
        "batch-delete": in_batch(lambda b, k: b.delete(k)),
        "table-put": lambda k: t.put(k, b"v"),
        "table-get": lambda k: t.get(k),
        "table-get-default": lambda k: t.get(k, b"dflt"),
        "table-delete": lambda k: t.delete(k),
        "table-getitem": lambda k: t[k],
        "table-delitem": lambda k: delitem(t, k),
        "table-contains": lambda k: k in t,
        "table-scan": lambda k: list(t.scan(start=k)),
    }


def value_calls(d: lsmdb.DB):
    t = d.table("t")

    def in_batch(v):
        with d.batch() as b:
            b.put(b"ok-in-batch", b"must not land")
            b.put(b"k", v, table="t")

    return {
        "put": lambda v: d.put(b"k", v),
        "setitem": lambda v: d.__setitem__(b"k", v),
        "batch-put": in_batch,
        "table-put": lambda v: t.put(b"k", v),
        "table-setitem": lambda v: t.__setitem__(b"k", v),
    }


# --------------------------------------------------------------------------- types

@pytest.mark.parametrize("bad", BAD_TYPES, ids=BAD_TYPE_IDS)
def test_keys_of_the_wrong_type_are_type_errors(db, bad):
    before = contents(db)
    for name, call in key_calls(db).items():
        with pytest.raises(TypeError) as info:
            call(bad)
        if isinstance(bad, str):
            assert "encode" in str(info.value), name
    assert contents(db) == before


def test_none_as_a_key_is_a_type_error_except_as_a_scan_bound(db):
    before = contents(db)
    for name, call in key_calls(db).items():
        if name.startswith(("scan", "table-scan")):
            call(None)  # None means "no bound"
            continue
        with pytest.raises(TypeError):
            call(None)
    assert contents(db) == before


@pytest.mark.parametrize("bad", BAD_TYPES + [None], ids=BAD_TYPE_IDS + ["None"])
def test_values_of_the_wrong_type_are_type_errors(db, bad):
    before = contents(db)
    for name, call in value_calls(db).items():
        with pytest.raises(TypeError) as info:
            call(bad)
        if isinstance(bad, str):
            assert "encode" in str(info.value), name
    assert contents(db) == before


def test_bytearray_and_memoryview_are_copied(db):
    k, v = bytearray(b"mutable-key"), bytearray(b"mutable-value")
    db.put(k, v)
    db.put(memoryview(b"view-key"), memoryview(b"view-value"))
    k[0:1] = b"X"
    v[0:1] = b"X"
    assert db.get(b"mutable-key") == b"mutable-value"
    assert db.get(bytearray(b"mutable-key")) == b"mutable-value"
    assert db.get(memoryview(b"view-key")) == b"view-value"
    assert b"Xutable-key" not in db
    assert type(db.get(b"view-key")) is bytes


# --------------------------------------------------------------------------- sizes

def test_empty_key_and_empty_value_are_valid_everywhere(db, path):
    db.put(b"", b"")
    db.table("t").put(b"", b"empty-key")
    db.put(b"empty-value", b"")
    for _round in range(3):
        assert db.get(b"") == b""  # b"" is a value, not "absent"
        assert db.get(b"", b"dflt") == b""
        assert b"" in db and b"empty-value" in db
        assert db[b"empty-value"] == b""
        assert db.table("t")[b""] == b"empty-key"
        assert list(db.scan(end=b"a")) == [(b"", b"")]
        assert (b"", b"") in list(db.scan(prefix=b""))
        db.flush()
        db.compact()
        db.close()
        db = lsmdb.open(path, auto_compaction=False)
    del db[b""]
    assert b"" not in db and db.get(b"", b"dflt") == b"dflt"
    db.close()


def test_key_at_the_limit_is_accepted_and_one_more_byte_is_a_value_error(db, path):
    at_limit = b"k" * MAX_KEY
    over = b"k" * (MAX_KEY + 1)
    db.put(at_limit, b"big key")
    db.flush()
    assert db.get(at_limit) == b"big key"
    before = contents(db)
    wal_before = digest(path, skip=("LOCK", "STATS"))
    for name, call in key_calls(db).items():
        with pytest.raises(ValueError) as info:
            call(over)
        assert str(MAX_KEY) in str(info.value), name
        with pytest.raises(ValueError):
            call(memoryview(over))
    assert contents(db) == before
    assert digest(path, skip=("LOCK", "STATS")) == wal_before
    db.close()
    with lsmdb.open(path) as again:
        assert again.get(at_limit) == b"big key"


def test_values_over_the_limit_and_batches_over_the_limit_change_nothing(tmp_path):
    """One 64 MiB + 1 buffer, shared by every call (bytes are not copied when checked)."""
    path = str(tmp_path / "db")
    big = bytes(MAX_VALUE + 1)
    try:
        with lsmdb.open(path, auto_compaction=False) as d:
            d.create_table("t", memtable_size_bytes=1024 ** 3)
            d.put(b"keep", b"me")
            before = contents(d)
            files_before = digest(path, skip=("LOCK", "STATS"))
            for name, call in value_calls(d).items():
                with pytest.raises(ValueError) as info:
                    call(big)
                assert str(MAX_VALUE) in str(info.value), name
            with pytest.raises(ValueError):
                d.put(b"k", memoryview(big))  # converted (copied) once, then refused
            at_limit = memoryview(big)[:MAX_VALUE].tobytes()
            del big
            # Values each at the limit, 576 MiB together (references, no copies).
            with pytest.raises(ValueError) as info:
                with d.batch() as b:
                    for i in range(9):
                        b.put(b"part%d" % i, at_limit)
            assert "batch" in str(info.value)
            assert contents(d) == before
            assert digest(path, skip=("LOCK", "STATS")) == files_before
            # Exactly at the limit is accepted (kept in a 1 GiB memtable: no flush).
            t = d.table("t")
            t.put(b"max", at_limit)
            got = t.get(b"max")
            assert len(got) == MAX_VALUE and got == at_limit
            del got
            t.delete(b"max")
            assert t.get(b"max") is None
    finally:
        shutil.rmtree(path, ignore_errors=True)  # 64 MiB of WAL


def test_a_batch_with_one_bad_operation_writes_nothing(db):
    before = contents(db)
    with pytest.raises(TypeError):
        with db.batch() as b:
            b.put(b"good", b"1")
            b.put(b"also-good", b"2", table="t")
            b.put("bad", b"3")
    with pytest.raises(lsmdb.NoSuchTableError):
        with db.batch() as b:
            b.put(b"good", b"1")
            b.put(b"k", b"v", table="nope")
    assert contents(db) == before
    b = db.batch()
    b.put(b"once", b"1")
    b.commit()
    for again in (b.commit, lambda: b.put(b"k", b"v"), lambda: b.delete(b"k")):
        with pytest.raises(ValueError):
            again()
    assert db.get(b"once") == b"1"


# --------------------------------------------------------------------------- options

BAD_OPTIONS = [
    ({"bloom_filter_fp_chance": 0}, ValueError),
    ({"bloom_filter_fp_chance": 1e-7}, ValueError),
    ({"bloom_filter_fp_chance": 1.01}, ValueError),
    ({"bloom_filter_fp_chance": -0.1}, ValueError),
    ({"bloom_filter_fp_chance": math.nan}, ValueError),
    ({"bloom_filter_fp_chance": math.inf}, ValueError),
    ({"bloom_filter_fp_chance": "0.01"}, TypeError),
    ({"bloom_filter_fp_chance": True}, TypeError),
    ({"bloom_filter_fp_chance": None}, TypeError),
    ({"block_size_bytes": 255}, ValueError),
    ({"block_size_bytes": 4 * 1024 * 1024 + 1}, ValueError),
    ({"block_size_bytes": 4096.0}, TypeError),
    ({"block_size_bytes": True}, TypeError),
    ({"memtable_size_bytes": 4095}, ValueError),
    ({"memtable_size_bytes": 1024 ** 3 + 1}, ValueError),
    ({"memtable_size_bytes": "4MiB"}, TypeError),
    ({"bloom_filter_mode": "off"}, ValueError),
    ({"bloom_filter_mode": 1}, TypeError),
    ({"bloom_filter_hash": "md5"}, ValueError),
    ({"bloom_filter_hash": None}, TypeError),
    ({"compaction": "tiered"}, ValueError),
    ({"min_threshold": 1}, ValueError),
    ({"max_threshold": 33}, ValueError),
    ({"min_threshold": 8, "max_threshold": 4}, ValueError),
    ({"target_file_size_bytes": 1}, ValueError),
    ({"bloom_filter_skip_last_level": "yes"}, TypeError),
    ({"bloom_filter_skip_last_level": 1}, TypeError),
    ({"bloom_filter_skip_last_level": 0}, TypeError),
    ({"bloom_filter_skip_last_level": None}, TypeError),
    ({"no_such_option": 1}, TypeError),
    ({"Bloom_Filter_FP_Chance": 0.1}, TypeError),
]


@pytest.mark.parametrize("options,exc", BAD_OPTIONS,
                         ids=[f"{sorted(o)[0]}={o[sorted(o)[0]]!r}" for o, _e in BAD_OPTIONS])
def test_invalid_table_options_are_refused_and_change_nothing(db, path, options, exc):
    t_options = db.table("t").options
    before = digest(path, skip=("LOCK", "STATS"))
    with pytest.raises(exc) as info:
        db.create_table("new", **options)
    name = "min_threshold" if "max_threshold" in options and "min_threshold" in options \
        else next(iter(options))
    assert name in str(info.value)
    assert db.tables() == ["default", "t"]
    with pytest.raises(exc):
        db.alter_table("t", **options)
    assert db.table("t").options == t_options
    assert digest(path, skip=("LOCK", "STATS")) == before
    db.close()
    with lsmdb.open(path) as again:
        assert again.tables() == ["default", "t"]
        assert again.table("t").options == t_options


@pytest.mark.parametrize("kwargs,exc", [
    ({"block_cache_size_bytes": -1}, ValueError),
    ({"block_cache_size_bytes": "32M"}, TypeError),
    ({"block_cache_size_bytes": 1.0}, TypeError),
])
def test_invalid_open_options_create_nothing(tmp_path, kwargs, exc):
    path = tmp_path / "db"
    with pytest.raises(exc):
        lsmdb.open(path, **kwargs)
    assert not path.exists()


#: The bool options of lsmdb.open: any other type, even 0/1 or "no", is refused.
BOOL_OPEN_OPTIONS = ("create_if_missing", "sync", "read_only", "auto_compaction", "mmap_reads",
                     "compaction_process", "follow")


@pytest.mark.parametrize("name", BOOL_OPEN_OPTIONS)
@pytest.mark.parametrize("bad", ["no", "yes", 0, 1, None, 1.0])
def test_bool_open_options_take_only_a_bool(tmp_path, name, bad):
    """``read_only="no"`` opened read-only (a non-empty str is true): a TypeError now,
    naming the option, before anything is created."""
    path = tmp_path / "db"
    with pytest.raises(TypeError, match=f"'{name}' must be a bool"):
        lsmdb.open(path, **{name: bad})
    assert not path.exists()
    with pytest.raises(TypeError, match=f"'{name}' must be a bool"):
        lsmdb.DB(path, **{name: bad})


def test_every_bool_option_is_checked():
    """Every bool-typed parameter of lsmdb.open and every bool table option is in the
    lists the tests above refuse non-bools for."""
    import inspect
    import typing
    hints = typing.get_type_hints(lsmdb.open)
    bools = [n for n in inspect.signature(lsmdb.open).parameters if hints.get(n) is bool]
    assert sorted(bools) == sorted(BOOL_OPEN_OPTIONS)
    table_hints = typing.get_type_hints(lsmdb.TableOptions)
    table_bools = [n for n, t in table_hints.items() if t is bool]
    assert table_bools == ["bloom_filter_skip_last_level"]
    assert ({"bloom_filter_skip_last_level": 0}, TypeError) in BAD_OPTIONS


@pytest.mark.parametrize("bad", [None, 7, 1.5, ["p"], object()])
def test_open_with_a_path_of_the_wrong_type_is_a_type_error(bad):
    with pytest.raises(TypeError):
        lsmdb.open(bad)


def test_open_with_a_bytes_path_creates_nothing_before_failing(tmp_path):
    """A bytes path either works or is refused before anything is created."""
    target = tmp_path / "bytes-db"
    try:
        d = lsmdb.open(os.fsencode(target))
    except TypeError:
        assert not target.exists(), "refused a bytes path after creating the directory"
    else:
        d.put(b"k", b"v")
        d.close()
        with lsmdb.open(target) as again:
            assert again.get(b"k") == b"v"


def test_open_accepts_a_pathlib_path(tmp_path):
    with lsmdb.open(tmp_path / "db") as d:
        d.put(b"k", b"v")
    with lsmdb.open(pathlib.Path(tmp_path, "db")) as d:
        assert d.get(b"k") == b"v"


# --------------------------------------------------------------------------- table names

BAD_NAMES = ["", "a" * 65, "a/b", "../escape", "..", ".", "a b", "tab\tle", "naïve", "x\x00",
             "/abs", "a\\b", "name.sst"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_invalid_table_names_are_refused_and_create_nothing(db, path, name):
    parent_before = sorted(os.listdir(os.path.dirname(path)))
    before = digest(path, skip=("LOCK", "STATS"))
    with pytest.raises(ValueError):
        db.create_table(name)
    with pytest.raises(ValueError):
        db.table(name)
    with pytest.raises(ValueError):
        db.alter_table(name, bloom_filter_fp_chance=0.1)
    with pytest.raises(ValueError):
        db.drop_table(name)
    for call in (lambda: db.flush(name), lambda: db.sstables(name), lambda: db.table_stats(name),
                 lambda: db.compact(name), lambda: db.trace(b"k", table=name),
                 lambda: db.rebuild_filters(name)):
        with pytest.raises((ValueError, lsmdb.NoSuchTableError)):
            call()
    with pytest.raises((ValueError, lsmdb.NoSuchTableError)):
        with db.batch() as b:
            b.put(b"k", b"v", table=name)
    assert db.tables() == ["default", "t"]
    assert sorted(os.listdir(os.path.dirname(path))) == parent_before
    assert digest(path, skip=("LOCK", "STATS")) == before


@pytest.mark.parametrize("name", [None, 7, b"t", ["t"]], ids=["None", "int", "bytes", "list"])
def test_table_names_of_the_wrong_type_are_type_errors(db, name):
    for call in (lambda: db.create_table(name), lambda: db.alter_table(name, min_threshold=4),
                 lambda: db.drop_table(name)):
        with pytest.raises(TypeError):
            call()
    if name is not None:  # None means "the default table" / "every table" for these
        for call in (lambda: db.table(name), lambda: db.flush(name), lambda: db.sstables(name),
                     lambda: db.table_stats(name), lambda: db.compact(name),
                     lambda: db.trace(b"k", table=name)):
            with pytest.raises(TypeError):
                call()
        with pytest.raises(TypeError):
            with db.batch() as b:
                b.put(b"k", b"v", table=name)
    assert db.tables() == ["default", "t"]


def test_table_existence_errors(db):
    with pytest.raises(lsmdb.TableExistsError):
        db.create_table("t")
    with pytest.raises(lsmdb.TableExistsError):
        db.create_table("default")
    with pytest.raises(ValueError):
        db.drop_table("default")
    for call in (lambda: db.table("missing"), lambda: db.drop_table("missing"),
                 lambda: db.alter_table("missing", min_threshold=4), lambda: db.flush("missing")):
        with pytest.raises(lsmdb.NoSuchTableError) as info:
            call()
        assert isinstance(info.value, KeyError)
        assert "missing" in str(info.value)
    t = db.table("t")
    db.drop_table("t")
    for call in (lambda: t.put(b"k", b"v"), lambda: t.get(b"x"), lambda: list(t.scan()),
                 lambda: t.delete(b"x"), lambda: t[b"x"], lambda: b"x" in t):
        with pytest.raises(lsmdb.NoSuchTableError):
            call()


# --------------------------------------------------------------------------- use after close

def _closed_calls(d: lsmdb.DB, t: lsmdb.Table, batch: lsmdb.WriteBatch):
    def delitem(m):
        del m[b"a"]

    def setitem(m):
        m[b"a"] = b"v"

    return {
        "put": lambda: d.put(b"k", b"v"),
        "get": lambda: d.get(b"a"),
        "delete": lambda: d.delete(b"a"),
        "scan": lambda: list(d.scan()),
        "batch": lambda: d.batch(),
        "batch-commit": batch.commit,
        "flush": lambda: d.flush(),
        "compact": lambda: d.compact(),
        "create_table": lambda: d.create_table("u"),
        "alter_table": lambda: d.alter_table("t", bloom_filter_fp_chance=0.1),
        "drop_table": lambda: d.drop_table("t"),
        "table": lambda: d.table("t"),
        "tables": lambda: d.tables(),
        "sstables": lambda: d.sstables(),
        "table_stats": lambda: d.table_stats(),
        "trace": lambda: d.trace(b"a"),
        "rebuild_filters": lambda: d.rebuild_filters(),
        "wait_for_compactions": lambda: d.wait_for_compactions(),
        "getitem": lambda: d[b"a"],
        "setitem": lambda: setitem(d),
        "contains": lambda: b"a" in d,
        "delitem": lambda: delitem(d),
        "table.put": lambda: t.put(b"k", b"v"),
        "table.get": lambda: t.get(b"x"),
        "table.delete": lambda: t.delete(b"x"),
        "table.scan": lambda: list(t.scan()),
        "table.flush": lambda: t.flush(),
        "table.getitem": lambda: t[b"x"],
        "table.setitem": lambda: setitem(t),
        "table.contains": lambda: b"x" in t,
        "table.delitem": lambda: delitem(t),
    }


@pytest.mark.parametrize("read_only", [False, True], ids=["read-write", "read-only"])
def test_every_method_after_close_raises_database_closed(db, path, read_only):
    if read_only:
        db.close()
        db = lsmdb.open(path, read_only=True)
    t = db.table("t")
    # bypasses db.batch(), which refuses read-only at once
    batch = lsmdb.WriteBatch(db._writes, db._table_state)
    batch.put(b"late", b"write", table="t")
    db.close()
    db.close()  # idempotent
    assert db.closed
    for name, call in _closed_calls(db, t, batch).items():
        with pytest.raises(lsmdb.DatabaseClosedError):
            call()
            pytest.fail(f"{name} worked on a closed database")
    with lsmdb.open(path) as again:
        assert again.table("t").get(b"late") is None
        assert again.get(b"k") is None


# --------------------------------------------------------------------------- not a database

def test_a_directory_that_is_not_a_database_is_refused_untouched(tmp_path):
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"\xff\xd8 not a database")
    (foreign / "sub").mkdir()
    before = digest(str(foreign))
    for kwargs in ({}, {"read_only": True}, {"create_if_missing": False}):
        with pytest.raises(lsmdb.NotADatabaseError):
            lsmdb.open(foreign, **kwargs)
        assert digest(str(foreign)) == before, kwargs  # not even a LOCK file
    assert verify_database(str(foreign))  # and verify says so


def test_a_file_path_instead_of_a_directory_is_refused_untouched(tmp_path):
    f = tmp_path / "data.db"
    f.write_bytes(b"some file")
    for kwargs in ({}, {"read_only": True}, {"create_if_missing": False}):
        with pytest.raises(lsmdb.NotADatabaseError):
            lsmdb.open(f, **kwargs)
        assert f.read_bytes() == b"some file"
    assert sorted(os.listdir(tmp_path)) == ["data.db"]


def test_missing_or_empty_directory_without_create_is_refused_untouched(tmp_path):
    missing = tmp_path / "missing"
    for kwargs in ({"create_if_missing": False}, {"read_only": True}):
        with pytest.raises(lsmdb.NotADatabaseError):
            lsmdb.open(missing, **kwargs)
        assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    for kwargs in ({"create_if_missing": False}, {"read_only": True}):
        with pytest.raises(lsmdb.NotADatabaseError):
            lsmdb.open(empty, **kwargs)
        assert os.listdir(empty) == []


# --------------------------------------------------------------------------- newer formats

def _newer_format_case(db, path):
    db.flush()
    snapshot = contents(db)
    sst = sorted(n for n in os.listdir(path) if n.endswith(".sst"))
    db.close()
    return snapshot, sst


def _assert_refused_and_unchanged(path, snapshot, what):
    before = digest(path)
    for read_only in (False, True):
        with pytest.raises(lsmdb.UnsupportedFormatError) as info:
            lsmdb.open(path, read_only=read_only)
        assert what in str(info.value)
        assert digest(path) == before
    assert any(p.severity == "error" for p in verify_database(path))


def test_manifest_of_a_newer_format_version_is_refused_and_left_alone(db, path):
    snapshot, _sst = _newer_format_case(db, path)
    manifest = os.path.join(path, MANIFEST_NAME)
    original = pathlib.Path(manifest).read_bytes()
    # Header: magic 8s | format_version u32 | crc32 u32 (of the payload) | length u32.
    for version in (99, MANIFEST_FORMAT_VERSION + 1, 2**32 - 1):
        patched = bytearray(original)
        struct.pack_into("<I", patched, 8, version)
        pathlib.Path(manifest).write_bytes(bytes(patched))
        _assert_refused_and_unchanged(path, snapshot, "manifest format version")
    pathlib.Path(manifest).write_bytes(original)
    with lsmdb.open(path) as again:
        assert contents(again) == snapshot


def test_sstable_of_a_newer_format_version_is_refused_and_left_alone(db, path):
    snapshot, sst = _newer_format_case(db, path)
    target = os.path.join(path, sst[0])
    original = pathlib.Path(target).read_bytes()
    for version in (max(READABLE_VERSIONS) + 1, 99, 2**32 - 1):
        patched = bytearray(original)
        foot = len(patched) - FOOTER_SIZE
        # Footer: six u64 handles | format_version u32 | crc32 u32 of the 52 bytes before | magic.
        struct.pack_into("<I", patched, foot + 48, version)
        struct.pack_into("<I", patched, foot + 52, crc32(bytes(patched[foot:foot + 52])))
        pathlib.Path(target).write_bytes(bytes(patched))
        _assert_refused_and_unchanged(path, snapshot, "SSTable format version")
    pathlib.Path(target).write_bytes(original)
    with lsmdb.open(path) as again:
        assert contents(again) == snapshot


def test_filter_of_a_newer_format_version_fails_open(db, path):
    """A filter it cannot read only slows reads down: data stays correct, verify tells."""
    snapshot, sst = _newer_format_case(db, path)
    target = os.path.join(path, sst[0])
    r = SSTableReader(target)
    off, size = r.filter_handle
    r.close()
    patched = bytearray(pathlib.Path(target).read_bytes())
    patched[off] = 3  # filter format version u8: newer than any this code reads
    struct.pack_into("<I", patched, off + size, crc32(bytes(patched[off:off + size])))
    pathlib.Path(target).write_bytes(bytes(patched))
    with lsmdb.open(path) as again:
        assert contents(again) == snapshot
        assert all(again.get(k) == v for k, v in snapshot["default"].items())
        assert [i for i in again.sstables() if i.filter_error]
    assert [p for p in verify_database(path)
            if p.severity == "error" and p.path == target]


# --------------------------------------------------------------------------- read-only

def test_read_only_database_refuses_every_write_and_changes_nothing(db, path):
    db.close()
    before = digest(path)
    ro = lsmdb.open(path, read_only=True)
    try:
        t = ro.table("t")
        snapshot = contents(ro)

        def setitem(m):
            m[b"a"] = b"v"

        def delitem(m, k):
            del m[k]

        def batch():
            with ro.batch() as b:
                b.put(b"k", b"v")

        writes = {
            "put": lambda: ro.put(b"k", b"v"), "delete": lambda: ro.delete(b"a"),
            "setitem": lambda: setitem(ro), "delitem": lambda: delitem(ro, b"a"),
            "batch": batch, "flush": lambda: ro.flush(), "compact": lambda: ro.compact(),
            "create_table": lambda: ro.create_table("u"),
            "alter_table": lambda: ro.alter_table("t", bloom_filter_fp_chance=0.1),
            "drop_table": lambda: ro.drop_table("t"),
            "rebuild_filters": lambda: ro.rebuild_filters(only_stale=False),
            "table.put": lambda: t.put(b"k", b"v"), "table.delete": lambda: t.delete(b"x"),
            "table.setitem": lambda: setitem(t), "table.delitem": lambda: delitem(t, b"x"),
            "table.flush": lambda: t.flush(),
        }
        for name, call in writes.items():
            with pytest.raises(lsmdb.ReadOnlyError):
                call()
                pytest.fail(f"{name} wrote to a read-only database")
        assert contents(ro) == snapshot
        assert ro.get(b"a") == b"1" and t[b"x"] == b"in t"
        assert ro.sstables() and ro.table_stats()["files"] and ro.trace(b"a")
    finally:
        ro.close()
    assert digest(path) == before


# --------------------------------------------------------------------------- other constructors

@pytest.mark.parametrize("args,exc", [
    (("10",), TypeError), ((10.0,), TypeError), ((True,), TypeError), ((-1,), ValueError),
    ((10, 0.0), ValueError), ((10, 1.5), ValueError), ((10, math.nan), ValueError),
    ((10, "0.01"), TypeError), ((10, False), TypeError),
])
def test_bloom_filter_constructor_rejects_bad_arguments(args, exc):
    with pytest.raises(exc):
        lsmdb.BloomFilter(*args)


def test_bloom_filter_with_size_and_table_options_reject_bad_arguments():
    for m, k in ((0, 1), (1, 0), (-5, 3)):
        with pytest.raises(ValueError):
            lsmdb.BloomFilter.with_size(m, k)
    for options, exc in BAD_OPTIONS:
        with pytest.raises(exc):
            lsmdb.TableOptions.resolve(options)
