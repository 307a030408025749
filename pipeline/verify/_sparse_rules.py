"""The rules ``batchlu verify`` checks on the sparse ops' outputs (``ldlt-solve``, ``ldlt-inertia``), in
the same :class:`batchlu.pipeline.verify._rules.Rule` form as the dense ops' and applied by the same
loop (:func:`batchlu.pipeline.verify.verify`).

* ``ldlt-solve``: the normwise backward error ``||b - A x||_inf / (||A||_inf ||x||_inf + ||b||_inf)``
  recomputed in float64 from the stored values, right-hand sides and ``x``, in units of ``n eps``
  (eps of the values' dtype): a matrix with ``info`` 0 fails above the threshold (30, i.e.
  ``30 n eps``). ``info`` -4 (refinement short of its tolerance) is counted, not failed.
* ``ldlt-inertia``: the counts are non-negative and add up to n; they are compared with the signs of
  the eigenvalues of the dense float64 matrix (``numpy.linalg.eigvalsh``) for the first
  :data:`REFERENCE_MATRICES` matrices with ``info`` 0 of each block (n <= :data:`REFERENCE_MAX_N`)
  whose eigenvalues all lie clear of zero (``|lambda| > n eps ||A||_2``). A difference fails a
  matrix with no perturbed pivot; where pivots were perturbed, the factored matrix is not A
  (static pivoting), so a difference is reported, not failed.
* both: ``info`` is a code the op writes; -1 exactly where the values (or right-hand side) hold NaN
  or Inf, -3 exactly where the input chunk is missing, and those come with NaN ``x`` and ``berr`` /
  -1 counts.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from batchlu.kernels._info import INFO_REFINEMENT
from batchlu.testing.ratios import unit_scale

from .._ops import INFO_MISSING_INPUT, INFO_NONFINITE_INPUT, INFO_NONFINITE_RESULT, INFO_NOT_COMPUTED, SPARSE_OPS
from ._rules import Rule

__all__ = ["REFERENCE_MATRICES", "REFERENCE_MAX_N", "RULES", "SparseBlock"]

REFERENCE_MATRICES = 8   # per block: matrices compared with the eigvalsh inertia
REFERENCE_MAX_N = 4000   # larger matrices are not compared (O(n^3) each)

NEGATIVE = {INFO_NONFINITE_INPUT: "non-finite input", INFO_NONFINITE_RESULT: "non-finite result",
            INFO_MISSING_INPUT: "missing input", INFO_REFINEMENT: "refinement short"}
NAN_CODES = (INFO_NONFINITE_INPUT, INFO_MISSING_INPUT)


@dataclasses.dataclass
class SparseBlock:
    """A block of a sparse batch under check: ``a`` the values (B, nnz), the outputs, ``b`` the
    right-hand sides; ``rows``/``cols`` the pattern's entries (``rows >= cols`` are A's)."""

    op: str
    a: np.ndarray
    out: dict
    b: np.ndarray | None
    n: int
    rows: np.ndarray
    cols: np.ndarray
    missing_input: np.ndarray | None = None

    @property
    def info(self) -> np.ndarray:
        return self.out["info"]

    @functools.cached_property
    def eps(self) -> float:
        return float(np.finfo(self.a.dtype).eps)

    @functools.cached_property
    def missing(self) -> np.ndarray:
        return (np.zeros(len(self.info), bool) if self.missing_input is None
                else np.asarray(self.missing_input, bool))

    @functools.cached_property
    def finite_input(self) -> np.ndarray:
        finite = np.isfinite(self.a).all(axis=1)
        if self.b is not None:
            finite &= np.isfinite(self.b).reshape(len(self.b), -1).all(-1)
        return finite

    @functools.cached_property
    def all_nan(self) -> np.ndarray:
        """-1 / -3 outputs: floating outputs NaN, integer ones -1."""
        parts = []
        for name, x in self.out.items():
            if name == "info":
                continue
            flat = x.reshape(len(x), -1)
            parts.append(np.isnan(flat).all(-1) if x.dtype.kind == "f" else (flat == -1).all(-1))
        return np.logical_and.reduce(parts)

    def matrix(self, i: int):
        """Matrix ``i`` as a SciPy CSR array in float64 (both triangles)."""
        import scipy.sparse as sp

        low = self.rows >= self.cols
        r, c, v = self.rows[low], self.cols[low], self.a[i][low].astype(np.float64)
        off = r != c
        return sp.csr_array((np.concatenate([v, v[off]]), (np.concatenate([r, c[off]]), np.concatenate([c, r[off]]))),
                            shape=(self.n, self.n))

    def scaled(self, i: int):
        """``(A * 2^-E, E)``: matrix ``i`` brought to a largest entry in [0.5, 1) (exact): the backward
        error and the signs of the eigenvalues are scale-free, but near 1e308 ``||A||`` would be
        infinite (a backward error of 0) and near 1e-308 the entries subnormal."""
        e = int(unit_scale(self.a[i].astype(np.float64), (0,))[1])
        a = self.matrix(i)
        a.data = np.ldexp(a.data, -e)
        return a, e

    @functools.cached_property
    def rated(self) -> np.ndarray:
        return self.info == 0

    @functools.cached_property
    def ratios(self) -> dict:
        """``ldlt-solve``: the recomputed backward error over ``n eps`` (0 where not rated, NaN made Inf)."""
        ratio = np.zeros(len(self.info))
        for i in np.flatnonzero(self.rated):
            a, ea = self.scaled(i)
            x, ex = unit_scale(self.out["x"][i].astype(np.float64).reshape(self.n, -1), (0,))
            with np.errstate(all="ignore"):
                b = np.ldexp(self.b[i].astype(np.float64).reshape(self.n, -1), -(ea + ex))
                r = np.abs(b - a @ x).max(axis=0)
                anorm = np.abs(a).sum(axis=1).max() if a.nnz else 0.0
                den = anorm * np.abs(x).max(axis=0) + np.abs(b).max(axis=0)
                berr = np.where(den > 0, r / np.where(den > 0, den, 1), np.where(r > 0, np.inf, 0.0))
                value = float(berr.max()) / (max(self.n, 1) * self.eps) if berr.size else 0.0
            ratio[i] = value if np.isfinite(value) else np.inf
        return {"berr": ratio}

    @functools.cached_property
    def inertia_reference(self) -> np.ndarray:
        """Per matrix: -1 where not compared, else the eigvalsh counts (positive, negative, zero)."""
        ref = np.full((len(self.info), 3), -1, np.int64)
        if self.n > REFERENCE_MAX_N:
            return ref
        pick = np.flatnonzero(self.info == 0)[:REFERENCE_MATRICES]
        for i in pick:
            w = np.linalg.eigvalsh(self.scaled(i)[0].toarray())
            scale = np.abs(w).max() if w.size else 0.0
            if w.size and np.abs(w).min() <= self.n * np.finfo(np.float64).eps * scale:
                continue   # an eigenvalue too close to zero for its sign to be told
            ref[i] = [(w > 0).sum(), (w < 0).sum(), 0]
        return ref


def _never_written(blk):
    return blk.info == INFO_NOT_COMPUTED


def _unknown_code(blk):
    info = blk.info
    known = ((info >= 0) & (info <= blk.n)) | np.isin(info, list(NEGATIVE))
    if blk.op == "ldlt-inertia":
        known &= info != INFO_REFINEMENT
    return ~known & (info != INFO_NOT_COMPUTED)


def _nonfinite_not_flagged(blk):
    return ~blk.finite_input & ~blk.missing & (blk.info != INFO_NONFINITE_INPUT)


def _minus_one_for_finite(blk):
    return blk.finite_input & (blk.info == INFO_NONFINITE_INPUT)


def _missing_not_flagged(blk):
    return blk.missing & (blk.info != INFO_MISSING_INPUT)


def _minus_three_for_stored(blk):
    return ~blk.missing & (blk.info == INFO_MISSING_INPUT)


def _nan_code_outputs(blk):
    return np.isin(blk.info, NAN_CODES) & ~blk.all_nan


def _ok_not_finite(blk):
    return (blk.info == 0) & ~np.isfinite(blk.out["x"]).reshape(len(blk.info), -1).all(-1)


def _nonfinite_result_elsewhere(blk):
    finite_x = np.isfinite(blk.out["x"]).reshape(len(blk.info), -1).all(-1)
    return (blk.info == INFO_NONFINITE_RESULT) & (finite_x | ~blk.finite_input)


def _berr(blk):
    return blk.ratios["berr"]


def _inertia_not_counts(blk):
    """Counts adding up to n where info is 0; counts or all -1 after a zero pivot (info k > 0: -1
    where a non-finite pivot followed it); all -1 for a non-finite pivot (info -2)."""
    inertia, info = blk.out["inertia"], blk.info
    counts = (inertia >= 0).all(-1) & (inertia.sum(-1) == blk.n)
    none = (inertia == -1).all(-1)
    return (((info == 0) & ~counts) | ((info > 0) & ~(counts | none))
            | ((info == INFO_NONFINITE_RESULT) & ~none))


def inertia_mismatch(blk) -> np.ndarray:
    """Compared with eigvalsh and different (perturbed pivots or not)."""
    ref = blk.inertia_reference
    return (ref[:, 0] >= 0) & (blk.out["inertia"] != ref).any(-1)


def _inertia_differs(blk):
    return inertia_mismatch(blk) & (blk.out["perturbed"] == 0)


_BOTH = SPARSE_OPS
RULES: tuple[Rule, ...] = (
    Rule("info-written", _BOTH, _never_written,
         "info was never written (it holds the fill value), yet its chunk is recorded complete"),
    Rule("info-code", _BOTH, _unknown_code, "info {info} is not a code this op writes"),
    Rule("nonfinite-flagged", _BOTH, _nonfinite_not_flagged,
         "the values or right-hand side hold NaN or Inf, but info is {info}, not -1"),
    Rule("nonfinite-only", _BOTH, _minus_one_for_finite, "info -1 (non-finite input), but the input is finite"),
    Rule("missing-flagged", _BOTH, _missing_not_flagged,
         "the input chunk is missing from its store, but info is {info}, not -3"),
    Rule("missing-only", _BOTH, _minus_three_for_stored, "info -3 (missing input), but the input chunk is stored"),
    Rule("nan-outputs", _BOTH, _nan_code_outputs, "info {info}: x and berr must be NaN, counts -1"),
    Rule("finite-result", ("ldlt-solve",), _ok_not_finite, "info 0, but x holds NaN or Inf"),
    Rule("nonfinite-result-only", ("ldlt-solve",), _nonfinite_result_elsewhere,
         "info -2 (non-finite result), but x is finite or the input is not"),
    Rule("berr", ("ldlt-solve",), _berr,
         "backward error ||b - A x|| / (||A|| ||x|| + ||b||) is {value:.3g} n eps (over {threshold:g})",
         ratio=True),
    Rule("inertia-counts", ("ldlt-inertia",), _inertia_not_counts,
         "the inertia is neither counts adding up to n nor (after a zero or non-finite pivot) all -1"),
    Rule("inertia-reference", ("ldlt-inertia",), _inertia_differs,
         "the inertia differs from the signs of the float64 eigenvalues (eigvalsh)"),
)


def rules_for(op: str) -> list[Rule]:
    return [rule for rule in RULES if op in rule.ops]
