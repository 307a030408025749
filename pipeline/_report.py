"""What a run reports: counts, throughput and where the work went, with a readable repr."""

from __future__ import annotations

import dataclasses

from ._ops import InfoCounts


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
    elapsed: float = 0.0       # seconds from submitting the tasks to the last result
    submitted: bool = False    # tasks were handed to the cluster (internal: decides cleanup on failure)
    startup: float = 0.0       # seconds to connect (or start the embedded cluster) and set it up
    bytes_in: int = 0          # bytes read by this run's tasks
    bytes_out: int = 0         # bytes written by this run's tasks
    tasks: int = 0
    backend: str = "auto"      # as requested
    backends: tuple[str, ...] = ()   # as resolved on the workers
    per_worker: dict[str, int] = dataclasses.field(default_factory=dict)  # matrices per worker
    status: str = "complete"
    dashboard: str | None = None
    codecs: dict[str, str] = dataclasses.field(default_factory=dict)  # GPU runs: array -> where its codec ran, why

    @property
    def counts(self) -> InfoCounts:
        """The ``info`` counts, one per category (ok, singular, non-finite input, ...)."""
        return InfoCounts(*(getattr(self, name) for name in InfoCounts._fields))

    @counts.setter
    def counts(self, value: InfoCounts) -> None:
        for name, number in zip(InfoCounts._fields, value):
            setattr(self, name, int(number))

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
        return {**dataclasses.asdict(self), "matrices_per_s": self.matrices_per_s,
                "gb_in_per_s": self.gb_in_per_s, "gb_out_per_s": self.gb_out_per_s}

    def __repr__(self) -> str:
        lines = [
            f"batchlu {self.op}: {self.status}, {self.count:,} matrices -> {self.output}",
            f"  {self.counts.describe()}",
            f"  computed {self.processed:,} in {self.elapsed:.2f} s ({self.matrices_per_s:,.0f} "
            f"matrices/s, {self.gb_in_per_s:.3f} GB/s in, {self.gb_out_per_s:.3f} GB/s out), "
            f"{self.tasks:,} tasks",
        ]
        if self.startup >= 0.05:
            lines.append(f"  cluster start and setup {self.startup:.2f} s"
                         + (f", dashboard {self.dashboard}" if self.dashboard else ""))
        if self.skipped:
            lines.append(f"  skipped {self.skipped:,} already complete (resume)")
        lines.append(f"  backend {self.backend} -> {', '.join(self.backends) or '-'}")
        for name, where in self.codecs.items():
            lines.append(f"  codec of {'the input' if name == 'a' else 'the right-hand side' if name == 'b' else name}: {where}")
        if len(self.per_worker) > 1:
            share = ", ".join(f"{w} {s:.0%}" for w, s in self.worker_share.items())
            lines.append(f"  per worker: {share}")
        return "\n".join(lines)

    __str__ = __repr__
