"""Compactions in a helper process, so that merges do not hold this process's
interpreter lock.

A compaction reads its inputs and writes new files; nothing the database
serves changes until its outputs are installed through the manifest
(lsmdb.compactor).  That part -- the merge, block building, compression,
filter building, checksums, file writes and fsyncs -- is what a *worker*
process runs: a Python started from ``sys.executable`` that imports this
same lsmdb and runs :func:`lsmdb.compaction.write_merged`, the code a
compaction in this process runs, on a :class:`lsmdb.compaction.MergeSpec`
(the job in plain values).  This process meanwhile waits on a pipe, without
the interpreter lock, so its writers and readers keep running.

The protocol, length-prefixed pickles over the worker's stdin and stdout:

* ``("merge", spec)``: run one merge.  The worker asks for each new file's
  number (``("alloc",)``, answered ``("number", n)``) -- numbers come from
  the database, which persists them -- and answers ``("done", outputs,
  history)``, lists of ``(path, number, level)`` of complete, fsynced files,
  or ``("error", exception)`` after deleting what it wrote.

This process then fsyncs each output itself before installing it (the files
are durable by the time any manifest names them, whoever wrote them), and
opens them.  A worker that dies mid-merge is an error of that compaction (its
files are deleted here; the next compaction starts a new worker).  A worker
never outlives this process: it watches a pipe only this process holds open,
and exits the moment that pipe closes, without touching the files.

A worker runs at a lower priority than this process (``WORKER_NICE``).
Workers are shared by every database of the process and kept (at most
``MAX_IDLE``) for the next compaction; a fork leaves the child none.  When no
worker can start (no ``sys.executable``, a Python that cannot import this
lsmdb), compactions run in this process, with a warning once.
"""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

from .errors import LsmdbError

if TYPE_CHECKING:
    from .compaction import Cancel

log = logging.getLogger("lsmdb")

#: Idle workers kept for later compactions.
MAX_IDLE = 2
#: A worker lowers its scheduling priority by this much (``os.nice``): on a
#: busy machine its merges take the CPU the writers and readers leave, and
#: catch up when they pause; a table whose level 0 grows meanwhile slows its
#: writers down (lsmdb.compaction.L0_SLOWDOWN_FILES).
WORKER_NICE = 10

_FRAME = struct.Struct("<Q")

# The worker's command: the directory holding this lsmdb at the head of its
# path, in place of the working directory (``python -c`` puts it there as "",
# unless PYTHONSAFEPATH: it may hold another lsmdb, a checkout, or a module
# that shadows a dependency), block the no-speedups warning (the parent warned
# already) and serve on the pipes.
_BOOT = ("import sys; sys.path[:1] = [sys.argv[2], *sys.path[:1]] if sys.path[:1] != [''] "
         "else [sys.argv[2]];"
         "import warnings; warnings.filterwarnings('ignore', 'lsmdb runs without its C speedups');"
         "import lsmdb.worker as w; w.serve(int(sys.argv[1]))")

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class WorkerError(LsmdbError):
    """A compaction's worker process could not start or exited mid-merge."""


def _send(out: IO[bytes], message: object) -> None:
    data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
    out.write(_FRAME.pack(len(data)) + data)
    out.flush()


def _recv(inp: IO[bytes]) -> Any:
    """The next message, or None at the end of the stream."""
    header = inp.read(_FRAME.size)
    if len(header) < _FRAME.size:
        return None
    (size,) = _FRAME.unpack(header)
    data = inp.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


class Worker:
    """One worker process, used by one merge at a time."""

    def __init__(self) -> None:
        if not sys.executable:
            raise WorkerError("no Python executable to start a compaction worker with")
        root = os.path.dirname(_PACKAGE_DIR)  # so the worker imports this very lsmdb
        life_r, self._life = os.pipe()  # the worker exits when this process lets go of it
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(life_r), root], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, pass_fds=(life_r,), close_fds=True)
        except BaseException:
            os.close(self._life)
            raise
        finally:
            os.close(life_r)
        self.pid = os.getpid()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._out: IO[bytes] = self.proc.stdin
        self._in: IO[bytes] = self.proc.stdout
        hello = _recv(self._in)
        if not (isinstance(hello, tuple) and hello[:2] == ("ready", _PACKAGE_DIR)):
            self.close()
            raise WorkerError(f"the compaction worker did not start as lsmdb in {_PACKAGE_DIR} "
                              f"(it said {hello!r}, exit status {self.proc.poll()})")

    def merge(self, spec: Any, alloc_number: Callable[[], int],
              path_for: Callable[[int], str]) -> tuple[list[tuple[str, int, int]],
                                                      list[tuple[str, int, int]]]:
        """Run ``spec`` (a MergeSpec): its outputs and history files, each
        ``(path, number, level)``, complete and fsynced.  On any failure every
        file the merge was numbered is deleted and the error raised."""
        numbers: list[int] = []
        try:
            try:
                _send(self._out, ("merge", spec))
                while True:
                    message = _recv(self._in)
                    if message is None:
                        raise BrokenPipeError
                    if message[0] == "alloc":
                        numbers.append(alloc_number())
                        _send(self._out, ("number", numbers[-1]))
                    elif message[0] == "done":
                        return message[1], message[2]
                    else:
                        raise message[1]
            except BrokenPipeError:  # its end of a pipe closed: it is gone
                raise WorkerError(f"the compaction worker (pid {self.proc.pid}) exited "
                                  f"mid-merge (status {self.proc.wait()})") from None
        except BaseException:
            for number in numbers:
                try:
                    os.unlink(path_for(number))
                except OSError:
                    pass
            raise

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """Stop the worker at once (a merge it runs then fails as if it died)."""
        try:
            self.proc.kill()
        except OSError:
            pass

    def let_go(self) -> None:
        """Close this process's ends of the worker's pipes, without waiting:
        once no process holds them, the worker sees the end of its input."""
        for f in (self._out, self._in):
            try:
                f.close()
            except OSError:
                pass
        try:
            os.close(self._life)
        except OSError:
            pass

    def close(self) -> None:
        """Let the worker go: it exits at the end of its input."""
        self.let_go()
        try:
            self.proc.wait(2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_lock = threading.Lock()
_idle: list[Worker] = []
_owner = os.getpid()
_broken: str | None = None   # why no worker can start here (then: compact in-process)
_warming = False             # a worker is being started ahead of its first merge


def available() -> bool:
    """Can compactions run in a worker process here (none failed to start)?"""
    return _broken is None


def merge(spec: Any, alloc_number: Callable[[], int],
          path_for: Callable[[int], str], cancel: Cancel | None = None
          ) -> tuple[list[tuple[str, int, int]], list[tuple[str, int, int]]] | None:
    """Run the merge ``spec`` in a worker process (see :meth:`Worker.merge`);
    None when no worker can start (the caller merges in this process).  Once
    ``cancel`` fires, the worker is killed, every file the merge was numbered
    deleted and CompactionCancelled raised."""
    global _owner, _broken
    with _lock:
        if _owner != os.getpid():  # a forked child: the workers are its parent's
            _idle.clear()
            _owner = os.getpid()
        worker = _idle.pop() if _idle else None
    if worker is not None and not worker.alive:  # it died while idle
        worker.close()
        worker = None
    if worker is None:
        try:
            worker = Worker()
        except (OSError, WorkerError) as exc:
            _broken = str(exc)
            log.warning("compactions run in this process from now on: %s", exc)
            return None
    ok = False
    try:
        if cancel is None:
            result = worker.merge(spec, alloc_number, path_for)
        else:
            with cancel.watch(worker.kill):
                try:
                    result = worker.merge(spec, alloc_number, path_for)
                except WorkerError:
                    cancel.check()  # killed by the cancel: say so
                    raise
        ok = True
        return result
    except BaseException:
        ok = worker.alive  # an error it reported leaves it usable; a death does not
        raise
    finally:
        # A cancel that fired may still call worker.kill (fire() calls the stops
        # it took after letting its lock go): such a worker is never reused, or
        # the kill could land in another database's merge.
        fired = cancel is not None and cancel.fired
        with _lock:
            if ok and not fired and worker.pid == os.getpid() and len(_idle) < MAX_IDLE:
                _idle.append(worker)
                worker = None
        if worker is not None:
            worker.close()


def warm() -> None:
    """Start a worker on a thread of its own unless one is idle or starting
    here, so that the next merge finds it ready instead of waiting for a new
    interpreter to import lsmdb (about 0.2 s).  A database calls it after its
    first flush: one that flushes is one that will compact."""
    global _warming
    with _lock:
        if _broken is not None or _idle or _warming or _owner != os.getpid():
            return
        _warming = True
    try:
        threading.Thread(target=_start_idle, name="lsmdb-worker-start", daemon=True).start()
    except RuntimeError as exc:  # no thread to start it on: the first merge starts one
        with _lock:
            _warming = False
        log.warning("no compaction worker started ahead: %s", exc)


def _start_idle() -> None:
    global _warming, _broken
    worker: Worker | None = None
    try:
        worker = Worker()
    except (OSError, WorkerError) as exc:
        _broken = str(exc)
        log.warning("compactions run in this process from now on: %s", exc)
    finally:
        with _lock:
            _warming = False
            if worker is not None and _broken is None and worker.pid == _owner == os.getpid() \
                    and len(_idle) < MAX_IDLE:
                _idle.append(worker)
                worker = None
    if worker is not None:  # not wanted after all (the interpreter exiting, a fork)
        worker.close()


def _after_fork_in_child() -> None:
    """A forked child lets go of its parent's workers at once: it closes its
    copies of their pipes (else a worker the parent closes would not see the
    end of its input while the child lives), without waiting for them."""
    global _lock, _idle, _owner, _warming
    inherited, _idle = _idle, []
    _lock = threading.Lock()  # the parent's may have been held by another thread
    _owner = os.getpid()
    _warming = False
    for worker in inherited:
        worker.let_go()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def close_idle() -> None:
    """Let every idle worker go; none starts after this (at exit: what is
    compacted then is merged in this process)."""
    global _broken
    _broken = _broken or "the interpreter is exiting"
    with _lock:
        workers = _idle[:] if _owner == os.getpid() else []
        _idle.clear()
    for worker in workers:
        worker.close()


# -- the worker's side ------------------------------------------------------

class _Written:
    """A complete output file, as the worker reports it."""

    __slots__ = ("path", "number", "level")

    def __init__(self, path: str, number: int, level: int) -> None:
        self.path = path
        self.number = number
        self.level = level

    def close(self) -> None:
        pass


def _watch(life_fd: int) -> None:
    """Exit the moment the parent is gone (its end of the pipe closes)."""
    try:
        while os.read(life_fd, 4096):
            pass
    finally:
        os._exit(0)


def _portable(exc: BaseException) -> BaseException:
    """``exc``, or an LsmdbError that says the same when it does not pickle."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 -- any failure to round-trip
        exc = LsmdbError(f"{type(exc).__name__}: {exc}")
    return exc


def serve(life_fd: int) -> None:
    """The worker's loop (``python -c`` in :class:`Worker`)."""
    from .compaction import open_output, write_merged  # noqa: F401 -- imported once
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides
    try:
        os.nice(WORKER_NICE)  # merges yield the CPU to the parent's writers and readers
    except OSError:
        pass
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, not into the protocol
    inp = sys.stdin.buffer
    parent = os.getppid()
    threading.Thread(target=_watch, args=(life_fd,), daemon=True).start()
    _send(out, ("ready", _PACKAGE_DIR))
    while True:
        message = _recv(inp)
        if message is None:
            return
        try:
            outputs, history = _run_merge(message[1], inp, out, parent)
        except BaseException as exc:  # noqa: BLE001 -- every error goes to the parent
            exc = _portable(exc)
            note = getattr(exc, "add_note", None)  # Python >= 3.11
            if note is not None:
                note(f"(in lsmdb's compaction worker, pid {os.getpid()}):\n"
                     + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
            _send(out, ("error", exc))
            continue
        _send(out, ("done", outputs, history))


def _run_merge(spec: Any, inp: IO[bytes], out: IO[bytes],
               parent: int) -> tuple[list[tuple[str, int, int]], list[tuple[str, int, int]]]:
    from .compaction import write_merged
    from .files import sst_name
    from .filters.hashing import FAST_HASHER
    from .secret import load_secret
    from .sstable_reader import SSTableReader

    if spec.hash_algorithm == FAST_HASHER.algorithm:
        hasher = FAST_HASHER
    else:
        hasher = load_secret(spec.directory)  # type: ignore[assignment]
        if hasher is None or hasher.key_id != spec.hash_key_id:
            raise WorkerError(f"the filter secret of {spec.directory} is not the one the "
                              "database uses")

    def alloc_number() -> int:
        _send(out, ("alloc",))
        reply = _recv(inp)
        if reply is None or os.getppid() != parent:
            os._exit(0)  # the parent is gone: touch nothing
        return int(reply[1])

    readers = []
    try:
        for path, number, level in spec.inputs:
            reader = SSTableReader(path, number)
            reader.level = level
            readers.append(reader)
        outputs, history = write_merged(
            spec, readers, alloc_number, lambda n: os.path.join(spec.directory, sst_name(n)),
            hasher, _Written)
    finally:
        for reader in readers:
            reader.close()
    return ([(w.path, w.number, w.level) for w in outputs],
            [(w.path, w.number, w.level) for w in history])
