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
                "keys that meet a false positive", "false positives, per key",
                "db.get from its parts", "blocks read per key from disk",
                "from the block cache", "minor page faults", "times over the keys",
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


def loaded(tmp_path, compaction: str) -> lsmdb.DB:
    """A database of 40,000 keys loaded as bench.scale loads it, open."""
    path = str(tmp_path / "db")
    profile_scale.load(path, 40_000, seed=1, compaction=compaction)
    return lsmdb.open(path)


@needs_c
def test_the_parts_count_on_counters_of_their_own(tmp_path):
    db = loaded(tmp_path, "leveled")
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


def test_a_pool_hands_its_keys_out_in_turn_as_new_objects():
    pool = profile_scale.Pool([1, 3, 5])
    first = pool.take(2)
    assert first == [b"user:0000000001", b"user:0000000003"]
    again = pool.take(2)  # on from where it stopped, round to the start
    assert again == [b"user:0000000005", b"user:0000000001"]
    assert again[1] is not first[0]  # a new object each time
    assert pool.passes() == 4 / 3


@needs_c
def test_no_timing_runs_on_the_keys_of_another_and_the_outcomes_are_right(tmp_path):
    db = loaded(tmp_path, "size_tiered")
    try:
        info: dict = {}
        runs = profile_scale.setup(db, 40_000, 2, info)
        pools = info["pools"]
        everyone = set(pools["all keys"].numbers)
        neg = set(pools["no filter lets through"].numbers)
        fp = set(pools["meet a false positive"].numbers)
        # every absent in-range key once: half for the timings over all keys, half by outcome
        assert sorted(everyone | neg | fp) == list(range(1, 2 * 40_000 - 2, 2))
        assert not everyone & neg and not everyone & fp and not neg & fp
        assert abs(len(everyone) - len(neg | fp)) <= 1
        assert info["fp share"] == len(fp) / (len(fp) + len(neg)) > 0
        first = profile_scale.parts(db)[0][0][1].first
        assert all(first(b"user:%010d" % x, 0) >= 0 for x in fp)
        assert not any(first(b"user:%010d" % x, 0) >= 0 for x in neg)
        by_name = {name: pool for name, _fn, pool, _share in runs}
        assert by_name["db.get"] is by_name["Probes.first, all files"] is pools["all keys"]
        assert by_name["db.get, keys that meet a false positive"] is pools["meet a false positive"]
        infos: list[dict] = [{}, {}]
        profile_scale.measure([db, db], [40_000, 40_000], 5000, 1, infos)
        # SLICES slices of 5000 // SLICES keys: each timing over all keys (db.get and each
        # part) took its own
        alls, slices = 1 + len(profile_scale.parts(db)[0]), profile_scale.SLICES
        chunk = 5000 // slices
        for info in infos:
            assert info["pools"]["all keys"].taken == slices * chunk * alls
            assert info["pools"]["no filter lets through"].taken == slices * chunk
            assert info["pools"]["meet a false positive"].taken == slices * max(
                1, round(chunk * info["fp share"]))
            assert info["reads per key"] + info["hits per key"] > 0  # false positives read
            assert info["faults per key"] >= 0
    finally:
        db.close()
