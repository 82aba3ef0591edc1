"""The MANIFEST on its own: encode/decode round trip, validation, format 1, durable switch."""

from __future__ import annotations

import errno
import os

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lsmdb.files
from lsmdb.coding import crc32
from lsmdb.errors import CorruptionError, UnsupportedFormatError
from lsmdb.files import SwitchedButNotSynced
from lsmdb.logset import WalState
from lsmdb.manifest import (
    MANIFEST_FORMAT_VERSION,
    MANIFEST_HEADER,
    MANIFEST_MAGIC,
    FileMeta,
    Manifest,
    TableMeta,
)

u = st.integers(0, 2**40)
file_meta = st.builds(FileMeta, u, st.integers(0, 7), u, u, st.binary(max_size=8),
                      st.binary(max_size=8), u, u)
table_meta = st.builds(TableMeta, st.integers(1, 1000),
                       st.dictionaries(st.sampled_from(["bloom_filter_fp_chance",
                                                        "compaction"]),
                                       st.one_of(st.floats(0.001, 1.0), st.text(max_size=8)),
                                       max_size=2),
                       u, st.lists(file_meta, max_size=4))


@st.composite
def wal_states(draw):
    numbers = sorted(draw(st.sets(st.integers(1, 10**6), max_size=6)))
    cut = draw(st.integers(0, len(numbers)))
    closed, rest = numbers[:cut], numbers[cut:]
    live = rest.pop() if rest and draw(st.booleans()) else None
    return WalState([(n, draw(u), draw(st.sampled_from([1, 2]))) for n in closed],
                    [(n, draw(u)) for n in rest], live)


manifests = st.builds(Manifest, u, u, u,
                      st.dictionaries(st.from_regex(r"[a-z][a-z0-9_-]{0,10}", fullmatch=True),
                                      table_meta, max_size=4),
                      wal_states())


@st.composite
def consistent_manifests(draw):
    """Manifests whose counters hold: above every number and sequence they name."""
    m = draw(manifests)
    files = [f for t in m.tables.values() for f in t.files]
    m.next_file_number = max([m.next_file_number, 1, *(f.number + 1 for f in files)])
    m.next_table_id = max([m.next_table_id, 1, *(t.id + 1 for t in m.tables.values())])
    m.last_seq = max([m.last_seq, *(f.max_seq for f in files),
                      *(t.flushed_seq for t in m.tables.values())])
    m.db_id = draw(st.sampled_from(["", "0" * 32, "0123456789abcdef" * 2]))
    return m


@settings(max_examples=200, deadline=None)
@given(m=consistent_manifests())
def test_a_manifest_reads_back_as_written(m):
    assert not m.counter_errors()
    assert Manifest.decode(m.encode(), "MANIFEST") == m


@settings(max_examples=200, deadline=None)
@given(m=manifests)
def test_a_manifest_whose_counters_do_not_hold_is_corruption(m):
    if m.counter_errors():
        with pytest.raises(CorruptionError, match="counters out of range"):
            Manifest.decode(m.encode(), "MANIFEST")
    else:
        assert Manifest.decode(m.encode(), "MANIFEST") == m


@pytest.mark.parametrize("db_id", ["x" * 32, "ABCDEF0123456789" * 2, "0" * 31, 5])
def test_a_bad_database_id_is_corruption(db_id):
    with pytest.raises(CorruptionError, match="undecodable"):
        Manifest.decode(_payload_manifest({**BASE, "db_id": db_id}), "MANIFEST")


def _payload_manifest(obj, version: int = MANIFEST_FORMAT_VERSION) -> bytes:
    payload = msgpack.packb(obj, use_bin_type=True)
    return MANIFEST_HEADER.pack(MANIFEST_MAGIC, version, crc32(payload), len(payload)) + payload


BASE = {"next_file_number": 3, "next_table_id": 2, "last_seq": 9,
        "tables": {"default": {"id": 1, "options": {}, "flushed_seq": 0, "files": []}},
        "wal": {"closed": [], "unsynced": [], "live": 2}}


def test_a_format_1_manifest_has_no_wal_record():
    obj = {k: v for k, v in BASE.items() if k != "wal"}
    m = Manifest.decode(_payload_manifest(obj, version=1), "MANIFEST")
    assert m.wal is None and m.last_seq == 9 and list(m.tables) == ["default"]


@pytest.mark.parametrize("version", [0, MANIFEST_FORMAT_VERSION + 1])
def test_an_unknown_format_is_refused_as_unsupported(version):
    with pytest.raises(UnsupportedFormatError, match="format version"):
        Manifest.decode(_payload_manifest(BASE, version=version), "MANIFEST")


@pytest.mark.parametrize("bend", [
    lambda o: o["wal"].update(closed=[[5, 10, 2], [4, 10, 2]]),        # out of order
    lambda o: o["wal"].update(closed=[[4, 10, 3]]),                     # unknown segment format
    lambda o: o["wal"].update(unsynced=[[-1, 0]]),                      # negative number
    lambda o: o["wal"].update(live="2"),                                # live of the wrong type
    lambda o: o["tables"]["default"].update(files=[[1, 0, 10, 1, "a", b"b", 1, 1]]),  # str key
    lambda o: o["tables"]["default"].update(files=[[1, 0, -10, 1, b"a", b"b", 1, 1]]),
    lambda o: o["tables"]["default"].update(options=[]),
    lambda o: o.pop("tables"),
    lambda o: o["tables"].update({7: {"id": 2, "options": {}, "flushed_seq": 0, "files": []}}),
])
def test_a_well_checksummed_manifest_of_the_wrong_shape_is_corruption(bend):
    obj = msgpack.unpackb(msgpack.packb(BASE))
    bend(obj)
    with pytest.raises(CorruptionError) as info:
        Manifest.decode(_payload_manifest(obj), "/db/MANIFEST")
    assert info.value.path == "/db/MANIFEST" and info.value.offset == MANIFEST_HEADER.size


def test_every_truncation_is_corruption():
    data = Manifest.decode(_payload_manifest(BASE), "M").encode()
    for n in range(len(data)):
        with pytest.raises(CorruptionError):
            Manifest.decode(data[:n], "M")


def test_write_replaces_the_file_atomically_and_fsyncs_file_and_directory(tmp_path, monkeypatch):
    path = str(tmp_path / "MANIFEST")
    Manifest(next_file_number=1, next_table_id=2).write(path)
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        calls.append("fsync " + os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[-1])
        return real_fsync(fd)

    def replace(a, b):
        calls.append(f"replace {os.path.basename(a)} {os.path.basename(b)}")
        return real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    m = Manifest(next_file_number=7, next_table_id=2, tables={"default": TableMeta(1, {})})
    m.write(path)
    assert calls == ["fsync MANIFEST.tmp", "replace MANIFEST.tmp MANIFEST",
                     f"fsync {tmp_path.name}"]
    assert Manifest.read(path) == m and not os.path.exists(path + ".tmp")


def test_a_failed_directory_fsync_is_reported_as_switched_but_not_synced(tmp_path, monkeypatch):
    path = str(tmp_path / "MANIFEST")

    def fail(directory):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(lsmdb.files, "fsync_dir", fail)
    with pytest.raises(SwitchedButNotSynced):
        Manifest(next_file_number=5).write(path)
    assert Manifest.read(path).next_file_number == 5      # visible, durability unknown


def test_a_manifest_that_is_a_symbolic_link_is_never_followed(tmp_path):
    real = tmp_path / "elsewhere"
    Manifest(next_file_number=2).write(str(real))
    os.symlink(real, tmp_path / "MANIFEST")
    with pytest.raises(CorruptionError, match="symbolic link"):
        Manifest.read(str(tmp_path / "MANIFEST"))
