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
    command started worker processes, and for an exception other than an exit (a bug, with its
    traceback), the process ends as Python ends it."""
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
    if _has_children():   # worker processes were started: Python's own exit (below) is needed
        raise SystemExit(status)
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
