"""zarr-python's private API, in one place: what batchlu needs of zarr that zarr offers no public way
to do. Nothing else in batchlu reaches into zarr's private modules or attributes;
``tests/pipeline/test_zarr_private.py`` fails when zarr changes any of them under this module.

* :func:`sync`: run a coroutine on zarr's own event loop (``zarr.core.sync``), for the store
  lookups of the missing-chunk check, which ask for many objects at once;
* :func:`reads_shard_indexes` / :func:`load_shard_index`: a shard's index through the sharding
  codec (``ShardingCodec._load_shard_index_maybe``), to tell the inner chunks a shard holds;
* :func:`nd_buffer`: a NumPy array as zarr's output buffer (``zarr.core.buffer``), so that a read
  decodes straight into batchlu's slot instead of a fresh array copied afterwards;
* :func:`chunk_key`: the store key of a chunk (or shard), as the array's metadata encodes it;
* :func:`codec_pipeline`: the codec pipeline an opened array decodes and encodes with;
* :func:`settle_reads`: let zarr's reads still in flight finish after one of them failed, so that
  the error is the only thing the process prints;
* :data:`FUSED_PIPELINE`: where zarr keeps its ``FusedCodecPipeline``, for ``batchlu.io-engine``
  (zarr's configuration names a codec pipeline by that path).
"""

from __future__ import annotations

import asyncio

__all__ = ["FUSED_PIPELINE", "SETTLE_SECONDS", "chunk_key", "codec_pipeline", "load_shard_index", "nd_buffer",
           "reads_shard_indexes", "settle_reads", "sync"]

FUSED_PIPELINE = "zarr.core.codec_pipeline.FusedCodecPipeline"
SETTLE_SECONDS = 30.0   # at most, for the reads still in flight after one failed


def sync(coroutine):
    """The result of ``coroutine``, run on zarr's event loop (as zarr's own synchronous API runs)."""
    from zarr.core.sync import sync as on_zarrs_loop

    return on_zarrs_loop(coroutine)


def reads_shard_indexes(codec) -> bool:
    """Whether the sharding ``codec`` can load a shard's index alone (:func:`load_shard_index`)."""
    return hasattr(codec, "_load_shard_index_maybe")


async def load_shard_index(codec, byte_getter, per_shard):
    """The index of the shard at ``byte_getter`` (a ``zarr.storage.StorePath``) with ``per_shard``
    inner chunks along each axis, through the sharding ``codec``; None where the shard is not there.
    Its ``get_full_chunk_map()`` says which inner chunks the shard holds."""
    return await codec._load_shard_index_maybe(byte_getter, per_shard)


def nd_buffer(out):
    """``out`` (a NumPy array) as the buffer zarr decodes into (``get_basic_selection(..., out=)``),
    or None where this zarr offers none (then read and copy)."""
    try:
        from zarr.core.buffer import default_buffer_prototype

        return default_buffer_prototype().nd_buffer.from_numpy_array(out)
    except Exception:
        return None


def chunk_key(array, coords) -> str:
    """The store key of the object (chunk, or shard when sharded) at grid coordinates ``coords`` of
    the zarr ``array``, relative to the array."""
    return array.metadata.encode_chunk_key(tuple(coords))


def codec_pipeline(array):
    """The codec pipeline the opened zarr ``array`` decodes and encodes its chunks with."""
    return array._async_array.codec_pipeline


def settle_reads() -> None:
    """Let the reads zarr still has in flight finish, after one of them failed.

    zarr reads a selection's chunks as tasks of its event loop (``asyncio.gather``): when one chunk
    fails to decode, the error reaches us while the others are still pending. Raised at once, the
    error ends the process with them pending, and Python prints "Task was destroyed but it is
    pending!" for each (and "cannot schedule new futures after interpreter shutdown" for a decode
    that starts then): a dozen to hundreds of lines after the one-line error. So wait for them
    (their results are dropped; ``SETTLE_SECONDS`` at most, should a task of some other caller of
    that loop never end)."""
    async def rest() -> None:
        me = asyncio.current_task()
        others = [task for task in asyncio.all_tasks() if task is not me]
        if others:
            done, _ = await asyncio.wait(others, timeout=SETTLE_SECONDS)
            for task in done:   # their errors are the same damage, or another: the first one is raised
                if not task.cancelled():
                    task.exception()

    try:
        sync(rest())
    except Exception:
        pass   # a loop already closed: nothing is pending there
