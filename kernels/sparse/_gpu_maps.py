"""The index arrays the GPU kernels of :mod:`batchlu.kernels.sparse` read (``kernels/cuda/ldlt.cu``),
built on the host from a :class:`batchlu.kernels.sparse.Plan` with NumPy: once per plan (cached by its
digest, the last few plans of this process), then copied to each device once.

The GPU works on L's fundamental supernodes (:func:`batchlu.kernels.sparse._supernodal.supernodes`:
runs of columns ``f .. f+s-1``, each column's parent the next one, sharing the rows ``R`` below the
run, so that the run's lower triangle is dense), in *supernodal levels*: a supernode's level is one
above its highest child supernode's, leaves 0. Every supernode of a level is independent of the
others; the levels number 29-87 on the benchmark's meshes and grids of 1,000-20,000 unknowns, where
the column levels number 65-1,600.

Their size is that of L and A (int64), whatever the batch.

* ``col_of`` (nnz(L),): the column of each position of ``Lx``;
* ``sn_first``, ``sn_size`` (S,): each supernode's first column and column count, in column order;
* ``sn``, ``sn_ptr``: level ``l``'s supernodes ``sn[sn_ptr[l]:sn_ptr[l+1]]``; ``sn_of`` (n,) the
  supernode of each column;
* ``narrow``, ``narrow_ptr``: level ``l``'s supernodes of fewer than :data:`WIDE` columns, each
  factored and solved by one thread per matrix (``ldlt_panel``, ``ldlt_forward_runs``,
  ``ldlt_backward_runs``); ``wide``, ``wide_ptr`` the others (a block per run and group of matrices:
  ``ldlt_wide_panels``, ``ldlt_forward_wide``, ``ldlt_backward_wide``), and ``wide_cols``,
  ``wide_cols_ptr`` their columns (a thread each in the solves' ``*_external`` kernels);
* ``ent``, ``ent_ptr``: level ``l``'s positions in ``Lx`` (its columns' entries, diagonals
  included) ``ent[ent_ptr[l]:ent_ptr[l+1]]``;
* ``base`` (n,): for column ``k`` (column ``t`` of supernode ``g``), the position in ``Lx`` of the
  first row of ``R_g``: ``colptr[k] + s_g - t``; row ``R_g[r]`` of column ``k`` is ``base[k] + r``;
* ``rl_ptr``, ``rl_sn``, ``rl_idx``: L's rows by supernodes: row ``i`` lies below the supernodes
  ``rl_sn[rl_ptr[i]:rl_ptr[i+1]]`` (ascending), as their row ``R_g[rl_idx] == i``; row ``i`` of L is
  non-zero in exactly the columns of those supernodes (and ``i`` itself);
* ``a_ptr``, ``a_col``, ``a_src``: A's whole symmetric pattern in CSR, original numbering, each
  entry's index into a matrix's row of values (residuals and ``||A||_inf``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ._cache import PerPlan
from ._supernodal import supernodes

# loop bounds the host reads; every other array is copied to the device
HOST_ARRAYS = ("sn_ptr", "ent_ptr", "narrow_ptr", "wide_ptr", "wide_cols_ptr")
# a supernode of this many columns or more is factored a column at a time over all its rows (a block
# per run and group of matrices, a barrier between columns), a narrower one by one thread per matrix
WIDE = 8


@dataclasses.dataclass(frozen=True, eq=False)
class GpuMaps:
    """See the module docstring; every array int64."""

    col_of: np.ndarray
    sn_first: np.ndarray
    sn_size: np.ndarray
    sn: np.ndarray
    sn_ptr: np.ndarray
    sn_of: np.ndarray
    narrow: np.ndarray
    narrow_ptr: np.ndarray
    wide: np.ndarray
    wide_ptr: np.ndarray
    wide_cols: np.ndarray
    wide_cols_ptr: np.ndarray
    ent: np.ndarray
    ent_ptr: np.ndarray
    base: np.ndarray
    rl_ptr: np.ndarray
    rl_sn: np.ndarray
    rl_idx: np.ndarray
    a_ptr: np.ndarray
    a_col: np.ndarray
    a_src: np.ndarray

    @property
    def nlevels(self) -> int:
        return int(self.sn_ptr.size - 1)

    def arrays(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(a, a + m) for a, m in zip(starts, lengths)])``."""
    total = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    return np.repeat(starts - total[:-1], lengths) + np.arange(total[-1], dtype=np.int64)


def levels(parent: np.ndarray, first: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Each supernode's level: one above its highest child supernode's (leaves 0)."""
    count = first.size
    of = np.repeat(np.arange(count), size)             # the supernode of each column
    last = first + size - 1
    up = np.where(parent[last] >= 0, of[np.maximum(parent[last], 0)], -1)
    level = np.zeros(count, np.int64)
    for g in range(count):                              # children come before their parent
        if up[g] >= 0 and level[up[g]] < level[g] + 1:
            level[up[g]] = level[g] + 1
    return level


def build(plan) -> GpuMaps:
    n, colptr, rowind = plan.n, plan.colptr, plan.rowind
    lengths = np.diff(colptr)
    col_of = np.repeat(np.arange(n, dtype=np.int64), lengths)
    first, size = supernodes(plan.parent, colptr)
    first, size = first.astype(np.int64), size.astype(np.int64)
    level = levels(plan.parent, first, size)
    sn = np.argsort(level, kind="stable").astype(np.int64)
    bounds = np.arange((level.max() + 2) if n else 1)
    sn_ptr = np.searchsorted(level[sn], bounds).astype(np.int64)
    sn_of = np.repeat(np.arange(first.size, dtype=np.int64), size)
    narrow = sn[size[sn] < WIDE]
    narrow_ptr = np.searchsorted(level[narrow], bounds).astype(np.int64)
    wide = sn[size[sn] >= WIDE]
    wide_ptr = np.searchsorted(level[wide], bounds).astype(np.int64)
    wide_cols = _ranges(first[wide], size[wide])
    wide_cols_ptr = np.concatenate(([0], np.cumsum(size[wide])))[wide_ptr].astype(np.int64)
    cols = _ranges(first[sn], size[sn])
    col_ptr = np.concatenate(([0], np.cumsum(size[sn])))[sn_ptr].astype(np.int64)
    ent = _ranges(colptr[cols], lengths[cols])
    ent_ptr = np.concatenate(([0], np.cumsum(lengths[cols])))[col_ptr].astype(np.int64)
    # base: the rows below supernode g start after the run's remaining s - t entries of column f + t
    t = np.arange(n, dtype=np.int64) - np.repeat(first, size)
    base = colptr[:-1] + np.repeat(size, size) - t
    # rows by supernodes: R_g is the part of g's last column below its diagonal
    last = first + size - 1
    below = lengths[last] - 1
    rows = rowind[_ranges(colptr[last] + 1, below)]
    owner = np.repeat(np.arange(first.size, dtype=np.int64), below)
    idx = np.arange(rows.size, dtype=np.int64) - np.repeat(np.cumsum(below) - below, below)
    order = np.lexsort((owner, rows))
    rl_ptr = np.concatenate(([0], np.cumsum(np.bincount(rows, minlength=n)))).astype(np.int64)
    # A's symmetric pattern by rows (original numbering): the lower entries and their mirror images
    mirror = plan.a_row != plan.a_col
    a_rows = np.concatenate([plan.a_row, plan.a_col[mirror]])
    a_cols = np.concatenate([plan.a_col, plan.a_row[mirror]])
    src = np.concatenate([plan.value_src, plan.value_src[mirror]])
    a_order = np.argsort(a_rows, kind="stable")
    a_ptr = np.concatenate(([0], np.cumsum(np.bincount(a_rows, minlength=n)))).astype(np.int64)
    as64 = lambda x: np.ascontiguousarray(x, np.int64)  # noqa: E731
    return GpuMaps(col_of=as64(col_of), sn_first=as64(first), sn_size=as64(size), sn=as64(sn),
                   sn_ptr=as64(sn_ptr), sn_of=sn_of, narrow=as64(narrow), narrow_ptr=narrow_ptr,
                   wide=as64(wide), wide_ptr=wide_ptr, wide_cols=as64(wide_cols),
                   wide_cols_ptr=wide_cols_ptr, ent=as64(ent),
                   ent_ptr=as64(ent_ptr), base=as64(base), rl_ptr=as64(rl_ptr), rl_sn=as64(owner[order]),
                   rl_idx=as64(idx[order]), a_ptr=as64(a_ptr), a_col=as64(a_cols[a_order]),
                   a_src=as64(src[a_order]))


for_plan = PerPlan(build)   # the plan's `GpuMaps`, built once per plan digest
