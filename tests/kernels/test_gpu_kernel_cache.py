"""The on-disk kernel cache is reused across processes: a second process that runs the same kernels
loads every module from ``$CUPY_CACHE_DIR/batchlu`` (``kernels/_gpu/_nvrtc.py``) and compiles none
again (a compile rewrites its cache file). This is what keeps a run's warm-up short after the first run on a machine.
Run on a machine with a CUDA GPU: ``pytest -m gpu tests/kernels/test_gpu_kernel_cache.py``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

SCRIPT = """
import time
import cupy
from batchlu import kernels
from batchlu.testing import matrices
a = cupy.asarray(matrices.generate("random", 24, "float64", seed=1, start=0, stop=8))
b = cupy.asarray(matrices.generate("random", 100, "complex64", seed=2, start=0, stop=8))
t = time.perf_counter()
kernels.inv(a)
kernels.lu_factor(b)
kernels.solve(b, b[:, :, :2])
cupy.cuda.Device().synchronize()
print(f"{time.perf_counter() - t:.3f}")
"""


def _cache(folder) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in (folder / "batchlu").iterdir() if p.suffix in (".cubin", ".ptx")}


def test_a_second_process_compiles_nothing(tmp_path):
    folder = tmp_path / "kernel_cache"
    env = {**os.environ, "CUPY_CACHE_DIR": str(folder)}
    env.pop("BATCHLU_KERNEL_CACHE", None)
    run = lambda: subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,  # noqa: E731
                                 text=True, timeout=900, check=True).stdout.strip()
    first = run()
    compiled = _cache(folder)
    assert compiled, f"nothing in {folder} after the first process"
    second = run()
    assert _cache(folder) == compiled, f"the second process compiled again; seconds: first {first}, second {second}"
    assert float(second) < float(first)
