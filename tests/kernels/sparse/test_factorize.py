"""The CPU numeric LDL^T: reconstruction against a dense reference, solves with refinement on every
generator in both precisions, inertia against eigvalsh, static pivoting and the second attempt at
``eps ||A||`` (the regularized KKT family at every delta on the defaults), the info codes; every test
on both CPU engines (compiled: ``_cpu_numba``, its BLAS and lane paths; NumPy: ``_cpu``)."""

from __future__ import annotations

import numpy as np
import pytest

import batchlu
from batchlu.errors import InputError
from batchlu.kernels.sparse import INFO_NONFINITE_INPUT, INFO_REFINEMENT
from batchlu.testing import sparse as gen
from batchlu.testing.ratios import get02

from _exact_ldlt import expected_last_zero, last_zero_pivot_batch

THRESHOLD = 30


@pytest.fixture(autouse=True, params=["compiled", "compiled-blas", "compiled-lanes", "numpy"])
def engine(request, monkeypatch):
    """The engines; ``compiled-blas`` sends every supernode through BLAS in column blocks of 3 (panel)
    and 5 (update), so that the small matrices here take every branch of the blocked code;
    ``compiled-lanes`` keeps every supernode on the lane loops."""
    from batchlu.kernels.sparse import _cpu_numba

    monkeypatch.setenv("BATCHLU_CPU_ENGINE", request.param.split("-")[0])
    if request.param == "compiled-blas":
        monkeypatch.setattr(_cpu_numba, "BLAS_MIN", 1)
        monkeypatch.setattr(_cpu_numba, "PANEL_BLOCK", 3)
        monkeypatch.setattr(_cpu_numba, "UPDATE_BLOCK", 5)
    elif request.param == "compiled-lanes":
        monkeypatch.setattr(_cpu_numba, "BLAS_MIN", 1 << 40)
        monkeypatch.setattr(_cpu_numba, "BLAS_MIN_TALL", 1 << 40)
    return request.param


@pytest.fixture(scope="module", params=[("fem-poisson", 2), ("fem-poisson", 3), ("fem-elasticity", 2),
                                        ("fem-elasticity", 3), ("saddle", 2), ("saddle", 3),
                                        ("power-grid", 2)], ids=lambda p: f"{p[0]}-{p[1]}d")
def problem(request):
    kind, dim = request.param
    p = gen.make(kind, size=260, dim=dim, seed=4)
    return p, batchlu.sparse.analyze(p.indptr, p.indices, p.n, kind=p.matrix_kind)


def _dense(problem, values):
    return problem.dense(values.astype(np.float64))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_solve_backward_error_on_generators(problem, dtype):
    p, plan = problem
    values = p.values(3, 9, dtype, seed=11)
    b = p.rhs(3, 9, None, dtype, seed=11)
    factor = plan.factorize(values)
    x = np.full(b.shape, np.nan, dtype)     # poisoned: every element must be written by solve
    # the KKT kinds perturb dozens of pivots; in float32 (threshold sqrt(eps) ~ 3e-4) refinement
    # then needs more than the default 2 steps
    x, info = factor.solve(b, refine=10)
    assert x.dtype == np.dtype(dtype) and x.shape == b.shape and info.dtype == np.int32
    assert np.all(info == 0), info
    berr = factor.backward_error(b, x)
    eps = np.finfo(dtype).eps
    assert np.all(berr <= THRESHOLD * p.n * eps), berr / (p.n * eps)
    assert np.array_equal(berr, factor.last_backward_error)
    # recomputed independently with the dense float64 matrices
    a = _dense(p, values)
    r = b.astype(np.float64) - np.einsum("bij,bj->bi", a, x.astype(np.float64))
    ref = np.abs(r).max(1) / (np.abs(a).sum(2).max(1) * np.abs(x).max(1) + np.abs(b).max(1))
    assert np.all(ref <= THRESHOLD * p.n * eps), ref / (p.n * eps)


def test_reconstruction_ratio(problem):
    """P A P^T = L D L^T: ||L D L^T - C|| / (n ||A|| eps) below 30 (LAPACK's dpot01 style)."""
    p, plan = problem
    values = p.values(0, 3, "float64", seed=2)
    factor = plan.factorize(values)
    a = _dense(p, values)
    for i in range(3):
        lower, d = factor.factors(i)
        c = a[i][np.ix_(plan.perm, plan.perm)]
        if factor.perturbed_pivots()[i]:
            continue  # a perturbed pivot factors a nearby matrix, by design
        recon = (lower.toarray() * d) @ lower.toarray().T
        ratio = np.abs(recon - c).sum(0).max() / (p.n * np.abs(a[i]).sum(0).max() * np.finfo(float).eps)
        assert ratio < THRESHOLD, ratio


def test_inertia_matches_eigvalsh(problem):
    p, plan = problem
    values = p.values(0, 4, "float64", seed=5)
    factor = plan.factorize(values)
    w = np.linalg.eigvalsh(_dense(p, values))
    ref = np.stack([(w > 0).sum(1), (w < 0).sum(1), np.zeros(4, int)], axis=1)
    assert factor.inertia().dtype == np.int64
    assert np.array_equal(factor.inertia(), ref)
    if p.inertia is not None:
        assert np.all(factor.inertia() == np.array(p.inertia))
    if p.matrix_kind == "spd":
        assert np.all(factor.perturbed_pivots() == 0)


def test_batch_independence_bit_for_bit(monkeypatch):
    """A matrix's factors and solution do not depend on the batch around it, nor on the blocks the
    batch is cut into."""
    from batchlu.kernels.sparse import _cpu

    p = gen.make("fem-elasticity", size=300, seed=1)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n)
    values, b = p.values(0, 7, seed=3), p.rhs(0, 7, 2, seed=3)
    together, _ = plan.factorize(values).solve(b)
    for i in (0, 4, 6):
        alone, _ = plan.factorize(values[i:i + 1]).solve(b[i:i + 1])
        assert np.array_equal(alone[0], together[i])
    monkeypatch.setattr(_cpu, "BLOCK", 3)
    blocked, _ = plan.factorize(values).solve(b)
    assert np.array_equal(blocked, together)


def test_threads_bit_for_bit(engine, monkeypatch):
    """The compiled engine's blocks split between threads give the same bits as one thread."""
    from batchlu.kernels import cpu_threads
    from batchlu.kernels.sparse import _cpu_numba

    p = gen.make("saddle", size=300, seed=2)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n, kind=p.matrix_kind)
    values, b = p.values(0, 21, seed=5), p.rhs(0, 21, None, seed=5)
    with cpu_threads(1):
        one, info_one = plan.factorize(values).solve(b)
    monkeypatch.setattr(_cpu_numba, "MIN_WORK", 1)
    with cpu_threads(2):
        factor = plan.factorize(values)
        two, info_two = factor.solve(b)
    assert np.array_equal(one, two) and np.array_equal(info_one, info_two)
    assert np.all(info_two == 0) and np.all(factor.last_backward_error <= THRESHOLD * p.n * np.finfo(float).eps)


def test_zero_pivot_perturbed_and_refined():
    """A diagonal entry exactly zero at the first pivot: perturbed (counted), refinement recovers x."""
    a = np.array([[0.0, 1.0, 0.0, 0.0], [1.0, 2.0, 1.0, 0.0], [0.0, 1.0, 3.0, 1.0], [0.0, 0.0, 1.0, 4.0]])
    rows, cols = np.tril_indices(4)
    keep = a[rows, cols] != 0
    keep[0] = True                         # store the zero (0, 0) entry
    rows, cols = rows[keep], cols[keep]
    indptr = np.concatenate(([0], np.cumsum(np.bincount(rows, minlength=4))))
    plan = batchlu.sparse.analyze(indptr, cols, 4, ordering="natural")
    values = np.stack([a[rows, cols], 2 * a[rows, cols]])
    b = np.random.default_rng(0).standard_normal((2, 4))
    factor = plan.factorize(values)
    assert factor.perturbed_pivots().tolist() == [1, 1]
    # without refinement the perturbed pivot leaves x far from the tolerance: -4, no steps taken
    x, info = factor.solve(b, refine=0)
    assert info.tolist() == [INFO_REFINEMENT] * 2 and factor.refine_steps.tolist() == [0, 0]
    unrefined = factor.last_backward_error.copy()
    assert np.all(unrefined > 4 * np.finfo(float).eps)
    x, info = factor.solve(b, refine=10)
    assert info.tolist() == [0, 0]
    steps = factor.refine_steps
    assert steps.dtype == np.int32 and steps.shape == (2,) and np.all((steps >= 1) & (steps <= 10)), steps
    berr = factor.backward_error(b, x)
    assert np.array_equal(berr, factor.last_backward_error) and np.all(berr < unrefined)
    assert np.all(berr <= THRESHOLD * 4 * np.finfo(float).eps)
    # a step stops a matrix once its backward error is at most eps, so one step more changes nothing
    again, _ = factor.solve(b, refine=int(steps.max()) + 1)
    assert np.array_equal(again, x) and np.array_equal(factor.refine_steps, steps)
    w = np.linalg.eigvalsh(a)
    assert factor.inertia()[0].tolist() == [(w > 0).sum(), (w < 0).sum(), 0]   # A + E's = A's
    # perturbation off: info names the zero pivot (1-based column of P A P^T), x is NaN
    off = plan.factorize(values, perturb=False)
    assert off.info.tolist() == [1, 1] and off.perturbed_pivots().tolist() == [0, 0]
    x, info = off.solve(b)
    assert info.tolist() == [1, 1] and np.isnan(x).all()
    # a pivot after the zero is NaN or infinite (0 / 0, 1 / 0): no counts to give (they used to count as
    # positive: [3, 0, 1] against A's [3, 1, 0])
    assert not np.isfinite(off.pivots()[0, 1:]).all() and off.inertia().tolist() == [[-1, -1, -1]] * 2


@pytest.mark.parametrize("perturb", [True, False])
def test_an_all_zero_matrix_is_flagged_not_counted(perturb):
    """||A|| = 0 makes the threshold 0, so static pivoting cannot move the zero pivots and NaN ones
    follow: info names the first zero pivot and the inertia is -1 (it read (22, 0, 8) with info 0,
    NaN pivots counted as positive). A nonzero matrix beside it keeps its own codes."""
    p = gen.make("fem-poisson", size=30, seed=3)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n)
    values = p.values(0, 2, "float64", seed=4)
    values[0] = 0.0
    factor = plan.factorize(values, perturb=perturb)
    assert factor.info.tolist() == [1, 0]
    assert factor.inertia()[0].tolist() == [-1, -1, -1] and factor.inertia()[1].tolist() == [p.n, 0, 0]
    x, info = factor.solve(p.rhs(0, 2, None, "float64", seed=5))
    assert info.tolist() == [1, 0] and np.isnan(x[0]).all() and np.isfinite(x[1]).all()


def test_an_overflowing_pivot_is_minus_two():
    """A finite matrix whose elimination overflows (the Schur complement of a tiny pivot): the
    infinite pivot makes the counts meaningless, so info -2 and inertia -1, not a count by its sign."""
    a = np.array([[1e-310, 1.0], [1.0, 1.0]])
    indptr, cols = np.array([0, 1, 3]), np.array([0, 0, 1])
    plan = batchlu.sparse.analyze(indptr, cols, 2, ordering="natural")
    factor = plan.factorize(a[[0, 1, 1], [0, 0, 1]][None, :], perturb=False)
    assert not np.isfinite(factor.pivots()[0, 1])
    assert factor.info.tolist() == [-2] and factor.inertia().tolist() == [[-1, -1, -1]]


def test_refinement_short_of_tolerance_is_minus_four():
    """One refinement step from a heavily perturbed factorization does not reach n eps: -4, x kept."""
    p = gen.make("power-grid", size=300, seed=2)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n)
    values, b = p.values(0, 3, "float32", seed=1), p.rhs(0, 3, None, "float32", seed=1)
    factor = plan.factorize(values, pivot_tol=1e-2)
    x, info = factor.solve(b, refine=0, tol=1e-12)
    assert np.all(info == INFO_REFINEMENT)
    assert np.isfinite(x).all()
    assert np.all(factor.last_backward_error > 1e-12)


def test_nonfinite_values_and_rhs_in_a_mixed_batch():
    p = gen.make("fem-poisson", size=150, seed=0)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n)
    values, b = p.values(0, 5, seed=9), p.rhs(0, 5, 3, seed=9)
    values[1, 7] = np.nan
    values[3, 0] = np.inf
    b[4, 2, 1] = np.nan
    factor = plan.factorize(values)
    assert factor.info.tolist() == [0, -1, 0, -1, 0]
    assert factor.inertia()[1].tolist() == [-1, -1, -1] and factor.perturbed_pivots()[1] == -1
    x, info = factor.solve(b)
    assert info.tolist() == [0, INFO_NONFINITE_INPUT, 0, INFO_NONFINITE_INPUT, INFO_NONFINITE_INPUT]
    assert np.isnan(x[[1, 3, 4]]).all() and np.isfinite(x[[0, 2]]).all()
    clean, _ = plan.factorize(values[[0, 2]]).solve(b[[0, 2]])
    assert np.array_equal(clean, x[[0, 2]])   # bad neighbours change nothing


def test_single_matrix_and_shapes():
    p = gen.make("saddle", size=120)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n)
    values = p.values(0, 1)[0]
    factor = plan.factorize(values)
    b = p.rhs(0, 1)[0]
    x, info = factor.solve(b)
    assert x.shape == (p.n,) and info.shape == () and factor.inertia().shape == (3,)
    with pytest.raises(InputError, match="Expected b of shape"):
        factor.solve(b[:-1])
    with pytest.raises(InputError, match="Expected values of shape"):
        plan.factorize(np.zeros((2, p.nnz + 1)))
    with pytest.raises(TypeError, match="float32 or float64"):
        plan.factorize(np.zeros((2, p.nnz), np.complex128))
    with pytest.raises(InputError, match="refine"):
        factor.solve(b, refine=-1)


def test_empty_batch():
    p = gen.make("fem-poisson", size=60)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n)
    factor = plan.factorize(np.zeros((0, p.nnz)))
    x, info = factor.solve(np.zeros((0, p.n)))
    assert x.shape == (0, p.n) and info.shape == (0,) and factor.inertia().shape == (0, 3)


def test_factor_memory_reused_once_free(engine):
    """The compiled engine hands a factorization's memory to a later one only once nothing refers
    to it, and a reused buffer (full of another batch's factors) gives the same bits as fresh memory."""
    if not engine.startswith("compiled"):
        pytest.skip("the compiled engine's memory")
    p = gen.make("fem-elasticity", size=300, dim=3, seed=6)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n, kind=p.matrix_kind)
    v1, v2, b = p.values(0, 9, seed=7), p.values(9, 18, seed=8), p.rhs(0, 9, None, seed=7)
    first = plan.factorize(v1)
    x1, _ = first.solve(b)
    second = plan.factorize(v2)             # while `first` lives: other memory
    assert not np.shares_memory(first._lanes, second._lanes)
    again, _ = first.solve(b)
    assert np.array_equal(again, x1)
    x2, _ = second.solve(b)
    view = second._lanes[0]                 # a view keeps the memory taken
    del first, second
    third = plan.factorize(v1)
    assert not np.shares_memory(third._lanes, view)
    x3, _ = third.solve(b)
    assert np.array_equal(x3, x1)
    third = plan.factorize(v2)              # third's memory is the one kept: taken while it lives
    address = third._lanes.__array_interface__["data"][0]
    del third, view
    fourth = plan.factorize(v1)             # the kept memory, full of v2's factors
    assert fourth._lanes.__array_interface__["data"][0] == address
    x4, _ = fourth.solve(b)
    assert np.array_equal(x4, x1)



@pytest.mark.parametrize("band", [True, False], ids=["tridiagonal", "dense"])
@pytest.mark.parametrize("perturb", [False, True])
def test_a_last_zero_pivot_is_counted_once(band, perturb):
    """The last pivot exactly zero (nothing after it to turn NaN): with static pivoting off it counts
    once as zero, info names its column and the inertia is A's; with it on, it becomes +tau, counted
    once as perturbed and positive."""
    plan, values, d = last_zero_pivot_batch(9 if band else 6, 5, seed=21 + band, band=band)
    factor = plan.factorize(values, perturb=perturb)
    info, perturbed, inertia = expected_last_zero(d, perturb)
    pivots = factor.pivots()
    assert np.array_equal(pivots[:, :-1], d[:, :-1])          # exact: pivots +-1, 2, 4 of integer L
    assert np.all(pivots[:, -1] > 0) if perturb else np.all(pivots[:, -1] == 0)
    assert factor.info.tolist() == info and factor.perturbed_pivots().tolist() == perturbed
    assert factor.inertia().dtype == np.int64 and factor.inertia().tolist() == inertia


@pytest.mark.parametrize("k", [None, 3])
def test_a_diagonal_only_pattern(k):
    """A pattern with no entry off the diagonal (no mirrored entries for the residual): solved and
    refined to a backward error below 30 n eps, inertia by the signs; the NumPy engine's residual
    failed there ("cannot reshape array of size 0")."""
    n, count = 11, 6
    rng = np.random.default_rng(31)
    values = rng.uniform(0.5, 2.0, (count, n)) * rng.choice([-1.0, 1.0], (count, n))
    b = rng.standard_normal((count, n) if k is None else (count, n, k))
    plan = batchlu.sparse.analyze(np.arange(n + 1), np.arange(n), n)
    factor = plan.factorize(values)
    x, info = factor.solve(b)
    assert info.tolist() == [0] * count and x.shape == b.shape and x.dtype == np.float64
    berr = factor.backward_error(b, x)
    assert np.array_equal(berr, factor.last_backward_error) and np.all(berr <= THRESHOLD * n * np.finfo(float).eps)
    a = np.einsum("bi,ij->bij", values, np.eye(n))               # the dense matrices, recomputed
    x3, b3 = (x[..., None], b[..., None]) if k is None else (x, b)
    r = np.abs(b3 - a @ x3).max(axis=1)
    ref = r / (np.abs(values).max(axis=1)[:, None] * np.abs(x3).max(axis=1) + np.abs(b3).max(axis=1))
    assert np.all(ref <= THRESHOLD * n * np.finfo(float).eps)
    assert factor.inertia().tolist() == np.stack([(values > 0).sum(1), (values < 0).sum(1), 0 * values[:, 0]],
                                                 axis=1).tolist()


def _check_solved(p, values, b, x, info, factor):
    """Every matrix at info 0 with every element of x written and finite, in b's shape and the
    values' dtype, and a normwise backward error <= 30 n eps: the factor's own, and LAPACK's ratio
    (get02, 1-norms) recomputed from the dense float64 matrices."""
    dtype = values.dtype
    assert x.dtype == dtype and x.shape == b.shape and info.dtype == np.int32 and info.shape == (values.shape[0],)
    assert np.all(info == 0), info
    assert np.isfinite(x).all()
    eps = np.finfo(dtype).eps
    berr = factor.backward_error(b, x)
    assert np.array_equal(berr, factor.last_backward_error)
    assert np.all(berr <= THRESHOLD * p.n * eps), berr / (p.n * eps)
    ratio = get02(_dense(p, values), x, b)
    assert np.all(ratio <= THRESHOLD * p.n), ratio / p.n


KKT_CASES = [(delta, "float64") for delta in gen.KKT_DELTAS] + [(1e-4, "float32")]


@pytest.mark.parametrize("delta, dtype", KKT_CASES, ids=[f"{d:g}-{t}" for d, t in KKT_CASES])
def test_the_kkt_family_solves_on_the_defaults(delta, dtype):
    """[[K, B^T], [B, -delta I]] with dependent constraint rows: sqrt(eps) ||A|| replaces the pivots
    -delta of the constraint rows (for delta <= 1e-8 here, some at 1e-6; in float32 all) and
    refinement cannot undo that (-4 with the threshold given); on the defaults those matrices get
    the second attempt at eps ||A||, which perturbs nothing, and every matrix solves. The factor
    then holds the second attempt's factors: no pivot perturbed, A's inertia, and a second solve
    needs no new attempt. (In float32 a delta below eps ||A||, 1e-5 here, is rounding: not covered.)"""
    p = gen.make("kkt", size=300, seed=5, delta=delta)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n, kind=p.matrix_kind)
    values, b = p.values(0, 6, dtype, seed=12), p.rhs(0, 6, None, dtype, seed=12)
    assert len({v.tobytes() for v in values}) == 6                      # a fresh matrix each
    eps = float(np.finfo(dtype).eps)
    alone = plan.factorize(values, pivot_tol=float(np.sqrt(eps)))
    flagged = (alone.solve(b)[1] == INFO_REFINEMENT)
    assert np.array_equal(flagged, alone.perturbed_pivots() > 0)        # the ones the threshold broke
    if delta <= 1e-8 or dtype == "float32":
        assert flagged.all()
    elif delta <= 1e-6:
        assert flagged.any()
    factor = plan.factorize(values)
    assert factor.retry_tol == eps
    x, info = factor.solve(b)
    _check_solved(p, values, b, x, info, factor)
    assert np.array_equal(factor.retried(), flagged) and factor.retried().dtype == bool
    assert np.all(factor.perturbed_pivots() == 0) and np.all(factor.info == 0)
    assert np.all(factor.inertia() == np.array(p.inertia))
    again, info_again = factor.solve(b)
    assert np.array_equal(again, x) and np.all(info_again == 0) and np.all(factor.refine_steps <= 2)


def test_the_second_attempt_takes_only_the_flagged_matrices():
    """In a batch mixing matrices the threshold breaks (delta 1e-8), ones it does not (delta 1e-2 on
    the same pattern), a non-finite one and one with a non-finite right-hand side, only the first
    are factored again, and each matrix's results are those of its own attempt, bit for bit: the
    second attempt's are those of pivot_tol=eps alone, the others' unchanged."""
    p = gen.make("kkt", size=200, seed=6, delta=1e-8)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n, kind=p.matrix_kind)
    values, b = p.values(0, 7, seed=13), p.rhs(0, 7, 2, seed=13)
    diagonal = np.flatnonzero(values[0] == -1e-8)
    assert diagonal.size == p.inertia[1]                                 # the -delta entries
    values[np.ix_([1, 4], diagonal)] = -1e-2
    values[2, 5] = np.nan
    b[6, 3, 1] = np.inf
    factor = plan.factorize(values)
    x, info = factor.solve(b)
    assert info.tolist() == [0, 0, INFO_NONFINITE_INPUT, 0, 0, 0, INFO_NONFINITE_INPUT]
    assert factor.retried().tolist() == [True, False, False, True, False, True, False]
    eps = float(np.finfo(float).eps)
    for rows, tol in (([0, 3, 5], eps), ([1, 4], None)):
        own = plan.factorize(values[rows], pivot_tol=tol)
        x_own, info_own = own.solve(b[rows])
        assert np.array_equal(x[rows], x_own) and np.array_equal(info[rows], info_own)
        assert np.array_equal(factor.last_backward_error[rows], own.last_backward_error)
        assert np.array_equal(factor.pivots()[rows], own.pivots())
    assert np.isnan(x[[2, 6]]).all()


def test_a_singular_kkt_matrix_stays_minus_four():
    """delta = 0 with dependent constraint rows: A is exactly singular. The second attempt has to
    perturb pivots too (below eps ||A||: rounding), so it is not taken: -4, x the first attempt's
    best iterate (finite), the factor the first attempt's."""
    p = gen.make("kkt", size=200, seed=7, delta=0.0)
    assert p.inertia is None
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n, kind=p.matrix_kind)
    values, b = p.values(0, 3, seed=14), p.rhs(0, 3, None, seed=14)
    first = plan.factorize(values, pivot_tol=float(np.sqrt(np.finfo(float).eps)))
    x_first, _ = first.solve(b)
    factor = plan.factorize(values)
    x, info = factor.solve(b)
    assert info.tolist() == [INFO_REFINEMENT] * 3 and not factor.retried().any()
    assert np.isfinite(x).all() and np.array_equal(x, x_first)
    assert np.all(factor.last_backward_error > p.n * np.finfo(float).eps)
    assert np.array_equal(factor.perturbed_pivots(), first.perturbed_pivots()) and np.all(first.perturbed_pivots() > 0)
    again, info_again = factor.solve(b)                                 # one second attempt per factor
    assert np.array_equal(again, x) and np.array_equal(info_again, info)


def test_a_threshold_given_gets_no_second_attempt():
    """pivot_tol given (the caller's threshold), or static pivoting off: no second attempt."""
    p = gen.make("kkt", size=200, seed=8, delta=1e-8)
    plan = batchlu.sparse.analyze(p.indptr, p.indices, p.n, kind=p.matrix_kind)
    values, b = p.values(0, 2, seed=15), p.rhs(0, 2, None, seed=15)
    factor = plan.factorize(values, pivot_tol=1e-8)
    assert factor.retry_tol is None
    _, info = factor.solve(b)
    assert info.tolist() == [INFO_REFINEMENT] * 2 and not factor.retried().any()
    assert plan.factorize(values, perturb=False).retry_tol is None
