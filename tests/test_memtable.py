"""The memtable against a dict: newest value per key, sorted keys, size accounting, key filter."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lsmdb.memtable as memtable_mod
from lsmdb.memtable import ENTRY_OVERHEAD_BYTES, Memtable

keys = st.binary(max_size=6)
values = st.one_of(st.none(), st.binary(max_size=20))
ops = st.lists(st.one_of(
    st.tuples(st.just("put"), keys, values),
    st.tuples(st.just("batch"), st.dictionaries(keys, values, max_size=8), st.none()),
    st.tuples(st.just("range"), st.one_of(st.none(), keys), st.one_of(st.none(), keys)),
), max_size=60)


def expected_size(model: dict[bytes, bytes | None]) -> int:
    return sum(len(k) + ENTRY_OVERHEAD_BYTES + len(v or b"") for k, v in model.items())


@pytest.fixture(params=["with key filter", "without"])
def with_filter(request, monkeypatch):
    if request.param == "without":
        monkeypatch.setattr(memtable_mod, "MemFilter", None)
    elif memtable_mod.MemFilter is None:
        pytest.skip("built without the C speedups")
    return request.param


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # it picks a path
@given(ops=ops, reverse=st.booleans())
def test_a_memtable_agrees_with_a_dict(with_filter, ops, reverse):
    mem = Memtable()
    model: dict[bytes, bytes | None] = {}
    seq = 0
    for op, a, b in ops:
        if op == "put":
            seq += 1
            mem.apply(seq, a, b)
            model[a] = b
        elif op == "batch":
            seq += 1
            mem.apply_many(seq, a)
            model.update(a)
        else:
            chunks = mem.chunk_range(a, b, reverse=reverse)
            want = sorted((k for k in model if (a is None or k >= a) and (b is None or k < b)),
                          reverse=reverse)
            got = [k for ks, _vs in chunks for k in ks]
            assert got == want
            assert [v for _ks, vs in chunks for v in vs] == [model[k] for k in want]
        mem._check()
        assert mem.data == model and len(mem) == len(model)
        assert mem.size_bytes == expected_size(model)
        if mem.filter is not None:          # never a "no" for a key the memtable holds
            assert all(mem.filter.may_hold(k) for k in model)
    assert list(mem.keys) == sorted(model)
    if seq:
        assert mem.min_seq == 1 and mem.max_seq == seq


def test_freeze_sorts_what_is_pending_and_the_sequence_range_is_kept(with_filter):
    mem = Memtable()
    mem.apply_many(5, {b"b": b"2", b"a": None})
    mem.apply(7, b"c", b"3")
    assert mem._pending
    mem.freeze()
    assert mem.frozen and not mem._pending and list(mem._keys) == [b"a", b"b", b"c"]
    assert (mem.min_seq, mem.max_seq) == (5, 7)


def test_the_key_filter_grows_and_never_forgets_a_key():
    mem = Memtable()
    if mem.filter is None:
        pytest.skip("built without the C speedups")
    start = mem.filter.capacity
    for i in range(start * 3):
        mem.apply(i + 1, b"key%d" % i, b"v")
    assert mem.filter.capacity > start
    assert all(mem.filter.may_hold(b"key%d" % i) for i in range(start * 3))
    # ... and still says "no" to most keys it never saw (a filter, not a yes-machine)
    absent = sum(mem.filter.may_hold(b"other%d" % i) for i in range(10_000))
    assert absent < 1_000


def test_a_sorted_view_is_corruption_caught_by_check():
    mem = Memtable()
    mem.apply(1, b"a", b"1")
    mem.freeze()
    mem._keys.add(b"zz")
    with pytest.raises(AssertionError, match="disagree"):
        mem._check()
