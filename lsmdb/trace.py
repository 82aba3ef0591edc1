"""Explain one point read, file by file, without touching any counter.

``trace_read`` runs the read path's own :func:`lsmdb.readpath.lookup` with an
observer (:class:`TraceSteps`) that records each step -- the memtables, a
level no file of which can hold the key, each file's key range, its filter
(the probe and bit that said no), the data block (offset, size) read on a
"maybe" and what it held -- while the lookup counts nothing and changes
nothing in the block cache.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .fastpath import FileProbe
from .filters.bloom import split_hash
from .filters.hashing import key_hash
from .readpath import lookup
from .sstable_format import MISSING

if TYPE_CHECKING:
    from .table import TableState


class TraceSteps:
    """A read observer (lsmdb.readpath.ReadObserver) recording each step as a dict."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self._file: dict[str, Any] | None = None

    def memtable(self, age: int | None, value: Any) -> None:
        if age is None:
            self.steps.append({"source": "memtable", "result": "miss"})
        else:
            self.steps.append({"source": "memtable" if age == 0 else "frozen memtable",
                               "result": "tombstone" if value is None else "found"})

    def level_miss(self, level: int, files: int) -> None:
        self.steps.append({"level": level, "outcome": "range_skip", "files_in_level": files})

    def _step(self, p: FileProbe, **fields: Any) -> dict[str, Any]:
        reader = p.reader
        step: dict[str, Any] = {"file": os.path.basename(reader.path), "level": reader.level}
        if p.hash_fn is not None:
            step["hash"] = "keyed"
        step.update(fields)
        self.steps.append(step)
        return step

    def range_skip(self, p: FileProbe) -> None:
        self._step(p, outcome="range_skip", min_key=p.min_key.hex(), max_key=p.max_key.hex())

    def filter_absent(self, p: FileProbe, h: int) -> None:
        self._step(p, **p.filter.explain(h), outcome="filter_absent", **self._error(p))

    def filter_maybe(self, p: FileProbe, h: int | None) -> None:
        explained = p.filter.explain(h) if h is not None else {"filter_bits": 0,
                                                               "filter_hashes": 0}
        self._file = self._step(p, **explained, **self._error(p))

    @staticmethod
    def _error(p: FileProbe) -> dict[str, Any]:
        error = p.reader.filter.error
        return {"filter_error": error} if error else {}

    def block(self, p: FileProbe, i: int, cached: bool, value: Any) -> None:
        step = self._file
        assert step is not None
        has_filter = bool(p.filter_family)
        if i < 0:  # past the last block
            step.update(outcome="filter_maybe", block=None, result="false_positive")
            return
        step["outcome"] = "filter_maybe" if has_filter else "no_filter"
        step["block"] = {"index": i, "offset": p.index_offsets[i], "size": p.index_sizes[i],
                         "cached": cached}
        if value is MISSING:
            step["result"] = "false_positive" if has_filter else "not_in_block"
        else:
            step["result"] = "tombstone" if value is None else "found"


def trace_read(state: TableState, key: bytes) -> dict[str, Any]:
    """A JSON-ready account of how ``get(key)`` is answered in this table."""
    h = key_hash(key)
    h1, h2 = split_hash(h)
    observer = TraceSteps()
    value = lookup(state.fast, key, observer=observer)
    out: dict[str, Any] = {"table": state.name, "key": key.hex(), "hash": h, "h1": h1, "h2": h2,
                           "steps": observer.steps}
    if value is MISSING:
        out["result"] = "absent"
        out["value"] = None
    elif value is None:
        out["result"] = "deleted"
        out["value"] = None
    else:
        out["result"] = "found"
        out["value"] = value.hex()
    files = [s for s in out["steps"] if "file" in s]
    out["files_consulted"] = len(files)
    out["range_skips"] = sum(1 for s in files if s["outcome"] == "range_skip")
    out["filter_skips"] = sum(1 for s in files if s["outcome"] == "filter_absent")
    out["block_reads"] = sum(1 for s in files if s.get("block"))
    return out
