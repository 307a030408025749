"""bench_e2e.py's plumbing on the CPU, in seconds: the inputs (plain zarr, reproducible, reused), the
check that refuses a wrong output, the reading of the CLI's report (against the real
:class:`batchlu.pipeline.Report`), and a smoke run of the scripts and the client case."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    """bench_e2e imported as its script does (its folder first on the path)."""
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module("bench_e2e")


def test_sizes_and_options(bench):
    assert bench.parse_bytes("4MB") == 4_000_000 and bench.parse_bytes("1GiB") == 2**30
    assert bench.parse_bytes("2.5gb") == 2_500_000_000 and bench.parse_bytes("100") == 100
    with pytest.raises(ValueError, match="Expected a size"):
        bench.parse_bytes("4 furlongs")
    args = bench.parse_args(["--impls", "batchlu-cli,script", "--ns", "8,16", "--dtypes", "float64"])
    assert args.impls == ["batchlu-cli", "script"] and args.ns == [8, 16] and args.dtypes == ["float64"]
    assert args.data == ["random", "compressible"] and args.chunks == "32MiB"


@pytest.mark.parametrize("argv", [["--impls", "numpy"], ["--data", "smooth"], ["--sizes", "4XB"],
                                  ["--chunks", "big"], ["--repeat", "0"]])
def test_bad_options_stop_with_a_usage_error(bench, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(argv)
    assert exc.value.code == 2 and "error" in capsys.readouterr().err


@pytest.mark.parametrize("data", ["random", "compressible"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_inputs_are_plain_zarr_reproducible_and_reused(bench, tmp_path, data, dtype):
    import zarr

    inp = bench.make_input(data, 8, dtype, "300KB", "64KiB", seed=5)
    assert inp.count == 300_000 // (64 * np.dtype(dtype).itemsize)
    path = tmp_path / inp.name
    assert bench.write_input(path, inp) > 0
    a = zarr.open_array(str(path), mode="r")
    assert a.shape == (inp.count, 8, 8) and a.dtype == np.dtype(dtype)
    assert a.chunks == (65536 // (64 * np.dtype(dtype).itemsize), 8, 8)
    assert [type(c).__name__ for c in a.compressors] == ["ZstdCodec"] and a.shards is None
    x = a[:]
    assert np.isfinite(x).all() and np.linalg.cond(x.astype(np.float64)).max() < 1e6
    # matrix i depends on i alone, however the input is cut
    np.testing.assert_array_equal(bench.matrices(inp, 7, 90), x[7:90])
    assert bench.write_input(path, inp) is None                                   # reused
    assert bench.write_input(path, bench.make_input(data, 8, dtype, "300KB", "64KiB", seed=6)) > 0
    if data == "compressible":
        assert inp.nbytes / bench.stored_bytes(path) > 2   # zstd takes it down substantially


def test_the_check_refuses_a_wrong_inverse_and_the_script_on_zarrs_own_chunks(bench, tmp_path, monkeypatch):
    """The user's script inverts whatever blocks the input's chunks make: on zarr's own guess, which
    cuts the matrices (4 MB of float64 8 x 8: chunks (3906, 4, 4)), it inverts 4 x 4 pieces without a
    word and its output fails the check; on chunks of whole matrices it passes. (Where zarr's guess
    makes the pieces oblong, 1 MB: (977, 4, 8), the script stops on a LinAlgError instead.)"""
    # dask.array probes ``import sparse`` (pydata/sparse) for its chunk types as it is imported; in the
    # whole suite that name finds the test folder tests/kernels/sparse (tests/ has no packages): here
    # it is unimportable, as where pydata/sparse is not installed
    monkeypatch.setitem(sys.modules, "sparse", None)
    import dask
    import dask.array as da
    import zarr

    def script(src, out):
        x = da.from_zarr(str(src))
        with dask.config.set(scheduler="sync"):
            da.to_zarr(x.map_blocks(np.linalg.inv, dtype=x.dtype), str(out))

    whole = bench.make_input("random", 8, "float64", "4MB", "32MiB", seed=1)
    guess = bench.make_input("random", 8, "float64", "4MB", "zarr", seed=1)
    for inp in (whole, guess):
        bench.write_input(tmp_path / inp.name, inp)
    assert zarr.open_array(str(tmp_path / guess.name), mode="r").chunks == (3906, 4, 4)   # zarr 3.1's guess

    script(tmp_path / whole.name, tmp_path / "right.zarr")
    ok, ratio, why = bench.check_output(tmp_path / whole.name, tmp_path / "right.zarr")
    assert ok and ratio < 30 and why is None
    script(tmp_path / guess.name, tmp_path / "wrong.zarr")
    ok, ratio, why = bench.check_output(tmp_path / guess.name, tmp_path / "wrong.zarr")
    assert not ok and "dget03" in why
    wrong = zarr.open_array(str(tmp_path / "right.zarr"), mode="r+")
    wrong[:] = wrong[:] * (1 + 1e-3)
    assert not bench.check_output(tmp_path / whole.name, tmp_path / "right.zarr")[0]
    short = zarr.create_array(str(tmp_path / "short.zarr"), shape=(5, 8, 8), dtype="float64")
    assert "shape" in bench.check_output(tmp_path / whole.name, tmp_path / "short.zarr")[2]
    assert short is not None and not bench.check_output(tmp_path / whole.name, tmp_path / "none.zarr")[0]


def test_it_reads_the_report_batchlu_run_prints(bench):
    from batchlu import pipeline

    report = pipeline.Report(output="/x/out.zarr", op="inv", count=1000, processed=1000, ok=998, singular=2,
                             elapsed=0.31, cluster_start=3.5, warmup=1.25, wall=6.5, read_s=0.1,
                             compute_s=0.2, write_s=0.05, tasks=1, backend="auto", backends=("cpu",),
                             warmup_steps={"device": 0.25, "kernels": 0.5, "pinned slots": 0.25, "I/O processes": 0.12},
                             finish_steps={"cluster close": 1.5, "checks": 0.02, "record": 0.01})
    found = bench.parse_report("some warning\n" + str(report) + "\n")
    assert found["status"] == "complete" and found["ok"] == 998 and found["backends"] == "cpu"
    assert found["phases_s"]["compute"] == 0.31 and found["phases_s"]["cluster_start"] == 3.5
    assert found["phases_s"]["warm_up"] == 1.25 and found["phases_s"]["total"] == 6.5
    assert found["stages_s"] == {"read": 0.1, "compute": 0.2, "write": 0.05}
    assert found["warm_up_s"] == {"device": 0.25, "kernels": 0.5, "pinned slots": 0.25, "I/O processes": 0.12}
    assert bench.report_of(report)["phases_s"] == found["phases_s"]
    assert bench.report_of(report)["warm_up_s"] == found["warm_up_s"]
    assert found["finish_s"] == {"cluster close": 1.5, "checks": 0.02, "record": 0.01}
    assert bench.report_of(report)["finish_s"] == found["finish_s"]
    assert bench.parse_report("Error: no such input\n") is None


def test_a_smoke_run_of_the_scripts_writes_its_records_and_table(tmp_path):
    out = tmp_path / "e2e.json"
    argv = ["--device", "cpu", "--sizes", "20KB", "--ns", "4", "--dtypes", "float64", "--impls",
            "script,script-client", "--data-dir", str(tmp_path / "data"), "--out", str(out)]
    done = subprocess.run([sys.executable, str(BENCH / "bench_e2e.py"), *argv], capture_output=True,
                          text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["commands"] == ["python benchmarks/bench_e2e.py " + " ".join(argv)]
    records = result["records"]
    assert sorted((r["impl"], r["data"], r["run"]) for r in records) == sorted(
        [("script", d, 1) for d in ("random", "compressible")]
        + [(i, d, k) for i in ("script-client",) for d in ("random", "compressible") for k in (1, 2)])
    for r in records:
        assert r["ok"] and r["max_ratio"] < 30 and r["wall_s"] > 0 and r["compute_s"] is None
        assert (r["n"], r["dtype"], r["bytes"], r["count"]) == (4, "float64", 19968, 156)
        assert r["device"].startswith("CPU: ") and r["cores"] >= 1 and r["date"] and "commit" in r
    assert "ratio = script / CLI" in done.stdout and "client case" in done.stdout
    assert len(list((tmp_path / "data").glob("*.zarr"))) == 2     # --data-dir keeps the inputs
