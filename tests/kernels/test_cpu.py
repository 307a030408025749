"""The CPU backend: per-matrix info on singular and non-finite matrices mixed into a batch, every
output element written, ill-conditioned inputs, and batches larger than one internal pass, on both
engines (compiled and NumPy) and on both sides of each one's crossover: the compiled xGETF2 or the
vectorised NumPy LU (small n), and LAPACK (one call per matrix, from a compiled loop or Python); and
the compiled engine's lane LU (``getrf`` and ``slogdet``, W matrices at once)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.linalg

from batchlu import kernels
from batchlu.kernels import _cpu, _cpu_lapack, _cpu_vectorised
from batchlu.testing import matrices
from batchlu.testing.ratios import THRESHOLD, get01, get02, get03, slogdet_ratios

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]


class _PoisonedNumpy:
    """Stands in for ``numpy`` inside the CPU backend's modules: fresh buffers start full of garbage (NaN for
    inexact types, -7 for integers), so a result element the backend forgets to write shows."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def _poison(dtype):
        return np.nan if np.dtype(dtype).kind in "fc" else -7

    def empty(self, shape, dtype=float, *args, **kwargs):
        return np.full(shape, self._poison(dtype), dtype)

    def empty_like(self, x, dtype=None, *args, **kwargs):
        return np.full(np.shape(x), self._poison(dtype or x.dtype), dtype or x.dtype)


@pytest.fixture(params=["compiled-lapack", "compiled-own", "compiled-lanes", "numpy-lapack",
                        "numpy-vectorised"])
def engine(request, monkeypatch):
    """One engine, with every n on one side of its crossover: all through LAPACK, or all through
    the engine's own LU (compiled xGETF2, or vectorised NumPy); or, compiled, ``getrf`` and
    ``slogdet`` at every n on the lane LU (W matrices at once), the other ops as the tables say."""
    kind, side = request.param.split("-")
    if kind == "compiled" and not _cpu.compiled_available():
        pytest.skip("numba is not importable: the CPU backend has only its NumPy engine")
    monkeypatch.setenv(_cpu.ENGINE_ENV, kind)
    if side == "lanes":
        monkeypatch.setattr(_cpu, "LANES_MIN_N", 1)
    else:
        monkeypatch.setattr(_cpu, "LAPACK_MIN_N", 1 if side == "lapack" else 1 << 30)
    return request.param


@pytest.fixture
def poisoned(monkeypatch):
    for module in (_cpu, _cpu_lapack, _cpu_vectorised):
        monkeypatch.setattr(module, "np", _PoisonedNumpy())


@pytest.mark.parametrize("n", [1, 2, 3, 8, 33, 64])
@pytest.mark.parametrize("dtype", DTYPES)
def test_singular_mix_info_and_neighbours(dtype, n, engine, poisoned):
    """Singular, zero, NaN and Inf matrices mixed into a batch: right info, NaN results for them
    only, and their neighbours solved to LAPACK accuracy."""
    count = 40
    a = matrices.generate("singular-mix", n, dtype, seed=n, start=0, stop=count)
    masks = matrices.singular_mix_masks(0, count)
    i = np.arange(count)
    expected = np.zeros(count, np.int32)
    expected[masks["singular"]] = (i[masks["singular"]] // 7) % n + 1
    expected[masks["zero"]] = 1
    expected[masks["nan"] | masks["inf"]] = -1
    assert {1, -1} <= set(expected.tolist()) and (expected == 0).sum() >= count // 2

    b = matrices.rhs(n, 2, dtype, seed=n, start=0, stop=count)
    lu, piv, info = kernels.lu_factor(a)
    ainv, info_inv = kernels.inv(a)
    x, info_solve = kernels.solve(a, b)
    sign, logabsdet, info_det = kernels.slogdet(a)
    for got in (info, info_inv, info_solve, info_det):
        np.testing.assert_array_equal(got, expected)

    good, singular, bad = expected == 0, expected > 0, expected < 0
    # Neighbours: unspoiled and accurate.
    assert np.isfinite(lu[good]).all() and np.isfinite(ainv[good]).all() and np.isfinite(x[good]).all()
    assert get01(a[good], lu[good], piv[good]).max() < THRESHOLD
    assert get03(a[good], ainv[good]).max() < THRESHOLD
    assert get02(a[good], x[good], b[good]).max() < THRESHOLD
    assert max(r.max() for r in slogdet_ratios(a[good], sign[good], logabsdet[good])) < THRESHOLD
    # Exactly singular: the factorization completes, as LAPACK's, and is still a valid one.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k in np.flatnonzero(singular):
            _, ref_piv = scipy.linalg.lu_factor(a[k])
            np.testing.assert_array_equal(piv[k], ref_piv)
    assert np.isfinite(lu[singular]).all()
    assert get01(a[singular], lu[singular], piv[singular]).max() < THRESHOLD
    assert np.isnan(ainv[singular]).all() and np.isnan(x[singular]).all()
    assert np.all(sign[singular] == 0) and np.all(logabsdet[singular] == -np.inf)
    # Non-finite: NaN everywhere, identity pivots.
    assert np.isnan(lu[bad]).all() and np.isnan(ainv[bad]).all() and np.isnan(x[bad]).all()
    np.testing.assert_array_equal(piv[bad], np.broadcast_to(np.arange(n), piv[bad].shape))
    assert np.isnan(sign[bad]).all() and np.isnan(logabsdet[bad]).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_hand_made_bad_matrices(dtype, engine):
    """A rank-one 2 x 2 matrix, the zero matrix, NaN and +-Inf between two good matrices."""
    good = np.array([[4.0, 1.0], [2.0, 3.0]])
    a = np.array([good, [[1.0, 2.0], [2.0, 4.0]], np.zeros((2, 2)),
                  [[1.0, np.nan], [0.0, 1.0]], [[np.inf, 0.0], [0.0, 1.0]],
                  [[1.0, 0.0], [-np.inf, 1.0]], good.T], dtype)
    lu, piv, info = kernels.lu_factor(a)
    np.testing.assert_array_equal(info, [0, 2, 1, -1, -1, -1, 0])
    # [[1, 2], [2, 4]]: pivot row 1, multiplier 0.5, U[1, 1] = 2 - 0.5 * 4 = 0 exactly.
    np.testing.assert_array_equal(piv[1], [1, 1])
    np.testing.assert_array_equal(lu[1], np.array([[2, 4], [0.5, 0]], dtype))
    np.testing.assert_array_equal(piv[2], [0, 1])
    np.testing.assert_array_equal(lu[2], np.zeros((2, 2), dtype))
    assert np.isnan(lu[3:6]).all()
    assert get01(a[[0, 6]], lu[[0, 6]], piv[[0, 6]]).max() < THRESHOLD
    ainv, info = kernels.inv(a)
    assert np.isnan(ainv[1:6]).all()
    np.testing.assert_allclose(ainv[0], np.linalg.inv(good), rtol=4 * np.finfo(dtype).eps)
    sign, logabsdet, _ = kernels.slogdet(a)
    np.testing.assert_array_equal(sign[1:3], [0, 0])
    np.testing.assert_array_equal(logabsdet[1:3], [-np.inf, -np.inf])
    assert sign[0] == 1 and sign[6] == 1
    assert max(r.max() for r in slogdet_ratios(a[[0, 6]], sign[[0, 6]], logabsdet[[0, 6]])) < THRESHOLD


def test_lu_solve_with_a_zero_pivot_spoils_only_its_own_x(engine):
    a = matrices.generate("random", 5, np.float64, seed=11, stop=3)
    a[1, :, 3] = 0
    lu, piv, info = kernels.lu_factor(a)
    np.testing.assert_array_equal(info, [0, 4, 0])
    b = matrices.rhs(5, None, np.float64, seed=11, stop=3)
    x = kernels.lu_solve(lu, piv, b)
    assert not np.isfinite(x[1]).all()
    assert np.isfinite(x[[0, 2]]).all() and get02(a[[0, 2]], x[[0, 2]], b[[0, 2]]).max() < THRESHOLD


@pytest.mark.parametrize("n", [8, 64])
@pytest.mark.parametrize("dtype", DTYPES)
def test_illcond(dtype, n, engine):
    """Backward stability holds at the condition number the generator targets."""
    a = matrices.generate("illcond", n, dtype, seed=3, start=5, stop=13)
    lu, piv, info = kernels.lu_factor(a)
    assert np.all(info == 0)
    assert get01(a, lu, piv).max() < THRESHOLD
    ainv, info = kernels.inv(a)
    assert ainv.dtype == dtype and ainv.shape == a.shape and np.all(info == 0)
    assert np.isfinite(ainv).all()  # cond = 1e12 (1e5 in single precision): no inverse overflows
    assert get03(a, ainv).max() < THRESHOLD
    b = matrices.rhs(n, 3, dtype, seed=3, start=5, stop=13)
    x, _ = kernels.solve(a, b)
    assert get02(a, x, b).max() < THRESHOLD
    sign, logabsdet, _ = kernels.slogdet(a)
    assert max(r.max() for r in slogdet_ratios(a, sign, logabsdet)) < THRESHOLD


def test_huge_and_tiny_entries_scale_like_lapack(engine):
    """Entries near the underflow threshold: the pivot is tiny, columns are divided, not scaled by
    an overflowing reciprocal; the result still passes get01."""
    rng = np.random.default_rng(17)
    a = rng.uniform(-1, 1, (4, 6, 6)) * np.finfo(np.float64).tiny
    lu, piv, info = kernels.lu_factor(a)
    assert np.all(info == 0) and np.isfinite(lu).all()
    assert get01(a, lu, piv).max() < THRESHOLD


def test_batch_larger_than_one_pass(engine, poisoned, monkeypatch):
    """The backend works through a large batch in passes; results do not depend on the pass size."""
    a = matrices.generate("singular-mix", 6, np.complex128, seed=5, stop=301)
    b = matrices.rhs(6, 2, np.complex128, seed=5, stop=301)
    whole = kernels.lu_factor(a), kernels.inv(a), kernels.solve(a, b), kernels.slogdet(a)
    monkeypatch.setattr(_cpu, "_CHUNK_ENTRIES", 36 * 32)  # passes of 32 matrices: ten of them
    monkeypatch.setattr(_cpu, "_CHUNK_MIN", 1)
    parts = kernels.lu_factor(a), kernels.inv(a), kernels.solve(a, b), kernels.slogdet(a)
    for one, other in zip(whole, parts):
        for x, y in zip(one, other):
            np.testing.assert_array_equal(x, y)


def test_inputs_are_not_modified_by_the_backend(engine):
    a = matrices.generate("singular-mix", 7, np.float32, seed=2, stop=30)
    before = a.copy()
    _cpu.getrf(a)
    _cpu.inv(a)
    _cpu.slogdet(a)
    b = matrices.rhs(7, 3, np.float32, seed=2, stop=30)
    b_before = b.copy()
    _cpu.solve(a, b)
    np.testing.assert_array_equal(a, before)
    np.testing.assert_array_equal(b, b_before)


@pytest.mark.parametrize("n", [1, 5, 33])
@pytest.mark.parametrize("dtype", DTYPES)
def test_lapack_engine_matches_scipy_bit_for_bit(dtype, n, monkeypatch, poisoned, cpu_engine):
    """Through LAPACK, ``lu``/``piv`` are ``scipy.linalg.lu_factor``'s and ``lu_solve`` is SciPy's,
    to the last bit, with a singular and a NaN matrix in the batch."""
    monkeypatch.setattr(_cpu, "LAPACK_MIN_N", 1)
    count = 12
    a = matrices.generate("random", n, dtype, seed=21, stop=count)
    a[3, :, n // 2] = 0      # info = n // 2 + 1 (or earlier, if elimination zeroes a pivot first)
    a[7, 0, 0] = np.nan
    b = matrices.rhs(n, 3, dtype, seed=21, stop=count)
    lu, piv, info = kernels.lu_factor(a)
    assert lu.dtype == dtype and info[3] > 0 and info[7] == -1
    finite = np.flatnonzero(info >= 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", scipy.linalg.LinAlgWarning)
        for k in finite:
            ref_lu, ref_piv = scipy.linalg.lu_factor(a[k])
            np.testing.assert_array_equal(lu[k], ref_lu, err_msg=f"lu of matrix {k}")
            np.testing.assert_array_equal(piv[k], ref_piv, err_msg=f"piv of matrix {k}")
    good = np.flatnonzero(info == 0)
    x = kernels.lu_solve(lu[good], piv[good], b[good])
    ref_x = scipy.linalg.lu_solve((lu[good], piv[good]), b[good], check_finite=False)
    assert x.dtype == dtype
    np.testing.assert_array_equal(x, ref_x)
    ainv, _ = kernels.inv(a)
    assert ainv.dtype == dtype and get03(a[good], ainv[good]).max() < THRESHOLD
    assert np.isnan(ainv[[3, 7]]).all()


@pytest.mark.parametrize("dtype", [np.float32, np.complex128])
def test_default_crossover_picks_lapack_from_lapack_min_n(dtype, monkeypatch):
    """NumPy engine: below ``NUMPY_LAPACK_MIN_N`` the vectorised LU runs, from it on LAPACK; both
    give right answers."""
    monkeypatch.setenv(_cpu.ENGINE_ENV, "numpy")
    calls = []
    real = _cpu_lapack.factor

    def spy(a, piv):
        calls.append(a.shape[-1])
        real(a, piv)

    monkeypatch.setattr(_cpu_lapack, "factor", spy)
    for n in (_cpu.NUMPY_LAPACK_MIN_N - 1, _cpu.NUMPY_LAPACK_MIN_N):
        a = matrices.generate("random", n, dtype, seed=n, stop=50)
        lu, piv, info = kernels.lu_factor(a)
        assert np.all(info == 0) and get01(a, lu, piv).max() < THRESHOLD
        ainv, _ = kernels.inv(a)
        assert get03(a, ainv).max() < THRESHOLD
    assert calls == [_cpu.NUMPY_LAPACK_MIN_N, _cpu.NUMPY_LAPACK_MIN_N]


def test_small_inverse_falls_back_to_our_lu_when_numpy_refuses(monkeypatch, poisoned):
    """NumPy engine: below the crossover ``inv`` asks ``numpy.linalg.inv`` for the matrices with
    info == 0; if NumPy's own factorization called one singular, the inverses come from our LU."""
    monkeypatch.setenv(_cpu.ENGINE_ENV, "numpy")
    monkeypatch.setattr(_cpu, "LAPACK_MIN_N", 1 << 30)
    a = matrices.generate("singular-mix", 6, np.float64, seed=4, stop=40)
    expected, info = kernels.inv(a)
    good = info == 0
    assert good.sum() >= 20 and (~good).any()

    def refuse(x):
        raise np.linalg.LinAlgError("Singular matrix")

    monkeypatch.setattr(np.linalg, "inv", refuse)
    ainv, info_fallback = kernels.inv(a)
    np.testing.assert_array_equal(info_fallback, info)
    assert get03(a[good], ainv[good]).max() < THRESHOLD
    assert np.isnan(ainv[~good]).all()


def test_near_underflow_matrices_stay_accurate_through_the_lapack_engine(monkeypatch, cpu_engine):
    """OpenBLAS's getrf loses subnormal intermediates; matrices that reach that range are factored
    by the engine's own LU instead, matrix by matrix, while their neighbours keep SciPy's bits."""
    monkeypatch.setattr(_cpu, "LAPACK_MIN_N", 1)
    n = 12
    rng = np.random.default_rng(29)
    a = rng.standard_normal((6, n, n))
    a[1] *= np.finfo(np.float64).tiny                       # every entry near the underflow threshold
    a[2, :, 1] = a[2, :, 0] * (1 + 1e-16 * rng.standard_normal())
    a[2] *= 1e-295                                          # nearly dependent columns at 1e-295
    a[3, :, 4] *= 1e-310                                    # a subnormal column
    # Entries all >= tiny / eps or zero, yet the second pivot is subnormal (0 - 2e-20 * 3e-292):
    # OpenBLAS scales by its reciprocal; reference LAPACK divides, giving the multiplier 0.5.
    a[4] = np.eye(n)
    a[4, :3, :3] = [[1, 3e-292, 1], [1e-20, 0, 2], [2e-20, 0, 3]]
    lu, piv, info = kernels.lu_factor(a)
    np.testing.assert_array_equal(info, 0)
    assert get01(a, lu, piv).max() < THRESHOLD
    assert lu[4, 1, 1] == 0 - 2e-20 * 3e-292 and lu[4, 2, 1] == 0.5
    np.testing.assert_array_equal(piv[4, :3], [0, 2, 2])
    for k in (0, 5):
        ref_lu, ref_piv = scipy.linalg.lu_factor(a[k])
        np.testing.assert_array_equal(lu[k], ref_lu)
        np.testing.assert_array_equal(piv[k], ref_piv)
    with np.errstate(all="ignore"):
        ainv, _ = kernels.inv(a)
    # 2, 3 and 4 have inverses beyond float64's range (~1e312: entries ~1e-295 with condition ~1e17;
    # ~1e310: a column scaled by 1e-310; ~1e311: a 6e-312 pivot), so get03 is taken on the others
    assert not np.isfinite(ainv[[2, 3, 4]]).all(axis=(1, 2)).any()
    assert get03(a[[0, 1, 5]], ainv[[0, 1, 5]]).max() < THRESHOLD


def _getf2_pivots(m: np.ndarray) -> list[int]:
    """Pivots of LAPACK's unblocked algorithm in Python's complex arithmetic, dividing by every pivot
    (exact for subnormal pivots, where a reciprocal would overflow)."""
    n = m.shape[0]
    a = [[complex(m[i, j]) for j in range(n)] for i in range(n)]
    piv = []
    for k in range(n):
        p = max(range(k, n), key=lambda i: (abs(a[i][k].real) + abs(a[i][k].imag), -i))
        piv.append(p)
        a[k], a[p] = a[p], a[k]
        if a[k][k] != 0:
            for i in range(k + 1, n):
                a[i][k] /= a[k][k]
        for i in range(k + 1, n):
            for j in range(k + 1, n):
                a[i][j] -= a[i][k] * a[k][j]
    return piv


@pytest.mark.parametrize("n", [5, 16])
@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_subnormal_first_pivot_matches_lapacks_algorithm(cpu_engine, dtype, n):
    """Column 0 in the subnormal range (the inputs of the GPU tests' test_tiny_pivot, which take their
    reference pivots from here because SciPy's OpenBLAS picks others): the pivots are those of
    LAPACK's algorithm, the factors accurate."""
    a = matrices.subnormal_first_column(n, dtype, seed=n, stop=12)
    lu, piv, info = kernels.lu_factor(a)
    np.testing.assert_array_equal(info, 0)
    assert np.isfinite(lu).all() and get01(a, lu, piv).max() < THRESHOLD
    np.testing.assert_array_equal(piv, [_getf2_pivots(m) for m in a])
    b = a @ matrices.rhs(n, 3, dtype, seed=n, start=0, stop=12)  # a solution well inside the range
    x, info = kernels.solve(a, b)
    np.testing.assert_array_equal(info, 0)
    assert np.isfinite(x).all() and get02(a, x, b).max() < THRESHOLD


@pytest.mark.parametrize("engine_name", ["numpy", "compiled"])
def test_tuning_cpu_crossover_moves_every_op_and_restores_the_tables(engine_name, monkeypatch):
    """``batchlu.kernels.tuning.cpu_crossover`` (what bench_cpu_crossover.py times with) puts every
    op of either engine on one side of n inside its block, and the tables are back after it."""
    from batchlu.kernels import tuning

    if engine_name == "compiled" and not _cpu.compiled_available():
        pytest.skip("numba is not importable: the CPU backend has only its NumPy engine")
    monkeypatch.setenv(_cpu.ENGINE_ENV, engine_name)
    before = {op: tuning.cpu_lapack_min_n(op, np.float64) for op in ("getrf", "inv", "solve", "slogdet")}
    assert before == ({op: tuning.NUMPY_LAPACK_MIN_N for op in before} if engine_name == "numpy" else
                      {op: tuning.COMPILED_LAPACK_MIN_N[op][1] for op in before})
    a = matrices.generate("random", 6, np.float64, seed=6, stop=30)
    for crossover in (1, 1 << 30):
        with tuning.cpu_crossover(crossover):
            assert {tuning.cpu_lapack_min_n(op, np.complex64) for op in before} == {crossover}
            lu, piv, info = kernels.lu_factor(a)
            assert np.all(info == 0) and get01(a, lu, piv).max() < THRESHOLD
        assert {op: tuning.cpu_lapack_min_n(op, np.float64) for op in before} == before
    with pytest.raises(ValueError, match="Expected a crossover n >= 1. Got 0 instead."):
        with tuning.cpu_crossover(0):
            pass
    assert _cpu.LAPACK_MIN_N is None
