"""The scripts of tools/ as modules, for tests that use what they define."""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_tool(name: str) -> ModuleType:
    """tools/``name``.py, imported (it is a script, not a package module)."""
    spec = importlib.util.spec_from_file_location(
        f"lsmdb_tool_{name}", os.path.join(ROOT, "tools", f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
