"""The input pattern, checked and reduced to one triangle.

A batch's matrices share one CSR pattern (``indptr`` (n+1,), ``indices`` (nnz,)) and hold their values
in ``values`` (B, nnz), entry ``p`` of matrix ``b`` at row ``i`` (``indptr[i] <= p < indptr[i+1]``) and
column ``indices[p]``. The pattern is either

* ``"lower"``: the lower triangle only (every entry has ``column <= row``), or
* ``"full"``: both triangles, symmetric as a pattern (entry (i, j) present iff (j, i) is).

Either way the matrix is the symmetric one defined by the lower triangle: with a full pattern the
entries above the diagonal are not read (as LAPACK's ``uplo="L"``). Diagonal entries may be missing
(a structurally zero diagonal, as in a KKT system's zero block). Duplicate entries are refused.
"""

from __future__ import annotations

import numpy as np

from batchlu.errors import InputError

PATTERNS = ("full", "lower")


def check(indptr, indices, n) -> tuple[np.ndarray, np.ndarray, int]:
    """``indptr`` and ``indices`` as int64 arrays, checked against ``n``; returns them and ``n``."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise InputError(f"Expected n to be an integer >= 0. Got {n!r} instead.")
    n = int(n)
    indptr, indices = np.asarray(indptr), np.asarray(indices)
    for name, x in (("indptr", indptr), ("indices", indices)):
        if x.ndim != 1 or x.dtype.kind not in "iu":
            raise InputError(f"Expected {name} to be a 1-D integer array. "
                             f"Got ndim {x.ndim}, dtype {x.dtype} instead.")
    if indptr.shape != (n + 1,):
        raise InputError(f"Expected indptr of shape (n + 1,) = ({n + 1},). Got shape {indptr.shape} instead.")
    indptr, indices = indptr.astype(np.int64), indices.astype(np.int64)
    if indptr[0] != 0 or np.any(np.diff(indptr) < 0) or indptr[-1] != indices.size:
        raise InputError(f"Expected indptr to start at 0, never decrease and end at nnz = len(indices) = "
                         f"{indices.size}. Got indptr[0] = {int(indptr[0])}, indptr[-1] = {int(indptr[-1])}"
                         f"{' and a decrease' if np.any(np.diff(indptr) < 0) else ''} instead.")
    if indices.size and (indices.min() < 0 or indices.max() >= n):
        bad = int(indices[(indices < 0) | (indices >= n)][0])
        raise InputError(f"Expected every column index in [0, n) = [0, {n}). Got {bad} instead.")
    return indptr, indices, n


def rows_of(indptr: np.ndarray) -> np.ndarray:
    """The row index of every entry of a CSR pattern."""
    return np.repeat(np.arange(indptr.size - 1, dtype=np.int64), np.diff(indptr))


def detect(rows: np.ndarray, cols: np.ndarray) -> str:
    """``"lower"`` when no entry lies above the diagonal, else ``"full"``."""
    return "lower" if not np.any(cols > rows) else "full"


def lower_entries(indptr, indices, n, pattern: str | None):
    """Check the pattern and pick the entries that define the matrix.

    Returns ``(pattern, keep, rows, cols, mirror)``: the pattern's name, the indices (into
    ``values``'s last axis) of the entries on or below the diagonal, their rows and columns (``rows
    >= cols``), and for pattern ``"full"`` the index of each one's mirror entry (``(j, i)`` of
    ``(i, j)``; itself on the diagonal), else None.
    """
    indptr, indices, n = check(indptr, indices, n)
    rows = rows_of(indptr)
    if pattern is None:
        pattern = detect(rows, indices)
    if pattern not in PATTERNS:
        raise InputError(f"Expected pattern to be one of {', '.join(PATTERNS)} or None (detect). "
                         f"Got {pattern!r} instead.")
    key = rows * max(n, 1) + indices
    if key.size > 1 and np.any(np.diff(np.sort(key)) == 0):
        dup = np.sort(key)[np.flatnonzero(np.diff(np.sort(key)) == 0)[0]]
        raise InputError(f"Expected no duplicate entries in the pattern. Got entry ({int(dup // n)}, "
                         f"{int(dup % n)}) more than once instead.")
    upper = indices > rows
    if pattern == "lower":
        if np.any(upper):
            p = int(np.flatnonzero(upper)[0])
            raise InputError(f"Expected a lower-triangular pattern (every column index <= its row) for "
                             f"pattern 'lower'. Got entry ({int(rows[p])}, {int(indices[p])}) above the "
                             f"diagonal instead; pass pattern='full' for both triangles.")
    else:
        mirror = np.sort(indices * max(n, 1) + rows)
        if not np.array_equal(np.sort(key), mirror):
            missing = np.setdiff1d(key, mirror)[:1]
            i, j = (int(missing[0] // n), int(missing[0] % n)) if missing.size else (-1, -1)
            raise InputError(f"Expected a symmetric pattern for pattern 'full' (entry (i, j) present iff "
                             f"(j, i) is). Got entry ({i}, {j}) without its mirror ({j}, {i}) instead; "
                             f"pass only the lower triangle with pattern='lower' for a one-sided pattern.")
    keep = np.flatnonzero(~upper)
    mirror = None
    if pattern == "full":
        order = np.argsort(key, kind="stable")
        mirror = order[np.searchsorted(key[order], indices[keep] * max(n, 1) + rows[keep])]
    return pattern, keep, rows[keep], indices[keep], mirror
