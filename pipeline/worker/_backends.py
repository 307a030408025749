"""Compute backends: ``cpu`` (kernels' SciPy/LAPACK backend) and ``gpu`` (kernels' CUDA kernels),
each the name of the engine (:mod:`batchlu.pipeline.worker._engines`) a task plugs into the batch
loop; what ``auto`` means on this worker is decided by
:func:`batchlu.pipeline.cluster._devices.resolve_here`.

Nothing here touches CUDA at import time or in the client: :func:`resolve` runs inside the worker
(from a task). Register another engine with :func:`register`.
"""

from __future__ import annotations

from collections.abc import Callable

from ..cluster._devices import resolve_here
from ..errors import BackendError
from . import _engines

_REGISTRY: dict[str, Callable[[], object]] = {"cpu": _engines.host_engine, "gpu": _engines.current_engine}


def register(name: str, factory: Callable[[], object]) -> Callable[[], object] | None:
    """Make ``factory()`` the engine of backend ``name`` in this process (call it on every worker);
    returns the factory it replaces (None: a new backend name), to put it back with."""
    previous = _REGISTRY.get(name)
    _REGISTRY[name] = factory
    return previous


def resolve_name(name: str) -> str:
    """The backend ``name`` means in this worker (``auto``: ``gpu`` if available); checks it is usable
    and has an engine."""
    name = resolve_here(name)
    if name not in _REGISTRY:
        raise BackendError(f"Expected backend to be one of auto, {', '.join(_REGISTRY)}. "
                           f"Got {name!r} instead.")
    return name


def resolve(name: str):
    """The engine of backend ``name`` in this worker (see :func:`resolve_name`)."""
    return _REGISTRY[resolve_name(name)]()
