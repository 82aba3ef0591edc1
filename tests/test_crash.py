"""Crash torture, short version: SIGKILL a writer at random moments and check the reopen.

The full tool is ``tools/crashtest.py --iterations N``; this runs enough
rounds of it to kill writers inside flushes and compactions.  Every
acknowledged write must be there, every acknowledged delete must stay
deleted, values must be the last acknowledged ones (or the one write in
flight), and ``verify`` (and once the ``lsmdb verify`` command) must find no
error.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools import crashtest

ITERATIONS = 30


pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork and SIGKILL")


def test_crash_torture(tmp_path):
    lines: list[str] = []
    summary = crashtest.run(ITERATIONS, seed=20240611, path=str(tmp_path / "db"),
                            out=lines.append)
    report = summary.text()
    print(report)
    assert summary.problems == [], report
    assert summary.iterations == ITERATIONS
    assert summary.acked_writes > 200, report
    assert summary.flushes > 10 and summary.compactions > 2, report
    assert summary.kills_in_flush + summary.kills_in_compaction > 0, report
    assert summary.cli_verify_runs == 1


def test_model_accepts_only_acknowledged_or_in_flight_states():
    """The checker itself: an in-flight batch counts whole or not at all."""
    model = crashtest.Model()
    model.begin({"kind": "write", "ops": [["default", b"a".hex(), b"1".hex()]]})
    model.ack()
    model.begin({"kind": "write", "ops": [["default", b"a".hex(), None],
                                          ["t", b"b".hex(), b"2".hex()]]})
    assert model.expected(False) == {"default": {b"a": b"1"}}
    assert model.expected(True) == {"default": {}, "t": {b"b": b"2"}}


def test_command_line(tmp_path):
    """The script itself, each writer a fresh interpreter (``--exec``)."""
    tool = Path(__file__).resolve().parent.parent / "tools" / "crashtest.py"
    result = subprocess.run([sys.executable, str(tool), "--iterations", "2", "--seed", "3",
                             "--exec", "--path", str(tmp_path / "db")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "iterations:              2" in result.stdout
    assert "problems:                0" in result.stdout
    assert not (tmp_path / "db").exists()     # removed without --keep
