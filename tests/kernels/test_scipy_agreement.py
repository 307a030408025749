"""What the README promises about ``lu`` against ``scipy.linalg.lu_factor``, checked as stated there:

* ``piv`` and ``info`` identical to SciPy's on random matrices, on both CPU engines and both sides
  of their crossovers (the compiled xGETF2 or the vectorised NumPy LU below, LAPACK from it on) and
  of the compiled engine's lane LU range (``_cpu.lanes_range("getrf", dtype)``); in float32 and
  complex64 a matrix's pivots may differ, but only at a step where LAPACK's own two largest
  candidates are a near tie, which rounding decides (seen at n = 256 with the lane LU);
* ``lu`` bit-identical to SciPy's where LAPACK runs: from the crossover
  (``_cpu.lapack_min_n("getrf", dtype)``) on, outside the lane LU range;
* elsewhere, ``lu`` equal to rounding: LAPACK's ``get01`` ratio under its threshold, as SciPy's own.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from batchlu import kernels
from batchlu.kernels import _cpu
from batchlu.testing import matrices
from batchlu.testing.ratios import THRESHOLD, get01

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
# Both sides of every engine's getrf crossover and of the lane LU's range, in every dtype
_CROSSOVERS = {_cpu.NUMPY_LAPACK_MIN_N, *_cpu.COMPILED_LAPACK_MIN_N["getrf"]}
_LANES = {n for first, last in _cpu.COMPILED_LANES_N["getrf"] for n in (first - 1, first, last, last + 1)}
SIZES = sorted({1, 2, 3, 4, 5, 8} | {c + d for c in _CROSSOVERS for d in (-1, 0, 3)} | _LANES)


def _scipy(a):
    pairs = [scipy.linalg.lu_factor(m, check_finite=False) for m in a]
    return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs]).astype(np.int32)


def _assert_near_tie(a, piv, ref_lu, ref_piv, msg):
    """At the first step where ``piv`` leaves LAPACK's, LAPACK's two largest candidates are within
    0.1% of each other, or within the rounding error of the Schur complement (4 n eps max|a|)."""
    k = int(np.flatnonzero(piv != ref_piv)[0])
    lu = ref_lu.astype(np.complex128)
    col = lu[k:, k] * lu[k, k]      # LAPACK's candidates at step k: L[i, k] U[k, k], U[k, k] first
    col[0] = lu[k, k]
    mag = np.sort(np.abs(col.real) + np.abs(col.imag))[::-1]
    slack = max(1e-3 * mag[0], 4 * a.shape[-1] * np.finfo(a.dtype).eps * np.abs(a).max())
    assert mag.size > 1 and mag[0] - mag[1] <= slack, (
        f"{msg}: pivot {k} is {piv[k]}, LAPACK's {ref_piv[k]}, and LAPACK's two largest candidates "
        f"{mag[:2]} are not a near tie")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_pivots_are_scipys_and_factors_equal_to_rounding(dtype, n, cpu_engine):
    # above 64, kept quick: 20 is a whole group of lanes and a part-filled one in every dtype (W = 8 or
    # 16), on one thread or split between two, and two passes of the NumPy engine (16 matrices each)
    count = 2000 if n <= 64 else 20
    seed = int(np.random.SeedSequence().generate_state(1)[0])  # fresh inputs on every run
    a = matrices.generate("random", n, dtype, seed=seed, stop=count)
    lu, piv, info = kernels.lu_factor(a)
    assert lu.shape == a.shape and lu.dtype == dtype
    assert piv.shape == (count, n) and piv.dtype == np.int32 and info.shape == (count,)

    ref_lu, ref_piv = _scipy(a)
    np.testing.assert_array_equal(info, 0, err_msg=f"seed {seed}")
    differ = np.flatnonzero((piv != ref_piv).any(axis=1))
    if np.dtype(dtype) in (np.float64, np.complex128):
        assert not differ.size, f"seed {seed}: pivots differ from SciPy's on matrices {differ[:10]}"
    for m in differ:
        _assert_near_tie(a[m], piv[m], ref_lu[m], ref_piv[m], f"seed {seed}, matrix {m}")
    ratios = get01(a, lu, piv)
    assert ratios.max() < THRESHOLD, f"seed {seed}: get01 {ratios.max():.1f}"
    assert get01(a, ref_lu, ref_piv).max() < THRESHOLD  # SciPy's own, for comparison
    first, last = _cpu.lanes_range("getrf", dtype)
    if n >= _cpu.lapack_min_n("getrf", dtype) and not first <= n <= last:
        assert lu.tobytes() == ref_lu.tobytes(), f"seed {seed}: LAPACK path not bit-identical"
