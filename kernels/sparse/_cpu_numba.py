"""The CPU numeric factorization and solves, compiled (numba): supernode by supernode, with
:data:`LANES` matrices of the batch side by side in every number the loops touch.

A block of :data:`LANES` matrices keeps its factors ``x`` (nnz(L), LANES): entry ``p`` of ``Lx`` of
all the block's matrices in one row of :data:`LANES` contiguous numbers (64 bytes in float64: one
cache line, one AVX-512 register). The lane loops are written with the intrinsics of
:mod:`._lanes` (one LLVM vector operation for the :data:`LANES` numbers), so the compiled code is
SIMD across matrices whatever the supernode's shape, and one index computation serves
:data:`LANES` matrices. Each lane's arithmetic is the same sequence of operations whatever its
neighbours (no fused multiply-add contraction, no reassociation), so a matrix's factors and
solutions are bit for bit the same whatever the batch around it.

The factorization is right-looking over the fundamental supernodes in column order (a child before
its parent: the elimination tree's numbering), every column's updates applied as soon as it is
final, so no level sets, rounds or update maps are needed here. A supernode of ``s`` columns
``f .. f+s-1`` with the rows ``R`` (``m`` of them) below it is the dense trapezoid ``(s + m) x s``
already in ``Lx`` (column ``f + t`` holds its rows ``t ..`` contiguously). A narrow one (below
:data:`BLAS_MIN` columns, and below :data:`BLAS_MIN_TALL` or with fewer than :data:`BLAS_TALL`
rows below) stays on the lanes (:func:`_factor_one`):

1. copied row-major into ``rt`` (row ``r``'s ``s`` numbers contiguous, per lane) and factored
   left-looking: column ``j``'s entries are ``c_rj - sum_{t<j} l_rt (l_jt d_t)``, dot products over
   contiguous rows, then the pivot (static pivoting, counted per lane) and the division; written
   back into ``Lx``;
2. the update of the ancestors ``L_R D L_R^T``: per row ``b`` of ``R`` the products
   ``l_{R_b t} d_t`` once, then for every row ``a >= b`` of ``R`` the dot product over the ``s``
   columns, subtracted from the entry ``(R_a, R_b)`` of column ``R_b``.

A wide one goes through BLAS (SciPy's ``cython_blas``; :func:`_supernode_blas`): each lane's panel
copied column-major and factored by column blocks with ``?gemm`` and ``?trsm``
(:func:`_panel_blas`), then ``L_R D L_R^T`` by ``?gemm`` in column blocks, each block subtracted for
all lanes at once. The BLAS results are per matrix too (one OpenBLAS thread per calling thread), so
the batch-independence above holds on both paths.

Both paths find the entries ``(R_a, R_b)`` of their update in a list made once per plan
(:func:`schedule`: :func:`_update_positions`, by walking the target columns' rows, of which
``R[b:]`` is a subset: the elimination tree's property), so the factorization itself has no
searches and no data-dependent branches in its scatter. The targets lie anywhere in a block's
factors (tens of MB), one cache line each, so each scatter asks for the line :data:`AHEAD` entries on
(:func:`._lanes.prefetch`, a hint with no effect on any value).

The factors ``lx`` come from :class:`_Spare`: the memory of an earlier call's factors once nothing
refers to them, else new; :func:`factor_blocks` zeroes each block before its values go in.

The solves run column by column (forward by columns, backward by dot products), a block's
right-hand sides gathered and permuted into ``(n, k, LANES)`` on the way in.

Blocks are independent: :func:`factor_blocks` and :func:`solve_blocks` work on the blocks
``lo .. hi - 1`` with the GIL released (``nogil``), and the caller hands ranges of blocks to threads
(``batchlu.kernels._cpu_threads``). Compiled at first use per dtype, cached on disk (``cache=True``).
"""

from __future__ import annotations

import dataclasses
import sys
import threading

import numpy as np
from numba import njit

from . import _lanes as lanes
from ._cache import PerPlan
from ._lanes import LANES

L = LANES
BLAS_MIN = 32        # supernodes of at least this many columns are factored through BLAS, lane by lane
BLAS_MIN_TALL = 16   # and those of at least this many with BLAS_TALL rows or more below them
BLAS_TALL = 128
PANEL_BLOCK = 32     # the BLAS path's column block in the panel
UPDATE_BLOCK = 64    # and in the update L_R D L_R^T
AHEAD = 64           # update entries ahead whose cache lines the scatters ask for


@njit(nogil=True, cache=True, error_model="numpy", inline="always")
def _pivot(dj, tau, perturb, counts, ln, n, column):
    """Static pivoting of lane ``ln``'s pivot ``dj`` of ``column``: a pivot below ``tau`` in size
    becomes +-``tau`` where ``perturb`` (counted in ``counts[1]``); negative and zero pivots are
    counted in ``counts[2]`` and ``counts[3]``, the first zero pivot's column kept in ``counts[0]``
    (``n`` while there is none), NaN and infinite ones in ``counts[4]``. Returns the pivot used."""
    if perturb and abs(dj) < tau:
        dj = -tau if dj < 0 else tau
        counts[1, ln] += 1
    if not np.isfinite(dj):
        counts[4, ln] += 1
    elif dj < 0:
        counts[2, ln] += 1
    elif dj == 0:
        counts[3, ln] += 1
        if counts[0, ln] == n:
            counts[0, ln] = column
    return dj


@njit(nogil=True, cache=True, error_model="numpy")
def _factor_one(colptr, sn_first, sn_size, upd_pos, upd_off, x, tau, perturb, counts, wb, rt, d, blocks,
                gemm, trsm, ints, chars, cdt, pbuf, ybuf, ubuf, dl):
    n = colptr.size - 1
    for J in range(sn_first.size):
        f = sn_first[J]
        s = sn_size[J]
        last = f + s - 1
        m = colptr[last + 1] - colptr[last] - 1
        total = s + m
        if s >= blocks[2] or (s >= blocks[3] and m >= blocks[4]):   # a wide supernode: through BLAS
            _supernode_blas(colptr, f, s, m, upd_pos, upd_off[J], x, tau, perturb, counts, blocks, gemm, trsm, ints,
                            chars, cdt, pbuf, ybuf, ubuf, dl)
            continue
        ms = rt.shape[1]                               # rt[r, t] is at (r ms + t) L
        for t in range(s):                             # the panel, row-major: rt[r, t] = C[f + r, f + t]
            o = colptr[f + t] - t
            for r in range(t, total):
                lanes.copy(rt, (r * ms + t) * L, x, (o + r) * L)
        for j in range(s):                             # left-looking by columns, dot products by rows
            for t in range(j):                         # row j's l d
                lanes.mul(wb, t * L, rt, (j * ms + t) * L, d, t * L)
            for r in range(j, total):
                lanes.sub_dot(rt, (r * ms + j) * L, rt, r * ms * L, L, wb, 0, L, j)
            for ln in range(L):
                d[j, ln] = _pivot(rt[j, j, ln], tau[ln], perturb, counts, ln, n, f + j)
            for r in range(j + 1, total):
                lanes.div(rt, (r * ms + j) * L, rt, (r * ms + j) * L, d, j * L)
        for t in range(s):                             # back into Lx: D on the diagonal, L below
            o = colptr[f + t] - t
            lanes.copy(x, (o + t) * L, d, t * L)
            for r in range(t + 1, total):
                lanes.copy(x, (o + r) * L, rt, (r * ms + t) * L)
        k = upd_off[J]                                 # R's rows are s .. s + m - 1 of rt
        kend = upd_off[J + 1] - 1
        for b in range(m):                             # the ancestors: C[R, R_b] -= L_R D L_R_b^T
            for t in range(s):
                lanes.mul(wb, t * L, rt, ((s + b) * ms + t) * L, d, t * L)
            for a in range(b, m):                      # the entry (R_a, R_b), at upd_pos[k]
                lanes.prefetch(x, upd_pos[min(k + AHEAD, kend)] * L)
                lanes.sub_dot(x, upd_pos[k] * L, rt, (s + a) * ms * L, L, wb, 0, L, s)
                k += 1


@njit(nogil=True, cache=True, error_model="numpy")
def _panel_blas(p, total, s, f, n, ln, tau, perturb, counts, nb, gemm, trsm, ints, chars, cdt, ybuf, d):
    """LDL^T of one lane's panel ``p`` ((s + m) x s, column-major, leading dimension ``total``) by
    column blocks of ``nb``, left-looking: ``?gemm`` brings the block's columns up to
    date, the diagonal block is factored column by column with static pivoting as in
    :func:`_factor_one` (counted in ``counts[:, ln]``), ``?trsm`` and a division by D give the rows
    below. ``p`` ends holding L below the diagonal; D goes to ``d``."""
    ld = total
    mi, ni, ki, l2, ld_i = ints[0:1], ints[1:2], ints[2:3], ints[3:4], ints[4:5]
    ld_i[0] = ld
    one, minus = cdt[0:1], cdt[1:2]
    trans_n, trans_t, side_r, uplo_l, diag_u = chars[0:1], chars[1:2], chars[2:3], chars[3:4], chars[4:5]
    for j0 in range(0, s, nb):
        j1 = min(j0 + nb, s)
        w = j1 - j0
        if j0 > 0:                                     # C[j0:, j0:j1] -= L[j0:, :j0] (L[j0:j1, :j0] D)^T
            for t in range(j0):
                for c in range(w):
                    ybuf[c + t * w] = p[j0 + c + t * ld] * d[t]
            mi[0], ni[0], ki[0], l2[0] = total - j0, w, j0, w
            gemm(trans_n.ctypes, trans_t.ctypes, mi.ctypes, ni.ctypes, ki.ctypes, minus.ctypes,
                 p[j0:].ctypes, ld_i.ctypes, ybuf.ctypes, l2.ctypes, one.ctypes, p[j0 + j0 * ld:].ctypes,
                 ld_i.ctypes)
        for j in range(j0, j1):                        # the diagonal block, left-looking by columns
            for t in range(j0, j):
                ybuf[t] = p[j + t * ld] * d[t]
            for r in range(j, j1):
                acc = p.dtype.type(0)
                for t in range(j0, j):
                    acc += p[r + t * ld] * ybuf[t]
                p[r + j * ld] -= acc
            dj = _pivot(p[j + j * ld], tau, perturb, counts, ln, n, f + j)
            d[j] = dj
            for r in range(j + 1, j1):
                p[r + j * ld] = p[r + j * ld] / dj
        if j1 < total:                                 # the rows below: L D = C L_bb^{-T}, then / D
            mi[0], ni[0] = total - j1, w
            trsm(side_r.ctypes, uplo_l.ctypes, trans_t.ctypes, diag_u.ctypes, mi.ctypes, ni.ctypes, one.ctypes,
                 p[j0 + j0 * ld:].ctypes, ld_i.ctypes, p[j1 + j0 * ld:].ctypes, ld_i.ctypes)
            for t in range(j0, j1):
                dt = d[t]
                if abs(dt) >= cdt[3]:                  # LAPACK's rule: times the reciprocal unless it overflows
                    rd = 1 / dt
                    for r in range(j1 + t * ld, total + t * ld):
                        p[r] *= rd
                else:
                    for r in range(j1 + t * ld, total + t * ld):
                        p[r] = p[r] / dt


@njit(nogil=True, cache=True, error_model="numpy")
def _supernode_blas(colptr, f, s, m, upd_pos, k, x, tau, perturb, counts, blocks, gemm, trsm, ints, chars, cdt,
                    pbuf, ybuf, ubuf, d):
    """Supernode ``f .. f+s-1`` (``m`` rows below it) through BLAS, each lane on its own: the panels
    copied column-major into ``pbuf[ln]`` and factored (:func:`_panel_blas`, column blocks of
    ``blocks[0]``), written back, then ``L_R D L_R^T`` by ``?gemm`` in column blocks of ``blocks[1]``
    into ``ubuf[ln]``, each block subtracted from the ancestors' entries (``upd_pos[k:]``, in the
    order ``b``, then ``a >= b``) for all lanes at once."""
    n = colptr.size - 1
    total = s + m
    ld = total
    for t in range(s):                                 # the panels: pbuf[ln, r + t ld] = C[f + r, f + t]
        o = colptr[f + t] - t
        for r in range(t, total):
            for ln in range(LANES):
                pbuf[ln, r + t * ld] = x[o + r, ln]
    for ln in range(LANES):
        _panel_blas(pbuf[ln], total, s, f, n, ln, tau[ln], perturb, counts, blocks[0], gemm, trsm, ints, chars,
                    cdt, ybuf, d[ln])
    for t in range(s):                                 # back into Lx: D on the diagonal, L below
        o = colptr[f + t] - t
        for ln in range(LANES):
            x[o + t, ln] = d[ln, t]
        for r in range(t + 1, total):
            for ln in range(LANES):
                x[o + r, ln] = pbuf[ln, r + t * ld]
    if m == 0:
        return
    mi, ni, ki, l2 = ints[0:1], ints[1:2], ints[2:3], ints[3:4]
    one, zero = cdt[0:1], cdt[2:3]
    trans_n, trans_t = chars[0:1], chars[1:2]
    ld_i = ints[4:5]
    ld_i[0] = ld
    kend = k + m * (m + 1) // 2 - 1
    for b0 in range(0, m, blocks[1]):                  # columns b0 .. b1-1 of L_R D L_R^T, rows b0 ..
        b1 = min(b0 + blocks[1], m)
        w = b1 - b0
        lu = m - b0
        for ln in range(LANES):
            p = pbuf[ln]
            dl = d[ln]
            for t in range(s):                         # ybuf (w x s) = (L_R D)[b0:b1]
                for c in range(w):
                    ybuf[c + t * w] = p[s + b0 + c + t * ld] * dl[t]
            mi[0], ni[0], ki[0], l2[0] = lu, w, s, w
            gemm(trans_n.ctypes, trans_t.ctypes, mi.ctypes, ni.ctypes, ki.ctypes, one.ctypes, p[s + b0:].ctypes,
                 ld_i.ctypes, ybuf.ctypes, l2.ctypes, zero.ctypes, ubuf[ln].ctypes, mi.ctypes)
        for b in range(b0, b1):                        # subtracted from the entries (R_a, R_b), a >= b
            base = (b - b0) * lu - b0
            for a in range(b, m):
                lanes.prefetch(x, upd_pos[min(k + AHEAD, kend)] * L)
                q = upd_pos[k]
                k += 1
                for ln in range(LANES):
                    x[q, ln] -= ubuf[ln, base + a]


@njit(nogil=True, cache=True, error_model="numpy")
def factor_blocks(colptr, sn_first, sn_size, upd_pos, upd_off, value_src, value_dst, values, tau, perturb, blocks,
                  gemm, trsm, lx, counts, lo, hi):
    """Factor the blocks ``lo .. hi - 1``: block ``k`` holds the matrices ``k LANES ..`` of
    ``values`` (B, nnz) (the last block's missing lanes repeat its last matrix) and writes
    ``lx[k]`` (nnz(L), LANES; zero on entry) and ``counts[k]`` (5, LANES): first zero pivot's column (n if none),
    perturbed, negative, zero and non-finite pivots. The supernodes and the positions of their updates are the
    plan's :class:`Schedule`. Supernodes of at least ``blocks[2]`` columns go through
    ``gemm`` and ``trsm`` (``?gemm``, ``?trsm`` of ``lx``'s dtype; :func:`_supernode_blas`, column
    blocks ``blocks[0]`` in the panel, ``blocks[1]`` in the update)."""
    count = values.shape[0]
    n = colptr.size - 1
    maxs = maxm = 1                                    # the lane path's largest supernode
    bs = bm = 0                                        # the BLAS path's
    for J in range(sn_size.size):
        last = sn_first[J] + sn_size[J] - 1
        s, m = sn_size[J], colptr[last + 1] - colptr[last] - 1
        if s >= blocks[2] or (s >= blocks[3] and m >= blocks[4]):
            bs, bm = max(bs, s), max(bm, m)
        else:
            maxs, maxm = max(maxs, s), max(maxm, m)
    dd = np.empty((maxs, LANES), lx.dtype)
    wb = np.empty((maxs, LANES), lx.dtype)
    rt = np.empty((maxm + maxs, maxs, LANES), lx.dtype)
    pbuf = np.empty((LANES, (bm + bs) * bs), lx.dtype)
    ybuf = np.empty(max(blocks[0], blocks[1]) * bs, lx.dtype)
    ubuf = np.empty((LANES, bm * min(blocks[1], bm)), lx.dtype)
    dl = np.empty((LANES, bs), lx.dtype)
    ints = np.zeros(5, np.int32)
    chars = np.array([ord("N"), ord("T"), ord("R"), ord("L"), ord("U")], np.uint8)
    cdt = np.array([1, -1, 0, np.finfo(lx.dtype).tiny], lx.dtype)
    lane_tau = np.empty(LANES, lx.dtype)
    lane = np.empty(LANES, np.int64)
    for k in range(lo, hi):
        x = lx[k]
        x.reshape(-1)[:] = 0                           # the fill's entries start at 0 (memory may be reused)
        for ln in range(LANES):
            lane[ln] = min(k * LANES + ln, count - 1)
            lane_tau[ln] = tau[lane[ln]]
        for e in range(value_src.size):
            for ln in range(LANES):
                x[value_dst[e], ln] = values[lane[ln], value_src[e]]
        c = counts[k]
        c[:] = 0
        for ln in range(LANES):
            c[0, ln] = n
        _factor_one(colptr, sn_first, sn_size, upd_pos, upd_off, x, lane_tau, perturb, c, wb, rt, dd, blocks, gemm,
                    trsm, ints, chars, cdt, pbuf, ybuf, ubuf, dl)


@njit(nogil=True, cache=True, error_model="numpy")
def solve_blocks(colptr, rowind, perm, lx, r, want, out, lo, hi):
    """``out[i] = x`` with ``L D L^T (P x) = P r[i]`` for the matrices ``i`` with ``want[i]`` in the
    blocks ``lo .. hi - 1`` (``r`` and ``out`` (B, n, k); ``out`` of the others untouched)."""
    n = colptr.size - 1
    count, k = r.shape[0], r.shape[2]
    y = np.zeros((n, k, LANES), lx.dtype)
    for blk in range(lo, hi):
        first = blk * LANES
        todo = False
        for ln in range(LANES):
            if first + ln < count and want[first + ln]:
                todo = True
        if not todo:
            continue
        x = lx[blk]
        for ln in range(LANES):
            i = first + ln
            for j in range(n):
                for kk in range(k):
                    y[j, kk, ln] = r[i, perm[j], kk] if i < count and want[i] else 0
        for j in range(n):                               # L y = b
            for p in range(colptr[j] + 1, colptr[j + 1]):
                i = rowind[p]
                for kk in range(k):
                    lanes.sub_mul(y, (i * k + kk) * L, x, p * L, y, (j * k + kk) * L)
        for j in range(n):                               # D z = y
            pd = colptr[j]
            for kk in range(k):
                lanes.div(y, (j * k + kk) * L, y, (j * k + kk) * L, x, pd * L)
        for j in range(n - 1, -1, -1):                   # L^T x = z
            for kk in range(k):
                lanes.sub_mul_rows(y, (j * k + kk) * L, x, colptr[j] + 1, colptr[j + 1], rowind, y, k, kk)
        for ln in range(LANES):
            i = first + ln
            if i < count and want[i]:
                for j in range(n):
                    for kk in range(k):
                        out[i, perm[j], kk] = y[j, kk, ln]


@njit(nogil=True, cache=True, error_model="numpy")
def residual_rows(a_row, a_col, src, values, rows, b, x, out, lo, hi):
    """``out[i] = b[i] - A_{rows[i]} x[i]`` in float64 for ``i`` in ``lo .. hi - 1``, ``values``
    (B, nnz) one matrix's contiguous: A's lower entries ``e`` (row ``a_row[e]``, column
    ``a_col[e]``, value ``values[rows[i], src[e]]``) taken in order, each added to its row and (off
    the diagonal) to its column, one matrix after the other. Every matrix gets the same operations
    in the same order as in :func:`residual_lanes`, whatever the threads."""
    n, k = b.shape[1], b.shape[2]
    ax = np.empty((n, k), np.float64)
    a1 = np.empty(n, np.float64)
    for i in range(lo, hi):
        vi = values[rows[i]]
        xi = x[i]
        if k == 1:                                     # one right-hand side: flat loops
            a1[:] = 0
            for e in range(src.size):
                v = np.float64(vi[src[e]])
                r, c = a_row[e], a_col[e]
                a1[r] += v * np.float64(xi[c, 0])
                if r != c:
                    a1[c] += v * np.float64(xi[r, 0])
            for j in range(n):
                out[i, j, 0] = b[i, j, 0] - a1[j]
            continue
        ax[:] = 0
        for e in range(src.size):
            v = np.float64(vi[src[e]])
            r, c = a_row[e], a_col[e]
            for kk in range(k):
                ax[r, kk] += v * np.float64(xi[c, kk])
            if r != c:
                for kk in range(k):
                    ax[c, kk] += v * np.float64(xi[r, kk])
        for j in range(n):
            for kk in range(k):
                out[i, j, kk] = b[i, j, kk] - ax[j, kk]


@njit(nogil=True, cache=True, error_model="numpy")
def residual_lanes(a_row, a_col, src, vt, rows, b, x, out, lo, hi):
    """As :func:`residual_rows` for ``vt`` (nnz, B), one entry's values of all matrices
    contiguous: :data:`LANES` matrices at a time side by side (the same operations per matrix)."""
    n, k = b.shape[1], b.shape[2]
    ax = np.empty((n, k, LANES), np.float64)
    xt = np.empty((n, k, LANES), np.float64)
    col = np.empty(LANES, np.int64)
    ve = np.empty(LANES, np.float64)
    for g in range(lo, hi, LANES):
        w = min(LANES, hi - g)
        for ln in range(LANES):                        # missing lanes repeat the last matrix, unused
            col[ln] = rows[g + min(ln, w - 1)]
            for j in range(n):
                for kk in range(k):
                    xt[j, kk, ln] = x[g + min(ln, w - 1), j, kk]
        ax[:] = 0
        for e in range(src.size):
            row = vt[src[e]]
            for ln in range(LANES):
                ve[ln] = np.float64(row[col[ln]])
            r, c = a_row[e], a_col[e]
            for kk in range(k):
                lanes.add_mul(ax, (r * k + kk) * L, ve, 0, xt, (c * k + kk) * L)
            if r != c:
                for kk in range(k):
                    lanes.add_mul(ax, (c * k + kk) * L, ve, 0, xt, (r * k + kk) * L)
        for ln in range(w):
            for j in range(n):
                for kk in range(k):
                    out[g + ln, j, kk] = b[g + ln, j, kk] - ax[j, kk, ln]


@njit(nogil=True, cache=True, error_model="numpy")
def _max_abs(a, kk, nan):
    """``max_j |a[j, kk]|`` in float64, NaN if any entry is NaN (as ``np.max``)."""
    m = 0.0
    for j in range(a.shape[0]):
        v = abs(np.float64(a[j, kk]))
        if v > m or v != v:
            m = v
            if v != v:
                return nan
    return m


@njit(nogil=True, cache=True, error_model="numpy")
def backward_errors(r, x, b, anorm, out, lo, hi):
    """``out[i]``: the normwise backward error ``max_k ||r||_inf / (anorm[i] ||x||_inf + ||b||_inf)``
    of matrix ``i`` in ``lo .. hi - 1`` (``r``, ``x``, ``b`` (m, n, k)); as
    :meth:`batchlu.kernels.sparse._shared.Refining._berr` (NaN where a norm is not finite, ``inf``
    for a nonzero residual over a zero denominator, 0 for 0 / 0)."""
    nan, inf = np.nan, np.inf
    k = r.shape[2]
    for i in range(lo, hi):
        worst = 0.0
        for kk in range(k):
            rn = _max_abs(r[i], kk, nan)
            den = anorm[i] * _max_abs(x[i], kk, nan) + _max_abs(b[i], kk, nan)
            if not (np.isfinite(rn) and np.isfinite(den)):
                be = nan
            elif den > 0:
                be = rn / den
            else:
                be = inf if rn > 0 else 0.0
            if be > worst or be != be:
                worst = be
                if be != be:
                    break
        out[i] = worst


MIN_WORK = 1 << 18   # multiply-adds per thread below which a call stays on one thread (~0.2 ms)


def _split(work: int, count: int) -> int:
    from batchlu.kernels import _cpu_threads

    return min(_cpu_threads.threads(), count, max(1, work // MIN_WORK))


def _parts(plan, blocks: int) -> int:
    return _split(blocks * LANES * max(plan.update_pairs, plan.nnz_l), blocks)


def _real(a: np.ndarray) -> np.ndarray:
    """``a`` contiguous, as float64 unless it is float32 or float64 already (one compile per dtype)."""
    return np.ascontiguousarray(a, a.dtype if a.dtype in (np.float32, np.float64) else np.float64)


def residual(plan, values: np.ndarray, rows: np.ndarray, b: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``b - A x`` (len(rows), n, k) in float64 for the matrices ``rows`` of ``values`` (B, nnz);
    ``b`` and ``x`` (len(rows), n, k) are theirs, in the same order. Read in the layout ``values``
    has (:func:`residual_rows` or, batch-minor, :func:`residual_lanes`: the same bits), the
    matrices split between threads."""
    from batchlu.kernels import _cpu_threads

    rows = np.ascontiguousarray(rows, np.int64)
    b = np.ascontiguousarray(b, np.float64)
    out = np.empty(b.shape, np.float64)
    if not (rows.size and b.shape[2] and plan.n):
        out[:] = b
        return out
    values = _real(values) if not values.T.flags.c_contiguous else values
    kernel = residual_rows if values.flags.c_contiguous else residual_lanes
    data = values if kernel is residual_rows else _real(values.T)
    parts = _split(6 * rows.size * b.shape[2] * plan.a_row.size, -(-rows.size // LANES))
    _cpu_threads.run_parts(lambda *a: kernel(*a[:-2], a[-2] * LANES, min(a[-1] * LANES, rows.size)),
                           parts, -(-rows.size // LANES), plan.a_row, plan.a_col, plan.value_src, data, rows, b,
                           _real(x), out)
    return out


def berr(r: np.ndarray, x: np.ndarray, b: np.ndarray, anorm: np.ndarray) -> np.ndarray:
    """Per matrix, the normwise backward error of its residual ``r``, solution ``x`` and right-hand
    side ``b`` (each (m, n, k)) with ``||A||_inf`` ``anorm`` (m,) (:func:`backward_errors`)."""
    from batchlu.kernels import _cpu_threads

    count = r.shape[0]
    out = np.zeros(count)
    if count and r.shape[1] and r.shape[2]:
        _cpu_threads.run_parts(backward_errors, _split(3 * r.size, count), count, np.ascontiguousarray(r),
                               _real(x), _real(b),
                               np.ascontiguousarray(anorm, np.float64), out)
    return out


@njit(nogil=True, cache=True)
def _update_positions(colptr, rowind, sn_first, sn_size, pos):
    """Fill ``pos`` with the positions in ``Lx`` of every supernode's update ``L_R D L_R^T``, one
    supernode after the other, each by columns ``b`` of ``R`` and rows ``a >= b``: the entry
    ``(R_a, R_b)`` of column ``R_b``, found by walking that column's rows (``R[b:]`` is a subset of
    them, in order)."""
    k = 0
    for J in range(sn_first.size):
        last = sn_first[J] + sn_size[J] - 1
        r0, r1 = colptr[last] + 1, colptr[last + 1]
        for i in range(r0, r1):
            q = colptr[rowind[i]]
            for j in range(i, r1):
                while rowind[q] != rowind[j]:
                    q += 1
                pos[k] = q
                k += 1


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
    """The compiled engine's view of a plan: the fundamental supernodes (first column, size) and
    where each one's update lands in ``Lx`` (``upd_pos[upd_off[J]:upd_off[J + 1]]`` for supernode
    ``J``; int32 while ``Lx``'s positions fit)."""

    first: np.ndarray
    size: np.ndarray
    upd_pos: np.ndarray
    upd_off: np.ndarray


def _schedule(plan) -> Schedule:
    from ._supernodal import supernodes as fundamental

    first, size = (a.astype(np.int64) for a in fundamental(plan.parent, plan.colptr))
    colptr = np.asarray(plan.colptr, np.int64)
    m = colptr[first + size] - colptr[first + size - 1] - 1
    off = np.zeros(first.size + 1, np.int64)
    np.cumsum(m * (m + 1) // 2, out=off[1:])
    pos = np.empty(int(off[-1]), np.int32 if plan.nnz_l < 2**31 else np.int64)
    _update_positions(plan.colptr, plan.rowind, first, size, pos)
    return Schedule(first, size, pos, off)


schedule = PerPlan(_schedule)   # the plan's `Schedule`, built once per plan digest


class _Spare:
    """The factors' memory of earlier :func:`factorize` calls, handed out again once nothing else
    refers to it (the last :attr:`keep` arrays made, in use or not). Fresh memory from the system
    costs page faults, the kernel's zeroing of every page, and on a virtual machine sometimes much
    more (the host hands the pages back slowly: 2-7x the time of writing them); memory already
    mapped costs one pass of ours (:func:`factor_blocks` zeroes each block before its values)."""

    def __init__(self, keep: int = 1):
        self.keep = keep
        self._arrays: list = []
        self._lock = threading.Lock()

    def take(self, shape: tuple, dtype) -> np.ndarray:
        """An array ``shape`` of ``dtype``, contents undefined: a kept one nothing else refers to,
        else a new one (kept, the oldest dropped beyond :attr:`keep`)."""
        dtype = np.dtype(dtype)
        with self._lock:
            for i in range(len(self._arrays)):
                # free: referred to by the list and getrefcount's argument only (a view refers to
                # its base, so a Factor or a view of one in use keeps it taken)
                if sys.getrefcount(self._arrays[i]) == 2 and self._arrays[i].shape == shape \
                        and self._arrays[i].dtype == dtype:
                    found = self._arrays.pop(i)
                    self._arrays.append(found)
                    return found
            made = np.empty(shape, dtype)
            if self.keep:
                self._arrays.append(made)
                del self._arrays[:-self.keep]
            return made


_SPARE = _Spare()


def factorize(plan, values: np.ndarray, tau: np.ndarray, perturb: bool):
    """The factors of ``values`` (B, nnz): ``lx`` (ceil(B / LANES), nnz(L), LANES) and per matrix
    ``(first_zero, perturbed, negative, zero, nonfinite)`` (see :func:`batchlu.kernels.sparse._cpu.factorize_block`)."""
    from batchlu.kernels import _cpu_threads

    count = values.shape[0]
    blocks = -(-count // LANES)
    sched = schedule(plan)
    lx = _SPARE.take((blocks, plan.nnz_l, LANES), values.dtype)   # zeroed block by block in factor_blocks
    counts = np.empty((blocks, 5, LANES), np.int64)
    if blocks:
        from batchlu.kernels import _cpu_numba as dense
        from batchlu.kernels._cpu_lapack import one_blas_thread

        with one_blas_thread():   # OpenBLAS's own threads would fight ours (and round otherwise)
            _cpu_threads.run_parts(factor_blocks, _parts(plan, blocks), blocks, plan.colptr,
                                   sched.first, sched.size, sched.upd_pos, sched.upd_off, plan.value_src, plan.value_dst,
                                   values if values.flags.f_contiguous else np.ascontiguousarray(values),
                                   np.ascontiguousarray(tau, values.dtype), bool(perturb),
                                   np.array([PANEL_BLOCK, UPDATE_BLOCK, BLAS_MIN, BLAS_MIN_TALL, BLAS_TALL], np.int64),
                                   dense.blas(values.dtype, "gemm"), dense.blas(values.dtype, "trsm"), lx, counts)
    per_matrix = counts.transpose(1, 0, 2).reshape(5, -1)[:, :count]
    return lx, tuple(per_matrix)


def solve(plan, lx: np.ndarray, r: np.ndarray, rows: np.ndarray | None, dtype) -> np.ndarray:
    """``x`` (B, n, k) in ``dtype`` with ``L D L^T (P x) = P r`` for the matrices ``rows`` (all
    when None; the others' ``x`` is 0)."""
    from batchlu.kernels import _cpu_threads

    count = r.shape[0]
    want = np.ones(count, bool) if rows is None else np.isin(np.arange(count), rows)
    out = np.zeros(r.shape, dtype)
    blocks = lx.shape[0]
    if blocks and r.shape[2] and plan.n:
        _cpu_threads.run_parts(solve_blocks, _parts(plan, blocks), blocks, plan.colptr, plan.rowind, plan.perm, lx,
                               np.ascontiguousarray(r), want, out)
    return out
