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

:func:`one_blas_thread` keeps OpenBLAS to one thread in the calling thread, for the compiled engine
(which calls the same LAPACK from its own threads) and for this module's loops (the NumPy engine,
on demand or as the fallback), whose results must be the compiled engine's bit for bit: OpenBLAS's
threaded ``?getrf`` / ``?getri`` (real from n ~ 200, complex from n < 96 on the 2-core development
machine) round differently from its one-thread code.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading

import numpy as np
from scipy.linalg import get_lapack_funcs

__all__ = ["factor", "invert", "one_blas_thread", "substitute"]


@functools.cache
def _blas_thread_setter():
    """OpenBLAS's ``openblas_set_num_threads_local`` (OpenBLAS >= 0.3.27; it returns the count it
    replaces) from the LAPACK that SciPy's ``cython_lapack`` calls (found among the libraries it
    loads), or None: another LAPACK, or an older OpenBLAS."""
    import scipy.linalg.cython_lapack

    try:
        setter = ctypes.CDLL(scipy.linalg.cython_lapack.__file__).openblas_set_num_threads_local
    except (OSError, AttributeError):
        return None
    setter.argtypes = [ctypes.c_int]
    setter.restype = ctypes.c_int
    return setter


_HELD = 0                    # blocks of one_blas_thread open now, in any thread
_BEFORE = 0                  # OpenBLAS's thread count when the first of them opened
_HELD_LOCK = threading.Lock()


@contextlib.contextmanager
def one_blas_thread():
    """OpenBLAS kept to one thread while the block runs, and given back its thread count once the
    last such block of the process ends. OpenBLAS threads ``?getrf`` from n ~ 100 on, and its
    threads and ours (the compiled engine's, or a pipeline's task threads) would fight over the same
    cores (measured at n = 128, float64 inverses on 2 cores: 120 ms with both, 56 ms with ours
    alone); and its threaded code rounds otherwise than its one-thread code, which the compiled
    engine's results must not depend on. ``openblas_set_num_threads_local`` sets the whole
    process's count in OpenBLAS's pthreads builds (SciPy's wheels), so blocks of several threads
    share one setting: set by the first, restored by the last (two blocks each restoring what it
    found left OpenBLAS threaded under a running one). Where the setter is not found, the block
    changes nothing."""
    global _HELD, _BEFORE
    setter = _blas_thread_setter()
    if setter is None:
        yield
        return
    with _HELD_LOCK:
        if _HELD == 0:
            _BEFORE = setter(1)
        _HELD += 1
    try:
        yield
    finally:
        with _HELD_LOCK:
            _HELD -= 1
            if _HELD == 0:
                setter(_BEFORE)


def factor(a: np.ndarray, piv: np.ndarray) -> None:
    """LU of every matrix of ``a`` (B, n, n) in place (``xGETRF``), 0-based pivots into ``piv``."""
    getrf, = get_lapack_funcs(("getrf",), (a,))
    with one_blas_thread():   # the NumPy engine too: threaded OpenBLAS rounds otherwise
        for i in range(a.shape[0]):
            a[i], piv[i], _ = getrf(a[i])


def substitute(lu: np.ndarray, piv: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``x`` (B, n, k) with ``A x = b`` from ``factor``'s ``lu`` and ``piv`` (``xGETRS``)."""
    getrs, = get_lapack_funcs(("getrs",), (lu,))
    x = np.empty(b.shape, lu.dtype)
    with one_blas_thread():
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
    with one_blas_thread():
        for i in range(lu.shape[0]):
            ainv[i], _ = getri(lu[i], piv[i], lwork=lwork)
    return ainv
