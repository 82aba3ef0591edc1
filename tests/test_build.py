"""The optional C extension is built wherever it can be."""

from __future__ import annotations

import pytest

import lsmdb


def test_speedups_are_built_where_a_c_compiler_is():
    """pip builds lsmdb/_speedups.c when it can; where a compiler exists and
    the extension is missing, the build broke (and lsmdb runs far slower)."""
    import shutil
    import sysconfig
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}): the Python paths serve")
    assert lsmdb.SPEEDUPS, "a C compiler is here but lsmdb._speedups was not built"


def test_the_built_extension_is_not_older_than_its_source():
    """pip treats the extension as optional: a source that no longer compiles
    leaves the previous build in place, silently.  In a source checkout the
    built file must be at least as new as lsmdb/_speedups.c."""
    import os
    if not lsmdb.SPEEDUPS:
        pytest.skip("built without the C speedups")
    from lsmdb import _speedups
    source = os.path.join(os.path.dirname(lsmdb.__file__), "_speedups.c")
    if not os.path.exists(source) or not _speedups.__file__:
        pytest.skip("not a source checkout")
    assert os.path.getmtime(_speedups.__file__) >= os.path.getmtime(source), \
        "lsmdb/_speedups.c changed since the extension was built: rebuild (pip install -e .)"
