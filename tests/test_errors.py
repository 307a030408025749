"""One error hierarchy: every error class batchlu defines derives from BatchluError and from a built-in
exception, and the pipeline's errors module is the same hierarchy."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import batchlu
from batchlu import errors
from batchlu.pipeline import errors as pipeline_errors

ROOT = Path(__file__).resolve().parents[1]


def test_every_exported_error_is_a_batchlu_error_and_a_builtin():
    for name in errors.__all__:
        cls = getattr(errors, name)
        if name == "BatchluWarning":
            assert issubclass(cls, UserWarning)
            continue
        assert issubclass(cls, errors.BatchluError), name
        if cls is not errors.BatchluError:
            builtins = [b for b in cls.__mro__ if b.__module__ == "builtins" and b not in (object, BaseException,
                                                                                         Exception)]
            assert builtins, f"{name} derives from no built-in exception"
    assert issubclass(errors.KernelCompileError, RuntimeError)
    assert issubclass(errors.IOProcessError, RuntimeError)
    assert issubclass(errors.GPUUnavailableError, ValueError)
    assert pipeline_errors.BatchluError is errors.BatchluError and batchlu.errors is errors


def test_no_error_class_is_defined_outside_the_hierarchy_module():
    """An exception class defined anywhere else in the product escapes ``except BatchluError``."""
    sources = [p for top in ("src/batchlu", "kernels", "pipeline", "workflows") for p in (ROOT / top).rglob("*.py")]
    strays = []
    for path in sources:
        if path == ROOT / "src" / "batchlu" / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    getattr(base, "id", getattr(base, "attr", "")).endswith(("Error", "Exception"))
                    for base in node.bases):
                strays.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not strays, strays
    assert inspect.getmodule(errors.KernelCompileError) is errors


# Where batchlu raises a built-in (or another library's) exception on purpose, and why that is not a
# user's error: each is caught where it is raised, is a protocol, mirrors SciPy, or guards an internal
# invariant (a bug in batchlu, which the CLI shows with its traceback rather than as a user error).
_NOT_IN_THE_HIERARCHY = {
    ("src/batchlu/__init__.py", "AttributeError"): "the module __getattr__ protocol",
    ("pipeline/config/_parsers.py", "ValueError"): "bare, caught by its own parser, which raises ConfigError",
    ("pipeline/worker/_io_pool.py", "RuntimeError"): "internal: callers check supported() and never use a closed pool",
    ("pipeline/worker/_io_pool.py", "ValueError"): "internal: the batch loop sends only shared buffers",
    ("pipeline/worker/_io_child.py", "ValueError"): "internal: the pool sends only reads and writes",
    ("pipeline/worker/_engines.py", "TypeError"): "internal: the kernels' return dtypes",
    ("pipeline/output/_lock.py", "RuntimeError"): "internal: acquire outside releases_locks",
    ("pipeline/_ops.py", "TypeError"): "internal: a sparse op used as a dense one",
}


def _raised_names(node: ast.Raise) -> str | None:
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    if isinstance(exc, ast.Name):
        return exc.id
    if isinstance(exc, ast.Attribute):
        return ast.unparse(exc)
    return None


def test_every_error_raised_on_purpose_is_in_the_hierarchy():
    """``raise ValueError(...)`` escapes ``except BatchluError``: what batchlu raises at its users derives
    from batchlu.errors; the few exceptions are listed above with their reason."""
    hierarchy = set(errors.__all__)
    sources = [p for top in ("src/batchlu", "kernels", "pipeline", "workflows") for p in (ROOT / top).rglob("*.py")]
    strays, allowed_seen = [], set()
    for path in sources:
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            name = _raised_names(node)
            if name is None or name in hierarchy or name.startswith("click.") or not name.endswith(
                    ("Error", "Exception")):
                continue   # a re-raise of a caught exception, one of ours, or click's own usage errors
            if (rel, name) in _NOT_IN_THE_HIERARCHY:
                allowed_seen.add((rel, name))
            else:
                strays.append(f"{rel}:{node.lineno} raise {name}")
    assert not strays, f"raise an error of batchlu.errors instead: {strays}"
    assert allowed_seen == set(_NOT_IN_THE_HIERARCHY), set(_NOT_IN_THE_HIERARCHY) - allowed_seen
