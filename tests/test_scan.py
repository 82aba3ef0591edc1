"""lsmdb.scan: a file's blocks read ahead in doubling runs, each checked as it is used,
cached blocks used as they are; scans over a pinned version."""

from __future__ import annotations

from contextlib import closing

import pytest

from lsmdb.cache import BlockCache
from lsmdb.errors import CorruptionError
from lsmdb.scan import chunks
from lsmdb.sstable_reader import SSTableReader
from lsmdb.sstable_writer import write_sstable


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
    return [kv for keys, values in chunks(r, start, None, reverse)
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
        for used, (keys, _values) in enumerate(chunks(r, b"k001000", None), 1):
            assert keys[0] >= b"k001000"
            if used == 5:
                break
        assert r.block_reads <= 2 * used


def test_cached_blocks_inside_a_run_are_used_and_counted_as_hits(tmp_path):
    path, entries = _table(tmp_path, n=600)
    with closing(SSTableReader(path, 1)) as r:
        r.attach_cache(BlockCache(1 << 20))
        for i in (1, 2, 5, 9):
            r.cache.put(r.cache_base + i, r.read_entry(i), 1)  # cached
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
        walk = chunks(r, None, None)
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
            for keys, _values in chunks(r, None, None):
                got.extend(keys)
        assert str(r.index_offsets[5]) in str(info.value)
        assert got == [k for k, _ in entries][:len(got)] and len(got) > 0


