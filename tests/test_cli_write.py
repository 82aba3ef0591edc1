"""The ``lsmdb`` commands that write (lsmdb/cli_write.py): --create, create-table, import with
table options, and nothing left behind by a command that fails after creating its database."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

import lsmdb
import lsmdb.cli
from lsmdb.options import OPTION_CHOICES, OPTION_HELP, OPTION_NAMES


@pytest.fixture
def cli(lsmdb_cli):
    """``lsmdb ARGS`` in this process (conftest's lsmdb_cli)."""
    return lsmdb_cli


def one_line_error(r: subprocess.CompletedProcess, starts: str) -> None:
    assert r.returncode == 1, r
    assert r.stderr.startswith(f"lsmdb: {starts}"), r.stderr
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr


# ------------------------------------------------------------------ --create
@pytest.mark.parametrize("command", [("put", "{p}", "k", "v"), ("create-table", "{p}", "t"),
                                     ("import", "{p}", "{f}")])
def test_a_command_that_can_create_says_to_pass_create(tmp_path, cli, command):
    """It used to say create_if_missing=False, a Python keyword, to a command line user."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"key": "aw==", "value": "dg=="}\n')
    empty = tmp_path / "empty"
    empty.mkdir()
    for path in (tmp_path / "new", empty):
        args = [a.format(p=path, f=rows) for a in command]
        r = cli(*args)
        one_line_error(r, f"no database at {path} (")
        assert r.stderr.rstrip().endswith(": pass --create to create one")
        assert "create_if_missing" not in r.stderr
        assert os.listdir(path) == [] if path == empty else not path.exists()
        r = cli(*args, "--create")
        assert r.returncode == 0, r.stderr
        with lsmdb.open(path, read_only=True) as db:
            assert db.tables() == (["default", "t"] if "create-table" in args else ["default"])
            assert db.get(b"k") == (None if "create-table" in args else b"v")


@pytest.mark.parametrize("command", [("get", "k"), ("delete", "k"), ("scan",), ("compact",),
                                     ("inspect",), ("export",)])
def test_a_command_that_cannot_create_says_no_database_without_python_words(tmp_path, cli,
                                                                             command):
    r = cli(command[0], str(tmp_path / "new"), *command[1:])
    one_line_error(r, f"no database at {tmp_path / 'new'} (it does not exist)")
    assert "create_if_missing" not in r.stderr and "--create" not in r.stderr
    assert not (tmp_path / "new").exists()


# ------------------------------------------------------------------ create-table
def option_values() -> dict[str, object]:
    """A value other than the default for every table option."""
    values: dict[str, object] = {}
    for f in dataclasses.fields(lsmdb.TableOptions):
        if f.name in OPTION_CHOICES:
            values[f.name] = next(c for c in OPTION_CHOICES[f.name] if c != f.default)
        elif isinstance(f.default, bool):
            values[f.name] = not f.default
        elif isinstance(f.default, float):
            values[f.name] = 0.001
        else:
            values[f.name] = {"min_threshold": 3, "max_threshold": 9}.get(f.name, f.default * 2)
    return values


def as_text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def test_create_table_takes_every_table_option_typed(tmp_path, cli):
    path = str(tmp_path / "db")
    values = option_values()
    assert set(values) == set(OPTION_NAMES) == set(OPTION_HELP)
    args = [a for name, v in values.items() for a in ("--" + name.replace("_", "-"), as_text(v))]
    r = cli("create-table", path, "everything", "--create", *args)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("created table 'everything' (")
    r = cli("create-table", path, "plain")
    assert (r.returncode, r.stdout) == (0, "created table 'plain'\n")
    with lsmdb.open(path, read_only=True) as db:
        assert db.table("everything").options == lsmdb.TableOptions(**values)
        assert db.table("plain").options == lsmdb.TableOptions()


@pytest.mark.parametrize("args, starts, code", [
    (["--bloom-filter-fp-chance", "2"], "table option 'bloom_filter_fp_chance' must", 1),
    (["--min-threshold", "9", "--max-threshold", "3"], "table option 'min_threshold' (9)", 1),
    (["--block-size-bytes", "1"], "table option 'block_size_bytes' must be between", 1),
    (["--block-size-bytes", "4k"], "", 2),
    (["--compaction", "tiered"], "", 2),
    (["--bloom-filter-skip-last-level", "1"], "", 2),
])
def test_create_table_refuses_a_bad_option_before_creating_anything(tmp_path, cli, args, starts,
                                                                     code):
    path = tmp_path / "db"
    r = cli("create-table", str(path), "t", "--create", *args)
    assert r.returncode == code and "Traceback" not in r.stderr
    if code == 1:
        one_line_error(r, starts)
    assert not path.exists()


def test_create_table_of_an_existing_table_is_one_line(tmp_path, cli):
    path = str(tmp_path / "db")
    assert cli("create-table", path, "t", "--create").returncode == 0
    one_line_error(cli("create-table", path, "t"), "table 't' already exists")
    one_line_error(cli("create-table", path, "bad name"), "invalid table name 'bad name'")


# ------------------------------------------------------------------ import
def test_export_then_import_brings_back_the_table_options(tmp_path, cli):
    """An fp chance of 0.001 came back as 0.01: the export now carries each table's options."""
    src, dst, out = str(tmp_path / "src"), str(tmp_path / "dst"), str(tmp_path / "all.jsonl")
    with lsmdb.open(src) as db:
        db.create_table("events", bloom_filter_fp_chance=0.001, compaction="leveled")
        db.table("events").put(b"e", b"1")
        db.alter_table("default", block_size_bytes=1024)
        db.put(b"d", b"2")
    assert cli("export", src, "--out", out).returncode == 0
    r = cli("import", dst, out, "--create")
    assert r.returncode == 0 and r.stderr == "imported 2 rows\n", r.stderr
    with lsmdb.open(src, read_only=True) as a, lsmdb.open(dst, read_only=True) as b:
        assert b.table("events").options.bloom_filter_fp_chance == 0.001
        for name in ("default", "events"):
            assert b.table(name).options == a.table(name).options
            assert list(b.table(name).items()) == list(a.table(name).items())
    one_table = str(tmp_path / "events.jsonl")
    assert cli("export", src, "--table", "events", "--out", one_table).returncode == 0
    r = cli("import", dst, one_table, "--table", "copy")
    assert r.returncode == 0, r.stderr
    with lsmdb.open(dst, read_only=True) as b:
        assert b.table("copy").options == b.table("events").options


def test_import_into_a_table_with_options_of_its_own_keeps_them_and_says_so(tmp_path, cli):
    src, dst, out = str(tmp_path / "src"), str(tmp_path / "dst"), str(tmp_path / "all.jsonl")
    with lsmdb.open(src) as db:
        db.create_table("events", bloom_filter_fp_chance=0.001).put(b"e", b"1")
    with lsmdb.open(dst) as db:
        db.create_table("events", bloom_filter_fp_chance=0.05)
    assert cli("export", src, "--out", out).returncode == 0
    r = cli("import", dst, out)
    assert r.returncode == 0
    assert r.stderr.splitlines() == [
        "lsmdb: note: table 'events' exists with options of its own, kept: the export has "
        "bloom_filter_fp_chance=0.001 (kept 0.05)", "imported 1 rows"]
    with lsmdb.open(dst, read_only=True) as db:
        assert db.table("events").options.bloom_filter_fp_chance == 0.05
        assert db.table("events")[b"e"] == b"1"


def test_import_reads_an_export_without_options(tmp_path, cli):
    old = tmp_path / "old.jsonl"
    old.write_text('{"key": "ZA==", "value": "MQ==", "table": "default"}\n'
                   '{"key": "ZQ==", "value": "Mg==", "table": "events"}\n')
    r = cli("import", str(tmp_path / "db"), str(old), "--create")
    assert r.returncode == 0, r.stderr
    with lsmdb.open(tmp_path / "db", read_only=True) as db:
        assert (db[b"d"], db.table("events")[b"e"]) == (b"1", b"2")


DEEP = "[" * 200_000 + "]" * 200_000


@pytest.mark.parametrize("bad", [DEEP, '{"key": ' + DEEP + "}", "not json",
                                 '{"options": {"bloom_filter_fp_chance": 7}}'],
                         ids=["nested", "nested-in-an-object", "not-json", "bad-options"])
def test_a_failed_import_into_a_new_path_leaves_nothing_behind(tmp_path, bad):
    """A deeply nested line was a RecursionError traceback; and a failed import into a
    new path left an empty database there.  In a subprocess: the real stack."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"key": "aw==", "value": "dg=="}\n' * 3 + bad + "\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    for path in (tmp_path / "new", tmp_path / "a" / "b" / "new", empty):
        r = subprocess.run([sys.executable, "-m", "lsmdb", "import", str(path), str(rows),
                            "--create"], capture_output=True, text=True, timeout=60)
        one_line_error(r, "line 4: ")
        assert sorted(os.listdir(tmp_path)) == ["empty", "rows.jsonl"]
        assert os.listdir(empty) == []


def test_a_failed_import_into_an_existing_database_keeps_it(tmp_path, cli):
    """Only what the command created is removed: an existing database keeps the rows
    before the bad line (an import resumes from it)."""
    path = tmp_path / "db"
    with lsmdb.open(path) as db:
        db.put(b"mine", b"1")
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"key": "aw==", "value": "dg=="}\n' + DEEP + "\n")
    one_line_error(cli("import", str(path), str(rows), "--create"), "line 2: ")
    with lsmdb.open(path, read_only=True) as db:
        assert list(db.items()) == [(b"k", b"v"), (b"mine", b"1")]


def test_a_put_with_bad_hex_creates_nothing(tmp_path, cli):
    one_line_error(cli("put", str(tmp_path / "db"), "zz", "v", "--hex", "--create"),
                   "KEY is not valid hex")
    assert not (tmp_path / "db").exists()


def test_the_export_jsonl_lines(tmp_path, cli):
    path = str(tmp_path / "db")
    assert cli("put", path, "k", "v", "--create").returncode == 0
    r = cli("export", path, "--table", "default")
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert lines == [{"options": lsmdb.TableOptions().to_dict()}, {"key": "aw==", "value": "dg=="}]
