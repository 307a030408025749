"""A stored chunk's bytes around its codec frame, checked on the host before anything decodes them.

* :func:`crc32c`: the checksum zarr's ``crc32c`` codec appends to each chunk (and to a shard's index);
* :func:`payload`: the codec frame inside one stored chunk: its crc32c trailer checked, numcodecs'
  LZ4 size header skipped;
* :func:`zstd_check` / :func:`zstd_check_many`: a zstd frame parser that checks a frame's structure
  (magic number, declared size, block headers chained to its end), for frames without a checksum:
  nvCOMP cannot be relied on to notice a damaged frame, and a run must never compute from one;
* :func:`faults`: the CRC-32C trailers of stored chunk files and shards checked without decoding
  them (what ``--resume`` does to the chunks it trusts).
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import FrameError
from ..store._layout import EMPTY, Frames, Stored

__all__ = ["crc32c", "faults", "object_fault", "payload", "zstd_check", "zstd_check_many"]


def _crc32c_extend():
    """``extend(crc, data)`` of the CRC-32C library at hand: the ``crc32c`` package where it is
    installed (it releases the GIL, so the I/O threads checksum in parallel), else ``google_crc32c``
    (zarr's codec's own library, which holds the GIL). Both give the same values."""
    global _EXTEND
    if _EXTEND is None:
        try:
            import crc32c as package
            _EXTEND = lambda crc, data: package.crc32c(data, crc)
        except ImportError:
            import google_crc32c
            _EXTEND = google_crc32c.extend
    return _EXTEND


_EXTEND = None


def crc32c(data, crc: int = 0) -> int:
    """CRC-32C of ``data`` (bytes-like), continuing ``crc``: the value zarr's ``crc32c`` codec appends."""
    # read in place (no copy: 6x faster); google_crc32c takes bytes and NumPy arrays, not memoryviews
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    elif not isinstance(data, bytes):
        data = np.frombuffer(memoryview(data).cast("B"), np.uint8)
    return int(_crc32c_extend()(crc, data))


def zstd_check(buffer: np.ndarray, offset: int, size: int, want: int, label: str) -> None:
    """Check that ``buffer[offset:offset + size]`` is one whole zstd frame that declares ``want``
    decoded bytes: the magic number, a frame header with the content size, then blocks whose headers
    chain exactly to the frame's end through a last block (and its content checksum, if flagged).
    A frame cut short, run on, or with a damaged header or block header fails here, on the host,
    before nvCOMP sees it (RFC 8878, section 3.1.1); a flipped bit inside a compressed block is
    beyond any check without a checksum, on the host as on the GPU."""
    view = buffer[offset:offset + size]
    if size < 6 or int.from_bytes(view[:4].tobytes(), "little") != 0xFD2FB528:
        raise FrameError(f"the chunk {label} is not a zstd frame")
    descriptor = int(view[4])
    fcs_flag, single, checksum, did_flag = descriptor >> 6, descriptor >> 5 & 1, descriptor >> 2 & 1, descriptor & 3
    if descriptor & 0x08:
        raise FrameError(f"the chunk {label} has a damaged zstd frame header")
    at = 5 + (0 if single else 1) + (0, 1, 2, 4)[did_flag]
    fcs_bytes = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if fcs_bytes == 0:
        raise FrameError(f"the chunk {label} is a zstd frame that does not declare its size")
    if at + fcs_bytes > size:
        raise FrameError(f"the chunk {label} ends inside its zstd frame header")
    declared = int.from_bytes(view[at:at + fcs_bytes].tobytes(), "little") + (256 if fcs_flag == 1 else 0)
    if declared != want:
        raise FrameError(f"the chunk {label} declares {declared} bytes; its matrices take {want}")
    at += fcs_bytes
    bytes_ = memoryview(view)
    while True:
        if at + 3 > size:
            raise FrameError(f"the chunk {label} ends inside its zstd frame (truncated?)")
        header = int.from_bytes(bytes_[at:at + 3], "little")
        kind, length = header >> 1 & 3, header >> 3
        if kind == 3 or length > 128 << 10:
            raise FrameError(f"the chunk {label} has a damaged zstd block header")
        at += 3 + (1 if kind == 1 else length)
        if header & 1:
            break
    at += 4 * checksum
    if at != size:
        raise FrameError(f"the chunk {label} holds {size} bytes; its zstd frame takes {at} (truncated or "
                         f"damaged)" if at > size else f"the chunk {label} has {size - at} bytes after its "
                         f"zstd frame")


def zstd_check_many(buffer: np.ndarray, offsets, sizes, want, labels) -> None:
    """:func:`zstd_check` of many frames at once: frame ``i`` is ``buffer[offsets[i]:offsets[i] +
    sizes[i]]``, declaring ``want`` decoded bytes (one number, or one per frame); ``labels[i]`` names
    it. The frames' headers are read with NumPy, their block headers walked one block of every frame
    at a time (a frame of B KiB has about B / 128 blocks), so the Python cost is per block, not per
    frame. The first frame that fails is checked again with :func:`zstd_check`, whose message it
    raises."""
    offsets = np.asarray(offsets, np.int64)
    sizes = np.asarray(sizes, np.int64)
    n = offsets.size
    if n == 0:
        return
    want = np.broadcast_to(np.asarray(want, np.int64), (n,))
    buf = buffer.reshape(-1).view(np.uint8)
    end = offsets + sizes
    limit = buf.size

    def byte(at):
        return buf[np.minimum(at, limit - 1)].astype(np.int64)

    def le(at, count):   # little-endian integers of count[i] bytes at at[i] (count <= 8)
        value = np.zeros(at.size, np.uint64)
        for k in range(8):
            use = k < count
            value |= np.where(use, byte(at + k).astype(np.uint64) << np.uint64(8 * k), np.uint64(0))
        return value

    bad = sizes < 6
    bad |= le(offsets, np.full(n, 4)) != 0xFD2FB528
    descriptor = byte(offsets + 4)
    fcs_flag, single, checksum, did = descriptor >> 6, descriptor >> 5 & 1, descriptor >> 2 & 1, descriptor & 3
    bad |= (descriptor & 0x08) != 0
    at = offsets + 5 + (1 - single) + np.array([0, 1, 2, 4])[did]
    fcs = np.where(fcs_flag == 0, single, np.array([0, 2, 4, 8])[fcs_flag])
    bad |= (fcs == 0) | (at + fcs > end)
    declared = le(at, fcs).astype(np.int64) + np.where(fcs_flag == 1, 256, 0)
    bad |= declared != want
    at = at + fcs
    active = ~bad
    while active.any():
        idx = np.flatnonzero(active)
        pos = at[idx]
        short = pos + 3 > end[idx]
        header = le(pos, np.full(idx.size, 3)).astype(np.int64)
        kind, length = header >> 1 & 3, header >> 3
        broken = short | (kind == 3) | (length > 128 << 10)
        at[idx] = pos + 3 + np.where(kind == 1, 1, length)
        last = (header & 1) == 1
        bad[idx[broken]] = True
        active[idx[broken | last]] = False
    at = at + 4 * checksum
    bad |= at != end
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        zstd_check(buf, int(offsets[i]), int(sizes[i]), int(want[i]), labels[i])
        raise FrameError(f"the chunk {labels[i]} is not a whole zstd frame")


def payload(frames: Frames, buffer: np.ndarray, offset: int, size: int, label: str) -> tuple[int, int]:
    """The codec frame inside one stored chunk's bytes: checks the crc32c trailer and numcodecs'
    LZ4 header; returns (offset, length) of the frame in ``buffer``. (A zstd frame without crc32c is
    checked by the caller, all of a group's at once: :func:`zstd_check_many`.)"""
    if frames.crc32c:
        if size < 4:
            raise FrameError(f"the chunk {label} has {size} bytes, too few for its CRC-32C")
        body = buffer[offset:offset + size - 4]
        if crc32c(body) != int.from_bytes(bytes(buffer[offset + size - 4:offset + size]), "little"):
            raise FrameError(f"the chunk {label} fails its CRC-32C")
        size -= 4
    if frames.head:
        if size < frames.head:
            raise FrameError(f"the chunk {label} has {size} bytes, too few for its header")
        offset += frames.head
        size -= frames.head
    return offset, size


def _trailer_fault(data: np.ndarray, offset: int, size: int) -> str | None:
    """Why ``data[offset:offset + size]``, one stored chunk, fails zarr's crc32c codec; None if it passes."""
    if size < 4:
        return f"has {size} bytes, too few for its CRC-32C"
    if crc32c(data[offset:offset + size - 4]) != int.from_bytes(data[offset + size - 4:offset + size].tobytes(),
                                                                 "little"):
        return "fails its CRC-32C"
    return None


def object_fault(stored: Stored, index: int, scratch: list | None = None) -> str | None:
    """Why stored object ``index`` (a chunk file, or a shard) of an array with zarr's crc32c codec
    fails its checksums, None if it passes (or is not stored): the file read whole, once, into
    ``scratch[0]`` (a buffer kept from call to call, grown as needed: a fresh one per file costs more
    in page faults than the read); a shard's index checked, then each of the chunks it lists. No
    chunk is decoded."""
    scratch = [np.empty(0, np.uint8)] if scratch is None else scratch
    try:
        with open(stored.path(index), "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            if scratch[0].size < size:
                scratch[0] = np.empty(size, np.uint8)
            data = scratch[0][:size]
            done = 0
            while done < size:
                got = f.readinto(memoryview(data)[done:])
                if not got:   # the file shrank while it was read
                    data = data[:done]
                    break
                done += got
    except FileNotFoundError:
        return None
    if not stored.sharded:
        return _trailer_fault(data, 0, data.size)
    if data.size < stored.index_bytes:
        return f"has {data.size} bytes, fewer than its shard index ({stored.index_bytes})"
    at = data.size - stored.index_bytes if stored.index_at_end else 0
    if _trailer_fault(data, at, stored.index_bytes):
        return "has a shard index that fails its CRC-32C"
    entries = data[at:at + stored.index_bytes - 4].view("<u8").reshape(stored.per_shard, 2)
    for i, (offset, size) in enumerate(entries.tolist()):
        if offset == EMPTY and size == EMPTY:   # a chunk the shard does not store
            continue
        if offset + size > data.size:
            return f"lists chunk {i} of the shard beyond the file's end"
        why = _trailer_fault(data, offset, size)
        if why:
            return f"(chunk {i} of the shard) {why}"
    return None


def faults(stored: Stored, objects, threads: int = 4) -> dict[int, str]:
    """:func:`object_fault` of each of ``objects`` (stored object numbers), in ``threads`` threads
    (the reads overlap the checksums): object -> why, for those that fail."""
    import concurrent.futures

    import threading

    objects = [int(o) for o in objects]
    if not stored.frames.crc32c or not objects:
        return {}
    local = threading.local()

    def one(o: int) -> str | None:
        if not hasattr(local, "scratch"):
            local.scratch = [np.empty(0, np.uint8)]
        return object_fault(stored, o, local.scratch)

    with concurrent.futures.ThreadPoolExecutor(max(1, min(threads, len(objects)))) as pool:
        found = dict(zip(objects, pool.map(one, objects)))
    return {o: why for o, why in found.items() if why}
