"""Fill-reducing orderings of a symmetric pattern, from well-kept libraries.

* ``"amd"``: SuiteSparse's approximate minimum degree (Amestoy, Davis, Duff), through CVXOPT's
  ``cvxopt.amd.order`` (CVXOPT's wheels bundle SuiteSparse; a hard dependency);
* ``"metis"``: METIS's nested dissection (``METIS_NodeND``) through ``pymetis`` (the optional extra
  ``batchlu[metis]``);
* ``"natural"``: the identity;
* an integer array: the caller's own permutation.

Every ordering is returned as ``perm`` (n,) int64, new to old: row and column ``k`` of the permuted
matrix ``C = A[perm][:, perm]`` are row and column ``perm[k]`` of ``A``.
"""

from __future__ import annotations

import numpy as np

from batchlu.errors import ConfigError, InputError

ORDERINGS = ("amd", "metis", "natural")


def _adjacency(n: int, rows: np.ndarray, cols: np.ndarray):
    """The symmetric adjacency (no diagonal) as CSR ``(indptr, indices)`` int64, sorted and unique."""
    off = rows != cols
    r = np.concatenate([rows[off], cols[off]])
    c = np.concatenate([cols[off], rows[off]])
    order = np.lexsort((c, r))
    r, c = r[order], c[order]
    if r.size:
        first = np.concatenate(([True], (np.diff(r) != 0) | (np.diff(c) != 0)))
        r, c = r[first], c[first]
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(r, minlength=n), out=indptr[1:])
    return indptr, c.astype(np.int64)


def amd(n: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    import cvxopt
    import cvxopt.amd

    if n == 0:
        return np.zeros(0, np.int64)
    # the lower triangle plus the whole diagonal (AMD ignores the diagonal; an order-n matrix needs
    # at least the shape); cvxopt wants Python ints
    r = np.concatenate([rows, np.arange(n)])
    c = np.concatenate([cols, np.arange(n)])
    matrix = cvxopt.spmatrix(1.0, r.tolist(), c.tolist(), (n, n))
    return np.asarray(cvxopt.amd.order(matrix, "L"), dtype=np.int64).reshape(-1)


def metis(n: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    try:
        import pymetis
    except ImportError:
        raise ConfigError("Expected pymetis for ordering='metis'. Got no module named 'pymetis' "
                          "instead; install it with: pip install 'batchlu[metis]'.") from None
    if n == 0:
        return np.zeros(0, np.int64)
    indptr, indices = _adjacency(n, rows, cols)
    if indices.size == 0:  # METIS needs at least one edge; a diagonal matrix needs no ordering
        return np.arange(n, dtype=np.int64)
    adjacency = pymetis.CSRAdjacency(indptr.astype(np.int32), indices.astype(np.int32)) \
        if hasattr(pymetis, "CSRAdjacency") else None
    if adjacency is not None:
        perm, _ = pymetis.nested_dissection(adjacency)
    else:  # pymetis before 2025
        perm, _ = pymetis.nested_dissection(xadj=indptr, adjncy=indices)
    return np.asarray(perm, dtype=np.int64)


def check_perm(perm, n: int) -> np.ndarray:
    perm = np.asarray(perm)
    if perm.ndim != 1 or perm.dtype.kind not in "iu" or perm.size != n:
        raise InputError(f"Expected the ordering to be a permutation of 0..n-1, an integer array of "
                         f"shape ({n},). Got shape {perm.shape}, dtype {perm.dtype} instead.")
    perm = perm.astype(np.int64)
    if n and not np.array_equal(np.sort(perm), np.arange(n)):
        outside = int(((perm < 0) | (perm >= n)).sum())
        inside = perm[(perm >= 0) & (perm < n)]
        repeated = int(inside.size - np.unique(inside).size)
        raise InputError(f"Expected the ordering to be a permutation of 0..n-1 (each index once). "
                         f"Got {repeated} repeated and {outside} out-of-range entries instead.")
    return perm


def order(ordering, n: int, rows: np.ndarray, cols: np.ndarray) -> tuple[str, np.ndarray]:
    """``(name, perm)`` for ``ordering`` (a name of :data:`ORDERINGS` or a permutation array)."""
    if isinstance(ordering, str):
        if ordering == "amd":
            return "amd", check_perm(amd(n, rows, cols), n)
        if ordering == "metis":
            return "metis", check_perm(metis(n, rows, cols), n)
        if ordering == "natural":
            return "natural", np.arange(n, dtype=np.int64)
        raise ConfigError(f"Expected ordering to be one of {', '.join(ORDERINGS)} or a permutation "
                          f"array. Got {ordering!r} instead.")
    return "given", check_perm(ordering, n)
