"""Settings: YAML defaults under dask.config's batchlu namespace, overrides, checks."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import dask.config
import pytest

from batchlu import pipeline
from batchlu.pipeline import errors
from batchlu.pipeline.config import _parsers, _settings


def test_defaults_from_yaml():
    assert dask.config.get("batchlu.memory-budget") == "256MiB"
    opts = pipeline.options()
    assert opts.memory_budget == 256 * 2**20 and opts.backend == "auto" and opts.chunk is None
    assert opts.cluster.host == "127.0.0.1" and opts.cluster.dashboard_address == "auto"


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
    from batchlu.pipeline.config._settings import TESTING_TASK_DELAY, known_keys, task_delay

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

    return yaml.safe_load(pathlib.Path(_settings.__file__).with_name("batchlu.yaml").read_text())["batchlu"]


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
    keys = [row.key for row in _settings.SETTINGS]
    fields = [row.field for row in _settings.SETTINGS]
    assert len(keys) == len(set(keys)) and len(fields) == len(set(fields))
    assert sorted(keys) == sorted(_leaf_keys(_shipped()))
    assert sorted(fields) == sorted(_leaf_fields(pipeline.Options))
    assert len(keys) > 20


def test_options_of_no_override_hold_the_yaml_values():
    shipped = _shipped()
    built = pipeline.options({})
    assert built == pipeline.Options() == pipeline.options()
    for row in _settings.SETTINGS:
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

    tree = ast.parse(inspect.getsource(_settings))
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
        _settings.setting("made-up", _parsers.Boolean())


# ------------------------------------------ a renamed setting: output-codec, formerly output-compressor
def _deprecations(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, errors.BatchluWarning)]


def _under_global(config: dict):
    """``pipeline.options()`` while ``config`` is set in the global dask.config (as a YAML file would)."""
    with dask.config.set(config):
        return pipeline.options()


def test_output_codec_is_the_setting_and_says_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error", errors.BatchluWarning)
        assert pipeline.options({"output-codec": "LZ4"}).output_codec == "lz4"
        assert pipeline.options({"batchlu": {"output_codec": "none"}}).output_codec == "none"
        assert pipeline.options(output_codec="zstd:3").output_codec == "zstd:3"
        assert pipeline.Options(output_codec="lz4").replace(output_codec="none").output_codec == "none"
        assert _under_global({"batchlu.output-codec": "lz4"}).output_codec == "lz4"
        settings = pipeline.options().as_dict()
    assert settings["output_codec"] == "auto" and "output_compressor" not in settings


OLD_NAME = {  # every way a caller may still say output-compressor; each asks for lz4
    "mapping": lambda: pipeline.options({"output-compressor": "lz4"}),
    "mapping-underscores": lambda: pipeline.options({"batchlu.output_compressor": "LZ4"}),
    "nested-mapping": lambda: pipeline.options({"batchlu": {"output-compressor": "lz4"}}),
    "keyword": lambda: pipeline.options(output_compressor="lz4"),
    "Options": lambda: pipeline.Options(output_compressor="lz4"),
    "replace": lambda: pipeline.Options().replace(output_compressor="lz4"),
    "dask.config": lambda: _under_global({"batchlu.output-compressor": "lz4"}),
    "same-value-twice": lambda: pipeline.options({"output-codec": "lz4", "output_compressor": "LZ4"}),
}


@pytest.mark.parametrize("build", OLD_NAME.values(), ids=OLD_NAME)
def test_the_old_name_output_compressor_still_works_with_one_warning(build):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opts = build()
    assert opts.output_codec == "lz4" and opts == pipeline.Options(output_codec="lz4")
    assert "output_compressor" not in opts.as_dict()
    said = _deprecations(caught)
    assert len(said) == 1, said
    assert said[0].startswith("batchlu.output-compressor (--output-compressor) is deprecated: use "
                              "batchlu.output-codec (--output-codec)"), said[0]


@pytest.mark.parametrize("where", ["yaml", "environment"])
def test_the_old_name_in_a_yaml_file_or_the_environment_still_works(tmp_path, where):
    env = dict(os.environ)
    if where == "yaml":
        (tmp_path / "mine.yaml").write_text("batchlu:\n  output-compressor: lz4\n")
        env["DASK_CONFIG"] = str(tmp_path)
    else:
        env["DASK_BATCHLU__OUTPUT_COMPRESSOR"] = "lz4"
    code = "from batchlu import pipeline; print(pipeline.options().output_codec)"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["lz4"]
    assert "BatchluWarning: batchlu.output-compressor (--output-compressor) is deprecated" in proc.stderr


CONFLICT = {  # output-codec lz4 and output-compressor none, given together
    "mapping": lambda: pipeline.options({"output-codec": "lz4", "output-compressor": "none"}),
    "keywords": lambda: pipeline.options(output_codec="lz4", output_compressor="none"),
    "Options": lambda: pipeline.Options(output_codec="lz4", output_compressor="none"),
    "replace": lambda: pipeline.Options().replace(output_codec="lz4", output_compressor="none"),
    "dask.config": lambda: _under_global({"batchlu.output-codec": "lz4", "batchlu.output-compressor": "none"}),
}


@pytest.mark.parametrize("build", CONFLICT.values(), ids=CONFLICT)
def test_both_names_with_different_values_are_one_error(build):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(errors.ConfigError) as raised:
            build()
    message = str(raised.value)
    assert "\n" not in message and message.startswith("Expected one value for batchlu.output-codec"), message
    assert "Got output-codec 'lz4' and output-compressor 'none' instead" in message, message
    assert not _deprecations(caught)   # the error alone: one line


def test_the_runs_own_value_wins_over_an_old_name_in_the_global_config():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with dask.config.set({"batchlu.output-compressor": "none"}):
            assert pipeline.options({"output-codec": "lz4"}).output_codec == "lz4"
            assert pipeline.options(output_codec="lz4").output_codec == "lz4"
        with dask.config.set({"batchlu.output-codec": "lz4"}):
            assert pipeline.options({"output-compressor": "none"}).output_codec == "none"
    said = _deprecations(caught)
    assert len(said) == 3 and all("batchlu.output-compressor" in line for line in said), said
    with pytest.raises(errors.ConfigError, match="output-compressor") as raised:   # its value still checked
        pipeline.options({"output-compressor": "gzip"})
    assert "output-codec" not in str(raised.value)
