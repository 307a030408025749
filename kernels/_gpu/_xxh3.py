"""GPU XXH3-64 of byte ranges of a device buffer: the launches of ``kernels/cuda/xxh3.cu``.

:func:`digests` returns the XXH3-64 (xxHash's, seed 0) of each range, the values the ``xxhash``
package gives for the same bytes on the host; the pipeline's GPU codec path uses it for the
checksums of the input chunks it decodes on the device (see :mod:`batchlu.pipeline.output._xxh3`).
"""

from __future__ import annotations

import numpy as np

from batchlu.pipeline.output import _xxh3

from ._runtime import kernel

FAMILY = "xxh3"
THREADS = 256
NAMES = ("blu::xxh3_blocks", "blu::xxh3_lanes")  # compiled together


def digests(buffer, offsets, lengths) -> np.ndarray:
    """XXH3-64 of ``buffer``'s bytes ``[offsets[r], offsets[r] + lengths[r])`` for each ``r`` (uint64,
    on the host), computed on the current stream; ``buffer`` is a C-contiguous CuPy array. A range of
    at most :data:`batchlu.pipeline.output._xxh3.SHORT` bytes, or not on 4-byte boundaries, is copied to the
    host and hashed there."""
    import cupy
    import xxhash

    offsets = np.asarray(offsets, np.int64)
    lengths = np.asarray(lengths, np.int64)
    out = np.zeros(offsets.size, np.uint64)
    base = buffer.reshape(-1).view(cupy.uint8)
    aligned = (buffer.data.ptr % 4 == 0)
    device = (lengths > _xxh3.SHORT) & (offsets % 4 == 0) & (lengths % 4 == 0) & aligned
    for r in np.flatnonzero(~device):
        out[r] = xxhash.xxh3_64(base[offsets[r]:offsets[r] + lengths[r]].get().tobytes()).intdigest()
    index = np.flatnonzero(device)
    if index.size == 0:
        return out
    ranges = int(index.size)
    blocks = (lengths[index] - 1) // _xxh3.BLOCK
    widest = max(1, int(blocks.max()))
    offs = cupy.asarray(offsets[index])
    sums = cupy.empty(ranges * widest * 8, cupy.uint64)
    first = kernel(FAMILY, "blu::xxh3_blocks", NAMES)
    first((-(-(ranges * widest) // THREADS),), (THREADS,),
          (base, offs, cupy.asarray(blocks), sums, np.int64(widest), np.int32(ranges)))
    acc = cupy.empty(ranges * 8, cupy.uint64)
    lanes = kernel(FAMILY, "blu::xxh3_lanes", NAMES)
    lanes((-(-(ranges * 8) // THREADS),), (THREADS,),
          (base, offs, cupy.asarray(lengths[index]), sums, acc, np.int64(widest), np.int32(ranges)))
    acc = acc.get().reshape(ranges, 8)
    for i, r in enumerate(index):
        out[r] = _xxh3.merge(acc[i], int(lengths[r]))
    return out
