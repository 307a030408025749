"""Compiled batched loops (numba) for the CPU backend: one nopython loop over a range of the batch per op.

Each kernel takes its outputs from the caller and works on the matrices ``lo .. hi - 1`` of the
batch with the GIL released (``nogil``), so ``batchlu.kernels._cpu`` splits a batch between threads
by handing each a range (``batchlu.kernels._cpu_threads``). Per matrix, a kernel

1. copies the matrix, transposed, into a column-major scratch buffer ``f`` (LAPACK's layout, so
   that LAPACK factors the matrix itself and not its transpose), checking on the way that it is
   finite (-1 otherwise: NaN results, identity ``piv``);
2. factors it in ``f``: with LAPACK's ``xGETRF`` through SciPy's ``cython_lapack`` function pointers
   (the ``_lapack`` kernels, for large n: ``lu`` and ``piv`` bit-identical to
   ``scipy.linalg.lu_factor``), or with :func:`_getf2` below, LAPACK's unblocked ``xGETF2`` compiled
   here (the ``_own`` kernels, for small n, where a LAPACK call costs more than the arithmetic; also
   the fallback, in the ``_lapack`` kernels, for the matrices OpenBLAS would get wrong, see
   ``batchlu.kernels._cpu._screen``);
3. sets ``info`` from the first exactly zero pivot and finishes the op from the factors: ``xGETRI`` /
   ``xGETRS`` after LAPACK's factorization, the compiled substitutions of :func:`_substitute`
   (``xGETRS``'s algorithm) otherwise.

Compiled at first use per dtype (``cache=True``: later processes load the machine code from numba's
cache), never at import of ``batchlu``. LAPACK's routines enter as first-class function arguments,
not as globals, so the compiled code does not embed their addresses and can be cached.
"""

from __future__ import annotations

import numba.experimental.function_type  # noqa: F401  (registers first-class function types)
import numpy as np
from numba import njit, types
from numba.extending import get_cython_function_address

from . import _cpu_threads
from ._cpu_lapack import one_blas_thread
from ._info import INFO_NONFINITE_INPUT, INFO_NONFINITE_RESULT

__all__ = ["getrf", "getrs", "huge_pivot", "huge_quotient", "inv", "lapack", "slogdet", "solve", "store_slogdet"]

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
    """A ``scipy.linalg.cython_lapack`` (or ``cython_blas``) routine as a numba first-class function
    (the address is read at run time, so compiled code that calls it stays cacheable)."""

    def __init__(self, name: str, signature, module: str = "scipy.linalg.cython_lapack"):
        self._address = get_cython_function_address(module, name)
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


_BLAS_SIGNATURES = {
    # (transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
    "gemm": types.void(*([_vp] * 13)),
    # (side, uplo, transa, diag, m, n, alpha, a, lda, b, ldb)
    "trsm": types.void(*([_vp] * 11)),
}


def blas(dtype, name: str) -> _LapackFunction:
    """``?gemm`` / ``?trsm`` (real ``dtype``) from ``scipy.linalg.cython_blas``."""
    key = (np.dtype(dtype), "blas-" + name)
    if key not in _LAPACK:
        _LAPACK[key] = _LapackFunction(_PREFIX[key[0]] + name, _BLAS_SIGNATURES[name], "scipy.linalg.cython_blas")
    return _LAPACK[key]


_jit = njit(cache=True, nogil=True, error_model="numpy")
_inline = njit(cache=True, nogil=True, error_model="numpy", inline="always")


# --- one matrix, in column-major scratch: f[c, r] is entry (r, c) ------------------------------


@_inline
def _mag(x):
    """LAPACK's pivot size ``|re| + |im|`` (``IxAMAX``); ``|x|`` for real."""
    return abs(x.real) + abs(x.imag)


@_inline
def _finite(x):
    """``x`` (real or complex) holds no NaN or Inf (each part on its own: ``re + im`` could
    overflow)."""
    return (x.real - x.real) + (x.imag - x.imag) == 0.0


# numba divides complex numbers as CPython does (Smith's algorithm), forming |d|^2 / max(|re|, |im|):
# for a d with both parts nonzero and one above half the largest float64, that overflows and 1 / d
# comes out 0 (and x / d too): a whole column of L zero and U not eliminated, with finite factors.
# (1 / d of complex64 is formed in complex128: no overflow there.) A pivot with a part above a
# quarter of the largest float (a margin for rounding) divides instead, numerator and denominator
# scaled by 1/8 first (exact): Smith's denominator stays below a quarter of the largest float, so
# its reciprocal is normal and the quotient keeps its digits.
_BIG = float(np.finfo(np.float64).max) / 4


@_inline
def huge_pivot(d):
    """``d`` is a complex number whose reciprocal numba's division may not form (see ``_BIG``);
    never for a real ``d``."""
    return d.imag != 0 and d.real != 0 and max(abs(d.real), abs(d.imag)) > _BIG


@_inline
def huge_quotient(x, d):
    """``x / d`` for a :func:`huge_pivot` ``d``."""
    return (x * 0.125) / (d * 0.125)


@_inline
def _check(ar, b, small):
    """Matrix ``b``, as the real parts (and imaginary parts) in row ``b`` of ``ar``: (finite, fit
    for OpenBLAS: no nonzero part below ``small``). One contiguous pass of boolean and/or
    reductions, which the compiler vectorises (measured: 4x faster than checking complex entries
    while transposing them)."""
    finite = True
    tiny = False
    for t in range(ar.shape[1]):
        v = ar[b, t]
        finite &= v - v == 0.0
        m = abs(v)
        tiny |= (m < small) & (m != 0.0)
    return finite, not tiny


_TILE = 8   # transposed copies go tile by tile: a 128 x 128 float64 matrix does not fit in L1


@_inline
def _load(a, b, f):
    """``f`` := matrix ``b`` of ``a`` transposed (column-major). Whole tiles of a constant size,
    which the compiler unrolls into vector shuffles (measured: 1.3-1.5x faster at n = 64-128
    than tiles cut at the matrix's edge), then the edge strips."""
    n = f.shape[0]
    m = n - n % _TILE
    for i0 in range(0, m, _TILE):
        for j0 in range(0, m, _TILE):
            for i in range(_TILE):
                for j in range(_TILE):
                    f[j0 + j, i0 + i] = a[b, i0 + i, j0 + j]
    for i in range(n):
        for j in range(m, n):
            f[j, i] = a[b, i, j]
    for i in range(m, n):
        for j in range(m):
            f[j, i] = a[b, i, j]


@_inline
def _store(f, out, b):
    """Matrix ``b`` of ``out`` := ``f`` transposed, tiled as :func:`_load`."""
    n = f.shape[0]
    m = n - n % _TILE
    for i0 in range(0, m, _TILE):
        for j0 in range(0, m, _TILE):
            for i in range(_TILE):
                for j in range(_TILE):
                    out[b, i0 + i, j0 + j] = f[j0 + j, i0 + i]
    for i in range(n):
        for j in range(m, n):
            out[b, i, j] = f[j, i]
    for i in range(m, n):
        for j in range(m):
            out[b, i, j] = f[j, i]


@_inline
def _row_finite(outr, b):
    """Row ``b`` of ``outr`` (a result's matrix as its real numbers) holds no NaN or Inf: one
    contiguous pass that the compiler vectorises, on a matrix just written (still in cache)."""
    finite = True
    for t in range(outr.shape[1]):
        v = outr[b, t]
        finite &= v - v == 0.0
    return finite


@_inline
def _load_checked(a, b, f):
    """:func:`_load` for small n (one pass, no tiles). Returns whether every entry is finite."""
    n = f.shape[0]
    finite = True
    for i in range(n):
        for j in range(n):
            x = a[b, i, j]
            f[j, i] = x
            finite &= _finite(x)
    return finite


@_inline
def _getf2(f, piv, sfmin):
    """LU with partial pivoting of the column-major ``f`` in place, 0-based ``piv``: LAPACK's
    ``xGETF2`` (the first largest ``|re| + |im|`` pivots; the column is scaled by the pivot's
    reciprocal, or divided by a pivot below ``sfmin`` or :func:`huge_pivot`; a zero pivot leaves its
    column, and goes on)."""
    n = f.shape[0]
    for j in range(n):
        p = j
        best = _mag(f[j, j])
        for i in range(j + 1, n):
            m = _mag(f[j, i])
            if m > best:
                best = m
                p = i
        piv[j] = p
        if p != j:
            for c in range(n):
                t = f[c, j]
                f[c, j] = f[c, p]
                f[c, p] = t
        if j + 1 == n:
            break
        pivot = f[j, j]
        if pivot != 0:
            if huge_pivot(pivot):
                for i in range(j + 1, n):
                    f[j, i] = huge_quotient(f[j, i], pivot)
            elif abs(pivot) >= sfmin:
                r = 1 / pivot
                for i in range(j + 1, n):
                    f[j, i] *= r
            else:
                for i in range(j + 1, n):
                    f[j, i] /= pivot
        for c in range(j + 1, n):
            u = f[c, j]
            for i in range(j + 1, n):
                f[c, i] -= f[j, i] * u


@_inline
def _pivots_finite(f):
    """Every pivot (diagonal entry) of the factors ``f`` is finite. An inverse or a solution from
    factors with an infinite pivot means nothing, even where it comes out finite (1 / inf is 0); an
    overflow elsewhere in the factors reaches the result as Inf or NaN, and there the result's own
    check flags it."""
    finite = True
    for i in range(f.shape[0]):
        finite &= _finite(f[i, i])
    return finite


@_inline
def _first_zero_pivot(f):
    """LAPACK's ``info``: 1 + the index of the first exactly zero diagonal entry, else 0."""
    for i in range(f.shape[0]):
        if f[i, i] == 0:
            return i + 1
    return 0


@_inline
def _own_getrf(a, b, f, piv, sfmin):
    """Matrix ``b`` of ``a`` factored by :func:`_getf2` in ``f``. Returns ``info`` (-1: not
    finite; ``f`` and ``piv`` then unset)."""
    if not _load_checked(a, b, f):
        return INFO_NONFINITE_INPUT
    _getf2(f, piv, sfmin)
    return _first_zero_pivot(f)


@_inline
def _lapack_getrf(fgetrf, a, ar, b, f, ipiv, piv, ni, status, small, sfmin, big):
    """Matrix ``b`` of ``a`` factored in ``f`` by LAPACK or, where OpenBLAS would get it wrong, by
    :func:`_getf2`: it loses subnormal intermediates (a nonzero part below ``small``, or a
    subnormal pivot in its ``U``), and a pivot with a part above ``big`` (:func:`_limits`: complex
    only) gets a zero reciprocal from it, as from numba's division (``_BIG``); 0-based
    ``piv``, and LAPACK's 1-based ones in ``ipiv`` when LAPACK's factors are kept. Returns (info,
    by LAPACK)."""
    n = f.shape[0]
    finite, fit = _check(ar, b, small)
    if not finite:
        return INFO_NONFINITE_INPUT, False
    _load(a, b, f)
    if fit:
        fgetrf(ni.ctypes, ni.ctypes, f.ctypes, ni.ctypes, ipiv.ctypes, status.ctypes)
        unsafe = False
        for i in range(n):
            piv[i] = ipiv[i] - 1
            d = _mag(f[i, i])              # |d| <= d < 2 |d|: the modulus only near sfmin
            if d != 0 and d < 2 * sfmin:
                unsafe |= abs(f[i, i]) < sfmin
            unsafe |= max(abs(f[i, i].real), abs(f[i, i].imag)) > big
        if not unsafe:
            return _first_zero_pivot(f), True
        _load(a, b, f)
    _getf2(f, piv, sfmin)
    return _first_zero_pivot(f), False


@_inline
def _substitute(f, piv, g, sfmin):
    """``g`` (k, n), right-hand sides as rows, := ``A^-1`` applied to each, from the factors in
    ``f`` and 0-based ``piv``: ``xGETRS``'s interchanges, unit-lower and upper solves, column by
    column (contiguous), skipping zeros in the first solve as ``xTRSM`` does. Diagonal entries at
    or above ``sfmin`` are applied as products with their reciprocals, :func:`huge_pivot` ones divide."""
    k, n = g.shape
    for c in range(k):
        for i in range(n):
            p = piv[i]
            if p != i:
                t = g[c, i]
                g[c, i] = g[c, p]
                g[c, p] = t
        for j in range(n):
            xj = g[c, j]
            if xj != 0:
                for i in range(j + 1, n):
                    g[c, i] -= xj * f[j, i]
        for j in range(n - 1, -1, -1):
            d = f[j, j]
            if huge_pivot(d):
                xj = huge_quotient(g[c, j], d)
            elif abs(d) >= sfmin:
                xj = g[c, j] * (1 / d)
            elif d == 0:   # a zero pivot: x / 0 as inf/NaN (numba's complex division would raise)
                xj = g[c, j] * np.inf
            else:
                xj = g[c, j] / d
            g[c, j] = xj
            for i in range(j):
                g[c, i] -= xj * f[j, i]


@_inline
def _invert(f, piv, y, sfmin):
    """``y`` (row-major) := ``A^-1`` from the factors in ``f`` and 0-based ``piv``, as ``xGETRI``:
    ``U^-1 L^-1``, then the interchanges undone on the columns, last first (~4/3 n^3 flops). Rows
    of ``y`` are updated whole (contiguous) with scalars of the factors."""
    n = f.shape[0]
    for i in range(n):                     # y = L^-1, unit lower triangular, row by row
        for c in range(n):
            y[i, c] = 0
        y[i, i] = 1
        for j in range(i):
            lij = f[j, i]
            for c in range(j + 1):
                y[i, c] -= lij * y[j, c]
    for i in range(n - 1, -1, -1):         # y = U^-1 y, bottom row first
        for j in range(i + 1, n):
            uij = f[j, i]
            for c in range(n):
                y[i, c] -= uij * y[j, c]
        d = f[i, i]
        if huge_pivot(d):
            for c in range(n):
                y[i, c] = huge_quotient(y[i, c], d)
        elif abs(d) >= sfmin:
            r = 1 / d
            for c in range(n):
                y[i, c] *= r
        else:
            for c in range(n):
                y[i, c] /= d
    for j in range(n - 2, -1, -1):
        p = piv[j]
        if p != j:
            for i in range(n):
                t = y[i, j]
                y[i, j] = y[i, p]
                y[i, p] = t


@_inline
def _log_det(f, piv):
    """(sign, log|det|) from factors with no zero pivot."""
    s = 1.0
    total = 0.0
    for i in range(f.shape[0]):
        d = f[i, i]
        m = abs(d)
        s = s * (d / m)
        total += np.log(m)
        if piv[i] != i:
            s = -s
    return s, total


# --- kernels over a range of the batch ----------------------------------------------------------
# Each op has two: ``_own`` (the compiled xGETF2 and substitutions) and ``_lapack`` (LAPACK through
# function pointers); the caller picks by n. Each matrix is worked on in scratch buffers allocated
# once per range (f: the factors; g: right-hand sides, column-major, or the inverse, row-major; ipiv: LAPACK's
# 1-based pivots; LAPACK's integer arguments as one-element arrays), and the kernel's own loop
# reads its inputs and writes its outputs by index. Measured at n = 2: handing an output view to a
# helper, or a branch to LAPACK, inside the small-n loop made it up to 2x slower (reference counts,
# and the compiler assuming that LAPACK may change the scratch buffers).
#
# getrf, inv, solve and slogdet apply ``batchlu.kernels._info``'s rule as they write their results: a
# finite input whose result is not finite gets INFO_NONFINITE_RESULT, and so does one whose pivots
# overflowed, for inv and solve (NaN results: 1 / inf is 0, and a finite result means nothing); for
# solve a right-hand side holding NaN or Inf makes the input non-finite (INFO_NONFINITE_INPUT, NaN
# x); the API then skips its own passes over the results (``_cpu.flags_results``).


@_jit
def _getrf_own(a, lu, lur, piv, info, sfmin, lo, hi):
    n = a.shape[-1]
    f = np.empty((n, n), a.dtype)
    p = np.empty(n, np.int32)
    for b in range(lo, hi):
        code = _own_getrf(a, b, f, p, sfmin)
        if code < 0:
            for i in range(n):
                piv[b, i] = i
                for j in range(n):
                    lu[b, i, j] = np.nan
        else:
            for i in range(n):
                piv[b, i] = p[i]
                for j in range(n):
                    lu[b, i, j] = f[j, i]
            if code == 0 and not _row_finite(lur, b):
                code = INFO_NONFINITE_RESULT
        info[b] = code


@_jit
def _getrf_lapack(fgetrf, a, ar, lu, lur, piv, info, small, sfmin, big, lo, hi):
    n = a.shape[-1]
    f = np.empty((n, n), a.dtype)
    p = np.empty(n, np.int32)
    ipiv = np.empty(n, np.int32)
    ni = np.full(1, n, np.int32)
    status = np.zeros(1, np.int32)
    for b in range(lo, hi):
        code, _ = _lapack_getrf(fgetrf, a, ar, b, f, ipiv, p, ni, status, small, sfmin, big)
        if code < 0:
            for i in range(n):
                piv[b, i] = i
                for j in range(n):
                    lu[b, i, j] = np.nan
        else:
            for i in range(n):
                piv[b, i] = p[i]
            _store(f, lu, b)
            if code == 0 and not _row_finite(lur, b):
                code = INFO_NONFINITE_RESULT
        info[b] = code


@_jit
def _inv_own(a, out, info, sfmin, lo, hi):
    n = a.shape[-1]
    f = np.empty((n, n), a.dtype)
    g = np.empty((n, n), a.dtype)
    piv = np.empty(n, np.int32)
    for b in range(lo, hi):
        code = _own_getrf(a, b, f, piv, sfmin)
        if code == 0 and not _pivots_finite(f):
            code = INFO_NONFINITE_RESULT
        if code == 0:
            _invert(f, piv, g, sfmin)
            finite = True
            for i in range(n):
                for j in range(n):
                    v = g[i, j]
                    out[b, i, j] = v
                    finite &= _finite(v)
            if not finite:
                code = INFO_NONFINITE_RESULT
        else:
            for i in range(n):
                for j in range(n):
                    out[b, i, j] = np.nan
        info[b] = code


@_jit
def _inv_lapack(fgetrf, fgetri, a, ar, out, outr, info, small, sfmin, big, lo, hi):
    n = a.shape[-1]
    f = np.empty((n, n), a.dtype)
    g = np.empty((n, n), a.dtype)
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
        code, by_lapack = _lapack_getrf(fgetrf, a, ar, b, f, ipiv, piv, ni, status, small, sfmin, big)
        if code == 0 and not _pivots_finite(f):
            code = INFO_NONFINITE_RESULT
        if code == 0:
            if by_lapack:
                fgetri(ni.ctypes, f.ctypes, ni.ctypes, ipiv.ctypes, work.ctypes, lwork.ctypes,
                       status.ctypes)
                _store(f, out, b)
                finite = _row_finite(outr, b)
            else:
                _invert(f, piv, g, sfmin)
                finite = True
                for i in range(n):
                    for j in range(n):
                        v = g[i, j]
                        out[b, i, j] = v
                        finite &= _finite(v)
            if not finite:
                code = INFO_NONFINITE_RESULT
        else:
            for i in range(n):
                for j in range(n):
                    out[b, i, j] = np.nan
        info[b] = code


@_inline
def store_slogdet(b, code, s, total, sign, logabsdet, info):
    """Write matrix ``b``'s slogdet from its factorization's ``code``: NaN for a non-finite input,
    sign 0 and log|det| -inf for a zero pivot, else ``s`` and ``total`` (its sign and log|det|),
    and -2 where those are not finite."""
    if code < 0:
        sign[b] = np.nan
        logabsdet[b] = np.nan
    elif code > 0:
        sign[b] = 0
        logabsdet[b] = -np.inf
    else:
        sign[b] = s
        logabsdet[b] = total
        if not (_finite(s) and _finite(total)):
            code = INFO_NONFINITE_RESULT
    info[b] = code


@_jit
def _slogdet_own(a, sign, logabsdet, info, sfmin, lo, hi):
    n = a.shape[-1]
    f = np.empty((n, n), a.dtype)
    piv = np.empty(n, np.int32)
    for b in range(lo, hi):
        code = _own_getrf(a, b, f, piv, sfmin)
        s, total = _log_det(f, piv) if code == 0 else (1.0, 0.0)
        store_slogdet(b, code, s, total, sign, logabsdet, info)


@_jit
def _slogdet_lapack(fgetrf, a, ar, sign, logabsdet, info, small, sfmin, big, lo, hi):
    n = a.shape[-1]
    f = np.empty((n, n), a.dtype)
    ipiv = np.empty(n, np.int32)
    piv = np.empty(n, np.int32)
    ni = np.full(1, n, np.int32)
    status = np.zeros(1, np.int32)
    for b in range(lo, hi):
        code, _ = _lapack_getrf(fgetrf, a, ar, b, f, ipiv, piv, ni, status, small, sfmin, big)
        s, total = _log_det(f, piv) if code == 0 else (1.0, 0.0)
        store_slogdet(b, code, s, total, sign, logabsdet, info)


@_jit
def _getrs_own(lu, piv, b, x, sfmin, lo, hi):
    n = lu.shape[-1]
    k = b.shape[-1]
    f = np.empty((n, n), lu.dtype)
    p = np.empty(n, np.int32)
    g = np.empty((k, n), lu.dtype)
    for m in range(lo, hi):
        _load(lu, m, f)
        for i in range(n):
            p[i] = piv[m, i]
            for c in range(k):
                g[c, i] = b[m, i, c]
        _substitute(f, p, g, sfmin)
        for i in range(n):
            for c in range(k):
                x[m, i, c] = g[c, i]


@_jit
def _getrs_lapack(fgetrs, lu, piv, b, x, sfmin, big, lo, hi):
    n = lu.shape[-1]
    k = b.shape[-1]
    f = np.empty((n, n), lu.dtype)
    g = np.empty((k, n), lu.dtype)
    p = np.empty(n, np.int32)
    ipiv = np.empty(n, np.int32)
    ni = np.full(1, n, np.int32)
    ki = np.full(1, k, np.int32)
    status = np.zeros(1, np.int32)
    trans = np.full(1, ord("N"), np.uint8)
    for m in range(lo, hi):
        _load(lu, m, f)
        unsafe = False     # a diagonal entry OpenBLAS's reciprocal gets wrong (see _lapack_getrf)
        for i in range(n):
            ipiv[i] = piv[m, i] + 1
            p[i] = piv[m, i]
            d = f[i, i]
            unsafe |= (d != 0 and abs(d) < sfmin) or max(abs(d.real), abs(d.imag)) > big
            for c in range(k):
                g[c, i] = b[m, i, c]
        if unsafe:
            _substitute(f, p, g, sfmin)
        else:
            fgetrs(trans.ctypes, ni.ctypes, ki.ctypes, f.ctypes, ni.ctypes, ipiv.ctypes, g.ctypes,
                   ni.ctypes, status.ctypes)
        for i in range(n):
            for c in range(k):
                x[m, i, c] = g[c, i]


@_jit
def _solve_own(a, b, x, info, sfmin, lo, hi):
    n = a.shape[-1]
    k = b.shape[-1]
    f = np.empty((n, n), a.dtype)
    piv = np.empty(n, np.int32)
    g = np.empty((k, n), a.dtype)
    for m in range(lo, hi):
        code = _own_getrf(a, m, f, piv, sfmin)
        finite = True
        for i in range(n):
            for c in range(k):
                v = b[m, i, c]
                g[c, i] = v
                finite &= _finite(v)
        if not finite:
            code = INFO_NONFINITE_INPUT
        if code == 0 and k > 0 and not _pivots_finite(f):
            code = INFO_NONFINITE_RESULT
        if code == 0:
            _substitute(f, piv, g, sfmin)
            for i in range(n):
                for c in range(k):
                    v = g[c, i]
                    x[m, i, c] = v
                    finite &= _finite(v)
            if not finite:
                code = INFO_NONFINITE_RESULT
        else:
            for i in range(n):
                for c in range(k):
                    x[m, i, c] = np.nan
        info[m] = code


@_jit
def _solve_lapack(fgetrf, fgetrs, a, ar, b, x, info, small, sfmin, big, lo, hi):
    n = a.shape[-1]
    k = b.shape[-1]
    f = np.empty((n, n), a.dtype)
    g = np.empty((k, n), a.dtype)
    ipiv = np.empty(n, np.int32)
    piv = np.empty(n, np.int32)
    ni = np.full(1, n, np.int32)
    ki = np.full(1, k, np.int32)
    status = np.zeros(1, np.int32)
    trans = np.full(1, ord("N"), np.uint8)
    for m in range(lo, hi):
        code, by_lapack = _lapack_getrf(fgetrf, a, ar, m, f, ipiv, piv, ni, status, small, sfmin, big)
        finite = True
        for i in range(n):
            for c in range(k):
                v = b[m, i, c]
                g[c, i] = v
                finite &= _finite(v)
        if not finite:
            code = INFO_NONFINITE_INPUT
        if code == 0 and k > 0 and not _pivots_finite(f):
            code = INFO_NONFINITE_RESULT
        if code == 0:
            if by_lapack:
                fgetrs(trans.ctypes, ni.ctypes, ki.ctypes, f.ctypes, ni.ctypes, ipiv.ctypes,
                       g.ctypes, ni.ctypes, status.ctypes)
            else:
                _substitute(f, piv, g, sfmin)
            for i in range(n):
                for c in range(k):
                    v = g[c, i]
                    x[m, i, c] = v
                    finite &= _finite(v)
            if not finite:
                code = INFO_NONFINITE_RESULT
        else:
            for i in range(n):
                for c in range(k):
                    x[m, i, c] = np.nan
        info[m] = code


# --- entry points: outputs from the caller, the batch split between threads ------------------


def _flat_real(a):
    """``a`` (B, n, n) as B rows of its real numbers (real and imaginary parts): a view."""
    return a.view(a.real.dtype).reshape(a.shape[0], -1)


def _limits(dtype):
    """``small`` (a matrix with a nonzero part below it stays away from OpenBLAS), ``sfmin``
    (LAPACK's safe minimum: a pivot below it divides instead of scaling by its reciprocal) and
    ``big`` (complex only: a pivot with a part above half the largest float gets a zero reciprocal
    from OpenBLAS, which forms |d|^2 / max(|re|, |im|) in the input's precision; a quarter, for a
    margin; inf for real)."""
    fi = np.finfo(dtype)
    big = float(fi.max) / 4 if np.dtype(dtype).kind == "c" else np.inf
    return float(fi.tiny / fi.eps), float(fi.tiny), big


def _run(own, lapack_kernel, routines, n: int, lapack_min_n: int, args_own, args_lapack) -> None:
    count = args_own[0].shape[0]
    if n >= lapack_min_n:
        with one_blas_thread():   # OpenBLAS's own threads would fight ours (and round otherwise)
            _cpu_threads.run(lapack_kernel, count, n, *routines, *args_lapack)
    else:
        _cpu_threads.run(own, count, n, *args_own)


def getrf(a, lu, piv, info, lapack_min_n: int) -> None:
    """``lu``, 0-based ``piv`` and ``info`` of every matrix of ``a`` (B, n, n); -2 where ``lu`` of a
    finite matrix is not finite."""
    small, sfmin, big = _limits(a.dtype)
    ar, lur = _flat_real(a), _flat_real(lu)
    _run(_getrf_own, _getrf_lapack, [lapack(a.dtype, "getrf")], a.shape[-1], lapack_min_n,
         (a, lu, lur, piv, info, sfmin), (a, ar, lu, lur, piv, info, small, sfmin, big))


def inv(a, out, info, lapack_min_n: int) -> None:
    """``out`` = the inverse of each matrix, NaN where ``info`` != 0; -2 where it is not finite."""
    small, sfmin, big = _limits(a.dtype)
    ar = _flat_real(a)
    _run(_inv_own, _inv_lapack, [lapack(a.dtype, "getrf"), lapack(a.dtype, "getri")], a.shape[-1],
         lapack_min_n, (a, out, info, sfmin), (a, ar, out, _flat_real(out), info, small, sfmin, big))


def slogdet(a, sign, logabsdet, info, lapack_min_n: int) -> None:
    """Sign and log|det| of each matrix (0 / -inf where singular, NaN where not finite)."""
    small, sfmin, big = _limits(a.dtype)
    ar = _flat_real(a)
    _run(_slogdet_own, _slogdet_lapack, [lapack(a.dtype, "getrf")], a.shape[-1], lapack_min_n,
         (a, sign, logabsdet, info, sfmin), (a, ar, sign, logabsdet, info, small, sfmin, big))


def getrs(lu, piv, b, x, lapack_min_n: int) -> None:
    """``x`` (B, n, k) with ``A x = b`` from ``getrf``'s ``lu`` and 0-based ``piv``."""
    _run(_getrs_own, _getrs_lapack, [lapack(lu.dtype, "getrs")], lu.shape[-1], lapack_min_n,
         (lu, piv, b, x, _limits(lu.dtype)[1]), (lu, piv, b, x, *_limits(lu.dtype)[1:]))


def solve(a, b, x, info, lapack_min_n: int) -> None:
    """``x`` (B, n, k) with ``a x = b``, NaN where ``info`` != 0; ``info`` -1 also where ``b`` holds
    NaN or Inf, -2 where ``x`` is not finite."""
    small, sfmin, big = _limits(a.dtype)
    ar = _flat_real(a)
    _run(_solve_own, _solve_lapack, [lapack(a.dtype, "getrf"), lapack(a.dtype, "getrs")], a.shape[-1],
         lapack_min_n, (a, b, x, info, sfmin), (a, ar, b, x, info, small, sfmin, big))
