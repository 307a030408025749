"""LAPACK's blocked right-looking LU and its triangular solves re-written in NumPy, vectorised over
the batch: the NumPy engine's path for small n (``batchlu.kernels._cpu`` picks it below
``NUMPY_LAPACK_MIN_N``; the CPU backend's fallback where numba is not importable).

Every step works on the whole batch at once: the Python loops run over the n columns (and over blocks
of columns), never over matrices, so a batch of tiny matrices costs a few NumPy calls per column
instead of one LAPACK call (microseconds of Python each) per matrix. Panels are factored column by
column exactly as LAPACK's ``xGETF2`` does (pivot = first entry of largest ``|re| + |im|``, as
``IxAMAX``; scale by the reciprocal of the pivot unless it is tiny or :func:`huge`; a zero pivot leaves its column
unscaled and the factorization goes on), and trailing matrices are updated with batched matrix
products. The order of the floating-point operations differs from the LAPACK library SciPy links,
so ``lu`` agrees with SciPy's to rounding, and ``piv`` agrees exactly unless two pivot candidates tie
to within that rounding.

Arrays come from ``batchlu.kernels._cpu``: C-contiguous, finite, one batch axis.
"""

from __future__ import annotations

import numpy as np

__all__ = ["factor", "huge", "substitute"]

_PANEL = 16   # columns per panel: trailing updates are batched products of this depth


def _magnitude(x: np.ndarray) -> np.ndarray:
    """LAPACK's pivot size: ``|x|`` for real, ``|re| + |im|`` for complex (``IxAMAX``)."""
    if x.dtype.kind == "c":
        return np.abs(x.real) + np.abs(x.imag)
    return np.abs(x)


def huge(d: np.ndarray) -> np.ndarray:
    """Elementwise: a complex ``d`` with both parts nonzero and one above a quarter of the largest
    float. NumPy's complex division (Smith's algorithm; OpenBLAS's reciprocal of a pivot alike)
    forms ``|d|^2 / max(|re|, |im|)``, which overflows from half the largest float on (a quarter
    leaves a margin for rounding): ``1 / d`` and ``x / d`` come out 0. Always False for real ``d``."""
    if d.dtype.kind != "c":
        return np.zeros(d.shape, bool)
    quarter = np.finfo(d.dtype).max / 4
    return (np.maximum(np.abs(d.real), np.abs(d.imag)) > quarter) & (d.real != 0) & (d.imag != 0)


def _divide(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """``x / d``, elementwise with broadcasting. NumPy's complex division forms ``1 / |d|``-sized
    intermediates, which overflow for a ``d`` below sfmin (subnormal) even where the quotient is
    small, and ``|d|^2``-sized ones, which overflow for a :func:`huge` ``d``: there numerator and
    denominator are first scaled by one power of two (exact), 2^64 in single precision, 2^128 in
    double, which brings any nonzero ``d`` into the normal range; 1/8 for a huge ``d``, which keeps
    the reciprocal of Smith's denominator normal."""
    if x.dtype.kind != "c":
        return x / d
    real = np.finfo(x.dtype)
    tiny = np.abs(d) < real.tiny
    big = huge(d)
    if not (tiny.any() or big.any()):
        return x / d
    scale = np.where(tiny, real.dtype.type(2.0 ** (64 if real.bits == 32 else 128)),
                     np.where(big, real.dtype.type(0.125), real.dtype.type(1)))
    return (x * scale) / (d * scale)


def _mul(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``x * y``, elementwise with broadcasting, each element rounded alone. NumPy's complex multiply
    rounds a product differently by where it falls in the array (its vector loops, taken for some
    strides and lengths, fuse a multiply and an add), so a matrix's factors would depend on the
    matrices batched with it; real products and sums round each element alone, whatever the loop."""
    if x.dtype.kind != "c" and y.dtype.kind != "c":
        return x * y
    out = np.empty(np.broadcast_shapes(x.shape, y.shape), np.result_type(x, y))
    out.real = x.real * y.real - x.imag * y.imag
    out.imag = x.real * y.imag + x.imag * y.real
    return out


def factor(a: np.ndarray, piv: np.ndarray) -> None:
    """LU of every matrix of ``a`` (B, n, n) in place, 0-based pivots into ``piv`` (B, n)."""
    n = a.shape[-1]
    sfmin = np.finfo(a.dtype).tiny
    for k0 in range(0, n, _PANEL):
        k1 = min(n, k0 + _PANEL)
        for j in range(k0, k1):
            p = j + np.argmax(_magnitude(a[:, j:, j]), axis=1)
            piv[:, j] = p
            swap = np.flatnonzero(p != j)
            if swap.size:
                pr = p[swap]
                row_j = a[swap, j, :].copy()
                a[swap, j, :] = a[swap, pr, :]
                a[swap, pr, :] = row_j
            if j + 1 == n:
                break
            pivot = a[:, j, j]
            # A zero pivot means the whole column below is zero: it stays unscaled, as in LAPACK.
            safe = np.where(pivot == 0, 1, pivot)[:, None]
            col = a[:, j + 1:, j]
            tiny = (np.abs(pivot) < sfmin) | huge(pivot)     # these divide: 1 / pivot would not do
            if tiny.any():
                col[...] = np.where(tiny[:, None], _divide(col, safe), _mul(col, 1 / safe))
            else:
                col[...] = _mul(col, 1 / safe)
            # Rank-1 update of the rest of the panel only; rows move whole, so the swaps reach
            # the columns right of the panel as LAPACK's xLASWP would apply them afterwards.
            a[:, j + 1:, j + 1:k1] -= _mul(col[:, :, None], a[:, j, None, j + 1:k1])
        if k1 < n:
            # U12 = L11^-1 A12 (unit lower triangular solve), then the trailing update.
            for j in range(k0, k1 - 1):
                a[:, j + 1:k1, k1:] -= _mul(a[:, j + 1:k1, j, None], a[:, j, None, k1:])
            a[:, k1:, k1:] -= a[:, k1:, k0:k1] @ a[:, k0:k1, k1:]


def _permutation(piv: np.ndarray) -> np.ndarray:
    """Row order ``perm`` (B, n) with ``(P b)[i] = b[perm[i]]`` from LAPACK's interchanges ``piv``."""
    count, n = piv.shape
    perm = np.broadcast_to(np.arange(n), (count, n)).copy()
    rows = np.arange(count)
    for i in range(n):
        j = piv[:, i]
        perm[rows, i], perm[rows, j] = perm[rows, j], perm[rows, i]
    return perm


def _triangular(lu: np.ndarray, x: np.ndarray) -> None:
    """Overwrite ``x`` (B, n, k) with ``U^-1 L^-1 x`` (unit L), blocked like LAPACK's ``xTRSM``."""
    n = lu.shape[-1]
    for k0 in range(0, n, _PANEL):
        k1 = min(n, k0 + _PANEL)
        if k0:
            x[:, k0:k1] -= lu[:, k0:k1, :k0] @ x[:, :k0]
        for i in range(k0, k1 - 1):
            x[:, i + 1:k1] -= _mul(lu[:, i + 1:k1, i, None], x[:, i, None])
    for k1 in range(n, 0, -_PANEL):
        k0 = max(0, k1 - _PANEL)
        if k1 < n:
            x[:, k0:k1] -= lu[:, k0:k1, k1:] @ x[:, k1:]
        for i in range(k1 - 1, k0 - 1, -1):
            x[:, i] = _divide(x[:, i], lu[:, i, i, None])
            if i > k0:
                x[:, k0:i] -= _mul(lu[:, k0:i, i, None], x[:, i, None])


def substitute(lu: np.ndarray, piv: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``x`` (B, n, k) with ``A x = b`` from ``factor``'s ``lu`` and ``piv`` (``xGETRS``)."""
    perm = _permutation(piv.astype(np.intp))
    x = np.take_along_axis(b.astype(lu.dtype), perm[:, :, None], axis=1)
    _triangular(lu, x)
    return x
