"""The GPU backend on ``s3://`` (issue 41, item 2), against moto's S3 server (the ``s3`` fixture): the
GPU computes, the chunks of object storage are decoded and encoded on the host (the GPU codec path
reads local files) and the report says so for each array; a resume redoes exactly the chunks not
recorded, bit-identical to the uninterrupted run.

Run on the GPU machine: ``BATCHLU_REQUIRE_NVCOMP=1 pytest -m gpu tests/pipeline/test_gpu_object_store.py``."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from _pipeline_helpers import outputs_of, require_nvcomp

from batchlu import pipeline
from batchlu.pipeline.cluster._devices import visible_gpus
from batchlu.pipeline.output import _group, _ledger
from batchlu.pipeline.store._object_store import zarr_store
from batchlu.testing.ratios import THRESHOLD, get03

pytestmark = pytest.mark.gpu
RNG = np.random.default_rng()


@pytest.fixture(autouse=True)
def _nvcomp():
    pytest.importorskip("cupy")
    require_nvcomp()   # with nvCOMP there, the host path is taken for object storage, not for its absence


def test_gpu_run_and_resume_on_s3_take_the_host_codecs(s3):
    source = pipeline.generate(f"{s3}/a.zarr", count=240, size=16, chunk=24, seed=int(RNG.integers(1 << 30)))
    out = f"{s3}/o.zarr"
    config = {"cluster.dashboard-address": "127.0.0.1:0", "cluster.gpus": visible_gpus()[0], "chunk": 24}
    first = pipeline.run(source, out, op="inv", backend="gpu", progress=False, config=config)
    assert first.status == "complete" and first.backends == ("gpu",), first
    assert set(first.codecs) == {"a", "inv", "info"}, first.codecs
    assert all(where.startswith("cpu (it is on object storage") for where in first.codecs.values()), first.codecs
    want = outputs_of(out)

    redo = [2, 5, 9]
    _ledger.unrecord(out, redo)
    inv = zarr.open_array(zarr_store(out), path="inv", mode="r+")
    for c in redo:
        inv[c * 24:(c + 1) * 24] = RNG.uniform(-1, 1, (24, 16, 16))   # stale values the resume must replace
    _group.update(out, status="running")
    again = pipeline.run(source, out, op="inv", backend="gpu", resume=True, progress=False, config=config)
    assert again.processed == 72 and again.skipped == 168 and again.status == "complete"
    got = outputs_of(out)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].tobytes() == want[name].tobytes(), name
    a = np.asarray(zarr.open_array(zarr_store(source), mode="r")[...])
    assert get03(a, got["inv"]).max() < THRESHOLD
    assert pipeline.verify(source, out).ok
