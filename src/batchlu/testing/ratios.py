"""LAPACK's test ratios for LU, solve and inverse, per matrix, vectorised over a batch.

These are the quantities LAPACK's own test suite computes (``dget01``, ``dget02``, ``dget03`` and their
``s``/``c``/``z`` twins). A result passes when its ratio is below :data:`THRESHOLD` (LAPACK's default,
30). Every ratio is computed in float64/complex128, against the machine epsilon of the *least* precise
input, so a float32 answer is judged at float32's epsilon even when checked against a float64 ``a``.

Norms are matrix 1-norms (largest column sum of moduli), as LAPACK's ``xLANGE('1', ...)``. Zero norms
are handled as LAPACK does: a zero ``a`` gives 0 when the residual is zero and ``1/eps`` otherwise
(``get01``); a zero ``a`` or ``x`` column gives ``1/eps`` (``get02``); a zero ``a`` or ``ainv`` gives
``1/eps`` (``get03``). NaN or Inf anywhere in a matrix (or a result so far off that its residual
overflows) gives a NaN ratio for that matrix, never a pass (``NaN < 30`` is False): callers that
expect non-finite inputs must set those matrices aside (their ``info`` is -1).

Scale: each ratio is unchanged when its operands are multiplied by powers of two. Where a norm of
the batch is not 0 or within ``2^+-256`` (:data:`SAFE_EXPONENT`), each matrix (``a``, ``ainv``,
``U``, each column of ``x``) is first brought to a largest entry in [0.5, 1) by a power of two
(:func:`unit_scale`, exact), and ``b`` by the product of those of ``a`` and ``x``. Near the ends of
float64's range a norm would otherwise overflow (``||A^-1||_1 = inf`` for ``A`` scaled by 1e-308
made every ``get03`` ratio 0, a wrong inverse included) or sink into subnormals.

All functions accept arrays of shape ``(..., n, n)`` (and ``(..., n)`` or ``(..., n, k)`` for right-hand
sides) and return float64 of shape ``(...)``.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np

from batchlu.errors import InputError, InputTypeError


__all__ = ["THRESHOLD", "SlogdetRatios", "get01", "get02", "get03", "slogdet_ratios", "unit_scale"]

THRESHOLD = 30.0


def _eps(*arrays) -> float:
    """Machine epsilon of the least precise of ``arrays`` (all of a supported inexact dtype)."""
    eps = 0.0
    for x in arrays:
        if x.dtype.kind not in "fc":
            raise InputTypeError(f"Expected a floating or complex array. Got dtype {x.dtype} instead.")
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


def _exponent(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """Per matrix (``axes`` reduced): the ``E`` with the largest real or imaginary part's modulus in
    ``[2^(E-1), 2^E)``; 0 where ``x`` is all zero, empty or not finite (left as it is)."""
    parts = np.abs(x) if x.dtype.kind != "c" else np.maximum(np.abs(x.real), np.abs(x.imag))
    amax = parts.max(axis=axes, initial=0.0)
    usable = np.isfinite(amax) & (amax > 0)
    return np.where(usable, np.frexp(np.where(usable, amax, 1.0))[1], 0)


def _ldexp(x: np.ndarray, e: np.ndarray) -> np.ndarray:
    """``x * 2^e`` (``e`` broadcast against ``x``), exact unless it over- or underflows; complex
    ``x`` part by part."""
    if x.dtype.kind != "c":
        return np.ldexp(x, e)
    out = np.empty(np.broadcast_shapes(x.shape, np.shape(e)), x.dtype)
    out.real, out.imag = np.ldexp(x.real, e), np.ldexp(x.imag, e)
    return out


def _axes(x: np.ndarray, axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(a % x.ndim for a in axes)


def unit_scale(x, axes: tuple[int, ...] = (-2, -1)) -> tuple[np.ndarray, np.ndarray]:
    """``(x * 2^-E, E)``: each matrix of ``x`` (float64 or complex128; ``axes`` its matrix axes) times
    the power of two that brings its largest real or imaginary part to [0.5, 1), and ``E`` per
    matrix. Exact (a power of two moves only the exponent) unless entries far below the largest sink
    into subnormals, which moves them by less than ``2^-1074`` of the largest. Zero, empty and
    non-finite matrices keep ``E = 0``."""
    x = np.asarray(x)
    e = _exponent(x, axes)
    return _ldexp(x, np.expand_dims(-e, _axes(x, axes))), e


# Norms between 2^-SAFE_EXPONENT and 2^SAFE_EXPONENT (or 0): the ratio's products and sums stay far
# inside float64's range unscaled, so :func:`unit_scale`'s copies are made only where some is not.
SAFE_EXPONENT = 256


def _safe(norm: np.ndarray) -> bool:
    """Every norm is 0 or within 2^+-SAFE_EXPONENT (False for NaN and inf)."""
    tiny, huge = 2.0 ** -SAFE_EXPONENT, 2.0 ** SAFE_EXPONENT
    return bool(((norm == 0) | ((norm >= tiny) & (norm <= huge))).all())


def _square(a: np.ndarray, what: str) -> int:
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise InputError(f"Expected {what} of shape (..., n, n). Got shape {a.shape} instead.")
    return a.shape[-1]


def _same_shape(a: np.ndarray, other: np.ndarray, what: str) -> None:
    if other.shape != a.shape:
        raise InputError(f"Expected {what} of shape {a.shape} (that of a). Got shape {other.shape} instead.")


def _permutation(piv: np.ndarray, n: int) -> np.ndarray:
    """Row permutation ``perm`` (..., n) with ``(P A)[i] = A[perm[i]]`` from LAPACK-style 0-based ``piv``.

    Loops over the n interchanges only; each step is vectorised over the batch.
    """
    if piv.size and (piv.min() < 0 or piv.max() >= n):
        raise InputError(f"Expected piv values in [0, {n}). Got values in "
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
    ``A`` gives 0 if ``L U`` is exactly zero too, else ``1/eps``. ``A`` and ``U`` are scaled by the
    power of two of ``A`` (``L`` is scale-free).
    """
    a, lu, piv = np.asarray(a), np.asarray(lu), np.asarray(piv)
    n = _square(a, "a")
    _same_shape(a, lu, "lu")
    if piv.shape != a.shape[:-1]:
        raise InputError(f"Expected piv of shape {a.shape[:-1]}. Got shape {piv.shape} instead.")
    eps = _eps(a, lu)
    if n == 0:
        return np.zeros(a.shape[:-2])
    a64, lu64 = _wide(a), _wide(lu)
    perm = _permutation(piv, n)
    with np.errstate(all="ignore"):
        anorm, upper = _norm1(a64), np.triu(lu64)
        if not _safe(anorm):   # near the ends of float64's range (or not finite): scaled
            a64, e = unit_scale(a64)
            anorm, upper = _norm1(a64), _ldexp(upper, -e[..., None, None])
        pa = np.take_along_axis(a64, perm[..., :, None], axis=-2)
        lower = np.tril(lu64, -1) + np.eye(n, dtype=lu64.dtype)
        resid = _norm1(lower @ upper - pa)
        ratio = resid / n / anorm / eps
    ratio = np.where(anorm == 0, np.where(resid == 0, 0.0, 1.0 / eps), ratio)
    return np.where(np.isfinite(anorm) & np.isfinite(resid), ratio, np.nan)


def get02(a, x, b) -> np.ndarray:
    """``max_j ||b_j - A x_j||_1 / (||A||_1 ||x_j||_1 eps)`` per matrix (LAPACK ``xGET02``), ``eps``
    that of ``x``: the precision the solve was done in (float64 for a float32 A with float64 b, or
    the other way round), not the least precise of the three.

    ``x`` and ``b`` are (..., n) for one right-hand side or (..., n, k) for k of them. A zero ``A`` or a
    zero column of ``x`` gives ``1/eps``; no right-hand side (k = 0) or n = 0 gives 0. ``A`` and each
    column ``x_j`` are scaled by their powers of two, ``b_j`` by the product of the two.
    """
    a, x, b = np.asarray(a), np.asarray(x), np.asarray(b)
    n = _square(a, "a")
    if x.shape != b.shape:
        raise InputError(f"Expected x of shape {b.shape} (that of b). Got shape {x.shape} instead.")
    if x.shape == a.shape[:-1]:
        x, b = x[..., None], b[..., None]
    elif x.ndim != a.ndim or x.shape[:-1] != a.shape[:-1]:
        raise InputError(f"Expected b of shape {a.shape[:-1]} or {a.shape[:-1] + ('k',)}. "
                         f"Got shape {b.shape} instead.")
    _eps(a, b)  # their dtypes checked
    eps = _eps(x)
    if n == 0 or x.shape[-1] == 0:
        return np.zeros(a.shape[:-2])
    a64, x64, b64 = _wide(a), _wide(x), _wide(b)
    with np.errstate(all="ignore"):
        anorm, xnorm = _norm1(a64)[..., None], np.abs(x64).sum(axis=-2)   # (..., 1), (..., k)
        if not (_safe(anorm) and _safe(xnorm)):   # near the ends of float64's range (or not finite)
            a64, ea = unit_scale(a64)
            x64, ex = unit_scale(x64, (-2,))   # (..., k): one power of two per column
            b64 = _ldexp(b64, -(ea[..., None] + ex)[..., None, :])   # b far off A x: inf or 0, failing
            anorm, xnorm = _norm1(a64)[..., None], np.abs(x64).sum(axis=-2)
        rnorm = np.abs(b64 - a64 @ x64).sum(axis=-2)  # (..., k)
        col = rnorm / anorm / xnorm / eps
    col = np.where((xnorm == 0) | (anorm == 0), 1.0 / eps, col)
    col = np.where(np.isfinite(anorm) & np.isfinite(xnorm) & np.isfinite(rnorm), col, np.nan)
    # A NaN column must not be hidden by max: np.max propagates NaN.
    return col.max(axis=-1)


def get03(a, ainv) -> np.ndarray:
    """``||I - AINV A||_1 / (n ||A||_1 ||AINV||_1 eps)`` per matrix (LAPACK ``xGET03``).

    A zero ``A`` or ``AINV`` gives ``1/eps``; n = 0 gives 0. ``A`` and ``AINV`` are scaled by their
    own powers of two, ``2^-Ea`` and ``2^-Ei``; ``I`` then by ``2^-(Ea+Ei)``.
    """
    a, ainv = np.asarray(a), np.asarray(ainv)
    n = _square(a, "a")
    _same_shape(a, ainv, "ainv")
    eps = _eps(a, ainv)
    if n == 0:
        return np.zeros(a.shape[:-2])
    a64, ainv64 = _wide(a), _wide(ainv)
    with np.errstate(all="ignore"):
        anorm, inorm, eye = _norm1(a64), _norm1(ainv64), np.eye(n)
        if not (_safe(anorm) and _safe(inorm)):   # near the ends of float64's range (or not finite)
            (a64, ea), (ainv64, ei) = unit_scale(a64), unit_scale(ainv64)
            anorm, inorm = _norm1(a64), _norm1(ainv64)
            # I * 2^-(Ea+Ei): 0 or inf only where ||A|| ||AINV|| is out of float64's range (failing)
            eye = np.where(np.eye(n, dtype=bool), np.ldexp(1.0, -(ea + ei))[..., None, None], 0.0)
        resid = _norm1(eye - ainv64 @ a64)
        ratio = resid * ((1.0 / anorm) / inorm) / eps / n
    ratio = np.where((anorm == 0) | (inorm == 0), 1.0 / eps, ratio)
    return np.where(np.isfinite(anorm) & np.isfinite(inorm) & np.isfinite(resid), ratio, np.nan)


class SlogdetRatios(NamedTuple):
    """Per-matrix ratios of :func:`slogdet_ratios` (float64, shape ``(...)``); each passes below 30."""

    logabsdet: np.ndarray
    sign: np.ndarray
    modulus: np.ndarray


def slogdet_ratios(a, sign, logabsdet) -> SlogdetRatios:
    """How far ``sign`` and ``logabsdet`` of each matrix of ``a`` are from the exact values, in units
    of the error a backward-stable LU in the precision of ``sign`` makes.

    The reference is LAPACK's LU of ``a`` in float64/complex128 (:func:`scipy.linalg.lu_factor`):
    ``log|det|`` is the sum of ``log|u_ii|`` and the sign the product of the phases of ``u_ii`` and the
    parity of the interchanges, so no product of pivots is formed and nothing overflows at any scale
    (matrices scaled by 1e300 or 1e-300 included). With ``eps`` that of ``sign``'s dtype:

    * ``logabsdet``: ``|logabsdet - ref| / (eps (max(n, L) + kappa))``;
    * ``sign``: ``|sign - ref_sign| / (eps (n + kappa))``;
    * ``modulus``: a real sign must be exactly +-1 (else ``1/eps``); a complex one
      ``||sign| - 1| / (n eps)``.

    Where the units come from. Rounding the ``n`` logarithms ``log|u_ii|`` and adding them errs by
    about ``eps * L``, ``L = sum_i |log|u_ii||`` (``n`` products of unit phases: ``n eps`` for the
    sign); ``max(n, L)`` keeps the unit at least ``n eps``, and makes it follow the scale of the matrix.
    The LU itself is exact for a nearby ``A + dA``, ``|dA_ij|`` of order ``eps |a_ij|``, which moves
    ``log det`` (real part: ``log|det|``, imaginary part: the phase of the sign) by
    ``tr(A^-1 dA) = sum_ij (A^-1)_ji dA_ij``; with errors of independent signs that is about
    ``eps * kappa``, ``kappa = ||A o A^-T||_F`` (entrywise product). ``kappa`` is ``sqrt(n)`` for a
    diagonal matrix and below ``n`` for a random well-conditioned one; it grows with ``||A^-1||`` as
    the matrix nears singularity (for a dense one, to about ``max|a_ij| / sigma_min``), so the
    condition of ``A`` matters only there. A wrong real sign
    (ratio ``2 / (eps (n + kappa))``), a complex sign off by a right angle, or ``logabsdet`` off by
    ``100 n eps`` all give ratios far above 30 for any matrix that is not near-singular.

    Where the float64 reference finds ``a`` exactly singular, ``kappa`` is infinite and any finite
    result passes the two first ratios (the modulus is still checked). NaN or Inf in ``a`` or the
    results gives NaN or Inf; ``n = 0`` expects sign 1 and logabsdet 0, as :func:`numpy.linalg.slogdet`.
    """
    import scipy.linalg

    a, sign, logabsdet = np.asarray(a), np.asarray(sign), np.asarray(logabsdet)
    n = _square(a, "a")
    batch = a.shape[:-2]
    for what, x in (("sign", sign), ("logabsdet", logabsdet)):
        if x.shape != batch:
            raise InputError(f"Expected {what} of shape {batch}. Got shape {x.shape} instead.")
    eps = _eps(sign)
    count = int(np.prod(batch, dtype=np.int64))
    a64 = _wide(a).reshape((count, n, n))
    ref_sign = np.ones(count, a64.dtype)
    ref_log, scale, kappa = np.zeros(count), np.zeros(count), np.zeros(count)
    if count:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", scipy.linalg.LinAlgWarning)
            # Each matrix brought to a largest entry in [0.5, 1) by a power of two 2^-E (exact), the
            # log of its determinant then shifted back by n E log 2: near 1e-308 U's diagonal would
            # be subnormal (its digits lost) and the inverse for kappa (scale-free) infinite.
            a_s, big = unit_scale(a64)
            lu, piv = scipy.linalg.lu_factor(a_s, check_finite=False)
            u = np.diagonal(lu, axis1=-2, axis2=-1)
            mag = np.abs(u)
            logs = np.log(mag) + (big * np.log(2.0))[:, None]
            ref_log, scale = logs.sum(-1), np.abs(logs).sum(-1)
            swaps = np.count_nonzero(piv != np.arange(n), axis=-1)
            ref_sign = np.prod(u / np.where(mag == 0, 1, mag), axis=-1) * np.where(swaps % 2, -1, 1)
            ref_sign = np.where((mag == 0).any(-1), 0, ref_sign)
            kappa = np.full(count, np.inf)
            regular = np.isfinite(a64).all(axis=(-2, -1)) & (mag != 0).all(-1)
            if regular.any():
                ar = a_s[regular]
                ainv = np.linalg.inv(ar)
                kappa[regular] = np.sqrt((np.abs(ar * np.swapaxes(ainv, -1, -2)) ** 2).sum(axis=(-2, -1)))
            kappa = np.where(np.isnan(u).any(-1), np.nan, kappa)
    sign64, log64 = _wide(sign).reshape(-1), logabsdet.astype(np.float64).reshape(-1)
    with np.errstate(all="ignore"):
        d_log = np.where(log64 == ref_log, 0.0, np.abs(log64 - ref_log))  # equal infinities: 0
        d_sign = np.abs(sign64 - ref_sign)
        r_log = d_log / (eps * (np.maximum(max(n, 1), scale) + kappa))
        r_sign = d_sign / (eps * (max(n, 1) + kappa))
        loose = np.isinf(kappa)  # exactly singular in float64: any finite value is a backward-stable one
        r_log = np.where(loose & np.isfinite(log64), 0.0, r_log)
        r_sign = np.where(loose & np.isfinite(sign64), 0.0, r_sign)
        if sign.dtype.kind == "c":
            modulus = np.abs(np.abs(sign64) - 1) / (max(n, 1) * eps)
        else:
            modulus = np.where(np.abs(sign64) == 1, 0.0, np.where(np.isnan(sign64), np.nan, 1 / eps))
    return SlogdetRatios(*(r.reshape(batch) for r in (r_log, r_sign, modulus)))
