"""Blocks lsmdb's C extension in every Python started with this directory on PYTHONPATH.

``tests/test_build.py`` runs the core suites this way, so that the pure-Python
path -- the reference the C speedups accelerate -- is tested on its own,
child processes included.  The RuntimeWarning ``import lsmdb`` gives without
its speedups is expected here, so it is ignored (tests/test_build.py resets
the filters to count it).
"""

import importlib.abc
import sys
import warnings


class _BlockSpeedups(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201
        if name == "lsmdb._speedups":
            raise ImportError("lsmdb's C speedups are blocked (tests/no_speedups)")
        return None


sys.meta_path.insert(0, _BlockSpeedups())
warnings.filterwarnings("ignore", message="lsmdb runs without its C speedups",
                        category=RuntimeWarning)
