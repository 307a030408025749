"""``batchlu`` through click's runner: generate -> inspect -> run (every op) -> verify, and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from batchlu.testing import matrices
from batchlu.testing import ratios
from batchlu.testing.ratios import THRESHOLD

COUNT, SIZE, CHUNK = 45, 6, 20  # chunks of 20, 20 and 5: the chunk size does not divide N

OUTPUTS = {  # op -> {array: (shape, dtype or None for the input's dtype)}
    "lu": {"lu": ((COUNT, SIZE, SIZE), None), "piv": ((COUNT, SIZE), "int32"), "info": ((COUNT,), "int32")},
    "inv": {"inv": ((COUNT, SIZE, SIZE), None), "info": ((COUNT,), "int32")},
    "solve": {"x": ((COUNT, SIZE, 2), None), "info": ((COUNT,), "int32")},
    "slogdet": {"sign": ((COUNT,), None), "logabsdet": ((COUNT,), "float64"), "info": ((COUNT,), "int32")},
}


@pytest.fixture(scope="module")
def stores(invoke, tmp_path_factory):
    """A generated input ``a.zarr`` (N=45, n=6, chunks of 20) and right-hand sides ``b.zarr`` (k=2)."""
    root = tmp_path_factory.mktemp("stores")
    a, b = root / "a.zarr", root / "b.zarr"
    result = invoke("generate", a, "--count", COUNT, "--size", SIZE, "--chunk", CHUNK, "--seed", 7,
                    "--rhs-out", b, "--rhs-columns", 2)
    assert result.exit_code == 0, result.output
    return a, b


def assert_user_error(result, *words, code=1):
    """Exit ``code``, no traceback, the last stderr line is ``Error: ...`` naming each of ``words``."""
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("Error: "), result.stderr
    if code == 1:
        assert len(lines) == 1, f"expected a one-line message, got:\n{result.stderr}"
    for word in words:
        assert word.lower() in lines[-1].lower(), lines[-1]
    return lines[-1]


def run_args(stores, out, op, scheduler):
    a, b = stores
    args = ["run", a, out, "--op", op, "--scheduler", scheduler]
    return args + (["--rhs", b] if op == "solve" else [])


# ------------------------------------------------------------------------------------ generate/inspect
def test_generate_writes_the_seeded_matrices_and_rhs(stores):
    a, b = stores
    arr = zarr.open_array(a, mode="r")
    assert arr.shape == (COUNT, SIZE, SIZE)
    assert arr.dtype == np.float64
    assert arr.chunks[0] == CHUNK
    expected = matrices.generate("random", SIZE, "float64", seed=7, start=0, stop=COUNT)
    np.testing.assert_array_equal(arr[...], expected)
    rhs = zarr.open_array(b, mode="r")
    assert rhs.shape == (COUNT, SIZE, 2)
    assert rhs.dtype == np.float64
    assert np.isfinite(rhs[...]).all() and np.unique(rhs[...]).size == rhs.size


def test_inspect_prints_shape_dtype_and_chunks(invoke, stores):
    """inspect's line for each generated array: the shape, dtype and chunks generate was asked for,
    and its provenance (the old checks, "float64", "45" and "20" anywhere in the output, passed on
    a date or a path)."""
    for store, tail, what in ((stores[0], (SIZE, SIZE), "'seed': 7"), (stores[1], (SIZE, 2), "'what': 'rhs'")):
        result = invoke("inspect", store)
        assert result.exit_code == 0 and result.stderr == "", result.output
        lines = result.stdout.splitlines()
        assert lines[:2] == [f"Zarr array {store}",
                             f"  /: shape {(COUNT,) + tail} float64, chunks {(CHUNK,) + tail}, zarr v3"], lines
        assert len(lines) == 3 and lines[2].startswith("  generated: {") and what in lines[2], lines


def test_generate_replaces_a_store_only_with_overwrite(invoke, tmp_path):
    out = tmp_path / "a.zarr"
    assert invoke("generate", out, "-N", 4, "-n", 3, "--seed", 1).exit_code == 0
    assert_user_error(invoke("generate", out, "-N", 6, "-n", 3, "--seed", 2), "--overwrite")
    assert zarr.open_array(out, mode="r").shape == (4, 3, 3)  # untouched
    replaced = invoke("generate", out, "-N", 6, "-n", 3, "--seed", 2, "--overwrite")
    assert replaced.exit_code == 0, replaced.output
    np.testing.assert_array_equal(zarr.open_array(out, mode="r")[...],
                                  matrices.generate("random", 3, "float64", seed=2, stop=6))


@pytest.mark.parametrize("dtype", ["float32", "complex64", "complex128"])
def test_generate_other_dtypes(invoke, tmp_path, dtype):
    out = tmp_path / "m.zarr"
    result = invoke("generate", out, "-N", 5, "-n", 3, "--dtype", dtype, "--kind", "illcond", "--seed", 1)
    assert result.exit_code == 0, result.output
    arr = zarr.open_array(out, mode="r")
    assert arr.shape == (5, 3, 3) and arr.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(arr[...], matrices.generate("illcond", 3, dtype, seed=1, stop=5))


# ------------------------------------------------------------------------------------------ run/verify
def _ratios(op, a, b, group) -> np.ndarray:
    """The op's LAPACK test ratios of the stored outputs, recomputed here (per matrix, max over kinds)."""
    from batchlu.testing import ratios

    out = {name: group[name][...] for name in OUTPUTS[op]}
    if op == "lu":
        return ratios.get01(a, out["lu"], out["piv"])
    if op == "inv":
        return ratios.get03(a, out["inv"])
    if op == "solve":
        return ratios.get02(a, out["x"], b)
    return np.maximum.reduce(ratios.slogdet_ratios(a, out["sign"], out["logabsdet"]))


@pytest.mark.parametrize("op", list(OUTPUTS))
def test_run_every_op_then_verify(invoke, stores, scheduler_address, tmp_path, op):
    """Each op's output: the arrays of the op with their shapes and dtypes, info 0 for the random
    matrices, results whose LAPACK test ratios (recomputed here) are below 30; verify says OK over
    all 45 matrices with as many ratios, on a sample of 10 too (for solve from the right-hand sides
    recorded in the output), and fails once one matrix's result is wrong (the old checks, "30" and
    "10" anywhere in the output, held for any report of any run)."""
    out = tmp_path / f"{op}.zarr"
    result = invoke(*run_args(stores, out, op, scheduler_address))
    assert result.exit_code == 0, result.output
    assert str(out) in result.output  # the report names the output

    group = zarr.open_group(out, mode="r")
    assert sorted(name for name, _ in group.arrays() if not name.startswith("_")) == sorted(OUTPUTS[op])
    for name, (shape, dtype) in OUTPUTS[op].items():
        assert group[name].shape == shape, name
        assert group[name].dtype == np.dtype(dtype or "float64"), name
    np.testing.assert_array_equal(group["info"][...], 0)  # random matrices are all regular
    a, b = zarr.open_array(stores[0], mode="r")[...], zarr.open_array(stores[1], mode="r")[...]
    assert _ratios(op, a, b, group).max() < THRESHOLD

    if op == "slogdet":  # the sign of a well-conditioned random matrix is not in doubt
        np.testing.assert_array_equal(group["sign"][...], np.linalg.slogdet(a)[0])
    args = ["verify", stores[0], out] + (["--rhs", stores[1]] if op == "solve" else [])
    verified = invoke(*args)
    assert verified.exit_code == 0, verified.output
    lines = verified.stdout.splitlines()
    assert lines[0] == f"verify {op}: OK - all {COUNT} of {COUNT} matrices in {out}", lines
    assert f", 0 over {int(THRESHOLD)} (of {COUNT} ratios)" in lines[1], lines
    # a random sample, and (for solve) the right-hand sides recorded in the output
    sampled = invoke("verify", stores[0], out, "--sample", 10, "--seed", 3)
    assert sampled.exit_code == 0, sampled.output
    lines = sampled.stdout.splitlines()
    assert lines[0] == f"verify {op}: OK - a random sample of 10 of {COUNT} matrices in {out}", lines
    assert f", 0 over {int(THRESHOLD)} (of 10 ratios)" in lines[1], lines
    # and verify tells a wrong result: matrix 7's main result off by 1 in one entry
    name = next(iter(OUTPUTS[op]))
    wrong = zarr.open_group(out, mode="r+")[name]
    value = np.array(wrong[7])
    value.reshape(-1)[-1] += 1
    wrong[7] = value
    failed = invoke(*args)
    assert failed.exit_code == 1 and "verify " + op + ": FAILED" in failed.stdout, failed.output
    assert "matrix 7: " in failed.stdout and "1 matrix with a test ratio over 30" in failed.stderr


def _v2_array(path, values, byteorder: str) -> None:
    """``values`` as a Zarr v2 array whose dtype carries ``byteorder`` (">": ">f8", ">c8", ...)."""
    dtype = values.dtype.newbyteorder(byteorder)
    zarr.create_array(path, shape=values.shape, chunks=(CHUNK,) + values.shape[1:], dtype=dtype,
                      zarr_format=2)[...] = values.astype(dtype)


@pytest.mark.parametrize("dtype, io_processes", [("float64", 0), ("complex64", 1)],
                         ids=["float64-in-the-worker", "complex64-in-an-io-process"])
def test_a_zarr_v2_big_endian_input_is_read_in_native_order(invoke, scheduler_address, tmp_path, dtype,
                                                            io_processes):
    """Zarr v2 keeps the byte order in the dtype (">f8"); such an input was refused ("Got >f8").
    It is read in native order on each read path (the worker, or its I/O processes): the outputs are
    right by LAPACK's ratio and bit-identical to those of the same values stored little-endian."""
    rng = np.random.default_rng(23)
    a = matrices.generate("random", SIZE, dtype, seed=23, start=0, stop=COUNT)
    b = rng.standard_normal((COUNT, SIZE, 2)).astype(dtype)
    outs = {}
    for order in (">", "<"):
        _v2_array(tmp_path / f"a{order}.zarr", a, order)
        _v2_array(tmp_path / f"b{order}.zarr", b, order)
        outs[order] = tmp_path / f"x{order}.zarr"
        result = invoke("run", tmp_path / f"a{order}.zarr", outs[order], "--op", "solve", "--rhs",
                        tmp_path / f"b{order}.zarr", "--scheduler", scheduler_address,
                        "--config", f"io-processes={io_processes}")
        assert result.exit_code == 0, result.output
    big, little = (zarr.open_group(outs[order], mode="r") for order in (">", "<"))
    for name in ("x", "info"):
        assert big[name].dtype == little[name].dtype and big[name].dtype.isnative, name
        np.testing.assert_array_equal(big[name][...].view(np.uint8), little[name][...].view(np.uint8))
    np.testing.assert_array_equal(big["info"][...], 0)
    assert ratios.get02(a, big["x"][...], b).max() <= THRESHOLD
    verified = invoke("verify", tmp_path / "a>.zarr", outs[">"])
    assert verified.exit_code == 0 and "OK" in verified.stdout, verified.output


def test_verify_exits_1_when_an_output_is_tampered_with(invoke, stores, scheduler_address, tmp_path):
    out = tmp_path / "inv.zarr"
    assert invoke(*run_args(stores, out, "inv", scheduler_address)).exit_code == 0
    assert invoke("verify", stores[0], out).exit_code == 0

    inv = zarr.open_group(out, mode="r+")["inv"]
    matrix = inv[CHUNK + 3]
    matrix[1, 2] += 1.0  # one wrong entry in one matrix
    inv[CHUNK + 3] = matrix

    result = invoke("verify", stores[0], out)
    assert_user_error(result, "verification failed")
    assert str(int(THRESHOLD)) in result.stdout  # the summary still comes first


@pytest.mark.parametrize("flag, codec", [("--output-codec", "lz4"), ("--output-compressor", "none")],
                         ids=["output-codec", "old-name"])
def test_output_codec_and_its_old_flag(invoke, stores, scheduler_address, tmp_path, flag, codec):
    """--output-codec sets the output arrays' codec; --output-compressor, its old name, still does, with
    one warning line; either way the output records it as output_codec."""
    a, _ = stores
    out = tmp_path / "o.zarr"
    result = invoke("run", a, out, "--op", "inv", "--scheduler", scheduler_address, flag, codec)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning: ")]
    if flag == "--output-codec":
        assert not warnings, result.stderr
    else:
        assert warnings == ["Warning: batchlu.output-compressor (--output-compressor) is deprecated: use "
                            "batchlu.output-codec (--output-codec), which takes the same values."], result.stderr
    group = zarr.open_group(str(out), mode="r")
    assert [type(c).__name__ for c in group["inv"].compressors] == \
        {"lz4": ["LZ4"], "none": []}[codec] + ["Crc32cCodec"]   # then batchlu.output-checksum's
    settings = group.attrs["batchlu"]["settings"]
    assert settings["output_codec"] == codec and "output_compressor" not in settings
    assert invoke("verify", a, out).exit_code == 0


def test_singular_matrices_are_counted_not_failed(invoke, tmp_path, scheduler_address):
    a, out, count = tmp_path / "mix.zarr", tmp_path / "inv.zarr", 60
    assert invoke("generate", a, "-N", count, "-n", 5, "--chunk", 16, "--kind", "singular-mix").exit_code == 0
    result = invoke("run", a, out, "--op", "inv", "--scheduler", scheduler_address)
    assert result.exit_code == 0, result.output

    masks = matrices.singular_mix_masks(0, count)
    info = zarr.open_group(out, mode="r")["info"][...]
    np.testing.assert_array_equal(info == -1, masks["nan"] | masks["inf"])
    np.testing.assert_array_equal(info > 0, masks["singular"] | masks["zero"])
    inv = zarr.open_group(out, mode="r")["inv"][...]
    assert np.isnan(inv[info != 0]).all()
    assert np.isfinite(inv[info == 0]).all()
    assert invoke("verify", a, out).exit_code == 0


def test_input_array_inside_a_group(invoke, tmp_path, scheduler_address):
    data = matrices.generate("random", 4, "float32", seed=3, stop=30)
    group = zarr.open_group(tmp_path / "g.zarr", mode="w")
    group.create_array("mats", data=data, chunks=(8, 4, 4))
    out = tmp_path / "lu.zarr"
    result = invoke("run", tmp_path / "g.zarr", out, "--array", "mats", "--op", "lu",
                    "--scheduler", scheduler_address)
    assert result.exit_code == 0, result.output
    assert zarr.open_group(out, mode="r")["lu"].dtype == np.float32
    verified = invoke("verify", f"{tmp_path / 'g.zarr'}:mats", out)
    assert verified.exit_code == 0, verified.output


def test_a_group_input_names_its_nested_arrays(invoke, tmp_path):
    """A group holding its array one level down (g.zarr/sub/m): the error suggests PATH:sub/m (it
    said the group held no arrays)."""
    group = zarr.open_group(tmp_path / "g.zarr", mode="w")
    group.create_group("sub").create_array("m", data=matrices.generate("random", 4, "float64", seed=3, stop=6))
    result = invoke("run", tmp_path / "g.zarr", tmp_path / "o.zarr", "--op", "lu")
    assert_user_error(result, f"{tmp_path / 'g.zarr'}:sub/m")


def test_existing_output_needs_overwrite_or_resume(invoke, stores, scheduler_address, tmp_path):
    out = tmp_path / "inv.zarr"
    args = run_args(stores, out, "inv", scheduler_address)
    assert invoke(*args).exit_code == 0
    first = zarr.open_group(out, mode="r")["inv"][...]

    assert_user_error(invoke(*args), "--overwrite")
    resumed = invoke(*args, "--resume")
    assert resumed.exit_code == 0, resumed.output
    overwritten = invoke(*args, "--overwrite")
    assert overwritten.exit_code == 0, overwritten.output
    np.testing.assert_array_equal(zarr.open_group(out, mode="r")["inv"][...], first)


def test_embedded_cluster_with_config_overrides(invoke, stores, tmp_path, monkeypatch):
    """No --scheduler: the run starts its own local cluster, sized by the CLI flags: LocalCluster is
    asked for them, and its scheduler sees exactly that many workers with that many threads each
    (1 x 3 is never distributed's default sizing, whatever the machine's core count)."""
    import distributed

    clusters = []

    class Spy(distributed.LocalCluster):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            clusters.append(({key: kwargs.get(key) for key in ("n_workers", "threads_per_worker")},
                             {address: worker["nthreads"]
                              for address, worker in self.scheduler_info["workers"].items()}))

    monkeypatch.setattr(distributed, "LocalCluster", Spy)
    out = tmp_path / "slogdet.zarr"
    result = invoke("run", stores[0], out, "--op", "slogdet", "--workers", 1, "--threads-per-worker", 3,
                    "--memory-budget", "64KiB", "--backend", "cpu",
                    "--config", "cluster.dashboard-address=127.0.0.1:0")
    assert result.exit_code == 0, result.output
    assert len(clusters) == 1, clusters
    asked, workers = clusters[0]
    assert asked == {"n_workers": 1, "threads_per_worker": 3} and list(workers.values()) == [3], clusters
    assert zarr.open_group(out, mode="r")["info"].shape == (COUNT,)
    record = zarr.open_group(out, mode="r").attrs["batchlu"]
    assert record["status"] == "complete" and record["counts"]["ok"] == COUNT


# ------------------------------------------------------------------------------------------ bad input
def test_missing_input_is_a_one_line_error(invoke, tmp_path):
    out = tmp_path / "out.zarr"
    assert_user_error(invoke("run", tmp_path / "nowhere.zarr", out, "--op", "lu"), "nowhere.zarr")
    assert not out.exists()


def test_integer_input_is_refused(invoke, tmp_path):
    a = tmp_path / "int.zarr"
    zarr.create_array(a, shape=(6, 3, 3), dtype="int32", chunks=(3, 3, 3))[...] = \
        np.arange(54, dtype=np.int32).reshape(6, 3, 3)
    out = tmp_path / "out.zarr"
    assert_user_error(invoke("run", a, out, "--op", "inv"), "int32")
    assert_user_error(invoke("inspect", tmp_path / "missing.zarr"), "missing.zarr")


@pytest.mark.parametrize("extra, words", [
    (["--resume", "--overwrite"], ["--resume and --overwrite"]),
    (["--scheduler", "tcp://127.0.0.1:1", "--scheduler-file", __file__], ["--scheduler and --scheduler-file"]),
    (["--rhs", "b.zarr"], ["--rhs", "solve"]),
    (["--array", "x"], ["array name once"]),
    (["--memory-budget", "lots"], ["512MiB"]),
    (["--config", "no-equals-sign"], ["KEY=VALUE"]),
    (["--backend", "tpu"], ["tpu"]),
], ids=["resume+overwrite", "scheduler+file", "rhs-without-solve", "array-twice", "bad-size", "bad-config",
        "bad-backend"])
def test_bad_run_options_are_usage_errors(invoke, tmp_path, extra, words):
    out = tmp_path / "out.zarr"
    source = "in.zarr:y" if "--array" in extra else "in.zarr"
    assert_user_error(invoke("run", source, out, "--op", "lu", *extra), *words, code=2)
    assert not out.exists()


def test_solve_needs_rhs(invoke, tmp_path):
    assert_user_error(invoke("run", "in.zarr", tmp_path / "o.zarr", "--op", "solve"), "--rhs", code=2)


def test_generate_rejects_integer_dtype_and_empty_count(invoke, tmp_path):
    assert_user_error(invoke("generate", tmp_path / "a.zarr", "-N", 4, "-n", 3, "--dtype", "int32"),
                      "int32", code=2)
    assert_user_error(invoke("generate", tmp_path / "a.zarr", "-N", 0, "-n", 3), "count", code=2)
    assert not (tmp_path / "a.zarr").exists()
