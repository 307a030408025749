"""The rules ``batchlu verify`` checks, one small function each, in one table (:data:`RULES`).

A rule looks at a :class:`Block` of matrices (input, outputs, ``info``) and returns, per matrix, either
a bool (True where the rule is broken) or a test ratio (broken where it exceeds the threshold, 30, or
is NaN). Each rule names the ops it applies to and says, in one line, what is wrong.

The ``info`` codes: 0 ok; ``1..n`` exactly singular (LAPACK's first zero pivot of U); the negative
codes in :data:`NEGATIVE_CODES`. To add a negative code: add it to :data:`NEGATIVE_CODES`, to
:data:`NAN_OUTPUT_CODES` if its outputs are all NaN as for -1, and its own rules in the table next to
-1's (marked below).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import numpy as np

from .._ops import (DENSE_OPS, INFO_MISSING_INPUT, INFO_NONFINITE_INPUT, INFO_NONFINITE_RESULT, INFO_NOT_COMPUTED,
                    OP_TABLE)

__all__ = ["NAN_OUTPUT_CODES", "NEGATIVE_CODES", "RULES", "Block", "Rule", "rules_for"]

# Negative info codes and what each means.
NEGATIVE_CODES = {INFO_NONFINITE_INPUT: "non-finite input", INFO_NONFINITE_RESULT: "non-finite result",
                  INFO_MISSING_INPUT: "missing input"}
# Codes whose outputs are all NaN (lu: NaN factors and identity pivots), as for a non-finite input.
NAN_OUTPUT_CODES = (INFO_NONFINITE_INPUT, INFO_MISSING_INPUT)


@dataclasses.dataclass
class Block:
    """A block of matrices under check: the input ``a`` (B, n, n), the outputs read back (``info``
    included) and, for ``solve``, the right-hand sides ``b``. What several rules need is computed once."""

    op: str
    a: np.ndarray
    out: dict
    b: np.ndarray | None = None
    # per matrix: its input (or right-hand side) chunk is missing from the store; set by verify where
    # the block holds info -3, else none is
    missing_input: np.ndarray | None = None

    @property
    def info(self) -> np.ndarray:
        return self.out["info"]

    @property
    def n(self) -> int:
        return self.a.shape[-1]

    @functools.cached_property
    def result(self) -> np.ndarray:
        """The op's main floating output: lu, inv, x or sign."""
        return self.out[OP_TABLE[self.op].results[0]]

    @functools.cached_property
    def eps(self) -> float:
        """Machine epsilon of the precision the op computed in (that of its result)."""
        return float(np.finfo(self.result.dtype).eps)

    @functools.cached_property
    def finite_input(self) -> np.ndarray:
        """The matrix, and for solve its right-hand side, hold no NaN or Inf."""
        finite = np.isfinite(self.a).all(axis=(1, 2))
        if self.b is not None:
            finite &= np.isfinite(self.b).reshape(len(self.b), -1).all(-1)
        return finite

    @functools.cached_property
    def missing(self) -> np.ndarray:
        return (np.zeros(len(self.info), bool) if self.missing_input is None
                else np.asarray(self.missing_input, bool))

    @functools.cached_property
    def finite_result(self) -> np.ndarray:
        """Every floating output (lu, inv, x; sign and logabsdet) holds no NaN or Inf."""
        finite = [np.isfinite(x).reshape(len(x), -1).all(-1) for x in self.out.values() if x.dtype.kind in "fc"]
        return np.logical_and.reduce(finite)

    @functools.cached_property
    def piv_in_range(self) -> np.ndarray:
        """lu: LAPACK's pivots, row i swapped with a row in [i, n)."""
        piv = self.out["piv"]
        return ((piv >= np.arange(self.n)) & (piv < self.n)).all(axis=-1)

    @functools.cached_property
    def all_nan(self) -> np.ndarray:
        """Per matrix: every output is NaN (lu: NaN factors and identity pivots)."""
        nan = [np.isnan(x).reshape(len(x), -1).all(-1) for name, x in self.out.items()
               if x.dtype.kind in "fc"]
        if self.op == "lu":
            nan.append((self.out["piv"] == np.arange(self.n)).all(-1))
        return np.logical_and.reduce(nan)

    @functools.cached_property
    def rated(self) -> np.ndarray:
        """The matrices that get a test ratio: info 0, and for lu the singular ones too."""
        if self.op == "lu":
            return (self.info >= 0) & self.piv_in_range
        return self.info == 0

    @functools.cached_property
    def ratios(self) -> dict:
        """The op's test ratios (name -> float64 per matrix, 0 where not rated, NaN made Inf)."""
        pick = self.rated
        a, out = self.a[pick], {k: v[pick] for k, v in self.out.items()}
        with np.errstate(all="ignore"):  # NaN / Inf in a result give a NaN / Inf ratio: broken
            got = OP_TABLE[self.op].ratios(a, out, None if self.b is None else self.b[pick])
        full = {}
        for name, value in got.items():
            full[name] = np.zeros(len(self.info))
            full[name][pick] = np.where(np.isnan(value), np.inf, value)
        return full


@dataclasses.dataclass(frozen=True)
class Rule:
    name: str
    ops: tuple[str, ...]
    check: Callable[[Block], np.ndarray]  # bool (True: broken) or a ratio (broken above the threshold)
    says: str  # what is wrong, formatted with the matrix's {info}, {value} and the {threshold}
    ratio: bool = False  # one of the op's test ratios (reported as max / median / over threshold)


def rules_for(op: str) -> list[Rule]:
    """The dense op ``op``'s rules (the sparse ops': :mod:`batchlu.pipeline.verify._sparse_rules`)."""
    return [rule for rule in RULES if op in rule.ops]


# ---- info itself --------------------------------------------------------------------------------

def _info_never_written(blk: Block) -> np.ndarray:
    return blk.info == INFO_NOT_COMPUTED


def _info_unknown_code(blk: Block) -> np.ndarray:
    info = blk.info
    known = ((info >= 0) & (info <= blk.n)) | np.isin(info, list(NEGATIVE_CODES))
    return ~known & (info != INFO_NOT_COMPUTED)


# ---- info -1: a non-finite input ------------------------------------------------------------------

def _nonfinite_input_not_flagged(blk: Block) -> np.ndarray:
    return ~blk.finite_input & ~blk.missing & (blk.info != INFO_NONFINITE_INPUT)


def _minus_one_for_a_finite_input(blk: Block) -> np.ndarray:
    return blk.finite_input & (blk.info == -1)


# ---- info -2: a finite input whose result is not finite (kept as computed) -------------------------

def _nonfinite_result_elsewhere(blk: Block) -> np.ndarray:
    return (blk.info == INFO_NONFINITE_RESULT) & (blk.finite_result | ~blk.finite_input | blk.missing)


# ---- info -3: the input chunk is missing (--missing-chunks fill) -----------------------------------

def _missing_input_not_flagged(blk: Block) -> np.ndarray:
    return blk.missing & (blk.info != INFO_MISSING_INPUT)


def _minus_three_for_a_stored_chunk(blk: Block) -> np.ndarray:
    return ~blk.missing & (blk.info == INFO_MISSING_INPUT)


def _nan_code_outputs_not_nan(blk: Block) -> np.ndarray:
    return np.isin(blk.info, NAN_OUTPUT_CODES) & ~blk.all_nan


# ---- info > 0: exactly singular -----------------------------------------------------------------

def _singular_claim_ratio(blk: Block) -> np.ndarray:
    """For info > 0: sigma_min / sigma_max of A (float64 SVD) over ``n eps``. An LU with an exactly
    zero pivot is the exact LU of ``A + dA``, ``||dA|| ~ n eps ||A||``, so that ratio stays small.
    A is scaled by a power of two first (the ratio is scale-free): near 1e308 sigma_max would be
    infinite, and the ratio of a regular matrix 0."""
    from batchlu.testing.ratios import unit_scale

    ratio = np.zeros(len(blk.info))
    claim = (blk.info > 0) & blk.finite_input
    if claim.any():
        a = blk.a[claim]
        s = np.linalg.svd(unit_scale(a.astype(np.complex128 if a.dtype.kind == "c" else np.float64))[0],
                          compute_uv=False)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio[claim] = np.where(s[:, 0] == 0, 0.0, s[:, -1] / s[:, 0]) / (blk.n * blk.eps)
    return ratio


def _singular_outputs_wrong(blk: Block) -> np.ndarray:
    singular = blk.info > 0
    if blk.op == "slogdet":
        return singular & ~((blk.out["sign"] == 0) & (blk.out["logabsdet"] == -np.inf))
    return singular & ~blk.all_nan


def _info_not_first_zero_pivot(blk: Block) -> np.ndarray:
    zero = np.diagonal(blk.out["lu"], axis1=-2, axis2=-1) == 0
    first = np.where(zero.any(-1), zero.argmax(-1) + 1, 0) if blk.n else np.zeros(len(blk.info), int)
    return (blk.info >= 0) & blk.finite_input & (first != blk.info)


def _piv_out_of_range(blk: Block) -> np.ndarray:
    return ~blk.piv_in_range


# ---- info 0: a result ---------------------------------------------------------------------------

def _ok_result_not_finite(blk: Block) -> np.ndarray:
    return (blk.info == 0) & ~blk.finite_result


def _ratio(name: str) -> Callable[[Block], np.ndarray]:
    def check(blk: Block) -> np.ndarray:
        return blk.ratios[name]
    check.__name__ = f"_ratio_{name}"
    return check


_ALL = DENSE_OPS
_NAN_OUTPUTS = {"lu": "lu must be all NaN and piv the identity", "inv": "inv must be all NaN",
                "solve": "x must be all NaN", "slogdet": "sign and logabsdet must be NaN"}

RULES: tuple[Rule, ...] = (
    Rule("info-written", _ALL, _info_never_written,
         "info was never written (it holds the fill value), yet its chunk is recorded complete"),
    Rule("info-code", _ALL, _info_unknown_code,
         "info {info} is not a code batchlu writes (0, 1..n, " + ", ".join(map(str, NEGATIVE_CODES)) + ")"),
    # info -1 (non-finite input)
    Rule("nonfinite-flagged", _ALL, _nonfinite_input_not_flagged,
         "the input holds NaN or Inf, but info is {info}, not -1"),
    Rule("nonfinite-only", _ALL, _minus_one_for_a_finite_input,
         "info -1 (non-finite input), but the input is finite"),
    *(Rule("nan-outputs", (op,), _nan_code_outputs_not_nan, "info {info}: " + says)
      for op, says in _NAN_OUTPUTS.items()),
    # info -2 (a finite input, a result that is not finite); its other half is finite-result below
    Rule("nonfinite-result-only", _ALL, _nonfinite_result_elsewhere,
         "info -2 (non-finite result), but the result is finite or the input is not"),
    # info -3 (the input chunk is missing from its store, --missing-chunks fill)
    Rule("missing-flagged", _ALL, _missing_input_not_flagged,
         "the input chunk is missing from its store, but info is {info}, not -3"),
    Rule("missing-only", _ALL, _minus_three_for_a_stored_chunk,
         "info -3 (missing input), but the input chunk is stored"),
    # info > 0 (exactly singular)
    Rule("singular-claim", _ALL, _singular_claim_ratio,
         "info {info} says singular, but the matrix is not: sigma_min/sigma_max = {value:.3g} n eps "
         "(over {threshold:g})"),
    Rule("singular-outputs", ("inv", "solve"), _singular_outputs_wrong,
         "info {info} (singular): the result must be all NaN"),
    Rule("singular-outputs", ("slogdet",), _singular_outputs_wrong,
         "info {info} (singular): sign must be 0 and logabsdet -inf"),
    Rule("zero-pivot", ("lu",), _info_not_first_zero_pivot,
         "info {info} does not name U's first exactly-zero pivot (info 0: none may be zero)"),
    Rule("piv-range", ("lu",), _piv_out_of_range, "piv out of range: piv[i] must lie in [i, n)"),
    # info 0 (a result)
    Rule("finite-result", _ALL, _ok_result_not_finite,
         "info 0, but the result holds NaN or Inf (a finite input's non-finite result is info -2)"),
    Rule("dget01", ("lu",), _ratio("dget01"),
         "dget01 ratio ||LU - PA|| / (n ||A|| eps) is {value:.3g} (over {threshold:g})", ratio=True),
    Rule("dget03", ("inv",), _ratio("dget03"),
         "dget03 ratio ||I - A inv(A)|| / (n ||A|| ||inv(A)|| eps) is {value:.3g} (over {threshold:g})",
         ratio=True),
    Rule("dget02", ("solve",), _ratio("dget02"),
         "dget02 ratio ||b - A x|| / (||A|| ||x|| eps) is {value:.3g} (over {threshold:g})", ratio=True),
    Rule("logabsdet", ("slogdet",), _ratio("logabsdet"),
         "logabsdet differs from the float64 reference: ratio {value:.3g} (over {threshold:g})", ratio=True),
    Rule("sign", ("slogdet",), _ratio("sign"),
         "sign differs from the float64 reference: ratio {value:.3g} (over {threshold:g})", ratio=True),
    Rule("sign-modulus", ("slogdet",), _ratio("sign-modulus"),
         "|sign| is not 1: a real sign must be exactly +-1, a complex one within n eps "
         "(ratio {value:.3g}, over {threshold:g})"),
)
