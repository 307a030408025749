"""The host path's stages of the batch loop (:mod:`batchlu.pipeline.worker._loop`): a unit is one batch, read
into one of a pair of host slots, computed there in place, written from there.

    read      the chunks the batch needs looked up in the store (:mod:`batchlu.pipeline.store._missing`),
              then the input (and right-hand side) decoded into the slot, and each output chunk's
              input digest taken (:mod:`batchlu.pipeline.output._fingerprint`)
    compute   the engine on the slot (on the GPU: copy in, kernels, copy back, on the thread's own
              CUDA stream), in pieces that fit its memory
    write     every output from the slot to Zarr

The slots are a pair borrowed from the engine's pool (:mod:`batchlu.pipeline.worker._buffers`); the engine
(:mod:`batchlu.pipeline.worker._engines`) is the only thing CPU and GPU do differently.

With I/O processes (``batchlu.io-processes``, on by default on GPU workers), the read and write
stages only send requests: the worker's :class:`batchlu.pipeline.worker._io_pool.IOPool` children decode the input
chunks straight into the slot (shared memory, page-locked on the GPU) and encode the outputs straight
from it, so that Zarr's CPU work is spread over several processes while this process keeps one GPU,
its streams and the bookkeeping (the chunks are recorded complete here, after every write returned).
Either way, the store is asked whether every chunk of the batch is there, so a missing chunk is
caught before its matrices are used as the fill value.

A task that covers one output chunk is one batch; then reading, computing and writing overlap across
the worker's tasks in flight (its threads), each on its own CUDA stream. A task of several chunks
also overlaps them inside itself (:func:`sub_batches`).

The batch is cut into pieces that fit the engine's device memory; an out-of-memory error on a piece
releases the engine's cached memory, halves the piece and retries, down to one matrix.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from .. import _ops
from ..codecs import _host
from ..output import _fingerprint
from ..store import _arrays
from ..store._object_store import join
from . import _io_pool
from ._buffers import Slot, layout_for, shared
from ._loop import PathStats, Record, Stages, Unit, run_loop

__all__ = ["BatchIO", "input_bytes", "pool_read", "pool_write", "run_batches", "split_requests", "sub_batches"]


def input_bytes(source, rhs=None) -> int:
    """Bytes of one matrix of ``source`` with its right-hand side in ``rhs`` (arrays of any kind with
    ``shape`` and ``dtype``; ``rhs`` None: none)."""
    return sum(int(np.prod(x.shape[1:], dtype=np.int64)) * np.dtype(x.dtype).itemsize
               for x in (source, rhs) if x is not None)


def sub_batches(plan, c0: int, c1: int) -> list[tuple[int, int]]:
    """Chunk ranges of a task's batches: whole output chunks, at most ``plan.batch`` matrices each,
    and at least two batches when the task has two chunks or more, so that reading, computing and
    writing overlap inside the task as well as across the worker's tasks."""
    per = max(1, plan.batch // plan.chunk)
    if c1 - c0 >= 2:
        per = min(per, -(-(c1 - c0) // 2))
    return [(b, min(b + per, c1)) for b in range(c0, c1, per)]



@dataclasses.dataclass
class BatchIO:
    """Where a task reads and writes, and what its read stage takes: open Zarr arrays for the input
    ``source``, the right-hand side ``rhs`` (or None) and each output.

    ``lookup(start, stop, found=None)`` asks the store for the chunks matrices ``[start, stop)`` need
    (:meth:`batchlu.pipeline.worker._task_io.TaskIO.missing`): it raises on a missing one, or returns the mask of
    matrices whose outputs get ``info`` -3, or None. ``digest_chunk`` (the output's chunk) has the
    read stage take each output chunk's input digest for the ledger (None: none).

    ``where`` gives the ``(store, array path)`` of ``"a"``, ``"b"`` and of every output: a chunk
    that fails to read is named by its file there (:func:`batchlu.pipeline.store._arrays.unreadable`).
    With ``pool`` (a :class:`batchlu.pipeline.worker._io_pool.IOPool`) too, the reads and writes run in its
    I/O processes, straight between the Zarr stores and the slot buffers; the arrays above still give
    the shapes and dtypes, and the in-process fallback when a slot is not in shared memory.
    """

    source: object
    rhs: object | None
    outputs: dict[str, object]
    pool: object = None
    where: dict | None = None
    lookup: object = None
    digest_chunk: int | None = None
    frames: dict = dataclasses.field(default_factory=dict)   # name -> Stored: read or written by codecs._host

    def array(self, name: str):
        """The array ``name``: ``"a"``, ``"b"`` or an output's name."""
        return self.source if name == "a" else self.rhs if name == "b" else self.outputs[name]

    def unreadable(self, name: str, start: int, stop: int, exc: BaseException) -> None:
        """Raise :class:`batchlu.pipeline.errors.CorruptInputError` naming the chunk file of
        ``name`` that fails among matrices ``[start, stop)`` (re-read here one by one), where
        ``where`` names its store; else return (the caller raises ``exc``)."""
        if self.where and name in self.where:
            raise _arrays.unreadable(self.array(name), np.arange(start, stop), join(*self.where[name]),
                                    exc) from None


def read_into(io: BatchIO, name: str, start: int, stop: int, out: np.ndarray) -> None:
    """``out[:] = array[start:stop]`` of input ``name``: from its chunk files by
    :mod:`batchlu.pipeline.codecs._host` where ``io.frames`` lists it, else (or where that path
    declines) decoded by zarr straight into ``out`` where zarr allows it; a chunk that fails is
    named (:meth:`BatchIO.unreadable`)."""
    stored = io.frames.get(name)
    if stored is not None and _host.read(stored, start, stop, out):
        return
    try:
        _io_pool.read_into(io.array(name), start, stop, out)
    except Exception as exc:
        io.unreadable(name, start, stop, exc)
        raise



def _pool_requests(calls, meanwhile=None) -> tuple[list[tuple[int, BaseException]], object]:
    """Send the I/O requests ``calls`` (each returns a future) at once, run ``meanwhile()`` (if given)
    while the processes work, and wait for all of them (their buffers are about to be reused), even
    when ``meanwhile`` raises. A request whose I/O process died is sent once more, to its
    replacement: reads and writes of whole chunks can be repeated. Returns the failures and what
    ``meanwhile`` returned (None without it)."""
    futures = [call() for call in calls]
    try:
        value = meanwhile() if meanwhile is not None else None
    finally:
        failures = _wait_requests(calls, futures)
    return failures, value


def _wait_requests(calls, futures) -> list[tuple[int, BaseException]]:
    failures = []
    for i, future in enumerate(futures):
        try:
            future.result()
        except _io_pool.IOProcessError:
            try:
                calls[i]().result()
            except BaseException as exc:
                failures.append((i, exc))
        except BaseException as exc:
            failures.append((i, exc))
    return failures


def split_requests(array, start: int, stop: int, parts: int, writing: bool = False) -> list[tuple[int, int]]:
    """Matrices ``[start, stop)`` of ``array`` as at most ``parts`` ranges of about as many of its
    stored objects each, cut only where one ends (a chunk; for ``writing``, a shard), so that no two
    requests decode, or write, the same object: one request per range, so that a batch's reads and
    writes spread over the I/O processes instead of queueing in one of them."""
    unit = (getattr(array, "shards", None) if writing else None) or getattr(array, "chunks", None)
    step = int(unit[0]) if unit else stop - start
    cuts = list(range((start // step + 1) * step, stop, step)) if step > 0 else []
    parts = max(1, min(int(parts), len(cuts) + 1))
    bounds = [start] + [cuts[(2 * i * (len(cuts) + 1) + parts) // (2 * parts) - 1] for i in range(1, parts)] + [stop]
    return list(zip(bounds[:-1], bounds[1:]))


def pool_read(io: BatchIO, jobs: list, start: int, stop: int, parts: int = 1, meanwhile=None):
    """Read matrices ``[start, stop)`` of each ``(name, out)`` of ``jobs`` (``"a"`` or ``"b"``)
    through the I/O processes, each input cut by :func:`split_requests` into ``parts`` requests, all
    sent at once; a failed read re-reads here to name the corrupt chunk file
    (:meth:`BatchIO.unreadable`). ``meanwhile()`` runs while they are read (see
    :func:`_pool_requests`); returns its value."""
    calls, owners = [], []
    for name, out in jobs:
        for lo, hi in split_requests(io.array(name), start, stop, parts):
            calls.append(lambda w=io.where[name], o=out[lo - start:hi - start], lo=lo, hi=hi: io.pool.read(*w, lo, hi, o))
            owners.append(name)
    failures, value = _pool_requests(calls, meanwhile)
    if failures:
        index, exc = failures[0]
        if not isinstance(exc, _io_pool.IOProcessError):
            io.unreadable(owners[index], start, stop, exc)
        raise exc
    return value


def pool_write(io: BatchIO, names: list[str], start: int, stop: int, values: dict, parts: int = 1) -> None:
    """Write matrices ``[start, stop)`` of the outputs ``names`` from ``values`` through the I/O
    processes, each cut by :func:`split_requests` (at shard ends) into ``parts`` requests, all sent
    at once."""
    failures, _ = _pool_requests([
        lambda w=io.where[name], o=values[name][lo - start:hi - start], lo=lo, hi=hi: io.pool.write(*w, lo, hi, o)
        for name in names for lo, hi in split_requests(io.outputs[name], start, stop, parts, writing=True)])
    if failures:
        raise failures[0][1]


class HostRead:
    """The read stage: batch ``unit`` into its slot (``slots[unit.index % 2]``), its gaps looked up
    and its chunks' input digests taken (see the module docstring)."""

    def __init__(self, io: BatchIO, slots):
        self.io = io
        self.slots = slots
        self.pooled = io.pool is not None and all(shared(slot) for slot in slots)

    def __call__(self, unit: Unit) -> None:
        io, start, stop = self.io, unit.start, unit.stop
        slot = self.slots[unit.index % 2].view(stop - start)
        lookup = None if io.lookup is None else (lambda: io.lookup(start, stop))
        if self.pooled:
            # the store is asked while the I/O processes read: the answer comes before the values
            # are used (a missing chunk reads as the fill value, and is failed or marked later)
            jobs = [("a", slot.a)] + ([] if slot.b is None else [("b", slot.b)])
            unit.gaps = pool_read(io, jobs, start, stop, meanwhile=lookup)
        else:
            unit.gaps = lookup() if lookup is not None else None
            read_into(io, "a", start, stop, slot.a)
            if slot.b is not None:
                read_into(io, "b", start, stop, slot.b)
        if io.digest_chunk is not None:
            unit.digests = _fingerprint.chunk_digests(io.digest_chunk, start, stop, slot.a, slot.b, unit.gaps)
        unit.inputs = (slot.a, slot.b)
        unit.bytes_in = slot.a.nbytes + (0 if slot.b is None else slot.b.nbytes)


class HostCompute:
    """The compute stage: the engine on the unit's slot in place, in pieces that fit its memory (a
    piece halved on out-of-memory, the next batch starting from the size that worked); the matrices
    of missing chunks then marked (``missing-chunks: fill``)."""

    def __init__(self, engine, op, slots, piece: int, stats: PathStats):
        self.engine, self.op, self.slots, self.piece, self.stats = engine, op, slots, piece, stats

    def __call__(self, unit: Unit) -> None:
        slot = self.slots[unit.index % 2].view(unit.stop - unit.start)
        m, start = slot.a.shape[0], 0
        while start < m:
            size = min(self.piece, m - start)
            part = Slot(slot.a[start:start + size], None if slot.b is None else slot.b[start:start + size],
                        {k: v[start:start + size] for k, v in slot.outs.items()})
            try:
                self.engine.run(self.op, part)
            except self.engine.oom_errors:
                if size == 1:
                    raise
                self.engine.release()
                self.piece = max(1, size // 2)
                self.stats.oom_splits += 1
                continue
            self.stats.pieces += 1
            start += size
        if unit.gaps is not None:
            _ops.mark_missing(slot.outs, unit.gaps)
        unit.outputs = slot.outs
        unit.info = slot.outs.get("info")


class HostWrite:
    """The write stage: every output of the unit from its slot to Zarr (by the I/O processes where
    the slot is in shared memory), fenced first (:meth:`batchlu.pipeline.worker._loop.Record.check`)."""

    def __init__(self, io: BatchIO, pooled: bool, record: Record):
        self.io, self.pooled, self.record = io, pooled, record

    def __call__(self, unit: Unit) -> None:
        self.record.check()
        if self.pooled:
            pool_write(self.io, list(unit.outputs), unit.start, unit.stop, unit.outputs)
        else:
            for name, out in unit.outputs.items():
                array, stored = self.io.outputs[name], self.io.frames.get(name)
                if stored is None or not _host.write(stored, unit.start, unit.stop, out, array.fill_value):
                    array[unit.start:unit.stop] = out


def run_batches(engine, op: str, io: BatchIO, batches: list[tuple[int, int]], *, record: Record | None = None,
                delay: float = 0.0) -> PathStats:
    """Run ``op`` over matrix ranges ``batches`` (each a whole number of output chunks or shards)
    on the host path's stages, recording each complete through ``record`` (None: nothing recorded).

    Returns the counts of the ``info`` values written, the bytes moved and the time each stage
    took. ``delay`` sleeps before each batch (``batchlu-testing.task-delay``: only for tests that
    interrupt a run).
    """
    stats = PathStats()
    if not batches:
        return stats
    t_start = time.perf_counter()
    record = record or Record()
    layout = layout_for(op, io.source, io.rhs, io.outputs)
    largest = max(stop - start for start, stop in batches)
    fit = engine.device_fit(layout.bytes_per_matrix() * 2)
    piece = largest if fit is None else max(1, min(largest, fit))
    with engine.pool.borrow(layout, largest) as slots:
        read = HostRead(io, slots)
        stages = Stages(read, HostCompute(engine, op, slots, piece, stats), HostWrite(io, read.pooled, record), record)
        run_loop(stages, [[batch] for batch in batches], stats, delay)
    stats.wall_s = time.perf_counter() - t_start
    return stats
