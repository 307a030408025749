"""Malformed inputs: each gives a clear pipeline.errors error ("Expected X. Got Y instead.") and
leaves nothing marked complete."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from _pipeline_helpers import assert_nothing_complete

from batchlu import pipeline
from batchlu.pipeline import errors


def _array(path, shape, dtype="f8", chunks=None, **kw):
    arr = zarr.create_array(str(path), shape=shape, dtype=dtype, chunks=chunks or shape, **kw)
    if all(shape):
        arr[...] = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    return str(path)


def case_missing_path(tmp, stores):
    return dict(input=str(tmp / "nope.zarr")), errors.InputNotFoundError, "to exist"


def case_missing_array_in_group(tmp, stores):
    zarr.open_group(tmp / "g.zarr", mode="w").create_array("a", shape=(2, 2, 2), dtype="f8")
    return dict(input=f"{tmp / 'g.zarr'}:b"), errors.InputNotFoundError, "Got nothing"


def case_group_not_array(tmp, stores):
    group = zarr.open_group(tmp / "g.zarr", mode="w")
    group.create_array("mats", shape=(2, 2, 2), dtype="f8")
    return dict(input=str(tmp / "g.zarr")), errors.InputError, "g.zarr:mats"


def case_plain_directory(tmp, stores):
    (tmp / "d").mkdir()
    return dict(input=str(tmp / "d")), errors.InputError, "without Zarr metadata"


def case_regular_file(tmp, stores):
    (tmp / "f.zarr").write_text("hello")
    return dict(input=str(tmp / "f.zarr")), errors.InputError, "regular file"


def case_ndim_2(tmp, stores):
    return dict(input=_array(tmp / "a.zarr", (4, 4))), errors.InputError, "ndim 2"


def case_ndim_4(tmp, stores):
    return dict(input=_array(tmp / "a.zarr", (2, 3, 4, 4))), errors.InputError, "ndim 4"


def case_non_square(tmp, stores):
    return dict(input=_array(tmp / "a.zarr", (5, 3, 4))), errors.InputError, "square"


def case_integer_dtype(tmp, stores):
    return dict(input=_array(tmp / "a.zarr", (5, 3, 3), "i4")), errors.InputError, "int32"


def case_rhs_wrong_count(tmp, stores):
    b = _array(tmp / "b.zarr", (52, 6))
    return dict(op="solve", rhs=b), errors.InputError, "N = 53"


def case_rhs_wrong_n(tmp, stores):
    b = _array(tmp / "b.zarr", (53, 5, 2))
    return dict(op="solve", rhs=b), errors.InputError, "n = 6"


def case_rhs_ndim(tmp, stores):
    return dict(op="solve", rhs=_array(tmp / "b.zarr", (53,))), errors.InputError, r"\(N, n\)"


def case_rhs_integer(tmp, stores):
    return dict(op="solve", rhs=_array(tmp / "b.zarr", (53, 6), "i8")), errors.InputError, "int64"


def case_rhs_missing_for_solve(tmp, stores):
    return dict(op="solve"), errors.InputError, "right-hand side"


def case_rhs_given_for_inv(tmp, stores):
    return dict(op="inv", rhs=stores["b"]), errors.InputError, "only solve"


def case_unknown_op(tmp, stores):
    return dict(op="qr"), errors.ConfigError, "lu, inv, solve, slogdet"


def case_unknown_backend(tmp, stores):
    return dict(backend="tpu"), errors.ConfigError, "auto, cpu, gpu"


def case_bad_config(tmp, stores):
    return dict(config={"memory-budget": "lots"}), errors.ConfigError, "memory-budget"


def case_output_is_input(tmp, stores):
    return dict(output=stores["a"]), errors.OutputError, "apart from the input"


def case_output_inside_input(tmp, stores):
    return dict(output=stores["a"] + "/out.zarr"), errors.OutputError, "apart from the input"


def case_output_not_writable(tmp, stores):
    (tmp / "file").write_text("")
    return dict(output=str(tmp / "file" / "out.zarr")), errors.OutputError, "regular file"


def case_output_is_file(tmp, stores):
    (tmp / "o.zarr").write_text("")
    return dict(output=str(tmp / "o.zarr")), errors.OutputError, "regular file"


CASES = [value for name, value in sorted(globals().items()) if name.startswith("case_")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__[5:])
def test_malformed_input(client, stores, tmp_path, case):
    kwargs, error, pattern = case(tmp_path, stores)
    kwargs = {"input": stores["a"], "output": str(tmp_path / "out.zarr"), "op": "lu", **kwargs}
    with pytest.raises(error, match=pattern) as caught:
        pipeline.run(kwargs.pop("input"), kwargs.pop("output"), client=client, progress=False,
                     **kwargs)
    assert isinstance(caught.value, errors.BatchluError)
    assert "Expected" in str(caught.value)
    assert_nothing_complete(tmp_path / "out.zarr")
    assert not (tmp_path / "out.zarr").exists()  # checked before anything was written


def test_malformed_count():
    assert len(CASES) >= 10


def test_corrupted_chunk_names_the_file(client, tmp_path):
    source = pipeline.generate(tmp_path / "a.zarr", count=40, size=4, chunk=10, seed=3)
    bad = tmp_path / "a.zarr" / "c" / "2" / "0" / "0"
    assert bad.is_file()
    bad.write_bytes(b"\x00garbage, not zstd" * 7)
    out = tmp_path / "out.zarr"
    with pytest.raises(errors.CorruptInputError) as caught:
        pipeline.run(source, out, op="inv", client=client, progress=False)
    message = str(caught.value)
    assert "Expected readable chunks" in message and str(bad) in message and "20:30" in message
    record = zarr.open_group(out, mode="r").attrs["batchlu"]
    assert record["status"] == "failed" and "CorruptInputError" in record["error"]
    done = np.asarray(zarr.open_array(store=str(out), path="_complete", mode="r")[...])
    assert not done[2]  # the unreadable chunk's range is never recorded (earlier ones may be)
    assert "INCOMPLETE" in pipeline.inspect(str(out))
    assert not pipeline.verify(source, out).ok


def test_corrupted_chunk_among_many_tasks(client, tmp_path):
    """With one task per chunk, the other chunks may finish; the bad one is never recorded."""
    source = pipeline.generate(tmp_path / "a.zarr", count=40, size=4, chunk=10, seed=3)
    (tmp_path / "a.zarr" / "c" / "1" / "0" / "0").write_bytes(b"\xff" * 50)
    out = tmp_path / "out.zarr"
    with pytest.raises(errors.CorruptInputError, match="10:20"):
        pipeline.run(source, out, op="lu", client=client, progress=False,
                     config={"memory-budget": 1, "chunk": 10})
    done = np.asarray(zarr.open_array(store=str(out), path="_complete", mode="r")[...])
    assert not done[1]
    assert zarr.open_group(out, mode="r").attrs["batchlu"]["status"] == "failed"


def test_backend_gpu_without_gpu(client, stores, tmp_path):
    from batchlu.pipeline.cluster import _devices

    if _devices.gpu_available():
        pytest.skip("a GPU is present here")
    with pytest.raises(errors.BackendError, match="Expected a CUDA GPU"):
        pipeline.run(stores["a"], tmp_path / "o.zarr", op="lu", backend="gpu", client=client,
                     progress=False)
    assert_nothing_complete(tmp_path / "o.zarr")


def test_connect_options_are_exclusive(client, stores, tmp_path):
    with pytest.raises(errors.ConfigError, match="at most one of client, scheduler"):
        pipeline.run(stores["a"], tmp_path / "o.zarr", op="lu", client=client,
                     scheduler="tcp://127.0.0.1:1", progress=False)
    with pytest.raises(errors.ConfigError, match="scheduler file"):
        pipeline.run(stores["a"], tmp_path / "p.zarr", op="lu", progress=False,
                     scheduler_file=str(tmp_path / "missing.json"))
    assert_nothing_complete(tmp_path / "o.zarr")
