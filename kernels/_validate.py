"""Input checks shared by every backend, and which array library an input belongs to (:func:`is_cupy`,
the one place NumPy and CuPy arrays are told apart). Messages read "Expected X. Got Y instead."."""

from __future__ import annotations

import numpy as np

from batchlu.errors import InputError, InputTypeError


SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64),
                    np.dtype(np.complex64), np.dtype(np.complex128))
_NAMES = ", ".join(str(d) for d in SUPPORTED_DTYPES)


def is_cupy(x) -> bool:
    """Whether ``x`` is a CuPy array, told by its type alone: CuPy is not imported for it."""
    return type(x).__module__.split(".")[0] == "cupy"


def array_module(x):
    """NumPy, or CuPy for a CuPy array (imported only then)."""
    if is_cupy(x):
        import cupy

        return cupy
    return np


def check_dtype(dtype, what: str = "a") -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise InputTypeError(f"Expected {what} to have one of the dtypes {_NAMES}. Got {dtype} instead.")
    return dtype


def check_square(shape: tuple, what: str = "a") -> int:
    if len(shape) < 2:
        raise InputError(f"Expected {what} to have shape (..., n, n) with ndim >= 2. "
                         f"Got shape {tuple(shape)} (ndim {len(shape)}) instead.")
    if shape[-1] != shape[-2]:
        raise InputError(f"Expected {what} to hold square matrices, shape (..., n, n). "
                         f"Got shape {tuple(shape)} instead.")
    return shape[-1]


def check_rhs(batch: tuple, n: int, bshape: tuple, what: str = "b") -> bool:
    """Return True when b holds vectors ``batch + (n,)``, False for matrices ``batch + (n, k)``."""
    bshape = tuple(bshape)
    if bshape == batch + (n,):
        return True
    if len(bshape) == len(batch) + 2 and bshape[:-1] == batch + (n,):
        return False
    raise InputError(f"Expected {what} of shape {batch + (n,)} or {batch + (n, 'k')}. "
                     f"Got shape {bshape} instead.")


def check_piv(batch: tuple, n: int, pshape: tuple) -> None:
    if tuple(pshape) != batch + (n,):
        raise InputError(f"Expected piv of shape {batch + (n,)}. Got shape {tuple(pshape)} instead.")


def refuse_masked(*arrays) -> None:
    """A ``numpy.ma.MaskedArray`` (or a dask array of them) is refused in one line: the ops have no
    masks, and computing on the values under a mask would give results the mask says are not there."""
    for x in arrays:
        meta = getattr(x, "_meta", None) if type(x).__module__.startswith("dask.array") else None
        if isinstance(x, np.ma.MaskedArray) or isinstance(meta, np.ma.MaskedArray):
            raise InputTypeError("Expected NumPy or CuPy arrays. Got a numpy.ma.MaskedArray instead: the "
                                 "ops have no masks; pass x.filled(value) or x.data if the values under "
                                 "the mask are what to compute on.")
