"""Long-running tools (crash torture, profiles): each is also a script, ``python tools/NAME.py``;
the tests import them from here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_test_layer(stem: str) -> ModuleType:
    """tests/support/<stem>.py (the fault and power-loss layers; tests/ is not a package), loaded
    once under one name, ``lsmdb_tests_<stem>``, so that the tests and the tools share its
    classes: a ``Crash`` one of them raises is the ``Crash`` another catches."""
    name = f"lsmdb_tests_{stem}"
    if name not in sys.modules:
        path = Path(__file__).resolve().parent.parent / "tests" / "support" / f"{stem}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
