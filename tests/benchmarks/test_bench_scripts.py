"""The benchmark scripts stay runnable as ``python benchmarks/bench_x.py`` on any machine: no module
shadows a package, no ``sys.path`` surgery or loading by path, only public names of
``batchlu.kernels`` (the tuning surface), and ``--help`` works without a GPU (CuPy is imported inside
the functions that time something)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(BENCH.glob("bench_*.py"))
SOURCES = sorted(BENCH.glob("*.py"))
# Pipeline internals bench_pipeline.py still reaches for (the --host-noop engine and the I/O-pool
# label), until batchlu.pipeline gives them a public hook.
PIPELINE_INTERNALS = {("bench_pipeline.py", "batchlu.pipeline._backends"),
                      ("bench_pipeline.py", "batchlu.pipeline._engines"),
                      ("bench_pipeline.py", "batchlu.pipeline._io_pool"),
                      ("bench_pipeline.py", "batchlu.pipeline._io_pool.io_settings")}
# bench_small_n.py's --noop engine, as bench_pipeline.py's --host-noop.
PIPELINE_INTERNALS |= {("bench_small_n.py", "batchlu.pipeline._backends"),
                       ("bench_small_n.py", "batchlu.pipeline._engines")}
# bench_resume_checks.py times the integrity checks themselves (the checksum patched out for the
# "without" column), so it names the modules that hold them.
PIPELINE_INTERNALS |= {("bench_resume_checks.py", name) for name in (
    "batchlu.pipeline._fingerprint", "batchlu.pipeline._ledger", "batchlu.pipeline._tasks",
    "batchlu.pipeline._io_pool", "batchlu.pipeline._io_pool.open_array", "batchlu.pipeline._ops",
    "batchlu.pipeline._plan", "batchlu.pipeline._store")}


def test_the_scripts_are_there():
    assert {p.name for p in SCRIPTS} == {
        "bench_kernels.py", "bench_pipeline.py", "bench_host_io.py", "bench_blocked_sweep.py",
        "bench_gesv_sweep.py", "bench_gje_sweep.py", "bench_kernel_ab.py", "bench_resume_checks.py",
        "bench_small_n.py"}
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


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_path_hacks_and_no_private_batchlu_names(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", "") == "sys":
            pytest.fail(f"{path.name}:{node.lineno}: sys.path is changed or read")
        if isinstance(node, ast.Attribute) and node.attr == "spec_from_file_location":
            pytest.fail(f"{path.name}:{node.lineno}: a module is loaded by path")
    for name in _imports(tree):
        parts = name.split(".")
        private = parts[0] == "batchlu" and any(p.startswith("_") for p in parts[1:])
        if private and (path.name, name) not in PIPELINE_INTERNALS:
            pytest.fail(f"{path.name}: imports the private name {name}; use batchlu.kernels.tuning")


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_help_works_without_a_gpu(path, tmp_path):
    done = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(f"usage: {path.name}"), done.stdout[:300]
