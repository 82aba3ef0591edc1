"""The memtable against a dict: newest value per key, sorted keys, size accounting, key filter."""

from __future__ import annotations

import random
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lsmdb
import lsmdb.fastpath
import lsmdb.memtable as memtable_mod
import lsmdb.readpath
import lsmdb.table
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


def test_freeze_leaves_the_sort_to_the_first_ordered_read_and_keeps_the_sequence_range(
        with_filter):
    mem = Memtable()
    mem.apply_many(5, {b"b": b"2", b"a": None})
    mem.apply(7, b"c", b"3")
    assert mem._pending
    mem.freeze()
    assert mem.frozen and mem._pending  # a flush sorts the dict itself
    assert list(mem.keys) == [b"a", b"b", b"c"] and not mem._pending
    assert (mem.min_seq, mem.max_seq) == (5, 7)


def test_readers_of_a_frozen_memtable_sort_its_keys_in_once():
    """Scans of a frozen memtable hold no lock: when several start at once, one
    sorts the pending keys in and the others wait for it -- never two sorts
    (keys twice over) nor a reader seeing half of one."""
    for _round in range(3):
        mem = Memtable()
        rng = random.Random(_round)
        mem.apply_many(1, {b"%08d" % rng.randrange(10**8): b"" for _ in range(60_000)})
        mem.freeze()
        expected = sorted(mem.data)
        start = threading.Barrier(6)
        seen: list[list[bytes]] = []

        def reader(mem: Memtable, start: threading.Barrier, seen: list[list[bytes]]) -> None:
            start.wait()
            seen.append(list(mem.keys))

        threads = [threading.Thread(target=reader, args=(mem, start, seen)) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(seen) == 6 and all(keys == expected for keys in seen)


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


try:
    from lsmdb import _speedups as speedups
except ImportError:  # pragma: no cover - built without a C compiler
    speedups = None  # type: ignore[assignment]
needs_c = pytest.mark.skipif(speedups is None, reason="built without a C compiler")


# ------------------------------------------------------------------ MemFilter
MemFilter = speedups.MemFilter


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.binary(max_size=260), max_size=300), max_size=12),
       st.lists(st.binary(max_size=260), max_size=50))
@needs_c
def test_memfilter_never_denies_a_key_of_its_dict(batches, start):
    """Built from a dict, then fed batches (add_many before the dict update, as
    Memtable does, growing past its capacity on the way): every key of the
    dict, long keys included, is always a maybe."""
    data = dict.fromkeys(start)
    mf = MemFilter(data)
    for batch in batches:
        new = [k for k in dict.fromkeys(batch) if k not in data]
        if len(new) == 1:
            mf.add(new[0])
        else:
            mf.add_many(new)
        data.update(dict.fromkeys(batch))
        assert all(mf.may_hold(k) for k in data)
    assert mf.capacity >= len(data)


@needs_c
def test_memfilter_false_positive_rate_at_full_design_load():
    """Filled to its capacity (10 bits per key, 6 bits in one 512-bit line per
    key) it should answer maybe for about 0.96 % of absent keys; the bound,
    2 %, is 33 standard deviations above that, so only a broken layout (all
    keys in a few lines, bits not set or not tested) fails it."""
    rng = random.Random(5)
    first = {rng.randbytes(16): None for _ in range(20_000)}
    mf = MemFilter(first)
    assert mf.capacity == 40_000
    more = [rng.randbytes(16) for _ in range(20_000)]
    mf.add_many(more)
    assert mf.capacity == 40_000  # exactly full: no resize
    assert all(mf.may_hold(k) for k in [*first, *more])
    probes = 100_000
    fp = sum(mf.may_hold(rng.randbytes(17)) for _ in range(probes))
    assert fp / probes < 0.02
    assert mf.nbytes == 64 * -(-40_000 * 10 // 512)


@needs_c
def test_memfilter_bad_input_changes_nothing():
    mf = MemFilter({})
    with pytest.raises(TypeError):
        MemFilter([b"a"])
    with pytest.raises(TypeError):
        mf.add_many((b"a",))
    with pytest.raises(TypeError):
        mf.add_many([b"a", "b"])
    with pytest.raises(TypeError):
        mf.add("a")
    with pytest.raises(TypeError):
        mf.may_hold("a")
    assert not mf.may_hold(b"a")  # the rejected batch left no bit behind
    assert mf.may_hold(b"x" * 241)  # too long to hash inline: always a maybe
    uninitialised = MemFilter.__new__(MemFilter)
    with pytest.raises(TypeError):
        uninitialised.may_hold(b"a")
    with pytest.raises(TypeError):
        uninitialised.add_many([b"a"])


@needs_c
def test_memtables_keep_their_keys_in_their_filters(tmp_path):
    """Every write path (put, delete, batches, recovery from the log, frozen
    memtables) leaves each key of each memtable in that memtable's filter, and
    the getter's state pairs each dict with its own filter."""
    db = lsmdb.open(str(tmp_path), auto_compaction=False)
    db.put(b"one", b"1")
    db.delete(b"two")
    with db.batch() as b:
        for i in range(3000):
            b.put(b"k%06d" % i, b"v")
    state = db._default_state
    assert state.mem.filter is not None
    db.close()
    db = lsmdb.open(str(tmp_path), auto_compaction=False)  # the memtable from the log
    db.put(b"three", b"3")
    state = db._default_state
    data, imms, filters = state.fast.data, state.fast.imm_datas, state.fast.filters
    assert filters[0].may_hold(b"three")
    for d, f in zip((data, *imms), filters, strict=True):
        assert len(d) >= 3002
        assert all(f.may_hold(k) for k in d)
    assert db.get(b"k001234") == b"v" and db.get(b"two") is None
    db.close()




# ------------------------------------------------------------ apply_columns
tagged_values = st.one_of(st.none(), st.binary(max_size=20),
                          st.tuples(st.binary(max_size=20), st.integers(1, 2**40)))
column_batches = st.lists(st.lists(st.tuples(st.binary(max_size=4), tagged_values),
                                   max_size=30), max_size=8)


def columns_into(mem: Memtable, batches: list[list[tuple[bytes, object]]], first_seq: int
                 ) -> None:
    for seq, ops in enumerate(batches, first_seq):
        keys, values = [k for k, _ in ops], [v for _, v in ops]
        mem.apply_columns(seq, keys, values, any(type(v) is tuple for v in values))


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(before=column_batches, batches=column_batches)
@needs_c
def test_apply_columns_in_c_agrees_with_apply_many(monkeypatch, before, batches):
    """The C step against the Python reference (apply_many of the batch's
    dict) on memtables that already hold values, tombstones and expiring
    values: the same dicts, tags, size, new keys, sequence range; a later op
    on a key wins; the key filter holds every key."""
    memtables = []
    for use_c in (False, True):
        monkeypatch.setattr(memtable_mod, "USE_SPEEDUPS", use_c)
        mem = Memtable()
        columns_into(mem, before, 1)
        columns_into(mem, batches, 100)
        memtables.append(mem)
    py, c = memtables
    assert c.data == py.data and c.tags == py.tags
    assert c.size_bytes == py.size_bytes
    assert sorted(c._pending) == sorted(py._pending) == sorted(py.data)
    assert (c.min_seq, c.max_seq) == (py.min_seq, py.max_seq)
    assert c.expiring >= py.expiring  # C: a tuple among the values given
    model: dict[bytes, object] = {}
    for ops in before + batches:
        model.update(ops)
    assert c.data == model
    assert all(c.filter.may_hold(k) for k in c.data)
    c._check()


@needs_c
def test_apply_columns_rejects_bad_input_and_changes_nothing():
    mem = Memtable()
    mem.apply_columns(1, [b"a", b"b"], [b"1", None])
    before = (dict(mem.data), dict(mem.tags), mem.size_bytes, list(mem._pending))
    for keys, values in (([b"c", "d"], [b"1", b"2"]), ([b"c", b"d"], [b"1", 2]),
                         ([b"c", b"d"], [b"1", (b"x",)]), ([b"c"], [b"1", b"2"])):
        with pytest.raises((TypeError, ValueError)):
            speedups.apply_columns(mem.data, mem.tags, mem.filter, mem._pending, 2, keys,
                                   values)
        assert (mem.data, mem.tags, mem.size_bytes, mem._pending) == before


@needs_c
def test_a_batch_through_apply_columns_is_seen_whole_or_not_at_all():
    """Readers racing batches of 2,000 keys that each set every key to the
    batch's own value: no read of all the keys ever sees two batches."""
    mem = Memtable()
    keys = [b"k%05d" % i for i in range(2_000)]
    mem.apply_columns(1, keys, [b"0"] * len(keys))
    done = threading.Event()
    torn: list[set[bytes]] = []

    def reader() -> None:
        data = mem.data
        while not done.is_set():
            seen = set(map(data.__getitem__, keys))  # C: no thread switch inside
            if len(seen) != 1:
                torn.append(seen)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for seq in range(2, 300):
            mem.apply_columns(seq, keys, [b"%d" % seq] * len(keys))
    finally:
        done.set()
        for t in threads:
            t.join()
    assert torn == []


@needs_c
def test_apply_columns_stopped_part_way_leaves_a_whole_memtable():
    """An op that fails in the loop (here a value the memtable cannot hold,
    planted under a key) stops the batch there: the ops before it applied
    whole, it and the ops after it not at all; the dicts, pending keys and
    filter agree, and the size is counted again."""
    mem = Memtable()
    mem.apply_columns(1, [b"a", b"bad"], [b"1", b"2"])
    mem.data[b"bad"] = bytearray(b"22222")  # not a memtable value
    with pytest.raises(TypeError):
        mem.apply_columns(2, [b"new1", b"a", b"bad", b"new2"], [b"x", None, b"y", b"z"])
    assert mem.data == {b"a": None, b"bad": bytearray(b"22222"), b"new1": b"x"}
    assert mem.tags.keys() == mem.data.keys()
    assert mem.tags[b"a"] == 2 << 8 and mem.tags[b"new1"] == 2 << 8 | 1
    assert sorted(mem._pending) == [b"a", b"bad", b"new1"]
    assert mem.max_seq == 2
    assert mem.size_bytes == (1 + 3 + 4) + 3 * ENTRY_OVERHEAD_BYTES + 1 + 5
    with pytest.raises(ValueError, match="pending"):
        keys = [b"k"]
        speedups.apply_columns(mem.data, mem.tags, mem.filter, keys, 3, keys, [b"v"])
