"""Missing input chunks: which stored objects a range of matrices needs are absent from the store.

Zarr reads a chunk that is not in the store as the array's fill value, so a deleted or never-written
chunk file would turn into zero (or NaN) matrices and a "complete" run. Before a task reads matrices
``[start, stop)`` of the input (and of the right-hand side), it asks the store about exactly the
objects that hold them:

* unsharded arrays (v2 and v3): one ``store.exists`` per chunk overlapping the range (a ``stat`` on
  a local store), all of them at once on zarr's event loop;
* sharded v3 arrays: the same per shard, then, for each shard that is there, its index (a ranged
  read of 16 bytes per inner chunk plus a checksum) says which inner chunks it holds; an inner chunk
  absent from the index is missing too (inner chunks wholly outside the array are never stored and
  are not asked about).

What to do then is ``batchlu.missing-chunks`` (``error`` or ``fill``): ``error`` raises
:class:`batchlu.pipeline.errors.MissingChunkError` naming the first missing chunk and its matrices;
``fill`` lets the read go on and returns the rows, whose outputs the task then overwrites with those
of ``info`` -3 (:func:`batchlu.pipeline._ops.mark_missing`).

Note: zarr-python 3 skips writing chunks that hold only the fill value unless the array is written
with ``write_empty_chunks=True``, so such an input needs ``fill`` (those matrices then get -3).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import stat

import numpy as np

from ..errors import CorruptInputError, MissingChunkError
from ._zarr import chunk_key, load_shard_index, reads_shard_indexes, sync

@dataclasses.dataclass(frozen=True)
class Gap:
    """One missing object: ``key`` (chunk or shard, relative to the array), ``inner`` (the chunk's
    coordinates in the array's chunk grid when it is absent from a shard that is there), and the
    matrices ``[lo, hi)`` it covers along N."""

    key: str
    inner: tuple[int, ...] | None
    lo: int
    hi: int

    def describe(self, where: str) -> str:
        path = os.path.join(where, self.key)
        if self.inner is None:
            return f"chunk file {path} (matrices {self.lo}:{self.hi})"
        return f"chunk {self.inner} inside shard {path} (matrices {self.lo}:{self.hi})"


def _sharding_codec(array):
    from zarr.codecs import ShardingCodec

    for codec in getattr(array.metadata, "codecs", ()):
        if isinstance(codec, ShardingCodec):
            return codec
    return None


def _grid(shape, unit) -> tuple[int, ...]:
    return tuple(-(-int(s) // int(u)) for s, u in zip(shape, unit))


def _objects(array, start: int, stop: int) -> tuple[list[tuple[int, ...]], list[str]]:
    """The stored objects (chunks, or shards) holding matrices ``[start, stop)`` of ``array``: their
    coordinates in its grid and their keys."""
    unit = tuple(array.shards or array.chunks)
    grid = _grid(array.shape, unit)
    rows = range(start // unit[0], (stop - 1) // unit[0] + 1)
    coords = list(itertools.product(rows, *(range(g) for g in grid[1:])))
    return coords, [chunk_key(array, c) for c in coords]


def _span(index: int, size: int, count: int) -> tuple[int, int]:
    """Matrices ``[lo, hi)`` of block ``index`` of ``size`` along N, of ``count``."""
    return index * size, min((index + 1) * size, count)


async def _find(array, start: int, stop: int) -> list[Gap]:
    shape = tuple(array.shape)
    unit = tuple(array.shards or array.chunks)
    coords, keys = _objects(array, start, stop)
    store, prefix = array.store_path.store, array.store_path.path

    def full(key: str) -> str:
        return f"{prefix}/{key}" if prefix else key

    present = await asyncio.gather(*(store.exists(full(key)) for key in keys))
    gaps = [Gap(key, None, *_span(c[0], unit[0], shape[0]))
            for c, key, there in zip(coords, keys, present) if not there]
    codec = _sharding_codec(array)
    if codec is None or not reads_shard_indexes(codec):
        return gaps
    chunks = tuple(array.chunks)
    per_shard = tuple(u // c for u, c in zip(unit, chunks))
    kept = [(c, key) for c, key, there in zip(coords, keys, present) if there]
    indexes = await asyncio.gather(*(_shard_index(codec, array.store_path / key, per_shard) for _, key in kept))
    for (shard, key), index in zip(kept, indexes):
        if index is _UNREADABLE:   # unreadable index: the read itself reports the corrupt shard ...
            try:
                empty = await store.getsize(full(key)) == 0
            except Exception:
                empty = False
            if empty:   # ... except an empty file, which zarr reads as every chunk the fill value
                lo, hi = _span(shard[0], unit[0], shape[0])
                raise CorruptInputError(f"Expected the shard file {full(key)} of the input {array.store_path} "
                                        f"to hold its chunks (matrices {lo}:{hi}). Got an empty file instead, "
                                        f"which zarr reads as the fill value.")
            continue
        if index is None:   # gone since it was listed: the read reports it
            continue
        stored = np.asarray(index.get_full_chunk_map())
        for local in itertools.product(*(range(p) for p in per_shard)):
            inner = tuple(s * p + i for s, p, i in zip(shard, per_shard, local))
            first = [i * c for i, c in zip(inner, chunks)]
            if any(f >= s for f, s in zip(first, shape)):
                continue    # wholly outside the array: never stored
            lo, hi = _span(inner[0], chunks[0], shape[0])
            if hi <= start or lo >= stop or stored[local]:
                continue
            gaps.append(Gap(key, inner, lo, hi))
    return sorted(gaps, key=lambda g: (g.lo, g.key, g.inner or ()))


_UNREADABLE = object()


async def _shard_index(codec, byte_getter, per_shard):
    try:
        return await load_shard_index(codec, byte_getter, per_shard)
    except Exception:
        return _UNREADABLE


def _local_files(array, start: int, stop: int) -> list[Gap] | None:
    """:func:`find` for an unsharded array in a local store: a ``stat`` per chunk file, here, rather
    than through zarr's event loop (which every task thread of a worker would queue on). None for
    any other array; a sharded one in a local store has its shard files checked for pipes,
    sockets and devices first (zarr's read of a pipe would wait forever)."""
    from zarr.storage import LocalStore

    store = array.store_path.store
    if not isinstance(store, LocalStore):
        return None
    root = os.path.join(str(store.root), *[p for p in str(array.store_path.path).split("/") if p])
    coords, keys = _objects(array, start, stop)
    there = [_is_chunk_file(os.path.join(root, *key.split("/")), array) for key in keys]   # pipes raise
    if array.shards:   # which inner chunks a shard holds, its index says: _find, through zarr
        return None
    return [Gap(key, None, *_span(c[0], array.chunks[0], array.shape[0]))
            for c, key, is_file in zip(coords, keys, there) if not is_file]


def _is_chunk_file(path: str, array) -> bool:
    """Whether a chunk (or shard) file is at ``path``: a regular file; nothing (or a folder) there is
    a missing chunk. A named pipe, socket or device is refused: zarr's read of it would wait forever (a pipe)
    or read what is not a chunk."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return False
    if stat.S_ISREG(mode):
        return True
    if stat.S_ISDIR(mode):
        return False
    raise CorruptInputError(f"Expected the chunk file {path} of {array.store_path} to be a regular file. "
                            f"Got a named pipe, socket or device instead.")


def find(array, start: int, stop: int) -> list[Gap]:
    """The objects holding matrices ``[start, stop)`` of the zarr ``array`` that the store lacks."""
    if stop <= start or 0 in tuple(array.shape):
        return []
    local = _local_files(array, int(start), int(stop))
    if local is not None:
        return local
    return sync(_find(array, int(start), int(stop)))


def check(array, where: str, start: int, stop: int, policy: str, what: str = "input") -> np.ndarray | None:
    """Look for missing chunks before reading matrices ``[start, stop)`` of ``array`` (stored at
    ``where``, a path for messages).

    Returns None when every chunk is there, else (policy ``fill``) a mask over ``[start, stop)`` of
    the matrices held by missing chunks. Policy ``error`` raises :class:`MissingChunkError` instead.
    """
    return judge(find(array, start, stop), where, start, stop, policy, what)


def judge(gaps: list[Gap], where: str, start: int, stop: int, policy: str, what: str = "input") -> np.ndarray | None:
    """:func:`check` on ``gaps`` already found (by :func:`find`, or by the GPU codec path, which
    reads the same shard indexes and chunk sizes before it decodes)."""
    if not gaps:
        return None
    gaps = sorted(gaps, key=lambda g: (g.lo, g.key, g.inner or ()))
    if policy != "fill":
        more = f" ({len(gaps) - 1} more missing in matrices {start}:{stop})" if len(gaps) > 1 else ""
        raise MissingChunkError(
            f"Expected every chunk of the {what} {where} to be stored. Got {gaps[0].describe(where)} "
            f"missing instead{more}; Zarr would read it as the fill value. Restore it, or pass "
            f"--missing-chunks fill (batchlu.missing-chunks: fill) to give those matrices info -3.")
    rows = np.zeros(stop - start, bool)
    for gap in gaps:
        rows[max(gap.lo, start) - start:min(gap.hi, stop) - start] = True
    return rows
