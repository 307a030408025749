"""What runs on a worker: one task = a run of whole output chunks, processed batch by batch as
read (and checksum the input read) → compute → write every output → record the chunks complete,
through the batch loop (:mod:`batchlu.pipeline.worker._loop`) on the stages of the task's path (the host's,
:mod:`batchlu.pipeline.worker._batches`, or the GPU codecs', :mod:`batchlu.pipeline.worker._device_batches`) with the
engine of the task's backend (:mod:`batchlu.pipeline.worker._backends`). The task records live here:
:class:`Job` (what to do) and :class:`TaskResult` (what it reports back); the task's arrays are a
:class:`batchlu.pipeline.worker._task_io.TaskIO`.

Before a batch is read, the chunks it needs are looked up in the input's store
(:mod:`batchlu.pipeline.store._missing`): a missing one stops the task with a
:class:`batchlu.pipeline.errors.MissingChunkError`, or (``batchlu.missing-chunks: fill``) its
matrices get ``info`` -3. An error raised on purpose (:class:`BatchluError`: a missing or corrupt
chunk), or an object store's failure (obstore's error, as one
:class:`batchlu.pipeline.errors.ObjectStoreError` line naming the request and the store's answer),
comes back to the client inside the :class:`TaskResult`, which raises it there: the task does not
fail on the worker, so the worker logs its traceback to the run's log only.

Every write of a batch's outputs and every record of its chunks is fenced with the run's lock token
(:class:`batchlu.pipeline.output._lock.Fence`, in the :class:`Job`): a task whose run no longer holds the
output's lock (its client was killed on an external cluster, another run took the output) stops
with a :class:`batchlu.pipeline.errors.FencedError` before it writes anything more; with no client
left to report to, the worker logs one line and goes on.
"""

from __future__ import annotations

import dataclasses
import logging
import sys

from . import _backends, _engines, _io_pool
from ..codecs import _host
from ._batches import BatchIO, input_bytes, run_batches, sub_batches
from ..config._settings import Options
from ._loop import Record
from .._ops import InfoTally, get_op
from .._plan import Plan
from ..store._arrays import ArrayRef
from ..store._object_store import store_error
from ._task_io import TaskIO
from ..errors import BatchluError, FencedError

logger = logging.getLogger("batchlu.tasks")


@dataclasses.dataclass(frozen=True)
class Job:
    """Everything a task needs, small and picklable; the same object goes to every task."""

    op: str
    input: ArrayRef
    rhs: ArrayRef | None
    output: str
    outputs: tuple[str, ...]
    plan: Plan
    backend: str = "auto"             # cpu or gpu, resolved in the client (auto: each worker its own)
    settings: Options = dataclasses.field(default_factory=Options)   # the run's, whole
    task_delay: float = 0.0           # batchlu-testing.task-delay: tests that interrupt a run only
    codecs: dict | None = None        # GPU runs: array ("a", "b", outputs) -> pipeline._codecs.Choice
    symbolic: object = None           # sparse ops: the pattern's batchlu.kernels.sparse.Plan
    fence: object = None              # the run's pipeline._lock.Fence (None: tasks write unfenced)

    def locations(self) -> list[str]:
        """The stores the job reads and writes: the input's, the right-hand side's, the output."""
        return [self.input.path, self.output] + ([self.rhs.path] if self.rhs is not None else [])

    def compute_op(self):
        """What the batch loop computes with: the op's name, or for a sparse op the op bound to its
        pattern's analysis and the run's settings."""
        if self.symbolic is None:
            return self.op
        return get_op(self.op).bind(self.symbolic, self.settings)


@dataclasses.dataclass
class TaskResult(InfoTally):
    """What a task reports back; the client sums these into the run's report."""

    c0: int
    c1: int
    matrices: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    read_s: float = 0.0       # the batch loop's stage times (pipeline._batches.PathStats)
    compute_s: float = 0.0
    write_s: float = 0.0
    worker: str = ""
    backend: str = ""
    error: BaseException | None = None   # an error raised on purpose in the task: the client raises it


def _worker_address() -> str:
    if "distributed" not in sys.modules:   # a task of the in-process pool: no worker, no import
        return "local"
    try:
        from distributed import get_worker

        return get_worker().address
    except Exception:
        return "local"


def io_pool_for(job: Job, engine):
    """The worker's :class:`batchlu.pipeline.worker._io_pool.IOPool` for ``job``, or None for I/O in this
    process (:func:`batchlu.pipeline.worker._io_pool.pool_settings`)."""
    processes, threads = _io_pool.pool_settings(job.settings, engine.name, _worker_threads(), job.locations())
    if processes == 0:
        return None
    return _io_pool.get_pool(processes, threads).using(job.settings.io_engine)


def _worker_threads() -> int:
    """The task threads of this worker: distributed's count, or outside a worker (the in-process
    pool) the cores this process may use, as the pool's default (dask's count: affinity, cgroups)."""
    if "distributed" in sys.modules:
        try:
            from distributed import get_worker

            return int(get_worker().state.nthreads)
        except Exception:
            pass
    from dask.system import cpu_count

    return max(1, int(cpu_count()))


def _host_frames(job: Job, engine, pool, io: TaskIO) -> dict:
    """The arrays whose chunk files a CPU task reads and writes itself (:mod:`batchlu.pipeline.codecs._host`):
    on the CPU, with no I/O processes, where ``batchlu.io-engine`` is ``auto`` (a named engine is
    zarr's pipeline of that name, as asked)."""
    if engine.name != "cpu" or pool is not None or job.settings.io_engine != "auto":
        return {}
    inputs = {"a": io.input, **({} if io.rhs is None else {"b": io.rhs})}
    return _host.arrays(inputs, io.out)


def _run_task(engine, job: Job, c0: int, c1: int) -> TaskResult:
    """Chunks ``[c0, c1)`` of ``job`` through the batch loop, on ``engine``."""
    _io_pool.tune_malloc()  # once per worker process: Zarr's chunk buffers reuse heap pages
    io = TaskIO(job)
    plan = job.plan
    ranges = [plan.chunk_range(b0, b1) for b0, b1 in sub_batches(plan, c0, c1)]
    where = {"a": (job.input.path, job.input.array), **{name: (job.output, name) for name in io.out}}
    if job.rhs is not None:
        where["b"] = (job.rhs.path, job.rhs.array)
    pool = io_pool_for(job, engine)
    batch_io = BatchIO(io.input, io.rhs, io.out, pool=pool, where=where, lookup=io.missing,
                       digest_chunk=plan.chunk, frames=_host_frames(job, engine, pool, io))
    record = Record(ledger=io, fence=job.fence, chunk=plan.chunk)
    stored = {name: c.stored for name, c in (job.codecs or {}).items() if c.device == "gpu"}
    if engine.name == "gpu" and stored:
        from ._device_batches import DeviceIO, run_device_batches, slot_rows

        group_bytes = job.settings.device_batch_bytes
        dio = DeviceIO(batch_io, stored, plan.chunk, group_bytes=group_bytes,
                       routed=frozenset(name for name, c in job.codecs.items() if c.route),
                       slot_rows=slot_rows(plan, group_bytes, input_bytes(io.input, io.rhs)))
        stats = run_device_batches(engine, job.compute_op(), dio, ranges, record=record, delay=job.task_delay)
    else:
        with _engines.computing(engine, input_bytes(io.input, io.rhs) * plan.count):
            stats = run_batches(engine, job.compute_op(), batch_io, ranges, record=record, delay=job.task_delay)
    address = _worker_address()
    return TaskResult(c0, c1, matrices=stats.matrices, **stats.counts._asdict(), bytes_in=stats.bytes_in,
                      bytes_out=stats.bytes_out, seconds=stats.wall_s, read_s=stats.read_s,
                      compute_s=stats.compute_s, write_s=stats.write_s,
                      worker=address if engine.name == "cpu" else f"{address} {engine.describe()}")


def process_range(job: Job, c0: int, c1: int) -> TaskResult:
    """Task body: output chunks ``[c0, c1)`` of ``job``, on the backend chosen here, on the worker."""
    engine = _backends.resolve(job.backend)
    try:
        result = _run_task(engine, job, c0, c1)
    except FencedError as exc:    # another run's output now: one line (the client may be gone)
        logger.warning("chunks %d:%d of %s stopped: %s", c0, c1, job.output, exc)
        result = TaskResult(c0, c1, worker=_worker_address(), error=exc)
    except Exception as exc:   # the client raises it (see the module docstring); the log keeps the rest
        error = exc if isinstance(exc, BatchluError) else store_error(exc)
        if error is None:
            raise
        logger.error("chunks %d:%d of %s failed", c0, c1, job.output, exc_info=True)
        result = TaskResult(c0, c1, worker=_worker_address(), error=error)
    result.backend = engine.name
    return result
