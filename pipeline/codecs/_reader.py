"""Reading a batch's stored frames straight from the chunk files, for the GPU codec path.

:func:`plan_reads` lists the frames that hold a range of matrices (whole chunk files, or the inner
chunks a shard's index lists), :func:`gaps` the chunks among them that are not stored (for the
missing-chunk check), and :func:`read_frames` reads them into one host buffer, each at its own
:data:`ALIGN`-byte boundary (:func:`aligned`), with one ``preadv`` per run of frames that lie back
to back in a file.
"""

from __future__ import annotations

import dataclasses
import os
import stat

import numpy as np

from ..errors import FrameError
from ..store._files import IOV_MAX
from ..store._layout import EMPTY, Stored
from ._frames import crc32c

__all__ = ["ALIGN", "COMPRESSED", "Read", "aligned", "frame_sizes", "gaps", "plan_reads", "read_frames",
           "shard_index"]

ALIGN = 16   # bytes: nvCOMP's strictest alignment of a frame in a batch
# a group of large frames whose stored bytes are under this fraction of their decoded bytes counts as
# compressed (zstd stores the blocks of random data raw: ratio 1.04; nvCOMP copies those at tens of GB/s)
COMPRESSED = 0.9


@dataclasses.dataclass(frozen=True)
class Read:
    """One frame to read: bytes ``[offset, offset + length)`` of ``path`` (``length`` None: the whole
    file), decoding to ``matrices`` matrices from matrix ``first`` of the array. ``missing`` says
    when a shard or an inner chunk is not stored (``length`` 0); a chunk file that is not there shows
    as size 0 in :func:`frame_sizes` (:func:`gaps` lists both for the missing-chunk check)."""

    path: str
    offset: int
    length: int | None
    first: int
    matrices: int
    label: str
    missing: str = ""   # "shard": the shard file is not there; "chunk": its index has no such chunk


def shard_index(stored: Stored, shard: int) -> np.ndarray | None:
    """The (offset, nbytes) pairs of a shard's chunks; None when the shard file is not there.
    A shard whose index is unreadable or fails its CRC-32C raises ``ValueError``."""
    path = stored.path(shard)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):   # open() of a named pipe waits for a writer forever
            raise FrameError(f"the shard {path} is not a regular file (a named pipe, socket, device or folder)")
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < stored.index_bytes:
                raise FrameError(f"the shard {path} has {size} bytes, fewer than its index ({stored.index_bytes})")
            f.seek(size - stored.index_bytes if stored.index_at_end else 0)
            raw = f.read(stored.index_bytes)
    except FileNotFoundError:
        return None
    body, trailer = raw[:-4], int.from_bytes(raw[-4:], "little")
    if crc32c(body) != trailer:
        raise FrameError(f"the index of shard {path} fails its CRC-32C")
    index = np.frombuffer(body, "<u8").reshape(stored.per_shard, 2)
    # an index that passes its CRC can still list bytes the file does not hold (a buggy writer): such
    # an entry would size the read buffer (exabytes) or overflow preadv's offset; name it here
    # (offset + nbytes > size, written so that uint64 cannot wrap)
    offset, nbytes, end = index[:, 0], index[:, 1], np.uint64(size)
    beyond = ~((offset == EMPTY) & (nbytes == EMPTY)) & ((offset > end) | (nbytes > end - np.minimum(offset, end)))
    if beyond.any():
        i = int(np.flatnonzero(beyond)[0])
        first, count = int(offset[i]), int(nbytes[i])
        raise FrameError(f"the shard {path} lists chunk {i} at bytes {first}:{first + count}, "
                         f"beyond its end ({size} bytes)")
    return index


def plan_reads(stored: Stored, start: int, stop: int) -> list[Read]:
    """The frames that hold matrices ``[start, stop)`` (whole stored objects), in order."""
    count = stored.shape[0]
    reads = []
    for obj in range(start // stored.unit, -(-stop // stored.unit)):
        lo = obj * stored.unit
        if not stored.sharded:
            reads.append(Read(stored.path(obj), 0, None, lo, stored.unit, stored.key(obj)))
            continue
        index = shard_index(stored, obj)
        for i in range(stored.per_shard):
            first = lo + i * stored.inner
            if first >= count:
                break
            label = f"{stored.key(obj)} (chunk {i} of the shard)"
            if index is None or int(index[i, 0]) == EMPTY:
                reads.append(Read(stored.path(obj), 0, 0, first, stored.inner, label,
                                  "shard" if index is None else "chunk"))
            else:
                reads.append(Read(stored.path(obj), int(index[i, 0]), int(index[i, 1]), first, stored.inner, label))
    return reads


def gaps(stored: Stored, reads: list[Read], sizes: list[int]) -> list:
    """The :class:`batchlu.pipeline.store._missing.Gap` of every object ``reads`` need that is not stored
    (``sizes`` from :func:`frame_sizes`): a shard or chunk file not there, or an inner chunk its
    shard's index does not hold, as :func:`batchlu.pipeline.store._missing.find` names them. A chunk file
    that is there but empty, or an index entry of no bytes, raises :class:`FrameError`."""
    from ..store._missing import Gap

    count = stored.shape[0]
    tail = (0,) * (len(stored.shape) - 1)
    found, shards = [], set()
    for r, size in zip(reads, sizes):
        obj = r.first // stored.unit
        if r.missing == "shard":
            if obj not in shards:
                shards.add(obj)
                found.append(Gap(stored.key(obj), None, obj * stored.unit, min((obj + 1) * stored.unit, count)))
        elif r.missing == "chunk":
            inner = r.first // stored.inner
            found.append(Gap(stored.key(obj), (inner,) + tail, r.first, min(r.first + stored.inner, count)))
        elif size == 0:
            if r.length is None and not os.path.exists(r.path):
                found.append(Gap(stored.key(obj), None, obj * stored.unit, min((obj + 1) * stored.unit, count)))
            else:
                raise FrameError(f"the chunk {r.label} is stored with no bytes")
    return found


def frame_sizes(reads: list[Read]) -> list[int]:
    """Bytes each read takes (whole files: their size now; 0 for a chunk not stored)."""
    sizes = []
    for r in reads:
        if r.length is not None:
            sizes.append(r.length)
            continue
        try:
            sizes.append(os.stat(r.path).st_size)
        except FileNotFoundError:
            sizes.append(0)
    return sizes


def aligned(sizes: list[int]) -> tuple[list[int], int]:
    """Offsets of frames of ``sizes`` packed at :data:`ALIGN`-byte boundaries, and the total."""
    offsets, at = [], 0
    for size in sizes:
        offsets.append(at)
        at += -(-size // ALIGN) * ALIGN
    return offsets, at


def read_frames(reads: list[Read], sizes: list[int], offsets: list[int], buffer: np.ndarray, pool=None) -> None:
    """Read every frame into ``buffer`` (uint8) at ``offsets``: in ``pool``'s threads if given. The
    inner chunks of one shard that lie back to back in its file are read by one ``preadv`` each run
    (one system call for many frames, each landing at its own aligned offset)."""
    runs: list[list[int]] = []
    for i, (r, size) in enumerate(zip(reads, sizes)):
        if size == 0:
            continue
        if runs and r.length is not None:
            p = runs[-1][-1]
            if (reads[p].path == r.path and reads[p].length is not None
                    and reads[p].offset + sizes[p] == r.offset and len(runs[-1]) < IOV_MAX):
                runs[-1].append(i)
                continue
        runs.append([i])

    def one(run: list[int]) -> None:
        first = reads[run[0]]
        views = [memoryview(buffer)[offsets[i]:offsets[i] + sizes[i]] for i in run]
        want = sum(sizes[i] for i in run)
        with open(first.path, "rb", buffering=0) as f:
            got = os.preadv(f.fileno(), views, first.offset)
            if got == want:
                return
            # a short read: go on frame by frame from where it stopped, to name the chunk that ends early
            at = first.offset
            for i, view in zip(run, views):
                done = min(got, sizes[i])
                got -= done
                while done < sizes[i]:
                    more = os.preadv(f.fileno(), [view[done:]], at + done)
                    if not more:
                        raise FrameError(f"the chunk {reads[i].label} ended after {done} of {sizes[i]} bytes")
                    done += more
                at += sizes[i]

    if pool is None:
        for run in runs:
            one(run)
    else:
        list(pool.map(one, runs))
