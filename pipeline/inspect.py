"""``batchlu.pipeline.inspect``: a printable summary of an input store or a run's output group."""

from __future__ import annotations

import os

import numpy as np
import zarr

from . import _ledger
from ._ops import INFO_NOT_COMPUTED, info_counts
from ._output import ATTR
from ._store import is_zarr_store, parse_ref
from .errors import InputError, InputNotFoundError

__all__ = ["inspect"]


def _describe(name: str, array: zarr.Array) -> str:
    shards = f", shards {array.shards}" if array.shards else ""
    return (f"  {name or '/'}: shape {tuple(array.shape)} {array.dtype}, chunks {array.chunks}"
            f"{shards}, zarr v{array.metadata.zarr_format}")


def _info_counts(info: zarr.Array, complete: np.ndarray | None, chunk: int) -> str:
    values = np.asarray(info[...])
    if complete is not None:
        values = values[_ledger.matrix_mask(complete, chunk, values.size)]
    values = values[values != INFO_NOT_COMPUTED]
    return f"  info: {info_counts(values).describe()}   (of {values.size:,} computed)"


def _count(value) -> str:
    """A recorded count with thousands separators; an edited record's other value as it is."""
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else repr(value)


def _output_summary(path: str, group: zarr.Group, record: dict) -> list[str]:
    inp = record.get("input", {})
    where = f"{inp.get('path')}{':' + inp['array'] if inp.get('array') else ''}"
    lines = [f"batchlu output {path}",
             f"  status: {record.get('status')}   op {record.get('op')}   {record.get('dtype')}   "
             f"n {record.get('n')}   N {_count(record.get('N'))}",
             f"  input: {where}"]
    if record.get("rhs"):
        rhs = record["rhs"]
        lines.append(f"  rhs: {rhs.get('path')}{':' + rhs['array'] if rhs.get('array') else ''}")
    lines.append(f"  backend {record.get('backend')} (used: {', '.join(record.get('backends_used') or []) or '-'})"
                 f"   batchlu {record.get('version')}   started {record.get('started')}   "
                 f"finished {record.get('finished') or '-'}")
    if record.get("error"):
        lines.append(f"  error: {record['error']}")
    complete = _ledger.read(path) if _ledger.exists(group) else None
    plan = record.get("plan")
    chunk = plan.get("chunk") if isinstance(plan, dict) else None
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
        lines.append(f"  plan: unreadable ({plan!r}): the info counts below cover every matrix")
        chunk, readable = 1, False
    else:
        readable = True
    if complete is not None:
        lines.append(f"  chunks: {int(complete.sum()):,}/{complete.size:,} complete"
                     + (f" ({chunk:,} matrices per chunk)" if readable else ""))
    else:
        lines.append("  chunks: no completion records yet")
    if record.get("status") != "complete":
        lines.append("  INCOMPLETE: finish it with resume (--resume)")
    for name in record.get("outputs", []):
        if name in group:
            lines.append(_describe(name, group[name]))
        else:
            lines.append(f"  {name}: missing")
    if "info" in group:
        mask = complete if complete is not None else np.zeros(0, bool)
        lines.append(_info_counts(group["info"], mask if readable else None, chunk))
    return lines


def inspect(path) -> str:
    """Shapes, dtypes, chunking; for a run's output also status, provenance, completed/total chunks
    and info counts. ``path`` is ``PATH`` or ``PATH:ARRAY``."""
    ref = parse_ref(path)
    if not os.path.exists(ref.path):
        raise InputNotFoundError(f"Expected a Zarr store at {ref.path}. Got no such path instead.")
    if not is_zarr_store(ref.path):
        raise InputError(f"Expected {ref.path} to be a Zarr store. Got a path without Zarr "
                         f"metadata instead.")
    try:
        node = zarr.open(store=ref.path, path=ref.array or None, mode="r")
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
