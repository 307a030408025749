"""Multi-worker behaviour of the data path: a worker killed mid-run, a whole run killed and resumed,
workers started by ``dask cuda worker``, one worker per GPU, and no CUDA context in the client.

The CPU variants run in CI on a LocalCluster of worker processes (same tasks, same ledger); the
``gpu`` / ``multi_gpu`` variants run on the GPU machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import dask
import numpy as np
import pytest
import zarr

from batchlu import pipeline
from batchlu.pipeline.config._settings import TESTING_TASK_DELAY
from _pipeline_helpers import assert_nothing_complete, complete_flags as _complete, \
    complete_flags_once_created, wait_partly_complete
from batchlu.pipeline.cluster._devices import visible_gpus
from batchlu.pipeline.cluster._gpu_cluster import make_gpu_cluster
from batchlu.pipeline.errors import BackendError

ROOT = Path(__file__).resolve().parents[2]
QUIET = {"cluster.dashboard-address": "127.0.0.1:0"}


def _arrays(path) -> dict[str, np.ndarray]:
    group = zarr.open_group(str(path), mode="r")
    # the results; not the ledger's arrays (``_complete``, ``_input_xxh3``: one entry per output chunk)
    return {name: np.asarray(arr[...]) for name, arr in group.arrays() if not name.startswith("_")}


def _assert_identical(path, reference) -> None:
    got, want = _arrays(path), _arrays(reference)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape
        assert got[name].tobytes() == want[name].tobytes(), f"{name} differs"


@pytest.fixture(scope="module")
def matrices(tmp_path_factory):
    root = tmp_path_factory.mktemp("multi")
    path = pipeline.generate(root / "a.zarr", count=480, size=16, chunk=12, kind="singular-mix", seed=31)
    return path


def _kill_one_worker_mid_run(client, matrices, out, backend, config):
    """Run in a thread; SIGKILL one worker process once some (not all) chunks are complete."""
    pids = client.run(os.getpid)
    victim_address, victim = sorted(pids.items())[0]
    box = {}

    def target():
        try:
            with dask.config.set({TESTING_TASK_DELAY: 0.1}):  # slowed down: the kill lands mid-run
                box["report"] = pipeline.run(matrices, str(out), op="lu", backend=backend, client=client,
                                             progress=False, config=config)
        except BaseException as exc:  # pragma: no cover - reported below
            box["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    wait_partly_complete(out)
    done_at_kill = int(_complete(out).sum())
    os.kill(victim, signal.SIGKILL)
    thread.join(300)
    assert not thread.is_alive()
    if "error" in box:
        raise box["error"]
    return box["report"], done_at_kill, _complete(out).size, victim_address


def test_worker_killed_mid_run_cpu(matrices, tmp_path):
    from distributed import Client, LocalCluster

    reference = tmp_path / "reference.zarr"
    pipeline.run(matrices, str(reference), op="lu", backend="cpu", progress=False,
                 config={**QUIET, "cluster.n-workers": 1, "cluster.threads-per-worker": 1})
    config = {"memory-budget": "64KiB"}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        report, done_at_kill, n_chunks, _ = _kill_one_worker_mid_run(
            client, matrices, tmp_path / "killed.zarr", "cpu", config)
    assert 0 < done_at_kill < n_chunks  # the kill really happened mid-run
    assert report.status == "complete"
    done = _complete(tmp_path / "killed.zarr")
    assert done.size == n_chunks and done.all()
    _assert_identical(tmp_path / "killed.zarr", reference)


def test_backend_gpu_without_a_visible_gpu_is_a_clear_error(matrices, tmp_path):
    code = textwrap.dedent(f"""
        from batchlu import pipeline
        try:
            pipeline.run({str(matrices)!r}, {str(tmp_path / 'out.zarr')!r}, op="inv", backend="gpu",
                         progress=False)
        except pipeline.errors.BackendError as exc:
            print("ERROR:", exc)
        else:
            print("NO ERROR")
    """)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "ERROR: Expected a CUDA GPU for --backend gpu. Got none instead" in out.stdout, out.stdout + out.stderr
    assert_nothing_complete(tmp_path / "out.zarr")


def test_explicit_gpus_that_do_not_exist_are_refused():
    with pytest.raises(BackendError, match="Expected"):
        visible_gpus("99")
    with pytest.raises(pipeline.errors.BatchluError, match="GPU indices or UUIDs"):
        visible_gpus("zero")


# ------------------------------------------------------------------------------------------------- GPU
_CONTEXT_PROBE = r'''
import ctypes, json, os, subprocess, sys

def primary_contexts_active():
    """Per device: is this process's primary CUDA context active? (cuInit creates no context.)"""
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    count = ctypes.c_int()
    cuda.cuDeviceGetCount(ctypes.byref(count))
    active = []
    for i in range(count.value):
        dev, flags, state = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        cuda.cuDeviceGet(ctypes.byref(dev), i)
        cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(state))
        active.append(bool(state.value))
    return active

from batchlu import pipeline
report = pipeline.run(sys.argv[1], sys.argv[2], op="inv", backend="gpu", progress=False,
                      config={"cluster.dashboard-address": "127.0.0.1:0"})
smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.split()
print(json.dumps({"kernels_gpu_imported": "batchlu.kernels._gpu" in sys.modules, "smi_pids": smi, "pid": os.getpid(),
                  "contexts": primary_contexts_active(), "backends": list(report.backends),
                  "processed": report.processed, "workers": sorted(report.per_worker)}))
'''


@pytest.mark.gpu
def test_client_never_creates_a_cuda_context(matrices, tmp_path):
    out = subprocess.run([sys.executable, "-c", _CONTEXT_PROBE, str(matrices), str(tmp_path / "inv.zarr")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["backends"] == ["gpu"] and result["processed"] == 480
    assert result["contexts"] and not any(result["contexts"]), result
    # batchlu's GPU backend was never loaded here (dask-cuda may import CuPy: that creates no context)
    assert not result["kernels_gpu_imported"]
    assert str(result["pid"]) not in result["smi_pids"]
    assert all("GPU" in w for w in result["workers"]), result["workers"]
    assert pipeline.verify(matrices, str(tmp_path / "inv.zarr")).ok


@pytest.mark.gpu
def test_resume_after_whole_run_killed_gpu(matrices, tmp_path):
    reference = tmp_path / "reference.zarr"
    pipeline.run(matrices, str(reference), op="lu", backend="gpu", progress=False,
                 config={**QUIET, "cluster.gpus": visible_gpus()[0]})
    out = tmp_path / "killed.zarr"
    env = dict(os.environ, DASK_BATCHLU_TESTING__TASK_DELAY="0.15")
    cmd = [sys.executable, "-m", "batchlu", "run", str(matrices), str(out), "--op", "lu", "--backend", "gpu",
           "--memory-budget", "64KiB",
           "--config", "cluster.dashboard-address=127.0.0.1:0", "--config", f"cluster.gpus={visible_gpus()[0]}",
           # where nvCOMP is installed the GPU codec path groups batches: small groups, so that the
           # ledger fills in steps a kill can fall between
           "--config", "device-batch-bytes=64KiB"]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        done = complete_flags_once_created(out)
        if done is not None and 3 <= done.sum() < done.size // 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = _complete(out)
    assert 0 < done.sum() < done.size
    resumed = subprocess.run(cmd[:10] + ["--resume", "--config", "cluster.dashboard-address=127.0.0.1:0",
                                         "--config", f"cluster.gpus={visible_gpus()[0]}"],
                             env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "skipped" in resumed.stdout
    _assert_identical(out, reference)


@pytest.mark.gpu
def test_scheduler_file_with_dask_cuda_workers(matrices, tmp_path):
    sched = tmp_path / "scheduler.json"
    env = dict(os.environ)
    procs = [subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--scheduler-file", str(sched),
                               "--host", "127.0.0.1", "--port", "0", "--dashboard-address", "127.0.0.1:0"],
                              env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)]
    try:
        deadline = time.monotonic() + 60
        while not sched.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        procs.append(subprocess.Popen([sys.executable, "-m", "dask", "cuda", "worker", "--scheduler-file",
                                       str(sched), "--nthreads", "2", "--dashboard-address", "127.0.0.1:0"],
                                      env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        from distributed import Client

        with Client(scheduler_file=str(sched), timeout=60) as client:
            client.wait_for_workers(len(visible_gpus()), timeout=120)
        report = pipeline.run(matrices, str(tmp_path / "inv.zarr"), op="inv", backend="gpu",
                              scheduler_file=str(sched), progress=False)
        assert report.backends == ("gpu",) and report.processed == 480
        assert len(report.per_worker) == len(visible_gpus())
        assert pipeline.verify(matrices, str(tmp_path / "inv.zarr")).ok
    finally:
        for proc in procs[::-1]:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.multi_gpu
def test_one_worker_per_gpu_share_and_identical_to_one_gpu(matrices, tmp_path):
    one = pipeline.run(matrices, str(tmp_path / "one.zarr"), op="inv", backend="gpu", progress=False,
                       config={**QUIET, "cluster.gpus": "0", "memory-budget": "256KiB"})
    two = pipeline.run(matrices, str(tmp_path / "two.zarr"), op="inv", backend="gpu", progress=False,
                       config={**QUIET, "cluster.gpus": "0,1", "memory-budget": "256KiB"})
    assert len(one.per_worker) == 1 and len(two.per_worker) == 2
    assert all(share > 0.2 for share in two.worker_share.values()), two.worker_share
    assert sum(two.per_worker.values()) == 480
    _assert_identical(tmp_path / "two.zarr", tmp_path / "one.zarr")
    assert pipeline.verify(matrices, str(tmp_path / "two.zarr")).ok


@pytest.mark.multi_gpu
def test_gpu_worker_killed_mid_run(matrices, tmp_path):
    from distributed import Client

    reference = tmp_path / "reference.zarr"
    pipeline.run(matrices, str(reference), op="lu", backend="gpu", progress=False,
                 config={**QUIET, "cluster.gpus": "0"})
    config = {"memory-budget": "64KiB"}
    with make_gpu_cluster(visible_gpus()[:2], threads_per_worker=1,
                          dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        report, done_at_kill, n_chunks, victim = _kill_one_worker_mid_run(
            client, matrices, tmp_path / "killed.zarr", "gpu", config)
    assert 0 < done_at_kill < n_chunks
    assert report.status == "complete" and report.backends == ("gpu",)
    _assert_identical(tmp_path / "killed.zarr", reference)


def test_cli_report_html_output_codec_and_gpu_error(matrices, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from batchlu.workflows.cli import cli

    pytest.importorskip("bokeh")
    out, html = tmp_path / "o.zarr", tmp_path / "report.html"
    result = CliRunner().invoke(cli, ["run", str(matrices), str(out), "--op", "inv", "--backend", "cpu",
                                      "--report", str(html), "--output-codec", "none", "--workers", "1",
                                      "--config", "cluster.dashboard-address=127.0.0.1:0"])
    assert result.exit_code == 0, result.output
    assert "dashboard" not in result.output   # the embedded cluster has stopped: no link to it
    assert html.stat().st_size > 10_000 and "<html" in html.read_text()[:2000].lower()
    assert [c["name"] for c in zarr.open_array(str(out), path="inv").metadata.to_dict()["codecs"]] == \
        ["bytes", "crc32c"]   # no compressor; the checksum (batchlu.output-checksum)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    result = CliRunner().invoke(cli, ["run", str(matrices), str(tmp_path / "g.zarr"), "--op", "inv",
                                      "--backend", "gpu", "--config", "cluster.dashboard-address=127.0.0.1:0"])
    assert result.exit_code == 1
    assert "Error: Expected a CUDA GPU for --backend gpu. Got none instead" in result.output
