"""Helpers shared by the pipeline tests (imported as a plain module: tests/ has no packages)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import zarr

from batchlu import pipeline
from batchlu.pipeline.store._object_store import zarr_store


def outputs_of(path: str) -> dict[str, np.ndarray]:
    """Every array of an output group (ledger included), read back (a path or an ``s3://`` URL)."""
    group = zarr.open_group(zarr_store(str(path)), mode="r")
    return {name: np.asarray(array[...]) for name, array in group.arrays()}


def assert_nothing_complete(path) -> None:
    """A failed run leaves either no output, or one whose status and ledger say nothing is done."""
    path = str(path)
    if not os.path.exists(path):
        return
    record = pipeline.output._group.read_provenance(path)
    if record is None:  # not even a group: nothing that looks like an output
        return
    assert record["status"] != "complete"
    group = zarr.open_group(path, mode="r")
    if "_complete" in group:
        assert not np.asarray(group["_complete"][...]).any()


def complete_flags(path) -> np.ndarray:
    """An output's per-chunk ledger (``_complete``): one bool per chunk, never empty. Raises when it
    cannot be read (zarr's error) or holds no chunk (AssertionError), so that ``.all()`` cannot pass
    on nothing."""
    flags = np.asarray(zarr.open_array(zarr_store(str(path)), path="_complete", mode="r")[...])
    assert flags.dtype == bool and flags.ndim == 1 and flags.size > 0, \
        f"expected a non-empty bool ledger at {path}, got {flags.dtype} {flags.shape}"
    return flags


def complete_flags_once_created(path) -> np.ndarray | None:
    """:func:`complete_flags`, or None while the output or its ledger does not exist yet (a run that
    is starting); any other failure to read it raises."""
    try:
        return complete_flags(path)
    except FileNotFoundError:  # zarr's ArrayNotFoundError too: the ledger is not created yet
        return None


def completed_count(path) -> int:
    """How many chunks of a run in progress are complete (0 while its ledger does not exist yet)."""
    flags = complete_flags_once_created(path)
    return 0 if flags is None else int(flags.sum())


def wait_partly_complete(path, timeout: float = 120) -> None:
    """Poll the ledger of a run in progress until at least 3 but under half of its chunks are complete
    (or ``timeout`` seconds pass; the caller asserts on what it then finds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = complete_flags_once_created(path)
        if done is not None and 3 <= done.sum() < done.size // 2:
            return
        time.sleep(0.05)


def start_script(tmp_path, text: str, *args, env=None) -> subprocess.Popen:
    """Run the Python script ``text`` (saved as ``tmp_path/runner.py``) with ``args`` in a process of
    its own, stdout and stderr together in a pipe."""
    script = tmp_path / "runner.py"
    script.write_text(text)
    return subprocess.Popen([sys.executable, str(script), *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def wait_for_chunks(proc: subprocess.Popen, out, count: int, timeout: float = 120) -> None:
    """Poll the ledger of ``proc``'s run until ``count`` chunks are complete; fail if the run ends
    first or makes no such progress within ``timeout`` seconds."""
    import pytest

    deadline = time.monotonic() + timeout
    while completed_count(out) < count:
        if proc.poll() is not None:
            pytest.fail(f"the run ended before it could be stopped:\n{proc.stdout.read().decode()}")
        if time.monotonic() > deadline:
            pytest.fail(f"the run did not complete {count} chunks within {timeout:g} s")
        time.sleep(0.02)


# One chunk of 4 matrices per task and per batch, slowed down (a test-only setting, outside the
# batchlu namespace, set through the environment of the runner): the run takes a few seconds.
SLOW = {"chunk": 4, "memory-budget": 1}
SLOW_ENV = {"DASK_BATCHLU_TESTING__TASK_DELAY": "0.08"}

RUNNER = textwrap.dedent("""
    import sys
    from distributed import Client, LocalCluster
    from batchlu import pipeline

    if __name__ == "__main__":
        with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            pipeline.run(sys.argv[1], sys.argv[2], op=sys.argv[3], rhs=sys.argv[4] or None,
                         client=client, progress=False, config=%r)
""" % SLOW)


def start_slow_run(tmp_path, source, out, op, rhs="") -> subprocess.Popen:
    """:data:`RUNNER`: ``op`` from ``source`` into ``out``, slowly, in a process of its own."""
    return start_script(tmp_path, RUNNER, source, out, op, rhs, env=dict(os.environ, **SLOW_ENV))


def start_and_kill(tmp_path, source, out, op, rhs="", *, wait_for=5):
    """A slow run SIGKILLed once ``wait_for`` chunks are complete."""
    proc = start_slow_run(tmp_path, source, out, op, rhs)
    try:
        wait_for_chunks(proc, out, wait_for, timeout=60)
        sigkill(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def sigkill(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` (a whole run killed at once) and reap it."""
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert proc.returncode == -signal.SIGKILL


def contend(take, threads: int = 6) -> tuple[list, list]:
    """Call ``take()`` in ``threads`` threads released at once: ``(what the calls returned, the messages
    of the ones that raised OutputLockedError)``."""
    from batchlu.pipeline.errors import OutputLockedError

    barrier, won, refused = threading.Barrier(threads), [], []

    def one():
        barrier.wait()
        try:
            won.append(take())
        except OutputLockedError as exc:
            refused.append(str(exc))

    started = [threading.Thread(target=one) for _ in range(threads)]
    for t in started:
        t.start()
    for t in started:
        t.join()
    return won, refused


def require_nvcomp() -> None:
    """Skip a GPU codec test where nvCOMP's library does not load (fail instead with
    ``BATCHLU_REQUIRE_NVCOMP=1``, as on the GPU machine)."""
    import pytest

    from batchlu.pipeline.codecs import _nvcomp

    why = _nvcomp.missing()
    if why is not None:
        if os.environ.get("BATCHLU_REQUIRE_NVCOMP") == "1":
            pytest.fail(f"BATCHLU_REQUIRE_NVCOMP=1 but {why}")
        pytest.skip(why)


class _Ledger:
    def __init__(self, marks: list):
        self.marks = marks

    def mark(self, c0: int, c1: int, digests) -> None:
        self.marks.append((c0, c1))


class _Check:
    def __init__(self, check):
        self.check = check


def recording(marks: list, check=None):
    """A record stage (:class:`batchlu.pipeline.worker._loop.Record`) that appends each range it records to
    ``marks`` (in matrices: a chunk of 1), fenced by ``check()`` (None: unfenced)."""
    from batchlu.pipeline.worker._loop import Record

    return Record(ledger=_Ledger(marks), fence=None if check is None else _Check(check))
