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
    from batchlu.pipeline._config import SparseOptions
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
    got = spec.bind(plan, SparseOptions()).compute(values, b)
    assert [o.name for o in outputs] == list(got) == [*spec.results, "info"]
    for o in outputs:
        assert got[o.name].dtype == o.dtype and got[o.name].shape == (count, *o.tail), o.name
    assert (got["info"] == 0).all()
