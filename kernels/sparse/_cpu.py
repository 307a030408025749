"""The CPU numeric factorization and triangular solves: NumPy, level by level, vectorised over the batch.

Values are kept **batch-minor**: ``lx`` is (nnz(L), B), so that every gather and scatter of the
schedule (:mod:`batchlu.kernels.sparse._schedule`) moves whole rows of B contiguous numbers and one
index serves the whole batch. Each level is a handful of NumPy calls whatever its width:

1. pivots ``d = lx[diag]`` of the level's columns; static pivoting (see :func:`factorize`);
2. ``W[e] = lx[e]`` (the value ``l_ek d_k``) and ``lx[e] /= d_k`` for the level's entries ``e``;
3. the updates, round by round (a round's targets are distinct) in pieces of at most :data:`PIECE`
   pairs: ``prod = lx[a] * W[b]``, ``lx[t] -= prod``.

The batch goes through in blocks of at most :data:`BLOCK` matrices, which bounds the scratch memory
(a few ``PIECE x BLOCK`` arrays). Every operation treats each matrix alone and in the same order
whatever the batch's size, so a matrix's factors do not depend on its neighbours (bit for bit).
"""

from __future__ import annotations

import numpy as np

PIECE = 1 << 15   # update pairs per NumPy call
BLOCK = 128       # matrices per pass over the levels


def _segments(t: np.ndarray):
    """Starts of the runs of equal targets in sorted ``t``; None when every target is distinct."""
    if t.size < 2:
        return None
    change = t[1:] != t[:-1]
    if change.all():
        return None
    return np.concatenate(([0], np.flatnonzero(change) + 1))


def _update(lx, w, a, b, t) -> None:
    prod = lx[a]
    prod *= w[b]
    lx[t] -= prod


def factorize_block(plan, sched, lx: np.ndarray, tau: np.ndarray | None, perturb: bool):
    """Factor one block in place: ``lx`` (nnz(L), b) holds C's lower triangle on entry, L (unit,
    strictly lower) and D (on the diagonal positions) on return.

    ``tau`` (b,) is the pivot threshold per matrix. Returns ``(first_zero, perturbed, negative,
    zero)`` per matrix: the first exactly zero pivot's column (``n`` if none; only counted when
    ``perturb`` is False, or ``tau`` is 0), the count of perturbed pivots, and the counts of
    negative and exactly zero pivots as used (after any perturbation: a perturbed pivot keeps its
    sign, an exact zero becomes positive).
    """
    n = plan.n
    nb = lx.shape[1]
    w = np.empty_like(lx)
    first_zero = np.full(nb, n, np.int64)
    perturbed = np.zeros(nb, np.int64)
    negative = np.zeros(nb, np.int64)
    zero = np.zeros(nb, np.int64)
    colptr, level_ptr, level_cols = plan.colptr, plan.level_ptr, plan.level_cols
    for lev in range(level_ptr.size - 1):
        cols = level_cols[level_ptr[lev]:level_ptr[lev + 1]]
        dpos = colptr[cols]
        d = lx[dpos]
        if perturb:
            small = np.abs(d) < tau
            if small.any():
                d = np.where(small, np.where(d < 0, -tau, tau).astype(d.dtype), d)
                perturbed += small.sum(axis=0)
        negative += (d < 0).sum(axis=0)
        isz = d == 0
        if isz.any():
            zero += isz.sum(axis=0)
            hit = np.where(isz, cols[:, None], n).min(axis=0)
            np.minimum(first_zero, hit, out=first_zero)
        lx[dpos] = d
        e0, e1 = sched.ent_ptr[lev], sched.ent_ptr[lev + 1]
        if e1 == e0:
            continue
        e = sched.ent_pos[e0:e1]
        v = lx[e]
        w[e] = v
        with np.errstate(divide="ignore", invalid="ignore"):
            v /= lx[sched.ent_diag[e0:e1]]
        lx[e] = v
        for rnd in range(sched.level_round[lev], sched.level_round[lev + 1]):
            p0, p1 = int(sched.round_ptr[rnd]), int(sched.round_ptr[rnd + 1])
            for q in range(p0, p1, PIECE):
                r = min(q + PIECE, p1)
                _update(lx, w, sched.pair_a[q:r], sched.pair_b[q:r], sched.pair_t[q:r])
    return first_zero, perturbed, negative, zero


def _rowsum_subtract(y, pos_sorted_rows, rows, contrib) -> None:
    starts = _segments(rows)
    if starts is None:
        y[rows] -= contrib
    else:
        y[rows[starts]] -= np.add.reduceat(contrib, starts, axis=0)


def solve_block(plan, sched, lx: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Solve ``L D L^T x = y`` in place for one block: ``lx`` (nnz(L), b), ``y`` (n, b, k) in the
    permuted numbering. Forward by levels upwards, backward by levels downwards."""
    rowind, col_of = plan.rowind, sched.col_of
    nlevels = plan.level_ptr.size - 1
    for lev in range(nlevels):           # L y = b: columns of a level push into their ancestors
        e0, e1 = sched.ent_ptr[lev], sched.ent_ptr[lev + 1]
        if e1 == e0:
            continue
        e = sched.fwd_pos[e0:e1]
        rows = rowind[e]
        contrib = lx[e][:, :, None] * y[col_of[e]]
        _rowsum_subtract(y, e, rows, contrib)
    y /= lx[plan.colptr[:-1]][:, :, None]  # D z = y
    for lev in range(nlevels - 1, -1, -1):  # L^T x = z: each column pulls from its ancestors
        e0, e1 = sched.ent_ptr[lev], sched.ent_ptr[lev + 1]
        if e1 == e0:
            continue
        e = sched.ent_pos[e0:e1]
        cols = col_of[e]
        contrib = lx[e][:, :, None] * y[rowind[e]]
        _rowsum_subtract(y, e, cols, contrib)
    return y
