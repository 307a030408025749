"""The one op table: every op's compute writes exactly the arrays its outputs declare, with their
dtypes and shapes, and the CLI, verify and the run take their choices from it."""

from __future__ import annotations

import numpy as np
import pytest

from batchlu.pipeline._ops import DENSE_OPS, OP_TABLE, OPS, SPARSE_OPS
from batchlu.testing import matrices


@pytest.mark.parametrize("k", [None, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.complex128])
@pytest.mark.parametrize("op", DENSE_OPS)
def test_compute_writes_what_outputs_declares(op, dtype, k):
    spec = OP_TABLE[op]
    n, count = 7, 5
    a = matrices.generate("random", n, dtype, seed=3, start=0, stop=count)
    b = matrices.rhs(n, k, dtype, seed=4, stop=count) if spec.needs_rhs else None
    outputs = spec.outputs(n, dtype, dtype if b is not None else None, k)
    got = spec.compute(a, b)
    assert [o.name for o in outputs] == list(got) == [*spec.results, "info"]
    for o in outputs:
        assert got[o.name].dtype == o.dtype and got[o.name].shape == (count, *o.tail), o.name
    assert (got["info"] == 0).all()


def test_the_cli_takes_its_op_choices_from_the_table():
    from batchlu.workflows.cli import cli

    run = cli.commands["run"]
    (op_option,) = [p for p in run.params if p.name == "op"]
    assert tuple(op_option.type.choices) == OPS == tuple(OP_TABLE)
    assert [name for name, spec in OP_TABLE.items() if spec.needs_rhs] == ["solve", "ldlt-solve"]
    assert OPS == DENSE_OPS + SPARSE_OPS and SPARSE_OPS == ("ldlt-solve", "ldlt-inertia")


@pytest.mark.parametrize("k", [None, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", SPARSE_OPS)
def test_sparse_compute_writes_what_outputs_declares(op, dtype, k):
    import batchlu
    from batchlu import pipeline
    from batchlu.testing import sparse

    problem = sparse.make("fem-poisson", size=60)
    plan = batchlu.sparse.analyze(problem.indptr, problem.indices, problem.n)
    spec = OP_TABLE[op]
    count = 4
    values = problem.values(0, count, dtype)
    b = problem.rhs(0, count, k, dtype) if spec.needs_rhs else None
    outputs = spec.outputs(problem.n, dtype, dtype if b is not None else None, k)
    with pytest.raises(TypeError, match="bound"):
        spec.compute(values, b)
    got = spec.bind(plan, pipeline.Options()).compute(values, b)
    assert [o.name for o in outputs] == list(got) == [*spec.results, "info"]
    for o in outputs:
        assert got[o.name].dtype == o.dtype and got[o.name].shape == (count, *o.tail), o.name
    assert (got["info"] == 0).all()
    with pytest.raises(TypeError, match="sparse op"):
        spec.ratios(values, got, b)   # their backward error needs the pattern: verify._sparse_rules


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize("op", DENSE_OPS)
def test_each_op_rates_its_own_results_and_verify_has_a_rule_per_ratio(op, dtype):
    from batchlu.pipeline.verify._rules import rules_for
    from batchlu.testing.ratios import THRESHOLD

    spec = OP_TABLE[op]
    n, count = 9, 6
    a = matrices.generate("random", n, dtype, seed=5, start=0, stop=count)
    b = matrices.rhs(n, 2, dtype, seed=6, stop=count) if spec.needs_rhs else None
    got = spec.compute(a, b)
    ratios = spec.ratios(a, got, b)
    assert set(ratios) <= {rule.name for rule in rules_for(op)}
    assert {rule.name for rule in rules_for(op) if rule.ratio} <= set(ratios)
    for name, value in ratios.items():
        assert value.shape == (count,) and np.isfinite(value).all() and (value < THRESHOLD).all(), name
    wrong = {k: v.copy() for k, v in got.items()}
    wrong[spec.results[0]][0] *= 1.5 if spec.results[0] != "sign" else -1   # one result spoilt
    assert any(v[0] >= THRESHOLD for v in spec.ratios(a, wrong, b).values())


def test_verify_names_each_ops_ratio_from_the_table():
    from batchlu.pipeline.verify._rules import rules_for

    assert [name for name, spec in OP_TABLE.items() if not spec.ratio_name] == ["ldlt-inertia"]
    for op in ("lu", "inv", "solve"):
        assert OP_TABLE[op].ratio_name in {rule.name for rule in rules_for(op) if rule.ratio}
