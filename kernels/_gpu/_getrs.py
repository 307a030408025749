"""GPU getrs and solve: forward / back substitution from the LU factors, the family of
``kernels/cuda/getrs.cu``.

* ``perm_from_piv`` turns LAPACK's interchanges into the row order of P^T A, one thread per matrix
  (getri uses it for its column interchange too);
* ``getrs_warp`` solves (B, n, k) right-hand sides with one warp per matrix and group of KC columns,
  block rows of 32 rows, L and U streamed through shared memory two chunks ahead, no block barrier;
* ``getrs_kernel`` solves them with one 256-thread block per matrix and group of KC columns, block
  rows of NB rows with delayed correction, the rows of L and U staged in shared memory. It runs where
  :data:`GETRS_BLOCK` says (complex128 from n = 160 at k >= 16 and from n = 1024; float64 and
  complex64 from n = 1024 at k >= 32), getrs_warp everywhere else.

:func:`solve` (``A X = B``) goes to the fused ``gesv_rows`` (``_gesv``) where :func:`solve_plan`
says so, else to getrf + getrs. :func:`launch_getrs` and :func:`launch_perm` run on preallocated
outputs on CuPy's current stream with no host synchronisation.
"""

from __future__ import annotations

import numpy as np

from batchlu.errors import InputError

from ._gesv import gesv_rows_fits, gesv_rows_tile, launch_gesv_rows
from ._getrf import getrf
from ._runtime import MAX_N, check, check_n, kernel, smem_optin, template


FAMILY = "getrs"
_PERM = "blu::perm_from_piv"
GETRS_KC = (1, 2, 4, 8, 16)  # right-hand-side columns per block
_GETRS_SMEM = 96 * 1024


def default_nb(dtype) -> int:
    """Block-row height of getrs, and getri's default: NB values of T fill whole 16-byte vectors."""
    return 8 if np.dtype(dtype).itemsize == 16 else 16


def launch_perm(piv, rp=None):
    """Row order ``rp`` (B, n) int32 of P^T A from LAPACK's interchanges ``piv`` (one thread per
    matrix); shared by getri (column interchange) and getrs (gathered right-hand sides)."""
    import cupy

    batch, n = piv.shape
    rp = cupy.empty((batch, n), np.int32) if rp is None else rp
    check("rp", rp, (batch, n), np.int32)
    if batch:
        func = kernel(FAMILY, _PERM, (_PERM,))
        func((-(-batch // 128),), (128,), (piv, rp, np.int32(n), np.int64(batch)))
    return rp


# getrs_warp: warps per block (independent), its chunk slots, the right-hand-side columns a warp may
# hold. It is dispatched except where getrs_kernel measured faster on the H100 (batch 10,000 or 2 GB
# of matrices; benchmarks/results/getrs-h100.txt): GETRS_BLOCK, per dtype, (n, k) pairs from which on
# (n >= and k >=) getrs_kernel runs.
GETRS_WARP_NW = 4
GETRS_WARP_STAGES = 3  # chunk slots a warp cycles through: 2 chunks in flight while it computes one
GETRS_WARP_KC = (1, 2, 4, 8, 16)
# the most right-hand sides a warp takes: 8-byte and wider types ran faster with two warps a matrix at
# k = 16 (fewer registers and less shared memory a warp, more warps an SM)
GETRS_WARP_KC_MAX = {np.dtype(np.float32): 16, np.dtype(np.float64): 8, np.dtype(np.complex64): 8,
                     np.dtype(np.complex128): 8}
_GETRS_WARP_SMEM = 28 * 1024  # a warp's shared memory at most (about 8 warps an SM)
GETRS_BLOCK = {np.dtype(np.float32): (), np.dtype(np.float64): ((1024, 32),),
               np.dtype(np.complex64): ((1024, 32),), np.dtype(np.complex128): ((160, 16), (1024, 1))}


def _warp_smem(dtype, n: int, kc: int, stages: int = GETRS_WARP_STAGES) -> int:
    """One getrs_warp warp's shared memory: ``stages`` staged chunks of 32 rows (getrs_ldw of getrs.cu:
    64 bytes of columns and 16 of padding a row) and Y (n rounded up to 32, x KC)."""
    size = np.dtype(dtype).itemsize
    ldw = 64 // size + max(1, 16 // size)
    return (stages * 32 * ldw + -(-n // 32) * 32 * kc) * size


def _warp_kc(dtype, n: int, k: int) -> int:
    """Right-hand-side columns per getrs_warp warp: the fewest powers of two covering k (at most
    GETRS_WARP_KC_MAX), while the warp's shared memory stays within _GETRS_WARP_SMEM."""
    kc = next(c for c in GETRS_WARP_KC if c >= min(k, GETRS_WARP_KC_MAX[np.dtype(dtype)]))
    while kc > 1 and _warp_smem(dtype, n, kc) > _GETRS_WARP_SMEM:
        kc //= 2
    return kc


def _check_kind(kind: str | None) -> None:
    if kind not in (None, "warp", "block"):
        raise InputError(f"Expected getrs kind 'warp' or 'block'. Got {kind!r} instead.")


def getrs_plan(dtype, n: int, k: int, kind: str | None = None, smem: int | None = None) -> tuple[str, int]:
    """("warp", KC) for getrs_warp or ("block", KC) for getrs_kernel, for order n and k right-hand
    sides; with ``smem`` (bytes a block may opt in to), getrs_kernel also where getrs_warp's block
    would not fit; ``kind`` forces the kernel (tests and A/B timings). Needs no GPU."""
    dtype = np.dtype(dtype)
    _check_kind(kind)
    if kind is None:
        if not any(n >= nmin and k >= kmin for nmin, kmin in GETRS_BLOCK[dtype]):
            warp = ("warp", _warp_kc(dtype, n, k))
            if smem is None or _plan_smem(dtype, n, warp) <= smem:
                return warp
        kind = "block"
    return kind, (_warp_kc if kind == "warp" else _getrs_kc)(dtype, n, k)


def getrs_names(dtype) -> tuple[str, ...]:
    """The getrs instantiations compiled together for ``dtype``: one per KC of each kernel."""
    return (tuple(template("getrs_kernel", dtype, default_nb(dtype), c) for c in GETRS_KC)
            + tuple(template("getrs_warp", dtype, c, GETRS_WARP_NW, GETRS_WARP_STAGES)
                    for c in GETRS_WARP_KC))


def _getrs_kc(dtype, n: int, k: int) -> int:
    """Right-hand-side columns per block: the fewest powers of two covering k (at most 16), while the
    block's copy of them (npad x KC) stays within 96 KB."""
    nb = default_nb(dtype)
    npad = -(-n // nb) * nb
    kc = next(c for c in GETRS_KC if c >= min(k, 16))
    while kc > 1 and npad * kc * np.dtype(dtype).itemsize > _GETRS_SMEM:
        kc //= 2
    return kc


def _plan_smem(dtype, n: int, plan: tuple[str, int], stages: int = GETRS_WARP_STAGES) -> int:
    """Shared memory of one block of ``plan`` (:func:`getrs_plan`). getrs_warp: GETRS_WARP_NW warps'
    (:func:`_warp_smem`, ``stages`` chunk slots). getrs_kernel: Y (npad x KC), the partial sums (256), a staged chunk of NB
    rows (getrs_tw / getrs_ldt in getrs.cu: 16 KB, rows padded by 16 bytes) and the NB x NB diagonal
    block."""
    dtype = np.dtype(dtype)
    kind, kc = plan
    if kind == "warp":
        return GETRS_WARP_NW * _warp_smem(dtype, n, kc, stages)
    nb = default_nb(dtype)
    npad = -(-n // nb) * nb
    ldt = 16384 // (nb * dtype.itemsize) + max(1, 16 // dtype.itemsize)
    return (npad * kc + 256 + nb * ldt + nb * nb) * dtype.itemsize


def getrs_smem(dtype, n: int, k: int, smem: int | None = None) -> int:
    """Shared memory of one getrs block for order n and k right-hand sides (the kernel
    :func:`getrs_plan` dispatches on a device allowing ``smem`` bytes a block)."""
    return _plan_smem(dtype, n, getrs_plan(dtype, n, k, smem=smem))


def getrs_fits(dtype, n: int, k: int, smem: int) -> bool:
    """Whether :func:`launch_getrs` runs for order n and k right-hand sides on a device that lets a
    block opt in to ``smem`` bytes: n within MAX_N, the block's shared memory within ``smem``. Needs
    no GPU."""
    return n <= MAX_N and getrs_smem(dtype, n, k, smem) <= smem


def launch_getrs(lu, piv, b, x, info=None, kind: str | None = None, stages: int | None = None,
                 kc: int | None = None) -> None:
    """Solve into ``x`` (B, n, k) from ``lu``, ``piv`` and ``b`` (B, n, k); ``info`` given: NaN where
    info != 0 (solve); not given: a zero pivot gives inf/NaN in that matrix's x (lu_solve). ``kind``
    ("warp" or "block") overrides :func:`getrs_plan`'s kernel, ``stages`` and ``kc`` getrs_warp's
    chunk slots and right-hand sides a warp (tests and A/B timings)."""
    batch, n = lu.shape[0], lu.shape[-1]
    k = b.shape[-1]
    dtype = lu.dtype
    check("lu", lu, (batch, n, n), dtype)
    check("piv", piv, (batch, n), np.int32)
    check("b", b, (batch, n, k), dtype)
    check("x", x, (batch, n, k), dtype)
    if info is not None:
        check("info", info, (batch,), np.int32)
    check_n(n)
    if batch == 0 or k == 0:
        return
    _check_kind(kind)  # before smem_optin(): a bad kind is an InputError without a GPU
    if kc is not None and (kind != "warp" or kc not in GETRS_WARP_KC):
        raise InputError(f"Expected kind 'warp' and a getrs_warp KC among {GETRS_WARP_KC}. Got {kc} "
                         f"for kind {kind!r} instead.")
    stages = stages or GETRS_WARP_STAGES
    if stages < 2:
        raise InputError(f"Expected at least 2 getrs_warp stages. Got {stages} instead.")
    plan, planned = getrs_plan(dtype, n, k, kind, smem_optin())
    kc = kc or planned
    smem = _plan_smem(dtype, n, (plan, kc), stages)
    if smem > smem_optin():
        raise InputError(f"Expected getrs' block to fit in shared memory: n = {n} with {kc} right-hand "
                         f"sides per {plan} needs {smem} bytes, this device allows {smem_optin()}.")
    info_arg = info if info is not None else np.uint64(0)
    if plan == "warp":
        name = template("getrs_warp", dtype, kc, GETRS_WARP_NW, stages)
        names = getrs_names(dtype)
        func = kernel(FAMILY, name, names if name in names else (name,), smem)
        groups = -(-k // kc)
        tasks = batch * groups
        vec = int(n % max(1, 16 // dtype.itemsize) == 0 and lu.data.ptr % 16 == 0)
        func((-(-tasks // GETRS_WARP_NW),), (32 * GETRS_WARP_NW,),
             (lu, piv, info_arg, b, x, np.int32(n), np.int32(k), np.int32(groups), np.int64(tasks),
              np.int32(vec)), shared_mem=smem)
        return
    func = kernel(FAMILY, template("getrs_kernel", dtype, default_nb(dtype), kc), getrs_names(dtype), smem)
    rp = launch_perm(piv)
    func((batch, -(-k // kc)), (256,), (lu, rp, info_arg, b, x, np.int32(n), np.int32(k)),
         shared_mem=smem)


# ---- backend entry points ---------------------------------------------------------------------

def solve_plan(dtype, n: int, k: int, smem: int | None = None) -> str:
    """"rows" (gesv_rows) or "getrs" (getrf + getrs) for this dtype, n and k right-hand sides; with
    ``smem`` (bytes a block may opt in to), "rows" only where its block fits that."""
    if smem is not None:
        return "rows" if gesv_rows_fits(dtype, n, k, smem) else "getrs"
    return "rows" if gesv_rows_tile(dtype, n, k) is not None else "getrs"


def getrs(lu, piv, b):
    import cupy

    x = cupy.empty(b.shape, lu.dtype)
    launch_getrs(lu, piv, b.astype(lu.dtype, copy=False), x)
    return x


def solve(a, b):
    import cupy

    batch, n, k = a.shape[0], a.shape[-1], b.shape[-1]
    b = b.astype(a.dtype, copy=False)
    x = cupy.empty(b.shape, a.dtype)
    if solve_plan(a.dtype, n, k, smem_optin()) == "rows":
        info = cupy.empty((batch,), np.int32)
        launch_gesv_rows(a, b, x, info)
        return x, info
    check_n(n)
    lu, piv, info = getrf(a)
    launch_getrs(lu, piv, b, x, info)
    return x, info
