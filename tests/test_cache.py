"""The block cache (lsmdb/cache.py): its byte budget, second-chance eviction
in the order blocks came in, a file's blocks dropped when it leaves, the ring
of keys beside the dict holding each cached block once however blocks leave,
and the admission of a full cache's blocks on their second read (in C and
in Python, alike)."""

from __future__ import annotations

import random
import threading

import pytest

from lsmdb.cache import MIN_GHOSTS, BlockCache, PyAdmission, cache_key

try:
    from lsmdb._speedups import Admission as CAdmission
except ImportError:  # pragma: no cover - no C compiler when installed
    CAdmission = None


def fill(cache: BlockCache, keys, size: int = 100) -> None:
    for k in keys:
        cache.put(k, ("block", k), size)


THREADS = 4


def run_threads(work) -> None:
    """work(seed) on THREADS threads at once (seeds 0..THREADS-1)."""
    threads = [threading.Thread(target=work, args=(s,)) for s in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def cached(cache: BlockCache) -> set[int]:
    return {k for k in range(1 << 12) if cache.lookup(k) is not None}


def test_the_budget_holds_and_the_oldest_blocks_leave_first():
    cache = BlockCache(1000)
    fill(cache, range(10))
    assert cached(cache) == set(range(10)) and cache.used_bytes == 1000
    fill(cache, range(10, 13))
    assert cached(cache) == set(range(3, 13)) and cache.used_bytes == 1000
    cache.put(13, "big", 350)  # needs four blocks' room
    assert cached(cache) == set(range(7, 14)) and cache.used_bytes == 950


def test_a_block_hit_since_the_last_pass_gets_a_second_chance():
    cache = BlockCache(500)
    fill(cache, range(5))
    assert cache.get(0) == ("block", 0)  # marked
    cache.touch(1)                       # the C getter's mark
    fill(cache, [5, 6])
    assert cached(cache) == {0, 1, 4, 5, 6}  # 2 and 3 went; 0 and 1 moved to the back
    fill(cache, [7, 8])
    assert cached(cache) == {0, 1, 6, 7, 8}  # 4 and 5 went
    fill(cache, [9, 10])  # the marks were spent: 0 and 1 go now
    assert cached(cache) == {6, 7, 8, 9, 10}


def test_every_block_marked_still_makes_room_and_the_new_block_stays():
    cache = BlockCache(300)
    fill(cache, range(3))
    for k in range(3):
        cache.touch(k)
    cache.put(3, "x", 100)
    assert cached(cache) == {1, 2, 3} and cache.used_bytes == 300 and cache.lookup(3) == "x"


def test_a_block_put_twice_keeps_one_place_and_its_new_size():
    cache = BlockCache(1000)
    fill(cache, range(3))
    cache.put(0, "again", 300)
    assert cache.used_bytes == 500 and cache.lookup(0) == "again"
    assert list(cache._ring) == [0, 1, 2]
    fill(cache, range(3, 9))  # 0 is still the oldest
    assert 0 not in cached(cache) and cached(cache) == set(range(1, 9))


def test_a_block_larger_than_the_budget_is_not_cached():
    cache = BlockCache(100)
    cache.put(1, "huge", 101)
    assert len(cache) == 0 and cache.used_bytes == 0 and not cache._ring


def test_evict_file_drops_only_that_files_blocks_and_their_place_in_the_ring():
    cache = BlockCache(1 << 30)  # never full: nothing leaves by eviction
    for number in range(1, 200):
        fill(cache, [cache_key(number, b) for b in range(20)])
        cache.evict_file(number - 1)
        assert len(cache) == 20 and cache.used_bytes == 2000
        assert all(cache.lookup(cache_key(number, b)) for b in range(20))
        assert sorted(cache._ring) == sorted(cache._sizes)


def test_the_ring_holds_every_cached_block_in_a_random_workload():
    """Whatever mix of puts, hits, re-puts and dropped files: the budget holds,
    used_bytes is the sum of the cached sizes, and the ring holds every cached
    block once (so each can be evicted) and nothing else."""
    rng = random.Random(7)
    cache = BlockCache(5000)
    for _ in range(20_000):
        op = rng.random()
        key = cache_key(rng.randrange(1, 8), rng.randrange(40))
        if op < 0.6:
            cache.put(key, key, rng.randrange(1, 400))
        elif op < 0.95:
            cache.get(key)
        else:
            cache.evict_file(rng.randrange(1, 8))
        assert cache.used_bytes <= 5000
        assert cache.used_bytes == sum(cache._sizes.values())
        assert set(cache._map) == set(cache._sizes)
        assert sorted(cache._ring) == sorted(cache._sizes)


def test_threads_putting_and_dropping_keep_the_books_straight():
    cache = BlockCache(20_000)

    def work(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(5000):
            key = cache_key(rng.randrange(1, 6), rng.randrange(100))
            if rng.random() < 0.02:
                cache.evict_file(rng.randrange(1, 6))
            else:
                cache.put(key, key, rng.randrange(1, 300))
                cache.get(key)

    run_threads(work)
    assert cache.used_bytes == sum(cache._sizes.values()) <= 20_000
    assert sorted(cache._ring) == sorted(cache._sizes)


def test_a_full_cache_admits_a_block_on_its_second_read_among_the_last_reads():
    cache = BlockCache(1000)
    assert cache.admit(1) and cache.admit(1)  # room: every block
    fill(cache, range(10))
    assert cache.admission.full
    assert not cache.admit(100) and cache.admit(100)  # full: the second read
    assert not cache.admit(100)  # admitted once: a read after that is a first again
    assert cache.admit(100)
    assert not cache.admit(200)
    assert cache.admission.window == MIN_GHOSTS  # 10 blocks held: the least window
    # other blocks turned away until the window is spent and the memory cleared
    k = 1000
    while cache.admission.count:
        cache.admit(k)
        k += 1
    assert k - 1000 >= MIN_GHOSTS - 2  # false admissions do not count
    assert not cache.admit(200)  # forgotten
    assert cache.admit(200)  # remembered again


def test_room_in_the_cache_admits_every_block_and_books_follow_evictions():
    cache = BlockCache(1000)
    fill(cache, range(9))
    assert not cache.admission.full  # a tenth block of the average size fits
    assert all(cache.admit(k) for k in range(100, 200))
    fill(cache, [9])
    assert cache.admission.full
    cache.evict_file(0)  # keys 0..9 belong to file 0: the cache is empty again
    assert len(cache) == 0 and not cache.admission.full
    assert all(cache.admit(k) for k in range(100, 200))


def test_blocks_never_read_before_are_rarely_admitted():
    """A full cache admits a block read once only when another block's mark
    shares its bit: at most 1/64 of the time (64 bits per block remembered);
    about 1/128 on average over a window.  Binomial bound: 20,480 blocks at
    p = 1/64 would average 320 (sd 17.7); at the expected 1/128, 160."""
    cache = BlockCache(1000)
    fill(cache, range(10))
    window = cache.admission.window
    n = 20 * window
    admitted = sum(cache.admit(k) for k in range(10_000, 10_000 + n))
    assert admitted < n / 64
    # Blocks read twice within a window are admitted on the second read,
    # unless another block sharing a bit was let in between and cleared it
    # (100 blocks in 65,536 bits: 0.08 such pairs expected).
    k = 20_000_000
    while cache.admission.count:  # to the start of a window
        cache.admit(k)
        k += 1
    for k in range(50_000, 50_100):
        cache.admit(k)
    again = sum(cache.admit(k) for k in range(50_000, 50_100))
    assert again >= 98


@pytest.mark.skipif(CAdmission is None, reason="needs the C speedups")
def test_the_c_admission_and_its_python_twin_decide_alike():
    """The C getter asks _speedups.Admission; the Python fallback PyAdmission
    must turn away and let in the same blocks, window ends and all."""
    rng = random.Random(3)
    twins = [CAdmission(4096), PyAdmission(4096)]
    assert twins[0].bits == twins[1].bits == 4096 * 64
    for step in range(60_000):
        if step % 5000 == 0:
            full, window = rng.random() < 0.8, rng.randrange(1, 4097)
            for t in twins:
                t.full, t.window = full, window
        key = rng.choice([rng.randrange(1 << 40), rng.randrange(3000), -rng.randrange(1, 50)])
        decisions = [t.admit(key) for t in twins]
        assert decisions[0] == decisions[1], (step, key)
        assert twins[0].count == twins[1].count < twins[0].window


@pytest.mark.parametrize("make", [PyAdmission] + ([CAdmission] if CAdmission else []))
def test_admission_refuses_bad_settings(make):
    with pytest.raises(ValueError):
        make(0)
    a = make(100)
    with pytest.raises(ValueError):
        a.window = 0
    with pytest.raises(ValueError):
        a.window = a.bits // 64 + 1  # more than its bits were made for
    a.window = a.bits // 64
    with pytest.raises(TypeError):
        a.admit("key")


def test_threads_admitting_and_putting_keep_the_books_straight():
    """Threads admitting and putting at once: the budget holds, the books add
    up, and the admission's count stays within its window."""
    cache = BlockCache(20_000)
    fill(cache, range(200))
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(20_000):
                key = rng.randrange(5000)
                if cache.admit(key):
                    cache.put(key, key, 100)
        except BaseException as exc:  # pragma: no cover - what the test looks for
            errors.append(exc)

    run_threads(work)
    assert not errors
    assert cache.used_bytes == sum(cache._sizes.values()) <= 20_000
    assert sorted(cache._ring) == sorted(cache._sizes)
    assert cache.admission.count < cache.admission.window
