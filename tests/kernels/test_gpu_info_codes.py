"""``info`` -2 (INFO_NONFINITE_RESULT) on the GPU: ``kernels`` on CuPy arrays flags a finite matrix
whose result overflows, for every op and dtype and the kernel paths picked by n (inverse: fused
Gauss-Jordan and getrf + getri; solve: gesv_rows and getrf + getrs; getrf: small, rows, blocked);
the outputs are the raw kernels' bit for bit, every element written (the CuPy memory pool is
poisoned with two byte patterns and the runs agree bit for bit); a NaN/Inf right-hand side makes
``solve``'s input non-finite (-1, all-NaN x). The check runs on the caller's stream.
Run on a machine with a CUDA GPU: ``pytest -m gpu tests/kernels/test_gpu_info_codes.py``."""

from __future__ import annotations

import numpy as np
import pytest

from batchlu import kernels
from batchlu.testing import matrices
from batchlu.testing.ratios import THRESHOLD, get01, get02, get03

from _overflow import GROUP, check_codes, check_near_max, expected_info, finite, overflow_batch, same

pytestmark = pytest.mark.gpu

try:
    import cupy
except ImportError:  # the gpu marker skips these tests (fails them under BATCHLU_REQUIRE_GPU=1), saying why
    cupy = None

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
SIZES = [6, 16, 40, 100]          # small / rows / rows or fused / blocked getrf and getri
POISON_BYTES = (0xFF, 0x7B)       # NaN in every float type / a large finite float, -1 / 2071690107 in int32


def _poison_pool(byte: int) -> None:
    """Fill CuPy's pool with one block of ``byte``: the arrays allocated next are carved out of it."""
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    junk = cupy.full(64 << 20, byte, dtype=cupy.uint8)
    cupy.cuda.Device().synchronize()
    del junk


def _api(op: str, *args):
    """``kernels.<op>`` on device copies of ``args``, twice with differently poisoned memory; the two
    runs must agree bit for bit (no element left unwritten); returns host arrays."""
    runs = []
    for byte in POISON_BYTES:
        _poison_pool(byte)
        device = [cupy.asarray(x) for x in args]
        out = getattr(kernels, op)(*device)
        runs.append(tuple(x.get() for x in out))
        for x, d in zip(args, device):
            assert same(d.get(), x), "the API changed its input"
    for first, second in zip(*runs):
        assert same(first, second), f"{op}: elements left unwritten (the result depends on the poison)"
    return runs[0]


def _overflows(dtype, raw_info, *raw) -> bool:
    """Whether -2 must occur on an overflow batch: always in double precision. In single precision
    the GPU kernels give the matrices of subnormal entries an exactly zero pivot (info k > 0) where
    LAPACK computes an overflowing result, so -2 occurs there only where the raw results overflow."""
    if np.finfo(dtype).bits == 64:
        return True
    return bool(((raw_info == 0) & ~np.logical_and.reduce([finite(x) for x in raw])).any())


def _raw(name: str, *args):
    """The GPU backend's entry point without the API's check: what the kernels wrote."""
    from batchlu.kernels import _gpu

    return tuple(x.get() for x in getattr(_gpu, name)(*(cupy.asarray(x) for x in args)))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_inv_flags_overflow(dtype, n):
    a = overflow_batch(n, dtype, seed=n)
    raw, raw_info = _raw("inv", a)
    ainv, info = _api("inv", a)
    assert ainv.dtype == np.dtype(dtype) and info.dtype == np.int32 and info.shape == (a.shape[0],)
    np.testing.assert_array_equal(info, expected_info(raw_info, raw))
    assert same(ainv, raw), "the outputs of a -2 matrix must be kept as computed"
    check_codes(info, a, ainv, overflow=_overflows(dtype, raw_info, raw))
    assert (info[:GROUP] == 0).all() and get03(a[:GROUP], ainv[:GROUP]).max() < THRESHOLD


@pytest.mark.parametrize("k", [None, 3, 16])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_solve_flags_overflow(dtype, n, k):
    a = overflow_batch(n, dtype, seed=n + 1)
    b = matrices.rhs(n, k, dtype, seed=n + 2, stop=a.shape[0])
    b3 = b[..., None] if k is None else b
    raw, raw_info = _raw("solve", a, b3)
    x, info = _api("solve", a, b)
    assert x.shape == b.shape and x.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(info, expected_info(raw_info, raw))
    assert same(x, raw.reshape(b.shape))
    check_codes(info, a, x, overflow=_overflows(dtype, raw_info, raw))
    assert get02(a[:GROUP], x[:GROUP], b[:GROUP]).max() < THRESHOLD


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_lu_factor_flags_overflow(dtype, n):
    a = overflow_batch(n, dtype, seed=n + 3)
    raw_lu, raw_piv, raw_info = _raw("getrf", a)
    lu, piv, info = _api("lu_factor", a)
    np.testing.assert_array_equal(info, expected_info(raw_info, raw_lu))
    assert same(lu, raw_lu) and same(piv, raw_piv)
    check_codes(info, a, lu, overflow=_overflows(dtype, raw_info, raw_lu))
    assert (info[:GROUP] == 0).all() and get01(a[:GROUP], lu[:GROUP], piv[:GROUP]).max() < THRESHOLD


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_slogdet_flags_overflow(dtype, n):
    a = overflow_batch(n, dtype, seed=n + 4)
    raw_sign, raw_log, raw_info = _raw("slogdet", a)
    sign, logabsdet, info = _api("slogdet", a)
    np.testing.assert_array_equal(info, expected_info(raw_info, raw_sign, raw_log))
    assert same(sign, raw_sign) and same(logabsdet, raw_log)
    check_codes(info, a, sign, logabsdet, overflow=_overflows(dtype, raw_info, raw_sign, raw_log))
    singular = info > 0
    assert singular.any() and (sign[singular] == 0).all() and (logabsdet[singular] == -np.inf).all()


def _call(op: str, *args):
    """``kernels.<op>`` on device copies of ``args`` (``_api``'s two poisoned runs but for
    ``lu_solve``); host results as a tuple."""
    if op == "lu_solve":
        return (kernels.lu_solve(*(cupy.asarray(x) for x in args)).get(),)
    return _api(op, *args)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_entries_near_the_largest_float_are_right_or_flagged(dtype, n):
    """The CPU's test (tests/kernels/test_info_codes.py) on the GPU's paths: entries near the largest
    float give right results with info 0, or -2 with non-finite ones. The CPU got both wrong: the
    reciprocal of a complex pivot with a part above half the largest float came out 0 (Smith's
    division forms |d|^2 / max(|re|, |im|), which overflows; kernels/cuda/common.cuh's ``recip_``
    and ``div_`` scale such a pivot by 1/8), and an inverse or solution from overflowed factors came out finite."""
    check_near_max(_call, n, dtype)


def test_issue_example_8x8_float64_scaled_by_1e_308():
    rng = np.random.default_rng(16)
    a = rng.uniform(-1, 1, (1000, 8, 8)) * 1e-308
    ainv, info = (x.get() for x in kernels.inv(cupy.asarray(a)))
    bad = ~np.isfinite(ainv).all(axis=(1, 2))
    np.testing.assert_array_equal(info == -2, bad & (info <= 0))  # an underflow to a zero pivot: k > 0
    assert (info == -2).sum() > 500 and (info[~bad] == 0).all()   # H100: 832 (the CPU: all 1,000)
    x, info = (v.get() for v in kernels.solve(cupy.asarray(a), cupy.asarray(rng.standard_normal((1000, 8)))))
    np.testing.assert_array_equal(info == -2, ~np.isfinite(x).all(axis=1) & (info <= 0))
    assert (info == -2).sum() > 500


@pytest.mark.parametrize("n, k", [(5, None), (5, 2), (100, 4)])   # gesv_rows and getrs
@pytest.mark.parametrize("dtype", DTYPES)
def test_solve_nonfinite_rhs_is_a_nonfinite_input(dtype, n, k):
    a = matrices.generate("random", n, dtype, seed=11, start=0, stop=8)
    b = matrices.rhs(n, k, dtype, seed=12, stop=8)
    b[2].flat[1] = np.nan
    b[5].flat[-1] = np.inf
    a[6, :, 1] = 0.0            # singular a, finite b: stays singular
    b[7].flat[0] = -np.inf
    a[7, 0, 0] = np.nan         # both non-finite: -1
    x, info = _api("solve", a, b)
    keep = [0, 1, 3, 4]
    clean, clean_info = _api("solve", a[keep], b[keep])
    assert info[[2, 5, 7]].tolist() == [-1, -1, -1] and info[6] > 0
    assert np.isnan(x[[2, 5, 6, 7]]).all()
    assert same(x[keep], clean) and (clean_info == 0).all() and (info[keep] == 0).all()


@pytest.mark.parametrize("op", ["lu_factor", "inv", "solve", "slogdet"])
def test_check_runs_on_the_callers_stream(op):
    """The API's check is ordered after the kernels on the stream given: same results as on the
    default stream."""
    a = overflow_batch(40, np.float64, seed=21)
    args = (a, matrices.rhs(40, 2, np.float64, seed=22, stop=a.shape[0])) if op == "solve" else (a,)
    want = _api(op, *args)
    device = [cupy.asarray(x) for x in args]
    stream = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.Device().synchronize()
    out = getattr(kernels, op)(*device, stream=stream)
    stream.synchronize()
    for got, expected in zip(out, want):
        assert same(got.get(), expected)
