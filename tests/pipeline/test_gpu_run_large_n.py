"""A GPU run of matrices above the kernels' range (issue 20): n = 2048 complex128, 64 MiB a matrix and
about 256 MiB with ``lu``'s or ``inv``'s outputs and workspace, so the default memory-budget plans one
matrix per batch and the run says so; the embedded GPU cluster computes them on cuSOLVER, a singular
matrix among them, and ``verify`` checks every result with LAPACK's ratios.
Run on a machine with a CUDA GPU: ``pytest -m gpu tests/pipeline/test_gpu_run_large_n.py``."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from batchlu import pipeline
from batchlu.pipeline.cluster._devices import visible_gpus
from batchlu.pipeline.errors import BatchluWarning
from batchlu.testing import matrices

pytestmark = pytest.mark.gpu

COUNT, N = 3, 2048


@pytest.mark.parametrize("op", ["lu", "inv"])
def test_gpu_run_above_the_kernels_range(tmp_path, op):
    from batchlu.kernels import tuning

    assert tuning.path("inv" if op == "inv" else "lu_factor", np.complex128, N) == tuning.CUSOLVER
    a = matrices.generate("random", N, np.complex128, seed=61, stop=COUNT)
    a[1, :, 7] = 0  # singular: info 8
    array = zarr.create_array(store=str(tmp_path / "a.zarr"), shape=a.shape, chunks=(1, N, N), dtype=a.dtype)
    array[...] = a
    out = tmp_path / "out.zarr"
    config = {"cluster.dashboard-address": "127.0.0.1:0", "cluster.gpus": visible_gpus()[0]}
    with pytest.warns(BatchluWarning, match="smaller than one matrix"):
        report = pipeline.run(str(tmp_path / "a.zarr"), str(out), op=op, backend="gpu", progress=False,
                              config=config)
    assert report.backends == ("gpu",) and report.status == "complete" and report.tasks == COUNT
    info = np.asarray(zarr.open_array(str(out), path="info", mode="r")[...])
    assert info.tolist() == [0, 8, 0] and report.ok == 2 and report.singular == 1
    record = zarr.open_group(str(out), mode="r").attrs["batchlu"]
    assert record["plan"]["chunk"] == 1
    check = pipeline.verify(str(tmp_path / "a.zarr"), str(out))
    assert check.ok and check.checked == COUNT, check.summary()
