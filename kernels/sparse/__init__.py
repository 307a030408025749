"""batchlu.sparse: LDL^T of batches of sparse symmetric matrices that share one pattern.

    plan = batchlu.sparse.analyze(indptr, indices, n, kind="sym-indef", ordering="amd")
    F = plan.factorize(values)          # values (B, nnz): NumPy -> CPU, CuPy -> GPU (one pass)
    x, info = F.solve(b, refine=2)      # b (B, n) or (B, n, k)
    F.inertia(), F.perturbed_pivots(), F.retried(), F.backward_error(b, x)

:func:`analyze` is the symbolic phase, once per pattern on the host (ordering, elimination tree,
structure of L, level sets); :class:`Plan` holds its result and the index maps of the numeric phase;
:class:`Factor` holds a batch's factors. ``info`` codes per matrix: 0 ok, ``k > 0`` zero pivot
(static pivoting off), -1 non-finite input, -2 non-finite result, -4 refinement short of its
tolerance, after the second attempt where the default threshold gives one
(:mod:`batchlu.kernels.sparse._factor`).
"""

from batchlu.kernels._info import INFO_NONFINITE_INPUT, INFO_NONFINITE_RESULT, INFO_OK, INFO_REFINEMENT

from ._factor import DTYPES, Factor
from ._ordering import ORDERINGS
from ._pattern import PATTERNS
from ._plan import KINDS, Plan, analyze

__all__ = ["DTYPES", "INFO_NONFINITE_INPUT", "INFO_NONFINITE_RESULT", "INFO_OK", "INFO_REFINEMENT", "KINDS",
           "ORDERINGS", "PATTERNS", "Factor", "Plan", "analyze"]
