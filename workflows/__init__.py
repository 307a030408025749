"""batchlu.workflows: the ``batchlu`` command line (``batchlu.workflows.cli``), cluster scripts and examples."""


def main(argv=None) -> None:
    """The ``batchlu`` console entry: loads the command line here, so that Ctrl-C while it loads
    (0.3-0.5 s of imports) ends as Ctrl-C later does, in click's one line ``Aborted!`` and exit
    status 1, not in a traceback of the import it stopped."""
    try:
        from .cli import main as command_line
    except KeyboardInterrupt:
        import sys

        print("Aborted!", file=sys.stderr)
        raise SystemExit(1) from None
    command_line(argv)
