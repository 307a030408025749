"""GPU getrf: batched LU with partial pivoting, the family of ``kernels/cuda/getrf.cu``.

Four kernels:

* ``getrf_tiny`` (n <= 8): one thread per matrix, the matrix in its registers, the block's matrices
  read and written through shared memory;
* ``getrf_small`` (n <= 32): NP lanes per matrix, one row per lane in registers, lazy swaps;
* ``getrf_rows`` (any tile up to ~190 in float32; dispatched where it measured fastest): one block
  per matrix, the whole matrix in registers (RR rows of CC elements per thread, TJ threads per row),
  right-looking, one barrier per column (none for one-warp tiles);
* ``getrf_blocked`` (any n): one block per matrix, blocked left-looking LU with the current panel of
  NB columns in shared memory (paper 000's design, in C-order).

:func:`getrf_plan` picks the kernel and its tile from (dtype, n) by :data:`GETRF_DISPATCH`.
:func:`launch_getrf` runs one plan on preallocated outputs, so tests can poison the outputs and
benchmarks can reuse buffers; :func:`getrf` is the backend entry point.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from batchlu.errors import InputError

from ._runtime import kernel, smem_optin, smem_per_sm, template


FAMILY = "getrf"
SMALL_NP = (2, 4, 8, 16, 32)
# NB by itemsize (NB * itemsize % 16 == 0, NB <= 32: one warp solves the NB columns of U_b).
BLOCKED_NB = {4: (8, 16, 32), 8: (8, 16, 32), 16: (4, 8, 16)}
_SMALL_THREADS = 128
TINY_N = 8   # the largest n the one-thread-per-matrix kernels (getrf_tiny, inv_tiny) take
_MAX_THREADS = 512
_MAX_GRID = 1 << 20
# Per dtype, (largest n, kind, tile) rows, first match wins; see docs/design.md#getrf-dispatch.
# "tiny": tile unused (one thread per matrix, n <= TINY_N; complex128 from n = 6 would need more than
# 255 registers); "small": tile unused (NP = n rounded up to a power of two); "rows": (RR, TJ[, step,
# minb]), see rows_plan; "blocked"
# (panel rows in registers) and "blocked_smem" (panel in shared memory): NB, (NB, minb) or (NB, minb,
# kb), minb blocks per SM in __launch_bounds__ (0: no bound), kb columns per block of L (default NB).
GETRF_DISPATCH = {
    np.dtype(np.float32): ((8, "tiny", 0), (16, "rows", (1, 2)), (24, "rows", (1, 1)),
                           (33, "rows", (5, 4, 4)), (48, "rows", (6, 4)), (64, "rows", (4, 4)),
                           (96, "blocked_smem", (16, 6, 8)), (128, "blocked_smem", (16, 8)),
                           (160, "blocked_smem", (16, 6)),
                           (190, "blocked_smem", (32, 3, 8)), (256, "blocked_smem", (16, 4)),
                           (1 << 30, "blocked_smem", 16)),
    np.dtype(np.float64): ((8, "tiny", 0), (24, "rows", (1, 2)), (33, "rows", (5, 4, 4)),
                           (48, "rows", (6, 4)), (64, "rows", (2, 4)), (96, "blocked_smem", (16, 7, 8)),
                           (128, "blocked_smem", (16, 6, 8)), (160, "blocked_smem", (16, 5, 8)),
                           (190, "blocked_smem", (32, 3, 8)), (256, "blocked", 16), (1 << 30, "blocked_smem", 8)),
    np.dtype(np.complex64): ((8, "tiny", 0), (24, "rows", (1, 2)), (33, "rows", (5, 4, 4)),
                             (48, "rows", (3, 4)), (64, "rows", (4, 8)), (96, "blocked_smem", (16, 7, 8)),
                             (128, "blocked_smem", (16, 6, 8)), (160, "blocked_smem", (16, 5, 8)),
                             (190, "blocked_smem", (16, 4, 8)), (256, "blocked_smem", (16, 3, 8)),
                             (1 << 30, "blocked_smem", 8)),
    np.dtype(np.complex128): ((5, "tiny", 0), (8, "small", 0), (24, "rows", (1, 2)), (33, "rows", (9, 8, 4)),
                              (48, "rows", (4, 8)), (64, "blocked_smem", 8), (96, "blocked", (8, 2)),
                              (160, "blocked", 8), (190, "blocked_smem", (16, 2, 4)), (1 << 30, "blocked", 8)),
}


@dataclass(frozen=True)
class Plan:
    """One kernel launch configuration: ``kind`` is "tiny" (tile = n: one thread per matrix), "small"
    (tile = NP), "blocked" (tile = NB, panel
    rows in registers), "blocked_smem" (tile = NB, panel factored in shared memory) or "rows" (tile =
    (TI, TJ, RR, CC): TI x TJ threads, each holding RR x CC elements; see :func:`rows_plan`)."""

    kind: str
    tile: int | tuple[int, int, int, int]
    minb: int = 0  # blocks per SM in __launch_bounds__ (0: blocked kinds the compiler's, rows rows_min_blocks)
    kb: int = 0  # blocked kinds: columns per block of L in the left-looking steps (0: NB)

    def describe(self) -> str:
        if self.kind == "rows":
            return "rows-" + "x".join(map(str, self.tile)) + (f"-m{self.minb}" if self.minb else "")
        if self.kind == "tiny":
            return f"tiny-n{self.tile}"
        minb = f"-m{self.minb}" if self.minb else ""
        kb = f"-K{self.kb}" if self.kb and self.kb != self.tile else ""
        return f"{self.kind}-{'NP' if self.kind == 'small' else 'NB'}{self.tile}{minb}{kb}"


def _rows_np(n: int, step: int = 0) -> int:
    """Padded order of the register tile: n rounded up to ``step``, by default 8 (16 above 64, 64 above
    128), so that nearby n share one compiled kernel while the padding stays small."""
    step = step or (8 if n <= 64 else 16 if n <= 128 else 64)
    return -(-n // step) * step


def rows_min_blocks(dtype, tile) -> int:
    """Blocks per SM that ``getrf_rows`` is compiled for (__launch_bounds__' second argument): the
    most whose warps, spread over the 4 sub-partitions (16K registers each), leave every thread the
    tile's data registers + 56 (float64), 64 (complex64), 72 (complex128) or 64 + CC (float32) (ptxas
    -v on the swept tiles: no spills)."""
    ti, tj, rr, cc = tile
    dtype = np.dtype(dtype)
    extra = {"f4": 64 + cc, "f8": 56, "c8": 64, "c16": 72}[f"{dtype.kind}{dtype.itemsize}"]
    need = rr * cc * dtype.itemsize // 4 + extra
    warps = ti * tj // 32
    for blocks in range(min(32, 64 // warps), 0, -1):
        per_partition = -(-blocks * warps // 4)
        if min(255, 512 // per_partition // 8 * 8) >= need:
            return blocks
    return 1


def rows_plan(n: int, rr: int, tj: int, step: int = 0, minb: int = 0) -> Plan:
    """The ``getrf_rows`` tile for order n with RR rows per thread and TJ threads per row (TJ divides 16):
    TI threads down (TI * TJ whole warps), CC = padded n / TJ (rounded up) elements of a row per thread;
    n padded to ``step`` (default: :func:`_rows_np`'s), compiled for ``minb`` blocks per SM (default:
    :func:`rows_min_blocks`)."""
    if tj not in (1, 2, 4, 8, 16) or rr < 1 or step < 0 or minb < 0:
        raise InputError(f"Expected TJ in (1, 2, 4, 8, 16), RR >= 1, step >= 0 and minb >= 0. Got TJ = {tj}, "
                         f"RR = {rr}, step = {step}, minb = {minb} instead.")
    npad = _rows_np(n, step)
    ti = -(-npad // rr)
    ti = -(-ti // (32 // tj)) * (32 // tj)
    return Plan("rows", (ti, tj, rr, -(-npad // tj)), minb)


def tiny_mpb(dtype, n: int) -> int:
    """Matrices (= threads) per block of the one-thread-per-matrix kernels (``getrf_tiny``, ``inv_tiny``)
    for order n: a block stages its matrices in shared memory, about 16-33 KB at most (several blocks
    per SM, every thread busy)."""
    size = n * n * np.dtype(dtype).itemsize
    return 128 if size <= 128 else 64 if size <= 512 else 32


def tiny_smem(dtype, n: int) -> int:
    """Dynamic shared memory of a block of the one-thread-per-matrix kernels: its matrices, each at an
    odd stride (common.cuh's tiny_ld: n * n | 1 scalars)."""
    return tiny_mpb(dtype, n) * ((n * n) | 1) * np.dtype(dtype).itemsize


def launch_tiny(family: str, name: str, top: int, dtype, n: int, batch: int, args) -> None:
    """One launch of the one-thread-per-matrix kernel ``name<T, n, MPB>`` of ``family`` (``getrf_tiny``,
    ``inv_tiny``) over ``batch`` matrices, ``args`` its arguments before the batch. Every n up to
    ``top`` (those its dispatch sends it) is compiled in one NVRTC run; an n above, alone."""
    mpb, smem = tiny_mpb(dtype, n), tiny_smem(dtype, n)
    together = range(1, top + 1) if n <= top else (n,)
    names = tuple(template(name, dtype, m, tiny_mpb(dtype, m)) for m in together)
    func = kernel(family, template(name, dtype, n, mpb), names, smem)
    func((-(-batch // mpb),), (mpb,), (*args, np.int64(batch)), shared_mem=smem)


def _ldp(n: int) -> int:
    return ((n + 3) & ~3) + 4


def _smem_bytes(item: int, n: int, nb: int, ldp: int, kb: int = 0) -> int:
    # the panel (nb x ldp), two row-major n x kb staging buffers of L, perm / slot / posof, pivot records
    return (nb * ldp + 2 * n * (kb or nb)) * item + n * (4 + 2 * 2) + 16 + 32 * 16 + 64 * item


def blocked_ldp(dtype, n: int, nb: int, sm_smem: int | None = None, kb: int = 0) -> int:
    """Column stride of ``getrf_blocked``'s panel buffers: padded (n rounded up to 4, plus 4: fewer bank
    conflicts) unless the tight one (n rounded up to 16 bytes) lets more blocks share an SM's shared
    memory (``sm_smem`` bytes; each block also takes 1 KB and 16 static bytes), as at complex128 n = 190
    NB8 (two blocks -> three)."""
    item = np.dtype(dtype).itemsize
    per16 = 16 // item if item < 16 else 1
    padded, tight = _ldp(n), -(-n // per16) * per16
    sm_smem = sm_smem or smem_per_sm()

    def blocks(ldp):
        return sm_smem // (_smem_bytes(item, n, nb, ldp, kb) + 16 + 1024)

    return tight if blocks(tight) > blocks(padded) else padded


def blocked_smem(dtype, n: int, nb: int, ldp: int | None = None, kb: int = 0) -> int:
    """Dynamic shared memory of ``getrf_blocked<T, nb, ..., kb>`` for order n with column stride ``ldp``
    (default: the padded one; kb = 0: nb; mirrors getrf_blocked_smem)."""
    return _smem_bytes(np.dtype(dtype).itemsize, n, nb, _ldp(n) if ldp is None else ldp, kb)


def fitting_plan(dtype, n: int, smem: int) -> Plan | None:
    """The measured-best kernel for (dtype, n) on a device that lets a block opt in to ``smem`` bytes
    of shared memory, or None where no getrf panel fits (``batchlu.kernels._gpu._paths`` sends those n
    to cuSOLVER). Needs no GPU."""
    dtype = np.dtype(dtype)
    kind, nb = next((kind, tile) for bound, kind, tile in GETRF_DISPATCH[dtype] if n <= bound)
    if kind == "rows":
        return rows_plan(n, *nb)
    if kind == "tiny":
        return Plan("tiny", n)
    if kind == "small":
        return Plan("small", next(p for p in SMALL_NP if p >= n))
    nb, minb, kb = (tuple(nb) + (0, 0))[:3] if isinstance(nb, tuple) else (nb, 0, 0)
    for candidate in sorted(BLOCKED_NB[dtype.itemsize], reverse=True):
        ckb = kb if candidate == nb else 0
        if candidate <= nb and blocked_smem(dtype, n, candidate, kb=ckb) <= smem:
            return Plan(kind, candidate, minb if candidate == nb else 0, ckb)
    return None


def getrf_plan(dtype, n: int, smem: int | None = None) -> Plan:
    """The measured-best kernel for (dtype, n) that fits this device's shared memory (``smem`` bytes
    per block; default: the current device's opt-in limit); raises where none fits."""
    limit = smem_optin() if smem is None else smem
    plan = fitting_plan(dtype, n, limit)
    if plan is None:
        raise InputError(f"Expected n small enough for the GPU getrf panel to fit in shared memory "
                         f"({limit} bytes). Got n = {n} for {np.dtype(dtype)} instead.")
    return plan


def _threads(p: Plan, n: int) -> int:
    """Threads per block of a launch of ``p`` for order n."""
    if p.kind == "rows":
        return p.tile[0] * p.tile[1]
    if p.kind == "small":
        return _SMALL_THREADS
    return min(-(-n // 32) * 32, _MAX_THREADS)


def kernel_name(p: Plan, dtype, n: int) -> str:
    """The name expression of ``p``'s kernel for order n (what :func:`launch_getrf` compiles).

    ``getrf_blocked`` keeps its defaults (at most 512 threads, no blocks-per-SM bound, blocks of L NB
    wide) unless ``minb`` (then __launch_bounds__(threads, minb)) or ``kb`` is given."""
    if p.kind == "rows":
        return template("getrf_rows", dtype, *p.tile, p.minb or rows_min_blocks(dtype, p.tile))
    if p.kind == "small":
        return template("getrf_small", dtype, p.tile)
    if p.kind == "tiny":
        return template("getrf_tiny", dtype, p.tile, tiny_mpb(dtype, p.tile))
    nb, reg, threads = p.tile, p.kind == "blocked", _threads(p, n)
    if p.kb and p.kb != nb:
        return template("getrf_blocked", dtype, nb, reg, threads if p.minb else 512, p.minb or 1, p.kb)
    if p.minb:
        return template("getrf_blocked", dtype, nb, reg, threads, p.minb)
    return template("getrf_blocked", dtype, nb) if reg else template("getrf_blocked", dtype, nb, False)


def launch_getrf(a, lu, piv, info, p: Plan | None = None) -> None:
    """Factor ``a`` (B, n, n) into preallocated ``lu``, ``piv`` (B, n) int32, ``info`` (B,) int32.

    Every element of the outputs is written. ``lu`` may be ``a`` itself (in-place factorization).
    Runs on CuPy's current stream, with no host synchronisation.
    """
    batch, n = a.shape[0], a.shape[-1]
    dtype = a.dtype
    for name, arr, shape, dt in (("lu", lu, a.shape, dtype), ("piv", piv, (batch, n), np.int32),
                                 ("info", info, (batch,), np.int32)):
        if arr.shape != shape or arr.dtype != dt or not arr.flags.c_contiguous:
            raise InputError(f"Expected {name} to be a C-contiguous {np.dtype(dt)} array of shape "
                             f"{shape}. Got {arr.dtype} {arr.shape} instead.")
    if not a.flags.c_contiguous:
        raise InputError("Expected a C-contiguous input. Got a non-contiguous array instead.")
    if batch == 0 or n == 0:
        return
    p = p or getrf_plan(dtype, n)
    args = (a, lu, piv, info, np.int32(n), np.int64(batch))
    if p.kind == "rows":
        ti, tj, rr, cc = p.tile
        if ti * rr < n or tj * cc < n or (ti * tj) % 32 or ti * tj > 1024:
            raise InputError(f"Expected a rows tile (TI, TJ, RR, CC) of whole warps holding n = {n}. "
                             f"Got {p.tile} instead.")
        # One block per matrix (grid.x allows 2^31 - 1 blocks, more than memory holds).
        kernel(FAMILY, kernel_name(p, dtype, n))((batch,), (ti * tj,), (a, lu, piv, info, np.int32(n)))
    elif p.kind == "tiny":
        if p.tile != n or not 1 <= n <= TINY_N:
            raise InputError(f"Expected the tiny kernel's n to be the matrices' n, at most {TINY_N}. Got "
                             f"tile {p.tile} for n = {n} instead.")
        top = max(bound for bound, kind, _ in GETRF_DISPATCH[np.dtype(dtype)] if kind == "tiny")
        launch_tiny(FAMILY, "getrf_tiny", top, dtype, n, batch, (a, lu, piv, info))
    elif p.kind == "small":
        if p.tile < n:
            raise InputError(f"Expected NP >= n for the small kernel. Got NP = {p.tile}, n = {n} instead.")
        per_block = _SMALL_THREADS // p.tile
        grid = min(-(-batch // per_block), _MAX_GRID)
        kernel(FAMILY, kernel_name(p, dtype, n))((grid,), (_SMALL_THREADS,), args)
    else:
        if p.kb and (p.tile % p.kb or p.kb * np.dtype(dtype).itemsize % 16):
            raise InputError(f"Expected a block of L (kb) that divides NB in whole 16-byte chunks. Got NB = "
                             f"{p.tile}, kb = {p.kb} for {np.dtype(dtype)} instead.")
        ldp = blocked_ldp(dtype, n, p.tile, kb=p.kb)
        smem = blocked_smem(dtype, n, p.tile, ldp, p.kb)
        grid = min(batch, _MAX_GRID)
        func = kernel(FAMILY, kernel_name(p, dtype, n), smem=smem)
        func((grid,), (_threads(p, n),), args + (np.int32(ldp),), shared_mem=smem)


def getrf(a):
    """Backend entry point: ``lu``, ``piv`` (0-based int32), ``info`` for a (B, n, n) C-contiguous array."""
    import cupy

    batch, n = a.shape[0], a.shape[-1]
    lu = cupy.empty_like(a)
    piv = cupy.empty((batch, n), dtype=np.int32)
    info = cupy.empty((batch,), dtype=np.int32)
    launch_getrf(a, lu, piv, info)
    return lu, piv, info
