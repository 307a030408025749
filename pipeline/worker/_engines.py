"""Engines: what computes a slot of a batch, in place, on this worker.

An engine has a ``name`` (``cpu`` or ``gpu``, the backend it serves), a :class:`SlotPool` of host
buffers, ``run(op, slot)`` (inputs in the slot, every output written into the slot),
``device_fit(per_matrix)`` (matrices per piece the device memory allows, or None),
``oom_errors`` and ``release()`` (what an out-of-memory error looks like and how to recover from
it), and ``describe()``. The batch loop (:mod:`batchlu.pipeline.worker._batches`) is the same for both:
CPU and GPU differ only in the engine plugged in.

* :class:`HostEngine`: NumPy buffers, kernels' SciPy/LAPACK backend; one per worker process
  (:func:`host_engine`).
* :class:`CudaEngine`: pinned buffers, one non-blocking CUDA stream per worker thread; set up per
  worker by :class:`batchlu.pipeline.plugins.GPUSetup` (:func:`install_engine`, :func:`warm_up`),
  looked up by the task (:func:`current_engine`). CuPy is imported only inside its methods.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time

import numpy as np

from .. import _ops
from ..config._settings import Options
from . import _io_pool
from ._buffers import Layout, Slot, SlotPool, host_allocate, pinned_allocate

__all__ = ["CudaEngine", "HostEngine", "WarmUp", "compile_op", "current_engine", "host_engine", "install_engine", "warm_up"]


@dataclasses.dataclass(frozen=True)
class WarmUp:
    """What the coming run computes: compile those kernels and reserve the pinned buffers for it.

    ``outputs`` lists ``(name, tail shape, dtype)`` per output array; ``batch`` is the largest batch
    of a task (matrices). ``rhs`` is ``(tail shape, dtype)`` for ``solve``; ``tail`` the input's shape
    after N where it is not ``(n, n)`` (a sparse batch's values, ``(nnz,)``), and ``symbolic`` a sparse
    op's pattern analysis, which the warm-up binds the op to. ``settings`` are the run's
    (its ``io-processes`` / ``io-threads`` size the I/O processes, None: auto): the I/O
    processes are started here too, so that their start-up is not a task's.
    """

    op: str
    dtype: str
    n: int
    outputs: tuple[tuple[str, tuple[int, ...], str], ...]
    batch: int
    rhs: tuple[tuple[int, ...], str] | None = None
    settings: Options = dataclasses.field(default_factory=Options)
    tail: tuple[int, ...] | None = None   # the input's shape after N; None: (n, n)
    symbolic: object = None               # sparse ops: the pattern's batchlu.kernels.sparse.Plan
    staging: int = 0   # the GPU codec path: bytes of input per group (batchlu.device-batch-bytes); 0: unused
    input_bytes: int = 0   # the whole run's input (see :func:`computing`); 0: not known
    # the GPU codec path: by whether the worker has I/O processes (its tasks read a routed input on
    # the host only then), (Layout, matrices) of the pinned pair each of its tasks borrows, () where
    # they borrow none; None: the run takes the host path, whose slots are ``outputs`` x ``batch``
    device_slots: dict[bool, tuple] | None = None
    locations: tuple[str, ...] = ()   # the run's stores: no I/O processes for object storage


class HostEngine:
    """Compute on the CPU: NumPy buffers, kernels' SciPy/LAPACK backend."""

    name = "cpu"
    oom_errors: tuple[type[BaseException], ...] = (MemoryError,)

    def __init__(self):
        self.pool = SlotPool(host_allocate)

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
        self.pool = SlotPool(pinned_allocate)
        from ..codecs import _gpu

        _gpu.use_allocator(pinned_allocate)   # the codec path's staging buffers: pinned the same way
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

    def run_device(self, op: str, a, b, tails: dict, splits: list[tuple[int, int]] | None = None) -> dict:
        """``op`` on device arrays (the GPU codec path): the outputs named in ``tails`` (name -> shape
        after N), on the device, computed on this thread's stream, one kernels call per ``splits``
        row range (default: one for all; the batch loop gives one per output chunk). An
        out-of-memory error releases CuPy's cache and computes the ranges in halves."""
        import cupy

        m = a.shape[0]
        splits = list(splits) if splits else [(0, m)]
        stream = self._stream()
        parts: list[dict] = []
        try:
            with cupy.cuda.Device(self.device), stream:
                for lo, hi in splits:
                    result = _ops.compute(op, a[lo:hi], None if b is None else b[lo:hi])
                    parts.append({name: result[name].reshape((hi - lo,) + tuple(tail))
                                  for name, tail in tails.items()})
                outs = parts[0] if len(parts) == 1 else {
                    name: cupy.concatenate([p[name] for p in parts]) for name in tails}
            stream.synchronize()
            return outs
        except self.oom_errors:
            if m == 1:
                raise
            parts.clear()
            self.release()
            if len(splits) > 1:   # halves at a range's edge: each range still one kernels call
                h = splits[len(splits) // 2][0]
                first_splits = [(lo, hi) for lo, hi in splits if hi <= h]
                second_splits = [(lo - h, hi - h) for lo, hi in splits if lo >= h]
            else:
                h = m // 2
                first_splits = second_splits = None
            first = self.run_device(op, a[:h], None if b is None else b[:h], tails, first_splits)
            second = self.run_device(op, a[h:], None if b is None else b[h:], tails, second_splits)
            with cupy.cuda.Device(self.device), stream:
                outs = {name: cupy.concatenate((first[name], second[name])) for name in tails}
            stream.synchronize()
            return outs

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



# ------------------------------------------------------------------------------- per-worker engines
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


def warm_up(engine, spec, reserve: int = 1) -> dict[str, float]:
    """Compile ``spec.op``'s kernels on a few random matrices, reserve pinned slots for ``spec`` and
    start the I/O processes (``reserve`` is the worker's thread count); returns the seconds of each
    step, by name (the run's report prints them: :attr:`batchlu.pipeline.client._report.Report.warmup_steps`).

    ``spec`` is a :class:`WarmUp`.
    """
    steps = {}
    clock = time.perf_counter()

    def step(name):
        nonlocal clock
        now = time.perf_counter()
        steps[name] = now - clock
        clock = now

    layout = compile_op(engine, spec)
    step("kernels")
    threads = max(1, int(reserve))
    # the tasks' own rule (batchlu.pipeline.worker._tasks.io_pool_for): whether they have I/O processes
    processes, io_threads = _io_pool.pool_settings(spec.settings, engine.name, threads, spec.locations)
    if spec.device_slots is None:
        engine.pool.reserve(layout, int(spec.batch), threads)
        step("pinned slots")
    else:   # the GPU codec path: a task per lane at a time, each borrowing one pair of its own layout
        from ..codecs import _gpu

        slots = spec.device_slots[processes > 0]
        if slots:
            device_layout, rows = slots
            engine.pool.reserve(device_layout, int(rows), min(threads, _gpu.LANES))
            step("pinned slots")
    if getattr(spec, "staging", 0):   # the GPU codec path: each of its lanes stages 4 buffers
        from ..codecs import _gpu

        _gpu.reserve(4 * min(threads, _gpu.LANES), _gpu.staging_bytes(int(spec.staging)))
        step("codec staging")
    if processes:
        _io_pool.get_pool(processes, io_threads)
        step("I/O processes")
    return steps


# A CPU run with at most this much input loads numba only where a batch needs it
# (batchlu.kernels._cpu.numba_on_demand: the compiled engine's results bit for bit): loading numba's
# cached code costs ~0.5 s, while the NumPy engine's LAPACK calls cost more per matrix than the
# compiled loop's (1 GB of n = 64: 4.4-5.2 s of compute against 2.9 on the 2-core VM; 50 MB: 0.4 s
# of warm-up saved for ~0.05 s more compute; docs/performance.md, end to end).
ON_DEMAND_BYTES = 64 << 20


def computing(engine, input_bytes: int):
    """The context a task (or the warm-up) of a run with ``input_bytes`` of input computes in on
    ``engine``: numba on demand for a small CPU run (:data:`ON_DEMAND_BYTES`), else nothing."""
    if engine.name == "cpu" and 0 < input_bytes <= ON_DEMAND_BYTES:
        from batchlu.kernels._cpu import numba_on_demand

        return numba_on_demand()
    return contextlib.nullcontext()


def compile_op(engine, spec) -> Layout:
    """Run ``spec.op`` once on ``engine`` over a few random matrices of the run's dtype and shapes,
    so that its kernels compile (numba, NVRTC) or load from their disk caches here and not in the
    first task; returns the run's slot :class:`Layout`. ``spec``: a :class:`WarmUp`."""
    n = int(spec.n)
    op = spec.op if spec.symbolic is None else _ops.get_op(spec.op).bind(spec.symbolic, spec.settings)
    layout = Layout(a=(tuple(spec.tail) if spec.tail is not None else (n, n), np.dtype(spec.dtype)),
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
    with computing(engine, int(getattr(spec, "input_bytes", 0))):
        engine.run(op, slot)
    return layout


_HOST_ENGINE = None


def host_engine() -> HostEngine:
    """This worker process's :class:`HostEngine` (made on first use)."""
    global _HOST_ENGINE
    with _ENGINE_LOCK:
        if _HOST_ENGINE is None:
            _HOST_ENGINE = HostEngine()
        return _HOST_ENGINE
