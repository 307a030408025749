"""GPU getri and inv: the inverse, the family of ``kernels/cuda/getri.cu``.

* ``inv_tiny`` — fused inverse of tiny matrices (n <= 8), one thread per matrix: ``inv_gje``'s
  Gauss-Jordan in the thread's registers, the block's matrices read and written through shared memory;
* ``inv_gje`` — fused inverse while the matrix fits in one block's registers: Gauss-Jordan with
  LAPACK's partial pivoting (implicit row order), unscrambled on the write;
* ``getri`` — inverse from ``getrf``'s factors: L^-1 and U^-1 by blocked delayed correction, then
  U^-1 L^-1 with the column interchange fused into the write; one launch ("static", "merged"), or
  per-step launches sized to the active columns ("dynamic", the paper's allocation).

:func:`inv_plan` chooses between them (:data:`TINY_MAX_N`, :data:`FUSED_MAX_N`, :data:`GJE_TILES`);
:func:`getri_plan` picks getri's launch (:data:`GETRI_MODE`, :data:`GETRI_PLANS`). The ``launch_*`` functions run on
preallocated outputs (tests poison them first; benchmarks reuse them) on CuPy's current stream with
no host synchronisation; :func:`inv` is the backend entry point (contract in ``kernels/_api.py``).
"""

from __future__ import annotations

import numpy as np

from batchlu.errors import ConfigError, InputError

from ._getrf import TINY_N, getrf, launch_tiny, tiny_mpb
from ._getrs import default_nb, launch_perm
from ._runtime import MAX_N, check, check_n, kernel, smem_optin, template


FAMILY = "getri"
# The dispatch of this family, four tables; see docs/design.md#getri-dispatch.
# Fused tiles per dtype, (largest n, TI, TJ, RR, CC, MINB) rows, first match wins: TI x TJ threads,
# each holding RR x CC elements in registers; MINB blocks per SM asked of the compiler.
_GJE_SMALL = ((8, 4, 8, 2, 1, 1), (16, 4, 8, 4, 2, 1), (32, 8, 8, 4, 4, 1))
_GJE_33 = ((36, 8, 4, 5, 9, 1), (40, 8, 8, 5, 5, 1))
GJE_TILES = {
    np.dtype(np.float32): _GJE_SMALL + _GJE_33 + ((64, 16, 8, 4, 8, 2), (96, 16, 16, 6, 6, 1),
                                                  (128, 16, 16, 8, 8, 1), (192, 32, 16, 6, 12, 1)),
    np.dtype(np.float64): _GJE_SMALL + _GJE_33 + ((64, 16, 8, 4, 8, 1), (96, 16, 16, 6, 6, 1),
                                                  (128, 32, 16, 4, 8, 1)),
    np.dtype(np.complex64): _GJE_SMALL + _GJE_33 + ((64, 16, 8, 4, 8, 1), (96, 16, 16, 6, 6, 1),
                                                    (128, 32, 16, 4, 8, 1)),
    np.dtype(np.complex128): _GJE_SMALL + ((36, 12, 8, 3, 5, 1), (40, 8, 8, 5, 5, 1), (64, 32, 8, 2, 8, 2),
                                           (96, 16, 16, 6, 6, 1)),
}
# Largest n sent to the fused kernel, per dtype (at most the largest tile above); beyond it getrf + getri.
FUSED_MAX_N = {np.dtype(np.float32): 64, np.dtype(np.float64): 64,
               np.dtype(np.complex64): 64, np.dtype(np.complex128): 64}
# Largest n sent to inv_tiny (one thread per matrix), per dtype; 0: none. A thread holds its matrix in
# registers (n*n scalars): complex128 from n = 6 would spill them, and stays on inv_gje.
TINY_MAX_N = {np.dtype(np.float32): 8, np.dtype(np.float64): 8,
              np.dtype(np.complex64): 8, np.dtype(np.complex128): 5}
TINY_LIMIT = TINY_N   # the largest n launch_inv_tiny takes (explicitly, outside TINY_MAX_N too)
# getri's launch shape per dtype ("static", "merged" or "dynamic") where GETRI_PLANS has no row.
GETRI_MODE = {np.dtype(np.float32): "static", np.dtype(np.float64): "static",
              np.dtype(np.complex64): "dynamic", np.dtype(np.complex128): "static"}
# Per dtype, (lowest n, largest n, mode, minb, mma[, nb]) rows: minb blocks per SM in __launch_bounds__
# (0: no bound), mma the sums on FP64 tensor cores, nb the block-row height (default: default_nb's).
GETRI_PLANS = {np.dtype(np.float32): ((65, 96, "dynamic", 0, False), (97, 128, "merged", 5, True),
                                      (129, 160, "merged", 4, True), (161, 190, "dynamic", 0, False, 32),
                                      (191, 256, "merged", 0, False)),
               np.dtype(np.float64): ((65, 96, "merged", 3, True), (97, 128, "static", 3, True),
                                      (129, 160, "merged", 2, True, 32), (161, 190, "static", 2, True, 32),
                                      (191, 256, "merged", 0, True, 32)),
               np.dtype(np.complex128): ((65, 190, "dynamic", 0, True, 16), (191, 256, "merged", 0, True, 16))}


def getri_plan(dtype, n: int) -> tuple[str, int, bool, int]:
    """(mode, minb, mma, nb) of ``launch_getri`` for (dtype, n): GETRI_PLANS where it has a row (nb
    :func:`default_nb`'s unless the row names one), else GETRI_MODE without a bound or mma."""
    dtype = np.dtype(dtype)
    for lo, hi, mode, minb, mma, *nb in GETRI_PLANS.get(dtype, ()):
        if lo <= n <= hi:
            return mode, minb, mma, nb[0] if nb else default_nb(dtype)
    return GETRI_MODE[dtype], 0, False, default_nb(dtype)


GETRI_NBS = (8, 16, 32)  # the block-row heights launch_getri accepts (whole 16-byte vectors, mma row tiles)


def getri_smem(dtype, n: int, mma: bool = False, nb: int | None = None) -> int:
    """Shared memory of getri's one-panel launch (static, or dynamic's widest step) for order n: the
    panel of every row (npad x LDP scalars), plus the per-warp scratch of the tensor-core sums."""
    dtype = np.dtype(dtype)
    nb = nb or default_nb(dtype)
    threads = -(-n // 32) * 32
    scratch = (threads // 32) * _SCRATCH_ROWS * _SCRATCH_LD * dtype.itemsize if mma else 0
    return -(-n // nb) * nb * _ldp(dtype, nb) * dtype.itemsize + scratch


def getri_fits(dtype, n: int, smem: int) -> bool:
    """Whether :func:`launch_getri` runs its planned launch (:func:`getri_plan`) for order n on a device
    that lets a block opt in to ``smem`` bytes: n within MAX_N, mma within 512 threads, the panel in
    shared memory. Needs no GPU."""
    _mode, _minb, mma, nb = getri_plan(dtype, n)
    return (n <= MAX_N and not (mma and -(-n // 32) * 32 > 512)
            and getri_smem(dtype, n, mma, nb) <= smem)


# ---- fused Gauss-Jordan inverse -----------------------------------------------------------------

def gje_tile(dtype, n: int):
    """The smallest fused tile (TI, TJ, RR, CC, MINB) holding an n x n matrix, or None."""
    for nmax, *tile in GJE_TILES[np.dtype(dtype)]:
        if n <= nmax:
            return tuple(tile)
    return None


def gje_name(dtype, tile) -> str:
    """The name expression of ``inv_gje`` on ``tile`` (TI, TJ, RR, CC, MINB)."""
    return template("inv_gje", dtype, *tile)


def _gje_names(dtype, extra=None) -> tuple[str, ...]:
    """The fused instantiations compiled together: the table's tiles, or one tile outside it alone."""
    tiles = [t[1:] for t in GJE_TILES[np.dtype(dtype)]]
    if extra is not None and tuple(extra) not in tiles:
        tiles = [tuple(extra)]
    return tuple(gje_name(dtype, t) for t in tiles)


def _check_tile(tile, n):
    if tile is None or len(tile) != 5 or tile[0] * tile[2] < n or tile[1] * tile[3] < n:
        raise InputError(f"Expected a fused tile (TI, TJ, RR, CC, MINB) holding n = {n}. "
                         f"Got {tile} instead.")


def launch_inv_gje(a, out, info, tile=None) -> None:
    """Fused inverse of ``a`` (B, n, n) into ``out`` (B, n, n) and ``info`` (B,) int32."""
    batch, n = a.shape[0], a.shape[-1]
    check("a", a, (batch, n, n), a.dtype)
    check("out", out, a.shape, a.dtype)
    check("info", info, (batch,), np.int32)
    tile = tuple(tile) if tile is not None else gje_tile(a.dtype, n)
    _check_tile(tile, n)
    if batch == 0:
        return
    smem = n * n * a.itemsize
    func = kernel(FAMILY, gje_name(a.dtype, tile), _gje_names(a.dtype, tile), smem)
    func((batch,), (tile[0] * tile[1],), (a, out, info, np.int32(n)), shared_mem=smem)


# ---- tiny inverse: one thread per matrix ----------------------------------------------------------

def tiny_name(dtype, n: int) -> str:
    """The name expression of ``inv_tiny`` for (dtype, n)."""
    return template("inv_tiny", dtype, n, tiny_mpb(dtype, n))


def launch_inv_tiny(a, out, info) -> None:
    """Fused inverse of ``a`` (B, n, n), n <= :data:`TINY_LIMIT`, into ``out`` (B, n, n) and ``info``
    (B,) int32, one thread per matrix."""
    batch, n = a.shape[0], a.shape[-1]
    check("a", a, (batch, n, n), a.dtype)
    check("out", out, a.shape, a.dtype)
    check("info", info, (batch,), np.int32)
    if not 1 <= n <= TINY_LIMIT:
        raise InputError(f"Expected 1 <= n <= {TINY_LIMIT} for the tiny inverse. Got n = {n} instead.")
    if batch == 0:
        return
    launch_tiny(FAMILY, "inv_tiny", TINY_MAX_N[np.dtype(a.dtype)], a.dtype, n, batch, (a, out, info))


# ---- getri: inverse from the LU factors ---------------------------------------------------------

def _getri_names(dtype) -> tuple[str, ...]:
    """The getri kernels compiled together: the default block-row height, no bound, no mma."""
    nb = default_nb(dtype)
    return tuple(template(f"getri_{k}", dtype, nb, t) for k, t in (
        ("static", 256), ("static", 1024), ("merged", 256), ("merged", 1024), ("product", 256),
        ("product", 1024), ("linv_step", 256), ("uinv_step", 256), ("linv_step", 1024), ("uinv_step", 1024)))


def _ldp(dtype, nb: int | None = None) -> int:
    """Stride of getri's / getrs' transposed panels (getri.cu's getri_panel::LDP)."""
    return (nb or default_nb(dtype)) + 16 // np.dtype(dtype).itemsize


_SCRATCH_ROWS, _SCRATCH_LD = 8, 33  # getri.cu's kScratchRows, kScratchLd: a warp's 8 x 32 sums, padded


def mma_bounds(threads: int, minb: int) -> str:
    """The last template arguments (MAXT, MINB, MMA) of the getri kernels with the tensor-core sums for a
    launch of ``threads``: MAXT at most 512 (getri.cu's GetriMma)."""
    return f"{threads if minb else 256 if threads <= 256 else 512}, {minb}, true"


def getri_kernels(dtype, threads: int, mode: str, minb: int, mma: bool, nb: int) -> tuple[dict, tuple[str, ...]]:
    """({kind: kernel name} of ``launch_getri``'s launch of ``threads`` threads, the kernels compiled
    together); sweeps precompile the same sets."""
    plain = 256 if threads <= 256 else 1024
    bounds = mma_bounds(threads, minb) if mma else f"{threads}, {minb}" if minb else plain
    kinds = ("linv_step", "uinv_step", "product") if mode == "dynamic" else ("static", "merged")
    kern = {k: template(f"getri_{k}", dtype, nb, bounds) for k in kinds}
    if not mma and not minb and nb == default_nb(dtype):
        return kern, _getri_names(dtype)  # the default set, compiled together
    return kern, tuple(kern.values())


def launch_getri(lu, piv, info, out, mode: str | None = None, minb: int = 0, mma: bool = False,
                 nb: int | None = None) -> None:
    """Inverse from ``getrf``'s ``lu`` (overwritten with L^-1 and U^-1), ``piv``, ``info`` into ``out``.

    ``mode``: "static" (one launch), "merged" (one launch, L and U steps interleaved; falls back to
    "static" where two panels do not fit in shared memory) or "dynamic" (one launch per step, active
    columns only). ``minb`` > 0: the kernels compiled with __launch_bounds__(threads, minb) (blocks per
    SM; fewer registers), by themselves; 0: the default (no such bound). ``mma``: the sums on FP64
    tensor cores (any mode, n <= 512; float / complex64 converted to double). ``nb``:
    the block-row height (GETRI_NBS; None: :func:`default_nb`'s): taller rows read the finished part of
    L^-1 / U^-1 fewer times, at the cost of registers and shared memory. With ``mode`` None all four
    come from :func:`getri_plan`. Matrices with info != 0 get NaN.
    """
    batch, n = lu.shape[0], lu.shape[-1]
    dtype = lu.dtype
    check("lu", lu, (batch, n, n), dtype)
    check("piv", piv, (batch, n), np.int32)
    check("info", info, (batch,), np.int32)
    check("out", out, lu.shape, dtype)
    check_n(n)
    if mode is None:
        mode, minb, mma, nb = getri_plan(dtype, n)
    if mode not in ("static", "merged", "dynamic"):
        raise ConfigError(f"Expected mode 'static', 'merged' or 'dynamic'. Got {mode!r} instead.")
    nb = default_nb(dtype) if nb is None else nb
    if nb not in GETRI_NBS:
        raise ConfigError(f"Expected a getri block-row height nb in {GETRI_NBS}. Got {nb!r} instead.")
    threads = -(-n // 32) * 32
    if mma and threads > 512:
        raise InputError(f"Expected mma only for n <= 512. Got n = {n} instead.")
    if batch == 0:
        return
    ldp, item = _ldp(dtype, nb), dtype.itemsize
    npad = -(-n // nb) * nb
    kern, names = getri_kernels(dtype, threads, mode, minb, mma, nb)

    def scratch_for(t):  # the per-warp scratch of the tensor-core sums (getri.cu's warp_scratch), t threads
        return (t // 32) * _SCRATCH_ROWS * _SCRATCH_LD * item if mma else 0

    scratch = scratch_for(threads)
    full = npad * ldp * item
    if getri_smem(dtype, n, mma, nb) > smem_optin():
        raise InputError(f"Expected getri's panel to fit in shared memory: n = {n} with nb = {nb} needs "
                         f"{full + scratch} bytes per block, this device allows {smem_optin()}. "
                         f"Use a smaller nb.")
    ni = np.int32(n)
    merged = 2 * npad * ldp * item + scratch
    rp = launch_perm(piv)
    if mode == "merged" and merged <= smem_optin():
        func = kernel(FAMILY, kern["merged"], names, merged)
        func((batch,), (threads,), (lu, rp, info, out, ni), shared_mem=merged)
        return
    if mode in ("static", "merged"):
        func = kernel(FAMILY, kern["static"], names, full + scratch)
        func((batch,), (threads,), (lu, rp, info, out, ni), shared_mem=full + scratch)
        return
    linv = kernel(FAMILY, kern["linv_step"], names, full + scratch)
    uinv = kernel(FAMILY, kern["uinv_step"], names, full + scratch)
    for i0 in range(0, n, nb):
        t = -(-min(n, i0 + nb) // 32) * 32
        linv((batch,), (t,), (lu, info, ni, np.int32(i0)), shared_mem=(i0 + nb) * ldp * item + scratch_for(t))
    for i0 in range((n - 1) // nb * nb, -1, -nb):
        t = -(-(n - i0) // 32) * 32
        uinv((batch,), (t,), (lu, info, ni, np.int32(i0)), shared_mem=(npad - i0) * ldp * item + scratch_for(t))
    prod = kernel(FAMILY, kern["product"], names, full + scratch)
    prod((batch,), (threads,), (lu, rp, info, out, ni), shared_mem=full + scratch)


# ---- backend entry points ---------------------------------------------------------------------

def inv_plan(dtype, n: int) -> str:
    """"tiny" (inv_tiny), "fused" (inv_gje) or "getri" (getrf + getri) for this dtype and n."""
    if n <= TINY_MAX_N[np.dtype(dtype)]:
        return "tiny"
    return "fused" if n <= FUSED_MAX_N[np.dtype(dtype)] and gje_tile(dtype, n) else "getri"


def inv(a):
    import cupy

    batch, n = a.shape[0], a.shape[-1]
    out = cupy.empty_like(a)
    plan = inv_plan(a.dtype, n)
    if plan == "tiny":
        info = cupy.empty((batch,), np.int32)
        launch_inv_tiny(a, out, info)
        return out, info
    if plan == "fused":
        info = cupy.empty((batch,), np.int32)
        launch_inv_gje(a, out, info)
        return out, info
    check_n(n)
    lu, piv, info = getrf(a)
    launch_getri(lu, piv, info, out)
    return out, info
