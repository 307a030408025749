"""What the two backends' factors share: :class:`batchlu.kernels.sparse._factor.Factor` (CPU) and
:class:`batchlu.kernels.sparse._gpu.GpuFactor` (CuPy) import it, and neither imports the other.

The checks of the values and of the pivot threshold (and the second attempt's threshold), the
``info`` codes and inertia from the pivots' counts (the codes are listed in
:mod:`batchlu.kernels.sparse._factor`), and :class:`Refining`, the right-hand sides' checks, backward
errors, iterative refinement and the second attempt of ``solve``, written over an array module.
"""

from __future__ import annotations

import numpy as np

from batchlu.errors import InputError, InputTypeError
from batchlu.kernels._info import INFO_NONFINITE_INPUT, INFO_NONFINITE_RESULT, INFO_OK, INFO_REFINEMENT

__all__ = ["DTYPES", "Refining", "check_pivot_tol", "check_values", "pivot_codes", "retry_pivot_tol"]

DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def check_values(plan, values, xp=np):
    """``values`` as a (B, nnz) array of ``xp`` of a supported dtype; True when one matrix was given."""
    values = xp.asarray(values)
    if values.dtype not in DTYPES:
        raise InputTypeError(f"Expected values of dtype float32 or float64. "
                             f"Got {values.dtype} instead.")
    single = values.ndim == 1
    if single:
        values = values[None]
    if values.ndim != 2 or values.shape[1] != plan.nnz:
        raise InputError(f"Expected values of shape (B, nnz) = (B, {plan.nnz}), one row per matrix in "
                         f"the pattern's entry order. Got shape {values.shape if not single else values.shape[1:]} instead.")
    mirror = getattr(plan, "value_mirror", None)
    if mirror is not None and values.size:
        # pattern "full": both triangles given, and the lower one is what is factored, so they must
        # agree to within the factorization's own backward error, max(n, 64) eps max|a_ij| (an
        # assembled B^T D B differs from its transpose by rounding); NaN/Inf aside: info -1 there
        low, high = values[:, plan.value_src], values[:, mirror]
        eps = float(np.finfo(values.dtype).eps)
        finite = xp.isfinite(low) & xp.isfinite(high)
        scale = xp.where(finite, xp.abs(low), 0).max(axis=1, keepdims=True) if low.shape[1] else 0
        differ = finite & (xp.abs(low - high) > max(plan.n, 64) * eps * scale)
        if bool(differ.any()):
            m, e = (int(v) for v in np.unravel_index(int(xp.argmax(differ)), differ.shape))
            i, j = int(plan.a_row[e]), int(plan.a_col[e])
            raise InputError(f"Expected symmetric values for pattern 'full' (entry ({i}, {j}) equal to "
                             f"({j}, {i}) to within max(n, 64) eps max|a|). Got matrix {m} of the batch with {low[m, e].item()!r} at ({i}, {j}) and "
                             f"{high[m, e].item()!r} at ({j}, {i}) instead; pass only the lower triangle "
                             f"(pattern 'lower') to factor that one.")
    return values, single


def check_pivot_tol(pivot_tol, dtype) -> float:
    """The pivot threshold's factor: ``pivot_tol``, or ``sqrt(eps)`` of ``dtype`` when None."""
    if pivot_tol is None:
        return float(np.sqrt(np.finfo(dtype).eps))
    if not isinstance(pivot_tol, (int, float, np.floating)) or not pivot_tol >= 0:
        raise InputError(f"Expected pivot_tol to be a number >= 0 or None. Got {pivot_tol!r} instead.")
    return float(pivot_tol)


def retry_pivot_tol(pivot_tol, perturb: bool, dtype) -> float | None:
    """The threshold factor of :meth:`Refining.solve`'s second attempt: ``eps`` of ``dtype`` where the
    first used the default (``pivot_tol`` None, static pivoting on), else None (no second attempt:
    a threshold the caller chose is kept).

    The default ``sqrt(eps) ||A||_inf`` bounds the growth of L, which unregularized saddle points
    need (a zero pivot replaced by ``eps ||A||`` leaves ``O(1)`` cancellation in later pivots), but it
    replaces the legitimate pivots ``-delta`` of a regularized KKT matrix whose constraints are
    dependent, and refinement cannot undo a perturbation many times the pivot. ``eps ||A||_inf``
    replaces only pivots at rounding level. Neither threshold solves every kind (docs/design.md,
    sparse LDL^T, has the measurement); the first that does is kept.
    """
    if pivot_tol is not None or not perturb:
        return None
    return float(np.finfo(dtype).eps)


def pivot_codes(n: int, first_zero, negative, zero, nonfinite, finite, xp=np):
    """``(info, inertia)`` from the pivots' counts per matrix (both backends). An exactly zero pivot
    gives ``info`` k > 0 (static pivoting off, or on with a threshold of 0: ``||A|| = 0``); a NaN or
    infinite pivot of a finite matrix (after such a zero, or an overflow) makes the counts
    meaningless: inertia -1, and ``info`` -2 where no zero pivot explains it. -1 for a non-finite
    matrix."""
    info = xp.where(first_zero < n, first_zero + 1, INFO_OK).astype(np.int32)
    info = xp.where((info == INFO_OK) & (nonfinite > 0), INFO_NONFINITE_RESULT, info).astype(np.int32)
    info = xp.where(finite, info, INFO_NONFINITE_INPUT).astype(np.int32)
    inertia = xp.stack([n - negative - zero - nonfinite, negative, zero], axis=1).astype(np.int64)
    inertia = xp.where(((nonfinite > 0) | ~finite)[:, None], -1, inertia)
    return info, inertia


class Refining:
    """What :class:`Factor` (NumPy) and :class:`batchlu.kernels.sparse._gpu.GpuFactor` (CuPy, or
    NumPy in the host tests) share, written over the array module ``self.xp``: the right-hand
    sides' checks, the backward errors and :meth:`solve`'s iterative refinement. A subclass gives
    ``_first(b)`` (the solution of every matrix, (B, n, k)), ``_correction(r, rows)`` (the
    solutions of the matrices ``rows`` for their right-hand sides ``r[rows]``, (len(rows), n, k)),
    ``_residual(b, x, rows)`` (float64) and ``info``, ``anorm``, ``dtype``, ``batch``, ``single``;
    for the second attempt ``retry_tol`` (None: none), the per-matrix ``_perturbed``, ``_inertia``,
    ``_tried`` and ``_retried`` (bool), ``_refactor(rows, pivot_tol)`` (a factor of the same backend
    for the matrices ``rows`` alone, that threshold) and ``_adopt(rows, other, src)`` (take the
    factors of ``other``'s matrices ``src`` for the matrices ``rows``).
    """

    xp = np
    # refine every matrix of the batch in each step and choose the results per matrix (no gather of
    # the active ones, no synchronisation but one a step): the device's way; the host refines the
    # active matrices only
    whole_batch = False

    def _out(self, x):
        return x[0] if self.single else x

    def _check_rhs(self, b, what="b"):
        b = self.xp.asarray(b)
        if b.dtype.kind not in "fiu":
            raise InputTypeError(f"Expected a real {what}. Got dtype {b.dtype} instead.")
        n, count = self.plan.n, self.batch
        shape = b.shape
        if self.single:
            b = b[None]
        if b.shape == (count, n):
            return b[:, :, None], True
        if b.ndim == 3 and b.shape[:2] == (count, n):
            return b, False
        want = f"({n},) or ({n}, k)" if self.single else f"({count}, {n}) or ({count}, {n}, k)"
        raise InputError(f"Expected {what} of shape {want}. Got shape {shape} instead.")

    def _berr(self, r, x, b, rows):
        """Per matrix of ``rows``: the normwise backward error from its residual ``r``, solution
        ``x`` and right-hand side ``b`` (each (len(rows), n, k), in the order of ``rows``)."""
        xp = self.xp
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            rn = xp.abs(r).max(axis=1)                                # (m, k)
            xn = xp.abs(x.astype(np.float64)).max(axis=1)
            bn = xp.abs(b.astype(np.float64)).max(axis=1)
            den = self.anorm[rows][:, None] * xn + bn
            be = xp.where(den > 0, rn / xp.where(den > 0, den, 1), xp.where(rn > 0, np.inf, 0.0))
            be = xp.where(xp.isfinite(rn) & xp.isfinite(den), be, np.nan)
        return be.max(axis=1) if be.shape[1] else xp.zeros(len(rows))

    def _refine_whole_batch(self, b3, info, steps, refine, eps):
        """:meth:`solve`'s first solution and refinement steps with every matrix computed in each
        step (``steps`` counted in place): the rules and bits of the active-matrices form, as each
        matrix's solve, residual and backward error do not depend on the others."""
        xp = self.xp
        rows = xp.arange(self.batch, dtype=np.int64)
        b64 = b3.astype(np.float64)
        x = self._first(b3)
        live = info == INFO_OK
        r = self._residual(b64, x, rows)
        berr = xp.where(live, self._berr(r, x, b64, rows), np.nan)
        for _ in range(refine):
            active = live & ~(berr <= eps)
            if not bool(active.any()):
                break
            x_try = x + self._correction(r, rows)
            r_try = self._residual(b64, x_try, rows)
            new = self._berr(r_try, x_try, b64, rows)
            live = active & ~(new >= berr)      # NaN before, or lower now
            x = xp.where(live[:, None, None], x_try, x)
            r = xp.where(live[:, None, None], r_try, r)
            berr = xp.where(live, new, berr)
            steps += active
        return x, berr

    def retried(self):
        """(B,) bool: the matrices that :meth:`solve` factored again with the second attempt's
        threshold (see :func:`retry_pivot_tol`) and whose new factors this factor now holds."""
        return self._out(self._retried.copy())

    def solve(self, b, refine: int = 2, tol: float | None = None):
        """Solve ``A x = b`` per matrix, then up to ``refine`` steps of iterative refinement.

        ``b`` is (B, n) or (B, n, k). Each step computes the residual ``b - A x`` in float64 against
        the original A, solves for the correction with the factors and keeps it if it lowers the
        backward error; a matrix stops once its backward error is at most its dtype's epsilon or a
        step did not lower it (slow progress goes on: the KKT kinds in float32 gain a factor 2-4 a
        step after heavy static pivoting).

        With the default pivot threshold, a matrix that ends above ``tol`` after perturbed pivots
        gets a second attempt: it is factored again with the threshold ``eps ||A||_inf``
        (:func:`retry_pivot_tol`), solved and refined the same way. The second attempt is taken
        where it perturbed no pivot (it factored A itself, no nearby matrix) and ends at ``tol`` or
        below, or above it but lower than the first; this factor then takes its factors (so
        :meth:`pivots`, :meth:`perturbed_pivots`, :meth:`inertia` and later solves are theirs;
        :meth:`retried` says which). A pivot below ``eps ||A||_inf`` is rounding: such a matrix is
        singular to working precision and keeps the first attempt's result, -4 included. A matrix
        gets one second attempt per factor.

        Returns ``(x, info)``: ``x`` in the factor's dtype, shaped as ``b``; ``info`` (B,) int32 as
        in the module docstring, -4 where the backward error is still above ``tol`` (default
        ``n * eps``). The last backward errors and step counts (of the attempt kept) stay in
        ``last_backward_error`` and ``refine_steps``.
        """
        if isinstance(refine, bool) or not isinstance(refine, (int, np.integer)) or refine < 0:
            raise InputError(f"Expected refine to be an integer >= 0. Got {refine!r} instead.")
        b3, vector = self._check_rhs(b)
        eps = float(np.finfo(self.dtype).eps)
        tol = max(self.plan.n, 1) * eps if tol is None else float(tol)
        x, info, berr, steps = self._attempt(b3, refine, tol)
        if self.retry_tol is not None:
            self._second_attempt(b3, refine, tol, x, info, berr, steps)
        self.refine_steps = self._out(steps)
        self.last_backward_error = self._out(berr)
        x = x[:, :, 0] if vector else x
        return self._out(x), self._out(info)

    def _second_attempt(self, b3, refine, tol, x, info, berr, steps) -> None:
        """:meth:`solve`'s retry, in place on its results: the matrices refinement left above ``tol``
        after perturbed pivots, not tried before, factored again with :attr:`retry_tol`
        (``_refactor``), solved the same way, and taken where no pivot was perturbed and they end at
        ``info`` 0 or with a lower backward error (their factors then adopted: ``_adopt``)."""
        xp = self.xp
        want = (info == INFO_REFINEMENT) & (self._perturbed > 0) & ~self._tried
        if not bool(want.any()):
            return
        rows = xp.flatnonzero(want).astype(np.int64)
        self._tried[rows] = True
        second = self._refactor(rows, self.retry_tol)
        x2, info2, berr2, steps2 = second._attempt(b3[rows], refine, tol)
        better = (second._perturbed == 0) & ((info2 == INFO_OK) | (berr2 < berr[rows]))
        if not bool(better.any()):
            return
        src = xp.flatnonzero(better).astype(np.int64)
        keep = rows[src]
        x[keep], info[keep], berr[keep], steps[keep] = x2[src], info2[src], berr2[src], steps2[src]
        self._adopt(keep, second, src)
        self.info[keep] = second.info[src]
        self._perturbed[keep] = second._perturbed[src]
        self._inertia[keep] = second._inertia[src]
        self._retried[keep] = True

    def _attempt(self, b3, refine, tol):
        """One attempt of :meth:`solve` with this factor's factors: ``(x, info, berr, steps)`` for
        the right-hand sides ``b3`` (B, n, k), x NaN where info says so."""
        xp = self.xp
        count, n = self.batch, self.plan.n
        eps = float(np.finfo(self.dtype).eps)
        info = xp.where((self.info == INFO_OK) & ~xp.isfinite(b3).all(axis=(1, 2)), INFO_NONFINITE_INPUT,
                        self.info).astype(np.int32)
        steps = xp.zeros(count, np.int32)
        if n == 0 or b3.shape[2] == 0 or count == 0:
            x = xp.zeros(b3.shape, self.dtype)
            berr = xp.zeros(count)
        elif self.whole_batch:
            x, berr = self._refine_whole_batch(b3, info, steps, refine, eps)
        else:
            b64 = b3.astype(np.float64)
            x = self._first(b3)
            rows = xp.flatnonzero(info == INFO_OK).astype(np.int64)
            berr = xp.full(count, np.nan)
            r = xp.zeros(b3.shape, np.float64)          # the residuals of the matrices in rows
            if rows.size:
                r[rows] = self._residual(b64[rows], x[rows], rows)
                berr[rows] = self._berr(r[rows], x[rows], b64[rows], rows)
            for _ in range(refine):
                active = rows[~(berr[rows] <= eps)]
                if active.size == 0:
                    break
                x_try = x[active] + self._correction(r, active)
                r_try = self._residual(b64[active], x_try, active)
                new = self._berr(r_try, x_try, b64[active], active)
                better = ~(new >= berr[active])   # NaN before, or lower now
                keep = active[better]
                x[keep] = x_try[better]
                r[keep] = r_try[better]
                berr[keep] = new[better]
                steps[active] += 1
                rows = keep
        if n and b3.shape[2] and count:
            finite_x = xp.isfinite(x).all(axis=(1, 2))
            info = xp.where((info == INFO_OK) & ~finite_x, INFO_NONFINITE_RESULT, info).astype(np.int32)
            info = xp.where((info == INFO_OK) & ~(berr <= tol), INFO_REFINEMENT, info).astype(np.int32)
            # a non-finite pivot (the factorization's -2) leaves no x worth keeping, finite or not
            bad = (info == INFO_NONFINITE_INPUT) | (info > 0) | (self.info == INFO_NONFINITE_RESULT)
            x = xp.where(bad[:, None, None], np.nan, x).astype(x.dtype, copy=False)
            berr = xp.where(bad, np.nan, berr)
        return x, info, berr, steps
