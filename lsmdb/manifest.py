"""The manifest: the tables, their options and SSTables, and the WAL segments.

One file, ``MANIFEST``, rewritten whole and switched atomically (temp file,
fsync, ``os.replace``, fsync the directory) on every change::

    magic b"LSMDBMAN" | format_version u32 | crc32 u32 | length u32 | payload

The payload is msgpack (docs/FORMAT.md §6).  Format 2 adds ``wal``: the live
WAL segment and every closed one still needed, with its size
(:class:`lsmdb.logset.WalState`); a format-1 manifest has none (its
segments are whatever is on disk) and is still read.  A manifest that fails
its checksum is a CorruptionError: it is never treated as empty, so no
"orphan" sweep can delete a database because of it.
"""

from __future__ import annotations

import errno
import re
import secrets
import struct
from dataclasses import dataclass, field
from typing import Any

import msgpack

from .coding import crc32
from .errors import CorruptionError, UnsupportedFormatError
from .files import MANIFEST_NAME, read_file, write_file_durably
from .logset import WalState
from .sstable_format import MAX_SEQ

#: The largest file number or table id a manifest may name: a signed 64-bit integer.
MAX_COUNTER = (1 << 63) - 1
#: A database id: 32 lowercase hex digits (new_db_id).
DB_ID_RE = re.compile(r"[0-9a-f]{32}\Z")


def new_db_id() -> str:
    """A new database identity: 128 random bits as hex."""
    return secrets.token_hex(16)

__all__ = ["MANIFEST_NAME", "Manifest", "TableMeta", "FileMeta"]

MANIFEST_MAGIC = b"LSMDBMAN"  # DO NOT CHANGE: on disk.
MANIFEST_FORMAT_VERSION = 2   # DO NOT CHANGE: on disk (1: no "wal"; still read).
MANIFEST_HEADER = struct.Struct("<8sIII")
assert MANIFEST_HEADER.size == 20


@dataclass
class FileMeta:
    """One SSTable as the manifest records it."""

    number: int
    level: int
    size: int
    entries: int
    min_key: bytes
    max_key: bytes
    min_seq: int
    max_seq: int

    def to_obj(self) -> list[Any]:
        return [self.number, self.level, self.size, self.entries, self.min_key, self.max_key,
                self.min_seq, self.max_seq]

    @classmethod
    def from_obj(cls, obj: Any) -> FileMeta:
        number, level, size, entries, min_key, max_key, min_seq, max_seq = obj
        for v in (number, level, size, entries, min_seq, max_seq):
            if type(v) is not int or v < 0:
                raise ValueError("bad integer")
        if type(min_key) is not bytes or type(max_key) is not bytes:
            raise ValueError("bad key")
        return cls(number, level, size, entries, min_key, max_key, min_seq, max_seq)


@dataclass
class TableMeta:
    id: int
    options: dict[str, Any]          # explicitly set options only
    flushed_seq: int = 0             # WAL records <= this are in SSTables
    files: list[FileMeta] = field(default_factory=list)


@dataclass
class Manifest:
    next_file_number: int = 1
    next_table_id: int = 1
    last_seq: int = 0
    tables: dict[str, TableMeta] = field(default_factory=dict)
    #: The WAL segments (None only when read from a format-1 manifest).
    wal: WalState | None = field(default_factory=WalState)
    #: The database's identity, made at creation (32 hex digits), which each
    #: format-2 SSTable records; "" in a manifest written before there was one.
    db_id: str = ""

    def encode(self) -> bytes:
        payload = msgpack.packb({
            "next_file_number": self.next_file_number,
            "next_table_id": self.next_table_id,
            "last_seq": self.last_seq,
            "tables": {
                name: {"id": t.id, "options": t.options, "flushed_seq": t.flushed_seq,
                       "files": [f.to_obj() for f in t.files]}
                for name, t in sorted(self.tables.items())
            },
            "wal": (self.wal or WalState()).to_obj(),
            **({"db_id": self.db_id} if self.db_id else {}),
        }, use_bin_type=True)
        return MANIFEST_HEADER.pack(MANIFEST_MAGIC, MANIFEST_FORMAT_VERSION, crc32(payload),
                                    len(payload)) + payload

    @classmethod
    def decode(cls, data: bytes, path: str) -> Manifest:
        if len(data) < MANIFEST_HEADER.size:
            raise CorruptionError("manifest truncated", path, 0)
        magic, version, crc, length = MANIFEST_HEADER.unpack_from(data, 0)
        if magic != MANIFEST_MAGIC:
            raise CorruptionError("bad manifest magic", path, 0)
        if version > MANIFEST_FORMAT_VERSION or version == 0:
            raise UnsupportedFormatError(
                f"{path}: manifest format version {version}; this lsmdb reads "
                f"{MANIFEST_FORMAT_VERSION}")
        payload = data[MANIFEST_HEADER.size:]
        if len(payload) != length:
            raise CorruptionError("manifest length mismatch", path, MANIFEST_HEADER.size)
        if crc32(payload) != crc:
            raise CorruptionError("manifest checksum mismatch", path, MANIFEST_HEADER.size)
        try:
            obj = msgpack.unpackb(payload, raw=False)
            m = cls(int(obj["next_file_number"]), int(obj["next_table_id"]), int(obj["last_seq"]),
                    wal=WalState.from_obj(obj["wal"]) if version >= 2 else None,
                    db_id=obj.get("db_id", ""))
            if type(m.db_id) is not str or (m.db_id and not DB_ID_RE.match(m.db_id)):
                raise ValueError("bad database id")
            for name, t in obj["tables"].items():
                if type(name) is not str or type(t["options"]) is not dict:
                    raise ValueError("bad table entry")
                m.tables[name] = TableMeta(int(t["id"]), dict(t["options"]), int(t["flushed_seq"]),
                                           [FileMeta.from_obj(f) for f in t["files"]])
        except CorruptionError:
            raise
        except Exception as exc:
            raise CorruptionError(f"manifest undecodable ({type(exc).__name__})", path,
                                  MANIFEST_HEADER.size) from None
        why = m.counter_errors()
        if why:
            raise CorruptionError(f"manifest counters out of range: {why}", path,
                                  MANIFEST_HEADER.size)
        return m

    def counter_errors(self) -> str:
        """Why the counters lie outside what the formats hold or contradict the
        numbers handed out ("" when they don't): a sequence number must fit an
        entry's tag, file numbers and table ids a signed 64-bit integer, and
        every file and table must have a number below the next one."""
        if not 0 <= self.last_seq <= MAX_SEQ:
            return f"last_seq {self.last_seq} (at most {MAX_SEQ})"
        for name, value in (("next_file_number", self.next_file_number),
                            ("next_table_id", self.next_table_id)):
            if not 1 <= value <= MAX_COUNTER:
                return f"{name} {value} (from 1 to {MAX_COUNTER})"
        for name, t in self.tables.items():
            if not 1 <= t.id < self.next_table_id:
                return f"table {name!r} has id {t.id}, next_table_id is {self.next_table_id}"
            if t.flushed_seq > self.last_seq:
                return f"table {name!r} flushed_seq {t.flushed_seq} > last_seq {self.last_seq}"
            for f in t.files:
                if f.number >= self.next_file_number:
                    return (f"file {f.number} of table {name!r}, next_file_number is "
                            f"{self.next_file_number}")
                if f.max_seq > self.last_seq:
                    return f"file {f.number} max_seq {f.max_seq} > last_seq {self.last_seq}"
        return ""

    def write(self, path: str) -> None:
        write_file_durably(path, self.encode())

    @classmethod
    def read(cls, path: str) -> Manifest:
        return cls.decode(read_bytes(path), path)


def read_bytes(path: str) -> bytes:
    """The bytes of the MANIFEST at ``path`` (a symbolic link is a CorruptionError)."""
    try:
        return read_file(path)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.EINVAL):
            raise
        raise CorruptionError("MANIFEST is not a regular file (a symbolic link is never "
                              "followed)", path) from None
