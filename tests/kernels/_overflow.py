"""Inputs whose results overflow, and the rule ``info`` -2 follows (imported as a plain module by the
CPU and GPU info-code tests: tests/ has no packages)."""

from __future__ import annotations

import numpy as np

from batchlu.testing import matrices
from batchlu.testing.ratios import THRESHOLD, get01, get02, get03, slogdet_ratios

GROUP = 12   # matrices per kind in a batch


def overflow_batch(n: int, dtype, seed: int = 0) -> np.ndarray:
    """Four groups of fresh random matrices: plain; scaled to tiny/16 (their inverses and solutions
    overflow); scaled to 0.9 * max (their LU factors and determinants overflow); singular-mix
    (singular, zero, NaN and Inf matrices among plain ones)."""
    fi = np.finfo(dtype)
    a = matrices.generate("random", n, dtype, seed=seed, start=0, stop=3 * GROUP)
    a[GROUP:2 * GROUP] *= fi.tiny / 16
    a[2 * GROUP:] *= fi.max * 0.9
    mix = matrices.generate("singular-mix", n, dtype, seed=seed + 1, start=0, stop=GROUP)
    return np.concatenate([a, mix]).astype(dtype)


def finite(x: np.ndarray) -> np.ndarray:
    """Per matrix (leading axis): every element finite."""
    return np.isfinite(x).reshape(x.shape[0], -1).all(axis=1)


def expected_info(raw_info: np.ndarray, *raw_results) -> np.ndarray:
    """The rule: -2 exactly where the backend said 0 and some result is not finite."""
    ok = np.logical_and.reduce([finite(x) for x in raw_results])
    return np.where((raw_info == 0) & ~ok, np.int32(-2), raw_info).astype(np.int32)


def same(x: np.ndarray, y: np.ndarray) -> bool:
    """Bit for bit, with dtype and shape."""
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def check_codes(info, a, *results, overflow: bool = True) -> None:
    """-2 only on finite inputs with a non-finite result; 0 only with finite results; both occur
    (-2 only where ``overflow``: the backend's results do overflow on this batch); -1 exactly on the
    non-finite inputs."""
    finite_in = finite(a)
    finite_out = np.logical_and.reduce([finite(x) for x in results])
    assert (info == 0).any() and (info == -2).any() == overflow, np.unique(info)
    assert (finite_in & ~finite_out)[info == -2].all()
    assert finite_out[info == 0].all()
    assert not finite_in[info == -1].any() and finite_in[info != -1].all()


def near_max_batch(n: int, dtype, seed: int = 0):
    """``(a, b, scale)``: fresh random matrices ``a = scale * b`` with entries near the largest
    float, ``scale = 2^(emax - 1)`` (2^1023 in double precision: exact, so each result of ``a`` is
    one of ``b`` scaled back), ``|b_ij| < 1.9``. Two groups of :data:`GROUP`:

    * column diagonally dominant ``b``: diagonal entries of modulus 1.75-1.85 (complex: both parts
      about 1.27, so Smith's division, forming ``|d|^2 / max(|re|, |im|)``, overflows for their
      pivots), the rest below 0.21 / n: no interchanges, no growth, no overflow; every result finite;
    * entries of modulus 1 to 1.9 anywhere: most results of ``a`` overflow (-2).
    """
    dtype = np.dtype(dtype)
    real = np.finfo(dtype).dtype
    rng = np.random.default_rng([seed, n, dtype.num])
    cplx = dtype.kind == "c"

    def entries(modulus, shape, phase):
        if not cplx:
            return modulus * rng.choice([-1.0, 1.0], shape)
        return modulus * np.exp(1j * phase)

    size = (GROUP, n)
    angle = np.pi / 4 + rng.uniform(-0.2, 0.2, size) + np.pi / 2 * rng.integers(0, 4, size)
    b = entries(rng.uniform(0, 0.21 / n, (GROUP, n, n)), (GROUP, n, n), rng.uniform(0, 2 * np.pi, (GROUP, n, n)))
    b[:, np.arange(n), np.arange(n)] = entries(rng.uniform(1.75, 1.85, size), size, angle)
    spread = entries(rng.uniform(1.0, 1.9, (GROUP, n, n)), (GROUP, n, n), rng.uniform(0, 2 * np.pi, (GROUP, n, n)))
    b = np.concatenate([b, spread]).astype(dtype)
    scale = float(2.0 ** (np.finfo(real).maxexp - 1))
    return b * real.type(scale), b, scale


def _none_finite(x: np.ndarray) -> bool:
    """No matrix (leading axis) of ``x`` is all finite; True for none at all."""
    return not np.isfinite(x).all(axis=tuple(range(1, x.ndim))).any()


def check_near_max(call, n: int, dtype, seed: int = 38) -> None:
    """On :func:`near_max_batch`'s matrices ``a = scale b``: every result with info 0 is right,
    checked on ``b`` (exact: the scaling is a power of two) with LAPACK's ratios, every other one is
    -2 with a non-finite result, and the diagonally dominant half is all 0. ``call(op, *args)`` runs
    ``kernels.<op>`` on host arrays (on the CPU or the GPU) and returns its results as a tuple of
    host arrays."""
    a, b, scale = near_max_batch(n, dtype, seed=seed)
    real = np.finfo(dtype).dtype.type
    c = matrices.rhs(n, 2, dtype, seed=seed + 1, stop=a.shape[0])
    rhs = c * real(scale)                                    # a x = rhs  <=>  b x = c, exactly
    dominant = np.arange(a.shape[0]) < GROUP

    def codes(info, *results):
        ok = info == 0
        assert ok[dominant].all() and (info[~ok] == -2).all(), info
        assert all(_none_finite(x[~ok]) if x.ndim > 1 else not np.isfinite(x[~ok]).any() for x in results)
        return ok

    sign, logabsdet, info = call("slogdet", a)
    ok = codes(info)
    assert (info == -2).any() and not (np.isfinite(sign) & np.isfinite(logabsdet))[~ok].any()
    # slogdet_ratios brings each matrix to a largest entry in [0.5, 1) by a power of two itself
    assert max(r.max() for r in slogdet_ratios(a[ok], sign[ok], logabsdet[ok])) < THRESHOLD

    lu, piv, info = call("lu_factor", a)
    ok = codes(info, lu)
    unscaled = np.tril(lu[ok], -1) + np.triu(lu[ok]) / real(scale)   # b's factors: L, and U / scale
    assert get01(b[ok], unscaled, piv[ok]).max() < THRESHOLD
    x, = call("lu_solve", lu[ok], piv[ok], rhs[ok])
    assert get02(b[ok], x, c[ok]).max() < THRESHOLD

    x, info = call("solve", a, rhs)
    ok = codes(info, x)
    assert get02(b[ok], x[ok], c[ok]).max() < THRESHOLD

    ainv, info = call("inv", a)
    ok = codes(info, ainv)
    # a^-1 = b^-1 / scale: entries near the smallest normal float, a few ulps lost to subnormals
    assert get03(b[ok], ainv[ok] * real(scale)).max() < THRESHOLD
