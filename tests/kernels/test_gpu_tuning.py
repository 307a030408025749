"""``batchlu.kernels.tuning`` beyond the launchers the kernel tests use: a source override compiles and
runs the given text and only inside its block, a source that fails to compile raises
KernelCompileError with NVRTC's log, and compiled kernels are cached. Run on a machine with a CUDA GPU:
``pytest -m gpu tests/kernels/test_gpu_tuning.py``."""

from __future__ import annotations

import numpy as np
import pytest

from batchlu.testing import matrices
from batchlu.testing.ratios import THRESHOLD, get01

pytestmark = pytest.mark.gpu

try:
    import cupy
except ImportError:  # the gpu marker skips these tests (fails them under BATCHLU_REQUIRE_GPU=1), saying why
    cupy = None

N, COUNT = 100, 16  # getrf_blocked for every dtype (GETRF_DISPATCH)
STORE = "if (tid == 0) info[m] = first_zero;"


def _factor(a):
    from batchlu.kernels import tuning

    out = (cupy.full_like(a, np.nan), cupy.full((COUNT, N), -7, np.int32), cupy.full((COUNT,), -9, np.int32))
    tuning.launch_getrf(a, *out)
    return [x.get() for x in out]


@pytest.mark.parametrize("dtype", [np.float32, np.complex128])
def test_source_override_runs_the_given_text(dtype):
    from batchlu.kernels import tuning

    assert tuning.getrf_plan(dtype, N).kind.startswith("blocked")
    host = matrices.generate("random", N, dtype, seed=21, start=0, stop=COUNT)
    a = cupy.asarray(host)
    lu, piv, info = _factor(a)
    assert (info == 0).all() and get01(host, lu, piv).max() < THRESHOLD
    text = tuning.kernel_source("getrf")
    assert text.count(STORE) == 1, "the test's marker left getrf.cu: pick another line to change"
    with tuning.source_override("getrf", text.replace(STORE, "if (tid == 0) info[m] = first_zero + 4321;")):
        assert tuning.kernel_source("getrf") != text
        lu2, piv2, info2 = _factor(a)
    assert (info2 == 4321).all(), "the override's kernel did not run"
    assert lu2.tobytes() == lu.tobytes() and (piv2 == piv).all()
    assert tuning.kernel_source("getrf") == text
    lu3, piv3, info3 = _factor(a)  # the file's kernel again, from the cache
    assert (info3 == 0).all() and lu3.tobytes() == lu.tobytes() and (piv3 == piv).all()


def test_compile_error_shows_the_log():
    from batchlu.kernels import tuning

    text = tuning.kernel_source("slogdet") + "\n#error batchlu_marker_of_a_failed_compile\n"
    a = cupy.asarray(matrices.generate("random", 8, np.float64, seed=1, start=0, stop=2))
    with tuning.source_override("slogdet", text):
        with pytest.raises(tuning.KernelCompileError, match="override of kernels/cuda/slogdet.cu") as err:
            from batchlu.kernels._gpu import _slogdet

            _slogdet.slogdet(a)
    assert "batchlu_marker_of_a_failed_compile" in str(err.value)


def test_source_override_refuses_an_unknown_family():
    from batchlu.kernels import tuning

    with pytest.raises(ValueError, match="Expected a kernel family"):
        with tuning.source_override("getrf_small", "// nothing"):
            pass
    from batchlu.kernels import _cuda_sources

    # every family is one kernels/cuda/<family>.cu, the dense ones among them
    assert set(tuning.FAMILIES) == {p.stem for p in _cuda_sources.CUDA_DIR.glob("*.cu")}
    assert {"gesv", "getrf", "getri", "getrs", "slogdet"} <= set(tuning.FAMILIES)


def test_kernels_are_cached():
    from batchlu.kernels import tuning
    from batchlu.kernels._gpu import _runtime

    names = tuple(tuning.gje_name(np.float64, t[1:]) for t in tuning.GJE_TILES[np.dtype(np.float64)])
    tuning.compile_kernels("getri", names)
    first = _runtime.kernel("getri", names[0], names)
    assert _runtime.kernel("getri", names[0], names) is first
    assert all(name.startswith("blu::inv_gje<double, ") for name in names)
