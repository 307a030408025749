"""Shared pytest setup: the ``gpu`` and ``multi_gpu`` markers skip cleanly where there is no device."""

from __future__ import annotations

import functools
import os

# One BLAS thread per process, as Dask's nanny gives each worker: the kernels tests call LAPACK per
# matrix, and oversubscribed OpenBLAS threads on a small CI machine slow them several times over.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import pytest  # noqa: E402


@functools.lru_cache(maxsize=None)
def gpu_count() -> int:
    """Number of CUDA devices CuPy can use here (0 without CuPy or without a driver)."""
    try:
        import cupy
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def pytest_collection_modifyitems(config, items):
    count = gpu_count()
    for item in items:
        if "multi_gpu" in item.keywords and count < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs 2 or more CUDA GPUs; found {count}"))
        elif "gpu" in item.keywords and count < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU and CuPy; none found"))
