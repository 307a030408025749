"""batchlu.pipeline: Zarr → Dask → Zarr for batches of small dense matrices, with resume.

* :func:`run` computes ``lu``, ``inv``, ``solve`` or ``slogdet`` for every matrix of a Zarr array
  (N, n, n), or ``ldlt-solve`` / ``ldlt-inertia`` for every matrix of a sparse batch (a Zarr group
  holding one symmetric pattern and N value sets), on a ``distributed`` cluster and writes a Zarr v3
  output group;
* :func:`generate` / :func:`generate_rhs` write test inputs; :func:`verify` checks an output with
  LAPACK's test ratios; :func:`inspect` summarises a store;
* settings live in ``dask.config`` under ``batchlu`` (defaults in ``batchlu.yaml``), gathered in one
  :class:`Options`; every error derives from :class:`batchlu.pipeline.errors.BatchluError`.
"""

from . import errors
from ._ops import DENSE_OPS, OPS, SPARSE_OPS
from .client._report import Report
from .client._run import run
from .config._settings import ClusterOptions, Options, options
from .generate import generate, generate_rhs
from .inspect import inspect
from .verify import VerifyReport, verify

__all__ = [
    "DENSE_OPS",
    "OPS",
    "SPARSE_OPS",
    "ClusterOptions",
    "Options",
    "Report",
    "VerifyReport",
    "errors",
    "generate",
    "generate_rhs",
    "inspect",
    "options",
    "run",
    "verify",
]
