"""Compute backends: ``cpu`` (kernels' SciPy/LAPACK backend) and ``gpu`` (kernels' CUDA kernels),
each the name of the engine (:mod:`batchlu.pipeline._engines`) a task plugs into the batch loop;
``auto`` means the GPU where the worker has one.

Nothing here touches CUDA at import time or in the client: :func:`resolve` and
:func:`gpu_available` run inside the worker (from a task or ``client.run``).
Register another engine with :func:`register`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from . import _engines
from .errors import BackendError

_REGISTRY: dict[str, Callable[[], object]] = {"cpu": _engines.host_engine, "gpu": _engines.current_engine}


def register(name: str, factory: Callable[[], object]) -> Callable[[], object] | None:
    """Make ``factory()`` the engine of backend ``name`` in this process (call it on every worker);
    returns the factory it replaces (None: a new backend name), to put it back with."""
    previous = _REGISTRY.get(name)
    _REGISTRY[name] = factory
    return previous


@functools.lru_cache(maxsize=None)
def gpu_available() -> bool:
    """Whether this process can use a CUDA GPU through CuPy (imports CuPy; worker side only)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:
        return False


def resolve_name(name: str) -> str:
    """The backend ``name`` means in this worker (``auto``: ``gpu`` if available); checks it is usable."""
    if name == "auto":
        name = "gpu" if gpu_available() else "cpu"
    elif name == "gpu" and not gpu_available():
        raise BackendError("Expected a CUDA GPU usable through CuPy on the worker for backend 'gpu'. "
                           "Got none instead; use backend 'cpu' or 'auto', or install cupy-cuda12x.")
    if name not in _REGISTRY:
        raise BackendError(f"Expected backend to be one of auto, {', '.join(_REGISTRY)}. "
                           f"Got {name!r} instead.")
    return name


def resolve(name: str):
    """The engine of backend ``name`` in this worker (see :func:`resolve_name`)."""
    return _REGISTRY[resolve_name(name)]()


def probe(name: str) -> str:
    """Run on each worker with ``client.run``: the backend name ``name`` resolves to there."""
    return resolve_name(name)
