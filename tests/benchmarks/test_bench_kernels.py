"""bench_kernels.py's plumbing, without a GPU: its options, the cuSOLVERDx and nvmath peers in the
registries, a missing nvmath-python recorded as one skip per point (impl names ``cusolverdx`` and
``nvmath``), a peer whose output fails its LAPACK ratio refused before timing, the cuSOLVERDx
shared-memory layouts and sweeps; and, on a GPU, every peer's check on a small batch."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
H100_SMEM_OPTIN = 232448  # bytes of shared memory one block may opt in to on an H100


@pytest.fixture
def bench(monkeypatch):
    """bench_kernels imported as its script does (its folder first on the path), with the device
    queries replaced; the registries' import-failure cache emptied."""
    monkeypatch.syspath_prepend(str(BENCH))
    bk = importlib.import_module("bench_kernels")
    monkeypatch.setattr(bk, "device_name", lambda: "test device")
    monkeypatch.setattr(bk, "free_memory", lambda: None)
    peers = importlib.import_module("_nvmath_impls")
    monkeypatch.setattr(peers, "_FAILED_IMPORTS", {})
    monkeypatch.setitem(peers.SETTINGS, "sweep", peers.SETTINGS["sweep"])
    return bk


@pytest.fixture
def no_nvmath(monkeypatch):
    """nvmath-python absent: importing it or a submodule raises ImportError."""
    for name in ("nvmath", "nvmath.device", "nvmath.linalg"):
        monkeypatch.setitem(sys.modules, name, None)


# ---- options --------------------------------------------------------------------------------------

def test_options_for_a_peers_run(bench):
    args = bench.parse_args(["--impls", "batchlu,cusolverdx,nvmath,cublas", "--ops", "lu,inv,solve",
                             "--dtypes", "float32,complex128", "--ns", "33,64,128,190", "--batch", "10000",
                             "--dx-sweep", "suggested", "--budget", "200", "--reps", "5", "--out", "x"])
    assert args.impls == ["ours", "cusolverdx", "nvmath", "cublas"]  # batchlu is ours' other name
    assert args.ops == ["lu", "inv", "solve"]
    assert args.dtypes == ["float32", "complex128"]
    assert args.sizes == [33, 64, 128, 190]
    assert (args.batch, args.reps, args.budget, args.dx_sweep) == (10000, 5, 200.0, "suggested")
    bench.configure_registries(args)
    assert importlib.import_module("_nvmath_impls").SETTINGS["sweep"] == "suggested"


def test_defaults_keep_every_peer_and_the_bpb_sweep(bench):
    args = bench.parse_args([])
    assert args.impls is None and args.budget is None and args.dx_sweep == "bpb"
    assert args.sizes == [16, 33, 64, 96, 128, 160, 190, 256, 512]


@pytest.mark.parametrize("argv", [["--dx-sweep", "everything"], ["--dtypes", "float16"],
                                  ["--sizes", "33,sixty"]])
def test_bad_options_stop_with_a_usage_error(bench, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(argv)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_the_new_peers_are_registered_for_each_op(bench):
    impls, flops, nbytes, _ = bench.load_registries()
    for op in ("lu", "inv", "solve"):
        assert {"cusolverdx", "nvmath"} <= set(impls[op]), op
        assert op in flops
    assert set(nbytes) == {"inv", "solve"}


# ---- a missing package: one skip record per point, named by the peer -----------------------------

def test_missing_nvmath_is_recorded_as_a_skip_per_point(bench, no_nvmath, capsys):
    args = bench.parse_args(["--impls", "cusolverdx,nvmath", "--ops", "lu,inv,solve", "--dtypes", "float32",
                             "--sizes", "33,64", "--batch", "100"])
    records = bench.run(args)
    assert len(records) == 3 * 2 * 2
    assert [r["impl"] for r in records] == ["cusolverdx", "nvmath"] * 6
    for r in records:
        assert "ms" not in r and "failed" not in r, r
        assert r["skipped"].startswith(f"import nvmath.{'device' if r['impl'] == 'cusolverdx' else 'linalg'} failed")
        assert "\n" not in r["skipped"]
        assert (r["device"], r["batch"]) == ("test device", 100)
    said = [line for line in capsys.readouterr().out.splitlines() if "skipped" in line]
    assert len(said) == 2, said  # once per peer and reason, not per point

    merged = bench.merge([], records)
    assert bench.timed(merged) == []
    for op in ("lu", "inv", "solve"):
        assert "| dtype | n |" in bench.table(merged, op, 3e12, None)
        lines = bench.not_run(merged, op).splitlines()
        assert [line.split()[2] for line in lines] == ["cusolverdx", "nvmath"]
        assert all("float32 n=33, float32 n=64" in line for line in lines)
    short = bench.summary(records, args.impls)
    assert "| cusolverdx ms | nvmath ms |" in short and "Not run:" in short


def test_a_skip_replaces_an_older_time_of_the_same_point(bench):
    old = [dict(op="lu", dtype="float32", n=33, batch=10, impl="nvmath", ms=1.0, gflops=2.0),
           dict(op="lu", dtype="float32", n=33, batch=10, impl="ours", ms=0.5, gflops=4.0)]
    new = [dict(op="lu", dtype="float32", n=33, batch=10, impl="nvmath", skipped="why")]
    merged = bench.merge(old, new)
    assert [(r["impl"], "ms" in r) for r in merged] == [("nvmath", False), ("ours", True)]


def test_the_budget_stops_new_points_and_keeps_them_out_of_the_json(bench, no_nvmath):
    args = bench.parse_args(["--impls", "nvmath", "--ops", "lu", "--dtypes", "float32", "--sizes", "33,64",
                             "--budget", "0"])
    records = bench.run(args)
    assert [r.get("budget") for r in records] == [True, True]
    assert all(r["skipped"] == "--budget 0 s spent" for r in records)


def test_precompile_is_a_no_op_without_cusolverdx_or_nvmath(bench, no_nvmath):
    peers = importlib.import_module("_nvmath_impls")
    for impls in ("ours,cublas", "cusolverdx"):  # not asked for; asked for but not importable
        args = bench.parse_args(["--impls", impls, "--ops", "lu", "--sizes", "33"])
        bench.precompile_registries(args)  # would need CuPy and a GPU if it went further
    assert peers._PLANS == {} and peers._CODE == {}


# ---- a wrong result is refused before it is timed ------------------------------------------------

def _fake_registry(bench, monkeypatch, runs):
    """Registries holding one implementation of ``inv`` per entry of ``runs`` (a function of the
    input and output arrays, NumPy on the host); time_case returns 1 ms and counts its calls."""
    case_type = importlib.import_module("_lu_impls").Case
    timed = []

    def factory(run):
        def make(dtype, n, batch):
            rng = np.random.default_rng(n)
            src = [rng.uniform(-1, 1, (batch, n, n)).astype(dtype) for _ in range(2)]
            a, out = np.empty_like(src[0]), np.empty_like(src[0])

            def prepare(k):
                a[...] = src[k % 2]

            inv_ratio = importlib.import_module("_harness").inv_ratio
            return case_type(prepare, lambda: run(a, out), check=lambda k: inv_ratio(src[k % 2], out),
                             outputs=(out,), note="fake setting")
        return make

    impls = {"inv": {name: factory(run) for name, run in runs.items()}}
    monkeypatch.setattr(bench, "load_registries", lambda: (impls, {"inv": lambda n, b, d: 1e6}, {}, []))
    monkeypatch.setattr(bench, "time_case", lambda case, reps: timed.append(case.note) or 1.0)
    return timed


def test_only_a_peer_with_a_right_result_is_timed(bench, monkeypatch):
    def right(a, out):
        out[...] = np.linalg.inv(a)

    def transposed(a, out):  # a plausible bug: the inverse of A^T
        out[...] = np.linalg.inv(np.swapaxes(a, -1, -2))

    def lazy(a, out):  # writes only the first half of the batch
        out[: len(a) // 2] = np.linalg.inv(a[: len(a) // 2])

    timed = _fake_registry(bench, monkeypatch, {"right": right, "transposed": transposed, "lazy": lazy})
    args = bench.parse_args(["--ops", "inv", "--impls", "right,transposed,lazy", "--dtypes", "float64",
                             "--sizes", "12", "--batch", "40"])
    records = {r["impl"]: r for r in bench.run(args)}
    assert timed == ["fake setting"]  # only `right` reached the timing
    assert records["right"]["ms"] == 1.0 and records["right"]["ratio"] < 30
    assert records["right"]["config"] == "fake setting"
    for name in ("transposed", "lazy"):
        assert "ms" not in records[name]
        assert records[name]["failed"].startswith("WrongResult: Expected LAPACK test ratios below 30"), name
    assert "Got nan" in records["lazy"]["failed"]  # the poisoned half was never written


def test_check_case_judges_pivots_out_of_range_as_a_wrong_result(bench):
    harness = importlib.import_module("_harness")
    case_type = importlib.import_module("_lu_impls").Case
    a = np.random.default_rng(0).uniform(-1, 1, (4, 6, 6))
    lu, piv = np.empty_like(a), np.empty((4, 6), np.int32)

    def run():  # right factors, pivots never written: they keep the poison
        import scipy.linalg

        for i in range(4):
            lu[i] = scipy.linalg.lu_factor(a[i])[0]

    case = case_type(lambda k: None, run, check=lambda k: harness.lu_ratio(a, lu, piv), outputs=(lu, piv))
    with pytest.raises(harness.WrongResult, match="Expected an output the LAPACK test ratios can judge"):
        harness.check_case(case)


# ---- cuSOLVERDx's shared-memory layout and its sweep ---------------------------------------------

@pytest.mark.parametrize("op,dtype,n,bpb,k", [
    ("lu", "float32", 190, 1, 0), ("solve", "float32", 190, 1, 16), ("inv", "float32", 190, 1, 64),
    ("lu", "float64", 128, 1, 0), ("inv", "float64", 128, 1, 64), ("inv", "float64", 64, 2, 64),
    ("solve", "complex128", 64, 2, 16), ("inv", "complex128", 33, 4, 33), ("lu", "complex64", 33, 5, 0),
])
def test_dx_layout_fits_the_matrices_aligned(bench, op, dtype, n, bpb, k):
    peers = importlib.import_module("_nvmath_impls")
    lay = peers.dx_layout(op, n, dtype, bpb, 0, H100_SMEM_OPTIN)
    item = np.dtype(dtype).itemsize
    assert (lay.bpb, lay.n, lay.k) == (bpb, n, k)
    assert lay.nbytes <= H100_SMEM_OPTIN
    assert (lay.b_off * item) % 16 == 0 and (lay.ipiv_off * 4) % 16 == 0
    assert lay.b_off >= bpb * n * n  # B after the matrices
    assert lay.ipiv_off * 4 >= (lay.b_off + bpb * n * k) * item  # pivots after B
    assert lay.nbytes == 4 * (lay.ipiv_off + bpb * (n + 1))  # pivots, then info


@pytest.mark.parametrize("op,dtype,n", [("lu", "float64", 190), ("lu", "complex128", 128),
                                        ("solve", "complex64", 190), ("inv", "complex128", 128),
                                        ("lu", "float32", 256)])
def test_dx_layout_is_none_where_one_matrix_does_not_fit(bench, op, dtype, n):
    peers = importlib.import_module("_nvmath_impls")
    assert peers.dx_layout(op, n, dtype, 1, 0, H100_SMEM_OPTIN) is None


def test_dx_sweeps_grow_from_the_suggested_setting(bench):
    peers = importlib.import_module("_nvmath_impls")
    suggested = peers.DxConfig()
    assert peers.dx_configs("lu", "suggested") == [suggested]
    assert [c.bpb for c in peers.dx_configs("solve", "bpb")] == ["suggested", 1, 2, 4, 8]
    full = peers.dx_configs("inv", "full")
    assert full[0] == suggested and len(full) == len(set(full)) == 11
    assert {c.arrangement for c in full} == {"row_major", "col_major"}
    assert {c.panel for c in full} == {0, 16, 32} and {c.panel for c in peers.dx_configs("lu", "full")} == {0}


# ---- on a GPU: every peer's check passes on a small batch ---------------------------------------

PEERS = ["ours", "cublas", "cusolverdx", "nvmath", "torch-default", "torch-magma", "jax", "cupy", "api",
         "cusolver"]


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["lu", "inv", "solve"])
@pytest.mark.parametrize("dtype", ["float32", "complex128"])
@pytest.mark.parametrize("impl", PEERS)
def test_each_peer_passes_its_check_on_a_small_batch(bench, op, dtype, impl, monkeypatch):
    """The peer adapters compute the right thing (so a check that refuses them is not a false
    alarm): n = 33, 67 matrices."""
    harness = importlib.import_module("_harness")
    monkeypatch.setitem(importlib.import_module("_nvmath_impls").SETTINGS, "sweep", "suggested")
    impls, _, _, variants = bench.load_registries()
    factory = impls[op].get(impl) or next((f for v in variants if (f := v(op, impl))), None)
    if factory is None:
        pytest.skip(f"{impl} has no {op}")
    try:
        case = factory(dtype, 33, 67)
    except (harness.PeerUnavailable, ImportError) as err:
        pytest.skip(f"{impl} cannot run here: {err}")
    ratio = harness.check_case(case)
    assert ratio is not None and ratio < 30


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["lu", "inv", "solve"])
@pytest.mark.parametrize("dtype", ["float64", "complex64"])
@pytest.mark.parametrize("setting", [dict(bpb=4), dict(arrangement="col_major", bpb=2), dict(panel=16),
                                     dict(block_dim=(128, 1, 1))], ids=str)
def test_cusolverdx_settings_pass_their_check(bench, op, dtype, setting):
    """cuSOLVERDx's kernel in the settings the sweep tries: 67 matrices, not a multiple of the
    batches per block (the last block's spare slots), the column-major arrangement (A^T), a
    narrower inverse panel."""
    harness = importlib.import_module("_harness")
    peers = importlib.import_module("_nvmath_impls")
    from batchlu.kernels import tuning

    try:
        peers._import("nvmath.device")
    except harness.PeerUnavailable as err:
        pytest.skip(str(err))
    limit = tuning.smem_optin()
    cfg = peers.DxConfig(**setting)
    if op == "solve" and dtype.startswith("complex") and cfg.arrangement == "col_major":
        # A^T X = B is real-only in cuSOLVERDx: the setting is refused with its reason, not compiled
        with pytest.raises(harness.PeerUnavailable, match="only for real types"):
            peers._dx_plan(op, dtype, 33, cfg, limit)
        return
    solver, lay = peers._dx_plan(op, dtype, 33, cfg, limit)
    bufs = peers._DxBuffers(op, dtype, 33, 67, cfg.arrangement == "row_major")
    case = peers._dx_case(op, 67, solver, lay, cfg.arrangement == "row_major", bufs, limit)
    assert harness.check_case(case) < 30
    if op != "inv":
        assert bool((bufs.info == 0).all())


def test_the_rows_latency_probe_finds_its_anchors(monkeypatch):
    """bench_rows_latency's phase split patches rows.cuh at named lines: every anchor is in today's
    rows.cuh (an edit that moves one must move STAMPS with it), each stamp lands once, rows.cuh is
    inlined and the counters are flushed."""
    monkeypatch.syspath_prepend(str(BENCH))
    probe = importlib.import_module("bench_rows_latency")
    for family, kernel in (("getrf", "getrf_rows"), ("gesv", "gesv_rows")):
        text = probe.probed_source(family)
        assert [text.count(f"BLU_STAMP({i})") for i in range(8)] == [1] * 8
        assert text.count("BLU_PROBE_DECL\n") == 1 and "atomicAdd(&blu_probe[q]" in text
        assert '#include "rows.cuh"' not in text and "rows_run" in text and f"{kernel}(" in text


def test_the_rows_latency_probe_names_a_missing_anchor(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    probe = importlib.import_module("bench_rows_latency")
    monkeypatch.setattr(probe, "STAMPS", probe.STAMPS + (("no such line in rows.cuh", 5, True),))
    with pytest.raises(SystemExit, match="no such line in rows.cuh"):
        probe.probed_source()


def test_the_rows_sweep_tries_the_next_occupancy_steps(monkeypatch):
    """Each lu shape is also compiled for the next two bounds that keep more blocks resident: one warp
    at 12 blocks (the float64 n = 33 tile: 144-146 registers) -> 16 (128) and 20 (102); a bound that
    keeps the occupancy (13) is not tried."""
    monkeypatch.syspath_prepend(str(BENCH))
    sweep = importlib.import_module("bench_rows_sweep")
    assert [sweep._resident(m, 32) for m in (12, 13, 16, 20)] == [12, 12, 16, 20]
    assert sweep.occupancy_minbs(12, 32) == [16, 20]
    assert sweep.occupancy_minbs(4, 512) == []  # 2048 threads an SM end it
    shapes = sweep.rows_shapes("lu", np.float64, 33)
    assert "rows-5x4x4m16" in shapes and "rows-5x4x4m20" in shapes and "rows-5x4x4m13" not in shapes


# ---- A/B sources --------------------------------------------------------------------------------

def test_the_old_source_inlines_its_headers_as_at_that_revision(monkeypatch):
    """bench_kernel_ab's old source at a git revision holds that revision's common.cuh and rows.cuh,
    each once (rows.cuh includes common.cuh), and no local include left for the working tree's to fill;
    an include of a header the revision lacks stays."""
    monkeypatch.syspath_prepend(str(BENCH))
    harness = importlib.import_module("_harness")
    text = harness.old_source("gesv", "HEAD")
    assert not harness._LOCAL_INCLUDE.search(text)
    assert text.count("// ---- common.cuh at HEAD") == 1 and text.count("// ---- rows.cuh at HEAD") == 1
    for name in ("common.cuh", "rows.cuh", "gesv.cu"):
        shown = harness._git_show("HEAD", f"kernels/cuda/{name}").stdout
        body = shown.split('#include "rows.cuh"')[-1] if name == "gesv.cu" else shown
        assert body.replace('#include "common.cuh"', "// common.cuh: inlined above") in text, name
    kept = '#include "no_such_header.cuh"'
    assert harness._inline_headers(kept, "HEAD", set()) == kept


def test_bench_kernel_ab_saves_the_old_source_without_a_gpu(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    out = tmp_path / "old" / "getrf.cu"
    done = subprocess.run([sys.executable, str(BENCH / "bench_kernel_ab.py"), "--family", "getrf", "--rev", "HEAD",
                           "--save", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == importlib.import_module("_harness").old_source("getrf", "HEAD")
    missing = subprocess.run([sys.executable, str(BENCH / "bench_kernel_ab.py"), "--family", "getrf", "--rev", "HEAD"],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "required: --op" in missing.stderr
