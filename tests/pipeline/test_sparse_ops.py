"""The sparse ops through the pipeline: ldlt-solve and ldlt-inertia round trips checked by verify,
verify catching wrong outputs, resume after SIGKILL bit-identical, bad inputs refused in one line."""

from __future__ import annotations

import os
import shutil
import textwrap

import numpy as np
import pytest
import zarr
from _pipeline_helpers import complete_flags, outputs_of, sigkill, start_script, wait_for_chunks

from batchlu import pipeline
from batchlu.pipeline import errors

COUNT, CHUNK = 30, 6


@pytest.fixture(scope="module")
def sparse_store(tmp_path_factory):
    """A saddle batch (N=30, chunks of 6) with a NaN in matrix 4's values and in matrix 9's rhs."""
    root = tmp_path_factory.mktemp("sparse")
    path = pipeline.generate(root / "kkt.zarr", count=COUNT, kind="saddle", size=120, chunk=CHUNK, seed=3)
    group = zarr.open_group(path, mode="r+")
    values = group["values"][4]
    values[2] = np.nan
    group["values"][4] = values
    rhs = group["rhs"][9]
    rhs[0] = np.nan
    group["rhs"][9] = rhs
    return path


@pytest.fixture(scope="module")
def runs(client, sparse_store, tmp_path_factory):
    root = tmp_path_factory.mktemp("sparse-out")
    made = {}
    for op in pipeline.SPARSE_OPS:
        made[op] = str(root / f"{op}.zarr")
        report = pipeline.run(sparse_store, made[op], op=op, client=client, progress=False)
        assert report.status == "complete"
    return made


def test_outputs_shapes_dtypes_and_info(runs, sparse_store):
    n = zarr.open_group(sparse_store, mode="r").attrs["sparse"]["n"]
    solved = outputs_of(runs["ldlt-solve"])
    assert solved["x"].shape == (COUNT, n) and solved["x"].dtype == np.float64
    assert solved["berr"].dtype == np.float64 and solved["perturbed"].dtype == np.int32
    info = solved["info"]
    assert info[4] == -1 and info[9] == -1 and np.all(np.delete(info, [4, 9]) == 0)
    assert np.isnan(solved["x"][[4, 9]]).all() and np.isfinite(np.delete(solved["x"], [4, 9], 0)).all()
    inertia = outputs_of(runs["ldlt-inertia"])
    assert inertia["inertia"].shape == (COUNT, 3) and inertia["inertia"].dtype == np.int64
    assert inertia["info"][4] == -1 and inertia["info"][9] == 0   # ldlt-inertia reads no rhs
    expected = zarr.open_group(sparse_store, mode="r").attrs["sparse"]["inertia"]
    assert np.all(np.delete(inertia["inertia"], 4, 0) == expected)
    record = pipeline.output._group.read_provenance(runs["ldlt-solve"])
    assert record["sparse"]["ordering"] == "amd" and record["sparse"]["n"] == n


def test_verify_passes_both_ops(runs, sparse_store):
    for op, out in runs.items():
        result = pipeline.verify(sparse_store, out)
        assert result.ok, result.summary()
        assert result.nonfinite == (2 if op == "ldlt-solve" else 1)
    solve = pipeline.verify(sparse_store, runs["ldlt-solve"])
    assert solve.ratios == COUNT - 2 and solve.max_ratio < 30
    inertia = pipeline.verify(sparse_store, runs["ldlt-inertia"])
    assert inertia.compared > 0 and "eigvalsh" in inertia.summary()


def test_verify_catches_a_wrong_solution_and_a_wrong_inertia(runs, sparse_store, tmp_path):
    bad = shutil.copytree(runs["ldlt-solve"], tmp_path / "bad-solve.zarr")
    x = zarr.open_array(str(bad), path="x", mode="r+")
    row = x[0]
    row[3] += 1e-3
    x[0] = row
    result = pipeline.verify(sparse_store, str(bad))
    assert not result.ok and "berr" in result.failures and result.first_failures[0][0] == 0
    bad = shutil.copytree(runs["ldlt-inertia"], tmp_path / "bad-inertia.zarr")
    counts = zarr.open_array(str(bad), path="inertia", mode="r+")
    counts[1] = counts[1] + np.array([1, 0, 0])
    result = pipeline.verify(sparse_store, str(bad))
    assert not result.ok and set(result.failures) == {"inertia-counts"}
    info = zarr.open_array(str(bad), path="info", mode="r+")
    info[5] = -1
    assert "nonfinite-only" in pipeline.verify(sparse_store, str(bad)).failures


def test_verify_judges_the_inertia_by_its_info_code(runs, sparse_store, tmp_path):
    """All -1 is the inertia of a matrix flagged by a zero pivot (info k > 0) or a non-finite one
    (-2); under info 0 it is a broken rule."""
    def tampered(name, row, inertia, code):
        bad = shutil.copytree(runs["ldlt-inertia"], tmp_path / name)
        counts = zarr.open_array(str(bad), path="inertia", mode="r+")
        counts[row] = inertia
        zarr.open_array(str(bad), path="info", mode="r+")[row] = code
        return pipeline.verify(sparse_store, str(bad))

    assert tampered("zero.zarr", 2, [-1, -1, -1], 1).ok
    assert tampered("overflow.zarr", 2, [-1, -1, -1], -2).ok
    assert set(tampered("ok.zarr", 2, [-1, -1, -1], 0).failures) == {"inertia-counts"}
    assert set(tampered("counted.zarr", 2, [1, 0, 0], -2).failures) == {"inertia-counts"}


def test_sharded_layout_gives_the_same_batch_and_results(client, runs, sparse_store, tmp_path):
    """generate --layout sharded: values and rhs stored as shards of inner chunks; the same numbers
    as the chunked store (the NaNs apart) and the same outputs, bit for bit, from ldlt-solve."""
    path = pipeline.generate(tmp_path / "sharded.zarr", count=COUNT, kind="saddle", size=120, chunk=CHUNK,
                             seed=3, layout="sharded")
    group, plain = zarr.open_group(path, mode="r"), zarr.open_group(sparse_store, mode="r")
    for name in ("values", "rhs"):
        assert group[name].shards is not None and group[name].shards[0] == CHUNK
        got, want = group[name][...], plain[name][...]
        same = np.isfinite(want)
        assert np.array_equal(got[same], want[same]) and np.isfinite(got).all()
    out = tmp_path / "out.zarr"
    assert pipeline.run(path, out, op="ldlt-solve", client=client, progress=False).status == "complete"
    got, want = outputs_of(out), outputs_of(runs["ldlt-solve"])
    keep = np.delete(np.arange(COUNT), [4, 9])   # the fixture's NaN matrices
    for name in ("x", "berr", "perturbed", "info"):
        assert np.array_equal(got[name][keep], want[name][keep]), name


RUNNER = textwrap.dedent("""
    import sys
    from distributed import Client, LocalCluster
    from batchlu import pipeline

    if __name__ == "__main__":
        with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            pipeline.run(sys.argv[1], sys.argv[2], op="ldlt-solve", client=client, progress=False,
                         config={"chunk": 2, "memory-budget": 1})
""")


def test_sigkill_then_resume_is_bit_identical(client, sparse_store, tmp_path):
    killed, clean = tmp_path / "killed.zarr", tmp_path / "clean.zarr"
    proc = start_script(tmp_path, RUNNER, sparse_store, killed,
                        env=dict(os.environ, DASK_BATCHLU_TESTING__TASK_DELAY="0.1"))
    try:
        wait_for_chunks(proc, killed, 3, timeout=60)
        sigkill(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    done = complete_flags(killed)
    assert 0 < done.sum() < done.size
    pipeline.run(sparse_store, killed, op="ldlt-solve", resume=True, client=client, progress=False)
    pipeline.run(sparse_store, clean, op="ldlt-solve", client=client, progress=False, config={"chunk": 2})
    a, b = outputs_of(str(killed)), outputs_of(str(clean))
    for name in ("x", "berr", "perturbed", "info"):
        assert np.array_equal(a[name], b[name], equal_nan=name in ("x", "berr")), name
    assert pipeline.verify(sparse_store, killed).ok


def test_resume_refuses_another_ordering(client, sparse_store, tmp_path):
    out = tmp_path / "o.zarr"
    pipeline.run(sparse_store, out, op="ldlt-inertia", client=client, progress=False)
    with pytest.raises(errors.ResumeError, match="ordering"):
        pipeline.run(sparse_store, out, op="ldlt-inertia", resume=True, client=client, progress=False,
                     config={"sparse.ordering": "natural"})


def test_bad_sparse_inputs(client, sparse_store, tmp_path):
    plain = pipeline.generate(tmp_path / "dense.zarr", count=4, size=3)
    with pytest.raises(errors.InputError, match="Zarr group") as err:
        pipeline.run(plain, tmp_path / "o1.zarr", op="ldlt-solve", client=client, progress=False)
    assert "\n" not in str(err.value)
    broken = shutil.copytree(sparse_store, tmp_path / "broken.zarr")
    group = zarr.open_group(str(broken), mode="r+")
    group.attrs["sparse"] = {"pattern": "upper", "kind": "spd"}
    with pytest.raises(errors.InputError, match="pattern"):
        pipeline.run(str(broken), tmp_path / "o2.zarr", op="ldlt-inertia", client=client, progress=False)
    group.attrs["sparse"] = {"pattern": "lower", "kind": "spd"}
    del group["values"]
    with pytest.raises(errors.InputError, match="'values'"):
        pipeline.run(str(broken), tmp_path / "o3.zarr", op="ldlt-inertia", client=client, progress=False)
    for path in ("o1.zarr", "o2.zarr", "o3.zarr"):
        assert not os.path.exists(tmp_path / path)


# ---- verify's sparse rules on their own ------------------------------------------------------------
@pytest.mark.parametrize("op", pipeline.SPARSE_OPS)
@pytest.mark.parametrize("code", [-1, -3])
def test_verify_wants_the_outputs_of_a_nan_code(runs, sparse_store, tmp_path, op, code):
    """info -1 (matrix 4's values hold a NaN) and -3 (chunk 2 of the values deleted, its outputs
    made those of a missing input) come with NaN x and berr and -1 counts: one matrix's finite x
    (ldlt-solve) or counts (ldlt-inertia) under such a code fail verify, by the rule nan-outputs."""
    from batchlu.pipeline._ops import mark_missing

    source, out = sparse_store, str(shutil.copytree(runs[op], tmp_path / "out.zarr"))
    row = 4
    if code == -3:
        source = str(shutil.copytree(sparse_store, tmp_path / "in.zarr"))
        os.remove(os.path.join(source, "values", "c", "2", "0"))
        rows = slice(2 * CHUNK, 3 * CHUNK)
        group = zarr.open_group(out, mode="r+")
        chunk = {name: np.asarray(group[name][rows]) for name in group.attrs["batchlu"]["outputs"]}
        mark_missing(chunk, np.ones(CHUNK, bool))
        for name, value in chunk.items():
            group[name][rows] = value
        row = 2 * CHUNK + 1
        assert pipeline.verify(source, out).ok   # a well-formed -3 chunk
    result_name = "x" if op == "ldlt-solve" else "inertia"
    array = zarr.open_array(out, path=result_name, mode="r+")
    assert zarr.open_array(out, path="info")[row] == code
    array[row] = array[0]                         # matrix 0's finite result
    result = pipeline.verify(source, out)
    assert not result.ok and result.failures == {"nan-outputs": 1}, result.summary()
    assert result.first_failures[0][0] == row and f"info {code}:" in result.first_failures[0][1]


@pytest.mark.parametrize("scale", [1e-308, 1e308])
def test_verify_sparse_backward_error_at_any_scale(scale):
    """Tridiagonal SPD matrices times 1e308 (||A||_inf overflows) or 1e-308 (subnormal entries):
    solutions computed at unit scale pass, halved ones fail. An infinite ||A|| made the backward
    error 0 and every halved solution passed."""
    from batchlu.pipeline.verify._sparse_rules import SparseBlock
    from batchlu.testing import matrices

    n, count = 6, 8
    rows = np.concatenate([np.arange(n), np.arange(1, n)])
    cols = np.concatenate([np.arange(n), np.arange(n - 1)])
    rng = np.random.default_rng(5)
    unit = np.concatenate([rng.uniform(1.2, 1.6, (count, n)), rng.uniform(-0.4, 0.4, (count, n - 1))], axis=1)
    values = unit * scale
    b = matrices.rhs(n, 2, "float64", seed=6, stop=count) * (scale if scale > 1 else 1)
    k = 1023 if scale > 1 else -1023     # values * 2^-k are of unit scale
    x = np.empty_like(b)
    for i in range(count):
        dense = np.zeros((n, n))
        dense[rows, cols] = dense[cols, rows] = np.ldexp(values[i], -k)
        x[i] = np.ldexp(np.linalg.solve(dense, np.ldexp(b[i], -(k if scale > 1 else 0))), (k if scale > 1 else 0) - k)
    assert np.isfinite(x).all()

    def berr(x):
        out = {"x": x, "berr": np.zeros(count), "perturbed": np.zeros(count, np.int32),
               "info": np.zeros(count, np.int32)}
        return SparseBlock("ldlt-solve", values, out, b, n, rows, cols).ratios["berr"]

    assert berr(x).max() < 30
    assert berr(x / 2).min() > 30


@pytest.mark.parametrize("engine", ["compiled", "numpy"])
def test_a_diagonal_only_pattern_runs_and_verifies(client, tmp_path, monkeypatch, engine):
    """A group whose pattern is the diagonal alone, on both CPU engines (the workers run in this
    process): ldlt-solve completes and verify passes; the NumPy engine's refinement ended the run
    with "cannot reshape array of size 0"."""
    monkeypatch.setenv("BATCHLU_CPU_ENGINE", engine)
    n, count = 9, 12
    rng = np.random.default_rng(41)
    group = zarr.open_group(str(tmp_path / "diag.zarr"), mode="w")
    group.create_array("indptr", data=np.arange(n + 1, dtype=np.int64))
    group.create_array("indices", data=np.arange(n, dtype=np.int64))
    values = rng.uniform(0.5, 2.0, (count, n)) * rng.choice([-1.0, 1.0], (count, n))
    group.create_array("values", data=values, chunks=(5, n))
    group.create_array("rhs", data=rng.standard_normal((count, n)), chunks=(5, n))
    group.attrs["sparse"] = {"pattern": "lower", "kind": "sym-indef"}
    out = tmp_path / "x.zarr"
    report = pipeline.run(str(tmp_path / "diag.zarr"), out, op="ldlt-solve", client=client, progress=False)
    assert report.status == "complete"
    result = pipeline.verify(str(tmp_path / "diag.zarr"), out)
    assert result.ok and result.ratios == count and result.max_ratio < 30, result.summary()
    solved = outputs_of(out)
    assert (solved["info"][:] == 0).all() and solved["x"].shape == (count, n)
