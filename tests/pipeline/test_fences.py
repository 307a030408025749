"""Fences (issue 38, item 6): the lock guards clients, not tasks. A client killed on an external
cluster leaves its running tasks behind; each task checks that the output's lock still names its run
before it writes a batch's outputs and again before it records them complete, and stops with a
one-line :class:`FencedError` once another run took the output."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import pickle
import textwrap
import threading
import time

import numpy as np
import pytest
import zarr
from _pipeline_helpers import outputs_of, recording, require_nvcomp, sigkill, start_script, wait_for_chunks

from batchlu import kernels, pipeline
from batchlu.pipeline import _ops, _plan, errors
from batchlu.pipeline.client import _submit
from batchlu.pipeline.worker import _io_pool
from batchlu.pipeline.output import _group, _lock
from batchlu.pipeline.worker import _tasks
from batchlu.pipeline.worker._batches import BatchIO, run_batches
from batchlu.pipeline.worker._engines import HostEngine
from batchlu.pipeline.store._arrays import parse_ref
from batchlu.testing.matrices import generate

FILL, INT_FILL = 2.0 ** 100, -7777   # no kernel result equals them: an element never written shows
FOREIGN = {"host": "node-elsewhere-7", "pid": 4242, "started": "2020-01-02T03:04:05+00:00",
           "token": "f" * 32, "boot_id": None, "pid_start": None}


def _take_over(lock_file) -> None:
    """Another run takes the output: its record replaces the lock file, atomically, as a new lock
    would (another host's, so that no run here takes it over as stale)."""
    tmp = f"{lock_file}.tmp"
    with open(tmp, "w") as f:
        json.dump(FOREIGN, f)
    os.replace(tmp, lock_file)


def _fenced_message(lock_file, token, got) -> str:
    return (rf"^Expected the lock {lock_file} to name this run \(token {token}\)\. Got {got} instead: "
            rf"another run took the output; this task stops without writing\.$")


# --------------------------------------------------------------------------------------- the fence
def test_fence_passes_while_the_lock_names_the_run_and_stops_once_it_does_not(tmp_path):
    out = str(tmp_path / "o.zarr")
    lock = _lock.OutputLock(out).acquire()
    fence = lock.fence()
    assert (fence.path, fence.token) == (out + ".lock", lock.owner.token)
    assert pickle.loads(pickle.dumps(fence)) == fence   # it travels to the workers in the Job
    fence.check()
    _take_over(lock.path)
    with pytest.raises(errors.FencedError, match=_fenced_message(
            lock.path, lock.owner.token, "the token f{32} of PID 4242 on host node-elsewhere-7, started "
                                         r"2020-01-02T03:04:05\+00:00 \(\d+ h \d+ min ago\)")):
        fence.check()
    os.remove(lock.path)   # released, or deleted by hand
    with pytest.raises(errors.FencedError, match=_fenced_message(lock.path, lock.owner.token, "no lock file")):
        fence.check()
    with open(lock.path, "w") as f:
        f.write('{"token": "' + lock.owner.token + '"')   # a record cut short: not this run's
    with pytest.raises(errors.FencedError, match=_fenced_message(lock.path, lock.owner.token,
                                                                 "unreadable content")):
        fence.check()
    assert issubclass(errors.FencedError, errors.OutputLockedError)
    assert isinstance(pickle.loads(pickle.dumps(errors.FencedError("x"))), errors.FencedError)


def test_a_lock_not_held_has_no_fence(tmp_path):
    lock = _lock.OutputLock(str(tmp_path / "o.zarr"))
    with pytest.raises(RuntimeError, match="held by this run"):
        lock.fence()


# ------------------------------------------------------------------------------------ the batch loop
def _loop_io(tmp_path, taken_at, pool):
    """Matrices 0:24 in 6 batches of 4 through :func:`run_batches`, outputs poisoned; the output's
    lock is taken by another run while batch ``taken_at`` is being written (after its check, before
    its record). Returns the outputs, the records and the input."""
    count, n, chunk = 24, 5, 4
    a = generate("random", n, "float64", seed=61, start=0, stop=count)
    src = zarr.create_array(str(tmp_path / "a.zarr"), shape=a.shape, dtype=a.dtype, chunks=(chunk, n, n))
    src[...] = a
    group = zarr.open_group(str(tmp_path / "o.zarr"), mode="w")
    outs = {"inv": group.create_array("inv", shape=a.shape, dtype="float64", chunks=(chunk, n, n),
                                      fill_value=FILL),
            "info": group.create_array("info", shape=(count,), dtype="int32", chunks=(chunk,),
                                       fill_value=INT_FILL)}
    where = {"a": (str(tmp_path / "a.zarr"), ""), **{k: (str(tmp_path / "o.zarr"), k) for k in outs}}
    lock = _lock.OutputLock(str(tmp_path / "o.zarr")).acquire()
    fence, checks, marks = lock.fence(), [], []

    def check():   # the writer checks before batch i's write (check 2 i + 1) and its record (2 i + 2)
        fence.check()
        checks.append(1)
        if len(checks) == 2 * taken_at + 1:   # batch taken_at's write passed its check: take over now
            _take_over(lock.path)

    io = BatchIO(src, None, outs, pool=pool, where=where if pool is not None else None)
    with pytest.raises(errors.FencedError, match="another run took the output"):
        run_batches(HostEngine(), "inv", io, [(s, s + chunk) for s in range(0, count, chunk)],
                    record=recording(marks, check))
    return outs, marks, a


@pytest.mark.parametrize("through", ["zarr here", "I/O processes"])
def test_batch_loop_checks_before_each_write_and_each_record(tmp_path, through):
    if through == "I/O processes" and not _io_pool.supported():
        pytest.skip("I/O processes need Linux")
    pool = _io_pool.get_pool(2, 2) if through == "I/O processes" else None
    outs, marks, a = _loop_io(tmp_path, 2, pool)
    # batches 0 and 1 written and recorded; batch 2 written (its check passed) but not recorded;
    # nothing after it written at all
    assert marks == [(0, 4), (4, 8)]
    inv, info = outs["inv"][...], outs["info"][...]
    assert (inv[12:] == FILL).all() and (info[12:] == INT_FILL).all()
    want, want_info = kernels.inv(a[:12])
    assert (want_info == 0).all()   # fresh random matrices: every one inverted
    assert inv[:12].tobytes() == want.tobytes() and (info[:12] == want_info).all()


@pytest.mark.gpu
def test_device_batch_loop_checks_before_each_write_and_each_record(tmp_path):
    """The GPU codec path's loop: a group's files start only after a passed check, and a group is
    recorded (one group behind the writes) only after another."""
    pytest.importorskip("cupy")
    from batchlu.pipeline.worker import _engines
    from batchlu.pipeline.output import _group
    from batchlu.pipeline.codecs import _choice
    from batchlu.pipeline.worker import _device_batches
    from batchlu.testing.ratios import THRESHOLD, get03

    require_nvcomp()
    count, n, chunk = 24, 5, 4
    a = generate("random", n, "float64", seed=65, start=0, stop=count)
    src = zarr.create_array(str(tmp_path / "a.zarr"), shape=a.shape, dtype=a.dtype, chunks=(chunk, n, n))
    src[...] = a
    group = zarr.open_group(str(tmp_path / "o.zarr"), mode="w")
    zstd = _group.compressors("zstd")   # batchlu's default output codec, which the GPU encodes
    outs = {"inv": group.create_array("inv", shape=a.shape, dtype="float64", chunks=(chunk, n, n),
                                      fill_value=FILL, compressors=zstd),
            "info": group.create_array("info", shape=(count,), dtype="int32", chunks=(chunk,),
                                       fill_value=INT_FILL, compressors=zstd)}
    stored = {"a": _choice.choose(src, "gpu", gpu=True, nvcomp=None, reading=True).stored}
    for name, array in outs.items():
        choice = _choice.choose(array, "gpu", gpu=True, nvcomp=None)
        stored[name] = choice.stored if choice.device == "gpu" else None
    assert stored["a"] is not None and stored["inv"] is not None   # the GPU decodes and encodes
    lock = _lock.OutputLock(str(tmp_path / "o.zarr")).acquire()
    fence, checks, marks = lock.fence(), [], []

    def check():   # one group per batch: write 0, write 1, record 0, write 2, record 1, ...
        fence.check()
        checks.append(1)
        if len(checks) == 4:   # group 2's write passed its check: take over now
            _take_over(lock.path)

    io = BatchIO(src, None, outs)
    dio = _device_batches.DeviceIO(io, stored, chunk)   # group_bytes 0: a group per batch
    with pytest.raises(errors.FencedError, match="another run took the output"):
        _device_batches.run_device_batches(_engines.CudaEngine(0, threads=2), "inv", dio,
                                           [(s, s + chunk) for s in range(0, count, chunk)],
                                           record=recording(marks, check))
    # group 0 recorded; groups 1 and 2 written (their checks passed) but not recorded; nothing later written
    assert marks == [(0, 4)]
    inv, info = outs["inv"][...], outs["info"][...]
    assert (inv[12:] == FILL).all() and (info[12:] == INT_FILL).all()
    assert (info[:12] == 0).all() and get03(a[:12], inv[:12]).max() < THRESHOLD


# ----------------------------------------------------------------------------------------- the task
def test_fenced_task_returns_the_error_writes_nothing_and_logs_one_line(tmp_path, caplog):
    count, n, chunk = 16, 5, 4
    a = generate("random", n, "float64", seed=62, start=0, stop=count)
    zarr.create_array(str(tmp_path / "a.zarr"), shape=a.shape, dtype=a.dtype, chunks=(chunk, n, n))[...] = a
    out = str(tmp_path / "o.zarr")
    specs = _ops.output_specs("inv", n, np.float64)
    plan = _plan.make_plan(count, 4096, memory_budget=1 << 20, max_tasks=1, input_chunk=chunk, chunk=chunk)
    settings = pipeline.Options(io_processes=0)
    _group.create(out, {"status": "running"}, specs, plan, settings.output_codec, settings.output_layout)
    lock = _lock.OutputLock(out).acquire()
    job = _tasks.Job(op="inv", input=parse_ref(str(tmp_path / "a.zarr")), rhs=None, output=out,
                     outputs=tuple(s.name for s in specs), plan=plan, backend="cpu", settings=settings,
                     fence=lock.fence())
    stored = {name: sorted(os.listdir(os.path.join(out, name))) for name in ("inv", "info", "_complete")}
    _take_over(lock.path)
    with caplog.at_level(logging.WARNING, logger="batchlu.tasks"):
        result = _tasks.process_range(job, 0, plan.n_chunks)
    assert isinstance(result.error, errors.FencedError) and result.matrices == 0
    assert {name: sorted(os.listdir(os.path.join(out, name))) for name in stored} == stored
    assert not zarr.open_array(out, path="_complete", mode="r")[...].any()
    lines = [r for r in caplog.records if r.name == "batchlu.tasks"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING and lines[0].exc_info is None
    assert "stopped: Expected the lock" in lines[0].getMessage()


# ------------------------------------------------------------------------------------- whole runs
ORPHANING = textwrap.dedent("""
    import sys
    from distributed import Client
    from batchlu import pipeline

    if __name__ == "__main__":
        with Client(sys.argv[3]) as client:   # an external cluster: the tasks outlive this process
            pipeline.run(sys.argv[1], sys.argv[2], op="inv", client=client, progress=False,
                         config={"chunk": 4, "max-tasks": 2})
""")


def _hold_after_first_record(monkeypatch, source, gate: threading.Event) -> None:
    """Tasks of the run that reads ``source`` (on a cluster in this process) wait after recording
    their first batch until ``gate`` is set: still running, in the middle of their chunks. The
    test-only widening of the window in which a killed client's tasks go on."""
    real, seen, held = _tasks.TaskIO.mark, set(), str(pathlib.Path(source).resolve())

    def mark(self, c0, c1, digests):
        real(self, c0, c1, digests)
        if self.job.input.path == held and id(self) not in seen:
            seen.add(id(self))
            assert gate.wait(60), "the test never let the held tasks go on"

    monkeypatch.setattr(_tasks.TaskIO, "mark", mark)


def test_orphaned_tasks_of_a_killed_client_do_not_touch_the_next_run(client, tmp_path, caplog, monkeypatch):
    """The reported case: after SIGKILL of the client, its running tasks went on writing chunks and
    records on the external cluster, over the output of a second run that had said complete."""
    from distributed import LocalCluster

    old = pipeline.generate(tmp_path / "old.zarr", count=40, size=6, chunk=8, kind="random", seed=63)
    new = pipeline.generate(tmp_path / "new.zarr", count=40, size=6, chunk=8, kind="random", seed=64)
    out, clean = tmp_path / "o.zarr", tmp_path / "clean.zarr"
    gate = threading.Event()
    _hold_after_first_record(monkeypatch, old, gate)
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, protocol="tcp", host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as external, \
            caplog.at_level(logging.WARNING, logger="batchlu.tasks"):
        worker = next(iter(external.workers.values()))
        try:
            first = start_script(tmp_path, ORPHANING, old, out, external.scheduler_address)
            try:
                wait_for_chunks(first, out, 2)   # 2 tasks of 5 chunks, each held after its first
                sigkill(first)
            finally:
                if first.poll() is None:
                    first.kill()
                    first.wait()
            assert worker.state.executing_count == 2   # the orphans, still running
            with pytest.warns(errors.BatchluWarning, match=f"stale lock .* PID {first.pid}"):
                report = pipeline.run(new, out, op="inv", overwrite=True, client=client, progress=False,
                                      config={"chunk": 4})
        finally:
            gate.set()   # the orphans go on with their next batches
        assert report.status == "complete" and report.processed == 40
        deadline = time.monotonic() + 60
        while worker.state.executing_count and time.monotonic() < deadline:   # the orphans end
            time.sleep(0.05)
        assert worker.state.executing_count == 0
    # every chunk (and its record of the input CRC-32) is the second run's: bit-identical to a fresh run
    pipeline.run(new, clean, op="inv", client=client, progress=False, config={"chunk": 4})
    got, want = outputs_of(str(out)), outputs_of(str(clean))
    assert sorted(got) == sorted(want) == ["_complete", "_input_xxh3", "info", "inv"]
    assert {k: v.tobytes() for k, v in got.items()} == {k: v.tobytes() for k, v in want.items()}
    assert pipeline.verify(new, out).ok
    assert zarr.open_group(str(out), mode="r").attrs["batchlu"]["status"] == "complete"
    assert not os.path.exists(str(out) + ".lock")
    fenced = [r.getMessage() for r in caplog.records if r.name == "batchlu.tasks"]
    assert len(fenced) == 2 and all("stopped: Expected the lock" in m for m in fenced), fenced   # both orphans


def test_run_whose_lock_is_taken_stops_and_leaves_the_output_to_the_new_owner(client, stores, tmp_path,
                                                                               monkeypatch):
    """A client still alive whose lock another run took: its tasks stop at their next write, it
    raises the one-line error and writes no status into the output it no longer owns."""
    out = tmp_path / "o.zarr"
    lock_file = str(out) + ".lock"
    real, marked, box = _tasks.TaskIO.mark, [], {}
    mutex = threading.Lock()

    def mark_then_lose_the_lock(self, c0, c1, digests):   # in the worker's threads
        real(self, c0, c1, digests)
        with mutex:
            marked.append(c0)
            if len(marked) == 2:   # another run takes the output after the second record
                _take_over(lock_file)
                box["record"] = (out / "zarr.json").read_bytes()

    monkeypatch.setattr(_tasks.TaskIO, "mark", mark_then_lose_the_lock)
    with pytest.raises(errors.FencedError, match="another run took the output"):
        pipeline.run(stores["a"], out, op="inv", client=client, progress=False, config={"chunk": 4})
    assert (out / "zarr.json").read_bytes() == box["record"]   # no "failed" over the new owner's output
    assert json.loads(open(lock_file).read()) == FOREIGN     # its lock left alone
    flags = zarr.open_array(str(out), path="_complete", mode="r")[...]
    # the 2 records, and at most one more per worker thread whose check had passed just before
    assert 2 <= flags.sum() <= 2 + sum(client.nthreads().values()) < flags.size
    os.remove(lock_file)


def test_run_records_no_status_once_its_lock_is_taken(client, stores, tmp_path, monkeypatch):
    """The client's own last writes are fenced too: a lock taken after the tasks ended (before the
    record says complete) leaves the record as it was."""
    out = tmp_path / "o.zarr"
    lock_file = str(out) + ".lock"
    real, box = _submit.submit, {}

    def submit_then_lose_the_lock(*args, **kwargs):
        real(*args, **kwargs)
        _take_over(lock_file)
        box["record"] = (out / "zarr.json").read_bytes()

    monkeypatch.setattr(_submit, "submit", submit_then_lose_the_lock)
    with pytest.raises(errors.FencedError, match="another run took the output"):
        pipeline.run(stores["a"], out, op="inv", client=client, progress=False)
    assert (out / "zarr.json").read_bytes() == box["record"]
    assert _group.read_provenance(str(out))["status"] == "running"
    assert json.loads(open(lock_file).read()) == FOREIGN
    os.remove(lock_file)
