"""GPU gesv: the fused solve ``gesv_rows``, the family of ``kernels/cuda/gesv.cu``.

``gesv_rows`` factors each matrix in one block's registers as ``getrf_rows`` does (``rows.cuh``), puts
the factors in shared memory and solves L y = P^T b and U x = y from there, KR right-hand sides a pass.
:data:`GESV_ROWS` gives its tile per (dtype, n); ``_getrs.solve`` sends larger n, or more right-hand
sides than :data:`GESV_ROWS_MAX_RHS` gives, to getrf + getrs.
"""

from __future__ import annotations

import numpy as np

from batchlu.errors import InputError

from ._getrf import rows_min_blocks, rows_plan
from ._runtime import check, kernel, smem_optin, template


FAMILY = "gesv"
# Per dtype, (largest n, RR, TJ[, step[, lanes]]) rows, first match wins; see docs/design.md#gesv-dispatch.
# (RR, TJ, step): getrf_rows' register tile (rows_plan; step: its padding of n, 0 the default); lanes:
# at least that many lanes per right-hand side in the triangular solves (default 1: as many right-hand
# sides a pass as gesv_rows_kr gives, 16 on tiles of 1, 2, 4 or 8 warps). Above the last n: getrf +
# getrs.
GESV_ROWS = {
    np.dtype(np.float32): ((16, 1, 2), (33, 5, 4, 4, 4), (48, 3, 2, 0, 4), (64, 2, 4)),
    np.dtype(np.float64): ((16, 1, 2), (33, 5, 4, 4), (48, 3, 4), (64, 2, 4)),
    np.dtype(np.complex64): ((16, 1, 2), (33, 9, 8, 4, 4), (48, 6, 8), (64, 2, 4)),
    np.dtype(np.complex128): ((16, 2, 4), (33, 9, 8, 4, 4), (48, 6, 8)),
}
# (largest n, most right-hand sides) rows, first match wins: how many right-hand sides the dispatch sends
# to gesv_rows (launch_gesv_rows takes any k). Against getrf + getrs on the H100, at every n of the
# table, the fused solve took 0.46-0.92x the time at k = 64; see docs/design.md#gesv-dispatch.
GESV_ROWS_MAX_RHS = ((1 << 30, 64),)


def gesv_rows_kr(threads: int, k: int, lanes: int = 1) -> int:
    """Right-hand sides per pass of ``gesv_rows`` with ``threads`` threads for k of them: the block's
    warps times the power of two that first reaches min(k, 16), so that each right-hand side has a
    power of two of lanes within one warp, and at most threads / ``lanes`` of them (more go in further
    passes)."""
    kr = threads // 32
    while kr < min(k, 16) and threads // (2 * kr) >= lanes:
        kr *= 2
    return kr


def gesv_rows_tile(dtype, n: int, k: int, shape=None):
    """The gesv_rows tile (TI, TJ, RR, CC, KR) for order n and k right-hand sides: (RR, TJ[, step[,
    lanes]]) from ``shape`` or GESV_ROWS; None where neither applies (n beyond the table, k above
    GESV_ROWS_MAX_RHS' row for n)."""
    if shape is None:
        if k > next(most for nmax, most in GESV_ROWS_MAX_RHS if n <= nmax):
            return None
        shape = next((tuple(s) for nmax, *s in GESV_ROWS[np.dtype(dtype)] if n <= nmax), None)
        if shape is None:
            return None
    rr, tj, step, lanes = (tuple(shape) + (0, 1))[:4]
    ti, tj, rr, cc = rows_plan(max(n, 1), rr, tj, step).tile
    return (ti, tj, rr, cc, gesv_rows_kr(ti * tj, k, lanes))


def gesv_rows_name(dtype, tile) -> str:
    """The name expression of ``gesv_rows`` on ``tile`` (TI, TJ, RR, CC, KR): registers as getrf_rows'
    tile (the triangular solves need fewer)."""
    return template("gesv_rows", dtype, *tile, rows_min_blocks(dtype, tile[:4]))


def _rows_stride(item: int, cols: int) -> int:
    """rows.cuh's rows_stride<T, cols>: ``cols`` elements of ``item`` bytes padded to an odd number of
    16-byte words, in elements."""
    per = max(1, 16 // item)
    return (-(-cols // per) | 1) * per


def gesv_rows_smem(dtype, tile) -> int:
    """Dynamic shared memory of ``gesv_rows`` on ``tile``: the factors, TI RR rows of TJ CC elements
    padded to an odd number of 16-byte words."""
    ti, tj, rr, cc = tile[:4]
    item = np.dtype(dtype).itemsize
    return ti * rr * _rows_stride(item, tj * cc) * item


def gesv_rows_static_smem(dtype, tile) -> int:
    """An upper bound of ``gesv_rows``' static shared memory on ``tile`` (TI, TJ, RR, CC, KR): rows.cuh's
    arrays (the column and pivot-row buffers, the warps' candidates, the row bookkeeping, the
    reciprocals and row order of the solves). ptxas -v gives 96-512 bytes less on the dispatched
    tiles (it drops what the solve does not read)."""
    ti, tj, rr, cc = tile[:4]
    item = np.dtype(dtype).itemsize
    warps, rows = ti * tj // 32, ti * rr
    return (2 * (rows + 32) * item + 2 * warps * tj * _rows_stride(item, cc) * item + 2 * warps * 16
            + 2 * rows * 4 + rows * item + rows * 4)


def gesv_rows_fits(dtype, n: int, k: int, smem: int) -> bool:
    """Whether the dispatch's ``gesv_rows`` tile for (dtype, n, k) exists and its shared memory (the
    factors and :func:`gesv_rows_static_smem`) fits a block that may opt in to ``smem`` bytes. Needs
    no GPU."""
    tile = gesv_rows_tile(dtype, n, k)
    return tile is not None and gesv_rows_smem(dtype, tile) + gesv_rows_static_smem(dtype, tile) <= smem


def _valid_tile(tile, n: int) -> bool:
    """``tile`` is one gesv_rows compiles and launches for order n (rows.cuh's static_asserts included)."""
    if tile is None or len(tile) != 5 or not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1 for v in tile):
        return False
    ti, tj, rr, cc, kr = (int(v) for v in tile)
    threads = ti * tj
    return (ti * rr >= n and tj * cc >= n and 32 % tj == 0 and rr <= 32 and threads % 32 == 0
            and threads <= 1024 and threads % kr == 0 and 32 % (threads // kr) == 0)


def launch_gesv_rows(a, b, x, info, tile=None) -> None:
    """Fused solve of ``a`` (B, n, n) against ``b`` (B, n, k) into ``x`` (B, n, k) and ``info`` (B,)
    int32 by ``gesv_rows``; ``tile`` (TI, TJ, RR, CC, KR) defaults to :func:`gesv_rows_tile`'s."""
    batch, n = a.shape[0], a.shape[-1]
    k = b.shape[-1]
    check("a", a, (batch, n, n), a.dtype)
    check("b", b, (batch, n, k), a.dtype)
    check("x", x, (batch, n, k), a.dtype)
    check("info", info, (batch,), np.int32)
    tile = tuple(tile) if tile is not None else gesv_rows_tile(a.dtype, n, k)
    if not _valid_tile(tile, n):
        raise InputError(f"Expected a gesv_rows tile (TI, TJ, RR, CC, KR) of positive integers: whole warps "
                         f"holding n = {n}, TJ dividing 32, RR <= 32, KR giving each right-hand side a power "
                         f"of two of lanes within one warp. Got {tile} instead.")
    threads = tile[0] * tile[1]
    if batch == 0 or n == 0 or k == 0:
        return
    name = gesv_rows_name(a.dtype, tile)
    smem = gesv_rows_smem(a.dtype, tile)
    need = smem + kernel(FAMILY, name).shared_size_bytes
    if need > smem_optin():
        raise InputError(f"Expected gesv_rows' block to fit in shared memory: tile {tile} needs {need} "
                         f"bytes, this device allows {smem_optin()}.")
    func = kernel(FAMILY, name, smem=smem)
    func((batch,), (threads,), (a, b, x, info, np.int32(n), np.int32(k)), shared_mem=smem)
