"""I/O faults for tests: chosen or random OSErrors from the calls lsmdb makes on its files.

:class:`Faults` watches one directory while installed and wraps the ``os``
functions lsmdb's files go through -- ``os.open``, ``os.write``,
``os.pwrite``, ``os.fsync``, ``os.fdatasync``, ``os.replace``, ``os.rename``, ``os.unlink``,
``os.pread`` -- so that a call on a file of that directory (or on the
directory itself, for fsync) can fail:

* with an errno (``ENOSPC``, ``EIO``, ``EMFILE``, ...) before it does anything;
* for ``write`` (``os.write`` and ``os.pwrite``), after a *partial* write:
  some prefix of the data reaches the file, then the error (a disk filling
  up mid-record).

``os.posix_fallocate`` -- how a WAL segment, written through a memory
mapping, grows (lsmdb.files.preallocate) -- counts as a ``write`` of the
space it allocates; it fails whole, never partially.

Rules say which calls fail: ``fail(op, match, err, times=1, skip=0,
partial=False)``.  ``random(rng, rate, ops, errs)`` makes every matching call
fail with probability ``rate``.  ``hits`` lists the faults raised, as (op,
name, errno).  Faults raise only in threads ``thread`` accepts (default: all).

Example::

    with Faults(db_dir) as faults:
        faults.fail("write", lambda n: n.startswith("wal-"), errno.ENOSPC, partial=True)
        db.put(b"k", b"v")            # OSError(ENOSPC), part of a record on disk
"""

from __future__ import annotations

import errno
import os
import random as _random
import threading
from collections.abc import Callable
from typing import Any

OPS = ("open", "write", "fsync", "replace", "unlink", "pread")


class Faults:
    """Injected OSErrors for one directory's files; see the module docstring."""

    def __init__(self, directory: str,
                 thread: Callable[[threading.Thread], bool] | None = None) -> None:
        self.directory = os.path.abspath(directory)
        self.thread = thread
        self.hits: list[tuple[str, str, int]] = []
        self.enabled = True
        self._rules: list[dict[str, Any]] = []
        self._random: tuple[int, float, tuple[str, ...], tuple[int, ...]] | None = None
        self._rngs: dict[str, _random.Random] = {}
        self._lock = threading.Lock()
        self._saved: dict[str, Any] = {}

    # -- rules ----------------------------------------------------------------
    def fail(self, op: str, match: Callable[[str], bool], err: int = errno.ENOSPC,
             times: int | None = 1, skip: int = 0, partial: bool = False) -> None:
        """Fail ``op`` on files whose name ``match`` accepts ("." is the directory)."""
        if op not in OPS:
            raise ValueError(f"op must be one of {OPS}")
        self._rules.append({"op": op, "match": match, "err": err, "times": times,
                            "skip": skip, "partial": partial})

    def random(self, rng: _random.Random, rate: float, ops: tuple[str, ...] = OPS,
               errs: tuple[int, ...] = (errno.EIO, errno.ENOSPC, errno.EMFILE)) -> None:
        """Fail each call of ``ops`` with probability ``rate`` (writes: partially, at
        random), with an errno drawn from ``errs``.  Each thread draws from a stream
        of its own (seeded from ``rng``), so that the faults a thread meets do not
        depend on how the threads interleave."""
        self._random = (rng.getrandbits(64), rate, ops, errs)
        self._rngs = {}

    def _rng(self) -> _random.Random:
        assert self._random is not None
        name = threading.current_thread().name
        rng = self._rngs.get(name)
        if rng is None:
            rng = self._rngs[name] = _random.Random(f"{self._random[0]}-{name}")
        return rng

    def clear(self) -> None:
        self._rules.clear()
        self._random = None

    # -- install --------------------------------------------------------------
    def __enter__(self) -> Faults:
        for name in ("open", "write", "pwrite", "fsync", "fdatasync", "replace", "rename",
                     "unlink", "pread", "posix_fallocate"):
            self._saved[name] = getattr(os, name)
        os.open = self._open
        os.write = self._write
        os.pwrite = self._pwrite
        os.posix_fallocate = self._fallocate
        os.fsync = self._fsync
        os.fdatasync = self._fdatasync
        os.replace = self._replace
        os.rename = self._rename
        os.unlink = self._unlink
        os.pread = self._pread
        return self

    def __exit__(self, *exc: Any) -> None:
        for name, fn in self._saved.items():
            setattr(os, name, fn)
        self._saved.clear()

    # -- deciding -------------------------------------------------------------
    def _name_of_path(self, path: Any) -> str | None:
        try:
            full = os.path.abspath(os.fsdecode(os.fspath(path)))
        except TypeError:
            return None
        if full == self.directory:
            return "."
        return os.path.basename(full) if os.path.dirname(full) == self.directory else None

    def _name_of_fd(self, fd: int) -> str | None:
        try:
            path = os.readlink(f"/proc/self/fd/{fd}").replace(" (deleted)", "")
        except OSError:
            return None
        return self._name_of_path(path)

    def _decide(self, op: str, name: str | None) -> tuple[int, bool] | None:
        """(errno, partial) when this call must fail, else None."""
        if name is None or not self.enabled:
            return None
        if self.thread is not None and not self.thread(threading.current_thread()):
            return None
        with self._lock:
            for rule in self._rules:
                if rule["op"] != op or rule["times"] == 0 or not rule["match"](name):
                    continue
                if rule["skip"]:
                    rule["skip"] -= 1
                    continue
                if rule["times"] is not None:
                    rule["times"] -= 1
                self.hits.append((op, name, rule["err"]))
                return rule["err"], rule["partial"]
            if self._random is not None:
                _seed, rate, ops, errs = self._random
                rng = self._rng()
                if op in ops and rng.random() < rate:
                    err = rng.choice(errs)
                    self.hits.append((op, name, err))
                    return err, op == "write" and rng.random() < 0.5
        return None

    @staticmethod
    def _raise(err: int, name: str) -> None:
        raise OSError(err, f"{os.strerror(err)} (injected)", name)

    # -- the wrapped calls ----------------------------------------------------
    def _open(self, path: Any, flags: int, mode: int = 0o777, *args: Any, **kwargs: Any) -> int:
        fault = self._decide("open", self._name_of_path(path))
        if fault is not None:
            self._raise(fault[0], os.fspath(path))
        return self._saved["open"](path, flags, mode, *args, **kwargs)

    def _write(self, fd: int, data: Any) -> int:
        self._maybe_fail_write(fd, data, lambda part: self._saved["write"](fd, part))
        return self._saved["write"](fd, data)

    def _pwrite(self, fd: int, data: Any, offset: int) -> int:
        self._maybe_fail_write(fd, data, lambda part: self._saved["pwrite"](fd, part, offset))
        return self._saved["pwrite"](fd, data, offset)

    def _maybe_fail_write(self, fd: int, data: Any, write: Callable[[Any], int]) -> None:
        """A write's fault, if one is due: a prefix of ``data`` written (``write``)
        for a partial one, then the error."""
        name = self._name_of_fd(fd)
        fault = self._decide("write", name)
        if fault is not None:
            err, partial = fault
            if partial and len(data) > 1:
                with self._lock:
                    rng = self._rng() if self._random else _random.Random(len(data))
                    cut = rng.randrange(1, len(data))
                write(memoryview(data)[:cut])
            self._raise(err, name or "?")

    def _fallocate(self, fd: int, offset: int, length: int) -> None:
        name = self._name_of_fd(fd)
        fault = self._decide("write", name)
        if fault is not None:
            self._raise(fault[0], name or "?")
        self._saved["posix_fallocate"](fd, offset, length)

    def _sync(self, which: str, fd: Any) -> None:
        if not isinstance(fd, int):
            fd = fd.fileno()
        name = self._name_of_fd(fd)
        fault = self._decide("fsync", name)
        if fault is not None:
            self._raise(fault[0], name or "?")
        self._saved[which](fd)

    def _fsync(self, fd: Any) -> None:
        self._sync("fsync", fd)

    def _fdatasync(self, fd: Any) -> None:
        self._sync("fdatasync", fd)

    def _replace(self, src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        fault = self._decide("replace", self._name_of_path(dst))
        if fault is not None:
            self._raise(fault[0], os.fspath(dst))
        self._saved["replace"](src, dst, *args, **kwargs)

    def _rename(self, src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        fault = self._decide("replace", self._name_of_path(dst))
        if fault is not None:
            self._raise(fault[0], os.fspath(dst))
        self._saved["rename"](src, dst, *args, **kwargs)

    def _unlink(self, path: Any, *args: Any, **kwargs: Any) -> None:
        fault = self._decide("unlink", self._name_of_path(path))
        if fault is not None:
            self._raise(fault[0], os.fspath(path))
        self._saved["unlink"](path, *args, **kwargs)

    def _pread(self, fd: int, n: int, offset: int) -> bytes:
        fault = self._decide("pread", self._name_of_fd(fd))
        if fault is not None:
            self._raise(fault[0], "?")
        return self._saved["pread"](fd, n, offset)
