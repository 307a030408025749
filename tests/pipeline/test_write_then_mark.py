"""Complete only after written: inside a task, a chunk is recorded complete only after every output
array's write of that chunk has returned, for every op and every engine.

The order is checked in one log per task, not by timing. The task runs here, in this process, as a
worker runs it (:func:`batchlu.pipeline.worker._tasks.process_range`), through a :class:`TaskIO` that logs:

* ``("write", name, start, stop)`` when the write of output ``name``'s matrices ``[start, stop)``
  returned: the Zarr array's ``__setitem__`` in the worker process, or the I/O process's answer (the
  request's future resolved) when the I/O processes write;
* ``("mark", c0, c1)`` when chunks ``[c0, c1)`` are recorded complete; at that moment the chunks'
  outputs are also read back from the store, as a resumed run would find them.

Engines: the CPU engine with I/O in the worker and through I/O processes, and the CUDA engine with
and without I/O processes (``gpu``).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import zarr

from batchlu.pipeline.codecs import _host
from batchlu.pipeline.output import _group, _ledger
from batchlu.pipeline.worker import _tasks
from batchlu.pipeline.config._settings import Options
from batchlu.pipeline._ops import DENSE_OPS as OPS, output_specs
from batchlu.pipeline._plan import Plan
from batchlu.pipeline.store._arrays import ArrayRef
from batchlu.testing.matrices import generate, rhs as make_rhs

COUNT, N, CHUNK = 37, 5, 4            # 10 chunks, the last one of a single matrix
PLAN = Plan(count=COUNT, chunk=CHUNK, batch=2 * CHUNK, chunks_per_task=6)  # batches of 2 chunks
TASKS = [(0, 6), (6, 10)]

ENGINES = [
    pytest.param("cpu", 0, id="cpu"),
    pytest.param("cpu", 2, id="cpu-io-processes"),
    pytest.param("gpu", 0, id="gpu", marks=pytest.mark.gpu),
    pytest.param("gpu", 2, id="gpu-io-processes", marks=pytest.mark.gpu),
]


class _LoggedArray:
    """An output array whose writes are logged once they returned."""

    def __init__(self, array, name: str, log: list):
        self._array, self._name, self._log = array, name, log

    shape = property(lambda self: self._array.shape)
    dtype = property(lambda self: self._array.dtype)

    def __getitem__(self, key):
        return self._array[key]

    def __getattr__(self, name):   # the rest (store, metadata, fill value) as the array's
        return getattr(self._array, name)

    def __setitem__(self, key, value):
        assert isinstance(key, slice) and key.step is None, key
        self._array[key] = value
        self._log.append(("write", self._name, key.start, key.stop))


class _LoggedFuture:
    """An I/O process's answer to a write: logged when the task has seen it succeed."""

    def __init__(self, future, event: tuple, log: list):
        self._future, self._event, self._log = future, event, log

    def result(self, timeout=None):
        value = self._future.result(timeout)
        self._log.append(self._event)
        return value

    def __getattr__(self, name):
        return getattr(self._future, name)


class _LoggedPool:
    def __init__(self, pool, log: list):
        self._pool, self._log = pool, log

    def write(self, store, array, start, stop, value):
        return _LoggedFuture(self._pool.write(store, array, start, stop, value),
                             ("write", array, int(start), int(stop)), self._log)

    def __getattr__(self, name):
        return getattr(self._pool, name)


def _unwritten(job: _tasks.Job, c0: int, c1: int) -> list[str]:
    """Chunks of ``[c0, c1)`` whose outputs, read back from the store now, still hold the fill value
    (the inputs are random matrices: no computed element equals a fill)."""
    found = []
    for name in job.outputs:
        array = zarr.open_array(store=job.output, path=name, mode="r")
        for c in range(c0, c1):
            start, stop = job.plan.chunk_range(c, c + 1)
            values = np.asarray(array[start:stop])
            fill = array.fill_value
            unset = np.isnan(values) if values.dtype.kind in "fc" else values == fill
            if values.size == 0 or unset.any():
                found.append(f"{name}[{start}:{stop}] (chunk {c})")
    return found


@pytest.fixture
def recorded(monkeypatch):
    """Every task's log: run tasks through ``_tasks.process_range`` and read ``recorded`` afterwards."""
    tasks: list = []

    class RecordingTaskIO(_tasks.TaskIO):
        def __init__(self, job):
            super().__init__(job)
            self.log: list[tuple] = []
            self.unwritten: list[str] = []
            self.out = {name: _LoggedArray(array, name, self.log) for name, array in self.out.items()}
            tasks.append(self)

        def mark(self, c0: int, c1: int, *digests) -> None:
            self.unwritten += _unwritten(self.job, c0, c1)
            self.log.append(("mark", c0, c1))
            super().mark(c0, c1, *digests)

    real_pool_for = _tasks.io_pool_for

    def pool_for(job, engine):
        pool = real_pool_for(job, engine)
        return None if pool is None else _LoggedPool(pool, tasks[-1].log)  # the TaskIO made just before

    real_host_write = _host.write

    def host_write(stored, start, stop, values, fill):   # a CPU task's raw outputs, written as chunk files
        done = real_host_write(stored, start, stop, values, fill)
        if done:
            tasks[-1].log.append(("write", os.path.basename(stored.root), int(start), int(stop)))
        return done

    monkeypatch.setattr(_tasks, "TaskIO", RecordingTaskIO)
    monkeypatch.setattr(_host, "write", host_write)
    monkeypatch.setattr(_tasks, "io_pool_for", pool_for)
    return tasks


def _order_problems(io, plan: Plan, c0: int, c1: int) -> list[str]:
    """Every chunk recorded once, in order, each after every output's write covering it."""
    written: dict[str, list[tuple[int, int]]] = {name: [] for name in io.job.outputs}
    problems, marked = [], []
    for event in io.log:
        if event[0] == "write":
            written[event[1]].append(event[2:])
            continue
        for c in range(event[1], event[2]):
            start, stop = plan.chunk_range(c, c + 1)
            for name, ranges in written.items():
                if not any(s <= start and stop <= e for s, e in ranges):
                    problems.append(f"chunk {c} recorded before {name}[{start}:{stop}] was written")
            marked.append(c)
    if marked != list(range(c0, c1)):
        problems.append(f"chunks recorded {marked}, expected each of {c0}..{c1 - 1} once, in order")
    problems += [f"{name} never written" for name, ranges in written.items() if not ranges]
    return problems


@pytest.mark.parametrize("backend, io_processes", ENGINES)
@pytest.mark.parametrize("op", OPS)
def test_every_chunk_recorded_only_after_all_its_outputs_are_written(tmp_path, recorded, op, backend,
                                                                     io_processes):
    dtype = "float64"
    a = generate("random", N, dtype, seed=41, start=0, stop=COUNT)
    source = zarr.create_array(str(tmp_path / "a.zarr"), shape=a.shape, dtype=dtype, chunks=(3, N, N))
    source[...] = a
    rhs, k = None, None
    if op == "solve":
        k = 2
        b = make_rhs(N, k, dtype, seed=42, start=0, stop=COUNT)
        zarr.create_array(str(tmp_path / "b.zarr"), shape=b.shape, dtype=dtype, chunks=(5, N, k))[...] = b
        rhs = ArrayRef(str(tmp_path / "b.zarr"))
    out = str(tmp_path / "out.zarr")
    specs = output_specs(op, N, dtype, dtype if rhs else None, k)
    settings = Options(io_processes=io_processes, io_threads=2 if io_processes else None)
    _group.create(out, {"settings": {}}, specs, PLAN, settings.output_codec, settings.output_layout)
    job = _tasks.Job(op=op, input=ArrayRef(str(tmp_path / "a.zarr")), rhs=rhs, output=out,
                     outputs=tuple(s.name for s in specs), plan=PLAN, backend=backend, settings=settings)

    for c0, c1 in TASKS:
        result = _tasks.process_range(job, c0, c1)
        io = recorded[-1]
        assert result.matrices == PLAN.chunk_range(c0, c1)[1] - PLAN.chunk_range(c0, c1)[0]
        problems = _order_problems(io, PLAN, c0, c1)
        assert not problems, "\n".join(problems + [f"log: {io.log}"])
        assert not io.unwritten, f"recorded complete while not in the store: {io.unwritten}"
    assert len(recorded) == len(TASKS)
    ledger = _ledger.read(out)
    assert ledger.size == PLAN.n_chunks and ledger.all()
    assert not _unwritten(job, 0, PLAN.n_chunks)
