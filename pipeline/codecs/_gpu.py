"""The GPU half of the codec path: nvCOMP decodes a batch's stored frames on the device and encodes
its outputs there (worker side; CuPy and nvCOMP are imported only inside the functions).

A :class:`Lane` is borrowed by one task at a time from the worker process's :data:`LANES` lanes per
GPU (:func:`borrow`) and lives as long as the process: its reader and writer streams, one
:class:`batchlu.pipeline.codecs._nvcomp.Batch` per stream and algorithm (nvCOMP's C API, its scratch
memory), and grow-only pinned staging buffers. The batch loop's reader and writer threads
(:mod:`batchlu.pipeline.worker._device_batches`) use the lane of the task that started them.

* :meth:`Lane.decode`: the frames of matrices ``[start, stop)``
  (:func:`batchlu.pipeline.codecs._reader.plan_reads`) are read into pinned memory by a few I/O threads,
  their crc32c trailers (or zstd structure) checked, copied to the device in one transfer and
  decoded by one nvCOMP call straight into the batch's device array. Every
  frame must decode to exactly its chunk's bytes; anything else raises :class:`FrameError` naming the
  chunk (the batch loop then reads the batch through zarr on the host, which names a corrupt chunk
  file or, where zarr reads what nvCOMP would not, uses its values).
* :meth:`Lane.encode`: one nvCOMP call per output encodes every (inner) chunk of a group into fixed
  slots; the slots come back to pinned memory in one transfer, and the I/O threads write the frames
  as chunk files or shards (:func:`batchlu.pipeline.codecs._writer.write_chunks`) while the lane goes on.
  nvCOMP's zstd and LZ4 encoders are deterministic, so a chunk computed again (resume, a restarted
  worker) is stored byte for byte as before.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import queue
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from batchlu.errors import FrameError, OutputError

from ..store import _layout
from . import _frames, _nvcomp, _reader, _writer

__all__ = ["FrameError", "LANES", "Lane", "borrow", "lane", "missing", "reserve", "staging_bytes", "use_allocator"]

logger = logging.getLogger("batchlu.path")

IO_THREADS = 8   # file reads and writes in flight per worker process


def missing() -> str | None:
    """Run on each worker: None when nvCOMP's C library loads here, else why not (one line)."""
    return _nvcomp.missing()


_IO_LOCK = threading.Lock()
_IO: list[ThreadPoolExecutor] = []


def io_threads() -> ThreadPoolExecutor:
    with _IO_LOCK:
        if not _IO:
            _IO.append(ThreadPoolExecutor(IO_THREADS, thread_name_prefix="batchlu-frames"))
        return _IO[0]


class _Pinned:
    """A grow-only page-locked host buffer. Growing takes a spare made at warm-up (:func:`reserve`)
    where one is large enough: pinning memory is slow (about 2 GB/s) and is the run's cost, not a
    task's."""

    def __init__(self):
        self.array = np.empty(0, np.uint8)
        self._memory = None

    def get(self, nbytes: int) -> np.ndarray:
        if self.array.nbytes < nbytes:
            spare = _take_spare(nbytes)
            if spare is not None:
                self.array, self._memory = spare.array, spare._memory
            else:
                self._allocate(max(int(nbytes * 1.25), 1 << 20))
        return self.array[:nbytes]

    def _allocate(self, size: int) -> None:
        if _ALLOCATE:   # the engine's (worker._buffers.pinned_allocate: faster to pin)
            self.array, self._memory = _ALLOCATE[0](size)[:size], None
            return
        import cupy

        self._memory = cupy.cuda.alloc_pinned_memory(size)
        self.array = np.frombuffer(self._memory, np.uint8, size)


_ALLOCATE: list = []


def use_allocator(allocate) -> None:
    """Pin the staging buffers with ``allocate(nbytes)`` (a flat uint8 array of page-locked memory)
    instead of CuPy's pinned memory: the GPU engine passes its own, which pins faster
    (:func:`batchlu.pipeline.worker._buffers.pinned_allocate`)."""
    _ALLOCATE[:] = [allocate]


_SPARE_LOCK = threading.Lock()
_SPARES: list[_Pinned] = []


def staging_bytes(group_bytes: int) -> int:
    """Bytes of one staging buffer for groups of ``group_bytes`` of input: a group's stored frames,
    or its outputs' encoded frames in fixed slots (see :meth:`Lane.encode`)."""
    return int(group_bytes * 1.05) + (1 << 20)


def reserve(count: int, nbytes: int) -> None:
    """At warm-up: make sure this process holds ``count`` page-locked staging buffers of at least
    ``nbytes`` (the lanes' own, or spares for the lanes to take), allocating what is missing."""
    with _SPARE_LOCK:
        _SPARES[:] = [p for p in _SPARES if p.array.nbytes >= nbytes]
        held = sum(1 for each in list(_LANES) for p in each.buffers() if p.array.nbytes >= nbytes)
        for _ in range(count - held - len(_SPARES)):
            spare = _Pinned()
            spare._allocate(nbytes)
            _SPARES.append(spare)


def _take_spare(nbytes: int) -> _Pinned | None:
    with _SPARE_LOCK:
        for i, spare in enumerate(_SPARES):
            if spare.array.nbytes >= nbytes:
                return _SPARES.pop(i)
    return None


class Lane:
    """One worker thread's streams, codecs and staging buffers (see the module docstring)."""

    def __init__(self, device: int):
        import cupy

        self.device = device
        with cupy.cuda.Device(device):
            self.read_stream = cupy.cuda.Stream(non_blocking=True)
            self.write_stream = cupy.cuda.Stream(non_blocking=True)
        self._codecs: dict = {}
        self._read = [_Pinned(), _Pinned()]
        self._write = [_Pinned(), _Pinned()]

    def buffers(self) -> list[_Pinned]:
        return [*self._read, *self._write]

    def _codec(self, algorithm: str, stream) -> _nvcomp.Batch:
        key = (algorithm, stream.ptr)
        codec = self._codecs.get(key)
        if codec is None:
            codec = self._codecs[key] = _nvcomp.Batch(algorithm, stream)
        return codec

    # ---------------------------------------------------------------------------------- decode
    def decode(self, stored: _layout.Stored, start: int, stop: int, parity: int):
        """Matrices ``[start, stop)`` of ``stored``'s array, decoded on the device: a CuPy array of
        shape ``(stop - start,) + shape[1:]`` on this lane's read stream (synchronised), and the
        :class:`batchlu.pipeline.store._missing.Gap` of every chunk not stored (:func:`batchlu.pipeline.
        _reader.gaps`; their matrices come back as zeros, and the missing-chunk check decides what
        that means)."""
        import cupy

        reads = _reader.plan_reads(stored, start, stop)
        sizes = _reader.frame_sizes(reads)
        gaps = _reader.gaps(stored, reads, sizes)
        offsets, total = _reader.aligned(sizes)
        host = self._read[parity].get(max(total, 1))
        try:
            _reader.read_frames(reads, sizes, offsets, host, io_threads())
        except (OSError, ValueError) as exc:
            raise FrameError(str(exc)) from exc
        first = reads[0].first
        end = reads[-1].first + reads[-1].matrices
        per = stored.matrix_bytes
        frames = []   # (frame offset, frame length, destination offset, destination length)
        check = stored.frames.algorithm == "zstd" and not stored.frames.crc32c   # the frames' structure
        for r, size, at in zip(reads, sizes, offsets):
            if size == 0:
                continue
            try:
                offset, length = _frames.payload(stored.frames, host, at, size, r.label)
            except ValueError as exc:
                raise FrameError(str(exc)) from exc
            frames.append((offset, length, (r.first - first) * per, r.matrices * per, r.label))
        if check and frames:
            try:
                _frames.zstd_check_many(host, [f[0] for f in frames], [f[1] for f in frames],
                                        [f[3] for f in frames], [f[4] for f in frames])
            except ValueError as exc:
                raise FrameError(str(exc)) from exc
        stream = self.read_stream
        with cupy.cuda.Device(self.device), stream:
            out = cupy.empty((end - first) * per, cupy.uint8)
            if len(frames) < len(reads):
                out.fill(0)
            if frames:
                staged = cupy.empty(max(total, 1), cupy.uint8)
                staged.set(host[:staged.size], stream=stream)
                if stored.frames.algorithm == "none":
                    for offset, length, dest, want, label in frames:
                        if length != want:
                            raise FrameError(f"the chunk {label} holds {length} bytes; its matrices take {want}")
                        out[dest:dest + want] = staged[offset:offset + length]
                else:
                    codec = self._codec(stored.frames.algorithm, stream)
                    try:
                        got, status = codec.decode(staged, [f[0] for f in frames], [f[1] for f in frames],
                                                   out, [f[2] for f in frames], [f[3] for f in frames])
                    except Exception as exc:
                        raise FrameError(f"nvCOMP could not decode the chunks {frames[0][4]} to "
                                         f"{frames[-1][4]}: {type(exc).__name__}: {exc}") from exc
                    for (_, _, _, want, label), size, code in zip(frames, got, status):
                        if code != 0:
                            raise FrameError(f"nvCOMP could not decode the chunk {label} (status {code}: "
                                             f"{_nvcomp.STATUS.get(int(code), 'unknown')})")
                        if int(size) != want:
                            raise FrameError(f"the chunk {label} decodes to {size} bytes; its matrices take {want}")
        stream.synchronize()
        lo = (start - first) * per
        value = out[lo:lo + (stop - start) * per].view(np.dtype(stored.dtype)).reshape((stop - start,) + stored.shape[1:])
        return value, gaps

    # ---------------------------------------------------------------------------------- encode
    def encode(self, items: list, start: int, parity: int) -> list:
        """Encode each ``(stored, value)`` of ``items`` (an output's matrices from ``start`` on, whole
        stored objects, the array's last one possibly partial) and start writing them as ``stored``'s
        chunk files or shards in the I/O threads. Returns the futures of the writes: the frames stay
        in this lane's write staging buffer ``parity`` until they are done, so the caller waits for
        them before it encodes with the same ``parity`` again.

        The values may still be in the making on the calling thread's current stream: the write
        stream waits for that stream's work (an event, no host wait) before it reads them. Values
        made on any other stream must be complete (the engine synchronises its stream)."""
        import cupy

        stream = self.write_stream
        coded = []   # (stored, device frames, slot, sizes, frame size)
        with cupy.cuda.Device(self.device):
            after(stream, cupy.cuda.get_current_stream())
        with cupy.cuda.Device(self.device), stream:
            for stored, value in items:
                per = stored.matrix_bytes
                count = value.shape[0]
                padded = -(-count // stored.inner) * stored.inner
                flat = cupy.ascontiguousarray(value).reshape(-1).view(cupy.uint8)
                if padded != count:   # the array's last chunk: zarr stores it whole
                    full = cupy.zeros(padded * per, cupy.uint8)
                    full[:flat.size] = flat
                    flat = full
                size = stored.inner * per
                frames = padded // stored.inner
                if stored.frames.algorithm == "none":
                    coded.append((stored, flat, size, np.full(frames, size, np.int64), size))
                else:
                    device, slot, sizes = self._encode_into_slots(stored, flat, frames, size, stream)
                    coded.append((stored, device, slot, sizes, size))
            offsets, total = _reader.aligned([c[1].size for c in coded])
            host = self._write[parity].get(max(total, 1))
            for (_, device, _, _, _), at in zip(coded, offsets):
                _get_async(device, host[at:at + device.size], stream)
        stream.synchronize()
        futures = []
        for (stored, _, slot, sizes, size), at in zip(coded, offsets):
            if stored.frames.algorithm == "zstd":   # each frame whole, declaring its decoded size (what a reader checks)
                try:
                    _frames.zstd_check_many(host, at + slot * np.arange(len(sizes)), sizes, size,
                                            [f"encoded frame {i}" for i in range(len(sizes))])
                except ValueError as exc:
                    raise OutputError(f"Expected whole zstd frames from nvCOMP for {stored.root}. Got "
                                      f"{exc} instead.") from None
            parts = [host[at + i * slot:at + i * slot + int(n)] for i, n in enumerate(sizes)]
            futures += _writer.write_chunks(stored, start // stored.unit, parts, [size] * len(parts), io_threads())
        return futures

    def _encode_into_slots(self, stored: _layout.Stored, flat, frames: int, size: int, stream):
        """Encode ``frames`` frames of ``size`` bytes of ``flat`` into one device buffer of fixed slots,
        each as large as nvCOMP's bound for a frame: the buffer, the slot and each frame's bytes. A
        frame nvCOMP did not encode raises :class:`batchlu.errors.OutputError`: nothing is written."""
        import cupy

        algorithm = stored.frames.algorithm
        slot = -(-_nvcomp.max_frame_bytes(algorithm, size) // _reader.ALIGN) * _reader.ALIGN
        device = cupy.empty(frames * slot, cupy.uint8)
        sizes, status = self._codec(algorithm, stream).encode(flat, [i * size for i in range(frames)], size,
                                                              device, slot)
        for i, (n, code) in enumerate(zip(sizes, status)):
            if code != 0 or not 0 < n <= slot:
                raise OutputError(f"Expected nvCOMP to encode every {algorithm} frame of {stored.root}. Got "
                                  f"frame {i} of {frames} ({size} bytes) with status {code} "
                                  f"({_nvcomp.STATUS.get(int(code), 'unknown')}) and {n} bytes instead.")
        return device, slot, sizes

    def close(self) -> None:
        """Let go of the codecs' scratch memory and the pinned buffers (at exit, before CUDA is torn
        down)."""
        try:
            self.read_stream.synchronize()
            self.write_stream.synchronize()
        except Exception:
            pass
        self._codecs.clear()
        self._read = [_Pinned(), _Pinned()]
        self._write = [_Pinned(), _Pinned()]


def after(stream, producer) -> None:
    """Order ``stream``'s next work after everything queued so far on ``producer``, on the device:
    a non-blocking stream does not wait for the legacy default stream, nor for any other stream, by
    itself, so a copy on it could read a value whose kernel or copy has not finished."""
    if producer.ptr != stream.ptr:
        stream.wait_event(producer.record())


def _get_async(value, out: np.ndarray, stream) -> None:
    try:
        value.get(stream=stream, out=out, blocking=False)
    except TypeError:  # CuPy without ``blocking``: the copy then waits for the stream
        value.get(stream=stream, out=out)


# Lanes per worker process and GPU: measured on an H100 (16 cores, sharded float64 n = 128), 2 lanes
# moved 2.85 GB/s end to end, 1 lane 2.46, 3 lanes 2.57; each lane holds 4 pinned staging buffers and
# nvCOMP's scratch memory (about 3.6 GB for a 512 MiB group of 256 KiB frames), so a worker with many
# threads must not make one per thread
LANES = 2

_LOCAL = threading.local()
_LANES: weakref.WeakSet = weakref.WeakSet()
_POOL_LOCK = threading.Lock()
_FREE: dict[int, queue.LifoQueue] = {}


def _new_lane(device: int) -> Lane:
    made = Lane(device)
    if not _LANES:
        atexit.register(_close_all)
    _LANES.add(made)
    return made


@contextlib.contextmanager
def borrow(device: int):
    """One of this process's :data:`LANES` lanes on ``device`` for the ``with`` block, waiting for
    one to be free (the batch loop of a task; the worker's other task threads wait here)."""
    with _POOL_LOCK:
        free = _FREE.get(device)
        if free is None:
            free = _FREE[device] = queue.LifoQueue()
            for _ in range(LANES):
                free.put(None)   # made at first use
    current = free.get()
    try:
        if current is None:
            current = _new_lane(device)
        yield current
    finally:
        free.put(current)


def lane(device: int) -> Lane:
    """The calling thread's own :class:`Lane` on ``device`` (made at first use; tests and tools)."""
    current = getattr(_LOCAL, "lane", None)
    if current is None or current.device != device:
        current = _LOCAL.lane = _new_lane(device)
    return current


def _close_all() -> None:
    for each in list(_LANES):
        each.close()
