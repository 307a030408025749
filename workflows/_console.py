"""Whether the process is the ``batchlu`` command's own: set by the console entry
(:func:`batchlu.workflows.console`), read by the report's import part (a notebook's or a test
runner's process is older than the command it runs)."""

started = False
