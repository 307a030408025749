"""A batch's host memory: the slot buffers a batch is read into, computed from and written from.

Each slot holds the input (and right-hand side) buffers and one buffer per output array, sized for
the largest batch of a task; two slots make a pair (double-buffering, :mod:`batchlu.pipeline.worker._batches`).
A task borrows a pair from its engine's :class:`SlotPool` and gives it back, so the memory is
allocated once per worker thread and reused by every later task (and run). The buffers lie in
shared memory where the I/O processes can map them (:mod:`batchlu.pipeline.worker._shared_memory`); on the GPU
they are page-locked too (:func:`pinned_allocate`), so that copies run asynchronously.
CuPy is imported only inside :func:`pinned_allocate`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading

import numpy as np

from ..store._arrays import native_dtype
from . import _shared_memory

logger = logging.getLogger("batchlu.path")

__all__ = ["Layout", "Slot", "SlotPool", "host_allocate", "layout_for", "pinned_allocate", "prefault", "shared"]


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


def host_allocate(nbytes: int) -> np.ndarray:
    """Host memory the I/O processes can map (:mod:`batchlu.pipeline.worker._shared_memory`), or plain
    memory elsewhere."""
    if _shared_memory.supported():
        return _shared_memory.shared_buffer(nbytes)
    return np.empty(nbytes, np.uint8)


def pinned_allocate(nbytes: int) -> np.ndarray:
    """Page-locked host memory: shared memory registered with CUDA (so that the I/O processes read
    into and write from the very buffers the copies use), else CuPy's pinned memory."""
    import cupy

    if _shared_memory.supported():
        raw = _shared_memory.shared_buffer(nbytes, on_free=_unregister)
        prefault(raw)
        try:
            cupy.cuda.runtime.hostRegister(raw.ctypes.data, raw.nbytes, 1)  # cudaHostRegisterPortable
            return raw
        except Exception as exc:  # not registrable here: CuPy's pinned memory, I/O in the worker
            _REGISTER_FAILED.append(repr(exc))
            logger.warning("batchlu: cudaHostRegister of shared memory failed (%s); CuPy's pinned "
                           "memory instead (an I/O process cannot reach it)", exc)
            del raw
    memory = cupy.cuda.alloc_pinned_memory(nbytes)
    return np.frombuffer(memory, np.uint8, nbytes)


_REGISTER_FAILED: list[str] = []

# Pages faulted in by this many bytes per thread before cudaHostRegister pins them: the registration
# alone faults them in one thread (0.42 s per GiB on the H100 machine, as slow as CuPy's pinned
# memory, 0.38 s); written first by up to 16 threads, then registered, 0.24 s
# (benchmarks/bench_pinning.py, run on that machine)
PREFAULT_BYTES = 64 << 20


def prefault(raw: np.ndarray) -> None:
    """Write every page of ``raw`` (fresh memory: zeros stay zeros) from several threads at once, so
    that its pages exist before it is registered. ctypes' memset lets the GIL go. Returns only when
    every page is written, whatever happens (a thread that cannot start: its share is written here),
    so that no thread writes into memory its caller may free."""
    import ctypes
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    pieces = min(16, cores, raw.nbytes // PREFAULT_BYTES)
    if pieces < 2:
        return
    step = -(-raw.nbytes // pieces)
    base = raw.ctypes.data
    spans = [(base + i, min(step, raw.nbytes - i)) for i in range(0, raw.nbytes, step)]
    started = []
    try:
        for address, size in spans[1:]:
            thread = threading.Thread(target=ctypes.memset, args=(address, 0, size), daemon=True)
            try:
                thread.start()
            except RuntimeError:   # no new thread to be had (a thread limit): written here instead
                ctypes.memset(address, 0, size)
                continue
            started.append(thread)
        ctypes.memset(spans[0][0], 0, spans[0][1])
    finally:
        for thread in started:
            thread.join()


def _unregister(address: int, nbytes: int) -> None:
    import cupy

    try:
        cupy.cuda.runtime.hostUnregister(address)
    except Exception:  # not registered (registration failed) or the context is gone at exit
        pass



def layout_for(op: str, source, rhs, outputs: dict) -> Layout:
    n = source.shape[1:]
    return Layout(   # the inputs are read in native byte order (a Zarr v2 ">f8" too)
        a=(tuple(n), native_dtype(source.dtype)),
        b=None if rhs is None else (tuple(rhs.shape[1:]), native_dtype(rhs.dtype)),
        outs=tuple((name, tuple(arr.shape[1:]), np.dtype(arr.dtype)) for name, arr in outputs.items()),
    )


def shared(slot: Slot) -> bool:
    """Whether every buffer of ``slot`` lies in memory the I/O processes can map."""
    buffers = [slot.a] + ([] if slot.b is None else [slot.b]) + list(slot.outs.values())
    return all(_shared_memory.locate(buffer) is not None for buffer in buffers)
