"""A stopped run's hold on Ctrl-C and SIGTERM: the first signal stops the run, within seconds, and
the ones after it are dropped while it stops, so that the stop, the failure's record, the lock's
release and the one line on the terminal are not cut short and the first signal decides the exit.

Shared by the embedded cluster's closes (:class:`batchlu.pipeline.cluster._connect._Stop`) and the
run on threads of the command's own process (``_run_in_process`` in
:mod:`batchlu.pipeline.client._submit`). In the ``batchlu`` command's own process the hold of a
stopped run lasts until the process exits (:func:`hold_stops_to_exit`); anywhere else (a notebook, a
test runner) the run gives the handlers back.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

STOPS = (signal.SIGINT, signal.SIGTERM)

_HOLD_TO_EXIT = False   # set by hold_stops_to_exit


def hold_stops_to_exit() -> None:
    """In a process that ends with its command (the ``batchlu`` console entry): a stopped run keeps
    dropping Ctrl-C and SIGTERM after its stop, until the process exits. What follows it, the run's
    failure recorded, its lock given back, its one line printed, was open to a second Ctrl-C: a
    traceback, exit status 130, a lock left behind. Never in a notebook or a test runner, whose
    Ctrl-C must work again after the run."""
    global _HOLD_TO_EXIT
    _HOLD_TO_EXIT = True


def dropped(signum, frame) -> None:
    """A Ctrl-C or SIGTERM while a stopped run stops: it is stopping already."""


def _in_main_thread() -> bool:
    # Python runs signal handlers in the main thread only, and sets them there only
    return threading.current_thread() is threading.main_thread()


class SignalHold:
    """Ctrl-C and SIGTERM dropped from :meth:`hold` until :meth:`release`. A signal the process
    ignores stays ignored."""

    def __init__(self):
        self.held = None     # the handlers in force before the hold, while it holds
        self._armed = {}     # the handlers :meth:`from_the_first_signal` wrapped, while it does

    def hold(self) -> None:
        """Drop Ctrl-C and SIGTERM from now on (the main thread only; held already: nothing)."""
        if self.held is not None or not _in_main_thread():
            return
        self.held = {}
        for signum in STOPS:
            handler = self._armed.get(signum, signal.getsignal(signum))   # not the arming's wrapper
            if handler is not signal.SIG_IGN:
                signal.signal(signum, dropped)
                self.held[signum] = handler

    def release(self) -> None:
        """The handlers of before the hold back in force."""
        held, self.held = self.held, None
        for signum, handler in (held or {}).items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

    def end(self, stopped: bool) -> None:
        """The run's part that may be stopped has ended: the handlers back, unless it was stopped in
        a process that ends with its command (:func:`hold_stops_to_exit`)."""
        if not (stopped and _HOLD_TO_EXIT):
            self.release()

    @contextlib.contextmanager
    def from_the_first_signal(self) -> Iterator[None]:
        """In the block, the first Ctrl-C or SIGTERM starts the hold and then takes effect as the
        handler in force decides (KeyboardInterrupt, the command's SIGTERM exit). A second signal
        20 ms behind it was raised in the stop the first began: it, not the first, decided the exit
        status (SIGTERM then Ctrl-C exited 1, Ctrl-C then SIGTERM 143). Leaving the block without a
        signal gives the handlers back; after one, :meth:`release` (or :meth:`end`) does. Signals
        whose handler is not Python's (ignored, or the default action) are left as they are."""
        if not _in_main_thread():
            yield
            return

        armed = {signum: handler for signum in STOPS if callable(handler := signal.getsignal(signum))}

        def first(signum, frame):   # its own copy: a signal as the block ends finds its handler still
            self.hold()
            armed[signum](signum, frame)

        self._armed = armed
        for signum in armed:
            signal.signal(signum, first)
        try:
            yield
        finally:
            self._armed = {}
            if self.held is None:   # no stop: the handlers of before
                for signum, handler in armed.items():
                    signal.signal(signum, handler)
