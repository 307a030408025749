"""The sparse ops (ldlt-solve, ldlt-inertia) through whole GPU runs: the embedded GPU cluster (one
worker on the first visible GPU), a saddle-point batch with a NaN in one matrix's values and in
another's right-hand side. Checked: the run is the GPU's, verify passes (backward error <= 30 n eps,
inertia against eigvalsh and the generator's), the info codes, perturbed counts and inertia are the
CPU backend's, and the outputs are bit-identical whatever the chunking, the pieces a batch is cut
into, the codec path (host or GPU decoding of a sharded input) or the run (what resume relies on).
Run on a machine with a CUDA GPU: ``pytest -m gpu tests/pipeline/test_gpu_sparse_run.py``."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from _pipeline_helpers import outputs_of

from batchlu import pipeline
from batchlu.pipeline.cluster._devices import visible_gpus

pytestmark = pytest.mark.gpu

COUNT, CHUNK = 40, 8
BAD_VALUES, BAD_RHS = 5, 12


def _config(**extra):
    return {"cluster.dashboard-address": "127.0.0.1:0", "cluster.gpus": visible_gpus()[0], **extra}


def _poison(path):
    group = zarr.open_group(path, mode="r+")
    values = group["values"][BAD_VALUES]
    values[3] = np.nan
    group["values"][BAD_VALUES] = values
    rhs = group["rhs"][BAD_RHS]
    rhs[1] = np.nan
    group["rhs"][BAD_RHS] = rhs
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-sparse")
    return _poison(pipeline.generate(root / "kkt.zarr", count=COUNT, kind="saddle", size=400, chunk=CHUNK,
                                     seed=5))


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-sparse-sharded")
    return _poison(pipeline.generate(root / "kkt.zarr", count=COUNT, kind="saddle", size=400, chunk=CHUNK,
                                     seed=5, layout="sharded"))


@pytest.mark.parametrize("op", ["ldlt-solve", "ldlt-inertia"])
def test_gpu_run_verifies_and_matches_the_cpu_codes(store, tmp_path, op, client):
    out, cpu = tmp_path / "gpu.zarr", tmp_path / "cpu.zarr"
    report = pipeline.run(store, str(out), op=op, backend="gpu", progress=False, config=_config())
    assert report.backends == ("gpu",) and report.status == "complete"
    pipeline.run(store, str(cpu), op=op, backend="cpu", client=client, progress=False)
    got, ref = outputs_of(str(out)), outputs_of(str(cpu))
    bad = [BAD_VALUES, BAD_RHS] if op == "ldlt-solve" else [BAD_VALUES]
    assert got["info"][bad].tolist() == [-1] * len(bad)
    assert np.all(np.delete(got["info"], bad) == 0)
    for name in ("info", "perturbed") + (("inertia",) if op == "ldlt-inertia" else ()):
        assert np.array_equal(got[name], ref[name]), name
    if op == "ldlt-solve":
        assert np.isnan(got["x"][bad]).all() and np.isfinite(np.delete(got["x"], bad, 0)).all()
        n = got["x"].shape[1]
        assert np.all(np.delete(got["berr"], bad) <= 30 * n * np.finfo(np.float64).eps)
    else:
        expected = zarr.open_group(store, mode="r").attrs["sparse"]["inertia"]
        assert np.all(np.delete(got["inertia"], bad, 0) == expected)
    check = pipeline.verify(store, str(out))
    assert check.ok, check.summary()


def test_gpu_outputs_bit_identical_across_chunking_pieces_and_codecs(store, sharded, tmp_path):
    """Each matrix is factored alone by its own threads: the same bits whatever the chunking, the
    pieces (a small memory budget) and the codec path; so a resumed GPU run's chunks match."""
    runs = {
        "default": (store, {}),
        "small-chunks": (store, {"chunk": 2, "memory-budget": "1MiB"}),
        "sharded-gpu-codecs": (sharded, {"codec-device": "auto"}),
        "sharded-host-codecs": (sharded, {"codec-device": "cpu"}),
    }
    outs = {}
    for label, (source, extra) in runs.items():
        outs[label] = tmp_path / f"{label}.zarr"
        report = pipeline.run(source, str(outs[label]), op="ldlt-solve", backend="gpu", progress=False,
                              config=_config(**extra))
        assert report.backends == ("gpu",)
    first = outputs_of(str(outs["default"]))
    for label in list(runs)[1:]:
        other = outputs_of(str(outs[label]))
        for name in ("x", "berr", "perturbed", "info"):
            assert np.array_equal(first[name], other[name], equal_nan=True), (label, name)
