"""Public entry points: check and normalise the arguments, then hand (B, n, n) arrays to a backend.

Backends (``_cpu`` for NumPy, ``_gpu`` for CuPy) implement the same five functions on arrays that are
already C-contiguous, of a supported dtype, with one flat batch axis:

    getrf(a)      -> lu (B,n,n), piv (B,n) int32, info (B,) int32
    getrs(lu, piv, b)  -> x (B,n,k)
    inv(a)        -> ainv (B,n,n), info (B,)
    solve(a, b)   -> x (B,n,k), info (B,)
    slogdet(a)    -> sign (B,), logabsdet (B,) real, info (B,)

with B >= 1 and n >= 1; empty batches and n = 0 are answered here. So is the one check every backend
shares (``batchlu.kernels._info``): a finite input whose result is not finite gets
``INFO_NONFINITE_RESULT`` (-2), and for ``solve`` a right-hand side holding NaN or Inf makes the input
non-finite (-1, all-NaN ``x``). A backend whose ``flags_results()`` is true applies that rule in its
own kernels for ``lu_factor``, ``inv``, ``solve`` and ``slogdet`` (the CPU's compiled engine, as it
writes each result), and the separate passes over the results are skipped.
"""

from __future__ import annotations

import numpy as np

from batchlu.errors import InputError, InputTypeError, LinAlgError

from . import _dask, _info
from ._validate import check_dtype, check_piv, check_rhs, check_square, is_cupy, refuse_masked


def _backend(*arrays):
    """Pick the backend from the array types, importing CuPy only when a CuPy array is given."""
    refuse_masked(*arrays)
    kinds = {is_cupy(x) for x in arrays}
    if len(kinds) > 1:
        raise InputTypeError("Expected all arrays to be NumPy arrays or all to be CuPy arrays. "
                             "Got a mix of both instead.")
    if kinds.pop():
        import cupy

        from . import _gpu
        return cupy, _gpu
    from . import _cpu
    return np, _cpu


def _as_array(x, xp):
    if xp is np:
        return np.asarray(x)
    return x


def _flat(x, xp, dtype, core: int):
    """C-contiguous copy-if-needed of ``x`` in ``dtype`` with the batch axes folded into one."""
    batch = x.shape[: x.ndim - core]
    size = int(np.prod(batch, dtype=np.int64)) if batch else 1
    return xp.ascontiguousarray(x.astype(dtype, copy=False).reshape((size,) + x.shape[x.ndim - core:]))


def _flags_results(backend) -> bool:
    """The backend's ``getrf`` / ``inv`` / ``solve`` / ``slogdet`` apply ``_info``'s rule themselves."""
    check = getattr(backend, "flags_results", None)
    return bool(check is not None and check())


def _raise_on_bad(info, batch, op: str) -> None:
    """``check=True``: raise LinAlgError naming the first matrix with info != 0 (syncs the device)."""
    host = info.get() if hasattr(info, "get") else np.asarray(info)
    bad = np.flatnonzero(host.reshape(-1) != 0)
    if bad.size:
        i = int(bad[0])
        index = np.unravel_index(i, batch) if batch else ()
        why = _info.describe(int(host.reshape(-1)[i]), rhs=op == "solve")
        raise LinAlgError(
            f"{op}: matrix at index {tuple(int(j) for j in index)} {why} "
            f"({int(bad.size)} bad matrices in the batch of {host.size}).")


def _stream_ctx(xp, stream):
    if stream is None or xp is np:
        import contextlib
        return contextlib.nullcontext()
    return stream


def _prepare_a(a, op):
    xp, backend = _backend(a)
    a = _as_array(a, xp)
    dtype = check_dtype(a.dtype, "a")
    n = check_square(a.shape, "a")
    return xp, backend, a, dtype, n, a.shape[:-2]


def _getrf(xp, backend, a, dtype, n, batch, stream, flag: bool):
    """``lu``, ``piv``, ``info`` shaped as ``a``; ``flag``: overflowed factors get -2 (else the
    factorization's own ``info``)."""
    if n == 0 or 0 in batch:
        return xp.empty(a.shape, dtype), xp.empty(batch + (n,), np.int32), xp.zeros(batch, np.int32)
    with _stream_ctx(xp, stream):
        lu, piv, info = backend.getrf(_flat(a, xp, dtype, 2))
        if _flags_results(backend):
            if not flag:   # the backend's -2 was a 0 of the factorization
                info[info == _info.INFO_NONFINITE_RESULT] = _info.INFO_OK
        elif flag:
            info = _info.flag_nonfinite(xp, info, lu)
    return lu.reshape(a.shape), piv.reshape(batch + (n,)), info.reshape(batch)


def lu_factor(a, *, check: bool = False, stream=None):
    """LU factorization with partial pivoting of each matrix in ``a`` (..., n, n).

    Returns ``lu`` (..., n, n), ``piv`` (..., n) int32 (0-based, as :func:`scipy.linalg.lu_factor`)
    and ``info`` (...) int32 (-2 where the factors of a finite matrix overflowed).
    """
    if _dask.any_dask(a):   # lazy: dask arrays back (kernels/_dask.py)
        return _dask.lu_factor(a, lu_factor, check=check, stream=stream)
    xp, backend, a, dtype, n, batch = _prepare_a(a, "lu_factor")
    lu, piv, info = _getrf(xp, backend, a, dtype, n, batch, stream, flag=True)
    if check:
        _raise_on_bad(info, batch, "lu_factor")
    return lu, piv, info


def lu_solve(lu, piv, b, *, stream=None):
    """Solve ``A x = b`` for each matrix from the output of :func:`lu_factor`.

    ``b`` is (..., n) for one right-hand side per matrix or (..., n, k) for k of them; the batch
    shape must equal that of ``lu``. Matrices with a zero pivot give inf/NaN in their own ``x``.
    Returns ``x`` only: there is no ``info`` here (it is :func:`lu_factor`'s), so an ``x`` that
    overflows is not flagged; :func:`solve` flags it.

    ``piv`` values outside ``[0, n)`` are checked before the cast to int32 (which would wrap
    ``2**32 + 1`` to 1). On NumPy inputs they raise ``ValueError``. On CuPy inputs the check runs
    on the device, like the solve, and the call does not wait for the GPU: each matrix with an
    out-of-range pivot gets an all-NaN ``x``.
    """
    if _dask.any_dask(lu, piv, b):   # lazy: dask arrays back (kernels/_dask.py)
        return _dask.lu_solve(lu, piv, b, lu_solve, stream=stream)
    xp, backend = _backend(lu, piv, b)
    lu, piv, b = (_as_array(x, xp) for x in (lu, piv, b))
    dtype = check_dtype(lu.dtype, "lu")
    n = check_square(lu.shape, "lu")
    batch = lu.shape[:-2]
    check_piv(batch, n, piv.shape)
    if piv.dtype.kind not in "iu":
        raise InputTypeError(f"Expected piv to have an integer dtype. Got {piv.dtype} instead.")
    if piv.size and xp is np:
        lo, hi = int(piv.min()), int(piv.max())
        if lo < 0 or hi >= n:
            raise InputError(f"Expected piv values in [0, {n}). Got values in [{lo}, {hi}] instead.")
    vector = check_rhs(batch, n, b.shape)
    out_dtype = check_dtype(np.result_type(dtype, b.dtype), "the result")
    if out_dtype != dtype:
        lu = lu.astype(out_dtype)
    if n == 0 or 0 in batch or (not vector and b.shape[-1] == 0):
        return xp.empty(b.shape, out_dtype)
    b3 = _flat(b[..., None] if vector else b, xp, out_dtype, 2)
    with _stream_ctx(xp, stream):
        piv2 = _flat(piv, xp, piv.dtype, 1)
        bad = None
        if xp is not np:   # on the device, queued on the stream: no host wait
            bad = ((piv2 < 0) | (piv2 >= n)).any(axis=1)
            piv2 = xp.clip(piv2, 0, n - 1)
        x = backend.getrs(_flat(lu, xp, out_dtype, 2), piv2.astype(np.int32), b3)
        if bad is not None:   # where(), not a masked assignment: that would count the mask on the host
            x = xp.where(bad[:, None, None], xp.asarray(xp.nan, x.dtype), x)
    return x.reshape(b.shape)


def inv(a, *, check: bool = False, stream=None):
    """Inverse of each matrix in ``a`` (..., n, n); NaN for a singular or non-finite matrix.

    Returns ``ainv`` and ``info`` (-2 where the inverse of a finite matrix is not finite).
    """
    if _dask.any_dask(a):   # lazy: dask arrays back (kernels/_dask.py)
        return _dask.inv(a, inv, check=check, stream=stream)
    xp, backend, a, dtype, n, batch = _prepare_a(a, "inv")
    if n == 0 or 0 in batch:
        ainv, info = xp.empty(a.shape, dtype), xp.zeros(batch, np.int32)
    else:
        with _stream_ctx(xp, stream):
            ainv, info = backend.inv(_flat(a, xp, dtype, 2))
            if not _flags_results(backend):
                info = _info.flag_nonfinite(xp, info, ainv)
        ainv, info = ainv.reshape(a.shape), info.reshape(batch)
    if check:
        _raise_on_bad(info, batch, "inv")
    return ainv, info


def solve(a, b, *, check: bool = False, stream=None):
    """Solve ``a x = b`` for each matrix; ``b`` is (..., n) or (..., n, k).

    Returns ``x`` (NaN for a singular or non-finite matrix) and ``info``. Mixed dtypes are computed
    in ``numpy.result_type(a, b)``. A right-hand side holding NaN or Inf counts as a non-finite input
    (info -1, ``x`` all NaN); a finite input whose ``x`` is not finite gets info -2.
    """
    if _dask.any_dask(a, b):   # lazy: dask arrays back (kernels/_dask.py)
        return _dask.solve(a, b, solve, check=check, stream=stream)
    xp, backend = _backend(a, b)
    a, b = _as_array(a, xp), _as_array(b, xp)
    check_dtype(a.dtype, "a")
    n = check_square(a.shape, "a")
    batch = a.shape[:-2]
    vector = check_rhs(batch, n, b.shape)
    dtype = check_dtype(np.result_type(a.dtype, b.dtype), "the result")
    if n == 0 or 0 in batch or (not vector and b.shape[-1] == 0):
        x, info = xp.empty(b.shape, dtype), xp.zeros(batch, np.int32)
        if n and 0 not in batch:  # no x to overflow: the factorization's info, unflagged
            _, _, info = _getrf(xp, backend, a, a.dtype, n, batch, stream, flag=False)
    else:
        b3 = _flat(b[..., None] if vector else b, xp, dtype, 2)
        with _stream_ctx(xp, stream):
            x, info = backend.solve(_flat(a, xp, dtype, 2), b3)
            if not _flags_results(backend):
                info, x = _info.nonfinite_rhs(xp, info, x, b3)
                info = _info.flag_nonfinite(xp, info, x)
        x, info = x.reshape(b.shape), info.reshape(batch)
    if check:
        _raise_on_bad(info, batch, "solve")
    return x, info


def slogdet(a, *, check: bool = False, stream=None):
    """Sign and natural log of the absolute determinant of each matrix, in the input's precision.

    For complex input the sign is complex with modulus 1. An exactly singular matrix gives sign 0 and
    logabsdet -inf (as :func:`numpy.linalg.slogdet`); a non-finite one gives NaN for both. A finite
    matrix whose sign or logabsdet comes out non-finite (its factors overflowed) gets info -2.
    Returns ``sign``, ``logabsdet`` and ``info``.
    """
    if _dask.any_dask(a):   # lazy: dask arrays back (kernels/_dask.py)
        return _dask.slogdet(a, slogdet, check=check, stream=stream)
    xp, backend, a, dtype, n, batch = _prepare_a(a, "slogdet")
    real = np.empty(0, dtype).real.dtype
    if n == 0 or 0 in batch:
        sign, logabsdet = xp.ones(batch, dtype), xp.zeros(batch, real)
        info = xp.zeros(batch, np.int32)
    else:
        with _stream_ctx(xp, stream):
            sign, logabsdet, info = backend.slogdet(_flat(a, xp, dtype, 2))
            if not _flags_results(backend):
                info = _info.flag_nonfinite(xp, info, sign, logabsdet)
        sign, logabsdet, info = sign.reshape(batch), logabsdet.reshape(batch), info.reshape(batch)
    if check:
        _raise_on_bad(info, batch, "slogdet")
    return sign, logabsdet, info
