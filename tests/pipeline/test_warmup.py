"""Before the tasks (batchlu.pipeline._warmup): the backend is resolved once, in the client, and the
tasks get a concrete ``cpu`` or ``gpu``."""

from __future__ import annotations

import pytest

from batchlu import pipeline
from batchlu.pipeline import _backends, _warmup, errors


def test_resolve_backend_on_a_cpu_cluster(client):
    assert _warmup.resolve_backend(client, "cpu") == "cpu"
    if _backends.gpu_available():
        pytest.skip("this machine has a GPU: auto would resolve to gpu")
    assert _warmup.resolve_backend(client, "auto") == "cpu"
    with pytest.raises(errors.BackendError, match="Expected a CUDA GPU usable through CuPy"):
        _warmup.resolve_backend(client, "gpu")


def test_tasks_get_the_backend_resolved_in_the_client(client, stores, tmp_path, monkeypatch):
    """The workers run in this process (the session's LocalCluster), so the tasks' calls show here."""
    if _backends.gpu_available():
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
    if _backends.gpu_available():
        pytest.skip("this machine has a GPU: auto would resolve to gpu")
    asked, probed = [], []
    real_resolve, real_probe = _warmup.resolve_backend, _backends.probe
    monkeypatch.setattr(_warmup, "resolve_backend", lambda client, name: asked.append(name) or
                        real_resolve(client, name))
    monkeypatch.setattr(_backends, "probe", lambda name: probed.append(name) or real_probe(name))
    report = pipeline.run(stores["a"], str(tmp_path / "out.zarr"), op="inv", backend="auto", progress=False,
                          config={"cluster.processes": False, "cluster.n-workers": 1,
                                  "cluster.dashboard-address": "127.0.0.1:0"})
    assert report.status == "complete" and report.backends == ("cpu",) and report.backend == "auto"
    assert asked == ["cpu"] and probed == []
