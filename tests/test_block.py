"""Checksummed blocks and the data block rule, in Python and in C: the same payloads
through both implementations, the same blocks accepted and refused, the same
cached form byte for byte, the same answers from it."""

from __future__ import annotations

from typing import Any, NamedTuple

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lsmdb import block as blk
from lsmdb.block import check_block, encode_block
from lsmdb.errors import CorruptionError
from lsmdb.sstable_format import MISSING

try:
    from lsmdb import _speedups as C
except ImportError:  # pragma: no cover - built without a C compiler
    C = None


class Impl(NamedTuple):
    """One implementation of the rule and the cached form."""

    name: str
    decode: Any   # (payload, after, last) -> (keys, values); CorruptionError if refused
    entry: Any    # (payload, after, last) -> the cached form; CorruptionError if refused
    find: Any     # (entry, key) -> value, None or MISSING
    lists: Any    # entry -> (keys, values)


def _py_decode(payload: bytes, after: bytes | None, last: bytes | None) -> Any:
    return blk.decode_data_block(payload, "f.sst", 77, after, last)


PY = Impl("python", _py_decode,
          lambda payload, after, last: blk.cache_entry(payload, _py_decode(payload, after, last)),
          blk.entry_find, blk.entry_lists)


def _c_refusal(fn: Any) -> Any:
    def call(payload: bytes, after: bytes | None, last: bytes | None) -> Any:
        try:
            return fn(payload, after, last)
        except ValueError:
            raise CorruptionError("refused", "f.sst", 77) from None
    return call


IMPLS = [PY]
if C is not None:
    IMPLS.append(Impl("c", _c_refusal(C.block_lists), _c_refusal(C.block_entry),
                      lambda entry, key: C.entry_find(entry, key, MISSING), C.entry_lists))


@pytest.fixture(params=IMPLS, ids=lambda i: i.name, scope="module")
def impl(request):
    return request.param


entries = st.dictionaries(st.binary(max_size=12), st.one_of(st.none(), st.binary(max_size=30)),
                          min_size=1, max_size=40)


def payload_of(d: dict[bytes, bytes | None]) -> bytes:
    keys = sorted(d)
    return msgpack.packb([keys, [d[k] for k in keys]], use_bin_type=True)


def test_the_worked_example_of_the_module_docstring(impl):
    raw = encode_block([[b"a", b"b"], [b"1", None]])
    assert raw.hex(" ") == "92 92 c4 01 61 c4 01 62 92 c4 01 31 c0 90 83 be 5d"
    payload = check_block(raw, "f.sst", 0, "data block")
    assert impl.decode(payload, None, b"b") == ([b"a", b"b"], [b"1", None])
    entry = impl.entry(payload, None, b"b")
    assert (impl.find(entry, b"a"), impl.find(entry, b"b"), impl.find(entry, b"c")) == (
        b"1", None, MISSING)
    # the payload, key_at (2, 5), value_at (9, 12), the count 2, the payload's 13 bytes
    assert entry == payload + b"".join(n.to_bytes(4, "little") for n in (2, 5, 9, 12, 2, 13))


@settings(max_examples=200, deadline=None)
@given(d=entries, absent=st.lists(st.binary(max_size=12), max_size=10),
       big=st.sampled_from([0, 300, 70_000]))
def test_a_data_block_reads_back_as_written(impl, d, absent, big):
    if big:  # values and keys past the bin 8 and bin 16 headers
        d = {**d, b"\xff" * 13: b"v" * big}
    keys = sorted(d)
    payload = payload_of(d)
    assert impl.decode(payload, None, keys[-1]) == (keys, [d[k] for k in keys])
    entry = impl.entry(payload, None, keys[-1])
    assert impl.lists(entry) == (keys, [d[k] for k in keys])
    for k in keys:
        assert impl.find(entry, k) == d[k]
    for k in absent:
        if k not in d:
            assert impl.find(entry, k) is MISSING


@pytest.mark.skipif(C is None, reason="built without a C compiler")
@settings(max_examples=300, deadline=None)
@given(d=entries)
def test_both_make_the_same_cached_form_byte_for_byte(d):
    payload, last = payload_of(d), max(d)
    assert PY.entry(payload, None, last) == IMPLS[1].entry(payload, None, last)


def _bin(data: bytes, width: int) -> bytes:
    head = {8: b"\xc4", 16: b"\xc5", 32: b"\xc6"}[width]
    return head + len(data).to_bytes(width // 8, "big") + data


REFUSED = {
    "not msgpack": b"\xc1\xc1\xc1",
    "a bare byte string": msgpack.packb(b"just bytes", use_bin_type=True),
    "a map": msgpack.packb({"a": 1}),
    "one list": msgpack.packb([[b"a"]], use_bin_type=True),
    "unequal lists": msgpack.packb([[b"a"], [b"1", b"2"]], use_bin_type=True),
    "an int key": msgpack.packb([[1], [b"1"]], use_bin_type=True),
    "an int value": msgpack.packb([[b"a"], [1]], use_bin_type=True),
    "a str key": msgpack.packb([["a"], [b"1"]], use_bin_type=True),
    "no entry": msgpack.packb([[], []], use_bin_type=True),
    "keys out of order": msgpack.packb([[b"b", b"a"], [b"1", b"2"]], use_bin_type=True),
    "a key twice": msgpack.packb([[b"a", b"a"], [b"1", b"2"]], use_bin_type=True),
    "keys and values swapped": msgpack.packb([[b"v9", b"v1"], [b"a", b"b"]],
                                              use_bin_type=True),
    "a byte left over": msgpack.packb([[b"a"], [b"1"]], use_bin_type=True) + b"\x00",
    "a longer bin header": b"\x92\x91" + _bin(b"a", 16) + b"\x91" + _bin(b"1", 8),
    "a longer value header": b"\x92\x91" + _bin(b"a", 8) + b"\x91" + _bin(b"1", 32),
    "a longer array header": b"\x92\xdc\x00\x01" + _bin(b"a", 8) + b"\x91" + _bin(b"1", 8),
    "a longer outer header": b"\xdc\x00\x02\x91" + _bin(b"a", 8) + b"\x91" + _bin(b"1", 8),
}


@pytest.mark.parametrize("why", list(REFUSED))
def test_a_checksum_valid_payload_the_writer_never_writes_is_corruption(impl, why):
    with pytest.raises(CorruptionError) as info:
        impl.decode(REFUSED[why], None, None)
    assert (info.value.path, info.value.offset) == ("f.sst", 77)
    with pytest.raises(CorruptionError):
        impl.entry(REFUSED[why], None, None)


def test_the_bounds_are_the_index_s(impl):
    payload = payload_of({b"b": b"1", b"c": b"2"})
    assert impl.decode(payload, b"a", b"c")[0] == [b"b", b"c"]
    assert impl.decode(payload, None, None)[0] == [b"b", b"c"]
    for after, last in [(b"b", b"c"), (b"bb", b"c"), (b"a", b"d"), (b"a", b"b"), (None, b"cc")]:
        with pytest.raises(CorruptionError):
            impl.decode(payload, after, last)
        with pytest.raises(CorruptionError):
            impl.entry(payload, after, last)


@pytest.mark.skipif(C is None, reason="built without a C compiler")
@settings(max_examples=1500, deadline=None)
@given(d=entries, pos=st.integers(min_value=0), byte=st.integers(0, 255),
       cut=st.integers(min_value=0), how=st.sampled_from(["flip", "cut", "insert", "bounds"]),
       after=st.one_of(st.none(), st.binary(max_size=4)),
       last=st.one_of(st.none(), st.binary(max_size=4)))
def test_both_accept_and_refuse_the_same_payloads(d, pos, byte, cut, how, after, last):
    """Damaged, cut, grown and mis-bounded payloads: the C rule accepts exactly what
    the Python rule accepts, and both read it the same."""
    payload = bytearray(payload_of(d))
    if how == "flip":
        payload[pos % len(payload)] = byte
    elif how == "cut":
        del payload[cut % len(payload):]
    elif how == "insert":
        payload.insert(pos % (len(payload) + 1), byte)
    else:
        after, last = None if after is None else min(d) + after, max(d) if last is None else last
    outcomes = []
    for im in IMPLS:
        try:
            outcomes.append((im.decode(bytes(payload), after, last),
                             im.entry(bytes(payload), after, last)))
        except CorruptionError:
            outcomes.append(None)
    assert outcomes[0] == outcomes[1]


def test_every_single_bit_flip_and_truncation_fails_the_checksum():
    raw = encode_block([[b"k%02d" % i for i in range(20)],
                        [b"value" * (i % 3) or None for i in range(20)]])
    for pos in range(len(raw)):
        for bit in range(8):
            bent = bytearray(raw)
            bent[pos] ^= 1 << bit
            with pytest.raises(CorruptionError, match="checksum") as info:
                check_block(bytes(bent), "f.sst", 4096, "data block")
            assert (info.value.path, info.value.offset) == ("f.sst", 4096)
    for n in range(len(raw)):
        with pytest.raises(CorruptionError):
            check_block(raw[:n], "f.sst", 0, "data block")


@pytest.mark.skipif(C is None, reason="built without a C compiler")
@settings(max_examples=300, deadline=None)
@given(d=entries, at=st.integers(min_value=0), byte=st.integers(0, 255),
       key=st.binary(max_size=12))
def test_a_damaged_cached_form_never_reads_past_itself(d, at, byte, key):
    """An object in the cache that is not a block the rule made (it cannot be, but
    if it were): the C lookups refuse it or answer from inside it, never past."""
    entry = bytearray(PY.entry(payload_of(d), None, max(d)))
    entry[at % len(entry)] = byte
    for call in (lambda: C.entry_find(bytes(entry), key, MISSING),
                 lambda: C.entry_lists(bytes(entry))):
        try:
            call()
        except ValueError:
            pass


# ---- a key among a block's keys alone (keys_among and block_keys_hold) ------

def _damaged(payload: bytes, how: str, pos: int, byte: int) -> bytes:
    """payload with byte written at pos ("flip"), cut there ("cut"), inserted
    there ("insert"), or as it is (any other how)."""
    out = bytearray(payload)
    if how == "flip":
        out[pos % len(out)] = byte
    elif how == "cut":
        del out[pos % len(out):]
    elif how == "insert":
        out.insert(pos % (len(out) + 1), byte)
    return bytes(out)


def _keys_among_py(payload: bytes, key: bytes, after: bytes | None, last: bytes | None,
                   version: int = 1) -> bool | None:
    """keys_among's answer, None when it refuses the keys."""
    try:
        return blk.keys_among(payload, [key], "f.sst", 77, after, last, version)
    except CorruptionError:
        return None


def _keys_hold_c(payload: bytes, key: bytes, after: bytes | None, last: bytes | None,
                 version: int = 1, n: int | None = None) -> bool | None | str:
    """block_keys_hold over the first n bytes: its answer, None when it refuses
    the keys, "more" when they run past the prefix."""
    try:
        r = C.block_keys_hold(payload[:n], len(payload), key, after, last, version)
    except ValueError:
        return None
    return "more" if r is None else r


def test_keys_among_reads_the_keys_alone():
    """The keys decide, whatever the other arrays hold; keys that break the
    rule's parts about them are corruption at the block's offset."""
    keys = [b"a", b"b", b"d"]
    good = msgpack.packb([keys, [b"1", None, b"3"], [257, 512, 769], []], use_bin_type=True)
    assert blk.keys_among(good, [b"d"], "f.sst", 77, None, b"d", 2)
    assert not blk.keys_among(good, [b"c", b"e"], "f.sst", 77, None, b"d", 2)
    assert blk.keys_among(good, [b"c", b"b"], "f.sst", 77, None, b"d", 2)
    # the values and tags arrays are not read: a kind the rule refuses, keys that hold
    bad_tags = msgpack.packb([keys, [b"1", None, b"3"], [263, 512, 769], []],
                             use_bin_type=True)
    with pytest.raises(CorruptionError):
        blk.decode_full(bad_tags, "f.sst", 77, None, b"d", 2)
    assert not blk.keys_among(bad_tags, [b"c"], "f.sst", 77, None, b"d", 2)
    for why in ("not msgpack", "a bare byte string", "a map", "an int key", "a str key",
                "no entry", "keys out of order", "a key twice", "keys and values swapped",
                "a longer bin header", "a longer array header", "a longer outer header"):
        with pytest.raises(CorruptionError) as info:
            blk.keys_among(REFUSED[why], [b"a"], "f.sst", 77, None, None, 1)
        assert (info.value.path, info.value.offset) == ("f.sst", 77)
    # the bounds are the index's
    payload = payload_of({b"b": b"1", b"c": b"2"})
    for after, last in [(b"b", b"c"), (b"a", b"b"), (None, b"cc")]:
        with pytest.raises(CorruptionError):
            blk.keys_among(payload, [b"x"], "f.sst", 77, after, last, 1)


@pytest.mark.skipif(C is None, reason="built without a C compiler")
@settings(max_examples=1500, deadline=None)
@given(d=entries, key=st.binary(max_size=12), pos=st.integers(min_value=0),
       byte=st.integers(0, 255), how=st.sampled_from(["none", "flip", "cut", "insert", "bounds"]),
       after=st.one_of(st.none(), st.binary(max_size=4)),
       last=st.one_of(st.none(), st.binary(max_size=4)))
def test_both_find_a_key_among_the_keys_alike(d, key, pos, byte, how, after, last):
    """block_keys_hold (C) over the whole payload answers as keys_among
    (Python) does, refusals included, on good, damaged, cut, grown and
    mis-bounded payloads; over any prefix of it, the same answer or "read
    more" -- never another answer."""
    data = _damaged(payload_of(d), how, pos, byte)
    if how == "bounds":
        after, last = None if after is None else min(d) + after, max(d) if last is None else last
    elif how == "none":
        after, last = None, max(d)
        if key not in d and pos % 2:
            key = sorted(d)[pos % len(d)]
    want = _keys_among_py(data, key, after, last)
    assert _keys_hold_c(data, key, after, last) == want
    if how == "none":
        assert want == (key in d)
    for n in range(len(data)):
        assert _keys_hold_c(data, key, after, last, n=n) in (want, "more")


# ---- a key's value from the first arrays alone (values_among, block_value_of)


def payload2_of(d: dict[bytes, bytes | None]) -> bytes:
    """A format-2 payload of d, every entry's sequence number its place + 1."""
    keys = sorted(d)
    values = [d[k] for k in keys]
    tags = [(n + 1) << 8 | (v is not None) for n, v in enumerate(values)]
    return msgpack.packb([keys, values, tags, []], use_bin_type=True)


def _values_among_py(payload: bytes, key: bytes, after: bytes | None,
                     last: bytes | None) -> Any:
    """values_among's answer for key: False, (value,), or None when it refuses."""
    try:
        held = blk.values_among(payload, [key], "f.sst", 77, after, last)
    except CorruptionError:
        return None
    return (held[key],) if key in held else False


def _value_of_c(payload: bytes, key: bytes, after: bytes | None, last: bytes | None,
                n: int | None = None) -> Any:
    """block_value_of over the first n bytes: its answer, None when it refuses,
    "more" when what decides runs past the prefix."""
    try:
        r = C.block_value_of(payload[:n], len(payload), key, after, last)
    except ValueError:
        return None
    return "more" if r is None else r


def test_values_among_reads_no_further_than_the_value():
    """The keys and the values up to the last key sought decide; what follows
    is not read; values or keys that break the rule's parts about them are
    corruption at the block's offset."""
    keys = [b"a", b"b", b"d"]

    def pack(values: list[Any], tags: list[Any]) -> bytes:
        return msgpack.packb([keys, values, tags, []], use_bin_type=True)

    good = pack([b"1", None, b"3"], [257, 512, 769])
    assert blk.values_among(good, [b"d", b"c", b"a"], "f.sst", 77, None, b"d") == {
        b"d": b"3", b"a": b"1"}
    assert blk.values_among(good, [b"b"], "f.sst", 77, None, b"d") == {b"b": None}
    assert blk.values_among(good, [b"c"], "f.sst", 77, None, b"d") == {}
    # tags the rule refuses are not read, nor values past the one sought
    bad_tags = pack([b"1", None, b"3"], [263, 512, 769])
    assert blk.values_among(bad_tags, [b"d"], "f.sst", 77, None, b"d") == {b"d": b"3"}
    bad_last = pack([b"1", None, 3], [257, 512, 769])
    assert blk.values_among(bad_last, [b"b"], "f.sst", 77, None, b"d") == {b"b": None}
    for values in ([b"1", 2, b"3"], [b"1", "x", b"3"], [b"1", None]):
        with pytest.raises(CorruptionError) as info:
            blk.values_among(pack(values, [257, 512, 769]), [b"d"], "f.sst", 77, None, b"d")
        assert (info.value.path, info.value.offset) == ("f.sst", 77)
    # a longer bin header for a value before the one sought
    longer = good.replace(b"\xc4\x011", b"\xc5\x00\x011", 1)
    with pytest.raises(CorruptionError):
        blk.values_among(longer, [b"d"], "f.sst", 77, None, b"d")
    with pytest.raises(CorruptionError):
        blk.values_among(REFUSED["keys out of order"], [b"a"], "f.sst", 77, None, None)


@pytest.mark.skipif(C is None, reason="built without a C compiler")
@settings(max_examples=1500, deadline=None)
@given(d=entries, key=st.binary(max_size=12), pos=st.integers(min_value=0),
       byte=st.integers(0, 255), how=st.sampled_from(["none", "flip", "cut", "insert"]))
def test_both_read_a_value_from_the_first_arrays_alike(d, key, pos, byte, how):
    """block_value_of (C) over the whole payload answers as values_among
    (Python) does, refusals included, on good, damaged, cut and grown
    format-2 payloads; over any prefix of it, the same answer or "read more"
    -- never another answer."""
    data = _damaged(payload2_of(d), how, pos, byte)
    if how == "none" and key not in d and pos % 2:
        key = sorted(d)[pos % len(d)]
    after, last = None, max(d)
    want = _values_among_py(data, key, after, last)
    assert _value_of_c(data, key, after, last) == want
    if how == "none":
        assert want == ((d[key],) if key in d else False)
    for n in range(len(data)):
        assert _value_of_c(data, key, after, last, n=n) in (want, "more")


@pytest.mark.skipif(C is None, reason="built without a C compiler")
def test_a_prefix_that_holds_the_keys_answers():
    """Once the prefix reaches the end of the keys array, the C twin answers
    from it: a false positive needs no byte of the values."""
    keys = [b"k%03d" % i for i in range(0, 200, 2)]
    payload = msgpack.packb([keys, [b"v" * 50] * len(keys), [257] * len(keys), []],
                            use_bin_type=True)
    keys_end = len(msgpack.packb(keys, use_bin_type=True)) + 1
    for n in range(keys_end):
        assert C.block_keys_hold(payload[:n], len(payload), b"k005", None, keys[-1], 2) is None
    for n in (keys_end, keys_end + 1, len(payload)):
        assert C.block_keys_hold(payload[:n], len(payload), b"k005", None, keys[-1], 2) is False
        assert C.block_keys_hold(payload[:n], len(payload), b"k004", None, keys[-1], 2) is True
