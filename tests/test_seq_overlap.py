"""Level-0 files that overlap in sequence numbers: every read takes the newest version.

A merge of files that are not adjacent in age (F1 and F3 around F2) leaves an
output whose sequence numbers span F2's: a key may then have its newest
version in a file read after one holding an older version.  Reads of such a
table (FastPath.seq_overlap) compare sequence numbers: point reads, get_many,
scans in both directions with seek, snapshots, trace.  Size-tiered compaction
makes such merges (files of similar size, whatever their age); most tests here
install one by hand.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lsmdb
from lsmdb import compaction
from tests.support.clock import T0, Clock


def merge_by_hand(db, pick):
    """Merge the default table's files at positions ``pick`` (oldest first), not the bottom."""
    state = db._default_state
    files = sorted(state.files, key=lambda r: r.max_seq)
    job = compaction.CompactionJob(state, [files[i] for i in pick], 0, False, None,
                                   "test: files not adjacent in age")
    db._compactor.run(job)


def three_files(db):
    db.put(b"k", b"old")
    db.put(b"a", b"a1")
    db.put(b"gone", b"g1")
    db.flush()                      # F1
    db.put(b"k", b"mid")
    db.put(b"b", b"b2")
    db.delete(b"a")
    db.put(b"t", b"t2", ttl=10)     # expires: then hides nothing older (none)
    db.put(b"gone", b"g2", ttl=10)  # expires: hides F1's g1
    db.flush()                      # F2
    db.put(b"c", b"c3")
    db.put(b"b", b"b3")
    db.flush()                      # F3


WANT = {b"k": b"mid", b"b": b"b3", b"c": b"c3", b"t": b"t2", b"gone": b"g2"}


def test_reads_take_the_newest_version_across_overlapping_files(tmp_path, impl):
    clock = Clock()
    db = lsmdb.open(tmp_path / "db", auto_compaction=False, clock=clock)
    three_files(db)
    merge_by_hand(db, [0, 2])
    state = db._default_state
    assert state.fast.seq_overlap and len(state.files) == 2
    keys = [b"a", b"b", b"c", b"gone", b"k", b"t", b"zz"]
    want = [WANT.get(k) for k in keys]
    assert [db.get(k) for k in keys] == want
    assert db.get_many(keys) == want
    assert [k in db for k in keys] == [w is not None for w in want]
    assert list(db.scan()) == sorted(WANT.items())
    assert list(db.scan(reverse=True)) == sorted(WANT.items(), reverse=True)
    it = db.scan()
    it.seek(b"c")
    assert list(it) == [(k, v) for k, v in sorted(WANT.items()) if k >= b"c"]
    assert db.trace(b"k")["result"] == "found"
    with db.snapshot() as snap:
        assert snap.get(b"k") == b"mid" and snap.get_many([b"a", b"b"]) == [None, b"b3"]
        assert list(snap.scan()) == sorted(WANT.items())
    clock.t = T0 + 10               # g2 expires: F1's g1 must not come back
    assert db.get(b"gone") is None and b"gone" not in dict(db.scan())
    assert db.get_many([b"gone", b"t"]) == [None, None]
    db.close()
    db = lsmdb.open(tmp_path / "db", auto_compaction=False, clock=clock)
    assert db._default_state.fast.seq_overlap
    assert dict(db.scan()) == {b"k": b"mid", b"b": b"b3", b"c": b"c3"}
    db.put(b"k", b"new")            # the memtable is newer than every file
    assert db.get(b"k") == b"new" and dict(db.scan())[b"k"] == b"new"
    db.compact()                    # one file again: no overlap, same answers
    assert not db._default_state.fast.seq_overlap
    assert dict(db.scan()) == {b"k": b"new", b"b": b"b3", b"c": b"c3"}
    db.close()


def test_the_merged_output_keeps_the_newest_of_its_inputs(tmp_path):
    db = lsmdb.open(tmp_path / "db", auto_compaction=False)
    db.put(b"k", b"v1")
    db.flush()
    db.put(b"x", b"x2")
    db.flush()
    db.put(b"k", b"v3")
    db.flush()
    merge_by_hand(db, [0, 2])       # F1 (k=v1) and F3 (k=v3): v3 by its sequence number
    assert db.get(b"k") == b"v3"
    db.close()


keys = st.sampled_from([b"a", b"b", b"c", b"d", b"e"])
op = st.tuples(keys, st.one_of(st.none(), st.binary(min_size=1, max_size=3)))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.lists(st.lists(op, min_size=1, max_size=6), min_size=3, max_size=6),
       data=st.data())
def test_any_merge_of_any_files_reads_as_the_history_says(tmp_path_factory, files, data):
    path = tmp_path_factory.mktemp("db")
    db = lsmdb.open(path, auto_compaction=False)
    model: dict[bytes, bytes] = {}
    for ops in files:
        for key, value in ops:
            if value is None:
                db.delete(key)
                model.pop(key, None)
            else:
                db.put(key, value)
                model[key] = value
        db.flush()
    n = len(files)
    pick = sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=2, max_size=n),
                            label="files merged"))
    merge_by_hand(db, pick)
    probe = [b"a", b"b", b"c", b"d", b"e", b"f"]
    assert [db.get(k) for k in probe] == [model.get(k) for k in probe]
    assert db.get_many(probe) == [model.get(k) for k in probe]
    assert list(db.scan()) == sorted(model.items())
    assert list(db.scan(reverse=True)) == sorted(model.items(), reverse=True)
    db.close()


@pytest.mark.parametrize("pick", [[0, 2], [0, 1, 3], [1, 3]])
def test_a_merge_of_non_adjacent_files_is_seen_as_overlapping(tmp_path, pick):
    db = lsmdb.open(tmp_path / "db", auto_compaction=False)
    for i in range(4):
        db.put(b"k%d" % i, b"v")
        db.flush()
    assert not db._default_state.fast.seq_overlap
    merge_by_hand(db, pick)
    assert db._default_state.fast.seq_overlap
    db.close()


def _counters_after(path, monkeypatch, python, reads):
    """``reads(db, python)`` of four files (file f holds every (f + 1)th key: newer
    versions of older ones) with the Python or the C read path; what it
    answered, and the files' and the table's counters after it."""
    from tests.support.impls import use_python
    with monkeypatch.context() as m:
        if python:
            use_python(m)
        db = lsmdb.open(path, auto_compaction=False)
        db.alter_table("default", bloom_filter_fp_chance=0.01)
        for f in range(4):
            for i in range(0, 200, f + 1):
                db.put(b"k%03d" % i, b"v%d.%d" % (f, i))
            db.flush()
        answers = reads(db, python)
        counters = [(s.range_skips, s.filter_negatives, s.true_positives, s.false_positives,
                     s.block_reads, s.block_cache_hits) for s in db.sstables()]
        stats = db.table_stats("default")
        db.close()
    return answers, counters, (stats["gets"], stats["gets_absent"])


def _gets(db, python):
    keys = [b"k%03d" % i for i in range(400)]
    before = [db.get(k) for k in keys]
    merge_by_hand(db, [0, 2])  # older versions than file 1's now in a file read first
    answers = [db.get(k) for k in keys]
    assert answers == before
    return list(zip(keys, answers, strict=True))


def _get_many(db, python):
    merge_by_hand(db, [0, 2])
    db.put(b"k005", b"in the memtable")
    db.delete(b"k006")
    keys = [b"k%03d" % i for i in range(300)] + [b"k000", b"k003", b"", b"k2"]
    random.Random(5).shuffle(keys)
    assert db._default_state.fast.seq_overlap
    if python:
        answers = db.get_many(keys)
    else:  # the C getter serves the whole call itself, not key by key
        answers = db._default_state.getter.many(keys)
    assert answers == [db.get(k) for k in keys]
    return list(zip(keys, answers, strict=True))


@pytest.mark.parametrize("reads", [_gets, _get_many], ids=["get", "get_many"])
def test_the_c_getter_reads_overlapping_files_itself_and_counts_as_python_does(
        tmp_path, monkeypatch, reads):
    if not lsmdb.SPEEDUPS:
        pytest.skip("built without the C speedups")
    py = _counters_after(tmp_path / "py", monkeypatch, True, reads)
    c = _counters_after(tmp_path / "c", monkeypatch, False, reads)
    assert py == c
    got = dict(c[0])
    # the newest writes
    assert [got[b"k%03d" % i] for i in range(4)] == [b"v3.0", b"v0.1", b"v1.2", b"v2.3"]
    assert got[b"k250"] is None
    if reads is _get_many:
        assert got[b"k005"] == b"in the memtable" and got[b"k006"] is None
        assert got[b""] is None and got[b"k2"] is None
    db = lsmdb.open(tmp_path / "c", auto_compaction=False)
    assert db._default_state.fast.seq_overlap
    monkeypatch.setattr(lsmdb.readpath, "lookup", None)  # the C getter must not need it
    assert db.get(b"k003") == b"v2.3" and db.get(b"k002") == b"v1.2" and db.get(b"k999") is None
    assert db._default_state.getter.many([b"k003", b"k999"]) == [b"v2.3", None]
    db.close()


def test_get_many_over_overlapping_files_never_sees_half_a_batch(tmp_path, impl):
    """Batches rewrite ten keys while get_many asks for them with reads of the
    files in between (a read lets the GIL go): each call sees one batch whole."""
    db = lsmdb.open(tmp_path / "db", auto_compaction=False, block_cache_size_bytes=0)
    db.alter_table("default", bloom_filter_fp_chance=1.0)  # every file's block is read
    filler = [b"f%04d" % i for i in range(1500)]
    for _ in range(3):
        for k in filler:
            db.put(k, b"x" * 50)
        db.flush()
    merge_by_hand(db, [0, 2])
    assert db._default_state.fast.seq_overlap
    batch_keys = [b"b%02d" % i for i in range(10)]
    asked = [k for i, bk in enumerate(batch_keys) for k in [bk, *filler[i * 150:(i + 1) * 150]]]
    stop = threading.Event()

    def batches() -> None:
        version = 0
        while not stop.is_set():
            version += 1
            with db.batch() as b:
                for k in batch_keys:
                    b.put(k, b"%08d" % version)

    writer = threading.Thread(target=batches)
    writer.start()
    try:
        calls, deadline = 0, time.monotonic() + 2
        while calls < 20 and time.monotonic() < deadline:
            got = dict(zip(asked, db.get_many(asked), strict=True))
            seen = {got[k] for k in batch_keys}
            assert len(seen) == 1, f"get_many saw half a batch: {sorted(map(str, seen))}"
            calls += 1
    finally:
        stop.set()
        writer.join()
    db.close()


def test_size_tiered_merges_files_of_similar_size_whatever_their_age(tmp_path, impl):
    db = lsmdb.open(tmp_path / "db", auto_compaction=False)
    db.alter_table("default", min_threshold=4, min_sstable_size_bytes=0)
    model: dict[bytes, bytes] = {}

    def file_of(n: int, tag: bytes, start: int = 0) -> None:
        for i in range(start, start + n):
            key = b"k%04d" % i
            db.put(key, tag + b"%d" % i)
            model[key] = tag + b"%d" % i
        db.flush()

    file_of(400, b"big1.")        # old and big
    file_of(3, b"s1.")            # small
    file_of(400, b"big2.", 100)   # big again, newer versions of 100..499
    db.delete(b"k0000")           # small: a tombstone over big1's k0000
    del model[b"k0000"]
    file_of(2, b"s2.", 200)       # newer than big2 for 200, 201
    file_of(2, b"s3.", 450)
    file_of(2, b"s4.", 1)
    state = db._default_state
    assert len(state.files) == 6 and not state.fast.seq_overlap
    job = compaction.pick(state)
    assert job is not None and len(job.inputs) == 4 and not job.bottom  # big1 is older
    db._compactor.run_pending(lambda: False)
    assert len(state.files) == 3 and state.fast.seq_overlap
    assert sum(s.tombstones for s in db.sstables()) == 1  # kept: big1's k0000 lies below
    probe = [b"k%04d" % i for i in range(0, 520, 7)] + [b"k0000", b"k0001", b"k0200", b"k0450"]
    assert [db.get(k) for k in probe] == [model.get(k) for k in probe]
    assert db.get_many(probe) == [model.get(k) for k in probe]
    assert list(db.scan()) == sorted(model.items())
    db.compact()
    assert not state.fast.seq_overlap and sum(s.tombstones for s in db.sstables()) == 0
    assert list(db.scan()) == sorted(model.items())
    db.close()
