"""LAPACK's test ratios for LU, solve and inverse, per matrix, vectorised over a batch.

These are the quantities LAPACK's own test suite computes (``dget01``, ``dget02``, ``dget03`` and their
``s``/``c``/``z`` twins). A result passes when its ratio is below :data:`THRESHOLD` (LAPACK's default,
30). Every ratio is computed in float64/complex128, against the machine epsilon of the *least* precise
input, so a float32 answer is judged at float32's epsilon even when checked against a float64 ``a``.

Norms are matrix 1-norms (largest column sum of moduli), as LAPACK's ``xLANGE('1', ...)``. Zero norms
are handled as LAPACK does: a zero ``a`` gives 0 when the residual is zero and ``1/eps`` otherwise
(``get01``); a zero ``a`` or ``x`` column gives ``1/eps`` (``get02``); a zero ``a`` or ``ainv`` gives
``1/eps`` (``get03``). NaN or Inf anywhere in a matrix gives a NaN or Inf ratio for that matrix:
callers that expect non-finite inputs must set those matrices aside (their ``info`` is -1).

All functions accept arrays of shape ``(..., n, n)`` (and ``(..., n)`` or ``(..., n, k)`` for right-hand
sides) and return float64 of shape ``(...)``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["THRESHOLD", "get01", "get02", "get03"]

THRESHOLD = 30.0


def _eps(*arrays) -> float:
    """Machine epsilon of the least precise of ``arrays`` (all of a supported inexact dtype)."""
    eps = 0.0
    for x in arrays:
        if x.dtype.kind not in "fc":
            raise TypeError(f"Expected a floating or complex array. Got dtype {x.dtype} instead.")
        eps = max(eps, float(np.finfo(x.dtype).eps))
    return eps


def _wide(x: np.ndarray) -> np.ndarray:
    """``x`` in float64 or complex128."""
    return x.astype(np.complex128 if x.dtype.kind == "c" else np.float64, copy=False)


def _norm1(x: np.ndarray) -> np.ndarray:
    """1-norm (largest column sum of moduli) of each matrix in ``x`` (..., m, n); 0 for empty."""
    if x.shape[-1] == 0 or x.shape[-2] == 0:
        return np.zeros(x.shape[:-2])
    return np.abs(x).sum(axis=-2).max(axis=-1)


def _square(a: np.ndarray, what: str) -> int:
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"Expected {what} of shape (..., n, n). Got shape {a.shape} instead.")
    return a.shape[-1]


def _same_shape(a: np.ndarray, other: np.ndarray, what: str) -> None:
    if other.shape != a.shape:
        raise ValueError(f"Expected {what} of shape {a.shape} (that of a). Got shape {other.shape} instead.")


def _permutation(piv: np.ndarray, n: int) -> np.ndarray:
    """Row permutation ``perm`` (..., n) with ``(P A)[i] = A[perm[i]]`` from LAPACK-style 0-based ``piv``.

    Loops over the n interchanges only; each step is vectorised over the batch.
    """
    if piv.size and (piv.min() < 0 or piv.max() >= n):
        raise ValueError(f"Expected piv values in [0, {n}). Got values in "
                         f"[{int(piv.min())}, {int(piv.max())}] instead.")
    perm = np.broadcast_to(np.arange(n), piv.shape).copy()
    for i in range(n):
        j = piv[..., i : i + 1].astype(np.intp)
        pi = perm[..., i : i + 1].copy()
        pj = np.take_along_axis(perm, j, axis=-1)
        perm[..., i : i + 1] = pj
        np.put_along_axis(perm, j, pi, axis=-1)
    return perm


def get01(a, lu, piv) -> np.ndarray:
    """``||L U - P A||_1 / (n ||A||_1 eps)`` per matrix (LAPACK ``xGET01``).

    ``lu`` and ``piv`` are as returned by :func:`scipy.linalg.lu_factor` (``piv`` 0-based). A zero
    ``A`` gives 0 if ``L U`` is exactly zero too, else ``1/eps``.
    """
    a, lu, piv = np.asarray(a), np.asarray(lu), np.asarray(piv)
    n = _square(a, "a")
    _same_shape(a, lu, "lu")
    if piv.shape != a.shape[:-1]:
        raise ValueError(f"Expected piv of shape {a.shape[:-1]}. Got shape {piv.shape} instead.")
    eps = _eps(a, lu)
    if n == 0:
        return np.zeros(a.shape[:-2])
    a64, lu64 = _wide(a), _wide(lu)
    lower = np.tril(lu64, -1) + np.eye(n, dtype=lu64.dtype)
    upper = np.triu(lu64)
    perm = _permutation(piv, n)
    pa = np.take_along_axis(a64, perm[..., :, None], axis=-2)
    resid = _norm1(lower @ upper - pa)
    anorm = _norm1(a64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = resid / n / anorm / eps
    zero = anorm == 0
    return np.where(zero, np.where(resid == 0, 0.0, 1.0 / eps), ratio)


def get02(a, x, b) -> np.ndarray:
    """``max_j ||b_j - A x_j||_1 / (||A||_1 ||x_j||_1 eps)`` per matrix (LAPACK ``xGET02``).

    ``x`` and ``b`` are (..., n) for one right-hand side or (..., n, k) for k of them. A zero ``A`` or a
    zero column of ``x`` gives ``1/eps``; no right-hand side (k = 0) or n = 0 gives 0.
    """
    a, x, b = np.asarray(a), np.asarray(x), np.asarray(b)
    n = _square(a, "a")
    if x.shape != b.shape:
        raise ValueError(f"Expected x of shape {b.shape} (that of b). Got shape {x.shape} instead.")
    if x.shape == a.shape[:-1]:
        x, b = x[..., None], b[..., None]
    elif x.ndim != a.ndim or x.shape[:-1] != a.shape[:-1]:
        raise ValueError(f"Expected b of shape {a.shape[:-1]} or {a.shape[:-1] + ('k',)}. "
                         f"Got shape {b.shape} instead.")
    eps = _eps(a, x, b)
    if n == 0 or x.shape[-1] == 0:
        return np.zeros(a.shape[:-2])
    a64, x64, b64 = _wide(a), _wide(x), _wide(b)
    anorm = _norm1(a64)[..., None]
    rnorm = np.abs(b64 - a64 @ x64).sum(axis=-2)  # (..., k)
    xnorm = np.abs(x64).sum(axis=-2)
    with np.errstate(divide="ignore", invalid="ignore"):
        col = rnorm / anorm / xnorm / eps
    col = np.where((xnorm == 0) | (anorm == 0), 1.0 / eps, col)
    # A NaN column must not be hidden by max: np.max propagates NaN.
    return col.max(axis=-1)


def get03(a, ainv) -> np.ndarray:
    """``||I - AINV A||_1 / (n ||A||_1 ||AINV||_1 eps)`` per matrix (LAPACK ``xGET03``).

    A zero ``A`` or ``AINV`` gives ``1/eps``; n = 0 gives 0.
    """
    a, ainv = np.asarray(a), np.asarray(ainv)
    n = _square(a, "a")
    _same_shape(a, ainv, "ainv")
    eps = _eps(a, ainv)
    if n == 0:
        return np.zeros(a.shape[:-2])
    a64, ainv64 = _wide(a), _wide(ainv)
    anorm, inorm = _norm1(a64), _norm1(ainv64)
    resid = _norm1(np.eye(n, dtype=a64.dtype) - ainv64 @ a64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = resid * ((1.0 / anorm) / inorm) / eps / n
    return np.where((anorm == 0) | (inorm == 0), 1.0 / eps, ratio)
