"""Fuzzing every reader of on-disk bytes.

Hypothesis feeds random bytes and mutations of valid encodings (bytes
flipped, inserted, deleted, truncated, length fields overwritten with huge
values) to each decoder.  The contract: the only exceptions that come out
are ``lsmdb.LsmdbError`` subclasses (``decode_stats`` may also raise
``ValueError``: its docstring says so, and its callers ignore a bad counters
file), no input hangs a reader (a Hypothesis deadline plus a hard alarm), and
no length field makes a reader allocate what it claims (tracemalloc).

Checksums stop almost every random mutation at the first check, so some
tests also fix the CRCs up after mutating: that is what reaches the decoders
behind them (msgpack shapes, types, handles) -- what a buggy writer or a
deliberately crafted file would present.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import struct
import tempfile
import tracemalloc
from datetime import timedelta
from types import SimpleNamespace

import msgpack
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import lsmdb
from lsmdb import block as blk
from lsmdb.coding import WAL_HEADER, crc32
from lsmdb.filters.bloom import FILTER_HEADER, BloomFilter
from lsmdb.filters.hashing import keyed_hasher
from lsmdb.manifest import MANIFEST_HEADER, FileMeta, Manifest, TableMeta
from lsmdb.sstable_format import FOOTER_SIZE, MISSING
from lsmdb.sstable_reader import SSTableReader
from lsmdb.sstable_writer import SSTableBuilder
from lsmdb.stats import decode_stats, encode_stats
from lsmdb.wal import FRAGMENT_HEADER, LogWriter, read_legacy_log, read_segment
from tests.support.reading import find, items

EXAMPLES = 200
# No shrink phase: a failure is reported as found, so a broken reader costs
# 200 examples, not minutes of shrinking (the plain tests below hold minimal
# repros of what fuzzing has found).
FUZZ = settings(max_examples=EXAMPLES, deadline=timedelta(seconds=2),
                phases=(Phase.explicit, Phase.reuse, Phase.generate),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
HARD_LIMIT_SECONDS = 10.0
MIB = 1024 * 1024


class Hang(Exception):
    """A reader ran past HARD_LIMIT_SECONDS (not an LsmdbError, so it fails the test)."""


@contextlib.contextmanager
def time_limit(seconds: float = HARD_LIMIT_SECONDS):
    """Interrupt a reader stuck in a loop (a deadline only reports after it returns)."""
    if not hasattr(signal, "setitimer"):
        yield
        return

    def on_alarm(signum, frame):
        raise Hang(f"reader still running after {seconds}s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# --------------------------------------------------------------------------- valid encodings

def build_sstable(entries, fp_chance=0.01, block_size=256, hasher=None) -> bytes:
    buf = io.BytesIO()
    kwargs = {} if hasher is None else {"hasher": hasher}
    b = SSTableBuilder(buf, fp_chance=fp_chance, block_size=block_size, table="t", **kwargs)
    for k, v in entries:
        b.add(k, v)
    b.note_seq(1, len(entries))
    b.finish()
    return buf.getvalue()


def _entries(n: int, tombstone_every: int = 0):
    out = []
    for i in range(n):
        tombstone = tombstone_every and i % tombstone_every == 0
        value = None if tombstone else b"value-%d" % i * (i % 4 + 1)
        out.append((b"key-%04d" % i, value))
    return out


SSTABLES = {
    "one-block": (build_sstable([(b"a", b"1"), (b"b", None), (b"c", b"3")]),
                  [(b"a", b"1"), (b"b", None), (b"c", b"3")]),
    "many-blocks": (build_sstable(_entries(60, tombstone_every=7)), _entries(60, 7)),
    "no-filter": (build_sstable(_entries(20), fp_chance=1.0), _entries(20)),
    "keyed-filter": (build_sstable(_entries(20), hasher=keyed_hasher(b"s" * 32)), _entries(20)),
    "binary-keys": (build_sstable([(b"", b""), (b"\x00", b"\xff" * 40), (b"\xff" * 9, b"x")]),
                    [(b"", b""), (b"\x00", b"\xff" * 40), (b"\xff" * 9, b"x")]),
}


def _wal_bytes(payloads: list[bytes]) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "wal-000001.log")
        w = LogWriter(path, 1)
        for p in payloads:
            w.add_record(p)
        w.close()
        with open(path, "rb") as f:
            return f.read()


WALS = [
    _wal_bytes([msgpack.packb([i + 1, [[1, b"k%d" % i, b"v" * i or None]]], use_bin_type=True)
                for i in range(8)]),
    _wal_bytes([b"x", b"y" * 300, b"z" * 3]),
    _wal_bytes([b"a" * 40_000, b"b" * 10]),   # a record in fragments over two blocks
]

_MANIFEST = Manifest(next_file_number=9, next_table_id=3, last_seq=42, tables={
    "default": TableMeta(1, {}, 40, [FileMeta(4, 0, 1234, 10, b"a", b"z", 1, 40)]),
    "t": TableMeta(2, {"bloom_filter_fp_chance": 0.001, "block_size_bytes": 512}, 7,
                   [FileMeta(5, 1, 99, 2, b"", b"\xff", 3, 7),
                    FileMeta(7, 0, 5, 1, b"m", b"m", 8, 8)]),
})
MANIFESTS = [Manifest().encode(), _MANIFEST.encode()]

STATS = [
    encode_stats([SimpleNamespace(number=n, range_skips=1, filter_negatives=2, true_positives=3,
                                  false_positives=4, false_negatives=0, block_reads=5,
                                  block_cache_hits=6) for n in (3, 4)],
                 [SimpleNamespace(id=1, gets=10, gets_absent=7, write_stalls=2,
                                  write_stall_us=900, write_slowdowns=3,
                                  write_slowdown_us=4000)]),
]

FILTERS = [BloomFilter(100, 0.01), BloomFilter(3, 0.5), BloomFilter(0, 1.0)]
for _f in FILTERS[:2]:
    for _i in range(_f._capacity):
        _f.add(b"k%d" % _i)
FILTER_BYTES = [f.to_bytes() for f in FILTERS]


# --------------------------------------------------------------------------- mutations

BIG_VALUES = [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**40, 2**60, 2**63, 2**64 - 1]

mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 20), st.integers(1, 255)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 20), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), st.integers(0, 1 << 20), st.integers(1, 32)),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 20)),
    st.tuples(st.just("u32"), st.integers(0, 1 << 20), st.sampled_from(BIG_VALUES)),
    st.tuples(st.just("u64"), st.integers(0, 1 << 20), st.sampled_from(BIG_VALUES)),
)


def apply_mutations(data: bytes, mutations) -> bytes:
    buf = bytearray(data)
    for m in mutations:
        kind, pos = m[0], m[1]
        if kind == "insert":
            pos %= len(buf) + 1
            buf[pos:pos] = m[2]
            continue
        if not buf:
            continue
        pos %= len(buf)
        if kind == "flip":
            buf[pos] ^= m[2]
        elif kind == "delete":
            del buf[pos:pos + m[2]]
        elif kind == "truncate":
            del buf[pos:]
        else:
            width = 4 if kind == "u32" else 8
            raw = (m[2] & ((1 << (8 * width)) - 1)).to_bytes(width, "little")
            buf[pos:pos + width] = raw[:len(buf) - pos]
    return bytes(buf)


@st.composite
def mutated(draw, bases):
    base = draw(st.sampled_from(bases))
    return apply_mutations(base, draw(st.lists(mutation, min_size=1, max_size=4)))


# --------------------------------------------------------------------------- SSTable helpers

def sst_regions(data: bytes) -> list[tuple[str, int, int]]:
    """(kind, payload start, payload end) of each checksummed region of a valid SSTable."""
    r = SSTableReader("<base>", 0, data=data)
    out = [("data", off, off + size)
           for off, size in zip(r.index_offsets, r.index_sizes, strict=True)]
    for kind, (off, size) in (("index", r.index_handle), ("filter", r.filter_handle),
                              ("props", r.props_handle)):
        out.append((kind, off, off + size))
    foot = len(data) - FOOTER_SIZE
    out.append(("footer", foot, foot + FOOTER_SIZE - 12))  # the bytes its crc covers
    return out


def fix_crc(buf: bytearray, kind: str, start: int, end: int) -> None:
    """Recompute the checksum of the region after its payload changed in place."""
    # A block's trailer and the footer's crc field both follow the bytes they cover.
    struct.pack_into("<I", buf, end, crc32(bytes(buf[start:end])))


def assemble_sstable(data_payloads: list[bytes], index_payload: bytes | None = None,
                     filter_payload: bytes | None = None, props_payload: bytes | None = None,
                     footer_version: int = 1) -> bytes:
    """An SSTable with every checksum right, from arbitrary block payloads.

    ``index_payload`` None: a well-formed index over the data blocks whose
    last keys are taken from each payload when it decodes to the expected
    shape (else b"").  Other None parts come from a small valid table.
    """
    base = SSTABLES["one-block"][0]
    r = SSTableReader("<base>", 0, data=base)
    out = bytearray()
    offsets, sizes, last_keys = [], [], []
    for p in data_payloads:
        offsets.append(len(out))
        sizes.append(len(p))
        out += p + crc32(p).to_bytes(4, "little")
        try:
            obj = msgpack.unpackb(p, raw=False)
            last = obj[0][-1]
        except Exception:
            last = b""
        last_keys.append(last if type(last) is bytes else b"")
    if index_payload is None:
        index_payload = msgpack.packb([last_keys, offsets, sizes], use_bin_type=True)
    if filter_payload is None:
        off, size = r.filter_handle
        filter_payload = base[off:off + size]
    if props_payload is None:
        props = dict(r.properties)
        props["format_version"] = footer_version  # crafted blocks are of this format
        props["max_key"] = last_keys[-1] if last_keys else b""
        props["min_key"] = b""
        props_payload = msgpack.packb(props, use_bin_type=True)
    handles = []
    for p in (index_payload, filter_payload, props_payload):
        handles += [len(out), len(p)]
        out += p + crc32(p).to_bytes(4, "little")
    head = struct.pack("<QQQQQQI", *handles, footer_version)
    out += head + struct.pack("<I", crc32(head)) + b"LSMDBSST"
    return bytes(out)


def exercise_sstable(data: bytes, probe_keys=()) -> SSTableReader | None:
    """Open ``data`` as an SSTable and read it every way; LsmdbError means "refused"."""
    try:
        r = SSTableReader("<fuzz>", 0, data=data)
    except lsmdb.LsmdbError:
        return None
    keys = list(probe_keys) + [b"", b"key-0001", b"\xff" * 4]
    for k in keys:
        try:
            find(r, k)
        except lsmdb.LsmdbError:
            pass
    for start, end, reverse in ((None, None, False), (None, None, True),
                                (b"key-0010", b"key-0030", False), (b"b", b"key-0005", True)):
        try:
            for _ in items(r, start, end, reverse):
                pass
        except lsmdb.LsmdbError:
            pass
    for h1, h2 in ((0, 0), (2**32 - 1, 2**32 - 1), (12345, 678)):
        r.filter.active.may_contain(h1 | h2 << 32)
    return r


# --------------------------------------------------------------------------- blocks

@FUZZ
@given(st.binary(max_size=2048))
def test_block_decoders_on_random_bytes(payload):
    with time_limit():
        for decode in (lambda p: blk.unpack(p, "<fuzz>", 0, "block"),
                       lambda p: blk.decode_data_block(p, "<fuzz>", 0),
                       lambda p: blk.check_block(p, "<fuzz>", 0, "block")):
            try:
                decode(payload)
            except lsmdb.LsmdbError:
                pass


_BLOCK_PAYLOADS = [bytes(SSTABLES[n][0][off:end]) for n in ("many-blocks", "binary-keys")
                   for kind, off, end in sst_regions(SSTABLES[n][0]) if kind in ("data", "index")]


@FUZZ
@given(mutated(_BLOCK_PAYLOADS))
def test_block_decoders_on_mutated_blocks(payload):
    with time_limit():
        try:
            block = blk.decode_data_block(payload, "<fuzz>", 0)
        except lsmdb.LsmdbError:
            return
        entry = blk.cache_entry(payload, block)  # what the rule accepts has a cached form
        assert blk.entry_lists(entry) == block


# --------------------------------------------------------------------------- SSTables

@FUZZ
@given(st.binary(max_size=4096))
def test_sstable_reader_on_random_bytes(data):
    with time_limit():
        exercise_sstable(data)


@FUZZ
@given(st.binary(min_size=1, max_size=600))
def test_sstable_reader_on_random_bytes_behind_a_valid_footer_magic(body):
    """Random bytes reach past the magic check only when the file ends with it."""
    data = body + b"LSMDBSST"
    with time_limit():
        exercise_sstable(data)


@FUZZ
@given(st.sampled_from(sorted(SSTABLES)), st.lists(mutation, min_size=1, max_size=4))
def test_sstable_reader_on_mutated_files_never_answers_wrongly(name, mutations):
    base, entries = SSTABLES[name]
    data = apply_mutations(base, mutations)
    with time_limit():
        r = exercise_sstable(data, [k for k, _v in entries])
        if r is None:
            return
        # Checksums guard every region: whatever still opens answers rightly.
        for k, v in entries:
            try:
                got = find(r, k)
            except lsmdb.LsmdbError:
                continue
            assert got is not MISSING and got == v, (k, got, v)


@FUZZ
@given(st.sampled_from(sorted(SSTABLES)), st.data())
def test_sstable_reader_on_checksum_valid_mutations(name, data):
    """Flip payload bytes of one region and fix its checksum: the decoders behind it."""
    base = SSTABLES[name][0]
    regions = sst_regions(base)
    kind, start, end = data.draw(st.sampled_from(regions))
    buf = bytearray(base)
    flips = data.draw(st.lists(st.tuples(st.integers(start, end - 1), st.integers(1, 255)),
                               min_size=1, max_size=4))
    for pos, mask in flips:
        buf[pos] ^= mask
    fix_crc(buf, kind, start, end)
    with time_limit():
        exercise_sstable(bytes(buf), [k for k, _v in SSTABLES[name][1]])


_ANY_SCALAR = st.one_of(st.binary(max_size=8), st.text(max_size=4), st.integers(-2, 2**64 - 1),
                        st.none(), st.booleans(), st.floats(allow_nan=True))
_ANY_OBJ = st.recursive(_ANY_SCALAR, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=3), inner, max_size=3), max_leaves=12)


@FUZZ
@given(st.lists(st.one_of(
    _ANY_OBJ,
    st.tuples(st.lists(_ANY_SCALAR, max_size=5), st.lists(_ANY_SCALAR, max_size=5)).map(list),
    st.lists(st.binary(max_size=6), min_size=1, max_size=5).map(
        lambda ks: [sorted(set(ks)), [b"v"] * len(set(ks))]),
), min_size=1, max_size=3))
def test_sstable_reader_on_checksum_valid_data_blocks_of_any_shape(blocks):
    """Data blocks holding any msgpack object (correct checksums, correct index)."""
    payloads = [msgpack.packb(b, use_bin_type=True) for b in blocks]
    data = assemble_sstable(payloads)
    with time_limit():
        exercise_sstable(data, [b"", b"a", b"\x00"])


@FUZZ
@given(index=_ANY_OBJ, props=_ANY_OBJ, pick=st.integers(0, 2))
def test_sstable_reader_on_checksum_valid_index_and_properties_of_any_shape(index, props, pick):
    good = msgpack.packb([[b"a", b"b"], [b"1", b"2"]], use_bin_type=True)
    parts = {0: {"index_payload": msgpack.packb(index, use_bin_type=True)},
             1: {"props_payload": msgpack.packb(props, use_bin_type=True)},
             2: {"index_payload": msgpack.packb(index, use_bin_type=True),
                 "props_payload": msgpack.packb(props, use_bin_type=True)}}[pick]
    data = assemble_sstable([good], **parts)
    with time_limit():
        exercise_sstable(data, [b"a", b"b"])


def test_checksum_valid_data_block_with_a_str_key_is_corruption():
    """Minimal repro of a crafted block: msgpack str where bytes belong."""
    payload = msgpack.packb([["a", b"b"], [b"1", b"2"]], use_bin_type=True)
    r = SSTableReader("<crafted>", 0, data=assemble_sstable([payload]))
    with pytest.raises(lsmdb.CorruptionError):
        find(r, b"a")
    with pytest.raises(lsmdb.CorruptionError):
        items(r, b"a", b"c")


def test_checksum_valid_index_out_of_order_is_corruption_at_open():
    """Reads bisect the index keys (block i holds the keys up to index key i):
    an index whose keys do not rise, checksum or not, is refused at open
    rather than sending a get to the wrong block."""
    blocks = [msgpack.packb([[b"a", b"b"], [b"1", b"2"]], use_bin_type=True),
              msgpack.packb([[b"c", b"d"], [b"3", b"4"]], use_bin_type=True)]
    sizes = [len(b) for b in blocks]
    offsets = [0, sizes[0] + 4]
    assert find(SSTableReader("<crafted>", 0, data=assemble_sstable(blocks)), b"c") == b"3"
    for keys in ([b"d", b"b"], [b"b", b"b"]):
        index = msgpack.packb([keys, offsets, sizes], use_bin_type=True)
        with pytest.raises(lsmdb.CorruptionError, match="out of order"):
            SSTableReader("<crafted>", 0, data=assemble_sstable(blocks, index_payload=index))


# --------------------------------------------------------------------------- filters

@FUZZ
@given(st.one_of(st.binary(max_size=512),
                 st.builds(lambda h, body: h + body,
                           st.builds(FILTER_HEADER.pack, st.integers(0, 3), st.integers(0, 3),
                                     st.integers(0, 2**16 - 1), st.integers(0, 2**32 - 1),
                                     st.sampled_from(BIG_VALUES + [8, 63, 64, 65, 1000]),
                                     st.integers(0, 2**64 - 1), st.floats(allow_nan=True),
                                     st.integers(0, 2**32 - 1)),
                           st.binary(max_size=200))))
def test_filter_decoder_on_random_bytes(data):
    with time_limit():
        try:
            f = BloomFilter.from_bytes(data, "<fuzz>", 0)
        except lsmdb.LsmdbError:
            return
        for h1, h2 in ((0, 0), (2**32 - 1, 1), (777, 2**32 - 1)):
            f.may_contain_hash(h1, h2)
        f.predicted_fpr()
        assert 0.0 <= f.fill_ratio <= 1.0


@FUZZ
@given(mutated(FILTER_BYTES))
def test_filter_decoder_on_mutated_filters(data):
    with time_limit():
        try:
            f = BloomFilter.from_bytes(data, "<fuzz>", 0)
        except lsmdb.LsmdbError:
            return
        f.may_contain_hash(1, 2)


# --------------------------------------------------------------------------- WAL

def _check_log(data: bytes) -> None:
    """Live and closed readings of a segment, and the legacy reader: a clean error or
    records that lie within the bytes."""
    for closed in (None, len(data)):
        try:
            result = read_segment(data, 1, "<fuzz>", closed)
        except lsmdb.LsmdbError:
            continue
        assert 0 <= result.valid_length <= len(data)
        assert all(off < result.valid_length for off, _p in result.records)
        assert all(data[off + FRAGMENT_HEADER.size:].startswith(p[:100])
                   for off, p in result.records)
    try:
        legacy = read_legacy_log(data, "<fuzz>")
    except lsmdb.LsmdbError:
        return
    assert all(data[off + WAL_HEADER.size:off + WAL_HEADER.size + len(p)] == p
               for off, p in legacy.records)


@FUZZ
@given(st.binary(max_size=2048))
def test_wal_reader_on_random_bytes(data):
    with time_limit():
        _check_log(data)


@FUZZ
@given(mutated(WALS))
def test_wal_reader_on_mutated_logs(data):
    with time_limit():
        _check_log(data)


# --------------------------------------------------------------------------- manifest

@FUZZ
@given(st.one_of(st.binary(max_size=1024),
                 st.binary(max_size=300).map(lambda b: b"LSMDBMAN" + b)))
def test_manifest_decoder_on_random_bytes(data):
    with time_limit():
        try:
            Manifest.decode(data, "<fuzz>")
        except lsmdb.LsmdbError:
            pass


@FUZZ
@given(mutated(MANIFESTS), st.booleans())
def test_manifest_decoder_on_mutated_manifests(data, fix_checksum):
    if fix_checksum and len(data) >= MANIFEST_HEADER.size:
        payload = data[MANIFEST_HEADER.size:]
        magic, version, _crc, _length = MANIFEST_HEADER.unpack_from(data, 0)
        data = MANIFEST_HEADER.pack(magic, version, crc32(payload), len(payload)) + payload
    with time_limit():
        try:
            Manifest.decode(data, "<fuzz>")
        except lsmdb.LsmdbError:
            pass


@FUZZ
@given(_ANY_OBJ)
def test_manifest_decoder_on_checksum_valid_payloads_of_any_shape(obj):
    from lsmdb.manifest import MANIFEST_FORMAT_VERSION, MANIFEST_MAGIC
    payload = msgpack.packb(obj, use_bin_type=True)
    data = MANIFEST_HEADER.pack(MANIFEST_MAGIC, MANIFEST_FORMAT_VERSION, crc32(payload),
                                len(payload)) + payload
    with time_limit():
        try:
            Manifest.decode(data, "<fuzz>")
        except lsmdb.LsmdbError:
            pass


# --------------------------------------------------------------------------- counters

def _check_stats(data: bytes) -> None:
    # decode_stats: "raises ValueError when unusable" -- by design, not an LsmdbError.
    try:
        decode_stats(data)
    except (ValueError, lsmdb.LsmdbError):
        pass


@FUZZ
@given(st.binary(max_size=1024))
def test_stats_decoder_on_random_bytes(data):
    with time_limit():
        _check_stats(data)


@FUZZ
@given(mutated(STATS), st.booleans())
def test_stats_decoder_on_mutated_files(data, fix_checksum):
    from lsmdb.stats import STATS_HEADER
    if fix_checksum and len(data) >= STATS_HEADER.size:
        payload = data[STATS_HEADER.size:]
        magic, version, _crc, _length = STATS_HEADER.unpack_from(data, 0)
        data = STATS_HEADER.pack(magic, version, crc32(payload), len(payload)) + payload
    with time_limit():
        _check_stats(data)


@FUZZ
@given(_ANY_OBJ)
def test_stats_decoder_on_checksum_valid_payloads_of_any_shape(obj):
    from lsmdb.stats import STATS_FORMAT_VERSION, STATS_HEADER, STATS_MAGIC
    payload = msgpack.packb(obj, use_bin_type=True)
    data = STATS_HEADER.pack(STATS_MAGIC, STATS_FORMAT_VERSION, crc32(payload),
                             len(payload)) + payload
    with time_limit():
        _check_stats(data)


def test_checksum_valid_stats_payload_of_the_wrong_shape_is_a_value_error():
    """Minimal repros: decode_stats promises ValueError for anything unusable."""
    from lsmdb.stats import STATS_FORMAT_VERSION, STATS_HEADER, STATS_MAGIC
    payloads = {
        "empty map": msgpack.packb({}),
        "list": msgpack.packb([]),
        "int": msgpack.packb(7),
        "files not a map": msgpack.packb({"files": [1], "tables": {}}),
        "unhashable map key": b"\x81\x80\x01",  # {{}: 1}
    }
    escaped = {}
    for name, payload in payloads.items():
        data = STATS_HEADER.pack(STATS_MAGIC, STATS_FORMAT_VERSION, crc32(payload),
                                 len(payload)) + payload
        try:
            decode_stats(data)
        except ValueError:
            continue
        except Exception as exc:
            escaped[name] = repr(exc)
        else:
            escaped[name] = "decoded without an error"
    assert not escaped, escaped


# --------------------------------------------------------------------------- allocation bounds

def peak_bytes(fn) -> int:
    """Peak traced allocation while ``fn`` runs (its LsmdbError is expected and swallowed)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        try:
            fn()
        except lsmdb.LsmdbError:
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("m", [2**30, 2**40 + 8, 2**60, 2**64 - 1])  # 2**30: 128 MiB, allocatable
def test_filter_header_claiming_huge_m_allocates_nothing(m):
    data = FILTER_HEADER.pack(1, 1, 0, 7, m, 1000, 0.01, 0) + b"\xff" * 64
    with pytest.raises(lsmdb.CorruptionError):
        BloomFilter.from_bytes(data, "<fuzz>", 0)
    assert peak_bytes(lambda: BloomFilter.from_bytes(data, "<fuzz>", 0)) < 1 * MIB


@pytest.mark.parametrize("length", [2**31 - 1, 2**31, 2**32 - 1])
def test_legacy_wal_length_field_claiming_gigabytes_allocates_nothing(length):
    good = bytes.fromhex("58a24db20b000000" "9201919301c4016bc40176") * 3
    data = good + WAL_HEADER.pack(0, length) + b"x" * 100
    result = read_legacy_log(data, "<fuzz>")
    assert result.torn and len(result.records) == 3
    assert peak_bytes(lambda: read_legacy_log(data, "<fuzz>")) < 1 * MIB


def test_sstable_handles_claiming_huge_blocks_allocate_nothing(tmp_path):
    """Footer handles of 1 TiB with a correct footer checksum, in memory and on disk."""
    base = SSTABLES["many-blocks"][0]
    for which in range(3):  # index, filter, properties
        buf = bytearray(base)
        foot = len(buf) - FOOTER_SIZE
        struct.pack_into("<Q", buf, foot + 16 * which + 8, 2**40)
        struct.pack_into("<I", buf, foot + 52, crc32(bytes(buf[foot:foot + 52])))
        data = bytes(buf)
        path = tmp_path / f"huge-{which}.sst"
        path.write_bytes(data)
        if which == 1:  # a filter fails open rather than failing the file
            SSTableReader(str(path)).close()
        else:
            with pytest.raises(lsmdb.CorruptionError):
                SSTableReader(str(path))
        assert peak_bytes(lambda d=data: SSTableReader("<fuzz>", 0, data=d)) < 1 * MIB
        assert peak_bytes(lambda p=str(path): SSTableReader(p).close()) < 1 * MIB


def test_index_entry_claiming_a_huge_block_allocates_nothing(tmp_path):
    payload = msgpack.packb([[b"a"], [b"1"]], use_bin_type=True)
    index = msgpack.packb([[b"a"], [0], [2**40]], use_bin_type=True)
    data = assemble_sstable([payload], index_payload=index)
    path = tmp_path / "huge-index.sst"
    path.write_bytes(data)
    with pytest.raises(lsmdb.CorruptionError):
        SSTableReader(str(path))
    assert peak_bytes(lambda: SSTableReader(str(path)).close()) < 1 * MIB


@pytest.mark.parametrize("header", [b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff",
                                    b"\xc6\xff\xff\xff\xff", b"\xdb\x7f\xff\xff\xff"])
def test_msgpack_length_fields_claiming_gigabytes_allocate_nothing(header):
    """array32 / map32 / bin32 / str32 headers of ~4 G items behind a correct checksum."""
    payload = header + b"\x00" * 32
    assert peak_bytes(lambda: blk.decode_data_block(payload, "<fuzz>", 0)) < 1 * MIB
    data = assemble_sstable([payload])
    assert peak_bytes(lambda: exercise_sstable(data)) < 1 * MIB
    from lsmdb.manifest import MANIFEST_FORMAT_VERSION, MANIFEST_MAGIC
    manifest = MANIFEST_HEADER.pack(MANIFEST_MAGIC, MANIFEST_FORMAT_VERSION, crc32(payload),
                                    len(payload)) + payload
    assert peak_bytes(lambda: Manifest.decode(manifest, "<fuzz>")) < 1 * MIB


def test_valid_encodings_round_trip():
    """The fuzz bases are valid, so the mutation tests start from real files."""
    for data, entries in SSTABLES.values():
        r = SSTableReader("<base>", 0, data=data)
        assert [find(r, k) for k, _v in entries] == [v for _k, v in entries]
        assert items(r, None, None) == entries
        assert r.filter.error is None or r.filter.hash_algorithm == 2
    for data in WALS:
        result = read_segment(data, 1, "<base>", len(data))
        assert not result.torn and result.records
    assert Manifest.decode(MANIFESTS[1], "<base>") == _MANIFEST
    assert decode_stats(STATS[0])[0][3][0] == 1
    for data, f in zip(FILTER_BYTES, FILTERS, strict=True):
        g = BloomFilter.from_bytes(data)
        assert (g.m, g.k, g.n) == (f.m, f.k, f.n)
