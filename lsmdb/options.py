"""Table options: validated, frozen, persisted in the manifest.

Only the options a user set explicitly are persisted; the effective
:class:`TableOptions` are resolved from them, so a default that depends on
another option (none yet) can follow it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from .ttl import MAX_TTL_SECONDS

# A filter below this false-positive chance would need more than ~29 bits per
# key; nothing in an LSM read path gains from that, and it catches typos such
# as 1e-60.
MIN_FP_CHANCE = 1e-6

MIN_BLOCK_SIZE_BYTES = 256
MAX_BLOCK_SIZE_BYTES = 4 * 1024 * 1024
MIN_MEMTABLE_SIZE_BYTES = 4 * 1024
MAX_MEMTABLE_SIZE_BYTES = 1024 * 1024 * 1024

DEFAULT_FP_CHANCE = 0.01          # size_tiered, as in Cassandra
DEFAULT_FP_CHANCE_LEVELED = 0.1   # leveled, as in Cassandra
DEFAULT_BLOCK_SIZE_BYTES = 4096
DEFAULT_MEMTABLE_SIZE_BYTES = 4 * 1024 * 1024

TABLE_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")
DEFAULT_TABLE = "default"


@dataclass(frozen=True)
class TableOptions:
    """Per-table settings.  Change them with ``db.alter_table(name, **options)``."""

    #: Target false-positive chance of the Bloom filter of each SSTable written
    #: from now on, as in Cassandra: 0.01 is about 1 % false positives;
    #: 1.0 means no filter.  Range: MIN_FP_CHANCE <= p <= 1.
    bloom_filter_fp_chance: float = DEFAULT_FP_CHANCE
    #: Uncompressed size a data block is cut at (the last entry may overrun it).
    block_size_bytes: int = DEFAULT_BLOCK_SIZE_BYTES
    #: Approximate memory a table's memtable may use before it is flushed.
    memtable_size_bytes: int = DEFAULT_MEMTABLE_SIZE_BYTES
    #: Which filter each SSTable written from now on embeds: "bloom" (k probes
    #: over the whole filter) or "blocked_bloom" (a key's probes in one 64-byte
    #: block: one cache miss per lookup, 3% more bits for the same
    #: false-positive chance at 0.01, 8% at 0.001).  Both are sized by
    #: bloom_filter_fp_chance.
    filter_family: str = "bloom"
    #: "active": a filter's "no" skips the read.  "shadow": the filter is asked
    #: and counted but the block is read anyway, so measured false negatives
    #: (which must be zero) and false positives can be checked before trusting it.
    bloom_filter_mode: str = "active"
    #: "fast" (xxh3_64, default) or "keyed": filter positions from blake2b keyed
    #: with a per-database secret, so nobody can craft keys offline that all
    #: hit the same bits (one blake2b per lookup: ~10x the cost of xxh3_64).
    bloom_filter_hash: str = "fast"
    #: "size_tiered" or "leveled" (see docs and README, "Compaction").
    compaction: str = "size_tiered"
    #: size_tiered: merge a bucket of similar-sized files once it holds this many.
    min_threshold: int = 4
    #: size_tiered: merge at most this many files at once.
    max_threshold: int = 32
    #: size_tiered: files smaller than this all fall in one bucket (Cassandra's
    #: min_sstable_size), so flushes of varied small sizes still get merged.
    min_sstable_size_bytes: int = 50 * 1024 * 1024
    #: leveled: size an output file is cut at in levels >= 1.
    target_file_size_bytes: int = 2 * 1024 * 1024
    #: Files in the last (bottom) level get no filter (RocksDB's
    #: optimize_filters_for_hits): pays when nearly every read is for a key that exists.
    bloom_filter_skip_last_level: bool = False
    #: How data blocks of the SSTables written from now on are compressed:
    #: "lz4" (default, as Cassandra's), "zstd" (smaller, slower to write) or
    #: "none".  A block that does not shrink by an eighth is stored as it is.
    compression: str = "lz4"
    #: Seconds a value put without ``ttl=`` lives (Cassandra's name): 0, the
    #: default, never expires.  Changing it affects later puts only.
    default_time_to_live: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Every option and its value."""
        return asdict(self)

    @classmethod
    def resolve(cls, explicit: Mapping[str, Any]) -> TableOptions:
        """Effective options from the explicitly set ones (validated).

        An unset ``bloom_filter_fp_chance`` follows the compaction strategy as
        in Cassandra: 0.01 for size_tiered, 0.1 for leveled.
        """
        values = validate_table_options(explicit)
        if "bloom_filter_fp_chance" not in values and values.get("compaction") == "leveled":
            values["bloom_filter_fp_chance"] = DEFAULT_FP_CHANCE_LEVELED
        opts = cls(**values)
        if opts.min_threshold > opts.max_threshold:
            raise ValueError(f"table option 'min_threshold' ({opts.min_threshold}) must not exceed "
                             f"'max_threshold' ({opts.max_threshold})")
        return opts


OPTION_NAMES = tuple(f.name for f in fields(TableOptions))

#: The values each str option takes.
OPTION_CHOICES: dict[str, tuple[str, ...]] = {
    "filter_family": ("bloom", "blocked_bloom"),
    "bloom_filter_mode": ("active", "shadow"),
    "bloom_filter_hash": ("fast", "keyed"),
    "compaction": ("size_tiered", "leveled"),
    "compression": ("lz4", "zstd", "none"),
}

#: Each option in a line, with its range (``lsmdb create-table --help``).
OPTION_HELP: dict[str, str] = {
    "bloom_filter_fp_chance": "target false-positive chance of each new SSTable's filter, "
                              f"{MIN_FP_CHANCE:g} to 1 (1.0: no filter; default 0.01, "
                              "leveled 0.1)",
    "block_size_bytes": f"data block size, {MIN_BLOCK_SIZE_BYTES} to {MAX_BLOCK_SIZE_BYTES} "
                        f"(default {DEFAULT_BLOCK_SIZE_BYTES})",
    "memtable_size_bytes": "memtable size a flush is started at, "
                           f"{MIN_MEMTABLE_SIZE_BYTES} to {MAX_MEMTABLE_SIZE_BYTES} "
                           f"(default {DEFAULT_MEMTABLE_SIZE_BYTES})",
    "filter_family": "bloom, or blocked_bloom (a key's probes in one cache line: one miss "
                     "per lookup in filters beyond the CPU caches; default bloom)",
    "bloom_filter_mode": "active: a filter's no skips the read; shadow: asked and counted, "
                         "the block read anyway (default active)",
    "bloom_filter_hash": "fast (xxh3_64) or keyed (blake2b with a per-database secret; "
                         "default fast)",
    "compaction": "compaction strategy (default size_tiered)",
    "min_threshold": "size_tiered: merge a bucket once it holds this many files, 2 to 32 "
                     "(default 4)",
    "max_threshold": "size_tiered: merge at most this many files at once, 2 to 32 (default 32)",
    "min_sstable_size_bytes": "size_tiered: files smaller than this share one bucket, "
                              "0 to 2**40 (default 50 MiB)",
    "target_file_size_bytes": "leveled: size output files are cut at, 64 KiB to 1 GiB "
                              "(default 2 MiB)",
    "bloom_filter_skip_last_level": "no filter for files in the last level (default false)",
    "compression": "data blocks of new SSTables: lz4, zstd (smaller, slower to read) or none "
                   "(default lz4)",
    "default_time_to_live": "seconds a value put without ttl= lives, 0 to 630720000 "
                            "(0, the default: never expires)",
}


def _int_option(name: str, value: Any, lo: int, hi: int, kind: str = "table option") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{kind} {name!r} must be an int, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValueError(f"{kind} {name!r} must be between {lo} and {hi}, got {value}")
    return value


def validate_fp_chance(value: Any, name: str = "bloom_filter_fp_chance") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"table option {name!r} must be a float, got {type(value).__name__}")
    p = float(value)
    if math.isnan(p) or not (MIN_FP_CHANCE <= p <= 1.0):
        raise ValueError(
            f"table option {name!r} must satisfy {MIN_FP_CHANCE:g} <= p <= 1 "
            f"(1.0 = no filter), got {value!r}"
        )
    return p


def validate_table_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Check every option and return a normalised copy; raises TypeError/ValueError."""
    out: dict[str, Any] = {}
    for name, value in options.items():
        if name not in OPTION_NAMES:
            raise TypeError(
                f"unknown table option {name!r}; known options: {', '.join(OPTION_NAMES)}")
        if name == "bloom_filter_fp_chance":
            out[name] = validate_fp_chance(value)
        elif name == "block_size_bytes":
            out[name] = _int_option(name, value, MIN_BLOCK_SIZE_BYTES, MAX_BLOCK_SIZE_BYTES)
        elif name == "memtable_size_bytes":
            out[name] = _int_option(name, value, MIN_MEMTABLE_SIZE_BYTES, MAX_MEMTABLE_SIZE_BYTES)
        elif name in OPTION_CHOICES:
            out[name] = _choice_option(name, value, OPTION_CHOICES[name])
        elif name == "min_threshold":
            out[name] = _int_option(name, value, 2, 32)
        elif name == "max_threshold":
            out[name] = _int_option(name, value, 2, 32)
        elif name == "min_sstable_size_bytes":
            out[name] = _int_option(name, value, 0, 1 << 40)
        elif name == "target_file_size_bytes":
            out[name] = _int_option(name, value, 64 * 1024, 1024 * 1024 * 1024)
        elif name == "bloom_filter_skip_last_level":
            out[name] = validate_bool(name, value)
        elif name == "default_time_to_live":
            out[name] = _int_option(name, value, 0, MAX_TTL_SECONDS)
    return out


def validate_bool(name: str, value: Any, kind: str = "table option") -> bool:
    """``value`` if it is a bool; anything else -- 0, 1, "no", None -- is a TypeError
    naming the option (``read_only="no"`` would otherwise mean True)."""
    if not isinstance(value, bool):
        raise TypeError(f"{kind} {name!r} must be a bool (True or False), got "
                        f"{type(value).__name__} {value!r}")
    return value


def _choice_option(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str):
        raise TypeError(f"table option {name!r} must be a str, got {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"table option {name!r} must be one of {', '.join(map(repr, choices))}, "
                         f"got {value!r}")
    return value


def validate_table_name(name: Any) -> str:
    if not isinstance(name, str):
        raise TypeError(f"table name must be a str, got {type(name).__name__}")
    if not TABLE_NAME_RE.match(name):
        raise ValueError(
            f"invalid table name {name!r}: use 1-64 characters from letters, digits, '_' and '-'"
        )
    return name


#: ``max_total_wal_size_bytes`` (a database option, ``lsmdb.open``): the range.
MIN_TOTAL_WAL_SIZE_BYTES = 64 * 1024
MAX_TOTAL_WAL_SIZE_BYTES = 1 << 48


def validate_max_total_wal_size(value: Any) -> int | None:
    """``max_total_wal_size_bytes``: None (four times the memtables' total) or an int."""
    if value is None:
        return None
    return _int_option("max_total_wal_size_bytes", value, MIN_TOTAL_WAL_SIZE_BYTES,
                       MAX_TOTAL_WAL_SIZE_BYTES, "option")
