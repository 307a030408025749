"""``python -m batchlu.workflows ...`` runs the ``batchlu`` command line."""

from .cli import main

main()
