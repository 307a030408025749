"""LAPACK's test ratios: small for right answers, far past the threshold for wrong ones, exact on
hand-computed cases, LAPACK's handling of zero norms, and the epsilon of the least precise input."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from batchlu.testing import matrices
from batchlu.testing.ratios import THRESHOLD, get01, get02, get03, slogdet_ratios

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
EPS64 = np.finfo(np.float64).eps


def _factor(a):
    lus, pivs = zip(*(scipy.linalg.lu_factor(m) for m in a.reshape((-1,) + a.shape[-2:])))
    return np.array(lus).reshape(a.shape), np.array(pivs).reshape(a.shape[:-1])


@pytest.fixture(params=DTYPES, ids=lambda d: np.dtype(d).name)
def dtype(request):
    return request.param


@pytest.fixture
def a(dtype):
    return matrices.generate("random", 12, dtype, seed=101, stop=6).reshape(2, 3, 12, 12)


def test_threshold_is_lapacks():
    assert THRESHOLD == 30


def test_get01_right_and_wrong(a, dtype):
    lu, piv = _factor(a)
    ratio = get01(a, lu, piv)
    assert ratio.dtype == np.float64 and ratio.shape == (2, 3)
    assert ratio.max() < THRESHOLD
    wrong = lu.copy()
    wrong[1, 2, 5, 7] += 1e3 * np.finfo(dtype).eps * np.abs(lu).max()
    bad = get01(a, wrong, piv)
    assert bad[1, 2] > THRESHOLD and np.delete(bad.ravel(), 5).max() < THRESHOLD
    swapped = piv.copy()
    swapped[0, 0, 3] = (piv[0, 0, 3] + 1) % 12
    assert get01(a, lu, swapped)[0, 0] > THRESHOLD


def test_get02_right_and_wrong(a, dtype):
    b = matrices.rhs(12, 3, dtype, seed=102, stop=6).reshape(2, 3, 12, 3)
    x = np.linalg.solve(a, b)
    ratio = get02(a, x, b)
    assert ratio.dtype == np.float64 and ratio.shape == (2, 3) and ratio.max() < THRESHOLD
    wrong = x.copy()
    wrong[0, 1, 4, 2] *= 1 + 1e3 * np.finfo(dtype).eps
    assert get02(a, wrong, b)[0, 1] > THRESHOLD  # one bad column of three is enough
    # A vector right-hand side and the same one as an (n, 1) matrix give the same ratio.
    np.testing.assert_array_equal(get02(a, x[..., 0], b[..., 0]), get02(a, x[..., :1], b[..., :1]))


@pytest.mark.parametrize("a_dtype,b_dtype", [("float64", "float32"), ("float32", "float64"),
                                              ("complex64", "complex128")])
def test_get02_judges_a_mixed_solve_at_the_precision_of_x(a_dtype, b_dtype):
    """x in float64 from a float32 A or b: judged at float64's eps. A 1e-8 relative error in x, far
    beyond float64 rounding, failed nobody at float32's eps (the least precise of the three)."""
    a = matrices.generate("random", 12, a_dtype, seed=5, start=0, stop=4)
    b = matrices.rhs(12, 3, b_dtype, seed=6, start=0, stop=4)
    wide = np.result_type(a, b)
    x = np.linalg.solve(a.astype(wide), b.astype(wide))
    assert get02(a, x, b).max() < THRESHOLD
    wrong = x * (1 + 1e-8)
    assert get02(a, wrong, b).min() > THRESHOLD


def test_get03_right_and_wrong(a, dtype):
    ainv = np.linalg.inv(a)
    ratio = get03(a, ainv)
    assert ratio.dtype == np.float64 and ratio.shape == (2, 3) and ratio.max() < THRESHOLD
    wrong = ainv.copy()
    wrong[1, 0] = wrong[1, 0].T
    assert get03(a, wrong)[1, 0] > THRESHOLD


def test_get01_hand_computed():
    """a = [[2, 0], [0, 1]] and an lu whose U[1, 1] is off by d: ||LU - PA||_1 = d, ||a||_1 = 2."""
    a = np.array([[2.0, 0.0], [0.0, 1.0]])
    d = 1e-13
    lu = np.array([[2.0, 0.0], [0.0, 1.0 + d]])
    assert get01(a, lu, np.array([0, 1])) == pytest.approx(d / 2 / 2 / EPS64, rel=1e-3)


def test_get01_applies_pivots_as_lapack_interchanges():
    """piv = [2, 2, 2]: swap rows 0 and 2, then row 1 with row 2, so P A = A[[2, 0, 1]]."""
    a = np.array([[1.0, 4, 7], [2, 5, 8], [3, 6, 10]])
    lu_, piv = scipy.linalg.lu_factor(a)
    np.testing.assert_array_equal(piv, [2, 2, 2])
    assert get01(a, lu_, piv) < THRESHOLD
    assert get01(a, lu_, np.array([2, 1, 2])) > THRESHOLD


def test_get02_hand_computed():
    """a = I, b = [1, 1], x = [1 + d, 1]: ||b - a x||_1 = d, ||a||_1 = 1, ||x||_1 = 2 + d."""
    d = 1e-12
    ratio = get02(np.eye(2), np.array([1.0 + d, 1.0]), np.array([1.0, 1.0]))
    assert ratio == pytest.approx(d / (2 + d) / EPS64, rel=1e-3)


def test_get03_hand_computed():
    """a = I (n = 2), ainv = (1 + d) I: ||I - ainv a||_1 = d, ||ainv||_1 = 1 + d."""
    d = 1e-12
    ratio = get03(np.eye(2), (1 + d) * np.eye(2))
    assert ratio == pytest.approx(d / (1 + d) / 2 / EPS64, rel=1e-3)


def test_zero_norms_as_lapack():
    z = np.zeros((1, 3, 3))
    eye = np.eye(3)[None]
    piv = np.array([[0, 1, 2]])
    assert get01(z, z, piv) == 0
    assert get01(z, eye, piv) == 1 / EPS64
    assert get02(z, np.ones((1, 3)), np.zeros((1, 3))) == 1 / EPS64
    assert get02(eye, np.zeros((1, 3)), np.zeros((1, 3))) == 1 / EPS64
    assert get03(z, eye) == 1 / EPS64
    assert get03(eye, z) == 1 / EPS64


def test_empty():
    assert get01(np.zeros((4, 0, 0)), np.zeros((4, 0, 0)), np.zeros((4, 0), int)).shape == (4,)
    assert np.all(get02(np.zeros((2, 0, 0)), np.zeros((2, 0, 3)), np.zeros((2, 0, 3))) == 0)
    assert np.all(get02(np.eye(3)[None], np.zeros((1, 3, 0)), np.zeros((1, 3, 0))) == 0)
    assert get03(np.zeros((0, 5, 5)), np.zeros((0, 5, 5))).shape == (0,)


def test_non_finite_input_is_not_a_pass():
    a = np.eye(3)[None].copy()
    a[0, 1, 1] = np.nan
    piv = np.array([[0, 1, 2]])
    assert not get01(a, a, piv) < THRESHOLD
    assert not get03(a, a) < THRESHOLD
    assert not get02(a, np.ones((1, 3)), np.ones((1, 3))) < THRESHOLD


def test_eps_is_that_of_the_least_precise_input():
    """A float32 answer is judged at float32's epsilon even against a float64 matrix."""
    a = matrices.generate("random", 10, np.float64, seed=7, stop=4)
    ainv32 = np.linalg.inv(a.astype(np.float32))
    assert get03(a, ainv32).max() < THRESHOLD
    assert get03(a, ainv32.astype(np.float64)).max() > THRESHOLD


@pytest.mark.parametrize("call", [
    lambda: get01(np.zeros((2, 3, 4)), np.zeros((2, 3, 4)), np.zeros((2, 3), int)),
    lambda: get01(np.zeros((2, 3, 3)), np.zeros((2, 3, 3)), np.zeros((2, 4), int)),
    lambda: get01(np.zeros((2, 3, 3)), np.zeros((1, 3, 3)), np.zeros((2, 3), int)),
    lambda: get02(np.zeros((2, 3, 3)), np.zeros((2, 3)), np.zeros((2, 4))),
    lambda: get02(np.zeros((2, 3, 3)), np.zeros((2, 4)), np.zeros((2, 4))),
    lambda: get03(np.zeros((2, 3, 3)), np.zeros((2, 2, 2))),
    lambda: get03(np.zeros(3), np.zeros(3)),
])
def test_shape_errors(call):
    with pytest.raises(ValueError, match="Expected .* Got .* instead"):
        call()


def test_integer_input_is_refused():
    with pytest.raises(TypeError, match="Expected"):
        get03(np.eye(3, dtype=int), np.eye(3))


# ---- slogdet -------------------------------------------------------------------------------------

def _slogdet(a, dtype):
    """numpy's slogdet in float64/complex128, returned in ``dtype`` (sign) and its real type."""
    sign, logabsdet = np.linalg.slogdet(a.astype(np.complex128 if np.dtype(dtype).kind == "c" else np.float64))
    return sign.astype(dtype), logabsdet.astype(np.finfo(dtype).dtype)


def _kappa(a):
    """||A o A^-T||_F per matrix, in float64/complex128: the first-order sensitivity of log det."""
    wide = a.astype(np.complex128 if a.dtype.kind == "c" else np.float64)
    return np.linalg.norm(wide * np.swapaxes(np.linalg.inv(wide), -1, -2), axis=(-2, -1))


@pytest.mark.parametrize("n", [1, 3, 12, 33, 128])
def test_slogdet_ratios_right_and_wrong(dtype, n):
    """Right answers pass. A wrong sign (-sign real, sign * 1j complex) and a complex sign of modulus
    1 + 1e-3 (1e-9 in double) fail for every matrix. logabsdet off by 100 n eps fails for every matrix
    that is not near-singular (kappa <= n: 70-98% of random ones); for the others a correct LU's own
    error reaches kappa eps, so so small an offset cannot be told from it."""
    a = matrices.generate("random", n, dtype, seed=103 + n, stop=60)
    sign, logabsdet = _slogdet(a, dtype)
    eps = np.finfo(dtype).eps
    right = slogdet_ratios(a, sign, logabsdet)
    for r in right:
        assert r.dtype == np.float64 and r.shape == (60,) and r.max() < THRESHOLD
    wrong_sign = sign * 1j if np.dtype(dtype).kind == "c" else -sign
    assert slogdet_ratios(a, wrong_sign, logabsdet).sign.min() > THRESHOLD
    if np.dtype(dtype).kind == "c":
        stretched = sign * np.finfo(dtype).dtype.type(1 + (1e-3 if dtype == np.complex64 else 1e-9))
        assert slogdet_ratios(a, stretched, logabsdet).modulus.min() > THRESHOLD
    if n >= 3:  # (n = 1: the unit is |log|a||, tested by hand below)
        off = slogdet_ratios(a, sign, logabsdet + np.finfo(dtype).dtype.type(100 * n * eps)).logabsdet
        regular = _kappa(a) <= n
        assert regular.mean() >= 0.7 and off[regular].min() > THRESHOLD


def test_slogdet_ratios_hand_computed():
    """[[0, 2], [3, 0]]: det -6 (one interchange). logabsdet off by d gives d / (eps (max(n, L) + kappa))
    with L = log 2 + log 3 < n = 2 and kappa = ||A o A^-T||_F = sqrt(2)."""
    a = np.array([[0.0, 2.0], [3.0, 0.0]])
    r = slogdet_ratios(a, np.float64(-1), np.log(6.0))
    assert r.logabsdet == 0 and r.sign == 0 and r.modulus == 0
    d = 1e-13
    assert slogdet_ratios(a, np.float64(-1), np.log(6.0) + d).logabsdet == pytest.approx(
        d / EPS64 / (2 + np.sqrt(2)), rel=1e-3)
    assert slogdet_ratios(a, np.float64(1), np.log(6.0)).sign == pytest.approx(2 / EPS64 / (2 + np.sqrt(2)))
    assert slogdet_ratios(a, np.float64(-0.5), np.log(6.0)).modulus == 1 / EPS64  # real: exactly +-1
    c = np.array([[1j, 0], [0, 2]])  # det 2j
    assert slogdet_ratios(c, np.complex128(1j), np.log(2.0)).sign < 1e-3


def test_slogdet_ratios_scale_with_log_det():
    """diag(1e+-300 k), n = 8: log|det| ~ +-5520, whose ulp is 4096 eps; one ulp off passes (the unit
    follows L = sum |log|u_ii||), ten thousand ulps off do not."""
    a = np.diag(1e300 * np.arange(1.0, 9.0))
    exact = np.sum(np.log(1e300 * np.arange(1.0, 9.0)))
    assert slogdet_ratios(a, np.float64(1), np.nextafter(exact, np.inf)).logabsdet < 1
    assert slogdet_ratios(a, np.float64(1), exact + 1e4 * np.spacing(exact)).logabsdet > THRESHOLD
    tiny = 1e-300 * np.arange(1.0, 9.0)
    exact = np.sum(np.log(tiny))
    assert slogdet_ratios(np.diag(tiny), np.float64(1), np.nextafter(exact, -np.inf)).logabsdet < 1
    assert slogdet_ratios(np.diag(tiny), np.float64(1), exact - 1e4 * np.spacing(-exact)).logabsdet > THRESHOLD


def _slogdet_by_lapack_lu(a):
    """sign and log|det| from LAPACK's LU in the precision of ``a`` (numpy.linalg.slogdet would work in
    double even for float32); the logarithms added in float64."""
    lu, piv = scipy.linalg.lu_factor(a)
    d = np.diagonal(lu, axis1=-2, axis2=-1)
    swaps = np.count_nonzero(piv != np.arange(a.shape[-1]), axis=-1)
    sign = np.prod(d / np.abs(d), axis=-1) * np.where(swaps % 2, -1, 1)
    return sign.astype(a.dtype), np.log(np.abs(d).astype(np.float64)).sum(-1)


def test_slogdet_ratios_reference_is_double_precision():
    """Judged at double's epsilon (answers given in float64), a float32 matrix's determinant from a
    double LU passes and the one from a single-precision LU does not: the reference is float64."""
    a = matrices.generate("illcond", 33, np.float32, seed=104, stop=4)
    sign, logabsdet = np.linalg.slogdet(a.astype(np.float64))
    assert max(r.max() for r in slogdet_ratios(a, sign, logabsdet)) < THRESHOLD
    sign32, log32 = _slogdet_by_lapack_lu(a)
    assert slogdet_ratios(a, sign32.astype(np.float64), log32).logabsdet.min() > THRESHOLD


@pytest.mark.parametrize("n", [3, 8, 12])
def test_slogdet_ratios_condition_counts_near_singularity(n):
    """Near-singular matrices (cond 1e5 in float32): LAPACK's single-precision LU errs by far more than
    30 (max(n, L)) eps, as theory allows (about kappa eps); kappa in the unit lets it pass."""
    a = matrices.generate("illcond", n, np.float32, seed=105, stop=20)
    sign, logabsdet = _slogdet_by_lapack_lu(a)
    r = slogdet_ratios(a, sign, logabsdet.astype(np.float32))
    assert r.logabsdet.max() < THRESHOLD and r.sign.max() < THRESHOLD
    lu, _ = scipy.linalg.lu_factor(a.astype(np.float64))
    scale = np.maximum(n, np.abs(np.log(np.abs(np.diagonal(lu, axis1=-2, axis2=-1)))).sum(-1))
    error = np.abs(logabsdet - np.linalg.slogdet(a.astype(np.float64))[1])
    assert (error / (np.finfo(np.float32).eps * scale)).max() > 3 * THRESHOLD


def test_slogdet_ratios_special_cases():
    empty = slogdet_ratios(np.zeros((3, 0, 0)), np.ones(3), np.zeros(3))
    assert all(r.shape == (3,) and (r == 0).all() for r in empty)
    assert slogdet_ratios(np.zeros((1, 0, 0)), np.ones(1), np.ones(1)).logabsdet[0] > THRESHOLD
    # exactly singular in float64 (a float32 LU may see it regular): any finite answer is a backward-
    # stable one; a NaN one is not
    singular = np.array([[1.0, 2.0], [2.0, 4.0]], np.float32)
    assert slogdet_ratios(singular, np.float32(1), np.float32(-20)).logabsdet == 0
    assert not slogdet_ratios(singular, np.float32(1), np.float32(np.nan)).logabsdet < THRESHOLD
    nan = np.array([[1.0, np.nan], [0.0, 1.0]])
    assert not slogdet_ratios(nan, np.float64(1), np.float64(0)).logabsdet < THRESHOLD
    with pytest.raises(ValueError, match="Expected sign of shape"):
        slogdet_ratios(np.eye(3)[None], np.ones(2), np.zeros(1))


@pytest.mark.parametrize("dtype", ["float64", "complex128"])
@pytest.mark.parametrize("scale", [1e-308, 1e300])
def test_slogdet_ratios_hold_at_any_scale(dtype, scale):
    """A regular matrix times 1e-308 (U's diagonal would be subnormal, the inverse for kappa
    infinite) or 1e300: the exact sign and log|det| (from the unscaled matrix) pass, a log|det| off
    by 1e-9 fails."""
    a0 = matrices.generate("random", 6, dtype, seed=8, start=0, stop=5)
    sign, log0 = np.linalg.slogdet(a0)
    log = log0 + 6 * np.log(scale)
    r = slogdet_ratios(a0 * scale, sign, log)
    assert max(r.logabsdet.max(), r.sign.max(), r.modulus.max()) < THRESHOLD
    assert slogdet_ratios(a0 * scale, sign, log + 1e-9).logabsdet.min() > THRESHOLD


# ---- the ends of float64's range: right answers pass, wrong ones fail, nothing is NaN ---------------

def _times_pow2(x, k):
    """``x * 2^k``, exact unless it over- or underflows (complex: part by part)."""
    return np.ldexp(x.real, k) + 1j * np.ldexp(x.imag, k) if x.dtype.kind == "c" else np.ldexp(x, k)


@pytest.mark.parametrize("dtype", ["float64", "complex128"])
@pytest.mark.parametrize("scale", [1e-308, 1e308])
def test_ratios_hold_at_the_ends_of_the_range(dtype, scale):
    """Matrices times 1e-308 (||A^-1||_1 overflows) or 1e308 (||A||_1 overflows): inverses, LU factors
    and solutions computed on the matrix brought to unit scale by 2^1023 (so correct to rounding)
    pass; halved ones fail. Before, an infinite norm made every ratio 0 (or NaN): a halved inverse
    of a matrix times 1e-308 passed get03, and halved factors or solutions of one times 1e308 passed
    get01 and get02."""
    k = 1023 if scale > 1 else -1023                           # a2 = a * 2^-k is of unit scale
    a = matrices.generate("random", 4, dtype, seed=3, stop=40) * scale
    b = matrices.rhs(4, 2, dtype, seed=4, stop=40) * (scale if scale > 1 else 1)
    a2 = _times_pow2(a, -k)
    kb = k if scale > 1 else 0
    with np.errstate(all="ignore"):
        ainv = _times_pow2(np.linalg.inv(a2), -k)
        lu2, piv = _factor(a2)
        lu = np.tril(lu2, -1) + _times_pow2(np.triu(lu2), k)
        x = _times_pow2(np.linalg.solve(a2, _times_pow2(b, -kb)), kb - k)
        overflowed = {"inv": np.isinf(np.abs(ainv).sum(-2).max(-1)), "a": np.isinf(np.abs(a).sum(-2).max(-1))}
    assert (overflowed["inv"] if scale < 1 else overflowed["a"]).sum() >= 5  # the case at hand
    cases = {"get03": (get03, (a, ainv), 1), "get01": (get01, (a, lu, piv), 1), "get02": (get02, (a, x, b), 1)}
    for name, (ratio, args, wrong_at) in cases.items():
        result = args[wrong_at]
        ok = np.isfinite(result).reshape(len(a), -1).all(-1)
        assert ok.sum() >= 5, name
        picked = tuple(arg[ok] for arg in args)
        right = ratio(*picked)
        halved = ratio(*picked[:wrong_at], picked[wrong_at] / 2, *picked[wrong_at + 1:])
        assert right.max() < THRESHOLD, (name, right)
        assert halved.min() > THRESHOLD and not np.isnan(halved).any(), (name, halved)


def test_a_non_finite_operand_gives_nan():
    """NaN or Inf in any operand of a matrix: its ratio is NaN (never a pass), the others unchanged."""
    a = matrices.generate("random", 3, np.float64, seed=9, stop=2)
    b = matrices.rhs(3, 2, np.float64, seed=10, stop=2)
    ainv, (lu, piv), x = np.linalg.inv(a), _factor(a), np.linalg.solve(a, b)
    for value in (np.nan, np.inf, -np.inf):
        for ratio, args in ((get03, [a, ainv]), (get01, [a, lu, piv]), (get02, [a, x, b])):
            for at in range(len(args)):
                if args[at].dtype.kind != "f":
                    continue
                bad = [arg.copy() for arg in args]
                bad[at][1].reshape(-1)[-1] = value
                got = ratio(*bad)
                assert np.isnan(got[1]) and got[0] < THRESHOLD, (ratio.__name__, at, value, got)


def test_ratios_of_a_batch_mixing_scales():
    """Unit-scale matrices and ones times 1e-308 in one batch (scaled together, as the batch needs):
    every right inverse passes, every halved one fails."""
    a0 = matrices.generate("random", 4, np.float64, seed=11, stop=40)
    tiny = a0 * 1e-308
    with np.errstate(all="ignore"):
        inv_tiny = np.ldexp(np.linalg.inv(np.ldexp(tiny, 1023)), 1023)
    keep = np.isfinite(inv_tiny).all(axis=(-2, -1))
    assert keep.sum() >= 5
    a = np.concatenate([a0, tiny[keep]])
    ainv = np.concatenate([np.linalg.inv(a0), inv_tiny[keep]])
    assert get03(a, ainv).max() < THRESHOLD
    assert get03(a, ainv / 2).min() > THRESHOLD
