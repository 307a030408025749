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
