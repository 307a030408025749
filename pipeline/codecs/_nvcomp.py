"""nvCOMP's batched C API (``libnvcomp``, from the ``nvidia-libnvcomp-cu12`` / ``-cu13`` wheel), called
through ctypes: the GPU codec path's zstd and LZ4 (worker side; CuPy is imported inside the methods).

Why the C API and not nvCOMP's Python package: the Python API holds the GIL for the whole of each call
(measured on an H100: 13-17 ms for a 512 MiB decode, 64 ms for an encode), and the batch loop's reader
and writer threads, which read and write the chunk files, stall for that long. ctypes lets the GIL go
around each C call, and these calls only queue work on a stream: the wait is a CuPy stream
synchronisation, which lets it go too. The same frames come out (RAW bitstreams, checked byte for byte
against the Python API on the H100).

A :class:`Batch` belongs to one stream of one worker thread: it keeps the stream's scratch memory
(nvCOMP's temporary buffer, grow-only, from CuPy's pool) and the pointer tables of the last call.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from batchlu.errors import DependencyError, GPUCodecError

__all__ = ["ALGORITHMS", "Batch", "MAJOR", "library", "max_frame_bytes", "missing"]

ALGORITHMS = {"zstd": "Zstd", "lz4": "LZ4"}
MAJOR = 6   # the C API's signatures are nvCOMP 6's
# bytes one frame may decode from, per algorithm, when encoding (lz4.h: 16 MiB; zstd.h: 2 GiB - 1)
ENCODE_LIMIT = {"zstd": (1 << 31) - 1, "lz4": 1 << 24}
STATUS = {10: "invalid value", 11: "not supported", 12: "cannot decompress", 13: "bad checksum",
          15: "output buffer too small", 17: "alignment", 18: "chunk size too large", 19: "cannot compress",
          20: "wrong input length", 21: "batch size too large", 1000: "CUDA error", 10000: "internal error"}


class _Options(ctypes.Structure):
    """Every algorithm's options struct here is 64 bytes whose zeros are nvCOMP's defaults (zstd: the
    default backend; LZ4: byte data, no bitshuffle, the default backend)."""

    _fields_ = [("raw", ctypes.c_char * 64)]


def missing() -> str | None:
    """None when nvCOMP's C library loads here and is version 6, else why not (one line)."""
    try:
        library()
    except Exception as exc:
        return f"nvCOMP is not installed on the workers ({exc})"
    return None


@functools.cache
def library():
    """libnvcomp as a ctypes library, its batched zstd and LZ4 functions declared."""
    try:
        from nvidia import libnvcomp
    except ImportError as exc:
        raise DependencyError(f"Expected the nvidia-libnvcomp-cu12 or -cu13 package. Got {exc} instead.") from None
    version = str(getattr(libnvcomp, "__version__", "0"))
    if int(version.split(".")[0]) != MAJOR:
        raise DependencyError(f"Expected nvCOMP {MAJOR} (nvidia-libnvcomp-cu1x=={MAJOR}.*). Got {version} instead.")
    lib = libnvcomp.load_library()
    if lib is None:
        raise DependencyError("Expected nvidia.libnvcomp.load_library() to load libnvcomp. Got None instead.")
    p, s, opts = ctypes.c_void_p, ctypes.c_size_t, _Options
    for name in ALGORITHMS.values():
        signatures = {
            f"nvcompBatched{name}DecompressGetTempSize": [s, s, opts, ctypes.POINTER(s), s, p],
            f"nvcompBatched{name}DecompressAsync": [p, p, p, p, s, p, s, p, opts, p, p],
            f"nvcompBatched{name}CompressGetTempSize": [s, s, opts, ctypes.POINTER(s), s, p],
            f"nvcompBatched{name}CompressGetMaxOutputChunkSize": [s, opts, ctypes.POINTER(s)],
            f"nvcompBatched{name}CompressAsync": [p, p, s, s, p, s, p, p, opts, p, p],
        }
        for function, argtypes in signatures.items():
            f = getattr(lib, function)
            f.argtypes = argtypes
            f.restype = ctypes.c_int
    return lib


def _call(function, *args) -> None:
    status = function(*args)
    if status != 0:
        raise GPUCodecError(f"Expected nvCOMP's {function.__name__} to succeed. Got status {status} "
                            f"({STATUS.get(status, 'unknown')}) instead.")


@functools.cache
def max_frame_bytes(algorithm: str, size: int) -> int:
    """The most bytes nvCOMP's encoder writes for a frame of ``size`` bytes."""
    out = ctypes.c_size_t()
    _call(getattr(library(), f"nvcompBatched{ALGORITHMS[algorithm]}CompressGetMaxOutputChunkSize"),
          size, _Options(), ctypes.byref(out))
    return int(out.value)


class Batch:
    """One stream's nvCOMP calls for one algorithm (see the module docstring)."""

    def __init__(self, algorithm: str, stream):
        self.algorithm = algorithm
        self.name = ALGORITHMS[algorithm]
        self.stream = stream
        self._temp = None

    def _scratch(self, nbytes: int):
        import cupy

        if self._temp is None or self._temp.size < nbytes:
            self._temp = None
            self._temp = cupy.empty(max(nbytes, 1), cupy.uint8)
        return self._temp

    def _table(self, columns: list[np.ndarray]):
        """``columns`` (n each) as one uint64 device table, copied on the stream."""
        import cupy

        host = np.ascontiguousarray(np.stack([np.asarray(c, np.uint64) for c in columns]))
        table = cupy.empty(host.shape, cupy.uint64)
        table.set(host, stream=self.stream)
        return table

    def decode(self, src, src_offsets, src_sizes, dst, dst_offsets, dst_sizes) -> tuple[np.ndarray, np.ndarray]:
        """Decode the frames at ``src_offsets`` (``src_sizes`` bytes) of device buffer ``src`` into
        ``dst`` at ``dst_offsets`` (room for ``dst_sizes`` bytes each). Returns the bytes each frame
        decoded to and nvCOMP's status of each (0: success), after the stream finished."""
        import cupy

        lib = library()
        n = len(src_offsets)
        dst_sizes = np.asarray(dst_sizes, np.uint64)
        table = self._table([src.data.ptr + np.asarray(src_offsets, np.uint64), src_sizes, dst_sizes,
                             dst.data.ptr + np.asarray(dst_offsets, np.uint64)])
        result = cupy.empty(2 * n, cupy.uint64)   # decoded bytes, then the statuses (int32, in the upper half)
        temp = ctypes.c_size_t()
        _call(getattr(lib, f"nvcompBatched{self.name}DecompressGetTempSize"), n, int(dst_sizes.max()),
              _Options(), ctypes.byref(temp), int(dst_sizes.sum()), self.stream.ptr)
        scratch = self._scratch(temp.value)
        statuses = result[n:].view(cupy.int32)[:n]
        _call(getattr(lib, f"nvcompBatched{self.name}DecompressAsync"), table[0].data.ptr, table[1].data.ptr,
              table[2].data.ptr, result.data.ptr, n, scratch.data.ptr, temp.value, table[3].data.ptr, _Options(),
              statuses.data.ptr, self.stream.ptr)
        host = result.get(stream=self.stream)
        return host[:n].astype(np.int64), host[n:].view(np.int32)[:n].copy()

    def encode(self, src, src_offsets, size: int, dst, slot: int) -> tuple[np.ndarray, np.ndarray]:
        """Encode the frames of ``size`` bytes at ``src_offsets`` of device buffer ``src`` into slots
        of ``slot`` bytes of ``dst`` (frame ``i`` at ``i * slot``; ``slot`` at least
        :func:`max_frame_bytes`). Returns each frame's encoded bytes and nvCOMP's status of each, after
        the stream finished."""
        import cupy

        lib = library()
        n = len(src_offsets)
        table = self._table([src.data.ptr + np.asarray(src_offsets, np.uint64), np.full(n, size, np.uint64),
                             dst.data.ptr + np.arange(n, dtype=np.uint64) * np.uint64(slot)])
        result = cupy.empty(2 * n, cupy.uint64)
        temp = ctypes.c_size_t()
        _call(getattr(lib, f"nvcompBatched{self.name}CompressGetTempSize"), n, size, _Options(),
              ctypes.byref(temp), n * size, self.stream.ptr)
        scratch = self._scratch(temp.value)
        statuses = result[n:].view(cupy.int32)[:n]
        _call(getattr(lib, f"nvcompBatched{self.name}CompressAsync"), table[0].data.ptr, table[1].data.ptr, size, n,
              scratch.data.ptr, temp.value, table[2].data.ptr, result.data.ptr, _Options(), statuses.data.ptr,
              self.stream.ptr)
        host = result.get(stream=self.stream)
        return host[:n].astype(np.int64), host[n:].view(np.int32)[:n].copy()
