"""How ``batchlu run``'s options map onto ``batchlu.pipeline.run``, and how errors reach the user.

``batchlu.pipeline.run`` is replaced by a recorder here: these tests check the CLI's side of the contract.
"""

from __future__ import annotations

import dask
import pytest

from batchlu import pipeline
from batchlu.pipeline.errors import BatchluError
from batchlu.workflows._run_options import CONFIG_OPTIONS


@pytest.fixture
def calls(monkeypatch):
    recorded = []

    class FakeReport:
        imports = None   # the command line sets it, then prints the report

        def __str__(self):
            return "REPORT-TEXT" if self.imports is not None else "REPORT WITHOUT ITS IMPORT TIME"

    def fake_run(input, output, **kwargs):
        recorded.append((input, output, kwargs))
        return FakeReport()

    monkeypatch.setattr(pipeline, "run", fake_run)
    return recorded


def test_every_option_reaches_pipeline_run(invoke, calls, tmp_path):
    result = invoke("run", "in.zarr", "out.zarr", "--op", "lu", "--array", "A", "--overwrite", "--force",
                    "--backend", "cpu", "--no-progress",
                    "--memory-budget", "64MiB", "--workers", 3, "--threads-per-worker", 2,
                    "--chunk", 500, "--config", "batchlu.max-tasks=100", "--config", "cluster.processes=no")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "REPORT-TEXT"
    (input, output, kwargs), = calls
    assert (input, output) == ("in.zarr:A", "out.zarr")
    assert kwargs == dict(
        op="lu", rhs=None, resume=False, overwrite=True, force=True, scheduler=None,
        scheduler_file=None, progress=False,
        config={"batchlu.backend": "cpu", "batchlu.memory-budget": 64 * 2**20, "batchlu.cluster.n-workers": 3,
                "batchlu.cluster.threads-per-worker": 2, "batchlu.chunk": 500,
                "batchlu.max-tasks": 100, "batchlu.cluster.processes": False})


def test_scheduler_file_and_resume_reach_pipeline_run(invoke, calls, tmp_path):
    sched = tmp_path / "sched.json"
    sched.write_text("{}")
    result = invoke("run", "in.zarr", "out.zarr", "--op", "inv", "--resume", "--scheduler-file", sched,
                    "--memory-budget", "64MiB")
    assert result.exit_code == 0, result.output
    (_, _, kwargs), = calls
    assert kwargs["resume"] is True and kwargs["scheduler_file"] == str(sched)
    assert kwargs["config"] == {"batchlu.memory-budget": 64 * 2**20}
    assert result.stderr == ""  # nothing ignored, nothing to warn about


def test_defaults_reach_pipeline_run(invoke, calls):
    result = invoke("run", "in.zarr:grp/arr", "out.zarr", "--op", "solve", "--rhs", "b.zarr:B",
                    "--scheduler", "tcp://127.0.0.1:8786")
    assert result.exit_code == 0, result.output
    (input, output, kwargs), = calls
    assert input == "in.zarr:grp/arr"
    assert kwargs["rhs"] == "b.zarr:B"
    assert kwargs["scheduler"] == "tcp://127.0.0.1:8786"
    assert "backend" not in kwargs and kwargs["config"] is None   # batchlu.backend: the YAML's, or the user's
    assert kwargs["resume"] is False and kwargs["overwrite"] is False
    assert kwargs["progress"] is False  # the runner's stderr is not a terminal


def test_backend_flag_is_the_settings_key_and_beats_the_config(invoke, calls):
    """--backend comes from the settings table (no default of its own): absent, the config decides;
    given, even ``auto``, it wins over a config that says otherwise."""
    from batchlu.workflows._run_options import CONFIG_OPTIONS as options

    assert [o.key for o in options if o.flag == "--backend"] == ["batchlu.backend"]
    with dask.config.set({"batchlu.backend": "cpu"}):
        assert invoke("run", "in.zarr", "out.zarr", "--op", "lu").exit_code == 0
        assert invoke("run", "in.zarr", "out.zarr", "--op", "lu", "--backend", "auto").exit_code == 0
    (_, _, first), (_, _, second) = calls
    assert first["config"] is None and second["config"] == {"batchlu.backend": "auto"}


def test_output_codec_flag_and_its_hidden_old_name_reach_pipeline_run(invoke, calls):
    """--output-compressor, the flag's name before batchlu.output-compressor became output-codec, still
    sets the old key (the settings read it, with a warning: tests/workflows/test_cli.py); --help hides it."""
    assert invoke("run", "in.zarr", "out.zarr", "--op", "lu", "--output-codec", "lz4").exit_code == 0
    assert invoke("run", "in.zarr", "out.zarr", "--op", "lu", "--output-compressor", "lz4").exit_code == 0
    (_, _, new), (_, _, old) = calls
    assert new["config"] == {"batchlu.output-codec": "lz4"}
    assert old["config"] == {"batchlu.output-compressor": "lz4"}
    shown = invoke("run", "--help").output
    assert "--output-codec" in shown and "--output-compressor" not in shown


def test_config_flags_name_keys_the_pipeline_defines():
    """A flag that sets a key no YAML default declares would be silently ignored."""
    for option in CONFIG_OPTIONS:
        dask.config.get(option.key)  # KeyError if the pipeline's YAML lacks it


def test_missing_scheduler_file_is_refused_before_anything_runs(invoke, calls, tmp_path):
    result = invoke("run", "in.zarr", "out.zarr", "--op", "lu", "--scheduler-file", tmp_path / "none.json")
    assert result.exit_code == 2
    assert "none.json" in result.stderr and "does not exist" in result.stderr
    assert not calls


def test_unknown_config_key_is_a_usage_error(invoke, calls):
    result = invoke("run", "in.zarr", "out.zarr", "--op", "lu", "--config", "memory-budjet=1GiB")
    assert result.exit_code == 2
    assert "batchlu.memory-budjet" in result.stderr and "batchlu.memory-budget" in result.stderr
    assert not calls


def test_pipeline_errors_become_one_line_messages(invoke, monkeypatch):
    def refuse(*args, **kwargs):
        raise BatchluError("Expected an array of shape (N, n, n).\nGot shape (3, 4) instead.")

    monkeypatch.setattr(pipeline, "run", refuse)
    result = invoke("run", "in.zarr", "out.zarr", "--op", "inv")
    assert result.exit_code == 1
    assert result.stderr == "Error: Expected an array of shape (N, n, n). Got shape (3, 4) instead.\n"


def test_traceback_flag_shows_the_exception(invoke, monkeypatch):
    def refuse(*args, **kwargs):
        raise BatchluError("Expected X. Got Y instead.")

    monkeypatch.setattr(pipeline, "run", refuse)
    with pytest.raises(BatchluError, match="Expected X"):
        invoke("--traceback", "run", "in.zarr", "out.zarr", "--op", "inv")


def test_a_bug_is_not_disguised_as_a_user_error(invoke, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("internal invariant violated")

    monkeypatch.setattr(pipeline, "run", broken)
    with pytest.raises(RuntimeError, match="internal invariant"):
        invoke("run", "in.zarr", "out.zarr", "--op", "inv")


def test_help_and_version(invoke):
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("generate", "run", "verify", "inspect", "demo"):
        assert command in result.output
    version = invoke("--version")
    assert version.exit_code == 0 and "batchlu" in version.output
