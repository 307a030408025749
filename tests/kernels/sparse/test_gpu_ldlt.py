"""The GPU numeric LDL^T (kernels/cuda/ldlt.cu and its host code, batchlu.kernels.sparse._gpu).

Every test runs twice: on the GPU (marker ``gpu``: CuPy values through ``plan.factorize``), and here
on the host, where the same CUDA text is compiled by the C++ compiler and each launch runs thread by
thread (``_cuda_on_host``: skipped without a compiler), with NumPy in CuPy's place. Checks:
reconstruction ``P A P^T = L D L^T`` against a dense float64 reference (ratio < 30), solves with
refinement on every generator in both precisions (normwise backward error <= 30 n eps, recomputed
with the dense matrices), the regularized KKT family at every delta on the defaults (the second
attempt of ``solve``), inertia against eigvalsh, indefinite and singular matrices, tiny pivots
with perturbation and refinement, non-finite input in a mixed batch, the info codes, a matrix's
results independent of the batch around it and of the order the threads run in, and agreement with
the CPU backend's codes and counts.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
from _cuda_on_host import HostLaunch, build, compiler
from _exact_ldlt import expected_last_zero, last_zero_pivot_batch

import batchlu
from batchlu.errors import InputError
from batchlu.kernels._info import INFO_NONFINITE_INPUT, INFO_REFINEMENT
from batchlu.kernels.sparse import _gpu, _gpu_maps
from batchlu.testing import sparse as gen
from batchlu.testing.ratios import get02

THRESHOLD = 30
Device = collections.namedtuple("Device", "name xp factorize host")


@pytest.fixture(scope="module")
def host_lib(tmp_path_factory):
    if compiler() is None:
        pytest.skip("no C++ compiler (g++ or clang++) to run kernels/cuda/ldlt.cu on the host")
    return build(tmp_path_factory.mktemp("ldlt-host"))


def _host_device(lib, order=0, recorded=False):
    def factorize(plan, values, perturb=True, pivot_tol=None):
        return _gpu.factorize_with(plan, values, perturb=perturb, pivot_tol=pivot_tol, xp=np,
                                   launch=HostLaunch(lib, order), recorded=recorded)

    return Device("host-recorded" if recorded else "host", np, factorize, np.asarray)


@pytest.fixture(params=["host", "host-recorded", pytest.param("gpu", marks=pytest.mark.gpu)])
def device(request):
    """The GPU (CUDA graphs, as ``plan.factorize`` runs by default), or the host's run of the same
    text: launch by launch, or recorded over a workspace and replayed (the graphs' path)."""
    if request.param.startswith("host"):
        return _host_device(request.getfixturevalue("host_lib"), recorded=request.param == "host-recorded")
    import cupy

    def factorize(plan, values, **kw):
        factor = plan.factorize(cupy.asarray(values), **kw)
        assert isinstance(factor, _gpu.GpuFactor) and isinstance(factor.info, cupy.ndarray)
        return factor

    return Device("gpu", cupy, factorize, cupy.asnumpy)


KINDS = [("fem-poisson", 2), ("fem-poisson", 3), ("fem-elasticity", 2), ("fem-elasticity", 3), ("saddle", 2),
         ("saddle", 3), ("power-grid", 2)]


@pytest.fixture(scope="module", params=KINDS, ids=lambda p: f"{p[0]}-{p[1]}d")
def problem(request):
    kind, dim = request.param
    p = gen.make(kind, size=260, dim=dim, seed=4)
    return p, batchlu.sparse.analyze(p.indptr, p.indices, p.n, kind=p.matrix_kind)


def _lower_csr(a: np.ndarray):
    rows, cols = np.nonzero(np.tril(a))
    indptr = np.concatenate(([0], np.cumsum(np.bincount(rows, minlength=a.shape[0]))))
    return indptr, cols


def _random_indefinite(n, count, seed, density=0.08):
    """``count`` sparse symmetric indefinite matrices of one pattern: off-diagonal entries in [-1, 1]
    and a diagonal of both signs, large enough that no pivot is tiny (no perturbation)."""
    rng = np.random.default_rng(seed)
    mask = np.tril(rng.random((n, n)) < density, -1)
    mask = mask | mask.T | np.eye(n, dtype=bool)
    indptr, cols = _lower_csr(mask.astype(float))
    rows = np.repeat(np.arange(n), np.diff(indptr))
    mats = np.zeros((count, n, n))
    signs = np.where(np.arange(n) % 3 == 0, -1.0, 1.0)
    for i in range(count):
        off = np.where(mask, rng.uniform(-1, 1, (n, n)), 0.0)
        off = np.tril(off, -1)
        off = off + off.T
        mats[i] = off + np.diag(signs * (np.abs(off).sum(1) + 1 + rng.random(n)))
    values = mats[:, rows, cols]
    return indptr, cols, values, mats


def _ratio(lower, d, c, a):
    recon = (lower.toarray() * d) @ lower.toarray().T
    return np.abs(recon - c).sum(0).max() / (c.shape[0] * np.abs(a).sum(0).max() * np.finfo(float).eps)


def test_the_sparse_modules_import_no_cycle():
    """kernels/sparse's modules, as their source imports one another (module- and function-level):
    no cycle; the CPU factor (``_factor``) and the GPU one (``_gpu``) share ``_shared``."""
    import ast
    from pathlib import Path

    root = Path(_gpu.__file__).parent
    modules = {path.stem for path in root.glob("*.py")}
    graph = {}
    for name in modules:
        found = set()
        for node in ast.walk(ast.parse((root / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                found |= {node.module.split(".")[0]} if node.module else {alias.name for alias in node.names}
        graph[name] = found & modules - {name}
    assert "_factor" in graph["__init__"] and "_gpu" in graph["_factor"]    # the graph is read
    cycles = []
    for start in sorted(graph):
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        if start in seen:
            cycles.append(start)
    assert not cycles, f"modules on an import cycle: {cycles}"


# ---------------------------------------------------------------------------------------- the maps
def test_maps_cover_l_and_a_exactly_once(problem):
    """Every position of Lx is one level's entry exactly once; the supernodes are runs of columns with
    one row structure below them, each on a level above its children's; the row lists by supernode
    are L's strict lower part by rows, and ``base`` finds each of their rows in every column of the
    run; the a_* lists rebuild A (both triangles) from a row of values."""
    import scipy.sparse as sp

    p, plan = problem
    maps = _gpu_maps.build(plan)
    colptr, rowind = plan.colptr, plan.rowind
    assert np.array_equal(maps.sn_of, np.repeat(np.arange(maps.sn_first.size), maps.sn_size))
    assert np.array_equal(np.sort(maps.ent), np.arange(plan.nnz_l))
    assert np.array_equal(np.sort(maps.sn), np.arange(maps.sn_first.size))
    level_of = np.empty(maps.sn_first.size, np.int64)
    run_of = np.empty(plan.n, np.int64)
    below = {}
    for lv in range(maps.nlevels):
        runs = maps.sn[maps.sn_ptr[lv]:maps.sn_ptr[lv + 1]]
        level_of[runs] = lv
        cols = np.concatenate([np.arange(maps.sn_first[g], maps.sn_first[g] + maps.sn_size[g]) for g in runs])
        wide = runs[maps.sn_size[runs] >= _gpu_maps.WIDE]
        assert np.array_equal(maps.wide[maps.wide_ptr[lv]:maps.wide_ptr[lv + 1]], wide)
        assert np.array_equal(maps.wide_cols[maps.wide_cols_ptr[lv]:maps.wide_cols_ptr[lv + 1]],
                              np.concatenate([np.arange(maps.sn_first[g], maps.sn_first[g] + maps.sn_size[g])
                                              for g in wide] + [np.zeros(0, np.int64)]))
        ent = np.concatenate([np.arange(colptr[j], colptr[j + 1]) for j in cols])
        assert np.array_equal(maps.ent[maps.ent_ptr[lv]:maps.ent_ptr[lv + 1]], ent)
        sizes = maps.sn_size[runs]
        assert np.array_equal(maps.narrow[maps.narrow_ptr[lv]:maps.narrow_ptr[lv + 1]], runs[sizes < _gpu_maps.WIDE])
        for g in runs:
            f, s = maps.sn_first[g], maps.sn_size[g]
            run_of[f:f + s] = g
            rows_below = rowind[colptr[f + s - 1] + 1:colptr[f + s]]
            below[g] = rows_below
            for t in range(s):
                column = rowind[colptr[f + t]:colptr[f + t + 1]]
                assert np.array_equal(column, np.concatenate([np.arange(f + t, f + s), rows_below]))
                assert maps.base[f + t] == colptr[f + t] + s - t
    for j in range(plan.n):                             # a parent's run is on a higher level, or the same run
        parent = plan.parent[j]
        assert parent < 0 or run_of[parent] == run_of[j] or level_of[run_of[parent]] > level_of[run_of[j]]
    pattern = sp.csc_array((np.ones(plan.nnz_l), rowind, colptr), shape=(plan.n, plan.n))
    strict = sp.tril(pattern, -1).tocsr()
    strict.sort_indices()
    for i in range(plan.n):
        runs = maps.rl_sn[maps.rl_ptr[i]:maps.rl_ptr[i + 1]]
        assert np.all(np.diff(runs) > 0)
        for g, r in zip(runs, maps.rl_idx[maps.rl_ptr[i]:maps.rl_ptr[i + 1]]):
            assert below[g][r] == i
        cols = np.concatenate([np.arange(maps.sn_first[g], maps.sn_first[g] + maps.sn_size[g]) for g in runs]
                              + [np.arange(maps.sn_first[run_of[i]], i)])
        assert np.array_equal(np.sort(cols), strict.indices[strict.indptr[i]:strict.indptr[i + 1]])
    values = p.values(0, 1, "float64", seed=1)[0]
    rows = np.repeat(np.arange(plan.n), np.diff(maps.a_ptr))
    rebuilt = np.zeros((plan.n, plan.n))
    np.add.at(rebuilt, (rows, maps.a_col), values[maps.a_src])
    assert np.array_equal(rebuilt, p.dense(values[None])[0])


# ----------------------------------------------------------------------------------- factorization
def test_reconstruction_ratio(problem, device):
    """P A P^T = L D L^T below ratio 30 against the dense float64 matrices (matrices without perturbed
    pivots: a perturbed pivot factors a nearby matrix, by design)."""
    p, plan = problem
    values = p.values(0, 3, "float64", seed=2)
    factor = device.factorize(plan, values)
    a = p.dense(values)
    perturbed = device.host(factor.perturbed_pivots())
    checked = 0
    for i in range(3):
        if perturbed[i]:
            continue
        lower, d = factor.factors(i)
        assert _ratio(lower, d, a[i][np.ix_(plan.perm, plan.perm)], a[i]) < THRESHOLD
        checked += 1
    if p.matrix_kind == "spd":
        assert checked == 3


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_indefinite_reconstruction_solve_and_inertia(device, dtype):
    """Random sparse symmetric indefinite matrices (no tiny pivot): reconstruction, inertia against
    eigvalsh, solve."""
    n, count = 70, 5
    indptr, cols, values, mats = _random_indefinite(n, count, seed=7)
    plan = batchlu.sparse.analyze(indptr, cols, n, pattern="lower")
    factor = device.factorize(plan, values.astype(dtype))
    assert device.host(factor.perturbed_pivots()).tolist() == [0] * count
    w = np.linalg.eigvalsh(mats)
    inertia = device.host(factor.inertia())
    assert inertia.dtype == np.int64 and inertia.shape == (count, 3)
    assert np.array_equal(inertia, np.stack([(w > 0).sum(1), (w < 0).sum(1), np.zeros(count, int)], 1))
    assert (w < 0).any(axis=1).all()   # indefinite indeed
    if dtype == "float64":
        for i in range(count):
            lower, d = factor.factors(i)
            assert _ratio(lower, d, mats[i][np.ix_(plan.perm, plan.perm)], mats[i]) < THRESHOLD
    b = np.random.default_rng(1).standard_normal((count, n, 2)).astype(dtype)
    x, info = factor.solve(device.xp.asarray(b))
    x, info = device.host(x), device.host(info)
    assert x.dtype == np.dtype(dtype) and x.shape == b.shape and np.all(info == 0)
    eps = np.finfo(dtype).eps
    r = b.astype(float) - mats @ x.astype(float)
    ref = np.abs(r).max(1) / (np.abs(mats).sum(2).max(1)[:, None] * np.abs(x).max(1) + np.abs(b).max(1))
    assert np.all(ref <= THRESHOLD * n * eps), ref / (n * eps)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_solve_backward_error_on_generators(problem, device, dtype):
    p, plan = problem
    values = p.values(3, 9, dtype, seed=11)
    b = p.rhs(3, 9, None, dtype, seed=11)
    factor = device.factorize(plan, values)
    # the KKT kinds perturb dozens of pivots; float32 needs more than the default 2 steps
    x, info = factor.solve(device.xp.asarray(b), refine=10)
    berr = device.host(factor.backward_error(device.xp.asarray(b), x))
    x, info = device.host(x), device.host(info)
    assert x.dtype == np.dtype(dtype) and x.shape == b.shape and info.dtype == np.int32
    assert np.all(info == 0), info
    eps = np.finfo(dtype).eps
    assert np.all(berr <= THRESHOLD * p.n * eps), berr / (p.n * eps)
    assert np.array_equal(berr, device.host(factor.last_backward_error))
    a = p.dense(values.astype(np.float64))
    r = b.astype(np.float64) - np.einsum("bij,bj->bi", a, x.astype(np.float64))
    ref = np.abs(r).max(1) / (np.abs(a).sum(2).max(1) * np.abs(x).max(1) + np.abs(b).max(1))
    assert np.all(ref <= THRESHOLD * p.n * eps), ref / (p.n * eps)


def test_inertia_and_counts_agree_with_the_cpu(problem, device):
    """Same pivot rule as the CPU backend: the same info, perturbed counts and inertia (eigvalsh's)."""
    p, plan = problem
    values = p.values(0, 4, "float64", seed=5)
    factor, cpu = device.factorize(plan, values), plan.factorize(values)
    assert np.array_equal(device.host(factor.info), cpu.info)
    assert np.array_equal(device.host(factor.perturbed_pivots()), cpu.perturbed_pivots())
    assert np.array_equal(device.host(factor.inertia()), cpu.inertia())
    w = np.linalg.eigvalsh(p.dense(values))
    assert np.array_equal(device.host(factor.inertia()), np.stack([(w > 0).sum(1), (w < 0).sum(1),
                                                                   np.zeros(4, int)], axis=1))
    pivots = device.host(factor.pivots())
    assert pivots.shape == (4, p.n) and np.array_equal(np.sign(pivots), np.sign(cpu.pivots()))


def _zero_pivot_problem():
    a = np.array([[0.0, 1.0, 0.0, 0.0], [1.0, 2.0, 1.0, 0.0], [0.0, 1.0, 3.0, 1.0], [0.0, 0.0, 1.0, 4.0]])
    rows, cols = np.tril_indices(4)
    keep = a[rows, cols] != 0
    keep[0] = True                         # store the zero (0, 0) entry
    rows, cols = rows[keep], cols[keep]
    indptr = np.concatenate(([0], np.cumsum(np.bincount(rows, minlength=4))))
    plan = batchlu.sparse.analyze(indptr, cols, 4, ordering="natural")
    return a, plan, np.stack([a[rows, cols], 2 * a[rows, cols]])


def test_zero_pivot_perturbed_and_refined(device):
    """A diagonal entry exactly zero at the first pivot: perturbed (counted), refinement recovers x;
    perturbation off: info names the zero pivot and x is NaN."""
    a, plan, values = _zero_pivot_problem()
    b = np.random.default_rng(0).standard_normal((2, 4))
    factor = device.factorize(plan, values)
    assert device.host(factor.perturbed_pivots()).tolist() == [1, 1]
    x, info = factor.solve(device.xp.asarray(b), refine=10)
    assert device.host(info).tolist() == [0, 0]
    berr = device.host(factor.backward_error(device.xp.asarray(b), x))
    assert np.all(berr <= THRESHOLD * 4 * np.finfo(float).eps)
    assert np.all(device.host(factor.last_backward_error) <= THRESHOLD * 4 * np.finfo(float).eps)
    assert np.all(device.host(factor.refine_steps) >= 1)
    w = np.linalg.eigvalsh(a)
    assert device.host(factor.inertia())[0].tolist() == [(w > 0).sum(), (w < 0).sum(), 0]
    off = device.factorize(plan, values, perturb=False)
    assert device.host(off.info).tolist() == [1, 1] and device.host(off.perturbed_pivots()).tolist() == [0, 0]
    x, info = off.solve(device.xp.asarray(b))
    assert device.host(info).tolist() == [1, 1] and np.isnan(device.host(x)).all()
    assert device.host(off.inertia()).tolist() == [[-1, -1, -1]] * 2  # non-finite pivots follow the zero


@pytest.mark.parametrize("band", [True, False], ids=["tridiagonal", "dense"])
@pytest.mark.parametrize("perturb", [False, True])
def test_a_last_zero_pivot_is_counted_once(device, band, perturb):
    """The last pivot exactly zero (nothing after it to turn NaN): counted once, as the CPU does
    (tests/kernels/sparse/test_factorize.py)."""
    plan, values, d = last_zero_pivot_batch(9 if band else 6, 5, seed=21 + band, band=band)
    factor = device.factorize(plan, values, perturb=perturb)
    info, perturbed, inertia = expected_last_zero(d, perturb)
    pivots = device.host(factor.pivots())
    assert np.array_equal(pivots[:, :-1], d[:, :-1])
    assert np.all(pivots[:, -1] > 0) if perturb else np.all(pivots[:, -1] == 0)
    assert device.host(factor.info).tolist() == info
    assert device.host(factor.perturbed_pivots()).tolist() == perturbed
    assert device.host(factor.inertia()).tolist() == inertia

def test_singular_matrix_later_pivot(device):
    """A structurally full but numerically singular matrix (two equal rows): with perturbation off the
    first zero pivot's 1-based column in C's numbering; with it on, a perturbed pivot and no -1/NaN."""
    a = np.array([[4.0, 2.0, 2.0], [2.0, 1.0, 1.0], [2.0, 1.0, 3.0]])   # rows 0 and 1 dependent
    indptr, cols = _lower_csr(a)
    rows = np.repeat(np.arange(3), np.diff(indptr))
    plan = batchlu.sparse.analyze(indptr, cols, 3, ordering="natural")
    values = a[rows, cols][None]
    off = device.factorize(plan, values, perturb=False)
    assert device.host(off.info).tolist() == [2]
    cpu = plan.factorize(values, perturb=False)
    assert cpu.info.tolist() == [2]
    on = device.factorize(plan, values)
    assert device.host(on.perturbed_pivots()).tolist() == [1] and device.host(on.info).tolist() == [0]


def test_refinement_short_of_tolerance_is_minus_four(device):
    p = gen.make("power-grid", size=300, seed=2)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n)
    values, b = p.values(0, 3, "float32", seed=1), p.rhs(0, 3, None, "float32", seed=1)
    factor = device.factorize(plan, values, pivot_tol=1e-2)
    x, info = factor.solve(device.xp.asarray(b), refine=0, tol=1e-12)
    assert np.all(device.host(info) == INFO_REFINEMENT)
    assert np.isfinite(device.host(x)).all()
    assert np.all(device.host(factor.last_backward_error) > 1e-12)


KKT_CASES = [(delta, "float64") for delta in gen.KKT_DELTAS] + [(1e-4, "float32")]


@pytest.mark.parametrize("delta, dtype", KKT_CASES, ids=[f"{d:g}-{t}" for d, t in KKT_CASES])
def test_the_kkt_family_solves_on_the_defaults(device, delta, dtype):
    """The regularized KKT family at every delta on the defaults: the matrices the sqrt(eps) ||A||
    threshold breaks get the second attempt at eps ||A|| (the shared rule of
    tests/kernels/sparse/test_factorize.py) and every matrix solves to <= 30 n eps (the factor's
    backward error, and get02 from the dense matrices); the same matrices retried as on the CPU, the
    second attempt's factors kept (no perturbed pivot, A's inertia), a second solve the same."""
    p = gen.make("kkt", size=300, seed=5, delta=delta)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n, kind=p.matrix_kind)
    values, b = p.values(0, 6, dtype, seed=12), p.rhs(0, 6, None, dtype, seed=12)
    factor = device.factorize(plan, values)
    x, info = factor.solve(device.xp.asarray(b))
    berr = device.host(factor.backward_error(device.xp.asarray(b), x))
    x, info = device.host(x), device.host(info)
    assert x.dtype == np.dtype(dtype) and x.shape == b.shape and info.dtype == np.int32 and info.shape == (6,)
    assert np.all(info == 0), info
    assert np.isfinite(x).all()
    eps = np.finfo(dtype).eps
    assert np.all(berr <= THRESHOLD * p.n * eps), berr / (p.n * eps)
    assert np.array_equal(berr, device.host(factor.last_backward_error))
    assert np.all(get02(p.dense(values), x, b) <= THRESHOLD * p.n)
    cpu = plan.factorize(values)
    _, cpu_info = cpu.solve(b)
    retried = device.host(factor.retried())
    assert retried.dtype == bool and np.array_equal(retried, cpu.retried()) and np.array_equal(info, cpu_info)
    if delta <= 1e-8 or dtype == "float32":
        assert retried.all()
    assert np.all(device.host(factor.perturbed_pivots()) == 0) and np.all(device.host(factor.info) == 0)
    assert np.all(device.host(factor.inertia()) == np.array(p.inertia))
    other = device.factorize(plan, p.values(6, 12, dtype, seed=12))   # the workspace's factors another's now
    other.solve(device.xp.asarray(b))
    again, info_again = factor.solve(device.xp.asarray(b))
    assert np.array_equal(device.host(again), x) and np.all(device.host(info_again) == 0)


def test_the_second_attempt_takes_only_the_flagged_matrices(device):
    """A batch mixing matrices the threshold breaks, ones it does not, a non-finite matrix and a
    non-finite right-hand side: only the first are factored again, and each matrix's results are
    those of its own attempt on the device, bit for bit."""
    p = gen.make("kkt", size=200, seed=6, delta=1e-8)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n, kind=p.matrix_kind)
    values, b = p.values(0, 7, seed=13), p.rhs(0, 7, 2, seed=13)
    diagonal = np.flatnonzero(values[0] == -1e-8)
    values[np.ix_([1, 4], diagonal)] = -1e-2
    values[2, 5] = np.nan
    b[6, 3, 1] = np.inf
    factor = device.factorize(plan, values)
    x, info = factor.solve(device.xp.asarray(b))
    x, info = device.host(x), device.host(info)
    assert info.tolist() == [0, 0, INFO_NONFINITE_INPUT, 0, 0, 0, INFO_NONFINITE_INPUT]
    assert device.host(factor.retried()).tolist() == [True, False, False, True, False, True, False]
    for rows, tol in (([0, 3, 5], float(np.finfo(float).eps)), ([1, 4], None)):
        own = device.factorize(plan, values[rows], pivot_tol=tol)
        x_own, info_own = own.solve(device.xp.asarray(b[rows]))
        assert np.array_equal(x[rows], device.host(x_own)) and np.array_equal(info[rows], device.host(info_own))
        assert np.array_equal(device.host(factor.last_backward_error)[rows], device.host(own.last_backward_error))
        assert np.array_equal(device.host(factor.pivots())[rows], device.host(own.pivots()))
    assert np.isnan(x[[2, 6]]).all()


def test_a_singular_kkt_matrix_stays_minus_four(device):
    """delta = 0 with dependent constraint rows (exactly singular): the second attempt perturbs pivots
    too, so it is not taken: -4, the first attempt's finite best iterate, as on the CPU."""
    p = gen.make("kkt", size=200, seed=7, delta=0.0)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n, kind=p.matrix_kind)
    values, b = p.values(0, 3, seed=14), p.rhs(0, 3, None, seed=14)
    factor = device.factorize(plan, values)
    x, info = factor.solve(device.xp.asarray(b))
    assert device.host(info).tolist() == [INFO_REFINEMENT] * 3 and not device.host(factor.retried()).any()
    assert np.isfinite(device.host(x)).all() and np.all(device.host(factor.perturbed_pivots()) > 0)
    assert np.all(device.host(factor.last_backward_error) > p.n * np.finfo(float).eps)
    first = device.factorize(plan, values, pivot_tol=float(np.sqrt(np.finfo(float).eps)))
    x_first, _ = first.solve(device.xp.asarray(b))
    assert np.array_equal(device.host(x), device.host(x_first))


def test_nonfinite_values_and_rhs_in_a_mixed_batch(device):
    p = gen.make("fem-poisson", size=150, seed=0)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n)
    values, b = p.values(0, 5, seed=9), p.rhs(0, 5, 3, seed=9)
    values[1, 7] = np.nan
    values[3, 0] = np.inf
    b[4, 2, 1] = np.nan
    factor = device.factorize(plan, values)
    assert device.host(factor.info).tolist() == [0, -1, 0, -1, 0]
    assert device.host(factor.inertia())[1].tolist() == [-1, -1, -1]
    assert device.host(factor.perturbed_pivots())[1] == -1
    x, info = factor.solve(device.xp.asarray(b))
    x, info = device.host(x), device.host(info)
    assert info.tolist() == [0, INFO_NONFINITE_INPUT, 0, INFO_NONFINITE_INPUT, INFO_NONFINITE_INPUT]
    assert np.isnan(x[[1, 3, 4]]).all() and np.isfinite(x[[0, 2]]).all()
    berr = device.host(factor.last_backward_error)
    assert np.isnan(berr[[1, 3, 4]]).all() and np.all(berr[[0, 2]] <= THRESHOLD * p.n * np.finfo(float).eps)
    clean, _ = device.factorize(plan, values[[0, 2]]).solve(device.xp.asarray(b[[0, 2]]))
    assert np.array_equal(device.host(clean), x[[0, 2]])   # bad neighbours change nothing


def test_batch_independence_bit_for_bit(device):
    """A matrix's factors and solution do not depend on the batch around it."""
    p = gen.make("fem-elasticity", size=300, seed=1)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n)
    values, b = p.values(0, 7, seed=3), p.rhs(0, 7, 2, seed=3)
    together, _ = device.factorize(plan, values).solve(device.xp.asarray(b))
    together = device.host(together)
    for i in (0, 4, 6):
        alone, _ = device.factorize(plan, values[i:i + 1]).solve(device.xp.asarray(b[i:i + 1]))
        assert np.array_equal(device.host(alone)[0], together[i])


def test_single_matrix_shapes_and_errors(device):
    p = gen.make("saddle", size=120)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n)
    factor = device.factorize(plan, p.values(0, 1)[0])
    b = device.xp.asarray(p.rhs(0, 1)[0])
    x, info = factor.solve(b)
    assert x.shape == (p.n,) and info.shape == () and factor.inertia().shape == (3,)
    assert factor.perturbed_pivots().shape == () and factor.pivots().shape == (p.n,)
    with pytest.raises(InputError, match="Expected b of shape"):
        factor.solve(b[:-1])
    with pytest.raises(InputError, match="Expected values of shape"):
        device.factorize(plan, np.zeros((2, p.nnz + 1)))
    with pytest.raises(TypeError, match="float32 or float64"):
        device.factorize(plan, np.zeros((2, p.nnz), np.complex128))
    with pytest.raises(InputError, match="refine"):
        factor.solve(b, refine=-1)
    with pytest.raises(InputError, match="pivot_tol"):
        device.factorize(plan, p.values(0, 1), pivot_tol=-1.0)


def test_empty_batch(device):
    p = gen.make("fem-poisson", size=60)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n)
    factor = device.factorize(plan, np.zeros((0, p.nnz)))
    x, info = factor.solve(device.xp.zeros((0, p.n)))
    assert x.shape == (0, p.n) and info.shape == (0,) and factor.inertia().shape == (0, 3)


# ------------------------------------------------------------------------------ host run of the text
def test_one_launch_per_level_and_step_for_the_whole_batch(host_lib):
    """The factorization's launches do not grow with the batch: per supernodal level one for what
    the supernodes below contribute (not on the leaves), one for the narrow runs' panels and one
    for the wide runs' (a block per run and group of matrices), plus one for the norms;
    supernodal levels are fewer than the column levels."""
    p = gen.make("fem-poisson", size=1000, seed=3)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n)
    maps = _gpu_maps.build(plan)
    wide = np.count_nonzero(np.diff(maps.wide_ptr))
    assert maps.nlevels < plan.nlevels and wide > 0
    narrow = np.count_nonzero(np.diff(maps.narrow_ptr))
    expected = (maps.nlevels - 1) + narrow + wide + 1
    for count in (1, 6):
        launch = HostLaunch(host_lib)
        _gpu.factorize_with(plan, p.values(0, count), perturb=True, pivot_tol=None, xp=np, launch=launch)
        assert launch.launches == expected


@pytest.mark.parametrize("kind", ["fem-poisson", "fem-elasticity"])
def test_wide_and_narrow_runs_give_the_same_bits(host_lib, monkeypatch, kind):
    """A run factored a column at a time over all its rows (wide) gives the same factors, bit for
    bit, as one thread per run and matrix (narrow): every run wide, the default split, none wide."""
    p = gen.make(kind, size=1000, seed=2)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n)
    values, b = p.values(0, 3, seed=5), p.rhs(0, 3, seed=5)
    assert _gpu_maps.build(plan).wide.size > 0                  # the default split has wide runs here
    results = []
    for wide in (1, _gpu_maps.WIDE, 10**9):
        monkeypatch.setattr(_gpu_maps, "WIDE", wide)
        _gpu_maps.for_plan._cache.clear()
        _gpu._ON_DEVICE.clear()
        maps = _gpu_maps.for_plan(plan)
        assert (maps.wide_cols.size == plan.n) if wide == 1 else (maps.wide_cols.size < plan.n)
        factor = _host_device(host_lib).factorize(plan, values)
        x, _ = factor.solve(b)
        results.append((factor.lx.copy(), x))
    _gpu_maps.for_plan._cache.clear()
    _gpu._ON_DEVICE.clear()
    for other in results[1:]:
        assert np.array_equal(results[0][0], other[0]) and np.array_equal(results[0][1], other[1])


@pytest.mark.parametrize("kind", ["fem-elasticity", "power-grid"])
def test_threads_in_any_order_give_the_same_bits(host_lib, kind):
    """No thread of a launch depends on another one: running every launch's threads last to first
    gives the same factors and solutions, bit for bit."""
    p = gen.make(kind, size=250, seed=6)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n)
    values, b = p.values(0, 4, seed=2), p.rhs(0, 4, 2, seed=2)
    results = []
    for order in (0, 1):
        factor = _host_device(host_lib, order).factorize(plan, values)
        x, info = factor.solve(b, refine=3)
        results.append((factor.lx.copy(), x, info, factor.last_backward_error))
    for first, second in zip(*results):
        assert np.array_equal(first, second, equal_nan=True)


ASAN_SCRIPT = """
import sys
import numpy as np
import _cuda_on_host as host
import batchlu
from batchlu.kernels.sparse import _gpu
from batchlu.testing import sparse as gen

lib = host.build(sys.argv[1], flags=("-fsanitize=address", "-fno-omit-frame-pointer"))
for kind, dim in (("fem-elasticity", 3), ("saddle", 2), ("power-grid", 2)):
    p = gen.make(kind, size=150, dim=dim, seed=1)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n)
    values, b = p.values(0, 3), p.rhs(0, 3, 2)
    values[1, 0] = np.nan
    factor = _gpu.factorize_with(plan, values, perturb=True, pivot_tol=None, xp=np, launch=host.HostLaunch(lib))
    x, info = factor.solve(b, refine=3)
    factor.backward_error(b, x)
    one = _gpu.factorize_with(plan, values[0], perturb=False, pivot_tol=None, xp=np, launch=host.HostLaunch(lib))
    one.solve(b[0, :, 0])
    print(kind, info.tolist())
print("done")
"""


def test_kernels_stay_inside_their_arrays(host_lib, tmp_path):
    """The host run of ldlt.cu under AddressSanitizer (in a child process that preloads it): no
    launch reads or writes outside its arrays."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    found = subprocess.run([compiler(), "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not found or not Path(found).is_absolute() or not Path(found).exists():
        pytest.skip("the host compiler has no AddressSanitizer runtime")
    env = dict(os.environ, LD_PRELOAD=found, ASAN_OPTIONS="detect_leaks=0:abort_on_error=0",
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", ASAN_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0 and "AddressSanitizer" not in done.stderr, done.stderr[-3000:]
    assert done.stdout.strip().endswith("done"), done.stdout
    assert "saddle [0, -1, 0]" in done.stdout


def test_cuda_launch_compiles_the_dtype_family_and_covers_the_threads(monkeypatch):
    """CudaLaunch (without a GPU: the compiled kernel is a stand-in): the family's kernels of the
    launch's dtype compiled together, a 1-D grid of THREADS-thread blocks covering every thread,
    nothing launched for no thread, each function looked up once per instance."""
    from batchlu.kernels._gpu import _runtime

    calls, lookups = [], []

    def kernel(family, name, names):
        lookups.append(name)
        return lambda grid, block, args: calls.append((family, name, names, grid, block, args))

    monkeypatch.setattr(_runtime, "kernel", kernel)
    launch = _gpu.CudaLaunch()
    launch(_gpu.name("ldlt_panel", np.float32), 2 * _gpu.THREADS + 1, ("args",))
    launch(_gpu.name("ldlt_external", np.float64), 0, ("args",))
    ((family, name, names, grid, block, args),) = calls
    assert family == "ldlt" and name == "blu::ldlt_panel<float>" and name in names
    assert names == _gpu.names(np.float32) and all(n.endswith("<float>") for n in names)
    assert len(names) == len(_gpu.KERNELS) == 12
    assert grid == (3,) and block == (_gpu.THREADS,) and args == ("args",)
    launch(_gpu.name("ldlt_panel", np.float32), 1, ("again",))
    assert lookups == ["blu::ldlt_panel<float>"] and calls[-1][3:] == ((1,), (_gpu.THREADS,), ("again",))


# ---------------------------------------------------------------- recorded launches (CUDA graphs)
def _results(factor, b, refine=2):
    x, info = factor.solve(b, refine=refine)
    return factor.lx.copy(), x, info, factor.last_backward_error.copy(), factor.refine_steps.copy()


@pytest.mark.parametrize("kind", ["fem-elasticity", "saddle", "power-grid"])
def test_recorded_launches_give_the_same_bits(host_lib, monkeypatch, kind):
    """The recorded path (a workspace's buffers, launches recorded once and replayed: CUDA graphs on
    the GPU) gives the factors, solutions, codes, backward errors and step counts of the launch-by-
    launch path, bit for bit: two factorizations on one workspace, the first one's solve after the
    second (its factors copied back in), two right-hand-side counts, a matrix with a NaN, and each
    recording made once."""
    p = gen.make(kind, size=300, seed=7)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n)
    v1, v2 = p.values(0, 5, seed=1), p.values(5, 10, seed=2)
    v2[3, 1] = np.nan
    b1, b3 = p.rhs(0, 5, seed=3), p.rhs(0, 5, 3, seed=4)
    records = []
    real = _gpu.record
    monkeypatch.setattr(_gpu, "record", lambda launch, body, dtype: records.append(dtype) or real(launch, body, dtype))
    eager, recorded = _host_device(host_lib), _host_device(host_lib, recorded=True)
    want = [_results(eager.factorize(plan, v), b) for v in (v1, v2) for b in (b1, b3)]
    assert records == []
    _gpu.Workspace._made.clear()
    f1, f2 = recorded.factorize(plan, v1), recorded.factorize(plan, v2)
    assert f1._space[0] is f2._space[0] and f1._space[1] is not f2._space[1]
    got = [_results(f2, b1), _results(f1, b1), _results(f1, b3), _results(f2, b3)]
    for w, g in zip([want[2], want[0], want[1], want[3]], got):
        for a, c in zip(w, g):
            assert a.dtype == c.dtype and np.array_equal(a, c, equal_nan=True)
    assert len(records) == 1 + 2 + 2       # the factorization once; forward and backward per k
    assert got[0][2][3] == INFO_NONFINITE_INPUT


def test_recorded_path_falls_back_past_its_memory_bound(host_lib, monkeypatch):
    """A batch whose workspace would pass GRAPH_BYTES runs launch by launch, with the same results."""
    p = gen.make("fem-poisson", size=200, seed=2)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n)
    values, b = p.values(0, 3, seed=1), p.rhs(0, 3, seed=1)
    want = _results(_host_device(host_lib).factorize(plan, values), b)
    monkeypatch.setattr(_gpu, "GRAPH_BYTES", _gpu.Workspace.nbytes(plan, np.float64, 3) - 1)
    _gpu.Workspace._made.clear()
    factor = _host_device(host_lib, recorded=True).factorize(plan, values)
    assert factor._space is None and not _gpu.Workspace._made
    for a, c in zip(want, _results(factor, b)):
        assert np.array_equal(a, c, equal_nan=True)


@pytest.mark.gpu
def test_cuda_graphs_give_the_launch_by_launch_bits(monkeypatch):
    """On the GPU: plan.factorize with CUDA graphs (the default) and without
    (BATCHLU_SPARSE_GRAPHS=0) give the same bits; a second factorization and solve replays them."""
    import cupy

    p = gen.make("fem-elasticity", size=2000, seed=3)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n)
    values, b = cupy.asarray(p.values(0, 16, seed=5)), cupy.asarray(p.rhs(0, 16, 2, seed=5))
    runs = {}
    for graphs in ("0", "1"):
        monkeypatch.setenv("BATCHLU_SPARSE_GRAPHS", graphs)
        factor = plan.factorize(values)
        assert (factor._space is not None) == (graphs == "1")
        runs[graphs] = [cupy.asnumpy(a) for a in _results(factor, b)]
        again = plan.factorize(values[::-1].copy())
        assert all(np.array_equal(a, c[::-1] if a.ndim and a.shape[0] == 16 else c, equal_nan=True)
                   for a, c in zip(runs[graphs][1:], [cupy.asnumpy(x) for x in _results(again, b[::-1].copy())][1:]))
    for a, c in zip(runs["0"], runs["1"]):
        assert np.array_equal(a, c, equal_nan=True)


@pytest.mark.gpu
def test_cuda_graphs_keep_what_they_use_alive():
    """A recorded solve replayed after the memory pool has handed out and filled fresh arrays gives
    the launch-by-launch result every time: every buffer the graphs use stays allocated."""
    import cupy

    p = gen.make("fem-poisson", size=3000, seed=2)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n)
    values, b = cupy.asarray(p.values(0, 9, seed=1)), cupy.asarray(p.rhs(0, 9, seed=1))
    eager = _gpu.factorize_with(plan, values, perturb=True, pivot_tol=None, xp=cupy, launch=_gpu.CudaLaunch())
    want = cupy.asnumpy(eager._first(b[:, :, None]))
    factor = plan.factorize(values)
    assert factor._space is not None
    for _ in range(4):
        junk = [cupy.full(int(n), cupy.nan) for n in (10**3, 10**5, 10**6)]
        got = cupy.asnumpy(factor._first(b[:, :, None]))
        del junk
        assert np.array_equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["fem-poisson", "fem-elasticity"])
def test_wide_and_narrow_runs_give_the_same_bits_on_the_gpu(monkeypatch, kind):
    """On the GPU (CUDA graphs): every run wide, the default split and none wide give the same
    factors, solutions and codes, bit for bit, with a batch not a multiple of a wide block's
    matrices and two right-hand sides."""
    import cupy

    p = gen.make(kind, size=3000, seed=4)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n)
    values, b = cupy.asarray(p.values(0, 37, seed=5)), cupy.asarray(p.rhs(0, 37, 2, seed=5))
    runs = []
    for wide in (1, _gpu_maps.WIDE, 10**9):
        monkeypatch.setattr(_gpu_maps, "WIDE", wide)
        _gpu_maps.for_plan._cache.clear()
        _gpu._ON_DEVICE.clear()
        _gpu.Workspace._made.clear()
        runs.append([cupy.asnumpy(a) for a in _results(plan.factorize(values), b)])
    _gpu_maps.for_plan._cache.clear()
    _gpu._ON_DEVICE.clear()
    _gpu.Workspace._made.clear()
    for other in runs[1:]:
        for a, c in zip(runs[0], other):
            assert np.array_equal(a, c, equal_nan=True)


@pytest.mark.parametrize("kind", ["saddle", "power-grid"])
def test_whole_batch_refinement_keeps_the_active_rows_rules(host_lib, monkeypatch, kind):
    """Refinement over the whole batch (the device's way: every matrix each step, results chosen per
    matrix) gives the solutions, codes, backward errors and step counts of refining only the active
    matrices, bit for bit, in a batch mixing a non-finite matrix, a non-finite right-hand side,
    matrices that converge at once and ones that need steps."""
    p = gen.make(kind, size=300, seed=9)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n)
    values, b = p.values(0, 6, seed=4), p.rhs(0, 6, 2, seed=4)
    values[1, 2] = np.nan
    b[4, 0, 1] = np.inf
    b[2] = 0.0                                          # converges before any step
    results = []
    for whole in (False, True):
        monkeypatch.setattr(_gpu.GpuFactor, "whole_batch", whole)
        factor = _host_device(host_lib).factorize(plan, values)
        results.append(_results(factor, b, refine=3)[1:])
    steps = results[0][3]
    assert steps[2] == 0 and steps.max() >= 1 and results[0][1][1] == results[0][1][4] == INFO_NONFINITE_INPUT
    for a, c in zip(*results):
        assert a.dtype == c.dtype and np.array_equal(a, c, equal_nan=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_backward_error_kernel_matches_the_reference(host_lib, dtype):
    """ldlt_backward_error gives Refining._berr's values bit for bit: random residuals, solutions and
    right-hand sides with NaN, inf, a zero denominator with and without a residual, and non-finite
    norms of A among them."""
    from batchlu.kernels.sparse._shared import Refining

    p = gen.make("saddle", size=60, seed=1)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n)
    factor = _host_device(host_lib).factorize(plan, p.values(0, 8, dtype=np.dtype(dtype).name, seed=2))
    rng = np.random.default_rng(5)
    shape = (8, p.n, 3)
    r = rng.standard_normal(shape) * 10.0 ** rng.integers(-18, 2, shape)
    x = (rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, shape)).astype(dtype)
    b = rng.standard_normal(shape)
    r[1, 4, 0], x[2, 7, 1], b[3, 0, 2] = np.nan, np.inf, -np.inf
    r[4], x[4], b[4] = 0.0, 0.0, 0.0                      # 0 / 0: backward error 0
    x[5], b[5] = 0.0, 0.0                                 # a residual over a zero denominator: inf
    factor.anorm = factor.anorm.copy()
    factor.anorm[6] = np.nan
    rows = np.arange(8, dtype=np.int64)
    got = factor._berr(r, x, b, rows)
    want = Refining._berr(factor, r, x, b, rows)
    assert np.array_equal(got, want, equal_nan=True)
    assert np.isnan(got[[1, 2, 3, 6]]).all() and got[4] == 0 and got[5] == np.inf and np.isfinite(got[[0, 7]]).all()


@pytest.mark.gpu
def test_backward_error_kernel_on_the_gpu_matches_cupy():
    """On the GPU, ldlt_backward_error (its product not fused into the sum) gives the CuPy
    operations' values bit for bit."""
    import cupy

    from batchlu.kernels.sparse._shared import Refining

    p = gen.make("fem-poisson", size=500, seed=1)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n)
    factor = plan.factorize(cupy.asarray(p.values(0, 16, seed=2)))
    rng = np.random.default_rng(6)
    shape = (16, p.n, 2)
    r, x, b = (cupy.asarray(rng.standard_normal(shape) * 10.0 ** rng.integers(-18, 2, shape)) for _ in range(3))
    r[1, 3, 0] = cupy.nan
    rows = cupy.arange(16, dtype=np.int64)
    got, want = factor._berr(r, x, b, rows), Refining._berr(factor, r, x, b, rows)
    assert np.array_equal(cupy.asnumpy(got), cupy.asnumpy(want), equal_nan=True)
    assert bool(cupy.isnan(got[1])) and bool(cupy.isfinite(got[2:]).all())
