"""Write test inputs: ``count`` matrices (or right-hand sides) from :mod:`batchlu.testing.matrices` into a
Zarr v3 array, chunk by chunk in parallel threads (each chunk is generated independently).

Everything is checked before the first byte is written: the arguments, an existing store (replaced
only with ``overwrite``, and only if ``batchlu generate`` wrote it, unless ``force``), the room on the
disk and the memory one chunk needs. The store is marked generated only once every chunk is written;
a failure removes it.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil

import numpy as np
import zarr

from ._guard import check_not_bootstrapping
from ._config import options as make_options
from ._output import remove, version
from ._store import SUPPORTED_DTYPES, check_output_path, check_replaceable
from .errors import ConfigError, OutputError, OutputExistsError

__all__ = ["generate", "generate_rhs"]

MARK, MARK_WRITING = "batchlu_generate", "batchlu_generate_incomplete"
# Peak memory of drawing one block, in float64/complex128 copies of it: uniform draws and their
# rounding (random), Gaussians, QR factors and products (illcond). See batchlu.testing.matrices.
_DRAW_COPIES = {"random": 3, "singular-mix": 3, "rhs": 3, "illcond": 8}
_BLOCK_ENTRIES = 1 << 18  # batchlu.testing.matrices draws at least this many entries at a time


def _check(count, size, dtype, chunk, k=None) -> np.dtype:
    for name, value, low in (("count", count, 0), ("size", size, 1), ("k", k, 1)):
        if value is not None and (not isinstance(value, (int, np.integer)) or value < low):
            raise ConfigError(f"Expected {name} to be an integer >= {low}. Got {value!r} instead.")
    if chunk is not None and (not isinstance(chunk, (int, np.integer)) or chunk < 1):
        raise ConfigError(f"Expected chunk to be an integer >= 1 or None. Got {chunk!r} instead.")
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        dtype = None
    if dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise ConfigError(f"Expected dtype to be one of {names}. Got {dtype!r} instead.")
    return dtype


def _folder_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def _check_room(out: str, shape: tuple, dtype: np.dtype, chunk: int, kind: str) -> int:
    """Refuse a store that cannot fit on the disk or a chunk that cannot fit in memory; return how
    many chunks may be generated at once (threads)."""
    from dask.utils import format_bytes
    import psutil

    count, tail = shape[0], shape[1:]
    entries = int(np.prod(tail, dtype=np.int64))
    total = count * entries * dtype.itemsize  # random data barely compresses: plan for all of it
    folder = out if os.path.isdir(out) else os.path.dirname(out)
    while not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    free = shutil.disk_usage(folder).free + (_folder_bytes(out) if os.path.isdir(out) else 0)
    what = f"{count:,} x {' x '.join(str(t) for t in tail)} {dtype}"
    if total > free:
        raise OutputError(f"Expected room for {what} ({format_bytes(total)}) on the disk of {folder}. "
                          f"Got {format_bytes(free)} free instead.")
    wide = 16 if dtype.kind == "c" else 8
    need = (min(chunk, count) * entries * dtype.itemsize
            + _DRAW_COPIES[kind] * max(_BLOCK_ENTRIES, entries) * wide)
    available = psutil.virtual_memory().available
    if need > available:
        raise OutputError(f"Expected the memory to generate one chunk of {what} ({format_bytes(need)}, "
                          f"chunk {chunk:,}). Got {format_bytes(available)} available instead; "
                          f"a smaller chunk or matrix size fits.")
    return max(1, int(available // need))


LAYOUTS = ("chunks", "sharded")


def _layout(layout: str, chunk: int, tail: tuple, dtype: np.dtype) -> dict:
    """zarr's ``chunks=`` / ``shards=`` for ``layout``: one chunk of ``chunk`` matrices, or one shard
    of them in inner chunks of about 256 KiB (what nvCOMP decodes fastest, docs/performance.md)."""
    from ._output import inner_chunk

    if layout not in LAYOUTS:
        raise ConfigError(f"Expected layout to be one of {', '.join(LAYOUTS)}. Got {layout!r} instead.")
    if layout == "chunks":
        return {"chunks": (chunk,) + tail}
    inner = inner_chunk(chunk, int(np.prod(tail, dtype=np.int64)) * dtype.itemsize)
    # crc32c on each inner chunk: the GPU decodes an input only when its frames carry a checksum
    return {"chunks": (inner,) + tail, "shards": (chunk,) + tail,
            "compressors": [zarr.codecs.ZstdCodec(level=0), zarr.codecs.Crc32cCodec()]}


def _write(path: str, shape: tuple, dtype: np.dtype, chunk: int | None, make, attrs: dict, *,
           kind: str, overwrite: bool, force: bool, layout: str = "chunks") -> str:
    out = check_output_path(path, [])
    exists = os.path.exists(out) and not (os.path.isdir(out) and not os.listdir(out))
    if exists and not overwrite:
        raise OutputExistsError(f"Expected {out} not to exist. Got an existing path instead; pass "
                                f"overwrite=True (--overwrite) to replace it.")
    if exists:
        check_replaceable(out, writer="generate", force=force)
    count, tail = shape[0], shape[1:]
    if chunk is None:
        per = int(np.prod(tail, dtype=np.int64)) * dtype.itemsize
        chunk = max(1, min(count or 1, make_options().generate_chunk_bytes // max(1, per)))
    grid = _layout(layout, chunk, tail, dtype)
    threads = _check_room(out, shape, dtype, chunk, kind)
    if os.path.exists(out):
        remove(out)  # only a Zarr store or an empty folder; anything else is refused
    # write_empty_chunks: a chunk of zero matrices (singular-mix) is stored too; zarr would skip it,
    # and batchlu run would then refuse the input for a missing chunk
    array = zarr.create_array(store=out, shape=shape, dtype=dtype, zarr_format=3,
                              attributes={MARK_WRITING: attrs}, config={"write_empty_chunks": True}, **grid)

    def one(c: int) -> None:
        lo, hi = c * chunk, min((c + 1) * chunk, count)
        array[lo:hi] = make(lo, hi)

    n_chunks = -(-count // chunk)
    workers = max(1, min(n_chunks, os.cpu_count() or 1, threads))
    try:
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            futures = [pool.submit(one, c) for c in range(n_chunks)]
            try:
                for future in futures:
                    future.result()
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
        array.attrs.put({MARK: attrs})  # generated: only now that every chunk is written
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)  # no half-written store that looks like an input
        raise
    return out


def generate(path, *, count, size, dtype="float64", chunk=None, kind="random", seed=0,
             overwrite=False, force=False, layout="chunks") -> str:
    """Write ``count`` matrices of size ``size`` to a Zarr v3 array (count, size, size) at ``path``.

    ``kind`` is ``random``, ``illcond`` or ``singular-mix`` (see :mod:`batchlu.testing.matrices`); the same
    ``seed`` gives the same matrices. ``chunk`` is the chunk length along N (default: about
    ``batchlu.generate.chunk-bytes``); ``layout`` ``sharded`` stores each chunk as a shard of small
    inner chunks (the layout the GPU codecs decode fastest). An existing store is replaced only with ``overwrite`` and
    only if ``batchlu generate`` wrote it (``force`` replaces any Zarr store). Returns the absolute
    path.
    """
    from batchlu.testing import matrices

    check_not_bootstrapping("batchlu.generate")
    dtype = _check(count, size, dtype, chunk)
    if kind not in matrices.KINDS:
        raise ConfigError(f"Expected kind to be one of {', '.join(matrices.KINDS)}. "
                          f"Got {kind!r} instead.")
    attrs = {"kind": kind, "seed": int(seed), "what": "matrices", "version": version()}
    return _write(path, (count, size, size), dtype, chunk,
                  lambda lo, hi: matrices.generate(kind, size, dtype, seed=seed, start=lo, stop=hi),
                  attrs, kind=kind, overwrite=overwrite, force=force, layout=layout)


def generate_rhs(path, *, count, size, k=1, dtype="float64", chunk=None, seed=0, overwrite=False,
                 force=False, layout="chunks") -> str:
    """Write right-hand sides for ``solve``: (count, size) when ``k`` is 1, else (count, size, k).

    ``overwrite`` and ``force`` as for :func:`generate`."""
    from batchlu.testing import matrices

    check_not_bootstrapping("batchlu.generate_rhs")
    dtype = _check(count, size, dtype, chunk, k)
    cols = None if k == 1 else int(k)
    shape = (count, size) if cols is None else (count, size, cols)
    attrs = {"what": "rhs", "k": int(k), "seed": int(seed), "version": version()}
    return _write(path, shape, dtype, chunk,
                  lambda lo, hi: matrices.rhs(size, cols, dtype, seed=seed, start=lo, stop=hi), attrs,
                  kind="rhs", overwrite=overwrite, force=force, layout=layout)
