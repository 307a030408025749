"""verify recomputes LAPACK test ratios and catches wrong outputs; inspect summarises stores."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from batchlu import pipeline
from batchlu.pipeline import errors


@pytest.fixture(scope="module")
def outputs(client, stores, tmp_path_factory):
    root = tmp_path_factory.mktemp("verify")
    made = {}
    for op in pipeline.OPS:
        made[op] = str(root / f"{op}.zarr")
        pipeline.run(stores["a"], made[op], op=op, rhs=stores["b"] if op == "solve" else None,
                     client=client, progress=False, config={"chunk": 10})
    return made


def _copy(src: str, dst) -> str:
    import shutil

    shutil.copytree(src, dst)
    return str(dst)


def _first(info: np.ndarray, ok: bool = True) -> int:
    return int(np.flatnonzero(info == 0)[0] if ok else np.flatnonzero(info > 0)[0])


def test_verify_all_ops_ok(outputs, stores):
    for op, out in outputs.items():
        result = pipeline.verify(stores["a"], out)
        assert result.ok, result.summary()
        assert result.checked == 53 and not result.sampled and result.semantic_errors == 0
        assert 0 <= result.median_ratio <= result.max_ratio < 30
        assert result.singular > 0 and result.nonfinite > 0
        summary = result.summary()
        assert "OK" in summary and "max" in summary and "median" in summary and "over 30" in summary


def test_verify_sample(outputs, stores):
    result = pipeline.verify(stores["a"], outputs["inv"], sample=10, seed=4)
    assert result.ok and result.sampled and result.checked == 10
    assert "random sample of 10" in result.summary()
    big = pipeline.verify(stores["a"], outputs["inv"], sample=1000)
    assert big.checked == 53


@pytest.mark.parametrize("op,name", [("inv", "inv"), ("lu", "lu"), ("solve", "x"),
                                     ("slogdet", "logabsdet")])
def test_verify_catches_a_wrong_value(outputs, stores, tmp_path, op, name):
    out = _copy(outputs[op], tmp_path / "bad.zarr")
    info = np.asarray(zarr.open_array(store=out, path="info")[...])
    i = _first(info)
    arr = zarr.open_array(store=out, path=name, mode="r+")
    value = np.asarray(arr[i:i + 1])
    value.reshape(-1)[-1] += 1.0 if name != "logabsdet" else 0.5
    arr[i:i + 1] = value
    result = pipeline.verify(stores["a"], out)
    assert not result.ok and result.over_threshold == 1 and result.max_ratio > 30
    assert f"matrix {i}: ratio" in result.summary() and "FAILED" in result.summary()


def test_verify_catches_swapped_pivots(outputs, stores, tmp_path):
    out = _copy(outputs["lu"], tmp_path / "bad.zarr")
    info = np.asarray(zarr.open_array(store=out, path="info")[...])
    i = _first(info)
    piv = zarr.open_array(store=out, path="piv", mode="r+")
    row = np.asarray(piv[i:i + 1])
    row[0, 0] = (row[0, 0] + 1) % row.shape[1]
    piv[i:i + 1] = row
    assert not pipeline.verify(stores["a"], out).ok


def test_verify_catches_broken_semantics(outputs, stores, tmp_path):
    """A singular matrix's inverse must be all NaN; a finite one is flagged."""
    out = _copy(outputs["inv"], tmp_path / "bad.zarr")
    info = np.asarray(zarr.open_array(store=out, path="info")[...])
    i = _first(info, ok=False)
    inv = zarr.open_array(store=out, path="inv", mode="r+")
    inv[i:i + 1] = np.ones((1, 6, 6))
    result = pipeline.verify(stores["a"], out)
    assert not result.ok and result.semantic_errors == 1 and result.over_threshold == 0
    assert f"matrix {i}: info" in result.summary()


def test_verify_reports_incomplete(outputs, stores, tmp_path):
    out = _copy(outputs["inv"], tmp_path / "part.zarr")
    zarr.open_array(store=out, path="_complete", mode="r+")[2:4] = False
    group = zarr.open_group(out, mode="r+")
    group.attrs["batchlu"] = {**group.attrs["batchlu"], "status": "running"}
    result = pipeline.verify(stores["a"], out)
    assert not result.ok and not result.complete and result.checked == 33
    assert "INCOMPLETE" in result.summary() and "4 of 6 chunks" in result.summary()


def test_verify_refuses_other_things(outputs, stores, tmp_path):
    with pytest.raises(errors.InputError, match="batchlu output"):
        pipeline.verify(stores["a"], stores["b"])
    other = pipeline.generate(tmp_path / "o.zarr", count=20, size=6)
    with pytest.raises(errors.InputError, match="as recorded"):
        pipeline.verify(other, outputs["inv"])


def test_inspect_output(outputs):
    text = pipeline.inspect(outputs["lu"])
    for part in ("status: complete", "op lu", "float64", "N 53", "chunks: 6/6 complete",
                 "lu: shape (53, 6, 6) float64, chunks (10, 6, 6)", "piv: shape (53, 6) int32",
                 "info: ok", "singular", "non-finite"):
        assert part in text, part
    info = np.asarray(zarr.open_array(store=outputs["lu"], path="info")[...])
    assert f"ok {int((info == 0).sum())}" in text


def test_inspect_incomplete(outputs, tmp_path):
    out = _copy(outputs["slogdet"], tmp_path / "part.zarr")
    zarr.open_array(store=out, path="_complete", mode="r+")[0] = False
    group = zarr.open_group(out, mode="r+")
    group.attrs["batchlu"] = {**group.attrs["batchlu"], "status": "running"}
    text = pipeline.inspect(out)
    assert "status: running" in text and "5/6 complete" in text and "INCOMPLETE" in text
    assert "of 43 computed" in text


def test_inspect_inputs(stores, tmp_path):
    text = pipeline.inspect(stores["a"])
    assert "shape (53, 6, 6) float64" in text and "chunks (10, 6, 6)" in text
    assert "singular-mix" in text
    group = zarr.open_group(tmp_path / "g.zarr", mode="w")
    group.create_array("m", shape=(4, 2, 2), dtype="f4")
    assert "m: shape (4, 2, 2) float32" in pipeline.inspect(str(tmp_path / "g.zarr"))
    assert "shape (4, 2, 2)" in pipeline.inspect(f"{tmp_path / 'g.zarr'}:m")
    with pytest.raises(errors.InputNotFoundError):
        pipeline.inspect(str(tmp_path / "missing.zarr"))
