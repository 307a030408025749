"""Settings: YAML defaults under dask.config's batchlu namespace, overrides, checks."""

from __future__ import annotations

import dask.config
import pytest

from batchlu import pipeline
from batchlu.pipeline import _config, errors


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
    ({"output-codec": "zstd:99"}, "output-codec"),
    ({"output-codec": "gzip"}, "output-codec"),
    ({"output-compressor": "gzip"}, "output-compressor"),   # the old name: its own value, its own name
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


# ------------------------------------------------------------------------------ the table of settings
def _leaf_keys(mapping, prefix=""):
    keys = []
    for name, value in mapping.items():
        keys += _leaf_keys(value, f"{prefix}{name}.") if isinstance(value, dict) else [f"{prefix}{name}"]
    return keys


def _shipped():
    import pathlib

    import yaml

    return yaml.safe_load(pathlib.Path(_config.__file__).with_name("batchlu.yaml").read_text())["batchlu"]


def _leaf_fields(cls, prefix=""):
    import dataclasses

    fields = []
    for f in dataclasses.fields(cls):
        if f.name == "cluster":
            fields += _leaf_fields(pipeline.ClusterOptions, f"{prefix}{f.name}.")
        else:
            fields.append(prefix + f.name)
    return fields


def test_every_shipped_key_is_one_row_and_every_field_one_key():
    keys = [row.key for row in _config.SETTINGS]
    fields = [row.field for row in _config.SETTINGS]
    assert len(keys) == len(set(keys)) and len(fields) == len(set(fields))
    assert sorted(keys) == sorted(_leaf_keys(_shipped()))
    assert sorted(fields) == sorted(_leaf_fields(pipeline.Options))
    assert len(keys) > 20


def test_options_of_no_override_hold_the_yaml_values():
    shipped = _shipped()
    built = pipeline.options({})
    assert built == pipeline.Options() == pipeline.options()
    for row in _config.SETTINGS:
        value = shipped
        for part in row.key.split("."):
            value = value[part]
        held = built
        for part in row.field.split("."):
            held = getattr(held, part)
        assert held == row.parse(value, row.key) == row.default, row.key
        assert row.parse(held, row.key) == held, f"{row.key}: parsing a parsed value changes it"


def test_no_default_is_written_in_python():
    """Every field of Options and ClusterOptions is declared with setting(key, parser, ...): its
    default can only come from batchlu.yaml."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(_config))
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    for name in ("Options", "ClusterOptions"):
        fields = [node for node in classes[name].body if isinstance(node, ast.AnnAssign)
                  and "InitVar" not in ast.unparse(node.annotation)]   # an old name, not a setting
        assert fields
        for node in fields:
            target, value = node.target.id, node.value
            if target == "cluster":
                assert ast.unparse(value) == "dataclasses.field(default_factory=ClusterOptions)"
                continue
            assert isinstance(value, ast.Call) and getattr(value.func, "id", "") == "setting", \
                f"{name}.{target}: declare it with setting(key, parser, ...), not {ast.unparse(value)}"
            assert isinstance(value.args[0], ast.Constant), f"{name}.{target}: the key is a literal"
            assert not any(k.arg in ("default", "default_factory") for k in value.keywords)


def test_options_built_directly_are_checked_too():
    assert pipeline.Options(memory_budget="64MiB").memory_budget == 64 * 2**20
    assert pipeline.Options(backend="CPU").backend == "cpu"
    assert pipeline.ClusterOptions(gpus=[0, 1]).gpus == "0,1"
    with pytest.raises(errors.ConfigError, match="batchlu.backend"):
        pipeline.Options(backend="tpu")
    with pytest.raises(errors.ConfigError, match="batchlu.cluster.n-workers"):
        pipeline.ClusterOptions(n_workers=0)
    with pytest.raises(errors.ConfigError, match="cluster"):
        pipeline.Options(cluster={"n-workers": 2})
    with pytest.raises(errors.ConfigError, match="batchlu.verify.threshold"):
        pipeline.options({"verify.threshold": "high"})


def test_a_setting_must_ship_a_default():
    with pytest.raises(errors.ConfigError, match="batchlu.yaml to ship a default for batchlu.made-up"):
        _config.setting("made-up", _config.Boolean())
