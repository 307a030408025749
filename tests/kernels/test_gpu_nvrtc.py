"""The kernels are compiled with IEEE subnormals in single precision (``kernels/_gpu/_nvrtc.py``):
CuPy's own compile appends ``-ftz=true``, which made a float32 product or reciprocal below 2^-126
zero on the GPU. Run on a machine with a CUDA GPU: ``pytest -m gpu tests/kernels/test_gpu_nvrtc.py``."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")

CODE = """
template <typename T>
__global__ void subnormals(const T* a, T* out) {
    out[0] = a[0] * a[1];
    out[1] = T(1) / a[2];
    out[2] = a[3] / a[2];
}
"""
NAMES = ("subnormals<float>", "subnormals<double>")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_products_and_reciprocals_below_the_smallest_normal_are_kept(dtype, tmp_path, monkeypatch):
    from batchlu.kernels._gpu import _nvrtc

    monkeypatch.setenv("BATCHLU_KERNEL_CACHE", str(tmp_path))
    path, lowered = _nvrtc.binary(CODE, NAMES, str(cupy.cuda.Device().compute_capability))
    kernel = cupy.RawModule(path=str(path)).get_function(lowered[NAMES[dtype == np.float64]])
    info = np.finfo(dtype)
    half = np.ldexp(dtype(1), (info.minexp - 8) // 2)          # half * half: 2^(minexp - 8), subnormal
    big = np.ldexp(dtype(1), info.maxexp - 1)                  # 1 / big: 2^(1 - maxexp), subnormal
    a = np.array([half, half * dtype(1.5), big, dtype(0.75)], dtype=dtype)
    out = cupy.full(3, np.nan, dtype=dtype)
    kernel((1,), (1,), (cupy.asarray(a), out))
    expected = np.array([a[0] * a[1], dtype(1) / a[2], a[3] / a[2]], dtype=dtype)
    assert (np.abs(expected) < info.tiny).all() and (expected != 0).all()   # the test's own premise
    np.testing.assert_array_equal(out.get(), expected)


def test_the_projects_kernels_compile_with_subnormals_on():
    from batchlu.kernels._gpu import _runtime

    assert "-ftz=false" in _runtime.OPTIONS and "-ftz=true" not in _runtime.OPTIONS
