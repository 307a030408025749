"""``analyze``: the symbolic phase, once per pattern, on the host; its result, :class:`Plan`."""

from __future__ import annotations

import dataclasses
import functools
import zlib

import numpy as np

from batchlu.errors import ConfigError

from . import _ordering, _pattern, _schedule, _symbolic

KINDS = ("sym-indef", "spd")


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """The symbolic analysis of one symmetric pattern: everything a numeric factorization of any
    matrix with that pattern needs. Frozen, picklable, plain NumPy arrays (int64).

    Numbering: the *original* numbering is the input's; the *permuted* one is that of
    ``C = P A P^T = A[perm][:, perm]``, which is what L, D, the tree and the levels refer to.

    Attributes
    ----------
    n, nnz : the order of A and the number of entries of the input pattern (``values.shape[-1]``).
    pattern : ``"full"`` (both triangles stored) or ``"lower"`` (lower triangle only); either way A
        is the symmetric matrix of the entries with ``row >= column``.
    kind : ``"sym-indef"`` or ``"spd"`` (recorded; the factorization is the same LDL^T).
    ordering : ``"amd"``, ``"metis"``, ``"natural"`` or ``"given"``.
    perm : (n,) new to old: row/column ``k`` of C is row/column ``perm[k]`` of A.
    iperm : (n,) old to new, ``iperm[perm[k]] == k``.
    parent : (n,) the elimination tree of C: ``parent[j]`` is the smallest row ``i > j`` with
        ``L[i, j] != 0``, -1 for a root; always ``parent[j] > j``.
    colptr, rowind : L's pattern in CSC, (n+1,) and (nnz_l,): column ``j`` is
        ``rowind[colptr[j]:colptr[j+1]]``, its diagonal ``j`` first, then the rows below, ascending.
        A factor's value array ``Lx`` follows this order: D's pivot ``d_j`` at ``colptr[j]``, the
        multipliers ``l_ij`` (unit L) at the other positions.
    level_ptr, level_cols : the level sets of the tree (leaves are level 0, a parent is 1 + its
        highest child): level ``l`` is ``level_cols[level_ptr[l]:level_ptr[l+1]]`` (ascending); the
        columns of one level are independent.
    value_src, value_dst : (m,) the scatter of the input into ``Lx``: before factorizing,
        ``Lx[value_dst] = values[..., value_src]`` (every other position 0, fill-in included).
        ``value_src`` are the input entries on or below the diagonal.
    a_row, a_col : (m,) row and column (original numbering, ``a_row >= a_col``) of those entries.
    value_mirror : (m,) for pattern ``"full"``, the input entry mirroring each of them (``(j, i)``),
        whose value must equal it (:func:`batchlu.kernels.sparse._shared.check_values`); else None.

    The per-level index maps of the numeric phase (update triples, solve orders) are built on first
    use by :meth:`schedule` (:mod:`batchlu.kernels.sparse._schedule` documents them).
    """

    n: int
    nnz: int
    pattern: str
    kind: str
    ordering: str
    perm: np.ndarray
    iperm: np.ndarray
    parent: np.ndarray
    colptr: np.ndarray
    rowind: np.ndarray
    level_ptr: np.ndarray
    level_cols: np.ndarray
    value_src: np.ndarray
    value_dst: np.ndarray
    a_row: np.ndarray
    a_col: np.ndarray
    value_mirror: np.ndarray | None = None

    # ------------------------------------------------------------------------------ derived numbers
    @property
    def nnz_l(self) -> int:
        """Entries of L, its diagonal (D) included."""
        return int(self.colptr[-1])

    @property
    def nlevels(self) -> int:
        return int(self.level_ptr.size - 1)

    @property
    def level(self) -> np.ndarray:
        """(n,) each column's level."""
        out = np.empty(self.n, np.int64)
        out[self.level_cols] = np.repeat(np.arange(self.nlevels), np.diff(self.level_ptr))
        return out

    @property
    def update_pairs(self) -> int:
        """Multiply-adds of one numeric factorization (the update triples of :meth:`schedule`)."""
        return _schedule.update_pairs(self.colptr)

    @functools.cached_property
    def digest(self) -> str:
        """A CRC-32 of the pattern, the ordering and L's pattern: equal digests, equal factors."""
        crc = zlib.crc32(f"{self.n} {self.nnz} {self.pattern}".encode())
        for x in (self.perm, self.colptr, self.rowind, self.value_src, self.value_dst):
            crc = zlib.crc32(np.ascontiguousarray(x, np.int64).tobytes(), crc)
        return f"{crc:08x}"

    def schedule(self) -> _schedule.Schedule:
        """The per-column-level index maps of the seed paper's right-looking numeric phase (built
        once, cached in this process). Their update triples take 12 bytes per multiply-add
        (:attr:`update_pairs`): gigabytes for 3-D meshes of a few thousand unknowns, so neither
        backend uses them whole: the CPU builds its supernodal schedule from the same pieces
        (:mod:`._supernodal`), the GPU's dot-product form needs only L's rows (:mod:`._gpu_maps`)."""
        return _schedule.for_plan(self)

    def describe(self) -> str:
        return (f"n {self.n:,}, nnz(A lower) {self.a_row.size:,}, nnz(L) {self.nnz_l:,} "
                f"(fill {self.nnz_l / max(1, self.a_row.size):.2f}x), {self.nlevels:,} levels, "
                f"{self.update_pairs:,} multiply-adds, ordering {self.ordering}")

    __repr__ = describe

    # ------------------------------------------------------------------------------------- numeric
    def factorize(self, values, *, perturb: bool = True, pivot_tol: float | None = None):
        """LDL^T of every matrix of ``values`` (B, nnz) (or (nnz,) for one): a
        :class:`batchlu.kernels.sparse.Factor`. NumPy in, the CPU backend; CuPy in, the GPU's.

        Static pivoting (``perturb``, the default): a pivot with ``|d| < pivot_tol * ||A||_inf``
        becomes ``+-pivot_tol * ||A||_inf`` (its sign kept, +1 for 0) and is counted per matrix
        (:meth:`Factor.perturbed_pivots`). ``pivot_tol`` defaults to the square root of the dtype's
        machine epsilon; with that default, :meth:`Factor.solve` gives a matrix that refinement
        leaves above its tolerance after perturbed pivots a second attempt at ``eps * ||A||_inf``
        (:meth:`Factor.retried`); a ``pivot_tol`` given is kept as it is. Without ``perturb``, an
        exactly zero pivot gives ``info = k`` (1-based column of C) and that matrix's solutions are
        NaN.
        """
        from ._factor import factorize

        return factorize(self, values, perturb=perturb, pivot_tol=pivot_tol)


def _check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ConfigError(f"Expected kind to be one of {', '.join(KINDS)}. Got {kind!r} instead.")
    return kind


def analyze(indptr, indices, n, *, kind: str = "sym-indef", ordering="amd", pattern: str | None = None) -> Plan:
    """The symbolic phase for the symmetric pattern ``indptr``, ``indices`` (CSR) of order ``n``.

    ``pattern`` is ``"full"`` (both triangles, a symmetric pattern), ``"lower"`` (the lower triangle)
    or None to detect it (lower when no entry lies above the diagonal). ``ordering`` is ``"amd"``
    (default), ``"metis"`` (needs ``batchlu[metis]``), ``"natural"`` or a permutation array (new to
    old). ``kind`` (``"sym-indef"`` or ``"spd"``) is recorded for the numeric phase and checks.
    Returns a :class:`Plan`; bad input raises :class:`batchlu.errors.InputError` (or
    :class:`batchlu.errors.ConfigError` for a bad option) with a one-line message.
    """
    kind = _check_kind(kind)
    pattern, keep, rows, cols, mirror = _pattern.lower_entries(indptr, indices, n, pattern)
    n = int(n)
    name, perm = _ordering.order(ordering, n, rows, cols)
    iperm = np.empty(n, np.int64)
    iperm[perm] = np.arange(n, dtype=np.int64)
    pr, pc = iperm[rows], iperm[cols]
    lo, hi = np.minimum(pr, pc), np.maximum(pr, pc)   # C's lower triangle
    parent, colptr, rowind, level = _symbolic.symbolic(n, hi, lo)
    level_ptr, level_cols = _symbolic.level_sets(level)
    col_of = np.repeat(np.arange(n, dtype=np.int64), np.diff(colptr))
    key = col_of * max(n, 1) + rowind
    dst = np.searchsorted(key, lo * max(n, 1) + hi)
    return Plan(n=n, nnz=int(np.asarray(indices).size), pattern=pattern, kind=kind, ordering=name,
                perm=perm, iperm=iperm, parent=parent, colptr=colptr, rowind=rowind,
                level_ptr=level_ptr, level_cols=level_cols, value_src=keep.astype(np.int64),
                value_dst=dst.astype(np.int64), a_row=rows.astype(np.int64), a_col=cols.astype(np.int64),
                value_mirror=None if mirror is None else mirror.astype(np.int64))
