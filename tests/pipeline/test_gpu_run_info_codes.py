"""``info`` -2 and -3 through whole GPU runs (issue 16, items 4 and 5): the embedded GPU cluster (one
worker on the first visible GPU, its I/O processes on by default), every op on matrices that
overflow, and a missing input chunk with and without ``--missing-chunks fill``; plus the CUDA engine
of the data path alone, with and without I/O processes.
Run on a machine with a CUDA GPU: ``pytest -m gpu tests/pipeline/test_gpu_info_codes.py``."""

from __future__ import annotations

import os

import numpy as np
import pytest
import zarr

from batchlu import pipeline
from batchlu.pipeline.worker import _batches
from batchlu.pipeline import errors
from batchlu.pipeline.worker import _engines
from batchlu.pipeline.store import _missing
from batchlu.pipeline.cluster._devices import visible_gpus
from batchlu.pipeline._ops import output_specs
from batchlu.testing import matrices

pytestmark = pytest.mark.gpu

COUNT, N, CHUNK = 96, 8, 16
RESULTS = {"lu": ("lu",), "inv": ("inv",), "solve": ("x",), "slogdet": ("sign", "logabsdet")}


def _config(**extra):
    return {"cluster.dashboard-address": "127.0.0.1:0", "cluster.gpus": visible_gpus()[0], "chunk": CHUNK,
            **extra}


def _write(path, data, chunk=CHUNK):
    array = zarr.create_array(store=str(path), shape=data.shape, chunks=(chunk,) + data.shape[1:],
                              dtype=data.dtype)
    array[...] = data
    return str(path)


def _overflow(op: str, dtype, seed: int) -> np.ndarray:
    """Fresh random matrices; half of the chunks scaled so that ``op`` overflows (tiny/16 for inv
    and solve, 0.9 * max for lu and slogdet)."""
    fi = np.finfo(dtype)
    a = matrices.generate("random", N, dtype, seed=seed, stop=COUNT)
    scale = fi.tiny / 16 if op in ("inv", "solve") else fi.max * 0.9
    for lo in range(CHUNK, COUNT, 2 * CHUNK):
        a[lo:lo + CHUNK] *= scale
    return a


def _finite(x: np.ndarray) -> np.ndarray:
    return np.isfinite(x).reshape(x.shape[0], -1).all(axis=1)


@pytest.mark.parametrize("op", ["lu", "inv", "solve", "slogdet"])
def test_gpu_run_counts_overflow_as_its_own_category(tmp_path, op):
    a = _overflow(op, np.float64, seed=1)
    source = _write(tmp_path / "a.zarr", a)
    rhs = _write(tmp_path / "b.zarr", matrices.rhs(N, 2, np.float64, seed=2, stop=COUNT)) if op == "solve" else None
    out = tmp_path / "out.zarr"
    report = pipeline.run(source, str(out), op=op, rhs=rhs, backend="gpu", progress=False, config=_config())
    assert report.backends == ("gpu",) and report.status == "complete"
    group = zarr.open_group(str(out), mode="r")
    info = np.asarray(group["info"][...])
    finite_out = np.logical_and.reduce([_finite(np.asarray(group[name][...])) for name in RESULTS[op]])
    np.testing.assert_array_equal(info == -2, ~finite_out & (info <= 0))
    assert (info == -2).sum() > CHUNK and (info[:CHUNK] == 0).all()
    assert report.nonfinite_result == int((info == -2).sum()) and report.ok == int((info == 0).sum())
    check = pipeline.verify(source, str(out))
    assert check.ok and check.nonfinite_result == report.nonfinite_result, check.summary()


def test_gpu_run_missing_chunk_error_and_fill(tmp_path):
    a = matrices.generate("random", N, np.complex64, seed=3, stop=COUNT)
    source = _write(tmp_path / "a.zarr", a)
    gone = tmp_path / "a.zarr" / "c" / "2" / "0" / "0"
    os.remove(gone)
    with pytest.raises(errors.MissingChunkError) as caught:
        pipeline.run(source, str(tmp_path / "o1.zarr"), op="inv", backend="gpu", progress=False,
                     config=_config())
    assert f"{gone} (matrices 32:48)" in str(caught.value)
    report = pipeline.run(source, str(tmp_path / "o2.zarr"), op="inv", backend="gpu", progress=False,
                          config=_config(**{"missing-chunks": "fill"}))
    info = np.asarray(zarr.open_array(str(tmp_path / "o2.zarr"), path="info", mode="r")[...])
    inv = np.asarray(zarr.open_array(str(tmp_path / "o2.zarr"), path="inv", mode="r")[...])
    assert (info[32:48] == -3).all() and np.isnan(inv[32:48]).all()
    assert (np.delete(info, np.s_[32:48]) == 0).all()
    assert report.missing == 16 and report.ok == COUNT - 16
    assert pipeline.verify(source, str(tmp_path / "o2.zarr")).ok


@pytest.mark.parametrize("pooled", [False, True])
def test_cuda_engine_marks_missing_and_counts_overflow(tmp_path, pooled):
    """The data path alone on the GPU: -3 for a missing chunk (filled), -2 counted, with the reads
    done here or by an I/O process."""
    from batchlu.pipeline.worker import _io_pool

    a = _overflow("inv", np.float64, seed=4)
    source = _write(tmp_path / "a.zarr", a)
    os.remove(tmp_path / "a.zarr" / "c" / "0" / "0" / "0")
    src = zarr.open_array(source, mode="r")
    group = zarr.open_group(str(tmp_path / "out.zarr"), mode="w")
    outs = {spec.name: group.create_array(spec.name, shape=(COUNT,) + spec.tail, dtype=spec.dtype,
                                          chunks=(CHUNK,) + spec.tail,
                                          fill_value=-7777 if spec.dtype.kind in "iu" else np.nan)
            for spec in output_specs("inv", N, np.float64)}
    io = _batches.BatchIO(src, None, outs,
                           lookup=lambda s, e, found=None: _missing.check(src, source, s, e, "fill"))
    if pooled:
        io.pool = _io_pool.get_pool(1, 1)
        io.where = {"a": (source, ""), **{name: (str(tmp_path / "out.zarr"), name) for name in outs}}
    engine = _engines.CudaEngine(0, threads=1)
    ranges = [(lo, min(lo + 2 * CHUNK, COUNT)) for lo in range(0, COUNT, 2 * CHUNK)]
    stats = _batches.run_batches(engine, "inv", io, ranges)
    info = np.asarray(outs["info"][...])
    inv = np.asarray(outs["inv"][...])
    assert (info[:CHUNK] == -3).all() and np.isnan(inv[:CHUNK]).all()
    assert stats.missing == CHUNK
    flagged = int((info == -2).sum())
    assert flagged > CHUNK and stats.nonfinite_result == flagged and stats.ok == int((info == 0).sum())
    np.testing.assert_array_equal((info == -2)[CHUNK:], ~_finite(inv[CHUNK:]) & (info[CHUNK:] <= 0))
