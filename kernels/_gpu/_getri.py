"""GPU inverse, solve and log-determinant built on the LU kernels (issue 4).

Kernels (``kernels/cuda``):

* ``inv_gje`` — fused inverse while the matrix fits in one block's registers: Gauss-Jordan with
  LAPACK's partial pivoting (implicit row order), unscrambled on the write;
* ``getrf_rows``'s ``gesv_rows`` — fused solve: getrf_rows' register LU with the right-hand sides as
  more register columns, then a backward substitution sweep;
* ``getri`` — inverse from ``getrf``'s factors: L^-1 and U^-1 by blocked delayed correction, then
  U^-1 L^-1 with the column interchange fused into the write; one static launch, or per-step
  launches sized to the active columns ("dynamic", the paper's allocation);
* ``getrs`` — forward/back substitution for (B, n, k) right-hand sides, pivots applied on the fly;
* ``slogdet`` — sign and log|det| from the LU diagonal and the interchange parity.

The ``launch_*`` functions run on preallocated outputs (tests poison them first; benchmarks reuse
them) on CuPy's current stream with no host synchronisation; :func:`getrs`, :func:`inv`,
:func:`solve` and :func:`slogdet` are the backend entry points (contract in ``kernels/_api.py``).
"""

from __future__ import annotations

import cupy
import numpy as np

from ._getrf import getrf, rows_min_blocks, rows_plan
from ._module import get_function

__all__ = ["getrs", "inv", "solve", "slogdet", "inv_plan", "solve_plan", "launch_inv_gje",
           "launch_gesv_rows", "gesv_rows_tile", "launch_getri", "launch_getrs", "launch_slogdet",
           "GJE_TILES", "MAX_N"]

_SCALAR = {
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
    np.dtype(np.complex64): "blu::c64",
    np.dtype(np.complex128): "blu::c128",
}
MAX_N = 1024  # getri/getrs run one thread per column or a panel of every row in shared memory

# Fused tiles (nmax, TI, TJ, RR, CC, MINB) per dtype: TI x TJ threads, each holding RR x CC elements
# in registers; MINB = blocks per SM asked of the compiler (caps registers). The largest per dtype keeps
# the whole matrix under ~64K 32-bit registers with no spills (ptxas -v, docs/getri-notes.md). The
# tiles for 32 < n <= 36 and 40 < n <= 64 are session 9's sweep (benchmarks/gje_sweep.py at n = 33 and
# 64 over every tile of whole warps that holds n, s9-gje-tiles.txt): 12x8x3x5 at n = 33 (float64 1.07x,
# complex64 1.11x, complex128 1.22x against 8x8x5x5; float32 keeps 8x8x5x5), 16x8x4x8 at n = 64
# (1.17-1.18x against 8x8x8x8 / 16x16x4x4) and 32x8x2x8 for complex128 (1.05x).
_GJE_SMALL = ((8, 4, 8, 2, 1, 1), (16, 4, 8, 4, 2, 1), (32, 8, 8, 4, 4, 1))
_GJE_33 = ((36, 12, 8, 3, 5, 1), (40, 8, 8, 5, 5, 1))
GJE_TILES = {
    np.dtype(np.float32): _GJE_SMALL + ((40, 8, 8, 5, 5, 1), (64, 16, 8, 4, 8, 2), (96, 16, 16, 6, 6, 1),
                                        (128, 16, 16, 8, 8, 1), (192, 32, 16, 6, 12, 1)),
    np.dtype(np.float64): _GJE_SMALL + _GJE_33 + ((64, 16, 8, 4, 8, 1), (96, 16, 16, 6, 6, 1),
                                                  (128, 32, 16, 4, 8, 1)),
    np.dtype(np.complex64): _GJE_SMALL + _GJE_33 + ((64, 16, 8, 4, 8, 1), (96, 16, 16, 6, 6, 1),
                                                    (128, 32, 16, 4, 8, 1)),
    np.dtype(np.complex128): _GJE_SMALL + _GJE_33 + ((64, 32, 8, 2, 8, 2), (96, 16, 16, 6, 6, 1)),
}
# Largest n sent to the fused kernels, per dtype (measured: docs/getri-notes.md). At most the largest
# tile above; beyond it, getrf + getri. Session 6: after the faster blocked getrf, getrf + getri (static)
# beat the fused kernel at float32 n = 96, 128, 160 (190: a tie) and float64 n = 96, 128, but not at
# n = 64, so both moved down to 64. Session 8 (s8-inv-fused-vs-getri.txt): with session 8's getrf and
# getri, getrf + getri beat it at complex64 n = 96 (6.62 against 9.33 ms) and 128 (13.28 / 14.43) and
# complex128 96 (12.62 / 12.90), not at 64, so complex64 / complex128 moved down to 64 too.
FUSED_MAX_N = {np.dtype(np.float32): 64, np.dtype(np.float64): 64,
               np.dtype(np.complex64): 64, np.dtype(np.complex128): 64}
# gesv_rows (the fused solve on getrf_rows' elimination): per dtype, (largest n, RR, TJ) rows, first
# match wins; the tile is getrf_rows' (rows_plan) plus ceil(k / TJ) right-hand-side columns per thread.
# Chosen from the H100 sweep in docs/getri-notes.md ("gesv_rows"); complex64 n = 64 goes to getrf +
# getrs since session 4's faster getrs (2.17 against 2.29 ms). Above the last n: getrf + getrs.
GESV_ROWS = {
    np.dtype(np.float32): ((16, 2, 4), (33, 5, 4), (48, 3, 4), (64, 8, 8), (96, 6, 8), (128, 8, 8)),
    np.dtype(np.float64): ((16, 2, 4), (33, 5, 8), (48, 6, 8), (96, 4, 8)),
    np.dtype(np.complex64): ((16, 2, 4), (33, 5, 8), (48, 3, 4)),
    np.dtype(np.complex128): ((16, 2, 4), (33, 5, 8), (48, 3, 8), (64, 4, 8)),
}
GESV_ROWS_MAX_RHS = 16
# getri launch shape per dtype ("static", "merged" or "dynamic"): measured, docs/getri-notes.md.
GETRI_MODE = {np.dtype(np.float32): "static", np.dtype(np.float64): "static",
              np.dtype(np.complex64): "dynamic", np.dtype(np.complex128): "static"}
# ... and where a blocks-per-SM bound, another mode or the sums on tensor cores measured faster (session 5,
# benchmarks/blocked_sweep.py --op getri at float64 / complex64 n = 190, complex128 n = 128, 190; session 8
# at n = 128, 190 for every dtype, s8-getri-sweep.txt: float32 128 dynamic 1.08x, 190 merged 1.02x; and
# float64 / complex128 at n = 96 .. 256 with and without mma, s8-getri-mma2.txt / s8-getri-old2.txt;
# float32 / complex64 the same, s8-getri-mma-c64f32.txt: complex64 keeps the per-step launches; session 9
# with taller block rows, nb, s9-getri-nb-*.txt: complex128 16 at every n (1.15-1.32x: half the reads of
# L^-1 / U^-1, which were DRAM-bound, s9-ncu-getri.txt), float64 32 above n = 128 (1.04-1.13x), float32
# 32 at n = 161 .. 190 (1.03x); complex64 and the other points keep theirs):
# (lowest n, largest n, mode, minb, mma[, nb: default _nb's]).
GETRI_PLANS = {np.dtype(np.float32): ((65, 96, "dynamic", 0, False), (97, 128, "merged", 5, True),
                                      (129, 160, "merged", 4, True), (161, 190, "dynamic", 0, False, 32),
                                      (191, 256, "merged", 0, False)),
               np.dtype(np.float64): ((65, 96, "merged", 3, True), (97, 128, "static", 3, True),
                                      (129, 160, "merged", 2, True, 32), (161, 190, "static", 2, True, 32),
                                      (191, 256, "merged", 0, True, 32)),
               np.dtype(np.complex128): ((65, 190, "dynamic", 0, True, 16), (191, 256, "merged", 0, True, 16))}


def getri_plan(dtype, n: int) -> tuple[str, int, bool, int]:
    """(mode, minb, mma, nb) of ``launch_getri`` for (dtype, n): GETRI_PLANS where it has a row (nb
    :func:`_nb`'s unless the row names one), else GETRI_MODE without a bound or mma."""
    dtype = np.dtype(dtype)
    for lo, hi, mode, minb, mma, *nb in GETRI_PLANS.get(dtype, ()):
        if lo <= n <= hi:
            return mode, minb, mma, nb[0] if nb else _nb(dtype)
    return GETRI_MODE[dtype], 0, False, _nb(dtype)
_SMEM_DEFAULT = 48 * 1024


def _nb(dtype) -> int:
    """Block-row height of getrs, and getri's default: NB values of T fill whole 16-byte vectors."""
    return 8 if np.dtype(dtype).itemsize == 16 else 16


GETRI_NBS = (8, 16, 32)  # the block-row heights launch_getri accepts (whole 16-byte vectors, mma row tiles)


def _check(name, arr, shape, dtype):
    if arr.shape != tuple(shape) or arr.dtype != np.dtype(dtype) or not arr.flags.c_contiguous:
        raise ValueError(f"Expected {name} to be a C-contiguous {np.dtype(dtype)} array of shape "
                         f"{tuple(shape)}. Got {arr.dtype} {arr.shape} "
                         f"(C-contiguous: {arr.flags.c_contiguous}) instead.")


def _check_n(n: int) -> None:
    if n > MAX_N:
        raise ValueError(f"Expected n <= {MAX_N} for the GPU inverse and solve kernels. "
                         f"Got n = {n} instead.")


def _smem_optin() -> int:
    """Largest dynamic shared memory a block may ask for on this device."""
    attr = getattr(cupy.cuda.runtime, "cudaDevAttrMaxSharedMemoryPerBlockOptin", 97)
    return int(cupy.cuda.runtime.deviceGetAttribute(attr, cupy.cuda.runtime.getDevice()))


def _kernel(family: str, name: str, names: tuple[str, ...], smem: int = 0):
    func = get_function(family, name, names=names)
    if smem > _SMEM_DEFAULT and func.max_dynamic_shared_size_bytes < smem:
        func.max_dynamic_shared_size_bytes = smem
    return func


# ---- fused Gauss-Jordan inverse -----------------------------------------------------------------

def gje_tile(dtype, n: int):
    """The smallest fused tile (TI, TJ, RR, CC, MINB) holding an n x n matrix, or None."""
    for nmax, *tile in GJE_TILES[np.dtype(dtype)]:
        if n <= nmax:
            return tuple(tile)
    return None


def _gje_name(dtype, tile) -> str:
    return "blu::inv_gje<{}, {}, {}, {}, {}, {}>".format(_SCALAR[np.dtype(dtype)], *tile)


def _gje_names(dtype, extra=None) -> tuple[str, ...]:
    """The fused instantiations compiled together: the table's tiles, or one tile outside it alone."""
    tiles = [t[1:] for t in GJE_TILES[np.dtype(dtype)]]
    if extra is not None and tuple(extra) not in tiles:
        tiles = [tuple(extra)]
    return tuple(_gje_name(dtype, t) for t in tiles)


def _check_tile(tile, n):
    if tile is None or len(tile) != 5 or tile[0] * tile[2] < n or tile[1] * tile[3] < n:
        raise ValueError(f"Expected a fused tile (TI, TJ, RR, CC, MINB) holding n = {n}. "
                         f"Got {tile} instead.")


def launch_inv_gje(a, out, info, tile=None) -> None:
    """Fused inverse of ``a`` (B, n, n) into ``out`` (B, n, n) and ``info`` (B,) int32."""
    batch, n = a.shape[0], a.shape[-1]
    _check("a", a, (batch, n, n), a.dtype)
    _check("out", out, a.shape, a.dtype)
    _check("info", info, (batch,), np.int32)
    tile = tuple(tile) if tile is not None else gje_tile(a.dtype, n)
    _check_tile(tile, n)
    if batch == 0:
        return
    smem = n * n * a.itemsize
    func = _kernel("inv_gje", _gje_name(a.dtype, tile), _gje_names(a.dtype, tile), smem)
    func((batch,), (tile[0] * tile[1],), (a, out, info, np.int32(n)), shared_mem=smem)


# ---- fused solve on getrf_rows' elimination -------------------------------------------------------

def gesv_rows_tile(dtype, n: int, k: int, rr_tj=None):
    """The gesv_rows tile (TI, TJ, RR, CC, CB) for order n and k right-hand sides: (RR, TJ) from
    ``rr_tj`` or GESV_ROWS; None where neither applies (n beyond the table, k > GESV_ROWS_MAX_RHS)."""
    if rr_tj is None:
        if k > GESV_ROWS_MAX_RHS:
            return None
        rr_tj = next(((rr, tj) for nmax, rr, tj in GESV_ROWS[np.dtype(dtype)] if n <= nmax), None)
        if rr_tj is None:
            return None
    ti, tj, rr, cc = rows_plan(max(n, 1), *rr_tj).tile
    return (ti, tj, rr, cc, max(1, -(-k // tj)))


def _gesv_rows_name(dtype, tile) -> str:
    ti, tj, rr, cc, cb = tile
    # registers as getrf_rows' tile with the CB right-hand-side columns on top (ptxas -v on the swept
    # tiles: at most a few words spilled on three of them)
    minb = rows_min_blocks(dtype, (ti, tj, rr, cc + cb))
    return f"blu::gesv_rows<{_SCALAR[np.dtype(dtype)]}, {ti}, {tj}, {rr}, {cc}, {cb}, {minb}>"


def launch_gesv_rows(a, b, x, info, tile=None) -> None:
    """Fused solve of ``a`` (B, n, n) against ``b`` (B, n, k) into ``x`` (B, n, k) and ``info`` (B,)
    int32 by ``gesv_rows``; ``tile`` (TI, TJ, RR, CC, CB) defaults to :func:`gesv_rows_tile`'s."""
    batch, n = a.shape[0], a.shape[-1]
    k = b.shape[-1]
    _check("a", a, (batch, n, n), a.dtype)
    _check("b", b, (batch, n, k), a.dtype)
    _check("x", x, (batch, n, k), a.dtype)
    _check("info", info, (batch,), np.int32)
    tile = tuple(tile) if tile is not None else gesv_rows_tile(a.dtype, n, k)
    if (tile is None or len(tile) != 5 or tile[0] * tile[2] < n or tile[1] * tile[3] < n
            or tile[1] * tile[4] < k or (tile[0] * tile[1]) % 32 or tile[0] * tile[1] > 1024):
        raise ValueError(f"Expected a gesv_rows tile (TI, TJ, RR, CC, CB) of whole warps holding n = {n} "
                         f"and k = {k} right-hand sides. Got {tile} instead.")
    if batch == 0 or n == 0 or k == 0:
        return
    name = _gesv_rows_name(a.dtype, tile)
    func = get_function("getrf_rows", name)
    func((batch,), (tile[0] * tile[1],), (a, b, x, info, np.int32(n), np.int32(k)))


# ---- getri: inverse from the LU factors ---------------------------------------------------------

def _getri_names(dtype) -> tuple[str, ...]:
    """The getri kernels compiled together: the default block-row height, no bound, no mma."""
    s, nb = _SCALAR[np.dtype(dtype)], _nb(dtype)
    return tuple(f"blu::{k}" for k in (
        f"getri_static<{s}, {nb}, 256>", f"getri_static<{s}, {nb}, 1024>",
        f"getri_merged<{s}, {nb}, 256>", f"getri_merged<{s}, {nb}, 1024>",
        f"getri_product<{s}, {nb}, 256>", f"getri_product<{s}, {nb}, 1024>",
        f"getri_linv_step<{s}, {nb}, 256>", f"getri_uinv_step<{s}, {nb}, 256>",
        f"getri_linv_step<{s}, {nb}, 1024>", f"getri_uinv_step<{s}, {nb}, 1024>"))


def _ldp(dtype, nb: int | None = None) -> int:
    """Stride of getri's / getrs' transposed panels (getri.cu's getri_panel::LDP)."""
    return (nb or _nb(dtype)) + 16 // np.dtype(dtype).itemsize


_SCRATCH_ROWS, _SCRATCH_LD = 8, 33  # getri.cu's kScratchRows, kScratchLd: a warp's 8 x 32 sums, padded


def mma_bounds(threads: int, minb: int) -> str:
    """The last template arguments (MAXT, MINB, MMA) of the getri kernels with the tensor-core sums for a
    launch of ``threads``: MAXT at most 512 (getri.cu's GetriMma)."""
    return f"{threads if minb else 256 if threads <= 256 else 512}, {minb}, true"


def getri_kernels(dtype, threads: int, mode: str, minb: int, mma: bool, nb: int) -> tuple[dict, tuple[str, ...]]:
    """({kind: kernel name} of ``launch_getri``'s launch of ``threads`` threads, the kernels compiled
    together); the sweep (benchmarks/blocked_sweep.py) precompiles the same sets."""
    s = _SCALAR[np.dtype(dtype)]
    plain = 256 if threads <= 256 else 1024
    bounds = mma_bounds(threads, minb) if mma else f"{threads}, {minb}" if minb else plain
    kinds = ("linv_step", "uinv_step", "product") if mode == "dynamic" else ("static", "merged")
    kern = {k: f"blu::getri_{k}<{s}, {nb}, {bounds}>" for k in kinds}
    if not mma and not minb and nb == _nb(dtype):
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
    the block-row height (GETRI_NBS; None: :func:`_nb`'s): taller rows read the finished part of
    L^-1 / U^-1 fewer times, at the cost of registers and shared memory. With ``mode`` None all four
    come from :func:`getri_plan`. Matrices with info != 0 get NaN.
    """
    batch, n = lu.shape[0], lu.shape[-1]
    dtype = lu.dtype
    _check("lu", lu, (batch, n, n), dtype)
    _check("piv", piv, (batch, n), np.int32)
    _check("info", info, (batch,), np.int32)
    _check("out", out, lu.shape, dtype)
    _check_n(n)
    if mode is None:
        mode, minb, mma, nb = getri_plan(dtype, n)
    if mode not in ("static", "merged", "dynamic"):
        raise ValueError(f"Expected mode 'static', 'merged' or 'dynamic'. Got {mode!r} instead.")
    nb = _nb(dtype) if nb is None else nb
    if nb not in GETRI_NBS:
        raise ValueError(f"Expected a getri block-row height nb in {GETRI_NBS}. Got {nb!r} instead.")
    threads = -(-n // 32) * 32
    if mma and threads > 512:
        raise ValueError(f"Expected mma only for n <= 512. Got n = {n} instead.")
    if batch == 0:
        return
    ldp, item = _ldp(dtype, nb), dtype.itemsize
    npad = -(-n // nb) * nb
    kern, names = getri_kernels(dtype, threads, mode, minb, mma, nb)

    def scratch_for(t):  # the per-warp scratch of the tensor-core sums (getri.cu's warp_scratch), t threads
        return (t // 32) * _SCRATCH_ROWS * _SCRATCH_LD * item if mma else 0

    scratch = scratch_for(threads)
    full = npad * ldp * item
    if full + scratch > _smem_optin():
        raise ValueError(f"Expected getri's panel to fit in shared memory: n = {n} with nb = {nb} needs "
                         f"{full + scratch} bytes per block, this device allows {_smem_optin()}. "
                         f"Use a smaller nb.")
    ni = np.int32(n)
    merged = 2 * npad * ldp * item + scratch
    rp = launch_perm(piv)
    if mode == "merged" and merged <= _smem_optin():
        func = _kernel("getri", kern["merged"], names, merged)
        func((batch,), (threads,), (lu, rp, info, out, ni), shared_mem=merged)
        return
    if mode in ("static", "merged"):
        func = _kernel("getri", kern["static"], names, full + scratch)
        func((batch,), (threads,), (lu, rp, info, out, ni), shared_mem=full + scratch)
        return
    linv = _kernel("getri", kern["linv_step"], names, full + scratch)
    uinv = _kernel("getri", kern["uinv_step"], names, full + scratch)
    for i0 in range(0, n, nb):
        t = -(-min(n, i0 + nb) // 32) * 32
        linv((batch,), (t,), (lu, info, ni, np.int32(i0)), shared_mem=(i0 + nb) * ldp * item + scratch_for(t))
    for i0 in range((n - 1) // nb * nb, -1, -nb):
        t = -(-(n - i0) // 32) * 32
        uinv((batch,), (t,), (lu, info, ni, np.int32(i0)), shared_mem=(npad - i0) * ldp * item + scratch_for(t))
    prod = _kernel("getri", kern["product"], names, full + scratch)
    prod((batch,), (threads,), (lu, rp, info, out, ni), shared_mem=full + scratch)


# ---- getrs ------------------------------------------------------------------------------------

def launch_perm(piv, rp=None):
    """Row order ``rp`` (B, n) int32 of P^T A from LAPACK's interchanges ``piv`` (one thread per
    matrix); shared by getri (column interchange) and getrs (gathered right-hand sides)."""
    batch, n = piv.shape
    rp = cupy.empty((batch, n), np.int32) if rp is None else rp
    _check("rp", rp, (batch, n), np.int32)
    if batch:
        func = _kernel("getrs", "blu::perm_from_piv", ("blu::perm_from_piv",))
        func((-(-batch // 128),), (128,), (piv, rp, np.int32(n), np.int64(batch)))
    return rp


def _getrs_names(dtype) -> tuple[str, ...]:
    s, nb = _SCALAR[np.dtype(dtype)], _nb(dtype)
    return tuple(f"blu::getrs_kernel<{s}, {nb}, {c}>" for c in _GETRS_KC)


_GETRS_KC = (1, 2, 4, 8, 16)
_GETRS_SMEM = 96 * 1024


def _getrs_kc(dtype, n: int, k: int) -> int:
    """Right-hand-side columns per block: the fewest powers of two covering k (at most 16), while the
    block's copy of them (npad x KC) stays within 96 KB."""
    nb = _nb(dtype)
    npad = -(-n // nb) * nb
    kc = next(c for c in _GETRS_KC if c >= min(k, 16))
    while kc > 1 and npad * kc * np.dtype(dtype).itemsize > _GETRS_SMEM:
        kc //= 2
    return kc


def launch_getrs(lu, piv, b, x, info=None) -> None:
    """Solve into ``x`` (B, n, k) from ``lu``, ``piv`` and ``b`` (B, n, k); ``info`` given: NaN where
    info != 0 (solve); not given: a zero pivot gives inf/NaN in that matrix's x (lu_solve)."""
    batch, n = lu.shape[0], lu.shape[-1]
    k = b.shape[-1]
    dtype = lu.dtype
    _check("lu", lu, (batch, n, n), dtype)
    _check("piv", piv, (batch, n), np.int32)
    _check("b", b, (batch, n, k), dtype)
    _check("x", x, (batch, n, k), dtype)
    if info is not None:
        _check("info", info, (batch,), np.int32)
    _check_n(n)
    if batch == 0 or k == 0:
        return
    nb = _nb(dtype)
    kc = _getrs_kc(dtype, n, k)
    s = _SCALAR[dtype]
    npad = -(-n // nb) * nb
    # Y (npad x KC), the partial sums (256), a staged chunk of NB rows (getrs_tw / getrs_ldt in
    # getrs.cu: 16 KB, rows padded by 16 bytes) and the NB x NB diagonal block
    ldt = 16384 // (nb * dtype.itemsize) + max(1, 16 // dtype.itemsize)
    smem = (npad * kc + 256 + nb * ldt + nb * nb) * dtype.itemsize
    func = _kernel("getrs", f"blu::getrs_kernel<{s}, {nb}, {kc}>", _getrs_names(dtype), smem)
    rp = launch_perm(piv)
    info_arg = info if info is not None else np.uint64(0)
    func((batch, -(-k // kc)), (256,), (lu, rp, info_arg, b, x, np.int32(n), np.int32(k)),
         shared_mem=smem)


# ---- slogdet ------------------------------------------------------------------------------------

def launch_slogdet(lu, piv, info, sign, logabsdet) -> None:
    """Sign (input dtype) and log|det| (real) from ``getrf``'s outputs into preallocated arrays."""
    batch, n = lu.shape[0], lu.shape[-1]
    dtype = lu.dtype
    real = np.empty(0, dtype).real.dtype
    _check("lu", lu, (batch, n, n), dtype)
    _check("piv", piv, (batch, n), np.int32)
    _check("info", info, (batch,), np.int32)
    _check("sign", sign, (batch,), dtype)
    _check("logabsdet", logabsdet, (batch,), real)
    if batch == 0:
        return
    names = tuple(f"blu::slogdet_kernel<{s}>" for s in _SCALAR.values())
    func = _kernel("slogdet", f"blu::slogdet_kernel<{_SCALAR[dtype]}>", names)
    func((-(-batch // 4),), (128,), (lu, piv, info, sign, logabsdet, np.int32(n), np.int64(batch)))


# ---- compilation ahead of use ------------------------------------------------------------------

def kernel_groups(dtype) -> list[tuple[str, tuple[str, ...]]]:
    """(family, instantiations) compiled together for ``dtype``: one NVRTC run each."""
    dtype = np.dtype(dtype)
    s, nb = _SCALAR[dtype], _nb(dtype)
    return [("inv_gje", _gje_names(dtype)),
            ("getri", _getri_names(dtype)),
            ("getrs", _getrs_names(dtype)),
            ("getrs", ("blu::perm_from_piv",)),
            ("slogdet", tuple(f"blu::slogdet_kernel<{x}>" for x in _SCALAR.values()))]


def warm(dtype) -> None:
    """Compile (or load from CuPy's cache) the kernels this module may launch for ``dtype``, except
    ``gesv_rows``, whose instantiation depends on n and k, and the getri kernels with a blocks-per-SM
    bound or mma (``GETRI_PLANS``, their instantiation depends on the thread count): those compile at first use."""
    for family, names in kernel_groups(dtype):
        get_function(family, names[0], names=names)


# ---- backend entry points ---------------------------------------------------------------------

def inv_plan(dtype, n: int) -> str:
    """"fused" (inv_gje) or "getri" (getrf + getri) for this dtype and n."""
    return "fused" if n <= FUSED_MAX_N[np.dtype(dtype)] and gje_tile(dtype, n) else "getri"


def solve_plan(dtype, n: int, k: int) -> str:
    """"rows" (gesv_rows) or "getrs" (getrf + getrs) for this dtype, n and k right-hand sides."""
    return "rows" if gesv_rows_tile(dtype, n, k) is not None else "getrs"


def getrs(lu, piv, b):
    x = cupy.empty(b.shape, lu.dtype)
    launch_getrs(lu, piv, b.astype(lu.dtype, copy=False), x)
    return x


def inv(a):
    batch, n = a.shape[0], a.shape[-1]
    out = cupy.empty_like(a)
    if inv_plan(a.dtype, n) == "fused":
        info = cupy.empty((batch,), np.int32)
        launch_inv_gje(a, out, info)
        return out, info
    _check_n(n)
    lu, piv, info = getrf(a)
    launch_getri(lu, piv, info, out)
    return out, info


def solve(a, b):
    batch, n, k = a.shape[0], a.shape[-1], b.shape[-1]
    b = b.astype(a.dtype, copy=False)
    x = cupy.empty(b.shape, a.dtype)
    if solve_plan(a.dtype, n, k) == "rows":
        info = cupy.empty((batch,), np.int32)
        launch_gesv_rows(a, b, x, info)
        return x, info
    _check_n(n)
    lu, piv, info = getrf(a)
    launch_getrs(lu, piv, b, x, info)
    return x, info


def slogdet(a):
    batch = a.shape[0]
    lu, piv, info = getrf(a)
    sign = cupy.empty((batch,), a.dtype)
    logabsdet = cupy.empty((batch,), np.empty(0, a.dtype).real.dtype)
    launch_slogdet(lu, piv, info, sign, logabsdet)
    return sign, logabsdet, info
