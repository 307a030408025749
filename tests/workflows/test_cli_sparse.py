"""``batchlu generate --kind <sparse>``, ``run --op ldlt-solve|ldlt-inertia`` and ``verify`` through
click's runner; bad sparse commands end in one line."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from test_cli import assert_user_error


@pytest.mark.parametrize("kind, size_args", [("fem-poisson", ("--size", 200)),
                                             ("fem-elasticity", ("--nodes", 64, "--dim", 3)),
                                             ("power-grid", ("--nodes", 60)),
                                             ("kkt", ("--size", 120, "--delta", "1e-10"))])
def test_generate_run_verify(invoke, scheduler_address, tmp_path, kind, size_args):
    source = tmp_path / "in.zarr"
    result = invoke("generate", source, "-N", 12, "--kind", kind, *size_args, "--chunk", 5, "--rhs-columns", 2)
    assert result.exit_code == 0, result.output
    group = zarr.open_group(str(source), mode="r")
    n = group.attrs["sparse"]["n"]
    assert group["values"].shape == (12, group["indices"].shape[0]) and group["rhs"].shape == (12, n, 2)
    for op in ("ldlt-solve", "ldlt-inertia"):
        out = tmp_path / f"{op}.zarr"
        result = invoke("run", source, out, "--op", op, "--scheduler", scheduler_address)
        assert result.exit_code == 0, result.output
        assert "complete" in result.output and "ok 12" in result.output
        result = invoke("verify", source, out)
        assert result.exit_code == 0, result.output
        assert "OK" in result.output
    assert zarr.open_array(str(tmp_path / "ldlt-solve.zarr"), path="x", mode="r").shape == (12, n, 2)


def test_verify_fails_on_a_wrong_inertia(invoke, scheduler_address, tmp_path):
    source, out = tmp_path / "spd.zarr", tmp_path / "inertia.zarr"
    assert invoke("generate", source, "-N", 6, "--kind", "fem-poisson", "--size", 100).exit_code == 0
    assert invoke("run", source, out, "--op", "ldlt-inertia", "--scheduler", scheduler_address).exit_code == 0
    counts = zarr.open_array(str(out), path="inertia", mode="r+")
    counts[2] = np.array([counts[2][0] - 1, 1, 0])
    result = invoke("verify", source, out)
    assert_user_error(result, "verification failed")
    assert "inertia-reference" in result.output


def test_bad_sparse_commands(invoke, tmp_path):
    assert_user_error(invoke("generate", tmp_path / "a.zarr", "-N", 2, "--kind", "saddle"),
                      "--size", "--nodes", code=2)
    assert_user_error(invoke("generate", tmp_path / "a.zarr", "-N", 2, "--kind", "saddle", "--size", 50,
                             "--rhs-out", tmp_path / "b.zarr"), "--rhs-out", code=2)
    assert_user_error(invoke("generate", tmp_path / "a.zarr", "-N", 2, "--kind", "saddle", "--size", 50,
                             "--dtype", "complex128"), "float32 or float64")
    assert_user_error(invoke("generate", tmp_path / "a.zarr", "-N", 2, "--kind", "saddle", "--size", 50,
                             "--delta", "1e-8"), "--delta", "kkt", code=2)
    assert_user_error(invoke("generate", tmp_path / "a.zarr", "-N", 2, "--kind", "kkt", "--size", 50,
                             "--delta", "-1"), "--delta", code=2)
    assert_user_error(invoke("generate", tmp_path / "d.zarr", "-N", 2, "--nodes", 9), "--size", code=2)
    assert invoke("generate", tmp_path / "d.zarr", "-N", 2, "--size", 3).exit_code == 0
    assert_user_error(invoke("run", tmp_path / "d.zarr", tmp_path / "o.zarr", "--op", "ldlt-solve"),
                      "Zarr group")
