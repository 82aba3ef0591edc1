"""SSTableReader.lookup: a false positive costs a read and a checksum, not a decode.

A key sits in a data block as its bytes verbatim (a msgpack bin), so a
checksum-verified payload that does not contain those bytes cannot hold the
key.  That shortcut must never say "not here" for a key that is there, must
still count the disk read, must not cache what it did not decode, and must
not skip the checksum.

And the reader's keys in the block cache: a range of its own, one key per
block, however many blocks the file has.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import closing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lsmdb import cache as cache_module
from lsmdb.cache import BlockCache, PyBlockCache
from lsmdb.errors import CorruptionError
from lsmdb.sstable_format import MISSING
from lsmdb.sstable_reader import SSTableReader
from lsmdb.sstable_writer import write_sstable


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.binary(min_size=0, max_size=8),
                       st.one_of(st.none(), st.binary(max_size=30)), min_size=1, max_size=80),
       st.lists(st.binary(max_size=8), max_size=40), st.integers(32, 400))
def test_never_misses_a_key_the_block_holds(tmp_path_factory, entries, probes, block_size):
    path = str(tmp_path_factory.mktemp("r") / "t.sst")
    write_sstable(path, sorted(entries.items()), fp_chance=0.01, block_size=block_size)
    r = SSTableReader(path, 1)
    try:
        for key in list(entries) + probes:
            i = r.block_for(key)
            want = entries.get(key, MISSING)
            assert r.lookup(key) == want and r.find(key) == want
            if i < len(r.index_keys):
                assert r.lookup(key, i) == want
        present = sum(1 for key in list(entries) + probes if key in entries)
        assert r.true_positives == 2 * present  # find counts no filter answer
    finally:
        r.close()


def test_false_positive_reads_and_counts_but_does_not_decode_or_cache(tmp_path):
    path = str(tmp_path / "t.sst")
    write_sstable(path, [(b"k%04d" % i, b"v" * 50) for i in range(0, 400, 2)], fp_chance=0.01,
                  block_size=1024)
    r = SSTableReader(path, 7)
    r.attach_cache(BlockCache(1 << 20))
    decode = r._decode
    try:
        absent = b"k0101"
        r._decode = lambda *args: pytest.fail("a false positive was decoded")  # type: ignore
        assert r.lookup(absent) is MISSING
        assert (r.block_reads, r.false_positives, len(r.cache)) == (1, 1, 0)
        r._decode = decode  # type: ignore[method-assign]
        present = b"k0100"
        assert r.lookup(present) == b"v" * 50
        assert (r.block_reads, r.true_positives, len(r.cache)) == (2, 1, 1)
        assert r.lookup(present) == b"v" * 50  # now a cache hit
        assert (r.block_reads, r.block_cache_hits, r.true_positives) == (2, 1, 2)
    finally:
        r.close()


def test_lookup_many_reads_each_block_once_and_counts_as_a_loop_of_lookup(tmp_path):
    """get_many's step: keys grouped by block; a cached block counts a hit per
    key, a block read from disk for several keys one read, cached as a get's
    block if it held one of them, as a false positive's (its second read) if
    it held none; a key past the last block is a false positive, no read."""
    path = str(tmp_path / "t.sst")
    write_sstable(path, [(b"k%04d" % i, b"v%d" % i) for i in range(0, 400, 2)], fp_chance=0.01,
                  block_size=1024)
    with closing(SSTableReader(path, 7)) as r:
        r.attach_cache(BlockCache(1 << 20))
        block0 = r.index_keys[0]
        two, one = b"k0000", b"k0002"
        assert r.block_for(two) == r.block_for(one) == r.block_for(b"k0001") == 0
        got = r.lookup_many([two, b"k0001", one, b"zzz"])
        assert got == [b"v0", MISSING, b"v2", MISSING]
        assert (r.block_reads, r.true_positives, r.false_positives, len(r.cache)) == (1, 2, 2, 1)
        assert r.lookup_many([two, one, b"k0001"]) == [b"v0", b"v2", MISSING]
        assert (r.block_reads, r.block_cache_hits) == (1, 3)
        last = len(r.index_keys) - 1
        absent = [k for k in (b"k%04d" % i for i in range(1, 400, 2))
                  if r.block_for(k) == last][:3]
        assert len(absent) == 3 and block0 < absent[0]
        assert r.lookup_many(absent) == [MISSING] * 3
        assert (r.block_reads, len(r.cache)) == (2, 1)  # a false positives' block: not yet
        assert r.lookup_many(absent) == [MISSING] * 3
        assert (r.block_reads, len(r.cache)) == (3, 2)  # its second read: cached
        assert r.false_positives == 2 + 1 + 6


def test_the_checksum_is_checked_before_the_shortcut(tmp_path):
    path = str(tmp_path / "t.sst")
    write_sstable(path, [(b"k%04d" % i, b"v" * 50) for i in range(100)], fp_chance=0.01,
                  block_size=512)
    r = SSTableReader(path, 1)
    offset = r.index_offsets[0]
    r.close()
    with open(path, "r+b") as f:  # flip a byte inside the first data block's payload
        f.seek(offset + 20)
        b = f.read(1)
        f.seek(offset + 20)
        f.write(bytes([b[0] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())
    r = SSTableReader(path, 1)
    try:
        with pytest.raises(CorruptionError) as e:
            r.lookup(b"absent-key", 0)
        assert e.value.path == path
    finally:
        r.close()


# ------------------------------------------------------------ read-ahead
def _table(tmp_path, n=3000, block_size=256):
    path = str(tmp_path / "ra.sst")
    entries = [(b"k%06d" % i, b"v%d" % i * 5) for i in range(n)]
    write_sstable(path, entries, fp_chance=0.01, block_size=block_size)
    return path, entries


def _corrupt(path, block):
    """Flip a bit of data block ``block``'s last payload byte (a value's: the
    block still decodes, only its checksum can tell); its offset."""
    with closing(SSTableReader(path, 1)) as r:
        offset, size = r.index_offsets[block], r.index_sizes[block]
    with open(path, "r+b") as f:
        f.seek(offset + size - 1)
        byte = f.read(1)
        f.seek(offset + size - 1)
        f.write(bytes([byte[0] ^ 0x20]))
    return offset


def _counting_preads(r, monkeypatch):
    sizes = []
    real = r._pread

    def pread(size, offset):
        sizes.append(size)
        return real(size, offset)
    monkeypatch.setattr(r, "_pread", pread)
    return sizes


def _walk(r, start=None, reverse=False):
    return [kv for keys, values in r.chunks(start, None, reverse)
            for kv in zip(keys, values, strict=True)]


@pytest.mark.parametrize("reverse", [False, True])
def test_chunks_read_ahead_in_doubling_runs(tmp_path, monkeypatch, reverse):
    """A whole-file walk reads every block once, counted once each, in runs of
    1, 2, 4, ... blocks up to READAHEAD_BLOCKS: far fewer reads than blocks."""
    from lsmdb.sstable_reader import READAHEAD_BLOCKS
    path, entries = _table(tmp_path)
    with closing(SSTableReader(path, 1)) as r:
        nblocks = len(r.index_keys)
        assert nblocks > 3 * READAHEAD_BLOCKS
        preads = _counting_preads(r, monkeypatch)
        assert _walk(r, reverse=reverse) == (entries[::-1] if reverse else entries)
        assert r.block_reads == nblocks
        full = -(-(nblocks - (READAHEAD_BLOCKS * 2 - 1)) // READAHEAD_BLOCKS)
        assert len(preads) == READAHEAD_BLOCKS.bit_length() + full
        assert max(preads) <= READAHEAD_BLOCKS * 4096


def test_a_short_walk_reads_at_most_twice_what_it_uses(tmp_path):
    path, _entries = _table(tmp_path)
    with closing(SSTableReader(path, 1)) as r:
        used = 0
        for used, (keys, _values) in enumerate(r.chunks(b"k001000", None), 1):
            assert keys[0] >= b"k001000"
            if used == 5:
                break
        assert r.block_reads <= 2 * used


def test_cached_blocks_inside_a_run_are_used_and_counted_as_hits(tmp_path):
    path, entries = _table(tmp_path, n=600)
    with closing(SSTableReader(path, 1)) as r:
        r.attach_cache(BlockCache(1 << 20))
        for i in (1, 2, 5, 9):
            r.block_entries(i)  # read (counted) and cached
        before = r.block_reads
        assert _walk(r) == entries
        assert r.block_cache_hits == 4
        # every other block read once; a cached one may have been read ahead with its run
        assert len(r.index_keys) - 4 <= r.block_reads - before <= len(r.index_keys)


@pytest.mark.parametrize("victim", [0, 3, 40, -1])
def test_corruption_inside_a_run_names_the_file_and_the_block(tmp_path, victim):
    path, _entries = _table(tmp_path)
    offset = _corrupt(path, victim)
    with closing(SSTableReader(path, 1)) as r:
        for reverse in (False, True):
            with pytest.raises(CorruptionError, match="checksum") as info:
                _walk(r, reverse=reverse)
            assert path in str(info.value) and str(offset) in str(info.value)


def test_a_block_read_ahead_but_not_used_fails_nothing(tmp_path):
    """Block 2 is corrupt: a walk that stops after blocks 0 and 1 (it read 1 and 2
    together) succeeds; a walk through block 2 raises, naming it."""
    path, _entries = _table(tmp_path)
    offset = _corrupt(path, 2)
    with closing(SSTableReader(path, 1)) as r:
        walk = r.chunks(None, None)
        next(walk), next(walk)
        assert r.block_reads == 3  # block 2 was read with block 1
        walk.close()
        with pytest.raises(CorruptionError, match="checksum") as info:
            _walk(r)
        assert path in str(info.value) and str(offset) in str(info.value)


def test_a_file_cut_short_inside_a_run_is_a_corruption_error(tmp_path, monkeypatch):
    path, entries = _table(tmp_path)
    with closing(SSTableReader(path, 1)) as r:
        cut = r.index_offsets[5] + 7
        real = r._pread

        def short_pread(size, offset):  # as if the file ended inside block 5
            return real(max(0, min(size, cut - offset)), offset)
        monkeypatch.setattr(r, "_pread", short_pread)
        got = []
        with pytest.raises(CorruptionError, match="truncated") as info:
            for keys, _values in r.chunks(None, None):
                got.extend(keys)
        assert str(r.index_offsets[5]) in str(info.value)
        assert got == [k for k, _ in entries][:len(got)] and len(got) > 0


class _EveryEntry(Sequence):
    """An index part of ``n`` entries that are all ``item``: a file that
    claims more blocks than a test can write, each its one real block."""

    def __init__(self, item: Any, n: int) -> None:
        self._item, self._n = item, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        if not isinstance(i, int) or not 0 <= i < self._n:
            raise IndexError(i)
        return self._item


CACHES = [PyBlockCache] + ([cache_module.CBlockCache] if hasattr(cache_module, "CBlockCache")
                           else [])


@pytest.mark.parametrize("make", CACHES, ids=lambda c: c.__name__)
def test_files_of_more_than_2_24_blocks_never_share_a_block_cache_key(tmp_path, make):
    """Two files of 2**24 + 3 blocks each in one cache (read from memory,
    their index patched so that every entry names the file's one real
    block): a block of one, on either side of block 2**24, is never served
    for a block of the other, and each keeps its range.  (Keys of the form
    (file number << 24) | block would cache file 2's block 2**24 under the
    key of file 3's block 0.)"""
    blocks = 2**24 + 3
    cache = make(1 << 20)
    readers = []
    for number, tag in ((2, b"a"), (3, b"b")):
        path = tmp_path / f"{number}.sst"
        write_sstable(str(path), [(b"k%d" % j, tag * 8) for j in range(4)], fp_chance=0.01,
                      block_size=4096)
        r = SSTableReader(str(path), number, data=path.read_bytes())
        assert len(r.index_keys) == 1
        for part in ("index_keys", "index_offsets", "index_sizes"):
            setattr(r, part, _EveryEntry(getattr(r, part)[0], blocks))
        r.attach_cache(cache)
        readers.append(r)
    a, b = readers
    assert a.cache_base + blocks <= b.cache_base or b.cache_base + blocks <= a.cache_base
    edges = (2**24, 2**24 + 1, 0, 1, blocks - 1)
    for i in edges:  # read from "disk" and cached, file 2's blocks past 2**24 first
        assert a.block_entries(i)[1] == [b"a" * 8] * 4
    for i in edges:
        assert b.block_entries(i)[1] == [b"b" * 8] * 4
    assert (a.block_reads, a.block_cache_hits, b.block_reads, b.block_cache_hits) == (5, 0, 5, 0)
    assert len(cache) == 10
    for r, tag in ((a, b"a"), (b, b"b")):  # now every one a hit of its own block
        assert all(r.block_entries(i)[1] == [tag * 8] * 4 for i in edges)
        assert r.block_cache_hits == 5
    a.drop_cached()  # file 2 leaves: file 3's blocks stay
    assert sorted(k - b.cache_base for k, _size, _marked in cache.entries()) == sorted(edges)


@pytest.mark.parametrize("make", CACHES, ids=lambda c: c.__name__)
def test_attach_cache_refuses_a_spent_cache_and_leaves_the_reader_as_it_was(tmp_path, make):
    path = str(tmp_path / "t.sst")
    write_sstable(path, [(b"k%04d" % i, b"v" * 50) for i in range(200)], fp_chance=0.01,
                  block_size=1024)
    with closing(SSTableReader(path, 1)) as r:
        first, spent = make(1 << 20), make(1 << 20)
        r.attach_cache(first)
        base = r.cache_base
        r.block_entries(0)
        spent.reserve(2**64 - len(r.index_keys))  # one key short of a range for r
        with pytest.raises(OverflowError):
            r.attach_cache(spent)
        assert r.cache is first and r.cache_base == base and len(first) == 1
        r.attach_cache(None)  # detached: its blocks leave the cache
        assert r.cache is None and len(first) == 0
        assert r.block_entries(0) == r.read_block(0, False)
