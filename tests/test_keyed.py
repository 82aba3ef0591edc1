"""Keyed filter hashing (table option ``bloom_filter_hash="keyed"``).

The fast hash (xxh3_64) is public, so anyone who can guess the keys of a
table can rebuild its filter bit for bit offline and keep only the absent
keys it answers "maybe" for: each such key then costs the database a disk
read, and the measured false-positive rate goes to ~100 %.  A keyed table
probes with blake2b keyed by a per-database secret (``FILTER_KEY``, mode
0600, never written into an SSTable), so the same crafted keys are ordinary
absent keys to it: their false-positive rate stays within a binomial bound
of the filter's prediction.

Also: the filter header records the algorithm (2) and a key id; losing the
secret makes keyed filters fail open (reads stay correct, ``verify`` reports
it); reopening keeps the same secret.
"""

from __future__ import annotations

import math
import os
import random
import stat
import time

import pytest

import lsmdb
import lsmdb.repair
import lsmdb.secret
from lsmdb.filters.bloom import FILTER_HEADER, BloomFilter, split_hash
from lsmdb.filters.hashing import HASH_BLAKE2B_KEYED, HASH_XXH3_64, key_hash, keyed_hasher
from lsmdb.secret import SECRET_NAME
from lsmdb.sstable_reader import SSTableReader
from lsmdb.verify import verify_database

N_KEYS = 2000
FP_CHANCE = 0.01
N_CRAFTED = 600
# A correct filter exceeds the bound less than once in a million runs.
TAIL = 1e-6


def user_key(i: int) -> bytes:
    return b"user:%06d" % (2 * i)  # guessable: sequential ids


def user_value(i: int) -> bytes:
    return b"profile-%d" % i


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "db")


def build(path: str) -> None:
    """Tables "fast" and "keyed" holding the same N_KEYS keys, flushed."""
    with lsmdb.open(path, auto_compaction=False) as db:
        fast = db.create_table("fast", bloom_filter_fp_chance=FP_CHANCE)
        keyed = db.create_table("keyed", bloom_filter_fp_chance=FP_CHANCE,
                                bloom_filter_hash="keyed")
        assert fast.options.bloom_filter_hash == "fast"
        for i in range(N_KEYS):
            fast.put(user_key(i), user_value(i))
            keyed.put(user_key(i), user_value(i))
        db.flush()


def read_secret(path: str) -> bytes:
    with open(os.path.join(path, SECRET_NAME), "rb") as f:
        return f.read()


def filter_header(sst_path: str) -> tuple:
    """(version, algorithm, flags, k, m, n, fp_chance, key_id) read from the file itself."""
    r = SSTableReader(sst_path)
    try:
        off, _size = r.filter_handle
    finally:
        r.close()
    with open(sst_path, "rb") as f:
        f.seek(off)
        return FILTER_HEADER.unpack(f.read(FILTER_HEADER.size))


def binomial_upper(n: int, p: float, tail: float = TAIL) -> int:
    """Smallest t with P(Binomial(n, p) >= t) <= tail."""
    p = min(max(p, 0.0), 1.0)
    cdf = 0.0
    for t in range(n + 1):
        if 1.0 - cdf <= tail:
            return t
        cdf += math.comb(n, t) * p ** t * (1 - p) ** (n - t)
    return n + 1


def craft_keys(bloom: BloomFilter, count: int, seed: int = 1) -> list[bytes]:
    """Absent keys inside the table's key range that the filter answers "maybe" for."""
    rng = random.Random(seed)
    out = []
    j = 0
    while len(out) < count:
        # "user:000124~j" sorts between two real keys: no range check skips it.
        candidate = b"%s~%d" % (user_key(rng.randrange(N_KEYS - 1)), j)
        j += 1
        if bloom.may_contain_hash(*split_hash(key_hash(candidate))):
            out.append(candidate)
    return out


def counters(db: lsmdb.DB, table: str) -> tuple[int, int, float, float]:
    """(false_positives, filter_negatives, predicted fpr, fill-implied fpr) of its one file."""
    (info,) = db.sstables(table)
    return (info.false_positives, info.filter_negatives, info.predicted_fpr,
            info.estimated_fpr_from_fill)


# --------------------------------------------------------------------------- the attack

def test_crafted_keys_defeat_the_fast_filter_but_not_the_keyed_one(path):
    build(path)
    with lsmdb.open(path, auto_compaction=False) as db:
        fast_info, = db.sstables("fast")
        keyed_info, = db.sstables("keyed")

        # The attacker, offline: the key format is guessable and xxh3 is public,
        # so a filter of the same size built from the guessed keys is the very
        # filter the table holds -- no access to the database needed.
        offline = BloomFilter(N_KEYS, FP_CHANCE)
        for i in range(N_KEYS):
            offline.add(user_key(i))
        fast_sst = SSTableReader(fast_info.path)
        keyed_sst = SSTableReader(keyed_info.path)
        keyed_sst.attach_hasher(keyed_hasher(read_secret(path)))
        try:
            assert (fast_sst.filter.active.m, fast_sst.filter.active.k) == (offline.m, offline.k)
            assert bytes(fast_sst.filter.active.bits) == bytes(offline.bits)
            assert bytes(keyed_sst.filter.active.bits) != bytes(offline.bits)
        finally:
            fast_sst.close()
            keyed_sst.close()
        crafted = craft_keys(offline, N_CRAFTED)

        fp0, tn0, predicted_fast, _fill = counters(db, "fast")
        kfp0, ktn0, predicted_keyed, fill_keyed = counters(db, "keyed")
        for k in crafted:
            assert db.table("fast").get(k) is None
            assert db.table("keyed").get(k) is None
        fp1, tn1, _p, _f = counters(db, "fast")
        kfp1, ktn1, _p, _f = counters(db, "keyed")

        fast_fpr = (fp1 - fp0) / ((fp1 - fp0) + (tn1 - tn0))
        keyed_fp = kfp1 - kfp0
        keyed_fpr = keyed_fp / (keyed_fp + (ktn1 - ktn0))
        assert (fp1 - fp0) + (tn1 - tn0) == N_CRAFTED
        assert (kfp1 - kfp0) + (ktn1 - ktn0) == N_CRAFTED
        print(f"\ncrafted keys: fast table measured FPR {fast_fpr:.1%} "
              f"(predicted {predicted_fast:.2%}); keyed table {keyed_fpr:.2%} "
              f"(predicted {predicted_keyed:.2%})")
        # Every crafted key costs the fast table a disk read.
        assert fast_fpr >= 0.99
        assert fast_fpr > 50 * predicted_fast
        # The keyed table sees them as ordinary absent keys.
        p = max(predicted_keyed, fill_keyed)
        bound = binomial_upper(N_CRAFTED, p)
        assert keyed_fp < bound, (keyed_fp, bound, p)
        # And a table-level view says the same.
        assert db.table_stats("fast")["measured_fpr"] >= 0.99
        assert db.table_stats("keyed")["measured_fpr"] < bound / N_CRAFTED


def test_keyed_filter_answers_like_a_filter_for_random_absent_keys(path):
    """Keyed hashing is still a working Bloom filter: no false negatives, FPR as predicted."""
    build(path)
    with lsmdb.open(path, auto_compaction=False) as db:
        keyed = db.table("keyed")
        for i in range(0, N_KEYS, 7):
            assert keyed.get(user_key(i)) == user_value(i)
        fp0, tn0, predicted, fill = counters(db, "keyed")
        n = 3000
        for j in range(n):
            assert keyed.get(b"user:%06d" % (2 * (j % (N_KEYS - 1)) + 1) + b"#%d" % j) is None
        fp1, tn1, _p, _f = counters(db, "keyed")
        assert (fp1 - fp0) + (tn1 - tn0) == n
        assert fp1 - fp0 < binomial_upper(n, max(predicted, fill))
        assert db.sstables("keyed")[0].false_negatives == 0
    assert not [p for p in verify_database(path) if p.severity == "error"]


# --------------------------------------------------------------------------- the secret

def test_filter_key_is_private_and_never_written_into_sstables(path):
    build(path)
    key_file = os.path.join(path, SECRET_NAME)
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    secret = read_secret(path)
    assert len(secret) == 32
    hasher = keyed_hasher(secret)
    files = sorted(os.listdir(path))
    assert any(n.endswith(".sst") for n in files)
    for name in files:
        if name == SECRET_NAME:
            continue
        with open(os.path.join(path, name), "rb") as f:
            data = f.read()
        assert secret not in data, name
        assert secret[:16] not in data and secret[16:] not in data, name
    with lsmdb.open(path, read_only=True) as db:
        keyed_sst, = db.sstables("keyed")
        fast_sst, = db.sstables("fast")
    version, algo, _flags, k, m, n, fp, key_id = filter_header(keyed_sst.path)
    assert algo == HASH_BLAKE2B_KEYED == 2
    assert key_id == hasher.key_id != 0
    assert (n, k, m) == (N_KEYS, keyed_sst.filter_hashes, keyed_sst.filter_bits)
    _v, algo, _flags, _k, _m, _n, _fp, key_id = filter_header(fast_sst.path)
    assert algo == HASH_XXH3_64 and key_id == 0


def test_no_filter_key_until_a_table_asks_for_keyed_hashing(path):
    with lsmdb.open(path) as db:
        db.put(b"k", b"v")
        db.create_table("plain").put(b"k", b"v")
        db.flush()
        assert not os.path.exists(os.path.join(path, SECRET_NAME))
        db.alter_table("plain", bloom_filter_hash="keyed")
        db.table("plain").put(b"k2", b"v2")
        db.flush()
        assert os.path.exists(os.path.join(path, SECRET_NAME))
        newest = db.sstables("plain")[0]
        assert filter_header(newest.path)[1] == HASH_BLAKE2B_KEYED
        assert db.table("plain").get(b"k") == b"v" and db.table("plain").get(b"k2") == b"v2"


def test_reopening_keeps_the_secret_and_its_key_id(path):
    build(path)
    secret = read_secret(path)
    key_id = keyed_hasher(secret).key_id
    with lsmdb.open(path, auto_compaction=False) as db:
        first, = db.sstables("keyed")
        assert first.filter_error is None
        db.table("keyed").put(b"user:999999", b"later")
        db.flush("keyed")
        second = db.sstables("keyed")[0]
        assert second.file != first.file
        assert filter_header(first.path)[-1] == filter_header(second.path)[-1] == key_id
    for _round in range(2):
        with lsmdb.open(path, auto_compaction=False) as db:
            infos = db.sstables("keyed")
            assert infos and all(i.filter_error is None for i in infos)
            # The filters are in use: absent keys are skipped without a read.
            negatives = sum(i.filter_negatives for i in infos)
            for j in range(50):
                assert db.table("keyed").get(b"user:000100#%d" % j) is None
            assert sum(i.filter_negatives for i in db.sstables("keyed")) > negatives
            assert db.table("keyed").get(b"user:999999") == b"later"
            db.compact("keyed")  # a new file, built after the reopen
    assert read_secret(path) == secret
    with lsmdb.open(path, read_only=True) as db:
        assert {filter_header(i.path)[-1] for i in db.sstables("keyed")} == {key_id}


def test_losing_filter_key_makes_keyed_filters_fail_open(path):
    build(path)
    old_key_id = keyed_hasher(read_secret(path)).key_id
    os.unlink(os.path.join(path, SECRET_NAME))
    keyed_path = None
    with lsmdb.open(path, auto_compaction=False) as db:
        info, = db.sstables("keyed")
        keyed_path = info.path
        assert info.filter_error  # fails open, and says why
        assert db.sstables("fast")[0].filter_error is None
        keyed = db.table("keyed")
        for i in range(N_KEYS):
            assert keyed.get(user_key(i)) == user_value(i)
        fp0, tn0, _p, _f = counters(db, "keyed")
        for j in range(200):
            assert keyed.get(b"user:000500#%d" % j) is None
        fp1, tn1, _p, _f = counters(db, "keyed")
        # Every absent key read the block: the filter answered "maybe".
        assert (fp1 - fp0, tn1 - tn0) == (200, 0)
    problems = [p for p in verify_database(path) if p.severity == "error"]
    assert [p.path for p in problems] == [keyed_path]

    # Writing on: a new secret (new key id) for new files; the old file keeps failing open.
    with lsmdb.open(path, auto_compaction=False) as db:
        db.table("keyed").put(b"user:999998", b"new")
        db.flush("keyed")
        new_key_id = keyed_hasher(read_secret(path)).key_id
        assert new_key_id != old_key_id
        newest, oldest = db.sstables("keyed")
        assert newest.filter_error is None and oldest.filter_error
        assert filter_header(newest.path)[-1] == new_key_id
        for i in range(0, N_KEYS, 3):
            assert db.table("keyed").get(user_key(i)) == user_value(i)
        assert db.table("keyed").get(b"user:999998") == b"new"


def test_damaged_filter_key_fails_open_and_writes_go_on(path):
    """A FILTER_KEY of the wrong length is like a lost one: slower reads, never wrong,
    and the database keeps accepting writes and flushes."""
    build(path)
    with open(os.path.join(path, SECRET_NAME), "r+b") as f:
        f.truncate(16)
    with lsmdb.open(path, auto_compaction=False) as db:
        keyed = db.table("keyed")
        assert db.sstables("keyed")[0].filter_error
        for i in range(0, N_KEYS, 5):
            assert keyed.get(user_key(i)) == user_value(i)
        keyed.put(b"user:999997", b"after the damage")
        db.flush("keyed")
        db.alter_table("keyed", memtable_size_bytes=4096)
        for j in range(200):  # memtable-full flushes from put
            keyed.put(b"user:5%05d" % j, b"x" * 40)
    with lsmdb.open(path, auto_compaction=False) as db:
        keyed = db.table("keyed")
        assert keyed.get(b"user:999997") == b"after the damage"
        assert all(keyed.get(b"user:5%05d" % j) == b"x" * 40 for j in range(200))
        for i in range(0, N_KEYS, 5):
            assert keyed.get(user_key(i)) == user_value(i)


@pytest.mark.parametrize("kind", ["directory", "fifo", "unreadable"])
def test_a_filter_key_that_cannot_be_read_fails_open_and_never_blocks_an_open(path, kind,
                                                                              monkeypatch):
    """FILTER_KEY a directory, a FIFO, or a file whose read fails: keyed filters
    fail open, and read-write opens, read-only opens, verify and repair all go on."""
    build(path)
    secret_path = os.path.join(path, SECRET_NAME)
    secret = read_secret(path)
    os.unlink(secret_path)
    if kind == "directory":
        os.mkdir(secret_path)
    elif kind == "fifo":
        os.mkfifo(secret_path)
    else:
        with open(secret_path, "wb") as f:
            f.write(secret)
        real_read = lsmdb.secret.read_file

        def failing_read(p: str) -> bytes:
            if os.path.basename(p) == SECRET_NAME:
                raise PermissionError(13, "Permission denied", p)
            return real_read(p)
        monkeypatch.setattr(lsmdb.secret, "read_file", failing_read)
    with lsmdb.open(path, read_only=True) as db:
        info, = db.sstables("keyed")
        assert info.filter_error
        assert all(db.table("keyed").get(user_key(i)) == user_value(i)
                   for i in range(0, N_KEYS, 7))
    problems = [p for p in verify_database(path) if p.severity == "error"]
    assert [p.path for p in problems] == [info.path]  # the filter that fails open
    assert lsmdb.repair.repair_database(path, dry_run=True) is not None
    with lsmdb.open(path, auto_compaction=False) as db:
        keyed = db.table("keyed")
        assert db.sstables("keyed")[0].filter_error
        assert all(keyed.get(user_key(i)) == user_value(i) for i in range(0, N_KEYS, 7))
        keyed.put(b"user:999996", b"after")
        db.flush("keyed")  # a new secret for the new file; the old one kept aside
        newest, oldest = db.sstables("keyed")
        assert newest.filter_error is None and oldest.filter_error
    assert os.path.isfile(secret_path) and not os.path.islink(secret_path)
    kept = [n for n in os.listdir(path) if n.startswith(SECRET_NAME + ".")]
    kept += os.listdir(os.path.join(path, "lost")) if os.path.isdir(
        os.path.join(path, "lost")) else []
    assert any(n.startswith(SECRET_NAME) for n in kept)  # the old one is never deleted
    with lsmdb.open(path) as db:
        assert db.table("keyed").get(b"user:999996") == b"after"


# --------------------------------------------------------------------------- cost

def test_report_the_cost_of_each_hash(path):
    """Measured and printed, not asserted: the price of keyed hashing per lookup."""
    build(path)
    keys = [b"user:%06d#probe" % i for i in range(20000)]
    keyed_fn = keyed_hasher(b"s" * 32).fn

    def per_call(fn, items) -> float:
        best = math.inf
        for _round in range(3):
            t0 = time.perf_counter()
            for k in items:
                fn(k)
            best = min(best, (time.perf_counter() - t0) / len(items))
        return best

    fast_hash = per_call(key_hash, keys)
    keyed_hash = per_call(keyed_fn, keys)
    with lsmdb.open(path, auto_compaction=False) as db:
        fast_get = per_call(db.table("fast").get, keys[:5000])
        keyed_get = per_call(db.table("keyed").get, keys[:5000])
    print(f"\nhash per key: xxh3_64 {fast_hash * 1e6:.2f} us, blake2b keyed "
          f"{keyed_hash * 1e6:.2f} us (+{(keyed_hash - fast_hash) * 1e6:.2f} us)")
    print(f"get of an absent key: fast table {fast_get * 1e6:.2f} us, keyed table "
          f"{keyed_get * 1e6:.2f} us")
    assert fast_hash > 0 and keyed_hash > 0


def test_a_secret_an_open_could_not_read_is_kept_not_replaced(path, monkeypatch):
    """An I/O error reading FILTER_KEY at open leaves the database without it for
    a while (keyed filters fail open); the next file written needs it and reads
    it again: the same secret, never a new one that would leave every filter
    built before failing open for good.  A transient error at that point is
    raised (the flush fails and is retried), not taken for damage."""
    import errno

    db = lsmdb.open(path)
    db.create_table("k", bloom_filter_hash="keyed")
    db.table("k").put(b"a", b"1")
    db.flush()
    db.close()
    with open(os.path.join(path, SECRET_NAME), "rb") as f:
        before = f.read()
    real = lsmdb.secret.read_file
    fail = {"n": 1}

    def flaky(p: str) -> bytes:
        if p.endswith(SECRET_NAME) and fail["n"]:
            fail["n"] -= 1
            raise OSError(errno.EIO, "injected: a transient read error")
        return real(p)

    monkeypatch.setattr(lsmdb.secret, "read_file", flaky)
    db = lsmdb.open(path, auto_compaction=False)
    assert db._versions.keyed is None  # the open could not read it
    fail["n"] = 1
    db.table("k").put(b"b", b"2")
    with pytest.raises(OSError, match="transient"):
        db.flush("k")  # the secret could not be read again: nothing replaced
    db.flush("k")
    db.close()
    with open(os.path.join(path, SECRET_NAME), "rb") as f:
        assert f.read() == before
    assert not os.path.exists(os.path.join(path, SECRET_NAME + ".damaged"))
    assert [p for p in verify_database(path) if p.severity == "error"] == []
