"""Inputs whose results overflow, and the rule ``info`` -2 follows (imported as a plain module by the
CPU and GPU info-code tests: tests/ has no packages)."""

from __future__ import annotations

import numpy as np

from batchlu.testing import matrices

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
