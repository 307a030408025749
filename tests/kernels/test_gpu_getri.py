"""The GPU inverse, solve and slogdet kernels (``kernels/_gpu/_getri.py``, ``_getrs.py``, ``_gesv.py``,
``_slogdet.py``, launched through ``batchlu.kernels.tuning``): LAPACK test ratios for
every dtype, size and path (inverse: the tiny kernel, fused Gauss-Jordan, getri static, merged and dynamic; solve: the
fused gesv_rows and getrf + getrs; slogdet: its errors against a float64 LU in units of n eps), info
and NaN semantics on bad matrices, every output element written, and agreement with the CPU backend.
Run on a machine with a CUDA GPU: ``BATCHLU_REQUIRE_GPU=1 pytest -m gpu tests/kernels/test_gpu_getri.py``."""

from __future__ import annotations

import numpy as np
import pytest

from batchlu import kernels
from batchlu.testing import matrices
from batchlu.testing.ratios import THRESHOLD, get02, get03, slogdet_ratios

pytestmark = pytest.mark.gpu

try:
    import cupy
except ImportError:  # the gpu marker skips these tests (fails them under BATCHLU_REQUIRE_GPU=1), saying why
    cupy = None

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
DOUBLE = (np.float64, np.complex128)
SIZES = [1, 2, 3, 7, 16, 31, 32, 33, 64, 100, 128, 190, 255, 256, 512, 1024]
POISONS = (7.25e30, -3.5e29)


def _count(n: int) -> int:
    """Matrices per case: many where they are cheap, a few at n >= 512 (the reference is slow)."""
    return 100 if n <= 64 else 24 if n <= 256 else 4 if n <= 512 else 2


def _paths(dtype, n: int) -> list[str]:
    from batchlu.kernels import tuning

    paths = ["getri-static", "getri-merged", "getri-dynamic"]
    if n <= 512:  # the sums on tensor cores; block rows twice the default height (getri_plan's choices)
        tall = f"nb{2 * tuning.default_nb(dtype)}"
        paths += ["getri-static-m0-mma", "getri-merged-m0-mma", "getri-static-m3-mma", "getri-merged-m2-mma",
                  "getri-dynamic-m0-mma", f"getri-static-m0-{tall}", f"getri-dynamic-m0-{tall}",
                  f"getri-merged-m2-mma-{tall}", f"getri-dynamic-m0-mma-{tall}",
                  f"getri-dynamic-m3-{tall}", f"getri-dynamic-m2-mma-{tall}"]
        mode, minb, mma, nb = tuning.getri_plan(dtype, n)  # the dispatched plan by name, too
        paths.append(f"getri-{mode}-m{minb}" + "-mma" * mma + f"-nb{nb}")
    if tuning.gje_tile(dtype, n) is not None:
        paths.insert(0, "fused")
    if n <= tuning.TINY_LIMIT:
        paths.insert(0, "tiny")
    return paths


def _launch_inv(a: np.ndarray, path: str, poison: int):
    """Inverse of host matrices ``a`` on the GPU by ``path``, outputs poisoned first; host results."""
    from batchlu.kernels import tuning
    from batchlu.kernels._gpu import _getrf

    d = cupy.asarray(a)
    out = cupy.full(a.shape, POISONS[poison], dtype=a.dtype)
    info = cupy.full(a.shape[:1], (-99, 777)[poison], dtype=np.int32)
    if path == "fused":
        tuning.launch_inv_gje(d, out, info)
    elif path == "tiny":
        tuning.launch_inv_tiny(d, out, info)
    else:
        lu, piv, info = _getrf.getrf(d)
        parts = path.split("-")  # getri-<mode>[-m<minb>[-mma][-nb<nb>]]
        minb = int(parts[2][1:]) if len(parts) > 2 else 0
        nb = int(parts[-1][2:]) if parts[-1].startswith("nb") else None
        tuning.launch_getri(lu, piv, info, out, mode=parts[1], minb=minb, mma="mma" in parts, nb=nb)
    assert d.get().tobytes() == a.tobytes(), "the kernel changed its input"
    return out.get(), info.get()


def _inv(a: np.ndarray, path: str):
    """Launched twice with different poisons: every element must be written (bitwise equal runs)."""
    first = _launch_inv(a, path, 0)
    second = _launch_inv(a, path, 1)
    for x, y, what in zip(first, second, ("inverse", "info")):
        assert (x.view(np.uint8) == y.view(np.uint8)).all(), f"{what}: elements left unwritten"
    return first


def _assert_ratios(ratio, what):
    assert np.isfinite(ratio).all(), f"{what}: non-finite ratios at {np.flatnonzero(~np.isfinite(ratio))}"
    assert ratio.max() < THRESHOLD, f"{what}: worst ratio {ratio.max():.3g} (>= {THRESHOLD})"


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_inverse_every_path(dtype, n):
    a = matrices.generate("random", n, dtype, seed=n, start=0, stop=_count(n))
    for path in _paths(dtype, n):
        ainv, info = _inv(a, path)
        assert ainv.dtype == a.dtype and ainv.shape == a.shape
        assert (info == 0).all(), f"{path}: info {info[info != 0]} on random matrices"
        _assert_ratios(get03(a, ainv), f"{path} n={n} {np.dtype(dtype)}")


@pytest.mark.parametrize("n", [34, 36, 37, 40, 41, 63])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_tiles_at_their_edges(dtype, n):
    """Each fused tile at the largest and smallest n of its GJE_TILES row (padded rows and columns)."""
    a = matrices.generate("random", n, dtype, seed=n, start=0, stop=_count(n))
    ainv, info = _inv(a, "fused")
    assert (info == 0).all()
    _assert_ratios(get03(a, ainv), f"fused n={n} {np.dtype(dtype)}")


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("dtype", DTYPES)
def test_tiny_inverse_every_n_and_a_partial_last_block(dtype, n):
    """inv_tiny: a thread per matrix, a block per tiny_mpb matrices; a batch that leaves the last block
    part full (a block's threads past the batch write nothing), at every n it takes, in every dtype,
    within LAPACK's ratio; the dispatch (kernels.inv) gives the planned kernel's results bit for bit."""
    from batchlu.kernels import tuning

    count = 3 * tuning.tiny_mpb(dtype, n) + 37
    a = matrices.generate("random", n, dtype, seed=100 + n, start=0, stop=count)
    ainv, info = _inv(a, "tiny")
    assert (info == 0).all()
    _assert_ratios(get03(a, ainv), f"tiny n={n} {np.dtype(dtype)}")
    expected_path = "tiny" if n <= tuning.TINY_MAX_N[np.dtype(dtype)] else "fused"
    assert tuning.inv_plan(dtype, n) == expected_path
    got, got_info = kernels.inv(cupy.asarray(a))   # the dispatch
    np.testing.assert_array_equal(got_info.get(), info)
    assert (got.get().view(np.uint8) == _inv(a, expected_path)[0].view(np.uint8)).all()


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 33, 64, 128, 190])
@pytest.mark.parametrize("dtype", DTYPES)
def test_inverse_bad_matrices(dtype, n):
    """singular-mix: info equals the CPU backend's; info != 0 gives all NaN, the rest pass get03."""
    a = matrices.generate("singular-mix", n, dtype, seed=1, start=0, stop=60)
    _, _, cpu_info = kernels.lu_factor(a)
    assert (cpu_info != 0).any() and (cpu_info == 0).any()
    for path in _paths(dtype, n):
        ainv, info = _inv(a, path)
        np.testing.assert_array_equal(info, cpu_info, err_msg=f"{path}: info differs from the CPU's")
        bad = info != 0
        assert np.isnan(ainv[bad]).all(), f"{path}: a bad matrix's inverse is not all NaN"
        assert np.isfinite(ainv[~bad]).all()
        _assert_ratios(get03(a[~bad], ainv[~bad]), f"{path} singular-mix n={n}")


@pytest.mark.parametrize("n", [16, 64, 128, 190])
@pytest.mark.parametrize("dtype", DTYPES)
def test_illconditioned(dtype, n):
    a = matrices.generate("illcond", n, dtype, seed=3, start=0, stop=12)
    for path in _paths(dtype, n):
        ainv, info = _inv(a, path)
        assert (info == 0).all()
        _assert_ratios(get03(a, ainv), f"{path} illcond n={n}")
    b = matrices.rhs(n, 16, dtype, seed=3, start=0, stop=12)
    for path in _solve_paths(dtype, n, 16):
        x, info = _solve_launch(a, b, 0, path)
        assert (info == 0).all()
        _assert_ratios(get02(a, x, b), f"{path} solve illcond n={n}")


def _solve_paths(dtype, n: int, k: int) -> list[str]:
    from batchlu.kernels import tuning

    rows = tuning.gesv_rows_tile(dtype, n, k) is not None
    return (["rows"] if rows else []) + ["getrs-warp", "getrs-block"]


def _solve_launch(a, b, poison, path="getrs", tile=None):
    from batchlu.kernels import tuning
    from batchlu.kernels._gpu import _getrf

    x = cupy.full(b.shape, POISONS[poison], dtype=a.dtype)
    if path == "rows":
        info = cupy.full(a.shape[:1], (-99, 777)[poison], dtype=np.int32)
        tuning.launch_gesv_rows(cupy.asarray(a), cupy.asarray(b), x, info, tile)
    else:
        lu, piv, info = _getrf.getrf(cupy.asarray(a))
        tuning.launch_getrs(lu, piv, cupy.asarray(b), x, info, kind=path.partition("-")[2] or None)
    return x.get(), info.get()


# 48 reaches the fused solve's two-warp tiles and 96 getrs_warp with two warps a matrix (float64 and
# complex types at k >= 16); k = 64 is the fused solve's largest dispatched right-hand-side count.
@pytest.mark.parametrize("n", sorted(SIZES + [48, 96]))
@pytest.mark.parametrize("dtype", DTYPES)
def test_solve(dtype, n):
    count = _count(n)
    a = matrices.generate("random", n, dtype, seed=n + 1, start=0, stop=count)
    for k in (1, 16, 40, 64):
        b = matrices.rhs(n, k, dtype, seed=k, start=0, stop=count)
        for path in _solve_paths(dtype, n, k):
            first, info = _solve_launch(a, b, 0, path)
            second, _ = _solve_launch(a, b, 1, path)
            assert (first.view(np.uint8) == second.view(np.uint8)).all(), f"{path}: x left unwritten"
            assert (info == 0).all()
            _assert_ratios(get02(a, first, b), f"{path} k={k} n={n}")
    # Vector right-hand sides through the public API, and lu_solve on GPU factors.
    b = matrices.rhs(n, None, dtype, seed=5, start=0, stop=count)
    x, info = kernels.solve(cupy.asarray(a), cupy.asarray(b))
    assert x.shape == b.shape and x.dtype == a.dtype
    _assert_ratios(get02(a, x.get(), b), f"solve vector n={n}")
    lu, piv, _ = kernels.lu_factor(cupy.asarray(a))
    x = kernels.lu_solve(lu, piv, cupy.asarray(b))
    _assert_ratios(get02(a, x.get(), b), f"lu_solve vector n={n}")


# gesv_rows on tiles outside its dispatch table too, each compiled for n = 33 and run from n = 1 to its
# edge: one-warp and multi-warp blocks (3 warps: 3 or 24 right-hand sides a pass, 32 or 4 lanes each),
# TJ = 2 .. 16, n padded to 4, at least 4 lanes a right-hand side (two passes of 8), k = 1 (32 lanes on
# it on one warp), 3, 16 and 40 (three passes).
@pytest.mark.parametrize("shape", [(1, 2), (2, 4), (5, 4), (4, 8), (2, 16), (5, 4, 4), (9, 8, 4),
                                   (9, 8, 4, 4)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gesv_rows_tiles(dtype, shape):
    from batchlu.kernels import tuning

    ti, tj, rr, cc, _ = tuning.gesv_rows_tile(dtype, 33, 1, shape)
    if rr * cc * np.dtype(dtype).itemsize // 4 > 200:
        pytest.skip("the data would not fit the registers")
    for n in (1, 5, 33, min(ti * rr, tj * cc)):
        a = matrices.generate("random", n, dtype, seed=n + 3, start=0, stop=40)
        for k in (1, 3, 16, 40):
            tile = tuning.gesv_rows_tile(dtype, 33, k, shape)
            b = matrices.rhs(n, k, dtype, seed=k, start=0, stop=40)
            first, info = _solve_launch(a, b, 0, "rows", tile)
            second, _ = _solve_launch(a, b, 1, "rows", tile)
            assert (first.view(np.uint8) == second.view(np.uint8)).all(), f"{tile}: x left unwritten"
            assert (info == 0).all()
            _assert_ratios(get02(a, first, b), f"rows {tile} k={k} n={n}")


@pytest.mark.parametrize("n", [5, 16, 33, 48, 64, 128])
@pytest.mark.parametrize("dtype", DTYPES)
def test_solve_tiny_pivot(dtype, n):
    """The first pivot nonzero but below sfmin (column 0 in the subnormal range, 2^(minexp - 12)),
    b = A x for a random x: every solve path backward stable, in every precision (the kernels keep
    single-precision subnormals: kernels/_gpu/_nvrtc.py, -ftz=false). In single precision the rounding
    error of x[0]'s numerator, divided by that pivot, can reach the largest float (eps / 2^-137 =
    2^113): such an x overflows, as LAPACK's would, and the public solve flags it -2."""
    a = matrices.subnormal_first_column(n, dtype, seed=n + 7, stop=40)
    wide = np.result_type(dtype, np.float64)
    b = (a.astype(wide) @ matrices.rhs(n, 16, dtype, seed=3, start=0, stop=40).astype(wide)).astype(dtype)
    for path in _solve_paths(dtype, n, 16):
        x, info = _solve_launch(a, b, 0, path)
        finite = np.isfinite(x).all(axis=(1, 2))
        assert (info == 0).all() and (finite.all() or dtype not in DOUBLE), path
        assert finite.sum() >= len(a) // 2, f"{path}: {len(a) - finite.sum()} of {len(a)} overflowed"
        _assert_ratios(get02(a[finite], x[finite], b[finite]), f"{path} tiny pivot n={n}")
    x, info = (v.get() for v in kernels.solve(cupy.asarray(a), cupy.asarray(b)))
    finite = np.isfinite(x).all(axis=(1, 2))
    np.testing.assert_array_equal(info, np.where(finite, 0, -2))
    _assert_ratios(get02(a[finite], x[finite], b[finite]), f"solve tiny pivot n={n}")


@pytest.mark.parametrize("n", [3, 33, 64, 128])
@pytest.mark.parametrize("dtype", DTYPES)
def test_solve_bad_matrices(dtype, n):
    a = matrices.generate("singular-mix", n, dtype, seed=2, start=0, stop=60)
    b = matrices.rhs(n, 16, dtype, seed=2, start=0, stop=60)
    x_cpu, info_cpu = kernels.solve(a, b)
    bad = info_cpu != 0
    assert np.isnan(x_cpu[bad]).all()
    _assert_ratios(get02(a[~bad], x_cpu[~bad], b[~bad]), "CPU solve singular-mix")
    for path in _solve_paths(dtype, n, 16):
        x, info = _solve_launch(a, b, 0, path)
        np.testing.assert_array_equal(info, info_cpu, err_msg=f"{path}: info differs from the CPU's")
        assert np.isnan(x[bad]).all()
        _assert_ratios(get02(a[~bad], x[~bad], b[~bad]), f"GPU {path} solve singular-mix")


def _launch_slogdet(a: np.ndarray, poison: int):
    """slogdet of host matrices ``a`` on the GPU: getrf, then the slogdet kernel into ``sign`` and
    ``logabsdet`` poisoned first; host results."""
    from batchlu.kernels import tuning
    from batchlu.kernels._gpu import _getrf

    d = cupy.asarray(a)
    lu, piv, info = _getrf.getrf(d)
    sign = cupy.full(a.shape[:1], POISONS[poison], dtype=a.dtype)
    logabsdet = cupy.full(a.shape[:1], POISONS[poison], dtype=np.finfo(a.dtype).dtype)
    tuning.launch_slogdet(lu, piv, info, sign, logabsdet)
    assert d.get().tobytes() == a.tobytes(), "the kernel changed its input"
    return sign.get(), logabsdet.get(), info.get()


def _slogdet(a: np.ndarray):
    """Launched twice with different poisons: every element must be written (bitwise equal runs); the
    public ``kernels.slogdet`` on CuPy gives the same bits."""
    first = _launch_slogdet(a, 0)
    second = _launch_slogdet(a, 1)
    public = [x.get() for x in kernels.slogdet(cupy.asarray(a))]
    for x, y, z, what in zip(first, second, public, ("sign", "logabsdet", "info")):
        assert (x.view(np.uint8) == y.view(np.uint8)).all(), f"{what}: elements left unwritten"
        assert x.dtype == z.dtype and (x.view(np.uint8) == z.view(np.uint8)).all(), f"{what}: kernels.slogdet differs"
    sign, logabsdet, info = first
    assert sign.dtype == a.dtype and logabsdet.dtype == np.finfo(a.dtype).dtype and info.dtype == np.int32
    assert sign.shape == logabsdet.shape == info.shape == a.shape[:1]
    return first


def _assert_slogdet(a, sign, logabsdet, what):
    """Against a float64/complex128 LU in units of n eps (slogdet_ratios): logabsdet, sign, |sign| = 1."""
    for name, ratio in slogdet_ratios(a, sign, logabsdet)._asdict().items():
        _assert_ratios(ratio, f"{what}: {name}")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_slogdet_random(dtype, n):
    a = matrices.generate("random", n, dtype, seed=7, start=0, stop=_count(n))
    sign, logabsdet, info = _slogdet(a)
    assert (info == 0).all()
    _assert_slogdet(a, sign, logabsdet, f"slogdet random n={n}")


@pytest.mark.parametrize("n", [8, 33, 128, 256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_slogdet_illcond(dtype, n):
    """Near-singular (cond 1e12, 1e5 in single precision): the condition enters the bound here."""
    a = matrices.generate("illcond", n, dtype, seed=8, start=0, stop=min(_count(n), 24))
    sign, logabsdet, info = _slogdet(a)
    assert (info == 0).all()
    _assert_slogdet(a, sign, logabsdet, f"slogdet illcond n={n}")


@pytest.mark.parametrize("n", [3, 33, 128])
@pytest.mark.parametrize("dtype", DTYPES)
def test_slogdet_bad_matrices(dtype, n):
    a = matrices.generate("singular-mix", n, dtype, seed=4, start=0, stop=60)
    sign, logabsdet, info = _slogdet(a)
    np.testing.assert_array_equal(info, kernels.slogdet(a)[2], err_msg="info differs from the CPU's")
    neg, sing, ok = info < 0, info > 0, info == 0
    assert neg.any() and sing.any() and ok.sum() > 30
    assert np.isnan(sign[neg]).all() and np.isnan(logabsdet[neg]).all()
    assert (sign[sing] == 0).all() and (logabsdet[sing] == -np.inf).all()
    _assert_slogdet(a[ok], sign[ok], logabsdet[ok], f"slogdet singular-mix n={n}")


@pytest.mark.parametrize("n", [1, 7, 33, 64, 128, 190, 256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_and_cpu_backends_agree(dtype, n):
    a = matrices.generate("random", n, dtype, seed=9, start=0, stop=min(_count(n), 30))
    a4 = a.reshape((-1, 3) + a.shape[1:]) if len(a) % 3 == 0 else a
    g, gi = kernels.inv(cupy.asarray(a4))
    c, ci = kernels.inv(a4)
    np.testing.assert_array_equal(gi.get(), ci)
    assert g.shape == a4.shape
    _assert_ratios(get03(a4, g.get()), "GPU inv")
    _assert_ratios(get03(a4, c), "CPU inv")


def test_mma_where_it_cannot_run_is_refused():
    from batchlu.kernels import tuning
    from batchlu.kernels._gpu import _getrf

    for dtype, n, mode in ((np.float32, 600, "dynamic"), (np.complex128, 600, "static")):
        a = cupy.asarray(matrices.generate("random", n, dtype, seed=2, start=0, stop=2))
        lu, piv, info = _getrf.getrf(a)
        with pytest.raises(ValueError, match="mma"):
            tuning.launch_getri(lu, piv, info, cupy.empty_like(lu), mode=mode, mma=True)


def test_bad_block_row_height_is_refused():
    from batchlu.kernels import tuning
    from batchlu.kernels._gpu import _getrf

    a = cupy.asarray(matrices.generate("random", 40, np.float64, seed=2, start=0, stop=2))
    lu, piv, info = _getrf.getrf(a)
    with pytest.raises(ValueError, match="block-row height nb"):
        tuning.launch_getri(lu, piv, info, cupy.empty_like(lu), mode="static", nb=12)
    a = cupy.asarray(matrices.generate("random", 1024, np.complex128, seed=2, start=0, stop=1))
    lu, piv, info = _getrf.getrf(a)
    with pytest.raises(ValueError, match="fit in shared memory: n = 1024 with nb = 32"):
        tuning.launch_getri(lu, piv, info, cupy.empty_like(lu), mode="static", nb=32)


def test_too_large_is_refused():
    from batchlu.kernels._gpu import _getrs

    a = cupy.zeros((1, 1025, 1025), np.float64)
    with pytest.raises(ValueError, match="Expected n <= 1024"):
        _getrs.solve(a, cupy.zeros((1, 1025, 1), np.float64))
