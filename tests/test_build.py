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
