"""lsmdb.coding: CRC-32, in Python (zlib) and in C (folded with PCLMULQDQ): the same
checksum on every length, alignment, start value and input."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

try:
    from lsmdb import _speedups as speedups
except ImportError:  # pragma: no cover - built without a C compiler
    speedups = None  # type: ignore[assignment]
needs_c = pytest.mark.skipif(speedups is None, reason="built without a C compiler")


@needs_c
def test_crc32_equals_zlib_on_every_length_alignment_and_start_value():
    import zlib
    rng = random.Random(7)
    for n in [*range(0, 700), 4095, 4096, 4100, 65_536, 65_537, 1_000_003]:
        data = bytes(rng.getrandbits(8) for _ in range(n + 3)) if n < 5000 else os.urandom(n + 3)
        for off in range(3):
            view = memoryview(data)[off:off + n]
            value = rng.getrandbits(32)
            assert speedups.crc32(view) == zlib.crc32(view), (n, off)
            assert speedups.crc32(view, value) == zlib.crc32(view, value), (n, off)
    assert speedups.crc32(bytearray(b"abc"), 2**40 + 5) == zlib.crc32(b"abc", 2**40 + 5)
    with pytest.raises(TypeError):
        speedups.crc32("text")


_CRC_LENGTHS = [*range(0, 1100, 7), *range(250, 300), 4095, 4096, 4100, 65_536, 1_000_003]


@needs_c
@pytest.mark.parametrize("wide", [True, False])
def test_crc32_equals_zlib_with_either_fold(wide):
    """The fold on 256-bit lanes (VPCLMULQDQ, where the CPU has it) and the
    one on 128-bit lanes (set_crc32_wide(False) keeps it) both give zlib's
    value, from the lengths each takes on."""
    import zlib
    rng = random.Random(9)
    assert speedups.CRC32_VPCLMUL <= speedups.CRC32_CLMUL
    try:
        assert speedups.set_crc32_wide(wide) is (wide and bool(speedups.CRC32_VPCLMUL))
        for n in _CRC_LENGTHS:
            data = os.urandom(n + 3)
            for off in range(3):
                view = memoryview(data)[off:off + n]
                value = rng.getrandbits(32)
                assert speedups.crc32(view, value) == zlib.crc32(view, value), (n, off)
    finally:
        speedups.set_crc32_wide(True)
    assert speedups.set_crc32_wide(True) is bool(speedups.CRC32_VPCLMUL)


@needs_c
def test_the_crc32_fold_is_chosen_by_a_bool():
    with pytest.raises(TypeError):
        speedups.set_crc32_wide(0)
    with pytest.raises(TypeError):
        speedups.set_crc32_wide("no")


@needs_c
@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=3000), st.integers(0, 2**32 - 1))
def test_crc32_equals_zlib_on_any_input(data, value):
    import zlib
    assert speedups.crc32(data, value) == zlib.crc32(data, value)


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=5000))
def test_the_crc32_residue_checks_payload_and_trailer_in_one_pass(payload):
    from lsmdb.coding import crc32
    from lsmdb.sstable_format import CRC32_RESIDUE
    good = payload + crc32(payload).to_bytes(4, "little")
    assert crc32(good) == CRC32_RESIDUE
    for bad_trailer in (crc32(payload) ^ 1, crc32(payload) ^ 0x80000000):
        assert crc32(payload + bad_trailer.to_bytes(4, "little")) != CRC32_RESIDUE
    if payload:
        flipped = bytes([payload[0] ^ 0x10]) + payload[1:]
        assert crc32(flipped + crc32(payload).to_bytes(4, "little")) != CRC32_RESIDUE


@needs_c
def test_the_c_crc32_is_used_where_it_is_faster():
    import zlib

    import lsmdb.coding
    assert lsmdb.coding.crc32 is (speedups.crc32 if speedups.CRC32_CLMUL else zlib.crc32)


