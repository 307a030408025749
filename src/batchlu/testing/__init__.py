"""batchlu.testing: what tests and verification use, not compute.

* :mod:`batchlu.testing.matrices` — the reproducible test matrices of ``batchlu generate``;
* :mod:`batchlu.testing.ratios` — LAPACK's test ratios (dget01 / dget02 / dget03) and their threshold;
* :mod:`batchlu.testing.sparse` — the sparse generators (FEM, saddle point, power grid) of
  ``batchlu generate --kind fem-poisson ...``.
"""

from . import matrices, ratios, sparse

__all__ = ["matrices", "ratios", "sparse"]
