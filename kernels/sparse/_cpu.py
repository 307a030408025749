"""The CPU numeric factorization and triangular solves: NumPy, level by level, vectorised over the batch.

Values are kept **batch-minor**: ``lx`` is (nnz(L), B), so that every gather and scatter of the
schedule (:mod:`batchlu.kernels.sparse._schedule`) moves whole rows of B contiguous numbers and one
index serves the whole batch. Each level is a handful of NumPy calls whatever its width:

1. pivots ``d = lx[diag]`` of the level's columns; static pivoting (see :func:`factorize`);
2. ``W[e] = lx[e]`` (the value ``l_ek d_k``) and ``lx[e] /= d_k`` for the level's entries ``e``;
3. the updates, round by round (a round's targets are distinct) in pieces of at most :data:`PIECE`
   pairs: ``prod = lx[a] * W[b]``, ``lx[t] -= prod``.

The batch goes through in blocks of at most :data:`BLOCK` matrices (fewer for large factors:
:func:`block_size`), which bounds the memory of a pass. Every operation treats each matrix alone and in the same order
whatever the batch's size, so a matrix's factors do not depend on its neighbours (bit for bit).
"""

from __future__ import annotations

import numpy as np

PIECE = 1 << 15   # update pairs per NumPy call
BLOCK = 128       # matrices per pass over the levels, at most
BLOCK_BYTES = 512 * 2**20   # ... and at most this much factor memory per pass
DENSE_BLOCK = 32  # columns per block of a supernode's dense LDL^T
UPDATE_BLOCK = 128  # columns per product of a supernode's update of its ancestors


def block_size(plan, itemsize: int) -> int:
    """Matrices per pass: :data:`BLOCK`, fewer where their factors (``Lx``, the dense panels and
    their copies, about 6 nnz(L) numbers a matrix) would pass :data:`BLOCK_BYTES`."""
    return max(1, min(BLOCK, BLOCK_BYTES // max(1, 6 * plan.nnz_l * itemsize)))


def _update(lx, w, a, b, t) -> None:
    prod = lx[a]
    prod *= w[b]
    lx[t] -= prod


class _Counts:
    """Per-matrix bookkeeping of the pivots (see :func:`factorize_block`)."""

    def __init__(self, n: int, nb: int, tau, perturb: bool):
        self.n, self.tau, self.perturb = n, tau, perturb
        self.first_zero = np.full(nb, n, np.int64)
        self.perturbed = np.zeros(nb, np.int64)
        self.negative = np.zeros(nb, np.int64)
        self.zero = np.zeros(nb, np.int64)
        self.nonfinite = np.zeros(nb, np.int64)

    def pivots(self, d: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """``d`` (k, b): the pivots of columns ``cols``, perturbed where needed, counted."""
        if self.perturb:
            small = np.abs(d) < self.tau
            if small.any():
                d = np.where(small, np.where(d < 0, -self.tau, self.tau).astype(d.dtype), d)
                self.perturbed += small.sum(axis=0)
        self.count(d, cols)
        return d

    def perturb_one(self, d: np.ndarray) -> np.ndarray:
        """One column's pivots ``d`` (b,), perturbed where needed (counted as perturbed only; the
        signs are counted later by :meth:`count`)."""
        if self.perturb:
            small = np.abs(d) < self.tau[0]
            if small.any():
                d = np.where(small, np.where(d < 0, -self.tau[0], self.tau[0]).astype(d.dtype), d)
                self.perturbed += small
        return d

    def count(self, d: np.ndarray, cols: np.ndarray) -> None:
        """Count the signs of the pivots ``d`` (k, b) as used, columns ``cols`` (NaN and Inf apart)."""
        bad = ~np.isfinite(d)
        self.nonfinite += bad.sum(axis=0)
        self.negative += ((d < 0) & ~bad).sum(axis=0)
        isz = d == 0
        if isz.any():
            self.zero += isz.sum(axis=0)
            np.minimum(self.first_zero, np.where(isz, cols[:, None], self.n).min(axis=0), out=self.first_zero)


def _scalar_level(maps, cols, plan, lx, counts) -> None:
    """The single columns of one level: pivots, division, then their update triples round by round
    (``W``, the entries before division, kept for the level only)."""
    dpos = plan.colptr[cols]
    lx[dpos] = counts.pivots(lx[dpos], cols)
    if maps.ent.size == 0:
        return
    e = maps.ent
    v = lx[e]
    w = v.copy()
    with np.errstate(divide="ignore", invalid="ignore"):
        v /= lx[plan.colptr[np.repeat(cols, np.diff(plan.colptr)[cols] - 1)]]
    lx[e] = v
    q = 0
    for size in maps.round_sizes:
        for p in range(q, q + size, PIECE):
            r = min(p + PIECE, q + size)
            _update(lx, w, maps.a[p:r], maps.b_local[p:r], maps.t[p:r])
        q += size


def _supernode(sn, lx, counts):
    """Factor one wide supernode as a dense panel per matrix and apply its update to the ancestors.

    ``panel`` (b, s + m, s) holds the run's columns; ``wt`` (b, s, s + m) the same columns before
    their division by the pivot (``L D``), transposed, so that both operands of every product are
    BLAS-ready (``np.matmul`` falls back to a slow loop on a transposed view). Blocks of
    :data:`DENSE_BLOCK` columns: the diagonal block by rank-1 steps, the rows below it as
    ``A_below L11^-T`` (a product with the block's inverse, which the solves use too), the rest of
    the panel by one product. Returns the supernode's :class:`Dense` factors.
    """
    nb, s, m = lx.shape[1], sn.size, sn.below
    rows = s + m
    flat = np.zeros((rows * s, nb), lx.dtype)
    flat[sn.pan_dst] = lx[sn.pan_src]
    panel = np.ascontiguousarray(flat.T).reshape(nb, rows, s)
    wt = np.zeros((nb, s, rows), lx.dtype)
    inv, inv_t = [], []
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for k0 in range(0, s, DENSE_BLOCK):
            k1 = min(k0 + DENSE_BLOCK, s)
            for t in range(k0, k1):             # the diagonal block
                d = counts.perturb_one(panel[:, t, t])
                panel[:, t, t] = d
                v = panel[:, t + 1:k1, t]
                wt[:, t, t + 1:k1] = v
                v /= d[:, None]
                if t + 1 < k1:
                    panel[:, t + 1:k1, t + 1:k1] -= v[:, :, None] * wt[:, t, None, t + 1:k1]
            x = _unit_lower_inverse(panel[:, k0:k1, k0:k1])
            inv.append(x)
            inv_t.append(np.ascontiguousarray(x.transpose(0, 2, 1)))
            if k1 < rows:                        # the rows below: L_below D = A_below L11^-T
                below = np.matmul(panel[:, k1:, k0:k1], inv_t[-1])
                wt[:, k0:k1, k1:] = below.transpose(0, 2, 1)
                below /= np.diagonal(panel[:, k0:k1, k0:k1], axis1=1, axis2=2)[:, None, :]
                panel[:, k1:, k0:k1] = below
            if k1 < s:
                panel[:, k1:, k1:] -= np.matmul(panel[:, k1:, k0:k1], wt[:, k0:k1, k1:s])
        counts.count(np.diagonal(panel[:, :s, :s], axis1=1, axis2=2).T, np.arange(sn.first, sn.first + s))
        if m:   # L_R D L_R^T, its lower triangle by column blocks (the upper one is never read)
            update = np.empty((nb, m, m), lx.dtype)
            for j0 in range(0, m, UPDATE_BLOCK):
                j1 = min(j0 + UPDATE_BLOCK, m)
                update[:, j0:, j0:j1] = np.matmul(panel[:, s + j0:, :], wt[:, :, s + j0:s + j1])
            lx[sn.upd_dst] -= np.ascontiguousarray(update.reshape(nb, m * m).T)[sn.upd_src]
    return Dense(sn, panel, wt, inv, inv_t)


def _unit_lower_inverse(block: np.ndarray) -> np.ndarray:
    """The inverse of the unit lower triangular part of ``block`` (b, k, k), by substitution."""
    k = block.shape[1]
    x = np.broadcast_to(np.eye(k, dtype=block.dtype), block.shape).copy()
    for t in range(k - 1):   # row t of the inverse has its entries in columns 0..t
        x[:, t + 1:, :t + 1] -= block[:, t + 1:, t, None] * x[:, t, None, :t + 1]
    return x


class Dense:
    """A wide supernode's factors, batch-major: ``panel`` (b, s + m, s) (L below the diagonal, D on
    it), ``wt`` (b, s, s + m) the transpose of ``L D``, and per block of :data:`DENSE_BLOCK`
    columns the inverse of its unit lower diagonal block and that transposed. They are written back
    into ``Lx`` only when asked (:meth:`write_back`); ``lt``, L's transpose, is made at the first
    solve."""

    def __init__(self, sn, panel, wt, inv, inv_t):
        self.sn, self.panel, self.wt, self.inv, self.inv_t = sn, panel, wt, inv, inv_t
        self._lt = None

    @property
    def lt(self) -> np.ndarray:
        if self._lt is None:
            s = self.sn.size
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                d = np.diagonal(self.panel[:, :s, :s], axis1=1, axis2=2)
                self._lt = self.wt / d[:, :, None]
        return self._lt

    def take(self, rows: np.ndarray) -> Dense:
        """The factors of the matrices ``rows`` of the block only."""
        out = Dense(self.sn, self.panel[rows], self.wt[rows], [x[rows] for x in self.inv],
                    [x[rows] for x in self.inv_t])
        out._lt = None if self._lt is None else self._lt[rows]
        return out

    def adopt(self, i: int, other: Dense, j: int) -> None:
        """Take ``other``'s factors of its matrix ``j`` for matrix ``i`` of the block."""
        self.panel[i], self.wt[i] = other.panel[j], other.wt[j]
        for mine, theirs in zip(self.inv + self.inv_t, other.inv + other.inv_t):
            mine[i] = theirs[j]
        self._lt = None

    def write_back(self, lx: np.ndarray) -> None:
        """Store L and D of the supernode in ``lx`` (nnz(L), b) at their CSC positions."""
        nb = self.panel.shape[0]
        flat = np.ascontiguousarray(self.panel.reshape(nb, -1).T)
        lx[self.sn.pan_src] = flat[self.sn.pan_dst]


def factorize_block(plan, sched, lx: np.ndarray, tau: np.ndarray | None, perturb: bool):
    """Factor one block in place: ``lx`` (nnz(L), b) holds C's lower triangle on entry, L (unit,
    strictly lower) and D (on the diagonal positions) on return.

    ``sched`` is the plan's :class:`batchlu.kernels.sparse._supernodal.CpuSchedule`. ``tau`` (b,)
    is the pivot threshold per matrix. Returns ``((first_zero, perturbed, negative, zero, nonfinite),
    dense)``:
    ``dense`` the wide supernodes' :class:`Dense` factors by first column, and per matrix the first exactly zero pivot's column (``n`` if none; only left when ``perturb`` is
    False, or ``tau`` is 0), the count of perturbed pivots, and the counts of negative and exactly
    zero pivots as used (after any perturbation: a perturbed pivot keeps its sign, an exact zero
    becomes positive), and of NaN or infinite ones (after an exact zero, or an overflow).
    """
    counts = _Counts(plan.n, lx.shape[1], tau, perturb)
    dense = {}
    for level in sched.levels:
        if level.scalar is not None:
            _scalar_level(level.scalar, level.scalar_cols, plan, lx, counts)
        for sn in level.supernodes:
            dense[sn.first] = _supernode(sn, lx, counts)
    return (counts.first_zero, counts.perturbed, counts.negative, counts.zero, counts.nonfinite), dense


def solve_block(plan, cpu, lx: np.ndarray, dense: dict, y: np.ndarray) -> np.ndarray:
    """Solve ``L D L^T x = y`` in place for one block: ``lx`` (nnz(L), b), ``y`` (n, b, k) in the
    permuted numbering, along the CPU schedule's levels ``cpu``: a level's single columns by their
    conflict-free rounds (forward: distinct rows; backward: distinct columns), its wide supernodes
    with their :class:`Dense` factors (block triangular solves and products, batched)."""
    rowind, col_of = plan.rowind, cpu.col_of
    for level in cpu.levels:                       # L y = b
        maps = level.scalar
        if maps is not None:
            q = 0
            for size in maps.fwd_rounds:
                e = maps.fwd[q:q + size]
                y[rowind[e]] -= lx[e][:, :, None] * y[col_of[e]]
                q += size
        for sn in level.supernodes:
            _dense_forward(sn, dense[sn.first], y, rowind, plan.colptr)
    d = lx[plan.colptr[:-1]]                       # D z = y (the wide supernodes' D in their panels)
    for f in dense.values():
        sn = f.sn
        d[sn.first:sn.first + sn.size] = np.diagonal(f.panel[:, :sn.size, :sn.size], axis1=1, axis2=2).T
    y /= d[:, :, None]
    for level in reversed(cpu.levels):             # L^T x = z
        maps = level.scalar
        if maps is not None:
            q = 0
            for size in maps.bwd_rounds:
                e = maps.bwd[q:q + size]
                y[col_of[e]] -= lx[e][:, :, None] * y[rowind[e]]
                q += size
        for sn in level.supernodes:
            _dense_backward(sn, dense[sn.first], y, rowind, plan.colptr)
    return y


def _below(sn, rowind, colptr):
    last = sn.first + sn.size - 1
    return rowind[colptr[last] + 1:colptr[last + 1]]


def _dense_forward(sn, f, y, rowind, colptr) -> None:
    s, first = sn.size, sn.first
    big = np.ascontiguousarray(y[first:first + s].transpose(1, 0, 2))      # (b, s, k)
    for j, k0 in enumerate(range(0, s, DENSE_BLOCK)):
        k1 = min(k0 + DENSE_BLOCK, s)
        big[:, k0:k1] = np.matmul(f.inv[j], big[:, k0:k1])
        if k1 < s:
            big[:, k1:] -= np.matmul(f.panel[:, k1:s, k0:k1], big[:, k0:k1])
    y[first:first + s] = big.transpose(1, 0, 2)
    if sn.below:
        y[_below(sn, rowind, colptr)] -= np.matmul(f.panel[:, s:, :], big).transpose(1, 0, 2)


def _dense_backward(sn, f, y, rowind, colptr) -> None:
    s, first = sn.size, sn.first
    big = np.ascontiguousarray(y[first:first + s].transpose(1, 0, 2))
    if sn.below:
        below = np.ascontiguousarray(y[_below(sn, rowind, colptr)].transpose(1, 0, 2))
        big -= np.matmul(f.lt[:, :, s:], below)
    starts = list(range(0, s, DENSE_BLOCK))
    for j in range(len(starts) - 1, -1, -1):
        k0, k1 = starts[j], min(starts[j] + DENSE_BLOCK, s)
        if k1 < s:
            big[:, k0:k1] -= np.matmul(f.lt[:, k0:k1, k1:s], big[:, k1:])
        big[:, k0:k1] = np.matmul(f.inv_t[j], big[:, k0:k1])
    y[first:first + s] = big.transpose(1, 0, 2)
