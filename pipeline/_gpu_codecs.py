"""The GPU half of the codec path: nvCOMP decodes a batch's stored frames on the device and encodes
its outputs there (worker side; CuPy and nvCOMP are imported only inside the functions).

A :class:`Lane` belongs to one worker thread (the Dask thread that runs tasks) and lives as long as
it: its reader and writer streams, one nvCOMP codec object per stream and algorithm (nvCOMP wants a
codec per thread), and grow-only pinned staging buffers. The batch loop's reader and writer threads
(:mod:`batchlu.pipeline._device_batches`) use the lane of the task that started them, one task at a
time.

* :meth:`Lane.decode`: the frames of matrices ``[start, stop)`` (:func:`batchlu.pipeline._codecs.plan_reads`)
  are read into pinned memory by a few I/O threads, their crc32c trailers checked, copied to the
  device in one transfer and decoded by one nvCOMP call straight into the batch's device array. Every
  frame must decode to exactly its chunk's bytes; anything else raises :class:`FrameError` naming the
  chunk (the batch loop then reads the batch through zarr on the host, which names a corrupt chunk
  file or, where zarr reads what nvCOMP would not, uses its values).
* :meth:`Lane.encode`: one nvCOMP call encodes every (inner) chunk of an output batch; the frames come
  back to pinned memory in one transfer per frame and are written as chunk files or shards
  (:func:`batchlu.pipeline._codecs.write_chunks`). nvCOMP's zstd and LZ4 encoders are deterministic,
  so a chunk computed again (resume, a restarted worker) is stored byte for byte as before.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from batchlu.errors import FrameError

from . import _codecs

__all__ = ["FrameError", "Lane", "lane", "missing"]

IO_THREADS = 8   # file reads and writes in flight per worker process


def missing() -> str | None:
    """Run on each worker: None when nvCOMP imports here, else why not (one line)."""
    try:
        from nvidia import nvcomp  # noqa: F401
    except Exception as exc:
        return f"nvCOMP is not installed on the workers ({type(exc).__name__}: {exc})"
    return None


_IO_LOCK = threading.Lock()
_IO: list[ThreadPoolExecutor] = []


def io_threads() -> ThreadPoolExecutor:
    with _IO_LOCK:
        if not _IO:
            _IO.append(ThreadPoolExecutor(IO_THREADS, thread_name_prefix="batchlu-frames"))
        return _IO[0]


class _Pinned:
    """A grow-only page-locked host buffer."""

    def __init__(self):
        self.array = np.empty(0, np.uint8)
        self._memory = None

    def get(self, nbytes: int) -> np.ndarray:
        import cupy

        if self.array.nbytes < nbytes:
            size = max(int(nbytes * 1.25), 1 << 20)
            self._memory = cupy.cuda.alloc_pinned_memory(size)
            self.array = np.frombuffer(self._memory, np.uint8, size)
        return self.array[:nbytes]


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
        self._write = _Pinned()

    def _codec(self, algorithm: str, stream):
        from nvidia import nvcomp

        key = (algorithm, stream.ptr)
        codec = self._codecs.get(key)
        if codec is None:
            codec = self._codecs[key] = nvcomp.Codec(algorithm=algorithm, device_id=self.device,
                                                     cuda_stream=stream.ptr,
                                                     bitstream_kind=nvcomp.BitstreamKind.RAW)
        return codec

    # ---------------------------------------------------------------------------------- decode
    def decode(self, stored: _codecs.Stored, start: int, stop: int, parity: int):
        """Matrices ``[start, stop)`` of ``stored``'s array, decoded on the device: a CuPy array of
        shape ``(stop - start,) + shape[1:]`` on this lane's read stream (synchronised). Chunks not
        stored come back as zeros (the missing-chunk check decides what that means)."""
        import cupy
        from nvidia import nvcomp

        reads = _codecs.plan_reads(stored, start, stop)
        sizes = _codecs.frame_sizes(reads)
        offsets, total = _codecs.aligned(sizes)
        host = self._read[parity].get(max(total, 1))
        try:
            _codecs.read_frames(reads, sizes, offsets, host, io_threads())
        except (OSError, ValueError) as exc:
            raise FrameError(str(exc)) from exc
        first = reads[0].first
        end = reads[-1].first + reads[-1].matrices
        per = stored.matrix_bytes
        frames = []   # (frame offset, frame length, destination offset, destination length)
        for r, size, at in zip(reads, sizes, offsets):
            if size == 0:
                continue
            try:
                offset, length = _codecs.payload(stored.frames, host, at, size, r.label)
            except ValueError as exc:
                raise FrameError(str(exc)) from exc
            frames.append((offset, length, (r.first - first) * per, r.matrices * per, r.label))
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
                    src = nvcomp.as_arrays(staged, [f[0] for f in frames], [f[1] for f in frames], stream.ptr)
                    dst = nvcomp.as_arrays(out, [f[2] for f in frames], [f[3] for f in frames], stream.ptr)
                    try:
                        decoded = codec.decode(src, out=dst)
                        got = list(decoded.buffer_sizes)
                    except Exception as exc:
                        raise FrameError(f"nvCOMP could not decode the chunks {frames[0][4]} to "
                                         f"{frames[-1][4]}: {type(exc).__name__}: {exc}") from exc
                    for (_, _, _, want, label), size in zip(frames, got):
                        if int(size) != want:
                            raise FrameError(f"the chunk {label} decodes to {size} bytes; its matrices take {want}")
        stream.synchronize()
        lo = (start - first) * per
        return out[lo:lo + (stop - start) * per].view(np.dtype(stored.dtype)).reshape((stop - start,) + stored.shape[1:])

    # ---------------------------------------------------------------------------------- encode
    def encode(self, stored: _codecs.Stored, start: int, value) -> None:
        """Encode ``value`` (matrices from ``start`` on, whole stored objects, the array's last one
        possibly partial) and write it as ``stored``'s chunk files or shards."""
        import cupy
        from nvidia import nvcomp

        per = stored.matrix_bytes
        count = value.shape[0]
        padded = -(-count // stored.inner) * stored.inner
        stream = self.write_stream
        with cupy.cuda.Device(self.device), stream:
            flat = cupy.ascontiguousarray(value).reshape(-1).view(cupy.uint8)
            if padded != count:   # the array's last chunk: zarr stores it whole
                full = cupy.zeros(padded * per, cupy.uint8)
                full[:flat.size] = flat
                flat = full
            size = stored.inner * per
            frames = padded // stored.inner
            if stored.frames.algorithm == "none":
                host = self._write.get(flat.size)
                flat.get(stream=stream, out=host)
                stream.synchronize()
                parts = [host[i * size:(i + 1) * size] for i in range(frames)]
            else:
                codec = self._codec(stored.frames.algorithm, stream)
                src = nvcomp.as_arrays(flat, [i * size for i in range(frames)], [size] * frames, stream.ptr)
                encoded = codec.encode(src)
                sizes = [int(s) for s in encoded.buffer_sizes]
                offsets, total = _codecs.aligned(sizes)
                host = self._write.get(max(total, 1))
                for i in range(frames):
                    frame = cupy.asarray(encoded[i])
                    if sizes[i]:
                        cupy.cuda.runtime.memcpyAsync(host[offsets[i]:].ctypes.data, frame.data.ptr, sizes[i],
                                                      cupy.cuda.runtime.memcpyDeviceToHost, stream.ptr)
                stream.synchronize()
                del encoded
                parts = [host[offsets[i]:offsets[i] + sizes[i]] for i in range(frames)]
        _codecs.write_chunks(stored, start // stored.unit, parts, [size] * frames, io_threads())


    def close(self) -> None:
        """Let go of the codecs and pinned buffers (before CUDA is torn down at exit: nvCOMP's codec
        objects freed after that print "context is destroyed")."""
        try:
            self.read_stream.synchronize()
            self.write_stream.synchronize()
        except Exception:
            pass
        self._codecs.clear()
        self._read = [_Pinned(), _Pinned()]
        self._write = _Pinned()


_LOCAL = threading.local()
_LANES: weakref.WeakSet = weakref.WeakSet()


def lane(device: int) -> Lane:
    """The calling thread's :class:`Lane` on ``device`` (made at first use)."""
    current = getattr(_LOCAL, "lane", None)
    if current is None or current.device != device:
        current = _LOCAL.lane = Lane(device)
        if not _LANES:
            atexit.register(_close_all)
        _LANES.add(current)
    return current


def _close_all() -> None:
    for each in list(_LANES):
        each.close()
