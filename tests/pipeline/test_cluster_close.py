"""The embedded cluster's close waits for its workers to end (``_connect.WORKER_CLOSE_S``), instead of
distributed's 4 s before a kill and 1 s for the kill, past which a finished run ended in TimeoutError.
A worker that takes 6 s to close must close whole: its slow plugin's teardown runs to the end."""

from __future__ import annotations

import time
from pathlib import Path

from distributed.diagnostics.plugin import WorkerPlugin

from batchlu import pipeline
from batchlu.pipeline.cluster import _connect

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
