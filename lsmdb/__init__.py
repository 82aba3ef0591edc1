"""lsmdb: an embedded LSM key-value store with Bloom filters that earn their memory.

    >>> import lsmdb, tempfile
    >>> db = lsmdb.open(tempfile.mkdtemp())
    >>> db.put(b"hello", b"world")
    >>> db.get(b"hello")
    b'world'
    >>> db.close()
"""

from .db import DB, open
from .errors import (
    CorruptionError,
    DatabaseClosedError,
    DatabaseForkedError,
    DatabaseLockedError,
    LsmdbError,
    NoSuchTableError,
    NotADatabaseError,
    ReadOnlyError,
    TableExistsError,
    UnsupportedFormatError,
)
from .filters.bloom import BloomFilter
from .handles import Table, WriteBatch
from .keys import MAX_KEY_SIZE_BYTES, MAX_VALUE_SIZE_BYTES
from .options import TableOptions
from .snapshot import Snapshot
from .table import SSTableInfo

__version__ = "0.1.0"

from .fastpath import C_READ_PATH, LAYOUT_ERRORS

#: True when the optional C speedups (lsmdb/csrc/) were built and are in use:
#: per-file read steps, get_many, merges and filter building.  Without them
#: (no C compiler at install time, or an extension built from other sources:
#: ``lsmdb.fastpath.LAYOUT_ERRORS``) the same code runs in Python.
SPEEDUPS = C_READ_PATH

#: What ``import lsmdb`` warns (a RuntimeWarning, once) when lsmdb._speedups is missing.
NO_SPEEDUPS_WARNING = (
    "lsmdb runs without its C speedups (lsmdb._speedups is not built): the same code runs "
    "in Python, absent-key gets about 30x slower. To get them, install a C compiler and the "
    "Python headers (e.g. gcc and python3-dev) and reinstall lsmdb (pip install "
    "--force-reinstall --no-cache-dir lsmdb, or pip install . in a checkout)")

if not SPEEDUPS and not LAYOUT_ERRORS:  # an extension that does not match warns in fastpath
    import warnings as _warnings
    _warnings.warn(NO_SPEEDUPS_WARNING, RuntimeWarning, stacklevel=2)

__all__ = [
    "open", "DB", "Table", "WriteBatch", "Snapshot", "SSTableInfo", "TableOptions", "BloomFilter",
    "LsmdbError", "CorruptionError", "UnsupportedFormatError", "DatabaseLockedError",
    "DatabaseClosedError", "DatabaseForkedError", "TableExistsError", "NoSuchTableError",
    "NotADatabaseError", "ReadOnlyError", "MAX_KEY_SIZE_BYTES", "MAX_VALUE_SIZE_BYTES",
    "SPEEDUPS", "NO_SPEEDUPS_WARNING", "__version__",
]
