"""The block cache (lsmdb/cache.py): its byte budget, second-chance eviction
in the order blocks came in, the ranges of keys it reserves for its readers
(one key per block, never shared, however many blocks a file has), a file's
blocks dropped when it leaves, the ring of keys beside the dict holding each
cached block once however blocks leave, and the admission of a full cache's
blocks on their second read (in C and in Python, alike)."""

from __future__ import annotations

import random
import threading
from itertools import pairwise

import pytest

from lsmdb import cache as cache_module
from lsmdb.cache import MIN_GHOSTS, BlockCache, PyAdmission, PyBlockCache, _mix

try:
    from lsmdb._speedups import Admission as CAdmission
except ImportError:  # pragma: no cover - no C compiler when installed
    CAdmission = None

#: The books in Python, and in C where the speedups are built.
IMPLEMENTATIONS = [PyBlockCache] + ([cache_module.CBlockCache] if CAdmission else [])


@pytest.fixture(params=IMPLEMENTATIONS, ids=lambda c: c.__name__)
def make(request):
    return request.param


def test_a_db_makes_the_c_books_where_the_speedups_are_built():
    assert BlockCache is IMPLEMENTATIONS[-1]


def ring(cache) -> list[int]:
    """The cached keys, oldest first."""
    return [k for k, _size, _marked in cache.entries()]


def books_straight(cache, budget: int) -> None:
    """The budget holds, used_bytes is the sum of the cached sizes, and the
    ring holds every cached block once (so each can be evicted), nothing else."""
    entries = cache.entries()
    assert cache.used_bytes == sum(size for _k, size, _m in entries) <= budget
    assert len(entries) == len(cache) == len({k for k, _s, _m in entries})
    assert all(cache.lookup(k) is not None for k, _s, _m in entries)


def fill(cache, keys, size: int = 100) -> None:
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


def cached(cache) -> set[int]:
    return {k for k in range(1 << 12) if cache.lookup(k) is not None}


def test_the_budget_holds_and_the_oldest_blocks_leave_first(make):
    cache = make(1000)
    fill(cache, range(10))
    assert cached(cache) == set(range(10)) and cache.used_bytes == 1000
    fill(cache, range(10, 13))
    assert cached(cache) == set(range(3, 13)) and cache.used_bytes == 1000
    cache.put(13, "big", 350)  # needs four blocks' room
    assert cached(cache) == set(range(7, 14)) and cache.used_bytes == 950


def test_a_block_hit_since_the_last_pass_gets_a_second_chance(make):
    cache = make(500)
    fill(cache, range(5))
    assert cache.get(0) == ("block", 0)  # marked
    cache.touch(1)                       # the C getter's mark
    fill(cache, [5, 6])
    assert cached(cache) == {0, 1, 4, 5, 6}  # 2 and 3 went; 0 and 1 moved to the back
    fill(cache, [7, 8])
    assert cached(cache) == {0, 1, 6, 7, 8}  # 4 and 5 went
    fill(cache, [9, 10])  # the marks were spent: 0 and 1 go now
    assert cached(cache) == {6, 7, 8, 9, 10}


def test_every_block_marked_still_makes_room_and_the_new_block_stays(make):
    cache = make(300)
    fill(cache, range(3))
    for k in range(3):
        cache.touch(k)
    cache.put(3, "x", 100)
    assert cached(cache) == {1, 2, 3} and cache.used_bytes == 300 and cache.lookup(3) == "x"


def test_a_block_put_twice_keeps_one_place_and_its_new_size(make):
    cache = make(1000)
    fill(cache, range(3))
    cache.put(0, "again", 300)
    assert cache.used_bytes == 500 and cache.lookup(0) == "again"
    assert ring(cache) == [0, 1, 2]
    fill(cache, range(3, 9))  # 0 is still the oldest
    assert 0 not in cached(cache) and cached(cache) == set(range(1, 9))


def test_a_block_larger_than_the_budget_is_not_cached(make):
    cache = make(100)
    cache.put(1, "huge", 101)
    assert len(cache) == 0 and cache.used_bytes == 0 and cache.entries() == []


def disjoint(ranges: list[tuple[int, int]]) -> bool:
    """No two of the [lo, hi) ranges share an int."""
    ranges = sorted(ranges)
    return all(hi <= lo2 for (_lo, hi), (lo2, _hi2) in pairwise(ranges))


def test_reserve_hands_out_ranges_that_never_share_a_key_however_many_blocks(make):
    """Each reader's range [base, base + blocks) is its own, for any block
    count: past 2**24 blocks, where keys of the form (file << 24) | block
    would give a block of one file the key of a block of the next."""
    cache = make(1 << 20)
    counts = [2**24 + 2, 3, 2**24, 1, 0, 2**32 + 7, 2**24 + 1, 5]
    bases = [cache.reserve(n) for n in counts]
    ranges = [(b, b + n) for b, n in zip(bases, counts, strict=True)]
    assert disjoint(ranges) and all(0 <= lo <= hi < 2**64 for lo, hi in ranges)
    # the blocks at each range's edges and past 2**24, cached side by side
    edges = {(f, i) for f, n in enumerate(counts)
             for i in (0, 1, n - 2, n - 1, 2**24, 2**24 + 1) if 0 <= i < n}
    keys = {bases[f] + i: (f, i) for f, i in edges}
    assert len(keys) == len(edges)  # no two blocks share a key
    for key, block in keys.items():
        cache.put(key, block, 1)
    assert all(cache.lookup(key) == block for key, block in keys.items())


def test_reserve_refuses_to_wrap_and_bad_counts(make):
    cache = make(1000)
    assert cache.reserve(2**64 - 10) == 0
    with pytest.raises(OverflowError):
        cache.reserve(10)  # would reach 2**64: nothing reserved
    assert cache.reserve(9) == 2**64 - 10  # its keys end at 2**64 - 2
    assert cache.reserve(0) == 2**64 - 1
    with pytest.raises(OverflowError):
        cache.reserve(1)
    cache.put(2**64 - 2, "last", 10)
    cache.put(0, "first", 10)
    assert cache.lookup(2**64 - 2) == "last" and cache.lookup(0) == "first"
    for bad, error in ((-1, ValueError), (2**64, ValueError), ("3", TypeError),
                       (3.0, TypeError)):
        with pytest.raises(error):
            make(1000).reserve(bad)
    for lo, hi, error in ((-1, 3, ValueError), (0, 2**64 + 1, ValueError), (0, "9", TypeError)):
        with pytest.raises(error):
            cache.evict_range(lo, hi)
    assert len(cache) == 2


def test_evict_range_drops_only_that_files_blocks_and_their_place_in_the_ring(make):
    cache = make(1 << 30)  # never full: nothing leaves by eviction
    before = None
    for _ in range(200):
        base = cache.reserve(20)
        fill(cache, range(base, base + 20))
        if before is not None:
            cache.evict_range(before, before + 20)
        before = base
        assert len(cache) == 20 and cache.used_bytes == 2000
        assert all(cache.lookup(base + b) for b in range(20))
        assert sorted(ring(cache)) == list(range(base, base + 20))
    cache.evict_range(before + 5, before + 15)  # a range's middle: its ends stay
    assert sorted(ring(cache)) == [*range(before, before + 5), *range(before + 15, before + 20)]
    cache.evict_range(before + 3, before + 3)  # an empty range drops nothing
    assert len(cache) == 10


def test_the_ring_holds_every_cached_block_in_a_random_workload(make):
    """Whatever mix of puts, hits, re-puts and dropped files: the budget holds,
    used_bytes is the sum of the cached sizes, and the ring holds every cached
    block once (so each can be evicted) and nothing else."""
    rng = random.Random(7)
    cache = make(5000)
    files = [cache.reserve(40) for _ in range(7)]
    for _ in range(20_000):
        op = rng.random()
        key = rng.choice(files) + rng.randrange(40)
        if op < 0.6:
            cache.put(key, key, rng.randrange(1, 400))
        elif op < 0.95:
            cache.get(key)
        else:
            base = rng.choice(files)
            cache.evict_range(base, base + 40)
        books_straight(cache, 5000)


def test_threads_reserving_putting_and_dropping_keep_the_books_straight(make):
    """Threads reserving at once get ranges no two of which share a key."""
    cache = make(20_000)
    files = [cache.reserve(100) for _ in range(5)]
    reserved: list[tuple[int, int]] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(5000):
            base = rng.choice(files)
            key = base + rng.randrange(100)
            op = rng.random()
            if op < 0.02:
                cache.evict_range(base, base + 100)
            elif op < 0.1:
                n = rng.randrange(1, 2**30)
                reserved.append((cache.reserve(n), n))
            else:
                cache.put(key, key, rng.randrange(1, 300))
                cache.get(key)

    run_threads(work)
    books_straight(cache, 20_000)
    ranges = [(b, b + 100) for b in files] + [(b, b + n) for b, n in reserved]
    assert len(reserved) > 1000 and disjoint(ranges)


def test_a_full_cache_admits_a_block_on_its_second_read_among_the_last_reads(make):
    cache = make(1000)
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


def test_a_false_positives_block_is_admitted_on_its_second_read_full_or_not(make):
    """admit_reread (a block read for a key it did not hold) asks the same
    memory of turned-away reads as a full cache's admit, with room or not;
    and the reads it turns away count toward the window."""
    cache = make(1000)
    assert not cache.admission.full
    assert cache.admit(5)  # room: a block that held its key goes in
    assert not cache.admit_reread(5) and cache.admit_reread(5)  # room or not: the second read
    assert not cache.admit_reread(5)  # admitted once: a read after that is a first again
    assert cache.admission.count == 2
    assert not cache.admit_reread(7)
    fill(cache, range(10))
    assert cache.admission.full
    assert cache.admit(7)  # a full cache's admit knows the false positive's read ...
    assert not cache.admit(8) and cache.admit_reread(8)  # ... and the other way round
    while cache.admission.count:  # the window spent: all forgotten
        cache.admit_reread(10_000 + cache.admission.count)
    assert not cache.admit_reread(5)


def test_room_in_the_cache_admits_every_block_and_books_follow_evictions(make):
    cache = make(1000)
    fill(cache, range(9))
    assert not cache.admission.full  # a tenth block of the average size fits
    assert all(cache.admit(k) for k in range(100, 200))
    fill(cache, [9])
    assert cache.admission.full
    cache.evict_range(0, 10)  # every block cached: the cache is empty again
    assert len(cache) == 0 and not cache.admission.full
    assert all(cache.admit(k) for k in range(100, 200))


def test_blocks_never_read_before_are_rarely_admitted(make):
    """A full cache admits a block read once only when another block's mark
    shares its bit: at most 1/64 of the time (64 bits per block remembered);
    about 1/128 on average over a window.  Binomial bound: 20,480 blocks at
    p = 1/64 would average 320 (sd 17.7); at the expected 1/128, 160."""
    cache = make(1000)
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
    must turn away and let in the same blocks, window ends and all, for
    blocks that held their key (admit) and false positives' (admit_reread);
    ``rereads`` says beforehand what admit_reread would, changing nothing."""
    rng = random.Random(3)
    twins = [CAdmission(4096), PyAdmission(4096)]
    assert twins[0].bits == twins[1].bits == 4096 * 64
    for step in range(60_000):
        if step % 5000 == 0:
            full, window = rng.random() < 0.8, rng.randrange(1, 4097)
            for t in twins:
                t.full, t.window = full, window
        key = rng.choice([rng.randrange(1 << 40), rng.randrange(3000), -rng.randrange(1, 50)])
        reread = rng.random() < 0.3
        peeks = [t.rereads(key) for t in twins]  # what admit_reread would say, nothing kept
        counts = [t.count for t in twins]
        decisions = [t.admit_reread(key) if reread else t.admit(key) for t in twins]
        assert decisions[0] == decisions[1], (step, key)
        assert peeks[0] == peeks[1]
        if reread:
            assert decisions[0] == peeks[0]
        assert twins[0].count == twins[1].count < twins[0].window
        assert [t.rereads(key) for t in twins] == [t.rereads(key) for t in twins]
        if not reread and not full:
            assert [t.count for t in twins] == counts  # admit with room: nothing remembered


def test_the_mix_spreads_runs_of_consecutive_keys_as_it_does_random_keys():
    """A cache's keys are runs of consecutive ints (a reader's base + block
    index).  The C table's slots (linear probing) and the admission's bits
    are picked by the low bits of ``_mix`` of a key (the C ``admission_mix``,
    bit for bit: the twin test above).  Slots picked by the keys' own low
    bits would fill in one run, which a lookup of an absent key walks to its
    end; mixed, such a lookup takes the 2.5 probes random keys would at a
    load of one half, and 1,024 consecutive keys set about the 1,016 distinct
    bits of 65,536 that random keys would."""

    def absent_lookup_probes(keys: list[int], slot) -> float:
        """Mean probes of a lookup of an absent key into a table of twice
        len(keys) slots holding keys, up to and including the empty slot."""
        n = 2 * len(keys)
        taken = bytearray(n)
        for k in keys:
            i = slot(k) % n
            while taken[i]:
                i = (i + 1) % n
            taken[i] = 1
        total, run = 0, 0
        for j in range(2 * n - 1, -1, -1):  # twice round: runs that wrap
            run = run + 1 if taken[j % n] else 1
            if j < n:
                total += run
        return total / n

    runs = [*range(1 << 14), *range(2**40 + 12345, 2**40 + 12345 + 8192),
            *range(2**63, 2**63 + 8192)]
    assert absent_lookup_probes(runs, _mix) < 2.75
    assert absent_lookup_probes(list(range(1 << 15)), lambda k: k) > 1000  # what mixing avoids
    for base in (0, 2**24 - 512, 2**40 + 3, 2**64 - 2048):
        bits = {_mix(k) & 0xFFFF for k in range(base, base + 1024)}
        assert len(bits) >= 1000


@pytest.mark.parametrize("admission", [PyAdmission] + ([CAdmission] if CAdmission else []))
def test_admission_refuses_bad_settings(admission):
    with pytest.raises(ValueError):
        admission(0)
    a = admission(100)
    with pytest.raises(ValueError):
        a.window = 0
    with pytest.raises(ValueError):
        a.window = a.bits // 64 + 1  # more than its bits were made for
    a.window = a.bits // 64
    with pytest.raises(TypeError):
        a.admit("key")
    with pytest.raises(TypeError):
        a.admit_reread(b"key")


def test_threads_admitting_and_putting_keep_the_books_straight(make):
    """Threads admitting and putting at once: the budget holds, the books add
    up, and the admission's count stays within its window."""
    cache = make(20_000)
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
    books_straight(cache, 20_000)
    assert cache.admission.count < cache.admission.window


@pytest.mark.skipif(CAdmission is None, reason="needs the C speedups")
@pytest.mark.parametrize("seed", range(4))
def test_the_c_books_and_the_python_books_agree_step_by_step(seed):
    """The Python books are the reference: given the same reservations, puts,
    hits, re-puts, admissions, dropped files and blocks too large, the C books
    hand out the same ranges, hold the same blocks in the same order with the
    same sizes and marks, answer every lookup alike and admit alike --
    through a table that grows, fills with dropped slots and is rebuilt many
    times over.  Files of more than 2**24 blocks among them have blocks
    cached on both sides of block 2**24 and of their neighbours' edges."""
    rng = random.Random(seed)
    budget = rng.choice([3_000, 20_000, 200_000])
    py, c = PyBlockCache(budget), cache_module.CBlockCache(budget)
    files: list[tuple[int, int]] = []  # (base, blocks) of each file's range

    def new_file() -> None:
        n = rng.choice([50, 500, 5000, 2**24 + 3, 2**33])
        base = py.reserve(n)
        assert c.reserve(n) == base
        files.append((base, n))

    for _ in range(rng.randrange(2, 12)):
        new_file()
    for step in range(30_000):
        op = rng.random()
        base, n = rng.choice(files)
        i = rng.randrange(min(n, rng.choice([50, 500, 5000])))
        key = base + rng.choice([i, n - 1 - i, min(2**24 + i, n - 1)])
        if op < 0.45:
            size = rng.choice([rng.randrange(1, 300), rng.randrange(1, budget + 50)])
            block = ("block", key, step)
            py.put(key, block, size)
            c.put(key, block, size)
        elif op < 0.75:
            assert py.get(key) == c.get(key), step
        elif op < 0.85:
            py.touch(key)
            c.touch(key)
        elif op < 0.92:
            assert py.admit(key) == c.admit(key), step
        elif op < 0.97:
            assert py.admit_reread(key) == c.admit_reread(key), step
        elif op < 0.99:
            py.evict_range(base, base + n)
            c.evict_range(base, base + n)
        else:
            new_file()
        if step % 97 == 0:
            assert py.entries() == c.entries(), step
            assert py.used_bytes == c.used_bytes and len(py) == len(c)
            assert py.admission.full == c.admission.full
            assert py.admission.window == c.admission.window
            assert py.admission.count == c.admission.count
    assert py.entries() == c.entries()
    books_straight(c, budget)
    assert [c.lookup(k) for k, _s, _m in c.entries()] == [py.lookup(k)
                                                          for k, _s, _m in py.entries()]


@pytest.mark.skipif(CAdmission is None, reason="needs the C speedups")
def test_the_c_books_refuse_bad_input_and_hold_their_blocks():
    c = cache_module.CBlockCache(1000)
    with pytest.raises(TypeError):
        c.put("key", b"x", 10)
    with pytest.raises(ValueError):
        c.put(1, b"x", -1)
    with pytest.raises(TypeError):
        c.put(1, b"x")
    with pytest.raises(TypeError):
        c.lookup(1.5)
    assert len(c) == 0 and c.used_bytes == 0
    block = bytearray(b"payload")
    c.put(7, block, 7)
    del block
    assert c.lookup(7) == bytearray(b"payload")  # the cache holds its own reference
    c.evict_range(7, 8)
    assert c.lookup(7) is None and c.entries() == []
    with pytest.raises(TypeError):
        cache_module._CCache(10, "not an Admission")


@pytest.mark.skipif(CAdmission is None, reason="needs the C speedups")
def test_a_block_that_refers_to_its_cache_is_collected_with_it():
    """The C books take part in cycle collection: a cache holding a block that
    holds the cache goes when nothing else holds either."""
    import gc
    import weakref

    class Block(list):
        pass

    c = cache_module.CBlockCache(1000)
    block = Block([c])
    c.put(5, block, 10)
    alive = weakref.ref(block)
    del c, block
    gc.collect()
    assert alive() is None
