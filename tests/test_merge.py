"""The k-way merge of scans and compactions, in C and in Python, against a model."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lsmdb
import lsmdb.fastpath
import lsmdb.merge as merge_mod
import lsmdb.readpath
import lsmdb.table
from lsmdb.merge import merge_newest

source = st.dictionaries(st.binary(max_size=4), st.one_of(st.none(), st.binary(max_size=4)),
                         max_size=30)


@pytest.fixture(params=["python", "c"])
def use_c(request, monkeypatch):
    if request.param == "c" and merge_mod._CMerge is None:
        pytest.skip("built without the C speedups")
    monkeypatch.setattr(merge_mod, "USE_SPEEDUPS", request.param == "c")
    return request.param


def chunked(pairs: list[tuple[bytes, bytes | None]], cuts: list[int]) -> list:
    """``pairs`` as (keys, values) chunks cut at ``cuts`` (empty chunks included)."""
    out, start = [], 0
    for cut in sorted(c % (len(pairs) + 1) for c in cuts) + [len(pairs)]:
        part = pairs[start:cut]
        out.append(([k for k, _ in part], [v for _, v in part]))
        start = max(start, cut)
    return out


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # it picks a path
@given(sources=st.lists(source, max_size=6), cuts=st.lists(st.integers(0, 40), max_size=4),
       reverse=st.booleans(), keep=st.booleans())
def test_the_newest_version_of_each_key_wins(use_c, sources, cuts, reverse, keep):
    model: dict[bytes, bytes | None] = {}
    for src in reversed(sources):           # oldest first: newer ones overwrite
        model.update(src)
    want = [(k, model[k]) for k in sorted(model, reverse=reverse)
            if keep or model[k] is not None]
    chunks = [chunked(sorted(src.items(), reverse=reverse), cuts) for src in sources]
    assert list(merge_newest(chunks, reverse=reverse, keep_tombstones=keep)) == want


# Tagged sources: versions carry their sequence numbers, unique per key, in any
# order of the sources: what a merge of files that overlap in age meets.
tagged_source = st.dictionaries(st.binary(max_size=3),
                                st.tuples(st.integers(1, 60), st.one_of(st.none(),
                                                                        st.binary(max_size=3))),
                                max_size=20)


def one_version_per_write(sources: list[dict]) -> list[dict]:
    """``sources`` without a second version of a (key, seq): a sequence number is one write."""
    seen: set[tuple[bytes, int]] = set()
    clean = []
    for src in sources:
        kept = {k: (seq, v) for k, (seq, v) in src.items() if (k, seq) not in seen}
        seen.update((k, seq) for k, (seq, _v) in kept.items())
        clean.append(kept)
    return clean


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sources=st.lists(tagged_source, max_size=5), cuts=st.lists(st.integers(0, 30),
                                                                   max_size=3),
       reverse=st.booleans(), keep=st.booleans())
def test_of_tagged_chunks_the_highest_sequence_number_wins_whatever_the_source(
        use_c, sources, cuts, reverse, keep):
    clean = one_version_per_write(sources)
    newest: dict[bytes, tuple[int, bytes | None]] = {}
    for src in clean:
        for k, (seq, v) in src.items():
            if k not in newest or seq > newest[k][0]:
                newest[k] = (seq, v)
    want = [(k, newest[k][1], newest[k][0] << 8 | (0 if newest[k][1] is None else 1))
            for k in sorted(newest, reverse=reverse) if keep or newest[k][1] is not None]
    chunks = []
    for src in clean:
        rows = sorted(src.items(), reverse=reverse)
        parts = chunked([(k, v) for k, (_s, v) in rows], cuts)
        tags = iter([seq << 8 | (0 if v is None else 1) for _k, (seq, v) in rows])
        chunks.append([(ks, vs, [next(tags) for _ in ks]) for ks, vs in parts])
    assert list(merge_newest(chunks, reverse=reverse, keep_tombstones=keep)) == want


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sources=st.lists(tagged_source, max_size=5), cuts=st.lists(st.integers(0, 30),
                                                                   max_size=3),
       snapshots=st.sets(st.integers(0, 65), min_size=1, max_size=5), keep=st.booleans())
def test_a_merge_for_snapshots_keeps_the_version_each_one_reads(use_c, sources, cuts,
                                                                snapshots, keep):
    """With snapshots: the newest version of each key comes out as ever; of the
    older ones, exactly those some snapshot reads (the highest not above it,
    when that is not the newest) go to ``kept``, by depth, in key order."""
    clean = one_version_per_write(sources)
    every: dict[bytes, list[tuple[int, bytes | None]]] = {}
    for src in clean:
        for k, (seq, v) in src.items():
            every.setdefault(k, []).append((seq, v))

    def tag(seq: int, v: bytes | None) -> int:
        return seq << 8 | (0 if v is None else 1)

    want_main, want_kept = [], []
    for k in sorted(every):
        versions = sorted(every[k], reverse=True)
        seq, v = versions[0]
        if keep or v is not None:
            want_main.append((k, v, tag(seq, v)))
        reads = {max(x for x in versions if x[0] <= s) for s in snapshots
                 if any(x[0] <= s for x in versions)}
        extra = sorted(reads - {versions[0]}, reverse=True)
        want_kept += [(d, k, v2, tag(s2, v2)) for d, (s2, v2) in enumerate(extra)]
    chunks = []
    for src in clean:
        rows = sorted(src.items())
        parts = chunked([(k, v) for k, (_s, v) in rows], cuts)
        tags = iter([tag(seq, v) for _k, (seq, v) in rows])
        chunks.append([(ks, vs, [next(tags) for _ in ks]) for ks, vs in parts])
    got_kept: list = []
    got = list(merge_newest(chunks, keep_tombstones=keep,
                            snapshots=sorted(snapshots, reverse=True), kept=got_kept))
    assert got == want_main
    assert got_kept == want_kept


@pytest.mark.skipif(merge_mod._CMerge is None, reason="built without a C compiler")
def test_the_c_merge_for_snapshots_refuses_an_unsorted_list():
    with pytest.raises(ValueError, match="descending"):
        merge_mod._CMerge([], snapshots=[3, 5], kept=[])
    with pytest.raises(TypeError, match="together"):
        merge_mod._CMerge([], snapshots=[3])


def test_an_older_source_with_the_newer_version_wins(use_c):
    newer_file = [([b"a", b"b"], [b"a@5", b"b@2"], [5 << 8 | 1, 2 << 8 | 1])]
    older_file = [([b"a", b"b"], [b"a@3", None], [3 << 8 | 1, 4 << 8 | 0])]
    assert list(merge_newest([newer_file, older_file], keep_tombstones=True)) == [
        (b"a", b"a@5", 5 << 8 | 1), (b"b", None, 4 << 8 | 0)]
    assert list(merge_newest([newer_file, older_file])) == [(b"a", b"a@5", 5 << 8 | 1)]


@pytest.mark.parametrize("seekable", [False, True])
def test_untag_gives_pairs_of_a_merge_by_sequence_number(use_c, seekable):
    newer_file = [([b"a", b"b"], [b"a@5", b"b@2"], [5 << 8 | 1, 2 << 8 | 1])]
    older_file = [([b"a", b"b"], [b"a@3", b"b@4"], [3 << 8 | 1, 4 << 8 | 1])]
    reseek = (lambda key: [[c for c in newer_file], [c for c in older_file]]) if seekable \
        else None
    merged = merge_newest([newer_file, older_file], untag=True, reseek=reseek)
    assert list(merged) == [(b"a", b"a@5"), (b"b", b"b@4")]
    assert list(merge_newest([older_file], untag=True)) == [(b"a", b"a@3"), (b"b", b"b@4")]


def test_a_source_is_read_lazily_one_chunk_at_a_time(use_c):
    taken = []

    def source(tag: bytes):
        for i in range(1000):
            taken.append((tag, i))
            yield [tag + b"%04d" % i], [b"v"]

    merged = merge_newest([source(b"a"), source(b"b")])
    first = [next(merged) for _ in range(3)]
    assert [k for k, _ in first] == [b"a0000", b"a0001", b"a0002"]
    assert len(taken) < 10


def test_chunks_of_unequal_length_are_refused(use_c):
    with pytest.raises((ValueError, TypeError)):
        list(merge_newest([[([b"a", b"b"], [b"1"])], [([b"c"], [b"2"])]]))


class Pin:
    """A stand-in for a scan's Version: counts its releases."""

    def __init__(self, fail: bool = False) -> None:
        self.released = 0
        self.fail = fail

    def release(self) -> None:
        self.released += 1
        if self.fail:
            raise RuntimeError("release failed")


def two_sources():
    return [[([b"a", b"c"], [b"1", b"3"])], [([b"b"], [b"2"])]]


def test_a_pin_is_released_once_when_the_merge_is_exhausted(use_c):
    pin = Pin()
    merged = merge_newest(two_sources(), pin=pin)
    assert next(merged) == (b"a", b"1") and pin.released == 0
    assert list(merged) == [(b"b", b"2"), (b"c", b"3")]
    assert pin.released == 1
    assert list(merged) == [] and pin.released == 1
    merged.close()
    assert pin.released == 1


@pytest.mark.parametrize("started", [False, True])
def test_a_pin_is_released_once_when_the_merge_is_closed_or_freed(use_c, started):
    pin = Pin()
    merged = merge_newest(two_sources(), pin=pin)
    if started:
        next(merged)
    merged.close()
    assert pin.released == 1 and list(merged) == []
    merged.close()
    assert pin.released == 1
    pin = Pin()
    merged = merge_newest(two_sources(), pin=pin)
    if started:
        next(merged)
    del merged
    assert pin.released == 1


def test_a_pin_is_released_when_a_source_fails_and_the_error_is_raised(use_c):
    def broken():
        yield [b"a"], [b"1"]
        raise OSError("disk gone")

    pin = Pin()
    merged = merge_newest([broken()], pin=pin)
    assert next(merged) == (b"a", b"1")
    with pytest.raises(OSError, match="disk gone"):
        next(merged)
    assert pin.released == 1 and list(merged) == []


def test_an_error_from_release_at_the_end_is_raised(use_c):
    merged = merge_newest(two_sources(), pin=Pin(fail=True))
    with pytest.raises(RuntimeError, match="release failed"):
        list(merged)


def test_a_merge_refuses_a_next_or_close_while_it_runs(use_c):
    merged = None

    def reentrant(action):
        yield [b"a"], [b"1"]
        action(merged)
        yield [b"b"], [b"2"]

    for action in (next, lambda m: m.close()):
        pin = Pin()
        merged = merge_newest([reentrant(action), iter([([b"c"], [b"3"])])], pin=pin)
        assert next(merged) == (b"a", b"1")
        with pytest.raises(ValueError, match="already executing"):
            next(merged)
        assert pin.released == 1 and list(merged) == []


def test_a_merge_in_a_reference_cycle_is_collected_and_releases_its_pin(use_c):
    import gc
    released = []

    class CyclicPin:
        def release(self) -> None:
            released.append(1)

    for started in (False, True):
        pin = CyclicPin()
        merged = merge_newest(two_sources(), pin=pin)
        if started:
            next(merged)
        pin.merged = merged  # type: ignore[attr-defined]  # merge -> pin -> merge
        del merged, pin
        gc.collect()
    assert released == [1, 1]


@pytest.mark.skipif(merge_mod._CMerge is None, reason="built without a C compiler")
def test_a_release_that_raises_as_a_c_merge_is_freed_is_reported_not_a_crash():
    """Run where a double free shows (-X dev: debug allocator hooks)."""
    import subprocess
    import sys
    script = ("from lsmdb._speedups import Merge\n"
              "class Pin:\n"
              "    def release(self):\n"
              "        raise KeyboardInterrupt('release failed')\n"
              "for started in (False, True):\n"
              "    m = Merge([iter([([b'a', b'b'], [b'1', b'2'])])], pin=Pin())\n"
              "    if started:\n"
              "        next(m)\n"
              "    del m\n"
              "print('survived')\n")
    done = subprocess.run([sys.executable, "-X", "dev", "-c", script], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "survived"
    assert done.stderr.count("release failed") == 2


def test_c_and_python_agree_on_a_database_scan(tmp_path, monkeypatch, small):
    if merge_mod._CMerge is None:
        pytest.skip("built without the C speedups")
    with lsmdb.open(str(tmp_path / "db"), auto_compaction=False) as db:
        db.alter_table("default", **small)
        for i in range(2000):
            db.put(b"k%05d" % (i * 7919 % 2000), b"v%d" % i)
            if i % 3 == 0:
                db.delete(b"k%05d" % (i * 31 % 2000))
        scans = {}
        for c in (True, False):
            monkeypatch.setattr(merge_mod, "USE_SPEEDUPS", c)
            scans[c] = (list(db.scan()), list(db.scan(reverse=True)),
                        list(db.scan(b"k00500", b"k01500")))
        assert scans[True] == scans[False] and len(scans[True][0]) > 100


try:
    from lsmdb import _speedups as speedups
except ImportError:  # pragma: no cover - built without a C compiler
    speedups = None  # type: ignore[assignment]
needs_c = pytest.mark.skipif(speedups is None, reason="built without a C compiler")


# ------------------------------------------------------------------- merge
def chunked_by(entries: dict[bytes, bytes | None], reverse: bool, size: int) -> list[tuple]:
    keys = sorted(entries, reverse=reverse)
    return [(keys[i:i + size], [entries[k] for k in keys[i:i + size]])
            for i in range(0, len(keys), size)]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.dictionaries(st.binary(max_size=3), st.one_of(st.none(), st.binary(max_size=3)),
                                max_size=30), max_size=6),
       st.booleans(), st.booleans(), st.integers(1, 7))
@needs_c
def test_c_merge_matches_the_python_merge(sources, reverse, keep, size):
    import lsmdb.merge
    chunks = [chunked_by(src, reverse, size) for src in sources]
    want = list(lsmdb.merge._merge(
        __import__("heapq").merge(*[lsmdb.merge._tagged(c, lsmdb.merge.tag_for(age, reverse),
                                                        reverse)
                                   for age, c in enumerate(chunks)], reverse=reverse), keep))
    got = list(speedups.Merge([iter(c) for c in chunks], reverse, keep))
    assert got == want
    # and what that is: the newest version of every key, in order
    newest: dict[bytes, bytes | None] = {}
    for src in reversed(sources):
        newest.update(src)
    expect = [(k, v) for k, v in sorted(newest.items(), reverse=reverse) if keep or v is not None]
    assert got == expect


@needs_c
def test_c_merge_errors_end_the_iteration():
    def broken():
        yield [b"a"], [b"1"]
        raise OSError("disk gone")

    m = speedups.Merge([broken(), iter([([b"b", b"c"], [b"2", b"3"])])])
    assert next(m) == (b"a", b"1")
    with pytest.raises(OSError):
        next(m)
    assert list(m) == []  # finished, never a partial answer after the error
    with pytest.raises(TypeError):
        list(speedups.Merge([iter([(["a"], [b"1"])])]))          # str key
    with pytest.raises(TypeError):
        list(speedups.Merge([iter([([b"a"], [b"1", b"2"])])]))   # lengths differ
    with pytest.raises(TypeError):
        list(speedups.Merge([iter([[b"a"]])]))                   # not a (keys, values) pair
    assert list(speedups.Merge([])) == []
    assert list(speedups.Merge([iter([([], [])]), iter([([b"x"], [None])])], False, True)) \
        == [(b"x", None)]

