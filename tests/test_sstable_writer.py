"""SSTableBuilder's bulk paths against adding one entry at a time.

``add_chunk`` (flushes and compactions) and ``add_many`` cut blocks with
cumulative sizes and a bisect per block; they must write byte for byte the
file ``add`` writes for the same entries, however the entries are split into
chunks, and stop at the same block boundary when a file size limit is given.
"""

from __future__ import annotations

import io
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lsmdb import block as blk
from lsmdb import compression
from lsmdb import sstable_writer as sw
from lsmdb.filters.hashing import FAST_HASHER, keyed_hasher
from lsmdb.memtable import Memtable
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


# -- the C twins (csrc/sstable_writer.c's block_cuts, csrc/block.c's data_payload) --

def tagged_strategy():
    """Sorted entries with their tags: values bytes, None or expiring (bytes, expires)."""
    value = st.one_of(st.none(), st.binary(max_size=300),
                      st.tuples(st.binary(max_size=40), st.integers(1, 2**63 - 1)))
    return st.dictionaries(st.binary(min_size=1, max_size=300), value, max_size=200).map(
        lambda d: sorted(d.items())).flatmap(lambda items: st.tuples(
            st.just(items), st.lists(st.integers(0, 2**56 - 1), min_size=len(items),
                                     max_size=len(items))))


def _tags(entries, seqs):
    kinds = [0 if v is None else 2 if type(v) is tuple else 1 for _k, v in entries]
    return [s << 8 | k for s, k in zip(seqs, kinds, strict=True)]


needs_c = pytest.mark.skipif(sw._c_block_cuts is None, reason="built without a C compiler")


@needs_c
@settings(max_examples=150, deadline=None)
@given(tagged_strategy(), st.integers(-50, 5000), st.integers(1, 5000), st.data())
def test_c_block_cuts_and_payloads_are_the_python_ones(tagged, need, block_size, data):
    entries, seqs = tagged
    keys, values = [k for k, _ in entries], [v for _, v in entries]
    tags = _tags(entries, seqs)
    assert sw._c_block_cuts(keys, values, need, block_size) == \
        sw.block_cuts(keys, values, need, block_size)
    lo = data.draw(st.integers(0, len(keys)))
    hi = data.draw(st.integers(lo, len(keys)))
    assert sw._c_data_payload(keys, values, tags, lo, hi) == \
        blk.encode_data_payload(keys[lo:hi], values[lo:hi], tags[lo:hi])


@needs_c
def test_c_block_cuts_refuse_what_the_python_ones_refuse():
    for keys, values, exc in [([b"b", b"a"], [b"1", b"2"], ValueError),
                              ([b"a", b"a"], [b"1", b"2"], ValueError),
                              ([b"a"], [], ValueError)]:
        with pytest.raises(exc):
            sw._c_block_cuts(keys, values, 10, 10)
        with pytest.raises(exc):
            sw.block_cuts(keys, values, 10, 10)
    with pytest.raises(TypeError):  # (the builder's callers hand it bytes alone)
        sw._c_block_cuts(["a"], [b"1"], 10, 10)
    with pytest.raises(TypeError):
        sw._c_data_payload([b"a"], ["1"], [257], 0, 1)
    with pytest.raises(ValueError):
        sw._c_data_payload([b"a"], [b"1"], [257], 0, 2)


@needs_c
@settings(max_examples=60, deadline=None)
@given(tagged_strategy(), st.integers(16, 2000), st.lists(st.integers(0, 250), max_size=5),
       st.one_of(st.none(), st.integers(1, 20000)), st.sampled_from(["none", "lz4"]))
def test_builders_in_c_and_in_python_write_the_same_file(tagged, block_size, cuts, limit,
                                                          compression):
    """Chunks of entries (expiring ones too) through add_chunk, with the C
    cuts and payloads and with the Python ones: the same bytes, the same
    count added under a file size limit."""
    entries, seqs = tagged
    if not entries:
        return
    tags = _tags(entries, seqs)
    bounds = sorted({0, len(entries), *[c % (len(entries) + 1) for c in cuts]})
    files = []
    for use_c in (True, False):
        sw.USE_SPEEDUPS = use_c
        try:
            out = io.BytesIO()
            b = SSTableBuilder(out, fp_chance=0.01, block_size=block_size,
                               compression=compression)
            added = []
            for lo, hi in zip(bounds, bounds[1:], strict=False):
                added.append(b.add_chunk([k for k, _ in entries[lo:hi]],
                                         [v for _, v in entries[lo:hi]], limit, tags[lo:hi]))
                if added[-1] < hi - lo:
                    break
            b.finish()
            files.append((out.getvalue(), added, b.entries, b.expiring, b.tombstones))
        finally:
            sw.USE_SPEEDUPS = sw._c_block_cuts is not None
    assert files[0] == files[1]


# -- a frozen memtable written whole (memtable_section, write_memtable) --

def _memtable(entries, seqs, shuffle):
    """A frozen memtable holding ``entries`` with these sequence numbers,
    written in the order ``shuffle`` gives (dict order differs from key order)."""
    mem = Memtable()
    order = list(range(len(entries)))
    shuffle.shuffle(order)
    for i in order:
        key, value = entries[i]
        mem.apply(max(seqs[i], 1), key, value)
    mem.freeze()
    return mem


def _write_both(tmp_path, mem, how, **kw):
    path = str(tmp_path / f"{how}-{len(os.listdir(tmp_path))}.sst")
    if how == "chunks":
        sw.write_sstable(path, (), chunks=mem.flush_chunks(), **kw)
    else:
        sw.USE_SPEEDUPS = how == "c"
        try:
            sw.write_memtable(path, mem.data, mem.tags, **kw)
        finally:
            sw.USE_SPEEDUPS = sw._c_block_cuts is not None
    with open(path, "rb") as f:
        return f.read()


@settings(max_examples=60, deadline=None)
@given(tagged_strategy(), st.sampled_from([16, 300, 4096]), st.sampled_from(["none", "lz4",
                                                                              "zstd"]),
       st.sampled_from([0.01, 1.0]), st.booleans(), st.randoms(use_true_random=False))
def test_write_memtable_writes_the_file_its_chunks_make(tmp_path_factory, tagged, block_size,
                                                        compression, fp, keyed, shuffle):
    """A memtable written whole -- sorted, cut, encoded and compressed by
    memtable_section, in C and in Python -- is byte for byte the file its
    sorted chunks make through add_chunk, with a keyed hasher too."""
    entries, seqs = tagged
    if not entries:
        return
    tmp_path = tmp_path_factory.mktemp("mem")
    mem = _memtable(entries, seqs, shuffle)
    kw = dict(fp_chance=fp, block_size=block_size, table="t", min_seq=mem.min_seq,
              max_seq=mem.max_seq, hasher=keyed_hasher(b"k" * 16) if keyed else FAST_HASHER,
              compression=compression, file_number=9, db_id="d")
    ref = _write_both(tmp_path, mem, "chunks", **kw)
    assert _write_both(tmp_path, mem, "python", **kw) == ref
    if sw._c_memtable_section is not None:
        assert _write_both(tmp_path, mem, "c", **kw) == ref


def _section(make, data, tags, block_size, kind, compress, want):
    """make(...)'s return and the bytes it handed its sink, joined."""
    parts: list[bytes] = []
    got = make(data, tags, block_size, kind, compress, want, parts.append)
    return got, b"".join(parts)


@needs_c
def test_c_memtable_section_is_the_python_one_and_refuses_what_it_cannot_write():
    data = {b"b": b"2" * 300, b"a": None, b"c": (b"x", 7)}
    tags = {b"b": 5 << 8 | 1, b"a": 6 << 8, b"c": 7 << 8 | 2}
    for kind, compress in [(0, None), (1, compression.compressor(1)),
                           (2, compression.compressor(2))]:
        for want in (True, False):
            assert _section(sw._c_memtable_section, data, tags, 64, kind, compress, want) == \
                _section(sw.memtable_section, data, tags, 64, kind, compress, want)
    # the tags dict in another order than the values'
    assert _section(sw._c_memtable_section, data, dict(reversed(tags.items())), 64, 0, None,
                    True) == _section(sw.memtable_section, data, tags, 64, 0, None, True)
    c = sw._c_memtable_section

    def sink(piece: bytes) -> None:
        pass

    with pytest.raises(ValueError):
        c({}, {}, 64, 0, None, True, sink)
    with pytest.raises(ValueError):
        c(data, {b"a": 1}, 64, 0, None, True, sink)
    with pytest.raises(KeyError):
        c({b"a": None}, {b"z": 0}, 64, 0, None, True, sink)
    for bad_data, bad_tags in [({"a": b"1"}, {"a": 257}), ({b"a": "1"}, {b"a": 257}),
                               ({b"a": (None, 5)}, {b"a": 2}), ({b"a": (b"x",)}, {b"a": 2}),
                               ({b"a": b"1"}, {b"a": "257"})]:
        with pytest.raises(TypeError):
            c(bad_data, bad_tags, 64, 0, None, True, sink)
    with pytest.raises(TypeError):
        c({b"a": b"1"}, {b"a": 257}, 64, 2, lambda p: "no", True, sink)
    with pytest.raises(ZeroDivisionError):
        c({b"a": b"1"}, {b"a": 257}, 64, 2, lambda p: 1 // 0, True, sink)
    with pytest.raises(ZeroDivisionError):
        c({b"a": b"1"}, {b"a": 257}, 64, 0, None, True, lambda p: 1 // 0)

    class Truthy:
        def __bool__(self) -> bool:
            return True

    with pytest.raises(TypeError):  # (not a SystemError: each argument checked at once)
        c({b"a": b"1"}, {b"a": 257}, "x", 0, None, Truthy(), sink)


@needs_c
def test_c_memtable_section_holds_what_it_reads_while_python_code_runs():
    """The tag lookup can run Python code (a key's __eq__ where the two dicts'
    orders differ); what it does to the memtable's dicts must not free what the
    section is being written from."""

    class Key(bytes):
        def __eq__(self, other: object) -> bool:
            data[b"k1"] = b"replaced"  # drops the value gathered for k1
            return bytes.__eq__(self, other)

        __hash__ = bytes.__hash__

    big = b"v" * 100_000
    data = {b"k1": big, b"k2": b"w"}
    del big
    tags = {Key(b"k2"): 257, b"k1": 257}  # another order: k2's tag is looked up
    got, written = _section(sw._c_memtable_section, data, tags, 64, 0, None, True)
    # k1's value as gathered, before the lookup replaced it: held, not freed
    assert len(written) == got[0] and written.count(b"v" * 100_000) == 1
    assert data[b"k1"] == b"replaced"


@needs_c
def test_c_memtable_section_sorts_keys_that_share_long_prefixes():
    """The C sort decides most comparisons on a key's first 16 bytes as two
    words: keys that agree in the first 8 or all 16 bytes, that are prefixes
    of each other, that end in zero bytes or hold 0xff, come out in the order
    the Python twin's sorted() gives."""
    rng = random.Random(11)
    keys = {b"user:%010d" % rng.randrange(10**10) for _ in range(3000)}
    for prefix in (b"", b"p" * 7, b"p" * 8, b"p" * 9, b"q" * 15, b"q" * 16, b"q" * 17,
                   b"r" * 24):
        for _ in range(300):
            keys.add(prefix + bytes(rng.choice(b"\x00\x01\x7f\x80\xff")
                                    for _ in range(rng.randrange(4))))
    keys |= {b"", b"\x00", b"\x00" * 16, b"\x00" * 17, b"\xff" * 16, b"\xff" * 17}
    order = list(keys)
    rng.shuffle(order)
    data = {k: b"v%d" % i for i, k in enumerate(order)}
    tags = {k: (i + 1) << 8 | 1 for i, k in enumerate(order)}
    got, written = _section(sw._c_memtable_section, data, tags, 256, 0, None, True)
    assert (got, written) == _section(sw.memtable_section, data, tags, 256, 0, None, True)


@needs_c
def test_c_memtable_sections_made_at_once_on_threads_are_each_their_own():
    """The C section keeps its scratch buffers from one call to the next:
    calls on four threads at once (each letting the GIL go while it sorts and
    encodes), of sizes that take the kept buffers and outgrow them, each write
    what the same call writes alone."""
    import threading

    rng = random.Random(5)
    memtables = []
    for t in range(4):
        n = [50, 3000, 400, 12000][t]
        data = {rng.randbytes(rng.randrange(1, 30)): rng.randbytes(rng.randrange(200))
                for _ in range(n)}
        memtables.append((data, {k: (i + 1) << 8 | 1 for i, k in enumerate(data)}))
    kinds = [(0, None), (1, compression.compressor(1))]
    alone = [[_section(sw._c_memtable_section, d, t, 512, kind, comp, True)
              for kind, comp in kinds] for d, t in memtables]
    got: dict[int, list] = {}
    start = threading.Barrier(4)

    def run(i: int) -> None:
        start.wait()
        d, t = memtables[i]
        got[i] = [[_section(sw._c_memtable_section, d, t, 512, kind, comp, True)
                   for kind, comp in kinds] for _ in range(5)]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for i in range(4):
        assert got[i] == [alone[i]] * 5


def test_add_section_takes_an_empty_format_2_builder_and_a_hash_per_entry():
    out = io.BytesIO()
    b = SSTableBuilder(out, fp_chance=0.01, block_size=64)
    section = sw.memtable_section({b"a": b"1"}, {b"a": 257}, 64, 0, None, True, out.write)
    with pytest.raises(ValueError):
        b.add_section(section, 1, None)
    b.add_section(section, 1, section[4])
    assert (b.entries, b.min_key, b.max_key) == (1, b"a", b"a")
    assert b.finish()["entries"] == 1
    b = SSTableBuilder(io.BytesIO(), fp_chance=0.01, block_size=64)
    b.add(b"0", b"x")
    with pytest.raises(ValueError):
        b.add_section(section, 1, section[4])


@needs_c
def test_c_memtable_section_compresses_lz4_as_the_lz4_package_does():
    """Where the C path compresses LZ4 blocks itself (the lz4 package's own
    library, without the GIL), each block is the bytes lz4.block.compress
    makes: compressible, incompressible and tiny payloads, blocks up to 64 KiB,
    sections of several runs (a run is about 4 MiB of payloads)."""
    import random

    rng = random.Random(3)
    words = [b"alpha", b"beta", b"gamma", b"delta", b"\x00\x01", b"city", b"name"]
    for block_size, entries in ((16, 400), (512, 400), (4096, 400), (65536, 400),
                                (4096, 40_000)):
        data = {}
        for i in range(entries):
            key = b"k%06d" % rng.randrange(10**6)
            data[key] = (rng.randbytes(rng.randrange(0, 300)) if i % 3 == 0 else
                         b" ".join(rng.choice(words) for _ in range(rng.randrange(0, 80))))
        tags = dict.fromkeys(data, 5 << 8 | 1)
        got = _section(sw._c_memtable_section, data, tags, block_size, 1,
                       compression.compressor(1), True)
        assert got == _section(sw.memtable_section, data, tags, block_size, 1,
                               compression.compressor(1), True), block_size
