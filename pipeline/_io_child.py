"""Entry point of an I/O process: ``python -m batchlu.pipeline._io_child PARENT_PID REQUEST_FD REPLY_FD
THREADS`` (see :mod:`batchlu.pipeline._io_pool`). A module of its own, which the package never
imports, so that ``-m`` runs it once rather than over a copy already imported with the package."""

from ._io_pool import _child_main

if __name__ == "__main__":
    _child_main()
