"""``batchlu run`` refuses to report wrong data as complete (issue 16, items 1 to 3; issue 38, item 4),
each refusal one line ``Error: ...`` with exit status 1: a resume whose output lost an array, a second
writer on an output, a resume whose input changed, a run whose input changed while it ran. A stale
lock is taken over with one ``Warning: ...`` line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import dask
import numpy as np
import pytest
import zarr
from _cli_helpers import one_line_error

from batchlu.pipeline.config._settings import TESTING_TASK_DELAY


@pytest.fixture()
def source(invoke, tmp_path):
    a = tmp_path / "a.zarr"
    assert invoke("generate", a, "--count", 40, "--size", 5, "--chunk", 10, "--seed", 3).exit_code == 0
    return a


def _run(invoke, source, out, scheduler, *extra):
    return invoke("run", source, out, "--op", "inv", "--scheduler", scheduler, "--no-progress", *extra)


def test_resume_with_a_deleted_output_array(invoke, source, scheduler_address, tmp_path):
    out = tmp_path / "o.zarr"
    assert _run(invoke, source, out, scheduler_address).exit_code == 0
    shutil.rmtree(out / "inv")
    one_line_error(_run(invoke, source, out, scheduler_address, "--resume"),
                    "output array inv", "4 of 4 chunks", "--overwrite")
    assert not (out / "inv").exists()


def test_second_writer_is_refused_naming_the_owner(invoke, source, scheduler_address, tmp_path):
    out = tmp_path / "o.zarr"
    assert _run(invoke, source, out, scheduler_address).exit_code == 0
    stamp = (out / "zarr.json").read_bytes()
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        from batchlu.pipeline.output import _lock

        with open(str(out) + ".lock", "w") as f:
            json.dump({"host": socket.gethostname(), "pid": owner.pid, "token": "t" * 32,
                       "started": "2020-01-02T03:04:05+00:00", "pid_start": _lock._process_start(owner.pid)}, f)
        for flag in ("--overwrite", "--resume"):
            one_line_error(_run(invoke, source, out, scheduler_address, flag),
                            f"PID {owner.pid} on host {socket.gethostname()}", "o.zarr.lock")
    finally:
        owner.kill()
        owner.wait()
    assert (out / "zarr.json").read_bytes() == stamp and (out / "inv").is_dir()


def test_stale_lock_is_one_warning_line(invoke, source, scheduler_address, tmp_path):
    out = tmp_path / "o.zarr"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with open(str(out) + ".lock", "w") as f:
        json.dump({"host": socket.gethostname(), "pid": dead.pid, "token": "t" * 32,
                   "started": "2020-01-02T03:04:05+00:00"}, f)
    result = _run(invoke, source, out, scheduler_address)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning: ")]
    assert len(warnings) == 1 and f"stale lock {out}.lock of PID {dead.pid}" in warnings[0], result.stderr
    assert not os.path.exists(str(out) + ".lock")


def test_resume_with_the_input_regenerated(invoke, source, scheduler_address, tmp_path):
    out = tmp_path / "o.zarr"
    assert _run(invoke, source, out, scheduler_address, "--chunk", 10).exit_code == 0
    zarr.open_array(str(out), path="_complete", mode="r+")[2:] = False  # as if killed half-way
    group = zarr.open_group(str(out), mode="r+")
    group.attrs["batchlu"] = {**group.attrs["batchlu"], "status": "running"}
    shutil.rmtree(source)
    assert invoke("generate", source, "--count", 40, "--size", 5, "--chunk", 10, "--seed", 4).exit_code == 0
    one_line_error(_run(invoke, source, out, scheduler_address, "--resume"),
                    "other values in matrices 0:10", "--overwrite")
    assert zarr.open_group(str(out), mode="r").attrs["batchlu"]["status"] == "running"


def test_an_input_rewritten_during_the_run_is_one_line_and_no_complete(invoke, scheduler_address, tmp_path):
    """Issue 38, item 4: the input written again with other values while tasks wait (the test-only
    task delay) gave "complete", exit 0. Now: one line naming the input and --overwrite, exit 1, the
    output's status failed."""
    source, out = tmp_path / "a.zarr", tmp_path / "o.zarr"
    assert invoke("generate", source, "--count", 120, "--size", 4, "--chunk", 10, "--seed", 5).exit_code == 0
    rewritten = []

    def rewrite():   # once some chunks are complete and the others wait: every chunk file replaced
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            folder = out / "_complete" / "c"
            if folder.is_dir() and 2 <= len([n for n in os.listdir(folder) if n.isdigit()]) < 8:
                zarr.open_array(str(source), mode="r+")[...] = np.random.default_rng(6).standard_normal((120, 4, 4))
                rewritten.append(True)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=rewrite)
    thread.start()
    with dask.config.set({TESTING_TASK_DELAY: 0.3}):
        result = _run(invoke, source, out, scheduler_address, "--chunk", 10)
    thread.join()
    assert rewritten
    one_line_error(result, f"the input {source}", "changed during the run", "--overwrite")
    assert zarr.open_group(str(out), mode="r").attrs["batchlu"]["status"] == "failed"


def test_two_real_processes_and_sigterm(source, scheduler_address, tmp_path):
    """Two ``batchlu run`` processes on one output: the second is refused with one line naming the
    first; SIGTERM (``kill``, a SLURM time limit) ends the first as Ctrl-C does: one line on stderr,
    status failed, lock given back, so that ``--resume`` starts without a stale-lock warning."""
    out = tmp_path / "o.zarr"
    base = [sys.executable, "-m", "batchlu", "run", str(source), str(out), "--op", "inv",
            "--scheduler", scheduler_address, "--no-progress"]
    first = subprocess.Popen(base + ["--chunk", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, DASK_BATCHLU_TESTING__TASK_DELAY="5"))  # alive until killed
    # (at 1 s a task, it ended on a loaded machine while the second was still importing (13.5 s), and
    # the second then rightly took the output)
    try:
        deadline = time.monotonic() + 120
        done = 0
        while time.monotonic() < deadline and done < 2 and first.poll() is None:
            try:
                done = int(zarr.open_array(str(out), path="_complete", mode="r")[...].sum())
            except Exception:
                pass
            time.sleep(0.05)
        assert first.poll() is None, first.communicate()
        second = subprocess.run(base + ["--overwrite"], capture_output=True, text=True, timeout=120)
        assert second.returncode == 1, second.stdout + second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: ") and f"PID {first.pid}" in lines[0], lines
        assert first.poll() is None  # unharmed, still running
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines() == ["Aborted! (SIGTERM)"], err   # one line, as Ctrl-C's "Aborted!"
    assert not os.path.exists(str(out) + ".lock")
    record = zarr.open_group(str(out), mode="r").attrs["batchlu"]
    assert record["status"] == "failed" and record["error"] == "Terminated: SIGTERM", record
    resumed = subprocess.run(base + ["--resume"], capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0 and "Warning" not in resumed.stderr, resumed.stderr
    assert "complete" in resumed.stdout
    assert zarr.open_group(str(out), mode="r").attrs["batchlu"]["status"] == "complete"
