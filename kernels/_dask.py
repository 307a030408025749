"""The batched ops on dask arrays: lazy, one block of the batch axes at a time, in the caller's graph.

``batchlu.inv(x)`` on a ``dask.array.Array`` returns dask arrays (``ainv`` and ``info``) without
computing anything. Each block goes through the same :mod:`batchlu.kernels._api` function as an
in-memory array, so a block of NumPy chunks runs on the CPU backend and a block of CuPy chunks on the
GPU kernels, on whatever scheduler computes the graph (threads, processes, distributed), with no
client needed. The graph is built by :func:`dask.array.apply_gufunc`: the batch axes are its loop
dimensions (chunked as the input), the matrix axes its core dimensions, and the output metas follow
the input's array type (NumPy or CuPy) with the dtypes given here.

A matrix split between chunks along its own axes is made whole first (``rechunk`` of the last two
axes, the batch chunks kept): a block must hold whole matrices. ``check=True`` and ``stream`` need
the values or a device stream, which a lazy call does not have: they are refused with one line.
Dask is imported here only, when a dask array is given.
"""

from __future__ import annotations

import numpy as np

from batchlu.errors import InputError

from ._validate import check_dtype, check_piv, check_rhs, check_square, refuse_masked


def is_dask(x) -> bool:
    """Whether ``x`` is a dask array (checked without importing dask)."""
    return type(x).__module__.startswith("dask.array") and hasattr(x, "__dask_graph__")


def any_dask(*arrays) -> bool:
    return any(is_dask(x) for x in arrays)


def _refuse(op: str, check: bool, stream) -> None:
    if check:
        raise InputError(f"Expected check=False for {op} on a dask array (the check needs the values). "
                         f"Got check=True instead: compute info and test it, e.g. "
                         f"bool((info != 0).any().compute()).")
    if stream is not None:
        raise InputError(f"Expected stream=None for {op} on a dask array (each block runs on its "
                         f"worker's current stream). Got a stream instead.")


def _dask_array(x, what: str):
    import dask.array as da

    refuse_masked(x)
    x = x if is_dask(x) else da.asarray(x)
    if any(np.isnan(s) for s in x.shape):
        raise InputError(f"Expected {what} with known chunk sizes. Got shape {x.shape} instead: call "
                         f"{what}.compute_chunk_sizes() first.")
    return x


def _whole(x, core: int):
    """``x`` with its last ``core`` axes in one chunk each (its other chunks kept)."""
    axes = range(x.ndim - core, x.ndim)
    if all(len(x.chunks[ax]) <= 1 for ax in axes):
        return x
    return x.rechunk({ax: -1 for ax in axes})


def _square(a, what: str = "a"):
    a = _dask_array(a, what)
    dtype = check_dtype(a.dtype, what)
    n = check_square(a.shape, what)
    return _whole(a, 2), dtype, n


def _real(dtype) -> np.dtype:
    return np.empty(0, dtype).real.dtype


def _along(x, a, core: int):
    """``x`` chunked as ``a`` along the batch axes (apply_gufunc's loop dimensions must agree)."""
    chunks = a.chunks[:-2] + x.chunks[x.ndim - core:]
    return x if x.chunks == chunks else x.rechunk(chunks)


def _gufunc(block, signature: str, dtypes, a, *rest):
    """``block`` over the batch axes of ``a`` (and of ``rest``), with output metas of ``a``'s array
    type (NumPy or CuPy) in ``dtypes``: ``empty_like`` dispatches to the chunks' library, where
    dask's own cast of the input meta to each dtype warns complex -> real."""
    import dask.array as da

    metas = tuple(np.empty_like(a._meta, shape=(0,), dtype=d) for d in dtypes)
    out = da.apply_gufunc(block, signature, a, *rest, meta=metas[0] if len(metas) == 1 else metas)
    return tuple(out) if isinstance(out, (tuple, list)) else out


# ---- the ops: ``block`` is the in-memory op of batchlu.kernels._api (a module-level function, which
# any scheduler pickles by name), handed in by it so that this module does not import it back ------

def lu_factor(a, block, *, check: bool = False, stream=None):
    _refuse("lu_factor", check, stream)
    a, dtype, _ = _square(a)
    return _gufunc(block, "(i,i)->(i,i),(i),()", (dtype, np.int32, np.int32), a)


def lu_solve(lu, piv, b, block, *, stream=None):
    _refuse("lu_solve", False, stream)
    lu, dtype, n = _square(lu, "lu")
    piv, b = _dask_array(piv, "piv"), _dask_array(b, "b")
    batch = lu.shape[:-2]
    check_piv(batch, n, piv.shape)
    if piv.dtype.kind not in "iu":
        from batchlu.errors import InputTypeError

        raise InputTypeError(f"Expected piv to have an integer dtype. Got {piv.dtype} instead.")
    vector = check_rhs(batch, n, b.shape)
    out = check_dtype(np.result_type(dtype, b.dtype), "the result")
    piv, b = _along(_whole(piv, 1), lu, 1), _along(_whole(b, 1 if vector else 2), lu, 1 if vector else 2)
    signature = "(i,i),(i),(i)->(i)" if vector else "(i,i),(i),(i,k)->(i,k)"
    return _gufunc(block, signature, (out,), lu, piv, b)


def inv(a, block, *, check: bool = False, stream=None):
    _refuse("inv", check, stream)
    a, dtype, _ = _square(a)
    return _gufunc(block, "(i,i)->(i,i),()", (dtype, np.int32), a)


def solve(a, b, block, *, check: bool = False, stream=None):
    _refuse("solve", check, stream)
    a, dtype, n = _square(a)
    b = _dask_array(b, "b")
    vector = check_rhs(a.shape[:-2], n, b.shape)
    out = check_dtype(np.result_type(dtype, b.dtype), "the result")
    b = _along(_whole(b, 1 if vector else 2), a, 1 if vector else 2)
    signature = "(i,i),(i)->(i),()" if vector else "(i,i),(i,k)->(i,k),()"
    return _gufunc(block, signature, (out, np.int32), a, b)


def slogdet(a, block, *, check: bool = False, stream=None):
    _refuse("slogdet", check, stream)
    a, dtype, _ = _square(a)
    return _gufunc(block, "(i,i)->(),(),()", (dtype, _real(dtype), np.int32), a)
