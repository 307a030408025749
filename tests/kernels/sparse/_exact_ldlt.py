"""Batches whose LDL^T is exact in floating point (imported as a plain module by the CPU and GPU
factorization tests: tests/ has no packages)."""

from __future__ import annotations

import numpy as np

import batchlu


def last_zero_pivot_batch(n: int, count: int, seed: int, band: bool):
    """``count`` fresh random matrices ``A = L D L^T`` whose LDL^T in the natural order is exact in
    floating point (integer L, pivots +-1, 2, 4), the last pivot exactly zero; ``band``: L
    bidiagonal (A tridiagonal), else L full. Returns ``(plan, values (count, nnz), d (count, n))``."""
    rng = np.random.default_rng(seed)
    ell = np.tril(rng.integers(-3, 4, (count, n, n)), -1)
    if band:
        ell = ell * np.eye(n, k=-1, dtype=int)
    ell = ell + np.eye(n, dtype=int)
    d = rng.choice([-4, -2, -1, 1, 2, 4], (count, n))
    d[:, -1] = 0
    a = np.einsum("bik,bk,bjk->bij", ell, d, ell).astype(np.float64)
    rows, cols = np.tril_indices(n)
    if band:
        keep = rows - cols <= 1
        rows, cols = rows[keep], cols[keep]
    indptr = np.concatenate(([0], np.cumsum(np.bincount(rows, minlength=n))))
    plan = batchlu.sparse.analyze(indptr, cols, n, ordering="natural")
    return plan, a[:, rows, cols], d


def expected_last_zero(d: np.ndarray, perturb: bool):
    """``(info, perturbed, inertia)`` of :func:`last_zero_pivot_batch`'s matrices: static pivoting
    off, the zero pivot counts once as zero and info names its column; on, it becomes +tau,
    counted once as perturbed and as positive."""
    count, n = d.shape
    positive, negative = (d > 0).sum(axis=1), (d < 0).sum(axis=1)
    if perturb:
        return [0] * count, [1] * count, np.stack([positive + 1, negative, 0 * negative], axis=1).tolist()
    return [n] * count, [0] * count, np.stack([positive, negative, 1 + 0 * negative], axis=1).tolist()
