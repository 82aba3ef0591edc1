"""The benchmarks run end to end at a tiny size; their JSON holds together.

Only structure and invariants are checked -- never speed: the machines are
shared and noisy.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
KEYS = 4_000
SSTABLES = 4
QUERIES = 1_000
PRICE_LIST_FP_CHANCES = [1.0, 0.1, 0.01, 0.001, 0.0001]
K_SWEEP = [1, 2, 4, 6, 8, 12, 20]
ABSENT_SHARES = [0.0, 0.5, 0.9, 0.99]
WORKLOADS = ["bulk_load", "single_put", "get_present", "get_absent_in_range",
             "get_absent_out_of_range", "scan"]
STORES = ["lsmdb", "sqlite3", "leveldb", "rocksdb", "lmdb"]


def run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` from the repository root, as bench/README.md runs it."""
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO_ROOT,
                          env=dict(os.environ, PYTHONPATH=path), capture_output=True, text=True,
                          timeout=300, check=False)


def run_module(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    done = run(module, *args)
    assert done.returncode == 0, f"{module} failed:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def absent_keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("absent") / "absent.json"
    done = run_module("bench.absent_keys", "--keys", str(KEYS), "--sstables", str(SSTABLES),
                      "--queries", str(QUERIES), "--json", str(out))
    return json.loads(out.read_text()), done.stdout


def in_unit_interval(x: float) -> bool:
    return 0.0 <= x <= 1.0


def check_fpr_fields(row: dict[str, Any]) -> None:
    """Every measured rate carries its interval and its prediction."""
    assert row["filter_probes"] > 0
    assert row["measured_fpr"] == row["false_positives"] / row["filter_probes"]
    assert in_unit_interval(row["predicted_fpr"])
    assert row["ci99_low"] <= row["measured_fpr"] <= row["ci99_high"]
    assert row["predicted_in_ci99"] == (row["ci99_low"] <= row["predicted_fpr"]
                                        <= row["ci99_high"])


def test_absent_keys_report_shape(absent_keys: tuple[dict[str, Any], str]) -> None:
    report, stdout = absent_keys
    for part in ("guarantee", "price_list", "k_sweep", "overfill", "absent_share"):
        assert report[part]["rows"], part
        assert isinstance(report[part]["title"], str)
        assert report[part]["title"].split(":")[0] in stdout
    assert report["config"] == {**report["config"], "keys": KEYS, "sstables": SSTABLES,
                                "queries": QUERIES}
    assert report["machine"]["cores"] >= 1
    import lsmdb
    assert report["machine"]["lsmdb_speedups"] is lsmdb.SPEEDUPS
    machine_line = next(line for line in stdout.splitlines() if line.startswith("machine:"))
    assert f"C speedups {'on' if lsmdb.SPEEDUPS else 'off'}" in machine_line


def test_guarantee_no_false_negatives(absent_keys: tuple[dict[str, Any], str]) -> None:
    rows = absent_keys[0]["guarantee"]["rows"]
    assert rows[0]["files"] == SSTABLES
    for row in rows:
        assert row["false_negatives"] == 0
        assert row["wrong_values"] == 0
        assert row["absent_found"] == 0
        assert row["present_found"] == row["present_gets"] == QUERIES
        assert row["range_skips"] == 0  # only the filters can turn the absent keys away
        assert row["filter_probes"] == QUERIES * row["files"]
        check_fpr_fields(row)
    if len(rows) == 2:  # the engine can compact
        assert rows[1]["layout"] == "after full compaction"
        assert rows[1]["files"] < SSTABLES


def test_price_list_block_reads(absent_keys: tuple[dict[str, Any], str]) -> None:
    rows = absent_keys[0]["price_list"]["rows"]
    assert [r["fp_chance"] for r in rows] == PRICE_LIST_FP_CHANCES
    no_filter = rows[0]
    # Without a filter every absent get reads one block in every file.
    assert no_filter["block_reads"] == QUERIES * SSTABLES
    assert no_filter["bits_per_key"] == 0
    assert no_filter["reads_skipped"] == 0
    for row in rows:
        assert row["files"] == SSTABLES
        assert row["absent_found"] == 0
        assert row["range_skips"] == 0
        assert row["present_found"] == QUERIES
        check_fpr_fields(row)
        if row["read_syscalls"] is not None:  # the kernel agrees with the engine
            assert row["read_syscalls"] >= row["block_reads"]
    for row in rows[1:]:
        assert row["block_reads"] < no_filter["block_reads"]
        assert row["filter_bytes"] > no_filter["filter_bytes"]
    bits = [r["bits_per_key"] for r in rows]
    assert bits == sorted(bits)


def test_k_sweep_and_overfill(absent_keys: tuple[dict[str, Any], str]) -> None:
    sweep = absent_keys[0]["k_sweep"]
    assert [r["k"] for r in sweep["rows"]] == K_SWEEP
    assert sweep["k_best_predicted"] == 6
    for row in sweep["rows"]:
        assert row["bits_per_key"] == 8
        assert row["false_negatives"] == 0
        check_fpr_fields(row)
    overfill = absent_keys[0]["overfill"]["rows"]
    assert [r["load"] for r in overfill] == [1, 2, 3]
    predicted = [r["predicted_fpr"] for r in overfill]
    assert predicted == sorted(predicted)
    for row in overfill:
        assert row["false_negatives"] == 0
        check_fpr_fields(row)


def test_absent_share(absent_keys: tuple[dict[str, Any], str]) -> None:
    part = absent_keys[0]["absent_share"]
    rows = part["rows"]
    assert [r["absent_share"] for r in rows[:4]] == ABSENT_SHARES
    assert len(rows) in (4, 8)
    for row in rows:
        assert row["no_filter_found"] == row["filter_found"] == row["expected_found"]
        assert row["speedup"] > 0
        assert row["filter_block_reads_per_get"] <= row["no_filter_block_reads_per_get"]
        assert row["no_filter_block_reads_per_get"] == pytest.approx(
            row["no_filter_predicted_block_reads_per_get"], rel=0.25)
    assert len(part["verdicts"]) == len(rows) // 4


def test_absent_keys_rejects_bad_options() -> None:
    done = run("bench.absent_keys", "--keys", "5", "--sstables", "4")
    assert done.returncode == 2
    assert "too few" in done.stderr


def test_absent_keys_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "out.png"
    run_module("bench.absent_keys", "--keys", "2000", "--sstables", "2", "--queries", "200",
               "--plot", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_peers(tmp_path: Path) -> None:
    out = tmp_path / "peers.json"
    png = tmp_path / "peers.png"
    plot = ["--plot", str(png)] if importlib.util.find_spec("matplotlib") else []
    done = run_module("bench.peers", "--keys", "3000", "--json", str(out), *plot)
    if plot:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads(out.read_text())
    assert [e["store"] for e in report["stores"]] == STORES
    by_name = {e["store"]: e for e in report["stores"]}
    for name in ("lsmdb", "sqlite3"):  # always present: lsmdb itself and the stdlib
        assert by_name[name]["available"]
    for entry in report["stores"]:
        if not entry["available"]:
            assert entry["skipped"] and entry["skipped"] in done.stdout
            continue
        assert list(entry["workloads"]) == WORKLOADS
        for name, w in entry["workloads"].items():
            assert w["correct"], (entry["store"], name, w)
            assert w["ops_per_s"] > 0
            assert w["found"] == w["expected_found"]
        assert entry["workloads"]["get_present"]["found"] == 3000
        assert entry["workloads"]["get_absent_in_range"]["found"] == 0
        assert entry["workloads"]["get_absent_out_of_range"]["found"] == 0
        assert entry["workloads"]["scan"]["found"] == 3000
    assert by_name["lsmdb"]["workloads"]["get_present"]["ratio_to_lsmdb"] == 1.0
    for entry in report["stores"]:
        for w in entry.get("workloads", {}).values():
            assert w["lsmdb_over_store"] == pytest.approx(1 / w["ratio_to_lsmdb"])
    # Puts while a compaction runs: the stores that compact, not the others.
    assert "puts_during_compaction" in by_name["lsmdb"]
    assert "puts_during_compaction" not in by_name["sqlite3"]
    assert "idle puts/s" in done.stdout
    # Batch commits: lsmdb and the peers with write batches, read back right.
    commit = by_name["lsmdb"]["batch_commit"]
    assert commit["ops"] == 20 * 6000 and commit["ops_per_s"] > 0
    assert commit["lsmdb_over_store"] == 1.0
    assert "batch_commit" not in by_name["sqlite3"]
    assert not any("WRONG" in n for e in report["stores"] for n in e.get("notes", []))
    assert "batch commits" in done.stdout
    many = by_name["lsmdb"]["get_many"]  # get_many against a loop of get, same keys
    assert list(many) == ["get_present", "get_absent_in_range", "get_absent_out_of_range"]
    for r in many.values():
        assert r["correct"] and r["found_loop"] == r["found_many"] == r["expected_found"]
        assert r["ratio"] > 0 and len(r["slice_rates"]["many"]) == 5
    assert "get_many" in done.stdout
    if by_name["rocksdb"]["available"]:
        assert any("filter in use after reopen" in n for n in by_name["rocksdb"]["notes"])


def test_puts_during_compaction_counts_only_the_slices_a_compaction_overlaps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    from bench import peers
    from bench.stores import Compacting
    written: dict[bytes, bytes] = {}
    items = [(b"%06d" % i, b"v") for i in range(40_000)]
    compacting = Compacting(written.__setitem__, lambda: time.sleep(0.3), lambda: None)
    got = peers.puts_during_compaction(compacting, items)
    assert written == dict(items)   # the quarter idle, the rest during (cycled if need be)
    assert got["during_puts"] > 0 and got["during_puts"] % peers.PUT_SLICE == 0
    assert got["ratio_to_idle"] == pytest.approx(got["during_ops_per_s"] / got["idle_ops_per_s"])
    assert got["compaction_seconds"] >= 0.3
    quick = Compacting(written.__setitem__, lambda: None, lambda: None)
    done = peers.puts_during_compaction(quick, items[:100])
    assert done["during_ops_per_s"] is None or done["during_puts"] > 0


def test_peers_only_some_stores(tmp_path: Path) -> None:
    out = tmp_path / "peers.json"
    run_module("bench.peers", "--keys", "500", "--stores", "sqlite3", "--json", str(out))
    report = json.loads(out.read_text())
    assert [e["store"] for e in report["stores"]] == ["sqlite3"]
    # Without lsmdb in the run there is nothing to divide by.
    assert report["stores"][0]["workloads"]["scan"]["ratio_to_lsmdb"] is None


def test_peers_reports_a_wrong_store_not_its_speed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    from bench import peers
    from bench.common import Progress

    class Liar(peers.SqliteStore):
        """sqlite3, except that it claims every absent key exists."""

        name = label = "liar"

        def getter(self) -> peers.Getter:
            real = super().getter()
            return lambda key: real(key) or b"made up"

    entry = peers.bench_store(Liar, peers.Data(300), Progress(enabled=False))
    lie = entry["workloads"]["get_absent_in_range"]
    assert lie["correct"] is False and lie["ops_per_s"] is None and lie["found"] == 299
    assert entry["workloads"]["get_present"]["correct"]
    assert any("WRONG ANSWER in get absent in range" in note for note in entry["notes"])


def test_peers_interleaves_the_stores_and_isolates_one_that_raises(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The reads run with every store open, taking turns slice by slice; a
    store that raises midway (here from its 400th get on, in the second query set) is
    reported as failed and the others' workloads all complete, each read
    ratio being the median of the per-slice ratios to lsmdb."""
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    import statistics

    from bench import peers
    from bench.common import Progress
    calls: list[str] = []

    class Tracing(peers.SqliteStore):
        name = label = "tracing"

        def getter(self) -> peers.Getter:
            real = super().getter()

            def get(key: bytes) -> bytes | None:
                if not calls or calls[-1] != self.name:
                    calls.append(self.name)
                return real(key)
            return get

    class Broken(Tracing):
        name = label = "broken"
        gets = 0

        def getter(self) -> peers.Getter:
            real = super().getter()

            def get(key: bytes) -> bytes | None:
                Broken.gets += 1
                if Broken.gets >= 400:
                    raise RuntimeError("disk on fire")
                return real(key)
            return get

    class Lsmdb(peers.LsmdbStore):
        def getter(self) -> peers.Getter:
            real = super().getter()

            def get(key: bytes) -> bytes | None:
                if not calls or calls[-1] != "lsmdb":
                    calls.append("lsmdb")
                return real(key)
            return get

    entries = peers.bench_stores([Lsmdb, Broken, Tracing], peers.Data(300), Progress(False))
    lsm, broken, tracing = entries
    assert broken["available"] is False and "FAILED: RuntimeError: disk on fire" in broken[
        "skipped"] and broken["failed"]
    for entry in (lsm, tracing):
        assert entry["available"] and tuple(entry["workloads"]) == peers.WORKLOADS
        assert all(w["correct"] for w in entry["workloads"].values())
    # Turns: in the first query set the stores alternate slice by slice (A B C, C B A, ...;
    # a store's two turns in a row count once): not one store's whole loop after another.
    assert calls[:7] == ["lsmdb", "broken", "tracing", "broken", "lsmdb", "broken", "tracing"]
    for name in ("get_absent_in_range", "get_absent_out_of_range"):
        mine, base = tracing["workloads"][name], lsm["workloads"][name]
        assert mine["ratio_to_lsmdb"] == pytest.approx(statistics.median(
            a / b for a, b in zip(mine["slice_rates"], base["slice_rates"], strict=True)))
    scan = tracing["workloads"]["scan"]
    assert len(scan["round_rates"]) == peers.SCAN_ROUNDS
    assert scan["ratio_to_lsmdb"] == pytest.approx(statistics.median(
        a / b for a, b in zip(scan["round_rates"], lsm["workloads"]["scan"]["round_rates"],
                              strict=True)))


def test_peers_loads_take_turns_round_by_round(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    """Each store is loaded LOAD_ROUNDS times, one store at a time, the order reversed
    every other round; its load rate is the median of its rounds and its ratio the
    median of the per-round ratios to lsmdb; only the last round's copy is kept (and
    reopened for the reads); a store that raises in a later round is reported failed
    and the others' loads go on."""
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    import statistics

    from bench import peers
    from bench.common import Progress
    loads: list[tuple[str, str]] = []

    class Tracing(peers.SqliteStore):
        name = label = "tracing"

        def load(self, items: Sequence[tuple[bytes, bytes]]) -> None:
            loads.append((self.name, self.path))
            super().load(items)

    class Broken(Tracing):
        name = label = "broken"

        def load(self, items: Sequence[tuple[bytes, bytes]]) -> None:
            if len(loads) >= 3:  # fails from its second round on
                raise OSError("disk full")
            super().load(items)

    class Lsmdb(peers.LsmdbStore):
        def load(self, items: Sequence[tuple[bytes, bytes]]) -> None:
            loads.append(("lsmdb", self.path))
            super().load(items)

    data = peers.Data(300)
    entries = [{"store": c.name, "label": c.label, "available": True, "skipped": None,
                "notes": [], "workloads": {}} for c in (Lsmdb, Broken, Tracing)]
    live = peers.timed_loads(list(zip((Lsmdb, Broken, Tracing), entries, strict=True)), data,
                             str(tmp_path), Progress(enabled=False))
    try:
        assert [name for name, _ in loads] == ["lsmdb", "broken", "tracing",
                                               "tracing", "lsmdb",
                                               "lsmdb", "tracing"]
        assert entries[1]["available"] is False and "FAILED: OSError: disk full" in entries[1][
            "skipped"]
        assert [run.entry["store"] for run in live] == ["lsmdb", "tracing"]
        lsm, tracing = (e["workloads"]["bulk_load"] for e in (entries[0], entries[2]))
        for load in (lsm, tracing):
            assert len(load["round_seconds"]) == peers.LOAD_ROUNDS == 3
            assert load["seconds"] == statistics.median(load["round_seconds"])
            assert load["ops_per_s"] == pytest.approx(300 / load["seconds"])
        assert lsm["ratio_to_lsmdb"] == 1.0
        assert tracing["ratio_to_lsmdb"] == pytest.approx(statistics.median(
            a / b for a, b in zip(lsm["round_seconds"], tracing["round_seconds"], strict=True)))
        # the earlier rounds' copies are gone; the last round's is open and whole
        assert sorted(os.listdir(tmp_path)) == ["lsmdb.2", "tracing.2"]
        for run in live:
            assert peers.check_values(run.store, data) is None
    finally:
        for run in live:
            run.store.close()


def test_peers_a_store_failing_after_its_timed_runs_is_reported(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that raises in its untimed checks (here its own check after the
    close) is reported as failed; the other stores' entries are whole."""
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    from bench import peers
    from bench.common import Progress

    class BadCheck(peers.SqliteStore):
        name = label = "badcheck"

        def check(self, absent: object) -> str | None:
            raise OSError("lost the statistics")

    lsm, bad = peers.bench_stores([peers.LsmdbStore, BadCheck], peers.Data(200),
                                  Progress(enabled=False))
    assert bad["available"] is False and "FAILED: OSError: lost the statistics" in bad["skipped"]
    assert lsm["available"] and tuple(lsm["workloads"]) == peers.WORKLOADS


def test_scale(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    done = run_module("bench.scale", "--small", "2000", "--large", "50000", "--queries", "5000",
                      "--peers", "sqlite3", "--json", str(out))
    report = json.loads(out.read_text())
    assert report["sizes"] == [2000, 50000] and report["fp_chance"] == 0.01
    assert [r["compaction"] for r in report["runs"]] == ["size_tiered", "leveled"]
    for run in report["runs"]:
        assert run["files"][0] >= 0 and run["files"][1] >= 1  # 50,000 keys outgrow a memtable
        assert all(r > 0 for r in run["absent_in_range_per_s"])
        assert len(run["slice_rates"][0]) == len(run["slice_rates"][1]) == 5
        assert run["small_over_large"] > 0
        # the files' own counters over the timed gets, per get: every absent key meets
        # a filter of each file it falls in, so 50,000 keys (all in SSTables) probe at
        # least one per get; one read per false positive, about 1% of probes
        small, large = run["per_get"]
        assert large["filters_probed"] >= 1.0 and run["filter_bytes"][1] > 0
        assert large["block_reads"] + large["block_cache_hits"] \
            <= 0.05 * large["filters_probed"]
        assert small["filters_probed"] == 0.0 if run["files"][0] == 0 else \
            small["filters_probed"] >= 1.0
    # size-tiered: an absent key is looked for in every file, each a range skip or a probe
    tiered = report["runs"][0]
    for files, work in zip(tiered["files"], tiered["per_get"], strict=True):
        assert work["filters_probed"] + work["range_skips"] == pytest.approx(files)
    assert "filters probed" in done.stdout and "filters: " in done.stdout
    assert report["runs"][1]["layout"][1].startswith(f"{report['runs'][1]['files'][1]} SSTables (L")
    assert report["runs"][0]["layout"][1] == f"{report['runs'][0]['files'][1]} SSTables " \
        f"(L0 {report['runs'][0]['files'][1]})"  # size-tiered: every file in level 0
    assert done.stdout.count("rate / 50,000-key rate") == 4
    assert "leveled compaction:" in done.stdout
    # present keys, a quarter as many, every one found (timed raises otherwise)
    for run in report["runs"]:
        assert all(r > 0 for r in run["present_per_s"]) and run["present_small_over_large"] > 0
        assert len(run["present_slice_rates"][0]) == 5
        # one block per present get, from disk or the cache, none when in the memtable
        for work in run["present_per_get"]:
            assert work["block_reads"] + work["block_cache_hits"] <= 1.05
        large = run["present_per_get"][1]
        assert large["block_reads"] + large["block_cache_hits"] >= 0.5
    assert done.stdout.count("present keys, ") == 6
    # the same test on a peer: sqlite3 (stdlib), loaded with the same keys, timed the same way
    [peer] = report["peers"]
    assert peer["store"] == "sqlite3" and peer["available"]
    assert all(r > 0 for r in peer["absent_in_range_per_s"]) and peer["small_over_large"] > 0
    assert all(r > 0 for r in peer["present_per_s"]) and peer["present_small_over_large"] > 0
    assert len(peer["slice_rates"][0]) == len(peer["slice_rates"][1]) == 5
    assert all(2.0 <= w < 120 for w in peer["settle_seconds"])
    assert "sqlite3: " in done.stdout and "k at 50,000:" in done.stdout
    # the bytes each database's timed gets read from the storage device, per get (None
    # only where /proc/self/io has no read_bytes); printed beside each ratio
    from bench.common import DeviceReads
    measured = DeviceReads().available
    for entry in [*report["runs"], peer]:
        for field in ("device_bytes_per_get", "present_device_bytes_per_get"):
            assert len(entry[field]) == 2
            assert all((x is not None and x >= 0) if measured else x is None
                       for x in entry[field])
    assert done.stdout.count("from the device: " if measured else "device reads not measured") \
        == 6


def test_scale_timed_counts_the_bytes_read_from_the_device(tmp_path: Path) -> None:
    """A getter reading a file the page cache dropped is charged its device reads; one
    reading nothing is charged none of them."""
    from bench.common import DeviceReads
    from bench.scale import timed
    if not DeviceReads().available:
        pytest.skip("no read_bytes in /proc/self/io here")
    if not hasattr(os, "posix_fadvise"):
        pytest.skip("no posix_fadvise: cannot drop a file from the page cache")
    path = tmp_path / "cold"
    size = 8 << 20
    with open(path, "wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        keys = [b"%d" % i for i in range(100)]

        def cold_get(key: bytes) -> None:
            os.pread(fd, 4096, int(key) * (size // 100))  # 100 pages 80 KiB apart

        def no_read(key: bytes) -> None:
            return None

        device: list[int | None] = []
        timed([1, 2], [cold_get, no_read], [keys, keys], slices=4, device=device)
    finally:
        os.close(fd)
    cold, none = device
    assert cold is not None and none is not None
    assert cold >= 100 * 4096 and none < cold


def test_scale_reports_a_peer_that_fails_and_goes_on() -> None:
    from bench import scale
    from bench.common import Progress
    from bench.stores import SqliteStore

    class Broken(SqliteStore):
        name = label = "broken"

        def load(self, items: object) -> None:
            raise OSError("disk on fire")

    entry = scale.run_peer_or_failure(Broken, [10, 20], 10, Progress(enabled=False))
    assert entry["available"] is False and entry["failed"] is True
    assert entry["skipped"] == "broken: FAILED: OSError: disk on fire"


def test_scale_items_are_what_load_writes() -> None:
    from bench.scale import Items
    items = Items(1000, seed=5)
    pairs = list(items)
    assert len(items) == len(pairs) == 1000
    assert items[10:20] == pairs[10:20] and items[-1] == pairs[-1]
    assert sorted(k for k, _v in pairs) == [b"user:%010d" % (2 * i) for i in range(1000)]
    assert all(v == b"%010d" % int(k[5:]) * 10 for k, v in pairs)


def test_scale_settle_waits_for_a_quiet_directory(tmp_path: Path) -> None:
    import threading

    from bench.scale import settle

    def busy() -> None:
        for i in range(6):
            (tmp_path / f"f{i}").write_bytes(b"x" * i)
            time.sleep(0.1)

    writer = threading.Thread(target=busy)
    start = time.monotonic()
    writer.start()
    waited = settle(str(tmp_path), quiet=0.5, limit=10)
    writer.join()
    assert waited >= 0.5 + 0.4 and time.monotonic() - start < 5  # quiet only after the writes
    assert 0.3 <= settle(str(tmp_path), quiet=5, limit=0.3) < 1.5  # the limit holds


def test_compression_bench_runs_and_reports_every_kind(tmp_path: Path) -> None:
    """bench.compression at a tiny size: every kind loaded, checked and timed."""
    out = tmp_path / "c.json"
    run = subprocess.run([sys.executable, "-m", "bench.compression", "--keys", "3000",
                          "--gets", "1000", "--json", str(out)], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    lo, hi = report["value_bytes"]
    assert 150 <= lo <= hi <= 300
    stores = report["stores"]
    for kind in ("none", "lz4", "zstd"):
        assert stores[f"lsmdb {kind}"]["sstable_bytes"] > 0
        for label in ("present", "absent"):
            assert report["gets"][label][kind]["per_second"] > 0
    # JSON records shrink: each compressor's files are well under the uncompressed ones
    assert stores["lsmdb zstd"]["sstable_bytes"] < stores["lsmdb lz4"]["sstable_bytes"] \
        < 0.8 * stores["lsmdb none"]["sstable_bytes"]
    assert "Bytes on disk" in run.stdout and "vs none" in run.stdout


def test_scale_sizes(tmp_path: Path) -> None:
    out = tmp_path / "sizes.json"
    png = tmp_path / "sizes.png"
    plot = ["--plot", str(png)] if importlib.util.find_spec("matplotlib") else []
    done = run_module("bench.scale", "--sizes", "40000", "12000", "--queries", "400",
                      "--json", str(out), "--filter-family", "blocked_bloom", *plot)
    report = json.loads(out.read_text())
    assert report["filter_family"] == "blocked_bloom"
    assert "filter_family=blocked_bloom" in done.stdout
    rows = report["rows"]
    assert [r["keys"] for r in rows] == [12000, 40000]   # ascending
    assert rows[1]["filter_families"] == [3]  # every file's filter blocked (12,000: no file)
    for r in rows:
        assert r["load_per_s"] > 0 and r["bytes_on_disk"] > 0 and r["open_seconds"] > 0
        assert r["rss_anon_after_gets"] > 0 and r["write_stalls"] == 0
        assert r["memory_budget_bytes"] == (r["filter_bytes_in_memory"]
                                            + r["index_bytes_in_memory"]
                                            + r["block_cache_bytes"] + (150 << 20))
        for name in ("warm_absent", "cold_absent", "warm_present", "cold_present"):
            assert r[name + "_per_s"] > 0
    assert rows[0]["warm_absent_slowdown"] == 1.0
    assert "RssAnon" in done.stdout
    if plot:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_scale_order_is_a_permutation() -> None:
    from bench.scale_ladder import scrambled
    for n in (2, 3, 10, 1000, 12345):
        order = list(scrambled(n, seed=n))
        assert sorted(order) == list(range(n))
        assert n < 10 or order[:10] != list(range(10))
