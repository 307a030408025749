"""Compute backends, chosen on the worker: ``cpu`` (NumPy through kernels' SciPy/LAPACK backend),
``gpu`` (CuPy through kernels' CUDA kernels) and ``auto`` (the GPU where the worker has one).

Nothing here touches CUDA at import time or in the client: :func:`resolve` and
:func:`gpu_available` run inside the worker (from a task or ``client.run``).

A backend has a ``name`` and ``compute(op, a, b) -> {name: numpy array}`` (host arrays in, host
arrays out). It may also define ``process_range(job, c0, c1) -> TaskResult`` to take over a whole
task (e.g. double-buffered reads, copies and writes on the GPU); :func:`batchlu.pipeline._tasks.process_range`
calls it when present and otherwise runs the plain read → compute → write → mark loop.
Register more with :func:`register`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from . import _ops
from .errors import BackendError


class CPUBackend:
    name = "cpu"

    def compute(self, op: str, a, b=None) -> dict:
        return _ops.compute(op, a, b)


class CupyBackend:
    """Straightforward GPU path: copy the batch in, run kernels' CUDA kernels, copy back."""

    name = "gpu"

    def compute(self, op: str, a, b=None) -> dict:
        import cupy

        out = _ops.compute(op, cupy.asarray(a), None if b is None else cupy.asarray(b))
        return {key: cupy.asnumpy(value) for key, value in out.items()}


def _path_backend(name: str):
    """Whole tasks through the double-buffered data path of :mod:`batchlu.pipeline._gpu_path` (issue 5)."""
    from . import _gpu_path

    return _gpu_path.HostPathBackend() if name == "cpu" else _gpu_path.GPUPathBackend()


_REGISTRY: dict[str, Callable[[], object]] = {"cpu": lambda: _path_backend("cpu"),
                                              "gpu": lambda: _path_backend("gpu")}


def register(name: str, factory: Callable[[], object]) -> None:
    """Make ``factory()`` the backend called ``name`` in this process (call it on every worker)."""
    _REGISTRY[name] = factory
    _instance.cache_clear()


@functools.lru_cache(maxsize=None)
def gpu_available() -> bool:
    """Whether this process can use a CUDA GPU through CuPy (imports CuPy; worker side only)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:
        return False


@functools.lru_cache(maxsize=None)
def _instance(name: str):
    return _REGISTRY[name]()


def resolve(name: str):
    """The backend object for ``name`` in this worker; ``auto`` means ``gpu`` if available."""
    if name == "auto":
        name = "gpu" if gpu_available() else "cpu"
    elif name == "gpu" and not gpu_available():
        raise BackendError("Expected a CUDA GPU usable through CuPy on the worker for backend 'gpu'. "
                           "Got none instead; use backend 'cpu' or 'auto', or install cupy-cuda12x.")
    if name not in _REGISTRY:
        raise BackendError(f"Expected backend to be one of auto, {', '.join(_REGISTRY)}. "
                           f"Got {name!r} instead.")
    return _instance(name)


def probe(name: str) -> str:
    """Run on each worker with ``client.run``: the backend name ``name`` resolves to there."""
    return resolve(name).name
