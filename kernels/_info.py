"""The per-matrix ``info`` codes, defined once, and the check that flags a finite input whose result
is not finite (``INFO_NONFINITE_RESULT``).

- ``INFO_OK`` (0): the result is finite and is what the op computes;
- LAPACK's ``k > 0``: ``U[k-1, k-1]`` is exactly zero, singular;
- ``INFO_NONFINITE_INPUT`` (-1): the input (the matrix; for ``solve`` also its right-hand side)
  holds NaN or Inf; its results are NaN;
- ``INFO_NONFINITE_RESULT`` (-2): the input is finite but the result is not (overflow); the results
  are kept as computed and hold an Inf or NaN. Also where the LU factors that ``inv`` or ``solve``
  (with a right-hand side) works from overflowed: their results are NaN, as a finite result of
  infinite factors means nothing (1 / inf is 0);
- ``INFO_MISSING_INPUT`` (-3): set by the pipeline, never by the kernels: the matrix's input chunk is
  missing from its store and the run was told to go on (``batchlu.missing-chunks: fill``); results
  as for -1;
- ``INFO_REFINEMENT`` (-4): sparse LDL^T solves only (:mod:`batchlu.kernels.sparse`): iterative
  refinement ended with a normwise backward error above its tolerance; ``x`` is kept (the best
  iterate) and its backward error is reported.

The check runs after the backend, on NumPy or CuPy arrays alike (``xp``): a few elementwise passes
over the results on the current stream, no device synchronisation.
"""

from __future__ import annotations

import numpy as np

__all__ = ["INFO_MISSING_INPUT", "INFO_NONFINITE_INPUT", "INFO_NONFINITE_RESULT", "INFO_OK", "INFO_REFINEMENT",
           "describe",
           "flag_nonfinite", "nonfinite_rhs"]

INFO_OK = 0
INFO_NONFINITE_INPUT = -1
INFO_NONFINITE_RESULT = -2
INFO_MISSING_INPUT = -3
INFO_REFINEMENT = -4


def describe(code: int, rhs: bool = False) -> str:
    """What ``info == code`` says about a matrix, for error messages (``rhs``: of ``solve``)."""
    if code > 0:
        return f"is singular: U[{code - 1}, {code - 1}] is exactly zero"
    if code == INFO_NONFINITE_INPUT:
        return "holds NaN or Inf" + (" (it or its right-hand side)" if rhs else "")
    if code == INFO_NONFINITE_RESULT:
        return "is finite but its result is not (overflow)"
    if code == INFO_MISSING_INPUT:
        return "is in an input chunk missing from its store"
    if code == INFO_REFINEMENT:
        return "was solved, but iterative refinement did not bring the backward error under its tolerance"
    return f"has info {code}"


def _finite(xp, x):
    """Per matrix (leading axis): every element of ``x`` finite."""
    if x.ndim == 1:
        return xp.isfinite(x)
    return xp.isfinite(x).all(axis=tuple(range(1, x.ndim)))


def flag_nonfinite(xp, info, *results):
    """``info`` with ``INFO_NONFINITE_RESULT`` where it was ``INFO_OK`` and some result is not finite.

    ``results`` are the op's outputs, each with the batch on its leading axis, as ``info`` (B,).
    """
    finite = None
    for x in results:
        ok = _finite(xp, x)
        finite = ok if finite is None else finite & ok
    if finite is None:
        return info
    code = xp.full((), INFO_NONFINITE_RESULT, np.int32)
    return xp.where((info == INFO_OK) & ~finite, code, info).astype(np.int32, copy=False)


def nonfinite_rhs(xp, info, x, b):
    """``solve``: a finite matrix with a right-hand side holding NaN or Inf is a non-finite input:
    ``INFO_NONFINITE_INPUT`` and an all-NaN ``x``, as for a non-finite matrix. Returns ``(info, x)``."""
    bad = ~_finite(xp, b)
    info = xp.where(bad, xp.full((), INFO_NONFINITE_INPUT, np.int32), info).astype(np.int32, copy=False)
    if xp is np:   # in place: no copy of x on the host
        x[bad] = np.nan
        return info, x
    # CuPy: an elementwise select on the current stream (a boolean-mask store may synchronise)
    x = xp.where(bad.reshape((-1,) + (1,) * (x.ndim - 1)), xp.full((), np.nan, x.dtype), x)
    return info, x
