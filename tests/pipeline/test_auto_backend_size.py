"""Backend ``auto`` with the embedded cluster on a machine with GPUs: a dense op whose input is at most
``_submit.CPU_AUTO_BYTES_PER_CORE`` bytes per core runs on the CPU backend (threads of this process,
no GPU cluster to start), the report saying why; a larger input, a sparse op or ``backend gpu`` keep
the GPU. The machine's GPU is stood in for by ``resolve_embedded`` answering ``gpu``: a run that
would start the GPU cluster is stopped where it would, so that this runs without one."""

from __future__ import annotations


import numpy as np
import pytest
import zarr

import batchlu
from batchlu.pipeline.client import _submit
from batchlu.pipeline.cluster import _connect, _devices
from batchlu.testing.ratios import get03


class _GPUCluster(Exception):
    """Raised where the GPU cluster would start."""


@pytest.fixture
def gpu_machine(monkeypatch):
    """``resolve_embedded`` as on a machine with a GPU; the GPU cluster's start raises :class:`_GPUCluster`."""
    real = _devices.resolve_embedded

    def resolve(backend, gpus=None):
        return "gpu" if backend in ("auto", "gpu") else real(backend, gpus)

    monkeypatch.setattr(_devices, "resolve_embedded", resolve)

    def no_cluster(*args, **kwargs):
        raise _GPUCluster()

    monkeypatch.setattr(_connect, "connect", no_cluster)


@pytest.fixture
def source(tmp_path):
    rng = np.random.default_rng()
    a = rng.standard_normal((1000, 6, 6))
    z = zarr.create_array(tmp_path / "in.zarr", shape=a.shape, dtype=a.dtype, chunks=(250, 6, 6))
    z[:] = a
    return str(tmp_path / "in.zarr"), a


def test_a_small_dense_run_on_a_gpu_machine_takes_the_cpu_and_says_why(source, tmp_path, gpu_machine):
    path, a = source
    out = tmp_path / "out.zarr"
    report = batchlu.run(path, str(out), op="inv", progress=False)
    assert report.status == "complete" and report.backend == "auto" and report.backends == ("cpu",)
    assert report.backend_note and "--backend gpu" in report.backend_note and "0.3 MB" in report.backend_note
    assert "backend auto -> cpu (0.3 MB of input" in str(report)
    inv = zarr.open_array(str(out / "inv"), mode="r")[:]
    info = zarr.open_array(str(out / "info"), mode="r")[:]
    assert np.all(info == 0)
    assert max(get03(a[i], inv[i]) for i in range(len(a))) < 30


def test_an_input_above_the_limit_keeps_the_gpu(source, tmp_path, gpu_machine, monkeypatch):
    path, a = source
    monkeypatch.setattr(_submit, "CPU_AUTO_BYTES_PER_CORE", a.nbytes // _submit.usable_cores() - 8)
    with pytest.raises(_GPUCluster):
        batchlu.run(path, str(tmp_path / "out.zarr"), op="inv", progress=False)


def test_backend_gpu_insists_on_a_small_input(source, tmp_path, gpu_machine):
    path, _ = source
    with pytest.raises(_GPUCluster):
        batchlu.run(path, str(tmp_path / "out.zarr"), op="inv", backend="gpu", progress=False)


def test_gpus_named_keep_the_gpu(source, tmp_path, gpu_machine):
    path, _ = source
    with pytest.raises(_GPUCluster):
        batchlu.run(path, str(tmp_path / "out.zarr"), op="inv", progress=False, config={"cluster.gpus": "0"})


def test_the_limit_is_per_thread_and_inclusive():
    job = type("J", (), {"symbolic": None})()
    assert _submit.cpu_pays(job, 16 * _submit.CPU_AUTO_BYTES_PER_CORE, 16)
    assert not _submit.cpu_pays(job, 16 * _submit.CPU_AUTO_BYTES_PER_CORE + 1, 16)
    assert not _submit.cpu_pays(job, 16 * _submit.CPU_AUTO_BYTES_PER_CORE, 2)


@pytest.fixture
def sixteen_cores(monkeypatch, source):
    """16 usable cores, and a limit per thread that the 1,000-matrix input passes on 2 threads only."""
    import dask.system

    monkeypatch.setattr(dask.system, "cpu_count", lambda: 16)
    monkeypatch.setattr(_submit, "CPU_AUTO_BYTES_PER_CORE", source[1].nbytes // 2)


def test_the_cores_counted_are_those_the_process_may_use(source, tmp_path, gpu_machine, sixteen_cores,
                                                         monkeypatch):
    """Under a CPU affinity or cgroup quota (Slurm, containers, taskset) dask counts fewer cores
    than the machine has: the limit follows (os.cpu_count said 16 on a 1-core allocation)."""
    import dask.system

    path, _ = source
    assert batchlu.run(path, str(tmp_path / "o16.zarr"), op="inv", progress=False).backends == ("cpu",)
    monkeypatch.setattr(dask.system, "cpu_count", lambda: 1)
    with pytest.raises(_GPUCluster):
        batchlu.run(path, str(tmp_path / "o1.zarr"), op="inv", progress=False)


def test_the_threads_configured_set_the_limit(source, tmp_path, gpu_machine, sixteen_cores):
    """One worker of one thread computes at one core's rate, whatever the machine: the limit is
    that thread's."""
    path, _ = source
    with pytest.raises(_GPUCluster):
        batchlu.run(path, str(tmp_path / "o.zarr"), op="inv", progress=False,
                    config={"cluster.n-workers": 1, "cluster.threads-per-worker": 1})


def test_a_sparse_op_keeps_the_gpu(tmp_path, gpu_machine):
    source = batchlu.generate(tmp_path / "kkt.zarr", count=8, kind="saddle", size=40, chunk=4, seed=5)
    with pytest.raises(_GPUCluster):
        batchlu.run(source, str(tmp_path / "out.zarr"), op="ldlt-solve", progress=False)


@pytest.mark.gpu
def test_on_a_gpu_machine_auto_takes_the_cpu_below_the_limit_and_the_gpu_above(source, tmp_path, monkeypatch):
    if not _devices.gpu_available():
        pytest.skip("needs a GPU with CuPy and dask-cuda")
    path, a = source
    small = batchlu.run(path, str(tmp_path / "small.zarr"), op="inv", progress=False)
    assert small.status == "complete" and small.backends == ("cpu",) and small.backend_note
    monkeypatch.setattr(_submit, "CPU_AUTO_BYTES_PER_CORE", 0)
    large = batchlu.run(path, str(tmp_path / "large.zarr"), op="inv", progress=False)
    assert large.status == "complete" and large.backends == ("gpu",) and large.backend_note is None
    for name in ("small", "large"):
        inv = zarr.open_array(str(tmp_path / f"{name}.zarr" / "inv"), mode="r")[:]
        info = zarr.open_array(str(tmp_path / f"{name}.zarr" / "info"), mode="r")[:]
        assert np.all(info == 0) and max(get03(a[i], inv[i]) for i in range(len(a))) < 30
