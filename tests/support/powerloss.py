"""A simulated power loss for tests: every directory a machine that lost power could leave.

:class:`PowerLoss` watches one directory (the regular files directly in it;
subdirectories are ignored) while it is installed, and at any moment can
produce *crash images*: name -> content maps of what a power cut at that
moment may leave on disk.  The model, rule by rule:

* **Names.**  The listing as of the directory's last fsync survives, plus
  any *ordered prefix* of the directory operations made since: file
  creations, renames (one operation each, atomic: never half done) and
  unlinks.  If the third operation survived, so did the first two.  Before
  the first directory fsync the layer sees, the listing at install time
  counts as durable.
* **Data.**  An inode keeps its content as of its last fsync (``os.fsync``
  or ``os.fdatasync``, through any descriptor); a file never fsynced has
  synced content ``b""`` (files present at install count as synced as they
  were then).  Bytes appended since survive as any prefix of them, and that
  surviving region may read as zeros (the size reached the disk, the data
  did not): the unsynced tail is ``extension[:a] + b"\\0" * (b - a)`` for
  ``0 <= a <= b <= len(extension)``.  Bytes written since over zeros the
  synced content ends with (space allocated ahead, then filled in place, as
  through a memory mapping) count the same way: an extension of the synced
  content up to where the two differ, the surviving file never shorter than
  the synced one (the rest of it zeros).  When the current content does not
  start with the synced content otherwise (truncated or rewritten since),
  either the synced or the current content survives.
* **Identity.**  An inode is the identity of a file across renames.  Every
  inode the layer sees is hard-linked into a private directory next to the
  watched one, so its current content can still be read when an image is
  taken after an unlink, and its number is not reused while installed.

Installing monkeypatches ``os.fsync``, ``os.fdatasync``, ``builtins.open``
and ``io.open`` (modes that may create: ``w``, ``a``, ``x``, ``+``),
``os.open`` (with ``O_CREAT``), ``os.replace``, ``os.rename``, ``os.unlink``
and ``os.remove``.  A creation is recorded only when the name did not exist
before the call (``O_CREAT`` on an existing file is no directory operation);
a rename over an existing name replaces it; a rename into the directory
from outside is a creation, out of it an unlink.  A descriptor's fsync
belongs to the directory when ``os.fstat`` says it is the directory itself
(how ``lsmdb.coding.fsync_dir`` syncs it: ``os.open(dir, O_RDONLY)`` then
``os.fsync``) or an inode of it (a kept inode, or ``/proc/self/fd/N``
pointing into it).  One ``threading.RLock`` serialises the layer: an
operation on the directory and the image taken are never interleaved.
A file another process created (lsmdb's compaction worker) is recorded as
created at the first fsync of it this process makes.  Linux only
(``/proc/self/fd``).

Each fsync of the directory or of one of its files is an *fsync point*:
``count`` counts them, ``labels`` names them (``"dir"``, ``"file
wal-000003.log"``).  ``observer(layer, "before" | "after")`` is called at
each point, with the layer's lock held, just before and just after the fsync
takes effect -- what it sees is exactly what a crash there leaves, so one
run can take images at every point.  ``crash_at=n`` raises :class:`Crash`
at the n-th point (``when="before"`` it takes effect, or ``"after"``); the
state of that moment is frozen for :meth:`PowerLoss.images`, and every later
fsync of the directory's files, in any thread, raises :class:`Crash` too (so
nothing can be acknowledged after the power cut; other directory operations
still run, unrecorded).

:meth:`PowerLoss.images` gives ``n`` images of the moment: nothing unsynced
survives, everything survives, then random ones; :meth:`PowerLoss.image`
one chosen image; :meth:`PowerLoss.all_images` every image the model allows
(exponential: for small tests).  :meth:`PowerLoss.moment` freezes the moment
itself, to take several images of it later.  Each :class:`Image` is a dict
whose ``recipe`` says how it was chosen.

Example::

    layer = PowerLoss(db_dir)
    with layer:
        workload(db_dir)
        for image in layer.images(random.Random(7), 4):
            dest = fresh_directory()
            layer.materialize(dest, image)
            check(dest)
    layer.cleanup()
"""

from __future__ import annotations

import builtins
import io
import itertools
import os
import random
import shutil
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Observer = Callable[["PowerLoss", str], None]
Tails = str | random.Random        # "none", "all", or a Random choosing per file


class Crash(BaseException):
    """The simulated power cut (a BaseException, so ``except Exception`` cannot eat it)."""


@dataclass(frozen=True)
class DirOp:
    """One directory operation since the directory's last fsync."""

    kind: str        # "create", "rename" or "unlink"
    name: str        # the name created or unlinked, or the source of the rename
    ino: int         # the inode created, renamed or unlinked
    dst: str = ""    # the destination of a rename

    def apply(self, listing: dict[str, int]) -> None:
        if self.kind == "create":
            listing[self.name] = self.ino
        elif self.kind == "unlink":
            if listing.get(self.name) == self.ino:
                del listing[self.name]
        else:
            if listing.get(self.name) == self.ino:
                del listing[self.name]
            listing[self.dst] = self.ino

    def __str__(self) -> str:
        return f"rename {self.name} -> {self.dst}" if self.kind == "rename" \
            else f"{self.kind} {self.name}"


class Image(dict[str, bytes]):
    """name -> content of a directory a power loss leaves; ``recipe`` says which choices
    made it (the directory operations kept, each file's surviving tail)."""

    recipe: str = ""


def _common_prefix(a: bytes, b: bytes) -> int:
    """How many leading bytes ``a`` and ``b`` share."""
    n, same, step = min(len(a), len(b)), 0, 4096
    while same < n and a[same:same + step] == b[same:same + step]:
        same += step
    while same < n and a[same] == b[same]:  # inside the first chunk that differs
        same += 1
    return min(same, n)


class Moment:
    """Everything a power loss at one moment may leave; immutable once built.

    ``listing`` is the durable listing (name -> inode), ``ops`` the
    directory operations since, ``synced`` and ``current`` each inode's
    content as of its last fsync and now.
    """

    def __init__(self, listing: dict[str, int], ops: tuple[DirOp, ...],
                 synced: dict[int, bytes], current: dict[int, bytes]) -> None:
        self.listing = listing
        self.ops = ops
        self.synced = synced
        self.current = current

    def names(self, dir_ops: int) -> dict[str, int]:
        """The listing when the first ``dir_ops`` operations since the last fsync survived."""
        if not 0 <= dir_ops <= len(self.ops):
            raise ValueError(f"dir_ops must be in 0..{len(self.ops)}, got {dir_ops}")
        listing = dict(self.listing)
        for op in self.ops[:dir_ops]:
            op.apply(listing)
        return listing

    def unsynced(self, ino: int) -> tuple[bytes, bytes | None, int]:
        """(the synced content's durable prefix, bytes written after it since,
        the least length a surviving file has) -- or (synced, None, 0) when the
        current content does not extend the synced one."""
        synced = self.synced.get(ino, b"")
        current = self.current.get(ino, synced)
        if current.startswith(synced):
            return synced, current[len(synced):], 0
        if len(current) >= len(synced):  # written in place over zeros allocated ahead?
            same = _common_prefix(synced, current)
            if synced.count(0, same) == len(synced) - same:
                return synced[:same], current[same:], len(synced)
        return synced, None, 0

    def content(self, ino: int, tails: Tails) -> tuple[bytes, str]:
        """One allowed content of ``ino`` and a note saying which."""
        synced, extension, floor = self.unsynced(ino)
        if extension is None:
            if tails == "all" or (isinstance(tails, random.Random) and tails.random() < 0.5):
                current = self.current[ino]
                return current, f"current {len(current)} B (not an extension of synced)"
            return synced, f"synced {len(synced)} B (not a prefix of current)"
        size = len(extension)
        if tails == "none" or not size:
            return synced.ljust(floor, b"\0"), \
                f"synced {len(synced)} B" + (f", 0/{size} unsynced" if size else "")
        if tails == "all":
            kept, zeros = size, 0
        elif isinstance(tails, random.Random):
            roll = tails.random()
            if roll < 0.25:
                kept, zeros = 0, 0
            elif roll < 0.5:
                kept, zeros = size, 0
            else:
                kept = tails.randint(0, size)
                zeros = 0 if tails.random() < 0.5 else tails.randint(0, size - kept)
        else:
            raise ValueError(f"tails must be 'none', 'all' or a random.Random, got {tails!r}")
        note = f"synced {len(synced)} B + {kept}/{size} unsynced" + (
            f" + {zeros} zeros" if zeros else "")
        return (synced + extension[:kept] + b"\0" * zeros).ljust(floor, b"\0"), note

    def contents(self, ino: int) -> list[bytes]:
        """Every content ``ino`` may have after the power loss (each once)."""
        synced, extension, floor = self.unsynced(ino)
        if extension is None:
            return [synced, self.current[ino]]
        size = len(extension)
        return list(dict.fromkeys(
            (synced + extension[:a] + b"\0" * (b - a)).ljust(floor, b"\0")
            for a in range(size + 1) for b in range(a, size + 1)))

    def image(self, *, dir_ops: int | None = None, tails: Tails = "none") -> Image:
        """One image.  ``dir_ops`` operations since the last directory fsync survive
        (None: none for ``tails="none"``, all for ``"all"``, a random count for a
        Random); ``tails`` chooses each file's surviving unsynced bytes."""
        if dir_ops is None:
            dir_ops = 0 if tails == "none" else len(self.ops) if tails == "all" \
                else tails.randint(0, len(self.ops)) if isinstance(tails, random.Random) else -1
        listing = self.names(dir_ops)
        image = Image()
        notes = [f"dir ops {dir_ops}/{len(self.ops)}"
                 + (f" [{', '.join(map(str, self.ops[:dir_ops]))}]" if dir_ops else "")]
        chosen: dict[int, bytes] = {}
        for name in sorted(listing):
            ino = listing[name]
            if ino not in chosen:
                chosen[ino], note = self.content(ino, tails)
                notes.append(f"{name}: {note}")
            image[name] = chosen[ino]
        image.recipe = "; ".join(notes)
        return image

    def images(self, rng: random.Random, n: int) -> list[Image]:
        """``n`` images: nothing unsynced survives; everything survives; then random
        ones -- a random prefix of the directory operations, and for the files
        either no unsynced byte, every one, or a random choice per file (so a
        journal that keeps names but not data is among them)."""
        out = [self.image(tails="none"), self.image(tails="all")][:n]
        while len(out) < n:
            tails: Tails = rng.choice(("none", "all", rng))
            out.append(self.image(dir_ops=rng.randint(0, len(self.ops)), tails=tails))
        return out

    def all_images(self) -> list[dict[str, bytes]]:
        """Every image the model allows, each once (exponential: for small tests)."""
        seen: set[tuple[tuple[str, bytes], ...]] = set()
        out = []
        for dir_ops in range(len(self.ops) + 1):
            listing = self.names(dir_ops)
            inos = sorted(set(listing.values()))
            for combo in itertools.product(*(self.contents(ino) for ino in inos)):
                by_ino = dict(zip(inos, combo, strict=True))
                key = tuple(sorted((name, by_ino[ino]) for name, ino in listing.items()))
                if key not in seen:
                    seen.add(key)
                    out.append(dict(key))
        return out


def materialize(dest: str, image: dict[str, bytes]) -> None:
    """Write ``image`` into the new directory ``dest``."""
    os.makedirs(dest)
    for name, data in image.items():
        with open(os.path.join(dest, name), "wb") as f:
            f.write(data)


class PowerLoss:
    """Watches ``directory`` and produces crash images; see the module docstring.

    ``real_fsync=False`` (default) skips the real fsync of the directory's
    files: the simulation does not need it, and tests run faster without it.
    """

    def __init__(self, directory: str | os.PathLike[str], *, crash_at: int | None = None,
                 when: str = "before", observer: Observer | None = None,
                 real_fsync: bool = False) -> None:
        if when not in ("before", "after"):
            raise ValueError("when must be 'before' or 'after'")
        given = os.path.abspath(os.fsdecode(os.fspath(directory)))
        self.directory = os.path.realpath(given)
        self._aliases = {self.directory, given}
        self.keep_dir = os.path.join(os.path.dirname(self.directory),
                                     f".powerloss-keep-{os.path.basename(self.directory)}")
        self.crash_at = crash_at
        self.when = when
        self.observer = observer
        self.real_fsync = real_fsync
        self.count = 0                      # fsync points seen
        self.labels: list[str] = []         # one per fsync point
        self.crashed = False
        self._durable: dict[str, int] = {}  # listing as of the last directory fsync
        self._ops: list[DirOp] = []         # directory operations since
        self._names: dict[str, int] = {}    # the listing now (durable + ops)
        self._synced: dict[int, bytes] = {} # inode -> content as of its last fsync
        self._kept: set[int] = set()
        self._frozen: Moment | None = None  # the moment of the crash
        self._dir_stat: os.stat_result | None = None
        self._proc_fd = -1
        self._lock = threading.RLock()
        self._saved: dict[tuple[Any, str], Any] = {}

    # ------------------------------------------------------------ install
    def install(self) -> PowerLoss:
        if self._saved:
            raise RuntimeError("already installed")
        os.makedirs(self.directory, exist_ok=True)
        shutil.rmtree(self.keep_dir, ignore_errors=True)  # stale links would lie about inodes
        os.makedirs(self.keep_dir)
        self._dir_stat = os.stat(self.directory)
        self._proc_fd = os.open("/proc/self/fd", os.O_RDONLY)
        for entry in os.scandir(self.directory):
            if entry.is_file(follow_symlinks=False):
                ino = entry.inode()
                self._keep_path(ino, entry.path)
                self._durable[entry.name] = ino
                self._synced[ino] = self._read(ino)
        self._names = dict(self._durable)
        patches: list[tuple[Any, str, Any]] = [
            (os, "fsync", self._fsync_like),
            (os, "fdatasync", self._fsync_like),
            (builtins, "open", self._open_like),
            (io, "open", self._open_like),
            (os, "open", self._os_open_like),
            (os, "replace", self._rename_like),
            (os, "rename", self._rename_like),
            (os, "unlink", self._unlink_like),
            (os, "remove", self._unlink_like),
        ]
        for module, name, make in patches:
            real = getattr(module, name)
            self._saved[(module, name)] = real
            setattr(module, name, make(real))
        return self

    def uninstall(self) -> None:
        for (module, name), real in self._saved.items():
            setattr(module, name, real)
        if self._saved:
            os.close(self._proc_fd)
        self._saved.clear()

    def __enter__(self) -> PowerLoss:
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()

    def cleanup(self) -> None:
        """Remove the private directory of kept inodes (images need it: take them first)."""
        shutil.rmtree(self.keep_dir, ignore_errors=True)

    # ------------------------------------------------------------- images
    def moment(self) -> Moment:
        """What a power loss now may leave (after a crash: what it left)."""
        with self._lock:
            if self._frozen is not None:
                return self._frozen
            return self._snapshot()

    def images(self, rng: random.Random, n: int) -> list[Image]:
        """``n`` crash images of this moment (see :meth:`Moment.images`)."""
        return self.moment().images(rng, n)

    def image(self, *, dir_ops: int | None = None, tails: Tails = "none") -> Image:
        """One crash image of this moment (see :meth:`Moment.image`)."""
        return self.moment().image(dir_ops=dir_ops, tails=tails)

    def all_images(self) -> list[dict[str, bytes]]:
        """Every crash image of this moment (see :meth:`Moment.all_images`)."""
        return self.moment().all_images()

    @staticmethod
    def materialize(dest: str, image: dict[str, bytes]) -> None:
        """Write ``image`` into the new directory ``dest``."""
        materialize(dest, image)

    @property
    def dir_ops(self) -> list[DirOp]:
        """The directory operations since the last directory fsync, oldest first."""
        with self._lock:
            return list(self._frozen.ops if self._frozen is not None else self._ops)

    def _check(self) -> None:
        """Invariants (not after a crash): the model's listing is the real one, and
        every inode it names is kept."""
        with self._lock:
            assert not self.crashed, "the real directory moved on after the crash"
            real = {e.name: e.inode() for e in os.scandir(self.directory)
                    if e.is_file(follow_symlinks=False)}
            for name, ino in list(real.items()):
                # An SSTable another process is writing, not yet fsynced here (_foreign).
                if name.endswith(".sst") and name not in self._names and ino not in self._kept:
                    del real[name]
            assert real == self._names, f"listing {real} != model {self._names}"
            listing = dict(self._durable)
            for op in self._ops:
                op.apply(listing)
            assert listing == self._names, (listing, self._names)
            for ino in set(self._durable.values()) | {op.ino for op in self._ops}:
                assert ino in self._kept and os.path.exists(self._kept_path(ino)), ino

    def _snapshot(self) -> Moment:
        inos = set(self._durable.values()) | {op.ino for op in self._ops}
        return Moment(dict(self._durable), tuple(self._ops),
                      {ino: self._synced.get(ino, b"") for ino in inos},
                      {ino: self._read(ino) for ino in inos})

    # -------------------------------------------------------------- inodes
    def _kept_path(self, ino: int) -> str:
        return os.path.join(self.keep_dir, str(ino))

    def _keep_path(self, ino: int, path: str) -> None:
        if ino not in self._kept:
            os.link(path, self._kept_path(ino), follow_symlinks=False)
            self._kept.add(ino)

    def _keep_fd(self, ino: int, fd: int) -> bool:
        if ino in self._kept:
            return True
        try:  # the magic link of the descriptor: works after a rename, not after an unlink
            # (linkat with AT_SYMLINK_FOLLOW: the dir_fd makes os.link use it)
            os.link(str(fd), self._kept_path(ino), src_dir_fd=self._proc_fd,
                    follow_symlinks=True)
        except FileNotFoundError:
            return False
        self._kept.add(ino)
        return True

    def _read(self, ino: int) -> bytes:
        try:
            with self._saved.get((builtins, "open"), builtins.open)(
                    self._kept_path(ino), "rb") as f:
                data: bytes = f.read()
                return data
        except FileNotFoundError:  # never kept (unlinked before the layer saw it)
            return self._synced.get(ino, b"")

    # --------------------------------------------------------------- names
    def _name_of(self, path: Any, dir_fd: int | None = None) -> str | None:
        """The name inside the directory that ``path`` denotes, or None."""
        if isinstance(path, int):
            return None
        p = os.fsdecode(os.fspath(path))
        if dir_fd is not None and not os.path.isabs(p):
            p = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), p)
        head, tail = os.path.split(os.path.abspath(p))
        if tail in ("", ".", ".."):
            return None
        if head in self._aliases:
            return tail
        try:  # another spelling of the directory (a symlink on the way)?
            same = os.path.samestat(os.stat(head), self._dir_stat)  # type: ignore[arg-type]
        except OSError:
            return None
        return tail if same else None

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def _lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.lstat(self._path(name))
        except OSError:
            return None

    def _record(self, op: DirOp) -> None:
        self._ops.append(op)
        op.apply(self._names)

    def _created(self, name: str, before: os.stat_result | None, fd: int) -> None:
        """After a call that may have created ``name`` (its stat ``before``), open as ``fd``."""
        if self.crashed:
            return
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return
        self._keep_fd(st.st_ino, fd)
        if before is None and self._names.get(name) != st.st_ino:
            self._record(DirOp("create", name, st.st_ino))

    # ---------------------------------------------------------- wrappers
    def _open_like(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            if isinstance(file, int) or not any(c in mode for c in "wax+"):
                return real(file, mode, *args, **kwargs)
            name = self._name_of(file)
            if name is None:
                return real(file, mode, *args, **kwargs)
            with self._lock:
                before = self._lstat(name)
                f = real(file, mode, *args, **kwargs)
                try:
                    self._created(name, before, f.fileno())
                except BaseException:
                    f.close()
                    raise
                return f
        return open_

    def _os_open_like(self, real: Callable[..., int]) -> Callable[..., int]:
        def os_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None
                    ) -> int:
            name = self._name_of(path, dir_fd) if flags & os.O_CREAT else None
            if name is None:
                return real(path, flags, mode, dir_fd=dir_fd)
            with self._lock:
                before = self._lstat(name)
                fd = real(path, flags, mode, dir_fd=dir_fd)
                try:
                    self._created(name, before, fd)
                except BaseException:
                    os.close(fd)
                    raise
                return fd
        return os_open

    def _rename_like(self, real: Callable[..., None]) -> Callable[..., None]:
        def rename(src: Any, dst: Any, *, src_dir_fd: int | None = None,
                   dst_dir_fd: int | None = None) -> None:
            s, d = self._name_of(src, src_dir_fd), self._name_of(dst, dst_dir_fd)
            if s is None and d is None:
                return real(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
            with self._lock:
                moved = self._lstat(s) if s is not None else None
                if moved is not None and stat.S_ISREG(moved.st_mode):
                    self._keep_path(moved.st_ino, self._path(s))  # type: ignore[arg-type]
                replaced = self._lstat(d) if d is not None else None
                if replaced is not None and stat.S_ISREG(replaced.st_mode):
                    self._keep_path(replaced.st_ino, self._path(d))  # type: ignore[arg-type]
                real(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
                if self.crashed:
                    return None
                if s is not None and d is not None:
                    if moved is not None and stat.S_ISREG(moved.st_mode) and s != d:
                        self._record(DirOp("rename", s, moved.st_ino, d))
                elif s is not None:
                    if moved is not None and stat.S_ISREG(moved.st_mode):
                        self._record(DirOp("unlink", s, moved.st_ino))
                else:
                    assert d is not None
                    arrived = self._lstat(d)
                    if arrived is not None and stat.S_ISREG(arrived.st_mode):
                        self._keep_path(arrived.st_ino, self._path(d))
                        self._record(DirOp("create", d, arrived.st_ino))
            return None
        return rename

    def _unlink_like(self, real: Callable[..., None]) -> Callable[..., None]:
        def unlink(path: Any, *, dir_fd: int | None = None) -> None:
            name = self._name_of(path, dir_fd)
            if name is None:
                return real(path, dir_fd=dir_fd)
            with self._lock:
                gone = self._lstat(name)
                if gone is not None and stat.S_ISREG(gone.st_mode):
                    self._keep_path(gone.st_ino, self._path(name))
                real(path, dir_fd=dir_fd)
                if not self.crashed and gone is not None and stat.S_ISREG(gone.st_mode):
                    self._record(DirOp("unlink", name, gone.st_ino))
            return None
        return unlink

    def _fsync_like(self, real: Callable[[int], None]) -> Callable[[Any], None]:
        def fsync(fd: Any) -> None:
            if not isinstance(fd, int):
                fd = fd.fileno()
            st = os.fstat(fd)
            is_dir = stat.S_ISDIR(st.st_mode)
            assert self._dir_stat is not None
            if is_dir:
                mine = os.path.samestat(st, self._dir_stat)
            else:
                mine = stat.S_ISREG(st.st_mode) and st.st_dev == self._dir_stat.st_dev and (
                    st.st_ino in self._kept or self._fd_in_directory(fd))
            if not mine:
                return real(fd)
            with self._lock:
                if self.crashed:
                    raise Crash("fsync after the simulated power loss")
                if not is_dir and st.st_ino not in self._names.values():
                    self._foreign(fd, st.st_ino)
                self.count += 1
                self.labels.append("dir" if is_dir else "file " + self._label(fd, st.st_ino))
                if self.observer is not None:
                    self.observer(self, "before")
                if self.count == self.crash_at and self.when == "before":
                    self._crash()
                if is_dir:
                    for op in self._ops:
                        op.apply(self._durable)
                    self._ops.clear()
                elif self._keep_fd(st.st_ino, fd):
                    self._synced[st.st_ino] = self._read(st.st_ino)
                if self.real_fsync:
                    real(fd)
                if self.observer is not None:
                    self.observer(self, "after")
                if self.count == self.crash_at:
                    self._crash()
            return None
        return fsync

    def _foreign(self, fd: int, ino: int) -> None:
        """A file of the directory this process did not create (another process
        wrote it, as lsmdb's compaction worker does): its creation is recorded
        now, the first moment this process can know of it."""
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return
        if path.endswith(" (deleted)") or os.path.dirname(path) not in self._aliases:
            return
        name = os.path.basename(path)
        if self._names.get(name) is None and self._keep_fd(ino, fd):
            self._record(DirOp("create", name, ino))

    def _fd_in_directory(self, fd: int) -> bool:
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return False
        return os.path.dirname(path) in self._aliases

    def _label(self, fd: int, ino: int) -> str:
        for name, known in self._names.items():
            if known == ino:
                return name
        try:
            return os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).replace(" (deleted)", "")
        except OSError:
            return f"inode {ino}"

    def _crash(self) -> None:
        self._frozen = self._snapshot()
        self.crashed = True
        raise Crash(f"simulated power loss {self.when} fsync #{self.count} ({self.labels[-1]})")

