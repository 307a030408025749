"""The ops on dask arrays of CuPy chunks (``kernels/_dask.py``): lazy, CuPy metas, blocks on the GPU
kernels, bit for bit the same call on the whole CuPy array. Run on a machine with a CUDA GPU:
``pytest -m gpu tests/kernels/test_gpu_dask_api.py``."""

from __future__ import annotations

import numpy as np
import pytest

import batchlu
from batchlu.testing import matrices

pytestmark = pytest.mark.gpu
da = pytest.importorskip("dask.array")

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]


def _same_bits(x, y) -> None:
    x, y = (v.get() if hasattr(v, "get") else np.asarray(v) for v in (x, y))
    assert x.shape == y.shape and x.dtype == y.dtype and x.tobytes() == y.tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
def test_cupy_chunks_run_on_the_gpu_and_match_the_whole_array(dtype):
    import cupy

    a = matrices.generate("random", 24, dtype, seed=3, start=0, stop=300)
    a[7, :, 2] = 0
    b = matrices.rhs(24, 4, dtype, seed=4, start=0, stop=300)
    x = da.from_array(a, chunks=(64, 24, 24)).map_blocks(cupy.asarray)
    rhs = da.from_array(b, chunks=(100, 24, 4)).map_blocks(cupy.asarray)
    ainv, info = batchlu.inv(x)
    sol, sinfo = batchlu.solve(x, rhs)
    sign, logabsdet, dinfo = batchlu.slogdet(x)
    for lazy in (ainv, info, sol, sinfo, sign, logabsdet, dinfo):
        assert isinstance(lazy, da.Array) and isinstance(lazy._meta, cupy.ndarray)
    got = da.compute(ainv, info, sol, sinfo, sign, logabsdet, dinfo, scheduler="threads")
    assert all(isinstance(g, cupy.ndarray) for g in got)
    whole = cupy.asarray(a)
    ref = (*batchlu.inv(whole), *batchlu.solve(whole, cupy.asarray(b)), *batchlu.slogdet(whole))
    for g, r in zip(got, ref):
        _same_bits(g, r)
    assert int(got[1][7]) > 0
