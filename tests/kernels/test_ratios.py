"""LAPACK's test ratios: small for right answers, far past the threshold for wrong ones, exact on
hand-computed cases, LAPACK's handling of zero norms, and the epsilon of the least precise input."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from batchlu.testing import matrices
from batchlu.testing.ratios import THRESHOLD, get01, get02, get03

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
