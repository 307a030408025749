"""The batch loop: a task's batches read -> compute -> write -> record, the three stages overlapping.

    reader thread   read batch i+1 from Zarr into slot (i+1) % 2 (zarr decodes its chunks in threads)
    this thread     batch i: the engine computes slot i % 2 in place (on the GPU: copy in, kernels,
                    copy back, on the thread's own CUDA stream)
    writer thread   write batch i-1 from slot (i-1) % 2 to Zarr, then record its chunks complete
                    (each only while the output's lock still names the run: :func:`fence`)

The slots are a pair borrowed from the engine's pool (:mod:`batchlu.pipeline._buffers`); the engine
(:mod:`batchlu.pipeline._engines`) is the only thing CPU and GPU do differently.

With I/O processes (``batchlu.io-processes``, on by default on GPU workers), the reader and writer
threads only send requests: the worker's :class:`batchlu.pipeline._io_pool.IOPool` children decode the input
chunks straight into the slot (shared memory, page-locked on the GPU) and encode the outputs straight
from it, so that Zarr's CPU work is spread over several processes while this process keeps one GPU,
its streams and the bookkeeping (the chunks are recorded complete here, after every write returned).
Either way, the reader thread first asks the store whether every chunk of the batch is there
(:mod:`batchlu.pipeline._missing`), so a missing chunk is caught before any process reads it as
the fill value.

A task that covers one output chunk is one batch; then reading, computing and writing overlap across
the worker's tasks in flight (its threads), each on its own CUDA stream. A task of several chunks
also overlaps them inside itself (:func:`sub_batches`).

The batch is cut into pieces that fit the engine's device memory; an out-of-memory error on a piece
releases the engine's cached memory, halves the piece and retries, down to one matrix.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import _io_pool, _ops
from ._buffers import Slot, layout_for, shared

__all__ = ["BatchIO", "PathStats", "fence", "input_bytes", "pool_read", "pool_write", "run_batches", "split_requests", "sub_batches"]


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
    """Where a task reads and writes: open Zarr arrays plus the completion hook.

    ``on_read(start, stop, a, b, missing)`` is called (in the reader thread) once the inputs of
    matrices ``[start, stop)`` are in the slot (``a``, ``b``), before they are computed (the pipeline
    takes their checksums there; ``missing`` is what ``missing`` returned); ``mark(start, stop)``
    is called (in the writer thread, in order) once every output of those matrices is written;
    ``read_error(array, start, stop, exc)`` turns a failed read into a clear error (e.g. naming the
    corrupt chunk file).
    ``missing(start, stop)`` runs (in the reader
    thread) before each read, whether this process or an I/O process then reads: it raises on a
    chunk missing from the store, or returns the mask of matrices whose outputs get ``info`` -3
    (:meth:`batchlu.pipeline._tasks.TaskIO.missing`), or None.
    ``fence()`` runs (in the writer thread) before a batch's outputs are written and again before
    they are recorded complete: it raises (:class:`batchlu.pipeline.errors.FencedError`) once
    another run took the output, and the task then writes nothing more (:func:`fence`).

    With ``pool`` (a :class:`batchlu.pipeline._io_pool.IOPool`), the reads and writes run in its I/O
    processes, straight between the Zarr stores and the slot buffers; ``where`` then gives the
    ``(store, array path)`` of ``"a"``, ``"b"`` and of every output. The arrays above still give the
    shapes and dtypes, and the in-process fallback when a slot is not in shared memory.
    """

    source: object
    rhs: object | None
    outputs: dict[str, object]
    mark: object = None
    read_error: object = None
    pool: object = None
    where: dict | None = None
    missing: object = None
    on_read: object = None
    fence: object = None


def fence(io: BatchIO) -> None:
    """The fence of both batch loops: call before every write of a batch's outputs and before every
    record of its chunks (raises if the output is no longer the run's; see :class:`BatchIO`)."""
    if io.fence is not None:
        io.fence()


@dataclasses.dataclass
class PathStats(_ops.InfoTally):
    matrices: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    pieces: int = 0          # kernel launches (batch pieces) run
    oom_splits: int = 0      # pieces halved after an out-of-memory error
    read_s: float = 0.0
    compute_s: float = 0.0
    write_s: float = 0.0
    wall_s: float = 0.0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)



def _read_into(array, start: int, stop: int, out: np.ndarray, read_error) -> None:
    """``out[:] = array[start:stop]``, decoded by zarr straight into ``out`` where zarr allows it."""
    try:
        _io_pool.read_into(array, start, stop, out)
    except Exception as exc:
        if read_error is not None:
            read_error(array, start, stop, exc)
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
    """Read matrices ``[start, stop)`` of each ``(array, (store, path), out)`` of ``jobs`` through the
    I/O processes, each input cut by :func:`split_requests` into ``parts`` requests, all sent at
    once; a failed read goes through ``read_error`` (which re-reads here to name the corrupt chunk
    file). ``meanwhile()`` runs while they are read (see :func:`_pool_requests`); returns its value."""
    calls, owners = [], []
    for array, where, out in jobs:
        for lo, hi in split_requests(array, start, stop, parts):
            calls.append(lambda w=where, o=out[lo - start:hi - start], lo=lo, hi=hi: io.pool.read(*w, lo, hi, o))
            owners.append(array)
    failures, value = _pool_requests(calls, meanwhile)
    if failures:
        index, exc = failures[0]
        if io.read_error is not None and not isinstance(exc, _io_pool.IOProcessError):
            io.read_error(owners[index], start, stop, exc)
        raise exc
    return value


def _pool_read(io: BatchIO, start: int, stop: int, slot: Slot, meanwhile=None):
    """Both inputs of a batch read by the I/O processes at once (:func:`pool_read`, returning what
    ``meanwhile()`` returned), a request each: the worker's many tasks in flight keep the processes
    busy."""
    return pool_read(io, [(io.source, io.where["a"], slot.a)] + ([] if slot.b is None else [(io.rhs, io.where["b"], slot.b)]),
              start, stop, meanwhile=meanwhile)


def pool_write(io: BatchIO, names: list[str], start: int, stop: int, values: dict, parts: int = 1) -> None:
    """Write matrices ``[start, stop)`` of the outputs ``names`` from ``values`` through the I/O
    processes, each cut by :func:`split_requests` (at shard ends) into ``parts`` requests, all sent
    at once."""
    failures, _ = _pool_requests([
        lambda w=io.where[name], o=values[name][lo - start:hi - start], lo=lo, hi=hi: io.pool.write(*w, lo, hi, o)
        for name in names for lo, hi in split_requests(io.outputs[name], start, stop, parts, writing=True)])
    if failures:
        raise failures[0][1]


def _pool_write(io: BatchIO, start: int, stop: int, slot: Slot) -> None:
    pool_write(io, list(slot.outs), start, stop, slot.outs)


def _compute(engine, op: str, slot: Slot, piece: int, stats: PathStats) -> int:
    """Run ``slot`` in pieces of at most ``piece`` matrices; halve a piece on out-of-memory.

    Returns the piece size that worked, so that the next batch starts from it.
    """
    m = slot.a.shape[0]
    start = 0
    while start < m:
        size = min(piece, m - start)
        part = Slot(slot.a[start:start + size], None if slot.b is None else slot.b[start:start + size],
                    {k: v[start:start + size] for k, v in slot.outs.items()})
        try:
            engine.run(op, part)
        except engine.oom_errors:
            if size == 1:
                raise
            engine.release()
            piece = max(1, size // 2)
            stats.oom_splits += 1
            continue
        stats.pieces += 1
        start += size
    return piece


def run_batches(engine, op: str, io: BatchIO, batches: list[tuple[int, int]], *,
                delay: float = 0.0) -> PathStats:
    """Run ``op`` over matrix ranges ``batches`` (each a whole number of output chunks or shards).

    Reads, compute and writes overlap as described in the module docstring. Returns the counts
    of the ``info`` values written, the bytes moved and the time each stage took. ``delay`` sleeps
    before each batch (``batchlu-testing.task-delay``: only for tests that interrupt a run).
    """
    stats = PathStats()
    if not batches:
        return stats
    t_start = time.perf_counter()
    layout = layout_for(op, io.source, io.rhs, io.outputs)
    largest = max(stop - start for start, stop in batches)
    with engine.pool.borrow(layout, largest) as slots:
        _run(engine, op, io, batches, largest, slots, stats, delay)
    stats.wall_s = time.perf_counter() - t_start
    return stats


def _run(engine, op, io, batches, largest, slots, stats, delay) -> None:
    layout = layout_for(op, io.source, io.rhs, io.outputs)
    fit = engine.device_fit(layout.bytes_per_matrix() * 2)
    piece = largest if fit is None else max(1, min(largest, fit))
    lock = threading.Lock()
    pooled = io.pool is not None and all(shared(slot) for slot in slots)

    def read(index: int):
        """Read batch ``index`` into its slot; returns the mask of matrices in missing chunks, or None."""
        start, stop = batches[index]
        slot = slots[index % 2].view(stop - start)
        t = time.perf_counter()
        if pooled:
            # the store is asked while the I/O processes read: the answer comes before the values
            # are used (a missing chunk reads as the fill value, and is failed or marked below)
            gaps = _pool_read(io, start, stop, slot, None if io.missing is None else lambda: io.missing(start, stop))
        else:
            gaps = io.missing(start, stop) if io.missing is not None else None
            _read_into(io.source, start, stop, slot.a, io.read_error)
            if io.rhs is not None:
                _read_into(io.rhs, start, stop, slot.b, io.read_error)
        if io.on_read is not None:
            io.on_read(start, stop, slot.a, slot.b, gaps)
        with lock:
            stats.read_s += time.perf_counter() - t
            stats.bytes_in += slot.a.nbytes + (0 if slot.b is None else slot.b.nbytes)
        return gaps

    def write(index: int) -> None:
        start, stop = batches[index]
        slot = slots[index % 2].view(stop - start)
        t = time.perf_counter()
        fence(io)
        if pooled:
            _pool_write(io, start, stop, slot)
        else:
            for name, out in slot.outs.items():
                io.outputs[name][start:stop] = out
        if io.mark is not None:
            fence(io)
            io.mark(start, stop)
        with lock:
            stats.write_s += time.perf_counter() - t
            stats.bytes_out += sum(v.nbytes for v in slot.outs.values())

    with ThreadPoolExecutor(1, thread_name_prefix="batchlu-read") as reader, \
            ThreadPoolExecutor(1, thread_name_prefix="batchlu-write") as writer:
        pending_read = reader.submit(read, 0)
        writes: deque = deque()
        try:
            for i, (start, stop) in enumerate(batches):
                gaps = pending_read.result()
                # slot (i + 1) % 2's input was consumed by batch i - 1's compute: refill it now
                if i + 1 < len(batches):
                    pending_read = reader.submit(read, i + 1)
                # slot i % 2's outputs were last used by batch i - 2's write: wait for that one
                while writes and writes[0][0] <= i - 2:
                    writes.popleft()[1].result()
                slot = slots[i % 2].view(stop - start)
                if delay:
                    time.sleep(delay)
                t = time.perf_counter()
                piece = _compute(engine, op, slot, piece, stats)
                if gaps is not None:   # batchlu.missing-chunks: fill
                    _ops.mark_missing(slot.outs, gaps)
                stats.compute_s += time.perf_counter() - t
                stats.matrices += stop - start
                if "info" in slot.outs:
                    stats.add_info(slot.outs["info"])
                writes.append((i, writer.submit(write, i)))
            while writes:
                writes.popleft()[1].result()
        finally:
            # on an error, let the reads and writes in flight finish (what is written is marked
            # complete only if the write got that far), then re-raise
            pending_read.cancel()
            for _, future in writes:
                future.cancel()
