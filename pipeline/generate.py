"""Write test inputs: ``count`` matrices (or right-hand sides) from :mod:`batchlu.testing.matrices` into a
Zarr v3 array, chunk by chunk in parallel threads (each chunk is generated independently)."""

from __future__ import annotations

import concurrent.futures
import os

import numpy as np
import zarr

from ._config import options as make_options
from ._output import remove, version
from ._store import SUPPORTED_DTYPES, check_output_path
from .errors import ConfigError

__all__ = ["generate", "generate_rhs"]


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


def _write(path: str, shape: tuple, dtype: np.dtype, chunk: int | None, make, attrs: dict) -> str:
    out = check_output_path(path, [])
    if os.path.exists(out):
        remove(out)  # only a Zarr store or an empty folder; anything else is refused
    count, tail = shape[0], shape[1:]
    if chunk is None:
        per = int(np.prod(tail, dtype=np.int64)) * dtype.itemsize
        chunk = max(1, min(count or 1, make_options().generate_chunk_bytes // max(1, per)))
    array = zarr.create_array(store=out, shape=shape, chunks=(chunk,) + tail, dtype=dtype,
                              zarr_format=3, attributes=attrs)

    def one(c: int) -> None:
        lo, hi = c * chunk, min((c + 1) * chunk, count)
        array[lo:hi] = make(lo, hi)

    n_chunks = -(-count // chunk)
    workers = min(n_chunks, os.cpu_count() or 1) or 1
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for future in [pool.submit(one, c) for c in range(n_chunks)]:
            future.result()
    return out


def generate(path, *, count, size, dtype="float64", chunk=None, kind="random", seed=0) -> str:
    """Write ``count`` matrices of size ``size`` to a Zarr v3 array (count, size, size) at ``path``.

    ``kind`` is ``random``, ``illcond`` or ``singular-mix`` (see :mod:`batchlu.testing.matrices`); the same
    ``seed`` gives the same matrices. ``chunk`` is the chunk length along N (default: about
    ``batchlu.generate.chunk-bytes``). An existing Zarr store at ``path`` is replaced. Returns the
    absolute path.
    """
    from batchlu.testing import matrices

    dtype = _check(count, size, dtype, chunk)
    if kind not in matrices.KINDS:
        raise ConfigError(f"Expected kind to be one of {', '.join(matrices.KINDS)}. "
                          f"Got {kind!r} instead.")
    attrs = {"batchlu_generate": {"kind": kind, "seed": int(seed), "what": "matrices",
                                  "version": version()}}
    return _write(path, (count, size, size), dtype, chunk,
                  lambda lo, hi: matrices.generate(kind, size, dtype, seed=seed, start=lo, stop=hi),
                  attrs)


def generate_rhs(path, *, count, size, k=1, dtype="float64", chunk=None, seed=0) -> str:
    """Write right-hand sides for ``solve``: (count, size) when ``k`` is 1, else (count, size, k)."""
    from batchlu.testing import matrices

    dtype = _check(count, size, dtype, chunk, k)
    cols = None if k == 1 else int(k)
    shape = (count, size) if cols is None else (count, size, cols)
    attrs = {"batchlu_generate": {"what": "rhs", "k": int(k), "seed": int(seed), "version": version()}}
    return _write(path, shape, dtype, chunk,
                  lambda lo, hi: matrices.rhs(size, cols, dtype, seed=seed, start=lo, stop=hi), attrs)
