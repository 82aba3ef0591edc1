"""The engine's ``_check()`` invariants hold on a working database and catch each kind of damage.

The state machines (``test_db_model``, ``test_compaction_model``) call
``db._check()`` after every step; these tests show that each check can fail:
a structure bent by hand is reported, naming what broke.
"""

from __future__ import annotations

import pytest

import lsmdb
import lsmdb.cache
from lsmdb.filters.bloom import BloomFilter


@pytest.fixture
def loaded(tmp_path, small):
    db = lsmdb.open(str(tmp_path / "db"), auto_compaction=False,
                    block_cache_size_bytes=64 * 1024)
    db.alter_table("default", **small)
    t = db.create_table("leveled", compaction="leveled", target_file_size_bytes=64 * 1024,
                        compression="none", **small)
    for i in range(3000):
        db.put(b"k%05d" % i, b"v" * 40)
        t.put(b"k%05d" % (i * 7 % 3000), b"w" * 40)
    db.flush()
    db.compact("leveled")
    for i in range(0, 3000, 3):
        assert db.get(b"k%05d" % i) == b"v" * 40   # fills the block cache
    yield db
    db.close()


def test_a_working_database_keeps_every_invariant(loaded):
    state = loaded._versions.tables["leveled"]
    assert any(r.level > 0 for r in state.files)
    assert len(loaded._versions.tables["default"].files) > 1
    assert len(loaded._versions.block_cache) > 0
    loaded._check()


def test_level_zero_out_of_order_is_caught(loaded):
    state = loaded._versions.tables["default"]
    state.version.l0 = tuple(reversed(state.version.l0))
    with pytest.raises(AssertionError, match="level 0 not newest first"):
        loaded._check()


def test_a_file_missing_from_the_view_is_caught(loaded):
    state = loaded._versions.tables["default"]
    state.version.l0 = state.version.l0[1:]
    with pytest.raises(AssertionError, match="version of other files"):
        loaded._check()


def test_a_released_current_version_is_caught(loaded):
    state = loaded._versions.tables["default"]
    state.version._refs = 0  # as if released while current
    with pytest.raises(AssertionError, match="released|not live"):
        loaded._check()
    state.version._refs = 1


def test_a_retired_file_still_current_is_caught(loaded):
    versions = loaded._versions
    reader = versions.tables["default"].files[0]
    versions.version_set._retired.add(reader)
    with pytest.raises(AssertionError, match="retired but current"):
        loaded._check()
    versions.version_set._retired.discard(reader)


def test_a_stale_fast_path_is_caught(loaded):
    state = loaded._versions.tables["default"]
    state.fast = state.fast._replace(l0=state.fast.l0[1:])
    with pytest.raises(AssertionError, match="fast path out of date"):
        loaded._check()


def test_overlapping_levels_are_caught(loaded):
    state = loaded._versions.tables["leveled"]
    deeper = state.version.levels
    level = next(i for i, (_k, readers) in enumerate(deeper) if len(readers) > 1)
    keys, readers = deeper[level]
    readers = (readers[0], readers[0], *readers[2:])
    bent = list(deeper)
    bent[level] = (tuple(r.max_key for r in readers), readers)
    state.version.levels = tuple(bent)
    with pytest.raises(AssertionError):
        loaded._check()


def test_a_file_in_two_tables_is_caught(loaded):
    versions = loaded._versions
    a, b = versions.tables["default"], versions.tables["leveled"]
    b.files = (*b.files, a.files[0])
    with pytest.raises(AssertionError, match="file numbers"):
        loaded._check()


def test_a_reader_whose_index_does_not_tile_its_data_is_caught(loaded):
    reader = loaded._versions.tables["default"].files[0]
    reader.index_offsets = [reader.index_offsets[0] + 1, *reader.index_offsets[1:]]
    with pytest.raises(AssertionError, match="data block at"):
        reader._check()


def test_a_filter_of_the_wrong_size_is_caught():
    f = BloomFilter(1000, 0.01)
    f._check()
    f.add(b"x")
    f._check()
    f.bits.append(0)
    with pytest.raises(AssertionError, match="holds"):
        f._check()
    g = BloomFilter(1000, 0.01)
    g.part += 1
    with pytest.raises(AssertionError, match="partition size"):
        g._check()


@pytest.mark.parametrize("kind", ["python", "c"])
def test_a_block_cache_whose_books_do_not_add_up_is_caught(kind):
    if kind == "c" and not lsmdb.SPEEDUPS:
        pytest.skip("built without the C speedups")
    cls = lsmdb.cache.PyBlockCache if kind == "python" else lsmdb.cache.CBlockCache
    cache = cls(16 * 1024)
    base = cache.reserve(100)
    for i in range(100):
        cache.put(base + i, b"x" * 500, 500)
        cache._check()
    assert cache.used_bytes <= 16 * 1024 and len(cache) > 0
    if kind == "python":
        cache.used_bytes += 1
        with pytest.raises(AssertionError, match="uses"):
            cache._check()


def test_wal_segments_out_of_order_are_caught(loaded):
    log = loaded._versions.log
    log._check()
    log._closed_bytes += 1
    with pytest.raises(AssertionError, match="miscounted"):
        log._check()
    log._closed_bytes -= 1
