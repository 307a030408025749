"""analyze: orderings are permutations; the elimination tree, the structure of L and the level sets
match brute-force references computed on the dense pattern; bad patterns give one-line errors."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import batchlu
from batchlu.errors import ConfigError, InputError
from batchlu.testing import sparse as gen


def _random_pattern(n: int, density: float, seed: int) -> np.ndarray:
    """A dense boolean symmetric pattern with a full diagonal."""
    rng = np.random.default_rng(seed)
    a = rng.random((n, n)) < density
    a = a | a.T
    np.fill_diagonal(a, True)
    return a


def _csr(mask: np.ndarray, lower: bool):
    m = sp.csr_array(np.tril(mask) if lower else mask)
    m.sort_indices()
    return m.indptr, m.indices


def _dense_symbolic(mask: np.ndarray):
    """Brute force: the fill of Gaussian elimination on the pattern, its tree and levels."""
    n = mask.shape[0]
    f = np.tril(mask).copy()
    for k in range(n):
        rows = np.flatnonzero(f[k + 1:, k]) + k + 1
        f[np.ix_(rows, rows)] |= True      # column k's rows become mutually connected
    f = np.tril(f)
    parent = np.array([(np.flatnonzero(f[k + 1:, k])[0] + k + 1) if f[k + 1:, k].any() else -1
                       for k in range(n)])
    level = np.zeros(n, int)
    for k in range(n):                      # parents come after their children
        if parent[k] >= 0:
            level[parent[k]] = max(level[parent[k]], level[k] + 1)
    return f, parent, level


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ordering", ["natural", "amd", "metis"])
def test_tree_structure_and_levels_match_brute_force(seed, ordering):
    if ordering == "metis":
        pytest.importorskip("pymetis")   # the optional extra batchlu[metis] (in batchlu[test])
    n = 30 + 7 * seed
    mask = _random_pattern(n, 0.08, seed)
    indptr, indices = _csr(mask, lower=seed % 2 == 0)
    plan = batchlu.sparse.analyze(indptr, indices, n, ordering=ordering)
    assert np.array_equal(np.sort(plan.perm), np.arange(n))
    assert np.array_equal(plan.iperm[plan.perm], np.arange(n))
    fill, parent, level = _dense_symbolic(mask[np.ix_(plan.perm, plan.perm)])
    assert np.array_equal(plan.parent, parent)
    assert np.array_equal(plan.level, level)
    # L's pattern is exactly the fill: diagonal first, rows ascending
    got = np.zeros((n, n), bool)
    col = np.repeat(np.arange(n), np.diff(plan.colptr))
    got[plan.rowind, col] = True
    assert np.array_equal(got, fill)
    assert np.array_equal(plan.rowind[plan.colptr[:-1]], np.arange(n))
    for j in range(n):
        assert np.all(np.diff(plan.rowind[plan.colptr[j]:plan.colptr[j + 1]]) > 0)
    # level sets: every column once, levels ascending, each level's columns independent
    assert np.array_equal(np.sort(plan.level_cols), np.arange(n))
    for lev in range(plan.nlevels):
        cols = plan.level_cols[plan.level_ptr[lev]:plan.level_ptr[lev + 1]]
        assert np.all(level[cols] == lev)
        assert not np.isin(parent[cols], cols).any()


def test_amd_reduces_fill_on_a_grid():
    problem = gen.make("fem-poisson", nodes=900)
    natural = batchlu.sparse.analyze(problem.indptr, problem.indices, problem.n, ordering="natural")
    amd = batchlu.sparse.analyze(problem.indptr, problem.indices, problem.n, ordering="amd")
    assert amd.nnz_l < natural.nnz_l
    assert amd.ordering == "amd" and natural.ordering == "natural"


def test_given_permutation_and_its_checks():
    mask = _random_pattern(12, 0.2, 3)
    indptr, indices = _csr(mask, lower=True)
    perm = np.random.default_rng(0).permutation(12)
    plan = batchlu.sparse.analyze(indptr, indices, 12, ordering=perm)
    assert plan.ordering == "given" and np.array_equal(plan.perm, perm)
    with pytest.raises(InputError, match="Got 11 repeated and 0 out-of-range entries"):
        batchlu.sparse.analyze(indptr, indices, 12, ordering=np.zeros(12, int))
    with pytest.raises(InputError, match="Got 0 repeated and 1 out-of-range entries"):
        batchlu.sparse.analyze(indptr, indices, 12, ordering=np.where(perm == 11, 12, perm))
    with pytest.raises(InputError, match="permutation"):
        batchlu.sparse.analyze(indptr, indices, 12, ordering=np.arange(11))
    with pytest.raises(ConfigError, match="ordering"):
        batchlu.sparse.analyze(indptr, indices, 12, ordering="colamd")


def test_plan_is_frozen_and_pickles_with_its_fields():
    import dataclasses
    import pickle

    problem = gen.make("saddle", size=200)
    plan = batchlu.sparse.analyze(problem.indptr, problem.indices, problem.n)
    plan.schedule()
    copy = pickle.loads(pickle.dumps(plan))
    for field in dataclasses.fields(plan):
        a, b = getattr(plan, field.name), getattr(copy, field.name)
        assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
    assert copy.digest == plan.digest
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.n = 3
    # the update triples count the multiply-adds, one per pair (i >= j) of each column
    m = np.diff(plan.colptr) - 1
    assert plan.schedule().pairs == plan.update_pairs == int((m * (m + 1) // 2).sum())


def test_full_pattern_values_must_be_symmetric():
    """Both triangles given (pattern 'full'), the lower one is factored: values whose mirrors differ
    are refused with the entry named (they solved tril(A) + tril(A, -1)^T and said ok), equal ones
    factor, and a NaN against a number is the matrix's info -1, not this error."""
    mask = _random_pattern(15, 0.3, 7)
    indptr, indices = _csr(mask, lower=False)
    plan = batchlu.sparse.analyze(indptr, indices, 15)
    rows = np.repeat(np.arange(15), np.diff(indptr))
    src, mirror = plan.value_src, plan.value_mirror
    assert np.array_equal(rows[mirror], plan.a_col) and np.array_equal(indices[mirror], plan.a_row)
    dense = np.random.default_rng(3).standard_normal((2, 15, 15))
    dense = dense + np.swapaxes(dense, 1, 2) + 30 * np.eye(15)
    values = dense[:, rows, indices]
    assert (plan.factorize(values).info == 0).all()
    off = int(np.flatnonzero(plan.a_row != plan.a_col)[0])
    i, j = int(plan.a_row[off]), int(plan.a_col[off])
    wrong = values.copy()
    wrong[1, mirror[off]] += 1.0
    with pytest.raises(InputError, match=rf"symmetric values for pattern 'full' .*matrix 1 .*\({i}, {j}\)"):
        plan.factorize(wrong)
    rounded = values.copy()  # one rounding unit apart, as an assembled B^T D B: accepted
    rounded[:, mirror[off]] = np.nextafter(rounded[:, mirror[off]], np.inf)
    assert (plan.factorize(rounded).info == 0).all()
    nan = values.copy()
    nan[1, mirror[off]] = np.nan
    assert plan.factorize(nan).info.tolist() == [0, -1]
    assert batchlu.sparse.analyze(*_csr(mask, lower=True), 15).value_mirror is None


def test_value_map_scatters_the_lower_triangle():
    mask = _random_pattern(15, 0.3, 7)
    indptr, indices = _csr(mask, lower=False)
    plan = batchlu.sparse.analyze(indptr, indices, 15)
    rows = np.repeat(np.arange(15), np.diff(indptr))
    assert plan.pattern == "full"
    assert np.array_equal(plan.value_src, np.flatnonzero(indices <= rows))
    col = np.repeat(np.arange(15), np.diff(plan.colptr))
    # the entry (r, c) of A lands at (iperm[max], iperm[min]) of C
    r, c = plan.iperm[plan.a_row], plan.iperm[plan.a_col]
    assert np.array_equal(plan.rowind[plan.value_dst], np.maximum(r, c))
    assert np.array_equal(col[plan.value_dst], np.minimum(r, c))


@pytest.mark.parametrize("args, match", [
    (dict(indptr=[0, 1, 2], indices=[0, 5], n=2), "column index in \\[0, n\\)"),
    (dict(indptr=[0, 1], indices=[0], n=2), "indptr of shape"),
    (dict(indptr=[0, 2, 1], indices=[0, 1], n=2), "indptr to start at 0"),
    (dict(indptr=[0, 2, 3], indices=[0, 1, 1], n=2, pattern="full"), "symmetric pattern"),
    (dict(indptr=[0, 2, 3], indices=[0, 1, 1], n=2, pattern="lower"), "lower-triangular"),
    (dict(indptr=[0, 2, 3], indices=[0, 0, 1], n=2), "duplicate"),
    (dict(indptr=[[0, 1]], indices=[0], n=1), "1-D integer"),
    (dict(indptr=[0, 1], indices=[0], n=-1), "n to be an integer"),
])
def test_bad_patterns_are_one_line_errors(args, match):
    with pytest.raises(InputError, match=match) as err:
        batchlu.sparse.analyze(args["indptr"], args["indices"], args["n"], pattern=args.get("pattern"))
    assert "\n" not in str(err.value)


def test_bad_kind_and_missing_metis(monkeypatch):
    with pytest.raises(ConfigError, match="kind"):
        batchlu.sparse.analyze([0, 1], [0], 1, kind="hermitian")
    import builtins

    real = builtins.__import__

    def no_metis(name, *args, **kwargs):
        if name == "pymetis":
            raise ImportError("no pymetis")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_metis)
    with pytest.raises(ConfigError, match=r"pip install 'batchlu\[metis\]'"):
        batchlu.sparse.analyze([0, 1, 3], [0, 0, 1], 2, ordering="metis")


def test_import_batchlu_stays_light():
    import subprocess
    import sys

    code = ("import sys, batchlu; s = batchlu.sparse; "
            "print(all(m not in sys.modules for m in ('cupy', 'dask', 'zarr', 'cvxopt', 'skfem')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
