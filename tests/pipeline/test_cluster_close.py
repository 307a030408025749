"""The embedded cluster's close waits for its workers to end (``_connect.WORKER_CLOSE_S``), instead of
distributed's 4 s before a kill and 1 s for the kill, past which a finished run ended in TimeoutError.
A worker that takes 6 s to close must close whole: its slow plugin's teardown runs to the end."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from distributed.diagnostics.plugin import WorkerPlugin

from batchlu import pipeline
from batchlu.pipeline.cluster import _connect, _stops

SLOW_S = 6   # past distributed's 4 s + 1 s


class SlowTeardown(WorkerPlugin):
    """Takes ``seconds`` to tear down, then writes ``marker``: the worker was let close."""

    def __init__(self, marker: str, seconds: float):
        self.marker, self.seconds = marker, seconds

    def teardown(self, worker):
        time.sleep(self.seconds)
        Path(self.marker).write_text(f"{worker.address} closed")


def test_a_slow_worker_process_is_let_close(tmp_path):
    assert _connect.WORKER_CLOSE_S > SLOW_S
    marker = tmp_path / "closed"
    options = pipeline.options({"cluster.processes": True, "cluster.n-workers": 1,
                                "cluster.threads-per-worker": 1,
                                "cluster.dashboard-address": "127.0.0.1:0",
                                "cluster.log-file": str(tmp_path / "run.log")})
    with _connect._embedded(options, None) as client:
        client.register_plugin(SlowTeardown(str(marker), SLOW_S))
        assert client.submit(sum, [1, 2, 3]).result() == 6
        started = time.monotonic()
    took = time.monotonic() - started
    assert marker.read_text().endswith(" closed")   # killed at 4 s, the teardown would not have ended
    assert SLOW_S <= took < _connect.WORKER_CLOSE_S + 10


def test_an_error_leaves_at_once_and_keeps_its_message(tmp_path):
    """A run stopped by an error (or Ctrl-C) does not wait for its busy workers to close, and what the
    user sees is the error, not the close."""
    options = pipeline.options({"cluster.processes": True, "cluster.n-workers": 1,
                                "cluster.threads-per-worker": 1,
                                "cluster.dashboard-address": "127.0.0.1:0",
                                "cluster.log-file": str(tmp_path / "run.log")})
    started = None
    try:
        with _connect._embedded(options, None) as client:
            client.register_plugin(SlowTeardown(str(tmp_path / "closed"), 3 * SLOW_S))
            started = time.monotonic()
            raise KeyError("the run's own error")
    except KeyError as error:
        assert error.args == ("the run's own error",)
    took = time.monotonic() - started
    assert took < 2 * SLOW_S and not (tmp_path / "closed").exists()


def _redirected(name: str) -> bool:
    import logging

    return any(getattr(h, "batchlu_log", None) for h in logging.getLogger(name).handlers)


def test_the_loggers_below_that_print_on_their_own_go_to_the_file_too(tmp_path, capfd):
    """distributed's config gives some loggers below the redirected ones a stderr handler of their own
    (``tornado.application`` logged a traceback under a stopped run's one line): they go to the file,
    and get their handlers back after."""
    import logging
    import sys

    from batchlu.pipeline.cluster import _logs

    path = tmp_path / "run.log"
    own = logging.getLogger("tornado.application.batchlu-test")
    silent = logging.getLogger("distributed.batchlu-test-silent")   # no handler, propagation off
    handler = logging.StreamHandler(sys.stderr)
    own.addHandler(handler)
    own.propagate = silent.propagate = False
    try:
        restore = _logs.redirect(str(path))
        try:
            own.error("Exception in callback (a test)")
            silent.error("Nothing to print it with (a test)")
        finally:
            restore()
        assert own.handlers == [handler] and not own.propagate and not silent.handlers
        text = path.read_text()
        assert "Exception in callback (a test)" in text and "Nothing to print it with (a test)" in text
        assert "(a test)" not in capfd.readouterr().err
    finally:
        own.removeHandler(handler)
        own.propagate = silent.propagate = True


def test_a_stopped_run_keeps_its_logs_in_the_file_an_ended_one_gives_them_back(tmp_path):
    """After Ctrl-C the client's event loop can still log about a worker just killed ("Couldn't gather
    1 keys, rescheduling"): those lines go to the run's log file, not under the run's one line on the
    terminal. A run that ended gives the loggers their handlers back."""
    import logging

    options = pipeline.options({"cluster.n-workers": 1, "cluster.threads-per-worker": 1,
                                "cluster.dashboard-address": "127.0.0.1:0",
                                "cluster.log-file": str(tmp_path / "run.log")})
    before = list(logging.getLogger("distributed").handlers)
    with _connect._embedded(options, None):
        assert _redirected("distributed")
    assert logging.getLogger("distributed").handlers == before
    try:
        with _connect._embedded(options, None):
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    try:
        assert _redirected("distributed")
        assert not [h for h in before if h in logging.getLogger("distributed").handlers and h.level <= logging.WARNING
                    and type(h) is logging.StreamHandler]
        logging.getLogger("distributed.client").warning("Couldn't gather 1 keys, rescheduling (a test)")
        assert "Couldn't gather 1 keys, rescheduling (a test)" in (tmp_path / "run.log").read_text()
    finally:   # the loggers as before the test
        for name in ("distributed", "tornado", "bokeh", "batchlu", "asyncio"):
            logger = logging.getLogger(name)
            for h in [h for h in logger.handlers if getattr(h, "batchlu_log", None)]:
                logger.removeHandler(h)
                h.close()
        logging.getLogger("distributed").handlers[:0] = [h for h in before
                                                         if h not in logging.getLogger("distributed").handlers]


def _slow_exit_hook(marker: str, seconds: float) -> None:
    """In a worker: an exit hook, registered before the close, that takes ``seconds`` and then writes
    ``marker``, as numba's, CuPy's and the interpreter's own teardown would take their time."""
    import atexit

    def hook():
        time.sleep(seconds)
        Path(marker).write_text("the interpreter's teardown ran")

    atexit.register(hook)


def _processes_options(tmp_path) -> object:
    return pipeline.options({"cluster.processes": True, "cluster.n-workers": 2,
                             "cluster.threads-per-worker": 1,
                             "cluster.dashboard-address": "127.0.0.1:0",
                             "cluster.log-file": str(tmp_path / "run.log")})


def test_a_closed_worker_process_ends_without_the_interpreters_teardown(tmp_path):
    """After a run that ended well, the client waits for its worker processes to end: each ends once
    its worker has closed, without the exit hooks registered before the close."""
    markers = [tmp_path / f"teardown-{i}" for i in range(2)]
    with _connect._embedded(_processes_options(tmp_path), None) as client:
        workers = sorted(client.scheduler_info()["workers"])
        assert len(workers) == 2
        for worker, marker in zip(workers, markers):
            client.run(_slow_exit_hook, str(marker), SLOW_S, workers=[worker])
        assert client.submit(sum, [1, 2, 3]).result() == 6
        started = time.monotonic()
    took = time.monotonic() - started
    assert not [m for m in markers if m.exists()]
    assert took < SLOW_S - 2


def _log_buffered(path: str) -> None:
    """In a worker: a line held in a buffering handler, which only a flush writes to ``path``."""
    import logging
    import logging.handlers

    target = logging.FileHandler(path)
    buffered = logging.handlers.MemoryHandler(capacity=10_000, flushLevel=logging.CRITICAL + 1, target=target)
    logger = logging.getLogger("batchlu.test-buffered")
    logger.addHandler(buffered)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logger.info("held until the handlers are flushed")


def test_a_closed_worker_process_flushes_its_log_handlers_before_it_ends(tmp_path):
    path = tmp_path / "buffered.log"
    with _connect._embedded(_processes_options(tmp_path), None) as client:
        worker = sorted(client.scheduler_info()["workers"])[0]
        client.run(_log_buffered, str(path), workers=[worker])
        assert not path.exists() or path.read_text() == ""
    assert path.read_text() == "held until the handlers are flushed\n"


def _has_exit_plugin(dask_worker) -> bool:
    return "batchlu-exit" in dask_worker.plugins


def test_workers_in_the_clients_own_process_are_not_ended(tmp_path):
    """A CPU cluster of threads runs its workers in this process: ending one would end the client.
    Worker processes get the plugin."""
    options = pipeline.options({"cluster.processes": False, "cluster.n-workers": 1,
                                "cluster.threads-per-worker": 1,
                                "cluster.dashboard-address": "127.0.0.1:0",
                                "cluster.log-file": str(tmp_path / "run.log")})
    with _connect._embedded(options, None) as client:
        assert client.run(_has_exit_plugin) == {w: False for w in client.scheduler_info()["workers"]}
    with _connect._embedded(_processes_options(tmp_path), None) as client:
        assert set(client.run(_has_exit_plugin).values()) == {True}


@pytest.mark.parametrize("to_exit", [True, False], ids=["command", "notebook"])
def test_a_stopped_run_keeps_dropping_signals_only_in_a_process_that_ends_with_it(tmp_path, monkeypatch, to_exit):
    """The console's process (``hold_stops_to_exit``) keeps Ctrl-C and SIGTERM dropped after a stopped
    run's closes, through its record, its lock's release and its last line, until it exits; in any
    other process the run gives the handlers back, so that Ctrl-C works after it."""
    import signal

    monkeypatch.setattr(_stops, "_HOLD_TO_EXIT", to_exit)
    options = pipeline.options({"cluster.n-workers": 1, "cluster.threads-per-worker": 1,
                                "cluster.dashboard-address": "127.0.0.1:0",
                                "cluster.log-file": str(tmp_path / "run.log")})
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(KeyboardInterrupt):
            with _connect._embedded(options, None):
                raise KeyboardInterrupt
        now = {s: signal.getsignal(s) for s in before}
        if to_exit:
            assert all(handler is _stops.dropped for handler in now.values()), now
        else:
            assert now == before
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
