"""The ``lsmdb`` command line: inspect, sstable, trace, verify, advise, --help.

The CLI runs as a separate process (``python -m lsmdb ...``) on a database
built here, whose files, key ranges and filters are known; filter answers are
recomputed independently from the filter block's bytes (docs/FORMAT.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import textwrap
import threading
import zlib
from bisect import bisect_left

import pytest
import xxhash

import lsmdb
import lsmdb.cli
from lsmdb.sstable_reader import SSTableReader

USERS = "users"

SSTABLE_FIELDS = (
    "table", "file", "path", "level", "entries", "tombstones", "size_bytes", "min_key", "max_key",
    "filter_fp_chance", "filter_bits", "filter_hashes", "filter_bytes", "bits_per_key",
    "fill_ratio", "predicted_fpr", "estimated_fpr_from_fill", "estimated_keys_from_fill",
    "filter_stale", "filter_version", "range_skips", "filter_negatives", "true_positives",
    "false_positives",
    "block_reads", "measured_fpr", "false_ratio",
)
COUNTER_FIELDS = ("range_skips", "filter_negatives", "true_positives", "false_positives",
                  "block_reads")
SUBCOMMANDS = ("demo", "inspect", "sstable", "trace", "verify", "advise")


def lsmdb_subprocess(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``python -m lsmdb ARGS`` in a new process."""
    return subprocess.run([sys.executable, "-m", "lsmdb", *args], capture_output=True,
                          text=True, timeout=timeout)


def ukey(i: int) -> bytes:
    return b"u:%06d" % i


# --------------------------------------------------------------------- filter model
class FilterModel:
    """One SSTable's filter decoded from the file's bytes (docs/FORMAT.md, "Filter block")."""

    HEADER = struct.Struct("<BBHIQQdI")

    def __init__(self, sst_path: str) -> None:
        reader = SSTableReader(sst_path)
        off, size = reader.filter_handle
        reader.close()
        with open(sst_path, "rb") as f:
            f.seek(off)
            block = f.read(size)
        self.version, _algo, _flags, self.k, self.m, self.n, _fp, _kid = \
            self.HEADER.unpack_from(block, 0)
        self.bits = block[self.HEADER.size:]

    def first_zero_probe(self, k: bytes) -> tuple[int, int] | None:
        """(probe index, bit) of the first probe hitting a 0 bit; None: "maybe"."""
        h = xxhash.xxh3_64_intdigest(k)
        h1, h2 = h & 0xFFFFFFFF, h >> 32
        s = self.m // self.k  # format 2: k partitions of s bits
        for i in range(self.k):
            if self.version == 2:
                pos = i * s + (((h1 + i * h2) % 2**32) * s >> 32)
            else:
                pos = (h1 + i * h2) % self.m
            if not self.bits[pos >> 3] & (1 << (pos & 7)):
                return i, pos
        return None


# --------------------------------------------------------------------- the database
@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A closed database with counters on disk.

    users: F1 holds u:000000..u:000998 (even, every 50th a tombstone), F2 holds
    u:000001..u:000999 (odd), F3 holds w:... -- so a key like ``u:000500a`` is inside
    F1's and F2's range and outside F3's.  default: one file, one non-UTF-8 key.
    """
    path = str(tmp_path_factory.mktemp("cli") / "db")
    with lsmdb.open(path, auto_compaction=False) as db:
        users = db.create_table(USERS, bloom_filter_fp_chance=0.01, block_size_bytes=512)
        with db.batch() as b:
            for i in range(0, 1000, 2):
                if i % 100 == 50:
                    b.delete(ukey(i), table=USERS)
                else:
                    b.put(ukey(i), b"even-%d" % i, table=USERS)
        users.flush()
        with db.batch() as b:
            for i in range(1, 1000, 2):
                b.put(ukey(i), b"odd-%d" % i, table=USERS)
        users.flush()
        with db.batch() as b:
            for i in range(300):
                b.put(b"w:%06d" % i, b"w-%d" % i, table=USERS)
        users.flush()
        db.put(b"alpha", b"1")
        db.put(b"\xff\x00bin", b"binary-value")
        db.put(b"omega", b"2")
        db.flush()
        # counters: present, absent, out-of-range reads
        for i in range(0, 1000, 3):
            users.get(ukey(i))
        for i in range(400):
            users.get(ukey(i) + b"x")
        for i in range(50):
            users.get(b"a%d" % i)
            db.get(b"zz%d" % i)
        db.get(b"alpha")
    return path


@pytest.fixture
def dbpath(template, tmp_path):
    path = str(tmp_path / "db")
    shutil.copytree(template, path)
    return path


def users_files(path: str) -> dict[str, str]:
    """{"F1"|"F2"|"F3": sst path} of the users table, by key range."""
    with lsmdb.open(path, read_only=True) as db:
        infos = db.sstables(USERS)
    out = {}
    for info in infos:
        if info.min_key.startswith(b"w:"):
            out["F3"] = info.path
        elif info.min_key == ukey(0):
            out["F1"] = info.path
        else:
            out["F2"] = info.path
    assert len(out) == 3
    return out


def expected_infos(path: str) -> dict[str, dict]:
    with lsmdb.open(path, read_only=True) as db:
        return {i.file: i for i in db.sstables()}


# --------------------------------------------------------------------- inspect
def test_inspect_fits_100_columns_unless_wide(dbpath, lsmdb_cli):
    narrow = lsmdb_cli("inspect", dbpath)
    wide = lsmdb_cli("inspect", dbpath, "--wide")
    assert narrow.returncode == wide.returncode == 0
    assert max(map(len, narrow.stdout.splitlines())) <= 100, narrow.stdout
    assert max(map(len, wide.stdout.splitlines())) > 100
    header = next(ln for ln in wide.stdout.splitlines() if ln.startswith("lvl"))
    assert {"tombs", "true pos", "disk reads", "cache hits", "fill"} <= set(
        re.split(r"\s{2,}", header.strip()))


def test_inspect_human_one_row_per_sstable_and_a_totals_line(dbpath, lsmdb_cli):
    infos = expected_infos(dbpath)
    r = lsmdb_cli("inspect", dbpath, "--wide")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    for name in infos:
        rows = [ln for ln in lines if name in ln]
        assert len(rows) == 1, (name, rows)
    assert len([ln for ln in lines if re.search(r"\d{6}\.sst", ln)]) == len(infos) == 4
    totals = [ln for ln in lines if ln.strip().startswith("totals:")]
    assert len(totals) == 2
    assert sum(1 for ln in lines if ln.startswith("table 'users'")) == 1
    assert sum(1 for ln in lines if ln.startswith("table 'default'")) == 1
    with lsmdb.open(dbpath, read_only=True) as db:
        st = db.table_stats(USERS)
    users_block = r.stdout.split("table 'users'")[1]
    assert f"point reads {st['gets']:,}" in users_block
    # the counters of each file appear in its row
    for name, info in infos.items():
        row = next(ln for ln in lines if name in ln)
        cells = row.split()
        for c in COUNTER_FIELDS:
            assert f"{getattr(info, c):,}" in cells, (name, c, row)


def test_inspect_table_filter(dbpath, lsmdb_cli):
    files = users_files(dbpath)
    infos = expected_infos(dbpath)
    default_files = [n for n, i in infos.items() if i.table == "default"]
    r = lsmdb_cli("inspect", dbpath, "--table", USERS)
    assert r.returncode == 0, r.stderr
    assert "table 'users'" in r.stdout and "table 'default'" not in r.stdout
    for p in files.values():
        assert os.path.basename(p) in r.stdout
    for n in default_files:
        assert n not in r.stdout
    assert len([ln for ln in r.stdout.splitlines() if ln.strip().startswith("totals:")]) == 1

    r = lsmdb_cli("inspect", dbpath, "--table", USERS, "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert list(report["tables"]) == [USERS]
    assert {s["file"] for s in report["tables"][USERS]["sstables"]} == \
        {os.path.basename(p) for p in files.values()}


def test_inspect_json_has_every_field(dbpath, lsmdb_cli):
    infos = expected_infos(dbpath)
    with lsmdb.open(dbpath, read_only=True) as db:
        stats = {t: db.table_stats(t) for t in db.tables()}
        options = {t: db.table(t).options.to_dict() for t in db.tables()}
    r = lsmdb_cli("inspect", dbpath, "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert set(report) == {"tables"}
    assert set(report["tables"]) == {"default", USERS}
    seen = set()
    for name, t in report["tables"].items():
        assert set(t) >= {"options", "totals", "sstables"}
        assert t["options"]["bloom_filter_fp_chance"] == options[name]["bloom_filter_fp_chance"]
        assert t["options"]["bloom_filter_mode"] == "active"
        assert t["options"] == json.loads(json.dumps(options[name]))
        totals = t["totals"]
        for f in ("absent_share", "gets", "gets_absent", "measured_fpr", "false_ratio",
                  "filter_negatives", "false_positives", "true_positives", "block_reads",
                  "range_skips"):
            assert f in totals, f
        assert totals["gets"] == stats[name]["gets"] > 0
        assert totals["gets_absent"] == stats[name]["gets_absent"]
        assert totals["absent_share"] == pytest.approx(
            stats[name]["gets_absent"] / stats[name]["gets"])
        assert len(t["sstables"]) == len([i for i in infos.values() if i.table == name])
        for s in t["sstables"]:
            missing = [f for f in SSTABLE_FIELDS if f not in s]
            assert not missing, missing
            info = infos[s["file"]]
            seen.add(s["file"])
            assert s["table"] == name
            assert s["path"] == info.path and os.path.exists(s["path"])
            assert s["min_key"] == info.min_key.hex() and s["max_key"] == info.max_key.hex()
            for f in ("level", "entries", "tombstones", "size_bytes", "filter_bits",
                      "filter_hashes", "filter_bytes") + COUNTER_FIELDS:
                assert s[f] == getattr(info, f), f
            assert s["size_bytes"] == os.path.getsize(info.path)
            assert s["bits_per_key"] == pytest.approx(s["filter_bits"] / s["entries"])
            if name == USERS:
                assert s["filter_fp_chance"] == 0.01
            assert s["filter_stale"] is False
            absent = s["false_positives"] + s["filter_negatives"]
            if absent:
                assert s["measured_fpr"] == pytest.approx(s["false_positives"] / absent)
            else:
                assert s["measured_fpr"] is None
            probes = s["true_positives"] + absent
            assert s["false_ratio"] == (pytest.approx(s["false_positives"] / probes)
                                        if probes else None)
            assert 0.0 < s["fill_ratio"] < 1.0
            assert 0.0 < s["predicted_fpr"] < 0.05
    assert seen == set(infos)
    users = report["tables"][USERS]["sstables"]
    # the workload touched every kind of counter in the users table
    for c in COUNTER_FIELDS:
        assert sum(s[c] for s in users) > 0, c


def test_inspect_is_read_only_and_changes_nothing(dbpath, lsmdb_cli):
    def digest():
        out = {}
        for n in sorted(os.listdir(dbpath)):
            with open(os.path.join(dbpath, n), "rb") as f:
                out[n] = hashlib.sha256(f.read()).hexdigest()
        return out
    before = digest()
    assert lsmdb_cli("inspect", dbpath).returncode == 0
    assert lsmdb_cli("inspect", dbpath, "--json").returncode == 0
    assert lsmdb_cli("trace", dbpath, "u:000500x", "--table", USERS).returncode == 0
    assert digest() == before


CHILD = textwrap.dedent("""
    import sys, lsmdb
    db = lsmdb.open(sys.argv[1], auto_compaction=False)
    db.put(b"held-key", b"held-value")          # in the WAL and memtable only
    db.table("users").get(b"u:000002")
    print("ready", flush=True)
    sys.stdin.readline()
    assert db.get(b"held-key") == b"held-value"
    db.close()
    print("closed", flush=True)
""")


def test_inspect_trace_verify_on_a_database_another_process_holds_open(dbpath, lsmdb_cli):
    child = subprocess.Popen([sys.executable, "-c", CHILD, dbpath], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(60, child.kill)   # never hang on a stuck child
    watchdog.start()
    try:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()
        # the child really holds the database
        with pytest.raises(lsmdb.DatabaseLockedError):
            lsmdb.open(dbpath)

        r = lsmdb_cli("inspect", dbpath)
        assert r.returncode == 0, r.stderr
        assert "totals:" in r.stdout
        r = lsmdb_subprocess("inspect", dbpath, "--json")      # a third process
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        assert set(report["tables"]) == {"default", USERS}
        assert len(report["tables"][USERS]["sstables"]) == 3
        assert report["tables"][USERS]["totals"]["gets"] > 0

        r = lsmdb_cli("trace", dbpath, "held-key", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["result"] == "found"   # read from the child's WAL

        r = lsmdb_cli("verify", dbpath)
        assert r.returncode == 0, r.stdout + r.stderr

        out, err = child.communicate("go\n", timeout=30)
        assert child.returncode == 0, err
        assert "closed" in out
    finally:
        watchdog.cancel()
        if child.poll() is None:
            child.kill()
            child.wait()
    # inspect left the lock alone: the database opens normally now
    with lsmdb.open(dbpath) as db:
        assert db.get(b"held-key") == b"held-value"


def test_inspect_bad_path_fails_cleanly(tmp_path, lsmdb_cli):
    r = lsmdb_cli("inspect", str(tmp_path / "nothing-here"))
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "nothing-here").exists()


@pytest.mark.parametrize("command", ["inspect", "trace"])
def test_unknown_table_is_a_clean_error(dbpath, command):
    """Like a bad path: an error message naming the table, no traceback."""
    args = [command, dbpath] + (["somekey"] if command == "trace" else []) + ["--table", "nope"]
    r = lsmdb_subprocess(*args)
    assert r.returncode != 0
    assert "nope" in r.stderr
    assert "Traceback" not in r.stderr, r.stderr


# --------------------------------------------------------------------- sstable
def test_sstable_json_fields(dbpath, lsmdb_cli):
    f1 = users_files(dbpath)["F1"]
    r = lsmdb_cli("sstable", f1, "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert set(rep) >= {"file", "properties", "filter", "stats", "handles"}
    assert "entries" not in rep
    st = rep["stats"]
    missing = [f for f in SSTABLE_FIELDS if f not in st]
    assert not missing, missing
    model = FilterModel(f1)
    assert st["entries"] == rep["properties"]["entries"] == 500
    assert st["tombstones"] == 10
    assert st["min_key"] == ukey(0).hex() and st["max_key"] == ukey(998).hex()
    assert (st["filter_bits"], st["filter_hashes"]) == (model.m, model.k)
    assert (rep["filter"]["m"], rep["filter"]["k"], rep["filter"]["n"]) == (model.m, model.k, 500)
    assert rep["filter"]["error"] is None
    assert rep["filter"]["version"] == model.version == 2  # what the header says, as written now
    assert st["filter_fp_chance"] == 0.01
    assert st["size_bytes"] == os.path.getsize(f1)
    assert st["file"] == os.path.basename(f1)
    reader = SSTableReader(f1)
    assert rep["handles"]["filter"] == list(reader.filter_handle)
    assert rep["handles"]["index"] == list(reader.index_handle)
    reader.close()
    bits_set = sum(bin(b).count("1") for b in model.bits)
    assert st["fill_ratio"] == pytest.approx(bits_set / model.m)


def test_sstable_keys_dumps_every_entry(dbpath, lsmdb_cli):
    f1 = users_files(dbpath)["F1"]
    r = lsmdb_cli("sstable", f1, "--json", "--keys")
    assert r.returncode == 0, r.stderr
    entries = json.loads(r.stdout)["entries"]
    want = [{"key": ukey(i).hex(),
             "value": None if i % 100 == 50 else (b"even-%d" % i).hex()}
            for i in range(0, 1000, 2)]
    assert entries == want

    r = lsmdb_cli("sstable", f1, "--keys")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"{ukey(2)!r} -> {b'even-2'!r}" in out
    assert f"{ukey(50)!r} -> <tombstone>" in out
    assert sum(1 for ln in out.splitlines() if " -> " in ln) == 500
    r = lsmdb_cli("sstable", f1)
    assert r.returncode == 0 and " -> " not in r.stdout
    assert "  filter: version 2, m=" in r.stdout


def test_sstable_reports_the_filter_version_of_an_old_file(lsmdb_cli):
    """A file written before filter format 2 (the golden copy kept for it) says version 1."""
    old = os.path.join(os.path.dirname(__file__), "data", "golden_v1.sst")
    r = lsmdb_cli("sstable", old, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["filter"]["version"] == 1
    new = os.path.join(os.path.dirname(__file__), "data", "golden.sst")
    assert json.loads(lsmdb_cli("sstable", new, "--json").stdout)["filter"]["version"] == 2


def test_sstable_on_a_file_that_is_not_one(tmp_path, lsmdb_cli):
    bad = tmp_path / "x.sst"
    bad.write_bytes(b"\0" * 200)
    r = lsmdb_cli("sstable", str(bad))
    assert r.returncode != 0
    assert "Traceback" not in r.stderr


# --------------------------------------------------------------------- trace
def absent_key_rejected_by(files: list[str]) -> tuple[bytes, dict[str, tuple[int, int]]]:
    models = {p: FilterModel(p) for p in files}
    for i in range(1, 998):
        k = ukey(i) + b"x"
        probes = {p: models[p].first_zero_probe(k) for p in files}
        if all(v is not None for v in probes.values()):
            return k, probes
    raise AssertionError("no key the filters reject")  # pragma: no cover


def test_trace_absent_key_names_each_file_and_why(dbpath, lsmdb_cli):
    files = users_files(dbpath)
    k, probes = absent_key_rejected_by([files["F1"], files["F2"]])
    r = lsmdb_cli("trace", dbpath, k.decode(), "--table", USERS)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()

    def line_of(p):
        found = [ln for ln in lines if os.path.basename(p) in ln]
        assert len(found) == 1, (p, r.stdout)
        return found[0]
    assert "range skip" in line_of(files["F3"])
    for name in ("F1", "F2"):
        ln = line_of(files[name])
        probe, bit = probes[files[name]]
        assert "filter says absent" in ln, ln
        m = re.search(r"probe (\d+) of (\d+) hit bit (\d+) of (\d+)", ln)
        assert m, ln
        model = FilterModel(files[name])
        assert (int(m[1]), int(m[2]), int(m[3]), int(m[4])) == (probe, model.k, bit, model.m)
    assert "result: absent" in r.stdout
    assert "0 block reads" in r.stdout

    r = lsmdb_cli("trace", dbpath, k.decode(), "--table", USERS, "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    steps = {s["file"]: s for s in res["steps"] if "file" in s}
    assert set(steps) == {os.path.basename(p) for p in files.values()}
    assert steps[os.path.basename(files["F3"])]["outcome"] == "range_skip"
    for name in ("F1", "F2"):
        s = steps[os.path.basename(files[name])]
        assert s["outcome"] == "filter_absent"
        assert (s["probe"], s["bit"]) == probes[files[name]]
        assert "block" not in s
    assert res["result"] == "absent" and res["value"] is None
    assert (res["files_consulted"], res["range_skips"], res["filter_skips"],
            res["block_reads"]) == (3, 1, 2, 0)


def test_trace_present_key_found_with_block_offset(dbpath, lsmdb_cli):
    files = users_files(dbpath)
    k = ukey(500)
    reader = SSTableReader(files["F1"])
    i = bisect_left(reader.index_keys, k)
    offset, size = reader.index_offsets[i], reader.index_sizes[i]
    reader.close()
    assert offset > 0  # not the first block: the offset means something

    r = lsmdb_cli("trace", dbpath, k.decode(), "--table", USERS)
    assert r.returncode == 0, r.stderr
    ln = [x for x in r.stdout.splitlines() if os.path.basename(files["F1"]) in x]
    assert len(ln) == 1
    assert "found" in ln[0]
    assert f"offset {offset}" in ln[0] and f"{size} bytes" in ln[0] and f"block {i}" in ln[0]
    assert "result: found" in r.stdout
    assert "range skip" in [x for x in r.stdout.splitlines()
                            if os.path.basename(files["F3"]) in x][0]

    r = lsmdb_cli("trace", dbpath, k.decode(), "--table", USERS, "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    h = xxhash.xxh3_64_intdigest(k)
    assert res["table"] == USERS and res["key"] == k.hex()
    assert (res["hash"], res["h1"], res["h2"]) == (h, h & 0xFFFFFFFF, h >> 32)
    assert res["result"] == "found" and res["value"] == b"even-500".hex()
    assert res["steps"][0] == {"source": "memtable", "result": "miss"}
    file_steps = [s for s in res["steps"] if "file" in s]
    # newest first: F3, F2, F1
    assert [s["file"] for s in file_steps] == \
        [os.path.basename(files[n]) for n in ("F3", "F2", "F1")]
    last = file_steps[-1]
    assert last["outcome"] == "filter_maybe" and last["result"] == "found"
    # trace opens read-only with a cold cache: the block comes from disk
    assert last["block"] == {"index": i, "offset": offset, "size": size, "cached": False}
    assert last["level"] == 0
    f2 = file_steps[1]
    assert f2["outcome"] in ("filter_absent", "filter_maybe")
    if f2["outcome"] == "filter_maybe":
        assert f2["result"] == "false_positive"
    assert res["files_consulted"] == 3 and res["range_skips"] == 1
    assert res["block_reads"] == 1 + (f2["outcome"] == "filter_maybe")


def test_trace_tombstone(dbpath, lsmdb_cli):
    r = lsmdb_cli("trace", dbpath, "u:000050", "--table", USERS, "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["result"] == "deleted" and res["value"] is None
    assert [s for s in res["steps"] if "file" in s][-1]["result"] == "tombstone"


def test_trace_hex_key(dbpath, lsmdb_cli):
    k = b"\xff\x00bin"
    r = lsmdb_cli("trace", dbpath, k.hex(), "--hex", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["table"] == "default" and res["key"] == k.hex()
    assert res["result"] == "found" and bytes.fromhex(res["value"]) == b"binary-value"

    r = lsmdb_cli("trace", dbpath, k.hex(), "--hex")
    assert r.returncode == 0, r.stderr
    assert "found" in r.stdout and "result: found" in r.stdout

    # --hex and text name the same key
    a = lsmdb_cli("trace", dbpath, ukey(7).hex(), "--hex", "--table", USERS, "--json")
    b = lsmdb_cli("trace", dbpath, ukey(7).decode(), "--table", USERS, "--json")
    assert a.returncode == b.returncode == 0
    assert json.loads(a.stdout) == json.loads(b.stdout)
    assert json.loads(a.stdout)["value"] == b"odd-7".hex()

    r = lsmdb_cli("trace", dbpath, "not-hex", "--hex")
    assert r.returncode != 0 and "Traceback" not in r.stderr


# --------------------------------------------------------------------- verify
def test_verify_clean_database(dbpath, lsmdb_cli):
    r = lsmdb_cli("verify", dbpath)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 errors" in r.stdout
    assert "ERROR" not in r.stdout


def test_verify_flipped_data_block_byte(dbpath, lsmdb_cli):
    f1 = users_files(dbpath)["F1"]
    reader = SSTableReader(f1)
    assert len(reader.index_offsets) > 2
    offset, size = reader.index_offsets[2], reader.index_sizes[2]
    reader.close()
    with open(f1, "r+b") as f:
        f.seek(offset + size // 2)
        b = f.read(1)
        f.seek(offset + size // 2)
        f.write(bytes([b[0] ^ 0x01]))
    r = lsmdb_cli("verify", dbpath)
    assert r.returncode == 1, r.stdout + r.stderr
    hits = [ln for ln in r.stdout.splitlines() if f1 in ln and f"offset {offset}" in ln]
    assert hits, r.stdout
    assert "ERROR" in hits[0]
    # only that file is named
    for other in users_files(dbpath).values():
        if other != f1:
            assert other not in r.stdout


def test_verify_flipped_filter_bit_array_byte_reports_fail_open(dbpath, lsmdb_cli):
    f2 = users_files(dbpath)["F2"]
    reader = SSTableReader(f2)
    off, size = reader.filter_handle
    reader.close()
    header = FilterModel.HEADER.size
    assert size > header + 8
    at = off + header + (size - header) // 2      # inside the bit array
    with open(f2, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x10]))
    r = lsmdb_cli("verify", dbpath)
    assert r.returncode == 1, r.stdout + r.stderr
    hits = [ln for ln in r.stdout.splitlines() if f2 in ln]
    assert hits, r.stdout
    assert any(re.search(r"fails? open", ln) and f"offset {off}" in ln for ln in hits), hits

    # reads still answer correctly: a broken filter fails open
    with lsmdb.open(dbpath, read_only=True) as db:
        assert db.table(USERS).get(ukey(501)) == b"odd-501"
        info = [i for i in db.sstables(USERS) if i.path == f2][0]
        assert info.filter_error and info.filter_version is None
    r = lsmdb_cli("inspect", dbpath, "--table", USERS, "--json")
    assert r.returncode == 0, r.stderr
    versions = {s["file"]: s["filter_version"]
                for s in json.loads(r.stdout)["tables"][USERS]["sstables"]}
    assert versions.pop(os.path.basename(f2)) is None
    assert set(versions.values()) == {2}
    r = lsmdb_cli("inspect", dbpath, "--table", USERS, "--wide")
    [row] = [ln.split() for ln in r.stdout.splitlines() if os.path.basename(f2) in ln]
    assert row[2:5] == ["(FILTER", "FAILS", "OPEN)"], row
    # lvl, file, entries, tombs, size, comp, data, raw data, ratio, filter, bits/key, k, fmt
    assert row[row.index("lz4") + 7] == "-", row


def test_verify_reports_a_filter_false_negative(dbpath, lsmdb_cli):
    """A filter whose CRC is sound but which rejects one of its own keys (a lost key)."""
    f1 = users_files(dbpath)["F1"]
    reader = SSTableReader(f1)
    off, size = reader.filter_handle
    reader.close()
    model = FilterModel(f1)
    h = xxhash.xxh3_64_intdigest(ukey(400))
    if model.version == 2:  # the first probe: partition 0 of m // k bits
        pos = (h & 0xFFFFFFFF) * (model.m // model.k) >> 32
    else:
        pos = (h & 0xFFFFFFFF) % model.m
    with open(f1, "r+b") as f:
        f.seek(off)
        payload = bytearray(f.read(size))
        payload[FilterModel.HEADER.size + (pos >> 3)] &= ~(1 << (pos & 7)) & 0xFF
        f.seek(off)
        f.write(bytes(payload) + zlib.crc32(bytes(payload)).to_bytes(4, "little"))
    r = lsmdb_cli("verify", dbpath)
    assert r.returncode == 1, r.stdout
    assert any(f1 in ln and "false negative" in ln and repr(ukey(400)) in ln
               for ln in r.stdout.splitlines()), r.stdout


def test_verify_not_a_database(tmp_path, lsmdb_cli):
    r = lsmdb_cli("verify", str(tmp_path))
    assert r.returncode == 1
    assert "MANIFEST" in r.stdout


# --------------------------------------------------------------------- advise
def test_advise_rows_and_best_k(lsmdb_cli):
    r = lsmdb_cli("advise", "--keys", "1000000", "--fp", "0.1", "0.01", "0.001",
                  "--bits-per-key", "8")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # (fp, bits/key, k) as in the README's table
    for fp, bpk, k in (("0.1", "4.79", "3"), ("0.01", "9.59", "7"), ("0.001", "14.38", "10")):
        rows = [ln.split() for ln in lines if ln.split()[:1] == [fp]]
        assert len(rows) == 1, (fp, r.stdout)
        assert rows[0][1:3] == [bpk, k], rows[0]
    m = re.search(r"best k = (\d+)", r.stdout)
    assert m and m[1] == "6", r.stdout
    best_rows = [ln for ln in lines if "<- best" in ln]
    assert len(best_rows) == 1 and best_rows[0].split()[0] == "6"
    # k = 1..20 each listed once in the bits-per-key table
    after = r.stdout.split("bits/key (")[1].splitlines()
    ks = [ln.split()[0] for ln in after if re.match(r"\s*\d+\s+\d", ln)]
    assert ks == [str(k) for k in range(1, 21)]


def test_advise_prices_the_blocked_family_by_its_own_sizing(lsmdb_cli):
    r = lsmdb_cli("advise", "--keys", "1000000", "--fp", "0.1", "0.01", "0.001",
                  "--bits-per-key", "10", "--family", "bloom", "blocked_bloom")
    assert r.returncode == 0, r.stderr
    bloom, blocked = r.stdout.split("Blocked Bloom filter price list")
    assert bloom.startswith("Bloom filter price list") and "9.59" in bloom
    lines = blocked.splitlines()
    # bits per key as docs/FORMAT.md section 5 and the README give them; each
    # row's predicted rate at most the chance asked for
    for fp, bpk in (("0.1", "4.84"), ("0.01", "9.92"), ("0.001", "15.55")):
        rows = [ln.split() for ln in lines if ln.split()[:1] == [fp]]
        assert len(rows) == 1 and rows[0][1] == bpk, (fp, blocked)
        assert float(rows[0][-1].rstrip("%")) / 100 <= float(fp) * 1.0001, rows[0]
    # at 10 bits/key: k = 1..20, the best the lowest of them, and dearer than a standard
    # filter's best (one block per key costs rate at equal memory)
    after = blocked.split("bits/key (")[1].splitlines()
    table = [ln.split() for ln in after if re.match(r"\s*\d+\s+\d", ln)]
    assert [row[0] for row in table] == [str(k) for k in range(1, 21)]
    rate = {int(row[0]): float(row[1].rstrip("%")) for row in table}
    best = int(re.search(r"best k = (\d+)", blocked)[1])
    assert rate[best] == min(rate.values())
    standard = re.search(r"(\d+\.\d+)%  <- best", bloom)
    assert standard and rate[best] > float(standard[1])


def test_advise_blocked_at_a_tiny_chance_ends_and_counts_whole_blocks(lsmdb_cli):
    """The sizing's bisection stopped at an absolute 1/1024 bit, which floats
    cannot resolve at bits per key like 2^43: 1e-60 never returned."""
    r = lsmdb_cli("advise", "--keys", "100", "--fp", "1e-60", "--family", "blocked_bloom")
    assert r.returncode == 1 and "need more than" in r.stderr
    r = lsmdb_cli("advise", "--keys", "100", "--bits-per-key", "8", "--family", "blocked_bloom")
    assert r.returncode == 0 and "At 8 bits/key (1,024 bits for 100 keys)" in r.stdout


def test_advise_refuses_an_unknown_family(lsmdb_cli):
    r = lsmdb_cli("advise", "--keys", "10", "--family", "cuckoo")
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_advise_default_fp_list(lsmdb_cli):
    r = lsmdb_cli("advise", "--keys", "1000")
    assert r.returncode == 0, r.stderr
    firsts = [ln.split()[0] for ln in r.stdout.splitlines() if ln.strip()]
    for fp in ("0.1", "0.01", "0.001", "0.0001"):
        assert firsts.count(fp) == 1, fp
    assert "best k" not in r.stdout


@pytest.mark.parametrize("args, message", [
    (["--keys", "-5"], "--keys must be >= 1, got -5"),
    (["--keys", "0"], "--keys must be >= 1, got 0"),
    (["--keys", "10", "--fp", "2"], "--fp must be between 0 and 1"),
    (["--keys", "10", "--fp", "0.01", "0"], "--fp must be between 0 and 1"),
    (["--keys", "10", "--fp", "nan"], "--fp must be between 0 and 1"),
    (["--keys", "10", "--bits-per-key", "-1"], "--bits-per-key must be a number > 0"),
    (["--keys", "10", "--bits-per-key", "0"], "--bits-per-key must be a number > 0"),
    (["--keys", "10", "--bits-per-key", "inf"], "--bits-per-key must be a number > 0"),
])
def test_advise_refuses_what_has_no_price_list_in_one_line(lsmdb_cli, args, message):
    """--keys 0 was a ZeroDivisionError traceback, --bits-per-key -1 exited 0."""
    r = lsmdb_cli("advise", *args)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith(f"lsmdb: {message}") and len(r.stderr.splitlines()) == 1, r.stderr


# --------------------------------------------------------------------- demo
DEMO_SMALL = ("--keys", "300", "--queries", "50", "--sstables", "2")


def test_demo_refuses_a_database_it_did_not_build(tmp_path, lsmdb_cli):
    """It used to drop the user's tables 'users' and 'events' silently."""
    path = str(tmp_path / "mine")
    with lsmdb.open(path) as db:
        db.create_table("users", bloom_filter_fp_chance=0.2).put(b"alice", b"1")
        db.put(b"k", b"v")
    r = lsmdb_cli("demo", path, *DEMO_SMALL)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith(f"lsmdb: {path} holds a database lsmdb demo did not build")
    assert "'users'" in r.stderr and "--force" in r.stderr and len(r.stderr.splitlines()) == 1
    with lsmdb.open(path, read_only=True) as db:
        assert db.tables() == ["default", "users"] and db.table("users")[b"alice"] == b"1"
        assert db.table("users").options.bloom_filter_fp_chance == 0.2
        assert list(db.items()) == [(b"k", b"v")]
    r = lsmdb_cli("demo", path, *DEMO_SMALL, "--force")
    assert r.returncode == 0, r.stderr
    with lsmdb.open(path, read_only=True) as db:
        assert db.tables() == ["default", "events", "users"] and b"alice" not in db.table("users")
        assert db[b"k"] == b"v"


def test_demo_builds_again_in_a_database_it_built(tmp_path, lsmdb_cli):
    empty = tmp_path / "empty"
    empty.mkdir()
    for path in (str(tmp_path / "new"), str(empty)):
        for _ in range(2):
            r = lsmdb_cli("demo", path, *DEMO_SMALL)
            assert r.returncode == 0, r.stderr
        with lsmdb.open(path, read_only=True) as db:
            assert db.tables() == ["default", "events", "users"]
            assert len(db.table("users")) == 200


@pytest.mark.parametrize("what", ["file", "foreign-dir"])
def test_demo_refuses_what_is_no_database_in_one_line(tmp_path, lsmdb_cli, what):
    path = tmp_path / "x"
    if what == "file":
        path.write_text("mine")
    else:
        path.mkdir()
        (path / "notes.txt").write_text("mine")
    for extra in ((), ("--force",)):
        r = lsmdb_cli("demo", str(path), *DEMO_SMALL, *extra)
        assert r.returncode == 1 and r.stderr.startswith("lsmdb: ")
        assert len(r.stderr.splitlines()) == 1, r.stderr
    assert (path.read_text() if what == "file" else sorted(os.listdir(path))) == \
        ("mine" if what == "file" else ["notes.txt"])


# --------------------------------------------------------------------- help
def parser_actions(parser: argparse.ArgumentParser, where: str = "lsmdb"):
    """(where, action) for every argument of ``parser`` and of its subcommands."""
    for action in parser._actions:
        yield where, action
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parser_actions(sub, f"{where} {name}")


def test_every_argument_has_a_help_text():
    missing = [f"{where}: {action.dest}" for where, action in
               parser_actions(lsmdb.cli.build_parser())
               if not action.help or action.help == argparse.SUPPRESS]
    assert missing == []


def test_the_help_walk_sees_every_argument():
    seen = {(where, action.dest) for where, action in parser_actions(lsmdb.cli.build_parser())}
    assert ("lsmdb inspect", "path") in seen and ("lsmdb advise", "keys") in seen
    assert ("lsmdb create-table", "bloom_filter_skip_last_level") in seen


def subcommand_names() -> list[str]:
    parser = lsmdb.cli.build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return sorted(action.choices)
    raise AssertionError("no subcommands")


def test_every_required_subcommand_exists():
    names = subcommand_names()
    for name in SUBCOMMANDS:
        assert name in names


def test_top_level_help_mentions_an_example():
    r = lsmdb_subprocess("--help")
    assert r.returncode == 0, r.stderr
    assert "example" in r.stdout.lower()
    for name in SUBCOMMANDS:
        assert name in r.stdout


@pytest.mark.parametrize("name", subcommand_names())
def test_subcommand_help_mentions_an_example(name, capsys):
    with pytest.raises(SystemExit) as exc:
        lsmdb.cli.main([name, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "example" in out.lower()
    assert f"lsmdb {name}" in out


def test_subcommand_help_via_subprocess():
    for name in ("inspect", "trace"):
        r = lsmdb_subprocess(name, "--help")
        assert r.returncode == 0 and "example" in r.stdout.lower()


# --------------------------------------------------------------------- quick looks
def test_put_get_delete_scan(tmp_path, lsmdb_cli):
    path = str(tmp_path / "db")
    with lsmdb.open(path) as db:
        db.create_table("t")
        db.put(b"\xff\x00", b"binary")
    assert lsmdb_cli("put", path, "a", "1").returncode == 0
    assert lsmdb_cli("put", path, "b", "2", "--table", "t").returncode == 0
    assert lsmdb_cli("put", path, "626262", "c3c3", "--hex").returncode == 0
    r = lsmdb_cli("get", path, "a")
    assert (r.returncode, r.stdout) == (0, "1\n")
    assert lsmdb_cli("get", path, "b", "--table", "t").stdout == "2\n"
    assert lsmdb_cli("get", path, "bbb").stdout == "\\xc3\\xc3\n"   # not UTF-8: escaped
    assert lsmdb_cli("get", path, "ff00", "--hex").stdout == "62696e617279\n"
    missing = lsmdb_cli("get", path, "nope")
    assert missing.returncode == 1 and missing.stderr.startswith("lsmdb: no key 'nope'")
    r = lsmdb_cli("scan", path)
    assert r.stdout.splitlines() == ["a\t1", "bbb\t\\xc3\\xc3", "\\xff\\x00\tbinary"]
    assert lsmdb_cli("scan", path, "--limit", "1").stdout == "a\t1\n"
    assert lsmdb_cli("scan", path, "--start", "b", "--end", "c").stdout == "bbb\t\\xc3\\xc3\n"
    assert lsmdb_cli("scan", path, "--prefix", "ff", "--hex").stdout == "ff00\t62696e617279\n"
    assert lsmdb_cli("scan", path, "--reverse", "--limit", "1").stdout == "\\xff\\x00\tbinary\n"
    assert lsmdb_cli("delete", path, "a").returncode == 0
    assert lsmdb_cli("get", path, "a").returncode == 1
    with lsmdb.open(path, read_only=True) as db:
        assert (db.get(b"a"), db.get(b"bbb"), db.table("t").get(b"b")) == (None, b"\xc3\xc3",
                                                                            b"2")


@pytest.mark.parametrize("args", [("get", "{p}", "k", "--table", "nope"),
                                  ("put", "{p}", "zz", "v", "--hex"),
                                  ("scan", "{p}", "--limit", "-1"),
                                  ("get", "{p}/missing", "k")])
def test_quick_look_errors_are_one_line(tmp_path, lsmdb_cli, args):
    path = str(tmp_path / "db")
    lsmdb.open(path).close()
    r = lsmdb_cli(*(a.format(p=path) for a in args))
    assert r.returncode == 1 and r.stderr.startswith("lsmdb: ")
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


# --------------------------------------------------------------------- errors, one line each
def test_import_of_a_csv_file_is_one_line(tmp_path):
    path = str(tmp_path / "db")
    with lsmdb.open(path) as db:
        db.put(b"k", b"v")
    csv = tmp_path / "rows.csv"
    assert lsmdb_subprocess("export", path, "--table", "default", "--format", "csv",
                            "--out", str(csv)).returncode == 0
    for args in (["import", str(tmp_path / "other"), str(csv), "--create"],
                 ["import", str(tmp_path / "other"), str(csv), "--table", "default", "--create"]):
        r = lsmdb_subprocess(*args)
        assert r.returncode == 1, r
        assert r.stderr.startswith("lsmdb: line 1: not valid JSON"), r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not (tmp_path / "other").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_inspect_of_an_unreadable_directory_is_one_line(tmp_path):
    path = tmp_path / "db"
    lsmdb.open(str(path)).close()
    path.chmod(0)
    try:
        r = lsmdb_subprocess("inspect", str(path))
    finally:
        path.chmod(0o755)
    assert r.returncode == 1 and r.stderr.startswith("lsmdb: ")
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_an_unreadable_manifest_is_one_line(tmp_path):
    path = tmp_path / "db"
    lsmdb.open(str(path)).close()
    (path / "MANIFEST").write_bytes(b"garbage" * 10)
    for command in ("inspect", "verify", "export", "scan"):
        r = lsmdb_subprocess(command, str(path))
        assert r.returncode == 1 and "Traceback" not in r.stderr, (command, r.stderr)
        assert r.stderr.startswith("lsmdb: ") or "ERROR" in r.stdout, (command, r)


def test_version_says_whether_the_c_speedups_are_on():
    r = lsmdb_subprocess("--version")
    assert r.returncode == 0
    assert r.stdout.startswith(f"lsmdb {lsmdb.__version__} (C speedups: ")
    assert ("C speedups: on" in r.stdout) == lsmdb.SPEEDUPS


def test_demo_header_says_whether_the_c_speedups_are_on(tmp_path):
    r = lsmdb_subprocess("demo", str(tmp_path / "demo"), "--keys", "3000", "--queries", "300")
    assert r.returncode == 0, r.stderr
    assert "C speedups: on" in r.stdout.splitlines()[0] or not lsmdb.SPEEDUPS


# --------------------------------------------------------------------- export every table
def test_export_without_table_exports_every_table_and_import_puts_them_back(tmp_path):
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    with lsmdb.open(src) as db:
        db.put(b"d", b"1")
        db.create_table("events").put(b"e", b"2")
        db.create_table("empty")
    out = tmp_path / "all.jsonl"
    assert lsmdb_subprocess("export", src, "--out", str(out)).returncode == 0
    lines = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert [ln["table"] for ln in lines if "key" in ln] == ["default", "events"]
    assert [ln["table"] for ln in lines if "options" in ln] == ["default", "empty", "events"]
    r = lsmdb_subprocess("import", dst, str(out), "--create")
    assert r.returncode == 0, r.stderr
    with lsmdb.open(dst) as db:
        assert (db.get(b"d"), db.table("events").get(b"e")) == (b"1", b"2")
        assert db.tables() == ["default", "empty", "events"]
    cql = lsmdb_subprocess("export", src, "--format", "cql")
    assert cql.stdout.count("CREATE TABLE") == 3
    csv = lsmdb_subprocess("export", src, "--format", "csv")
    assert csv.returncode == 1 and "--table" in csv.stderr


def test_inspect_of_a_directory_whose_files_do_not_read_is_one_line(tmp_path):
    """Root reads any directory, so the unreadable file here is a MANIFEST that is a
    directory: an OSError from the open, as EACCES would be."""
    path = tmp_path / "db"
    path.mkdir()
    (path / "MANIFEST").mkdir()
    for command in ("inspect", "verify", "scan"):
        r = lsmdb_subprocess(command, str(path))
        assert r.returncode == 1 and "Traceback" not in r.stderr + r.stdout, (command, r)
        assert len((r.stderr + r.stdout).strip().splitlines()) <= 2, (command, r)
