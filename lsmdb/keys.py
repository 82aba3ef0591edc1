"""Validation of keys and values at the API edge.

Keys and values are bytes; ``bytearray`` and ``memoryview`` are accepted and
copied.  Anything else is a ``TypeError`` -- nothing is encoded silently.
"""

from __future__ import annotations

from typing import Any

#: Largest key accepted, in bytes (the empty key is valid).
MAX_KEY_SIZE_BYTES = 64 * 1024
#: Largest value accepted, in bytes.
MAX_VALUE_SIZE_BYTES = 64 * 1024 * 1024
#: Largest total of keys and values in one batch, in bytes.
MAX_BATCH_SIZE_BYTES = 512 * 1024 * 1024


def _convert(obj: Any, what: str) -> bytes:
    if isinstance(obj, (bytearray, memoryview)):
        return bytes(obj)
    if isinstance(obj, bytes):
        return bytes(obj)
    if isinstance(obj, str):
        raise TypeError(f"{what} must be bytes, not str; encode it first, e.g. {what}.encode()")
    raise TypeError(f"{what} must be bytes, bytearray or memoryview, not {type(obj).__name__}")


def as_key(key: Any) -> bytes:
    if type(key) is not bytes:
        key = _convert(key, "key")
    if len(key) > MAX_KEY_SIZE_BYTES:
        raise ValueError(f"key of {len(key)} bytes exceeds the limit of {MAX_KEY_SIZE_BYTES} bytes")
    return key


def as_value(value: Any) -> bytes:
    if type(value) is not bytes:
        value = _convert(value, "value")
    if len(value) > MAX_VALUE_SIZE_BYTES:
        raise ValueError(
            f"value of {len(value)} bytes exceeds the limit of {MAX_VALUE_SIZE_BYTES} bytes")
    return value
