"""Checksummed blocks: encoding, the trailer check, decoding and validation, C and Python."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lsmdb.sstable_reader as reader_mod
from lsmdb.block import check_block, decode_data_block, encode_block, validate_data_block
from lsmdb.coding import BLOCK_TRAILER_SIZE
from lsmdb.errors import CorruptionError

entries = st.dictionaries(st.binary(max_size=12), st.one_of(st.none(), st.binary(max_size=30)),
                          max_size=40)


def data_block(d: dict[bytes, bytes | None]) -> bytes:
    keys = sorted(d)
    return encode_block([keys, [d[k] for k in keys]])


def test_the_worked_example_of_the_module_docstring():
    raw = encode_block([[b"a", b"b"], [b"1", None]])
    assert raw.hex(" ") == "92 92 c4 01 61 c4 01 62 92 c4 01 31 c0 90 83 be 5d"


@settings(max_examples=200, deadline=None)
@given(d=entries)
def test_a_data_block_reads_back_as_written(d):
    raw = data_block(d)
    payload = check_block(raw, "f.sst", 0, "data block")
    keys, values = decode_data_block(payload, "f.sst", 0)
    assert dict(zip(keys, values, strict=True)) == d and keys == sorted(d)
    validate_data_block(keys, values, "f.sst", 0)


def test_every_single_bit_flip_and_truncation_fails_the_checksum():
    raw = data_block({b"k%02d" % i: b"value" * (i % 3) or None for i in range(20)})
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


@pytest.mark.parametrize("obj", [
    {"a": 1}, [[b"a"]], [[b"a"], [b"1", b"2"]], [[1], [b"1"]], [[b"a"], [1]], [b"a", b"b"],
])
def test_a_checksummed_payload_of_the_wrong_shape_is_corruption(obj):
    payload = msgpack.packb(obj, use_bin_type=True)
    with pytest.raises(CorruptionError, match="data block") as info:
        decode_data_block(payload, "f.sst", 77)
    assert info.value.offset == 77


def test_an_undecodable_payload_is_corruption_not_a_msgpack_error():
    with pytest.raises(CorruptionError, match="undecodable"):
        decode_data_block(b"\xc1\xc1\xc1", "f.sst", 0)


def test_validation_catches_keys_out_of_order_or_repeated():
    with pytest.raises(CorruptionError, match="out of order"):
        validate_data_block([b"b", b"a"], [b"1", b"2"], "f.sst", 0)
    with pytest.raises(CorruptionError, match="out of order"):
        validate_data_block([b"a", b"a"], [b"1", b"2"], "f.sst", 0)


@settings(max_examples=300, deadline=None)
@given(d=entries, key=st.binary(max_size=12))
def test_block_may_hold_never_says_no_for_a_key_the_block_holds(d, key):
    raw = data_block(d)
    for k in d:
        assert reader_mod.block_may_hold(raw, k)
    if key in d:
        assert reader_mod.block_may_hold(raw, key)


def test_block_may_hold_rules_out_keys_whose_bytes_are_nowhere_in_the_block():
    raw = data_block({b"apple": b"red", b"banana": b"yellow"})
    assert not reader_mod.block_may_hold(raw, b"cherry")
    assert len(raw) > BLOCK_TRAILER_SIZE
