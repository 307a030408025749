"""Every bad command ends in one clear line and leaves nothing behind (issue 16, "Clean errors").

After each refused command the output path does not exist (no stub that blocks the corrected
command); options ignored in a context are refused or warned about, never silently dropped.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import zarr
from test_cli import assert_user_error

from batchlu.testing import matrices

COUNT, SIZE, CHUNK = 30, 5, 10


@pytest.fixture(scope="module")
def source(invoke, tmp_path_factory):
    path = tmp_path_factory.mktemp("errors") / "a.zarr"
    result = invoke("generate", path, "--count", COUNT, "--size", SIZE, "--chunk", CHUNK, "--seed", 4)
    assert result.exit_code == 0, result.output
    return path


def _cli(*args, timeout=120, env=None, cwd=None):
    """``python -m batchlu ARGS`` as a real process (worker processes write to the real stderr)."""
    return subprocess.run([sys.executable, "-m", "batchlu", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env=env, cwd=cwd)


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), stderr
    return lines[0]


@pytest.fixture
def http_server():
    """An HTTP server on a free loopback port: it accepts connections but is no Dask scheduler."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("the HTTP server did not start")
                time.sleep(0.1)
        yield f"tcp://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------------------------------ scheduler
def test_a_port_that_is_not_a_scheduler_times_out_in_one_line(source, tmp_path, http_server,
                                                               scheduler_address):
    out = tmp_path / "o.zarr"
    started = time.monotonic()
    proc = _cli("run", source, out, "--op", "inv", "--scheduler", http_server,
                "--config", "connect-timeout=2", timeout=90)
    assert time.monotonic() - started < 60
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = _one_error_line(proc.stderr)
    assert http_server in line and "connect-timeout" in line
    assert not out.exists()
    # the plain command, pointed at a real scheduler, needs neither --resume nor --overwrite
    proc = _cli("run", source, out, "--op", "inv", "--scheduler", scheduler_address)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert zarr.open_group(out, mode="r").attrs["batchlu"]["status"] == "complete"


@pytest.mark.parametrize("text", ["garbage{", '{"address": 5}', "[1, 2]", ""],
                         ids=["not-json", "address-not-text", "not-an-object", "empty"])
def test_a_garbage_scheduler_file_is_one_line(invoke, source, tmp_path, text):
    sched = tmp_path / "sched.json"
    sched.write_text(text)
    out = tmp_path / "o.zarr"
    assert_user_error(invoke("run", source, out, "--op", "inv", "--scheduler-file", sched), "sched.json",
                      "scheduler file")
    assert not out.exists()


# ------------------------------------------------------------------------------- options checked first
@pytest.mark.parametrize("extra, words", [
    (["--output-codec", "zstd:99"], ["output-codec", "zstd:99"]),
    (["--output-codec", "gzip"], ["output-codec", "gzip"]),
    (["--output-compressor", "gzip"], ["output-compressor", "gzip"]),   # the old flag: named as given
    (["--output-codec", "lz4", "--output-compressor", "none"], ["output-codec", "output-compressor", "lz4", "none"]),
    (["--config", "output-codec=lz4", "--config", "output-compressor=none"], ["output-codec", "output-compressor"]),
    (["--config", "connect-timeout=-1"], ["connect-timeout"]),
    (["--config", "max-tasks=0"], ["max-tasks"]),
], ids=["zstd-level", "codec", "old-codec-flag", "codec-and-old-flag-disagree", "codec-and-old-key-disagree",
        "timeout", "max-tasks"])
def test_bad_options_leave_no_stub(invoke, source, tmp_path, scheduler_address, extra, words):
    out = tmp_path / "o.zarr"
    assert_user_error(invoke("run", source, out, "--op", "lu", "--scheduler", scheduler_address, *extra),
                      *words)
    assert not out.exists()


def test_a_log_file_in_a_missing_folder_is_refused_before_anything_starts(invoke, source, tmp_path):
    out, log = tmp_path / "o.zarr", tmp_path / "nowhere" / "w.log"
    assert_user_error(invoke("run", source, out, "--op", "lu", "--config", f"cluster.log-file={log}"),
                      "log-file", str(log.parent))
    assert not out.exists() and not log.parent.exists()


def test_report_into_a_missing_folder_is_refused_before_the_run(invoke, source, tmp_path, scheduler_address):
    out, report = tmp_path / "o.zarr", tmp_path / "missing" / "run.html"
    assert_user_error(invoke("run", source, out, "--op", "inv", "--scheduler", scheduler_address,
                             "--report", report), str(report.parent))
    assert not out.exists() and not report.parent.exists()


def test_report_says_where_it_went(invoke, source, tmp_path, scheduler_address, monkeypatch):
    pytest.importorskip("bokeh")
    monkeypatch.chdir(tmp_path)
    result = invoke("run", source, "o.zarr", "--op", "inv", "--scheduler", scheduler_address,
                    "--report", "run.html")
    assert result.exit_code == 0, result.output
    where = tmp_path / "run.html"
    assert f"Performance report: {where}" in result.stdout
    assert where.stat().st_size > 0


# -------------------------------------------------------------------------------------- corrupt input
def test_a_corrupt_chunk_ends_in_one_line_and_the_worker_log_has_the_rest(tmp_path):
    a = tmp_path / "a.zarr"
    assert _cli("generate", a, "-N", 40, "-n", 4, "--chunk", 10).returncode == 0
    bad = a / "c" / "2" / "0" / "0"
    assert bad.is_file()
    bad.write_bytes(b"not a zstd frame")
    out, log = tmp_path / "o.zarr", tmp_path / "workers.log"
    proc = _cli("run", a, out, "--op", "inv", "--backend", "cpu", "--workers", 1, "--threads-per-worker", 1,
                "--config", "cluster.dashboard-address=127.0.0.1:0", "--config", f"cluster.log-file={log}")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = _one_error_line(proc.stderr)
    assert str(bad) in line and "matrices 20:30" in line and str(log) in line
    text = log.read_text()
    # generate's chunks carry zarr's crc32c: the checksum fails before zstd sees the frame
    assert "Traceback" in text and "checksum do not match" in text and "chunks 2:3" in text, text


_LOGS_WHILE_CLOSING = """
import logging, sys
from distributed.diagnostics.plugin import WorkerPlugin
from batchlu.pipeline.config._settings import options
from batchlu.pipeline.cluster import _connect

class LogsWhileClosing(WorkerPlugin):
    # torn down after batchlu's WorkerLog (registered later): stands for what a closing worker
    # logs once its plugins are gone (a heartbeat to a scheduler already closed)
    name = "logs-while-closing"

    def teardown(self, worker):
        logging.getLogger("distributed.worker").error("logged while the worker closes")

if __name__ == "__main__":
    settings = options({"cluster.n-workers": 1, "cluster.threads-per-worker": 1,
                        "cluster.dashboard-address": "127.0.0.1:0", "cluster.log-file": sys.argv[1]})
    with _connect.connect(settings) as client:
        client.register_plugin(LogsWhileClosing())
"""


def test_what_a_closing_worker_logs_goes_to_the_log_file(tmp_path):
    """A worker tears its plugins down before it stops its heartbeat and its connections: the
    WorkerLog plugin keeps the run's log file until the worker process ends (it gave stderr back,
    and a heartbeat failing while the cluster closed printed 31 lines and 2 tracebacks)."""
    log = tmp_path / "workers.log"
    script = tmp_path / "closing.py"
    script.write_text(_LOGS_WHILE_CLOSING)
    proc = subprocess.run([sys.executable, str(script), str(log)], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "logged while the worker closes" not in proc.stderr, proc.stderr
    assert "logged while the worker closes" in log.read_text()


def test_a_missing_chunk_ends_in_one_line_however_the_cluster_closes(tmp_path):
    """The run stops at a missing chunk while the other workers still run their tasks (the
    test-only task delay) and send heartbeats: each time, stderr is the one error line."""
    a = tmp_path / "a.zarr"
    assert _cli("generate", a, "-N", 40, "-n", 4, "--chunk", 5).returncode == 0
    (a / "c" / "0" / "0" / "0").unlink()
    env = dict(os.environ, DASK_BATCHLU_TESTING__TASK_DELAY="0.5")
    for attempt in range(3):
        out = tmp_path / f"o{attempt}.zarr"
        proc = _cli("run", a, out, "--op", "inv", "--backend", "cpu", "--workers", 2, "--threads-per-worker", 1,
                    "--config", "cluster.dashboard-address=127.0.0.1:0", "--config",
                    f"cluster.log-file={tmp_path / 'workers.log'}", env=env)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "matrices 0:5" in _one_error_line(proc.stderr)


# ---------------------------------------------------------------------------------------- full device
def _full_device_under(monkeypatch, root):
    """Every chunk zarr writes under ``root`` fails as on a full disk (its metadata is still written):
    ``write()`` raises ENOSPC, an OSError that names no file."""
    import errno
    import os as _os

    from zarr.storage import _local

    real = _local._put

    def put(path, value, exclusive=False):
        if str(path).startswith(str(root)) and path.name != "zarr.json":
            raise OSError(errno.ENOSPC, _os.strerror(errno.ENOSPC))
        return real(path, value, exclusive=exclusive)

    monkeypatch.setattr(_local, "_put", put)


def test_a_full_device_during_a_run_names_the_output(invoke, source, tmp_path, monkeypatch):
    out = tmp_path / "o.zarr"
    run = ("run", source, out, "--op", "inv", "--backend", "cpu", "--workers", 1, "--threads-per-worker", 1,
           "--config", "cluster.processes=false", "--config", "cluster.dashboard-address=127.0.0.1:0")
    with monkeypatch.context() as patched:   # the in-process workers write through this process's zarr
        _full_device_under(patched, out)
        assert_user_error(invoke(*run), str(out), "No space left on device", "--resume")
    assert not (tmp_path / "o.zarr.lock").exists()
    resumed = invoke(*run, "--resume")
    assert resumed.exit_code == 0 and "complete" in resumed.stdout, resumed.output
    checked = invoke("verify", source, out)
    assert checked.exit_code == 0 and "OK" in checked.stdout, checked.output


def test_a_full_device_during_generate_names_the_store(invoke, tmp_path, monkeypatch):
    out = tmp_path / "a.zarr"
    with monkeypatch.context() as patched:
        _full_device_under(patched, out)
        assert_user_error(invoke("generate", out, "-N", 8, "-n", 3, "--chunk", 4), str(out),
                          "No space left on device", "--overwrite")
    again = invoke("generate", out, "-N", 8, "-n", 3, "--chunk", 4, "--overwrite")
    assert again.exit_code == 0, again.output
    np.testing.assert_array_equal(zarr.open_array(out, mode="r")[...], matrices.generate("random", 3, "float64",
                                                                                          seed=0, stop=8))


# ------------------------------------------------------------------------------------------ overwrite
def test_overwrite_of_a_store_batchlu_did_not_write_needs_force(invoke, source, tmp_path, scheduler_address):
    out = tmp_path / "mine.zarr"
    theirs = np.arange(12.0).reshape(3, 4)
    zarr.create_array(out, shape=theirs.shape, dtype=theirs.dtype)[...] = theirs
    run = ("run", source, out, "--op", "inv", "--scheduler", scheduler_address)
    assert_user_error(invoke(*run, "--overwrite"), "--force", "did not write")
    np.testing.assert_array_equal(zarr.open_array(out, mode="r")[...], theirs)  # untouched
    assert_user_error(invoke(*run, "--force"), "--force only goes with --overwrite", code=2)
    forced = invoke(*run, "--overwrite", "--force")
    assert forced.exit_code == 0, forced.output
    assert zarr.open_group(out, mode="r")["inv"].shape == (COUNT, SIZE, SIZE)
    again = invoke(*run, "--overwrite")  # now a batchlu output: --overwrite alone replaces it
    assert again.exit_code == 0, again.output


def test_generate_overwrite_of_a_foreign_store_needs_force(invoke, tmp_path):
    out = tmp_path / "mine.zarr"
    zarr.create_array(out, shape=(4,), dtype="float64")[...] = np.arange(4.0)
    assert_user_error(invoke("generate", out, "-N", 5, "-n", 3, "--overwrite"), "--force")
    np.testing.assert_array_equal(zarr.open_array(out, mode="r")[...], np.arange(4.0))
    result = invoke("generate", out, "-N", 5, "-n", 3, "--overwrite", "--force", "--seed", 2)
    assert result.exit_code == 0, result.output
    np.testing.assert_array_equal(zarr.open_array(out, mode="r")[...],
                                  matrices.generate("random", 3, "float64", seed=2, stop=5))


# ----------------------------------------------------------------------------------------- generate
def test_generate_refuses_rhs_out_equal_to_out(invoke, tmp_path):
    out = tmp_path / "a.zarr"
    assert_user_error(invoke("generate", out, "-N", 4, "-n", 3, "--rhs-out", out), "--rhs-out", code=2)
    assert not out.exists()
    assert invoke("generate", out, "-N", 4, "-n", 3).exit_code == 0
    # with --overwrite too: it would have replaced the matrices with the right-hand sides
    assert_user_error(invoke("generate", out, "-N", 4, "-n", 3, "--rhs-out", tmp_path / "." / "a.zarr",
                             "--overwrite"), "--rhs-out", code=2)
    assert zarr.open_array(out, mode="r").shape == (4, 3, 3)


@pytest.mark.parametrize("args, words", [
    (["--count", 10**12, "--size", 64], ["room", "1,000,000,000,000 x 64 x 64"]),
    (["--count", 1, "--size", 10**7], ["room", "10000000 x 10000000"]),
], ids=["count", "size"])
def test_generate_refuses_sizes_that_do_not_fit(invoke, tmp_path, args, words):
    out = tmp_path / "a.zarr"
    assert_user_error(invoke("generate", out, *args), *words)
    assert not out.exists()


# --------------------------------------------------------------------------------- ignored options
@pytest.mark.parametrize("extra, flag", [
    (["--workers", 2], "--workers"),
    (["--threads-per-worker", 2], "--threads-per-worker"),
    (["--gpus", "0"], "--gpus"),
    (["--config", "cluster.n-workers=2"], "--config cluster.n-workers"),
], ids=["workers", "threads", "gpus", "config-key"])
@pytest.mark.parametrize("where", ["--scheduler", "--scheduler-file"])
def test_embedded_cluster_options_with_a_scheduler_are_refused(invoke, tmp_path, extra, flag, where):
    sched = tmp_path / "sched.json"
    sched.write_text('{"address": "tcp://127.0.0.1:1"}')
    target = "tcp://127.0.0.1:1" if where == "--scheduler" else sched
    out = tmp_path / "o.zarr"
    line = assert_user_error(invoke("run", "in.zarr", out, "--op", "lu", where, target, *extra), flag, where,
                             code=2)
    assert "embedded" in line
    assert not out.exists()


def test_chunk_and_codec_with_resume_are_warned_about(invoke, source, tmp_path, scheduler_address):
    out = tmp_path / "o.zarr"
    run = ("run", source, out, "--op", "lu", "--scheduler", scheduler_address)
    assert invoke(*run, "--chunk", 5).exit_code == 0
    resumed = invoke(*run, "--resume", "--chunk", 7, "--output-codec", "none")
    assert resumed.exit_code == 0, resumed.output
    warnings = [line for line in resumed.stderr.splitlines() if line.startswith("Warning: ")]
    assert len(warnings) == 2, resumed.stderr
    assert "--chunk" in warnings[0] and "--resume" in warnings[0]
    assert "--output-codec" in warnings[1] and "--resume" in warnings[1]
    assert zarr.open_group(out, mode="r")["lu"].chunks[0] == 5  # kept, as the warning says
    quiet = invoke(*run, "--resume")
    assert quiet.exit_code == 0 and "Warning" not in quiet.stderr
    old_flag = invoke(*run, "--resume", "--output-compressor", "lz4")   # the codec flag's old name
    assert old_flag.exit_code == 0, old_flag.output
    warnings = [line for line in old_flag.stderr.splitlines() if line.strip()]
    assert len(warnings) == 2 and all(line.startswith("Warning: ") for line in warnings), old_flag.stderr
    assert "--output-compressor is ignored with --resume" in warnings[0]
    assert "--output-compressor) is deprecated: use batchlu.output-codec (--output-codec)" in warnings[1]
    assert zarr.open_group(out, mode="r").attrs["batchlu"]["settings"]["output_codec"] == "auto"  # kept


def test_verify_rhs_for_an_output_that_is_not_solve_is_refused(invoke, source, tmp_path, scheduler_address):
    out, rhs = tmp_path / "inv.zarr", tmp_path / "b.zarr"
    assert invoke("generate", rhs, "-N", COUNT, "-n", SIZE).exit_code == 0
    assert invoke("run", source, out, "--op", "inv", "--scheduler", scheduler_address).exit_code == 0
    assert_user_error(invoke("verify", source, out, "--rhs", rhs), "--rhs", "inv", code=2)
    assert invoke("verify", source, out).exit_code == 0


def test_config_overrides_in_python_refuse_unknown_keys(tmp_path, source):
    from batchlu import pipeline
    from batchlu.pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="memory-budjet"):
        pipeline.run(str(source), str(tmp_path / "o.zarr"), op="inv", config={"memory-budjet": "1GiB"})
    assert not (tmp_path / "o.zarr").exists()

