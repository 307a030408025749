"""batchlu.workflows: the ``batchlu`` command line (``workflows.cli``), cluster scripts and examples."""
