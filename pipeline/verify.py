"""``batchlu.pipeline.verify``: check a run's output against its input, matrix by matrix.

Every rule of :mod:`._verify_rules` is applied to every matrix checked: LAPACK's test ratios against a
float64/complex128 recomputation for the results (dget01 for ``lu``, dget03 for ``inv``, dget02 for
``solve`` via :mod:`batchlu.testing.ratios`, and for ``slogdet`` the errors of ``logabsdet`` and
``sign`` in units of ``n eps``, :func:`batchlu.testing.ratios.slogdet_ratios`), and the ``info``
rules: each code is one batchlu writes, means what it says (a non-finite input is -1 and only it, -2
exactly where a finite input's result is not finite, -3 exactly where the input chunk is missing, a
matrix flagged singular is singular) and comes with the agreed outputs (NaN inverse / solution,
sign 0 and logabsdet -inf, NaN lu and identity pivots, ...). Singular and non-finite matrices are
counted, not failed. Only chunks recorded complete are checked; an incomplete output is reported as
such, naming the chunks not computed, and is never ``ok``. Before anything is checked, the record's
fields that say what to check (N, n, the chunk, op, input, rhs) are compared with the stored arrays
(:mod:`._verify_record`): an edited record is refused, never trusted.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import zarr

from . import _ledger, _missing
from . import _verify_record as _record
from ._config import options as make_options
from ._ops import INFO_MISSING_INPUT, OP_TABLE, info_counts
from ._output import read_provenance
from ._pending_reads import settle_reads
from ._store import ArrayRef, check_matrices, open_array_info, parse_ref, unreadable
from ._sparse import pattern_crc as _pattern_crc
from ._verify_rules import Block
from ._verify_rules import rules_for as _dense_rules
from ._verify_sparse import SparseBlock, inertia_mismatch
from ._verify_sparse import rules_for as _sparse_rules
from .errors import CorruptInputError, InputError, OutputError

__all__ = ["VerifyReport", "verify"]

_FIRST = 5  # failures listed by matrix


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
    over_threshold: int = 0       # matrices with a test ratio over the threshold
    singular: int = 0
    nonfinite: int = 0
    nonfinite_result: int = 0     # info -2
    missing: int = 0              # info -3
    refinement: int = 0           # info -4 (ldlt-solve: refinement short of its tolerance)
    compared: int = 0             # ldlt-inertia: matrices compared with the eigvalsh reference
    perturbed_differ: int = 0     # ldlt-inertia: of those, differing with perturbed pivots (not failed)
    semantic_errors: int = 0      # matrices that break an info rule (see failures)
    failures: dict = dataclasses.field(default_factory=dict)        # rule name -> matrices breaking it
    first_failures: list = dataclasses.field(default_factory=list)  # (index, why), a few
    complete_chunks: int = 0
    total_chunks: int = 0
    missing_chunks: list = dataclasses.field(default_factory=list)  # (first, last) chunk index ranges
    missing_matrices: int = 0     # matrices in chunks not recorded complete
    chunk: int = 1
    status: str = "complete"
    threshold: float = 30.0

    @property
    def complete(self) -> bool:
        return self.status == "complete" and self.complete_chunks == self.total_chunks

    @property
    def ok(self) -> bool:
        return self.complete and not self.failures

    def problems(self) -> list[str]:
        """What is wrong, one short phrase each (empty when ``ok``)."""
        said = []
        if self.complete_chunks < self.total_chunks:
            said.append(f"the output is incomplete: {_count(self.missing_matrices)} in "
                        f"{self.total_chunks - self.complete_chunks:,} of {self.total_chunks:,} chunks "
                        f"not computed ({self._missing_text()})")
        if self.status != "complete":
            said.append(f"its run did not finish (status {self.status!r})")
        if self.over_threshold:
            said.append(f"{_count(self.over_threshold)} with a test ratio over {self.threshold:g}")
        if self.semantic_errors:
            broken = [name for name in self.failures if name not in self._ratio_rules]
            said.append(f"{_count(self.semantic_errors)} breaking the info rules ({', '.join(broken)})")
        return said

    @property
    def _ratio_rules(self) -> set:
        return {rule.name for rule in rules_for(self.op) if rule.ratio}

    def _missing_text(self, most: int = 4) -> str:
        parts = []
        for first, last in self.missing_chunks[:most]:
            lo, hi = first * self.chunk, min((last + 1) * self.chunk, self.total) - 1
            which = f"chunk {first}" if first == last else f"chunks {first}-{last}"
            parts.append(f"{which} (matrices {lo}-{hi})")
        if len(self.missing_chunks) > most:
            parts.append(f"and {len(self.missing_chunks) - most:,} more ranges")
        return ", ".join(parts)

    def summary(self) -> str:
        scope = f"a random sample of {self.checked:,}" if self.sampled else f"all {self.checked:,}"
        if self.op == "ldlt-inertia":
            measure = (f"  inertia against float64 eigvalsh: {self.compared:,} matrices compared, "
                       f"{self.failures.get('inertia-reference', 0):,} differ"
                       + (f" (and {self.perturbed_differ:,} with perturbed pivots differ: reported, not failed)"
                          if self.perturbed_differ else ""))
        else:
            name = OP_TABLE[self.op].ratio_name
            measure = (f"  {name} ratio: max {self.max_ratio:.3g}, median {self.median_ratio:.3g}, "
                       f"{self.over_threshold:,} over {self.threshold:g} (of {self.ratios:,} ratios)")
        lines = [f"verify {self.op}: {'OK' if self.ok else 'FAILED'} - {scope} of {self.total:,} "
                 f"matrices in {self.output}", measure,
                 f"  singular {self.singular:,}   non-finite input {self.nonfinite:,}   "
                 f"non-finite result {self.nonfinite_result:,}   missing input {self.missing:,}   "
                 + (f"refinement short {self.refinement:,}   " if self.refinement else "")
                 + f"semantic errors {self.semantic_errors:,}"]
        if self.failures:
            lines.append("  rules broken: " + ", ".join(f"{name} ({_count(count)})"
                                                         for name, count in self.failures.items()))
        if not self.complete:
            lines.append(f"  INCOMPLETE output: status {self.status!r}, {self.complete_chunks:,} of "
                         f"{self.total_chunks:,} chunks complete (only those were checked)"
                         + (f"; not computed: {self._missing_text()}" if self.missing_chunks else "")
                         + "; finish it with resume (--resume)")
        for index, why in self.first_failures:
            lines.append(f"  matrix {index}: {why}")
        return "\n".join(lines)

    __repr__ = summary


def rules_for(op: str) -> list:
    """The rules verify applies to ``op``'s outputs: the dense table's or the sparse one's."""
    return _sparse_rules(op) if OP_TABLE[op].sparse else _dense_rules(op)


def _count(k: int) -> str:
    return f"{k:,} matrix" if k == 1 else f"{k:,} matrices"


def _runs(indices: np.ndarray) -> list[tuple[int, int]]:
    """Sorted indices as (first, last) runs of consecutive values."""
    if indices.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(indices) != 1)
    starts = np.concatenate([[0], breaks + 1])
    stops = np.concatenate([breaks, [indices.size - 1]])
    return [(int(indices[a]), int(indices[b])) for a, b in zip(starts, stops)]


def _missing_rows(index: np.ndarray, *arrays) -> np.ndarray:
    """Per matrix of ``index``: its chunk (of the input or right-hand side) is missing from its store."""
    lo, hi = int(index.min()), int(index.max()) + 1
    rows = np.zeros(hi - lo, bool)
    for array in filter(lambda x: x is not None, arrays):
        for gap in _missing.find(array, lo, hi):
            rows[max(gap.lo, lo) - lo:min(gap.hi, hi) - lo] = True
    return rows[index - lo]


def _check_block(report: VerifyReport, blk: Block, index: np.ndarray, rated: list) -> None:
    """Apply every rule of the op to one block; count and describe what breaks."""
    over = np.zeros(len(blk.info), bool)
    semantic = np.zeros(len(blk.info), bool)
    for rule in rules_for(blk.op):
        value = rule.check(blk)
        broken = value if value.dtype == bool else ~(value <= report.threshold)
        if not broken.any():
            continue
        report.failures[rule.name] = report.failures.get(rule.name, 0) + int(broken.sum())
        (over if rule.ratio else semantic)[broken] = True
        for i in np.flatnonzero(broken)[:_FIRST - len(report.first_failures)]:
            why = rule.says.format(info=int(blk.info[i]), value=float(value[i]), threshold=report.threshold)
            report.first_failures.append((int(index[i]), f"{rule.name}: {why}"))
    report.over_threshold += int(over.sum())
    report.semantic_errors += int(semantic.sum())
    ratios = [blk.ratios[rule.name] for rule in rules_for(blk.op) if rule.ratio]
    if blk.rated.any() and ratios:
        rated.append(np.maximum.reduce(ratios)[blk.rated])
    if blk.op == "ldlt-inertia":
        report.compared += int((blk.inertia_reference[:, 0] >= 0).sum())
        report.perturbed_differ += int((inertia_mismatch(blk) & (blk.out["perturbed"] != 0)).sum())


def _read(array: zarr.Array, sel, where: str, error=CorruptInputError) -> np.ndarray:
    """The rows ``sel`` (a slice or sorted indices) of ``array``; where a chunk cannot be read or
    decoded, ``error`` naming its file in ``where`` (the array's folder), not zarr's traceback."""
    try:
        if isinstance(sel, slice):
            return np.asarray(array[sel])
        return np.asarray(array.oindex[sel])
    except Exception as exc:
        rows = np.arange(array.shape[0])[sel] if isinstance(sel, slice) else np.asarray(sel)
        failure = unreadable(array, rows, where, exc, error)
        settle_reads()
        raise failure from None


def _folder(ref: ArrayRef) -> str:
    return os.path.join(ref.path, ref.array) if ref.array else ref.path


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
    # every field read below agrees with what is stored, before any of it is used
    _record.check_fields(record, out_path)
    group = zarr.open_group(store=out_path, mode="r")
    missing = _record.absent(record, group)
    if missing and record.get("status") != "complete":
        raise OutputError(f"Expected the output {out_path} to hold {', '.join(missing)}. Got none of them "
                          f"instead: its run did not finish (status {record.get('status')!r}); finish it "
                          f"with resume (--resume).")
    said = _record.output_mismatches(record, group)
    if said:
        raise _record.edited(out_path, said[0])
    op = record["op"]
    sparse = OP_TABLE[op].sparse
    if sparse:   # the sparse batch's group: its values are the input
        from ._sparse import read_pattern
        from batchlu.kernels.sparse._pattern import rows_of

        group_ref = parse_ref(input)
        attrs, indptr, indices = read_pattern(group_ref)
        info_a = open_array_info(ArrayRef(group_ref.path, f"{group_ref.array}/values".lstrip("/")), "values")
        if not isinstance(record.get("sparse"), dict) or \
                record["sparse"].get("pattern_crc") != _pattern_crc(indptr, indices):
            raise InputError(f"Expected the sparse batch {group_ref} to hold the pattern recorded in "
                             f"{out_path}. Got another pattern instead.")
        pattern_rows, pattern_cols = rows_of(indptr), indices.astype(np.int64)
        n_stored = indptr.size - 1
    else:
        info_a = open_array_info(parse_ref(input))
        n_stored = check_matrices(info_a)
    rhs_ref = rhs_info = None
    if OP_TABLE[op].needs_rhs:
        rec = record["rhs"]
        rhs_ref = parse_ref(rhs) if rhs is not None else ArrayRef(rec["path"], rec.get("array", ""))
        rhs_info = open_array_info(rhs_ref, "right-hand side")
    _record.check_input(record, out_path, group, info_a, rhs_info, n_stored)
    if sample is not None and (not isinstance(sample, (int, np.integer)) or sample < 1):
        raise InputError(f"Expected sample to be an integer >= 1 or None. Got {sample!r} instead.")

    plan = record["plan"]
    chunk, count = int(plan["chunk"]), int(record["N"])
    complete = _ledger.read(out_path)
    done = _ledger.matrix_mask(complete, chunk, count)
    report = VerifyReport(output=out_path, op=op, total=count, sampled=sample is not None,
                          complete_chunks=int(complete.sum()), total_chunks=int(complete.size),
                          missing_chunks=_runs(np.flatnonzero(~complete)),
                          missing_matrices=int(count - done.sum()), chunk=chunk,
                          status=record.get("status", "unknown"), threshold=opts.verify_threshold)
    a_arr = info_a.ref.open()
    b_arr = rhs_ref.open() if rhs_ref is not None else None
    outs = {name: group[name] for name in _record.op_outputs(op)}
    n = int(record["n"])
    matrix_bytes = info_a.shape[1] * 8 + n * n * 8 if sparse else n * n * info_a.dtype.itemsize
    per = max(1, opts.verify_block_bytes // max(1, 2 * matrix_bytes))
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
        out = {name: _read(arr, sel, os.path.join(out_path, name), OutputError) for name, arr in outs.items()}
        b_block = _read(b_arr, sel, _folder(rhs_ref)) if b_arr is not None else None
        a_block = _read(a_arr, sel, _folder(info_a.ref))
        if sparse:
            blk = SparseBlock(op, a_block, out, b_block, n, pattern_rows, pattern_cols)
        else:
            blk = Block(op, a_block, out, b_block)
        report.checked += blk.info.size
        counts = info_counts(blk.info)
        report.singular += counts.singular
        report.nonfinite += counts.nonfinite
        report.nonfinite_result += counts.nonfinite_result
        report.missing += counts.missing
        report.refinement += counts.refinement
        index = np.arange(sel.start, sel.stop) if isinstance(sel, slice) else sel
        if (blk.info == INFO_MISSING_INPUT).any():   # -3 must sit on matrices whose chunk is missing
            blk.missing_input = _missing_rows(index, a_arr, b_arr)
        _check_block(report, blk, index, all_ratios)
    if all_ratios:
        ratios = np.concatenate(all_ratios)
        report.ratios = int(ratios.size)
        report.max_ratio = float(ratios.max())
        report.median_ratio = float(np.median(ratios))
    return report
