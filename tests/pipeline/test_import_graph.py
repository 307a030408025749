"""The project's import graph, read from the source (module-level and function-level imports alike):
no cycle anywhere in batchlu, none between the pipeline's folders, and building the cluster reaches
nothing of the data path (issue 17)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# where each part of the one import name lives (pyproject.toml's package-dir)
FOLDERS = {"batchlu": ROOT / "src" / "batchlu", "batchlu.kernels": ROOT / "kernels",
           "batchlu.pipeline": ROOT / "pipeline", "batchlu.workflows": ROOT / "workflows"}
PIPELINE = "batchlu.pipeline"
# the stages of a batch's life and what sets them up on a worker
DATA_PATH = {"worker._buffers", "worker._engines", "worker._batches", "worker._tasks", "worker._backends",
             "worker._io_pool", "worker._shared_memory", "output._fingerprint", "client._warmup", "plugins"}
CLUSTER = ("cluster._connect", "cluster._gpu_cluster")


def _modules() -> dict[str, Path]:
    """Every module of batchlu by its dotted name (a package by its own name)."""
    found = {}
    for prefix, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join((prefix, *parts))
            if name.split(".")[:2] == ["batchlu", "kernels"] and prefix == "batchlu" or "__pycache__" in parts:
                continue
            found.setdefault(name, path)
    return found


def _imports(name: str, path: Path, modules: dict) -> set[str]:
    """The batchlu modules ``name`` imports by name, anywhere in its source (a parent package that is
    only passed through on the way is not counted)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                target = f"{module}.{alias.name}"
                found.add(target if target in modules else module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _part(module: str) -> str | None:
    """The pipeline's folder or top-level module that ``module`` belongs to (None: outside it, or the
    package itself)."""
    if not module.startswith(PIPELINE + "."):
        return None
    return module[len(PIPELINE) + 1:].split(".")[0]


def _inside(module: str) -> str:
    return module[len(PIPELINE) + 1:]


def test_the_graph_is_read():
    graph = _graph()
    assert f"{PIPELINE}.worker._batches" in graph[f"{PIPELINE}.worker._tasks"]
    assert f"{PIPELINE}.worker._engines" in graph[f"{PIPELINE}.worker._backends"]
    assert "batchlu.kernels.sparse._shared" in graph["batchlu.kernels.sparse._factor"]
    assert len(graph) > 80


def test_no_import_cycles():
    graph = _graph()
    cycles = sorted(name for name in graph if name in _reach(graph, name))
    assert not cycles, f"modules on an import cycle: {cycles}"


def test_no_cycles_between_the_pipelines_folders():
    """Imports between the pipeline's folders (and its top-level modules) point one way."""
    graph: dict[str, set[str]] = {}
    for name, targets in _graph().items():
        part = _part(name)
        if part is None:
            continue
        graph.setdefault(part, set()).update(p for p in map(_part, targets) if p not in (None, part))
    cycles = sorted(part for part in graph if part in _reach(graph, part))
    assert not cycles, f"folders of pipeline/ on an import cycle: {cycles}"


@pytest.mark.parametrize("module", CLUSTER)
def test_cluster_construction_does_not_import_the_data_path(module):
    graph = _graph()
    assert f"{PIPELINE}.{module}" in graph
    reached = {_inside(m) for m in _reach(graph, f"{PIPELINE}.{module}") if m.startswith(PIPELINE + ".")}
    assert not reached & DATA_PATH, f"{module} reaches the data path: {sorted(reached & DATA_PATH)}"
