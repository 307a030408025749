"""Sparse batches on disk: a Zarr group that holds one symmetric pattern and many value sets.

    IN.zarr/                         attributes {"sparse": {"pattern": "lower" | "full",
      indptr   (n+1,)  int                         "kind": "spd" | "sym-indef", "n": n}}
      indices  (nnz,)  int           the pattern, CSR (rows of indptr, columns in indices)
      values   (N, nnz) float32|64   chunked along N: matrix i's entries in the pattern's order
      rhs      (N, n) or (N, n, k)   optional right-hand sides, same dtype family, chunked along N

The sparse ops read ``values`` (and ``rhs``) through the same batch loop as the dense ops read their
matrices; the pattern is analysed once in the client (:func:`open_input`) and its
:class:`batchlu.kernels.sparse.Plan` travels in the run's Job.
"""

from __future__ import annotations

import dataclasses
import os
import zlib

import numpy as np
import zarr

from ..errors import InputError
from ._arrays import ArrayInfo, ArrayRef, check_rhs, open_array_info, parse_ref
from ._object_store import is_url

ATTR = "sparse"


@dataclasses.dataclass(frozen=True)
class SparseInput:
    """A checked sparse batch: its values (and right-hand sides) and the pattern's analysis."""

    group: str
    values: ArrayInfo
    rhs: ArrayInfo | None
    k: int | None
    symbolic: object          # batchlu.kernels.sparse.Plan
    pattern: str
    kind: str
    pattern_crc: str

    @property
    def n(self) -> int:
        return self.symbolic.n

    def provenance(self) -> dict:
        plan = self.symbolic
        return {"group": self.group, "n": plan.n, "nnz": plan.nnz, "nnz_l": plan.nnz_l, "pattern": self.pattern,
                "kind": self.kind, "ordering": plan.ordering, "levels": plan.nlevels, "digest": plan.digest,
                "pattern_crc": self.pattern_crc}


def pattern_crc(indptr, indices) -> str:
    """CRC-32 of a pattern (int64, native order): what verify compares with the run's record."""
    crc = zlib.crc32(np.ascontiguousarray(indptr, np.int64).tobytes())
    return f"{zlib.crc32(np.ascontiguousarray(indices, np.int64).tobytes(), crc):08x}"


def _group(ref: ArrayRef) -> zarr.Group:
    if is_url(ref.path):
        raise InputError(f"Expected a local path for the sparse input. Got {ref.path} instead: sparse "
                         f"batches are not read from object storage; copy it to a local or shared disk.")
    if not os.path.isdir(ref.path):
        raise InputError(f"Expected the sparse input {ref.path} to be a Zarr group (a directory). "
                         f"Got {'no such path' if not os.path.exists(ref.path) else 'a regular file'} instead.")
    try:
        node = zarr.open(store=ref.path, path=ref.array or None, mode="r")
    except Exception as exc:
        raise InputError(f"Expected a readable Zarr group at {ref}. Got {type(exc).__name__}: {exc} instead.") from None
    if not isinstance(node, zarr.Group):
        raise InputError(f"Expected the sparse input {ref} to be a Zarr group with indptr, indices and "
                         f"values (see batchlu generate --kind fem-poisson). Got an array instead.")
    return node


def read_pattern(ref: ArrayRef):
    """``(group attrs["sparse"], indptr, indices)`` of the sparse batch at ``ref``, checked for presence."""
    group = _group(ref)
    attrs = group.attrs.get(ATTR)
    if not isinstance(attrs, dict):
        raise InputError(f"Expected the group {ref} to be a sparse batch, with a {ATTR!r} attribute "
                         f"({{'pattern': 'lower' | 'full', 'kind': ...}}). Got none instead.")
    arrays = {name for name, _ in group.arrays()}
    for name in ("indptr", "indices", "values"):
        if name not in arrays:
            raise InputError(f"Expected an array {name!r} in the sparse batch {ref}. "
                             f"Got only {', '.join(sorted(arrays)) or 'no arrays'} instead.")
    indptr = np.asarray(group["indptr"][...])
    indices = np.asarray(group["indices"][...])
    return attrs, indptr, indices


def open_input(input, rhs, *, needs_rhs: bool, settings) -> SparseInput:
    """Open and check a sparse batch and analyse its pattern (``settings``: the run's Options)."""
    from batchlu.kernels import sparse

    ref = parse_ref(input)
    attrs, indptr, indices = read_pattern(ref)
    pattern = attrs.get("pattern")
    kind = attrs.get("kind", "sym-indef")
    if pattern not in sparse.PATTERNS:
        raise InputError(f"Expected the sparse batch's attribute pattern to be one of "
                         f"{', '.join(sparse.PATTERNS)}. Got {pattern!r} instead.")
    if kind not in sparse.KINDS:
        raise InputError(f"Expected the sparse batch's attribute kind to be one of {', '.join(sparse.KINDS)}. "
                         f"Got {kind!r} instead.")
    n = indptr.size - 1 if indptr.ndim == 1 else -1
    if n < 0:
        raise InputError(f"Expected indptr of {ref} to be 1-D. Got shape {indptr.shape} instead.")
    values = open_array_info(ArrayRef(ref.path, _join(ref.array, "values")), "values")
    if len(values.shape) != 2 or values.shape[1] != indices.size:
        raise InputError(f"Expected values of shape (N, nnz) = (N, {indices.size}) in {ref}. "
                         f"Got shape {values.shape} instead.")
    if values.dtype not in sparse.DTYPES:
        raise InputError(f"Expected values of dtype float32 or float64 in {ref}. Got {values.dtype} instead.")
    symbolic = sparse.analyze(indptr, indices, n, kind=kind, ordering=settings.sparse_ordering, pattern=pattern)
    rhs_info, k = None, None
    if needs_rhs:
        if rhs is None:
            inside = ArrayRef(ref.path, _join(ref.array, "rhs"))
            if not os.path.exists(os.path.join(inside.path, inside.array)):
                raise InputError(f"Expected right-hand sides: an array 'rhs' in {ref} or --rhs B.zarr. "
                                 f"Got neither instead.")
            rhs_ref = inside
        else:
            rhs_ref = parse_ref(rhs)
        rhs_info = open_array_info(rhs_ref, "right-hand side")
        k = check_rhs(rhs_info, _as_square(values, n))
        if rhs_info.dtype not in sparse.DTYPES:
            raise InputError(f"Expected the right-hand side {rhs_info.ref} of dtype float32 or float64. "
                             f"Got {rhs_info.dtype} instead.")
    elif rhs is not None:
        raise InputError(f"Expected no right-hand side for this op; only ldlt-solve takes one. Got rhs={rhs!r} instead.")
    return SparseInput(group=ref.path, values=values, rhs=rhs_info, k=k, symbolic=symbolic, pattern=pattern,
                       kind=kind, pattern_crc=pattern_crc(indptr, indices))


def _join(base: str, name: str) -> str:
    return f"{base}/{name}" if base else name


def _as_square(values: ArrayInfo, n: int) -> ArrayInfo:
    """A stand-in with the dense shape (N, n, n), for the right-hand side's shape check."""
    return dataclasses.replace(values, shape=(values.shape[0], n, n))


def bytes_per_matrix(symbolic, itemsize: int, out_bytes: int, rhs_bytes: int) -> int:
    """Memory one matrix needs inside a task: values, right-hand side, outputs and the factors (L's
    values, the per-level copy before division, the wide supernodes' dense panels, their ``L D``
    and ``L^T`` copies and block inverses), plus the solves' workspace."""
    return 2 * (symbolic.nnz * itemsize + rhs_bytes + out_bytes) + 6 * symbolic.nnz_l * itemsize
