"""Cut N matrices into tasks: whole output chunks per task, chunks and batches sized in bytes, and a
bounded number of tasks however large N is.

Vocabulary: the output is chunked along N in ``chunk`` matrices; chunk ``c`` holds matrices
``[c * chunk, min((c + 1) * chunk, N))``. A task covers a run of whole chunks, so no two tasks ever
write the same chunk; inside a task, matrices go through in batches of ``batch`` (a multiple of
``chunk``) so that memory stays within the budget whatever the task's length.

Sizing in bytes: every chunk costs the same fixed work whatever it holds (a task, a missing-chunk
look-up, a file per output array, two ledger records, a CRC), so a chunk of a few hundred kilobytes
moves far fewer GB/s than one of tens of megabytes. The output chunk is therefore whole input
chunks (or shards), as many as fit in ``batchlu.chunk-bytes`` of input and in the memory budget:
an input written with small chunks (``--chunk 256`` at n = 8 is 128 KiB) is read and written in
chunks of about the same bytes as one written with large ones, whatever n is. Merging stops where
it would leave fewer than :data:`MIN_CHUNKS` chunks, so that a short job still has a task for every
worker thread. Input chunks are never split unless one does not fit the memory budget (a task that
reads part of a chunk decodes all of it).

Determinism: ``batch == chunk``, so every kernels call covers exactly one output chunk, whatever
the tasks are. The CPU backend's results for complex dtypes depend on the batch's size and
composition in the last bit (NumPy's SIMD and scalar loops round complex products differently), so
a chunk computed inside a larger batch would differ from the same chunk recomputed alone on resume.
The batch loop cuts a task into its batches (:func:`batchlu.pipeline.worker._batches.sub_batches`).

A matrix larger than the budget (n = 4096 complex128 takes 1 GiB for ``inv`` with its workspace,
against the default 256 MiB) still runs, one matrix per batch: :func:`budget_warning` says so, with
the budget that would hold it.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

WORKSPACE_FACTOR = 2  # the kernels' copies and workspace, relative to input + output bytes
MIN_CHUNKS = 64       # merging small input chunks stops short of leaving fewer output chunks than this


@dataclasses.dataclass(frozen=True)
class Plan:
    count: int            # N
    chunk: int            # output chunk length along N
    batch: int            # matrices per batch inside a task; a multiple of chunk
    chunks_per_task: int  # task grid: task t covers chunks [t * chunks_per_task, ...)

    @property
    def n_chunks(self) -> int:
        return math.ceil(self.count / self.chunk) if self.count else 0

    def chunk_range(self, c0: int, c1: int) -> tuple[int, int]:
        """Matrix index range covered by chunks ``[c0, c1)``."""
        return c0 * self.chunk, min(c1 * self.chunk, self.count)

    def tasks(self, complete: np.ndarray | None = None) -> list[tuple[int, int]]:
        """Chunk ranges ``(c0, c1)`` still to do: runs of incomplete chunks, cut at the task grid.

        ``complete`` is a bool per chunk (the ledger). After an interrupted run, each task of the
        grid is done, untouched, or done up to some batch, so the count stays near the grid's.
        """
        todo = np.ones(self.n_chunks, bool) if complete is None else ~np.asarray(complete, bool)
        ranges = []
        for g0 in range(0, self.n_chunks, self.chunks_per_task):
            g1 = min(g0 + self.chunks_per_task, self.n_chunks)
            cell = todo[g0:g1]
            if not cell.any():
                continue
            edges = np.flatnonzero(np.diff(np.concatenate(([0], cell.view(np.int8), [0]))))
            ranges.extend((g0 + int(a), g0 + int(b)) for a, b in zip(edges[::2], edges[1::2]))
        return ranges

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "n_chunks": self.n_chunks}


def bytes_per_matrix(n: int, in_itemsize: int, out_bytes: int, rhs_bytes: int = 0) -> int:
    """Memory one matrix needs inside a task: input, right-hand side and outputs, with workspace."""
    return WORKSPACE_FACTOR * (n * n * in_itemsize + rhs_bytes + out_bytes)


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"


def budget_warning(plan: Plan, per_matrix: int, memory_budget: int) -> str | None:
    """A one-line warning where one batch of ``plan`` needs more than ``memory_budget`` (one matrix of
    ``per_matrix`` bytes already does, or an explicit ``chunk`` asks for more); None where it fits."""
    need = plan.batch * per_matrix
    if not plan.count or need <= memory_budget:
        return None
    if plan.batch == 1:
        return (f"memory-budget {_size(memory_budget)} is smaller than one matrix with its outputs and "
                f"workspace ({_size(per_matrix)}): running one matrix per batch, about {_size(per_matrix)} "
                f"each; set memory-budget to at least {_size(per_matrix)} to plan within it.")
    return (f"chunk {plan.chunk} needs about {_size(need)} per batch ({_size(per_matrix)} per matrix with "
            f"outputs and workspace), more than memory-budget {_size(memory_budget)}; running batches of "
            f"{plan.batch} matrices as the chunk asks.")


def make_plan(count: int, per_matrix: int, *, memory_budget: int, max_tasks: int,
              input_chunk: int, chunk: int | None = None, matrix_bytes: int = 0, chunk_bytes: int = 0,
              input_inner: int | None = None) -> Plan:
    """Choose the output chunk, the batch and the task grid.

    * ``chunk``: as given, else whole input chunks of ``input_chunk`` matrices (the input's read
      unit: its chunk, or its shard), as many as fit both ``chunk_bytes`` bytes of input
      (``matrix_bytes`` per matrix: matrix and right-hand side) and the memory budget, while at least
      :data:`MIN_CHUNKS` chunks remain (see the module docstring). An input chunk larger than the
      budget allows is cut: into whole inner chunks of ``input_inner`` matrices for a sharded input,
      else to what fits;
    * ``batch``: one chunk (see the module docstring);
    * tasks: one batch each, or more when that would exceed ``max_tasks``.
    """
    fit = max(1, memory_budget // max(1, per_matrix))
    if chunk is None:
        chunk = _chunk(count, fit, input_chunk, matrix_bytes, chunk_bytes, input_inner)
    batch = chunk
    n_chunks = math.ceil(count / chunk) if count else 0
    chunks_per_task = batch // chunk
    if n_chunks and math.ceil(n_chunks / chunks_per_task) > max_tasks:
        chunks_per_task = math.ceil(n_chunks / max_tasks)
    return Plan(count=count, chunk=chunk, batch=batch, chunks_per_task=chunks_per_task)


def _chunk(count: int, fit: int, unit: int, matrix_bytes: int, target: int, inner: int | None) -> int:
    """The output chunk (matrices) :func:`make_plan` picks when none is given."""
    unit = max(1, int(unit))
    if unit > fit:  # one input chunk exceeds the budget: cut it, at inner chunks where there are some
        inner = int(inner or 0)
        chunk = fit // inner * inner if 0 < inner <= fit else fit
    else:
        units = math.ceil(count / unit) if count else 0
        merge = min(fit // unit, units // MIN_CHUNKS,
                    int(target) // max(1, unit * int(matrix_bytes)) if matrix_bytes and target else 1)
        chunk = unit * max(1, merge)
    return max(1, min(chunk, count or 1))


def merge_tasks(tasks: list[tuple[int, int]], parts: int) -> list[tuple[int, int]]:
    """Chunk ranges ``tasks`` (from :meth:`Plan.tasks`) merged into about ``parts`` longer ones, of
    about equal chunk counts, joining only ranges that touch. The GPU codec path wants a few long tasks
    per worker thread: its batch loop decodes many chunks per nvCOMP call and overlaps the reading,
    computing and writing of consecutive batches, which a one-chunk task cannot. The host path on GPU
    workers merges to a few tasks per thread for the same overlap."""
    total = sum(c1 - c0 for c0, c1 in tasks)
    if not tasks or parts < 1:
        return list(tasks)
    size = max(1, math.ceil(total / parts))
    merged: list[tuple[int, int]] = []
    for c0, c1 in tasks:
        while c0 < c1:
            if merged and merged[-1][1] == c0 and merged[-1][1] - merged[-1][0] < size:
                m0 = merged.pop()[0]
            else:
                m0 = c0
            end = min(c1, m0 + size)
            merged.append((m0, end))
            c0 = end
    return merged
