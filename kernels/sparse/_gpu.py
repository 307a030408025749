"""The GPU numeric factorization of :mod:`batchlu.kernels.sparse` (CuPy ``values``): not written yet.

What a GPU backend implements (the CPU one, :mod:`batchlu.kernels.sparse._factor` and
:mod:`batchlu.kernels.sparse._cpu`, is the reference):

    factorize(plan, values, *, perturb, pivot_tol) -> a factor object

with ``values`` a CuPy (B, nnz) float32/float64 array, the same checks, the same pivot rule
(``|d| < pivot_tol * ||A||_inf`` -> ``+-pivot_tol * ||A||_inf``, ``pivot_tol`` default sqrt(eps)) and a
factor with the same methods and meanings as :class:`batchlu.kernels.sparse.Factor`: ``info``,
``perturbed_pivots()``, ``inertia()``, ``pivots()``, ``solve(b, refine, tol)``,
``backward_error(b, x)``, ``refine_steps`` and ``last_backward_error``, arrays on the device.
``plan.schedule()`` gives the per-level index maps (:mod:`batchlu.kernels.sparse._schedule`) to copy
to the device once per plan.
"""

from __future__ import annotations

from batchlu.errors import BackendError


def factorize(plan, values, *, perturb: bool = True, pivot_tol: float | None = None):
    raise BackendError("Expected NumPy values for batchlu.sparse: its GPU numeric factorization is not "
                       "written yet. Got a CuPy array instead; pass values.get() to factor on the CPU.")
