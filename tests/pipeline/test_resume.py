"""Resume: a SIGKILLed run, resumed, is bit-identical to an uninterrupted one; existing outputs are
never written without resume or overwrite; resume refuses another input, rhs or op."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from _pipeline_helpers import complete_flags, outputs_of, start_and_kill

from batchlu import pipeline
from batchlu.pipeline import errors


@pytest.mark.parametrize("op,dtype", [("lu", "float64"), ("solve", "float64"),
                                      ("inv", "complex128")])
def test_sigkill_then_resume_is_bit_identical(client, stores, tmp_path, op, dtype):
    rhs = stores["b"] if op == "solve" else ""
    if dtype != "float64":
        stores = {"a": pipeline.generate(tmp_path / "a.zarr", count=53, size=6, chunk=10,
                                         dtype=dtype, kind="singular-mix", seed=5)}
    killed, clean = tmp_path / "killed.zarr", tmp_path / "clean.zarr"
    start_and_kill(tmp_path, stores["a"], killed, op, rhs)

    done = complete_flags(killed)
    assert 0 < done.sum() < done.size  # some, not all, chunks complete
    record = zarr.open_group(killed, mode="r").attrs["batchlu"]
    assert record["status"] == "running"
    assert "INCOMPLETE" in pipeline.inspect(str(killed))
    partial = pipeline.verify(stores["a"], killed)
    assert not partial.ok and not partial.complete and "INCOMPLETE" in partial.summary()
    with pytest.raises(errors.OutputExistsError, match="resume"):
        pipeline.run(stores["a"], killed, op=op, rhs=rhs or None, client=client, progress=False)

    report = pipeline.run(stores["a"], killed, op=op, rhs=rhs or None, resume=True,
                          client=client, progress=False, config={"chunk": 4})
    assert 0 < report.skipped < 53 and report.processed == 53 - report.skipped
    pipeline.run(stores["a"], clean, op=op, rhs=rhs or None, client=client, progress=False,
                 config={"chunk": 4})
    got, want = outputs_of(str(killed)), outputs_of(str(clean))
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == want[name].dtype
        assert got[name].tobytes() == want[name].tobytes(), name  # bit for bit, NaNs included
    record = zarr.open_group(killed, mode="r").attrs["batchlu"]
    assert record["status"] == "complete" and len(record["runs"]) == 2
    assert report.ok + report.singular + report.nonfinite == 53  # counts cover the whole output
    assert pipeline.verify(stores["a"], killed).ok


def test_resume_picks_up_a_failed_run(client, stores, tmp_path):
    """Chunks recorded complete are skipped: remove some records and resume only redoes those."""
    out = tmp_path / "o.zarr"
    pipeline.run(stores["a"], out, op="inv", client=client, progress=False, config={"chunk": 5})
    before = outputs_of(str(out))
    records = zarr.open_array(store=str(out), path="_complete", mode="r+")
    records[3:6] = False
    inv = zarr.open_array(store=str(out), path="inv", mode="r+")
    inv[15:30] = 0.0  # the unrecorded chunks' data is stale: resume must rewrite it
    zarr.open_group(out, mode="r+").attrs["batchlu"] = {
        **zarr.open_group(out, mode="r").attrs["batchlu"], "status": "running"}
    report = pipeline.run(stores["a"], out, op="inv", resume=True, client=client, progress=False)
    assert report.processed == 15 and report.skipped == 38 and report.tasks == 3
    after = outputs_of(str(out))
    assert after["inv"].tobytes() == before["inv"].tobytes()


def test_resume_of_complete_output_does_nothing(client, stores, tmp_path):
    out = tmp_path / "o.zarr"
    first = pipeline.run(stores["a"], out, op="slogdet", client=client, progress=False)
    again = pipeline.run(stores["a"], out, op="slogdet", resume=True, client=client, progress=False)
    assert again.processed == 0 and again.skipped == 53 and again.tasks == 0
    assert (again.ok, again.singular, again.nonfinite) == (first.ok, first.singular, first.nonfinite)


def test_resume_without_output_starts_fresh(client, stores, tmp_path):
    report = pipeline.run(stores["a"], tmp_path / "new.zarr", op="lu", resume=True, client=client,
                          progress=False)
    assert report.processed == 53 and report.skipped == 0


def test_refuses_existing_output(client, stores, tmp_path):
    out = tmp_path / "o.zarr"
    pipeline.run(stores["a"], out, op="inv", client=client, progress=False)
    stamp = (out / "zarr.json").read_bytes()
    with pytest.raises(errors.OutputExistsError, match="--overwrite"):
        pipeline.run(stores["a"], out, op="inv", client=client, progress=False)
    assert (out / "zarr.json").read_bytes() == stamp  # untouched
    with pytest.raises(errors.OutputError, match="at most one"):
        pipeline.run(stores["a"], out, op="inv", resume=True, overwrite=True, client=client,
                     progress=False)


def test_overwrite_replaces(client, stores, tmp_path):
    out = tmp_path / "o.zarr"
    pipeline.run(stores["a"], out, op="inv", client=client, progress=False)
    report = pipeline.run(stores["a"], out, op="lu", overwrite=True, client=client, progress=False)
    assert report.processed == 53
    group = zarr.open_group(out, mode="r")
    assert "inv" not in group and "lu" in group and group.attrs["batchlu"]["op"] == "lu"


def test_overwrite_refuses_a_folder_that_is_not_zarr(client, stores, tmp_path):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.tex").write_text("do not delete")
    with pytest.raises(errors.OutputError, match="refusing to delete"):
        pipeline.run(stores["a"], out, op="inv", overwrite=True, client=client, progress=False)
    assert (out / "thesis.tex").exists()


@pytest.mark.parametrize("change", ["op", "input", "rhs", "array"])
def test_resume_refuses_other_input_or_op(client, stores, tmp_path, change):
    root = tmp_path
    other = pipeline.generate(root / "other.zarr", count=53, size=6, seed=9)
    other_b = pipeline.generate_rhs(root / "other_b.zarr", count=53, size=6, seed=9)
    group = zarr.open_group(root / "g.zarr", mode="w")
    for name in ("x", "y"):
        group.create_array(name, shape=(53, 6, 6), chunks=(10, 6, 6), dtype="f8")[...] = \
            np.asarray(zarr.open_array(stores["a"], mode="r")[...])
    first = {"op": ["solve", "solve"], "input": [stores["a"], other], "rhs": [stores["b"], other_b],
             "array": [f"{root / 'g.zarr'}:x", f"{root / 'g.zarr'}:y"]}[change]
    out = root / "o.zarr"
    if change == "op":
        pipeline.run(stores["a"], out, op="solve", rhs=stores["b"], client=client, progress=False)
        second = dict(input=stores["a"], op="inv", rhs=None)
    elif change == "rhs":
        pipeline.run(stores["a"], out, op="solve", rhs=first[0], client=client, progress=False)
        second = dict(input=stores["a"], op="solve", rhs=first[1])
    else:
        pipeline.run(first[0], out, op="lu", client=client, progress=False)
        second = dict(input=first[1], op="lu", rhs=None)
    stamp = (out / "zarr.json").read_bytes()
    with pytest.raises(errors.ResumeError, match="Expected .* to match the one recorded"):
        pipeline.run(second["input"], out, op=second["op"], rhs=second["rhs"], resume=True,
                     client=client, progress=False)
    assert (out / "zarr.json").read_bytes() == stamp


@pytest.mark.parametrize("dtype", ["complex64", "complex128", "float32"])
def test_bits_do_not_depend_on_the_task_cut(client, tmp_path, dtype):
    """One task over every chunk, or one task per chunk: the same bits (each chunk is one kernels
    call), so any resume, whatever it skips, matches an uninterrupted run."""
    source = pipeline.generate(tmp_path / "a.zarr", count=40, size=7, chunk=5, dtype=dtype,
                               kind="singular-mix", seed=11)
    # Chunks of one matrix: a batch of one is where the CPU backend's complex rounding differs most.
    pipeline.run(source, tmp_path / "one.zarr", op="lu", client=client, progress=False,
                 config={"max-tasks": 1, "chunk": 1})
    pipeline.run(source, tmp_path / "many.zarr", op="lu", client=client, progress=False,
                 config={"max-tasks": 1000, "chunk": 1, "memory-budget": 1})
    one, many = outputs_of(str(tmp_path / "one.zarr")), outputs_of(str(tmp_path / "many.zarr"))
    for name in ("lu", "piv", "info"):
        assert one[name].tobytes() == many[name].tobytes(), name
