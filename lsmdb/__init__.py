"""lsmdb: an embedded LSM key-value store with Bloom filters that earn their memory.

    >>> import lsmdb, tempfile
    >>> db = lsmdb.open(tempfile.mkdtemp())
    >>> db.put(b"hello", b"world")
    >>> db.get(b"hello")
    b'world'
    >>> db.close()
"""

from .bloom import BloomFilter
from .db import DB, open
from .errors import (
                     CorruptionError,
                     DatabaseClosedError,
                     DatabaseLockedError,
                     LsmdbError,
                     NoSuchTableError,
                     NotADatabaseError,
                     ReadOnlyError,
                     TableExistsError,
                     UnsupportedFormatError,
)
from .keys import MAX_KEY_SIZE_BYTES, MAX_VALUE_SIZE_BYTES
from .options import TableOptions
from .table import SSTableInfo, Table, WriteBatch

__version__ = "0.1.0"

__all__ = [
    "open", "DB", "Table", "WriteBatch", "SSTableInfo", "TableOptions", "BloomFilter",
    "LsmdbError", "CorruptionError", "UnsupportedFormatError", "DatabaseLockedError",
    "DatabaseClosedError", "TableExistsError", "NoSuchTableError", "NotADatabaseError",
    "ReadOnlyError", "MAX_KEY_SIZE_BYTES", "MAX_VALUE_SIZE_BYTES", "__version__",
]
