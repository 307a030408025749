"""Which GPU path each (op, dtype, n) takes: batchlu's own kernels where they fit, cuSOLVER above.

The own kernels hold a whole matrix's working set in one CUDA block: getrf's panel of every row in
shared memory (``_getrf.fitting_plan``), getri's one thread per column with a panel of every row in
shared memory, getrs' right-hand sides in shared memory (``_getri.getri_fits``, ``_getrs.getrs_fits``,
both n <= ``MAX_N``). Where an op's
kernels do not fit the device, the op goes to :mod:`._cusolver` (cuSOLVER's getrf / getrs, one matrix
at a time). The test is the very function each launcher raises from, so every n is covered: an n
the kernels refuse is an n this module sends to cuSOLVER, whatever the device's shared memory.

Paths, by op:

* ``lu_factor`` and ``slogdet``: ``"getrf"`` (getrf's table; slogdet adds one small kernel) or
  ``"cusolver"``;
* ``inv``: ``"tiny"`` (``inv_tiny``), ``"fused"`` (``inv_gje``), ``"getri"`` (getrf + getri) or ``"cusolver"``;
* ``solve``: ``"rows"`` (``gesv_rows``), ``"getrs"`` (getrf + getrs) or ``"cusolver"``;
* ``lu_solve``: ``"getrs"`` or ``"cusolver"``.

Needs no GPU and imports no CuPy when ``smem`` is given (tests and docs); without it the current
device's opt-in shared memory per block is read.
"""

from __future__ import annotations

import numpy as np

from batchlu.errors import ConfigError

from ._getrf import fitting_plan
from ._getri import getri_fits, inv_plan
from ._getrs import getrs_fits, solve_plan


CUSOLVER = "cusolver"
OPS = ("lu_factor", "inv", "solve", "lu_solve", "slogdet")
# Shared memory a block may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin), for docs and tests.
SMEM_H100 = 232448  # H100 and H200: 227 KiB
SMEM_A100 = 166912  # A100: 163 KiB

__all__ = ["CUSOLVER", "OPS", "SMEM_A100", "SMEM_H100", "first_cusolver_n", "path"]


def _device_smem() -> int:
    from ._runtime import smem_optin

    return smem_optin()


def path(op: str, dtype, n: int, k: int = 1, smem: int | None = None) -> str:
    """The path of ``op`` for order n (and k right-hand sides for ``solve`` / ``lu_solve``) on a device
    whose blocks may opt in to ``smem`` bytes of shared memory (default: the current device's)."""
    if op not in OPS:
        raise ConfigError(f"Expected op among {OPS}. Got {op!r} instead.")
    dtype = np.dtype(dtype)
    smem = _device_smem() if smem is None else int(smem)
    if op == "lu_solve":
        return "getrs" if getrs_fits(dtype, n, k, smem) else CUSOLVER
    if op == "inv" and inv_plan(dtype, n) in ("tiny", "fused"):
        return inv_plan(dtype, n)
    if op == "solve" and solve_plan(dtype, n, k, smem) == "rows":
        return "rows"
    if fitting_plan(dtype, n, smem) is None:
        return CUSOLVER
    if op == "inv":
        return "getri" if getri_fits(dtype, n, smem) else CUSOLVER
    if op == "solve":
        return "getrs" if getrs_fits(dtype, n, k, smem) else CUSOLVER
    return "getrf"


def first_cusolver_n(op: str, dtype, smem: int, k: int = 1, limit: int = 1 << 16) -> int:
    """The smallest n that ``op`` sends to cuSOLVER on a device with ``smem`` bytes per block (every
    smaller n runs on batchlu's own kernels); ``limit`` + 1 if none up to ``limit``."""
    for n in range(1, limit + 1):
        if path(op, dtype, n, k, smem) == CUSOLVER:
            return n
    return limit + 1
