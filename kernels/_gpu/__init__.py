"""CuPy backend: batchlu's own CUDA kernels, and cuSOLVER above the range they cover. Used only when a
CuPy array reaches ``kernels``; importing it imports no CuPy (the functions do).

One module per kernel family, each the host code of one ``kernels/cuda/<family>.cu``: ``_getrf``,
``_getri`` (inverse), ``_getrs`` (solve), ``_gesv`` (fused solve) and ``_slogdet``; what they share
(C++ names, device limits, compilation) is in ``_runtime``. ``_paths`` says, per op, dtype and n,
whether the kernels fit the device; where they do not, ``_cusolver`` computes the op (cuSOLVER's getrf
and getrs, one matrix at a time). Each function below takes arrays already normalised by
``batchlu.kernels._api`` (C-contiguous, (B, n, n), a supported dtype, B >= 1, n >= 1) and launches on
CuPy's current stream. The tuning surface is ``batchlu.kernels.tuning``.
"""

from . import _cusolver, _getrf, _getri, _getrs, _slogdet
from ._paths import CUSOLVER, path

__all__ = ["getrf", "getrs", "inv", "slogdet", "solve"]


def getrf(a):
    if path("lu_factor", a.dtype, a.shape[-1]) == CUSOLVER:
        return _cusolver.getrf(a)
    return _getrf.getrf(a)


def getrs(lu, piv, b):
    if path("lu_solve", lu.dtype, lu.shape[-1], b.shape[-1]) == CUSOLVER:
        return _cusolver.getrs(lu, piv, b)
    return _getrs.getrs(lu, piv, b)


def inv(a):
    if path("inv", a.dtype, a.shape[-1]) == CUSOLVER:
        return _cusolver.inv(a)
    return _getri.inv(a)


def solve(a, b):
    if path("solve", a.dtype, a.shape[-1], b.shape[-1]) == CUSOLVER:
        return _cusolver.solve(a, b.astype(a.dtype, copy=False))
    return _getrs.solve(a, b)


def slogdet(a):
    if path("slogdet", a.dtype, a.shape[-1]) == CUSOLVER:
        return _cusolver.slogdet(a)
    return _slogdet.slogdet(a)
