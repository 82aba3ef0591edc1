"""The database's background thread: compactions after flushes, periodic counter saves.

One daemon thread runs ``work(should_stop)`` whenever it is woken and at
least every ``period`` seconds.  An exception from ``work`` is logged, kept
for :meth:`Background.take_error` (``DB.wait_for_compactions`` re-raises it)
and the work is retried on the next round.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("lsmdb")


class Background:
    """A worker thread with wake-ups, an idle flag and error hand-over."""

    def __init__(self, name: str, work: Callable[[Callable[[], bool]], None],
                 period: float = 1.0) -> None:
        self._work = work
        self._period = period
        self._cond = threading.Condition()
        self._woken = False
        self._stop = False
        self._busy = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def stop(self) -> None:
        """Ask the thread to finish and wait for it (not from the thread itself)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def is_current(self) -> bool:
        """Whether the caller runs on this worker's thread."""
        return threading.current_thread() is self._thread

    @property
    def busy(self) -> bool:
        return self._busy or self._woken

    def take_error(self) -> BaseException | None:
        with self._cond:
            error, self.error = self.error, None
            return error

    def wait_round(self, timeout: float) -> None:
        """Wake the thread and wait until it finishes a round (or ``timeout``)."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()
            self._cond.wait(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._woken and not self._stop:
                    self._cond.wait(self._period)
                if self._stop:
                    return
                self._woken = False
                self._busy = True
            try:
                self._work(lambda: self._stop)
            except BaseException as exc:
                log.exception("background work failed; will retry")
                with self._cond:
                    self.error = exc
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
