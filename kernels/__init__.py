"""batchlu.kernels: batched LU, inverse, solve and log-determinant of small dense matrices.

NumPy arrays go to the CPU backend (SciPy/LAPACK); CuPy arrays go to batchlu's own CUDA kernels,
or to cuSOLVER above the n those cover (docs/design.md#large-n-cusolver): every n works on both.
Both follow the same conventions:

* arrays are C-order ``(..., n, n)``; float32, float64, complex64 and complex128; results keep the
  input dtype;
* ``lu`` and ``piv`` mean what :func:`scipy.linalg.lu_factor` returns for each matrix, ``piv`` 0-based
  int32: ``piv`` is SciPy's but for near ties, ``lu`` SciPy's to rounding (README: How close);
* ``info`` is int32 of shape ``(...)``, one code per matrix (named in ``batchlu.kernels``):

  - 0 (``INFO_OK``): the result is finite;
  - ``k > 0``: ``U[k-1, k-1]`` is exactly zero (the factorization still completes; ``inv`` and
    ``solve`` give NaN, ``slogdet`` sign 0 and logabsdet -inf);
  - -1 (``INFO_NONFINITE_INPUT``): the matrix, or for ``solve`` its right-hand side, holds NaN or
    Inf; results NaN, ``piv`` the identity;
  - -2 (``INFO_NONFINITE_RESULT``): the input is finite but the result is not (it overflowed:
    ``lu``, the inverse, ``x``, ``sign`` or ``logabsdet`` holds Inf or NaN); the results are kept as
    computed. ``lu_solve`` returns no ``info`` and flags nothing;
* a singular or non-finite matrix never raises and never spoils its neighbours; ``check=True``
  raises :class:`batchlu.errors.LinAlgError` (a :class:`numpy.linalg.LinAlgError`) naming the first bad index.

The CPU backend runs compiled batched loops (numba, compiled at first use and cached on disk) where
numba is importable, and NumPy/SciPy code otherwise (:func:`cpu_engine` says which); it uses every
core of the process from the main thread and one core from any other thread (a Dask worker's),
unless told otherwise by :func:`cpu_threads` or ``BATCHLU_CPU_THREADS``.

The GPU kernels' dispatch tables, plans and launchers are public in :mod:`batchlu.kernels.tuning`
(for benchmarks; not imported here). Sparse symmetric batches (LDL^T) are
:mod:`batchlu.kernels.sparse`, also ``batchlu.sparse``.
"""

from ._api import inv, lu_factor, lu_solve, slogdet, solve
from ._cpu_threads import cpu_threads
from ._info import INFO_NONFINITE_INPUT, INFO_NONFINITE_RESULT, INFO_OK
from ._validate import SUPPORTED_DTYPES

__all__ = ["INFO_NONFINITE_INPUT", "INFO_NONFINITE_RESULT", "INFO_OK", "SUPPORTED_DTYPES", "cpu_engine",
           "cpu_threads", "inv", "lu_factor", "lu_solve", "slogdet", "solve"]


def cpu_engine() -> str:
    """The CPU backend's engine: ``"compiled"`` (numba) or ``"numpy"`` (numba is not importable, or
    ``BATCHLU_CPU_ENGINE=numpy``). Imports numba, when it is there, on the first call."""
    from . import _cpu

    return "numpy" if _cpu._compiled() is None else "compiled"
