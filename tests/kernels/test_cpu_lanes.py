"""The compiled engine's lane LU (``batchlu.kernels._cpu_lanes``: W matrices at once, one per SIMD
lane) and its SIMD vectors (``batchlu.kernels._cpu_simd``): fresh random inputs in every dtype at
sizes that cut the panels, register tiles and transposes at every edge, in batches that leave the
last group of lanes part-filled; outputs poisoned before the kernel runs; LAPACK's test ratios
against float64/complex128 references; LAPACK's pivots and ``info``; singular, ill-conditioned,
tiny-pivot, overflowing and non-finite matrices mixed with good ones in one group of lanes; and
results that do not depend on a matrix's lane, its neighbours or the thread count."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from batchlu import kernels
from batchlu.kernels import _cpu, _cpu_threads
from batchlu.testing import matrices
from batchlu.testing.ratios import THRESHOLD, get01, slogdet_ratios

lanes_module = pytest.importorskip("batchlu.kernels._cpu_lanes", reason="numba is not importable")
simd = pytest.importorskip("batchlu.kernels._cpu_simd", reason="numba is not importable")

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
# 1-3: degenerate; 9, 17: one panel and a bit (NB = 8), edges of the 4 x 4 / 2 x 4 tiles;
# 16, 33: whole / partial 16-wide transposes; 64, 100, 128: the benchmark's sizes and an odd one.
SIZES = [1, 2, 3, 5, 8, 9, 16, 17, 33, 64, 100, 128]


@pytest.fixture(autouse=True)
def compiled_lanes(monkeypatch):
    """The compiled engine, with ``getrf`` and ``slogdet`` on the lane LU at every n."""
    monkeypatch.setenv(_cpu.ENGINE_ENV, "compiled")
    monkeypatch.setattr(_cpu, "LANES_MIN_N", 1)


def _seed() -> int:
    return int(np.random.SeedSequence().generate_state(1)[0])  # fresh inputs on every run


def _count(n: int, dtype) -> int:
    """Two and a half groups of lanes at least (the last one part-filled), more for small n."""
    width = lanes_module.lanes(dtype)
    return max(5 * width // 2, 4000 // (n * n)) | 1


def _factor_poisoned(a):
    """``_cpu_lanes.getrf`` into outputs poisoned first (NaN, -7): every element must be written."""
    count, n = a.shape[0], a.shape[-1]
    lu = np.full(a.shape, np.nan, a.dtype)
    piv = np.full((count, n), -7, np.int32)
    info = np.full(count, -7, np.int32)
    lanes_module.getrf(a, lu, piv, info)
    return lu, piv, info


def _overflowing(n, dtype):
    """The identity but [[1, M], [-1, M]] at the top left, M = 0.9 max: U[1, 1] = 2M overflows."""
    big = 0.9 * np.finfo(np.empty(0, dtype).real.dtype).max
    a = np.eye(n, dtype=dtype)
    a[:2, :2] = [[1, big], [-1, big]]
    return a


def _scipy_piv(a):
    with np.errstate(all="ignore"):
        return np.array([scipy.linalg.lu_factor(m, check_finite=False)[1] for m in a], np.int32)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_random_matrices(dtype, n):
    seed = _seed()
    count = _count(n, dtype)
    a = matrices.generate("random", n, dtype, seed=seed, stop=count)
    before = a.copy()
    lu, piv, info = _factor_poisoned(a)
    msg = f"seed {seed}"
    np.testing.assert_array_equal(a, before)
    assert lu.dtype == dtype and lu.shape == a.shape and piv.shape == (count, n)
    np.testing.assert_array_equal(info, 0, err_msg=msg)
    assert np.isfinite(lu).all(), msg
    assert get01(a, lu, piv).max() < THRESHOLD, msg
    if np.dtype(dtype) in (np.float64, np.complex128):   # single precision: near ties may differ
        np.testing.assert_array_equal(piv, _scipy_piv(a), err_msg=msg)
    # through the API, which allocates the outputs itself
    lu2, piv2, info2 = kernels.lu_factor(a)
    assert lu2.tobytes() == lu.tobytes() and piv2.tobytes() == piv.tobytes()
    assert info2.tobytes() == info.tobytes()


@pytest.mark.parametrize("n", [2, 9, 33, 64])
@pytest.mark.parametrize("dtype", DTYPES)
def test_bad_matrices_share_a_group_with_good_ones(dtype, n):
    """In the first group of lanes: an exactly singular matrix (a zero column: ``info`` is LAPACK's
    first zero pivot), the zero matrix, NaN, +Inf (in the imaginary part where complex), -Inf, an
    overflowing one (-2), a tiny one
    (pivots below ``sfmin``: columns divided, not scaled) and an ill-conditioned one; good random
    matrices around them keep the bits they have alone."""
    seed = _seed()
    count = _count(n, dtype)
    a = matrices.generate("random", n, dtype, seed=seed, stop=count)
    real = np.finfo(np.empty(0, dtype).real.dtype)
    a[1, :, n // 2] = 0
    a[2] = 0
    a[3, n - 1, 0] = np.nan
    a[4, 0, n - 1] = complex(0, np.inf) if np.dtype(dtype).kind == "c" else np.inf   # imaginary part
    a[5, n // 2, n // 2] = -np.inf
    if n >= 2:
        a[6] = _overflowing(n, dtype)
    a[7] *= real.tiny                           # every entry near the underflow threshold
    a[8] = matrices.generate("illcond", n, dtype, seed=seed, start=0, stop=1)[0]
    lu, piv, info = _factor_poisoned(a)
    msg = f"seed {seed}"

    ref = scipy.linalg.get_lapack_funcs("getrf", (a[1],))(a[1])[2]
    assert info[1] == ref and info[1] > 0, msg
    assert info[2] == 1
    np.testing.assert_array_equal(info[3:6], -1)
    assert np.isnan(lu[3:6]).all()
    np.testing.assert_array_equal(piv[3:6], np.broadcast_to(np.arange(n), (3, n)))
    assert info[6] == (-2 if n >= 2 else 0), msg
    if n >= 2:
        assert not np.isfinite(lu[6]).all()
    good = np.r_[0, 7, 8, 9:count]
    np.testing.assert_array_equal(info[good], 0, err_msg=msg)
    assert get01(a[good], lu[good], piv[good]).max() < THRESHOLD, msg
    assert get01(a[[1, 2]], lu[[1, 2]], piv[[1, 2]]).max() < THRESHOLD, msg
    for k in (0, 7, 8, 9, count - 1):           # each alone: the same bits as in the batch
        alone = _factor_poisoned(a[k:k + 1])
        for x, y in zip(alone, (lu, piv, info)):
            assert x.tobytes() == y[k:k + 1].tobytes(), f"{msg}, matrix {k}"


def test_tiny_pivot_divides_like_reference_lapack():
    """A subnormal second pivot (0 - 2e-20 * 3e-292) next to ordinary matrices in the same group:
    the column under it is divided by it (LAPACK's xGETF2 below ``sfmin``), giving the multiplier
    0.5, while OpenBLAS would scale by an overflowing reciprocal."""
    n = 12
    rng = np.random.default_rng(_seed())
    a = rng.standard_normal((9, n, n))
    a[4] = np.eye(n)
    a[4, :3, :3] = [[1, 3e-292, 1], [1e-20, 0, 2], [2e-20, 0, 3]]
    lu, piv, info = _factor_poisoned(a)
    np.testing.assert_array_equal(info, 0)
    assert lu[4, 1, 1] == 0 - 2e-20 * 3e-292 and lu[4, 2, 1] == 0.5
    np.testing.assert_array_equal(piv[4, :3], [0, 2, 2])
    assert get01(a, lu, piv).max() < THRESHOLD


@pytest.mark.parametrize("dtype", DTYPES)
def test_exact_ties_go_to_the_first_candidate(dtype):
    """Column 0 is +-1 but +-2 at row r; row r is 0 in column 1 and every other column-1 entry has
    |re| + |im| = 1. Step 1 must take position 1 (LAPACK's first largest), in exact arithmetic; and
    so must the first step of the second panel."""
    n, count = 33, 40
    rng = np.random.default_rng(_seed())
    a = matrices.generate("random", n, dtype, seed=n, stop=count)
    first = rng.integers(1, n, size=count)
    a[:, :, 0] = rng.choice([-1.0, 1.0], size=(count, n))
    a[np.arange(count), first, 0] = 2
    ties = np.array([1, -1, 1j, -1j, 0.5 + 0.5j, 0.5 - 0.5j, -0.5 + 0.5j, -0.5 - 0.5j])
    if np.dtype(dtype).kind == "c":
        a[:, :, 1] = rng.choice(ties, size=(count, n))
    else:
        a[:, :, 1] = rng.choice([-1.0, 1.0], size=(count, n))
    a[np.arange(count), first, 1] = 0
    lu, piv, info = _factor_poisoned(a)
    assert (info == 0).all() and (piv[:, 0] == first).all() and (piv[:, 1] == 1).all()
    np.testing.assert_array_equal(piv[:, :2], _scipy_piv(a)[:, :2])
    assert get01(a, lu, piv).max() < THRESHOLD
    # The same at the first column of a panel (NB): the identity first, then a block whose first
    # column ties everywhere; steps 0 .. NB - 1 leave it exactly as it is.
    nb = lanes_module.NB
    b = matrices.generate("random", n, dtype, seed=n + 1, stop=count)
    b[:, :nb, :] = 0
    b[:, :, :nb] = 0
    b[:, np.arange(nb), np.arange(nb)] = 1
    b[:, nb:, nb] = rng.choice(ties if np.dtype(dtype).kind == "c" else [-1.0, 1.0], size=(count, n - nb))
    lu, piv, info = _factor_poisoned(b)
    assert (info == 0).all() and (piv[:, nb] == nb).all()
    np.testing.assert_array_equal(piv[:, :nb + 1], _scipy_piv(b)[:, :nb + 1])
    assert get01(b, lu, piv).max() < THRESHOLD


@pytest.mark.parametrize("n", [3, 17, 64])
@pytest.mark.parametrize("dtype", DTYPES)
def test_slogdet(dtype, n):
    """Sign and log|det| from the lane LU: LAPACK's ratios on good matrices, 0 / -inf on singular
    ones, NaN on non-finite ones, -2 where the factors overflow; outputs poisoned first."""
    seed = _seed()
    count = _count(n, dtype)
    a = matrices.generate("random", n, dtype, seed=seed, stop=count)
    a[1, :, 0] = 0
    a[2, 0, 0] = np.nan
    a[3] = _overflowing(n, dtype)
    sign = np.full(count, np.nan, dtype)
    logabsdet = np.full(count, np.nan, np.empty(0, dtype).real.dtype)
    info = np.full(count, -7, np.int32)
    lanes_module.slogdet(a, sign, logabsdet, info)
    msg = f"seed {seed}"
    good = np.r_[0, 4:count]
    np.testing.assert_array_equal(info[good], 0, err_msg=msg)
    assert max(r.max() for r in slogdet_ratios(a[good], sign[good], logabsdet[good])) < THRESHOLD, msg
    assert info[1] == 1 and sign[1] == 0 and logabsdet[1] == -np.inf
    assert info[2] == -1 and np.isnan(sign[2]) and np.isnan(logabsdet[2])
    assert info[3] == -2, msg
    s2, l2, i2 = kernels.slogdet(a)                   # the API, same kernel
    assert s2.tobytes() == sign.tobytes() and l2.tobytes() == logabsdet.tobytes()
    assert i2.tobytes() == info.tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
def test_results_do_not_depend_on_lane_threads_or_neighbours(dtype, monkeypatch):
    """A matrix gives the same bits in any lane, alone or in a batch, on one thread or split four
    ways (ranges then start mid-batch, on whole groups of lanes)."""
    n = 24
    a = matrices.generate("singular-mix", n, dtype, seed=_seed(), stop=203)
    with kernels.cpu_threads(1):
        one = kernels.lu_factor(a), kernels.slogdet(a)
        shifted = kernels.lu_factor(a[3:]), kernels.slogdet(a[3:])   # every matrix in another lane
    with kernels.cpu_threads(4), monkeypatch.context() as m:
        m.setattr(_cpu_threads, "MIN_WORK", 1)
        four = kernels.lu_factor(a), kernels.slogdet(a)
    for p, q, r in zip([*one[0], *one[1]], [*four[0], *four[1]], [*shifted[0], *shifted[1]]):
        assert p.tobytes() == q.tobytes()
        assert p[3:].tobytes() == r.tobytes()


def test_ranges_split_on_whole_groups(monkeypatch):
    """``_cpu_threads.run(..., align=W)`` hands out ranges that start on multiples of W."""
    seen = []

    def kernel(lo, hi):
        seen.append((lo, hi))
    with kernels.cpu_threads(3):
        _cpu_threads.run(kernel, 100, 200, align=8)
    seen.sort()
    assert seen[0][0] == 0 and seen[-1][1] == 100
    assert all(hi == lo2 for (_, hi), (lo2, _) in zip(seen, seen[1:]))
    assert all(lo % 8 == 0 for lo, _ in seen) and len(seen) == 3


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vector_transposes(dtype):
    """``vtranspose`` and its complex pair ``vtranspose_split`` / ``vtranspose_join`` at strides
    other than the block's, against NumPy's transposes."""
    from numba import njit

    @njit
    def run(d, s, re, im, c, out, w):
        simd.vtranspose(d, 3, w + 1, s, 5, w + 2)
        simd.vtranspose_split(re, im, 0, w, c, 0, 2 * w)
        simd.vtranspose_join(out, 0, 2 * w, re, im, 0, w)

    w = simd.lanes(np.dtype(dtype))
    rng = np.random.default_rng(_seed())
    s = rng.standard_normal(5 + w * (w + 2)).astype(dtype)
    d = np.full(3 + w * (w + 1), np.nan, dtype)
    c = rng.standard_normal(2 * w * w).astype(dtype)
    re, im = np.full(w * w, np.nan, dtype), np.full(w * w, np.nan, dtype)
    out = np.full(2 * w * w, np.nan, dtype)
    run(d, s, re, im, c, out, w)
    block = s[5:].reshape(w, w + 2)[:, :w]
    np.testing.assert_array_equal(d[3:].reshape(w, w + 1)[:, :w], block.T)
    z = c.reshape(w, w, 2)
    np.testing.assert_array_equal(re.reshape(w, w), z[:, :, 0].T)
    np.testing.assert_array_equal(im.reshape(w, w), z[:, :, 1].T)
    np.testing.assert_array_equal(out, c)
