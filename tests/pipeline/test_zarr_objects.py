"""``batchlu.run`` takes zarr objects where it takes paths: a ``zarr.Array``, a ``zarr.Group`` with the
array's name, a ``zarr.storage.LocalStore`` (input, right-hand side and output), and gives the output a
run on the same paths gives, bit for bit. Stores off the local file system, read-only output stores,
an array as the output and objects of other types are refused in one line before anything is written."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from zarr.storage import LocalStore, MemoryStore

import batchlu
from batchlu.errors import InputError, OutputError
from batchlu.testing import matrices
from batchlu.testing.ratios import THRESHOLD, get02, get03

N, COUNT = 6, 50
CONFIG = {"cluster.dashboard-address": "127.0.0.1:0"}


def _run(source, out, **kwargs):
    return batchlu.run(source, out, backend="cpu", progress=False, config=CONFIG, **kwargs)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A group holding fresh random matrices at ``sub/a`` and right-hand sides at ``b``."""
    root = tmp_path_factory.mktemp("objects") / "in.zarr"
    group = zarr.open_group(LocalStore(str(root)), mode="w")
    a = matrices.generate("random", N, np.float64, seed=21, start=0, stop=COUNT)
    b = matrices.rhs(N, 2, np.float64, seed=22, start=0, stop=COUNT)
    group.create_array("sub/a", shape=a.shape, chunks=(16, N, N), dtype=a.dtype)[...] = a
    group.create_array("b", shape=b.shape, chunks=(16, N, 2), dtype=b.dtype)[...] = b
    return root, a, b


def _arrays(path, names):
    return {name: np.asarray(zarr.open_array(store=str(path), path=name, mode="r")[...]) for name in names}


def test_an_array_in_and_a_local_store_out_give_the_paths_output(stores, tmp_path):
    root, a, _ = stores
    _run(f"{root}:sub/a", tmp_path / "by-path.zarr", op="inv")
    array = zarr.open_array(LocalStore(str(root), read_only=True), path="sub/a", mode="r")
    report = _run(array, LocalStore(str(tmp_path / "by-object.zarr")), op="inv")
    assert report.output == str(tmp_path / "by-object.zarr")
    got, ref = _arrays(tmp_path / "by-object.zarr", ["inv", "info"]), _arrays(tmp_path / "by-path.zarr", ["inv", "info"])
    for name in ("inv", "info"):
        assert got[name].tobytes() == ref[name].tobytes()
    assert (got["info"] == 0).all() and get03(a, got["inv"]).max() < THRESHOLD
    assert batchlu.verify(array, str(tmp_path / "by-object.zarr")).ok


def test_a_group_with_a_name_and_an_array_rhs_solve(stores, tmp_path):
    root, a, b = stores
    group = zarr.open_group(LocalStore(str(root), read_only=True), mode="r")
    out = tmp_path / "solve.zarr"
    _run((group, "sub/a"), str(out), op="solve", rhs=group["b"])
    got = _arrays(out, ["x", "info"])            # a chunk never written would read as zeros: ratios of 1e15
    assert (got["info"] == 0).all() and get02(a, got["x"], b).max() < THRESHOLD


def test_verify_and_inspect_take_the_objects_too(stores, tmp_path):
    """An output group inside a store, given as a group object or a read-only store with its name."""
    root, a, _ = stores
    array = zarr.open_array(LocalStore(str(root), read_only=True), path="sub/a", mode="r")
    _run(array, (LocalStore(str(tmp_path / "outer.zarr")), "runs/one"), op="inv")
    out = zarr.open_group(LocalStore(str(tmp_path / "outer.zarr"), read_only=True), path="runs/one", mode="r")
    assert batchlu.verify(array, out).ok
    assert batchlu.verify(array, LocalStore(str(tmp_path / "outer.zarr" / "runs" / "one"), read_only=True)).ok
    assert f"({COUNT}, {N}, {N})" in batchlu.inspect(out["inv"])


@pytest.mark.parametrize("case", ["memory-store", "int", "tuple-of-other", "array-output", "read-only-output",
                                  "memory-output"])
def test_objects_that_cannot_be_used_are_refused_in_one_line(stores, tmp_path, case):
    root, _, _ = stores
    source, out, error = f"{root}:sub/a", tmp_path / "out.zarr", OutputError
    if case == "memory-store":
        source, error = zarr.open_group(MemoryStore(), mode="w").create_array("m", shape=(4, 3, 3), dtype="f8"), InputError
    elif case == "int":
        source, error = 7, InputError
    elif case == "tuple-of-other":
        source, error = (object(), "sub/a"), InputError
    elif case == "array-output":
        out = zarr.open_array(LocalStore(str(tmp_path / "arr.zarr")), mode="w", shape=(4, 3, 3), dtype="f8")
    elif case == "read-only-output":
        out = LocalStore(str(tmp_path / "ro.zarr"), read_only=True)
    else:
        out = MemoryStore()
    with pytest.raises(error) as caught:
        _run(source, out, op="inv")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("Expected")
    assert {"memory-store": "MemoryStore", "int": "int", "tuple-of-other": "object", "array-output": "zarr.Array",
            "read-only-output": "read-only", "memory-output": "MemoryStore"}[case] in message
    assert not (tmp_path / "out.zarr").exists() and not (tmp_path / "ro.zarr").exists()
