"""SSTableBuilder's bulk paths against adding one entry at a time.

``add_chunk`` (flushes and compactions) and ``add_many`` cut blocks with
cumulative sizes and a bisect per block; they must write byte for byte the
file ``add`` writes for the same entries, however the entries are split into
chunks, and stop at the same block boundary when a file size limit is given.
"""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lsmdb.sstable_writer import SSTableBuilder


def entries_strategy():
    return st.dictionaries(st.binary(min_size=1, max_size=12),
                           st.one_of(st.none(), st.binary(max_size=40)),
                           max_size=300).map(lambda d: sorted(d.items()))


def build(entries, block_size, how, cuts=(), fp=0.01):
    out = io.BytesIO()
    b = SSTableBuilder(out, fp_chance=fp, block_size=block_size)
    if how == "add":
        for k, v in entries:
            b.add(k, v)
    elif how == "many":
        b.add_many(iter(entries))
    else:
        bounds = sorted({0, len(entries), *[c % (len(entries) + 1) for c in cuts]})
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            part = entries[lo:hi]
            assert b.add_chunk([k for k, _ in part], [v for _, v in part]) == len(part)
    if entries:
        b.finish()
    return out.getvalue(), b


@settings(max_examples=120, deadline=None)
@given(entries_strategy(), st.integers(16, 600), st.lists(st.integers(0, 400), max_size=6))
def test_bulk_paths_write_the_same_bytes_as_add(entries, block_size, cuts):
    ref, rb = build(entries, block_size, "add")
    for how in ("many", "chunks"):
        got, gb = build(entries, block_size, how, cuts)
        assert got == ref, how
        assert (gb.entries, gb.tombstones, gb.min_key, gb.max_key) == \
            (rb.entries, rb.tombstones, rb.min_key, rb.max_key)


@settings(max_examples=80, deadline=None)
@given(entries_strategy(), st.integers(16, 300), st.integers(1, 3000))
def test_add_chunk_stops_at_the_same_block_boundary_as_add(entries, block_size, limit):
    if not entries:
        return
    # reference: add one at a time, stop after the first block flush at or past the limit
    ref = SSTableBuilder(io.BytesIO(), fp_chance=1.0, block_size=block_size)
    n_ref = 0
    for k, v in entries:
        ref.add(k, v)
        n_ref += 1
        if ref.file_size >= limit:
            break
    b = SSTableBuilder(io.BytesIO(), fp_chance=1.0, block_size=block_size)
    added = b.add_chunk([k for k, _ in entries], [v for _, v in entries], limit)
    assert added == n_ref
    assert b.file_size == ref.file_size


def test_add_chunk_refuses_disorder_and_changes_nothing():
    b = SSTableBuilder(io.BytesIO(), fp_chance=0.01, block_size=64)
    b.add_chunk([b"a", b"b"], [b"1", None])
    with pytest.raises(ValueError):
        b.add_chunk([b"c", b"c"], [b"1", b"2"])     # not strictly increasing
    with pytest.raises(ValueError):
        b.add_chunk([b"b"], [b"1"])                 # not after the last key
    with pytest.raises(ValueError):
        b.add_chunk([b"x"], [])                     # lengths differ
    assert (b.entries, b.tombstones, b.max_key) == (2, 1, b"b")
    assert b.add_chunk([], []) == 0
