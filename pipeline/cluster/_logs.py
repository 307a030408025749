"""Where the embedded cluster's logs go: a file, not the terminal of ``batchlu run``.

A task that fails makes its worker log a traceback ("Compute Failed", ...); the run then ends in one
error line that names this file. :func:`log_file` picks the file (``batchlu.cluster.log-file``, or a
new one per run in the temporary folder); :func:`redirect` moves the loggers of one process there: the
client's (the nannies live in it) around the embedded cluster, and each worker's through the
:class:`batchlu.pipeline.cluster._worker_log.WorkerLog` plugin. The file is created at the first message only.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable

__all__ = ["log_file", "redirect"]

# distributed configures these three with a handler on stderr; batchlu's own loggers propagate to
# the root logger, whose last-resort handler also prints to stderr, as asyncio's do (a comm closed
# under a run that stops: "Future exception was never retrieved"). Loggers below them that print on
# their own go too (:func:`_loggers`).
_LOGGERS = ("distributed", "tornado", "bokeh", "batchlu", "asyncio")
_FORMAT = "%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"


def _user() -> str:
    try:
        return str(os.getuid())
    except AttributeError:  # Windows
        import getpass

        return getpass.getuser()


def log_file(configured: str | None) -> str:
    """The log file of one run: ``configured`` (its folder must exist), or
    ``<tmp>/batchlu-logs-<user>/run-<time>-<pid>.log`` (the folder is created, private)."""
    if configured:
        return os.path.abspath(os.path.expanduser(configured))
    folder = os.path.join(tempfile.gettempdir(), f"batchlu-logs-{_user()}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return os.path.join(folder, f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log")


def _to_terminal(handler: logging.Handler) -> bool:
    return (type(handler) is logging.StreamHandler
            and getattr(handler, "stream", None) in (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__))


def _loggers() -> list[str]:
    """:data:`_LOGGERS` and the loggers below them that print without them: a handler of their own,
    or propagation off. distributed's logging config gives ``distributed.client``, ``distributed.gc``
    and ``tornado.application`` a stderr handler each: a stopped run printed a tornado traceback
    (distributed's ``sync`` cancelling a call it had not made yet) under its one line."""
    below = sorted(name for name, logger in list(logging.root.manager.loggerDict.items())
                   if isinstance(logger, logging.Logger) and name not in _LOGGERS
                   and name.split(".")[0] in _LOGGERS and (logger.handlers or not logger.propagate))
    return [*_LOGGERS, *below]


def redirect(path: str) -> Callable[[], None]:
    """Send this process's distributed and batchlu logs to ``path`` instead of stderr/stdout.

    Returns the function that undoes it. Calling it again for the same ``path`` while it is in
    force changes nothing (an in-process worker shares the client's loggers).
    """
    undo = []
    handler = None
    for name in _loggers():
        logger = logging.getLogger(name)
        if any(getattr(h, "batchlu_log", None) == path for h in logger.handlers):
            continue
        if handler is None:
            handler = logging.FileHandler(path, delay=True)
            handler.setFormatter(logging.Formatter(_FORMAT))
            handler.setLevel(logging.WARNING)
            handler.batchlu_log = path
        removed = [h for h in logger.handlers if _to_terminal(h)]
        for h in removed:
            logger.removeHandler(h)
        logger.addHandler(handler)
        propagate = logger.propagate
        logger.propagate = False
        undo.append((logger, removed, propagate))

    def restore() -> None:
        for logger, removed, propagate in undo:
            logger.removeHandler(handler)
            for h in removed:
                logger.addHandler(h)
            logger.propagate = propagate
        if handler is not None:
            handler.close()

    return restore
