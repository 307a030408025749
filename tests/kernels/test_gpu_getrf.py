"""The GPU getrf kernels (``kernels/_gpu/_getrf.py``, launched through ``batchlu.kernels.tuning``):
LAPACK accuracy for every dtype and every path, pivots identical to LAPACK's, info semantics, every
output element written, and agreement with the CPU backend. Run on a machine with a CUDA GPU:
``BATCHLU_REQUIRE_GPU=1 pytest -m gpu tests/kernels/test_gpu_getrf.py``."""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest
import scipy.linalg

from batchlu import kernels
from batchlu.testing import matrices
from batchlu.testing.ratios import THRESHOLD, get01, get02, get03

pytestmark = pytest.mark.gpu

try:
    import cupy
except ImportError:  # the gpu marker skips these tests (fails them under BATCHLU_REQUIRE_GPU=1), saying why
    cupy = None

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
SIZES = [1, 2, 3, 7, 16, 31, 32, 33, 64, 100, 128, 190, 255, 256, 512, 1024]
DOUBLE = (np.float64, np.complex128)


def _count(n: int) -> int:
    """Matrices per case: many where they are cheap, a few at n >= 512 (the CPU reference is slow)."""
    return 300 if n <= 64 else 40 if n <= 256 else 6 if n <= 512 else 3


def _gpu_launch(a: np.ndarray, plan=None, poison: int = 0):
    """Run the GPU kernel on ``a`` with outputs pre-filled with one of two poisons; return host arrays."""
    from batchlu.kernels import tuning

    d = cupy.asarray(a)
    fill = (7.25e30, -3.5e29)[poison]
    lu = cupy.full(a.shape, fill, dtype=a.dtype)
    piv = cupy.full(a.shape[:-1], (-7, 123456)[poison], dtype=np.int32)
    info = cupy.full(a.shape[:1], (-99, 777)[poison], dtype=np.int32)
    tuning.launch_getrf(d, lu, piv, info, plan)
    assert d.get().tobytes() == a.tobytes(), "the kernel changed its input"
    return lu.get(), piv.get(), info.get()


def _factor(a: np.ndarray, plan=None):
    """GPU factorization, launched twice with different poisons: every output element must be written
    (the two runs agree bit for bit, whatever the poison was)."""
    first = _gpu_launch(a, plan, 0)
    second = _gpu_launch(a, plan, 1)
    for x, y, what in zip(first, second, ("lu", "piv", "info")):
        same = (x.view(np.uint8) == y.view(np.uint8)).all()
        assert same, f"{what}: some elements are not written by the kernel (they keep the poison)"
    return first


def _scipy(a: np.ndarray):
    lus, pivs = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m in a:
            lu, piv = scipy.linalg.lu_factor(m, check_finite=False)
            lus.append(lu)
            pivs.append(piv)
    return np.array(lus), np.array(pivs, dtype=np.int32)


def _check_pivots(a, piv, dtype, reference=_scipy):
    """Pivots equal LAPACK's (``reference(a)``: lu and piv). In float32/complex64 a near tie between
    the two largest candidates can be decided either way by rounding (LAPACK orders its operations
    differently): there a matrix may differ, but only at a step where LAPACK's own two largest
    candidates are a near tie: within 0.1%, or within the rounding error of the Schur complement,
    4 n eps max|a| (cancellation in ill-conditioned matrices makes the candidates small while their
    absolute error stays that size)."""
    ref_lu, ref = reference(a)
    differ = np.flatnonzero((piv != ref).any(axis=1))
    if dtype in DOUBLE:
        assert not differ.size, f"pivots differ from LAPACK's on {differ.size} of {len(a)} matrices"
    for m in differ:
        k = int(np.flatnonzero(piv[m] != ref[m])[0])
        # LAPACK's step k: its candidates are the rows >= k of the Schur complement, whose column k
        # is U[k, k] for the pivot and L[i, k] * U[k, k] below it (rows in LAPACK's final order).
        lu = ref_lu[m].astype(np.complex128)
        col = lu[k:, k] * lu[k, k]
        col[0] = lu[k, k]
        mag = np.sort(np.abs(col.real) + np.abs(col.imag))[::-1]
        slack = max(1e-3 * mag[0], 4 * a.shape[-1] * np.finfo(dtype).eps * np.abs(a[m]).max())
        assert mag.size > 1 and mag[0] - mag[1] <= slack, (
            f"matrix {m}: pivot {k} is {piv[m, k]}, LAPACK's {ref[m, k]}, and LAPACK's two largest "
            f"candidates {mag[:2]} are not a near tie")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_random_accuracy_and_pivots(dtype, n):
    count = _count(n)
    a = matrices.generate("random", n, dtype, seed=3, start=0, stop=count)
    lu, piv, info = _factor(a)
    assert lu.dtype == dtype and lu.shape == a.shape
    assert piv.dtype == np.int32 and piv.shape == (count, n)
    assert info.dtype == np.int32 and info.shape == (count,)
    assert (info == 0).all()
    ratio = get01(a, lu, piv)
    assert ratio.max() < THRESHOLD, f"get01 max {ratio.max():.3g}"
    _check_pivots(a, piv, dtype)


@pytest.mark.parametrize("n", [1, 2, 5, 16, 32, 33, 64, 100])
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_path(dtype, n):
    """The small kernel and the blocked kernel with each NB give LAPACK accuracy at sizes they share."""
    from batchlu.kernels import tuning

    a = matrices.generate("random", n, dtype, seed=5, start=0, stop=97)
    plans = [tuning.Plan(kind, nb) for nb in tuning.BLOCKED_NB[np.dtype(dtype).itemsize]
             for kind in ("blocked", "blocked_smem")]
    if n <= 32:
        plans += [tuning.Plan("small", p) for p in tuning.SMALL_NP if p >= n]
    if n <= 8:
        plans.append(tuning.Plan("tiny", n))
    for plan in plans:
        lu, piv, info = _factor(a, plan)
        assert (info == 0).all(), plan
        ratio = get01(a, lu, piv)
        assert ratio.max() < THRESHOLD, f"{plan}: get01 max {ratio.max():.3g}"
        _check_pivots(a, piv, dtype)


def _check_with_bad_matrices(a, plan, dtype):
    """Factor ``a`` (matrix 3 with a zero first column, matrix 5 with a NaN or Inf) with ``plan``: info 1
    and -1 there, 0 elsewhere; matrix 5 all NaN with identity pivots; the rest pass get01 with LAPACK's
    pivots. Returns the pivots."""
    lu, piv, info = _factor(a, plan)
    good = [m for m in range(len(a)) if m not in (3, 5)]
    assert (info[good] == 0).all() and info[3] == 1 and info[5] == -1, (plan, info)
    assert np.isnan(lu[5]).all() and (piv[5] == np.arange(a.shape[-1])).all(), plan
    ratio = get01(a[good], lu[good], piv[good])
    assert ratio.max() < THRESHOLD, f"{plan}: get01 max {ratio.max():.3g}"
    _check_pivots(a[good], piv[good], dtype)
    return piv


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("dtype", DTYPES)
def test_tiny_every_n_bad_matrices_a_partial_last_block_and_in_place(dtype, n):
    """getrf_tiny (one thread per matrix; a block per tiny_mpb matrices) at every n it takes, in every
    dtype: a batch whose last block is part full, with a zero first column (info 1) and a NaN or Inf
    (info -1, all NaN, identity pivots) among random matrices, LAPACK's accuracy and pivots; in place
    (lu is the input) the same bits; the dispatch (kernels.lu_factor) gives the planned kernel's bits."""
    from batchlu.kernels import tuning

    count = 2 * tuning.tiny_mpb(dtype, n) + 29
    a = matrices.generate("random", n, dtype, seed=40 + n, start=0, stop=count)
    a[3, :, 0] = 0
    a[5, n // 2, n - 1] = np.nan if n % 2 else np.inf
    plan = tuning.Plan("tiny", n)
    lu, piv, info = _factor(a, plan)
    good = [m for m in range(count) if m not in (3, 5)]
    assert (info[good] == 0).all() and info[3] == 1 and info[5] == -1, info
    assert np.isnan(lu[5]).all() and (piv[5] == np.arange(n)).all()
    assert get01(a[good], lu[good], piv[good]).max() < THRESHOLD
    _check_pivots(a[good], piv[good], dtype)
    d = cupy.asarray(a)
    piv2 = cupy.empty((count, n), np.int32)
    info2 = cupy.empty((count,), np.int32)
    tuning.launch_getrf(d, d, piv2, info2, plan)
    assert (d.get().view(np.uint8) == lu.view(np.uint8)).all() and (piv2.get() == piv).all()
    planned = tuning.getrf_plan(dtype, n)
    lu3, piv3, info3 = kernels.lu_factor(cupy.asarray(a))
    ref = lu if planned.kind == "tiny" else _factor(a, planned)[0]
    assert (lu3.get().view(np.uint8) == ref.view(np.uint8)).all()
    np.testing.assert_array_equal(info3.get(), info)


@pytest.mark.parametrize("n", [5, 100, 190, 300])
@pytest.mark.parametrize("dtype", DTYPES)
def test_blocked_min_blocks(dtype, n):
    """The blocked kernels compiled with a blocks-per-SM bound (fewer registers, spills allowed) give
    the same LAPACK accuracy and pivots; exact zero pivots and NaN still give info k and -1."""
    from batchlu.kernels import tuning

    a = matrices.generate("random", n, dtype, seed=11, start=0, stop=40)
    a[3, :, 0] = 0  # a zero first column: info 1
    a[5, n // 2, n // 3] = np.nan
    for plan in [tuning.Plan(kind, nb, minb) for kind in ("blocked", "blocked_smem")
                 for nb in tuning.BLOCKED_NB[np.dtype(dtype).itemsize][:2] for minb in (2, 3)]:
        piv = _check_with_bad_matrices(a, plan, dtype)
        ref_lu, ref_piv = _scipy(a[3:4])
        assert (piv[3] == ref_piv[0]).all(), plan


@pytest.mark.parametrize("n", [5, 40, 100, 190, 300, 600])
@pytest.mark.parametrize("dtype", DTYPES)
def test_blocked_narrow_l_blocks(dtype, n):
    """Blocks of L narrower than the panel (kb < NB, the left-looking steps KB columns at a time): the
    same accuracy, pivots and info, at sizes below, across and above a panel, and past the block size
    (n = 600 > 512 threads: rows looped over)."""
    from batchlu.kernels import tuning

    item = np.dtype(dtype).itemsize
    nbs = tuning.BLOCKED_NB[item]
    a = matrices.generate("random", n, dtype, seed=13, start=0, stop=24)
    a[3, :, 0] = 0  # a zero first column: info 1
    a[5, n // 2, n // 3] = np.inf
    plans = [tuning.Plan(kind, nb, minb, kb) for kind in ("blocked", "blocked_smem") for nb in nbs
             for kb in nbs if kb < nb for minb in (0, 2)]
    for plan in plans:
        if tuning.blocked_smem(dtype, n, plan.tile, kb=plan.kb) > tuning.smem_optin():
            continue
        _check_with_bad_matrices(a, plan, dtype)


def test_blocked_rejects_bad_l_block():
    from batchlu.kernels import tuning

    a = cupy.asarray(matrices.generate("random", 40, np.float64, seed=1, start=0, stop=2))
    out = (cupy.empty_like(a), cupy.empty((2, 40), np.int32), cupy.empty((2,), np.int32))
    with pytest.raises(ValueError, match="kb"):
        tuning.launch_getrf(a, *out, tuning.Plan("blocked", 16, 0, 6))


# (dtype, n, RR, TJ): the register-resident kernel's tiles that the dispatch or the benchmark uses,
# at sizes that exercise padding (n below the tile) and exact fits.
ROWS_CASES = [
    (np.float32, 21, 1, 1), (np.float32, 33, 2, 1), (np.float32, 33, 1, 1), (np.float32, 64, 1, 1),
    (np.float32, 64, 2, 1), (np.float32, 100, 1, 2), (np.float32, 128, 2, 2), (np.float32, 190, 2, 4),
    (np.float64, 21, 1, 1), (np.float64, 33, 1, 1), (np.float64, 33, 2, 1), (np.float64, 64, 1, 2),
    (np.float64, 96, 1, 2), (np.float64, 128, 1, 4),
    (np.complex64, 31, 1, 1), (np.complex64, 64, 1, 2), (np.complex64, 128, 1, 4),
    (np.complex128, 33, 1, 4), (np.complex128, 64, 1, 4), (np.complex128, 96, 1, 4),
    # the tiles of the measured dispatch (2-D: TJ = 4 or 8 threads per row, 2-4 rows per thread)
    (np.float32, 64, 2, 4), (np.float64, 16, 1, 2), (np.float64, 48, 2, 4), (np.float64, 64, 4, 8),
    (np.complex64, 24, 1, 2), (np.complex64, 64, 4, 8), (np.complex128, 33, 2, 4),
    (np.complex128, 48, 4, 8),
    # run 6's dispatch: one-warp tiles (5-6 rows per thread, no block barrier), two-warp tiles, 8x8 at
    # float32 n = 96; sizes below the tile too (n = 27 pads to 32, 41 to 48, 57 to 64, 90 to 96)
    (np.float32, 16, 1, 2), (np.float32, 33, 5, 4), (np.float32, 27, 5, 4), (np.float32, 48, 6, 4),
    (np.float32, 41, 6, 4), (np.float32, 64, 4, 4), (np.float32, 57, 4, 4), (np.float32, 96, 8, 8),
    (np.float32, 90, 8, 8), (np.float64, 33, 5, 4), (np.float64, 27, 5, 4), (np.float64, 48, 6, 4),
    (np.float64, 41, 6, 4), (np.float64, 64, 2, 4),
    (np.complex64, 33, 5, 4), (np.complex64, 48, 3, 4), (np.complex128, 24, 1, 2),
    (np.complex128, 33, 3, 4), (np.complex128, 41, 3, 4),
]
# n padded to 4 rather than 8 (the dispatch at n = 25-33), at the top of that range and below it
STEP_CASES = [
    (np.float32, 33, 5, 4, 4), (np.float32, 29, 5, 4, 4), (np.float64, 33, 5, 4, 4),
    (np.complex64, 33, 5, 4, 4), (np.complex64, 26, 5, 4, 4), (np.complex128, 33, 9, 8, 4),
    (np.complex128, 25, 9, 8, 4), (np.complex128, 33, 5, 8, 1),
]


@pytest.mark.parametrize("dtype, n, rr, tj, step", [case + (0,) for case in ROWS_CASES] + STEP_CASES)
def test_rows_tiles(dtype, n, rr, tj, step):
    """getrf_rows with each tile: LAPACK accuracy and pivots on random and ill-conditioned input, a
    zero column (info, no swap there, the factorization completed) and one NaN (info = -1)."""
    from batchlu.kernels import tuning

    plan = tuning.rows_plan(n, rr, tj, step)
    a = matrices.generate("random", n, dtype, seed=n + rr, start=0, stop=64)
    a[32:48] = matrices.generate("illcond", n, dtype, seed=n, start=0, stop=16)
    a[48:56, :, n // 3] = 0
    a[56, n - 1, n // 2] = np.nan
    lu, piv, info = _factor(a, plan)
    cpu_lu, cpu_piv, cpu_info = kernels.lu_factor(a)
    np.testing.assert_array_equal(info, cpu_info)
    assert (info[:48] == 0).all() and (info[48:56] == n // 3 + 1).all() and info[56] == -1
    assert np.isnan(lu[56]).all() and (piv[56] == np.arange(n)).all()
    good = np.ones(len(a), bool)
    good[56] = False
    assert get01(a[good], lu[good], piv[good]).max() < THRESHOLD
    _check_pivots(a[good], piv[good], dtype)


@pytest.mark.parametrize("n", [13, 24, 33, 47, 64, 96])
@pytest.mark.parametrize("dtype", DTYPES)
def test_exact_ties(dtype, n):
    """Ties in the pivot search go to the smallest CURRENT position, as in LAPACK. Column 0 is +-1
    except +-2 at row r (the first pivot: swapped with position 0, so row 0 now sits at position r);
    row r is 0 in column 1, which step 0 then leaves unchanged, and every other row's column-1 entry
    has cabs1 = 1 (complex: +-1, +-i, +-0.5 +- 0.5i). Step 1 must pick position 1, not the smallest
    row index. Both steps are exact arithmetic, so pivots 0 and 1 equal LAPACK's in every dtype."""
    count = 64
    rng = np.random.default_rng(n)
    a = matrices.generate("random", n, dtype, seed=n, start=0, stop=count)
    first = rng.integers(1, n, size=count)
    sign = lambda size: rng.choice([-1.0, 1.0], size=size)
    a[:, :, 0] = sign((count, n))
    a[np.arange(count), first, 0] = 2 * sign(count)
    if np.dtype(dtype).kind == "c":
        ties = np.array([1, -1, 1j, -1j, 0.5 + 0.5j, 0.5 - 0.5j, -0.5 + 0.5j, -0.5 - 0.5j])
        a[:, :, 1] = rng.choice(ties, size=(count, n))
    else:
        a[:, :, 1] = sign((count, n))
    a[np.arange(count), first, 1] = 0
    lu, piv, info = _factor(a)
    _, ref = _scipy(a)
    assert (info == 0).all()
    np.testing.assert_array_equal(piv[:, :2], ref[:, :2])
    assert (piv[:, 0] == first).all() and (piv[:, 1] == 1).all()
    assert get01(a, lu, piv).max() < THRESHOLD
    _check_pivots(a, piv, dtype)


# A register-resident tile per dtype at n = 64 (from ROWS_CASES) for the in-place factorization.
IN_PLACE_TILES = {np.float32: (1, 1), np.float64: (1, 1), np.complex64: (1, 2), np.complex128: (1, 4)}


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_in_place(dtype):
    """lu may be the input array itself: what getrf_rows writes over the input passes get01 against
    the matrices in float64/complex128, with LAPACK's pivots; piv and info, poisoned first (two runs,
    two poisons), are written everywhere; and the result is the out-of-place one, bit for bit."""
    from batchlu.kernels import tuning

    n, count = 64, 50
    plan = tuning.rows_plan(n, *IN_PLACE_TILES[dtype])
    a = matrices.generate("random", n, dtype, seed=4, start=0, stop=count)
    runs = []
    for poison in (0, 1):
        d = cupy.asarray(a)
        piv = cupy.full((count, n), (-7, 123456)[poison], dtype=np.int32)
        info = cupy.full((count,), (-99, 777)[poison], dtype=np.int32)
        tuning.launch_getrf(d, d, piv, info, plan)
        runs.append((d.get(), piv.get(), info.get()))
    for x, y, what in zip(runs[0], runs[1], ("lu", "piv", "info")):
        assert (x.view(np.uint8) == y.view(np.uint8)).all(), f"{what}: some elements keep the poison"
    lu, piv, info = runs[0]
    assert lu.dtype == dtype and lu.shape == a.shape and piv.shape == (count, n) and info.shape == (count,)
    assert (info == 0).all()
    assert get01(a, lu, piv).max() < THRESHOLD  # an element left as the input's would fail it
    _check_pivots(a, piv, dtype)
    out_lu, out_piv, out_info = _factor(a, plan)
    assert lu.tobytes() == out_lu.tobytes() and piv.tobytes() == out_piv.tobytes()
    assert info.tobytes() == out_info.tobytes()


@pytest.mark.parametrize("batch", [1, 5, 33, 1000])
@pytest.mark.parametrize("n", [3, 31, 40])
def test_batch_sizes(batch, n):
    a = matrices.generate("random", n, np.float64, seed=batch, start=0, stop=batch)
    lu, piv, info = _factor(a)
    assert (info == 0).all()
    assert get01(a, lu, piv).max() < THRESHOLD
    _check_pivots(a[:50], piv[:50], np.float64)


@pytest.mark.parametrize("n", [1, 2, 7, 32, 33, 64, 128, 190])
@pytest.mark.parametrize("dtype", DTYPES)
def test_singular_zero_nan_inf(dtype, n):
    """singular-mix: info exactly as the CPU backend gives it; NaN/Inf matrices all NaN with identity
    piv; singular ones completed (get01 still holds) with LAPACK's pivots."""
    count = 80
    a = matrices.generate("singular-mix", n, dtype, seed=n, start=0, stop=count)
    masks = matrices.singular_mix_masks(0, count)
    lu, piv, info = _factor(a)
    cpu_lu, cpu_piv, cpu_info = kernels.lu_factor(a)
    np.testing.assert_array_equal(info, cpu_info)
    bad = masks["nan"] | masks["inf"]
    assert (info[bad] == -1).all()
    assert np.isnan(lu[bad]).all()
    assert (piv[bad] == np.arange(n)).all()
    assert (info[masks["zero"]] == 1).all()
    assert (lu[masks["zero"]] == 0).all() and (piv[masks["zero"]] == np.arange(n)).all()
    if n > 1:
        assert (info[masks["singular"]] > 0).all()
    good = ~bad
    assert get01(a[good], lu[good], piv[good]).max() < THRESHOLD
    if dtype in DOUBLE:
        np.testing.assert_array_equal(piv[good], cpu_piv[good])


@pytest.mark.parametrize("n", [4, 33, 100])
@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_pivot_mid_factorization(dtype, n):
    """A zero column in the middle: info = its index + 1 (the FIRST zero pivot), no swap there, and
    the factorization goes on to the end (get01 holds, later columns are pivoted as LAPACK does)."""
    count = 20
    a = matrices.generate("random", n, dtype, seed=11, start=0, stop=count)
    k = n // 2
    a[:, :, k] = 0
    a[:, :, n - 1] = 0
    lu, piv, info = _factor(a)
    cpu_lu, cpu_piv, cpu_info = kernels.lu_factor(a)
    np.testing.assert_array_equal(info, cpu_info)
    assert (info == k + 1).all()
    assert (piv[:, k] == k).all()
    assert get01(a, lu, piv).max() < THRESHOLD
    if dtype in DOUBLE:
        np.testing.assert_array_equal(piv, cpu_piv)


@pytest.mark.parametrize("n", [16, 33, 64, 128, 190])
@pytest.mark.parametrize("dtype", DTYPES)
def test_illcond(dtype, n):
    a = matrices.generate("illcond", n, dtype, seed=1, start=0, stop=30)
    lu, piv, info = _factor(a)
    assert (info == 0).all()
    assert get01(a, lu, piv).max() < THRESHOLD
    _check_pivots(a, piv, dtype)


def _cpu_backend(a: np.ndarray):
    """lu and piv of the CPU backend, which factors a matrix with a subnormal pivot with its own LU
    (LAPACK's algorithm, dividing by a pivot below sfmin): the reference where SciPy's OpenBLAS
    getrf, which loses subnormal intermediates, picks other pivots."""
    lu, piv, _ = kernels.lu_factor(a)
    return lu, piv


# Every precision: the kernels keep single-precision subnormals (kernels/_gpu/_nvrtc.py compiles with
# -ftz=false; CuPy's own compile, used before, flushed them and made such a pivot an exact zero).
@pytest.mark.parametrize("n", [5, 16, 24, 33, 48, 64, 100, 190])
@pytest.mark.parametrize("dtype", DTYPES)
def test_tiny_pivot(dtype, n):
    a = matrices.subnormal_first_column(n, dtype, seed=n, stop=30)
    lu, piv, info = _factor(a)
    assert (info == 0).all()
    assert np.isfinite(lu).all()
    assert get01(a, lu, piv).max() < THRESHOLD
    _check_pivots(a, piv, dtype, reference=_cpu_backend)


@pytest.mark.parametrize("n", [7, 33, 128, 190])
@pytest.mark.parametrize("dtype", DTYPES)
def test_badly_scaled(dtype, n):
    """Rows scaled by 10^+-150 (double) or 10^+-15 (single): no overflow in pivoting or scaling."""
    rng = np.random.default_rng(n)
    big = 150 if dtype in DOUBLE else 15
    a = matrices.generate("random", n, dtype, seed=2, start=0, stop=30)
    scale = 10.0 ** rng.integers(-big, big + 1, size=(30, n, 1))
    a = (a * scale).astype(dtype)
    lu, piv, info = _factor(a)
    assert (info == 0).all()
    assert np.isfinite(lu).all()
    assert get01(a, lu, piv).max() < THRESHOLD


@pytest.mark.parametrize("n", [2, 16, 33, 100, 190])
@pytest.mark.parametrize("dtype", DTYPES)
def test_public_api_agrees_with_cpu(dtype, n):
    """kernels.lu_factor on CuPy vs NumPy input: same pivots and info, both within the LAPACK bound;
    leading batch axes and F-order input are handled by the API."""
    a = matrices.generate("random", n, dtype, seed=9, start=0, stop=24).reshape(2, 3, 4, n, n)
    lu_g, piv_g, info_g = (x.get() for x in kernels.lu_factor(cupy.asarray(a)))
    lu_c, piv_c, info_c = kernels.lu_factor(a)
    assert lu_g.shape == a.shape and piv_g.shape == a.shape[:-1] and info_g.shape == a.shape[:-2]
    np.testing.assert_array_equal(info_g, info_c)
    flat = a.reshape(-1, n, n)
    g01 = get01(flat, lu_g.reshape(flat.shape), piv_g.reshape(-1, n))
    c01 = get01(flat, lu_c.reshape(flat.shape), piv_c.reshape(-1, n))
    assert g01.max() < THRESHOLD and c01.max() < THRESHOLD
    if dtype in DOUBLE:
        np.testing.assert_array_equal(piv_g, piv_c)
    fortran = cupy.asfortranarray(cupy.asarray(a))
    lu_f, piv_f, _ = kernels.lu_factor(fortran)
    np.testing.assert_array_equal(lu_f.get(), lu_g)
    np.testing.assert_array_equal(piv_f.get(), piv_g)


# A kernel that holds a stream: thread 0 spins until *flag is set (or max_cycles pass: status 2,
# never a hang), then the block copies src to dst; and the kernel that sets the flag.
_GATE = r"""
extern "C" __global__ void gate_copy(const volatile int* flag, int* status, const unsigned int* src,
                                     unsigned int* dst, long long words, long long max_cycles) {
    if (threadIdx.x == 0) {
        const long long start = clock64();
        int seen = 0;
        while (!(seen = *flag) && clock64() - start < max_cycles) {
        }
        *status = seen ? 1 : 2;
    }
    __syncthreads();
    for (long long i = threadIdx.x; i < words; i += blockDim.x) dst[i] = src[i];
}

extern "C" __global__ void release(int* flag) {
    atomicExch(flag, 1);
}
"""
_GATE_CYCLES = 20_000_000_000  # ~10 s at the H100's clock: the gate opens by itself if the test stops


def _on_stream(op: str, how: str, stream, x, piv, b):
    """Run public ``op`` on input ``x`` (``lu`` for lu_solve) on ``stream``: made current
    (``how="current"``) or passed as ``stream=``. Returns the CuPy results."""
    call = {"lu_factor": lambda **kw: kernels.lu_factor(x, **kw),
            "inv": lambda **kw: kernels.inv(x, **kw),
            "solve": lambda **kw: kernels.solve(x, b, **kw),
            "slogdet": lambda **kw: kernels.slogdet(x, **kw),
            "lu_solve": lambda **kw: (kernels.lu_solve(x, piv, b, **kw),)}[op]
    if how == "argument":
        return call(stream=stream)
    with stream:
        return call()


@pytest.mark.parametrize("how", ["current", "argument"])
@pytest.mark.parametrize("op", ["lu_factor", "inv", "solve", "slogdet", "lu_solve"])
def test_runs_on_the_current_stream(op, how):
    """The kernels launch on CuPy's current stream (or the ``stream=`` given), so they are ordered after
    work queued there before them. On a non-blocking stream, a gate kernel that waits for the host
    fills the op's input (NaN until then) from the real matrices; the op is queued behind it, then the
    host waits 0.2 s and opens the gate from another stream. On the right stream the op reads the real
    matrices; launched on any other stream it would have run at once on the NaNs: info -1, NaN
    results. The op runs once ungated on the same streams first, so its kernels are compiled and
    CuPy's pool holds its buffers (no cudaMalloc while the gate holds the stream)."""
    n, count, k = 24, 64, 2
    a = matrices.generate("random", n, np.float64, seed=6, start=0, stop=count)
    b_host = matrices.rhs(n, k, np.float64, seed=7, start=0, stop=count)
    lu_host, piv_host, _ = kernels.lu_factor(a)
    source = lu_host if op == "lu_solve" else a
    src = cupy.asarray(source)
    piv, b = cupy.asarray(piv_host), cupy.asarray(b_host)
    gated = cupy.full(source.shape, np.nan, dtype=source.dtype)
    flag, status = cupy.zeros(1, np.int32), cupy.zeros(1, np.int32)
    module = cupy.RawModule(code=_GATE)
    gate, release = module.get_function("gate_copy"), module.get_function("release")
    stream, other = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)

    warm = _on_stream(op, how, stream, src.copy(), piv, b)  # compile, and fill the pool, ungated
    stream.synchronize()
    del warm
    cupy.cuda.Device().synchronize()

    with stream:
        gate((1,), (256,), (flag, status, src, gated, np.int64(src.nbytes // 4), np.int64(_GATE_CYCLES)))
    try:
        result = _on_stream(op, how, stream, gated, piv, b)
        time.sleep(0.2)  # an op launched on another stream has long finished, on the NaNs
        held = not stream.done
    finally:
        with other:
            release((1,), (1,), (flag,))
        other.synchronize()
        stream.synchronize()
    assert held, "the gate did not hold its stream: the test would prove nothing"
    assert int(status.get()[0]) == 1, "the gate opened by itself: something waited on the held stream"

    host = [x.get() for x in result]
    if op == "lu_solve":
        assert get02(a, host[0], b_host).max() < THRESHOLD
        return
    info = host[-1]
    assert (info == 0).all(), f"info {np.unique(info)}: the op ran before its input was written"
    if op == "lu_factor":
        assert get01(a, host[0], host[1]).max() < THRESHOLD
    elif op == "inv":
        assert get03(a, host[0]).max() < THRESHOLD
    elif op == "solve":
        assert get02(a, host[0], b_host).max() < THRESHOLD
    else:
        sign, _ = np.linalg.slogdet(a)  # random float64 matrices: det far from 0, the sign exact
        assert (host[0] == sign).all() and np.isfinite(host[1]).all()


@pytest.mark.parametrize("bad", [4, -1, 2**32 + 1, 2**63 - 1])
def test_lu_solve_out_of_range_piv_gives_nan_x_on_the_device(bad):
    """On CuPy inputs the piv range check runs on the device (no host wait): the matrix with an
    out-of-range pivot (an int64 2**32 + 1 is not wrapped to 1 by the int32 cast) gets an all-NaN
    x, every other matrix its solution."""
    import cupy

    rng = np.random.default_rng()
    a = rng.standard_normal((5, 4, 4))
    b = rng.standard_normal((5, 4, 2))
    lu, piv, info = kernels.lu_factor(cupy.asarray(a))
    assert (info.get() == 0).all()
    wide = piv.astype(cupy.int64)
    wide[2, 1] = bad
    x = kernels.lu_solve(lu, wide, cupy.asarray(b)).get()
    assert x.shape == b.shape and x.dtype == np.float64
    assert np.isnan(x[2]).all()
    keep = [0, 1, 3, 4]
    assert get02(a[keep], x[keep], b[keep]).max() < THRESHOLD
