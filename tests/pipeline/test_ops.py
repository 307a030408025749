"""The one op table: every op's compute writes exactly the arrays its outputs declare, with their
dtypes and shapes, and the CLI, verify and the run take their choices from it."""

from __future__ import annotations

import numpy as np
import pytest

from batchlu.pipeline._ops import OP_TABLE, OPS
from batchlu.testing import matrices


@pytest.mark.parametrize("k", [None, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.complex128])
@pytest.mark.parametrize("op", OPS)
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
    assert [name for name, spec in OP_TABLE.items() if spec.needs_rhs] == ["solve"]
