"""``python -m batchlu ...`` runs the ``batchlu`` command line."""

from .workflows import console

console()
