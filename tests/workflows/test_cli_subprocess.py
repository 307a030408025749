"""``batchlu`` as a real process: the README's first command, and the installed console script."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from batchlu.testing.ratios import get03

ROOT = Path(__file__).resolve().parents[2]


def _env():
    env = dict(os.environ)
    return env


def test_demo_runs_end_to_end_in_well_under_a_minute(tmp_path):
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "batchlu", "demo"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "3/3 verify" in proc.stdout
    assert "dashboard" not in proc.stdout   # its cluster has stopped: no link to it
    assert elapsed < 60, f"batchlu demo took {elapsed:.0f} s"
    assert not list(tmp_path.iterdir())  # the temporary stores were not left in the working folder


def test_console_script_reports_errors_in_one_line(tmp_path):
    script = Path(sys.executable).with_name("batchlu")
    if not script.exists():
        pytest.skip(f"batchlu is not installed beside {sys.executable} (pip install -e . installs it)")
    proc = subprocess.run([str(script), "inspect", str(tmp_path / "absent.zarr")], env=_env(),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1
    assert proc.stderr.startswith("Error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "absent.zarr" in proc.stderr


def test_a_truncated_chunk_is_one_line_for_verify_and_inspect(invoke, scheduler_address, tmp_path):
    """An output of 100 chunks whose first inv chunk is truncated: verify's stderr is the one error
    line. When zarr's read of the block failed, the reads of the other chunks were still pending in
    its event loop; the process ended with them, and Python printed "Task was destroyed but it is
    pending!" (and "cannot schedule new futures after interpreter shutdown") for each: 300-500 more
    lines. inspect of a truncated info chunk: one line naming it (it was a traceback), nothing on
    stderr."""
    a, out = tmp_path / "a.zarr", tmp_path / "inv.zarr"
    assert invoke("generate", a, "-N", 1000, "-n", 8, "--chunk", 10, "--seed", 4).exit_code == 0
    run = invoke("run", a, out, "--op", "inv", "--scheduler", scheduler_address, "--config", "chunk=10")
    assert run.exit_code == 0, run.output
    chunks = sorted((out / "inv" / "c").iterdir(), key=lambda p: int(p.name))
    assert len(chunks) == 100
    victim = chunks[0] / "0" / "0"
    victim.write_bytes(victim.read_bytes()[:7])

    def batchlu(*args):
        return subprocess.run([sys.executable, "-m", "batchlu", *map(str, args)], env=_env(),
                              capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)

    proc = batchlu("verify", a, out)
    assert proc.returncode == 1
    assert proc.stderr.startswith("Error: ") and proc.stderr.count("\n") == 1, proc.stderr[:2000]
    assert f"unreadable chunk file {victim} " in proc.stderr
    info = out / "info" / "c" / "0"
    info.write_bytes(info.read_bytes()[:3])
    proc = batchlu("inspect", out)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[:2000]
    lines = [line for line in proc.stdout.splitlines() if "unreadable" in line]
    assert len(lines) == 1 and lines[0].startswith("  info: Expected readable chunks"), proc.stdout
    assert f"unreadable chunk file {info} (matrices 0:10)" in lines[0]


def test_a_busy_dashboard_port_says_nothing(tmp_path):
    """Two runs at once: the second one's dashboard port is taken. distributed moves the dashboard
    to a free port, and its 4-line UserWarning about it is not shown."""
    a = tmp_path / "a.zarr"
    assert subprocess.run([sys.executable, "-m", "batchlu", "generate", str(a), "-N", "8", "-n", "3"], env=_env(),
                          capture_output=True, timeout=120).returncode == 0
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "batchlu", "run", str(a), str(tmp_path / "o.zarr"), "--op", "inv",
                               "--backend", "cpu", "--workers", "1", "--threads-per-worker", "1",
                               "--config", f"cluster.dashboard-address=127.0.0.1:{port}"],
                              env=_env(), capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == "", proc.stderr
    assert "complete, 8 matrices" in proc.stdout


TIME_PART = re.compile(r"(import|plan|cluster start|warm-up|compute|finish|total) (\d+\.\d\d) s")


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_a_small_run_names_where_every_second_went(tmp_path, workers):
    """The fixed-cost path (issue 43): a 1,000-matrix ``batchlu run`` from the console script, timed
    by this process from the start of the command to its exit. Its report's time line names six
    parts (import, plan, cluster start, warm-up, compute, finish) that add up to its total, and that
    total is the command's whole time: what it leaves unnamed, the exit included, is under 0.25 s.
    With worker processes too (the interpreter's teardown after them took 0.8 s), and with nothing
    on stderr (multiprocessing's resource tracker reports semaphores left registered there)."""
    script = Path(sys.executable).with_name("batchlu")
    if not script.exists():
        pytest.skip(f"batchlu is not installed beside {sys.executable} (pip install -e . installs it)")
    source = tmp_path / "in.zarr"
    rng = np.random.default_rng(20261206)
    array = zarr.create_array(str(source), shape=(1000, 32, 32), chunks=(250, 32, 32), dtype="float64")
    array[...] = rng.standard_normal((1000, 32, 32))
    start = time.monotonic()
    extra = ["--config", "cluster.processes=true"] if workers == "processes" else []
    proc = subprocess.run([str(script), "run", str(source), str(tmp_path / "out.zarr"), "--op", "inv", *extra],
                          env=_env(), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    whole = time.monotonic() - start
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    line = next(text for text in proc.stdout.splitlines() if text.strip().startswith("time:"))
    parts = dict((name, float(value)) for name, value in TIME_PART.findall(line))
    assert list(parts) == ["import", "plan", "cluster start", "warm-up", "compute", "finish", "total"], line
    total = parts.pop("total")
    assert all(value >= 0 for value in parts.values()) and parts["import"] > 0 and parts["compute"] > 0, line
    assert sum(parts.values()) == pytest.approx(total, abs=0.035), line   # each part rounded to 0.01 s
    assert total <= whole + 0.02 and whole - total < 0.25, f"{line}; the command took {whole:.2f} s"
    inverse = zarr.open_array(str(tmp_path / "out.zarr"), path="inv", mode="r")[...]
    info = zarr.open_array(str(tmp_path / "out.zarr"), path="info", mode="r")[...]
    assert (info == 0).all() and (get03(array[...], inverse) < 30).all()   # every inverse written, right


@pytest.mark.parametrize("closed", [1, 2], ids=["stdout", "stderr"])
def test_a_command_with_a_closed_stream_exits_as_it_would(closed):
    """Python sets a stream closed at the start to None: the console entry's last flush skips it."""
    proc = subprocess.run([sys.executable, "-m", "batchlu", "--version"], env=_env(), capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL, preexec_fn=lambda: os.close(closed))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


def test_the_import_part_is_the_commands_own_only(invoke, tmp_path):
    """In a process the command line did not start (a notebook, a test runner), the process's age is
    not the command's: the report shows no import part then."""
    source = tmp_path / "in.zarr"
    array = zarr.create_array(str(source), shape=(20, 5, 5), chunks=(10, 5, 5), dtype="float64")
    array[...] = np.random.default_rng(7).standard_normal((20, 5, 5))
    result = invoke("run", str(source), str(tmp_path / "out.zarr"), "--op", "inv", "--no-progress")
    assert result.exit_code == 0, result.output
    line = next(text for text in result.output.splitlines() if text.strip().startswith("time:"))
    assert line.strip().startswith("time: plan ") and " import " not in line, line


def _random_input(path: Path, count: int = 64, size: int = 6) -> np.ndarray:
    """Fresh random matrices at ``path`` (chunks of 16); returns them."""
    values = np.random.default_rng().standard_normal((count, size, size))
    array = zarr.create_array(str(path), shape=values.shape, chunks=(16, size, size), dtype="float64")
    array[...] = values
    return values


def _with_stdout_gone(args, **kwargs) -> subprocess.CompletedProcess:
    """``batchlu ARGS`` whose stdout is a pipe with no reader left (``batchlu ... | true``, ``| head``
    once it has read its lines): every write to it fails with EPIPE."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-m", "batchlu", *map(str, args)], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=180, stdin=subprocess.DEVNULL,
                              env=_env(), **kwargs)
    finally:
        os.close(write)


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_a_run_whose_reader_has_gone_is_complete_and_exits_quietly(tmp_path, workers):
    """``batchlu run ... | true``: the report's print failed with "Error: [Errno 32] Broken pipe",
    exit 1. The run is done and recorded complete; the command exits as a Unix tool killed by
    SIGPIPE reports (128 + 13), with nothing on stderr."""
    source, out = tmp_path / "in.zarr", tmp_path / "out.zarr"
    values = _random_input(source)
    extra = ["--config", "cluster.processes=true"] if workers == "processes" else []
    proc = _with_stdout_gone(["run", source, out, "--op", "inv", *extra])
    assert proc.returncode == 128 + 13 and proc.stderr == "", (proc.returncode, proc.stderr)
    assert zarr.open_group(str(out), mode="r").attrs["batchlu"]["status"] == "complete"
    assert not (tmp_path / "out.zarr.lock").exists()
    inverse = zarr.open_array(str(out), path="inv", mode="r")[...]
    info = zarr.open_array(str(out), path="info", mode="r")[...]
    assert (info == 0).all() and (get03(values, inverse) < 30).all()
    checked = subprocess.run([sys.executable, "-m", "batchlu", "verify", str(source), str(out)], env=_env(),
                             capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert checked.returncode == 0 and checked.stderr == "", checked.stdout + checked.stderr


def test_an_error_with_the_reader_gone_still_says_its_line(tmp_path):
    """A run that fails, its stdout's reader gone: its one line on stderr, exit 1, as ever."""
    proc = _with_stdout_gone(["run", tmp_path / "absent.zarr", tmp_path / "out.zarr", "--op", "inv"])
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert proc.stderr.startswith("Error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "absent.zarr" in proc.stderr


_OTHER_PIPE = r"""
import sys
from batchlu import pipeline

def run(*args, **kwargs):   # a pipe of the run's own broke (an I/O process's), not stdout
    raise BrokenPipeError(32, "Broken pipe")

if __name__ == "__main__":
    pipeline.run = run
    sys.argv = ["batchlu", *sys.argv[1:]]
    from batchlu.workflows import console
    console()
"""


def test_a_broken_pipe_that_is_not_stdouts_is_an_error(tmp_path):
    """EPIPE from another pipe than stdout's (an I/O process gone) is a failure of the run: its one
    line, exit 1, whatever stdout is."""
    source = tmp_path / "in.zarr"
    _random_input(source, count=4)
    script = tmp_path / "other_pipe.py"
    script.write_text(_OTHER_PIPE)
    proc = subprocess.run([sys.executable, str(script), "run", str(source), str(tmp_path / "out.zarr"), "--op",
                           "inv"], capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
                          env=_env(), cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr == "Error: [Errno 32] Broken pipe\n", (proc.returncode, proc.stderr)
    assert proc.stdout == ""
