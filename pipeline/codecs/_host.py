"""The host half of the codec path, for CPU runs: an input's chunk files read and decoded straight
into the batch's slot, and raw outputs written from the slot as chunk files, without zarr's codec
pipeline in between.

zarr-python reads each chunk file into a new buffer, decodes it into another, copies that into the
slot, and on the way out copies each chunk once more to append its CRC-32C. Each of those buffers is
tens of MiB of fresh pages, and page faults are what a CPU run spends most of its kernel time on. Here
a task's thread reads the frames into one buffer it keeps (:func:`batchlu.pipeline.codecs._reader.read_frames`),
checks each (its crc32c trailer, or a zstd frame's structure and declared size), decodes a zstd frame
with numcodecs (zarr's own zstd) straight into the slot, and writes an output chunk from the slot with
its trailer in one ``writev`` (:func:`batchlu.pipeline.codecs._writer.write_object`). The values are
those zarr reads and the files those zarr writes, byte for byte (tests/pipeline/codecs/test_host.py);
``benchmarks/bench_host_frames.py`` measures the difference (docs/performance.md, "Chunk files on the CPU").

Where this path cannot be exact, it declines and zarr does the work, as before: a chunk that is not
stored (zarr's fill value, and the missing-chunk rules), a frame that fails a check or does not
decode (zarr then names the corrupt chunk, or reads what it reads), codecs other than raw bytes or
zstd, a partial output chunk. :func:`arrays` says which of a task's arrays it takes.
"""

from __future__ import annotations

import threading

import numpy as np

from ..errors import FrameError
from ..store._layout import Stored, describe
from . import _frames, _reader, _writer

__all__ = ["arrays", "read", "write"]

READS = ("none", "zstd")   # the frames this path decodes; the rest goes through zarr


def arrays(inputs: dict, outputs: dict) -> dict[str, Stored]:
    """The :class:`Stored` layout of each of ``inputs`` (name -> zarr array) whose frames this path
    reads, and of each of ``outputs`` it writes (raw bytes, with or without crc32c, chunk files)."""
    found = {}
    for name, array in inputs.items():
        stored, _ = describe(array)
        if stored is not None and stored.frames.algorithm in READS:
            found[name] = stored
    for name, array in outputs.items():
        stored, _ = describe(array)
        if stored is not None and stored.frames.algorithm == "none" and not stored.sharded:
            found[name] = stored
    return found


_LOCAL = threading.local()


def _buffer(nbytes: int) -> np.ndarray:
    """This thread's grow-only read buffer, ``nbytes`` of it: its pages stay faulted in from batch to
    batch."""
    buffer = getattr(_LOCAL, "buffer", None)
    if buffer is None or buffer.nbytes < nbytes:
        buffer = _LOCAL.buffer = np.empty(max(nbytes, 1 << 20), np.uint8)
    return buffer[:nbytes]


def _scratch(nbytes: int) -> np.ndarray:
    """This thread's grow-only buffer for a frame only part of which the batch takes."""
    scratch = getattr(_LOCAL, "scratch", None)
    if scratch is None or scratch.nbytes < nbytes:
        scratch = _LOCAL.scratch = np.empty(nbytes, np.uint8)
    return scratch[:nbytes]


def _decode(stored: Stored, buffer: np.ndarray, offset: int, size: int, label: str, into: np.ndarray) -> None:
    """Decode one stored chunk's bytes, ``buffer[offset:offset + size]``, into ``into`` (uint8, the
    chunk's decoded bytes exactly), checked first; :class:`FrameError` if a check fails."""
    offset, size = _frames.payload(stored.frames, buffer, offset, size, label)
    if stored.frames.algorithm == "none":
        if size != into.nbytes:
            raise FrameError(f"the chunk {label} holds {size} bytes; its matrices take {into.nbytes}")
        np.copyto(into, buffer[offset:offset + size])
        return
    # the frame's declared size must be the chunk's: numcodecs decodes as many bytes as a frame
    # declares, and would leave the rest of ``into`` as it was (a crc32c trailer cannot say that)
    _frames.zstd_check(buffer, offset, size, into.nbytes, label)
    from numcodecs import Zstd

    Zstd().decode(buffer[offset:offset + size], out=into)


def _largest(stored: Stored, matrices: int) -> int:
    """The most bytes a stored chunk of ``matrices`` matrices can take: its values, or a zstd frame
    of them (ZSTD_COMPRESSBOUND, with a margin for the frame header and checksum), with its
    header and crc32c trailer."""
    raw = matrices * stored.matrix_bytes
    if stored.frames.algorithm == "zstd":
        raw += (raw >> 8) + (((128 << 10) - raw) >> 11 if raw < 128 << 10 else 0) + 64
    return raw + stored.frames.head + (4 if stored.frames.crc32c else 0)


def read(stored: Stored, start: int, stop: int, out: np.ndarray) -> bool:
    """``out[...] = array[start:stop]`` from the array's chunk files; False, with ``out`` in any
    state, where this path declines (see the module docstring) and zarr must read it."""
    if out.dtype != np.dtype(stored.dtype) or not out.flags.c_contiguous:
        return False
    flat = out.reshape(len(out), -1).view(np.uint8)
    per = stored.matrix_bytes
    try:
        # a shard's inner chunks outside the batch are not read
        reads = [r for r in _reader.plan_reads(stored, start, stop) if r.first < stop and r.first + r.matrices > start]
        if any(r.missing for r in reads):
            return False
        sizes = _reader.frame_sizes(reads)
        if not all(sizes):
            return False
        # a chunk file larger than any frame of its matrices (extended, or a sparse file of terabytes)
        # would size this thread's kept buffer: zarr reads it instead, and names it
        if any(size > _largest(stored, r.matrices) for r, size in zip(reads, sizes)):
            return False
        offsets, total = _reader.aligned(sizes)
        buffer = _buffer(total)
        _reader.read_frames(reads, sizes, offsets, buffer)
        for r, offset, size in zip(reads, offsets, sizes):
            lo, hi = max(r.first, start), min(r.first + r.matrices, stop)
            if r.first >= start and r.first + r.matrices <= stop:   # the whole chunk lands in out
                _decode(stored, buffer, offset, size, r.label, flat[lo - start:hi - start].reshape(-1))
            else:   # the array's last chunk, or one that reaches outside the batch
                chunk = _scratch(r.matrices * per)
                _decode(stored, buffer, offset, size, r.label, chunk)
                flat[lo - start:hi - start] = chunk.reshape(r.matrices, per)[lo - r.first:hi - r.first]
    except (FrameError, ValueError, RuntimeError, OSError, OverflowError):
        return False   # zarr reads it, and names the chunk that fails (OverflowError: an offset
                       # past what a file can hold, from a shard index that passes its CRC)
    return True


def write(stored: Stored, start: int, stop: int, values: np.ndarray, fill) -> bool:
    """Write matrices ``[start, stop)`` of a raw output from ``values`` as its chunk files, each with
    its crc32c trailer where the array has the codec; the array's last chunk is padded with its
    ``fill`` value, as zarr pads it. False where ``[start, stop)`` is not whole chunks (zarr writes
    it then)."""
    unit, count = stored.unit, stored.shape[0]
    if start % unit or (stop % unit and stop != count) or values.dtype != np.dtype(stored.dtype):
        return False
    values = np.ascontiguousarray(values)
    for obj in range(start // unit, -(-stop // unit)):
        lo, hi = obj * unit, min((obj + 1) * unit, count)
        parts = [values[lo - start:hi - start]]
        if hi - lo < unit:
            parts.append(np.full((unit - (hi - lo),) + tuple(stored.shape[1:]), fill, values.dtype))
        _writer.write_object(stored.path(obj), stored.frames, [parts])
    return True

