"""The batch loop: a task's units flow read -> compute -> write -> record, the stages overlapping.

    reader thread   unit i+1: read (and decode, and checksum) its inputs
    this thread     unit i: compute
    writer thread   unit i-1: (encode and) write its outputs, then record complete every unit whose
                    writes are done (each only while the output's lock still names the run)

:func:`run_loop` is the one schedule. A path is a set of four stages, each an object with one job that
holds what it needs (:class:`Stages`): the host path's stages (:mod:`batchlu.pipeline.worker._batches`: a
unit is one batch in a pair of host slots) and the GPU codec path's (:mod:`batchlu.pipeline.worker._device_batches`:
a unit is a group of batches whose values stay on the device) run on it alike. A :class:`Unit` carries
its batch's values and facts from stage to stage, so no stage calls back into the task.

Two units' buffers are in use at once (double-buffering): unit i computes into the buffers that unit
i-2 wrote from, so the loop waits for that write first. A path may bound how many written units are
still unrecorded (:attr:`Stages.unrecorded`: the GPU path's files of one group are written while the
next encodes) and how many units may be written-but-unfinished when the next read starts
(:attr:`Stages.read_ahead`: the GPU path keeps at most two groups on the device).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np

from .. import _ops

__all__ = ["PathStats", "Record", "Stages", "Unit", "run_loop"]


@dataclasses.dataclass
class PathStats(_ops.InfoTally):
    matrices: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    pieces: int = 0          # kernel launches (batch pieces) run
    oom_splits: int = 0      # pieces halved after an out-of-memory error
    read_s: float = 0.0
    compute_s: float = 0.0
    write_s: float = 0.0
    wall_s: float = 0.0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Unit:
    """One pass of the loop: matrices ``[start, stop)``, made of the task's batches ``batches``
    (one on the host path, a group on the GPU path), and what the stages found and made for it."""

    index: int
    batches: list[tuple[int, int]]
    inputs: tuple = (None, None)     # read: the input and right-hand side (slot views or device arrays)
    gaps: np.ndarray | None = None   # read: matrices in missing chunks (``missing-chunks: fill``), or None
    digests: np.ndarray | None = None   # read: the digest of each output chunk's input (None: not taken)
    bytes_in: int = 0                # read
    outputs: dict | None = None      # compute: each output's values
    info: np.ndarray | None = None   # compute: the info codes on the host, to count
    writes: list = dataclasses.field(default_factory=list)   # write: the writes still in flight (futures)

    @property
    def start(self) -> int:
        return self.batches[0][0]

    @property
    def stop(self) -> int:
        return self.batches[-1][1]


class Record:
    """The record stage: once a unit's writes are done, record its chunks complete in the output's
    ledger with the digests of their inputs, only while the output's lock names the run.

    ``ledger`` has ``mark(c0, c1, digests)`` for output chunks ``[c0, c1)`` of ``chunk`` matrices
    (:class:`batchlu.pipeline.worker._task_io.TaskIO`; None: nothing is recorded); ``fence`` has ``check()``,
    which raises :class:`batchlu.pipeline.errors.FencedError` once another run took the output
    (:class:`batchlu.pipeline.output._lock.Fence`; None: unfenced)."""

    def __init__(self, ledger=None, fence=None, chunk: int = 1):
        self.ledger = ledger
        self.fence = fence
        self.chunk = chunk

    def check(self) -> None:
        """The fence: called before a unit's first write and before its record."""
        if self.fence is not None:
            self.fence.check()

    def __call__(self, unit: Unit) -> None:
        for future in unit.writes:
            future.result()
        if self.ledger is not None:
            self.check()
            self.ledger.mark(unit.start // self.chunk, -(-unit.stop // self.chunk), unit.digests)


@dataclasses.dataclass
class Stages:
    """One path's stages: ``read(unit)`` fills ``unit.inputs`` (and its gaps, digests, bytes),
    ``compute(unit)`` its outputs and info, ``write(unit)`` starts writing its outputs (after
    ``record.check()``) and leaves the writes in flight in ``unit.writes``, ``record(unit)`` waits for
    them and records the unit complete."""

    read: object
    compute: object
    write: object
    record: Record
    unrecorded: int = 0            # written units whose record waits for the next unit's write
    read_ahead: int | None = None  # written units that may be unfinished when the next read starts


def run_loop(stages: Stages, batches: list[list[tuple[int, int]]], stats: PathStats, delay: float = 0.0) -> None:
    """Run ``stages`` over the units made of ``batches`` (each unit a list of consecutive batches):
    the one batch schedule (see the module docstring). ``delay`` sleeps before each compute
    (``batchlu-testing.task-delay``: tests that interrupt a run only). On an error, the reads and
    writes in flight finish and nothing more is recorded; the error is raised."""
    units = [Unit(i, list(group)) for i, group in enumerate(batches)]
    lock = threading.Lock()
    recording: deque = deque()   # written units not yet recorded, in order (the writer thread's)

    def read(unit: Unit) -> None:
        t = time.perf_counter()
        stages.read(unit)
        with lock:
            stats.read_s += time.perf_counter() - t
            stats.bytes_in += unit.bytes_in

    def write(unit: Unit) -> None:
        t = time.perf_counter()
        stages.write(unit)
        recording.append(unit)
        record(stages.unrecorded)
        with lock:
            stats.write_s += time.perf_counter() - t
            stats.bytes_out += sum(v.nbytes for v in unit.outputs.values())
        unit.outputs = None

    def record(keep: int) -> None:
        while len(recording) > keep:
            stages.record(recording.popleft())

    written: deque = deque()   # (index, future of its write)
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="batchlu-read") as reader, \
                ThreadPoolExecutor(1, thread_name_prefix="batchlu-write") as writer:
            pending = reader.submit(read, units[0])
            try:
                for i, unit in enumerate(units):
                    pending.result()
                    if i + 1 < len(units):
                        if stages.read_ahead is not None:
                            _settle(written, i - 1 - stages.read_ahead)
                        pending = reader.submit(read, units[i + 1])
                    _settle(written, i - 2)   # unit i's buffers were last written from by unit i - 2
                    if delay:
                        time.sleep(delay)
                    t = time.perf_counter()
                    stages.compute(unit)
                    unit.inputs = (None, None)
                    if unit.info is not None:
                        stats.add_info(unit.info)
                    stats.compute_s += time.perf_counter() - t
                    stats.matrices += unit.stop - unit.start
                    written.append((i, writer.submit(write, unit)))
                _settle(written, len(units))
                t = time.perf_counter()
                writer.submit(record, 0).result()
                stats.write_s += time.perf_counter() - t
            finally:   # on an error: what was submitted and not started is dropped
                pending.cancel()
                for _, future in written:
                    future.cancel()
    finally:
        # the executors closed: the read and write in flight finished; the files they started
        # finish too before the error goes on (what is written is recorded only if its record ran)
        for unit in recording:
            wait(unit.writes)


def _settle(written: deque, last: int) -> None:
    """Wait for the writes of units up to index ``last``."""
    while written and written[0][0] <= last:
        written.popleft()[1].result()
