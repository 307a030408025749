"""End to end on a real LocalCluster and real on-disk Zarr: every op, dtypes, odd chunkings, a v2
input, an input inside a group, right-hand sides of both shapes, the embedded cluster."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import zarr

from batchlu import pipeline
from batchlu.errors import BatchluError
from batchlu.pipeline.output import _fingerprint
from batchlu.pipeline._ops import INFO_NOT_COMPUTED, OP_TABLE, compute
from batchlu.pipeline.output import _group

from _pipeline_helpers import outputs_of

DTYPES = ("float32", "float64", "complex64", "complex128")
# Small batches and few tasks: tasks of several batches, output chunks that do not divide N (53)
# and do not match the input's chunks (10).
SMALL = {"chunk": 8, "memory-budget": 6000, "max-tasks": 3}


def expected(op, a, b=None, chunk=None) -> dict:
    """What the pipeline must write: kernels.* called once per output chunk, in this process."""
    if chunk is not None:
        parts = [expected(op, a[lo:lo + chunk], None if b is None else b[lo:lo + chunk])
                 for lo in range(0, a.shape[0], chunk)]
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    return compute(op, a, b)


def check_output(path, op, a, b=None, chunk=None) -> dict:
    got = outputs_of(path)
    if chunk is None:
        chunk = zarr.open_array(store=path, path="info", mode="r").chunks[0]
    want = expected(op, a, b, chunk)
    assert set(got) == set(want) | {"_complete", "_input_xxh3"}
    assert got["_complete"].all()
    step = chunk or max(1, a.shape[0])  # the digest of each chunk's input, as resume will check it
    assert got["_input_xxh3"].tolist() == [
        _fingerprint.digest(a[lo:lo + step], None if b is None else b[lo:lo + step])
        for lo in range(0, a.shape[0], step)]
    for name, value in want.items():
        assert got[name].dtype == value.dtype, name
        assert got[name].shape == value.shape, name
        assert np.array_equal(got[name], value, equal_nan=True), name
    assert not (got["info"] == INFO_NOT_COMPUTED).any()  # every element was written
    if chunk:
        group = zarr.open_group(path, mode="r")
        for name in want:
            assert group[name].chunks[0] == chunk
            assert group[name].metadata.zarr_format == 3
    return got


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("run-inputs")
    made = {}
    for i, dtype in enumerate(DTYPES):
        made[dtype] = pipeline.generate(root / f"a-{dtype}.zarr", count=53, size=5, chunk=10,
                                        dtype=dtype, kind="singular-mix", seed=10 + i)
        made[dtype + "-b"] = pipeline.generate_rhs(root / f"b-{dtype}.zarr", count=53, size=5,
                                                   dtype=dtype, chunk=10, seed=20 + i)
    return made


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", pipeline.DENSE_OPS)
def test_every_op_and_dtype(client, inputs, tmp_path, op, dtype):
    a = np.asarray(zarr.open_array(inputs[dtype], mode="r")[...])
    rhs = inputs[dtype + "-b"] if op == "solve" else None
    b = np.asarray(zarr.open_array(rhs, mode="r")[...]) if rhs else None
    out = tmp_path / "out.zarr"
    report = pipeline.run(inputs[dtype], out, op=op, rhs=rhs, client=client, progress=False,
                          config=SMALL)
    got = check_output(str(out), op, a, b, chunk=8)
    info = got["info"]
    counts = {"ok": int((info == 0).sum()), "singular": int((info > 0).sum()),
              "nonfinite": int((info == -1).sum()), "nonfinite_result": int((info == -2).sum()),
              "missing": int((info == -3).sum()), "refinement": int((info == -4).sum())}
    assert report.counts._asdict() == counts and (info >= -3).all()
    assert report.singular > 0 and report.nonfinite > 0 and report.ok > 0
    assert report.processed == report.count == 53 and report.skipped == 0
    assert report.tasks == 3 and report.status == "complete" and report.backends == ("cpu",)
    record = zarr.open_group(out, mode="r").attrs["batchlu"]
    assert record["status"] == "complete" and record["op"] == op and record["finished"]
    assert record["input"]["path"] == inputs[dtype] and record["N"] == 53 and record["n"] == 5
    assert record["dtype"] == dtype and record["settings"]["memory_budget"] == 6000
    assert record["backend"] == "auto" and record["backends_used"] == ["cpu"]
    assert record["version"] and record["started"] and record["plan"]["chunk"] == 8
    assert record["counts"] == counts
    json.dumps(record)  # provenance is plain JSON
    result = pipeline.verify(inputs[dtype], out)
    assert result.ok, result.summary()
    assert result.checked == 53 and result.ratios > 0


def test_report_repr(client, stores, tmp_path):
    report = pipeline.run(stores["a"], tmp_path / "o.zarr", op="inv", client=client, progress=False)
    text = repr(report)
    for word in ("inv", "complete", "ok", "singular", "non-finite", "matrices/s", str(tmp_path)):
        assert word in text
    assert report.elapsed > 0 and report.matrices_per_s > 0 and report.bytes_in == 53 * 36 * 8
    assert abs(sum(report.worker_share.values()) - 1) < 1e-12


def check_times(report, outer: float) -> None:
    """The run's times are there, in the text and the dict, and its parts add up to its whole."""
    assert report.cluster_start >= 0 and report.warmup >= 0 and report.elapsed > 0
    assert report.plan > 0 and report.finish >= 0 and report.imports == 0   # the API: no imports part
    parts = report.plan + report.cluster_start + report.warmup + report.elapsed + report.finish
    assert parts == pytest.approx(report.wall, abs=1e-9) and report.total == report.wall <= outer, \
        (report.plan, report.cluster_start, report.warmup, report.elapsed, report.finish, report.wall, outer)
    assert report.gb_in_per_s == pytest.approx(report.bytes_in / 1e9 / report.elapsed)  # compute only
    for stage in (report.read_s, report.compute_s, report.write_s):
        assert stage > 0
    text = repr(report)
    # the warm-up's parts (the slowest worker's): a CPU run's is its kernels, within the warm-up
    assert set(report.warmup_steps) == {"kernels"}, report.warmup_steps
    assert 0 < report.warmup_steps["kernels"] <= report.warmup, (report.warmup_steps, report.warmup)
    steps = ", ".join(f"{name} {seconds:.2f}" for name, seconds in report.warmup_steps.items())
    # the finish's parts: the cluster's close (a run on a cluster), the checks after the tasks, the record
    assert list(report.finish_steps)[-2:] == ["checks", "record"], report.finish_steps
    assert set(report.finish_steps) <= {"cluster close", "checks", "record"}
    assert all(s >= 0 for s in report.finish_steps.values())
    assert sum(report.finish_steps.values()) <= report.finish + 1e-9, (report.finish_steps, report.finish)
    ends = ", ".join(f"{name} {seconds:.2f}" for name, seconds in report.finish_steps.items())
    assert (f"time: plan {report.plan:.2f} s, cluster start {report.cluster_start:.2f} s, warm-up "
            f"{report.warmup:.2f} s ({steps}), compute {report.elapsed:.2f} s, finish {report.finish:.2f} s "
            f"({ends}), total {report.wall:.2f} s") in text
    assert "import " not in text and "read " in text and "write " in text
    record = report.as_dict()
    assert {"plan", "cluster_start", "warmup", "warmup_steps", "elapsed", "finish", "finish_steps", "wall", "total", "read_s",
            "compute_s", "write_s"} <= set(record)
    json.dumps(record)


def test_report_times_with_a_client(client, stores, tmp_path):
    import time

    t = time.perf_counter()
    report = pipeline.run(stores["a"], tmp_path / "o.zarr", op="inv", client=client, progress=False,
                          config={"chunk": 9, "memory-budget": 1})
    check_times(report, time.perf_counter() - t)
    assert report.cluster_start < 1  # a client given: nothing to start
    run = zarr.open_group(tmp_path / "o.zarr", mode="r").attrs["batchlu"]["runs"][-1]
    assert run["seconds"] == report.elapsed and run["warmup"] == report.warmup
    assert run["cluster_start"] == report.cluster_start and 0 < run["wall"] <= report.wall


def test_v2_input_and_array_inside_group(client, tmp_path):
    from batchlu.testing import matrices

    a = matrices.generate("random", 4, "float64", seed=5, start=0, stop=23)
    v2 = zarr.create_array(tmp_path / "v2.zarr", shape=a.shape, chunks=(6, 4, 4), dtype=a.dtype,
                           zarr_format=2)
    v2[...] = a
    group = zarr.open_group(tmp_path / "g.zarr", mode="w")
    nested = group.create_group("sub").create_array("mats", shape=a.shape, chunks=(5, 4, 4),
                                                    dtype=a.dtype)
    nested[...] = a
    group.create_array("other", shape=(3,), dtype="f8")
    first = pipeline.run(str(tmp_path / "v2.zarr"), tmp_path / "o1.zarr", op="lu", client=client,
                         progress=False)
    second = pipeline.run(f"{tmp_path / 'g.zarr'}:sub/mats", tmp_path / "o2.zarr", op="lu",
                          client=client, progress=False)
    assert first.ok == second.ok == 23
    check_output(str(tmp_path / "o1.zarr"), "lu", a, chunk=6)
    check_output(str(tmp_path / "o2.zarr"), "lu", a, chunk=5)
    record = zarr.open_group(tmp_path / "o2.zarr", mode="r").attrs["batchlu"]
    assert record["input"]["array"] == "sub/mats" and record["input"]["zarr_format"] == 3
    assert zarr.open_group(tmp_path / "o1.zarr", mode="r").attrs["batchlu"]["input"]["zarr_format"] == 2
    assert pipeline.verify(f"{tmp_path / 'g.zarr'}:sub/mats", tmp_path / "o2.zarr").ok


def test_solve_with_k_columns(client, stores, tmp_path):
    a = np.asarray(zarr.open_array(stores["a"], mode="r")[...])
    b = np.asarray(zarr.open_array(stores["bk"], mode="r")[...])
    assert b.shape == (53, 6, 3)
    pipeline.run(stores["a"], tmp_path / "x.zarr", op="solve", rhs=stores["bk"], client=client,
                 progress=False, config={"chunk": 11})
    got = check_output(str(tmp_path / "x.zarr"), "solve", a, b, chunk=11)
    assert got["x"].shape == (53, 6, 3)
    result = pipeline.verify(stores["a"], tmp_path / "x.zarr")  # rhs taken from the record
    assert result.ok and result.ratios == int((got["info"] == 0).sum())


def test_mixed_precision_solve(client, inputs, tmp_path):
    """float32 matrices with complex128 right-hand sides: x in numpy.result_type."""
    b = pipeline.generate_rhs(tmp_path / "bz.zarr", count=53, size=5, dtype="complex128", seed=4)
    pipeline.run(inputs["float32"], tmp_path / "x.zarr", op="solve", rhs=b, client=client,
                 progress=False)
    x = zarr.open_array(tmp_path / "x.zarr", path="x", mode="r")
    assert x.dtype == np.complex128
    assert pipeline.verify(inputs["float32"], tmp_path / "x.zarr").ok


def test_many_tasks_one_chunk_each(client, stores, tmp_path):
    a = np.asarray(zarr.open_array(stores["a"], mode="r")[...])
    report = pipeline.run(stores["a"], tmp_path / "o.zarr", op="slogdet", client=client,
                          progress=False, config={"chunk": 3, "memory-budget": 1})
    assert report.tasks == 18  # ceil(53 / 3)
    assert len(report.per_worker) == 2  # both workers took part
    check_output(str(tmp_path / "o.zarr"), "slogdet", a, chunk=3)


def test_small_input_chunks_are_merged_into_byte_sized_output_chunks(client, tmp_path):
    """256 one-matrix input chunks: output chunks gather whole input chunks up to
    batchlu.chunk-bytes (2 matrices here), and each holds what kernels.* give for it alone."""
    from batchlu.pipeline._plan import MIN_CHUNKS

    src = pipeline.generate(tmp_path / "a.zarr", count=4 * MIN_CHUNKS, size=5, dtype="complex128",
                            chunk=1, kind="singular-mix", seed=3)
    report = pipeline.run(src, tmp_path / "o.zarr", op="lu", client=client, progress=False,
                          config={"chunk-bytes": 2 * 5 * 5 * 16})
    assert report.tasks == 2 * MIN_CHUNKS
    plan = zarr.open_group(tmp_path / "o.zarr", mode="r").attrs["batchlu"]["plan"]
    assert plan["chunk"] == 2 and plan["n_chunks"] == 2 * MIN_CHUNKS
    a = np.asarray(zarr.open_array(src, mode="r")[...])
    check_output(str(tmp_path / "o.zarr"), "lu", a, chunk=2)


def test_progress_bar(client, stores, tmp_path, capsys):
    pipeline.run(stores["a"], tmp_path / "o.zarr", op="inv", client=client, progress=True,
                 config={"chunk": 5, "memory-budget": 1})
    err = capsys.readouterr().err
    assert "batchlu inv [" in err and "53/53 matrices" in err
    pipeline.run(stores["a"], tmp_path / "p.zarr", op="inv", client=client, progress=False)
    assert capsys.readouterr().err == ""


def test_empty_input(client, tmp_path):
    zarr.create_array(tmp_path / "e.zarr", shape=(0, 3, 3), chunks=(4, 3, 3), dtype="f8")
    report = pipeline.run(str(tmp_path / "e.zarr"), tmp_path / "o.zarr", op="lu", client=client,
                          progress=False)
    assert report.count == report.processed == 0 and report.tasks == 0
    assert zarr.open_group(tmp_path / "o.zarr", mode="r").attrs["batchlu"]["status"] == "complete"


def test_embedded_cluster_with_processes(stores, tmp_path):
    """No client: the embedded LocalCluster (2 worker processes here), on 127.0.0.1."""
    config = {"cluster": {"n-workers": 2, "threads-per-worker": 1, "processes": True,
                          "dashboard-address": "127.0.0.1:0"}, "chunk": 9, "memory-budget": 1}
    import time

    t = time.perf_counter()
    report = pipeline.run(stores["a"], tmp_path / "o.zarr", op="lu", progress=False, config=config)
    check_times(report, time.perf_counter() - t)
    # starting 2 worker processes takes time of its own; the warm-up then loads the kernels on them
    # (numba's compilation, or its disk cache), which may take longer still
    assert report.cluster_start > 0.1 and report.warmup > 0
    a = np.asarray(zarr.open_array(stores["a"], mode="r")[...])
    check_output(str(tmp_path / "o.zarr"), "lu", a, chunk=9)
    assert report.dashboard is None   # the embedded cluster stopped with the run: no link to it
    assert all(w.startswith("tcp://127.0.0.1:") for w in report.per_worker)
    assert sum(report.per_worker.values()) == 53


def test_scheduler_address_and_file(client, stores, tmp_path):
    address = client.scheduler.address
    first = pipeline.run(stores["a"], tmp_path / "o1.zarr", op="inv", scheduler=address,
                         progress=False)
    (tmp_path / "sched.json").write_text(json.dumps({"address": address}))
    second = pipeline.run(stores["a"], tmp_path / "o2.zarr", op="inv",
                          scheduler_file=str(tmp_path / "sched.json"), progress=False)
    assert first.status == second.status == "complete"
    assert first.dashboard == second.dashboard == client.dashboard_link  # a cluster that goes on running
    assert np.array_equal(outputs_of(str(tmp_path / "o1.zarr"))["inv"],
                          outputs_of(str(tmp_path / "o2.zarr"))["inv"], equal_nan=True)
    assert client.status == "running"  # a client passed in, or shared, is never closed


def test_sharded_input_and_options_object(client, tmp_path):
    """A sharded input: output chunks follow the shard (the stored object), not the inner chunk."""
    from batchlu.testing import matrices

    a = matrices.generate("random", 3, "complex64", seed=8, start=0, stop=45)
    arr = zarr.create_array(tmp_path / "s.zarr", shape=a.shape, chunks=(4, 3, 3), shards=(12, 3, 3),
                            dtype=a.dtype)
    arr[...] = a
    opts = pipeline.options({"max-tasks": 100}).replace(progress=False)
    report = pipeline.run(str(tmp_path / "s.zarr"), tmp_path / "o.zarr", op="inv", client=client,
                          progress=False, config=opts)
    check_output(str(tmp_path / "o.zarr"), "inv", a, chunk=12)
    assert report.tasks == 4 and report.ok == 45


def test_matrices_larger_than_the_budget(client, tmp_path):
    """n = 300 complex128 with a budget below one matrix: one matrix per batch, a warning, and every
    output as ``kernels`` computes it (the CPU backend; the GPU's large-n path is
    tests/kernels/test_gpu_large_n.py)."""
    from batchlu.pipeline.errors import BatchluWarning

    source = pipeline.generate(tmp_path / "a.zarr", count=5, size=300, chunk=5, dtype="complex128",
                               kind="random", seed=31)
    a = np.asarray(zarr.open_array(source, mode="r")[...])
    with pytest.warns(BatchluWarning, match=r"memory-budget 1 MiB is smaller than one matrix .*5\.49 MiB"):
        report = pipeline.run(source, tmp_path / "o.zarr", op="inv", client=client, progress=False,
                              config={"memory-budget": "1MiB"})
    assert report.status == "complete" and report.tasks == 5 and report.processed == 5
    got = check_output(str(tmp_path / "o.zarr"), "inv", a, chunk=1)
    assert (got["info"] == 0).all()
    assert pipeline.verify(source, tmp_path / "o.zarr").ok


def test_run_backend_overrides_the_config_and_none_keeps_it(monkeypatch):
    """``backend=None`` keeps ``batchlu.backend``; any name, ``auto`` included, wins over it."""
    from batchlu.pipeline.client import _run
    from batchlu.pipeline.errors import ConfigError

    seen, real = [], _run.make_options
    monkeypatch.setattr(_run, "make_options", lambda config, **kw: seen.append(real(config, **kw)) or seen[-1])
    for backend in (None, "auto", "gpu"):
        with pytest.raises(ConfigError, match="no-such-op"):
            pipeline.run("in.zarr", "out.zarr", op="no-such-op", backend=backend, config={"backend": "cpu"})
    assert [opts.backend for opts in seen] == ["cpu", "auto", "gpu"]


@pytest.mark.parametrize("op", ["lu", "slogdet"])
def test_default_output_codec_leaves_floats_uncompressed_and_zstds_integers(client, stores, tmp_path, op):
    """``output-codec: auto`` (the default): floating-point results (mantissas of noise) are written
    uncompressed, info, pivots and the like with zstd; crc32c on all; recorded as ``auto``, so that a
    resume makes a lost array again as it was made. An output that recorded no codec is zstd's."""
    out = tmp_path / "o.zarr"
    report = pipeline.run(stores["a"], out, op=op, client=client, progress=False)
    assert report.status == "complete"
    group = zarr.open_group(str(out), mode="r")
    made = {spec.name: [type(c).__name__ for c in group[spec.name].compressors]
            for spec in OP_TABLE[op].outputs(6, np.float64)}
    for name, codecs in made.items():
        floating = np.dtype(group[name].dtype).kind in "fc"
        assert codecs == (["Crc32cCodec"] if floating else ["ZstdCodec", "Crc32cCodec"]), (name, codecs)
    assert any(np.dtype(group[name].dtype).kind in "fc" for name in made)
    assert any(np.dtype(group[name].dtype).kind not in "fc" for name in made)
    assert _group.read_provenance(str(out))["settings"]["output_codec"] == "auto"
    assert _group.created_with({"settings": {}})[0] == "zstd"   # a batchlu from before the setting


IN_PROCESS_RUN = """
import sys, batchlu
report = batchlu.run(sys.argv[1], sys.argv[2], op="inv", progress=False, config={"chunk": 9})
print(report.status, report.backends, report.per_worker, "distributed" in sys.modules)
"""


def test_a_default_cpu_run_of_threads_runs_without_distributed(stores, tmp_path):
    """The embedded cluster of threads (the CPU's default up to 1 GiB, no dashboard, no report) is a
    thread pool of the calling process: distributed is never imported (0.4 s of a 1.7 s run), and the
    output is the bits that distributed's cluster of threads writes."""
    import subprocess
    import sys

    pooled = subprocess.run([sys.executable, "-c", IN_PROCESS_RUN, stores["a"], str(tmp_path / "pool.zarr")],
                            capture_output=True, text=True, timeout=300)
    assert pooled.returncode == 0, pooled.stderr
    assert pooled.stdout.split() == ["complete", "('cpu',)", "{'local':", "53}", "False"], pooled.stdout
    # the same run on distributed's cluster of threads (a dashboard asks for it)
    report = pipeline.run(stores["a"], tmp_path / "cluster.zarr", op="inv", progress=False,
                          config={"chunk": 9, "cluster": {"dashboard-address": "127.0.0.1:0"}})
    assert report.status == "complete" and all(w.startswith("tcp://") for w in report.per_worker)
    a = np.asarray(zarr.open_array(stores["a"], mode="r")[...])
    check_output(str(tmp_path / "pool.zarr"), "inv", a, chunk=9)
    pool, cluster = outputs_of(str(tmp_path / "pool.zarr")), outputs_of(str(tmp_path / "cluster.zarr"))
    for name in ("inv", "info"):
        assert pool[name].tobytes() == cluster[name].tobytes(), name


def test_an_error_in_an_in_process_task_stops_the_run_and_names_the_log(tmp_path, capfd):
    """A task's error raised on purpose (here: missing input chunks) ends the in-process run in that
    error, with the log file named where the task logged. The other tasks stop at their next write
    before the run returns: none of them logs to the terminal after it, none is left running."""
    import threading

    source = tmp_path / "in.zarr"
    rng = np.random.default_rng(20261206)
    array = zarr.create_array(str(source), shape=(400, 6, 6), chunks=(4, 6, 6), dtype="float64")
    array[...] = rng.standard_normal((400, 6, 6))
    for chunk in (3, 40, 41, 90):
        (source / "c" / str(chunk) / "0" / "0").unlink()
    log = tmp_path / "run.log"
    capfd.readouterr()
    with pytest.raises(BatchluError) as caught:
        pipeline.run(str(source), tmp_path / "out.zarr", op="inv", progress=False,
                     config={"cluster": {"log-file": str(log), "threads-per-worker": 8}, "max-tasks": 100})
    message = str(caught.value)
    assert "missing" in message and f"(Worker log: {log})" in message and "\n" not in message, message
    assert "Traceback" in log.read_text()   # the task's traceback went to the log, not the terminal
    time.sleep(0.5)
    assert capfd.readouterr().err == ""
    assert not [t.name for t in threading.enumerate() if t.name.startswith("batchlu-task")]
    record = zarr.open_group(str(tmp_path / "out.zarr"), mode="r").attrs["batchlu"]
    assert record["status"] == "failed"


@pytest.mark.parametrize("workers, threads", [(None, None), (3, None), (4, 2), (None, 5)])
def test_the_in_process_pool_has_the_threads_of_distributeds_cluster_of_threads(workers, threads):
    from distributed import LocalCluster

    from batchlu.pipeline.client._submit import pool_threads

    kwargs = {k: v for k, v in (("n_workers", workers), ("threads_per_worker", threads)) if v is not None}
    with LocalCluster(processes=False, dashboard_address=None, **kwargs) as cluster:
        want = sum(worker.state.nthreads for worker in cluster.workers.values())
    assert pool_threads(workers, threads) == want


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit], ids=["ctrl-c", "sigterm"])
def test_a_stop_after_the_tasks_is_recorded_and_the_lock_given_back(tmp_path, monkeypatch, stop):
    """A Ctrl-C or SIGTERM (SystemExit) in the checks after the tasks, before the run is recorded
    complete: the output said ``running`` with no error. It says failed, naming the stop, and a resume
    completes it."""
    source = pipeline.generate(str(tmp_path / "a.zarr"), count=64, size=5, chunk=16,
                               seed=int(np.random.default_rng().integers(1 << 30)))
    out = tmp_path / "o.zarr"
    real = _fingerprint.check_same_files

    def stopped(*args):
        raise stop(130) if stop is SystemExit else stop()

    monkeypatch.setattr(_fingerprint, "check_same_files", stopped)
    with pytest.raises(stop):
        pipeline.run(source, str(out), op="inv", backend="cpu", progress=False)
    record = _group.read_provenance(str(out))
    assert record["status"] == "failed" and record["error"].startswith(stop.__name__), record
    assert not (tmp_path / "o.zarr.lock").exists()
    monkeypatch.setattr(_fingerprint, "check_same_files", real)
    again = pipeline.run(source, str(out), op="inv", backend="cpu", progress=False, resume=True)
    assert again.status == "complete" and again.skipped == 64
