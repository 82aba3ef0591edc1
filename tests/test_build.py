"""The optional C extension is built wherever it can be."""

from __future__ import annotations

import os

import pytest

import lsmdb

REPO = os.path.dirname(os.path.dirname(os.path.abspath(lsmdb.__file__)))


def test_speedups_are_built_where_a_c_compiler_is():
    """pip builds lsmdb/csrc/ when it can; where a compiler exists and the
    extension is missing, the build broke (and lsmdb runs far slower)."""
    import shutil
    import sysconfig
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}): the Python paths serve")
    assert lsmdb.SPEEDUPS, "a C compiler is here but lsmdb._speedups was not built"


def _c_sources() -> list[str]:
    """The C files and the header of lsmdb._speedups in a source checkout."""
    csrc = os.path.join(os.path.dirname(lsmdb.__file__), "csrc")
    if not os.path.isdir(csrc):
        return []
    return sorted(os.path.join(csrc, n) for n in os.listdir(csrc) if n.endswith((".c", ".h")))


def test_the_built_extension_is_not_older_than_its_sources():
    """pip treats the extension as optional: a source that no longer compiles
    leaves the previous build in place, silently.  In a source checkout the
    built file must be at least as new as every file of lsmdb/csrc/."""
    if not lsmdb.SPEEDUPS:
        pytest.skip("built without the C speedups")
    from lsmdb import _speedups
    sources = _c_sources()
    if not sources or not _speedups.__file__:
        pytest.skip("not a source checkout")
    built = os.path.getmtime(_speedups.__file__)
    newer = [os.path.relpath(p, REPO) for p in sources if os.path.getmtime(p) > built]
    assert not newer, f"{newer} changed since the extension was built: rebuild (pip install -e .)"


def test_setup_builds_every_c_file_of_csrc():
    """setup.py names the extension's sources one by one: a C file added to
    lsmdb/csrc/ and not to that list would be left out of the build."""
    import ast
    sources = [os.path.basename(p) for p in _c_sources() if p.endswith(".c")]
    if not sources:
        pytest.skip("not a source checkout")
    tree = ast.parse(open(os.path.join(REPO, "setup.py")).read())
    listed = next(ast.literal_eval(node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Assign)
                  and any(getattr(t, "id", None) == "SOURCES" for t in node.targets))
    assert sorted(listed) == sources


def test_the_stub_is_true_to_the_module():
    """lsmdb/_speedups.pyi against the built module, by mypy's stubtest: every
    name, every signature (the C docstrings begin with theirs, "name(...)" and
    "--", which is what stubtest reads), which classes are final, which
    attributes are read-only.  Nothing is allowlisted."""
    import subprocess
    import sys
    if not lsmdb.SPEEDUPS:
        pytest.skip("built without the C speedups")
    pytest.importorskip("mypy.stubtest")
    out = subprocess.run([sys.executable, "-m", "mypy.stubtest", "--mypy-config-file",
                          os.path.join(REPO, "pyproject.toml"), "lsmdb._speedups"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr


#: PYTHONPATH entry whose sitecustomize blocks lsmdb._speedups in every process.
NO_SPEEDUPS_PATH = os.path.join(REPO, "tests", "no_speedups")


def without_speedups() -> dict[str, str]:
    """The environment of a child process (and its children) without the C extension."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [NO_SPEEDUPS_PATH,
                                                      env.get("PYTHONPATH")]))
    return env


NO_SPEEDUPS_CHILD = r'''
import sys
import lsmdb, lsmdb.cache, lsmdb.table
assert not lsmdb.SPEEDUPS and not lsmdb.table.USE_SPEEDUPS
assert lsmdb.cache.BlockCache is lsmdb.cache.PyBlockCache
db = lsmdb.open(sys.argv[1], block_cache_size_bytes=12 * 1024)
for i in range(20000):
    db.put(b"k%06d" % (2 * i), b"v%d" % i)
db.flush()
def want(i):
    return b"v%d" % (i // 2) if i % 2 == 0 else None
for _ in range(2):  # the small cache fills, then admits on second reads
    for i in range(0, 40000, 7):
        assert db.get(b"k%06d" % i) == want(i), i
assert db._versions.block_cache.admission.full and len(db._versions.block_cache) > 0
keys = [b"k%06d" % i for i in range(0, 40000, 13)]
assert db.get_many(keys) == [want(i) for i in range(0, 40000, 13)]
db.compact()
assert sum(1 for _ in db.scan()) == 20000
assert db.get(b"k000002") == b"v1" and db.get(b"k000003") is None
db.close()
print("ok")
'''


def test_lsmdb_works_without_its_c_extension(tmp_path):
    """The extension is optional: with its import failing, a database is
    written, read (the Python block cache full and admitting), read many
    keys at once, compacted and scanned, with the same answers."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", NO_SPEEDUPS_CHILD, str(tmp_path / "db")],
                         cwd=REPO, capture_output=True, text=True, timeout=300,
                         env=without_speedups())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


WARNINGS_CHILD = r'''
import importlib, json, pkgutil, warnings
warnings.resetwarnings()  # tests/no_speedups ignores the warning: count it here
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import lsmdb
    for info in pkgutil.walk_packages(lsmdb.__path__, "lsmdb."):
        if info.name not in ("lsmdb._speedups", "lsmdb.__main__"):  # __main__ runs the CLI
            importlib.import_module(info.name)
print(json.dumps([[w.category.__name__, str(w.message)] for w in caught]))
'''


@pytest.mark.parametrize("blocked", [True, False], ids=["without-c", "with-c"])
def test_import_warns_once_without_the_c_speedups(blocked):
    """Without lsmdb._speedups, importing lsmdb and every module of it gives one
    RuntimeWarning (even with every warning shown each time), naming the cost and how
    to get the speedups; with them, none."""
    import json
    import subprocess
    import sys
    if not blocked and not lsmdb.SPEEDUPS:
        pytest.skip("built without the C speedups")
    out = subprocess.run([sys.executable, "-c", WARNINGS_CHILD], cwd=REPO, capture_output=True,
                         text=True, timeout=120,
                         env=without_speedups() if blocked else dict(os.environ))
    assert out.returncode == 0, out.stderr
    runtime = [message for category, message in json.loads(out.stdout)
               if category == "RuntimeWarning"]
    if not blocked:
        assert runtime == []
        return
    assert runtime == [lsmdb.NO_SPEEDUPS_WARNING]
    for words in ("C speedups", "30x slower", "C compiler", "Python headers", "reinstall"):
        assert words in runtime[0]


#: The suites that also run on the Python path alone: the database, its model,
#: the formats, corruption, crashes and power losses, snapshots, expiring values, reads
#: across files that overlap in age, compactions in the worker process.
CORE_SUITES = ["test_db.py", "test_db_model.py", "test_golden.py", "test_corruption.py",
               "test_crash.py", "test_powerloss.py", "test_format2.py", "test_snapshot.py",
               "test_ttl.py", "test_seq_overlap.py", "test_worker.py", "test_blocked_bloom.py"]


def test_the_core_suites_pass_without_the_c_extension(tmp_path):
    """The Python path is the reference: the core suites pass on it alone, in a
    pytest whose every process has the C extension blocked (where it is built;
    without it the suites ran so already)."""
    import re
    import subprocess
    import sys
    if not lsmdb.SPEEDUPS:
        pytest.skip("built without the C speedups: the whole suite ran on the Python path")
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rfE",
                          "--tb=short", "--basetemp", str(tmp_path / "t"),
                          *(os.path.join("tests", name) for name in CORE_SUITES)],
                         cwd=REPO, capture_output=True, text=True, timeout=1800,
                         env=without_speedups())
    tail = out.stdout[-4000:] + out.stderr[-2000:]
    assert "lsmdb C speedups: off" in out.stdout, tail
    assert out.returncode == 0, tail
    passed = re.search(r"(\d+) passed", out.stdout)
    assert passed is not None and int(passed.group(1)) >= 150, tail


def test_the_sdist_carries_what_the_tests_and_benches_need(tmp_path):
    """An sdist built from the tracked files holds every tracked file of the package,
    the tests (and their data), the benches, the tools and the docs, and declares its
    licence as an SPDX expression."""
    import shutil
    import subprocess
    import sys
    import tarfile
    if shutil.which("git") is None or not os.path.isdir(os.path.join(REPO, ".git")):
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    src = tmp_path / "src"
    for name in tracked:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.join(REPO, name), src / name)
    build = "from setuptools import build_meta; print(build_meta.build_sdist('dist'))"
    out = subprocess.run([sys.executable, "-c", build], cwd=src, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    sdist = src / "dist" / out.stdout.split()[-1]
    with tarfile.open(sdist) as tar:
        root = tar.getnames()[0].split("/")[0]
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        pkg_info = tar.extractfile(f"{root}/PKG-INFO").read().decode()  # type: ignore[union-attr]
    wanted = [n for n in tracked if n.split("/")[0] in ("lsmdb", "tests", "bench", "tools", "docs")]
    assert len(wanted) > 100
    missing = sorted(set(wanted) - names)
    assert missing == [], missing
    assert {".ci/run", "README.md", "pyproject.toml", "setup.py"} <= names
    assert "License-Expression: Apache-2.0" in pkg_info
