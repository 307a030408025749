"""What a run reports: counts, throughput and where the work and the time went, with a readable repr.

The time of a run, in parts that add up to its whole (:attr:`Report.total`):

* ``imports``: from the process's start to the run's call, where the command line measured it (the
  interpreter, batchlu's and its libraries' imports, the command line's parsing); 0 in the API;
* ``plan``: the checks before the tasks: the inputs opened and checked, the output's lock, resume
  checks and fingerprint, the plan, the output created or reopened;
* ``cluster_start``: connecting to the cluster, or starting the embedded one;
* ``warmup``: asking the workers which backend they run and setting them up for the run: the op's
  kernels compiled or loaded from their disk caches (numba's on the CPU, CuPy's on the GPU), and on
  the GPU the device, allocator, pinned buffers and I/O processes (:mod:`batchlu.pipeline.client._warmup`);
  ``warmup_steps`` names its parts, each the slowest worker's (the rest of ``warmup`` is asking the
  workers for their backend and their codecs);
* ``elapsed``: the compute, from handing the tasks to the cluster to the last result. The rates
  (matrices/s, GB/s) are over this part only, so that a short job's rate is not its start-up's;
* ``finish``: the rest until the run returns: closing the cluster, the checks after the tasks
  (every chunk recorded, the input's files unchanged) and the output's record; ``finish_steps``
  names those parts (``cluster close``: the embedded cluster's workers and scheduler, or the
  client's connection; ``checks``; ``record``).

``wall`` is the run's own time, from its call to its return (every part but ``imports``).

``read_s``, ``compute_s`` and ``write_s`` are the tasks' stage times summed over the tasks (the
stages overlap, within a task and across the worker threads): they say which stage the tasks
spent their time in, not how long the run took.
"""

from __future__ import annotations

import dataclasses

from .._ops import InfoCounts


@dataclasses.dataclass
class Report:
    output: str
    op: str
    count: int                 # N, matrices in the input
    processed: int = 0         # matrices computed by this run
    skipped: int = 0           # matrices already complete (resume)
    ok: int = 0                # info == 0, over the whole output
    singular: int = 0          # info > 0
    nonfinite: int = 0         # info == -1: the input holds NaN or Inf
    nonfinite_result: int = 0  # info == -2: finite input, non-finite result (overflow)
    missing: int = 0           # info == -3: input chunk missing (batchlu.missing-chunks: fill)
    refinement: int = 0        # info == -4: sparse solves whose refinement fell short of its tolerance
    elapsed: float = 0.0       # compute: seconds from submitting the tasks to the last result
    submitted: bool = False    # tasks were handed to the cluster (internal: decides cleanup on failure)
    cluster_start: float = 0.0  # seconds to connect, or to start the embedded cluster
    warmup: float = 0.0        # seconds to resolve the backend and set up the workers (GPU: compile)
    warmup_steps: dict[str, float] = dataclasses.field(default_factory=dict)  # its parts on the slowest worker
    wall: float = 0.0          # seconds of the whole run, from the call to its return
    plan: float = 0.0          # seconds of the checks, the plan and the output's creation, before the cluster
    finish: float = 0.0        # seconds after the last result: the cluster closed, the checks, the record
    finish_steps: dict[str, float] = dataclasses.field(default_factory=dict)  # its parts, by name
    imports: float = 0.0       # seconds from the process's start to the call (set by the command line)
    read_s: float = 0.0        # the tasks' read, compute and write stages, summed over the tasks
    compute_s: float = 0.0
    write_s: float = 0.0
    bytes_in: int = 0          # bytes read by this run's tasks
    bytes_out: int = 0         # bytes written by this run's tasks
    tasks: int = 0
    backend: str = "auto"      # as requested
    backends: tuple[str, ...] = ()   # as resolved on the workers
    backend_note: str | None = None  # why auto took the CPU on a machine with GPUs
    per_worker: dict[str, int] = dataclasses.field(default_factory=dict)  # matrices per worker
    status: str = "complete"
    dashboard: str | None = None   # a cluster that outlives the run (a scheduler or client given); not the embedded one
    codecs: dict[str, str] = dataclasses.field(default_factory=dict)  # GPU runs: array -> where its codec ran, why

    @property
    def counts(self) -> InfoCounts:
        """The ``info`` counts, one per category (ok, singular, non-finite input, ...)."""
        return InfoCounts(*(getattr(self, name) for name in InfoCounts._fields))

    @counts.setter
    def counts(self, value: InfoCounts) -> None:
        for name, number in zip(InfoCounts._fields, value):
            setattr(self, name, int(number))

    def add(self, result) -> None:
        """Add what a task reports (a :class:`batchlu.pipeline.worker._tasks.TaskResult`): its matrices,
        ``info`` counts, bytes, stage times and worker."""
        self.processed += result.matrices
        self.counts = self.counts.plus(result.counts)
        self.bytes_in += result.bytes_in
        self.bytes_out += result.bytes_out
        self.read_s += result.read_s
        self.compute_s += result.compute_s
        self.write_s += result.write_s
        self.per_worker[result.worker] = self.per_worker.get(result.worker, 0) + result.matrices

    @property
    def total(self) -> float:
        """Seconds from the process's start (the command line) or the call (the API) to the return:
        the sum of the parts."""
        return self.imports + self.wall

    def end(self, wall: float) -> None:
        """The run returns (or fails) ``wall`` s after its call: ``finish`` is what no other part took."""
        self.wall = wall
        self.finish = max(0.0, wall - self.plan - self.cluster_start - self.warmup - self.elapsed)

    @property
    def matrices_per_s(self) -> float:
        return self.processed / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def gb_in_per_s(self) -> float:
        return self.bytes_in / 1e9 / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def gb_out_per_s(self) -> float:
        return self.bytes_out / 1e9 / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def worker_share(self) -> dict[str, float]:
        total = sum(self.per_worker.values())
        return {w: m / total for w, m in sorted(self.per_worker.items())} if total else {}

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "total": self.total, "matrices_per_s": self.matrices_per_s,
                "gb_in_per_s": self.gb_in_per_s, "gb_out_per_s": self.gb_out_per_s}

    def __repr__(self) -> str:
        lines = [
            f"batchlu {self.op}: {self.status}, {self.count:,} matrices -> {self.output}",
            f"  {self.counts.describe()}",
            f"  computed {self.processed:,} in {self.elapsed:.2f} s ({self.matrices_per_s:,.0f} "
            f"matrices/s, {self.gb_in_per_s:.3f} GB/s in, {self.gb_out_per_s:.3f} GB/s out), "
            f"{self.tasks:,} tasks",
        ]
        lines.append("  time: " + (f"import {self.imports:.2f} s, " if self.imports else "")
                     + f"plan {self.plan:.2f} s, cluster start {self.cluster_start:.2f} s, warm-up {self.warmup:.2f} s"
                     + (" (" + ", ".join(f"{name} {s:.2f}" for name, s in self.warmup_steps.items()) + ")"
                        if self.warmup_steps else "") + ", "
                     f"compute {self.elapsed:.2f} s, finish {self.finish:.2f} s"
                     + (" (" + ", ".join(f"{name} {s:.2f}" for name, s in self.finish_steps.items()) + ")"
                        if self.finish_steps else "") + f", total {self.total:.2f} s"
                     + (f"; dashboard {self.dashboard}" if self.dashboard else ""))
        if self.processed:
            lines.append(f"  task stages, summed over the tasks: read {self.read_s:.2f} s, "
                         f"compute {self.compute_s:.2f} s, write {self.write_s:.2f} s")
        if self.skipped:
            lines.append(f"  skipped {self.skipped:,} already complete (resume)")
        lines.append(f"  backend {self.backend} -> {', '.join(self.backends) or '-'}"
                     + (f" ({self.backend_note})" if self.backend_note else ""))
        for name, where in self.codecs.items():
            lines.append(f"  codec of {'the input' if name == 'a' else 'the right-hand side' if name == 'b' else name}: {where}")
        if len(self.per_worker) > 1:
            share = ", ".join(f"{w} {s:.0%}" for w, s in self.worker_share.items())
            lines.append(f"  per worker: {share}")
        return "\n".join(lines)

    __str__ = __repr__
