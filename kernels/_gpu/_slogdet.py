"""GPU slogdet: sign and log|det| from the LU factors, the family of ``kernels/cuda/slogdet.cu``
(one warp per matrix; the interchange parity, the product of the diagonal's phases and the sum of
its logs, in the input's precision)."""

from __future__ import annotations

import numpy as np

from ._getrf import getrf
from ._runtime import SCALAR, check, kernel, template

FAMILY = "slogdet"


def launch_slogdet(lu, piv, info, sign, logabsdet) -> None:
    """Sign (input dtype) and log|det| (real) from ``getrf``'s outputs into preallocated arrays."""
    batch, n = lu.shape[0], lu.shape[-1]
    dtype = lu.dtype
    real = np.empty(0, dtype).real.dtype
    check("lu", lu, (batch, n, n), dtype)
    check("piv", piv, (batch, n), np.int32)
    check("info", info, (batch,), np.int32)
    check("sign", sign, (batch,), dtype)
    check("logabsdet", logabsdet, (batch,), real)
    if batch == 0:
        return
    names = tuple(template("slogdet_kernel", d) for d in SCALAR)  # every dtype in one NVRTC run
    func = kernel(FAMILY, template("slogdet_kernel", dtype), names)
    func((-(-batch // 4),), (128,), (lu, piv, info, sign, logabsdet, np.int32(n), np.int64(batch)))


def slogdet(a):
    """Backend entry point: ``sign``, ``logabsdet``, ``info`` of a (B, n, n) C-contiguous array."""
    import cupy

    batch = a.shape[0]
    lu, piv, info = getrf(a)
    sign = cupy.empty((batch,), a.dtype)
    logabsdet = cupy.empty((batch,), np.empty(0, a.dtype).real.dtype)
    launch_slogdet(lu, piv, info, sign, logabsdet)
    return sign, logabsdet, info
