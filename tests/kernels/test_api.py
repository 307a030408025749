"""The public ``kernels`` API on NumPy arrays: every dtype and size, LAPACK's test ratios, SciPy's
pivots, shapes and dtypes of every result, and the argument errors."""

from __future__ import annotations

import re
import zlib

import numpy as np
import pytest
import scipy.linalg

import batchlu.errors
from batchlu import kernels
from batchlu.testing import matrices
from batchlu.testing.ratios import THRESHOLD, get01, get02, get03, slogdet_ratios

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
SIZES = [1, 2, 3, 8, 33, 64, 128]


def _seed(*key) -> int:
    return zlib.crc32(repr(key).encode())


def _batch_shape(n: int) -> tuple:
    """Leading dimensions for a test batch: two of them for small n, one for large n (speed)."""
    return (2, 3) if n <= 33 else (3,)


def _random(n, dtype, batch, *key):
    count = int(np.prod(batch, dtype=np.int64))
    a = matrices.generate("random", n, dtype, seed=_seed("a", n, np.dtype(dtype).name, *key), stop=count)
    return a.reshape(batch + (n, n))


def _rhs(n, k, dtype, batch, *key):
    count = int(np.prod(batch, dtype=np.int64))
    b = matrices.rhs(n, k, dtype, seed=_seed("b", n, k, np.dtype(dtype).name, *key), stop=count)
    return b.reshape(batch + b.shape[1:])


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_lu_factor(dtype, n):
    batch = _batch_shape(n)
    a = _random(n, dtype, batch)
    a_before = a.copy()
    lu, piv, info = kernels.lu_factor(a)
    assert lu.dtype == dtype and lu.shape == a.shape and lu.flags.c_contiguous
    assert piv.dtype == np.int32 and piv.shape == batch + (n,)
    assert info.dtype == np.int32 and info.shape == batch
    assert np.array_equal(a, a_before), "the input was modified"
    assert np.all(info == 0)
    assert np.isfinite(lu).all()
    ratio = get01(a, lu, piv)
    assert ratio.shape == batch
    assert ratio.max() < THRESHOLD, ratio
    for index in np.ndindex(*batch):
        _, ref_piv = scipy.linalg.lu_factor(a[index])
        np.testing.assert_array_equal(piv[index], ref_piv, err_msg=f"pivots of matrix {index}")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [None, 1, 4])
def test_lu_solve(dtype, n, k):
    batch = _batch_shape(n)
    a = _random(n, dtype, batch, k)
    b = _rhs(n, k, dtype, batch)
    b_before = b.copy()
    lu, piv, _ = kernels.lu_factor(a)
    x = kernels.lu_solve(lu, piv, b)
    assert x.dtype == dtype and x.shape == b.shape
    assert np.array_equal(b, b_before), "b was modified"
    assert np.isfinite(x).all()
    ratio = get02(a, x, b)
    assert ratio.shape == batch and ratio.max() < THRESHOLD, ratio


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [None, 1, 4])
def test_solve(dtype, n, k):
    batch = _batch_shape(n)
    a = _random(n, dtype, batch, "solve", k)
    b = _rhs(n, k, dtype, batch, "solve")
    x, info = kernels.solve(a, b)
    assert x.dtype == dtype and x.shape == b.shape
    assert info.dtype == np.int32 and info.shape == batch and np.all(info == 0)
    assert np.isfinite(x).all()
    ratio = get02(a, x, b)
    assert ratio.max() < THRESHOLD, ratio


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_inv(dtype, n):
    batch = _batch_shape(n)
    a = _random(n, dtype, batch, "inv")
    ainv, info = kernels.inv(a)
    assert ainv.dtype == dtype and ainv.shape == a.shape and ainv.flags.c_contiguous
    assert info.dtype == np.int32 and info.shape == batch and np.all(info == 0)
    assert np.isfinite(ainv).all()
    ratio = get03(a, ainv)
    assert ratio.max() < THRESHOLD, ratio


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["random", "illcond"])
def test_slogdet(dtype, n, kind):
    """sign and log|det| against a float64/complex128 LU, in units of n eps (the condition counts only
    for near-singular matrices: :func:`batchlu.testing.ratios.slogdet_ratios`)."""
    batch = _batch_shape(n)
    count = int(np.prod(batch))
    a = matrices.generate(kind, n, dtype, seed=_seed("slogdet", kind, n, np.dtype(dtype).name),
                          stop=count).reshape(batch + (n, n))
    sign, logabsdet, info = kernels.slogdet(a)
    real = np.finfo(dtype).dtype
    assert sign.dtype == dtype and sign.shape == batch
    assert logabsdet.dtype == real and logabsdet.shape == batch
    assert info.dtype == np.int32 and info.shape == batch and np.all(info == 0)
    for name, ratio in slogdet_ratios(a, sign, logabsdet)._asdict().items():
        assert ratio.shape == batch and ratio.max() < THRESHOLD, (name, ratio)


@pytest.mark.parametrize("dtype", DTYPES)
def test_single_matrix_without_batch_axes(dtype):
    a = _random(5, dtype, ())
    lu, piv, info = kernels.lu_factor(a)
    assert lu.shape == (5, 5) and piv.shape == (5,) and info.shape == ()
    assert get01(a, lu, piv) < THRESHOLD
    ainv, info = kernels.inv(a)
    assert ainv.shape == (5, 5) and info.shape == () and get03(a, ainv) < THRESHOLD
    b = _rhs(5, None, dtype, ())
    x, info = kernels.solve(a, b)
    assert x.shape == (5,) and get02(a, x, b) < THRESHOLD
    sign, logabsdet, info = kernels.slogdet(a)
    assert sign.shape == () and logabsdet.shape == () and info.shape == ()


def test_three_leading_axes():
    a = _random(4, np.float64, (2, 1, 3))
    lu, piv, info = kernels.lu_factor(a)
    assert lu.shape == (2, 1, 3, 4, 4) and piv.shape == (2, 1, 3, 4) and info.shape == (2, 1, 3)
    assert get01(a, lu, piv).max() < THRESHOLD


def test_non_contiguous_input():
    """Fortran-ordered and strided views are accepted; results are C-contiguous."""
    base = _random(6, np.float64, (4,), "strided")
    a = np.asfortranarray(base)[::2]
    ainv, info = kernels.inv(a)
    assert ainv.flags.c_contiguous and np.all(info == 0)
    assert get03(a, ainv).max() < THRESHOLD
    at = np.swapaxes(base, -1, -2)
    lu, piv, _ = kernels.lu_factor(at)
    assert get01(at, lu, piv).max() < THRESHOLD


def test_solve_mixed_dtypes_computes_in_the_result_type():
    a = _random(7, np.float32, (3,), "mixed")
    b = _rhs(7, 2, np.complex128, (3,), "mixed")
    x, info = kernels.solve(a, b)
    assert x.dtype == np.complex128 and np.all(info == 0)
    assert get02(a.astype(np.complex128), x, b).max() < THRESHOLD


def test_python_lists_are_accepted():
    lu, piv, info = kernels.lu_factor([[0.0, 2.0], [3.0, 1.0]])
    assert lu.dtype == np.float64 and info == 0
    np.testing.assert_array_equal(piv, [1, 1])


# ---- empty inputs ------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(0, 0), (3, 0, 0), (0, 4, 4), (2, 0, 3, 3)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_empty(dtype, shape):
    a = np.zeros(shape, dtype)
    n, batch = shape[-1], shape[:-2]
    lu, piv, info = kernels.lu_factor(a)
    assert lu.shape == shape and lu.dtype == dtype
    assert piv.shape == batch + (n,) and piv.dtype == np.int32
    assert info.shape == batch and info.dtype == np.int32 and np.all(info == 0)
    ainv, info = kernels.inv(a)
    assert ainv.shape == shape and ainv.dtype == dtype and info.shape == batch
    b = np.zeros(batch + (n, 2), dtype)
    x, info = kernels.solve(a, b)
    assert x.shape == b.shape and x.dtype == dtype and info.shape == batch
    assert kernels.lu_solve(lu, piv, b[..., 0]).shape == batch + (n,)
    sign, logabsdet, info = kernels.slogdet(a)
    assert sign.shape == batch and sign.dtype == dtype
    assert logabsdet.shape == batch and logabsdet.dtype == np.finfo(dtype).dtype
    if n == 0:  # det of a 0 x 0 matrix is 1, as in NumPy
        assert np.all(sign == 1) and np.all(logabsdet == 0)


def test_solve_with_zero_right_hand_sides_still_reports_info():
    a = _random(3, np.float64, (4,), "k0")
    a[2] = 0
    x, info = kernels.solve(a, np.zeros((4, 3, 0)))
    assert x.shape == (4, 3, 0)
    np.testing.assert_array_equal(info, [0, 0, 1, 0])


# ---- check=True ----------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["lu_factor", "inv", "solve", "slogdet"])
def test_check_names_the_first_bad_index(op):
    a = _random(4, np.float64, (2, 3), "check", op)
    a[1, 2] = 0          # singular: info 1
    a[1, 0, 2, 1] = np.nan   # non-finite: info -1, and first in C order
    args = (a, _rhs(4, None, np.float64, (2, 3))) if op == "solve" else (a,)
    with pytest.raises(np.linalg.LinAlgError, match=re.escape("(1, 0)")) as err:
        getattr(kernels, op)(*args, check=True)
    assert "NaN or Inf" in str(err.value) and "2 bad matrices" in str(err.value)
    a[1, 0, 2, 1] = 1.0
    with pytest.raises(np.linalg.LinAlgError, match=re.escape("(1, 2)")) as err:
        getattr(kernels, op)(*args, check=True)
    assert "singular" in str(err.value)
    assert isinstance(err.value, batchlu.errors.BatchluError)   # batchlu's hierarchy, NumPy's class too
    a[1, 2] = _random(4, np.float64, (), "check-ok")
    result = getattr(kernels, op)(*args, check=True)
    assert np.all(result[-1] == 0)


def test_check_is_off_by_default():
    a = np.zeros((3, 2, 2))
    _, _, info = kernels.lu_factor(a)
    np.testing.assert_array_equal(info, [1, 1, 1])


# ---- argument errors ---------------------------------------------------------------------------

def _expected_got(err) -> None:
    text = str(err.value)
    assert "Expected" in text and "Got" in text, text


@pytest.mark.parametrize("op", ["lu_factor", "inv", "slogdet"])
@pytest.mark.parametrize("shape", [(3,), (), (3, 4), (2, 3, 2)])
def test_bad_matrix_shape(op, shape):
    with pytest.raises(ValueError) as err:
        getattr(kernels, op)(np.ones(shape))
    _expected_got(err)
    assert str(tuple(shape)) in str(err.value)


@pytest.mark.parametrize("bshape", [(2, 4), (3, 5), (2, 3, 5), (3, 4, 2, 1), (4,), (3, 3, 4)])
def test_solve_bad_rhs_shape(bshape):
    a = _random(4, np.float64, (3,), "bshape")
    with pytest.raises(ValueError) as err:
        kernels.solve(a, np.ones(bshape))
    _expected_got(err)
    lu, piv, _ = kernels.lu_factor(a)
    with pytest.raises(ValueError) as err:
        kernels.lu_solve(lu, piv, np.ones(bshape))
    _expected_got(err)


@pytest.mark.parametrize("pshape", [(3,), (3, 5), (4, 4), (3, 4, 1)])
def test_lu_solve_bad_piv_shape(pshape):
    lu, _, _ = kernels.lu_factor(_random(4, np.float64, (3,), "pshape"))
    with pytest.raises(ValueError) as err:
        kernels.lu_solve(lu, np.zeros(pshape, np.int32), np.ones((3, 4)))
    _expected_got(err)


def test_lu_solve_piv_out_of_range():
    lu, piv, _ = kernels.lu_factor(_random(4, np.float64, (3,), "prange"))
    piv[1, 2] = 4
    with pytest.raises(ValueError) as err:
        kernels.lu_solve(lu, piv, np.ones((3, 4)))
    _expected_got(err)


@pytest.mark.parametrize("bad", [2**32 + 1, -(2**32) + 2, 2**63 - 1])
def test_lu_solve_piv_out_of_int32_range(bad):
    """An int64 piv beyond int32 is out of range, not wrapped into it (2**32 + 1 became 1)."""
    lu, piv, _ = kernels.lu_factor(_random(4, np.float64, (3,), "pwide"))
    wide = piv.astype(np.int64)
    wide[1, 2] = bad
    with pytest.raises(ValueError, match=r"piv values in \[0, 4\)") as err:
        kernels.lu_solve(lu, wide, np.ones((3, 4)))
    _expected_got(err)


def test_lu_solve_float_piv():
    lu, piv, _ = kernels.lu_factor(_random(4, np.float64, (3,), "pfloat"))
    with pytest.raises(TypeError) as err:
        kernels.lu_solve(lu, piv.astype(np.float64), np.ones((3, 4)))
    _expected_got(err)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float16, np.bool_, np.uint8, np.longdouble])
@pytest.mark.parametrize("op", ["lu_factor", "inv", "slogdet", "solve"])
def test_unsupported_dtype(op, dtype):
    a = np.eye(3, dtype=dtype)[None]
    args = (a, np.ones((1, 3), dtype)) if op == "solve" else (a,)
    with pytest.raises(TypeError) as err:
        getattr(kernels, op)(*args)
    _expected_got(err)
    for name in ("float32", "float64", "complex64", "complex128"):
        assert name in str(err.value)
    assert np.dtype(dtype).name in str(err.value)


@pytest.mark.parametrize("n", [7, 40, 400])   # the compiled substitution, and LAPACK's getrs above
@pytest.mark.parametrize("dtype", DTYPES)
def test_lu_solve_of_a_singular_matrix_gives_inf_or_nan_in_its_own_x(dtype, n, cpu_engine):
    """A zero pivot (U[1, 1] = 0) divides by zero in its own x only: no exception (numba's complex
    division raised ZeroDivisionError), its neighbours' x unchanged and backward stable."""
    a = matrices.generate("random", n, dtype, seed=n, start=0, stop=6)
    a[3, :, 1] = 0
    b = matrices.rhs(n, 3, dtype, seed=n + 1, start=0, stop=6)
    lu, piv, info = kernels.lu_factor(a)
    assert info[3] > 0 and (np.delete(info, 3) == 0).all()
    x = kernels.lu_solve(lu, piv, b)
    assert x.shape == b.shape and x.dtype == dtype
    assert not np.isfinite(x[3]).all()
    good = np.delete(np.arange(6), 3)
    alone = kernels.lu_solve(lu[good], piv[good], b[good])
    assert x[good].tobytes() == alone.tobytes()
    assert get02(a[good], x[good], b[good]).max() < THRESHOLD
