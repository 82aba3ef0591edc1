"""Randomized I/O faults (EIO, ENOSPC, EMFILE, partial writes) under a random workload.

The short version of ``tools/faultsoak.py``: only OSError and LsmdbError reach
the caller, reads in the same process match the model, and once faults stop
the database reopens with every acknowledged write and verifies clean.
"""

from __future__ import annotations

import os

import pytest

from tools import faultsoak

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"),
                                reason="the fault layer reads descriptors through /proc")


def test_random_io_faults_lose_no_acknowledged_write():
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    summary = faultsoak.run(seeds=40, seed=1, ops=400, rate=0.05, base=base, out=print)
    report = summary.text()
    print(report)
    assert summary.problems == [], report
    assert summary.acked_writes > 500 and summary.faults > 100, report
    assert summary.failed_calls > 50 and summary.reopens > 20, report


def test_the_model_allows_one_failed_write_since_the_last_acknowledged_one():
    model = faultsoak.Model()
    model.apply([("default", b"a", b"1")])
    model.failed = [[("default", b"a", None)], [("default", b"b", b"2")]]
    assert model.with_failed() == [{"default": {}}, {"default": {b"a": b"1", b"b": b"2"}}]
