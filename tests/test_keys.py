"""The key order: bytes compared bytewise, a shorter prefix first -- in Python the
order of bytes itself, in C mem_order (lsmdb/csrc/keys.h), the same."""

from __future__ import annotations

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
@settings(max_examples=3000, deadline=None)
@given(st.binary(max_size=40), st.binary(max_size=40), st.binary(max_size=20))
def test_the_c_key_order_is_bytes_order(a, b, prefix):
    for x, y in ((a, b), (prefix + a, prefix + b), (a, a + b), (prefix + a, prefix)):
        assert speedups._cmp(x, y) == (x > y) - (x < y)


@needs_c
def test_the_c_key_order_at_every_length_and_position():
    """Keys of 0 to 33 bytes that differ in one byte, either way, at every
    position, or only in length: the compare takes 8 bytes at a time and the
    last, overlapping 8 bytes of the shorter key at once."""
    rng = random.Random(5)
    for n in range(34):
        base = bytes(rng.randrange(1, 255) for _ in range(n))
        others = [base[:j] + bytes([(base[j] + d) % 256]) + base[j + 1:]
                  for j in range(n) for d in (1, -1, 128)]
        others += [base[:j] for j in range(n)] + [base + b"\0", base + b"\xff"]
        for other in others:
            for x, y in ((base, other), (other, base), (base, base)):
                assert speedups._cmp(x, y) == (x > y) - (x < y), (x, y)


