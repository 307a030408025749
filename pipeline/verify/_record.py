"""The provenance fields ``batchlu verify`` and ``batchlu inspect`` read from an output's record, checked
against what is stored.

The record steers verify: ``N`` says how many matrices to check, ``plan.chunk`` which of them the
ledger marks complete, ``op`` and ``n`` which arrays to read and what shape they have, ``input`` and
``rhs`` what to compare with. A record edited by hand, or an output or input rewritten under it, must
not make verify check fewer matrices, or other ones, and say OK. So every such field is compared with
the stored arrays it describes, and a mismatch is one line naming the field, the value recorded and
the one stored:

* :func:`field_problem` / :func:`check_fields`: each field present and of its type (``N`` a whole
  number, ``input`` a mapping, ...), and ``outputs`` the arrays ``op`` writes;
* :func:`absent`: the arrays and the ledger the output group lacks (a run killed while it made them);
* :func:`output_mismatches`: ``op``, ``N``, ``n`` and ``plan.chunk`` against the output group's arrays
  (their shapes and chunks along N) and the ledger's length; inspect prints these, verify refuses them;
* :func:`check_input`: ``input``, ``dtype``, ``N`` and ``n`` against the input verify reads (and, for
  the ops with right-hand sides, ``rhs``), then the output arrays' shapes and dtypes against what the op
  writes for that input.
"""

from __future__ import annotations

import math

import numpy as np
import zarr

from .._ops import OP_TABLE, output_specs
from ..errors import InputError
from ..output import _ledger

__all__ = ["absent", "check_fields", "check_input", "edited", "field_problem", "op_outputs", "output_mismatches"]


def edited(out_path: str, what: str) -> InputError:
    """The one-line error of a record that does not describe what is stored."""
    return InputError(f"Expected the batchlu provenance of {out_path} as a run writes it, agreeing with "
                      f"the stored arrays. Got {what} instead; was it edited?")


def _whole(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _ints(value) -> bool:
    return isinstance(value, (list, tuple)) and all(_whole(v) for v in value)


def op_outputs(op: str) -> list[str]:
    """The arrays ``op`` writes, ``info`` last (what a run records as ``outputs``)."""
    return list(OP_TABLE[op].results) + ["info"]


def field_problem(record: dict) -> str | None:
    """The first field verify reads that is missing or not of its type (``N`` a whole number,
    ``input`` a mapping, ...), or ``outputs`` not what ``op`` writes: a phrase naming it and the value
    recorded. None when there is none."""
    op = record.get("op")
    if not isinstance(op, str) or op not in OP_TABLE:
        return f"a record with op {op!r}, not one of {', '.join(OP_TABLE)}"
    for key in ("n", "N", "plan", "input", "outputs", "dtype"):
        if key not in record:
            return f"a record without {key!r}"
    for key in ("n", "N"):
        if not _whole(record[key]) or record[key] < 0:
            return f"{key} = {record[key]!r} recorded, not a whole number >= 0"
    plan = record["plan"]
    if not isinstance(plan, dict) or "chunk" not in plan:
        return "a record without the plan's chunk"
    if not _whole(plan["chunk"]) or plan["chunk"] < 1:
        return f"plan.chunk = {plan['chunk']!r} recorded, not a whole number >= 1"
    for key in ("input",) + (("rhs",) if OP_TABLE[op].needs_rhs else ()):
        value = record.get(key)
        if not isinstance(value, dict) or not isinstance(value.get("path"), str) \
                or not isinstance(value.get("array", ""), str):
            return (f"{key} = {value!r} recorded, not a mapping with the array's path"
                    + (f" (op {op} reads its right-hand side's path from it)" if key == "rhs" else ""))
        if not _ints(value.get("shape")) or not isinstance(value.get("dtype"), str):
            return f"{key} = {value!r} recorded, without the array's shape and dtype"
    if not isinstance(record["dtype"], str):
        return f"dtype = {record['dtype']!r} recorded, not the name of a dtype"
    wanted, outputs = op_outputs(op), record["outputs"]
    if not isinstance(outputs, list) or not set(wanted) <= set(map(str, outputs)):
        lack = sorted(set(wanted) - set(map(str, outputs))) if isinstance(outputs, list) else wanted
        return f"a record whose outputs {outputs!r} lack {lack} of op {op}"
    if sorted(map(str, outputs)) != sorted(wanted):
        return f"outputs = {outputs!r} recorded, but op {op} writes {wanted}"
    return None


def check_fields(record: dict, out_path: str) -> None:
    """Refuse a record with a :func:`field_problem` (it would end in a traceback, or steer the rules)."""
    what = field_problem(record)
    if what is not None:
        raise edited(out_path, what)


def _stored_along_n(array: zarr.Array) -> int:
    """Matrices per stored object along N (the shard if sharded, else the chunk)."""
    return int((array.shards or array.chunks)[0])


def absent(record: dict, group: zarr.Group) -> list[str]:
    """The arrays of ``op`` (and the ledger) that the output group does not hold: a run killed while
    it created them left them out (its resume makes them), or they were deleted."""
    names = op_outputs(record["op"]) + [_ledger.NAME]
    return [name for name in names if not isinstance(group.get(name), zarr.Array)]


def output_mismatches(record: dict, group: zarr.Group) -> list[str]:
    """Where ``op``, ``N``, ``n`` and ``plan.chunk`` (of a record :func:`check_fields` passed) disagree
    with the output group: each a phrase ``FIELD = RECORDED recorded, but STORED``. Empty when they agree."""
    op, count, n, chunk = record["op"], record["N"], record["n"], record["plan"]["chunk"]
    said = []
    arrays = {}
    for name in op_outputs(op):
        node = group.get(name)
        if not isinstance(node, zarr.Array):
            said.append(f"op = {op!r} recorded, but the output holds no array {name!r}")
            continue
        arrays[name] = node
        if node.shape[0:1] != (count,):
            said.append(f"N = {count!r} recorded, but the output array {name} holds "
                        f"{node.shape[0] if node.ndim else 0:,} matrices (shape {tuple(node.shape)})")
        elif _stored_along_n(node) != chunk:
            said.append(f"plan.chunk = {chunk!r} recorded, but the output array {name} is stored in "
                        f"chunks of {_stored_along_n(node):,} matrices")
    if len(arrays) == len(op_outputs(op)) and not said:
        first = arrays[op_outputs(op)[0]]
        k = first.shape[2] if OP_TABLE[op].needs_rhs and first.ndim == 3 else None  # x (N, n, k)
        for spec in output_specs(op, n, "float64", "float64", k):
            shape = tuple(arrays[spec.name].shape)
            if shape[1:] != spec.tail:
                said.append(f"n = {n!r} recorded, but the output array {spec.name} has shape {shape}, "
                            f"where op {op} at n = {n} writes {(count,) + spec.tail}")
    if not _ledger.exists(group):
        said.append("the output holds no completion records (_complete)")
    elif not said:
        records = group[_ledger.NAME].shape[0]
        if records != math.ceil(count / chunk):
            said.append(f"N = {count:,} and plan.chunk = {chunk:,} recorded (chunks "
                        f"{math.ceil(count / chunk):,}), but the ledger holds {records:,} completion records")
    return said


def check_input(record: dict, out_path: str, group: zarr.Group, info_a, rhs_info, n_stored: int) -> None:
    """``input``, ``dtype``, ``N`` and ``n`` against the input verify reads (``info_a``, an
    :class:`batchlu.pipeline.store._arrays.ArrayInfo`; ``n_stored`` the order of its matrices: the dense
    input's ``shape[1]``, the sparse pattern's n), ``rhs`` against ``rhs_info``; then each output
    array's shape and dtype against what ``op`` writes for these inputs."""
    op, count, n = record["op"], record["N"], record["n"]
    recorded = record["input"]
    if list(info_a.shape) != list(recorded["shape"]) or str(info_a.dtype) != recorded["dtype"]:
        raise InputError(f"Expected an input of shape {tuple(recorded['shape'])} and dtype "
                         f"{recorded['dtype']}, as recorded in {out_path} (input.shape, input.dtype). Got "
                         f"{info_a.ref}: shape {info_a.shape}, dtype {info_a.dtype} instead.")
    if record["dtype"] != str(info_a.dtype):
        raise edited(out_path, f"dtype = {record['dtype']!r} recorded, but the input {info_a.ref} is "
                               f"{info_a.dtype}")
    if info_a.shape[0] != count:
        raise edited(out_path, f"N = {count:,} recorded, but the input {info_a.ref} holds "
                               f"{info_a.shape[0]:,} matrices")
    if n_stored != n:
        raise edited(out_path, f"n = {n!r} recorded, but the input {info_a.ref} holds matrices of order "
                               f"{n_stored}")
    k = None
    if rhs_info is not None:
        rec = record["rhs"]
        if list(rhs_info.shape) != list(rec["shape"]) or str(rhs_info.dtype) != rec["dtype"]:
            raise InputError(f"Expected a right-hand side of shape {tuple(rec['shape'])} and dtype "
                             f"{rec['dtype']}, as recorded in {out_path} (rhs.shape, rhs.dtype). Got "
                             f"{rhs_info.ref}: shape {rhs_info.shape}, dtype {rhs_info.dtype} instead.")
        if len(rhs_info.shape) not in (2, 3) or tuple(rhs_info.shape[:2]) != (count, n):
            raise edited(out_path, f"N = {count:,} and n = {n} recorded, but the right-hand side "
                                   f"{rhs_info.ref} has shape {rhs_info.shape}")
        k = rhs_info.shape[2] if len(rhs_info.shape) == 3 else None
    for spec in output_specs(op, n, info_a.dtype, rhs_info.dtype if rhs_info is not None else None, k):
        array = group[spec.name]
        want = ((count,) + spec.tail, np.dtype(spec.dtype))
        if (tuple(array.shape), np.dtype(array.dtype)) != want:
            raise edited(out_path, f"op = {op!r} recorded, but the output array {spec.name} has shape "
                                   f"{tuple(array.shape)} and dtype {array.dtype}, where op {op} of these "
                                   f"inputs writes shape {want[0]} and dtype {want[1]}")
