"""A plain text progress bar on stderr, updated as tasks finish (at most a few times a second)."""

from __future__ import annotations

import sys
import time


class ProgressBar:
    def __init__(self, total: int, *, enabled: bool = True, label: str = "batchlu", stream=None,
                 width: int = 30, interval: float = 0.2):
        self.total, self.done = total, 0
        self.enabled = enabled and total > 0
        self.label, self.width, self.interval = label, width, interval
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.perf_counter()
        self._last = 0.0
        self._drawn = -1

    def update(self, matrices: int) -> None:
        self.done += matrices
        now = time.perf_counter()
        if self.enabled and (now - self._last >= self.interval or self.done >= self.total):
            self._last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        frac = min(1.0, self.done / self.total)
        filled = int(round(frac * self.width))
        rate = self.done / max(now - self.started, 1e-9)
        self.stream.write(f"\r{self.label} [{'#' * filled}{' ' * (self.width - filled)}] "
                          f"{frac:4.0%} {self.done:,}/{self.total:,} matrices, {rate:,.0f}/s")
        self.stream.flush()
        self._drawn = self.done

    def close(self) -> None:
        if self.enabled:
            if self._drawn != self.done:
                self._draw(time.perf_counter())
            self.stream.write("\n")
            self.stream.flush()
