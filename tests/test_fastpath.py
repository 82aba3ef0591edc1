"""The C read path's layout (counter slots) checked against the Python one at import."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

import lsmdb
import lsmdb.fastpath
from lsmdb.fastpath import layout_errors
from lsmdb.stats import FILE_COUNTERS, TABLE_COUNTERS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(lsmdb.__file__)))


def test_the_built_extension_matches_the_python_layout():
    """The extension lsmdb imports numbers its counters as lsmdb.stats does:
    else the C read path would be refused (and the C-against-Python tests
    would compare Python with itself)."""
    speedups = pytest.importorskip("lsmdb._speedups", reason="built without a C compiler")
    assert layout_errors(speedups) == []
    assert speedups.FILE_COUNTERS == FILE_COUNTERS
    assert speedups.TABLE_COUNTERS == TABLE_COUNTERS
    assert lsmdb.fastpath.LAYOUT_ERRORS == [] and lsmdb.fastpath.C_READ_PATH
    assert lsmdb.SPEEDUPS and lsmdb.table.Probes is not None


def _module(**names: object) -> types.ModuleType:
    mod = types.ModuleType("fake_speedups")
    defaults = {"FILE_COUNTERS": FILE_COUNTERS, "TABLE_COUNTERS": TABLE_COUNTERS}
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
    old = types.ModuleType("old_speedups")  # built before it exported its layout
    assert layout_errors(old) == ["it exports no counter slots"]


MISMATCH_CHILD = r'''
import importlib.util, sys
spec = importlib.util.spec_from_file_location("lsmdb._speedups", sys.argv[1])
speedups = importlib.util.module_from_spec(spec)
spec.loader.exec_module(speedups)
slots = list(speedups.FILE_COUNTERS)
slots[0], slots[1] = slots[1], slots[0]  # as if built from sources that swapped two slots
speedups.FILE_COUNTERS = tuple(slots)
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


def test_an_extension_built_from_other_sources_is_refused(tmp_path):
    """An extension whose counter slots differ from lsmdb.stats (built from
    other sources than the Python beside it) would count into the wrong
    slots: lsmdb refuses its read path with a warning at import, says so where
    it says whether the speedups are on, and reads in Python, counting right."""
    speedups = pytest.importorskip("lsmdb._speedups", reason="built without a C compiler")
    out = subprocess.run([sys.executable, "-c", MISMATCH_CHILD, speedups.__file__,
                          str(tmp_path / "db")], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    assert "lsmdb._speedups does not match this lsmdb (file counter slots" in out.stderr
