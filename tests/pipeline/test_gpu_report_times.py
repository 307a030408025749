"""A GPU run's report splits its time into cluster start, warm-up and compute, and the warm-up's
kernel compilation is done once per machine: a second run, on a fresh embedded GPU cluster with the
same ``CUPY_CACHE_DIR``, loads the kernels from CuPy's disk cache and warms up faster.
Run on a machine with a CUDA GPU: ``pytest -m gpu tests/pipeline/test_gpu_report_times.py``."""

from __future__ import annotations

import time

import pytest

from batchlu import pipeline
from batchlu.pipeline.cluster._devices import visible_gpus

pytestmark = pytest.mark.gpu


def test_warm_up_reuses_the_kernel_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path / "kernel_cache"))  # empty: the first run compiles
    source = pipeline.generate(tmp_path / "a.zarr", count=2000, size=48, dtype="complex128", chunk=250)
    config = {"cluster.dashboard-address": "127.0.0.1:0", "cluster.gpus": visible_gpus()[0]}
    reports = []
    for name in ("first", "second"):
        t = time.perf_counter()
        report = pipeline.run(source, str(tmp_path / f"{name}.zarr"), op="inv", backend="gpu",
                              progress=False, config=config)
        outer = time.perf_counter() - t
        assert report.status == "complete" and report.backends == ("gpu",)
        assert report.cluster_start > 0 and report.warmup > 0 and report.elapsed > 0
        assert report.cluster_start + report.warmup + report.elapsed <= report.wall <= outer
        assert "warm-up" in repr(report) and report.compute_s > 0
        reports.append(report)
    assert any((tmp_path / "kernel_cache").iterdir())
    first, second = reports
    assert second.warmup < first.warmup, (first.warmup, second.warmup)
