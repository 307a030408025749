"""Before the tasks (batchlu.pipeline.cluster._devices, batchlu.pipeline.client._warmup): the backend is
resolved once, in the client, and the tasks get a concrete ``cpu`` or ``gpu``."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from batchlu import pipeline
from batchlu.pipeline import errors
from batchlu.pipeline.client import _warmup
from batchlu.pipeline.cluster import _devices
from batchlu.pipeline.worker import _backends


def test_resolve_backend_on_a_cpu_cluster(client):
    assert _devices.resolve_on_workers(client, "cpu") == "cpu"
    if _devices.gpu_available():
        pytest.skip("this machine has a GPU: auto would resolve to gpu")
    assert _devices.resolve_on_workers(client, "auto") == "cpu"
    with pytest.raises(errors.BackendError, match="Expected a CUDA GPU usable through CuPy"):
        _devices.resolve_on_workers(client, "gpu")


def test_tasks_get_the_backend_resolved_in_the_client(client, stores, tmp_path, monkeypatch):
    """The workers run in this process (the session's LocalCluster), so the tasks' calls show here."""
    if _devices.gpu_available():
        pytest.skip("this machine has a GPU: auto would resolve to gpu")
    asked = []
    real = _backends.resolve

    def resolve(name):
        asked.append(name)
        return real(name)

    monkeypatch.setattr(_backends, "resolve", resolve)
    report = pipeline.run(stores["a"], str(tmp_path / "out.zarr"), op="inv", backend="auto",
                          client=client, progress=False, config={"backend": "auto"})
    assert report.status == "complete" and report.tasks >= 2
    assert asked == ["cpu"] * report.tasks
    assert report.backends == ("cpu",) and report.backend == "auto"


def test_the_embedded_cluster_decides_the_backend_once(stores, tmp_path, monkeypatch):
    """The embedded cluster is built for cpu or gpu: its tasks get that one, with no second
    resolution of auto on the workers."""
    if _devices.gpu_available():
        pytest.skip("this machine has a GPU: auto would resolve to gpu")
    asked, probed = [], []
    real_resolve, real_probe = _devices.resolve_on_workers, _devices.probe
    monkeypatch.setattr(_devices, "resolve_on_workers", lambda client, name: asked.append(name) or
                        real_resolve(client, name))
    monkeypatch.setattr(_devices, "probe", lambda name: probed.append(name) or real_probe(name))
    report = pipeline.run(stores["a"], str(tmp_path / "out.zarr"), op="inv", backend="auto", progress=False,
                          config={"cluster.processes": False, "cluster.n-workers": 1,
                                  "cluster.dashboard-address": "127.0.0.1:0"})
    assert report.status == "complete" and report.backends == ("cpu",) and report.backend == "auto"
    assert asked == ["cpu"] and probed == []


def test_a_sparse_run_warms_up_its_bound_op_on_values(client, tmp_path, monkeypatch):
    """The GPU workers' warm-up of a sparse op: the values' shape (N, nnz) and the pattern's analysis
    travel in the WarmUp; warming up runs the op bound to it on random values and reserves slots of
    the layout the tasks borrow (run here with the host engine: the GPU one is tested on a GPU)."""
    from batchlu.pipeline.worker import _buffers, _engines

    source = pipeline.generate(tmp_path / "kkt.zarr", count=12, kind="saddle", size=90, chunk=4, seed=2)
    seen = []
    monkeypatch.setattr(_warmup, "prepare_workers", lambda client, job, options: seen.append(
        _warmup.warmup_for(job)))
    monkeypatch.setattr(_devices, "resolve_on_workers", lambda client, requested: "gpu")  # asks for a warm-up
    monkeypatch.setattr(_warmup, "choose_codecs", lambda client, job: job)
    real = _backends.resolve
    monkeypatch.setattr(_backends, "resolve", lambda name: real("cpu"))   # the tasks compute on the host
    out = tmp_path / "out.zarr"
    pipeline.run(source, str(out), op="ldlt-solve", client=client, progress=False)
    (spec,) = seen
    import zarr

    group = zarr.open_group(source, mode="r")
    n, nnz = group.attrs["sparse"]["n"], group["values"].shape[1]
    assert spec.n == n and spec.tail == (nnz,) and spec.symbolic is not None and spec.symbolic.n == n
    assert spec.rhs == ((n,), "float64") and [o[0] for o in spec.outputs] == ["x", "berr", "perturbed", "info"]
    engine = _engines.HostEngine()
    steps = _engines.warm_up(engine, spec)
    assert list(steps) == ["kernels", "pinned slots"] and all(s >= 0 for s in steps.values()), steps
    layout = _buffers.Layout(a=((nnz,), np.dtype("float64")), b=((n,), np.dtype("float64")),
                             outs=tuple((name, tuple(tail), np.dtype(dtype)) for name, tail, dtype in spec.outputs))
    assert any(lay == layout for lay, _, _ in engine.pool._free)


_KERNELS_AT_THE_FIRST_TASK = """
import sys

from numba.core.dispatcher import Dispatcher


def loaded():
    # overloads of batchlu's numba kernels in this process: compiled, or read from numba's disk cache
    return sum(len(f.overloads) for name, module in list(sys.modules.items()) if name.startswith("batchlu.kernels")
               for f in vars(module).values() if isinstance(f, Dispatcher))


if __name__ == "__main__":
    from batchlu import pipeline
    from batchlu.pipeline.worker import _tasks

    real, first = _tasks.run_batches, []

    def run_batches(*args, **kwargs):   # the tasks' batch loop (in-process workers share these modules)
        if not first:
            first.append(loaded())
        return real(*args, **kwargs)

    _tasks.run_batches = run_batches
    source = pipeline.generate(sys.argv[1] + "/a.zarr", count=16, size=5, dtype=sys.argv[2], chunk=8, seed=3)
    report = pipeline.run(source, sys.argv[1] + "/o.zarr", op=sys.argv[3], backend="cpu", progress=False,
                          config={"cluster.processes": False, "cluster.n-workers": 1,
                                  "cluster.threads-per-worker": 1, "cluster.dashboard-address": "127.0.0.1:0"})
    assert report.status == "complete" and report.tasks == 2, report
    print("kernels loaded at the first task, after the run:", first[0], loaded())
"""


def test_the_cpu_warm_up_loads_every_kernel_the_tasks_call(tmp_path):
    """A CPU run's warm-up compiles the op's numba kernels (or loads them from numba's cache) on
    each worker: the tasks find every kernel they call there. The demo's first run counted the
    compilation as compute (warm-up 0.02 s, compute 9.5 s)."""
    script = tmp_path / "kernels.py"
    script.write_text(_KERNELS_AT_THE_FIRST_TASK)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path), "float64", "inv"], capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first, after = map(int, proc.stdout.split()[-2:])
    assert first > 0 and first == after, proc.stdout


def test_a_run_reports_its_own_warm_up_parts_on_a_cluster_kept_up(client, stores, tmp_path):
    """A cluster kept up (Jupyter's ``client=``) keeps every run's setup plugin: a CPU run reports the
    parts of its own setup, not those an earlier GPU run left on the workers, and the parts of one
    worker, which add up to at most the warm-up."""
    from distributed.diagnostics.plugin import WorkerPlugin

    from batchlu.pipeline.plugins import GPUSetup

    class EarlierGPURun(WorkerPlugin):
        name = GPUSetup.name
        steps = {"device": 0.5, "pinned slots": 9.0}

    client.register_plugin(EarlierGPURun())
    try:
        report = pipeline.run(stores["a"], str(tmp_path / "out.zarr"), op="inv", backend="cpu",
                              client=client, progress=False)
    finally:
        client.unregister_worker_plugin(GPUSetup.name)
    assert report.status == "complete"
    assert set(report.warmup_steps) == {"kernels"}, report.warmup_steps
    assert sum(report.warmup_steps.values()) <= report.warmup


@pytest.mark.parametrize("locations, io_processes, pooled", [
    (("/data/in.zarr", "/data/out.zarr"), 2, True),
    (("/data/in.zarr", "/data/out.zarr"), 0, False),          # io-processes 0: I/O in the worker
    (("s3://bucket/in.zarr", "/data/out.zarr"), 2, False),    # object storage: never I/O processes
], ids=["io-processes", "none-asked", "object-storage"])
def test_the_warm_up_reserves_the_slots_the_tasks_borrow_by_their_own_io_rule(monkeypatch, locations,
                                                                               io_processes, pooled):
    """The GPU codec path reads an input routed to the host in its slots only where the worker has I/O
    processes (worker._device_batches._routed): the warm-up reserves the layout of the case the
    tasks will meet, by the tasks' own rule (_io_pool.pool_settings), and starts I/O processes only
    where the tasks will use them."""
    import dataclasses

    from batchlu.pipeline.config._settings import Options
    from batchlu.pipeline.worker import _engines, _io_pool
    from batchlu.pipeline.worker._buffers import Layout

    monkeypatch.setattr(_io_pool, "supported", lambda: True)
    started = []
    monkeypatch.setattr(_io_pool, "get_pool", lambda processes, threads: started.append(processes))
    assert (_io_pool.pool_settings(dataclasses.replace(Options(), io_processes=io_processes), "gpu", 4,
                                   locations)[0] > 0) is pooled
    f8 = np.dtype("float64")
    with_input = Layout(a=((4, 4), f8), b=None, outs=())
    without = Layout(a=((0,), f8), b=None, outs=(("info", (), np.dtype("int32")),))
    spec = _engines.WarmUp(op="inv", dtype="float64", n=4, batch=8,
                           outputs=(("inv", (4, 4), "float64"), ("info", (), "int32")),
                           settings=dataclasses.replace(Options(), io_processes=io_processes),
                           device_slots={True: (with_input, 16), False: (without, 16)}, locations=locations)
    engine = _engines.HostEngine()
    _engines.warm_up(engine, spec, reserve=4)
    reserved = {layout for layout, _, _ in engine.pool._free}
    assert reserved == {with_input if pooled else without}
    assert started == ([2] if pooled else [])
