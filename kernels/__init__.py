"""batchlu.kernels: batched LU, inverse, solve and log-determinant of small dense matrices.

NumPy arrays go to the CPU backend (SciPy/LAPACK); CuPy arrays go to batchlu's own CUDA kernels.
Both follow the same conventions:

* arrays are C-order ``(..., n, n)``; float32, float64, complex64 and complex128; results keep the
  input dtype;
* ``lu`` and ``piv`` mean exactly what :func:`scipy.linalg.lu_factor` returns for each matrix, with
  ``piv`` 0-based int32;
* ``info`` is int32 of shape ``(...)``: 0 ok, ``k > 0`` when ``U[k-1, k-1]`` is exactly zero (the
  factorization still completes), -1 when the matrix holds NaN or Inf;
* a singular or non-finite matrix never raises and never spoils its neighbours; ``check=True``
  raises :class:`numpy.linalg.LinAlgError` naming the first bad index.

The GPU kernels' dispatch tables, plans and launchers are public in :mod:`batchlu.kernels.tuning`
(for benchmarks; it imports CuPy, so it is not imported here).
"""

from ._api import inv, lu_factor, lu_solve, slogdet, solve
from ._validate import SUPPORTED_DTYPES

__all__ = ["SUPPORTED_DTYPES", "inv", "lu_factor", "lu_solve", "slogdet", "solve"]
