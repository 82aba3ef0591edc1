"""A simulated machine crash for tests: only what was fsynced survives.

:class:`FaultFS` watches one directory while it is installed.  It replaces
``os.fsync`` (``lsmdb.coding.fsync_dir`` calls it too, on a directory
descriptor), and at every fsync of something in the directory it records
what a power cut could no longer take away:

* a regular file: its whole current content, by inode;
* the directory itself: its listing, name -> inode.

:meth:`FaultFS.materialize` then writes the directory a crash would leave:
the names of the last synced listing (files created since vanish, renames
and unlinks since are undone), each with the last synced content of its
inode (empty when it was never synced).  ``names_now=True`` keeps the
listing of the moment of the crash instead -- a file system that journals
names but not data -- with the same synced contents.

Inode numbers are the identity of a file across renames; so that a number
cannot be reused by a later file while the test runs, every inode the layer
records is hard-linked into a private directory next to the watched one.

``crash_at=n`` raises :class:`Crash` at the n-th fsync of the directory's
files (``when="before"`` the fsync takes effect or ``"after"``); from then on
every fsync raises, in every thread, so nothing can be acknowledged after
the crash.  ``labels`` names each fsync point (``"file 000007.sst"``,
``"dir"``).  ``observer(fs, "before" | "after")`` is called at each fsync
point just before and just after it takes effect: what it sees there is
exactly what a crash at that point leaves, so one run can check every
point.  ``os.unlink``, ``os.remove``, ``os.replace`` and ``os.rename``
are wrapped only to take the layer's lock, so a listing is never taken in
the middle of one.  Linux only (reads write-only descriptors through
``/proc/self/fd``).

:class:`IOFaults` makes chosen writes or fsyncs fail with an OSError
(ENOSPC, EIO) instead.

Example::

    fs = FaultFS(db_dir, crash_at=12, when="before")
    with fs:
        try:
            workload(db_dir)
        except Crash:
            pass
    fs.materialize(fresh_dir)      # what a power cut at fsync 12 leaves
"""

from __future__ import annotations

import builtins
import errno
import functools
import io
import os
import shutil
import stat
import threading
from collections.abc import Callable
from typing import Any


class Crash(BaseException):
    """The simulated power cut (a BaseException, so ``except Exception`` cannot eat it)."""


class FaultFS:
    """Records what each fsync of ``directory`` made durable; see the module docstring.

    ``real_fsync=False`` (default) skips the real fsync: the simulation does
    not need it, and tests run faster without it.
    """

    def __init__(self, directory: str, crash_at: int | None = None, when: str = "before",
                 real_fsync: bool = False,
                 observer: Callable[[FaultFS, str], None] | None = None) -> None:
        if when not in ("before", "after"):
            raise ValueError("when must be 'before' or 'after'")
        self.directory = os.path.abspath(directory)
        self.keep_dir = os.path.join(os.path.dirname(self.directory),
                                     f".faultfs-keep-{os.path.basename(self.directory)}")
        self.crash_at = crash_at
        self.when = when
        self.real_fsync = real_fsync
        self.observer = observer
        self.count = 0                        # fsync points seen
        self.labels: list[str] = []           # one per fsync point
        self.crashed = False
        self.synced_listing: dict[str, int] | None = None   # None: directory never synced
        self.crash_listing: dict[str, int] | None = None
        self.contents: dict[int, bytes] = {}  # inode -> last synced content
        self._kept: set[int] = set()
        self._lock = threading.RLock()
        self._saved: dict[str, Callable[..., Any]] = {}
        self._installed = False

    # ------------------------------------------------------------- install
    def install(self) -> FaultFS:
        os.makedirs(self.keep_dir, exist_ok=True)
        self._proc_fd = os.open("/proc/self/fd", os.O_RDONLY)
        for name in ("fsync", "unlink", "remove", "replace", "rename"):
            self._saved[name] = getattr(os, name)
        os.fsync = self._fsync
        for name in ("unlink", "remove", "replace", "rename"):
            setattr(os, name, self._locked(self._saved[name]))
        self._installed = True
        return self

    def uninstall(self) -> None:
        # The originals stay in _saved: a background thread that fetched a
        # wrapper before this ran still calls through to the real function.
        self._installed = False
        for name, fn in self._saved.items():
            setattr(os, name, fn)
        os.close(self._proc_fd)

    def __enter__(self) -> FaultFS:
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()

    def cleanup(self) -> None:
        """Remove the private directory of kept inodes."""
        shutil.rmtree(self.keep_dir, ignore_errors=True)

    def _locked(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return fn(*args, **kwargs)
        return wrapper

    # --------------------------------------------------------------- fsync
    def _fsync(self, fd: Any) -> None:
        if not isinstance(fd, int):
            fd = fd.fileno()
        if not self._installed:
            self._saved["fsync"](fd)
            return
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            mine = os.path.samestat(st, os.stat(self.directory))
            label = "dir"
        elif stat.S_ISREG(st.st_mode):
            path = os.readlink(f"/proc/self/fd/{fd}")
            mine = os.path.dirname(path) == self.directory
            label = "file " + os.path.basename(path).replace(" (deleted)", "")
        else:
            mine = False
        if not mine:
            self._saved["fsync"](fd)
            return
        with self._lock:
            if self.crashed:
                raise Crash("fsync after the crash")
            self.count += 1
            self.labels.append(label)
            if self.observer is not None:
                self.observer(self, "before")
            if self.count == self.crash_at and self.when == "before":
                self._crash()
            if stat.S_ISDIR(st.st_mode):
                self.synced_listing = self._listing(keep=True)
            else:
                self._record_file(fd, st.st_ino)
            if self.real_fsync:
                self._saved["fsync"](fd)
            if self.observer is not None:
                self.observer(self, "after")
            if self.count == self.crash_at:
                self._crash()

    def _crash(self) -> None:
        self.crashed = True
        self.crash_listing = self._listing(keep=False)
        raise Crash(f"simulated crash {self.when} fsync #{self.count} ({self.labels[-1]})")

    def _keep(self, ino: int, link: Callable[[str], None]) -> bool:
        if ino in self._kept:
            return True
        try:
            link(os.path.join(self.keep_dir, str(ino)))
        except FileNotFoundError:
            return False
        self._kept.add(ino)
        return True

    def _record_file(self, fd: int, ino: int) -> None:
        # A file unlinked before it was ever synced or listed cannot come back
        # after a crash: nothing to record (and it cannot be linked any more).
        if not self._keep(ino, lambda dst: os.link(str(fd), dst, src_dir_fd=self._proc_fd,
                                                   follow_symlinks=True)):
            return
        with open(f"/proc/self/fd/{fd}", "rb") as f:
            self.contents[ino] = f.read()

    def _listing(self, keep: bool) -> dict[str, int]:
        listing = {}
        for entry in os.scandir(self.directory):
            if not entry.is_file(follow_symlinks=False):
                continue
            ino = entry.inode()
            if keep:
                self._keep(ino, functools.partial(os.link, entry.path))
            listing[entry.name] = ino
        return listing

    # ----------------------------------------------------------- the crash
    def crash_image(self, names_now: bool = False) -> dict[str, bytes]:
        """name -> content of the directory a crash at this point leaves."""
        with self._lock:
            if names_now:
                listing = self.crash_listing if self.crash_listing is not None \
                    else self._listing(keep=False)
            else:
                listing = self.synced_listing or {}
            return {name: self.contents.get(ino, b"") for name, ino in listing.items()}

    def materialize(self, dest: str, names_now: bool = False) -> dict[str, bytes]:
        """Write :meth:`crash_image` into the new directory ``dest``; returns the image."""
        image = self.crash_image(names_now)
        os.makedirs(dest)
        for name, data in image.items():
            with open(os.path.join(dest, name), "wb") as f:
                f.write(data)
        return image


class IOFaults:
    """Make chosen writes or fsyncs of files in one directory fail with an OSError.

    ``fail_fsync(match)`` fails fsyncs of the file whose name ``match``
    accepts (``"."`` for the directory itself); ``fail_write(match,
    after_bytes=n)`` lets the first ``n`` bytes written to a matching file
    through ``open()`` or ``os.write`` reach it and fails the write that
    would go past them (a disk filling up).  Each fails ``times`` times (None:
    until removed), only in threads ``thread`` accepts (default: all).
    ``hits`` counts the failures raised.  (Patches ``os.fsync``, ``os.write``
    and ``builtins.open`` while entered; not to be combined with FaultFS.)

    Example::

        with IOFaults(db_dir) as faults:
            faults.fail_fsync(lambda name: name.endswith(".sst"), errno.ENOSPC)
            db.flush()     # raises OSError(ENOSPC)
    """

    def __init__(self, directory: str) -> None:
        self.directory = os.path.abspath(directory)
        self.hits = 0
        self._rules: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._saved: dict[tuple[Any, str], Any] = {}

    def fail_fsync(self, match: Callable[[str], bool], err: int = errno.ENOSPC,
                   times: int | None = 1, skip: int = 0,
                   thread: Callable[[threading.Thread], bool] | None = None) -> None:
        """Fail fsyncs of matching files, after letting the first ``skip`` of them pass."""
        self._rules.append({"op": "fsync", "match": match, "err": err, "times": times,
                            "skip": skip, "thread": thread, "after": 0})

    def fail_write(self, match: Callable[[str], bool], err: int = errno.ENOSPC,
                   times: int | None = 1, after_bytes: int = 0, skip: int = 0,
                   thread: Callable[[threading.Thread], bool] | None = None) -> None:
        """Fail the write that takes a matching file past ``after_bytes``, sparing the
        first ``skip`` matching files written to."""
        self._rules.append({"op": "write", "match": match, "err": err, "times": times,
                            "skip": skip, "thread": thread, "after": after_bytes,
                            "files": [], "spared": set()})

    def clear(self) -> None:
        self._rules.clear()

    def __enter__(self) -> IOFaults:
        self._saved[(os, "fsync")] = os.fsync
        self._saved[(os, "write")] = os.write
        self._saved[(builtins, "open")] = builtins.open
        os.fsync = self._fsync
        os.write = self._write
        builtins.open = self._open
        return self

    def __exit__(self, *exc: Any) -> None:
        # The rules go and the originals come back, but stay in _saved: a
        # background thread that fetched a wrapper before this ran still calls
        # through to the real function, with no fault.
        self._rules.clear()
        for (module, name), fn in self._saved.items():
            setattr(module, name, fn)

    def _name_of(self, fd: int) -> str | None:
        """Name of ``fd`` inside the directory ("." for the directory), or None."""
        try:
            path = os.readlink(f"/proc/self/fd/{fd}").replace(" (deleted)", "")
        except OSError:
            return None
        if path == self.directory:
            return "."
        if os.path.dirname(path) == self.directory:
            return os.path.basename(path)
        return None

    def _check(self, op: str, name: str | None, written: int, size: int) -> int | None:
        """Bytes that may still be written (write) / 0 to fail (fsync); None: no fault."""
        if name is None:
            return None
        with self._lock:
            for rule in self._rules:
                if rule["op"] != op or rule["times"] == 0 or not rule["match"](name):
                    continue
                if rule["thread"] is not None and not rule["thread"](threading.current_thread()):
                    continue
                if op == "fsync" and rule["skip"]:
                    rule["skip"] -= 1
                    continue
                if op == "write":
                    if name not in rule["files"]:
                        rule["files"].append(name)
                        if len(rule["files"]) <= rule["skip"]:
                            rule["spared"].add(name)
                    if name in rule["spared"]:
                        continue
                room = max(0, rule["after"] - written)
                if op == "write" and size <= room:
                    return None
                if op == "write" and room:
                    return room          # a short write first, then the failure
                if rule["times"] is not None:
                    rule["times"] -= 1
                self.hits += 1
                raise OSError(rule["err"], f"{os.strerror(rule['err'])} (injected)", name)
        return None

    def _fsync(self, fd: Any) -> None:
        if not isinstance(fd, int):
            fd = fd.fileno()
        self._check("fsync", self._name_of(fd), 0, 0)
        self._saved[(os, "fsync")](fd)

    def _write(self, fd: int, data: Any) -> int:
        name = self._name_of(fd)
        if name is not None:
            written = os.lseek(fd, 0, os.SEEK_CUR)
            room = self._check("write", name, written, len(data))
            if room is not None:
                data = memoryview(data)[:room]
        return self._saved[(os, "write")](fd, data)

    def _open(self, file: Any, mode: str = "r", buffering: int = -1, *args: Any,
              **kwargs: Any) -> Any:
        real_open = self._saved[(builtins, "open")]
        if (not isinstance(file, (str, os.PathLike)) or "b" not in mode
                or not any(c in mode for c in "wax+")
                or os.path.dirname(os.path.abspath(os.fspath(file))) != self.directory):
            return real_open(file, mode, buffering, *args, **kwargs)
        raw = _FaultyFile(self, os.fspath(file), mode.replace("b", ""))
        if buffering == 0:
            return raw
        return io.BufferedWriter(raw) if "+" not in mode else io.BufferedRandom(raw)


class _FaultyFile(io.FileIO):
    """A raw file whose writes go through :class:`IOFaults`."""

    def __init__(self, faults: IOFaults, path: str, mode: str) -> None:
        super().__init__(path, mode)
        self._faults = faults
        self._fault_name = os.path.basename(path)

    def write(self, data: Any) -> int:
        room = self._faults._check("write", self._fault_name, self.tell(), len(data))
        if room is not None:
            data = memoryview(data)[:room]
        return super().write(data)
