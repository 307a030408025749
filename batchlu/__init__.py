"""batchlu: LU, inverse, solve and log-determinant of huge collections of small dense matrices.

The one import name of the project. Its subpackages:

* :mod:`batchlu.kernels` — the SciPy-shaped batched API on in-memory arrays (NumPy: CPU; CuPy: GPU);
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

from . import errors, testing
from .kernels import inv, lu_factor, lu_solve, slogdet, solve
from .pipeline import generate, inspect, run, verify

__version__ = "0.1.0"

__all__ = ["errors", "testing", "generate", "inspect", "inv", "lu_factor", "lu_solve", "run", "slogdet", "solve", "verify"]
