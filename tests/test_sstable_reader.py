"""SSTableReader, the file: footer, index, properties and filter in memory, and its
data blocks read on demand -- each checked (its checksum, then the data block
rule) before any key in it is used -- and its own range of keys in the block
cache, one per block, however many blocks the file has."""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import closing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lsmdb import block as blk
from lsmdb import cache as cache_module
from lsmdb.cache import PyBlockCache
from lsmdb.errors import CorruptionError, DatabaseClosedError
from lsmdb.sstable_format import MISSING
from lsmdb.sstable_reader import SSTableReader
from lsmdb.sstable_writer import write_sstable
from tests.support.reading import data_payload, stored_block


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.binary(min_size=0, max_size=8),
                       st.one_of(st.none(), st.binary(max_size=30)), min_size=1, max_size=80),
       st.lists(st.binary(max_size=8), max_size=40), st.integers(32, 400))
def test_every_key_is_in_the_block_the_index_names(tmp_path_factory, entries, probes,
                                                    block_size):
    """block_for names the only block that can hold a key; read_entry and
    read_block give that block, checked, in the cached form and decoded."""
    path = str(tmp_path_factory.mktemp("r") / "t.sst")
    write_sstable(path, sorted(entries.items()), fp_chance=0.01, block_size=block_size)
    with closing(SSTableReader(path, 1)) as r:
        blocks = [r.read_block(i) for i in range(len(r.index_keys))]
        assert [kv for keys, values in blocks for kv in zip(keys, values, strict=True)] == \
            sorted(entries.items())
        for key in list(entries) + probes:
            i = r.block_for(key)
            want = entries.get(key, MISSING)
            if i == len(r.index_keys):
                assert want is MISSING and key > r.max_key
                continue
            assert blk.entry_find(r.read_entry(i), key) == want
            assert blk.find_in_block(blocks[i], key) == want
            assert r.bounds(i) == ((r.index_keys[i - 1] if i else None), r.index_keys[i])
        assert r.counts.tolist() == [0] * len(r.counts)  # the file counts nothing


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())


def test_the_checksum_is_checked_before_anything_in_a_block_is_used(tmp_path):
    path = str(tmp_path / "t.sst")
    write_sstable(path, [(b"k%04d" % i, b"v" * 50) for i in range(100)], fp_chance=0.01,
                  block_size=512)
    with closing(SSTableReader(path, 1)) as r:
        offset = r.index_offsets[0]
    _flip(path, offset + 20)  # a byte inside the first data block's payload
    with closing(SSTableReader(path, 1)) as r:
        for read in (r.read_entry, r.read_block, r.read_raw):
            with pytest.raises(CorruptionError, match="checksum") as e:
                read(0)
            assert (e.value.path, e.value.offset) == (path, offset)
        assert r.read_block(1)[0][0] > r.index_keys[0]  # the others read


@pytest.mark.parametrize("how", ["keys and values swapped", "keys of another block"])
def test_a_checksum_valid_block_the_rule_refuses_is_corruption_at_its_offset(tmp_path, how):
    """A block rewritten in place with a valid checksum but keys that are not
    where the index says (a misdirected write, a bug): refused on every way in,
    naming the file and the block's offset."""
    path = str(tmp_path / "t.sst")
    write_sstable(path, [(b"k%04d" % i, b"v%04d" % i) for i in range(300)], fp_chance=0.01,
                  block_size=512, compression="none")
    with closing(SSTableReader(path, 1)) as r:
        offset = r.index_offsets[1]
        keys, values = r.read_block(1)
        if how == "keys and values swapped":
            raw = stored_block(r, data_payload(r, values, keys))  # type: ignore[arg-type]
        else:
            raw = stored_block(r, data_payload(r, [b"j" + k[1:] for k in keys], values))
    with open(path, "r+b") as f:  # the same size: the index and footer stay valid
        f.seek(offset)
        assert len(f.read(len(raw))) == len(raw)
        f.seek(offset)
        f.write(raw)
    with closing(SSTableReader(path, 1)) as r:
        r.read_block(0)
        for read in (r.read_entry, r.read_block):
            with pytest.raises(CorruptionError, match="index entry") as e:
                read(1)
            assert (e.value.path, e.value.offset) == (path, offset)


def test_a_closed_reader_reads_nothing(tmp_path):
    path = str(tmp_path / "t.sst")
    write_sstable(path, [(b"k", b"v")], fp_chance=0.01, block_size=512)
    r = SSTableReader(path, 1)
    assert r.fd >= 0
    r.close()
    assert r.fd == -1
    with pytest.raises(DatabaseClosedError):
        r.read_entry(0)


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
    for r in (a, b):  # cached, file 2's blocks past 2**24 first (each is the file's block 0)
        for i in edges:
            assert cache.offer(r.cache_base + i, r.read_entry(0), True)
    assert len(cache) == 10
    for r, tag in ((a, b"a"), (b, b"b")):  # each one its own block
        assert all(blk.entry_lists(cache.get(r.cache_base + i))[1] == [tag * 8] * 4
                   for i in edges)
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
        first.put(base, r.read_entry(0), 1)
        spent.reserve(2**64 - len(r.index_keys))  # one key short of a range for r
        with pytest.raises(OverflowError):
            r.attach_cache(spent)
        assert r.cache is first and r.cache_base == base and len(first) == 1
        r.attach_cache(None)  # detached: its blocks leave the cache
        assert r.cache is None and len(first) == 0


@pytest.mark.parametrize("tail", [1, 100, 5_000, 1 << 20], ids=lambda t: f"tail {t}")
def test_an_open_reads_the_same_file_whatever_part_its_tail_read_covers(tmp_path, monkeypatch,
                                                                        tail):
    """The open reads the file's last TAIL_READ_BYTES once and the meta blocks
    beyond them with a pread of their own: footer, properties, index and
    filter come out the same however much the tail covers (none of them, the
    footer only, some, all), and a damaged footer is still caught."""
    import lsmdb.sstable_reader as reader_mod

    path = str(tmp_path / "t.sst")
    items = [(b"k%06d" % i, b"v" * (i % 50)) for i in range(3000)]
    write_sstable(path, items, fp_chance=0.01, block_size=512)
    with closing(SSTableReader(path)) as whole:
        want = (whole.properties, whole.index_keys, whole.index_offsets, whole.index_sizes,
                whole.filter.stored is not None)
    monkeypatch.setattr(reader_mod, "TAIL_READ_BYTES", tail)
    with closing(SSTableReader(path)) as r:
        assert (r.properties, r.index_keys, r.index_offsets, r.index_sizes,
                r.filter.stored is not None) == want
        for k, v in items[::97]:
            assert blk.entry_find(r.read_entry(r.block_for(k)), k) == v
    with open(path, "r+b") as f:
        f.seek(-3, os.SEEK_END)
        f.write(b"\0\0\0")
    with pytest.raises(CorruptionError):
        SSTableReader(path)
