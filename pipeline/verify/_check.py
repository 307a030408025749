"""The check behind ``batchlu verify`` (:func:`verify`) and what it reports (:class:`VerifyReport`):
the record checked against the stored arrays (:mod:`._record`), then every rule of the op
(:mod:`._rules`, :mod:`._sparse_rules`) applied to every matrix of the chunks recorded complete,
block by block."""

from __future__ import annotations

import dataclasses

import numpy as np
import zarr

from .._ops import OP_TABLE, info_counts
from ..config._settings import options as make_options
from ..errors import CorruptInputError, InputError, OutputError
from ..output import _ledger
from ..output._group import read_provenance
from ..store import _missing
from ..store._arrays import ArrayInfo, ArrayRef, check_matrices, open_array_info, parse_ref, unreadable
from ..store._files import output_path
from ..store._object_store import join, naming_store_failures, takes_storage_options, zarr_store
from ..store._sparse import pattern_crc as _pattern_crc
from ..store._zarr import settle_reads
from . import _record
from ._rules import Block
from ._rules import rules_for as _dense_rules
from ._sparse_rules import SparseBlock, inertia_mismatch
from ._sparse_rules import rules_for as _sparse_rules

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
    return ref.location()


@takes_storage_options
@naming_store_failures
def verify(input, output, *, rhs=None, sample=None, seed=0) -> VerifyReport:
    """Check ``output`` (a batchlu output group) against ``input`` (``PATH`` or ``PATH:ARRAY``).

    ``rhs`` defaults to the right-hand side recorded in the output. ``sample=K`` checks K matrices
    drawn at random (with ``seed``) from the complete chunks instead of all of them.
    ``storage_options``: as for :func:`batchlu.pipeline.run`, for ``s3://`` stores.
    """
    opts = make_options()
    out_path = parse_ref(output_path(output, writing=False)).path
    record, group = _checked_record(out_path)
    sources = _open_sources(input, rhs, record, out_path, group)
    if sample is not None and (not isinstance(sample, (int, np.integer)) or sample < 1):
        raise InputError(f"Expected sample to be an integer >= 1 or None. Got {sample!r} instead.")

    op = record["op"]
    chunk, count = int(record["plan"]["chunk"]), int(record["N"])
    complete = _ledger.read(out_path)
    done = _ledger.matrix_mask(complete, chunk, count)
    report = VerifyReport(output=out_path, op=op, total=count, sampled=sample is not None,
                          complete_chunks=int(complete.sum()), total_chunks=int(complete.size),
                          missing_chunks=_runs(np.flatnonzero(~complete)),
                          missing_matrices=int(count - done.sum()), chunk=chunk,
                          status=record.get("status", "unknown"), threshold=opts.verify_threshold)
    n = int(record["n"])
    matrix_bytes = sources.a.shape[1] * 8 + n * n * 8 if sources.pattern else n * n * sources.a.dtype.itemsize
    per = max(1, opts.verify_block_bytes // max(1, 2 * matrix_bytes))
    _check_blocks(report, _blocks(done, count, per, sample, seed), sources, group, out_path, n)
    return report


def _checked_record(out_path: str) -> tuple[dict, zarr.Group]:
    """The output's record and group, once every field verify reads agrees with what is stored."""
    record = read_provenance(out_path)
    if record is None:
        raise InputError(f"Expected {out_path} to be a batchlu output group. Got a path without "
                         f"batchlu provenance instead.")
    # every field read below agrees with what is stored, before any of it is used
    _record.check_fields(record, out_path)
    group = zarr.open_group(store=zarr_store(out_path, read_only=True), mode="r")
    missing = _record.absent(record, group)
    if missing and record.get("status") != "complete":
        raise OutputError(f"Expected the output {out_path} to hold {', '.join(missing)}. Got none of them "
                          f"instead: its run did not finish (status {record.get('status')!r}); finish it "
                          f"with resume (--resume).")
    said = _record.output_mismatches(record, group)
    if said:
        raise _record.edited(out_path, said[0])
    return record, group


@dataclasses.dataclass(frozen=True)
class _Sources:
    """What the outputs are checked against: the input (a sparse batch's values), the right-hand
    sides, and a sparse batch's pattern (the row and column of each entry)."""

    a: ArrayInfo
    rhs: ArrayRef | None
    pattern: tuple[np.ndarray, np.ndarray] | None


def _open_sources(input, rhs, record: dict, out_path: str, group: zarr.Group) -> _Sources:
    """Open the input and right-hand sides of the output's op and check them against the record."""
    op = record["op"]
    pattern = None
    if OP_TABLE[op].sparse:   # the sparse batch's group: its values are the input
        from batchlu.kernels.sparse._pattern import rows_of

        from ..store._sparse import read_pattern

        group_ref = parse_ref(input)
        attrs, indptr, indices = read_pattern(group_ref)
        info_a = open_array_info(ArrayRef(group_ref.path, f"{group_ref.array}/values".lstrip("/")), "values")
        if not isinstance(record.get("sparse"), dict) or \
                record["sparse"].get("pattern_crc") != _pattern_crc(indptr, indices):
            raise InputError(f"Expected the sparse batch {group_ref} to hold the pattern recorded in "
                             f"{out_path}. Got another pattern instead.")
        pattern = (rows_of(indptr), indices.astype(np.int64))
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
    return _Sources(info_a, rhs_ref, pattern)


def _blocks(done: np.ndarray, count: int, per: int, sample, seed) -> list:
    """The matrices to check, in blocks of at most ``per``: ``sample`` of those whose chunks are
    complete (``done``) drawn with ``seed``, or all ``count`` of them (a slice per block wholly
    complete)."""
    if sample is not None:
        candidates = np.flatnonzero(done)
        rng = np.random.default_rng(seed)
        picked = np.sort(rng.choice(candidates, size=min(int(sample), candidates.size), replace=False))
        return [picked[i:i + per] for i in range(0, picked.size, per)]
    blocks = [slice(lo, min(lo + per, count)) for lo in range(0, count, per)]
    return [s for s in blocks if done[s].all()] + \
           [np.flatnonzero(done[s]) + s.start for s in blocks if not done[s].all() and done[s].any()]


def _check_blocks(report: VerifyReport, blocks: list, sources: _Sources, group: zarr.Group, out_path: str,
                  n: int) -> None:
    """Read each block of the input, right-hand sides and outputs, apply the op's rules to it, and
    sum the counts and test ratios into ``report``."""
    op = report.op
    a_arr = sources.a.ref.open()
    b_arr = sources.rhs.open() if sources.rhs is not None else None
    outs = {name: group[name] for name in _record.op_outputs(op)}
    all_ratios = []
    for sel in blocks:
        index = np.arange(sel.start, sel.stop) if isinstance(sel, slice) else sel
        # -3 must sit on exactly the matrices whose chunk is missing: asked of the store for every
        # block before any read (a chunk gone since the run reads as the fill value); an empty shard
        # file or a pipe in the input raises CorruptInputError here, as in a run (read, a pipe hung)
        missing_input = _missing_rows(index, a_arr, b_arr)
        out = {name: _read(arr, sel, join(out_path, name), OutputError) for name, arr in outs.items()}
        b_block = _read(b_arr, sel, _folder(sources.rhs)) if b_arr is not None else None
        a_block = _read(a_arr, sel, _folder(sources.a.ref))
        if sources.pattern is not None:
            blk = SparseBlock(op, a_block, out, b_block, n, *sources.pattern)
        else:
            blk = Block(op, a_block, out, b_block)
        report.checked += blk.info.size
        counts = info_counts(blk.info)
        report.singular += counts.singular
        report.nonfinite += counts.nonfinite
        report.nonfinite_result += counts.nonfinite_result
        report.missing += counts.missing
        report.refinement += counts.refinement
        blk.missing_input = missing_input
        _check_block(report, blk, index, all_ratios)
    if all_ratios:
        ratios = np.concatenate(all_ratios)
        report.ratios = int(ratios.size)
        report.max_ratio = float(ratios.max())
        report.median_ratio = float(np.median(ratios))
