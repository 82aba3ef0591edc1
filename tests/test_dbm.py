"""lsmdb.dbm against the contract of the standard library's dbm modules, and shelve on top."""

from __future__ import annotations

import errno
import gc
import os
import pathlib
import random
import shelve
import stat
import threading

import pytest

import lsmdb
import lsmdb.dbm as ldbm

DATA = {
    "a": b"Python:",
    "b": b"Programming",
    "c": b"the",
    "d": b"way",
    "f": b"Guido",
    "g": b"intended",
}


class StrPath:
    """A minimal os.PathLike whose __fspath__ returns what it was given (str or bytes)."""

    def __init__(self, path: str | bytes) -> None:
        self.path = path

    def __fspath__(self) -> str | bytes:
        return self.path


@pytest.fixture
def path(tmp_path: pathlib.Path) -> str:
    return str(tmp_path / "db")


def fill(path: str) -> None:
    d = ldbm.open(path, "n")
    for k, v in DATA.items():
        d[k.encode("ascii")] = v
    d.close()


def check_contents(d: ldbm.Database, expected: dict[str, bytes]) -> None:
    assert sorted(k.decode("ascii") for k in d.keys()) == sorted(expected)
    for k, v in expected.items():
        assert d[k.encode("ascii")] == v


# ----------------------------------------------------------------- errors
def test_error_is_an_oserror_and_an_lsmdb_error() -> None:
    assert issubclass(ldbm.error, OSError)
    assert issubclass(ldbm.error, lsmdb.LsmdbError)


@pytest.mark.parametrize("flag", ["r", "w"])
def test_opening_a_missing_database_raises_error(path: str, flag: str) -> None:
    with pytest.raises(ldbm.error) as info:
        ldbm.open(path, flag)
    assert info.value.errno == errno.ENOENT
    assert info.value.filename == path
    assert path in str(info.value)
    assert not os.path.exists(path)


def test_default_flag_is_read_only(path: str) -> None:
    with pytest.raises(ldbm.error):
        ldbm.open(path)
    fill(path)
    with ldbm.open(path) as d:
        with pytest.raises(ldbm.error):
            d[b"x"] = b"y"


@pytest.mark.parametrize("flag", ["", "rw", "x", "cf", None, b"c"])
def test_unknown_flag_is_a_value_error(path: str, flag: object) -> None:
    with pytest.raises(ValueError):
        ldbm.open(path, flag)  # type: ignore[arg-type]
    assert not os.path.exists(path)


def test_w_on_an_empty_directory_is_an_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ldbm.error):
        ldbm.open(tmp_path, "w")
    with pytest.raises(ldbm.error):
        ldbm.open(tmp_path, "r")


def test_c_on_a_regular_file_is_an_error(tmp_path: pathlib.Path) -> None:
    p = tmp_path / "file"
    p.write_bytes(b"not a database")
    with pytest.raises(ldbm.error):
        ldbm.open(p, "c")
    assert p.read_bytes() == b"not a database"


def test_c_in_a_missing_parent_is_an_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ldbm.error):
        ldbm.open(tmp_path / "no" / "such" / "db", "c")


def test_second_writer_gets_error(path: str) -> None:
    with ldbm.open(path, "c"):
        with pytest.raises(ldbm.error) as info:
            ldbm.open(path, "w")
        assert isinstance(info.value.__cause__, lsmdb.DatabaseLockedError)


# --------------------------------------------------------- create / modify
def test_creation(path: str) -> None:
    d = ldbm.open(path, "c")
    assert d.keys() == []
    assert len(d) == 0
    for k, v in DATA.items():
        d[k.encode("ascii")] = v
    check_contents(d, DATA)
    d.close()
    with ldbm.open(path, "r") as d:
        check_contents(d, DATA)


def test_c_opens_an_existing_database(path: str) -> None:
    fill(path)
    with ldbm.open(path, "c") as d:
        check_contents(d, DATA)


def test_modification(path: str) -> None:
    fill(path)
    expected = dict(DATA)
    with ldbm.open(path, "w") as d:
        d[b"g"] = expected["g"] = b"indented"
        check_contents(d, expected)
        assert d.setdefault(b"xxx", b"foo") == b"foo"
        assert d[b"xxx"] == b"foo"
        assert d.setdefault(b"xxx", b"bar") == b"foo"
        del d[b"a"]
        with pytest.raises(KeyError):
            del d[b"a"]
        with pytest.raises(KeyError):
            d[b"a"]
    with ldbm.open(path, "r") as d:
        assert d[b"g"] == b"indented"
        assert d[b"xxx"] == b"foo"
        assert b"a" not in d


def test_read(path: str) -> None:
    fill(path)
    with ldbm.open(path, "r") as d:
        check_contents(d, DATA)
        assert d.get(b"a") == DATA["a"]
        assert d.get(b"xxx", b"foo") == b"foo"
        assert d.get(b"xxx") is None
        assert b"a" in d and "a" in d
        assert b"xxx" not in d
        with pytest.raises(KeyError):
            d[b"xxx"]
        # setdefault of a present key is a read
        assert d.setdefault(b"a", b"other") == DATA["a"]


def test_read_only_refuses_every_write(path: str) -> None:
    fill(path)
    with ldbm.open(path, "r") as d:
        with pytest.raises(ldbm.error):
            d[b"new"] = b"value"
        with pytest.raises(ldbm.error):
            d[b"a"] = b"value"
        with pytest.raises(ldbm.error):  # before the KeyError, as gdbm/ndbm do
            del d[b"not there"]
        with pytest.raises(ldbm.error):
            del d[b"a"]
        with pytest.raises(ldbm.error):
            d.setdefault(b"not there", b"x")
        with pytest.raises(ldbm.error):
            d.clear()
        with pytest.raises(ldbm.error):
            d.update({b"k": b"v"})
        d.sync()  # a no-op, not an error
        check_contents(d, DATA)
    with ldbm.open(path, "r") as d:
        check_contents(d, DATA)


def test_read_only_works_while_a_writer_has_it_open(path: str) -> None:
    with ldbm.open(path, "c") as w:
        w[b"k"] = b"v"
        with ldbm.open(path, "r") as r:
            assert r[b"k"] == b"v"
            assert r.keys() == [b"k"]


def test_keys(path: str) -> None:
    with ldbm.open(path, "c") as d:
        assert d.keys() == []
        pairs = [(b"a", b"b"), (b"12345678910", b"019237410982340912840198242")]
        for k, v in pairs:
            d[k] = v
        keys = d.keys()
        assert isinstance(keys, list)
        assert keys == sorted(k for k, _ in pairs)
        for k, v in pairs:
            assert k in d
            assert d[k] == v
        assert b"xxx" not in d
        with pytest.raises(KeyError):
            d[b"xxx"]
        assert list(d) == keys
        assert dict(d.items()) == dict(pairs)
        assert sorted(d.values()) == sorted(v for _, v in pairs)


def test_empty_value_is_not_an_absent_key(path: str) -> None:
    with ldbm.open(path, "c") as d:
        assert d.keys() == []
        d[b"empty"] = b""
        assert d.keys() == [b"empty"]
        assert b"empty" in d
        assert d[b"empty"] == b""
        assert d.get(b"empty") == b""
        assert d.get(b"empty", b"default") == b""
        assert d.setdefault(b"empty") == b""
        assert len(d) == 1
    with ldbm.open(path, "r") as d:
        assert d[b"empty"] == b""


def test_empty_key(path: str) -> None:
    with ldbm.open(path, "c") as d:
        d[b""] = b"v"
        assert d[b""] == b"v" and "" in d
        assert d.keys() == [b""]


def test_setdefault_default_is_the_empty_value(path: str) -> None:
    with ldbm.open(path, "c") as d:
        assert d.setdefault(b"k") == b""
        assert d[b"k"] == b""


def test_clear(path: str) -> None:
    with ldbm.open(path, "c") as d:
        d.clear()  # empty: nothing to do
        assert d.keys() == []
        d[b"a"] = b"b"
        d[b"c"] = b"d"
        d.clear()
        assert d.keys() == []
        assert len(d) == 0
        assert b"a" not in d
        d[b"e"] = b"f"
        assert d.keys() == [b"e"]
    with ldbm.open(path, "r") as d:
        assert d.keys() == [b"e"]


def test_clear_in_several_batches(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ldbm, "_CLEAR_BATCH_KEYS", 7)
    with ldbm.open(path, "c") as d:
        for i in range(50):
            d[b"%03d" % i] = b"x" * i
        d.sync()  # half in SSTables, half in the memtable
        for i in range(50, 100):
            d[b"%03d" % i] = b"y"
        assert len(d) == 100
        d.clear()
        assert len(d) == 0 and d.keys() == []
    with ldbm.open(path, "r") as d:
        assert d.keys() == [] and len(d) == 0


def test_mutable_mapping_methods(path: str) -> None:
    with ldbm.open(path, "c") as d:
        d.update({b"a": b"1", "b": "2"}, c=b"3")
        assert d.keys() == [b"a", b"b", b"c"]
        assert d.pop(b"a") == b"1"
        assert d.pop(b"a", None) is None
        with pytest.raises(KeyError):
            d.pop(b"a")
        assert d.popitem() == (b"b", b"2")
        assert d == {b"c": b"3"}
        assert bool(d)
        del d[b"c"]
        assert not d


# ---------------------------------------------------------------- str keys
def test_str_keys_and_values_are_utf8(path: str) -> None:
    with ldbm.open(path, "c") as d:
        d["Unicode key \U0001f40d"] = "Unicode value \U0001f40d"
        d[b"bytes key \xbd"] = b"bytes value \xbd"
        d[bytearray(b"ba")] = memoryview(b"mv")
    with ldbm.open(path, "r") as d:
        assert sorted(d.keys()) == sorted([
            "Unicode key \U0001f40d".encode(), b"bytes key \xbd", b"ba"])
        assert "Unicode key \U0001f40d" in d
        assert "Unicode key \U0001f40d".encode() in d
        assert d["Unicode key \U0001f40d"] == "Unicode value \U0001f40d".encode()
        assert d[b"bytes key \xbd"] == b"bytes value \xbd"
        assert d[b"ba"] == b"mv"


@pytest.mark.parametrize("bad", [1, 1.5, None, ("t",), object()])
def test_other_key_and_value_types_are_type_errors(path: str, bad: object) -> None:
    with ldbm.open(path, "c") as d:
        with pytest.raises(TypeError):
            d[bad] = b"v"  # type: ignore[index]
        with pytest.raises(TypeError):
            d[b"k"] = bad  # type: ignore[assignment]
        with pytest.raises(TypeError):
            d[bad]  # type: ignore[index]
        with pytest.raises(TypeError):
            assert bad in d
        assert d.keys() == []


# -------------------------------------------------------------- path types
@pytest.mark.parametrize("kind", ["str", "bytes", "pathlib", "pathlike-str", "pathlike-bytes"])
def test_path_types(path: str, kind: str) -> None:
    arg: object = {
        "str": path,
        "bytes": os.fsencode(path),
        "pathlib": pathlib.Path(path),
        "pathlike-str": StrPath(path),
        "pathlike-bytes": StrPath(os.fsencode(path)),
    }[kind]
    with ldbm.open(arg, "c") as d:  # type: ignore[arg-type]
        d[b"k"] = b"v"
    assert os.path.isdir(path)
    with ldbm.open(arg, "r") as d:  # type: ignore[arg-type]
        assert d[b"k"] == b"v"
    with ldbm.open(arg, "n") as d:  # type: ignore[arg-type]
        assert d.keys() == []


def test_non_ascii_path(tmp_path: pathlib.Path) -> None:
    p = tmp_path / "d\u00e9j\u00e0-\U0001f40d"
    with ldbm.open(p, "c") as d:
        d[b"key"] = b"value"
    with ldbm.open(str(p), "r") as d:
        assert d[b"key"] == b"value"


# --------------------------------------------------------------------- "n"
def test_n_creates(path: str) -> None:
    with ldbm.open(path, "n") as d:
        assert len(d) == 0
        d[b"k"] = b"v"
    with ldbm.open(path, "r") as d:
        assert d.keys() == [b"k"]


def test_n_replaces_an_existing_database(path: str) -> None:
    fill(path)
    with ldbm.open(path, "w") as d:
        d.sync()  # leave SSTables as well as a WAL behind
        d[b"more"] = b"x"
    with ldbm.open(path, "n") as d:
        assert d.keys() == []
        assert len(d) == 0
    with ldbm.open(path, "r") as d:
        assert d.keys() == []


def test_n_replaces_a_database_with_named_tables(path: str) -> None:
    with lsmdb.open(path) as db:
        db.create_table("other").put(b"k", b"v")
        db.flush()
    with ldbm.open(path, "n"):
        pass
    with lsmdb.open(path) as db:
        assert db.tables() == ["default"]


@pytest.mark.parametrize("content", [b"", b"some garbage that is not a database"])
def test_n_over_a_regular_file(path: str, content: bytes) -> None:
    with open(path, "wb") as f:
        f.write(content)
    with ldbm.open(path, "n") as d:
        assert len(d) == 0
        d[b"k"] = b"v"
    assert os.path.isdir(path)
    with ldbm.open(path, "r") as d:
        assert d[b"k"] == b"v"


def test_n_over_an_empty_directory(tmp_path: pathlib.Path) -> None:
    with ldbm.open(tmp_path, "n") as d:
        assert d.keys() == []


def test_n_over_a_symlink_to_a_file_removes_the_link_only(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    link = tmp_path / "db"
    link.symlink_to(target)
    with ldbm.open(link, "n") as d:
        d[b"k"] = b"v"
    assert target.read_text() == "keep me"
    assert link.is_dir() and not link.is_symlink()


def test_n_over_a_symlink_to_a_database_keeps_the_link(tmp_path: pathlib.Path) -> None:
    real = tmp_path / "real"
    fill(str(real))
    link = tmp_path / "db"
    link.symlink_to(real, target_is_directory=True)
    with ldbm.open(link, "n") as d:
        assert d.keys() == []
        d[b"new"] = b"1"
    assert link.is_symlink()
    with ldbm.open(real, "r") as d:
        assert d.keys() == [b"new"]


def test_n_refuses_a_directory_that_is_not_a_database(tmp_path: pathlib.Path) -> None:
    victim = tmp_path / "home"
    victim.mkdir()
    (victim / "notes.txt").write_text("important")
    (victim / "MANIFEST").write_text("a user file that happens to share a name")
    with pytest.raises(ldbm.error) as info:
        ldbm.open(victim, "n")
    assert "not an lsmdb database" in str(info.value)
    assert sorted(os.listdir(victim)) == ["MANIFEST", "notes.txt"]
    assert (victim / "notes.txt").read_text() == "important"


def test_n_refuses_a_database_with_a_foreign_file(path: str) -> None:
    fill(path)
    with open(os.path.join(path, "README"), "w") as f:
        f.write("mine")
    with pytest.raises(ldbm.error):
        ldbm.open(path, "n")
    with ldbm.open(path, "r") as d:  # untouched
        check_contents(d, DATA)


def test_n_refuses_a_database_open_elsewhere(path: str) -> None:
    fill(path)
    with ldbm.open(path, "w"):
        with pytest.raises(ldbm.error):
            ldbm.open(path, "n")
    with ldbm.open(path, "r") as d:
        check_contents(d, DATA)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_n_refuses_a_special_file(path: str) -> None:
    os.mkfifo(path)
    with pytest.raises(ldbm.error):
        ldbm.open(path, "n")
    assert stat.S_ISFIFO(os.lstat(path).st_mode)


# ------------------------------------------------------------- mode, close
def test_mode_sets_the_directory_permissions(tmp_path: pathlib.Path) -> None:
    old = os.umask(0o022)
    try:
        ldbm.open(tmp_path / "a", "c", 0o600).close()
        ldbm.open(tmp_path / "b", "n", 0o666).close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "b").st_mode) == 0o755


def test_closed_database_raises_error(path: str) -> None:
    d = ldbm.open(path, "c")
    d[b"k"] = b"v"
    it = iter(d)
    d.close()
    d.close()  # idempotent
    assert d.closed
    for op in (lambda: d[b"k"], lambda: d.get(b"k"), lambda: b"k" in d, d.keys, lambda: len(d),
               lambda: list(d), lambda: d.__setitem__(b"k", b"w"),
               lambda: d.__delitem__(b"k"), d.clear, d.sync, lambda: list(it)):
        with pytest.raises(ldbm.error):
            op()


def test_context_manager_closes(path: str) -> None:
    with ldbm.open(path, "c") as d:
        d[b"k"] = b"v"
    assert d.closed
    with pytest.raises(ldbm.error):
        d.keys()
    with ldbm.open(path, "w") as d2:  # the lock was released
        assert d2[b"k"] == b"v"


def test_dropping_the_object_releases_the_database(path: str) -> None:
    d = ldbm.open(path, "c")
    d[b"k"] = b"v"
    del d
    gc.collect()
    with ldbm.open(path, "w") as d:
        assert d[b"k"] == b"v"


def test_sync_fsyncs_the_write_ahead_log(path: str, monkeypatch) -> None:
    import os as _os
    calls = []
    real_fsync = _os.fsync
    with ldbm.open(path, "c") as d:
        d[b"k"] = b"v"
        monkeypatch.setattr(_os, "fsync", lambda fd: (calls.append(fd), real_fsync(fd)))
        d.sync()
        monkeypatch.setattr(_os, "fsync", real_fsync)
        assert calls, "sync() must fsync the write-ahead log"
    with lsmdb.open(path, read_only=True) as db:
        assert db[b"k"] == b"v"


def test_sync_without_writes_writes_nothing(path: str) -> None:
    with ldbm.open(path, "c") as d:
        d[b"k"] = b"v"              # only in the write-ahead log (close fsyncs it)
    with ldbm.open(path, "w") as d:
        d.sync()
        assert d[b"k"] == b"v"
    with ldbm.open_shelf(path, "w") as s:   # Shelf.close() calls sync()
        len(s)
    with lsmdb.open(path, read_only=True) as db:
        assert db.sstables() == []
        assert db[b"k"] == b"v"


# --------------------------------------------------------------- iteration
def test_iteration_is_a_snapshot_in_key_order(path: str) -> None:
    with ldbm.open(path, "c") as d:
        for i in range(20):
            d[b"%02d" % i] = b"v"
        seen = []
        for key in d:
            seen.append(key)
            del d[key]          # changing the mapping while iterating is fine
            d[key + b"+"] = b"w"
        assert seen == [b"%02d" % i for i in range(20)]
        assert d.keys() == [b"%02d+" % i for i in range(20)]


def test_len_stays_right_through_every_kind_of_write(path: str) -> None:
    with ldbm.open(path, "c") as d:
        def raises(exc: type[BaseException], op) -> None:
            with pytest.raises(exc):
                op()

        steps = [
            lambda: d.__setitem__(b"a", b"1"),
            lambda: d.__setitem__(b"a", b"2"),            # overwrite: same count
            lambda: d.__setitem__(b"b", b""),
            lambda: d.setdefault(b"c", b"3"),
            lambda: d.setdefault(b"c", b"4"),
            lambda: d.update({b"c": b"5", b"d": b"6"}),
            lambda: d.__delitem__(b"a"),
            lambda: raises(KeyError, lambda: d.__delitem__(b"a")),
            lambda: d.pop(b"b"),
            d.popitem,
            lambda: raises(TypeError, lambda: d.__setitem__(b"x", 5)),
            d.clear,
            lambda: d.__setitem__(b"z", b"z"),
        ]
        assert len(d) == 0
        for step in steps:
            step()
            assert len(d) == len(d.keys())
        assert len(d) == 1
    with ldbm.open(path, "r") as d:
        assert len(d) == 1


def test_concurrent_writers_keep_len_right(path: str) -> None:
    with ldbm.open(path, "c") as d:
        assert len(d) == 0  # the count is now cached and maintained

        def work(n: int) -> None:
            for i in range(200):
                d[b"%d" % (i % 150)] = b"%d" % n   # the same keys from every thread

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(d) == 150 == len(d.keys())


def test_many_keys_survive_flushes_and_reopen(path: str) -> None:
    expected = {b"key-%05d" % i: os.urandom(i % 50) for i in range(3000)}
    with ldbm.open(path, "c") as d:
        for k, v in expected.items():
            d[k] = v
        d.sync()
        for k in list(expected)[::3]:
            del d[k]
            del expected[k]
    with ldbm.open(path, "r") as d:
        assert len(d) == len(expected)
        assert d.keys() == sorted(expected)
        assert all(d[k] == v for k, v in expected.items())


@pytest.mark.parametrize("seed", [1, 2])
def test_random_operations_match_a_dict(path: str, seed: int) -> None:
    rng = random.Random(seed)
    model: dict[bytes, bytes] = {}
    d = ldbm.open(path, "c")
    try:
        for _ in range(3000):
            op = rng.random()
            key = b"%d" % rng.randrange(300)
            if op < 0.45:
                value = rng.randbytes(rng.choice([0, 1, 5, 30]))
                d[key] = model[key] = value
            elif op < 0.65:
                if key in model:
                    del d[key], model[key]
                else:
                    with pytest.raises(KeyError):
                        del d[key]
            elif op < 0.8:
                assert d.get(key) == model.get(key)
                assert (key in d) == (key in model)
            elif op < 0.9:
                assert len(d) == len(model)
            elif op < 0.995:
                assert d.setdefault(key, b"sd") == model.setdefault(key, b"sd")
            elif op < 0.997:
                d.sync()
            else:
                d.close()
                d = ldbm.open(path, rng.choice("wc"))
        assert d.keys() == sorted(model)
        assert dict(d.items()) == model
    finally:
        d.close()
    with ldbm.open(path, "r") as r:
        assert len(r) == len(model)
        assert dict(r.items()) == model


# ------------------------------------------------------------------ shelve
def test_shelf_round_trip_across_reopen(path: str) -> None:
    record = {"name": "alice", "tags": ["a", "b"], "score": 1.5, "raw": b"\x00\xff"}
    s = shelve.Shelf(ldbm.open(path, "c"))
    s["alice"] = record
    s["numbers"] = list(range(100))
    s["caf\u00e9"] = ("unicode", "key")
    s["empty"] = None
    assert len(s) == 4
    s.close()

    s = shelve.Shelf(ldbm.open(path, "r"))
    try:
        assert sorted(s.keys()) == sorted(["alice", "numbers", "caf\u00e9", "empty"])
        assert s["alice"] == record
        assert s["numbers"] == list(range(100))
        assert s["caf\u00e9"] == ("unicode", "key")
        assert s["empty"] is None
        assert "alice" in s and "bob" not in s
        with pytest.raises(ldbm.error):
            s["bob"] = 1
    finally:
        s.close()

    with ldbm.open_shelf(path, "w") as s:
        del s["numbers"]
        s["alice"] = {**record, "score": 2.0}
    with ldbm.open_shelf(path, "r") as s:
        assert dict(s) == {"alice": {**record, "score": 2.0}, "caf\u00e9": ("unicode", "key"),
                           "empty": None}


def test_open_shelf_writeback_and_protocol(path: str) -> None:
    with ldbm.open_shelf(path, "c", protocol=2, writeback=True) as s:
        s["list"] = [1]
        s["list"].append(2)   # only kept because of writeback
    with ldbm.open(path, "r") as d:
        assert d[b"list"][:2] == b"\x80\x02"   # pickle protocol 2 header
    with ldbm.open_shelf(path, "r") as s:
        assert s["list"] == [1, 2]
    with ldbm.open_shelf(path, "n") as s:
        assert len(s) == 0


def test_open_shelf_default_flag_creates(path: str) -> None:
    with ldbm.open_shelf(path) as s:
        s["k"] = 1
    assert os.path.isdir(path)
