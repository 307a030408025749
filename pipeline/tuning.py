"""The tuning surface of batchlu's pipeline: hooks for benchmarks and experiments (``benchmarks/``);
everyday code uses :func:`batchlu.run` and the ``batchlu.*`` settings. The same role as
:mod:`batchlu.kernels.tuning` for the kernels. Nothing here touches CUDA.

Engines -- what a backend computes, per worker process:

* :class:`HostEngine`, the ``cpu`` backend's engine. Its ``run(op, slot)`` computes ``op`` on the
  batch in ``slot``: the matrices in ``slot.a`` (and the right-hand sides in ``slot.b``), every
  output written in place into the arrays of ``slot.outs`` (output name -> array, ``info``
  included). Subclass it and override ``run`` to change the compute, e.g. a copy of the input to
  time the Zarr I/O and bookkeeping alone (``benchmarks/bench_pipeline.py --host-noop``).
* :func:`register_engine` makes a factory the engine of a backend in the calling process: run it
  on every worker (``client.run``) before the run; it returns the factory it replaced.

I/O processes: :func:`io_settings` gives the ``(processes, threads)`` of a worker's I/O pool for the
``batchlu.io-processes`` / ``batchlu.io-threads`` settings (None: ``auto``); :class:`IOPool`,
:func:`shared_buffer`, :func:`read_into`, :func:`open_array`, :func:`tune_malloc` and :func:`supported`
are the pool and its buffers themselves (``benchmarks/bench_host_codecs.py`` times them against
zarr's own codec pipelines, which :data:`FUSED_PIPELINE` names and :func:`codec_pipeline` tells
apart; :func:`chunk_key` names a chunk's file).

The CPU's chunk files (:mod:`batchlu.pipeline.codecs._host`): :func:`frame_layouts` says which arrays a
CPU task reads and writes itself, :func:`frames_read` and :func:`frames_write` are its read and
write (``benchmarks/bench_host_frames.py`` times them against zarr's pipeline).

Integrity checks (``benchmarks/bench_resume_checks.py`` times them):

* :func:`without_input_checksums`: inside it, tasks running in this process (an in-process cluster,
  ``LocalCluster(processes=False)``) record their chunks complete without the CRC-32 of their
  input, i.e. the run as it was before the checks. An output written so cannot be resumed.
* :class:`ResumeChecks`: the checks a resume makes before it trusts an output's ledger, one at a
  time. :data:`FRESH_SECONDS`: input files written more recently than this when a run starts are
  always read again on resume (their times could not show a later write).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import numpy as np
import zarr

from ._ops import output_specs
from ._plan import Plan
from .config._settings import options
from .errors import ResumeError
from .output import _fingerprint, _group, _ledger
from .output._fingerprint import FRESH_SECONDS
from .codecs._host import arrays as frame_layouts, read as frames_read, write as frames_write
from .store._arrays import ArrayRef
from .store._zarr import FUSED_PIPELINE, chunk_key, codec_pipeline
from .worker import _backends
from .worker import _tasks
from .worker._engines import HostEngine
from .worker._io_pool import IOPool, io_settings, open_array, read_into, supported, tune_malloc
from .worker._shared_memory import shared_buffer

__all__ = ["FRESH_SECONDS", "FUSED_PIPELINE", "HostEngine", "IOPool", "ResumeChecks", "chunk_key", "codec_pipeline",
           "frame_layouts", "frames_read", "frames_write", "io_settings", "open_array", "read_into", "register_engine", "shared_buffer", "supported", "tune_malloc",
           "without_input_checksums"]


def register_engine(backend: str, factory: Callable[[], object]) -> Callable[[], object] | None:
    """Make ``factory()`` the engine of ``backend`` (``cpu`` or ``gpu``) in this process; returns the
    factory it replaces. Tasks look their engine up when they start: run this on every worker."""
    return _backends.register(backend, factory)


@contextlib.contextmanager
def without_input_checksums():
    """Inside: tasks in this process mark their chunks complete without taking and storing the digests
    of the input (see :mod:`batchlu.pipeline.output._fingerprint`). For measuring what the checksums cost;
    a resume of an output written so is refused (it has no checksums to compare)."""
    def no_digests(chunk, start, stop, a, b=None, missing=None):
        return None

    def mark(self, c0, c1, digests):
        open_array(self.job.output, _ledger.NAME, "r+")[c0:c1] = True

    saved = _fingerprint.chunk_digests, _tasks.TaskIO.mark
    _fingerprint.chunk_digests, _tasks.TaskIO.mark = no_digests, mark
    try:
        yield
    finally:
        _fingerprint.chunk_digests, _tasks.TaskIO.mark = saved


class ResumeChecks:
    """The checks ``batchlu.run(..., resume=True)`` makes on an existing output before it trusts its
    ledger, one method each, for timing them. Built from the output's own record (its input,
    right-hand side, op and plan); building one reads only the output's metadata.

    * :meth:`stored`: reads the ledger and checks that each output array has the recorded shape,
      dtype and chunks and that every chunk recorded complete is stored;
    * :meth:`input`: checks that the input still holds the values the completed chunks were
      computed from, by reading every completed chunk's input again and comparing its digest.

    Each raises :class:`batchlu.pipeline.errors.ResumeError` where the resume would be refused.
    """

    def __init__(self, output: str):
        self.output = str(output)
        self.record = _group.read_provenance(self.output)
        if self.record is None or not self.record.get("plan"):
            raise ResumeError(f"Expected a batchlu output with a plan at {self.output}. Got "
                              f"{'none' if self.record is None else 'an output without a plan'} instead.")
        record = self.record
        self.input_ref = ArrayRef(record["input"]["path"], record["input"].get("array", ""))
        rhs = record.get("rhs")
        self.rhs_ref = ArrayRef(rhs["path"], rhs.get("array", "")) if rhs else None
        self.specs = output_specs(record["op"], int(record["n"]), np.dtype(record["dtype"]),
                                  np.dtype(rhs["dtype"]) if rhs else None, record.get("k"))
        self.plan = Plan(**{k: int(record["plan"][k]) for k in ("count", "chunk", "batch", "chunks_per_task")})
        self.memory_budget = options().memory_budget   # a resume reads with the current budget
        self.group = zarr.open_group(store=self.output, mode="r")
        self.complete = None

    def stored(self) -> None:
        """Read the ledger; check the output arrays and that every complete chunk is stored."""
        self.complete = _ledger.read(self.output)
        _group.check_stored(self.output, self.group, self.specs, self.plan, self.complete)

    def input(self) -> int:
        """Check the input against the completed chunks' checksums, as resume does (reading every
        completed chunk's input again); returns how many chunks' input was read."""
        if self.complete is None:
            self.complete = _ledger.read(self.output)
        was_read = _fingerprint.check_unchanged(self.output, self.record, self.plan, self.complete,
                                                self.input_ref, self.rhs_ref, self.memory_budget)
        return int(np.count_nonzero(self.complete)) if was_read else 0
