"""The data path inside one worker: Zarr -> (pinned) host buffers -> GPU -> host buffers -> Zarr.

A task's batches go through three stages that run at the same time (double-buffering):

    reader thread   read batch i+1 from Zarr into slot (i+1) % 2 (zarr decodes its chunks in threads)
    this thread     batch i: copy to the GPU on the task's stream, run kernels, copy back into slot i % 2
    writer thread   write batch i-1 from slot (i-1) % 2 to Zarr, then record its chunks complete

Each slot holds the input (and right-hand side) buffers and one buffer per output array, sized for
the largest batch; on the GPU they are pinned (page-locked) so that copies run asynchronously. A
task borrows a pair of slots from the worker's :class:`SlotPool` and gives it back, so the pinned
memory is allocated once per worker thread and reused by every later task (and run).

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
also overlaps them inside itself.

On the GPU, the batch is cut into pieces that fit the free device memory; a CUDA out-of-memory
error on a piece frees CuPy's cached blocks, halves the piece and retries, down to one matrix.

The same loop runs on the CPU (:class:`HostEngine`: NumPy buffers, SciPy/LAPACK kernels), so CI
exercises everything but the copies. CuPy is imported only inside :class:`CudaEngine`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import _fingerprint, _io_pool, _ops

logger = logging.getLogger("batchlu.path")

__all__ = ["BatchIO", "CudaEngine", "HostEngine", "PathStats", "SlotPool", "run_batches"]


# --------------------------------------------------------------------------------------------- buffers
@dataclasses.dataclass
class Slot:
    """One set of host buffers: input ``a``, optional right-hand side ``b``, one per output."""

    a: np.ndarray
    b: np.ndarray | None
    outs: dict[str, np.ndarray]

    def view(self, m: int) -> Slot:
        return Slot(self.a[:m], None if self.b is None else self.b[:m],
                    {k: v[:m] for k, v in self.outs.items()})

    @property
    def nbytes(self) -> int:
        return self.a.nbytes + (0 if self.b is None else self.b.nbytes) + sum(v.nbytes for v in self.outs.values())


@dataclasses.dataclass(frozen=True)
class Layout:
    """Shapes and dtypes of one matrix's worth of every buffer of a slot."""

    a: tuple[tuple[int, ...], np.dtype]
    b: tuple[tuple[int, ...], np.dtype] | None
    outs: tuple[tuple[str, tuple[int, ...], np.dtype], ...]

    def bytes_per_matrix(self) -> int:
        def size(tail, dtype):
            return int(np.prod(tail, dtype=np.int64)) * np.dtype(dtype).itemsize
        total = size(*self.a) + (size(*self.b) if self.b else 0)
        return total + sum(size(tail, dtype) for _, tail, dtype in self.outs)


class SlotPool:
    """Pairs of slots (double-buffering), allocated once and lent to tasks again and again.

    ``allocate(nbytes)`` returns a flat uint8 host buffer (pinned for the GPU). A task borrows a pair
    for its layout and largest batch and gives it back at the end; the next task with the same layout
    and a batch no larger gets the same buffers. A pair that no longer fits is released before a new
    one is made, so the pool holds at most as many pairs as tasks ever ran at once on the worker
    (its threads): the pinned memory does not grow from task to task.
    """

    def __init__(self, allocate):
        self._allocate = allocate
        self._lock = threading.Lock()
        self._free: list[tuple[Layout, int, tuple[Slot, Slot]]] = []
        self._lent = 0
        self._lent_bytes = 0
        self.allocations = 0   # pairs allocated so far (tests watch it)

    @property
    def nbytes(self) -> int:
        """Host bytes held by the pool, lent or free."""
        with self._lock:
            return self._lent_bytes + sum(_pair_bytes(p) for _, _, p in self._free)

    @property
    def pairs(self) -> int:
        with self._lock:
            return self._lent + len(self._free)

    def reserve(self, layout: Layout, batch: int, count: int) -> None:
        """Allocate ``count`` pairs up front (a worker plugin does this before the first task)."""
        with self._lock:
            missing = count - sum(1 for lay, b, _ in self._free if lay == layout and b >= batch)
        for _ in range(max(0, missing)):
            pair = self._make_pair(layout, batch)
            with self._lock:
                self._free.append((layout, batch, pair))

    @contextlib.contextmanager
    def borrow(self, layout: Layout, batch: int):
        entry = None
        with self._lock:
            for i, (lay, b, _) in enumerate(self._free):
                if lay == layout and b >= batch:
                    entry = self._free.pop(i)
                    break
            else:
                if self._free:  # a pair of another layout or too small: release it first
                    self._free.pop(0)
        if entry is None:
            entry = (layout, batch, self._make_pair(layout, batch))
        size = _pair_bytes(entry[2])
        with self._lock:
            self._lent += 1
            self._lent_bytes += size
        try:
            yield entry[2]
        finally:
            with self._lock:
                self._lent -= 1
                self._lent_bytes -= size
                self._free.append(entry)

    def _make_pair(self, layout: Layout, batch: int) -> tuple[Slot, Slot]:
        with self._lock:
            self.allocations += 1
        return self._make(layout, batch), self._make(layout, batch)

    def _make(self, layout: Layout, batch: int) -> Slot:
        """One allocation per slot, cut into its buffers (each aligned to 256 bytes)."""
        shapes = [((batch,) + tuple(layout.a[0]), np.dtype(layout.a[1]))]
        if layout.b:
            shapes.append(((batch,) + tuple(layout.b[0]), np.dtype(layout.b[1])))
        shapes += [((batch,) + tuple(tail), np.dtype(dtype)) for _, tail, dtype in layout.outs]
        sizes = [int(np.prod(shape, dtype=np.int64)) * dtype.itemsize for shape, dtype in shapes]
        offsets = np.concatenate(([0], np.cumsum([-(-size // 256) * 256 for size in sizes])))
        raw = self._allocate(max(1, int(offsets[-1])))
        views = [raw[o:o + size].view(dtype).reshape(shape)
                 for o, size, (shape, dtype) in zip(offsets, sizes, shapes)]
        a = views.pop(0)
        b = views.pop(0) if layout.b else None
        return Slot(a, b, {name: view for (name, _, _), view in zip(layout.outs, views)})


def _pair_bytes(pair) -> int:
    return sum(slot.nbytes for slot in pair)


def _host_allocate(nbytes: int) -> np.ndarray:
    """Host memory the I/O processes can map (:mod:`batchlu.pipeline._io_pool`), or plain memory elsewhere."""
    if _io_pool.supported():
        return _io_pool.shared_buffer(nbytes)
    return np.empty(nbytes, np.uint8)


def _pinned_allocate(nbytes: int) -> np.ndarray:
    """Page-locked host memory: shared memory registered with CUDA (so that the I/O processes read
    into and write from the very buffers the copies use), else CuPy's pinned memory."""
    import cupy

    if _io_pool.supported():
        raw = _io_pool.shared_buffer(nbytes, on_free=_unregister)
        try:
            cupy.cuda.runtime.hostRegister(raw.ctypes.data, raw.nbytes, 1)  # cudaHostRegisterPortable
            return raw
        except Exception as exc:  # not registrable here: CuPy's pinned memory, I/O in the worker
            _REGISTER_FAILED.append(repr(exc))
            logger.warning("batchlu: cudaHostRegister of shared memory failed (%s); I/O stays in "
                           "the worker process", exc)
            del raw
    memory = cupy.cuda.alloc_pinned_memory(nbytes)
    return np.frombuffer(memory, np.uint8, nbytes)


_REGISTER_FAILED: list[str] = []


def _unregister(address: int, nbytes: int) -> None:
    import cupy

    try:
        cupy.cuda.runtime.hostUnregister(address)
    except Exception:  # not registered (registration failed) or the context is gone at exit
        pass


# --------------------------------------------------------------------------------------------- engines
class HostEngine:
    """Compute on the CPU: NumPy buffers, kernels' SciPy/LAPACK backend."""

    name = "cpu"
    oom_errors: tuple[type[BaseException], ...] = (MemoryError,)

    def __init__(self):
        self.pool = SlotPool(_host_allocate)

    def device_fit(self, per_matrix: int) -> int | None:
        return None  # no device memory limit: the host budget already sized the batch

    def run(self, op: str, slot: Slot) -> None:
        result = _ops.compute(op, slot.a, slot.b)
        for name, out in slot.outs.items():
            np.copyto(out, result[name].reshape(out.shape), casting="no")

    def release(self) -> None:
        pass

    def describe(self) -> str:
        return "cpu"


class CudaEngine:
    """Compute on this worker's GPU: pinned buffers, one non-blocking CUDA stream per worker thread.

    ``run`` copies the slot's inputs to the device on the thread's stream, launches the kernels there
    (``kernels`` launch on CuPy's current stream), copies each output back into the slot's pinned
    buffers on the same stream and waits for that stream only.
    """

    name = "gpu"
    device_fraction = 0.8   # of the free device memory one batch piece may take, split between threads

    def __init__(self, device: int = 0, threads: int = 1):
        import cupy

        self.device = int(device)
        self.threads = max(1, int(threads))
        self.oom_errors = (cupy.cuda.memory.OutOfMemoryError,)
        self.pool = SlotPool(_pinned_allocate)
        self._local = threading.local()
        with cupy.cuda.Device(self.device):
            props = cupy.cuda.runtime.getDeviceProperties(self.device)
        self.label = f"GPU {self.device} ({props['name'].decode() if isinstance(props['name'], bytes) else props['name']})"

    def describe(self) -> str:
        return self.label

    def _stream(self):
        import cupy

        stream = getattr(self._local, "stream", None)
        if stream is None:
            cupy.cuda.Device(self.device).use()
            stream = self._local.stream = cupy.cuda.Stream(non_blocking=True)
        return stream

    def device_fit(self, per_matrix: int) -> int:
        """Matrices per piece from the free device memory (plus what CuPy's pool holds unused)."""
        import cupy

        with cupy.cuda.Device(self.device):
            free, _total = cupy.cuda.runtime.memGetInfo()
            pool = cupy.get_default_memory_pool()
            free += pool.free_bytes()
        return max(1, int(free * self.device_fraction / self.threads) // max(1, per_matrix))

    def run(self, op: str, slot: Slot) -> None:
        import cupy

        stream = self._stream()
        with cupy.cuda.Device(self.device), stream:
            a = cupy.empty(slot.a.shape, slot.a.dtype)
            a.set(slot.a, stream=stream)
            b = None
            if slot.b is not None:
                b = cupy.empty(slot.b.shape, slot.b.dtype)
                b.set(slot.b, stream=stream)
            result = _ops.compute(op, a, b)
            for name, out in slot.outs.items():
                value = result[name].reshape(out.shape)
                if value.dtype != out.dtype:
                    raise TypeError(f"Expected the GPU kernels to return {name} as {out.dtype}. "
                                    f"Got {value.dtype} instead.")
                _get_async(value, out, stream)
            del a, b, result
        stream.synchronize()

    def release(self) -> None:
        """Give CuPy's cached device blocks back (after an out-of-memory error)."""
        import cupy

        self._stream().synchronize()
        cupy.get_default_memory_pool().free_all_blocks()


def _get_async(value, out: np.ndarray, stream) -> None:
    try:
        value.get(stream=stream, out=out, blocking=False)
    except TypeError:  # CuPy without ``blocking``: the copy then waits for the stream
        value.get(stream=stream, out=out)


# ------------------------------------------------------------------------------------------ data path
@dataclasses.dataclass
class BatchIO:
    """Where a task reads and writes: open Zarr arrays plus the completion hook.

    ``on_read(start, stop, a, b)`` is called (in the reader thread) once the inputs of matrices
    ``[start, stop)`` are in the slot (``a``, ``b``), before they are computed (the pipeline takes
    their checksums there); ``mark(start, stop)`` is called (in the writer thread, in order) once
    every output of those matrices is written; ``read_error(array, start, stop, exc)`` turns a failed
    read into a clear error (e.g. naming the corrupt chunk file).
    ``missing(start, stop)`` runs (in the reader
    thread) before each read, whether this process or an I/O process then reads: it raises on a
    chunk missing from the store, or returns the mask of matrices whose outputs get ``info`` -3
    (:meth:`batchlu.pipeline._tasks.TaskIO.missing`), or None.

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


@dataclasses.dataclass
class PathStats:
    matrices: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    ok: int = 0
    singular: int = 0
    nonfinite: int = 0
    nonfinite_result: int = 0
    missing: int = 0
    pieces: int = 0          # kernel launches (batch pieces) run
    oom_splits: int = 0      # pieces halved after an out-of-memory error
    read_s: float = 0.0
    compute_s: float = 0.0
    write_s: float = 0.0
    wall_s: float = 0.0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def layout_for(op: str, source, rhs, outputs: dict) -> Layout:
    n = source.shape[1:]
    return Layout(
        a=(tuple(n), np.dtype(source.dtype)),
        b=None if rhs is None else (tuple(rhs.shape[1:]), np.dtype(rhs.dtype)),
        outs=tuple((name, tuple(arr.shape[1:]), np.dtype(arr.dtype)) for name, arr in outputs.items()),
    )


def _read_into(array, start: int, stop: int, out: np.ndarray, read_error) -> None:
    """``out[:] = array[start:stop]``, decoded by zarr straight into ``out`` where zarr allows it."""
    try:
        _io_pool.read_into(array, start, stop, out)
    except Exception as exc:
        if read_error is not None:
            read_error(array, start, stop, exc)
        raise


def _shared(slot: Slot) -> bool:
    """Whether every buffer of ``slot`` lies in memory the I/O processes can map."""
    buffers = [slot.a] + ([] if slot.b is None else [slot.b]) + list(slot.outs.values())
    return all(_io_pool.locate(buffer) is not None for buffer in buffers)


def _pool_requests(calls) -> list[tuple[int, BaseException]]:
    """Send the I/O requests ``calls`` (each returns a future) at once and wait for all of them (their
    buffers are about to be reused). A request whose I/O process died is sent once more, to its
    replacement: reads and writes of whole chunks can be repeated. Returns the failures."""
    futures = [call() for call in calls]
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


def _pool_read(io: BatchIO, start: int, stop: int, slot: Slot) -> None:
    """Both inputs of a batch read by the I/O processes at once; a failed read goes through
    ``read_error`` (which re-reads here to name the corrupt chunk file)."""
    jobs = [(io.source, io.where["a"], slot.a)] + ([] if slot.b is None else [(io.rhs, io.where["b"], slot.b)])
    failures = _pool_requests([lambda w=where, o=out: io.pool.read(*w, start, stop, o) for _, where, out in jobs])
    if failures:
        index, exc = failures[0]
        if io.read_error is not None and not isinstance(exc, _io_pool.IOProcessError):
            io.read_error(jobs[index][0], start, stop, exc)
        raise exc


def _pool_write(io: BatchIO, start: int, stop: int, slot: Slot) -> None:
    failures = _pool_requests([lambda w=io.where[name], o=out: io.pool.write(*w, start, stop, o)
                               for name, out in slot.outs.items()])
    if failures:
        raise failures[0][1]


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


def _count_info(info: np.ndarray, stats: PathStats) -> None:
    for name, value in zip(_ops.InfoCounts._fields, _ops.info_counts(info)):
        setattr(stats, name, getattr(stats, name) + value)


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
    pooled = io.pool is not None and all(_shared(slot) for slot in slots)

    def read(index: int):
        """Read batch ``index`` into its slot; returns the mask of matrices in missing chunks, or None."""
        start, stop = batches[index]
        slot = slots[index % 2].view(stop - start)
        t = time.perf_counter()
        gaps = io.missing(start, stop) if io.missing is not None else None
        if pooled:
            _pool_read(io, start, stop, slot)
        else:
            _read_into(io.source, start, stop, slot.a, io.read_error)
            if io.rhs is not None:
                _read_into(io.rhs, start, stop, slot.b, io.read_error)
        if io.on_read is not None:
            io.on_read(start, stop, slot.a, slot.b)
        with lock:
            stats.read_s += time.perf_counter() - t
            stats.bytes_in += slot.a.nbytes + (0 if slot.b is None else slot.b.nbytes)
        return gaps

    def write(index: int) -> None:
        start, stop = batches[index]
        slot = slots[index % 2].view(stop - start)
        t = time.perf_counter()
        if pooled:
            _pool_write(io, start, stop, slot)
        else:
            for name, out in slot.outs.items():
                io.outputs[name][start:stop] = out
        if io.mark is not None:
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
                    _count_info(slot.outs["info"], stats)
                writes.append((i, writer.submit(write, i)))
            while writes:
                writes.popleft()[1].result()
        finally:
            # on an error, let the reads and writes in flight finish (what is written is marked
            # complete only if the write got that far), then re-raise
            pending_read.cancel()
            for _, future in writes:
                future.cancel()


# ------------------------------------------------------------------------------- per-worker engine
_ENGINE = None
_ENGINE_LOCK = threading.Lock()


def install_engine(device: int = 0, threads: int = 1) -> CudaEngine:
    """Create this worker process's :class:`CudaEngine` (called by :class:`batchlu.pipeline.plugins.GPUSetup`)."""
    global _ENGINE
    with _ENGINE_LOCK:
        if _ENGINE is None or _ENGINE.device != int(device):
            _ENGINE = CudaEngine(device, threads)
        else:
            _ENGINE.threads = max(1, int(threads))
        return _ENGINE


def release_engine() -> None:
    global _ENGINE
    with _ENGINE_LOCK:
        _ENGINE = None


def current_engine() -> CudaEngine:
    """The worker's engine; made here on first use when no plugin set one up (device 0)."""
    with _ENGINE_LOCK:
        engine = _ENGINE
    if engine is not None:
        return engine
    threads = 1
    try:
        from distributed import get_worker

        threads = get_worker().state.nthreads
    except Exception:
        pass
    return install_engine(0, threads)


def warm_up(engine, spec, reserve: int = 1) -> None:
    """Compile ``spec.op``'s kernels on a few random matrices, reserve pinned slots for ``spec`` and
    start the I/O processes (``reserve`` is the worker's thread count).

    ``spec`` is a :class:`batchlu.pipeline.plugins.WarmUp`.
    """
    n = int(spec.n)
    layout = Layout(a=((n, n), np.dtype(spec.dtype)),
                    b=None if spec.rhs is None else (tuple(spec.rhs[0]), np.dtype(spec.rhs[1])),
                    outs=tuple((name, tuple(tail), np.dtype(dtype)) for name, tail, dtype in spec.outputs))
    rng = np.random.default_rng()
    m = 4

    def random(tail, dtype):
        x = rng.standard_normal((m,) + tuple(tail))
        if np.dtype(dtype).kind == "c":
            x = x + 1j * rng.standard_normal((m,) + tuple(tail))
        return x.astype(dtype)

    slot = Slot(random(*layout.a), None if layout.b is None else random(*layout.b),
                {name: np.empty((m,) + tail, dtype) for name, tail, dtype in layout.outs})
    engine.run(spec.op, slot)
    engine.pool.reserve(layout, int(spec.batch), max(1, int(reserve)))
    processes, threads = io_settings(getattr(spec, "io_processes", None), getattr(spec, "io_threads", None),
                                     engine.name, max(1, int(reserve)))
    if processes and _io_pool.supported():
        _io_pool.get_pool(processes, threads)


# ------------------------------------------------------------------------------- pipeline backends
def sub_batches(plan, c0: int, c1: int) -> list[tuple[int, int]]:
    """Chunk ranges of a task's batches: whole output chunks, at most ``plan.batch`` matrices each,
    and at least two batches when the task has two chunks or more, so that reading, computing and
    writing overlap inside the task as well as across the worker's tasks."""
    per = max(1, plan.batch // plan.chunk)
    if c1 - c0 >= 2:
        per = min(per, -(-(c1 - c0) // 2))
    return [(b, min(b + per, c1)) for b in range(c0, c1, per)]


def _worker_threads() -> int:
    try:
        from distributed import get_worker

        return int(get_worker().state.nthreads)
    except Exception:
        return os.cpu_count() or 1


def io_settings(processes: int | None, threads: int | None, engine: str,
                worker_threads: int) -> tuple[int, int]:
    """``(processes, threads)`` of the worker's I/O pool from ``batchlu.io-processes`` and
    ``batchlu.io-threads`` (None: auto).

    auto: on a GPU worker, one I/O process per 2 worker threads (the worker's threads wait on the
    I/O and the GPU; the cores do the decoding and encoding), each with as many threads as it takes
    to give the worker's thread count in all; on a CPU worker none (its cores also compute, and
    CPU clusters already run a process per few cores). 0 processes: I/O in the worker process.
    On the 2 x H200 host, 16 worker threads as 8 processes x 2 threads moved 3.13 GB/s (1 GPU) and
    4.94 GB/s (2 GPUs), against 2.93 / 4.51 as 4 x 4 and 2.99 / 4.61 as 16 x 1 (medians of 3 runs,
    docs/performance.md).
    """
    worker_threads = max(1, int(worker_threads))
    if processes is None:
        processes = max(1, worker_threads // 2) if engine == "gpu" else 0
    if threads is None:
        threads = max(1, -(-worker_threads // max(1, processes)))
    return int(processes), int(threads)


def io_pool_for(job, engine):
    """The worker's :class:`batchlu.pipeline._io_pool.IOPool` for ``job``, or None for I/O in this process."""
    processes, threads = io_settings(getattr(job, "io_processes", None), getattr(job, "io_threads", None),
                                     engine.name, _worker_threads())
    if processes == 0 or not _io_pool.supported():
        return None
    return _io_pool.get_pool(processes, threads)


class PathBackend:
    """A :mod:`batchlu.pipeline._backends` backend that runs whole tasks through :func:`run_batches`."""

    name = "path"

    def engine(self):
        raise NotImplementedError

    def compute(self, op: str, a, b=None) -> dict:
        return _ops.compute(op, a, b)

    def label(self, engine) -> str:
        try:
            from distributed import get_worker

            address = get_worker().address
        except Exception:
            address = "local"
        return address if engine.name == "cpu" else f"{address} {engine.describe()}"

    def process_range(self, job, c0: int, c1: int):
        from ._store import read_range
        from ._tasks import TaskIO, TaskResult

        _io_pool.tune_malloc()  # once per worker process: Zarr's chunk buffers reuse heap pages
        engine = self.engine()
        io = TaskIO(job)
        plan = job.plan
        chunk_batches = sub_batches(plan, c0, c1)
        ranges = [plan.chunk_range(b0, b1) for b0, b1 in chunk_batches]
        refs = {id(io.input): job.input}
        if io.rhs is not None:
            refs[id(io.rhs)] = job.rhs

        digests = {}  # batch start -> CRC-32 of its chunks' inputs, from the reader to the writer

        def on_read(start: int, stop: int, a, b) -> None:
            digests[start] = _fingerprint.chunk_digests(plan.chunk, start, stop, a, b)

        def mark(start: int, stop: int) -> None:
            io.mark(start // plan.chunk, -(-stop // plan.chunk), digests.pop(start))

        def read_error(array, start, stop, exc):
            read_range(refs[id(array)], array, start, stop)  # raises CorruptInputError naming the file

        where = {"a": (job.input.path, job.input.array), **{name: (job.output, name) for name in io.out}}
        if job.rhs is not None:
            where["b"] = (job.rhs.path, job.rhs.array)
        batch_io = BatchIO(io.input, io.rhs, io.out, mark=mark, read_error=read_error,
                           pool=io_pool_for(job, engine), where=where, missing=io.missing,
                           on_read=on_read)
        stats = run_batches(engine, job.op, batch_io, ranges, delay=job.task_delay)
        counts = {name: getattr(stats, name) for name in _ops.InfoCounts._fields}
        return TaskResult(c0, c1, matrices=stats.matrices, **counts, bytes_in=stats.bytes_in,
                          bytes_out=stats.bytes_out, seconds=stats.wall_s,
                          worker=self.label(engine), backend=self.name)


class GPUPathBackend(PathBackend):
    """``gpu``: this worker's GPU through :class:`CudaEngine` (set up by the ``GPUSetup`` plugin)."""

    name = "gpu"

    def engine(self):
        return current_engine()

    def compute(self, op: str, a, b=None) -> dict:
        engine = current_engine()
        a = np.ascontiguousarray(a)
        b = None if b is None else np.ascontiguousarray(b)
        probe = _ops.compute(op, a[:1], None if b is None else b[:1])  # shapes and dtypes only
        outs = {k: np.empty((a.shape[0],) + v.shape[1:], v.dtype) for k, v in probe.items()}
        _compute(engine, op, Slot(a, b, outs), a.shape[0], PathStats())
        return outs


_HOST_ENGINE = None


class HostPathBackend(PathBackend):
    """``cpu`` through the same double-buffered loop (NumPy buffers, SciPy/LAPACK kernels)."""

    name = "cpu"

    def engine(self):
        global _HOST_ENGINE
        with _ENGINE_LOCK:
            if _HOST_ENGINE is None:
                _HOST_ENGINE = HostEngine()
            return _HOST_ENGINE
