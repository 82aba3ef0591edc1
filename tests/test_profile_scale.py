"""``tools/profile_scale.py``, short: it runs at small sizes and reports every part."""

from __future__ import annotations

import pytest

import lsmdb
import lsmdb.table
from tools import profile_scale

needs_c = pytest.mark.skipif(lsmdb.table.Probes is None, reason="built without a C compiler")


@needs_c
def test_profile_scale_reports_every_part(capsys):
    assert profile_scale.main(["--small", "40000", "--large", "300000", "--queries", "1000",
                               "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    for row in ("SSTables per level", "filter bytes", "db.get", "Probes.first, all files",
                "none (the call and the hash)", "level-0 files only",
                "500 keys repeated", "keys no filter lets through",
                "level 1 only, no filters (pick + range check)",
                "keys inside one of the files of level 1",
                "false-positive block reads per key", "false positives, per key",
                "40,000-key rate / 300,000-key rate"):
        assert row in out, row


@needs_c
def test_profile_scale_profiles_databases_already_loaded(tmp_path, capsys):
    paths = [str(tmp_path / "small"), str(tmp_path / "large")]
    for path, n in zip(paths, (40_000, 120_000), strict=True):
        profile_scale.load(path, n, seed=n, compaction="size_tiered")
    files = []
    for path in paths:
        db = lsmdb.open(path)
        files.append(len(db.sstables()))
        db.close()
    assert profile_scale.main(["--small", "40000", "--large", "120000", "--queries", "1000",
                               "--rounds", "1", "--paths", *paths]) == 0
    out = capsys.readouterr().out
    assert "size_tiered compaction" in out and "40,000-key rate / 120,000-key rate" in out
    layout = next(line for line in out.splitlines() if line.startswith("SSTables per level"))
    assert layout.split()[-4:] == ["L0", str(files[0]), "L0", str(files[1])]


@needs_c
def test_the_parts_count_on_counters_of_their_own(tmp_path):
    path = str(tmp_path / "db")
    profile_scale.load(path, 40_000, seed=1, compaction="leveled")
    db = lsmdb.open(path)
    try:
        before = [(i.range_skips, i.filter_negatives) for i in db.sstables()]
        named, layout, filter_bytes = profile_scale.parts(db)
        assert layout.startswith("L0 ") and filter_bytes > 0
        for _name, probes in named:
            for i in range(0, 2000, 2):
                probes.first(b"user:%010d" % (2 * i + 1), 0)
        assert [(i.range_skips, i.filter_negatives) for i in db.sstables()] == before
    finally:
        db.close()


def test_without_the_c_speedups_it_says_so(monkeypatch, capsys):
    monkeypatch.setattr(lsmdb.table, "Probes", None)
    assert profile_scale.main(["--small", "10", "--large", "20", "--queries", "500"]) == 1
    assert "not built" in capsys.readouterr().err
