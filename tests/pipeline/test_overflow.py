"""Overflow through whole runs (issue 16, item 4): finite matrices whose results are not finite used
to be written with ``info`` 0 and reported "ok". Now they get ``info`` -2, are counted as
"non-finite result" in the report, the provenance, ``inspect`` and ``verify``, and the run still
exits 0. Real LocalCluster, real on-disk Zarr; the expected outputs are ``kernels`` on the same
matrices, chunk by chunk, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from batchlu import pipeline
from batchlu.pipeline._ops import compute
from batchlu.testing import matrices

from _pipeline_helpers import outputs_of

COUNT, N, CHUNK = 60, 8, 15
RESULTS = {"lu": ("lu",), "inv": ("inv",), "solve": ("x",), "slogdet": ("sign", "logabsdet")}


def _overflow_store(path, op: str, dtype="float64", seed=0) -> tuple[str, np.ndarray]:
    """Fresh random matrices, every other chunk's worth scaled so that ``op`` overflows on most of
    them: by 1e-308-like tiny values for inv and solve (as in the issue), by 0.9 * max for lu and
    slogdet."""
    fi = np.finfo(dtype)
    a = matrices.generate("random", N, dtype, seed=seed, stop=COUNT)
    scale = fi.tiny / 16 if op in ("inv", "solve") else fi.max * 0.9
    a[CHUNK:2 * CHUNK] *= scale
    a[3 * CHUNK:] *= scale
    array = zarr.create_array(store=str(path), shape=a.shape, chunks=(CHUNK, N, N), dtype=a.dtype)
    array[...] = a
    return str(path), a


def _rhs_store(path, dtype="float64", seed=1) -> tuple[str, np.ndarray]:
    b = matrices.rhs(N, 2, dtype, seed=seed, stop=COUNT)
    array = zarr.create_array(store=str(path), shape=b.shape, chunks=(CHUNK, N, 2), dtype=b.dtype)
    array[...] = b
    return str(path), b


def _finite(x: np.ndarray) -> np.ndarray:
    return np.isfinite(x).reshape(x.shape[0], -1).all(axis=1)


@pytest.mark.parametrize("dtype", ["float64", "complex64"])
@pytest.mark.parametrize("op", ["lu", "inv", "solve", "slogdet"])
def test_overflow_is_its_own_category(client, tmp_path, op, dtype):
    source, a = _overflow_store(tmp_path / "a.zarr", op, dtype)
    rhs, b = _rhs_store(tmp_path / "b.zarr", dtype) if op == "solve" else (None, None)
    out = tmp_path / "out.zarr"
    report = pipeline.run(source, out, op=op, rhs=rhs, client=client, progress=False,
                          config={"chunk": CHUNK})
    got = outputs_of(str(out))
    parts = [compute(op, a[lo:lo + CHUNK], None if b is None else b[lo:lo + CHUNK])
             for lo in range(0, COUNT, CHUNK)]
    for name in parts[0]:
        want = np.concatenate([p[name] for p in parts])
        assert got[name].dtype == want.dtype and np.array_equal(got[name], want, equal_nan=True), name
    info = got["info"]
    finite_out = np.logical_and.reduce([_finite(got[name]) for name in RESULTS[op]])
    # the rule: a finite input (all of them here) gets -2 exactly where its results are not finite
    np.testing.assert_array_equal(info == -2, ~finite_out & (info <= 0))
    overflowed = int((info == -2).sum())
    assert overflowed > 10 and (info[:CHUNK] == 0).all()
    assert report.nonfinite_result == overflowed and report.nonfinite == 0
    assert report.ok == int((info == 0).sum()) and report.status == "complete"
    assert f"non-finite result {overflowed:,}" in repr(report)
    record = zarr.open_group(out, mode="r").attrs["batchlu"]
    assert record["counts"]["nonfinite_result"] == overflowed
    assert f"non-finite result {overflowed:,}" in pipeline.inspect(str(out))
    check = pipeline.verify(source, out)
    assert check.ok and check.nonfinite_result == overflowed, check.summary()


@pytest.mark.parametrize("op", ["inv", "solve"])
def test_cli_run_reports_the_overflow_and_exits_0(client, tmp_path, op):
    """The issue's reproduction: 8x8 float64 matrices scaled to ~1e-308, through ``batchlu run``."""
    from batchlu.workflows.cli import cli

    source, a = _overflow_store(tmp_path / "a.zarr", op, "float64", seed=3)
    args = ["run", source, str(tmp_path / "out.zarr"), "--op", op, "--scheduler", client.scheduler.address]
    if op == "solve":
        args += ["--rhs", _rhs_store(tmp_path / "b.zarr", seed=4)[0]]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    info = np.asarray(zarr.open_array(str(tmp_path / "out.zarr"), path="info", mode="r")[...])
    overflowed, ok = int((info == -2).sum()), int((info == 0).sum())
    assert overflowed > 10 and ok + overflowed == COUNT
    assert f"ok {ok:,}" in result.stdout and f"non-finite result {overflowed:,}" in result.stdout
    assert "non-finite input 0" in result.stdout and "missing input 0" in result.stdout


def _tampered(client, tmp_path, change) -> pipeline.VerifyReport:
    source, _ = _overflow_store(tmp_path / "a.zarr", "inv", seed=5)
    out = tmp_path / "out.zarr"
    pipeline.run(source, out, op="inv", client=client, progress=False, config={"chunk": CHUNK})
    assert pipeline.verify(source, out).ok
    info = zarr.open_array(str(out), path="info", mode="r+")
    inv = zarr.open_array(str(out), path="inv", mode="r+")
    change(info, inv)
    return pipeline.verify(source, out)


def test_verify_fails_a_minus_2_whose_outputs_are_finite(client, tmp_path):
    def change(info, inv):
        i = int(np.flatnonzero(np.asarray(info[...]) == -2)[0])
        inv[i] = np.eye(N)
    check = _tampered(client, tmp_path, change)
    assert not check.ok and check.semantic_errors == 1, check.summary()


def test_verify_fails_a_finite_output_flagged_minus_2(client, tmp_path):
    def change(info, inv):
        i = int(np.flatnonzero(np.asarray(info[...]) == 0)[0])
        info[i] = -2
    check = _tampered(client, tmp_path, change)
    assert not check.ok and check.semantic_errors == 1, check.summary()


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the ratio of an inf inverse
def test_verify_fails_an_overflow_reported_as_ok(client, tmp_path):
    """What the issue saw: info 0 with inf/NaN inverses. verify must not call it OK."""
    def change(info, inv):
        values = np.asarray(info[...])
        info[...] = np.where(values == -2, 0, values)
    check = _tampered(client, tmp_path, change)
    assert not check.ok and check.semantic_errors > 10, check.summary()
