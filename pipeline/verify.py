"""``batchlu.pipeline.verify``: recompute LAPACK's test ratios of a run's output against its input.

dget01 for ``lu``, dget03 for ``inv``, dget02 for ``solve`` (via :mod:`batchlu.testing.ratios`), and for
``slogdet`` a ratio of the same kind: the difference to a float64/complex128 recomputation divided
by ``n * eps * cond1(A)``, the first-order bound of a backward-stable determinant. Singular and
non-finite matrices are counted, not failed, but their outputs must follow the agreed semantics
(NaN inverse/solution, sign 0 and -inf, NaN lu and identity piv, ...), and ``info == -1`` must match
the matrices that hold NaN or Inf (for ``solve``, in the matrix or its right-hand side). ``info == -2``
must match the finite inputs whose outputs (computed as for ``info == 0``) are not finite; ``info ==
-3`` the matrices whose input chunk is missing from the store, with the outputs of -1. Only chunks
recorded complete are checked; an incomplete output is reported as such and is never ``ok``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import zarr

from . import _ledger, _missing
from ._config import options as make_options
from ._ops import INFO_MISSING_INPUT, INFO_NONFINITE_RESULT, info_counts
from ._output import read_provenance
from ._store import ArrayRef, open_array_info, parse_ref
from .errors import InputError

__all__ = ["VerifyReport", "verify"]


@dataclasses.dataclass
class VerifyReport:
    output: str
    op: str
    total: int                    # N
    checked: int = 0              # matrices looked at
    sampled: bool = False
    ratios: int = 0               # matrices with a test ratio (the others are singular / non-finite)
    max_ratio: float = 0.0
    median_ratio: float = 0.0
    over_threshold: int = 0
    singular: int = 0
    nonfinite: int = 0
    nonfinite_result: int = 0     # info -2
    missing: int = 0              # info -3
    semantic_errors: int = 0      # bad matrices whose outputs break the agreed semantics
    first_failures: list = dataclasses.field(default_factory=list)  # (index, why), a few
    complete_chunks: int = 0
    total_chunks: int = 0
    status: str = "complete"
    threshold: float = 30.0

    @property
    def complete(self) -> bool:
        return self.status == "complete" and self.complete_chunks == self.total_chunks

    @property
    def ok(self) -> bool:
        return self.complete and self.over_threshold == 0 and self.semantic_errors == 0

    def summary(self) -> str:
        what = {"lu": "dget01", "inv": "dget03", "solve": "dget02",
                "slogdet": "|d slogdet|/(n eps cond1)"}[self.op]
        scope = f"a random sample of {self.checked:,}" if self.sampled else f"all {self.checked:,}"
        lines = [f"verify {self.op}: {'OK' if self.ok else 'FAILED'} - {scope} of {self.total:,} "
                 f"matrices in {self.output}",
                 f"  {what} ratio: max {self.max_ratio:.3g}, median {self.median_ratio:.3g}, "
                 f"{self.over_threshold:,} over {self.threshold:g} (of {self.ratios:,} ratios)",
                 f"  singular {self.singular:,}   non-finite input {self.nonfinite:,}   "
                 f"non-finite result {self.nonfinite_result:,}   missing input {self.missing:,}   "
                 f"semantic errors {self.semantic_errors:,}"]
        if not self.complete:
            lines.append(f"  INCOMPLETE output: status {self.status!r}, {self.complete_chunks:,} of "
                         f"{self.total_chunks:,} chunks complete (only those were checked); "
                         f"finish it with resume (--resume)")
        for index, why in self.first_failures:
            lines.append(f"  matrix {index}: {why}")
        return "\n".join(lines)

    __repr__ = summary


def _eps(dtype) -> float:
    return float(np.finfo(np.dtype(dtype)).eps)


def _wide(x: np.ndarray) -> np.ndarray:
    return x.astype(np.complex128 if np.iscomplexobj(x) else np.float64)


def _slogdet_ratio(a, sign, logabsdet) -> np.ndarray:
    n = a.shape[-1]
    wide = _wide(a)
    ref_sign, ref_log = np.linalg.slogdet(wide)
    with np.errstate(all="ignore"):
        try:
            inv = np.linalg.inv(wide)
            cond = np.abs(wide).sum(-2).max(-1) * np.abs(inv).sum(-2).max(-1)
        except np.linalg.LinAlgError:
            cond = np.full(a.shape[0], np.inf)
        err = np.maximum(np.abs(logabsdet.astype(np.float64) - ref_log),
                         np.abs(_wide(sign) - ref_sign))
        err = np.where(np.isnan(err), np.inf, err)
        err = np.where(logabsdet == ref_log, 0.0, err)  # equal infinities
        return err / (n * _eps(a.dtype) * np.maximum(cond, 1.0))


def _block_ratios(op, a, out, b) -> np.ndarray:
    from batchlu.testing import ratios

    if op == "lu":
        return ratios.get01(a, out["lu"], out["piv"])
    if op == "inv":
        return ratios.get03(a, out["inv"])
    if op == "solve":
        return ratios.get02(a, out["x"], b)
    return _slogdet_ratio(a, out["sign"], out["logabsdet"])


def _semantics(op, info, out, nonfinite_in, missing_in) -> np.ndarray:
    """Per matrix: True where the outputs of a singular / non-finite matrix break the agreement."""
    bad = (info == INFO_MISSING_INPUT) != missing_in
    bad |= ~missing_in & ((info == -1) != nonfinite_in)
    nf, sg = (info == -1) | (info == INFO_MISSING_INPUT), info > 0
    axes = lambda x: tuple(range(1, x.ndim))  # noqa: E731
    allnan = lambda x: np.isnan(x).all(axis=axes(x)) if x.ndim > 1 else np.isnan(x)  # noqa: E731
    allfinite = lambda x: np.isfinite(x).all(axis=axes(x)) if x.ndim > 1 else np.isfinite(x)  # noqa: E731
    # -2 exactly where a finite input would have info 0 but its outputs are not all finite
    finite_out = np.logical_and.reduce([allfinite(x) for name, x in out.items() if name not in ("info", "piv")])
    rule = ~missing_in & ~nonfinite_in & ((info == 0) | (info == INFO_NONFINITE_RESULT))
    bad |= rule & ((info == INFO_NONFINITE_RESULT) == finite_out)
    if op == "lu":
        n = out["piv"].shape[-1]
        bad |= nf & ~(allnan(out["lu"]) & (out["piv"] == np.arange(n)).all(-1))
    elif op in ("inv", "solve"):
        x = out["inv" if op == "inv" else "x"]
        bad |= (nf | sg) & ~allnan(x)
    else:
        bad |= nf & ~(np.isnan(out["sign"]) & np.isnan(out["logabsdet"]))
        bad |= sg & ~((out["sign"] == 0) & (out["logabsdet"] == -np.inf))
    return bad


def _read(array: zarr.Array, sel) -> np.ndarray:
    if isinstance(sel, slice):
        return np.asarray(array[sel])
    return np.asarray(array.oindex[sel])


def verify(input, output, *, rhs=None, sample=None, seed=0) -> VerifyReport:
    """Check ``output`` (a batchlu output group) against ``input`` (``PATH`` or ``PATH:ARRAY``).

    ``rhs`` defaults to the right-hand side recorded in the output. ``sample=K`` checks K matrices
    drawn at random (with ``seed``) from the complete chunks instead of all of them.
    """
    opts = make_options()
    out_path = parse_ref(output).path
    record = read_provenance(out_path)
    if record is None:
        raise InputError(f"Expected {out_path} to be a batchlu output group. Got a path without "
                         f"batchlu provenance instead.")
    op = record["op"]
    info_a = open_array_info(parse_ref(input))
    recorded = record.get("input", {})
    if info_a.ref.as_dict() != {"path": recorded.get("path"), "array": recorded.get("array")} and \
            (list(info_a.shape) != recorded.get("shape") or str(info_a.dtype) != recorded.get("dtype")):
        raise InputError(f"Expected an input of shape {tuple(recorded.get('shape', ()))} and dtype "
                         f"{recorded.get('dtype')}, as recorded in {out_path}. Got shape "
                         f"{info_a.shape}, dtype {info_a.dtype} instead.")
    rhs_ref = None
    if op == "solve":
        rec = record.get("rhs") or {}
        rhs_ref = parse_ref(rhs) if rhs is not None else ArrayRef(rec["path"], rec.get("array", ""))
    if sample is not None and (not isinstance(sample, (int, np.integer)) or sample < 1):
        raise InputError(f"Expected sample to be an integer >= 1 or None. Got {sample!r} instead.")

    plan = record["plan"]
    chunk, count = int(plan["chunk"]), int(record["N"])
    complete = _ledger.read(out_path)
    report = VerifyReport(output=out_path, op=op, total=count, sampled=sample is not None,
                          complete_chunks=int(complete.sum()), total_chunks=int(complete.size),
                          status=record.get("status", "unknown"), threshold=opts.verify_threshold)
    done = _ledger.matrix_mask(complete, chunk, count)
    a_arr = info_a.ref.open()
    b_arr = rhs_ref.open() if rhs_ref is not None else None
    outs = {name: zarr.open_array(store=out_path, path=name, mode="r") for name in record["outputs"]}
    n = info_a.shape[1]
    per = max(1, opts.verify_block_bytes // max(1, 2 * n * n * info_a.dtype.itemsize))
    if sample is not None:
        candidates = np.flatnonzero(done)
        rng = np.random.default_rng(seed)
        picked = np.sort(rng.choice(candidates, size=min(int(sample), candidates.size), replace=False))
        blocks = [picked[i:i + per] for i in range(0, picked.size, per)]
    else:
        blocks = [slice(lo, min(lo + per, count)) for lo in range(0, count, per)]
        blocks = [s for s in blocks if done[s].all()] + \
                 [np.flatnonzero(done[s]) + s.start for s in blocks if not done[s].all() and done[s].any()]
    all_ratios = []
    for sel in blocks:
        a = _read(a_arr, sel)
        out = {name: _read(arr, sel) for name, arr in outs.items()}
        b = _read(b_arr, sel) if b_arr is not None else None
        info = out["info"]
        index = np.arange(count)[sel]
        report.checked += info.size
        counts = info_counts(info)
        report.singular += counts.singular
        report.nonfinite += counts.nonfinite
        report.nonfinite_result += counts.nonfinite_result
        report.missing += counts.missing
        nonfinite_in = ~np.isfinite(a).all(axis=(1, 2))
        if b is not None:   # solve: a NaN or Inf in the right-hand side makes the input non-finite
            nonfinite_in |= ~np.isfinite(b).reshape(b.shape[0], -1).all(axis=1)
        missing_in = np.zeros(info.shape, bool)
        if (info == INFO_MISSING_INPUT).any():   # -3 must sit on matrices whose chunk is missing
            lo, hi = int(index.min()), int(index.max()) + 1
            for array in filter(None, (a_arr, b_arr)):
                gaps = _missing.find(array, lo, hi)
                rows = np.zeros(hi - lo, bool)
                for gap in gaps:
                    rows[max(gap.lo, lo) - lo:min(gap.hi, hi) - lo] = True
                missing_in |= rows[index - lo]
        wrong = _semantics(op, info, out, nonfinite_in, missing_in)
        report.semantic_errors += int(wrong.sum())
        for i in np.flatnonzero(wrong)[:5 - len(report.first_failures)]:
            report.first_failures.append((int(index[i]), f"info {int(info[i])}: outputs break the "
                                          f"agreed semantics for a singular/non-finite matrix"))
        rated = (info == 0) | ((info > 0) & (op == "lu"))
        if rated.any():
            pick = lambda x: x[rated]  # noqa: E731
            ratio = _block_ratios(op, pick(a), {k: pick(v) for k, v in out.items()},
                                  pick(b) if b is not None else None)
            ratio = np.where(np.isnan(ratio), np.inf, ratio)
            all_ratios.append(ratio)
            over = np.flatnonzero(ratio > report.threshold)
            for i in over[:5 - len(report.first_failures)]:
                report.first_failures.append((int(index[rated][i]), f"ratio {ratio[i]:.3g}"))
    if all_ratios:
        ratios = np.concatenate(all_ratios)
        report.ratios = int(ratios.size)
        report.max_ratio = float(ratios.max())
        report.median_ratio = float(np.median(ratios))
        report.over_threshold = int(np.count_nonzero(ratios > report.threshold))
    return report
