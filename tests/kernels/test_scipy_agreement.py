"""What the README promises about ``lu`` against ``scipy.linalg.lu_factor``, checked as stated there:

* ``piv`` and ``info`` identical to SciPy's on random matrices, on both CPU engines and both sides
  of their crossovers (the compiled xGETF2 or the vectorised NumPy LU below, LAPACK from it on);
* ``lu`` bit-identical to SciPy's from the crossover (``_cpu.lapack_min_n("getrf", dtype)``) on;
* below it, ``lu`` equal to rounding: LAPACK's ``get01`` ratio under its threshold, as SciPy's own.
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
# Both sides of every engine's getrf crossover, in every dtype
_CROSSOVERS = {_cpu.NUMPY_LAPACK_MIN_N, *_cpu.COMPILED_LAPACK_MIN_N["getrf"]}
SIZES = sorted({1, 2, 3, 4, 5, 8} | {c + d for c in _CROSSOVERS for d in (-1, 0, 3)})


def _scipy(a):
    pairs = [scipy.linalg.lu_factor(m, check_finite=False) for m in a]
    return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs]).astype(np.int32)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_pivots_are_scipys_and_factors_equal_to_rounding(dtype, n, cpu_engine):
    count = 2000
    seed = int(np.random.SeedSequence().generate_state(1)[0])  # fresh inputs on every run
    a = matrices.generate("random", n, dtype, seed=seed, stop=count)
    lu, piv, info = kernels.lu_factor(a)
    assert lu.shape == a.shape and lu.dtype == dtype
    assert piv.shape == (count, n) and piv.dtype == np.int32 and info.shape == (count,)

    ref_lu, ref_piv = _scipy(a)
    np.testing.assert_array_equal(info, 0, err_msg=f"seed {seed}")
    differ = np.flatnonzero((piv != ref_piv).any(axis=1))
    assert not differ.size, f"seed {seed}: pivots differ from SciPy's on matrices {differ[:10]}"
    ratios = get01(a, lu, piv)
    assert ratios.max() < THRESHOLD, f"seed {seed}: get01 {ratios.max():.1f}"
    assert get01(a, ref_lu, ref_piv).max() < THRESHOLD  # SciPy's own, for comparison
    if n >= _cpu.lapack_min_n("getrf", dtype):
        assert lu.tobytes() == ref_lu.tobytes(), f"seed {seed}: LAPACK path not bit-identical"
