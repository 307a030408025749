"""``info`` -2 (INFO_NONFINITE_RESULT) on the CPU backend: a finite matrix whose result overflows is
flagged, never reported as 0, for every op, dtype and both CPU engines, on each path of theirs
forced in turn (``PATHS``: the engines' own LU, the compiled engine's lane LU, LAPACK, and the
crossover tables as shipped; the path fixture checks that the path it names ran); a right-hand side
holding NaN or Inf makes ``solve``'s input non-finite (-1); entries near the largest float give
results that are right or flagged.

Issue 16, item 4: 8x8 float64 matrices scaled by 1e-308 gave inf/NaN inverses with info 0.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from batchlu import kernels
from batchlu.kernels import _cpu, _cpu_lapack, _cpu_vectorised
from batchlu.testing import matrices
from batchlu.testing.ratios import THRESHOLD, get01, get02, get03

from _overflow import GROUP, check_codes, check_near_max, expected_info, finite, overflow_batch, same

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
# name: (n, _cpu.LAPACK_MIN_N, _cpu.LANES_MIN_N). The tables pick a path by n, dtype and op, and move
# with measurements (n = 40 is the lane LU, not LAPACK, for getrf and slogdet): each path is forced.
PATHS = {
    "own-lu": (6, 1 << 30, None),   # compiled: xGETF2 and substitutions in numba; NumPy: the vectorised LU
    "lane-lu": (16, None, 1),       # compiled only: getrf and slogdet on the lane LU (the rest by the tables)
    "lapack": (16, 1, None),        # LAPACK (compiled: through function pointers; NumPy: SciPy's wrappers)
    "tables": (40, None, None),     # the crossover tables as shipped
}


class _PoisonedNumpy:
    """``numpy`` inside the CPU backend with fresh buffers full of NaN (-7 for integers): an output
    element left unwritten would read as a non-finite result."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def _poison(dtype):
        return np.nan if np.dtype(dtype).kind in "fc" else -7

    def empty(self, shape, dtype=float, *args, **kwargs):
        return np.full(shape, self._poison(dtype), dtype)

    def empty_like(self, x, dtype=None, *args, **kwargs):
        return np.full(np.shape(x), self._poison(dtype or x.dtype), dtype or x.dtype)


@pytest.fixture
def poisoned(monkeypatch, cpu_engine):
    """Poisoned buffers, on each CPU engine in turn (the compiled one's outputs are allocated in
    ``_cpu`` too)."""
    for module in (_cpu, _cpu_lapack, _cpu_vectorised):
        monkeypatch.setattr(module, "np", _PoisonedNumpy())


class _Path:
    """A path of ``PATHS`` forced on the engine, and the kernels that ran while it was (``taken``:
    "own", "lanes", "lapack")."""

    def __init__(self, name: str, engine: str):
        self.name, self.engine, self.n, self.taken = name, engine, PATHS[name][0], set()

    def spy(self, module, attribute: str, label: str, monkeypatch) -> None:
        inner = getattr(module, attribute)

        def run(*args):
            self.taken.add(label)
            return inner(*args)
        monkeypatch.setattr(module, attribute, run)

    def check(self, op: str) -> None:
        """The path named ran for ``op`` (getrf, inv, solve, slogdet)."""
        want = {"own-lu": "own", "lapack": "lapack"}.get(self.name)
        if self.name == "lane-lu" and op in ("getrf", "slogdet"):
            want = "lanes"
        if want is not None:
            assert want in self.taken, (self.name, op, self.taken)
        if self.name == "own-lu":
            assert self.taken == {"own"}, self.taken


@pytest.fixture(params=list(PATHS))
def path(request, monkeypatch, cpu_engine):
    """Each path of ``PATHS`` forced in turn, on each CPU engine (the NumPy one has no lane LU)."""
    name = request.param
    if name == "lane-lu" and cpu_engine == "numpy":
        pytest.skip("the NumPy engine has no lane LU")
    _, lapack_min_n, lanes_min_n = PATHS[name]
    monkeypatch.setattr(_cpu, "LAPACK_MIN_N", lapack_min_n)
    monkeypatch.setattr(_cpu, "LANES_MIN_N", lanes_min_n)
    chosen = _Path(name, cpu_engine)
    if cpu_engine == "compiled":
        from batchlu.kernels import _cpu_lanes, _cpu_numba

        run = _cpu_numba._run

        def spy_run(own, lapack_kernel, routines, n, lapack_min_n, *args):
            chosen.taken.add("lapack" if n >= lapack_min_n else "own")
            return run(own, lapack_kernel, routines, n, lapack_min_n, *args)
        monkeypatch.setattr(_cpu_numba, "_run", spy_run)
        for op in ("getrf", "slogdet"):
            chosen.spy(_cpu_lanes, op, "lanes", monkeypatch)
    else:
        chosen.spy(_cpu_lapack, "factor", "lapack", monkeypatch)
        chosen.spy(_cpu_vectorised, "factor", "own", monkeypatch)
    return chosen


@pytest.mark.parametrize("dtype", DTYPES)
def test_inv_flags_overflow(dtype, path, poisoned):
    a = overflow_batch(path.n, dtype)
    raw, raw_info = _cpu.inv(a.copy())
    ainv, info = kernels.inv(a)
    assert info.dtype == np.int32 and info.shape == (a.shape[0],)
    np.testing.assert_array_equal(info, expected_info(raw_info, raw))
    assert same(ainv, raw), "the outputs of a -2 matrix must be kept as computed"
    check_codes(info, a, ainv)
    plain = info[:GROUP] == 0
    assert plain.all() and get03(a[:GROUP], ainv[:GROUP]).max() < THRESHOLD
    path.check("inv")


@pytest.mark.parametrize("k", [None, 3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_solve_flags_overflow(dtype, path, k, poisoned):
    n = path.n
    a = overflow_batch(n, dtype, seed=5)
    b = matrices.rhs(n, k, dtype, seed=6, stop=a.shape[0])
    b3 = b[..., None] if k is None else b
    raw, raw_info = _cpu.solve(a.copy(), b3.copy())
    x, info = kernels.solve(a, b)
    assert x.shape == b.shape and x.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(info, expected_info(raw_info, raw))
    assert same(x, raw.reshape(b.shape))
    check_codes(info, a, x)
    assert get02(a[:GROUP], x[:GROUP], b[:GROUP]).max() < THRESHOLD
    path.check("solve")


@pytest.mark.parametrize("dtype", DTYPES)
def test_lu_factor_flags_overflow(dtype, path, poisoned):
    a = overflow_batch(path.n, dtype, seed=7)
    raw_lu, raw_piv, raw_info = _cpu.getrf(a.copy())
    lu, piv, info = kernels.lu_factor(a)
    np.testing.assert_array_equal(info, expected_info(raw_info, raw_lu))
    assert same(lu, raw_lu) and same(piv, raw_piv)
    check_codes(info, a, lu)
    assert (info[:GROUP] == 0).all() and get01(a[:GROUP], lu[:GROUP], piv[:GROUP]).max() < THRESHOLD
    path.check("getrf")


@pytest.mark.parametrize("dtype", DTYPES)
def test_slogdet_flags_overflow(dtype, path, poisoned):
    a = overflow_batch(path.n, dtype, seed=9)
    raw_sign, raw_log, raw_info = _cpu.slogdet(a.copy())
    sign, logabsdet, info = kernels.slogdet(a)
    np.testing.assert_array_equal(info, expected_info(raw_info, raw_sign, raw_log))
    assert same(sign, raw_sign) and same(logabsdet, raw_log)
    check_codes(info, a, sign, logabsdet)
    # singular matrices keep their code and their by-design outputs (sign 0, logabsdet -inf)
    singular = info > 0
    assert singular.any() and (sign[singular] == 0).all() and (logabsdet[singular] == -np.inf).all()
    path.check("slogdet")


def test_issue_example_8x8_float64_scaled_by_1e_308(cpu_engine):
    """The reproduction from the issue: 1,000 inverses, most of them not finite (all beyond
    float64's range but a few hundred), none of those reported ok; the finite ones are accurate.

    The compiled engine keeps a fifth of them finite (~780 flagged; with the NumPy engine, whose
    ``numpy.linalg.inv`` scales by the reciprocals of subnormal pivots, all 1,000)."""
    rng = np.random.default_rng(16)
    a = rng.uniform(-1, 1, (1000, 8, 8)) * 1e-308
    ainv, info = kernels.inv(a)
    bad = ~finite(ainv)
    assert bad.sum() > 700
    np.testing.assert_array_equal(info[bad], -2)
    assert (info[~bad] == 0).all()
    # inv(s a) = inv(a) / s: get03 in a range where its norms do not overflow (s a power of 2)
    s = 2.0 ** 1000
    if (~bad).any():
        assert get03(a[~bad] * s, ainv[~bad] / s).max() < THRESHOLD
    x, info = kernels.solve(a, rng.standard_normal((1000, 8)))
    np.testing.assert_array_equal(info == -2, ~finite(x))
    assert (info == -2).sum() > 500


@pytest.mark.parametrize("k", [None, 2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_solve_nonfinite_rhs_is_a_nonfinite_input(dtype, k, cpu_engine):
    """A NaN or Inf in b: info -1 and all-NaN x, as for a NaN in a; neighbours untouched."""
    n = 5
    a = matrices.generate("random", n, dtype, seed=11, start=0, stop=8)
    b = matrices.rhs(n, k, dtype, seed=12, stop=8)
    b[2].flat[1] = np.nan
    b[5].flat[-1] = np.inf
    a[6, :, 1] = 0.0            # singular a, finite b: stays singular
    b[7].flat[0] = -np.inf
    a[7, 0, 0] = np.nan         # both non-finite: -1
    x, info = kernels.solve(a, b)
    clean, clean_info = kernels.solve(a[[0, 1, 3, 4]], b[[0, 1, 3, 4]])
    assert info[[2, 5, 7]].tolist() == [-1, -1, -1] and info[6] > 0
    assert np.isnan(x[[2, 5, 6, 7]]).all()
    assert same(x[[0, 1, 3, 4]], clean) and (clean_info == 0).all() and (info[[0, 1, 3, 4]] == 0).all()
    with pytest.raises(np.linalg.LinAlgError, match=re.escape("(2,) holds NaN or Inf (it or its right-hand side)")):
        kernels.solve(a, b, check=True)


def test_check_names_a_nonfinite_result(cpu_engine):
    a = np.random.default_rng(3).uniform(-1, 1, (3, 4, 4))
    a[1] *= 1e-308
    with pytest.raises(np.linalg.LinAlgError, match=re.escape("(1,) is finite but its result is not")):
        kernels.inv(a, check=True)


def test_codes_are_named_in_the_public_api():
    assert (kernels.INFO_OK, kernels.INFO_NONFINITE_INPUT, kernels.INFO_NONFINITE_RESULT) == (0, -1, -2)


def test_solve_without_right_hand_sides_is_not_flagged_for_its_factors(cpu_engine):
    """k = 0: there is no x to overflow; info is the factorization's, never -2."""
    a = np.random.default_rng(4).uniform(-1, 1, (8, 4, 4)) * (np.finfo(np.float64).max * 0.9)
    _, _, lu_info = kernels.lu_factor(a)
    assert (lu_info == -2).any()
    _, _, raw_info = _cpu.getrf(a.copy())
    if _cpu.flags_results():   # the compiled engine's getrf flags its overflowed factors itself
        raw_info[raw_info == kernels.INFO_NONFINITE_RESULT] = kernels.INFO_OK
    assert not (raw_info == -2).any()
    x, info = kernels.solve(a, np.ones((8, 4, 0)))
    assert x.shape == (8, 4, 0)
    np.testing.assert_array_equal(info, raw_info)
    assert not (info == -2).any()


def _call(op: str, *args):
    """``kernels.<op>(*args)`` as a tuple."""
    out = getattr(kernels, op)(*args)
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("dtype", DTYPES)
def test_entries_near_the_largest_float_are_right_or_flagged(dtype, path, poisoned):
    """Fresh random matrices with entries near the largest float (1.7e308 in double precision;
    ``_overflow.near_max_batch``, the checks in ``check_near_max``): every result with info 0 is
    right, checked with LAPACK's ratios, and every other one is -2 with a non-finite result.

    The developers' note of issue 38: ``slogdet`` of complex128 entries near 1.7e308 gave info 0,
    logabsdet 4255.95 against an exact 4257.08 and a wrong sign. The reciprocal of a complex pivot
    with both parts above half the largest float came out 0 (Smith's division, in numba, NumPy and
    OpenBLAS alike, forms |d|^2 / max(|re|, |im|)): a column of L zero, U not eliminated, finite
    and wrong factors, for every op on every path (complex64 too, on NumPy's and LAPACK's). And in
    real and complex alike, an inverse or solution from factors that overflowed came out finite
    (1 / inf is 0) with info 0."""
    check_near_max(_call, path.n, dtype)
    for op in ("slogdet", "getrf", "inv", "solve"):
        path.check(op)


@pytest.mark.parametrize("dtype", DTYPES)
def test_inverse_and_solution_of_overflowed_factors_are_minus_two(dtype, path, poisoned):
    """Fresh random matrices whose LU overflows to an infinite pivot (a 2 x 2 block near the largest
    float, its Schur complement w - l y of one sign beyond it) beside a plain block: the inverse and
    the solution came out finite (1 / inf is 0) and wrong, with info 0. They are -2 and NaN; the
    factors and the determinant are -2 as computed; a solve without right-hand sides is not flagged."""
    n, count = path.n, 24
    rng = np.random.default_rng([40, n])
    top = float(np.finfo(dtype).max)
    a = np.zeros((count, n, n))
    a[:, 2:, 2:] = rng.uniform(-1, 1, (count, n - 2, n - 2)) + 4 * np.eye(n - 2)
    sign = rng.choice([-1.0, 1.0], (count, 2))
    x = rng.uniform(0.5, 0.9, count) * top * sign[:, 0]
    y = rng.uniform(0.7, 0.95, count) * top * sign[:, 1]
    a[:, 0, 0], a[:, 1, 0] = x, -x * rng.uniform(0.8, 1.0, count)          # pivot x, l in [-1, -0.8]
    a[:, 0, 1], a[:, 1, 1] = y, y * rng.uniform(0.7, 1.0, count)          # w - l y beyond the largest float
    a = a.astype(dtype)
    assert np.isfinite(a).all()
    b = matrices.rhs(n, None, dtype, seed=41, stop=count)

    for op, args in (("inv", (a,)), ("solve", (a, b))):
        *results, info = getattr(kernels, op)(*args)
        assert info.tolist() == [-2] * count, (op, info)
        assert np.isnan(results[0]).all(), op
    lu, _, info = kernels.lu_factor(a)
    assert info.tolist() == [-2] * count and not finite(lu).any()
    sign, logabsdet, info = kernels.slogdet(a)
    assert info.tolist() == [-2] * count and not np.isfinite(logabsdet).any()
    x, info = kernels.solve(a, np.ones((count, n, 0), dtype))
    assert x.shape == (count, n, 0) and (info == 0).all()
    for op in ("getrf", "inv", "solve", "slogdet"):
        path.check(op)
