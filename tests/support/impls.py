"""The two implementations of lsmdb's hot steps, for tests that run over both.

Python is the reference and C the accelerator; a concept test takes the
``impl`` fixture (tests/conftest.py) and runs once per implementation, as
msgpack's suite does.  ``use_python`` switches every C twin of the read path
off in this process -- the C getter and probes, the C block cache's books,
the C data block rule and cached-block lookups, the C merge -- and the C
single put (lsmdb/csrc/writepath.c), so that what runs is the Python
reference alone (the hashes and CRC-32 stay: they compute the same numbers
either way).  tests/no_speedups/ blocks the extension for
whole processes.
"""

from __future__ import annotations

from typing import Any

import lsmdb
import lsmdb.compression
import lsmdb.db
import lsmdb.follow
import lsmdb.memtable
import lsmdb.merge
import lsmdb.readpath
import lsmdb.scan
import lsmdb.sstable_reader
import lsmdb.sstable_writer
import lsmdb.table
import lsmdb.writepath
from lsmdb.cache import PyBlockCache

#: The implementations this build has: Python always, C where it was built.
IMPLEMENTATIONS = ["python"] + (["c"] if lsmdb.SPEEDUPS else [])


def use_python(monkeypatch: Any) -> None:
    """Take the Python reference for every read step, the single put and the
    SSTable builder's steps from now on (undone with ``monkeypatch``):
    databases opened after this read, put and flush in Python only."""
    monkeypatch.setattr(lsmdb.readpath, "USE_C_GETTER", False)
    monkeypatch.setattr(lsmdb.table, "USE_SPEEDUPS", False)
    monkeypatch.setattr(lsmdb.db, "BlockCache", PyBlockCache)
    monkeypatch.setattr(lsmdb.sstable_reader, "_block_entry", None)
    monkeypatch.setattr(lsmdb.sstable_reader, "_block_lists", None)
    monkeypatch.setattr(lsmdb.sstable_reader, "_block_full", None)
    monkeypatch.setattr(lsmdb.sstable_reader, "_pieces_payload", None)
    monkeypatch.setattr(lsmdb.compression, "USE_SPEEDUPS", False)
    monkeypatch.setattr(lsmdb.readpath, "_c_entry_find", None)
    monkeypatch.setattr(lsmdb.scan, "_c_entry_lists", None)
    monkeypatch.setattr(lsmdb.merge, "USE_SPEEDUPS", False)
    monkeypatch.setattr(lsmdb.writepath, "USE_SPEEDUPS", False)
    monkeypatch.setattr(lsmdb.sstable_writer, "USE_SPEEDUPS", False)
    monkeypatch.setattr(lsmdb.memtable, "USE_SPEEDUPS", False)
    monkeypatch.setattr(lsmdb.follow, "USE_C_WATCH", False)
