"""The sparse generators' structure (``batchlu.testing.sparse``): the regularized KKT kind."""

from __future__ import annotations

import numpy as np
import pytest

from batchlu.testing import sparse as gen


@pytest.mark.parametrize("delta", gen.KKT_DELTAS + (0.0,))
def test_kkt_blocks_dependence_and_inertia(delta):
    """[[K, B^T], [B, -delta I]]: K a weighted Laplacian plus 1e-2 I (SPD), B rows of 0 and +-1 with
    two entries each, about a quarter of them dependent (the count the description gives), -delta
    on the constraints' diagonal; the inertia (vertices, rows, 0) is eigvalsh's for delta > 0, none
    is claimed for the singular delta = 0; one pattern, a fresh matrix per sample."""
    p = gen.make("kkt", size=250, seed=2, delta=delta)
    assert p.kind == "kkt" and p.matrix_kind == "sym-indef" and f"delta {delta:g}" in p.description
    values = p.values(0, 3, seed=4)
    assert len({v.tobytes() for v in values}) == 3
    a = p.dense(values)
    verts = round(p.n / 1.25)
    k, b, c = a[:, :verts, :verts], a[:, verts:, :verts], a[:, verts:, verts:]
    m = p.n - verts
    assert np.all(np.linalg.eigvalsh(k) > 0)
    assert np.allclose(k.sum(axis=2), 1e-2, rtol=0, atol=1e-12)              # Laplacian rows sum to 0
    assert set(np.unique(b)) == {-1.0, 0.0, 1.0} and np.all((b != 0).sum(axis=2) == 2)
    assert np.array_equal(c, np.broadcast_to(-delta * np.eye(m), c.shape))
    dependent = m - np.linalg.matrix_rank(b[0])
    assert 0.15 * m <= dependent <= 0.4 * m and f"({dependent:,} dependent)" in p.description
    w = np.linalg.eigvalsh(a)
    if delta > 0:
        assert p.inertia == (verts, m, 0)
        assert np.all((w > 0).sum(axis=1) == verts) and np.all((w < 0).sum(axis=1) == m)
        assert np.allclose(np.sort(np.abs(w), axis=1)[:, :dependent], delta, rtol=1e-2, atol=0)
    else:
        assert p.inertia is None
        assert np.all(np.sort(np.abs(w), axis=1)[:, :dependent] < 1e-12 * np.abs(w).max())


def test_kkt_sizes_and_reproducibility():
    """``size`` gives about that many unknowns and ``nodes`` that many vertices; a sample's values do
    not depend on the range it is drawn in."""
    assert abs(gen.make("kkt", size=1000).n - 1000) <= 2
    assert gen.make("kkt", nodes=400).n == 500
    p = gen.make("kkt", size=120, seed=1)
    assert np.array_equal(p.values(0, 7, seed=3), np.concatenate([p.values(0, 4, seed=3), p.values(4, 7, seed=3)]))
    assert gen.build_bytes("kkt", nodes=400) == gen.build_bytes("kkt", size=500)
