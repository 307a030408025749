"""``batchlu.pipeline.inspect``: a printable summary of an input store or a run's output group."""

from __future__ import annotations

import os

import numpy as np
import zarr

from ._ops import INFO_NOT_COMPUTED, info_counts
from .errors import InputError, InputNotFoundError, ObjectStoreError
from .output import _ledger
from .output._group import ATTR
from .store._arrays import parse_ref, unreadable
from .store._files import is_zarr_store, occupied, zarr_location
from .store._object_store import is_url, join, naming_store_failures, takes_storage_options, zarr_store
from .store._zarr import settle_reads
from .verify import _record

__all__ = ["inspect"]


def _describe(name: str, array: zarr.Array) -> str:
    shards = f", shards {array.shards}" if array.shards else ""
    return (f"  {name or '/'}: shape {tuple(array.shape)} {array.dtype}, chunks {array.chunks}"
            f"{shards}, zarr v{array.metadata.zarr_format}")


def _info_counts(info: zarr.Array, folder: str, complete: np.ndarray | None, chunk: int) -> str:
    try:
        values = np.asarray(info[...])
    except Exception as exc:  # a damaged chunk: named in one line, as verify names it
        error = unreadable(info, np.arange(info.shape[0]), folder, exc)
        settle_reads()   # the other chunks' reads, still in flight, finish before the process may end
        if isinstance(error, ObjectStoreError):   # the store failed, not the chunk: no summary
            raise error from None
        return f"  info: {' '.join(str(error).split())}"
    if complete is not None:
        values = values[_ledger.matrix_mask(complete, chunk, values.size)]
    values = values[values != INFO_NOT_COMPUTED]
    return f"  info: {info_counts(values).describe()}   (of {values.size:,} computed)"


def _count(value) -> str:
    """A recorded count with thousands separators; an edited record's other value as it is."""
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else repr(value)


def _where(ref) -> str:
    """A recorded ``{"path", "array"}`` as ``PATH[:ARRAY]``; an edited record's other value as it is."""
    if not isinstance(ref, dict):
        return repr(ref)
    return f"{ref.get('path')}{':' + str(ref['array']) if ref.get('array') else ''}"


def _names(value) -> list[str]:
    """A recorded list of names; an edited record's other value as no names."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _ledger_chunk(record: dict, group: zarr.Group, complete: np.ndarray | None, lines: list) -> int | None:
    """Matrices per chunk for reading the ledger: the recorded plan's chunk where it agrees with the
    stored ``info`` and the ledger (else None: the counts then cover every matrix). Where the record
    does not describe the stored arrays (:mod:`batchlu.pipeline.verify._record`), one line says so."""
    plan = record.get("plan")
    chunk = plan.get("chunk") if isinstance(plan, dict) else None
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
        lines.append(f"  plan: unreadable ({plan!r}): the info counts below cover every matrix")
        return None
    problem = _record.field_problem(record)
    said = [problem] if problem else _record.output_mismatches(record, group)
    info = group.get("info")
    usable = isinstance(info, zarr.Array) and info.ndim == 1 and (info.shards or info.chunks)[0] == chunk \
        and (complete is None or complete.size == -(-info.shape[0] // chunk))
    if said:
        lines.append(f"  RECORD EDITED? {said[0]}" + ("" if usable else ": the info counts below cover every matrix"))
    return chunk if usable else None


def _output_summary(path: str, group: zarr.Group, record: dict) -> list[str]:
    lines = [f"batchlu output {path}",
             f"  status: {record.get('status')}   op {record.get('op')}   {record.get('dtype')}   "
             f"n {record.get('n')}   N {_count(record.get('N'))}",
             f"  input: {_where(record.get('input', {}))}"]
    if record.get("rhs"):
        lines.append(f"  rhs: {_where(record['rhs'])}")
    lines.append(f"  backend {record.get('backend')} (used: {', '.join(_names(record.get('backends_used'))) or '-'})"
                 f"   batchlu {record.get('version')}   started {record.get('started')}   "
                 f"finished {record.get('finished') or '-'}")
    if record.get("error"):
        lines.append(f"  error: {record['error']}")
    complete = _ledger.read(path) if _ledger.exists(group) else None
    chunk = _ledger_chunk(record, group, complete, lines)
    if complete is not None:
        lines.append(f"  chunks: {int(complete.sum()):,}/{complete.size:,} complete"
                     + (f" ({chunk:,} matrices per chunk)" if chunk else ""))
    else:
        lines.append("  chunks: no completion records yet")
    if record.get("status") != "complete":
        lines.append("  INCOMPLETE: finish it with resume (--resume)")
    for name in _names(record.get("outputs")):
        node = group.get(name)
        if isinstance(node, zarr.Array):
            lines.append(_describe(name, node))
        else:
            lines.append(f"  {name}: missing")
    info = group.get("info")
    if isinstance(info, zarr.Array) and info.ndim == 1:
        mask = complete if complete is not None else np.zeros(0, bool)
        lines.append(_info_counts(info, join(path, "info"), mask if chunk else None, chunk or 1))
    return lines


@takes_storage_options
@naming_store_failures
def inspect(path) -> str:
    """Shapes, dtypes, chunking; for a run's output also status, provenance, completed/total chunks
    and info counts. ``path`` is ``PATH`` or ``PATH:ARRAY``."""
    location = zarr_location(path, "store to inspect", InputError)
    if location is not None:   # a zarr object: its own directory, whatever the store's root holds
        root, inner = location
        path = os.path.join(root, *inner.split("/")) if inner else root
    ref = parse_ref(path)
    if not (occupied(ref.path) if is_url(ref.path) else os.path.exists(ref.path)):
        raise InputNotFoundError(f"Expected a Zarr store at {ref.path}. Got no such path instead.")
    if not is_zarr_store(ref.path):
        raise InputError(f"Expected {ref.path} to be a Zarr store. Got a path without Zarr "
                         f"metadata instead.")
    try:
        node = zarr.open(store=zarr_store(ref.path, read_only=True), path=ref.array or None, mode="r")
    except (FileNotFoundError, KeyError):
        raise InputNotFoundError(f"Expected an array or group {ref.array!r} in {ref.path}. "
                                 f"Got nothing there instead.") from None
    if isinstance(node, zarr.Array):
        lines = [f"Zarr array {ref}", _describe(ref.array, node)]
        generated = node.attrs.get("batchlu_generate")
        if generated:
            lines.append(f"  generated: {generated}")
        elif node.attrs.get("batchlu_generate_incomplete"):
            lines.append("  INCOMPLETE: batchlu generate did not finish writing it (generate it again "
                         "with --overwrite)")
        return "\n".join(lines)
    record = node.attrs.get(ATTR)
    if isinstance(record, dict) and not ref.array:
        return "\n".join(_output_summary(ref.path, node, record))
    lines = [f"Zarr group {ref}"]
    for name, array in sorted(node.arrays()):
        lines.append(_describe(name, array))
    for name, _ in sorted(node.groups()):
        lines.append(f"  {name}/: group")
    return "\n".join(lines)
