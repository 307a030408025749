"""GPU gesv: the fused solve ``gesv_rows``, the family of ``kernels/cuda/gesv.cu``.

``gesv_rows`` is getrf_rows' register LU (``rows.cuh``) with the right-hand sides as more register
columns, then a backward substitution sweep, one block per matrix. :data:`GESV_ROWS` gives its tile
per (dtype, n); ``_getrs.solve`` sends larger n, or more than :data:`GESV_ROWS_MAX_RHS` right-hand
sides, to getrf + getrs.
"""

from __future__ import annotations

import numpy as np

from batchlu.errors import InputError

from ._getrf import rows_min_blocks, rows_plan
from ._runtime import check, kernel, template


FAMILY = "gesv"
# Per dtype, (largest n, RR, TJ[, step]) rows, first match wins; see docs/design.md#gesv-dispatch. The
# tile is getrf_rows' (rows_plan; step: its padding of n) plus ceil(k / TJ) right-hand-side columns per
# thread; above the last n: getrf + getrs.
GESV_ROWS = {
    np.dtype(np.float32): ((16, 2, 4), (33, 5, 4, 4), (48, 3, 4), (64, 8, 8), (96, 6, 8), (128, 8, 8)),
    np.dtype(np.float64): ((16, 2, 4), (33, 5, 8), (48, 6, 8), (96, 4, 8)),
    np.dtype(np.complex64): ((16, 2, 4), (33, 5, 8), (48, 3, 4)),
    np.dtype(np.complex128): ((16, 2, 4), (33, 3, 8, 4), (48, 3, 8), (64, 4, 8)),
}
GESV_ROWS_MAX_RHS = 16


def gesv_rows_tile(dtype, n: int, k: int, rr_tj=None):
    """The gesv_rows tile (TI, TJ, RR, CC, CB) for order n and k right-hand sides: (RR, TJ[, step]) from
    ``rr_tj`` or GESV_ROWS; None where neither applies (n beyond the table, k > GESV_ROWS_MAX_RHS)."""
    if rr_tj is None:
        if k > GESV_ROWS_MAX_RHS:
            return None
        rr_tj = next((tuple(shape) for nmax, *shape in GESV_ROWS[np.dtype(dtype)] if n <= nmax), None)
        if rr_tj is None:
            return None
    ti, tj, rr, cc = rows_plan(max(n, 1), *rr_tj).tile
    return (ti, tj, rr, cc, max(1, -(-k // tj)))


def gesv_rows_name(dtype, tile) -> str:
    """The name expression of ``gesv_rows`` on ``tile`` (TI, TJ, RR, CC, CB)."""
    ti, tj, rr, cc, cb = tile
    # registers as getrf_rows' tile with the CB right-hand-side columns on top (ptxas -v on the swept
    # tiles: at most a few words spilled on three of them)
    minb = rows_min_blocks(dtype, (ti, tj, rr, cc + cb))
    return template("gesv_rows", dtype, ti, tj, rr, cc, cb, minb)


def launch_gesv_rows(a, b, x, info, tile=None) -> None:
    """Fused solve of ``a`` (B, n, n) against ``b`` (B, n, k) into ``x`` (B, n, k) and ``info`` (B,)
    int32 by ``gesv_rows``; ``tile`` (TI, TJ, RR, CC, CB) defaults to :func:`gesv_rows_tile`'s."""
    batch, n = a.shape[0], a.shape[-1]
    k = b.shape[-1]
    check("a", a, (batch, n, n), a.dtype)
    check("b", b, (batch, n, k), a.dtype)
    check("x", x, (batch, n, k), a.dtype)
    check("info", info, (batch,), np.int32)
    tile = tuple(tile) if tile is not None else gesv_rows_tile(a.dtype, n, k)
    if (tile is None or len(tile) != 5 or tile[0] * tile[2] < n or tile[1] * tile[3] < n
            or tile[1] * tile[4] < k or (tile[0] * tile[1]) % 32 or tile[0] * tile[1] > 1024):
        raise InputError(f"Expected a gesv_rows tile (TI, TJ, RR, CC, CB) of whole warps holding n = {n} "
                         f"and k = {k} right-hand sides. Got {tile} instead.")
    if batch == 0 or n == 0 or k == 0:
        return
    func = kernel(FAMILY, gesv_rows_name(a.dtype, tile))
    func((batch,), (tile[0] * tile[1],), (a, b, x, info, np.int32(n), np.int32(k)))
