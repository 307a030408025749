"""The worker plugin that sends a worker's log to the run's log file (:mod:`._logs`). It imports
distributed, which the rest of batchlu imports only with a cluster."""

from __future__ import annotations

from distributed.diagnostics.plugin import WorkerPlugin

from ._logs import redirect

__all__ = ["WorkerLog"]


class WorkerLog(WorkerPlugin):
    """Send the worker's log to the run's log file (see :func:`._logs.redirect`), not to the terminal
    it inherited from the client: the embedded cluster's workers share ``batchlu run``'s."""

    name = "batchlu-log"
    idempotent = True

    def __init__(self, path: str):
        self.path = path
        self._restore = None

    def setup(self, worker):
        self._restore = redirect(self.path)

    def teardown(self, worker):
        # A closing worker tears its plugins down first, then stops its heartbeat, its task threads
        # and its connections: what it logs meanwhile (a heartbeat to a scheduler already gone, with
        # its tracebacks) still belongs to the run's log file. Only a plugin taken off a worker that
        # keeps running gives the terminal back.
        if self._restore is not None and _running(worker):
            self._restore()
            self._restore = None


def _running(worker) -> bool:
    from distributed.core import Status

    return getattr(worker, "status", None) in (Status.running, Status.paused)
