"""``batchlu.cluster.processes``: the embedded CPU cluster's workers are threads of the client process
for inputs up to ``_submit.THREADS_UP_TO`` bytes and processes above (``auto``, the default), or what
the setting says. The cluster made is recorded, and started as threads either way (the test's speed)."""

from __future__ import annotations

import dataclasses

import pytest

import batchlu
from batchlu.errors import ConfigError
from batchlu.pipeline.client import _submit
from batchlu.pipeline.cluster import _connect
from batchlu.pipeline.config._parsers import AutoBoolean


@pytest.fixture
def made(monkeypatch):
    seen: list = []
    real = _connect._local_cluster

    def record(options, security=None):
        seen.append(options.cluster.processes)
        threads = dataclasses.replace(options.cluster, processes=False, n_workers=1, threads_per_worker=2)
        return real(options.replace(cluster=threads), security)

    monkeypatch.setattr(_connect, "_local_cluster", record)
    return seen


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return batchlu.generate(tmp_path_factory.mktemp("src") / "a.zarr", count=64, size=5, seed=3)


def _run(source, out, **config):
    config = {"cluster.dashboard-address": "127.0.0.1:0", **config}
    return batchlu.run(source, out, op="inv", backend="cpu", config=config)


def test_auto_gives_threads_up_to_the_limit_and_processes_above(source, tmp_path, made, monkeypatch):
    assert _submit.THREADS_UP_TO == 1 << 30
    _run(source, tmp_path / "small.zarr")
    monkeypatch.setattr(_submit, "THREADS_UP_TO", 64 * 5 * 5 * 8 - 1)   # one byte less than the input
    _run(source, tmp_path / "large.zarr")
    monkeypatch.setattr(_submit, "THREADS_UP_TO", 64 * 5 * 5 * 8)       # exactly the input
    _run(source, tmp_path / "equal.zarr")
    assert made == [False, True, False]


@pytest.mark.parametrize("setting, expected", [(True, True), ("false", False), ("auto", False)])
def test_the_setting_wins_over_the_size(source, tmp_path, made, monkeypatch, setting, expected):
    monkeypatch.setattr(_submit, "THREADS_UP_TO", 0 if setting != "auto" else 1 << 40)
    _run(source, tmp_path / "out.zarr", **{"cluster.processes": setting})
    assert made == [expected]


@pytest.mark.parametrize("value, parsed", [("auto", None), (None, None), ("yes", True), (False, False), ("0", False)])
def test_auto_boolean(value, parsed):
    assert AutoBoolean()(value, "cluster.processes") is parsed


def test_auto_boolean_refuses_other_values():
    with pytest.raises(ConfigError, match=r"^Expected batchlu.cluster.processes to be auto, true or false. Got 'maybe' instead.$"):
        AutoBoolean()("maybe", "cluster.processes")


@pytest.mark.parametrize("setting, backend, processes, report, expected", [
    ("auto", "cpu", False, None, None),                           # threads of this process: no bokeh
    ("auto", "cpu", False, "report.html", _connect.DASHBOARD),    # a performance report gets one
    ("auto", "cpu", True, None, _connect.DASHBOARD),              # worker processes
    ("auto", "gpu", False, None, _connect.DASHBOARD),             # the GPU cluster: processes always
    ("none", "cpu", True, None, None),
    ("None", "gpu", False, "report.html", None),
    ("127.0.0.1:0", "cpu", False, None, "127.0.0.1:0"),
])
def test_dashboard_address(tmp_path, setting, backend, processes, report, expected):
    config = {"cluster.dashboard-address": setting, "cluster.processes": processes, "backend": backend}
    if report:
        config["performance-report"] = str(tmp_path / report)
    assert _connect.dashboard_address(batchlu.pipeline.options(config)) == expected


def test_the_default_threads_cluster_serves_no_dashboard_and_shows_no_link(tmp_path, capsys):
    """No bokeh server on the default threads cluster, and no link to distributed's health routes in
    its place; an address given gets a dashboard and its link."""
    import urllib.request

    source = batchlu.generate(tmp_path / "a.zarr", count=40, size=4, seed=5)
    for setting, has in [("auto", False), ("127.0.0.1:0", True)]:
        options = batchlu.pipeline.options({"cluster.processes": False, "cluster.n-workers": 1,
                                            "cluster.dashboard-address": setting,
                                            "cluster.log-file": str(tmp_path / "run.log")})
        with _connect._embedded(options, None) as client:
            status = urllib.request.urlopen(client.dashboard_link, timeout=10).status if has else None
            assert _connect.dashboard_address(options) is None or status == 200
            if not has:   # the health route answers, the dashboard's pages do not
                with pytest.raises(OSError):
                    urllib.request.urlopen(client.dashboard_link, timeout=10)
        batchlu.run(source, tmp_path / f"out-{has}.zarr", op="inv", backend="cpu", progress=True,
                    config={"cluster.dashboard-address": setting, "cluster.processes": False})
        assert ("dashboard http" in capsys.readouterr().err) == has
