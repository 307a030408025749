"""The numeric factors of a batch on the CPU and what is done with them: solve with iterative
refinement, inertia, perturbed pivots, backward errors. The checks, codes and refinement that the GPU
factor (:mod:`batchlu.kernels.sparse._gpu`) shares are in :mod:`batchlu.kernels.sparse._shared`.

``info`` per matrix (the codes of :mod:`batchlu.kernels._info`):

* 0: ok;
* ``k > 0``: the pivot ``D[k-1]`` of ``C = P A P^T`` is exactly zero (``plan.perm[k-1]`` is A's
  column): without static pivoting, or with it where ``||A|| = 0`` makes its threshold 0; the
  matrix's solutions are NaN;
* -1 (``INFO_NONFINITE_INPUT``): the matrix (or, in :meth:`Factor.solve`, its right-hand side) holds
  NaN or Inf; solutions NaN, inertia -1;
* -2 (``INFO_NONFINITE_RESULT``): finite input, but a pivot (inertia -1) or the solution is not
  finite (overflow);
* -4 (``INFO_REFINEMENT``): :meth:`Factor.solve` only: after the refinement steps the normwise
  backward error is still above ``tol`` (default ``n * eps`` of the dtype), and, with the default
  pivot threshold after perturbed pivots, after the second attempt at ``eps ||A||_inf`` too, or
  where that attempt had to perturb a pivot (below rounding: singular to working precision; see
  :meth:`Refining.solve`); ``x`` is the best iterate.
"""

from __future__ import annotations

import numpy as np

from batchlu.errors import BatchIndexError, InputError

from .._validate import is_cupy
from . import _cpu
from ._shared import DTYPES, Refining, check_pivot_tol, check_values, pivot_codes, retry_pivot_tol

__all__ = ["DTYPES", "Factor", "Refining", "check_pivot_tol", "check_values", "factorize", "inf_norms",
           "pivot_codes"]


def _compiled():
    """:mod:`._cpu_numba` where the CPU backend's compiled engine runs (``batchlu.kernels.cpu_engine``),
    else None (the NumPy engine of :mod:`._cpu`)."""
    from batchlu.kernels import _cpu as dense

    if dense._compiled() is None:
        return None
    from . import _cpu_numba

    return _cpu_numba


def inf_norms(plan, values: np.ndarray) -> np.ndarray:
    """``||A||_inf`` per matrix (float64; NaN for a non-finite matrix): the row sums of ``|A|`` as
    one product of ``|values|`` with the pattern's (entry -> rows) incidence matrix."""
    import scipy.sparse as sp

    if plan.n == 0 or values.shape[0] == 0:
        return np.zeros(values.shape[0])
    off = plan.a_row != plan.a_col
    src = np.concatenate([plan.value_src, plan.value_src[off]])
    row = np.concatenate([plan.a_row, plan.a_col[off]])
    incidence = sp.csr_array((np.ones(src.size), (src, row)), shape=(plan.nnz, plan.n))
    sums = incidence.T @ np.abs(values.astype(np.float64, copy=False)).T     # (n, B)
    return sums.max(axis=0)


def factorize(plan, values, *, perturb: bool = True, pivot_tol: float | None = None):
    if is_cupy(values):
        from . import _gpu

        return _gpu.factorize(plan, values, perturb=perturb, pivot_tol=pivot_tol)
    values, single = check_values(plan, values)
    dtype = values.dtype
    retry_tol = retry_pivot_tol(pivot_tol, perturb, dtype)
    pivot_tol = check_pivot_tol(pivot_tol, dtype)
    return _factorize(plan, values, single, inf_norms(plan, values), float(pivot_tol), bool(perturb), retry_tol,
                      _compiled())


def _factorize(plan, values, single, anorm, pivot_tol, perturb, retry_tol, compiled):
    """:func:`factorize` of checked ``values`` with their norms ``anorm``, on the compiled engine
    ``compiled`` (:mod:`._cpu_numba`) or, where None, the NumPy one."""
    from . import _supernodal

    dtype = values.dtype
    count = values.shape[0]
    finite = np.isfinite(values).all(axis=1)
    tau = (pivot_tol * np.nan_to_num(anorm, nan=0.0, posinf=0.0)).astype(dtype)
    blocks = []
    lanes = None
    if compiled is not None:
        lanes, (first_zero, perturbed, negative, zero, nonfinite) = compiled.factorize(plan, values, tau, perturb)
        width = compiled.LANES
        blocks = [(s, min(s + width, count), lanes[i, :, :min(width, count - s)], {})
                  for i, s in enumerate(range(0, count, width))]
    else:
        first_zero = np.full(count, plan.n, np.int64)
        perturbed = np.zeros(count, np.int64)
        negative = np.zeros(count, np.int64)
        zero = np.zeros(count, np.int64)
        nonfinite = np.zeros(count, np.int64)
        cpu = _supernodal.for_plan(plan)
        block = _cpu.block_size(plan, dtype.itemsize)
        for s in range(0, count, block):
            e = min(s + block, count)
            lx = np.zeros((plan.nnz_l, e - s), dtype)
            lx[plan.value_dst] = values[s:e, plan.value_src].T
            counts, dense = _cpu.factorize_block(plan, cpu, lx, tau[s:e][None, :], perturb)
            first_zero[s:e], perturbed[s:e], negative[s:e], zero[s:e], nonfinite[s:e] = counts
            blocks.append((s, e, lx, dense))
    info, inertia = pivot_codes(plan.n, first_zero, negative, zero, nonfinite, finite)
    perturbed[~finite] = -1
    return Factor(plan, values, blocks, info, perturbed.astype(np.int32), inertia, anorm, pivot_tol, perturb, single,
                  lanes, retry_tol)


class Factor(Refining):
    """``P A P^T = L D L^T`` for every matrix of a batch (CPU backend: NumPy, batch-minor blocks).

    ``info`` (B,) int32 is the factorization's (0, ``k > 0`` or -1; see the module docstring);
    :meth:`solve` returns its own, which adds the right-hand side's and the refinement's codes.
    """

    backend = "cpu"

    def __init__(self, plan, values, blocks, info, perturbed, inertia, anorm, pivot_tol, perturb, single,
                 lanes=None, retry_tol=None):
        self.plan = plan
        self.dtype = values.dtype
        self.values = values             # kept for the residuals of iterative refinement
        self._blocks = blocks            # [(start, stop, lx (nnz_l, stop - start), {first: _cpu.Dense})]
        self._lanes = lanes              # compiled engine: all of lx, (blocks, nnz_l, LANES) (_cpu_numba)
        self.info = info
        self._perturbed = perturbed
        self._inertia = inertia
        self.anorm = anorm               # ||A||_inf per matrix (float64)
        self.pivot_tol = pivot_tol
        self.perturb = perturb
        self.single = single
        self.retry_tol = retry_tol       # the second attempt's threshold factor (solve), or None
        self._tried = np.zeros(values.shape[0], bool)     # given a second attempt
        self._retried = np.zeros(values.shape[0], bool)   # ... and holding its factors now
        self._complete = False           # wide supernodes written back into Lx (see _written)
        self._spmv = None                # see _incidence
        self.refine_steps = None         # per matrix, of the last solve
        self.last_backward_error = None  # per matrix, of the last solve

    @property
    def batch(self) -> int:
        return self.values.shape[0]

    def _written(self):
        """The blocks, with the wide supernodes' factors written back into ``Lx`` (once)."""
        if not self._complete:
            for _, _, lx, dense in self._blocks:
                for f in dense.values():
                    f.write_back(lx)
            self._complete = True
        return self._blocks

    # ------------------------------------------------------------------------------------ queries
    def perturbed_pivots(self) -> np.ndarray:
        """(B,) int32: how many pivots static pivoting replaced, per matrix (-1 for a non-finite one)."""
        return self._out(self._perturbed.copy())

    def inertia(self) -> np.ndarray:
        """(B, 3) int64: the counts of positive, negative and zero pivots of D per matrix, as used:
        by Sylvester's law of inertia, the inertia of the matrix actually factored, ``A + E``.
        Without perturbed pivots ``E = 0`` and this is A's inertia. A perturbed pivot keeps its
        sign (an exact zero becomes ``+pivot_tol ||A||``), so ``E`` is as small as the threshold
        and for a nonsingular A well apart from it the counts are still A's; with static pivoting
        off an exactly zero pivot counts as zero. -1 for a non-finite matrix, and where a pivot is
        NaN or infinite (after a zero pivot, or an overflow): the counts would mean nothing.
        """
        return self._out(self._inertia.copy())

    def pivots(self) -> np.ndarray:
        """(B, n): D's pivots in C's numbering, as used (perturbed ones replaced)."""
        out = np.empty((self.batch, self.plan.n), self.dtype)
        for s, e, lx, _ in self._written():
            out[s:e] = lx[self.plan.colptr[:-1]].T
        return self._out(out)

    def factors(self, index: int = 0):
        """``(L, d)`` of matrix ``index``: L unit lower triangular as a SciPy CSC array and D's
        pivots, with ``L @ diag(d) @ L.T == A[perm][:, perm]`` up to rounding."""
        import scipy.sparse as sp

        plan = self.plan
        for s, e, lx, _ in self._written():
            if s <= index < e:
                data = lx[:, index - s].copy()
                d = data[plan.colptr[:-1]].copy()
                data[plan.colptr[:-1]] = 1
                return sp.csc_array((data, plan.rowind, plan.colptr), shape=(plan.n, plan.n)), d
        raise BatchIndexError(f"Expected an index in [0, {self.batch}). Got {index} instead.")

    # -------------------------------------------------------------------------------- second attempt
    def _refactor(self, rows: np.ndarray, pivot_tol: float) -> Factor:
        """The matrices ``rows`` factored again with the threshold factor ``pivot_tol``, on this
        factor's engine."""
        compiled = None
        if self._lanes is not None:
            from . import _cpu_numba as compiled
        return _factorize(self.plan, self.values[rows], False, self.anorm[rows], float(pivot_tol), True, None,
                          compiled)

    def _adopt(self, rows: np.ndarray, other: Factor, src: np.ndarray) -> None:
        """Take ``other``'s factors of its matrices ``src`` for this factor's matrices ``rows``."""
        if rows.size == self.batch and np.array_equal(src, np.arange(other.batch)):   # all of them: its storage
            self._blocks, self._lanes, self._complete = other._blocks, other._lanes, other._complete
            return
        if self._lanes is not None:
            width = self._lanes.shape[2]
            self._lanes[rows // width, :, rows % width] = other._lanes[src // width, :, src % width]
            return
        mine, theirs = self._written(), other._written()
        starts, their_starts = [s for s, *_ in mine], [s for s, *_ in theirs]
        for r, j in zip(rows.tolist(), src.tolist()):
            s, _, lx, dense = mine[np.searchsorted(starts, r, side="right") - 1]
            t, _, their_lx, their_dense = theirs[np.searchsorted(their_starts, j, side="right") - 1]
            lx[:, r - s] = their_lx[:, j - t]
            for first, f in dense.items():
                f.adopt(r - s, their_dense[first], j - t)

    # -------------------------------------------------------------------------------------- solve
    def _solve(self, r: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """``x`` (B, n, k) in the factor's dtype with ``L D L^T (P x) = P r``, for the matrices
        ``rows`` only (all by default; the others' ``x`` is left 0)."""
        from . import _supernodal

        if self._lanes is not None:
            return _compiled().solve(self.plan, self._lanes, r, rows, self.dtype)
        plan, cpu = self.plan, _supernodal.for_plan(self.plan)
        x = np.zeros(r.shape, self.dtype)
        for s, e, lx, dense in self._blocks:
            local = np.arange(e - s) if rows is None else rows[(rows >= s) & (rows < e)] - s
            if local.size == 0:
                continue
            if local.size < e - s:
                lx = lx[:, local]
                dense = {k: f.take(local) for k, f in dense.items()}
            y = np.ascontiguousarray(r[s + local].transpose(1, 0, 2)[plan.perm], dtype=self.dtype)
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                _cpu.solve_block(plan, cpu, lx, dense, y)
            x[s + local] = y[plan.iperm].transpose(1, 0, 2)
        return x

    def _incidence(self):
        """Sparse (n, m) matrices that sum A's lower entries into their rows and (off the diagonal)
        into their columns, ``A x = S_row (v * x[col]) + S_col (v * x[row])`` for all matrices at
        once, and the entries' values ``v`` (m, B) in float64 (built once per factor)."""
        if self._spmv is None:
            import scipy.sparse as sp

            plan = self.plan
            m = plan.a_row.size
            off = np.flatnonzero(plan.a_row != plan.a_col)
            s_row = sp.csr_array((np.ones(m), (plan.a_row, np.arange(m))), shape=(plan.n, m))
            s_col = sp.csr_array((np.ones(off.size), (plan.a_col[off], np.arange(off.size))),
                                 shape=(plan.n, off.size))
            values = np.ascontiguousarray(self.values[:, plan.value_src].T, dtype=np.float64)  # (m, B)
            self._spmv = (s_row, s_col, off, values, np.ascontiguousarray(values[off]))
        return self._spmv

    def _residual(self, b: np.ndarray, x: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """``b - A x`` in float64 for the matrices ``rows``; ``b`` and ``x`` (len(rows), n, k) are
        theirs, in the same order."""
        plan = self.plan
        if self._lanes is not None:
            return _compiled().residual(plan, self.values, rows, b, x)
        s_row, s_col, off, v, v_off = self._incidence()
        if rows.size < self.batch or np.any(rows != np.arange(self.batch)):
            v, v_off = v[:, rows], v_off[:, rows]
        xt = np.ascontiguousarray(x.transpose(1, 0, 2), dtype=np.float64)       # (n, r, k)
        k = xt.shape[2]
        ax = s_row @ (v[:, :, None] * xt[plan.a_col]).reshape(v.shape[0], rows.size * k)
        if off.size:   # a diagonal-only pattern has no mirrored entries
            ax += s_col @ (v_off[:, :, None] * xt[plan.a_row[off]]).reshape(off.size, rows.size * k)
        return b - ax.reshape(plan.n, rows.size, k).transpose(1, 0, 2)

    def backward_error(self, b, x) -> np.ndarray:
        """(B,) float64: ``||b - A x||_inf / (||A||_inf ||x||_inf + ||b||_inf)`` per matrix (the
        largest over a matrix's right-hand sides), computed in float64. NaN where x is not finite."""
        b3, vector = self._check_rhs(b)
        x3, _ = self._check_rhs(x, "x")
        if x3.shape != b3.shape:
            raise InputError(f"Expected x of the shape of b, {np.shape(b)}. Got {np.shape(x)} instead.")
        rows = np.arange(self.batch)
        be = (self._berr(self._residual(b3.astype(np.float64), x3, rows), x3, b3, rows) if self.plan.n
              else np.zeros(self.batch))
        return self._out(be)

    def _berr(self, r, x, b, rows):
        if self._lanes is not None:
            return _compiled().berr(r, x, b, self.anorm[rows])
        return super()._berr(r, x, b, rows)

    def _first(self, b):
        return self._solve(b)

    def _correction(self, r, rows):
        return self._solve(r, rows)[rows]
