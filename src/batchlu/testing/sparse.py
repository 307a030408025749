"""Batches of sparse symmetric matrices that share one pattern: finite-element models swept over their
coefficients, a saddle-point (mixed FEM) system, an optimal-power-flow KKT system and a regularized
KKT system with dependent constraints.

Each generator builds a :class:`Problem` once: the pattern (lower triangle, CSR) and the values as an
affine map of a few coefficients per sample, ``values = base + coefficients @ maps``. Sample ``i``'s
coefficients come from its own stream keyed by ``(seed, i)``, so any range of samples can be made
alone (``values(0, 100)`` equals the concatenation of ``values(0, 37)`` and ``values(37, 100)``).

Kinds (``dim`` 2 or 3 for the FEM kinds):

``fem-poisson`` (SPD)
    -div(kappa grad u) = f on the unit square / cube, P1 elements (scikit-fem), u = 0 on the boundary
    (boundary nodes removed); kappa constant per element, log-normal (sigma 0.5), drawn per sample.
``fem-elasticity`` (SPD)
    linear elasticity, vector P1 elements, clamped at x = 0; Young's modulus per element log-normal
    (sigma 0.5) per sample, Poisson ratio 0.3.
``saddle`` (symmetric indefinite)
    mixed Poisson / Darcy flow, Raviart-Thomas RT0 fluxes and P0 pressures (scikit-fem):
    ``[[M(1/kappa), B^T], [B, -delta M_p]]`` with kappa per element per sample and a weak
    compressibility ``delta = 1e-6``; inertia (fluxes, pressures, 0).
``power-grid`` (symmetric indefinite)
    the KKT matrix of an interior-point step of a DC optimal power flow on a synthetic grid:
    unknowns generator outputs ``p`` (a fifth of the buses), bus angles ``theta`` (the slack bus's
    removed) and the nodal-balance multipliers; ``[[H, J^T], [J, -delta I]]`` with ``H =
    blkdiag(Q, A^T W A)`` (cost curvature plus barrier terms of the generator limits, and the
    line-flow barrier terms), ``J = [-C_g, B_bus]`` (the DC power-flow equations) and ``delta =
    1e-8``. Per sample (a time step) the barrier weights and costs change. The grid: ``nodes`` buses
    placed uniformly at random in the unit square, the minimum spanning tree of their Delaunay
    triangulation plus its shortest other edges up to a mean degree of 2.7 (as transmission grids
    have); no well-kept package generates grids of any size (pandapower and PYPOWER ship fixed
    cases), so the grid is synthetic. Inertia (generators + buses - 1, buses, 0).
``kkt`` (symmetric indefinite, quasi-definite)
    the regularized KKT matrix of an interior-point step, ``[[K, B^T], [B, -delta I]]``: ``K = L_w +
    10^-2 I``, the Laplacian of a planar graph (the Delaunay triangulation of ``nodes`` random points
    in the unit square) with log-normal edge weights (sigma 1) drawn per sample, plus a small shift;
    ``B`` ``nodes / 4`` constraint rows ``+-(e_i - e_j)^T`` on the graph's edges, the three edges of
    a random triangle for three in four of them and single edges for the rest, so that about a
    quarter of the rows are linear combinations of others (a triangle's signed rows sum to zero;
    the edges close further cycles; the description gives the count). ``delta`` (default 1e-8;
    :data:`KKT_DELTAS` are the values the tests cover) is the regularization an interior-point
    solver adds to the constraint block: the dependent directions leave A nonsingular, with
    eigenvalues of size ``delta``. Inertia (vertices, constraint rows, 0) for ``delta > 0``;
    ``delta = 0`` makes A exactly singular.

``size`` asks for about that many unknowns; ``nodes`` for that many mesh nodes, buses or graph vertices.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from batchlu.errors import ConfigError

__all__ = ["KINDS", "KKT_DELTAS", "Problem", "make"]

KINDS = ("fem-poisson", "fem-elasticity", "saddle", "power-grid", "kkt")
KKT_DELTAS = (1e-4, 1e-6, 1e-8, 1e-10)   # the kkt kind's regularizations that the tests and docs cover
_KKT_ROWS = 0.25                         # kkt: constraint rows per vertex
_KKT_SHIFT = 1e-2                        # kkt: K = Laplacian + this times I


@dataclasses.dataclass(frozen=True)
class Problem:
    """One pattern and the affine map from per-sample coefficients to values."""

    kind: str                  # the generator
    matrix_kind: str           # "spd" or "sym-indef"
    n: int
    indptr: np.ndarray         # (n+1,) lower triangle, CSR
    indices: np.ndarray        # (nnz,)
    base: np.ndarray           # (nnz,) float64
    maps: object               # scipy.sparse.csr_array (coefficients, nnz): values = base + c @ maps
    draw: object = dataclasses.field(repr=False)   # draw(rng) -> (coefficients,) for one sample
    inertia: tuple | None = None  # (positive, negative, zero) when known for every sample
    description: str = ""

    @property
    def nnz(self) -> int:
        return int(self.indices.size)

    def values(self, start: int, stop: int, dtype="float64", seed: int = 0) -> np.ndarray:
        """(stop - start, nnz) values of samples ``[start, stop)`` in ``dtype``."""
        coef = np.stack([self.draw(np.random.default_rng([int(seed), 19, i])) for i in range(start, stop)]) \
            if stop > start else np.zeros((0, self.maps.shape[0]))
        out = np.asarray(self.maps.T @ coef.T).T if coef.size else np.zeros((stop - start, self.nnz))
        return (out + self.base).astype(dtype)

    def rhs(self, start: int, stop: int, k: int | None = None, dtype="float64", seed: int = 0) -> np.ndarray:
        """Right-hand sides of samples ``[start, stop)``: (m, n) for ``k`` None, else (m, n, k)."""
        tail = (self.n,) if k is None else (self.n, int(k))
        out = np.empty((stop - start,) + tail, dtype)
        for j, i in enumerate(range(start, stop)):
            out[j] = np.random.default_rng([int(seed), 23, i]).standard_normal(tail)
        return out

    def dense(self, values: np.ndarray) -> np.ndarray:
        """The full symmetric matrices (m, n, n) of ``values`` (m, nnz), for tests."""
        rows = np.repeat(np.arange(self.n), np.diff(self.indptr))
        a = np.zeros((values.shape[0], self.n, self.n), np.float64)
        a[:, rows, self.indices] = values
        a[:, self.indices, rows] = values
        return a


# ------------------------------------------------------------------------------------------ assembly
def _lower_pattern(n: int, rows: np.ndarray, cols: np.ndarray):
    """Unique lower entries of the given (row, col) pairs (either triangle): CSR pattern and, per
    pair, its entry's position."""
    hi, lo = np.maximum(rows, cols), np.minimum(rows, cols)
    key = hi.astype(np.int64) * n + lo
    uniq, where = np.unique(key, return_inverse=True)
    r, c = uniq // n, uniq % n
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(r, minlength=n), out=indptr[1:])
    return indptr, c.astype(np.int64), where.reshape(-1)


class _Builder:
    """Collects entries ``(row, col, value, coefficient)`` (coefficient -1: the constant part) of a
    symmetric matrix, both triangles or one, and turns them into a :class:`Problem`'s pattern and maps.
    Entries above the diagonal are dropped (the lower triangle defines the matrix)."""

    def __init__(self, n: int):
        self.n = n
        self.parts = []

    def add(self, rows, cols, data, coef) -> None:
        rows, cols = np.asarray(rows, np.int64).ravel(), np.asarray(cols, np.int64).ravel()
        data = np.asarray(data, np.float64).ravel()
        coef = np.broadcast_to(np.asarray(coef, np.int64), rows.shape).ravel()
        keep = rows >= cols
        self.parts.append((rows[keep], cols[keep], data[keep], coef[keep]))

    def build(self, ncoef: int):
        import scipy.sparse as sp

        rows, cols, data, coef = (np.concatenate(x) for x in zip(*self.parts))
        indptr, indices, where = _lower_pattern(self.n, rows, cols)
        nnz = indices.size
        const = coef < 0
        base = np.bincount(where[const], weights=data[const], minlength=nnz)
        maps = sp.csr_array((data[~const], (coef[~const], where[~const])), shape=(ncoef, nnz))
        maps.sum_duplicates()
        return indptr, indices, base, maps


def _grid_side(dim: int, nodes: int | None, size: int | None, interior_per_node: float, boundary: str) -> int:
    """Elements per side of the unit square/cube mesh for about ``nodes`` nodes or ``size`` unknowns."""
    if nodes is not None:
        m = round(nodes ** (1 / dim)) - 1
    else:
        per = size / interior_per_node
        if boundary == "all":        # interior nodes (m - 1)^dim
            m = round(per ** (1 / dim)) + 1
        elif boundary == "face":     # nodes minus one face: m (m + 1)^(dim - 1)
            m = max(1, round(per ** (1 / dim)) - 1)
        else:                        # mixed: element count m^dim * (2 or 6)
            m = round((per / (2 if dim == 2 else 6)) ** (1 / dim))
    return max(2, int(m))


def _mesh(dim: int, m: int):
    import skfem

    x = np.linspace(0.0, 1.0, m + 1)
    return skfem.MeshTri.init_tensor(x, x) if dim == 2 else skfem.MeshTet.init_tensor(x, x, x)


def _elementwise(form, ubasis, vbasis=None):
    """Unsummed element matrices of ``form``: rows, cols, data and the element of each entry."""
    coo = form.coo_data(ubasis, vbasis) if vbasis is not None else form.coo_data(ubasis)
    nelems = ubasis.mesh.t.shape[1]
    element = np.arange(coo.data.size) % nelems   # data is laid out (local i, local j, element)
    return coo.indices[0], coo.indices[1], coo.data, element


def _restrict(keep: np.ndarray, total: int):
    """Old index -> new index (-1 where dropped) for keeping the unknowns ``keep``."""
    new = np.full(total, -1, np.int64)
    new[keep] = np.arange(keep.size)
    return new


def _lognormal(count: int, sigma: float = 0.5):
    return lambda rng: np.exp(sigma * rng.standard_normal(count))


def fem_poisson(dim: int = 2, nodes: int | None = None, size: int | None = None) -> Problem:
    import skfem
    from skfem.helpers import dot, grad

    m = _grid_side(dim, nodes, size, 1.0, "all")
    mesh = _mesh(dim, m)
    basis = skfem.Basis(mesh, skfem.ElementTriP1() if dim == 2 else skfem.ElementTetP1())

    @skfem.BilinearForm
    def laplace(u, v, w):
        return dot(grad(u), grad(v))

    rows, cols, data, elem = _elementwise(laplace, basis)
    interior = basis.complement_dofs(basis.get_dofs())
    new = _restrict(interior, basis.N)
    ok = (new[rows] >= 0) & (new[cols] >= 0)
    b = _Builder(interior.size)
    b.add(new[rows[ok]], new[cols[ok]], data[ok], elem[ok])
    nel = mesh.t.shape[1]
    indptr, indices, base, maps = b.build(nel)
    return Problem("fem-poisson", "spd", int(interior.size), indptr, indices, base, maps, _lognormal(nel),
                   description=f"{dim}-D Poisson, P1, {m}^{dim} cells, {mesh.p.shape[1]:,} nodes")


def fem_elasticity(dim: int = 2, nodes: int | None = None, size: int | None = None) -> Problem:
    import skfem
    from skfem.helpers import ddot, div, sym_grad

    m = _grid_side(dim, nodes, size, float(dim), "face")
    mesh = _mesh(dim, m)
    element = skfem.ElementVector(skfem.ElementTriP1() if dim == 2 else skfem.ElementTetP1())
    basis = skfem.Basis(mesh, element)

    @skfem.BilinearForm
    def lam(u, v, w):
        return div(u) * div(v)

    @skfem.BilinearForm
    def mu(u, v, w):
        return 2.0 * ddot(sym_grad(u), sym_grad(v))

    clamped = basis.get_dofs(lambda x: np.isclose(x[0], 0.0)).all()
    free = basis.complement_dofs(clamped)
    new = _restrict(free, basis.N)
    nel = mesh.t.shape[1]
    b = _Builder(free.size)
    for offset, form in ((0, lam), (nel, mu)):
        rows, cols, data, elem = _elementwise(form, basis)
        ok = (new[rows] >= 0) & (new[cols] >= 0)
        b.add(new[rows[ok]], new[cols[ok]], data[ok], elem[ok] + offset)
    indptr, indices, base, maps = b.build(2 * nel)
    nu = 0.3

    def draw(rng):
        young = np.exp(0.5 * rng.standard_normal(nel))
        return np.concatenate([young * nu / ((1 + nu) * (1 - 2 * nu)), young / (2 * (1 + nu))])

    return Problem("fem-elasticity", "spd", int(free.size), indptr, indices, base, maps, draw,
                   description=f"{dim}-D linear elasticity, vector P1, {m}^{dim} cells, clamped at x = 0")


def saddle(dim: int = 2, nodes: int | None = None, size: int | None = None, delta: float = 1e-6) -> Problem:
    import skfem
    from skfem.helpers import div, dot

    m = _grid_side(dim, nodes, size, 2.5 if dim == 2 else 3.0, "mixed")
    mesh = _mesh(dim, m)
    flux = skfem.Basis(mesh, skfem.ElementTriRT0() if dim == 2 else skfem.ElementTetRT0())
    pres = skfem.Basis(mesh, skfem.ElementTriP0() if dim == 2 else skfem.ElementTetP0(),
                       quadrature=flux.quadrature)

    @skfem.BilinearForm
    def mass(u, v, w):
        return dot(u, v)

    @skfem.BilinearForm
    def divergence(u, q, w):
        return -div(u) * q

    @skfem.BilinearForm
    def pmass(p, q, w):
        return -delta * p * q

    nf, npres = flux.N, pres.N
    b = _Builder(nf + npres)
    rows, cols, data, elem = _elementwise(mass, flux)
    b.add(rows, cols, data, elem)
    r, c, d, _ = _elementwise(divergence, flux, pres)     # rows: pressures, cols: fluxes
    b.add(r + nf, c, d, -1)
    r, c, d, _ = _elementwise(pmass, pres)
    b.add(r + nf, c + nf, d, -1)
    nel = mesh.t.shape[1]
    indptr, indices, base, maps = b.build(nel)
    inv_kappa = _lognormal(nel)
    return Problem("saddle", "sym-indef", int(nf + npres), indptr, indices, base, maps, inv_kappa,
                   inertia=(int(nf), int(npres), 0),
                   description=f"{dim}-D mixed Darcy, RT0-P0, {m}^{dim} cells, delta {delta:g}")


def _synthetic_grid(buses: int, rng: np.random.Generator):
    """Lines ``(i, j)`` of a connected planar grid on ``buses`` random points, mean degree ~2.7."""
    import scipy.sparse as sp
    from scipy.sparse.csgraph import minimum_spanning_tree
    from scipy.spatial import Delaunay

    pts = rng.uniform(size=(buses, 2))
    if buses < 4:
        i = np.arange(buses - 1)
        return np.stack([i, i + 1], axis=1)
    tri = Delaunay(pts).simplices
    e = np.concatenate([tri[:, [0, 1]], tri[:, [1, 2]], tri[:, [0, 2]]])
    e = np.unique(np.sort(e, axis=1), axis=0)
    length = np.linalg.norm(pts[e[:, 0]] - pts[e[:, 1]], axis=1)
    graph = sp.coo_array((length, (e[:, 0], e[:, 1])), shape=(buses, buses))
    tree = minimum_spanning_tree(graph).tocoo()
    tree_keys = set(zip(np.minimum(tree.row, tree.col).tolist(), np.maximum(tree.row, tree.col).tolist()))
    in_tree = np.array([(a, b) in tree_keys for a, b in e.tolist()])
    extra = int(round(1.35 * buses)) - (buses - 1)
    rest = np.flatnonzero(~in_tree)
    rest = rest[np.argsort(length[rest], kind="stable")][:max(0, extra)]
    return np.concatenate([e[in_tree], e[rest]])


def power_grid(nodes: int | None = None, size: int | None = None, seed: int = 0, delta: float = 1e-8) -> Problem:
    buses = int(nodes) if nodes is not None else max(3, int(round((size + 1) / 2.2)))
    if buses < 3:
        raise ConfigError(f"Expected at least 3 buses for power-grid. Got {buses} instead.")
    rng = np.random.default_rng([int(seed), 29])
    lines = _synthetic_grid(buses, rng)
    nl = lines.shape[0]
    susceptance = rng.uniform(5.0, 20.0, nl)
    ng = max(1, buses // 5)
    gen_bus = np.sort(rng.choice(buses, ng, replace=False))
    slack = int(gen_bus[0])
    theta = np.delete(np.arange(buses), slack)        # angle unknowns: every bus but the slack
    col_theta = _restrict(theta, buses)               # bus -> angle unknown (-1: slack)
    n = ng + theta.size + buses
    p0, t0, y0 = 0, ng, ng + theta.size              # offsets of p, theta, multipliers
    b = _Builder(n)
    # H: cost curvature and generator-limit barriers (coefficient per generator)
    b.add(p0 + np.arange(ng), p0 + np.arange(ng), np.ones(ng), np.arange(ng))
    # H: line-flow barrier terms A^T W A on the angles (coefficient per line)
    i, j = lines[:, 0], lines[:, 1]
    for u, v, sign in ((i, i, 1.0), (j, j, 1.0), (i, j, -1.0), (j, i, -1.0)):
        ok = (col_theta[u] >= 0) & (col_theta[v] >= 0)
        b.add(t0 + col_theta[u[ok]], t0 + col_theta[v[ok]], sign * susceptance[ok] ** 2,
              ng + np.flatnonzero(ok))
    # J = [-C_g, B_bus]: nodal balance rows
    b.add(y0 + gen_bus, p0 + np.arange(ng), -np.ones(ng), -1)
    for u, v, sign in ((i, i, 1.0), (j, j, 1.0), (i, j, -1.0), (j, i, -1.0)):
        ok = col_theta[v] >= 0
        b.add(y0 + u[ok], t0 + col_theta[v[ok]], sign * susceptance[ok], -1)
    b.add(y0 + np.arange(buses), y0 + np.arange(buses), np.full(buses, -delta), -1)
    indptr, indices, base, maps = b.build(ng + nl)

    def draw(r):
        cost = 2.0 * r.uniform(0.01, 0.1, ng) + np.exp(r.standard_normal(ng))    # curvature + barrier
        flow = np.exp(1.5 * r.standard_normal(nl)) * 1e-2                         # barrier weights
        return np.concatenate([cost, flow])

    return Problem("power-grid", "sym-indef", n, indptr, indices, base, maps, draw,
                   inertia=(ng + theta.size, buses, 0),
                   description=f"DC-OPF KKT, synthetic grid of {buses:,} buses, {nl:,} lines, {ng:,} generators")


def kkt(nodes: int | None = None, size: int | None = None, seed: int = 0, delta: float = 1e-8) -> Problem:
    """The ``kkt`` kind (module docstring): ``nodes`` graph vertices, or about ``size`` unknowns."""
    from scipy.sparse.csgraph import connected_components
    import scipy.sparse as sp
    from scipy.spatial import Delaunay

    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.floating)) or not 0 <= delta < math.inf:
        raise ConfigError(f"Expected delta to be a finite number >= 0. Got {delta!r} instead.")
    verts = int(nodes) if nodes is not None else max(4, int(round(size / (1 + _KKT_ROWS))))
    rng = np.random.default_rng([int(seed), 31])
    tri = Delaunay(rng.uniform(size=(verts, 2))).simplices
    edges = np.unique(np.sort(np.concatenate([tri[:, [0, 1]], tri[:, [1, 2]], tri[:, [0, 2]]]), axis=1), axis=0)
    ne = edges.shape[0]
    want = max(3, int(round(_KKT_ROWS * verts)))                 # constraint rows
    picked = tri[rng.choice(tri.shape[0], min(tri.shape[0], max(1, want // 4)), replace=False)]
    cons = np.concatenate([picked[:, [0, 1]], picked[:, [1, 2]], picked[:, [0, 2]],
                           edges[rng.choice(ne, max(0, want - 3 * picked.shape[0]), replace=False)]])
    m = cons.shape[0]
    sign = rng.choice([-1.0, 1.0], m)
    n = verts + m
    b = _Builder(n)
    i, j = edges[:, 0], edges[:, 1]
    for u, v, s in ((i, i, 1.0), (j, j, 1.0), (i, j, -1.0), (j, i, -1.0)):     # K: w_e (e_i - e_j)(e_i - e_j)^T
        b.add(u, v, np.full(ne, s), np.arange(ne))
    b.add(np.arange(verts), np.arange(verts), np.full(verts, _KKT_SHIFT), -1)    # ... + shift I
    r = verts + np.arange(m)
    b.add(r, cons[:, 0], sign, -1)                                               # B: +-(e_i - e_j)^T
    b.add(r, cons[:, 1], -sign, -1)
    b.add(r, r, np.full(m, -float(delta)), -1)                                   # -delta I
    indptr, indices, base, maps = b.build(ne)
    # B is the signed incidence matrix of the constraints' edges: its rank is the vertices they touch
    # less the connected components they form
    touched = np.unique(cons)
    graph = sp.coo_array((np.ones(m), (cons[:, 0], cons[:, 1])), shape=(verts, verts))
    components = connected_components(graph, directed=False)[0] - (verts - touched.size)
    dependent = m - (touched.size - components)
    return Problem("kkt", "sym-indef", n, indptr, indices, base, maps, _lognormal(ne, 1.0),
                   inertia=(verts, m, 0) if delta > 0 else None,
                   description=f"regularized KKT, Laplacian of a {verts:,}-vertex planar graph, {m:,} constraint "
                               f"rows ({dependent:,} dependent), delta {float(delta):g}")


# Peak memory a built unknown takes while :func:`make` runs (measured at 1e5-3e5 unknowns: scikit-fem's
# element matrices, the pattern, the coefficient maps), bytes with a margin of about 1.3, and the
# unknowns a node carries.
_BUILD_BYTES = {("fem-poisson", 2): 4_000, ("fem-poisson", 3): 22_000, ("fem-elasticity", 2): 12_000,
                ("fem-elasticity", 3): 64_000, ("saddle", 2): 2_000, ("saddle", 3): 2_000,
                ("power-grid", 2): 1_500, ("power-grid", 3): 1_500, ("kkt", 2): 3_000, ("kkt", 3): 3_000}
_PER_NODE = {"fem-poisson": lambda dim: 1, "fem-elasticity": lambda dim: dim, "saddle": lambda dim: 2.5,
             "power-grid": lambda dim: 1, "kkt": lambda dim: 1 + _KKT_ROWS}


def build_bytes(kind: str, *, nodes: int | None = None, size: int | None = None, dim: int = 2) -> int:
    """About the peak memory :func:`make` takes for these arguments (an upper estimate), so that a
    caller can refuse a size that cannot be built before it starts."""
    unknowns = size if size is not None else (nodes or 0) * _PER_NODE.get(kind, lambda d: d)(dim)
    return int(unknowns * _BUILD_BYTES.get((kind, dim), max(_BUILD_BYTES.values())))


def make(kind: str, *, nodes: int | None = None, size: int | None = None, dim: int = 2, seed: int = 0,
         delta: float | None = None) -> Problem:
    """The :class:`Problem` of ``kind`` with about ``nodes`` nodes or ``size`` unknowns (one of them);
    ``delta`` is the ``kkt`` kind's regularization (None: its default, 1e-8)."""
    if kind not in KINDS:
        raise ConfigError(f"Expected kind to be one of {', '.join(KINDS)}. Got {kind!r} instead.")
    if (nodes is None) == (size is None):
        raise ConfigError(f"Expected exactly one of nodes and size for kind {kind}. "
                          f"Got nodes={nodes!r}, size={size!r} instead.")
    for name, value in (("nodes", nodes), ("size", size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 4):
            raise ConfigError(f"Expected {name} to be an integer >= 4. Got {value!r} instead.")
    if dim not in (2, 3):
        raise ConfigError(f"Expected dim 2 or 3. Got {dim!r} instead.")
    if delta is not None and kind != "kkt":
        raise ConfigError(f"Expected delta only with kind kkt. Got delta={delta!r} with kind {kind} instead.")
    if kind == "kkt":
        return kkt(nodes=nodes, size=size, seed=seed, delta=1e-8 if delta is None else delta)
    if kind == "power-grid":
        return power_grid(nodes=nodes, size=size, seed=seed)
    return {"fem-poisson": fem_poisson, "fem-elasticity": fem_elasticity, "saddle": saddle}[kind](
        dim=dim, nodes=nodes, size=size)
