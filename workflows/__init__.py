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
    after that (Dask's, Zarr's and numba's modules and threads) took 0.2 s of a 1.8 s run. An
    exception other than an exit (a bug) ends the process as Python does, with its traceback."""
    import os
    import sys

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
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # a closed pipe (batchlu ... | head): nothing more to say
            pass
    os._exit(status)
