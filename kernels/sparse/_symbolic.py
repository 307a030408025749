"""The symbolic factorization of a permuted symmetric pattern: elimination tree, the structure of L
and the level sets of the tree.

Everything works on ``C = P A P^T``'s lower triangle, given as the (row, column) pairs of its entries
(``row >= column``, new numbering). Column ``j`` of L holds ``j`` itself (the diagonal, where D is
kept) and the rows of ``struct(L_j)``:

    struct(L_j) = { i > j : C[i, j] != 0 }  ∪  ⋃_{c child of j} struct(L_c) \\ {j}

and the parent of ``j`` in the elimination tree is the smallest row of ``struct(L_j)`` (Liu 1990;
Davis, *Direct Methods for Sparse Linear Systems*, ch. 4). Columns are visited in increasing order, so
every child (a smaller index) is done before its parent; each column's structure is merged into its
parent's once, which keeps the work in O(nnz(L) log) inside NumPy's sorts. The result is exactly the
up-looking (``ereach``) structure of the seed paper, computed column-wise.

Levels (the seed paper's Algorithm 2): a leaf is level 0, any other node is 1 + the largest level
of its children; columns of one level do not depend on each other.
"""

from __future__ import annotations

import numpy as np


def lower_csc(n: int, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Strictly-lower entries of C as CSC ``(colptr, rowind)``: rows sorted within each column."""
    off = rows > cols
    r, c = rows[off], cols[off]
    order = np.lexsort((r, c))
    colptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(c, minlength=n), out=colptr[1:])
    return colptr, r[order]


def symbolic(n: int, rows: np.ndarray, cols: np.ndarray):
    """``(parent, colptr, rowind, level)`` of the LDL^T factor of C's pattern.

    ``parent[j]`` is -1 for a root. ``colptr`` (n+1,) and ``rowind`` (nnz(L),) are L's CSC pattern,
    the diagonal first in each column and the rows ascending; ``level[j]`` is the column's level.
    """
    a_ptr, a_row = lower_csc(n, rows, cols)
    parent = np.full(n, -1, np.int64)
    level = np.zeros(n, np.int64)
    children: list[list[int]] = [[] for _ in range(n)]
    struct: list[np.ndarray] = [None] * n  # type: ignore[list-item]
    for j in range(n):
        kids = children[j]
        if kids:
            s = np.unique(np.concatenate([a_row[a_ptr[j]:a_ptr[j + 1]]] + [struct[c][1:] for c in kids]))
            level[j] = 1 + max(int(level[c]) for c in kids)
        else:
            s = a_row[a_ptr[j]:a_ptr[j + 1]]
        struct[j] = s
        if s.size:
            p = int(s[0])
            parent[j] = p
            children[p].append(j)
    counts = np.fromiter((s.size + 1 for s in struct), np.int64, n)
    colptr = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=colptr[1:])
    if n:
        rowind = np.concatenate([np.concatenate(([j], struct[j])) for j in range(n)]).astype(np.int64)
    else:
        rowind = np.zeros(0, np.int64)
    return parent, colptr, rowind, level


def level_sets(level: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(level_ptr, level_cols)``: the columns of level ``l`` are ``level_cols[level_ptr[l]:level_ptr[l+1]]``,
    ascending (the seed paper's ``level_p`` and ``level_i``)."""
    nlevels = int(level.max()) + 1 if level.size else 0
    level_cols = np.argsort(level, kind="stable").astype(np.int64)
    level_ptr = np.zeros(nlevels + 1, np.int64)
    np.cumsum(np.bincount(level, minlength=nlevels), out=level_ptr[1:])
    return level_ptr, level_cols
