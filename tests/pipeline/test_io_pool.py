"""I/O processes (batchlu.pipeline.worker._io_pool): shared buffers, the pool's requests and faults, and the data path
and whole runs through them on the CPU backend (the same code as on the GPU, less the copies)."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dask
import numpy as np
import pytest
import zarr

from batchlu import kernels
from batchlu import pipeline
from _pipeline_helpers import complete_flags as _complete, recording, wait_partly_complete
from batchlu.testing.matrices import generate, rhs as make_rhs
from batchlu.pipeline.worker import _io_pool, _shared_memory
from batchlu.pipeline.config._settings import TESTING_TASK_DELAY
from batchlu.pipeline.worker._batches import BatchIO, run_batches
from batchlu.pipeline.worker._engines import HostEngine
from batchlu.pipeline.worker._io_pool import io_settings
from batchlu.pipeline._ops import output_specs

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not _io_pool.supported(), reason="I/O processes need Linux")
POOL = (2, 2)  # one pool size for the whole module: the worker's pool is reused, not restarted


@pytest.fixture(scope="module")
def pool():
    return _io_pool.get_pool(*POOL)


def _store(path, data, chunk, **kwargs):
    arr = zarr.create_array(str(path), shape=data.shape, dtype=data.dtype, chunks=(chunk,) + data.shape[1:],
                            **kwargs)
    arr[...] = data
    return arr


def _shared(shape, dtype, fill):
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = _shared_memory.shared_buffer(nbytes)
    assert raw.nbytes >= nbytes and raw.nbytes % 4096 == 0  # whole pages
    out = raw[:nbytes].view(dtype).reshape(shape)
    out[...] = fill
    return out


# ------------------------------------------------------------------------------------ shared buffers
def test_shared_buffer_located_and_freed_with_its_last_view():
    raw = _shared_memory.shared_buffer(4096)
    view = raw[256:1280].view(np.float64).reshape(8, 16)
    name, fd, size, offset, shape, dtype = _shared_memory.locate(view)
    assert (size, offset, shape, np.dtype(dtype)) == (4096, 256, (8, 16), np.float64)
    assert _shared_memory.locate(np.empty((8, 16))) is None  # ordinary memory
    assert _shared_memory.locate(view[:, ::2]) is None        # not contiguous
    del raw
    gc.collect()
    assert _shared_memory.locate(view) is not None  # a view keeps the memory (and its record) alive
    view[...] = 3.0
    link = f"/proc/self/fd/{fd}"
    assert name in os.readlink(link)
    del view
    gc.collect()
    assert name not in _shared_memory._SEGMENTS  # forgotten: the children drop their mapping next time
    assert not os.path.lexists(link) or name not in os.readlink(link)  # its descriptor is closed


# -------------------------------------------------------------------------------------- requests
@pytest.mark.parametrize("dtype", ["float32", "complex128"])
def test_read_and_write_round_trip_bit_identical(pool, tmp_path, dtype):
    a = generate("singular-mix", 7, dtype, seed=21, start=0, stop=45)
    _store(tmp_path / "a.zarr", a, chunk=10)
    out = _shared((45, 7, 7), dtype, np.nan)
    futures = [pool.read(str(tmp_path / "a.zarr"), "", s, min(s + 10, 45), out[s:s + 10])
               for s in range(0, 45, 10)]
    [f.result(timeout=60) for f in futures]
    assert out.tobytes() == a.tobytes()
    dst = zarr.create_array(str(tmp_path / "o.zarr"), shape=a.shape, dtype=a.dtype, chunks=(10, 7, 7),
                            fill_value=0)
    futures = [pool.write(str(tmp_path / "o.zarr"), "", s, min(s + 10, 45), out[s:s + 10])
               for s in range(0, 45, 10)]
    [f.result(timeout=60) for f in futures]
    assert np.asarray(dst[...]).tobytes() == a.tobytes()


def test_errors_come_back_as_the_childs_exception(pool, tmp_path):
    a = generate("random", 4, "float64", seed=22, start=0, stop=16)
    _store(tmp_path / "a.zarr", a, chunk=4)
    (tmp_path / "a.zarr" / "c" / "2" / "0" / "0").write_bytes(b"not zstd")
    out = _shared((4, 4, 4), "float64", np.nan)
    pool.read(str(tmp_path / "a.zarr"), "", 0, 4, out).result(timeout=60)  # a good chunk reads
    with pytest.raises(RuntimeError, match="Zstd decompression error") as info:
        pool.read(str(tmp_path / "a.zarr"), "", 8, 12, out).result(timeout=60)
    assert type(info.value) is RuntimeError  # the codec's own error, not an IOProcessError (a subclass)
    with pytest.raises(FileNotFoundError):
        pool.read(str(tmp_path / "missing.zarr"), "", 0, 4, out).result(timeout=60)
    with pytest.raises(ValueError, match="Expected a buffer from batchlu.pipeline.worker._shared_memory.shared_buffer"):
        pool.read(str(tmp_path / "a.zarr"), "", 0, 4, np.empty((4, 4, 4)))


def test_a_killed_io_process_fails_its_requests_and_is_replaced(tmp_path):
    a = generate("random", 64, "float64", seed=23, start=0, stop=64)
    _store(tmp_path / "a.zarr", a, chunk=64)
    io = _io_pool.IOPool(1, 1)
    try:
        out = _shared((64, 64, 64), "float64", np.nan)
        io.read(str(tmp_path / "a.zarr"), "", 0, 64, out).result(timeout=60)
        victim = io.pids[0]
        os.kill(victim, signal.SIGSTOP)  # hold it, queue requests, then kill it with them in flight
        futures = [io.read(str(tmp_path / "a.zarr"), "", 0, 64, out) for _ in range(3)]
        os.kill(victim, signal.SIGKILL)
        for future in futures:
            with pytest.raises(_io_pool.IOProcessError, match=f"I/O process {victim}"):
                future.result(timeout=60)
        out[...] = np.nan
        io.read(str(tmp_path / "a.zarr"), "", 0, 64, out).result(timeout=60)  # a new child answers
        assert io.restarts == 1 and io.pids[0] != victim
        assert out.tobytes() == a.tobytes()
    finally:
        io.close()
    assert all(c.process.poll() is not None for c in io._children)


def test_a_broken_pipe_retires_its_process_before_its_receiver_notices(tmp_path, monkeypatch):
    """A request whose send fails (a broken pipe: the process died, but its receiver thread has not
    read the end of its replies yet) fails with IOProcessError and retires that process at once, so
    that the request sent again goes to a new one (the data path sends a failed request once more)."""
    a = generate("random", 16, "float64", seed=29, start=0, stop=8)
    _store(tmp_path / "a.zarr", a, chunk=8)
    io = _io_pool.IOPool(1, 1)
    try:
        child = io._children[0]
        victim = child.process.pid

        def broken(message):
            raise BrokenPipeError(32, "Broken pipe")

        monkeypatch.setattr(child.requests, "send", broken)
        out = _shared((8, 16, 16), "float64", np.nan)
        with pytest.raises(_io_pool.IOProcessError, match=f"I/O process {victim}"):
            io.read(str(tmp_path / "a.zarr"), "", 0, 8, out).result(timeout=60)
        assert child.process.poll() is None and not child.alive   # still running, already retired
        io.read(str(tmp_path / "a.zarr"), "", 0, 8, out).result(timeout=60)
        assert io.restarts == 1 and io.pids[0] != victim and out.tobytes() == a.tobytes()
    finally:
        io.close()


def test_data_path_resends_the_requests_of_a_killed_io_process(tmp_path):
    import threading

    count, n, chunk = 40, 16, 8
    a = generate("random", n, "float64", seed=28, start=0, stop=count)
    src = _store(tmp_path / "a.zarr", a, chunk)
    group = zarr.open_group(str(tmp_path / "o.zarr"), mode="w")
    outs = {"inv": group.create_array("inv", shape=a.shape, dtype="float64", chunks=(chunk, n, n),
                                      fill_value=np.nan),
            "info": group.create_array("info", shape=(count,), dtype="int32", chunks=(chunk,), fill_value=-7)}
    where = {"a": (str(tmp_path / "a.zarr"), ""), "inv": (str(tmp_path / "o.zarr"), "inv"),
             "info": (str(tmp_path / "o.zarr"), "info")}
    io = _io_pool.IOPool(1, 1)
    try:
        victim = io.pids[0]
        os.kill(victim, signal.SIGSTOP)
        box = {}
        thread = threading.Thread(target=lambda: box.setdefault("stats", run_batches(
            HostEngine(), "inv", BatchIO(src, None, outs, pool=io, where=where),
            [(s, s + chunk) for s in range(0, count, chunk)])))
        thread.start()
        deadline = time.monotonic() + 30
        while not io._children[0].pending and time.monotonic() < deadline:
            time.sleep(0.01)
        assert io._children[0].pending  # a read waits on the stopped process
        os.kill(victim, signal.SIGKILL)
        thread.join(60)
        assert box["stats"].matrices == count and io.restarts == 1
    finally:
        io.close()
    inv, info = kernels.inv(a)
    assert np.asarray(outs["inv"][...]).tobytes() == inv.tobytes()
    assert np.asarray(outs["info"][...]).tobytes() == info.tobytes()


def test_io_processes_exit_when_their_worker_is_killed(tmp_path):
    code = textwrap.dedent("""
        import sys, time
        from batchlu.pipeline.worker import _io_pool
        pool = _io_pool.get_pool(2, 1)
        print(*pool.pids, flush=True)
        time.sleep(600)
    """)
    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# -------------------------------------------------------------------------------------- data path
@pytest.mark.parametrize("op", ["lu", "solve"])
def test_data_path_through_io_processes_matches_in_process(pool, tmp_path, op):
    count, n, chunk, dtype = 61, 8, 9, "complex64"
    a = generate("singular-mix", n, dtype, seed=24, start=0, stop=count)
    src = _store(tmp_path / "a.zarr", a, chunk)
    rhs = b = None
    where = {"a": (str(tmp_path / "a.zarr"), "")}
    if op == "solve":
        b = make_rhs(n, 2, dtype, seed=25, start=0, stop=count)
        rhs = _store(tmp_path / "b.zarr", b, chunk)
        where["b"] = (str(tmp_path / "b.zarr"), "")
    results = {}
    for mode in ("worker", "pool"):
        group = zarr.open_group(str(tmp_path / f"{mode}.zarr"), mode="w")
        outs = {}
        for spec in output_specs(op, n, dtype, dtype if b is not None else None, 2 if b is not None else None):
            outs[spec.name] = group.create_array(spec.name, shape=(count,) + spec.tail, dtype=spec.dtype,
                                                 chunks=(chunk,) + spec.tail,
                                                 fill_value=-7 if spec.dtype.kind == "i" else np.nan)
            where[spec.name] = (str(tmp_path / f"{mode}.zarr"), spec.name)
        marks = []
        io = BatchIO(src, rhs, outs, pool=pool if mode == "pool" else None, where=dict(where))
        ranges = [(s, min(s + 2 * chunk, count)) for s in range(0, count, 2 * chunk)]
        stats = run_batches(HostEngine(), op, io, ranges, record=recording(marks))
        assert marks == ranges and stats.matrices == count
        results[mode] = {name: np.asarray(arr[...]) for name, arr in outs.items()}
    want = dict(zip(("lu", "piv", "info") if op == "lu" else ("x", "info"),
                    kernels.lu_factor(a) if op == "lu" else kernels.solve(a, b)))
    for name, value in want.items():
        for mode in ("worker", "pool"):
            got = results[mode][name]
            assert got.dtype == value.dtype and got.shape == value.shape
            assert got.tobytes() == value.tobytes(), (mode, name)


def test_corrupt_chunk_through_io_processes_names_the_file_and_marks_nothing(pool, tmp_path):
    a = generate("random", 4, "float64", seed=26, start=0, stop=16)
    src = _store(tmp_path / "a.zarr", a, 4)
    (tmp_path / "a.zarr" / "c" / "2" / "0" / "0").write_bytes(b"not zstd")
    group = zarr.open_group(str(tmp_path / "o.zarr"), mode="w")
    outs = {"inv": group.create_array("inv", shape=(16, 4, 4), dtype="float64", chunks=(4, 4, 4),
                                      fill_value=np.nan),
            "info": group.create_array("info", shape=(16,), dtype="int32", chunks=(4,), fill_value=-7)}
    where = {"a": (str(tmp_path / "a.zarr"), ""), "inv": (str(tmp_path / "o.zarr"), "inv"),
             "info": (str(tmp_path / "o.zarr"), "info")}
    marks = []
    io = BatchIO(src, None, outs, pool=pool, where=where)
    with pytest.raises(pipeline.errors.CorruptInputError,
                       match=r"unreadable chunk file .*a\.zarr/c/2/0/0 \(matrices 8:12\)"):
        run_batches(HostEngine(), "inv", io, [(s, s + 4) for s in range(0, 16, 4)], record=recording(marks))
    assert (8, 12) not in marks and (12, 16) not in marks
    assert np.isnan(outs["inv"][8:][...]).all() and (outs["info"][8:][...] == -7).all()


def test_io_settings_defaults_and_overrides():
    assert io_settings(None, None, "gpu", 16) == (8, 2)
    assert io_settings(None, None, "gpu", 2) == (1, 2)
    assert io_settings(None, None, "gpu", 1) == (1, 1)
    assert io_settings(None, None, "cpu", 16) == (0, 16)
    assert io_settings(3, None, "cpu", 16) == (3, 6)
    assert io_settings(2, 5, "gpu", 16) == (2, 5)
    assert io_settings(0, None, "gpu", 16)[0] == 0


def test_io_settings_are_checked():
    with pytest.raises(pipeline.errors.ConfigError, match="io-processes to be auto or an integer >= 0"):
        pipeline.config._settings.options({"io-processes": -1})
    with pytest.raises(pipeline.errors.ConfigError, match="io-threads to be auto or an integer >= 1"):
        pipeline.config._settings.options({"io-threads": "many"})
    opts = pipeline.config._settings.options({"io-processes": "auto", "io-threads": 3})
    assert (opts.io_processes, opts.io_threads) == (None, 3)


# ----------------------------------------------------------------------------------------- runs
def _arrays(path) -> dict[str, bytes]:
    group = zarr.open_group(str(path), mode="r")
    return {name: np.asarray(arr[...]).tobytes() for name, arr in group.arrays() if name != "_complete"}


def test_run_with_io_processes_bit_identical_and_resumes(client, stores, tmp_path):
    io = {"io-processes": POOL[0], "io-threads": POOL[1]}
    plain = pipeline.run(stores["a"], str(tmp_path / "plain.zarr"), op="inv", backend="cpu", client=client,
                         progress=False, config={"io-processes": 0})
    pooled = pipeline.run(stores["a"], str(tmp_path / "pooled.zarr"), op="inv", backend="cpu", client=client,
                          progress=False, config=io)
    assert pooled.status == "complete" and pooled.processed == plain.processed == 53
    assert (pooled.ok, pooled.singular, pooled.nonfinite) == (plain.ok, plain.singular, plain.nonfinite)
    assert _arrays(tmp_path / "pooled.zarr") == _arrays(tmp_path / "plain.zarr")
    assert _io_pool._POOL is not None and (_io_pool._POOL.processes, _io_pool._POOL.threads) == POOL
    # forget some chunks (as if the run had been killed), then resume through the I/O processes
    ledger = zarr.open_array(str(tmp_path / "pooled.zarr"), path="_complete", mode="r+")
    ledger[1:4] = False
    zarr.open_array(str(tmp_path / "pooled.zarr"), path="inv", mode="r+")[10:40] = 0.0
    pipeline.output._group.update(str(tmp_path / "pooled.zarr"), status="running")
    resumed = pipeline.run(stores["a"], str(tmp_path / "pooled.zarr"), op="inv", backend="cpu", client=client,
                           progress=False, resume=True, config=io)
    assert resumed.status == "complete" and resumed.skipped == 23 and resumed.processed == 30
    assert _arrays(tmp_path / "pooled.zarr") == _arrays(tmp_path / "plain.zarr")


def test_worker_with_io_processes_killed_mid_run(client, tmp_path):
    from distributed import Client, LocalCluster

    matrices = pipeline.generate(tmp_path / "a.zarr", count=132, size=12, chunk=6, kind="singular-mix", seed=27)
    reference = tmp_path / "reference.zarr"
    pipeline.run(matrices, str(reference), op="lu", backend="cpu", client=client, progress=False,
                 config={"io-processes": 0, "memory-budget": "16KiB"})
    config = {"memory-budget": "16KiB", "io-processes": 1, "io-threads": 1}
    out = tmp_path / "killed.zarr"
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as cl, \
            dask.config.set({TESTING_TASK_DELAY: 0.1}):  # slowed down: the kill lands mid-run
        import threading

        pids = cl.run(os.getpid)
        victim = sorted(pids.values())[0]
        box = {}
        thread = threading.Thread(target=lambda: box.setdefault("report", pipeline.run(
            matrices, str(out), op="lu", backend="cpu", client=cl, progress=False, config=config)))
        thread.start()
        wait_partly_complete(out)
        children = [int(p) for task in Path(f"/proc/{victim}/task").iterdir()
                    for p in (task / "children").read_text().split()
                    if "batchlu.pipeline.worker._io_child" in Path(f"/proc/{p}/cmdline").read_text()]
        done_at_kill = int(_complete(out).sum())
        os.kill(victim, signal.SIGKILL)
        thread.join(300)
    assert not thread.is_alive() and box["report"].status == "complete"
    assert 0 < done_at_kill < _complete(out).size  # killed mid-run
    assert _arrays(out) == _arrays(reference)
    assert children  # the victim had its I/O process, and it went with it
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(p) for p in children):
        time.sleep(0.1)
    assert not any(_alive(p) for p in children)

