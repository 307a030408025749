"""``batchlu`` as a real process: the README's first command, and the installed console script."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
