"""The test suite's command-line options."""

from __future__ import annotations

from typing import Any


def pytest_addoption(parser: Any) -> None:
    parser.addoption("--bloom-seed", type=int, default=20240611,
                     help="seed of the keys tests/test_bloom.py's statistical tests draw")
