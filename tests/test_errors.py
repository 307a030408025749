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
    sources = [p for top in ("batchlu", "kernels", "pipeline", "workflows") for p in (ROOT / top).rglob("*.py")]
    strays = []
    for path in sources:
        if path == ROOT / "batchlu" / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    getattr(base, "id", getattr(base, "attr", "")).endswith(("Error", "Exception"))
                    for base in node.bases):
                strays.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not strays, strays
    assert inspect.getmodule(errors.KernelCompileError) is errors
