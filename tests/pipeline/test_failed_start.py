"""A run that cannot start leaves nothing behind, so the corrected command needs no --overwrite."""

from __future__ import annotations

import os

import dask
import pytest

from batchlu import pipeline
from batchlu.pipeline.errors import OutputError


@pytest.fixture
def small(tmp_path):
    return pipeline.generate(str(tmp_path / "a.zarr"), count=12, size=4, seed=3)


def test_unreachable_scheduler_leaves_no_output(small, tmp_path, client):
    out = tmp_path / "out.zarr"
    # nothing listens on port 9: 2 s to give up instead of batchlu.connect-timeout's 30
    with dask.config.set({"distributed.comm.timeouts.connect": "2s", "batchlu.connect-timeout": "2s"}), \
            pytest.raises(OSError, match="127.0.0.1:9"):
        pipeline.run(small, str(out), op="inv", progress=False, scheduler="tcp://127.0.0.1:9")
    assert not out.exists()
    report = pipeline.run(small, str(out), op="inv", progress=False, client=client)
    assert report.status == "complete" and report.processed == 12


def test_output_location_that_cannot_be_written(small, tmp_path):
    if not os.path.isdir("/proc/self"):
        pytest.skip("needs /proc")
    with pytest.raises(OutputError, match="Expected the output location /proc to be writable"):
        pipeline.run(small, "/proc/batchlu-out.zarr", op="lu", progress=False)
