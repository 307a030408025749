"""The CPU backend's two engines as a fixture: ``compiled`` (numba's batched loops; skipped where
numba is not importable) and ``numpy`` (the NumPy/SciPy engines it falls back to)."""

from __future__ import annotations

import pytest

from batchlu.kernels import _cpu


@pytest.fixture(params=["compiled", "numpy"])
def cpu_engine(request, monkeypatch):
    """Run the test on one CPU engine (``BATCHLU_CPU_ENGINE``); returns its name."""
    if request.param == "compiled" and not _cpu.compiled_available():
        pytest.skip("numba is not importable: the CPU backend has only its NumPy engine")
    monkeypatch.setenv(_cpu.ENGINE_ENV, request.param)
    return request.param
