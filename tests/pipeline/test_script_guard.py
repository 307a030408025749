"""A script that calls batchlu without the ``if __name__ == "__main__":`` guard, on an embedded
cluster of worker processes (GPU runs, or ``cluster.processes=true``), gets one error that names the
guard, not "Nanny failed to start" after its worker processes re-ran it; on the default CPU cluster
of a small input, whose workers are threads of the script's process, it needs no guard.

Each case is a real script run by a real interpreter: spawned worker processes import the main
script again, which is the whole point.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import zarr

GUARD = 'if __name__ == "__main__":'
CALLS = """\
batchlu.generate("a.zarr", count=300, size=6, seed=0)
report = batchlu.run("a.zarr", "inv.zarr", op="inv", backend="cpu",
                     config={"cluster.n-workers": 1, "cluster.processes": True,
                             "cluster.dashboard-address": "127.0.0.1:0"})
print(report)
"""


def _run_script(tmp_path, text):
    script = tmp_path / "script.py"
    script.write_text(text)
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=180, stdin=subprocess.DEVNULL)


def _last_line(proc) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines, proc.stdout
    return lines[-1]


def test_without_the_guard_the_error_names_it_before_any_worker_starts(tmp_path):
    proc = _run_script(tmp_path, "import batchlu\n\n" + CALLS)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = _last_line(proc)
    assert last.startswith("batchlu.errors.ClusterError: "), proc.stderr
    assert GUARD in last and f"{tmp_path / 'script.py'}:4" in last  # the line of batchlu.run
    assert "Nanny failed" not in proc.stderr and "bootstrapping phase" not in proc.stderr
    assert proc.stderr.count("Traceback") == 1  # the script's own, no worker's
    assert not (tmp_path / "inv.zarr").exists()


def test_a_worker_that_reruns_the_script_says_what_to_do(tmp_path):
    """The fallback: when the top-level call is not recognised (here: the check is switched off in
    the script), the spawned worker refuses to rerun batchlu and the run's error names the guard."""
    off = "import batchlu.pipeline.cluster._guard as g\ng.unguarded_call = lambda: None\n"
    proc = _run_script(tmp_path, "import batchlu\n" + off + CALLS)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = _last_line(proc)
    assert last.startswith("batchlu.errors.ClusterError: "), proc.stderr
    assert GUARD in last and "script.py" in last
    assert not (tmp_path / "inv.zarr").exists()


@pytest.mark.parametrize("guard", [GUARD, "if '__main__' == __name__:"], ids=["usual", "reversed"])
def test_with_the_guard_the_same_calls_run(tmp_path, guard):
    body = "def main():\n" + textwrap.indent(CALLS, "    ") + f"\n\n{guard}\n    main()\n"
    proc = _run_script(tmp_path, "import batchlu\n\n\n" + body)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "batchlu inv: complete, 300 matrices" in proc.stdout
    assert zarr.open_group(tmp_path / "inv.zarr", mode="r").attrs["batchlu"]["status"] == "complete"


def test_the_default_cpu_cluster_runs_a_script_without_the_guard(tmp_path):
    """Threads of the script's process: nothing imports the script again, so no guard is needed."""
    calls = CALLS.replace('"cluster.processes": True,', "")
    assert "processes" not in calls
    proc = _run_script(tmp_path, "import batchlu\n\n" + calls)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "batchlu inv: complete, 300 matrices" in proc.stdout
    assert zarr.open_group(tmp_path / "inv.zarr", mode="r").attrs["batchlu"]["status"] == "complete"
