"""The pipeline's import graph, read from the source (module-level and function-level imports alike):
no cycles, and building the cluster reaches nothing of the data path (issue 17)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PIPELINE = Path(__file__).resolve().parents[2] / "pipeline"
# the stages of a batch's life and what sets them up (_missing is left out: the settings read its
# table of policies, and it imports nothing but the errors)
DATA_PATH = {"_buffers", "_engines", "_batches", "_tasks", "_backends", "_io_pool", "_fingerprint",
             "_warmup", "plugins"}
CLUSTER = ("_cluster", "_gpu_cluster")


def _graph() -> dict[str, set[str]]:
    """Module -> the pipeline modules it imports, anywhere in its source."""
    modules = {path.stem for path in PIPELINE.glob("*.py")}
    graph = {}
    for name in modules:
        tree = ast.parse((PIPELINE / f"{name}.py").read_text())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1 and node.module:           # from ._x import y
                    found.add(node.module.split(".")[0])
                elif node.level == 1:                          # from . import _x, _y
                    found.update(alias.name for alias in node.names)
                elif node.module and node.module.startswith("batchlu.pipeline."):
                    found.add(node.module.split(".")[2])
            elif isinstance(node, ast.Import):
                found.update(alias.name.split(".")[2] for alias in node.names
                             if alias.name.startswith("batchlu.pipeline."))
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_graph_is_read():
    graph = _graph()
    assert "_batches" in graph["_tasks"] and "_engines" in graph["_backends"]
    assert {"_buffers", "_engines", "_batches", "_tasks"} <= set(graph)


def test_no_import_cycles():
    graph = _graph()
    cycles = sorted(name for name in graph if name in _reach(graph, name))
    assert not cycles, f"modules on an import cycle: {cycles}"


@pytest.mark.parametrize("module", CLUSTER)
def test_cluster_construction_does_not_import_the_data_path(module):
    reached = _reach(_graph(), module) & DATA_PATH
    assert not reached, f"{module} reaches the data path: {sorted(reached)}"
