"""batchlu.workflows: the ``batchlu`` command line (``batchlu.workflows.cli``), cluster scripts and examples."""
