"""The ``if __name__ == "__main__":`` guard a script needs around the batchlu calls that start the
embedded cluster.

multiprocessing's spawn, which distributed uses for worker processes, starts each by importing the
main script again: without the guard, every worker re-runs the script's top level, with its
``batchlu.generate`` and ``batchlu.run``. :func:`refuse_unguarded` sees that coming in the client (the
call is at the top level of a script that spawn re-runs) and refuses before any process starts;
:func:`check_not_bootstrapping` catches what it missed in the worker itself; the embedded cluster's
start failure then names the guard too (:mod:`batchlu.pipeline.cluster._connect`).
"""

from __future__ import annotations

import ast
import os
import sys

from ..errors import ClusterError

GUARD = 'if __name__ == "__main__":'
RERUN = ("the local cluster's worker processes start by importing the main script again, and "
         "rerun what it does at the top level")


def check_not_bootstrapping(what: str) -> None:
    """Refuse to run ``what`` in a worker process that is still importing the parent's main script.

    Without the ``__main__`` guard, each worker process that multiprocessing spawns re-runs the
    script's top level, and with it ``batchlu.run`` or ``batchlu.generate``: say so, instead of
    multiprocessing's "bootstrapping phase" error and distributed's "Nanny failed to start".
    """
    import multiprocessing

    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise ClusterError(f"Expected the batchlu calls of a script under `{GUARD}`. Got {what} called "
                           f"by a worker process while it imported the main script instead: {RERUN}.")


def _main_guarded(stmt: ast.stmt) -> bool:
    """Whether ``stmt`` is ``if __name__ == "__main__":`` (either way round)."""
    if not isinstance(stmt, ast.If) or not isinstance(stmt.test, ast.Compare):
        return False
    test = stmt.test
    if len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    mains = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(mains) == 1


def rerun_main_script() -> str | None:
    """The main script that spawned worker processes would run again, or None.

    Mirrors what multiprocessing's spawn does with ``__main__``: a script run by path (or a module
    run with ``-m``) is re-run; a package's ``__main__`` (``python -m batchlu``), an interactive
    session or ``-c`` is not. Other start methods do not re-run it.
    """
    import dask.config

    if str(dask.config.get("distributed.worker.multiprocessing-method", "spawn")) != "spawn":
        return None
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    if not path or not str(path).endswith(".py") or os.path.basename(path) == "ipython.py":
        return None
    if spec_name is not None and (spec_name == "__main__" or spec_name.endswith(".__main__")):
        return None
    return str(path)


def unguarded_call() -> str | None:
    """``SCRIPT:LINE`` when this call comes from the top level of the main script, outside
    ``if __name__ == "__main__":``, and spawned worker processes would re-run that line; else None."""
    path = rerun_main_script()
    if path is None:
        return None
    main = sys.modules["__main__"]
    line, frame = None, sys._getframe(1)
    while frame is not None:
        if frame.f_globals is vars(main) and frame.f_code.co_name == "<module>":
            line = frame.f_lineno
        frame = frame.f_back
    if line is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    for stmt in tree.body:
        if stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
            return None if _main_guarded(stmt) else f"{path}:{line}"
    return None


def refuse_unguarded() -> None:
    """Fail before any worker process starts when those processes would re-run the caller."""
    where = unguarded_call()
    if where is not None:
        raise ClusterError(f"Expected the batchlu calls of a script under `{GUARD}`. Got a call at "
                           f"the top level of {where} instead: {RERUN}.")
