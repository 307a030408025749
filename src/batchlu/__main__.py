"""``python -m batchlu ...`` runs the ``batchlu`` command line."""

from .workflows.cli import main

main()
