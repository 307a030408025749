"""What runs on a worker: one task = a run of whole output chunks, processed batch by batch as
read (and checksum the input read) → compute → write every output → record the chunks complete."""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from . import _backends, _fingerprint, _ledger
from ._io_pool import open_array
from ._ops import info_counts
from ._plan import Plan
from ._store import ArrayRef, read_range


@dataclasses.dataclass(frozen=True)
class Job:
    """Everything a task needs, small and picklable; the same object goes to every task."""

    op: str
    input: ArrayRef
    rhs: ArrayRef | None
    output: str
    outputs: tuple[str, ...]
    plan: Plan
    backend: str = "auto"
    task_delay: float = 0.0
    io_processes: int | None = None   # I/O processes per worker (batchlu.io-processes); None: auto
    io_threads: int | None = None     # threads per I/O process (batchlu.io-threads); None: auto


@dataclasses.dataclass
class TaskResult:
    """What a task reports back; the client sums these into the run's report."""

    c0: int
    c1: int
    matrices: int = 0
    ok: int = 0
    singular: int = 0
    nonfinite: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    worker: str = ""
    backend: str = ""

    def count_info(self, info: np.ndarray) -> None:
        ok, singular, nonfinite = info_counts(info)
        self.matrices += int(np.size(info))
        self.ok += ok
        self.singular += singular
        self.nonfinite += nonfinite


class TaskIO:
    """The task's Zarr arrays (opened once per worker process, see
    :func:`batchlu.pipeline._io_pool.open_array`): read a batch, write a batch, record chunks."""

    def __init__(self, job: Job):
        self.job = job
        self.input = open_array(job.input.path, job.input.array, "r")
        self.rhs = open_array(job.rhs.path, job.rhs.array, "r") if job.rhs is not None else None
        # write_empty: a chunk whose values all equal the fill value (the NaN inverses of a chunk of
        # singular matrices) is stored too, so that resume can check every complete chunk is there
        self.out = {name: open_array(job.output, name, "r+", write_empty=True) for name in job.outputs}

    def read(self, start: int, stop: int):
        a = read_range(self.job.input, self.input, start, stop)
        b = read_range(self.job.rhs, self.rhs, start, stop) if self.rhs is not None else None
        return a, b

    def write(self, start: int, stop: int, results: dict) -> int:
        written = 0
        for name, array in self.out.items():
            value = np.asarray(results[name])
            array[start:stop] = value
            written += value.nbytes
        return written

    def mark(self, c0: int, c1: int, digests) -> None:
        """Record chunks ``[c0, c1)`` complete with the CRC-32 of their inputs, ``digests`` (as
        :func:`batchlu.pipeline._ledger.mark`, on the cached arrays)."""
        open_array(self.job.output, _ledger.DIGESTS, "r+")[c0:c1] = digests
        open_array(self.job.output, _ledger.NAME, "r+")[c0:c1] = True


def _worker_address() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except Exception:
        return "local"


def run_batches(job: Job, c0: int, c1: int, compute) -> TaskResult:
    """The plain per-task loop; ``compute(op, a, b) -> {name: numpy array}`` does the math."""
    started = time.perf_counter()
    result = TaskResult(c0, c1, worker=_worker_address())
    io = TaskIO(job)
    per = job.plan.batch // job.plan.chunk
    for b0 in range(c0, c1, per):
        b1 = min(b0 + per, c1)
        start, stop = job.plan.chunk_range(b0, b1)
        if job.task_delay:
            time.sleep(job.task_delay)
        a, b = io.read(start, stop)
        digests = _fingerprint.chunk_digests(job.plan.chunk, start, stop, a, b)
        results = compute(job.op, a, b)
        result.bytes_in += a.nbytes + (b.nbytes if b is not None else 0)
        result.bytes_out += io.write(start, stop, results)
        io.mark(b0, b1, digests)
        result.count_info(results["info"])
    result.seconds = time.perf_counter() - started
    return result


def process_range(job: Job, c0: int, c1: int) -> TaskResult:
    """Task body: output chunks ``[c0, c1)`` of ``job``, on the backend chosen here, on the worker."""
    backend = _backends.resolve(job.backend)
    custom = getattr(backend, "process_range", None)
    result = custom(job, c0, c1) if custom is not None else run_batches(job, c0, c1, backend.compute)
    result.backend = backend.name
    return result
