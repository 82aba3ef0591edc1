"""The keys and values both benchmarks load: key number i -> ``b"user:%010d" % i``.

Present keys are the even numbers, so every odd number is an absent key that
sorts between two present ones.  The value of key i is 100 bytes derived from
i, so a wrong value read back is recognised.

Example:
    >>> key_of(42), number_of(key_of(42)), len(value_of(42))
    (b'user:0000000042', 42, 100)
"""

from __future__ import annotations

import random
from typing import Any

KEY_FORMAT = b"user:%010d"     # key number i -> key; present keys are even, absent odd
KEY_PREFIX_LEN = len(b"user:")
VALUE_BYTES = 100


def key_of(number: int) -> bytes:
    return KEY_FORMAT % number


def value_of(number: int) -> bytes:
    """The 100-byte value stored under ``key_of(number)``."""
    return (b"%010d" % number) * (VALUE_BYTES // 10)


def number_of(key: bytes) -> int:
    return int(key[KEY_PREFIX_LEN:])


def load_shuffled(db: Any, n: int, rng: random.Random, batch: int = 10_000) -> list[int]:
    """Put the present keys ``key_of(2 * i)`` for i < n into ``db`` in a random order
    (``rng``), ``batch`` to a ``db.batch()``; returns that order."""
    order = list(range(n))
    rng.shuffle(order)
    for chunk in range(0, n, batch):
        with db.batch() as b:
            for i in order[chunk:chunk + batch]:
                b.put(key_of(2 * i), value_of(2 * i))
    return order
