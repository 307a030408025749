"""GPU CRC-32 of byte ranges of a device buffer: the launches of ``kernels/cuda/crc32.cu``.

:func:`registers` returns ``R(0, range)`` for each range (see :mod:`batchlu.pipeline._crc32`, which
turns registers into zlib's CRC-32 and joins ranges); the pipeline's GPU codec path uses it for the
checksums of the input chunks it decodes on the device.
"""

from __future__ import annotations

import numpy as np

from batchlu.pipeline import _crc32

from ._runtime import kernel

FAMILY = "crc32"
SEGMENT = 256  # bytes per thread in the first pass
THREADS = 256
NAMES = ("blu::crc32_segments", "blu::crc32_join")  # compiled together


def registers(buffer, offsets, lengths) -> np.ndarray:
    """``R(0, .)`` of ``buffer``'s bytes ``[offsets[r], offsets[r] + lengths[r])`` for each ``r``
    (uint32, on the host), computed on the current stream; ``buffer`` is a C-contiguous CuPy array."""
    import cupy

    ranges = len(offsets)
    if ranges == 0:
        return np.zeros(0, np.uint32)
    segments = _crc32.padded_segments(max(int(x) for x in lengths), SEGMENT)
    base = buffer.reshape(-1).view(cupy.uint8)
    offs = cupy.asarray(np.asarray(offsets, np.int64))
    lens = cupy.asarray(np.asarray(lengths, np.int64))
    values = cupy.empty(ranges * segments, cupy.uint32)
    total = ranges * segments
    first = kernel(FAMILY, "blu::crc32_segments", NAMES)
    first((-(-total // THREADS),), (THREADS,), (base, offs, lens, values, np.int32(SEGMENT),
                                               np.int64(segments), np.int32(ranges)))
    join = kernel(FAMILY, "blu::crc32_join", NAMES)
    for matrix in _crc32.tree(segments * SEGMENT, SEGMENT):
        segments //= 2
        out = cupy.empty(ranges * segments, cupy.uint32)
        join((-(-(ranges * segments) // THREADS),), (THREADS,),
             (values, out, cupy.asarray(np.asarray(matrix, np.uint32)), np.int64(segments), np.int32(ranges)))
        values = out
    return values.get()
