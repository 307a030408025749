"""batchlu.testing: what tests and verification use, not compute.

* :mod:`batchlu.testing.matrices` — the reproducible test matrices of ``batchlu generate``;
* :mod:`batchlu.testing.ratios` — LAPACK's test ratios (dget01 / dget02 / dget03) and their threshold.
"""

from . import matrices, ratios

__all__ = ["matrices", "ratios"]
