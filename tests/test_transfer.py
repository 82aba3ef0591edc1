"""Export (JSONL, CSV, CQL schema) and JSONL import."""

from __future__ import annotations

import base64
import csv
import io
import json
import pathlib
import random
import types

import pytest

import lsmdb
from lsmdb.transfer import (
    CASSANDRA_LOWEST_FP_CHANCE,
    cql_create_table,
    export_table,
    import_jsonl,
)


def random_rows(seed: int, n: int) -> dict[bytes, bytes]:
    rng = random.Random(seed)
    rows = {b"": b"value of the empty key", b"empty-value": b"", b"\x00": b"\x00",
            b"\xff" * 3: bytes(range(256))}
    while len(rows) < n:
        key = rng.randbytes(rng.randrange(1, 40))
        rows[key] = rng.randbytes(rng.choice([0, 1, 2, 3, 10, 100, 1000]))
    return rows


@pytest.fixture
def db(tmp_path: pathlib.Path):
    with lsmdb.open(tmp_path / "src") as database:
        yield database


def load(db: lsmdb.DB, rows: dict[bytes, bytes], table: str | None = None) -> None:
    """Write ``rows`` with some in SSTables, some in the memtable, plus deleted keys."""
    items = list(rows.items())
    half = len(items) // 2
    t = db if table is None else db.table(table)
    for k, v in items[:half]:
        t.put(k, v)
    for i in range(50):                      # keys that are gone before the export
        t.put(b"deleted-%d" % i, b"x")
    db.flush()
    for k, v in items[half:]:
        t.put(k, v)
    for i in range(50):
        t.delete(b"deleted-%d" % i)


# ------------------------------------------------------------------ jsonl
@pytest.mark.parametrize("table", [None, "events"])
def test_jsonl_round_trip_into_a_fresh_database(db: lsmdb.DB, tmp_path: pathlib.Path,
                                                table: str | None) -> None:
    if table is not None:
        db.create_table(table, bloom_filter_fp_chance=0.001)
    rows = random_rows(1, 2000)
    load(db, rows, table)
    out = io.StringIO()
    assert export_table(db, table, "jsonl", out) == len(rows)
    text = out.getvalue()

    with lsmdb.open(tmp_path / "dst") as fresh:
        if table is not None:
            fresh.create_table(table)
        loaded = import_jsonl(fresh, table, io.StringIO(text), batch_size=333)
        assert loaded == len(rows)
        t = fresh if table is None else fresh.table(table)
        assert list(t.scan()) == sorted(rows.items())
        assert t.get(b"") == b"value of the empty key"
        assert t.get(b"empty-value") == b""
        again = io.StringIO()
        export_table(fresh, table, "jsonl", again)
        assert again.getvalue() == text     # byte for byte
        fresh.flush()
        again = io.StringIO()
        export_table(fresh, table, "jsonl", again)
        assert again.getvalue() == text


def test_jsonl_lines_are_json_objects_in_key_order(db: lsmdb.DB) -> None:
    rows = random_rows(2, 300)
    load(db, rows)
    out = io.StringIO()
    export_table(db, None, "jsonl", out)
    lines = out.getvalue().split("\n")
    assert lines[-1] == ""                  # every line ends with \n
    assert json.loads(lines.pop(0)) == {"options": db.table("default").options.to_dict()}
    decoded = []
    for line in lines[:-1]:
        obj = json.loads(line)
        assert list(obj) == ["key", "value"]
        decoded.append((base64.b64decode(obj["key"], validate=True),
                        base64.b64decode(obj["value"], validate=True)))
    assert decoded == sorted(rows.items())
    value = base64.b64encode(b"value of the empty key").decode()
    assert lines[0] == f'{{"key": "", "value": "{value}"}}'


def test_export_of_an_empty_table(db: lsmdb.DB) -> None:
    out = io.StringIO()
    assert export_table(db, None, "jsonl", out, options=False) == 0
    assert out.getvalue() == ""
    assert export_table(db, None, "jsonl", out) == 0
    assert list(json.loads(out.getvalue())) == ["options"]
    out = io.StringIO()
    assert export_table(db, None, "csv", out) == 0
    assert out.getvalue() == "key,value\n"


def test_import_into_a_named_table_and_over_existing_keys(db: lsmdb.DB) -> None:
    db.create_table("t")
    db.table("t").put(b"a", b"old")
    db.table("t").put(b"keep", b"me")
    data = "".join(json.dumps({"key": base64.b64encode(k).decode(),
                               "value": base64.b64encode(v).decode()}) + "\n"
                   for k, v in [(b"a", b"new"), (b"b", b"")])
    assert import_jsonl(db, "t", io.StringIO(data)) == 2
    assert list(db.table("t").scan()) == [(b"a", b"new"), (b"b", b""), (b"keep", b"me")]
    assert list(db.scan()) == []            # the default table is untouched


def test_import_skips_blank_lines_and_extra_fields(db: lsmdb.DB) -> None:
    data = ('\n{"key": "YQ==", "value": "MQ==", "ts": 5}\r\n   \n'
            '{"value": "Mg==", "key": "Yg=="}')           # no final newline
    assert import_jsonl(db, None, io.StringIO(data)) == 2
    assert list(db.scan()) == [(b"a", b"1"), (b"b", b"2")]


def test_import_batches_and_progress(db: lsmdb.DB) -> None:
    lines = [json.dumps({"key": base64.b64encode(b"%03d" % i).decode(), "value": ""})
             for i in range(25)]
    calls: list[int] = []
    assert import_jsonl(db, None, io.StringIO("\n".join(lines)), batch_size=10,
                        progress=calls.append) == 25
    assert calls == [10, 20, 25]
    assert len(list(db.scan())) == 25


@pytest.mark.parametrize("bad_line, message", [
    ("not json", "not valid JSON"),
    ('["YQ==", "MQ=="]', "expected a JSON object"),
    ('{"key": "YQ=="}', "'value' is missing"),
    ('{"value": "YQ=="}', "'key' is missing"),
    ('{"key": 5, "value": "YQ=="}', "'key' is not a string"),
    ('{"key": "YQ==", "value": null}', "'value' is not a string"),
    ('{"key": "not base64!", "value": ""}', "'key' is not valid base64"),
    ('{"key": "YQ=", "value": ""}', "'key' is not valid base64"),
    ('{"key": "' + base64.b64encode(b"k" * (lsmdb.MAX_KEY_SIZE_BYTES + 1)).decode()
     + '", "value": ""}', "exceeds the limit"),
])
def test_bad_line_is_a_value_error_naming_its_line(db: lsmdb.DB, bad_line: str,
                                                   message: str) -> None:
    good = ['{"key": "' + base64.b64encode(b"%d" % i).decode() + '", "value": "eA=="}'
            for i in range(5)]
    data = "\n".join(good[:3] + ["", bad_line] + good[3:]) + "\n"
    with pytest.raises(ValueError) as info:
        import_jsonl(db, None, io.StringIO(data), batch_size=2)
    assert str(info.value).startswith("line 5: ")
    assert message in str(info.value)
    # the rows before the bad line are loaded, none after it
    assert [k for k, _ in db.scan()] == [b"0", b"1", b"2"]


def test_import_of_undecodable_text_names_the_line(db: lsmdb.DB, tmp_path: pathlib.Path) -> None:
    p = tmp_path / "in.jsonl"
    p.write_bytes(b'{"key": "YQ==", "value": ""}\n\xff\xfe\n')
    with open(p, "rb") as f, pytest.raises(ValueError, match="^line 2: not valid UTF-8"):
        import_jsonl(db, None, f)
    assert list(db.scan()) == [(b"a", b"")]
    # a text stream decodes ahead of the line being parsed: the message says so
    with open(p, encoding="utf-8") as f, pytest.raises(ValueError, match="^line 1 or a later"):
        import_jsonl(db, None, f)


def test_import_from_a_binary_stream(db: lsmdb.DB) -> None:
    data = b'{"key": "YQ==", "value": "MQ=="}\n\n{"key": "Yg==", "value": ""}\n'
    assert import_jsonl(db, None, io.BytesIO(data)) == 2
    assert list(db.scan()) == [(b"a", b"1"), (b"b", b"")]


def test_import_argument_errors(db: lsmdb.DB) -> None:
    with pytest.raises(ValueError):
        import_jsonl(db, None, io.StringIO(""), batch_size=0)
    with pytest.raises(lsmdb.NoSuchTableError):
        import_jsonl(db, "nope", io.StringIO(""))
    assert import_jsonl(db, None, io.StringIO("")) == 0


def test_jsonl_round_trip_through_files(db: lsmdb.DB, tmp_path: pathlib.Path) -> None:
    rows = random_rows(3, 500)
    load(db, rows)
    p = tmp_path / "export.jsonl"
    with open(p, "w", encoding="utf-8", newline="") as f:
        assert export_table(db, None, "jsonl", f) == len(rows)
    with lsmdb.open(tmp_path / "dst") as fresh, open(p, encoding="utf-8") as f:
        assert import_jsonl(fresh, None, f) == len(rows)
        assert dict(fresh.scan()) == rows


# -------------------------------------------------------------------- csv
def test_csv_line_by_line(db: lsmdb.DB) -> None:
    rows = random_rows(4, 200)
    load(db, rows)
    out = io.StringIO()
    assert export_table(db, None, "csv", out) == len(rows)
    text = out.getvalue()
    assert text.endswith("\n") and "\r" not in text
    lines = text.split("\n")[:-1]
    assert lines[0] == "key,value"
    expected = sorted(rows.items())
    assert len(lines) == 1 + len(expected)
    for line, (k, v) in zip(lines[1:], expected, strict=True):
        assert line == f"0x{k.hex()},0x{v.hex()}"
    assert lines[1] == "0x," + "0x" + b"value of the empty key".hex()   # the empty key
    assert f"0x{b'empty-value'.hex()},0x" in lines                       # the empty value
    # and a CSV reader gets the bytes back
    parsed = list(csv.reader(io.StringIO(text)))
    assert parsed[0] == ["key", "value"]
    assert [(bytes.fromhex(k[2:]), bytes.fromhex(v[2:])) for k, v in parsed[1:]] == expected


# -------------------------------------------------------------------- cql
def test_cql_for_the_default_table(db: lsmdb.DB) -> None:
    db.put(b"k", b"v")
    out = io.StringIO()
    assert export_table(db, None, "cql", out) == 0
    fp = db.table("default").options.bloom_filter_fp_chance
    assert out.getvalue() == (
        'CREATE TABLE "default" (\n'
        "    key blob PRIMARY KEY,\n"
        "    value blob\n"
        f") WITH bloom_filter_fp_chance = {fp!r}\n"
        "    AND compaction = {'class': 'SizeTieredCompactionStrategy'}\n"
        "    AND compression = {'class': 'LZ4Compressor'}\n"
        "    AND default_time_to_live = 0;\n"
    )


def test_cql_uses_the_table_fp_chance(db: lsmdb.DB) -> None:
    db.create_table("Events", bloom_filter_fp_chance=0.001)
    out = io.StringIO()
    export_table(db, "Events", "cql", out)
    text = out.getvalue()
    assert text.startswith('CREATE TABLE "Events" (')
    assert "bloom_filter_fp_chance = 0.001\n" in text
    assert "key blob PRIMARY KEY" in text and "value blob" in text
    assert "'class': 'SizeTieredCompactionStrategy'" in text


def test_cql_size_tiered_and_leveled_from_options_objects() -> None:
    stcs = types.SimpleNamespace(bloom_filter_fp_chance=0.01)       # no compaction option
    assert cql_create_table("t", stcs).endswith(
        ") WITH bloom_filter_fp_chance = 0.01\n"
        "    AND compaction = {'class': 'SizeTieredCompactionStrategy'}\n"
        "    AND compression = {'class': 'LZ4Compressor'}\n"
        "    AND default_time_to_live = 0;")
    lcs = types.SimpleNamespace(bloom_filter_fp_chance=0.1, compaction="leveled")
    assert cql_create_table("t", lcs) == (
        'CREATE TABLE "t" (\n'
        "    key blob PRIMARY KEY,\n"
        "    value blob\n"
        ") WITH bloom_filter_fp_chance = 0.1\n"
        "    AND compaction = {'class': 'LeveledCompactionStrategy'}\n"
        "    AND compression = {'class': 'LZ4Compressor'}\n"
        "    AND default_time_to_live = 0;")
    tuned = types.SimpleNamespace(bloom_filter_fp_chance=0.01, compaction="size_tiered",
                                  min_threshold=6, max_threshold=20)
    assert ("compaction = {'class': 'SizeTieredCompactionStrategy', "
            "'min_threshold': '6', 'max_threshold': '20'}") in cql_create_table("t", tuned)
    with pytest.raises(ValueError, match="compaction strategy"):
        cql_create_table("t", types.SimpleNamespace(bloom_filter_fp_chance=0.01,
                                                    compaction="time_window"))


@pytest.mark.parametrize("kind,cql", [("lz4", "{'class': 'LZ4Compressor'}"),
                                      ("zstd", "{'class': 'ZstdCompressor'}"),
                                      ("none", "{'enabled': 'false'}")])
def test_cql_carries_the_compression(db: lsmdb.DB, kind: str, cql: str) -> None:
    db.create_table("c", compression=kind, default_time_to_live=3600)
    out = io.StringIO()
    export_table(db, "c", "cql", out)
    assert out.getvalue().endswith(f"    AND compression = {cql}\n"
                                   "    AND default_time_to_live = 3600;\n")


def test_cql_with_a_real_leveled_table_if_supported(db: lsmdb.DB) -> None:
    if "compaction" not in lsmdb.TableOptions.__dataclass_fields__:
        pytest.skip("table option 'compaction' does not exist yet")
    db.create_table("lv", compaction="leveled", bloom_filter_fp_chance=0.05)
    out = io.StringIO()
    export_table(db, "lv", "cql", out)
    assert "bloom_filter_fp_chance = 0.05\n" in out.getvalue()
    assert "{'class': 'LeveledCompactionStrategy'}" in out.getvalue()


def test_cql_fixes_what_cassandra_would_refuse() -> None:
    text = cql_create_table("my-table", types.SimpleNamespace(bloom_filter_fp_chance=1e-6))
    lines = text.split("\n")
    assert lines[0].startswith("-- ") and "'my-table'" in lines[0]
    assert lines[1].startswith("-- ") and "1e-06" in lines[1]
    assert 'CREATE TABLE "my_table" (' in lines
    assert f"bloom_filter_fp_chance = {CASSANDRA_LOWEST_FP_CHANCE!r}" in text
    # 1.0 (no filter) is valid in Cassandra too
    assert "bloom_filter_fp_chance = 1.0\n" in cql_create_table(
        "t", types.SimpleNamespace(bloom_filter_fp_chance=1.0))


# --------------------------------------------------------- export options
@pytest.mark.parametrize("every, expected", [(1, [1, 2, 3, 4, 5]), (2, [2, 4, 5]),
                                             (5, [5]), (100, [5])])
def test_export_progress(db: lsmdb.DB, every: int, expected: list[int]) -> None:
    for i in range(5):
        db.put(b"%d" % i, b"v")
    calls: list[int] = []
    assert export_table(db, None, "jsonl", io.StringIO(), progress=calls.append,
                        progress_every=every) == 5
    assert calls == expected


def test_export_argument_errors(db: lsmdb.DB) -> None:
    out = io.StringIO()
    with pytest.raises(ValueError, match="unknown export format"):
        export_table(db, None, "xml", out)
    with pytest.raises(ValueError):
        export_table(db, None, "jsonl", out, progress_every=0)
    with pytest.raises(lsmdb.NoSuchTableError):
        export_table(db, "missing", "jsonl", out)
    assert out.getvalue() == ""


def test_export_is_a_snapshot(db: lsmdb.DB) -> None:
    for i in range(10):
        db.put(b"%d" % i, b"v")

    class Writer(io.StringIO):
        def write(self, s: str) -> int:
            db.put(b"zz-late", b"written during the export")   # not in this export
            return super().write(s)

    out = Writer()
    assert export_table(db, None, "jsonl", out) == 10
    assert base64.b64encode(b"zz-late").decode() not in out.getvalue()


def test_export_from_a_read_only_database(tmp_path: pathlib.Path) -> None:
    with lsmdb.open(tmp_path / "db") as db:
        db.put(b"k", b"v")
    with lsmdb.open(tmp_path / "db", read_only=True) as ro:
        out = io.StringIO()
        assert export_table(ro, "default", "csv", out) == 1
    assert out.getvalue() == "key,value\n0x6b,0x76\n"


# ------------------------------------------------------------------ table options
OPTIONS = {"events": {"bloom_filter_fp_chance": 0.001, "compaction": "leveled",
                      "block_size_bytes": 1024, "bloom_filter_skip_last_level": True},
           "keyed": {"bloom_filter_hash": "keyed", "bloom_filter_mode": "shadow",
                     "min_threshold": 3, "max_threshold": 9},
           "empty": {"memtable_size_bytes": 8192, "target_file_size_bytes": 1 << 20}}


def with_options(db: lsmdb.DB) -> None:
    db.alter_table("default", bloom_filter_fp_chance=0.05)
    db.put(b"d", b"1")
    for name, options in OPTIONS.items():
        t = db.create_table(name, **options)
        if name != "empty":
            t.put(b"k-" + name.encode(), b"v")


def test_an_export_of_every_table_brings_back_their_options(db: lsmdb.DB,
                                                           tmp_path: pathlib.Path) -> None:
    """An fp chance of 0.001 comes back as 0.001 (not the default 0.01), and so does
    every other option, the default table's and an empty table's included."""
    from lsmdb.transfer import export_tables
    with_options(db)
    out = io.StringIO()
    assert export_tables(db, "jsonl", out) == 3
    notes: list[str] = []
    with lsmdb.open(tmp_path / "dst") as fresh:
        assert import_jsonl(fresh, None, io.StringIO(out.getvalue()), create_tables=True,
                            note=notes.append) == 3
        assert fresh.tables() == db.tables()
        for name in db.tables():
            assert fresh.table(name).options == db.table(name).options, name
            assert list(fresh.table(name).scan()) == list(db.table(name).scan())
        assert fresh.table("events").options.bloom_filter_fp_chance == 0.001
        again = io.StringIO()
        export_tables(fresh, "jsonl", again)
        assert again.getvalue() == out.getvalue()
    assert notes == []


def test_a_table_with_data_or_options_of_its_own_keeps_them(db: lsmdb.DB,
                                                           tmp_path: pathlib.Path) -> None:
    from lsmdb.transfer import export_tables
    with_options(db)
    out = io.StringIO()
    export_tables(db, "jsonl", out)
    notes: list[str] = []
    with lsmdb.open(tmp_path / "dst") as other:
        other.put(b"mine", b"x")                                   # data: keeps its options
        other.create_table("events", bloom_filter_fp_chance=0.2)   # options of its own
        other.create_table("empty")                                # as new: takes the export's
        import_jsonl(other, None, io.StringIO(out.getvalue()), create_tables=True,
                     note=notes.append)
        assert other.table("default").options == lsmdb.TableOptions()
        assert other.table("events").options == lsmdb.TableOptions(bloom_filter_fp_chance=0.2)
        assert other.table("empty").options == db.table("empty").options
        assert other.table("keyed").options == db.table("keyed").options
        assert other.get(b"d") == b"1" and other.table("events").get(b"k-events") == b"v"
    assert len(notes) == 2 and all("\n" not in n for n in notes)
    assert "'default'" in notes[0] and "bloom_filter_fp_chance=0.05 (kept 0.01)" in notes[0]
    assert "'events'" in notes[1] and "bloom_filter_fp_chance=0.001 (kept 0.2)" in notes[1]
    assert "compaction='leveled' (kept 'size_tiered')" in notes[1]


def test_an_export_of_one_table_brings_its_options_to_the_table_named(
        db: lsmdb.DB, tmp_path: pathlib.Path) -> None:
    with_options(db)
    out = io.StringIO()
    export_table(db, "events", "jsonl", out)
    with lsmdb.open(tmp_path / "dst") as fresh:
        assert import_jsonl(fresh, "copy", io.StringIO(out.getvalue()), create_tables=True) == 1
        assert fresh.table("copy").options == db.table("events").options
        assert import_jsonl(fresh, None, io.StringIO(out.getvalue())) == 1
        assert fresh.table("default").options == db.table("events").options
    with pytest.raises(lsmdb.NoSuchTableError):      # without create_tables: must exist
        import_jsonl(db, "nope", io.StringIO(out.getvalue()))


def test_with_a_table_named_the_options_of_named_tables_are_ignored(db: lsmdb.DB) -> None:
    from lsmdb.transfer import export_tables
    with_options(db)
    out = io.StringIO()
    export_tables(db, "jsonl", out)
    db.create_table("all")
    assert import_jsonl(db, "all", io.StringIO(out.getvalue())) == 3
    assert db.table("all").options == lsmdb.TableOptions()
    assert len(list(db.table("all").scan())) == 3


def test_an_export_without_options_still_imports(db: lsmdb.DB, tmp_path: pathlib.Path) -> None:
    """Exports written before the options lines (or with options=False) read as before:
    the tables created with default options."""
    from lsmdb.transfer import export_tables
    with_options(db)
    out = io.StringIO()
    export_tables(db, "jsonl", out, options=False)
    assert "options" not in out.getvalue()
    old = ('{"key": "ZA==", "value": "MQ==", "table": "default"}\n'
           '{"key": "YQ==", "value": "Yg==", "table": "events"}\n')
    for text in (out.getvalue(), old):
        with lsmdb.open(tmp_path / "dst") as fresh:
            assert import_jsonl(fresh, None, io.StringIO(text), create_tables=True) >= 2
            assert fresh.table("events").options == lsmdb.TableOptions()
            assert fresh.get(b"d") == b"1"
            fresh.drop_table("events")


@pytest.mark.parametrize("bad_line, message", [
    ('{"options": 5}', "table options must be a JSON object"),
    ('{"options": {"bloom_filter_fp_chance": 2}}', "'bloom_filter_fp_chance' must satisfy"),
    ('{"options": {"no_such_option": 1}}', "unknown table option 'no_such_option'"),
    ('{"options": {"bloom_filter_skip_last_level": 1}}', "must be a bool"),
    ('{"options": {}, "table": "bad name!"}', "invalid table name"),
    ('{"options": {}, "table": 7}', "no table 7"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"key": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
], ids=["not-object", "bad-fp", "unknown", "bool", "bad-name", "name-not-str", "nested",
        "nested-key"])
def test_a_bad_line_of_options_names_its_line(db: lsmdb.DB, bad_line: str,
                                              message: str) -> None:
    data = '{"key": "YQ==", "value": ""}\n' + bad_line + "\n"
    with pytest.raises(ValueError) as info:
        import_jsonl(db, None, io.StringIO(data), create_tables=True)
    assert str(info.value).startswith("line 2: ") and message in str(info.value)
    assert "\n" not in str(info.value)
    assert list(db.scan()) == [(b"a", b"")] and db.tables() == ["default"]
