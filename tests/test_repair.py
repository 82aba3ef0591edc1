"""``lsmdb repair``: a database that does not open is rebuilt from what still reads.

Each test damages a database the way a failing disk or a careless hand
would, checks that the open refuses it (CorruptionError), repairs it, and
checks that it then opens and verifies clean, that every write that still
read is there, and that nothing was deleted that did not read whole: what the
rebuilt database leaves out is in ``lost/``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lsmdb
from lsmdb.manifest import Manifest
from lsmdb.repair import repair_database
from lsmdb.verify import verify_database


def errors_of(path: str) -> list[str]:
    return [str(p) for p in verify_database(path) if p.severity == "error"]


def digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def make_db(path: Path) -> dict[str, dict[bytes, bytes]]:
    """Two tables: flushed SSTables (several blocks each) and unflushed WAL records."""
    rows: dict[str, dict[bytes, bytes]] = {"default": {}, "events": {}}
    with lsmdb.open(str(path), auto_compaction=False) as db:
        db.create_table("events", bloom_filter_fp_chance=0.001, block_size_bytes=256)
        db.alter_table("default", block_size_bytes=256)
        for part in range(2):
            for i in range(60):
                for table in rows:
                    key, value = b"%s-%d-%03d" % (table.encode(), part, i), b"v%d-%d" % (part, i)
                    db.table(table).put(key, value)
                    rows[table][key] = value
            db.flush()
        for i in range(40):           # in the WAL only
            key, value = b"wal-%03d" % i, b"w%d" % i
            db.table("events" if i % 2 else "default").put(key, value)
            rows["events" if i % 2 else "default"][key] = value
    return rows


def reads(path: Path, tables: dict[str, dict[bytes, bytes]]) -> dict[str, dict[bytes, bytes]]:
    with lsmdb.open(str(path)) as db:
        return {t: dict(db.table(t).scan()) for t in tables}


def wal_path(path: Path) -> Path:
    wal = Manifest.read(str(path / "MANIFEST")).wal
    assert wal is not None and wal.closed
    return path / f"wal-{wal.closed[-1][0]:06d}.log"


def test_a_closed_segment_cut_short(tmp_path):
    path = tmp_path / "db"
    rows = make_db(path)
    seg = wal_path(path)
    data = seg.read_bytes()
    seg.write_bytes(data[:len(data) // 2])
    with pytest.raises(lsmdb.CorruptionError):
        lsmdb.open(str(path))
    report = repair_database(str(path))
    assert report.records_replayed > 5
    assert [n for n, _why in report.set_aside] == [seg.name]
    assert (path / "lost" / seg.name).read_bytes() == data[:len(data) // 2]
    assert errors_of(str(path)) == []
    got = reads(path, rows)
    for table, want in rows.items():
        flushed = {k: v for k, v in want.items() if not k.startswith(b"wal-")}
        assert flushed.items() <= got[table].items()
        assert got[table].keys() <= want.keys()
    assert 5 < sum(k.startswith(b"wal-") for t in got.values() for k in t) < 40


def test_a_closed_segment_deleted_is_reported_missing(tmp_path):
    path = tmp_path / "db"
    rows = make_db(path)
    seg = wal_path(path)
    seg.unlink()
    with pytest.raises(lsmdb.CorruptionError):
        lsmdb.open(str(path))
    report = repair_database(str(path))
    assert [n for n, _why in report.missing] == [seg.name]
    got = reads(path, rows)
    assert not any(k.startswith(b"wal-") for t in got.values() for k in t)
    assert got["default"] == {k: v for k, v in rows["default"].items()
                              if not k.startswith(b"wal-")}


def test_an_sstable_with_a_damaged_block_is_salvaged(tmp_path):
    path = tmp_path / "db"
    rows = make_db(path)
    victim = sorted(path.glob("*.sst"))[0]
    reader = lsmdb.sstable_reader.SSTableReader(str(victim))
    table = reader.table
    damaged_keys = reader.read_block(1)[0]
    pos = reader.index_offsets[1] + 3
    reader.close()
    data = bytearray(victim.read_bytes())
    data[pos] ^= 0xFF
    victim.write_bytes(bytes(data))
    assert errors_of(str(path))
    report = repair_database(str(path))
    assert len(report.salvaged) == 1 and victim.name in report.salvaged[0]
    assert [n for n, _why in report.set_aside] == [victim.name]
    assert (path / "lost" / victim.name).read_bytes() == bytes(data)
    assert errors_of(str(path)) == []
    got = reads(path, rows)
    lost = set(damaged_keys)
    assert {k: v for k, v in rows[table].items() if k not in lost} == got[table]
    assert got[next(t for t in rows if t != table)] == rows[next(t for t in rows if t != table)]


def test_an_sstable_whose_footer_does_not_read_is_set_aside(tmp_path):
    path = tmp_path / "db"
    rows = make_db(path)
    victim = sorted(path.glob("*.sst"))[-1]
    data = victim.read_bytes()
    victim.write_bytes(data[:-5])
    with pytest.raises(lsmdb.CorruptionError):
        lsmdb.open(str(path))
    report = repair_database(str(path))
    assert [n for n, _why in report.set_aside] == [victim.name]
    assert errors_of(str(path)) == []
    got = reads(path, rows)
    for table in rows:
        assert got[table].keys() <= rows[table].keys()


def test_an_unreadable_manifest_is_rebuilt_from_the_sstables_and_the_wal(tmp_path):
    path = tmp_path / "db"
    rows = make_db(path)
    manifest = path / "MANIFEST"
    original = manifest.read_bytes()
    damaged = bytearray(original)
    damaged[30] ^= 0xFF
    manifest.write_bytes(bytes(damaged))
    with pytest.raises(lsmdb.CorruptionError):
        lsmdb.open(str(path))
    report = repair_database(str(path))
    assert not report.manifest_read
    assert (path / "lost" / "MANIFEST").read_bytes() == bytes(damaged)
    assert errors_of(str(path)) == []
    with lsmdb.open(str(path)) as db:
        tables = db.tables()
        # SSTables name their table; WAL records carry only the table id, and
        # without the manifest only the default table's id (1) is known.
        assert {"default", "events"} <= set(tables)
        assert dict(db.scan()) == rows["default"]
        recovered = [t for t in tables if t.startswith("recovered_")]
        assert len(recovered) == 1
        events = {**dict(db.table("events").scan()), **dict(db.table(recovered[0]).scan())}
        assert events == rows["events"]


def test_orphan_sstables_are_set_aside_not_deleted(tmp_path):
    path = tmp_path / "db"
    rows = make_db(path)
    orphan = path / "999999.sst"
    orphan.write_bytes(sorted(path.glob("*.sst"))[0].read_bytes())
    report = repair_database(str(path))
    assert [n for n, _why in report.set_aside] == [orphan.name]
    assert (path / "lost" / orphan.name).exists()
    assert reads(path, rows) == rows


def test_a_sound_database_keeps_every_write(tmp_path):
    path = tmp_path / "db"
    rows = make_db(path)
    before = set(path.iterdir())
    report = repair_database(str(path))
    assert report.set_aside == [] and report.missing == [] and report.salvaged == []
    assert "nothing was damaged" in "\n".join(report.lines())
    assert not (path / "lost").exists()
    assert reads(path, rows) == rows
    assert {p for p in before if p.suffix == ".sst"} <= set(path.iterdir())
    assert errors_of(str(path)) == []


def test_dry_run_changes_nothing(tmp_path):
    path = tmp_path / "db"
    make_db(path)
    seg = wal_path(path)
    seg.write_bytes(seg.read_bytes()[:100])
    before = digest(path)
    report = repair_database(str(path), dry_run=True)
    assert report.set_aside and report.dry_run
    assert digest(path) == before


def test_repair_refuses_a_database_open_elsewhere(tmp_path):
    path = tmp_path / "db"
    make_db(path)
    with lsmdb.open(str(path)):
        with pytest.raises(lsmdb.DatabaseLockedError):
            repair_database(str(path))


def test_the_command(tmp_path):
    path = tmp_path / "db"
    rows = make_db(path)
    seg = wal_path(path)
    seg.write_bytes(seg.read_bytes()[:200])
    cmd = [sys.executable, "-m", "lsmdb"]
    dry = subprocess.run([*cmd, "repair", str(path), "--dry-run"], capture_output=True,
                         text=True, timeout=60)
    assert dry.returncode == 0 and "would repair" in dry.stdout, dry.stdout + dry.stderr
    done = subprocess.run([*cmd, "repair", str(path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"set aside in lost/: {seg.name}" in done.stdout
    assert "verify after repair: no errors" in done.stdout
    assert reads(path, rows)["events"].keys() <= rows["events"].keys()
    missing = subprocess.run([*cmd, "repair", str(tmp_path / "nothing")], capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 1 and missing.stderr.startswith("lsmdb: ")
    assert os.listdir(tmp_path) == ["db"]


@pytest.mark.parametrize("contents", [[], ["notes.txt"], ["LOCK"]])
@pytest.mark.parametrize("dry_run", [False, True])
def test_repair_of_a_directory_that_is_no_database_leaves_it_as_it_was(tmp_path, contents,
                                                                        dry_run):
    """Refused before anything is made in it: no LOCK, no lost/ (a LOCK already there
    stays)."""
    path = tmp_path / "not-a-db"
    path.mkdir()
    for name in contents:
        (path / name).write_text("mine")
    with pytest.raises(lsmdb.NotADatabaseError, match="nothing to repair"):
        repair_database(str(path), dry_run=dry_run)
    assert sorted(os.listdir(path)) == contents
    r = subprocess.run([sys.executable, "-m", "lsmdb", "repair", str(path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.startswith("lsmdb: ")
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert sorted(os.listdir(path)) == contents
