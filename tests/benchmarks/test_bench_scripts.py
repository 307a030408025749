"""The benchmark scripts stay runnable as ``python benchmarks/bench_x.py`` on any machine: no module
shadows a package, no ``sys.path`` surgery or loading by path, only public names of
``batchlu`` (the tuning surfaces: ``batchlu.kernels.tuning``, ``batchlu.pipeline.tuning``), and
``--help`` works without a GPU (CuPy is imported inside the functions that time something)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(BENCH.glob("bench_*.py"))
SOURCES = sorted(BENCH.glob("*.py"))


def test_the_scripts_are_there():
    assert {p.name for p in SCRIPTS} == {
        "bench_kernels.py", "bench_pipeline.py", "bench_host_io.py", "bench_blocked_sweep.py",
        "bench_kernel_ab.py", "bench_resume_checks.py",
        "bench_cpu.py", "bench_cpu_crossover.py", "bench_host_codecs.py", "bench_sparse.py", "bench_sparse_pivoting.py",
        "bench_small_n.py", "bench_rows_sweep.py", "bench_getrs.py", "bench_rows_latency.py", "bench_e2e.py",
        "bench_dask_api.py", "bench_objstore.py", "bench_host_frames.py", "bench_pinning.py",
        "bench_sparse_first_call.py"}
    for path in SOURCES:  # the rest are private helper modules, named so
        assert path.name.startswith(("bench_", "_")), f"{path.name}: name benchmark modules bench_* or _*"


def _imports(tree):
    """(module or module.name) of every import in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def _batchlu_names(tree) -> set[str]:
    """The names an import binds to batchlu or something of it (``from batchlu import pipeline``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.asname or alias.name.split(".")[0] for alias in node.names
                         if alias.name.split(".")[0] == "batchlu")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "batchlu":
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _problems(name: str, source: str) -> list[str]:
    """What a benchmark module must not do: change or read ``sys.path``, load a module by path, or
    reach a private batchlu name (imported, or as an attribute of an imported batchlu module)."""
    tree = ast.parse(source, filename=name)
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", "") == "sys":
            problems.append(f"{name}:{node.lineno}: sys.path is changed or read")
        if isinstance(node, ast.Attribute) and node.attr == "spec_from_file_location":
            problems.append(f"{name}:{node.lineno}: a module is loaded by path")
    hint = "use the public API or a tuning surface (batchlu.kernels.tuning, batchlu.pipeline.tuning)"
    for imported in _imports(tree):
        parts = imported.split(".")
        if parts[0] == "batchlu" and any(_private(p) for p in parts[1:]):
            problems.append(f"{name}: imports the private name {imported}; {hint}")
    bound = _batchlu_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in bound:
                problems.append(f"{name}:{node.lineno}: reaches the private name {ast.unparse(node)}; {hint}")
    return problems


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_path_hacks_and_no_private_batchlu_names(path):
    problems = _problems(path.name, path.read_text())
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("source", [
    "from batchlu.pipeline import _fingerprint\n",
    "from batchlu.pipeline.worker._io_pool import io_settings\n",
    "import batchlu.pipeline.worker._tasks\n",
    "from batchlu import pipeline\npipeline._output.check_stored()\n",
    "import batchlu as b\nb.pipeline._ledger.read('x')\n",
    "import sys\nsys.path.insert(0, '.')\n",
])
def test_the_check_catches_each_way_in(source):
    assert _problems("bench_x.py", source)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_help_works_without_a_gpu(path, tmp_path):
    done = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(f"usage: {path.name}"), done.stdout[:300]


def test_bench_cpu_runs_and_writes_its_records(tmp_path):
    out = tmp_path / "cpu.json"
    done = subprocess.run([sys.executable, str(BENCH / "bench_cpu.py"), "--ops", "inv,lu_factor",
                           "--dtypes", "float64", "--sizes", "4", "--scale", "0.002", "--repeat", "1",
                           "--machine", "test", "--out", str(out)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    records = json.loads(out.read_text())["records"]
    assert {(r["op"], r["impl"]) for r in records} == {
        ("inv", "batchlu"), ("inv", "batchlu-1thread"), ("inv", "numpy"),
        ("lu_factor", "batchlu"), ("lu_factor", "batchlu-1thread"), ("lu_factor", "scipy-loop")}
    for r in records:
        assert r["seconds"] > 0 and r["batch"] == 200 and r["n"] == 4 and r["dtype"] == "float64"
        assert {"cores", "threads", "date", "machine", "seed", "load"} <= set(r)
    # a second run of one op replaces that op's records and keeps the others, and lists both commands
    again = subprocess.run([sys.executable, str(BENCH / "bench_cpu.py"), "--ops", "inv",
                            "--dtypes", "float64", "--sizes", "4", "--scale", "0.002", "--repeat", "1",
                            "--machine", "test", "--seed", "11", "--out", str(out)],
                           capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    merged = json.loads(out.read_text())
    assert len(merged["commands"]) == 2 and "--seed 11" in merged["commands"][1]
    by_op = {(r["op"], r["impl"]): r for r in merged["records"]}
    assert len(merged["records"]) == len(by_op) == 6
    assert all(by_op["inv", impl]["seed"] == 11 for impl in ("batchlu", "batchlu-1thread", "numpy"))
    first = {(r["op"], r["impl"]): r for r in records}
    assert all(by_op["lu_factor", impl] == first["lu_factor", impl]
               for impl in ("batchlu", "batchlu-1thread", "scipy-loop"))


def test_bench_cpu_does_not_time_a_wrong_peer():
    """Each implementation is checked with LAPACK's ratios first: a wrong answer fails the check."""
    import runpy

    import numpy as np

    bench = runpy.run_path(str(BENCH / "bench_cpu.py"))       # defines, does not run main()
    case = bench["make_case"]("inv", "float64", 6, 64, 1, seed=3)
    right = bench["implementations"]("inv", 1)["numpy"](case)
    assert bench["check"]("inv", case, right) < 30
    wrong = (right[0] + 1e-3 * np.abs(right[0]).max(),)
    assert not bench["check"]("inv", case, wrong) < 30
    lu, piv, _ = bench["implementations"]("lu_factor", 1)["batchlu"](case)
    assert bench["check"]("lu_factor", case, (lu, piv)) < 30
    assert not bench["check"]("lu_factor", case, (lu, np.roll(piv, 1, axis=1))) < 30


def test_bench_cpu_crossover_lanes_writes_its_range(tmp_path):
    """``--lanes`` times the lane LU against the tables without it and writes each ratio and the
    longest run of sizes where the lane LU is as fast."""
    import json
    import runpy

    out = tmp_path / "lanes.json"
    done = subprocess.run([sys.executable, str(BENCH / "bench_cpu_crossover.py"), "--lanes",
                           "--ops", "getrf", "--dtypes", "float64", "--sizes", "3,24", "--repeat", "1",
                           "--out", str(out)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert [(r["op"], r["dtype"], r["n"]) for r in result["records"]] == [
        ("getrf", "float64", 3), ("getrf", "float64", 24)]
    assert all(r["tables_over_lanes"] > 0 for r in result["records"])
    assert "--lanes" in result["command"] and "getrf float64" in result["crossovers"]
    longest = runpy.run_path(str(BENCH / "bench_cpu_crossover.py"))["_longest_run"]
    assert longest([2, 3, 4, 5, 6], [1.0, 0.9, 1.1, 1.2, 1.0]) == [4, 6]
    assert longest([2, 3], [0.5, 0.9]) is None


def test_bench_sparse_first_call_runs_each_point_in_a_process_and_checks_it(tmp_path):
    out = tmp_path / "first.json"
    done = subprocess.run([sys.executable, str(BENCH / "bench_sparse_first_call.py"), "--device", "cpu",
                           "--points", "kkt:120:4,fem-poisson:100:3", "--delta", "1e-10", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    import json

    records = json.loads(out.read_text())
    assert [(r["kind"], r["batch"], r["matrices"], r["delta"]) for r in records] == [
        ("kkt", 4, 8, 1e-10), ("fem-poisson", 3, 6, None)]
    for r in records:
        assert r["info0"] == r["matrices"] and 0 < r["max_berr_neps"] <= 30
        assert r["first_s"] >= r["first_factor_s"] > 0 and r["second_s"] > 0 and r["cache"] is None
    assert done.stdout.count("n eps") == 2   # a line per point
