"""LZ4 blocks in pieces against the file's dictionary (block type 3,
docs/FORMAT.md §4.1): when a file gets a dictionary, where its pieces begin,
that both read paths answer every get from them as a whole read would, and
that a block whose pieces are not what its table says is refused wherever it
is read whole."""

from __future__ import annotations

import os
import random
from itertools import pairwise

import lz4.block
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import lsmdb
import lsmdb.readpath
from lsmdb import block as blk
from lsmdb import compression
from lsmdb.coding import crc32
from lsmdb.sstable_reader import SSTableReader
from lsmdb.sstable_writer import write_sstable
from lsmdb.verify import verify_database

from .test_format2 import records


def _types(reader: SSTableReader) -> set[int]:
    return {reader.read_raw(i)[-5] for i in range(len(reader.index_keys))}


def test_varints_round_trip_and_refuse_what_runs_past():
    for n in (0, 1, 127, 128, 300, 16383, 16384, 2**28 - 1, 2**32 - 1):
        data = compression._varint(n)
        assert compression._read_varint(data + b"\x07", 0) == (n, len(data))
    with pytest.raises(ValueError):
        compression._read_varint(b"\x80\x80", 0)
    with pytest.raises(ValueError):
        compression._read_varint(b"\xff" * 6, 0)  # longer than 32 bits take


def test_a_small_lz4_file_keeps_whole_blocks_and_a_large_one_gets_a_dictionary(tmp_path):
    """Below DICT_BLOCKS data blocks an lz4 file's blocks are whole LZ4 blocks
    (type 1) and it records no dictionary; at DICT_BLOCKS and beyond every block
    is stored in pieces (type 3) against the dictionary its properties carry,
    excerpts of its first blocks' values, and the file is smaller for it."""
    items = records(3000)
    sizes = {}
    for n in (300, 3000):
        path = str(tmp_path / f"{n}.sst")
        props = write_sstable(path, items[:n], fp_chance=0.01, block_size=4096,
                              compression="lz4")
        r = SSTableReader(path, 0)
        blocks = len(r.index_keys)
        if blocks < compression.DICT_BLOCKS:
            assert _types(r) == {compression.LZ4} and r.compression_dict is None
            assert "compression_dict" not in props
        else:
            assert _types(r) == {compression.LZ4_PIECES}
            d = r.compression_dict
            assert d is not None and props["compression_dict"] == d
            assert 0 < len(d) <= compression.DICT_SAMPLES * compression.DICT_EXCERPT
            first = bytes(r.payload_of(0, r.read_raw(0)))
            keys_end, _starts = blk.payload_value_starts(first)
            assert d.startswith(first[keys_end:keys_end + compression.DICT_EXCERPT])
        got = [kv for i in range(blocks) for kv in zip(*r.read_block(i), strict=True)]
        assert got == items[:n]
        sizes[n] = (blocks, r.size_bytes)
        r.close()
    assert sizes[300][0] < compression.DICT_BLOCKS <= sizes[3000][0]
    # the same entries without the dictionary (whole LZ4 blocks) take more room
    plain = write_sstable(str(tmp_path / "plain.sst"), items, fp_chance=0.01, block_size=4096,
                          compression="none")
    assert sizes[3000][1] < 0.5 * plain["size_bytes"]


def test_pieces_begin_where_the_keys_end_and_at_values(tmp_path):
    """Every type-3 block's table names pieces that begin at the keys array's end
    and then at values (cut_pieces of where its values begin), each value piece
    but the last PIECE_BYTES or more; each piece decompresses on its own against
    the dictionary, and together they are the payload."""
    rng = random.Random(3)
    words = [b"alpha", b"beta", b"gamma", b"delta", b"%d" % rng.randrange(10**6)]
    items = [(b"k%07d" % i, None if i % 17 == 0 else
              b" ".join(rng.choice(words) for _ in range(rng.choice([1, 15, 170]))))
             for i in range(6000)]
    path = str(tmp_path / "f.sst")
    write_sstable(path, items, fp_chance=1.0, block_size=4096, compression="lz4")
    r = SSTableReader(path, 0)
    d = r.compression_dict
    assert d is not None and _types(r) == {compression.LZ4_PIECES}
    many = 0
    for i in range(len(r.index_keys)):
        stored = bytes(r.read_raw(i)[:-5])
        payload = bytes(r.payload_of(i, r.read_raw(i)))
        plen, sizes, firsts, at = compression.piece_table(stored)
        assert plen == len(payload)
        keys_end, starts = blk.payload_value_starts(payload)
        begins, want_firsts = compression.cut_pieces(keys_end, starts)
        assert firsts == want_firsts and len(sizes) == len(begins)
        ends = begins[1:] + [plen]
        for k, size in enumerate(sizes):
            part = lz4.block.decompress(stored[at:at + size], uncompressed_size=plen, dict=d)
            assert part == payload[begins[k]:ends[k]]
            at += size
        assert all(b - a >= compression.PIECE_BYTES for a, b in pairwise(begins[1:]))
        many += len(sizes) > 3
    assert many > 0
    r.close()


def _handovers(monkeypatch) -> list[list[bytes]]:
    """The keys of every block the C getter hands to the Python side, from now on."""
    handed: list[list[bytes]] = []
    real = lsmdb.readpath._c_blocks
    monkeypatch.setattr(lsmdb.readpath, "_c_blocks",
                        lambda fast, f, ks: handed.append(list(ks)) or real(fast, f, ks))
    return handed


def _pieces_db(path: str, entries: dict[bytes, bytes | None], block_size: int) -> None:
    """A database whose default table (lz4, no filter: every get reads a block)
    holds ``entries`` in one compacted file (compacted in this process, whose
    DICT_BLOCKS a test may have set)."""
    with lsmdb.open(path, auto_compaction=False, compaction_process=False) as db:
        db.alter_table("default", bloom_filter_fp_chance=1.0, block_size_bytes=block_size,
                       compression="lz4")
        with db.batch() as b:
            for k, v in entries.items():
                if v is None:
                    b.delete(k)
                else:
                    b.put(k, v)
        db.put(b"\x00", b"older")  # an older file holds a value the tombstones hide
        db.flush()
        for k, v in entries.items():
            if v is None:
                db.delete(k)
        db.compact()


def _value(rng: random.Random, kinds: list[str]) -> bytes | None:
    kind = rng.choice(kinds)
    if kind == "tombstone":
        return None
    if kind == "big":  # more than the room after the dictionary: read whole
        return b"x" * 20000 if rng.random() < 0.5 else bytes(range(256)) * 90
    size = {"empty": 0, "small": rng.randrange(1, 40), "mid": rng.randrange(150, 1200)}[kind]
    return b" ".join(rng.choice([b"red", b"green", b"%d" % rng.randrange(999)])
                     for _ in range(size // 4 + 1))[:size]


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(n=st.integers(100, 900), block_size=st.sampled_from([256, 512, 1024, 4096]),
       kinds=st.lists(st.sampled_from(["tombstone", "empty", "small", "mid", "big"]),
                      min_size=1, max_size=6).filter(lambda k: set(k) - {"tombstone"}),
       seed=st.integers(0, 2**16))
def test_gets_answer_from_pieces_as_a_whole_read_would(tmp_path_factory, impl, monkeypatch,
                                                       n, block_size, kinds, seed):
    """Random entries -- tombstones, empty, small, mid-size and values bigger
    than a piece's room -- compacted into type-3 blocks: with no block cache (so
    a get reads its keys piece, then its value's piece) every present key reads
    its value, every deleted and absent key None, on both read paths; C decides
    them without handing a block to the Python side, but for values too large
    for the room after the dictionary (read whole)."""
    monkeypatch.setattr(compression, "DICT_BLOCKS", 1)  # a dictionary for every file
    rng = random.Random(seed)
    values = [_value(rng, kinds) for _ in range(n)]
    assume(sum(v is not None for v in values) >= 20)
    keys = sorted(rng.sample(range(10**6), len(values)))
    entries = {b"user:%07d" % (2 * k + 1): v for k, v in zip(keys, values, strict=True)}
    path = str(tmp_path_factory.mktemp("pieces") / "db")
    _pieces_db(path, entries, block_size)
    handed = _handovers(monkeypatch)
    with lsmdb.open(path, auto_compaction=False, block_cache_size_bytes=0) as db:
        info = max(db.sstables(), key=lambda s: s.entries)
        reader = SSTableReader(info.path, 0)
        typed = _types(reader)
        reader.close()
        big = any(v is not None and len(v) > 16000 for v in values)
        for k, v in entries.items():
            assert db.get(k) == v
        for k in rng.sample(sorted(entries), 50):
            assert db.get(k[:-1] + b"0") is None  # between two keys: absent
        assert db.get(b"\x00") == b"older"
        assert compression.LZ4_PIECES in typed
        if not big and impl == "c":
            assert handed == []


def _rewrite_block(path: str, i: int, stored: bytes, kind: int) -> int:
    r = SSTableReader(path, 0)
    offset, size = r.index_offsets[i], r.index_sizes[i]
    r.close()
    assert len(stored) == size
    t = bytes([kind])
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(stored + t + crc32(t, crc32(stored)).to_bytes(4, "little"))
    return offset


def _lying_table_db(path: str) -> tuple[str, int, list[bytes], list[bytes], int]:
    """A database whose compacted file has a type-3 block of 3 pieces or more
    rewritten, its checksum right, with the entry its third piece begins with
    one further on than it is: (the file, the block's offset, its keys and
    values, how many of them its second and third pieces hold)."""
    items = records(3000)
    with lsmdb.open(path, auto_compaction=False) as db:
        db.alter_table("default", compression="lz4")
        with db.batch() as b:
            for k, v in items:
                b.put(k, v)
        db.compact()
        [info] = db.sstables()
    r = SSTableReader(info.path, 0)
    for i in range(len(r.index_keys)):
        stored = bytes(r.read_raw(i)[:-5])
        plen, sizes, firsts, at = compression.piece_table(stored)
        if len(sizes) >= 3 and firsts[1] + 1 < (firsts[2] if len(firsts) > 2 else 10**9) \
                and firsts[1] + 1 < 128 and firsts[1] < 127:
            keys, values = r.read_block(i)
            lied = firsts[2] if len(firsts) > 2 else len(keys)  # entries of pieces 1 and 2
            break
    else:
        pytest.fail("no block of three pieces")
    r.close()
    head = plen.to_bytes(4, "little") + compression._varint(len(sizes))
    head += b"".join(map(compression._varint, sizes))
    lying = [firsts[1] + 1] + firsts[2:]
    assert len(compression._varint(firsts[1])) == len(compression._varint(lying[0]))
    head += b"".join(map(compression._varint, lying))
    offset = _rewrite_block(info.path, i, head + stored[at:], compression.LZ4_PIECES)
    return info.path, offset, keys, values, lied


def test_a_block_whose_pieces_lie_is_refused_wherever_it_is_read_whole(tmp_path, impl):
    """A checksum-valid type-3 block whose table says a piece begins with
    another entry than it does: read whole -- a get the cache takes the block
    for, a scan, get_many, lsmdb verify -- it is CorruptionError at its offset
    on both read paths.  A get that reads the keys piece and the value's
    piece alone (no block cache) checks that the piece holds as many values
    as its table says: CorruptionError there too for the keys of the pieces
    the table lies about, the right value (or CorruptionError) for the
    others, never another key's value."""
    path = str(tmp_path / "db")
    file, offset, keys, values, lied = _lying_table_db(path)
    for cache in (None, 0):
        opts = {} if cache is None else {"block_cache_size_bytes": cache}
        with lsmdb.open(path, auto_compaction=False, **opts) as db:
            for n, key in enumerate(keys):
                if cache is None or n < lied:
                    with pytest.raises(lsmdb.CorruptionError) as exc:
                        db.get(key)
                    assert (exc.value.path, exc.value.offset) == (file, offset)
                else:  # a piece the table names right: its value, or refused
                    try:
                        assert db.get(key) == values[n]
                    except lsmdb.CorruptionError as exc:
                        assert (exc.path, exc.offset) == (file, offset)
            with pytest.raises(lsmdb.CorruptionError):
                db.get_many([keys[0]])
            with pytest.raises(lsmdb.CorruptionError):
                list(db.scan())
    problems = verify_database(path)
    assert any(p.offset == offset for p in problems), problems


def test_a_file_without_its_dictionary_is_corruption_not_an_answer(tmp_path, impl):
    """A type-3 block read where its file records no dictionary is a
    CorruptionError naming the file and the block's offset, on both paths."""
    path = str(tmp_path / "db")
    with lsmdb.open(path, auto_compaction=False) as db:
        db.alter_table("default", compression="lz4")
        with db.batch() as b:
            for k, v in records(3000):
                b.put(k, v)
        db.compact()
        [info] = db.sstables()
    with lsmdb.open(path, auto_compaction=False, block_cache_size_bytes=0) as db:
        reader = db._default_state.fast.files[0].reader
        assert reader.compression_dict is not None
        reader.compression_dict = None
        with pytest.raises(lsmdb.CorruptionError) as exc:
            db.get(b"user:%08d" % 5)
        assert exc.value.path == info.path and exc.value.offset == reader.index_offsets[0]


def test_piece_table_refuses_tables_that_do_not_add_up():
    keys = [b"key%04d" % i for i in range(40)]
    values = [b"value %d of a block whose values repeat " % i * 3 for i in range(40)]
    payload = blk.encode_data_payload(keys, values, blk.tags_for(values, 9))
    begins, firsts = compression.cut_pieces(*blk.payload_value_starts(payload))
    assert len(begins) >= 3
    kind, good = compression.compress_pieces(payload, begins, firsts, b"a dictionary")
    assert kind == compression.LZ4_PIECES
    plen, sizes, got_firsts, at = compression.piece_table(good)
    assert (plen, len(sizes), got_firsts) == (len(payload), len(begins), firsts)
    for bad in (good[:5], good[:-1], good + b"\x00", b"\x00\x00\x00\x00" + good[4:],
                good[:4] + b"\x01" + good[5:]):
        with pytest.raises(ValueError):
            compression.piece_table(bad)
    with pytest.raises(lsmdb.CorruptionError):
        compression.decompress_pieces(good, None, "f", 0)
    assert compression.decompress_pieces(good, b"a dictionary", "f", 0) == payload


needs_c = pytest.mark.skipif(compression._CPieceCompressor is None, reason="built without C")


@needs_c
@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(1, 80), dict_bytes=st.integers(1, 4000))
def test_c_pieces_are_the_python_pieces_byte_for_byte(seed, n, dict_bytes):
    """PieceCompressor (lsmdb/csrc/compression.c), which loads the dictionary
    once and copies the loaded stream for each piece, stores any format-2
    payload exactly as compress_pieces of cut_pieces does (python-lz4 loading
    the dictionary for every piece): the same type, the same bytes."""
    rng = random.Random(seed)
    keys = sorted({b"k%06d" % rng.randrange(10**6) for _ in range(n)})
    values = [None if rng.random() < 0.2 else
              b"".join(rng.choice([b"abc ", b"%d," % rng.randrange(99), b"\x00"])
                       for _ in range(rng.choice([0, 3, 60, 400]))) for _ in keys]
    payload = blk.encode_data_payload(keys, values, blk.tags_for(values, 5))
    d = rng.randbytes(dict_bytes // 2 + 1) + b"abc 1,abc 2," * (dict_bytes // 24)
    want = compression.compress_pieces(
        payload, *compression.cut_pieces(*blk.payload_value_starts(payload)), d)
    assert compression._CPieceCompressor(d).compress(payload) == want


@needs_c
def test_piece_compressor_refuses_what_it_cannot_store():
    with pytest.raises(ValueError):
        compression._CPieceCompressor(b"")
    with pytest.raises(ValueError):
        compression._CPieceCompressor(bytes(compression.MAX_DICT + 1))
    with pytest.raises(TypeError):
        compression._CPieceCompressor("a dictionary")  # type: ignore[arg-type]
    c = compression._CPieceCompressor(b"a dictionary")
    for bad in (b"", b"\x92\x91\xc4\x01a\x91\xc0", b"\x94\x91\xc4\x01a\x92\xc0"):
        with pytest.raises(ValueError):
            c.compress(bad)


def test_a_file_in_pieces_is_the_same_bytes_with_c_and_without(tmp_path, monkeypatch):
    """An lz4 file with a dictionary is byte for byte the same whether its
    pieces were compressed in C or in Python."""
    items = records(3000)
    files = []
    for use_c in {False, compression.USE_SPEEDUPS}:
        monkeypatch.setattr(compression, "USE_SPEEDUPS", use_c)
        path = str(tmp_path / f"{use_c}.sst")
        write_sstable(path, items, fp_chance=0.01, block_size=4096, compression="lz4")
        with open(path, "rb") as f:
            files.append(f.read())
    assert len(set(files)) == 1
    r = SSTableReader(str(tmp_path / "False.sst"), 0)
    assert _types(r) == {compression.LZ4_PIECES}
    r.close()


def test_lsmdb_sstable_shows_the_dictionary_by_its_size(tmp_path, lsmdb_cli):
    """``lsmdb sstable`` names a file's dictionary by its size, in its
    properties and its statistics, not by its bytes."""
    import json

    path = str(tmp_path / "000001.sst")
    write_sstable(path, records(3000), fp_chance=0.01, block_size=4096, compression="lz4")
    r = SSTableReader(path, 1)
    size = len(r.compression_dict or b"")
    r.close()
    assert size > 0
    out = lsmdb_cli("sstable", path, "--json")
    assert out.returncode == 0
    report = json.loads(out.stdout)
    assert report["properties"]["compression_dict_bytes"] == size
    assert "compression_dict" not in report["properties"]
    assert report["stats"]["compression_dict_bytes"] == size
    text = lsmdb_cli("sstable", path).stdout
    assert f"in pieces against a {size:,}-byte dictionary" in text


def test_a_file_with_a_dictionary_is_format_4_or_5(tmp_path):
    """A file stored in pieces records format 4 (format 2's layout with a
    dictionary), or 5 where it holds expiring values (format 3's), so that a
    reader of formats 2 and 3 refuses it as a newer format instead of reading
    its blocks as corrupt; a file without one stays 2 or 3.  Each reads back
    whole, expiring values with their expiries."""
    items = records(3000)
    expiring = [(k, (v, 2**50 + n) if n % 7 == 0 else v) for n, (k, v) in enumerate(items)]
    for name, entries, n, want in (("small", items[:300], 300, 2), ("plain", items, 3000, 4),
                                   ("ttl", expiring, 3000, 5)):
        path = str(tmp_path / f"{name}.sst")
        props = write_sstable(path, entries[:n], fp_chance=0.01, block_size=4096,
                              compression="lz4")
        r = SSTableReader(path, 0)
        assert props["format_version"] == r.file_version == want
        assert r.version == (3 if name == "ttl" else 2)  # the layout
        assert (r.compression_dict is not None) == (want >= 4)
        got = [kv for i in range(len(r.index_keys))
               for kv in zip(*r.decode_full(i, r.read_raw(i))[:2], strict=True)]
        assert got == entries[:n]
        r.close()


def test_an_unknown_format_version_is_unsupported_not_corrupt(tmp_path):
    import lsmdb.sstable_reader as sr

    path = str(tmp_path / "f.sst")
    write_sstable(path, records(3000), fp_chance=0.01, block_size=4096, compression="lz4")
    real = sr.READABLE_VERSIONS
    try:  # a reader of formats 1 to 3 alone (the release before dictionaries)
        sr.READABLE_VERSIONS = (1, 2, 3)
        with pytest.raises(lsmdb.UnsupportedFormatError):
            SSTableReader(path, 0)
    finally:
        sr.READABLE_VERSIONS = real


def test_split_outputs_are_cut_near_their_target(tmp_path):
    """Blocks held back for the dictionary count as they would be stored, so a
    compaction's outputs (add_chunk with max_file_bytes) are cut near their
    target size, not early, and large enough ones get a dictionary."""
    from lsmdb.sstable_writer import SSTableBuilder

    items = records(40000)
    keys, values = [k for k, _ in items], [v for _, v in items]
    target = 256 * 1024
    sizes, versions = [], []
    while keys:
        path = str(tmp_path / f"{len(sizes)}.sst")
        with open(path, "wb") as f:
            b = SSTableBuilder(f, fp_chance=0.01, block_size=4096, compression="lz4")
            added = b.add_chunk(keys, values, target)
            keys, values = keys[added:], values[added:]
            b.finish()
        sizes.append(os.path.getsize(path))
        versions.append(SSTableReader(path, 0).file_version)
    assert len(sizes) > 3
    for size, version in zip(sizes[:-1], versions[:-1], strict=True):
        assert 0.8 * target <= size <= target + 64 * 1024
        assert version == 4


def test_a_keys_piece_larger_than_the_first_room_is_still_read_alone(tmp_path, impl,
                                                                     monkeypatch):
    """64 KiB blocks of small values have keys pieces of tens of KiB, more than
    the room first made after a file's dictionary: the room grows, and a get
    without a block cache still reads its block's keys piece and value's
    piece alone in C, with the right answers."""
    monkeypatch.setattr(compression, "DICT_BLOCKS", 2)  # 8 blocks: a dictionary all the same
    entries = {b"user:%07d" % (2 * i + 1): b"v%d" % i for i in range(20000)}
    path = str(tmp_path / "db")
    _pieces_db(path, entries, 65536)
    handed = _handovers(monkeypatch)
    with lsmdb.open(path, auto_compaction=False, block_cache_size_bytes=0) as db:
        info = max(db.sstables(), key=lambda s: s.entries)
        assert info.compression_dict_bytes > 0
        for k in list(entries)[::97]:
            assert db.get(k) == entries[k]
            assert db.get(k[:-1] + b"0") is None
    assert handed == []


def test_make_golden_dumps_the_file_in_pieces():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "tools/make_golden.py", "--dump", "pieces"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "data block 0 (lz4" in out.stdout and "compression_dict" in out.stdout


@needs_c
def test_c_whole_reads_of_pieces_are_the_python_ones(tmp_path):
    """pieces_payload (C, the scan's and compaction's whole read) gives every
    block's payload exactly as decompress_pieces does, and None -- so that the
    Python twin raises -- for a block it refuses."""
    from lsmdb._speedups import pieces_payload

    path = str(tmp_path / "f.sst")
    write_sstable(path, records(3000), fp_chance=0.01, block_size=4096, compression="lz4")
    r = SSTableReader(path, 0)
    for i in range(len(r.index_keys)):
        stored = bytes(r.read_raw(i)[:-5])
        want = compression.decompress_pieces(stored, r.compression_dict, path, 0)
        assert pieces_payload(r, stored) == want
        assert pieces_payload(r, memoryview(stored)) == want
    plen, sizes, firsts, at = compression.piece_table(stored)
    assert pieces_payload(r, stored[:-1]) is None
    lying = stored[:4] + b"\x02" + stored[5:] if len(sizes) > 2 else stored[:at - 1] + b"\x7f" \
        + stored[at:]
    assert pieces_payload(r, lying) is None
    r.close()
    r = SSTableReader(path, 0)
    r.compression_dict = None  # a file without its dictionary
    assert pieces_payload(r, stored) is None
    r.close()
