"""Live view of a run: distributed's progress widget in Jupyter, the text bar in a terminal, and the
dashboard link either way."""

from __future__ import annotations

import importlib.util
import sys

from ._progress import ProgressBar


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
