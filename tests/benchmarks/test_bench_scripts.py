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
        "bench_gesv_sweep.py", "bench_gje_sweep.py", "bench_kernel_ab.py", "bench_resume_checks.py",
        "bench_host_codecs.py"}
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
    "from batchlu.pipeline._io_pool import io_settings\n",
    "import batchlu.pipeline._tasks\n",
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
