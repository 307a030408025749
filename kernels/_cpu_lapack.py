"""LAPACK through SciPy, one call per matrix: the NumPy engine's path for n >= ``NUMPY_LAPACK_MIN_N``
(the CPU backend's fallback where numba is not importable).

``scipy.linalg.lu_factor`` and ``lu_solve`` accept batches, but batch by looping in Python over the
matrices and add per-matrix checks and warnings on top; calling the ``?getrf`` / ``?getrs`` /
``?getri`` wrappers from ``scipy.linalg.get_lapack_funcs`` in the same loop computes exactly the same
thing (``lu_factor`` is ``getrf``) for a third to a half of the per-matrix cost, which is what
dominates at moderate n. The wrappers take and return 0-based pivots and release the GIL, so Dask
worker threads run them side by side.

Arrays come from ``batchlu.kernels._cpu``: C-contiguous, one batch axis; ``factor`` only sees finite
matrices, ``invert`` only matrices whose factorization has no zero pivot.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import get_lapack_funcs

__all__ = ["factor", "invert", "substitute"]


def factor(a: np.ndarray, piv: np.ndarray) -> None:
    """LU of every matrix of ``a`` (B, n, n) in place (``xGETRF``), 0-based pivots into ``piv``."""
    getrf, = get_lapack_funcs(("getrf",), (a,))
    for i in range(a.shape[0]):
        a[i], piv[i], _ = getrf(a[i])


def substitute(lu: np.ndarray, piv: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``x`` (B, n, k) with ``A x = b`` from ``factor``'s ``lu`` and ``piv`` (``xGETRS``)."""
    getrs, = get_lapack_funcs(("getrs",), (lu,))
    x = np.empty(b.shape, lu.dtype)
    for i in range(lu.shape[0]):
        x[i], _ = getrs(lu[i], piv[i], b[i])
    return x


def invert(lu: np.ndarray, piv: np.ndarray) -> np.ndarray:
    """``A^-1`` (B, n, n) from ``factor``'s ``lu`` and ``piv`` (``xGETRI``); no zero pivots."""
    getri, getri_lwork = get_lapack_funcs(("getri", "getri_lwork"), (lu,))
    n = lu.shape[-1]
    work, _ = getri_lwork(n)
    lwork = max(1, int(np.real(work)))
    ainv = np.empty(lu.shape, lu.dtype)
    for i in range(lu.shape[0]):
        ainv[i], _ = getri(lu[i], piv[i], lwork=lwork)
    return ainv
