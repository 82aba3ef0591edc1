"""The WAL set on its own: rotation, sync, retirement and replay, against a model.

A state machine drives a :class:`~lsmdb.logset.LogSet` the way the engine
does -- appends, rotations that leave the closed segment synced or unsynced,
``sync()``, flushes that retire what the memtables no longer need, a manifest
switch that fails -- and after every step replays the directory from the
last manifest record (``state()``) the machine "committed": every record a
memtable still needs must come back, in order, nothing after it is lost, and
nothing the model never wrote appears.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lsmdb.files import wal_name
from lsmdb.logset import LogSet, WalState, encode_record
from lsmdb.wal import read_segment_file


class LogSetMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="lsmdb-logset-")
        self.log = LogSet(self.dir)
        self.seq = 0
        self.low = 1          # the oldest sequence number a memtable still holds
        self.next_number = 1
        self.records: dict[int, bytes] = {}
        self.manifest: WalState | None = None
        self.log.rotate(self._number(), self._commit)

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _number(self) -> int:
        n, self.next_number = self.next_number, self.next_number + 1
        return n

    def _low(self) -> int | None:
        return self.low if self.low <= self.seq else None

    def _commit(self) -> None:
        self.manifest = self.log.state(self._low())

    @rule(value=st.binary(max_size=3000), sync=st.booleans())
    def append(self, value, sync):
        self.seq += 1
        payload = encode_record(self.seq, [(1, b"k%d" % self.seq, value)])
        self.log.append(self.seq, payload, sync)
        self.records[self.seq] = payload
        if self.log.promoted:
            self._commit()

    @rule(sync=st.booleans())
    def rotate(self, sync):
        self.log.rotate(self._number(), self._commit, sync=sync)

    @rule()
    def rotate_with_a_failing_switch(self):
        before = (self.log.state(self._low()), os.listdir(self.dir))
        self.log.promoted = False

        def fail():
            raise OSError(errno.ENOSPC, "No space left on device")

        with pytest.raises(OSError):
            self.log.rotate(self._number(), fail, sync=False)
        assert (self.log.state(self._low()), os.listdir(self.dir)) == before

    @rule()
    def sync(self):
        self.log.sync()
        if self.log.promoted:
            self._commit()

    @precondition(lambda self: self.seq >= self.low)
    @rule(data=st.data())
    def flush(self, data):
        """A flush put every record up to some sequence number in SSTables."""
        self.low = data.draw(st.integers(self.low + 1, self.seq + 1))
        self._commit()
        self.log.retire(self._low())

    @invariant()
    def holds_its_invariants(self):
        self.log._check()
        on_disk = sorted(int(n[4:10]) for n in os.listdir(self.dir) if n.startswith("wal-"))
        held = [s.number for s in self.log.closed + self.log.unsynced] + [self.log.live.number]
        assert on_disk == held
        def file_bytes(number: int) -> int:
            return os.path.getsize(os.path.join(self.dir, wal_name(number)))

        # A closed writer cut its file to its records; an open one has space ahead.
        for seg in self.log.closed + self.log.unsynced:
            if seg.writer is None:
                assert file_bytes(seg.number) == seg.size
            else:
                assert file_bytes(seg.number) >= seg.size
        assert self.log.writer is not None
        assert file_bytes(self.log.live.number) >= self.log.writer.size
        assert self.log.total_bytes == sum(s.size for s in self.log.closed + self.log.unsynced) \
            + self.log.writer.size

    @invariant()
    def the_last_manifest_replays_every_record_still_needed(self):
        assert self.manifest is not None
        on_disk = sorted(int(n[4:10]) for n in os.listdir(self.dir) if n.startswith("wal-"))
        got: list[int] = []
        replayed = LogSet(self.dir).replay(self.manifest, on_disk,
                                           lambda seq, ops: got.append(seq))
        assert replayed.torn == [] and got == sorted(got)
        assert set(range(self.low, self.seq + 1)) <= set(got) <= set(self.records)
        if got:
            assert got == list(range(got[0], self.seq + 1))   # no hole

    @invariant()
    def closed_synced_segments_are_read_strictly(self):
        for seg in self.log.closed:
            result = read_segment_file(os.path.join(self.dir, wal_name(seg.number)),
                                       seg.number, seg.size, seg.format)
            assert not result.torn and result.valid_length == seg.size


LogSetMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30,
                                           deadline=None)
TestLogSet = LogSetMachine.TestCase


try:
    from lsmdb import _speedups as speedups
except ImportError:  # pragma: no cover - built without a C compiler
    speedups = None  # type: ignore[assignment]
needs_c = pytest.mark.skipif(speedups is None, reason="built without a C compiler")


_UINTS = st.sampled_from([0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1]) \
    | st.integers(0, 2**64 - 1)


@settings(max_examples=500, deadline=None)
@given(_UINTS, _UINTS,
       st.lists(st.tuples(st.binary(max_size=300), st.none() | st.binary(max_size=300)),
                max_size=40))
@needs_c
def test_encode_ops_writes_what_msgpack_writes(seq, table_id, ops):
    import msgpack

    from lsmdb.logset import encode_record, encode_table_record
    keys, values = [k for k, _ in ops], [v for _, v in ops]
    want = msgpack.packb([seq, [[table_id, k, v] for k, v in ops]], use_bin_type=True)
    assert speedups.encode_ops(seq, table_id, keys, values) == want
    assert encode_table_record(seq, table_id, keys, values) == want
    assert encode_record(seq, [(table_id, k, v) for k, v in ops]) == want


@needs_c
def test_encode_ops_on_long_batches_and_long_values_and_bad_input():
    import msgpack
    for n in (15, 16, 65535, 65536):  # fixarray, array16 and array32 headers
        keys = [b"k%d" % i for i in range(n)]
        values = [None if i % 3 == 0 else b"v" for i in range(n)]
        want = msgpack.packb([7, [[2, k, v] for k, v in zip(keys, values, strict=True)]],
                             use_bin_type=True)
        assert speedups.encode_ops(7, 2, keys, values) == want
    for size in (255, 256, 65535, 65536, 70000):  # bin8, bin16 and bin32
        value = b"x" * size
        assert speedups.encode_ops(1, 1, [value], [value]) == msgpack.packb(
            [1, [[1, value, value]]], use_bin_type=True)
    with pytest.raises(TypeError):
        speedups.encode_ops(1, 1, [b"k"], ["str"])
    with pytest.raises(TypeError):
        speedups.encode_ops(1, 1, (b"k",), [b"v"])
    with pytest.raises(ValueError):
        speedups.encode_ops(1, 1, [b"k"], [])
    with pytest.raises(OverflowError):
        speedups.encode_ops(-1, 1, [], [])


