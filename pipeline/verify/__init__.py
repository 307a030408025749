"""``batchlu.pipeline.verify``: check a run's output against its input, matrix by matrix.

Every rule of :mod:`._rules` (the dense ops) and :mod:`._sparse_rules` (the sparse ops) is applied
to every matrix checked: LAPACK's test ratios against a float64/complex128 recomputation for the
results (dget01 for ``lu``, dget03 for ``inv``, dget02 for ``solve`` via :mod:`batchlu.testing.ratios`,
and for ``slogdet`` the errors of ``logabsdet`` and ``sign`` in units of ``n eps``,
:func:`batchlu.testing.ratios.slogdet_ratios`), and the ``info`` rules: each code is one batchlu
writes, means what it says (a non-finite input is -1 and only it, -2 exactly where a finite input's
result is not finite, -3 exactly where the input chunk is missing, a matrix flagged singular is
singular) and comes with the agreed outputs (NaN inverse / solution, sign 0 and logabsdet -inf, NaN
lu and identity pivots, ...). Singular and non-finite matrices are counted, not failed. Only chunks
recorded complete are checked; an incomplete output is reported as such, naming the chunks not
computed, and is never ``ok``. Before anything is checked, the record's fields that say what to
check (N, n, the chunk, op, input, rhs) are compared with the stored arrays (:mod:`._record`): an
edited record is refused, never trusted.
"""

from ._check import VerifyReport, verify

__all__ = ["VerifyReport", "verify"]
