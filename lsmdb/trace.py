"""Explain one point read, file by file, without touching any counter.

``trace_read`` follows exactly the path ``DB.get`` takes -- memtables, level
0 newest first, then at most one file per deeper level -- and records at
each file why it was skipped or read: the key range, the filter probe and
bit that was zero, or the data block (offset, size) read on a "maybe".
"""

from __future__ import annotations

import os
from bisect import bisect_left
from typing import TYPE_CHECKING, Any

from .filters.bloom import split_hash
from .filters.hashing import key_hash
from .sstable_format import MISSING

if TYPE_CHECKING:
    from .table import TableState


def _file_step(reader: Any, key: bytes, h: int) -> tuple[dict[str, Any], Any]:
    step: dict[str, Any] = {"file": os.path.basename(reader.path), "level": reader.level}
    handle = reader.filter
    if handle.hash_fn is not None:
        h = handle.hash_fn(key)
        step["hash"] = "keyed"
    if key < reader.min_key or key > reader.max_key:
        step.update(outcome="range_skip", min_key=reader.min_key.hex(),
                    max_key=reader.max_key.hex())
        return step, MISSING
    flt = handle.active
    has_filter = bool(flt.probe_spec().family)
    step.update(flt.explain(h) if has_filter else {"filter_bits": 0, "filter_hashes": 0})
    if handle.error:
        step["filter_error"] = handle.error
    if has_filter and not flt.may_contain(h):
        step["outcome"] = "filter_absent"
        return step, MISSING
    for name in ("probe", "bit"):
        step.pop(name, None)
    i = reader.block_for(key)
    if i >= len(reader.index_keys):
        step.update(outcome="filter_maybe", block=None, result="false_positive")
        return step, MISSING
    step["outcome"] = "filter_maybe" if has_filter else "no_filter"
    step["block"] = {"index": i, "offset": reader.index_offsets[i], "size": reader.index_sizes[i]}
    keys, values = reader.read_block(i, count=False)
    j = bisect_left(keys, key)
    if j < len(keys) and keys[j] == key:
        value = values[j]
        step["result"] = "tombstone" if value is None else "found"
        return step, value
    step["result"] = "false_positive" if has_filter else "not_in_block"
    return step, MISSING


def trace_read(state: TableState, key: bytes) -> dict[str, Any]:
    """A JSON-ready account of how ``get(key)`` is answered in this table."""
    h = key_hash(key)
    h1, h2 = split_hash(h)
    out: dict[str, Any] = {"table": state.name, "key": key.hex(), "hash": h, "h1": h1, "h2": h2,
                           "steps": []}
    steps = out["steps"]
    mem, imms, l0, deeper = state.view
    for where, table in [("memtable", mem)] + [("frozen memtable", m) for m in imms]:
        value = table.data.get(key, MISSING)
        if value is not MISSING:
            steps.append({"source": where, "result": "tombstone" if value is None else "found"})
            return _finish(out, value)
    steps.append({"source": "memtable", "result": "miss"})
    files = list(l0)
    for level, (max_keys, readers) in enumerate(deeper, start=1):
        i = bisect_left(max_keys, key)
        if i < len(readers):
            files.append(readers[i])
        elif readers:
            steps.append({"level": level, "outcome": "range_skip", "files_in_level": len(readers)})
    for reader in files:
        step, value = _file_step(reader, key, h)
        steps.append(step)
        if value is not MISSING:
            return _finish(out, value)
    return _finish(out, MISSING)


def _finish(out: dict[str, Any], value: Any) -> dict[str, Any]:
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
