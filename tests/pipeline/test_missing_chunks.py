"""Missing input chunks (issue 16, item 5): a chunk file deleted from the input (or the right-hand
side) used to be read as Zarr's fill value and reported "complete, singular". Now it is an error
naming the chunk and its matrices, unless ``batchlu.missing-chunks: fill`` (``--missing-chunks
fill``) gives those matrices ``info`` -3. Whole runs on a real LocalCluster and on-disk Zarr: v3,
v2, sharded v3 (a missing shard, an inner chunk absent from a shard's index), the I/O processes,
a task run directly, the CLI and the console script."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest
import zarr

from batchlu import pipeline
from batchlu.pipeline import errors
from batchlu.pipeline.store import _missing
from batchlu.pipeline._ops import INFO_MISSING_INPUT, compute
from batchlu.testing import matrices

from _pipeline_helpers import outputs_of

COUNT, N, CHUNK = 40, 5, 10


def _store(path, *, dtype="float64", seed=0, chunks=(CHUNK, N, N), shards=None, zarr_format=3,
           rhs=False, k=None):
    """Fresh random matrices (or, ``rhs``, right-hand sides of ``k`` columns) written to ``path``;
    returns (path, data)."""
    if rhs:
        data = matrices.rhs(N, k, dtype, seed=seed, stop=COUNT)
    else:
        data = matrices.generate("random", N, dtype, seed=seed, stop=COUNT)
    kwargs = {"shards": shards} if shards else {}
    if zarr_format == 2:
        array = zarr.open_array(store=str(path), mode="w", shape=data.shape, chunks=chunks, dtype=data.dtype,
                                zarr_format=2)
    else:
        array = zarr.create_array(store=str(path), shape=data.shape, chunks=chunks, dtype=data.dtype, **kwargs)
    array[...] = data
    return str(path), data


def _expected(op, a, b, missing_rows) -> dict:
    """kernels on the original matrices, per output chunk; the missing rows as for info -3."""
    parts = [compute(op, a[lo:lo + CHUNK], None if b is None else b[lo:lo + CHUNK])
             for lo in range(0, COUNT, CHUNK)]
    want = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    for name, value in want.items():
        if name == "info":
            value[missing_rows] = -3
        elif name == "piv":
            value[missing_rows] = np.arange(N)
        else:
            value[missing_rows] = np.nan
    return want


def _check_filled(out, op, a, b, missing_rows, report) -> None:
    got = outputs_of(str(out))
    want = _expected(op, a, b, missing_rows)
    for name, value in want.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
        assert np.array_equal(got[name], value, equal_nan=True), name
    info = got["info"]
    assert np.array_equal(np.flatnonzero(info == INFO_MISSING_INPUT), np.flatnonzero(missing_rows))
    assert report.missing == int(missing_rows.sum()) > 0
    assert report.ok == COUNT - report.missing and report.status == "complete"
    assert got["_complete"].all()


# --------------------------------------------------------------------------------------------- error
@pytest.mark.parametrize("op", ["inv", "lu"])
def test_missing_chunk_is_an_error_naming_the_chunk_and_its_matrices(client, tmp_path, op):
    source, _ = _store(tmp_path / "a.zarr")
    gone = tmp_path / "a.zarr" / "c" / "2" / "0" / "0"
    os.remove(gone)
    out = tmp_path / "out.zarr"
    with pytest.raises(errors.MissingChunkError) as caught:
        pipeline.run(source, out, op=op, client=client, progress=False, config={"chunk": CHUNK})
    message = str(caught.value)
    assert isinstance(caught.value, errors.BatchluError) and isinstance(caught.value, ValueError)
    assert f"chunk file {gone} (matrices 20:30) missing" in message, message
    assert "--missing-chunks fill" in message and "\n" not in message
    record = zarr.open_group(out, mode="r").attrs["batchlu"]
    assert record["status"] == "failed" and "MissingChunkError" in record["error"]
    done = np.asarray(zarr.open_array(store=str(out), path="_complete", mode="r")[...])
    assert not done[2]   # never recorded complete (the others may be)


def test_missing_rhs_chunk_is_an_error(client, tmp_path):
    source, _ = _store(tmp_path / "a.zarr")
    rhs, _ = _store(tmp_path / "b.zarr", seed=1, rhs=True, k=2, chunks=(8, N, 2))
    gone = tmp_path / "b.zarr" / "c" / "3" / "0" / "0"
    os.remove(gone)
    with pytest.raises(errors.MissingChunkError) as caught:
        pipeline.run(source, tmp_path / "out.zarr", op="solve", rhs=rhs, client=client, progress=False)
    assert f"right-hand side {tmp_path / 'b.zarr'}" in str(caught.value)
    assert f"chunk file {gone} (matrices 24:32) missing" in str(caught.value)


def test_missing_chunk_of_a_v2_input(client, tmp_path):
    source, _ = _store(tmp_path / "a2.zarr", zarr_format=2)
    gone = tmp_path / "a2.zarr" / "1.0.0"
    os.remove(gone)
    with pytest.raises(errors.MissingChunkError, match=f"chunk file {gone} \\(matrices 10:20\\)"):
        pipeline.run(source, tmp_path / "out.zarr", op="slogdet", client=client, progress=False)


def test_missing_shard_and_inner_chunk_of_a_sharded_input(client, tmp_path):
    source, a = _store(tmp_path / "s.zarr", chunks=(5, N, N), shards=(CHUNK, N, N))
    array = zarr.open_array(source, mode="r+")
    array[25:30] = 0     # zarr drops an inner chunk equal to the fill value from the shard's index
    shard = tmp_path / "s.zarr" / "c" / "2" / "0" / "0"
    assert shard.is_file()
    with pytest.raises(errors.MissingChunkError) as caught:
        pipeline.run(source, tmp_path / "o1.zarr", op="inv", client=client, progress=False)
    assert f"chunk (5, 0, 0) inside shard {shard} (matrices 25:30) missing" in str(caught.value)
    os.remove(tmp_path / "s.zarr" / "c" / "0" / "0" / "0")
    with pytest.raises(errors.MissingChunkError, match="matrices 0:10"):
        pipeline.run(source, tmp_path / "o2.zarr", op="inv", client=client, progress=False)
    report = pipeline.run(source, tmp_path / "o3.zarr", op="inv", client=client, progress=False,
                          config={"missing-chunks": "fill", "chunk": CHUNK})
    rows = np.zeros(COUNT, bool)
    rows[0:10] = rows[25:30] = True
    _check_filled(tmp_path / "o3.zarr", "inv", a, None, rows, report)


def test_missing_chunk_through_io_processes(client, tmp_path):
    source, a = _store(tmp_path / "a.zarr", seed=4)
    os.remove(tmp_path / "a.zarr" / "c" / "1" / "0" / "0")
    config = {"io-processes": 1, "io-threads": 1, "chunk": CHUNK}
    with pytest.raises(errors.MissingChunkError, match="matrices 10:20"):
        pipeline.run(source, tmp_path / "o1.zarr", op="inv", client=client, progress=False, config=config)
    report = pipeline.run(source, tmp_path / "o2.zarr", op="inv", client=client, progress=False,
                          config={**config, "missing-chunks": "fill"})
    rows = np.zeros(COUNT, bool)
    rows[10:20] = True
    _check_filled(tmp_path / "o2.zarr", "inv", a, None, rows, report)


# ---------------------------------------------------------------------------------------------- fill
@pytest.mark.parametrize("op", ["lu", "inv", "slogdet"])
def test_fill_gives_info_minus_3_counted_in_the_report(client, tmp_path, op):
    source, a = _store(tmp_path / "a.zarr", seed=2, dtype="complex64")
    os.remove(tmp_path / "a.zarr" / "c" / "1" / "0" / "0")
    out = tmp_path / "out.zarr"
    report = pipeline.run(source, out, op=op, client=client, progress=False,
                          config={"missing-chunks": "fill", "chunk": CHUNK, "max-tasks": 2})
    rows = np.zeros(COUNT, bool)
    rows[10:20] = True
    _check_filled(out, op, a, None, rows, report)
    assert "missing input 10" in repr(report)
    record = zarr.open_group(out, mode="r").attrs["batchlu"]
    assert record["counts"]["missing"] == 10 and record["settings"]["missing_chunks"] == "fill"
    assert "missing input 10" in pipeline.inspect(str(out))
    check = pipeline.verify(source, out)
    assert check.ok and check.missing == 10, check.summary()


def test_fill_for_a_missing_rhs_chunk(client, tmp_path):
    source, a = _store(tmp_path / "a.zarr", seed=5)
    rhs, b = _store(tmp_path / "b.zarr", seed=6, rhs=True, chunks=(8, N))
    os.remove(tmp_path / "b.zarr" / "c" / "2" / "0")
    out = tmp_path / "out.zarr"
    report = pipeline.run(source, out, op="solve", rhs=rhs, client=client, progress=False,
                          config={"missing-chunks": "fill", "chunk": CHUNK})
    rows = np.zeros(COUNT, bool)
    rows[16:24] = True
    _check_filled(out, "solve", a, b, rows, report)
    assert pipeline.verify(source, out).ok


def test_verify_refuses_minus_3_where_the_chunk_is_there(client, tmp_path):
    """-3 is only right where the input chunk is missing: restored, the same output fails verify."""
    source, _ = _store(tmp_path / "a.zarr", seed=7)
    chunk_file = tmp_path / "a.zarr" / "c" / "3" / "0" / "0"
    saved = chunk_file.read_bytes()
    os.remove(chunk_file)
    out = tmp_path / "out.zarr"
    pipeline.run(source, out, op="inv", client=client, progress=False, config={"missing-chunks": "fill"})
    assert pipeline.verify(source, out).ok
    chunk_file.write_bytes(saved)
    check = pipeline.verify(source, out)
    assert not check.ok and check.semantic_errors == 10, check.summary()


def test_verify_asks_the_store_even_where_no_matrix_is_minus_3(client, tmp_path):
    """An input chunk gone since a complete run reads as the fill value: verify asks the store for
    every block it checks (it asked only where some matrix was -3), so the matrices of that chunk are
    a "missing-flagged" error, whatever their ratios say."""
    source, _ = _store(tmp_path / "a.zarr", seed=8)
    out = tmp_path / "out.zarr"
    pipeline.run(source, out, op="inv", client=client, progress=False)
    assert pipeline.verify(source, out).ok
    os.remove(tmp_path / "a.zarr" / "c" / "2" / "0" / "0")
    check = pipeline.verify(source, out)
    assert not check.ok and check.failures.get("missing-flagged") == 10, check.summary()


def test_verify_refuses_an_input_with_an_empty_shard_file(client, tmp_path):
    """An output computed from a shard file of no bytes (zarr reads it as the fill value; runs before
    the run refused it computed from zeros: "singular", verify OK): verify names the empty shard."""
    source, _ = _store(tmp_path / "a.zarr", seed=9, shards=(2 * CHUNK, N, N))
    out = tmp_path / "out.zarr"
    pipeline.run(source, out, op="inv", client=client, progress=False)
    assert pipeline.verify(source, out).ok
    (tmp_path / "a.zarr" / "c" / "1" / "0" / "0").write_bytes(b"")
    with pytest.raises(errors.CorruptInputError, match="empty file"):
        pipeline.verify(source, out)


# ------------------------------------------------------------------------------------------- the task
def test_task_checks_too(tmp_path):
    """A task run directly (``_tasks.process_range``, as on a worker) looks up the chunks as well:
    its result carries the error by default, -3 with fill."""
    from batchlu.pipeline import _ops, _plan
    from batchlu.pipeline.output import _group
    from batchlu.pipeline.store import _arrays
    from batchlu.pipeline.worker import _tasks

    source, a = _store(tmp_path / "a.zarr", seed=8)
    os.remove(tmp_path / "a.zarr" / "c" / "0" / "0" / "0")
    out = str(tmp_path / "out.zarr")
    specs = _ops.output_specs("inv", N, np.float64)
    plan = _plan.make_plan(COUNT, 4096, memory_budget=1 << 20, max_tasks=4, input_chunk=CHUNK, chunk=CHUNK)
    settings = pipeline.Options(io_processes=0)
    _group.create(out, {"status": "running"}, specs, plan, settings.output_codec, settings.output_layout)
    job = _tasks.Job(op="inv", input=_arrays.parse_ref(source), rhs=None, output=out,
                     outputs=tuple(s.name for s in specs), plan=plan, backend="cpu", settings=settings)
    failed = _tasks.process_range(job, 0, plan.n_chunks)
    assert isinstance(failed.error, errors.MissingChunkError) and "matrices 0:10" in str(failed.error)
    filled = dataclasses.replace(job, settings=job.settings.replace(missing_chunks="fill"))
    result = _tasks.process_range(filled, 0, plan.n_chunks)
    assert result.error is None and (result.missing, result.ok) == (10, 30)
    info = np.asarray(zarr.open_array(store=out, path="info", mode="r")[...])
    assert (info[:10] == -3).all() and (info[10:] == 0).all()


def test_find_asks_only_for_the_chunks_of_the_range(tmp_path):
    source, _ = _store(tmp_path / "a.zarr", seed=9)
    os.remove(tmp_path / "a.zarr" / "c" / "3" / "0" / "0")
    array = zarr.open_array(source, mode="r")
    assert _missing.find(array, 0, 30) == []
    gaps = _missing.find(array, 29, 31)
    assert [(g.key, g.lo, g.hi) for g in gaps] == [("c/3/0/0", 30, 40)]
    mask = _missing.check(array, source, 25, 35, "fill")
    assert mask.tolist() == [False] * 5 + [True] * 5


@pytest.mark.parametrize("zarr_format,chunks", [(3, (CHUNK, N, N)), (3, (CHUNK, 2, 3)), (2, (CHUNK, N, N)),
                                                 (2, (7, 2, N))])
def test_find_on_local_files_agrees_with_the_store(tmp_path, zarr_format, chunks):
    """Unsharded arrays in a local store are looked up with a stat per chunk file (no event loop):
    the same gaps as zarr's store finds, for v2 and v3 keys and chunks cut along every axis."""
    from batchlu.pipeline.store._zarr import sync

    source, _ = _store(tmp_path / "a.zarr", seed=10, chunks=chunks, zarr_format=zarr_format)
    array = zarr.open_array(source, mode="r")
    files = sorted(os.path.relpath(os.path.join(d, f), source) for d, _, fs in os.walk(source) for f in fs
                   if not f.startswith((".z", "zarr.json")))
    rng = np.random.default_rng(11)
    removed = [str(name) for name in rng.choice(files, size=3, replace=False)]
    for name in removed:
        os.remove(os.path.join(source, name))
    for start, stop in [(0, COUNT), (3, 9), (7, 8), (13, 37), (COUNT - 1, COUNT)]:
        fast = _missing._local_files(array, start, stop)
        slow = sync(_missing._find(array, start, stop))
        assert fast is not None and fast == slow, (start, stop)
    assert sorted(g.key for g in _missing.find(array, 0, COUNT)) == sorted(n.replace(os.sep, "/") for n in removed)


def test_missing_chunks_setting_is_checked():
    with pytest.raises(errors.ConfigError, match="missing-chunks to be one of error, fill"):
        pipeline.options({"missing-chunks": "zeros"})
    assert pipeline.options().missing_chunks == "error"


# ---------------------------------------------------------------------------------------------- CLI
def test_cli_missing_chunk_one_line_and_fill(client, tmp_path):
    from click.testing import CliRunner

    from batchlu.workflows.cli import cli

    source, _ = _store(tmp_path / "a.zarr", seed=10)
    gone = tmp_path / "a.zarr" / "c" / "2" / "0" / "0"
    os.remove(gone)
    scheduler = client.scheduler.address
    result = CliRunner().invoke(cli, ["run", source, str(tmp_path / "o1.zarr"), "--op", "inv",
                                      "--scheduler", scheduler], catch_exceptions=False)
    assert result.exit_code == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: Expected every chunk"), result.stderr
    assert f"{gone} (matrices 20:30)" in lines[0]
    result = CliRunner().invoke(cli, ["run", source, str(tmp_path / "o2.zarr"), "--op", "inv",
                                      "--scheduler", scheduler, "--missing-chunks", "fill"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "missing input 10" in result.stdout and "ok 30" in result.stdout
    result = CliRunner().invoke(cli, ["run", source, str(tmp_path / "o3.zarr"), "--op", "inv",
                                      "--scheduler", scheduler, "--missing-chunks", "zeros"])
    assert result.exit_code == 2 and "zeros" in result.stderr


def test_console_script_missing_chunk_prints_one_line_and_no_worker_traceback(tmp_path):
    """On the embedded cluster (worker processes writing to the same terminal): one line, exit 1."""
    source, _ = _store(tmp_path / "a.zarr", seed=11)
    os.remove(tmp_path / "a.zarr" / "c" / "1" / "0" / "0")
    proc = subprocess.run([sys.executable, "-m", "batchlu", "run", source, str(tmp_path / "o.zarr"),
                           "--op", "inv", "--workers", "1", "--threads-per-worker", "1", "--no-progress",
                           "--config", "cluster.dashboard-address=127.0.0.1:0"],
                          capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
                          cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: Expected every chunk"), proc.stderr
    assert "(matrices 10:20)" in lines[0] and "Traceback" not in proc.stderr
