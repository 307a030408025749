"""Writing encoded frames back as chunk files, or as whole shards with their index, that plain
zarr-python reads: where the array has zarr's crc32c codec (batchlu's outputs by default,
``batchlu.output-checksum``), each chunk's CRC-32C trailer is computed here, on the host, in the I/O
thread that writes the file.
"""

from __future__ import annotations

import numpy as np

from ..store._files import write_file
from ..store._layout import EMPTY, Frames, Stored
from ._frames import crc32c

__all__ = ["trailer", "wrap", "write_chunks", "write_object"]


def wrap(frames: Frames, frame, decoded_bytes: int) -> list:
    """A stored chunk's parts around an encoded ``frame``: numcodecs' LZ4 header; the crc32c trailer
    is added by :func:`write_object`, as the file is written."""
    if frames.head:
        return [int(decoded_bytes).to_bytes(4, "little"), frame]
    return [frame]


def trailer(parts) -> bytes:
    """zarr's crc32c trailer of a chunk made of ``parts``: the CRC-32C of all of them, 4 bytes
    little-endian, as the codec appends it."""
    crc = 0
    for part in parts:
        crc = crc32c(part, crc)
    return crc.to_bytes(4, "little")


def write_object(path: str, frames: Frames, chunks: list, head=(), tail=()) -> None:
    """Write one stored object: ``head``, each chunk's parts (from :func:`wrap`) followed by its
    crc32c trailer where the array has zarr's crc32c codec, then ``tail`` (a shard's index before or
    after its chunks). The trailers are computed here, in the I/O thread that writes the file, not in
    the thread that encodes the next group."""
    parts = list(head)
    for chunk in chunks:
        parts += chunk
        if frames.crc32c:
            parts.append(trailer(chunk))
    write_file(path, parts + list(tail))


def write_chunks(stored: Stored, first_object: int, frames: list, decoded_bytes: list[int], pool=None) -> list:
    """Write encoded chunks of consecutive stored objects from ``first_object`` on: one chunk file per
    frame, or (sharded) one shard per ``per_shard`` frames with its index (and its CRC-32C). Where the
    array has zarr's crc32c codec, each chunk ends with its trailer (:func:`write_object`).
    ``decoded_bytes[i]`` is the size frame ``i`` decodes to (numcodecs' LZ4 header keeps it). With a
    ``pool``, the files are written there and the futures of the writes come back (the caller waits
    for them, and keeps ``frames`` alive until then); without, they are written here and the list is
    empty."""
    jobs = []
    if not stored.sharded:
        for i, frame in enumerate(frames):
            jobs.append((stored.path(first_object + i), [wrap(stored.frames, frame, decoded_bytes[i])], (), ()))
    else:
        k = stored.per_shard
        extra = 4 if stored.frames.crc32c else 0
        for s in range(-(-len(frames) // k)):
            chunks = [wrap(stored.frames, f, d) for f, d in zip(frames[s * k:(s + 1) * k],
                                                                   decoded_bytes[s * k:(s + 1) * k])]
            index = np.full((k, 2), EMPTY, "<u8")
            at = 0 if stored.index_at_end else stored.index_bytes
            for i, parts in enumerate(chunks):
                size = sum(len(memoryview(p).cast("B")) for p in parts) + extra
                index[i] = (at, size)
                at += size
            body = index.tobytes()
            index_parts = [body, crc32c(body).to_bytes(4, "little")]
            head, tail = ((), index_parts) if stored.index_at_end else (index_parts, ())
            jobs.append((stored.path(first_object + s), chunks, head, tail))
    if pool is None:
        for path, chunks, head, tail in jobs:
            write_object(path, stored.frames, chunks, head, tail)
        return []
    return [pool.submit(write_object, path, stored.frames, chunks, head, tail) for path, chunks, head, tail in jobs]
