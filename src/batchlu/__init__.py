"""batchlu: LU, inverse, solve and log-determinant of huge collections of small dense matrices.

The one import name of the project. Its subpackages:

* :mod:`batchlu.kernels` — the SciPy-shaped batched API on in-memory arrays (NumPy: CPU; CuPy: GPU);
* :mod:`batchlu.sparse` (= :mod:`batchlu.kernels.sparse`) — LDL^T of batches of sparse symmetric
  matrices sharing one pattern (``analyze`` once, ``factorize`` / ``solve`` per batch);
* :mod:`batchlu.pipeline` — Zarr in, Dask across CPU cores or GPUs, Zarr out, resumable;
* :mod:`batchlu.workflows` — the ``batchlu`` command line, cluster scripts and examples;
* :mod:`batchlu.testing` — reproducible test matrices and LAPACK's test ratios;
* :mod:`batchlu.errors` — the one error hierarchy: every error batchlu raises on purpose derives from
  :class:`batchlu.errors.BatchluError` and from the matching built-in.

The everyday functions are re-exported here: ``batchlu.run``, ``batchlu.verify``, ``batchlu.generate``
and ``batchlu.inspect`` work on stores; ``batchlu.lu_factor``, ``batchlu.lu_solve``, ``batchlu.inv``,
``batchlu.solve`` and ``batchlu.slogdet`` on arrays. In the repository the subpackages live in the
top-level folders ``kernels/``, ``pipeline/`` and ``workflows/`` (``pyproject.toml`` maps them).
"""

import importlib

__version__ = "0.1.0"

# name -> the subpackage it comes from, imported at first use: ``import batchlu`` stays light (the
# kernels' users do not load Dask and Zarr; the CLI's --help stays quick).
_EXPORTS = {
    "inv": "kernels", "lu_factor": "kernels", "lu_solve": "kernels", "slogdet": "kernels", "solve": "kernels",
    "generate": "pipeline", "inspect": "pipeline", "run": "pipeline", "verify": "pipeline",
}
_SUBMODULES = ("errors", "kernels", "pipeline", "testing", "workflows")
_ALIASES = {"sparse": "batchlu.kernels.sparse"}   # name -> module, imported at first use

__all__ = ["errors", "sparse", "testing", *sorted(_EXPORTS)]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    elif name in _ALIASES:
        value = importlib.import_module(_ALIASES[name])
    else:
        raise AttributeError(f"module 'batchlu' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *_EXPORTS, *_SUBMODULES, *_ALIASES})
