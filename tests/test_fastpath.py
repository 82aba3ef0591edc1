"""The read path's named tuples, and the C read path's layout (their fields, the
counter slots) checked against them at import."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

import lsmdb
import lsmdb.fastpath
from lsmdb.fastpath import FastPath, FileProbe, Level, layout_errors, py_constants
from lsmdb.stats import FILE_COUNTERS, TABLE_COUNTERS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(lsmdb.__file__)))


def test_the_built_extension_matches_the_python_layout():
    """The extension lsmdb imports numbers its counters as lsmdb.stats does:
    else the C read path would be refused (and the C-against-Python tests
    would compare Python with itself)."""
    speedups = pytest.importorskip("lsmdb._speedups", reason="built without a C compiler")
    assert layout_errors(speedups) == []
    assert speedups.FILE_PROBE_FIELDS == FileProbe._fields
    assert speedups.LEVEL_FIELDS == Level._fields
    assert speedups.FAST_PATH_FIELDS == FastPath._fields
    assert speedups.FILE_COUNTERS == FILE_COUNTERS
    assert speedups.TABLE_COUNTERS == TABLE_COUNTERS
    assert lsmdb.fastpath.LAYOUT_ERRORS == [] and lsmdb.fastpath.C_READ_PATH
    assert lsmdb.SPEEDUPS and lsmdb.table.Probes is not None


def _module(**names: object) -> types.ModuleType:
    mod = types.ModuleType("fake_speedups")
    defaults = {"FILE_PROBE_FIELDS": FileProbe._fields, "LEVEL_FIELDS": Level._fields,
                "FAST_PATH_FIELDS": FastPath._fields, "FILE_COUNTERS": FILE_COUNTERS,
                "TABLE_COUNTERS": TABLE_COUNTERS, "CONSTANTS": py_constants()}
    for name, value in {**defaults, **names}.items():
        setattr(mod, name, value)
    return mod


def test_layout_errors_name_what_does_not_match():
    assert layout_errors(None) == []  # not built: nothing to refuse
    assert layout_errors(_module()) == []
    # a prefix is fine: counters appended in Python that C does not count
    assert layout_errors(_module(FILE_COUNTERS=FILE_COUNTERS[:5])) == []
    swapped = (FILE_COUNTERS[1], FILE_COUNTERS[0], *FILE_COUNTERS[2:])
    [error] = layout_errors(_module(FILE_COUNTERS=swapped))
    assert error.startswith("file counter slots (filter_negatives, range_skips,")
    [error] = layout_errors(_module(TABLE_COUNTERS=("gets_absent", "gets")))
    assert error.startswith("table counter slots")
    assert layout_errors(_module(FILE_COUNTERS=(*FILE_COUNTERS, "extra")))
    bits_first = ("filter_data", *(f for f in FileProbe._fields if f != "filter_data"))
    [error] = layout_errors(_module(FILE_PROBE_FIELDS=bits_first))
    assert error.startswith("FileProbe fields ('filter_data', 'reader',")
    [error] = layout_errors(_module(FILTER_FAMILIES={2: "binary fuse"}))
    assert error.startswith("filter family 2 is 'binary fuse' in C")
    [error] = layout_errors(_module(FAST_PATH_FIELDS=FastPath._fields[:-1]))
    assert error.startswith("FastPath fields")
    [error] = layout_errors(_module(LEVEL_FIELDS=("files", "max_keys")))
    assert error.startswith("Level fields")
    [error] = layout_errors(_module(CONSTANTS={**py_constants(), "CRC32_RESIDUE": 1}))
    assert error.startswith("CRC32_RESIDUE is 1 in C")
    old = types.ModuleType("old_speedups")  # built before it exported its layout
    assert len(layout_errors(old)) == 4 + len(py_constants())
    assert layout_errors(old)[-1] == "it exports no counter slots"


def test_the_fast_path_is_the_files_in_read_order(tmp_path):
    """state.fast names what a get reads: the memtables' dicts, each file's
    FileProbe (its reader, range, filter and index as they are), level 0
    newest first, then each level's files, the same in ``files``."""
    db = lsmdb.open(str(tmp_path / "db"), auto_compaction=False)
    try:
        for n in range(3):
            db.put(b"k%d" % n, b"v")
            db.flush()
        db.put(b"x", b"y")
        fast = db._default_state.fast
        assert isinstance(fast, FastPath) and fast.data == {b"x": b"y"} and fast.imm_datas == ()
        assert [p.reader.number for p in fast.l0] == sorted(
            (p.reader.number for p in fast.l0), reverse=True)
        assert fast.files == fast.l0 + tuple(p for level in fast.deeper for p in level.files)
        for p in fast.files:
            r = p.reader
            assert isinstance(p, FileProbe)
            assert (p.min_key, p.max_key, p.counts, p.index_keys, p.cache_base) == (
                r.min_key, r.max_key, r.counts, r.index_keys, r.cache_base)
            flt = r.filter.active
            assert p.filter is flt and p.hash_fn is r.filter.hash_fn
            assert (p.filter_family, p.filter_params) == (flt.version, (flt.m, flt.k, flt.part))
            assert p.filter_data is flt.bits
        assert len(fast.filters) == 1 + len(fast.imm_datas)
    finally:
        db.close()


MISMATCH_CHILD = r'''
import importlib.util, sys
spec = importlib.util.spec_from_file_location("lsmdb._speedups", sys.argv[1])
speedups = importlib.util.module_from_spec(spec)
spec.loader.exec_module(speedups)
what = sys.argv[3]
names = list(getattr(speedups, what))
names[0], names[1] = names[1], names[0]  # as if built from sources that swapped two
setattr(speedups, what, tuple(names))
sys.modules["lsmdb._speedups"] = speedups
import lsmdb, lsmdb.cli_report, lsmdb.fastpath, lsmdb.readpath, lsmdb.table
assert lsmdb.fastpath.LAYOUT_ERRORS and not lsmdb.fastpath.C_READ_PATH
assert not lsmdb.SPEEDUPS and lsmdb.table.Probes is None and not lsmdb.table.USE_SPEEDUPS
assert not lsmdb.readpath.USE_C_GETTER
assert "built from other sources" in lsmdb.cli_report.speedups_line()
db = lsmdb.open(sys.argv[2])
for i in range(2000):
    db.put(b"k%05d" % (2 * i), b"v")
db.flush()
assert type(db.get).__name__ != "Getter"
assert db.get(b"k00002") == b"v" and db.get(b"k00003") is None
assert db.get_many([b"k00002", b"k00003"]) == [b"v", None]
[info] = db.sstables()
assert info.range_skips == 0 and info.filter_negatives + info.false_positives == 2
db.close()
print("ok")
'''


@pytest.mark.parametrize("what, said", [("FILE_COUNTERS", "file counter slots"),
                                        ("FILE_PROBE_FIELDS", "FileProbe fields")])
def test_an_extension_built_from_other_sources_is_refused(tmp_path, what, said):
    """An extension whose counter slots or FileProbe fields differ from the
    Python beside it (built from other sources) would count into the wrong
    slots or read the wrong fields: lsmdb refuses its read path with a
    warning at import, says so where it says whether the speedups are on,
    and reads in Python, counting right."""
    speedups = pytest.importorskip("lsmdb._speedups", reason="built without a C compiler")
    out = subprocess.run([sys.executable, "-c", MISMATCH_CHILD, speedups.__file__,
                          str(tmp_path / "db"), what], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    assert f"lsmdb._speedups does not match this lsmdb ({said}" in out.stderr
