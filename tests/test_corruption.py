"""Corruption never yields a wrong answer.

Every region of every file kind is damaged in turn -- SSTable data blocks,
index, filter, properties and footer; WAL records; the manifest; the
counters file -- by flipping bytes and by truncating, and the database is
reopened each time.  What may happen:

* ``lsmdb.CorruptionError`` naming the damaged file (``.path``) and the start
  of the damaged region (``.offset``) -- at open (footer, index, properties,
  manifest, any record of a WAL segment closed with the database) or at the
  read that touches the damaged data block;
* for a filter only: the filter fails open ("maybe"), every read stays
  correct, and ``verify_database`` reports the file;
* in the live WAL segment of a database that crashed, for damage with no
  whole WAL block after it: the records from there on are dropped as a torn
  tail (a crash cuts the last writes short in just that way).

What must never happen: a get returning a value other than the one written,
a get answering "absent" for a key that is present (a deleted key must not
resurface from an older file either), or a failed open deleting files.

Reopening a database costs a few fsyncs, so the working directories live on
tmpfs when there is one; the positions flipped in large regions are a fixed
random sample plus every boundary byte, so every region is covered.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import tempfile

import pytest

import lsmdb
from lsmdb.manifest import MANIFEST_HEADER, MANIFEST_NAME, Manifest
from lsmdb.sstable_format import BLOCK_TRAILER_SIZE, FOOTER_SIZE
from lsmdb.sstable_reader import SSTableReader
from lsmdb.stats import STATS_NAME
from lsmdb.verify import verify_database
from lsmdb.wal import read_segment_file

TABLE = "t"
OPTS = {"block_size_bytes": 256, "bloom_filter_fp_chance": 0.01}
# Interior bytes flipped per region, besides its boundary bytes (there are a
# dozen data blocks per file, so fewer per block).
SAMPLE_PER_REGION = {"data": 6, "index": 24, "filter": 24, "props": 24, "footer": 24}
MASKS = (0xFF, 0x01, 0x80, 0x10, 0x5A)


# --------------------------------------------------------------------------- helpers

def _scratch_root() -> str | None:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


@pytest.fixture(scope="module")
def scratch():
    """A directory for this module's databases (tmpfs when available: no fsync cost)."""
    d = tempfile.mkdtemp(prefix="lsmdb-corruption-", dir=_scratch_root())
    yield d
    shutil.rmtree(d, ignore_errors=True)


def key(i: int) -> bytes:
    return b"key%05d" % i


def digest(path: str) -> dict[str, str]:
    """File name -> sha256 of its contents, for every file of a directory."""
    out = {}
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def flip(path: str, pos: int, mask: int) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        assert len(b) == 1
        f.seek(pos)
        f.write(bytes([b[0] ^ mask]))


def truncate(path: str, length: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(length)


def fresh_copy(pristine: str, scratch: str) -> str:
    case = os.path.join(scratch, "case")
    if os.path.exists(case):
        shutil.rmtree(case)
    shutil.copytree(pristine, case)
    return case


def error_problems(dbpath: str, file_path: str) -> list:
    return [p for p in verify_database(dbpath)
            if p.severity == "error" and os.path.abspath(p.path) == os.path.abspath(file_path)]


def sst_regions(path: str) -> list[tuple[str, int, int]]:
    """(kind, start, end) of every region of an SSTable; they tile the file exactly."""
    r = SSTableReader(path)
    try:
        regions = [("data", off, off + size + r.data_trailer)
                   for off, size in zip(r.index_offsets, r.index_sizes, strict=True)]
        for kind, (off, size) in (("index", r.index_handle), ("filter", r.filter_handle),
                                  ("props", r.props_handle)):
            regions.append((kind, off, off + size + BLOCK_TRAILER_SIZE))
        regions.append(("footer", r.size_bytes - FOOTER_SIZE, r.size_bytes))
        regions.sort(key=lambda reg: reg[1])
        # The sample below covers every region only if these are all of the file.
        assert regions[0][1] == 0 and regions[-1][2] == r.size_bytes
        assert all(a[2] == b[1] for a, b in zip(regions, regions[1:], strict=False))
        return regions
    finally:
        r.close()


def positions(kind: str, start: int, end: int) -> list[int]:
    """Boundary bytes of a region plus a fixed random sample of its interior."""
    chosen = {start, start + 1, end - 1}
    if kind == "footer":
        chosen.update(start + off for off in range(0, FOOTER_SIZE, 4))  # every field
    else:
        chosen.update(range(end - BLOCK_TRAILER_SIZE - 1, end))  # last payload byte + crc
    rng = random.Random(f"{kind}:{start}:{end}")
    interior = list(range(start, end))
    chosen.update(rng.sample(interior, min(SAMPLE_PER_REGION[kind], len(interior))))
    return sorted(p for p in chosen if start <= p < end)


# --------------------------------------------------------------------------- the database

class Layout:
    """A database whose table ``t`` has two SSTables of overlapping keys.

    The older file holds key 0..199 with "old" values; the newer one
    overwrites the even keys (every tenth with a tombstone) and adds 200..259.
    So a damaged newer file could serve a stale value from the older file or
    let a deleted key resurface, and a damaged older file could lose the odd
    keys -- all of which the checks below would see.
    """

    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, "pristine")
        self.expected: dict[bytes, bytes | None] = {}
        db = lsmdb.open(self.path, auto_compaction=False)
        try:
            t = db.create_table(TABLE, **OPTS)
            db.put(b"default-key", b"default-value")
            for i in range(200):
                self._put(t, i, b"old-%05d-" % i + b"o" * (i % 13))
            t.flush()
            for i in range(0, 200, 2):
                if i % 10 == 0:
                    t.delete(key(i))
                    self.expected[key(i)] = None
                else:
                    self._put(t, i, b"new-%05d-" % i + b"n" * (i % 7))
            for i in range(200, 260):
                self._put(t, i, b"new-%05d-" % i)
            t.flush()
            db.flush()
            infos = db.sstables(TABLE)
            assert len(infos) == 2 and infos[0].entries == 160  # newest first
            self.newest, self.oldest = infos[0].file, infos[1].file
        finally:
            db.close()
        self.live = {k: v for k, v in self.expected.items() if v is not None}
        self.block_keys: dict[str, list[list[bytes]]] = {}
        for name in (self.newest, self.oldest):
            r = SSTableReader(os.path.join(self.path, name))
            try:
                self.block_keys[name] = [r.read_block(i)[0]
                                         for i in range(len(r.index_keys))]
            finally:
                r.close()
        self.newest_keys = {k for block in self.block_keys[self.newest] for k in block}

    def _put(self, t: lsmdb.Table, i: int, value: bytes) -> None:
        t.put(key(i), value)
        self.expected[key(i)] = value

    def keys_that_must_fail(self, name: str, region: tuple[str, int, int]) -> set[bytes]:
        """Keys whose get can only be answered by reading the damaged data block."""
        kind, start, _end = region
        if kind != "data":
            return set()
        r = SSTableReader(os.path.join(self.path, name))
        try:
            i = r.index_offsets.index(start)
        finally:
            r.close()
        keys = set(self.block_keys[name][i])
        return keys if name == self.newest else keys - self.newest_keys


@pytest.fixture(scope="module")
def layout(scratch):
    return Layout(scratch)


def check_all_reads(db: lsmdb.DB, layout: Layout, damaged: str,
                    region_start: int) -> set[bytes]:
    """Get every key and scan: right answers or CorruptionError; returns the keys that failed."""
    t = db.table(TABLE)
    failed = set()
    for k, want in layout.expected.items():
        try:
            got = t.get(k)
        except lsmdb.CorruptionError as exc:
            assert exc.path == damaged and exc.offset == region_start, (k, exc)
            failed.add(k)
            continue
        assert got == want, f"get({k!r}) returned {got!r}, wrote {want!r}"
    for reverse in (False, True):
        try:
            got = list(t.scan(reverse=reverse))
        except lsmdb.CorruptionError as exc:
            assert exc.path == damaged and exc.offset == region_start, exc
            continue
        assert got == sorted(layout.live.items(), reverse=reverse)
    assert db.get(b"default-key") == b"default-value"
    return failed


# --------------------------------------------------------------------------- SSTables: flips

@pytest.mark.parametrize("which", ["newest", "oldest"])
@pytest.mark.parametrize("kind", ["data", "index", "filter", "props", "footer"])
def test_flipped_sstable_byte_never_gives_a_wrong_answer(layout, scratch, which, kind):
    name = getattr(layout, which)
    pristine_file = os.path.join(layout.path, name)
    regions = [r for r in sst_regions(pristine_file) if r[0] == kind]
    assert regions
    cases = 0
    for region in regions:
        _kind, start, end = region
        must_fail = layout.keys_that_must_fail(name, region)
        for n, pos in enumerate(positions(kind, start, end)):
            mask = MASKS[(pos + n) % len(MASKS)]
            case = fresh_copy(layout.path, scratch)
            damaged = os.path.join(case, name)
            flip(damaged, pos, mask)
            before = digest(case)
            cases += 1
            try:
                db = lsmdb.open(case, auto_compaction=False)
            except lsmdb.CorruptionError as exc:
                # Only what open reads may fail it: footer, index, properties.
                assert kind in ("index", "props", "footer"), (pos, exc)
                assert exc.path == damaged and exc.offset == start, (pos, exc)
                assert digest(case) == before, "a failed open changed the directory"
                assert error_problems(case, damaged), pos
                continue
            assert kind in ("data", "filter"), f"flip at {pos} of the {kind} went unnoticed"
            try:
                failed = check_all_reads(db, layout, damaged, start)
                infos = {i.file: i for i in db.sstables(TABLE)}
            finally:
                db.close()
            if kind == "filter":
                # Fails open: slower, never wrong, and reported.
                assert not failed, (pos, failed)
                assert infos[name].filter_error, pos
            else:
                assert must_fail <= failed, (pos, must_fail - failed)
            assert error_problems(case, damaged), f"verify missed the flip at {pos}"
    assert cases >= len(regions) * 5


def test_flipped_filter_of_a_read_only_open_fails_open(layout, scratch):
    """The read-only open path makes the same choice as the writer's."""
    name = layout.newest
    (_kind, start, end), = [r for r in sst_regions(os.path.join(layout.path, name))
                            if r[0] == "filter"]
    for pos in (start, (start + end) // 2, end - 1):
        case = fresh_copy(layout.path, scratch)
        flip(os.path.join(case, name), pos, 0xFF)
        with lsmdb.open(case, read_only=True) as db:
            assert check_all_reads(db, layout, os.path.join(case, name), start) == set()


def test_damaged_data_block_is_reported_not_served_from_an_older_file(layout, scratch):
    """The classic bug: an exception swallowed as "not here" serves the older value."""
    name = layout.newest
    case = fresh_copy(layout.path, scratch)
    damaged = os.path.join(case, name)
    data_regions = [r for r in sst_regions(damaged) if r[0] == "data"]
    for _kind, start, _end in data_regions:
        flip(damaged, start + 3, 0x01)
    with lsmdb.open(case, auto_compaction=False) as db:
        t = db.table(TABLE)
        overwritten = [key(i) for i in range(2, 200, 2) if i % 10]
        deleted = [key(i) for i in range(0, 200, 10)]
        for k in overwritten + deleted:
            with pytest.raises(lsmdb.CorruptionError) as info:
                t.get(k)
            assert info.value.path == damaged
            assert info.value.offset in {r[1] for r in data_regions}
        with pytest.raises(lsmdb.CorruptionError):
            list(t.scan())


# --------------------------------------------------------------------------- SSTables: truncation

def test_truncated_sstable_is_corruption_at_open(layout, scratch):
    for name in (layout.newest, layout.oldest):
        size = os.path.getsize(os.path.join(layout.path, name))
        lengths = {0, 1, 7, 8, FOOTER_SIZE - 1, FOOTER_SIZE, FOOTER_SIZE + 1,
                   size - FOOTER_SIZE - 1, size - FOOTER_SIZE, size - FOOTER_SIZE + 1,
                   size - 9, size - 8, size - 1}
        lengths.update(start for _k, start, _e in sst_regions(os.path.join(layout.path, name)))
        lengths.update(random.Random(name).sample(range(size), 12))
        for length in sorted(n for n in lengths if 0 <= n < size):
            case = fresh_copy(layout.path, scratch)
            damaged = os.path.join(case, name)
            truncate(damaged, length)
            before = digest(case)
            # A read-only open retries for a second (racing a writer's compaction),
            # so it is tried on one length per file only.
            for read_only in (False, True) if length == FOOTER_SIZE else (False,):
                with pytest.raises(lsmdb.CorruptionError) as info:
                    lsmdb.open(case, read_only=read_only, auto_compaction=False)
                assert info.value.path == damaged, length
                assert info.value.offset is not None and 0 <= info.value.offset <= length
                assert digest(case) == before
            assert error_problems(case, damaged)


def test_missing_sstable_is_corruption_and_nothing_is_deleted(layout, scratch):
    case = fresh_copy(layout.path, scratch)
    os.unlink(os.path.join(case, layout.oldest))
    before = digest(case)
    with pytest.raises(lsmdb.CorruptionError) as info:
        lsmdb.open(case)
    assert info.value.path == os.path.join(case, layout.oldest)
    assert digest(case) == before


# --------------------------------------------------------------------------- manifest

def test_flipped_manifest_byte_fails_open_and_deletes_nothing(layout, scratch):
    manifest = os.path.join(layout.path, MANIFEST_NAME)
    size = os.path.getsize(manifest)
    version_field = range(8, 12)  # magic u64 (8) | format_version u32 | crc | length
    for pos in range(size):
        for mask in (0xFF, 0x01) if pos < MANIFEST_HEADER.size or pos % 3 == 0 else (0x80,):
            case = fresh_copy(layout.path, scratch)
            damaged = os.path.join(case, MANIFEST_NAME)
            flip(damaged, pos, mask)
            before = digest(case)
            for read_only in (False, True):
                try:
                    db = lsmdb.open(case, read_only=read_only)
                except lsmdb.CorruptionError as exc:
                    assert exc.path == damaged and exc.offset is not None, (pos, exc)
                    assert 0 <= exc.offset < size
                except lsmdb.UnsupportedFormatError:
                    # The version field is outside the checksum: a changed value
                    # reads as "a newer lsmdb wrote this" -- refused just the same.
                    assert pos in version_field, pos
                else:
                    db.close()
                    pytest.fail(f"manifest flip at {pos} (mask {mask:#x}) went unnoticed")
                assert digest(case) == before, f"failed open at manifest flip {pos} changed files"
            problems = verify_database(case)
            assert any(p.severity == "error" for p in problems), pos


def test_truncated_or_empty_manifest_fails_open_and_deletes_nothing(layout, scratch):
    size = os.path.getsize(os.path.join(layout.path, MANIFEST_NAME))
    for length in range(size):
        case = fresh_copy(layout.path, scratch)
        damaged = os.path.join(case, MANIFEST_NAME)
        truncate(damaged, length)
        before = digest(case)
        with pytest.raises(lsmdb.CorruptionError) as info:
            lsmdb.open(case)
        assert info.value.path == damaged and info.value.offset is not None
        assert digest(case) == before, length


def test_missing_manifest_beside_data_is_not_a_database(layout, scratch):
    """Without a manifest the directory is refused -- never re-created empty and swept."""
    case = fresh_copy(layout.path, scratch)
    os.unlink(os.path.join(case, MANIFEST_NAME))
    before = digest(case)
    for read_only in (False, True):
        with pytest.raises(lsmdb.NotADatabaseError):
            lsmdb.open(case, read_only=read_only)
        assert digest(case) == before


def test_checksum_valid_manifest_with_a_bad_payload_deletes_nothing(layout, scratch):
    """Structure errors behind a correct checksum are corruption too (never "empty")."""
    import msgpack

    from lsmdb.coding import crc32
    from lsmdb.manifest import MANIFEST_FORMAT_VERSION, MANIFEST_MAGIC

    payloads = [
        msgpack.packb({"next_file_number": 1, "next_table_id": 2, "last_seq": 0, "tables": {}}),
        msgpack.packb({"next_file_number": 1}),
        msgpack.packb([1, 2, 3]),
        b"\xc1",  # never used by msgpack
        msgpack.packb({"next_file_number": 1, "next_table_id": 2, "last_seq": 0,
                       "tables": {"default": {"id": 1, "options": {"block_size_bytes": 3},
                                              "flushed_seq": 0, "files": []}}}),
    ]
    for payload in payloads:
        case = fresh_copy(layout.path, scratch)
        with open(os.path.join(case, MANIFEST_NAME), "wb") as f:
            f.write(MANIFEST_HEADER.pack(MANIFEST_MAGIC, MANIFEST_FORMAT_VERSION, crc32(payload),
                                         len(payload)) + payload)
        before = digest(case)
        with pytest.raises(lsmdb.CorruptionError) as info:
            lsmdb.open(case)
        assert info.value.path == os.path.join(case, MANIFEST_NAME), payload
        assert digest(case) == before, payload


# --------------------------------------------------------------------------- WAL

class WalLayout:
    """A database whose data is only in one WAL segment (nothing flushed):
    closed cleanly (the segment sealed, its size in the manifest), or, with
    ``crashed``, copied while still open (its live segment)."""

    def __init__(self, root: str, crashed: bool) -> None:
        self.path = os.path.join(root, "wal-crashed" if crashed else "wal-closed")
        self.ops: list[list[tuple[str, bytes, bytes | None]]] = []
        live = self.path + ("-live" if crashed else "")
        db = lsmdb.open(live, auto_compaction=False)
        try:
            db.create_table(TABLE)
            for i in range(10):
                op = ("default" if i % 3 else TABLE, b"w%02d" % i, b"value-%d-" % i + b"v" * i)
                db.table(op[0]).put(op[1], op[2])
                self.ops.append([op])
            db.delete(b"w01")
            self.ops.append([("default", b"w01", None)])
            with db.batch() as b:
                b.put(b"w00", b"batched", table=TABLE)
                b.put(b"w02", b"batched")
                b.delete(b"w04")
            self.ops.append([(TABLE, b"w00", b"batched"), ("default", b"w02", b"batched"),
                             ("default", b"w04", None)])
            db.put(b"last", b"the last record")
            self.ops.append([("default", b"last", b"the last record")])
            if crashed:
                db.sync()
                shutil.copytree(live, self.path)
        finally:
            db.close()
        wal = Manifest.read(os.path.join(self.path, MANIFEST_NAME)).wal
        assert wal is not None
        number, closed_size = (wal.live, None) if crashed else wal.closed[0][:2]
        assert number is not None
        self.wal = f"wal-{number:06d}.log"
        assert not [n for n in os.listdir(self.path) if n.endswith(".sst")]
        result = read_segment_file(os.path.join(self.path, self.wal), number, closed_size)
        self.starts = [off for off, _payload in result.records]
        self.size = result.valid_length
        assert len(self.starts) == len(self.ops) and not result.torn
        self.keys = sorted({(t, k) for ops in self.ops for t, k, _v in ops})

    def state_after(self, n_records: int) -> dict[tuple[str, bytes], bytes | None]:
        state: dict[tuple[str, bytes], bytes | None] = {tk: None for tk in self.keys}
        for ops in self.ops[:n_records]:
            for t, k, v in ops:
                state[(t, k)] = v
        return state

    def record_at(self, pos: int) -> int:
        """Index of the record holding byte ``pos``."""
        return max(i for i, s in enumerate(self.starts) if s <= pos)


@pytest.fixture(scope="module")
def wal_closed(scratch):
    return WalLayout(scratch, crashed=False)


@pytest.fixture(scope="module")
def wal_crashed(scratch):
    return WalLayout(scratch, crashed=True)


def assert_state(db: lsmdb.DB, expected: dict[tuple[str, bytes], bytes | None]) -> None:
    for (t, k), want in expected.items():
        assert db.table(t).get(k) == want, (t, k)
    for t in ("default", TABLE):
        live = sorted((k, v) for (tt, k), v in expected.items() if tt == t and v is not None)
        assert list(db.table(t).scan()) == live


def test_flipped_byte_of_a_closed_wal_segment_is_corruption_at_open(wal_closed, scratch):
    """Every byte, the header and the last record included: a sealed segment was
    fsynced whole, so no damage in it can be a torn write."""
    layout = wal_closed
    for pos in range(layout.size):
        mask = MASKS[pos % len(MASKS)]
        case = fresh_copy(layout.path, scratch)
        damaged = os.path.join(case, layout.wal)
        flip(damaged, pos, mask)
        before = digest(case)
        for read_only in (False, True) if pos % 4 == 0 else (False,):
            with pytest.raises(lsmdb.CorruptionError) as info:
                lsmdb.open(case, read_only=read_only)
            assert info.value.path == damaged, pos
            want = 0 if pos < layout.starts[0] else layout.starts[layout.record_at(pos)]
            assert info.value.offset == want, pos
            assert digest(case) == before, f"failed open at WAL flip {pos} changed files"


def test_truncated_closed_wal_segment_is_corruption_at_open(wal_closed, scratch):
    layout = wal_closed
    for length in sorted({0, 5, 16, *layout.starts, layout.size - 1,
                          *random.Random(2).sample(range(layout.size), 10)}):
        case = fresh_copy(layout.path, scratch)
        truncate(os.path.join(case, layout.wal), length)
        before = digest(case)
        with pytest.raises(lsmdb.CorruptionError):
            lsmdb.open(case)
        assert digest(case) == before


def test_flipped_byte_in_the_live_segment_drops_the_records_from_there(wal_crashed, scratch):
    """A one-block live segment: damage cannot be told from a torn write, and
    every record from the damaged one on is dropped -- never served wrongly."""
    layout = wal_crashed
    for pos in range(layout.starts[0], layout.size):
        case = fresh_copy(layout.path, scratch)
        flip(os.path.join(case, layout.wal), pos, MASKS[pos % len(MASKS)])
        with lsmdb.open(case) as db:
            assert_state(db, layout.state_after(layout.record_at(pos)))


def test_truncated_live_segment_drops_only_the_torn_tail(wal_crashed, scratch):
    layout = wal_crashed
    ends = layout.starts[1:] + [layout.size]
    lengths = set(range(layout.starts[-2], layout.size + 1))
    for s in layout.starts + [layout.size]:
        lengths.update((s - 1, s, s + 1, s + 8))
    lengths.update(random.Random(1).sample(range(layout.size), 30))
    for length in sorted(n for n in lengths if 0 <= n <= layout.size):
        complete = sum(1 for e in ends if e <= length)
        expected = layout.state_after(complete)
        case = fresh_copy(layout.path, scratch)
        wal = os.path.join(case, layout.wal)
        truncate(wal, length)
        with lsmdb.open(case, read_only=True) as db:  # reads it, changes nothing
            assert_state(db, expected)
        assert os.path.getsize(wal) == length
        with lsmdb.open(case) as db:
            assert_state(db, expected)
            db.put(b"after-recovery", b"x")
        assert not [p for p in verify_database(case) if p.severity == "error"]
        with lsmdb.open(case) as db:
            assert db.get(b"after-recovery") == b"x"
            db.delete(b"after-recovery")
            assert_state(db, expected)


# --------------------------------------------------------------------------- counters

def test_damaged_stats_file_is_ignored_not_fatal(layout, scratch):
    """Counters are statistics: a bad STATS file restarts them, data is untouched."""
    size = os.path.getsize(os.path.join(layout.path, STATS_NAME))
    for pos in sorted({0, 8, 12, 16, 20, size // 2, size - 1}):
        case = fresh_copy(layout.path, scratch)
        flip(os.path.join(case, STATS_NAME), pos, 0xFF)
        problems = verify_database(case)
        assert not [p for p in problems if p.severity == "error"], problems
        assert [p for p in problems if p.path.endswith(STATS_NAME)]
        with lsmdb.open(case, auto_compaction=False) as db:
            assert check_all_reads(db, layout, "", -1) == set()
