"""batchlu.workflows: the ``batchlu`` command line (``batchlu.workflows.cli``), cluster scripts and examples."""


def main(argv=None) -> None:
    """The ``batchlu`` command line: loads it here, so that Ctrl-C while it loads (0.3-0.5 s of
    imports) ends as Ctrl-C later does, in click's one line ``Aborted!`` and exit status 1, not in a
    traceback of the import it stopped."""
    try:
        from .cli import main as command_line
    except KeyboardInterrupt:
        import sys

        print("Aborted!", file=sys.stderr)
        raise SystemExit(1) from None
    command_line(argv)


def console() -> None:
    """The ``batchlu`` console entry (and ``python -m batchlu``): :func:`main`, then the process
    ends at once with its exit status. A command has closed its cluster, written and closed every
    file and given its output's lock back by the time it returns; the interpreter's own teardown
    after that (Dask's, Zarr's and numba's modules and threads) took 0.2 s of a 1.8 s run. Where the
    command started worker processes, the interpreter's exit hooks run first (:func:`_run_exit_hooks`).
    For an exception other than an exit (a bug, with its traceback), the process ends as Python ends
    it."""
    import os
    import sys

    from . import _console

    _console.started = True   # the process is the command's own: its age is the command's
    try:
        main()
        status = 0
    except SystemExit as exc:
        status = exc.code
    if status is None:
        status = 0
    elif not isinstance(status, int):   # sys.exit("message"): Python prints it, status 1
        print(status, file=sys.stderr)
        status = 1
    if _has_children() and not _run_exit_hooks():   # worker processes were started
        raise SystemExit(status)   # Python's own exit
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):   # a closed pipe (| head), a stream closed at start (None)
            pass
    os._exit(status)


def _has_children() -> bool:
    """Whether this process has a child process: multiprocessing's resource tracker, started with
    worker processes, warns of every semaphore not unregistered by Python's own exit (the
    finalizers :func:`os._exit` skips), on the terminal it shares."""
    import psutil

    try:
        return bool(psutil.Process().children())
    except psutil.Error:
        return True


def _run_exit_hooks() -> bool:
    """Run the interpreter's exit hooks (:mod:`atexit`) now, as Python's own exit would, and say
    whether they ran. multiprocessing's is among them: it joins the worker processes and unregisters
    its semaphores, so that the resource tracker (a child process) has none to report as leaked.
    What Python's exit does after them, tearing its modules down, is what :func:`console` skips: it
    took 0.8 s of a run with worker processes (2-core VM). False where this Python offers no way to
    run them (``atexit._run_exitfuncs``, CPython's): then the process exits as Python does."""
    import atexit

    run = getattr(atexit, "_run_exitfuncs", None)
    if run is None:
        return False
    run()
    return True
