"""What the tests share: small table options, database fixtures, the implementation a
concept test runs over, the suite's options.

``SMALL`` makes a table flush every few dozen writes into SSTables of several
blocks, so a test of a few hundred keys meets many files, blocks and
compactions.  ``small`` hands a copy to a test; modules that build options at
import time take ``SMALL`` itself.  ``impl`` runs a test once per
implementation of the hot steps (tests/support/impls.py).  The fault and
power-loss layers live in tests/support/ too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

# Where lsmdb._speedups is not built, every `import lsmdb` warns so (pyproject.toml ignores it
# in this process): expected in the processes the tests start too, whose stderr they read.
_EXPECTED = "ignore:lsmdb runs without its C speedups:RuntimeWarning"
os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"),
                                                      _EXPECTED]))

#: A 4 KiB memtable (the least allowed) and 512-byte blocks.
SMALL: dict[str, int] = {"memtable_size_bytes": 4096, "block_size_bytes": 512}


def pytest_addoption(parser: Any) -> None:
    parser.addoption("--bloom-seed", type=int, default=20240611,
                     help="seed of the keys tests/test_bloom.py's statistical tests draw")


def pytest_report_header(config: Any) -> str:
    import lsmdb
    return f"lsmdb C speedups: {'on' if lsmdb.SPEEDUPS else 'off'}"


@pytest.fixture(params=["python", "c"])
def impl(request: Any, monkeypatch: Any) -> str:
    """"python" or "c": the implementation of the read path this run of the test
    takes (tests/support/impls.py); the C run is skipped where C is not built."""
    from tests.support.impls import IMPLEMENTATIONS, use_python
    if request.param not in IMPLEMENTATIONS:
        pytest.skip("built without a C compiler")
    if request.param == "python":
        use_python(monkeypatch)
    return str(request.param)


@pytest.fixture
def small() -> dict[str, int]:
    """A copy of ``SMALL``."""
    return dict(SMALL)


@pytest.fixture
def db_path(tmp_path: Any) -> str:
    """Where a test's database lives (not created yet)."""
    return str(tmp_path / "db")


@pytest.fixture
def small_db(db_path: str) -> Iterator[Any]:
    """A database whose default table has ``SMALL`` options, background compaction
    off (a test decides when to compact); closed after the test."""
    import lsmdb
    db = lsmdb.open(db_path, auto_compaction=False)
    db.alter_table("default", **SMALL)
    yield db
    if not db.closed:
        db.close()


@pytest.fixture(scope="module")
def fixed_db_id():
    """Every database made while it is in force gets the same id (lsmdb.manifest.new_db_id
    is random): for tests that compare the bytes of two runs of one workload."""
    import lsmdb.manifest
    real = lsmdb.manifest.new_db_id
    lsmdb.manifest.new_db_id = lambda: "fe" * 16
    yield
    lsmdb.manifest.new_db_id = real


@pytest.fixture
def lsmdb_cli(capsys):
    """``lsmdb ARGS`` in this process (lsmdb.cli.main): same result shape as a subprocess."""
    import subprocess

    import lsmdb.cli

    def run(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        try:
            rc = lsmdb.cli.main(list(args))
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["lsmdb", *args], rc, out, err)
    return run
