"""Settings: YAML defaults under dask.config's batchlu namespace, overrides, checks."""

from __future__ import annotations

import dask.config
import pytest

from batchlu import pipeline
from batchlu.pipeline import errors


def test_defaults_from_yaml():
    assert dask.config.get("batchlu.memory-budget") == "256MiB"
    opts = pipeline.options()
    assert opts.memory_budget == 256 * 2**20 and opts.backend == "auto" and opts.chunk is None
    assert opts.cluster.host == "127.0.0.1" and opts.cluster.dashboard_address.startswith("127.0.0.1")


def test_overrides_nested_dotted_dashes_underscores():
    opts = pipeline.options({"memory_budget": "1MiB", "cluster.n-workers": 3,
                             "batchlu.chunk": 16, "cluster": {"threads_per_worker": 2}})
    assert opts.memory_budget == 2**20 and opts.cluster.n_workers == 3
    assert opts.chunk == 16 and opts.cluster.threads_per_worker == 2
    assert pipeline.options().chunk is None  # overrides do not leak into the global config
    with dask.config.set({"batchlu.max-tasks": 7}):
        assert pipeline.options().max_tasks == 7
    assert pipeline.options(opts) is opts
    assert pipeline.options(opts, backend="cpu").backend == "cpu"


def test_options_are_frozen_and_json_able():
    import dataclasses
    import json

    opts = pipeline.options()
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.backend = "gpu"
    assert opts.backend == "auto"
    assert json.loads(json.dumps(opts.as_dict())) == opts.as_dict()


@pytest.mark.parametrize("bad,pattern", [
    ({"memory-budget": "lots"}, "memory-budget"),
    ({"memory-budget": 0}, "memory-budget"),
    ({"chunk": 0}, "chunk"),
    ({"chunk": 2.5}, "chunk"),
    ({"max-tasks": "many"}, "max-tasks"),
    ({"backend": "tpu"}, "backend"),
    ({"progress": "sometimes"}, "progress"),
    ({"output-compressor": "zstd:99"}, "output-compressor"),
    ({"output-compressor": "gzip"}, "output-compressor"),
    ({"connect-timeout": "soon"}, "connect-timeout"),
    ({"connect-timeout": 0}, "connect-timeout"),
    ({"task-delay": 0.1}, "task-delay"),  # test-only, not a batchlu setting (see TESTING_TASK_DELAY)
    ({"memory-budjet": "1GiB"}, "memory-budjet"),
])
def test_bad_settings(bad, pattern):
    with pytest.raises(errors.ConfigError, match=pattern) as caught:
        pipeline.options(bad)
    assert "Expected" in str(caught.value) and "Got" in str(caught.value)


def test_config_must_be_a_mapping():
    with pytest.raises(errors.ConfigError, match="mapping"):
        pipeline.options(["chunk", 3])


def test_task_delay_is_a_test_only_setting_outside_the_batchlu_namespace():
    from batchlu.pipeline._config import TESTING_TASK_DELAY, known_keys, task_delay

    assert not [key for key in known_keys() if "delay" in key]
    assert not [name for name in pipeline.options().as_dict() if "delay" in name]
    assert task_delay() == 0
    with dask.config.set({TESTING_TASK_DELAY: 0.25}):
        assert task_delay() == 0.25
    with dask.config.set({TESTING_TASK_DELAY: -1}), pytest.raises(errors.ConfigError, match="task-delay"):
        task_delay()
