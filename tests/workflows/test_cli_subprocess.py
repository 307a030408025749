"""``batchlu`` as a real process: the README's first command, and the installed console script."""

from __future__ import annotations

import os
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
