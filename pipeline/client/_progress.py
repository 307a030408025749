"""Live view of a run: distributed's progress widget in Jupyter, a plain text bar on stderr in a
terminal (updated as tasks finish, at most a few times a second), and the dashboard link either way."""

from __future__ import annotations

import importlib.util
import sys
import time

__all__ = ["ProgressBar", "in_notebook", "progress"]


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


def in_notebook() -> bool:
    """True inside a Jupyter kernel (not in plain IPython or a script)."""
    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return False
    return shell is not None and hasattr(shell, "kernel")


class _WidgetProgress:
    """``distributed.progress`` draws and updates itself; the run's loop has nothing to do."""

    def update(self, matrices: int) -> None:
        pass

    def close(self) -> None:
        pass


def progress(futures, total: int, *, enabled: bool, label: str, dashboard: str | None):
    """Start showing the run's progress; returns an object with ``update(matrices)`` and ``close()``."""
    if enabled and in_notebook() and importlib.util.find_spec("ipywidgets") is not None:
        from distributed import progress as widget
        from IPython.display import HTML, display

        if dashboard:
            display(HTML(f'{label}: dashboard <a href="{dashboard}" target="_blank">{dashboard}</a>'))
        widget(futures, notebook=True, multi=False)
        return _WidgetProgress()
    if enabled and dashboard:
        print(f"{label}: dashboard {dashboard}", file=sys.stderr, flush=True)
    return ProgressBar(total, enabled=enabled, label=label)
