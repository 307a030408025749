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

from .cluster._guard import check_not_bootstrapping
from .config._choices import OUTPUT_LAYOUTS
from .config._settings import options as make_options
from .errors import ConfigError, OutputError
from .output._group import grid, version
from .store._arrays import SUPPORTED_DTYPES
from .store._files import check_output_path, check_replaceable, discard, occupied, refuse_occupied, remove
from .store._object_store import is_url, naming_store_failures, takes_storage_options, zarr_store

__all__ = ["generate", "generate_rhs", "generate_sparse"]

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
    what = f"{count:,} x {' x '.join(str(t) for t in tail)} {dtype}"
    if is_url(out):   # object storage: no disk to fill
        folder, free = out, total
    else:
        folder = out if os.path.isdir(out) else os.path.dirname(out)
        while not os.path.isdir(folder):
            folder = os.path.dirname(folder)
        free = shutil.disk_usage(folder).free + (_folder_bytes(out) if os.path.isdir(out) else 0)
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


def _compressors() -> list:
    """zstd (zarr's default), then zarr's crc32c codec: every chunk carries its CRC-32C, so that a
    damaged one fails to read (and the GPU decodes lz4 and zstd frames only with a checksum)."""
    return [zarr.codecs.ZstdCodec(level=0), zarr.codecs.Crc32cCodec()]


def _layout(layout: str, chunk: int, tail: tuple, dtype: np.dtype) -> dict:
    """zarr's ``chunks=`` / ``shards=`` (:func:`batchlu.pipeline.output._group.grid`) and
    ``compressors=`` for ``layout``: one chunk of ``chunk`` matrices, or one shard of them in inner
    chunks of about 256 KiB (what nvCOMP decodes fastest, docs/performance.md)."""
    if layout not in OUTPUT_LAYOUTS:
        raise ConfigError(f"Expected layout to be one of {', '.join(OUTPUT_LAYOUTS)}. Got {layout!r} instead.")
    return {**grid(layout, chunk, tail, int(np.prod(tail, dtype=np.int64)) * dtype.itemsize),
            "compressors": _compressors()}


def _write(path: str, shape: tuple, dtype: np.dtype, chunk: int | None, make, attrs: dict, *,
           kind: str, overwrite: bool, force: bool, layout: str = "chunks") -> str:
    out = check_output_path(path, [])
    if not overwrite:
        refuse_occupied(out, "pass overwrite=True (--overwrite) to replace it")
    elif occupied(out):
        check_replaceable(out, writer="generate", force=force)
    count, tail = shape[0], shape[1:]
    if chunk is None:
        per = int(np.prod(tail, dtype=np.int64)) * dtype.itemsize
        chunk = max(1, min(count or 1, make_options().generate_chunk_bytes // max(1, per)))
    grid = _layout(layout, chunk, tail, dtype)
    threads = _check_room(out, shape, dtype, chunk, kind)
    if occupied(out) if is_url(out) else os.path.exists(out):
        remove(out)  # only a Zarr store or an empty folder; anything else is refused
    # write_empty_chunks: a chunk of zero matrices (singular-mix) is stored too; zarr would skip it,
    # and batchlu run would then refuse the input for a missing chunk
    array = zarr.create_array(store=zarr_store(out), shape=shape, dtype=dtype, zarr_format=3,
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
        discard(out)  # no half-written store that looks like an input
        raise
    return out


@takes_storage_options(writes="path")
@naming_store_failures
def generate(path, *, count, size=None, dtype="float64", chunk=None, kind="random", seed=0,
             overwrite=False, force=False, layout="chunks", nodes=None, dim=2, rhs_columns=1, delta=None) -> str:
    """Write ``count`` matrices of size ``size`` to a Zarr v3 array (count, size, size) at ``path``.

    The sparse kinds (``fem-poisson``, ``fem-elasticity``, ``saddle``, ``power-grid``, ``kkt``) write a
    sparse batch instead: see :func:`generate_sparse` (``nodes``, ``dim``, ``rhs_columns`` and ``delta``
    are theirs).

    ``kind`` is ``random``, ``illcond`` or ``singular-mix`` (see :mod:`batchlu.testing.matrices`); the same
    ``seed`` gives the same matrices. ``chunk`` is the chunk length along N (default: about
    ``batchlu.generate.chunk-bytes``); ``layout`` ``sharded`` stores each chunk as a shard of small
    inner chunks (the layout the GPU codecs decode fastest). An existing store is replaced only with ``overwrite`` and
    only if ``batchlu generate`` wrote it (``force`` replaces any Zarr store). Returns the absolute
    path.
    """
    from batchlu.testing import matrices, sparse

    check_not_bootstrapping("batchlu.generate")
    if kind in sparse.KINDS:
        return generate_sparse(path, count=count, kind=kind, size=size, nodes=nodes, dim=dim, dtype=dtype,
                               chunk=chunk, seed=seed, rhs_columns=rhs_columns, overwrite=overwrite, force=force,
                               layout=layout, delta=delta)
    if size is None:
        raise ConfigError(f"Expected size (the matrix order n) for kind {kind!r}. Got none instead.")
    if delta is not None:
        raise ConfigError(f"Expected delta only with kind kkt. Got delta={delta!r} with kind {kind!r} instead.")
    if nodes is not None:
        raise ConfigError(f"Expected nodes only with a sparse kind ({', '.join(sparse.KINDS)}). "
                          f"Got nodes={nodes!r} with kind {kind!r} instead.")
    dtype = _check(count, size, dtype, chunk)
    if kind not in matrices.KINDS:
        raise ConfigError(f"Expected kind to be one of {', '.join(matrices.KINDS + sparse.KINDS)}. "
                          f"Got {kind!r} instead.")
    attrs = {"kind": kind, "seed": int(seed), "what": "matrices", "version": version()}
    return _write(path, (count, size, size), dtype, chunk,
                  lambda lo, hi: matrices.generate(kind, size, dtype, seed=seed, start=lo, stop=hi),
                  attrs, kind=kind, overwrite=overwrite, force=force, layout=layout)


@naming_store_failures
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


def _check_build_memory(kind: str, nodes, size, dim) -> None:
    """Refuse a sparse kind too large to build in the memory available, before building it."""
    from dask.utils import format_bytes
    import psutil

    from batchlu.testing import sparse

    value = size if size is not None else nodes
    if kind not in sparse.KINDS or (nodes is None) == (size is None) or isinstance(value, bool) or \
            not isinstance(value, (int, np.integer)):
        return  # sparse.make names what is wrong
    need = sparse.build_bytes(kind, nodes=nodes, size=size, dim=dim)
    available = psutil.virtual_memory().available
    if need > available:
        what = f"size {size:,}" if size is not None else f"{nodes:,} nodes"
        raise OutputError(f"Expected the memory to build the {kind} pattern ({dim}-D, {what}): about "
                          f"{format_bytes(need)}. Got {format_bytes(available)} available instead; a "
                          f"smaller size fits.")


def generate_sparse(path, *, count, kind, size=None, nodes=None, dim=2, dtype="float64", chunk=None, seed=0,
                    rhs_columns=1, overwrite=False, force=False, layout="chunks", delta=None) -> str:
    """Write a sparse batch (:mod:`batchlu.pipeline.store._sparse`) of ``count`` matrices of ``kind`` (see
    :mod:`batchlu.testing.sparse`) with about ``size`` unknowns or ``nodes`` mesh nodes / buses, and
    right-hand sides ``rhs`` of shape (count, n) (``rhs_columns`` 1) or (count, n, rhs_columns).
    ``delta`` is the ``kkt`` kind's regularization (None: 1e-8).

    The pattern is the lower triangle; the group's attributes say so (``sparse.pattern``) with the
    matrices' kind (``spd`` or ``sym-indef``). ``overwrite``, ``force`` and ``seed`` as for
    :func:`generate`; ``layout`` as for :func:`generate`, for ``values`` and ``rhs``. Returns the
    absolute path.
    """
    from batchlu.testing import sparse

    check_not_bootstrapping("batchlu.generate")
    dtype = _check(count, None, dtype, chunk, rhs_columns)
    if dtype.kind != "f":
        raise ConfigError(f"Expected dtype float32 or float64 for the sparse kind {kind}. Got {dtype} instead.")
    if is_url(path):
        raise OutputError(f"Expected a local path for a sparse batch. Got {path} instead: sparse batches "
                          f"are not read or written on object storage; generate it locally.")
    out = check_output_path(path, [])
    if not overwrite:
        refuse_occupied(out, "pass overwrite=True (--overwrite) to replace it")
    elif occupied(out):
        check_replaceable(out, writer="generate", force=force)
    _check_build_memory(kind, nodes, size, dim)
    try:
        problem = sparse.make(kind, nodes=nodes, size=size, dim=dim, seed=seed, delta=delta)
    except MemoryError:  # a limit the estimate could not see (ulimit, a cgroup)
        raise OutputError(f"Expected the memory to build the {kind} pattern ({dim}-D). Got a "
                          f"MemoryError instead; a smaller size fits.") from None
    n, nnz = problem.n, problem.nnz
    if chunk is None:
        chunk = max(1, min(count or 1, make_options().generate_chunk_bytes // max(1, nnz * dtype.itemsize)))
    k = None if rhs_columns == 1 else int(rhs_columns)
    rhs_shape = (count, n) if k is None else (count, n, k)
    values_grid, rhs_grid = _layout(layout, chunk, (nnz,), dtype), _layout(layout, chunk, rhs_shape[1:], dtype)
    threads = _check_room(out, (count, nnz + n * rhs_columns), dtype, chunk, "random")
    if os.path.exists(out):
        remove(out)
    info = {"kind": kind, "seed": int(seed), "what": "sparse", "dim": int(dim), "n": int(n), "nnz": int(nnz),
            "rhs_columns": int(rhs_columns), "description": problem.description, "version": version()}
    attrs = {"pattern": "lower", "kind": problem.matrix_kind, "n": int(n),
              "inertia": None if problem.inertia is None else [int(x) for x in problem.inertia]}
    group = zarr.open_group(store=out, mode="w", zarr_format=3, attributes={MARK_WRITING: info})
    group.create_array("indptr", data=problem.indptr.astype(np.int64), compressors=_compressors())
    group.create_array("indices", data=problem.indices.astype(np.int64), compressors=_compressors())
    values = group.create_array("values", shape=(count, nnz), dtype=dtype, **values_grid)
    rhs = group.create_array("rhs", shape=rhs_shape, dtype=dtype, **rhs_grid)

    def one(c: int) -> None:
        lo, hi = c * chunk, min((c + 1) * chunk, count)
        values[lo:hi] = problem.values(lo, hi, dtype, seed=seed)
        rhs[lo:hi] = problem.rhs(lo, hi, k, dtype, seed=seed)

    n_chunks = -(-count // chunk)
    try:
        with concurrent.futures.ThreadPoolExecutor(max(1, min(n_chunks, os.cpu_count() or 1, threads))) as pool:
            for future in [pool.submit(one, c) for c in range(n_chunks)]:
                future.result()
        group.attrs.put({MARK: info, "sparse": attrs})
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    return out
