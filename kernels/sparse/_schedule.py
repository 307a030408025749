"""The index maps of a numeric factorization and triangular solves, level by level.

Built once per :class:`batchlu.kernels.sparse.Plan` on first use (from its L pattern and level sets,
vectorised NumPy; cached per plan in this process, never pickled with it). All positions index L's
value array ``Lx`` (the CSC order of ``plan.rowind``), which every backend keeps per matrix:

* the **entries** of level ``l``: ``ent_pos[ent_ptr[l]:ent_ptr[l+1]]``, the off-diagonal positions
  of the level's columns in CSC order (column by column, rows ascending); ``ent_diag`` the position
  of each one's diagonal (where its column's pivot ``d_k`` lives); ``fwd_pos`` and ``bwd_pos`` the
  same positions over the same ``ent_ptr`` ranges, cut into rounds in which every row (forward
  solve, ``y[row] -= l * y[col]``) or every column (backward solve, ``x[col] -= l * x[row]``) occurs
  once: round ``r`` is ``*_round_ptr[r]:*_round_ptr[r+1]``, level ``l`` has rounds
  ``*_level_round[l]:*_level_round[l+1]``;
* the **updates** of level ``l``: ``pair_a``, ``pair_b`` and ``pair_t`` over
  ``pair_ptr[l]:pair_ptr[l+1]``, one triple per pair of off-diagonal entries ``(i, k)``, ``(j, k)``
  of one column ``k`` of the level with ``i >= j``: the right-looking update

      Lx[pair_t] -= Lx[pair_a] * W[pair_b]          (L[i, j] -= l_ik * (l_jk d_k))

  where ``W`` holds each entry's value before its column was divided by the pivot (``l_jk d_k``,
  the seed paper's ``tmpMem1``). Targets are ancestors' entries (i >= j > k): no update of a level
  touches the level's own columns. Two columns of one level may update the same entry, so each
  level's triples are cut into **rounds** in which every target appears at most once: round ``r``
  is ``round_ptr[r]:round_ptr[r+1]`` and level ``l`` has rounds ``level_round[l]:level_round[l+1]``.
  A round is one conflict-free scatter (no atomics, no segmented sum); the rounds of a level run one
  after the other. Within a round the triples are sorted by target. A level's triple count is
  ``sum m_k (m_k + 1) / 2`` over its columns (``m_k`` the column's off-diagonal count): the
  factorization's multiply-adds.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ._cache import PerPlan


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
    """See the module docstring. ``index`` is the integer dtype of every position array (int32 when
    nnz(L) < 2**31, else int64)."""

    col_of: np.ndarray     # (nnz(L),) column of each position
    ent_ptr: np.ndarray    # (nlevels + 1,) int64
    ent_pos: np.ndarray    # (nnz(L) - n,)
    ent_diag: np.ndarray   # (nnz(L) - n,)
    fwd_pos: np.ndarray    # (nnz(L) - n,) in rounds of distinct rows (fwd_round_ptr, fwd_level_round)
    fwd_round_ptr: np.ndarray
    fwd_level_round: np.ndarray
    bwd_pos: np.ndarray    # (nnz(L) - n,) in rounds of distinct columns (bwd_round_ptr, bwd_level_round)
    bwd_round_ptr: np.ndarray
    bwd_level_round: np.ndarray
    pair_ptr: np.ndarray   # (nlevels + 1,) int64
    pair_a: np.ndarray     # (pairs,)
    pair_b: np.ndarray     # (pairs,)
    pair_t: np.ndarray     # (pairs,)
    round_ptr: np.ndarray  # (rounds + 1,) int64: round r is pair_*[round_ptr[r]:round_ptr[r+1]]
    level_round: np.ndarray  # (nlevels + 1,) int64: level l has rounds level_round[l]:level_round[l+1]
    # A itself (both triangles, original numbering) as CSR, for residuals: entry q of row i is
    # column sym_col[q] with the value values[..., sym_src[q]]
    sym_ptr: np.ndarray    # (n + 1,) int64
    sym_col: np.ndarray    # (nnz of both triangles,)
    sym_src: np.ndarray    # (nnz of both triangles,)

    @property
    def pairs(self) -> int:
        return int(self.pair_ptr[-1])

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, f.name).nbytes for f in dataclasses.fields(self))


def update_pairs(colptr: np.ndarray) -> int:
    """The number of update triples (multiply-adds per matrix) without building them."""
    m = np.diff(colptr) - 1
    return int(np.sum(m * (m + 1) // 2))


def symmetric(n: int, rows: np.ndarray, cols: np.ndarray, src: np.ndarray):
    """Both triangles of A from its lower entries, as CSR ``(ptr, col, src)`` sorted by (row, col)."""
    off = rows != cols
    r = np.concatenate([rows, cols[off]])
    c = np.concatenate([cols, rows[off]])
    s = np.concatenate([src, src[off]])
    order = np.lexsort((c, r))
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(r, minlength=n), out=ptr[1:])
    return ptr, c[order], s[order]


def _rounds(keys: np.ndarray):
    """An order of ``keys`` in rounds of distinct keys (the k-th occurrence of a key in round k), each
    round sorted by key; returns ``(order, round sizes)``."""
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    total = k.size
    if total == 0:
        return order, []
    new = np.concatenate(([True], k[1:] != k[:-1]))
    starts = np.flatnonzero(new)
    occ = np.arange(total) - np.repeat(starts, np.diff(np.append(starts, total)))
    by_round = np.argsort(occ, kind="stable")
    return order[by_round], np.bincount(occ).tolist()


class _LevelMaps:
    """The entries and update triples (in rounds) of one set of columns: see the module docstring."""

    def __init__(self, cols, colptr, rowind, col_of, key, n):
        counts = np.diff(colptr)
        m = counts[cols] - 1
        first = colptr[cols] + 1
        # the off-diagonal positions of the columns, column by column
        e = np.repeat(first - np.concatenate(([0], np.cumsum(m)[:-1])), m) + np.arange(int(m.sum()))
        self.ent = e
        order, self.fwd_rounds = _rounds(rowind[e])      # forward solve: rows distinct per round
        self.fwd = e[order]
        order, self.bwd_rounds = _rounds(col_of[e])      # backward solve: columns distinct per round
        self.bwd = e[order]
        # pairs (a >= b) of each column: entry b, then every entry a from b to the column's end
        count = colptr[col_of[e] + 1] - e
        total = int(count.sum())
        b = np.repeat(e, count)
        a = b + (np.arange(total) - np.repeat(np.cumsum(count) - count, count))
        t = np.searchsorted(key, rowind[b] * max(n, 1) + rowind[a])
        order, self.round_sizes = _rounds(t)
        self.a, self.b, self.t = a[order], b[order], t[order]
        self.b_local = np.searchsorted(e, self.b)        # b's index among the columns' entries


def _keys(n, colptr, rowind):
    col_of = np.repeat(np.arange(n, dtype=np.int64), np.diff(colptr))
    return col_of, col_of * max(n, 1) + rowind      # ascending: CSC with rows ascending per column


def build(plan) -> Schedule:
    n, colptr, rowind, level_ptr, level_cols = plan.n, plan.colptr, plan.rowind, plan.level_ptr, plan.level_cols
    nnz_l = int(colptr[-1]) if colptr.size else 0
    index = np.int32 if nnz_l < 2**31 - 1 else np.int64
    col_of, key = _keys(n, colptr, rowind)
    nlevels = level_ptr.size - 1
    ent_ptr = np.zeros(nlevels + 1, np.int64)
    pair_ptr = np.zeros(nlevels + 1, np.int64)
    ents, fwds, bwds, pa, pb, pt, rounds = [], [], [], [], [], [], [0]
    level_round = np.zeros(nlevels + 1, np.int64)
    fwd_rounds, bwd_rounds = [0], [0]
    fwd_level_round = np.zeros(nlevels + 1, np.int64)
    bwd_level_round = np.zeros(nlevels + 1, np.int64)
    for lev in range(nlevels):
        maps = _LevelMaps(level_cols[level_ptr[lev]:level_ptr[lev + 1]], colptr, rowind, col_of, key, n)
        ents.append(maps.ent)
        fwds.append(maps.fwd)
        bwds.append(maps.bwd)
        fwd_rounds.extend((ent_ptr[lev] + np.cumsum(maps.fwd_rounds)).tolist())
        bwd_rounds.extend((ent_ptr[lev] + np.cumsum(maps.bwd_rounds)).tolist())
        fwd_level_round[lev + 1] = len(fwd_rounds) - 1
        bwd_level_round[lev + 1] = len(bwd_rounds) - 1
        ent_ptr[lev + 1] = ent_ptr[lev] + maps.ent.size
        rounds.extend((pair_ptr[lev] + np.cumsum(maps.round_sizes)).tolist())
        level_round[lev + 1] = len(rounds) - 1
        pa.append(maps.a)
        pb.append(maps.b)
        pt.append(maps.t)
        pair_ptr[lev + 1] = pair_ptr[lev] + maps.t.size

    def cat(parts):
        return (np.concatenate(parts) if parts else np.zeros(0, np.int64)).astype(index)

    ent_pos = cat(ents)
    sym_ptr, sym_col, sym_src = symmetric(n, plan.a_row, plan.a_col, plan.value_src)
    return Schedule(sym_ptr=sym_ptr, sym_col=sym_col.astype(np.int64), sym_src=sym_src.astype(np.int64),
                    col_of=col_of.astype(index), ent_ptr=ent_ptr, ent_pos=ent_pos,
                    ent_diag=colptr[col_of[ent_pos]].astype(index), fwd_pos=cat(fwds),
                    fwd_round_ptr=np.asarray(fwd_rounds, np.int64), fwd_level_round=fwd_level_round,
                    bwd_pos=cat(bwds), bwd_round_ptr=np.asarray(bwd_rounds, np.int64),
                    bwd_level_round=bwd_level_round,
                    pair_ptr=pair_ptr, pair_a=cat(pa), pair_b=cat(pb), pair_t=cat(pt),
                    round_ptr=np.asarray(rounds, np.int64), level_round=level_round)


for_plan = PerPlan(build)   # the plan's `Schedule`, built once per plan digest
