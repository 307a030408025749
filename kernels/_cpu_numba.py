"""Compiled batched loops (numba) for the CPU backend: one nopython loop over a range of the batch per op.

Each kernel takes its outputs from the caller and works on the matrices ``lo .. hi - 1`` of the
batch, with the GIL released (``nogil``), so ``batchlu.kernels._cpu`` splits a batch between threads
by handing each a range. Per matrix, a kernel

1. copies the matrix into a work buffer and checks on the way that it is finite (-1 otherwise: NaN
   results, identity ``piv``) and whether LAPACK may factor it (no nonzero entry below
   ``tiny / eps``, see ``batchlu.kernels._cpu._screen``);
2. factors it: with LAPACK's ``xGETRF`` through SciPy's ``cython_lapack`` function pointers when
   ``n >= lapack_min_n`` (on a column-major copy: ``lu``/``piv`` bit-identical to
   ``scipy.linalg.lu_factor``), else with :func:`_getf2` below (LAPACK's unblocked ``xGETF2``, which is
   also the fallback for a LAPACK ``U`` with a subnormal pivot);
3. sets ``info`` from the first exactly zero pivot, and finishes the op from the factors: ``xGETRI``
   / ``xGETRS`` on the column-major copy on the LAPACK side, row-major substitutions on the other.

Compiled at first use per dtype (``cache=True``: later processes load the machine code from numba's
cache) and never at import of ``batchlu``. LAPACK functions enter as first-class function arguments,
not globals, so the compiled code does not embed their addresses and can be cached.
"""

from __future__ import annotations

import numba.experimental.function_type  # noqa: F401  (registers first-class function types)
import numpy as np
from numba import njit, types
from numba.extending import get_cython_function_address

from . import _cpu_threads
from ._info import INFO_NONFINITE_INPUT, INFO_NONFINITE_RESULT

__all__ = ["getrf", "getrs", "inv", "lapack", "slogdet", "solve"]

_vp = types.voidptr
_SIGNATURES = {
    # (m, n, a, lda, ipiv, info)
    "getrf": types.void(_vp, _vp, _vp, _vp, _vp, _vp),
    # (n, a, lda, ipiv, work, lwork, info)
    "getri": types.void(_vp, _vp, _vp, _vp, _vp, _vp, _vp),
    # (trans, n, nrhs, a, lda, ipiv, b, ldb, info)
    "getrs": types.void(_vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp),
}
_PREFIX = {np.dtype(np.float32): "s", np.dtype(np.float64): "d",
           np.dtype(np.complex64): "c", np.dtype(np.complex128): "z"}


class _LapackFunction(types.WrapperAddressProtocol):
    """A ``scipy.linalg.cython_lapack`` routine as a numba first-class function (the address is read
    at run time, so compiled code that calls it stays cacheable)."""

    def __init__(self, name: str, signature):
        self._address = get_cython_function_address("scipy.linalg.cython_lapack", name)
        self._signature = signature

    def __wrapper_address__(self):
        return self._address

    def signature(self):
        return self._signature


_LAPACK: dict = {}


def lapack(dtype, name: str) -> _LapackFunction:
    """``?getrf`` / ``?getri`` / ``?getrs`` for ``dtype``."""
    key = (np.dtype(dtype), name)
    if key not in _LAPACK:
        _LAPACK[key] = _LapackFunction(_PREFIX[key[0]] + name, _SIGNATURES[name])
    return _LAPACK[key]


_jit = njit(cache=True, nogil=True, error_model="numpy")
_inline = njit(cache=True, nogil=True, error_model="numpy", inline="always")


# --- one matrix -------------------------------------------------------------------------------


@_inline
def _mag(x):
    """LAPACK's pivot size ``|re| + |im|`` (``IxAMAX``); ``|x|`` for real."""
    return abs(x.real) + abs(x.imag)


@_inline
def _copy(a, w):
    """Copy ``a`` (n, n) into ``w``. Returns whether every entry is finite."""
    n = a.shape[0]
    nonfinite = 0.0
    for i in range(n):
        for j in range(n):
            x = a[i, j]
            w[i, j] = x
            nonfinite += (x.real + x.imag) * 0.0     # NaN once a part is NaN or Inf
    return nonfinite == 0.0


@_inline
def _copy_transposed(a, f, small):
    """Copy ``a`` (n, n) row-major into ``f`` as column-major (``f[j, i] = a[i, j]``: LAPACK sees
    ``a`` in ``f``). Returns (finite, fit for OpenBLAS: no nonzero part below ``small``)."""
    n = a.shape[0]
    nonfinite = 0.0
    least = np.inf
    for i in range(n):
        for j in range(n):
            x = a[i, j]
            f[j, i] = x
            re = abs(x.real)
            im = abs(x.imag)
            nonfinite += (re + im) * 0.0
            least = min(least, re if re != 0.0 else np.inf, im if im != 0.0 else np.inf)
    return nonfinite == 0.0, least >= small


@_inline
def _getf2(w, piv, sfmin):
    """LU with partial pivoting of ``w`` (n, n) row-major, in place; 0-based ``piv`` (LAPACK's
    ``xGETF2``: first largest ``|re| + |im|`` pivots, the column is scaled by the pivot's reciprocal
    unless the pivot is below ``sfmin``; a zero pivot leaves its column and goes on)."""
    n = w.shape[0]
    for j in range(n):
        p = j
        best = _mag(w[j, j])
        for i in range(j + 1, n):
            m = _mag(w[i, j])
            if m > best:
                best = m
                p = i
        piv[j] = p
        if p != j:
            for k in range(n):
                t = w[j, k]
                w[j, k] = w[p, k]
                w[p, k] = t
        if j + 1 == n:
            break
        pivot = w[j, j]
        if pivot != 0:
            if abs(pivot) >= sfmin:
                r = 1 / pivot
                for i in range(j + 1, n):
                    w[i, j] *= r
            else:
                for i in range(j + 1, n):
                    w[i, j] /= pivot
        for i in range(j + 1, n):
            lij = w[i, j]
            for k in range(j + 1, n):
                w[i, k] -= lij * w[j, k]


@_inline
def _first_zero_pivot(w):
    """LAPACK's ``info``: 1 + the index of the first exactly zero diagonal entry, else 0."""
    for i in range(w.shape[0]):
        if w[i, i] == 0:
            return i + 1
    return 0


@_inline
def _own_getrf(a, w, piv, sfmin):
    """``a`` copied into ``w`` and factored there by :func:`_getf2`. Returns ``info`` (-1: not
    finite, ``w`` and ``piv`` then unset)."""
    if not _copy(a, w):
        return -1
    _getf2(w, piv, sfmin)
    return _first_zero_pivot(w)


@_inline
def _lapack_getrf(fgetrf, a, w, f, ipiv, piv, ni, status, small, sfmin):
    """``a`` factored by LAPACK in the column-major ``f`` (``column_major`` True), or, where OpenBLAS
    would lose subnormal intermediates (a tiny entry, or a subnormal pivot in its ``U``), by
    :func:`_getf2` in the row-major ``w``. ``piv`` 0-based either way. Returns (info, column_major)."""
    n = a.shape[0]
    finite, fit = _copy_transposed(a, f, small)
    if not finite:
        return -1, False
    if fit:
        fgetrf(ni.ctypes, ni.ctypes, f.ctypes, ni.ctypes, ipiv.ctypes, status.ctypes)
        subnormal = False
        for i in range(n):
            piv[i] = ipiv[i] - 1
            d = abs(f[i, i])
            subnormal |= d != 0 and d < sfmin
        if not subnormal:
            return _first_zero_pivot(f), True
    return _own_getrf(a, w, piv, sfmin), False


@_inline
def _scale_row(x, i, d, sfmin):
    """``x[i, :] /= d``, as a product with ``1 / d`` unless ``|d| < sfmin`` (LAPACK's rule)."""
    if abs(d) >= sfmin:
        r = 1 / d
        for c in range(x.shape[1]):
            x[i, c] *= r
    else:
        for c in range(x.shape[1]):
            x[i, c] /= d


@_inline
def _substitute(w, piv, x, sfmin):
    """``x`` (n, k) := ``A^-1 x`` from the row-major factors ``w``, 0-based ``piv`` (``xGETRS``)."""
    n, k = x.shape
    for i in range(n):
        p = piv[i]
        if p != i:
            for c in range(k):
                t = x[i, c]
                x[i, c] = x[p, c]
                x[p, c] = t
    for i in range(1, n):
        for j in range(i):
            lij = w[i, j]
            for c in range(k):
                x[i, c] -= lij * x[j, c]
    for i in range(n - 1, -1, -1):
        for j in range(i + 1, n):
            uij = w[i, j]
            for c in range(k):
                x[i, c] -= uij * x[j, c]
        _scale_row(x, i, w[i, i], sfmin)


@_inline
def _invert(w, piv, x, sfmin):
    """``x`` (n, n) := ``A^-1`` from the row-major factors ``w``, 0-based ``piv``, as ``xGETRI``
    (``U^-1 L^-1``, then the interchanges undone on the columns, last first): ~4/3 n^3 flops."""
    n = w.shape[0]
    for i in range(n):                     # x = L^-1, unit lower triangular, row by row
        for c in range(n):
            x[i, c] = 0
        x[i, i] = 1
        for j in range(i):
            lij = w[i, j]
            for c in range(j + 1):
                x[i, c] -= lij * x[j, c]
    for i in range(n - 1, -1, -1):         # x = U^-1 x, bottom row first
        for j in range(i + 1, n):
            uij = w[i, j]
            for c in range(n):
                x[i, c] -= uij * x[j, c]
        _scale_row(x, i, w[i, i], sfmin)
    for j in range(n - 2, -1, -1):
        p = piv[j]
        if p != j:
            for i in range(n):
                t = x[i, j]
                x[i, j] = x[i, p]
                x[i, p] = t


@_inline
def _log_det(w, piv):
    """(sign, log|det|) from factors with no zero pivot (row- or column-major: the diagonal)."""
    s = 1.0
    total = 0.0
    for i in range(w.shape[0]):
        d = w[i, i]
        m = abs(d)
        s = s * (d / m)
        total += np.log(m)
        if piv[i] != i:
            s = -s
    return s, total


# --- kernels over a range of the batch ----------------------------------------------------------
# Each op has two: ``_own`` (the compiled xGETF2 and substitutions) and ``_lapack`` (LAPACK through
# function pointers); the caller picks by n. Each matrix is worked on in scratch buffers allocated
# once per range (w: row-major factors, f: column-major, LAPACK's; y: a result; ipiv: LAPACK's
# 1-based pivots; LAPACK's integer arguments as one-element arrays), and the kernel's own loop
# reads its input and writes its outputs by index. Measured at n = 2: handing an output view, or a
# branch to LAPACK, to the small-n loop made it up to 2x slower (reference counts and lost
# registers).
#
# inv, solve and slogdet apply ``batchlu.kernels._info``'s rule themselves as they write: a finite
# input whose result is not finite gets INFO_NONFINITE_RESULT, and for solve a right-hand side
# holding NaN or Inf makes the input non-finite (INFO_NONFINITE_INPUT, NaN x), so the API's
# separate passes over the results are skipped (``_cpu.flags_results``).


@_jit
def _getrf_own(a, lu, piv, info, sfmin, lo, hi):
    n = a.shape[-1]
    w = np.empty((n, n), a.dtype)
    p = np.empty(n, np.int32)
    for b in range(lo, hi):
        code = _own_getrf(a[b], w, p, sfmin)
        info[b] = code
        if code < 0:
            for i in range(n):
                piv[b, i] = i
                for j in range(n):
                    lu[b, i, j] = np.nan
        else:
            for i in range(n):
                piv[b, i] = p[i]
                for j in range(n):
                    lu[b, i, j] = w[i, j]


@_jit
def _getrf_lapack(fgetrf, a, lu, piv, info, small, sfmin, lo, hi):
    n = a.shape[-1]
    w = np.empty((n, n), a.dtype)
    f = np.empty((n, n), a.dtype)
    p = np.empty(n, np.int32)
    ipiv = np.empty(n, np.int32)
    ni = np.full(1, n, np.int32)
    status = np.zeros(1, np.int32)
    for b in range(lo, hi):
        code, column_major = _lapack_getrf(fgetrf, a[b], w, f, ipiv, p, ni, status, small, sfmin)
        info[b] = code
        if code < 0:
            for i in range(n):
                piv[b, i] = i
                for j in range(n):
                    lu[b, i, j] = np.nan
        else:
            for i in range(n):
                piv[b, i] = p[i]
                for j in range(n):
                    lu[b, i, j] = f[j, i] if column_major else w[i, j]


@_jit
def _inv_own(a, out, info, sfmin, lo, hi):
    n = a.shape[-1]
    w = np.empty((n, n), a.dtype)
    y = np.empty((n, n), a.dtype)
    piv = np.empty(n, np.int32)
    for b in range(lo, hi):
        code = _own_getrf(a[b], w, piv, sfmin)
        if code == 0:
            _invert(w, piv, y, sfmin)
            nonfinite = 0.0
            for i in range(n):
                for j in range(n):
                    v = y[i, j]
                    out[b, i, j] = v
                    nonfinite += (v.real + v.imag) * 0.0
            if nonfinite != 0.0:
                code = INFO_NONFINITE_RESULT
        else:
            for i in range(n):
                for j in range(n):
                    out[b, i, j] = np.nan
        info[b] = code


@_jit
def _inv_lapack(fgetrf, fgetri, a, out, info, small, sfmin, lo, hi):
    n = a.shape[-1]
    f = np.empty((n, n), a.dtype)
    w = np.empty((n, n), a.dtype)
    y = np.empty((n, n), a.dtype)
    ipiv = np.empty(n, np.int32)
    piv = np.empty(n, np.int32)
    ni = np.full(1, n, np.int32)
    status = np.zeros(1, np.int32)
    lwork = np.full(1, -1, np.int32)
    work = np.empty(1, a.dtype)
    # workspace query, as scipy's getri_lwork
    fgetri(ni.ctypes, f.ctypes, ni.ctypes, ipiv.ctypes, work.ctypes, lwork.ctypes, status.ctypes)
    lwork[0] = max(1, int(work[0].real))
    work = np.empty(lwork[0], a.dtype)
    for b in range(lo, hi):
        code, column_major = _lapack_getrf(fgetrf, a[b], w, f, ipiv, piv, ni, status, small, sfmin)
        if code == 0:
            if column_major:
                fgetri(ni.ctypes, f.ctypes, ni.ctypes, ipiv.ctypes, work.ctypes, lwork.ctypes,
                       status.ctypes)
            else:
                _invert(w, piv, y, sfmin)
            nonfinite = 0.0
            for i in range(n):
                for j in range(n):
                    v = f[j, i] if column_major else y[i, j]
                    out[b, i, j] = v
                    nonfinite += (v.real + v.imag) * 0.0
            if nonfinite != 0.0:
                code = INFO_NONFINITE_RESULT
        else:
            for i in range(n):
                for j in range(n):
                    out[b, i, j] = np.nan
        info[b] = code


@_jit
def _slogdet_own(a, sign, logabsdet, info, sfmin, lo, hi):
    n = a.shape[-1]
    w = np.empty((n, n), a.dtype)
    piv = np.empty(n, np.int32)
    for b in range(lo, hi):
        code = _own_getrf(a[b], w, piv, sfmin)
        if code < 0:
            sign[b] = np.nan
            logabsdet[b] = np.nan
        elif code > 0:
            sign[b] = 0
            logabsdet[b] = -np.inf
        else:
            s, total = _log_det(w, piv)
            sign[b] = s
            logabsdet[b] = total
            if (s.real + s.imag + total) * 0.0 != 0.0:
                code = INFO_NONFINITE_RESULT
        info[b] = code


@_jit
def _slogdet_lapack(fgetrf, a, sign, logabsdet, info, small, sfmin, lo, hi):
    n = a.shape[-1]
    f = np.empty((n, n), a.dtype)
    w = np.empty((n, n), a.dtype)
    ipiv = np.empty(n, np.int32)
    piv = np.empty(n, np.int32)
    ni = np.full(1, n, np.int32)
    status = np.zeros(1, np.int32)
    for b in range(lo, hi):
        code, column_major = _lapack_getrf(fgetrf, a[b], w, f, ipiv, piv, ni, status, small, sfmin)
        if code < 0:
            sign[b] = np.nan
            logabsdet[b] = np.nan
        elif code > 0:
            sign[b] = 0
            logabsdet[b] = -np.inf
        else:
            s, total = _log_det(f if column_major else w, piv)
            sign[b] = s
            logabsdet[b] = total
            if (s.real + s.imag + total) * 0.0 != 0.0:
                code = INFO_NONFINITE_RESULT
        info[b] = code


@_jit
def _getrs_own(lu, piv, b, x, sfmin, lo, hi):
    n = lu.shape[-1]
    k = b.shape[-1]
    w = np.empty((n, n), lu.dtype)
    p = np.empty(n, np.int32)
    y = np.empty((n, k), lu.dtype)
    for m in range(lo, hi):
        for i in range(n):
            p[i] = piv[m, i]
            for j in range(n):
                w[i, j] = lu[m, i, j]
            for c in range(k):
                y[i, c] = b[m, i, c]
        _substitute(w, p, y, sfmin)
        for i in range(n):
            for c in range(k):
                x[m, i, c] = y[i, c]


@_jit
def _getrs_lapack(fgetrs, lu, piv, b, x, lo, hi):
    n = lu.shape[-1]
    k = b.shape[-1]
    f = np.empty((n, n), lu.dtype)
    g = np.empty((k, n), lu.dtype)
    ipiv = np.empty(n, np.int32)
    ni = np.full(1, n, np.int32)
    ki = np.full(1, k, np.int32)
    status = np.zeros(1, np.int32)
    trans = np.full(1, ord("N"), np.uint8)
    for m in range(lo, hi):
        for i in range(n):
            ipiv[i] = piv[m, i] + 1
            for j in range(n):
                f[j, i] = lu[m, i, j]
            for c in range(k):
                g[c, i] = b[m, i, c]
        fgetrs(trans.ctypes, ni.ctypes, ki.ctypes, f.ctypes, ni.ctypes, ipiv.ctypes, g.ctypes,
               ni.ctypes, status.ctypes)
        for i in range(n):
            for c in range(k):
                x[m, i, c] = g[c, i]


@_jit
def _solve_own(a, b, x, info, sfmin, lo, hi):
    n = a.shape[-1]
    k = b.shape[-1]
    w = np.empty((n, n), a.dtype)
    piv = np.empty(n, np.int32)
    y = np.empty((n, k), a.dtype)
    for m in range(lo, hi):
        code = _own_getrf(a[m], w, piv, sfmin)
        nonfinite = 0.0
        for i in range(n):
            for c in range(k):
                v = b[m, i, c]
                y[i, c] = v
                nonfinite += (v.real + v.imag) * 0.0
        if nonfinite != 0.0:
            code = INFO_NONFINITE_INPUT
        if code == 0:
            _substitute(w, piv, y, sfmin)
            for i in range(n):
                for c in range(k):
                    v = y[i, c]
                    x[m, i, c] = v
                    nonfinite += (v.real + v.imag) * 0.0
            if nonfinite != 0.0:
                code = INFO_NONFINITE_RESULT
        else:
            for i in range(n):
                for c in range(k):
                    x[m, i, c] = np.nan
        info[m] = code


@_jit
def _solve_lapack(fgetrf, fgetrs, a, b, x, info, small, sfmin, lo, hi):
    n = a.shape[-1]
    k = b.shape[-1]
    f = np.empty((n, n), a.dtype)
    w = np.empty((n, n), a.dtype)
    g = np.empty((k, n), a.dtype)
    y = np.empty((n, k), a.dtype)
    ipiv = np.empty(n, np.int32)
    piv = np.empty(n, np.int32)
    ni = np.full(1, n, np.int32)
    ki = np.full(1, k, np.int32)
    status = np.zeros(1, np.int32)
    trans = np.full(1, ord("N"), np.uint8)
    for m in range(lo, hi):
        code, column_major = _lapack_getrf(fgetrf, a[m], w, f, ipiv, piv, ni, status, small, sfmin)
        nonfinite = 0.0
        for i in range(n):
            for c in range(k):
                v = b[m, i, c]
                y[i, c] = v
                g[c, i] = v
                nonfinite += (v.real + v.imag) * 0.0
        if nonfinite != 0.0:
            code = INFO_NONFINITE_INPUT
        if code == 0:
            if column_major:
                fgetrs(trans.ctypes, ni.ctypes, ki.ctypes, f.ctypes, ni.ctypes, ipiv.ctypes,
                       g.ctypes, ni.ctypes, status.ctypes)
            else:
                _substitute(w, piv, y, sfmin)
            for i in range(n):
                for c in range(k):
                    v = g[c, i] if column_major else y[i, c]
                    x[m, i, c] = v
                    nonfinite += (v.real + v.imag) * 0.0
            if nonfinite != 0.0:
                code = INFO_NONFINITE_RESULT
        else:
            for i in range(n):
                for c in range(k):
                    x[m, i, c] = np.nan
        info[m] = code


# --- entry points: outputs from the caller, the batch split between threads ------------------


def _limits(dtype):
    """``small`` (a matrix with a nonzero part below it stays away from OpenBLAS) and ``sfmin``
    (LAPACK's safe minimum: a pivot below it divides instead of scaling by its reciprocal)."""
    fi = np.finfo(dtype)
    return float(fi.tiny / fi.eps), float(fi.tiny)


def getrf(a, lu, piv, info, lapack_min_n: int) -> None:
    """``lu``, 0-based ``piv`` and ``info`` of every matrix of ``a`` (B, n, n)."""
    count, n = a.shape[0], a.shape[-1]
    small, sfmin = _limits(a.dtype)
    if n >= lapack_min_n:
        _cpu_threads.run(_getrf_lapack, count, n, lapack(a.dtype, "getrf"), a, lu, piv, info,
                         small, sfmin)
    else:
        _cpu_threads.run(_getrf_own, count, n, a, lu, piv, info, sfmin)


def inv(a, out, info, lapack_min_n: int) -> None:
    """``out`` = the inverse of each matrix, NaN where ``info`` != 0."""
    count, n = a.shape[0], a.shape[-1]
    small, sfmin = _limits(a.dtype)
    if n >= lapack_min_n:
        _cpu_threads.run(_inv_lapack, count, n, lapack(a.dtype, "getrf"), lapack(a.dtype, "getri"),
                         a, out, info, small, sfmin)
    else:
        _cpu_threads.run(_inv_own, count, n, a, out, info, sfmin)


def slogdet(a, sign, logabsdet, info, lapack_min_n: int) -> None:
    """Sign and log|det| of each matrix (0 / -inf where singular, NaN where not finite)."""
    count, n = a.shape[0], a.shape[-1]
    small, sfmin = _limits(a.dtype)
    if n >= lapack_min_n:
        _cpu_threads.run(_slogdet_lapack, count, n, lapack(a.dtype, "getrf"), a, sign, logabsdet,
                         info, small, sfmin)
    else:
        _cpu_threads.run(_slogdet_own, count, n, a, sign, logabsdet, info, sfmin)


def getrs(lu, piv, b, x, lapack_min_n: int) -> None:
    """``x`` (B, n, k) with ``A x = b`` from ``getrf``'s ``lu`` and 0-based ``piv``."""
    count, n = lu.shape[0], lu.shape[-1]
    if n >= lapack_min_n:
        _cpu_threads.run(_getrs_lapack, count, n, lapack(lu.dtype, "getrs"), lu, piv, b, x)
    else:
        _cpu_threads.run(_getrs_own, count, n, lu, piv, b, x, _limits(lu.dtype)[1])


def solve(a, b, x, info, lapack_min_n: int) -> None:
    """``x`` (B, n, k) with ``a x = b``, NaN where ``info`` != 0."""
    count, n = a.shape[0], a.shape[-1]
    small, sfmin = _limits(a.dtype)
    if n >= lapack_min_n:
        _cpu_threads.run(_solve_lapack, count, n, lapack(a.dtype, "getrf"), lapack(a.dtype, "getrs"),
                         a, b, x, info, small, sfmin)
    else:
        _cpu_threads.run(_solve_own, count, n, a, b, x, info, sfmin)
