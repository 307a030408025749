"""The index arrays the GPU kernels of :mod:`batchlu.kernels.sparse` read (``kernels/cuda/ldlt.cu``),
built on the host from a :class:`batchlu.kernels.sparse.Plan` with NumPy: once per plan (cached by its
digest, the last few plans of this process), then copied to each device once.

Their size is that of L and A (int64, about 24 bytes per entry of L), whatever the batch: unlike
the right-looking update triples of :meth:`Plan.schedule` (12 bytes per multiply-add), nothing here
grows with the factorization's work.

* ``col_of`` (nnz(L),): the column of each position of ``Lx``;
* ``ent`` and ``ent_ptr``: level ``l``'s entries, the positions of its columns in ``Lx`` (diagonals
  included), ``ent[ent_ptr[l]:ent_ptr[l+1]]`` (``ldlt_entries``);
* ``row_ptr``, ``row_col``, ``row_pos``: the rows of L's strict lower part in CSR, row ``i``'s
  columns ``k < i`` ascending at positions ``row_pos`` of ``Lx`` (the dot products and the forward
  solve);
* ``a_ptr``, ``a_col``, ``a_src``: A's whole symmetric pattern in CSR, original numbering, each
  entry's index into a matrix's row of values (residuals and ``||A||_inf``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ._cache import PerPlan


@dataclasses.dataclass(frozen=True, eq=False)
class GpuMaps:
    """See the module docstring; every array int64."""

    col_of: np.ndarray
    ent: np.ndarray
    ent_ptr: np.ndarray
    row_ptr: np.ndarray
    row_col: np.ndarray
    row_pos: np.ndarray
    a_ptr: np.ndarray
    a_col: np.ndarray
    a_src: np.ndarray

    def arrays(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def build(plan) -> GpuMaps:
    n, colptr, rowind = plan.n, plan.colptr, plan.rowind
    lengths = np.diff(colptr)
    col_of = np.repeat(np.arange(n, dtype=np.int64), lengths)
    # a level's entries: its columns' position ranges, one after the other
    cols = plan.level_cols
    starts, lens = colptr[cols], lengths[cols]
    total = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
    ent = np.repeat(starts - total[:-1], lens) + np.arange(total[-1], dtype=np.int64)
    ent_ptr = total[plan.level_ptr]
    # L's strict lower part by rows: a stable sort by row keeps each row's columns ascending
    off = np.flatnonzero(rowind != col_of)
    order = np.argsort(rowind[off], kind="stable")
    row_pos = off[order]
    row_col = col_of[row_pos]
    row_ptr = np.concatenate(([0], np.cumsum(np.bincount(rowind[off], minlength=n)))).astype(np.int64)
    # A's symmetric pattern by rows (original numbering): the lower entries and their mirror images
    mirror = plan.a_row != plan.a_col
    rows = np.concatenate([plan.a_row, plan.a_col[mirror]])
    a_cols = np.concatenate([plan.a_col, plan.a_row[mirror]])
    src = np.concatenate([plan.value_src, plan.value_src[mirror]])
    order = np.argsort(rows, kind="stable")
    a_ptr = np.concatenate(([0], np.cumsum(np.bincount(rows, minlength=n)))).astype(np.int64)
    as64 = lambda x: np.ascontiguousarray(x, np.int64)  # noqa: E731
    return GpuMaps(col_of=as64(col_of), ent=as64(ent), ent_ptr=as64(ent_ptr), row_ptr=as64(row_ptr),
                   row_col=as64(row_col), row_pos=as64(row_pos), a_ptr=as64(a_ptr),
                   a_col=as64(a_cols[order]), a_src=as64(src[order]))


for_plan = PerPlan(build)   # the plan's `GpuMaps`, built once per plan digest
