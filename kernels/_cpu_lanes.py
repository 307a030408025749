"""The compiled engine's LU for larger n: W matrices factored at once, one per SIMD lane.

From ``LANES_MIN_N`` on (``batchlu.kernels._cpu``), ``getrf`` and ``slogdet`` take the batch W
matrices at a time (W = 8 in float64 and complex128, 16 in float32 and complex64: one 64-byte vector)
and interleave them: entry (r, c) of the W matrices is one vector, ``F[(r * n + c) * W + lane]``
(complex: the real parts in ``F``, the imaginary parts in ``G``, laid out alike). Every arithmetic
step is then one vector instruction on W matrices (``batchlu.kernels._cpu_simd``), with no shuffles
and no horizontal work, and each matrix keeps its own pivots: the pivot search compares lane by lane,
and row interchanges move one lane's entries only.

The algorithm is LAPACK's blocked right-looking LU (``xGETRF``) with panels of ``NB`` columns:

1. each panel is factored column by column as ``xGETF2`` does: the pivot is the first entry of
   largest ``|re| + |im|`` (``IxAMAX``), its whole row is swapped in, the column below is scaled by
   the pivot's reciprocal (divided by a pivot below ``sfmin``, and by a complex one whose reciprocal
   would come out 0, ``_cpu_numba.huge_pivot``; a zero pivot leaves its column as it is, and the
   factorization goes on); one pass over the rows scales column j, updates the panel's
   later columns and searches column j + 1 for its pivot;
2. the rows of the panel right of it are solved with its unit lower triangle (``xTRSM``);
3. the trailing matrix takes the panel's rank-NB update (``xGEMM``) in register tiles of 4 x 4
   vectors (2 x 2 complex), each loaded and stored once per panel.

The matrices enter and leave the interleaved buffer through W x W transposes in registers, checked
on the way: a matrix holding NaN or Inf is replaced by the identity in its lane and gets info -1
(NaN ``lu``, identity ``piv``); a finite matrix whose ``lu`` is not finite gets -2. A batch whose
size is not a multiple of W fills the spare lanes of its last group with identity matrices.

What a lane computes depends only on its matrix: vector instructions work lane by lane, and the one
branch taken for all lanes together (a tiny pivot in some lane) gives the other lanes the same bits.
The operations run in another order than OpenBLAS's ``xGETRF``, so ``lu`` equals SciPy's to
rounding and ``piv`` is SciPy's unless two pivot candidates tie to within that rounding.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._cpu_simd import (vabs, vadd, vfma, vfnma, vload, vmul, vsel_gt, vsplat, vstore, vsub,
                        vtranspose, vtranspose_join, vtranspose_split)
from ._cpu_numba import huge_pivot, huge_quotient, store_slogdet
from ._info import INFO_NONFINITE_INPUT, INFO_NONFINITE_RESULT

__all__ = ["NB", "getrf", "slogdet"]

NB = 8          # columns per panel (measured on the 2-core development machine: 4 and 16 no faster)

_jit = njit(cache=True, nogil=True, error_model="numpy")
_inline = njit(cache=True, nogil=True, error_model="numpy", inline="always")


@_jit
def _aligned(size, like):
    """A scratch array of ``size`` elements of ``like``'s dtype that starts on a 64-byte boundary."""
    buf = np.zeros(size + 64 // like.itemsize, like.dtype)
    off = (-(buf.ctypes.data % 64)) % 64 // like.itemsize
    return buf[off:off + size]


# --- moving matrices in and out ---------------------------------------------------------------


@_jit
def _gather(af, g, cnt, F, n, ld):
    """``F`` := matrices ``g .. g + cnt - 1`` of the flat real batch ``af``, interleaved; lanes from
    ``cnt`` on hold the identity."""
    W = 64 // F.itemsize
    nn = n * n
    m = n - n % W
    if cnt == W:
        for r in range(n):
            for c in range(0, m, W):
                vtranspose(F, (r * ld + c) * W, W, af, g * nn + r * n + c, nn)
            for c in range(m, n):
                for lane in range(W):
                    F[(r * ld + c) * W + lane] = af[(g + lane) * nn + r * n + c]
        return
    for lane in range(W):
        for r in range(n):
            for c in range(n):
                if lane < cnt:
                    F[(r * ld + c) * W + lane] = af[(g + lane) * nn + r * n + c]
                else:
                    F[(r * ld + c) * W + lane] = 1.0 if r == c else 0.0


@_jit
def _scatter(F, luf, g, cnt, n, ld):
    """Matrices ``g .. g + cnt - 1`` of the flat real ``luf`` := lanes ``0 .. cnt - 1`` of ``F``."""
    W = 64 // F.itemsize
    nn = n * n
    m = n - n % W
    if cnt == W:
        for r in range(n):
            for c in range(0, m, W):
                vtranspose(luf, g * nn + r * n + c, nn, F, (r * ld + c) * W, W)
            for c in range(m, n):
                for lane in range(W):
                    luf[(g + lane) * nn + r * n + c] = F[(r * ld + c) * W + lane]
        return
    for lane in range(cnt):
        for r in range(n):
            for c in range(n):
                luf[(g + lane) * nn + r * n + c] = F[(r * ld + c) * W + lane]


@_jit
def _gather_complex(ar, g, cnt, F, G, n, ld):
    """:func:`_gather` of complex matrices (``ar``: their flat (re, im) pairs) into real parts ``F``
    and imaginary parts ``G``."""
    W = 64 // F.itemsize
    nn = n * n
    m = n - n % W
    if cnt == W:
        for r in range(n):
            for c in range(0, m, W):
                vtranspose_split(F, G, (r * ld + c) * W, W, ar, 2 * (g * nn + r * n + c), 2 * nn)
            for c in range(m, n):
                for lane in range(W):
                    s = 2 * ((g + lane) * nn + r * n + c)
                    F[(r * ld + c) * W + lane] = ar[s]
                    G[(r * ld + c) * W + lane] = ar[s + 1]
        return
    for lane in range(W):
        for r in range(n):
            for c in range(n):
                t = (r * ld + c) * W + lane
                if lane < cnt:
                    s = 2 * ((g + lane) * nn + r * n + c)
                    F[t] = ar[s]
                    G[t] = ar[s + 1]
                else:
                    F[t] = 1.0 if r == c else 0.0
                    G[t] = 0.0


@_jit
def _scatter_complex(F, G, lur, g, cnt, n, ld):
    """:func:`_scatter` of complex matrices (``lur``: the flat (re, im) pairs of the output)."""
    W = 64 // F.itemsize
    nn = n * n
    m = n - n % W
    if cnt == W:
        for r in range(n):
            for c in range(0, m, W):
                vtranspose_join(lur, 2 * (g * nn + r * n + c), 2 * nn, F, G, (r * ld + c) * W, W)
            for c in range(m, n):
                for lane in range(W):
                    s = 2 * ((g + lane) * nn + r * n + c)
                    lur[s] = F[(r * ld + c) * W + lane]
                    lur[s + 1] = G[(r * ld + c) * W + lane]
        return
    for lane in range(cnt):
        for r in range(n):
            for c in range(n):
                s = 2 * ((g + lane) * nn + r * n + c)
                lur[s] = F[(r * ld + c) * W + lane]
                lur[s + 1] = G[(r * ld + c) * W + lane]


@_jit
def _lanes_finite(F, size, tmp):
    """``tmp[lane] == 0`` where the first ``size`` vectors of ``F`` are finite in that lane (NaN
    there otherwise): four running sums of ``v - v``, which is 0 for finite ``v`` and NaN else."""
    W = 64 // F.itemsize
    z = vsub(vload(F, 0), vload(F, 0))
    s0, s1, s2, s3 = z, z, z, z
    t = 1
    while t + 4 <= size:
        v0, v1, v2, v3 = vload(F, t * W), vload(F, (t + 1) * W), vload(F, (t + 2) * W), vload(F, (t + 3) * W)
        s0 = vadd(s0, vsub(v0, v0))
        s1 = vadd(s1, vsub(v1, v1))
        s2 = vadd(s2, vsub(v2, v2))
        s3 = vadd(s3, vsub(v3, v3))
        t += 4
    while t < size:
        v0 = vload(F, t * W)
        s0 = vadd(s0, vsub(v0, v0))
        t += 1
    vstore(tmp, 0, vadd(vadd(s0, s1), vadd(s2, s3)))


@_jit
def _set_identity(F, n, ld, lane):
    W = 64 // F.itemsize
    for r in range(n):
        for c in range(n):
            F[(r * ld + c) * W + lane] = 1.0 if r == c else 0.0


# --- the factorization, real ----------------------------------------------------------------------


@_jit
def _swap_rows(F, n, ld, j, tmp, piv):
    """Per lane: ``piv[j * W + lane]`` := the pivot row ``tmp[lane]`` (a float), and rows j and
    that row swapped in that lane."""
    W = 64 // F.itemsize
    for lane in range(W):
        p = int(tmp[lane])
        piv[j * W + lane] = p
        if p != j:
            x = j * ld * W + lane
            y = p * ld * W + lane
            for c in range(n):
                t = F[x]
                F[x] = F[y]
                F[y] = t
                x += W
                y += W


@_jit
def _search(F, n, ld, j, rows):
    """Per lane, the row (as a float) of the first largest ``|F[i, j]|``, i >= j."""
    W = 64 // F.itemsize
    best = vabs(vload(F, (j * ld + j) * W))
    pidx = vsplat(rows[j])
    for i in range(j + 1, n):
        m = vabs(vload(F, (i * ld + j) * W))
        pidx = vsel_gt(m, best, vsplat(rows[i]), pidx)
        best = vsel_gt(m, best, m, best)
    return pidx


@_jit
def _reciprocals(F, d0, rec, sfmin):
    """Per lane, ``rec`` := 1 / the pivot ``F[d0 + lane]``, or 1 where it is zero (the column stays
    as it is) or below ``sfmin`` (the column is divided instead). Returns whether some lane has a
    nonzero pivot below ``sfmin``."""
    W = 64 // F.itemsize
    tiny = False
    for lane in range(W):
        d = F[d0 + lane]
        if d == 0:
            rec[lane] = 1
        elif abs(d) >= sfmin:
            rec[lane] = 1 / d
        else:
            rec[lane] = 1
            tiny = True
    return tiny


@_jit
def _divide_tiny(F, n, ld, j, sfmin):
    """Rows below j of column j divided by the pivot, in the lanes whose nonzero pivot is below
    ``sfmin``."""
    W = 64 // F.itemsize
    d0 = (j * ld + j) * W
    for lane in range(W):
        d = F[d0 + lane]
        if d != 0 and abs(d) < sfmin:
            for i in range(j + 1, n):
                F[(i * ld + j) * W + lane] /= d


@_jit
def _panel_step(F, n, ld, j, k1, rec, rows):
    """One pass over rows j + 1 .. n - 1: column j scaled by ``rec``, the panel's columns j + 1 ..
    k1 - 1 updated by its rank-1 step; returns the pivot rows of column j + 1 (if it is in the
    panel), searched as it is updated."""
    W = 64 // F.itemsize
    d0 = (j * ld + j) * W
    r = vload(rec, 0)
    pidx = vsplat(rows[j + 1])
    if j + 1 == k1:
        for i in range(j + 1, n):
            o = (i * ld + j) * W
            vstore(F, o, vmul(vload(F, o), r))
        return pidx
    u = vload(F, d0 + W)
    o = ((j + 1) * ld + j) * W
    lij = vmul(vload(F, o), r)
    vstore(F, o, lij)
    x = vfnma(lij, u, vload(F, o + W))
    vstore(F, o + W, x)
    best = vabs(x)
    for c in range(j + 2, k1):
        q = o + (c - j) * W
        vstore(F, q, vfnma(lij, vload(F, d0 + (c - j) * W), vload(F, q)))
    for i in range(j + 2, n):
        o = (i * ld + j) * W
        lij = vmul(vload(F, o), r)
        vstore(F, o, lij)
        x = vfnma(lij, u, vload(F, o + W))
        vstore(F, o + W, x)
        m = vabs(x)
        pidx = vsel_gt(m, best, vsplat(rows[i]), pidx)
        best = vsel_gt(m, best, m, best)
        for c in range(j + 2, k1):
            q = o + (c - j) * W
            vstore(F, q, vfnma(lij, vload(F, d0 + (c - j) * W), vload(F, q)))
    return pidx


@_jit
def _trsm(F, n, ld, k0, k1):
    """Rows k0 .. k1 - 1 right of the panel := L11^-1 times them (unit lower triangular)."""
    W = 64 // F.itemsize
    for j in range(k0, k1):
        for i in range(j + 1, k1):
            lij = vload(F, (i * ld + j) * W)
            for c in range(k1, n):
                o = (i * ld + c) * W
                vstore(F, o, vfnma(lij, vload(F, (j * ld + c) * W), vload(F, o)))


@_inline
def _load4(F, p, W):
    """The four vectors from ``F[p]`` on, W apart (a row of a tile)."""
    return vload(F, p), vload(F, p + W), vload(F, p + 2 * W), vload(F, p + 3 * W)


@_inline
def _store4(F, p, W, x0, x1, x2, x3):
    vstore(F, p, x0)
    vstore(F, p + W, x1)
    vstore(F, p + 2 * W, x2)
    vstore(F, p + 3 * W, x3)


@_inline
def _fnma4(a, b0, b1, b2, b3, c0, c1, c2, c3):
    """A row of a tile minus ``a`` times the row ``b``."""
    return vfnma(a, b0, c0), vfnma(a, b1, c1), vfnma(a, b2, c2), vfnma(a, b3, c3)


@_jit
def _gemm(F, n, ld, k0, k1):
    """The trailing matrix (rows and columns k1 .. n - 1) minus L21 U12 (k = k0 .. k1 - 1), in
    tiles of 4 x 4 vectors held in registers; the edges one vector at a time."""
    W = 64 // F.itemsize
    m4 = k1 + (n - k1) // 4 * 4
    for i in range(k1, m4, 4):
        r0 = i * ld * W
        r1 = r0 + ld * W
        r2 = r1 + ld * W
        r3 = r2 + ld * W
        for c in range(k1, m4, 4):
            o = c * W
            c00, c01, c02, c03 = _load4(F, r0 + o, W)
            c10, c11, c12, c13 = _load4(F, r1 + o, W)
            c20, c21, c22, c23 = _load4(F, r2 + o, W)
            c30, c31, c32, c33 = _load4(F, r3 + o, W)
            for k in range(k0, k1):
                b0, b1, b2, b3 = _load4(F, (k * ld + c) * W, W)
                c00, c01, c02, c03 = _fnma4(vload(F, r0 + k * W), b0, b1, b2, b3, c00, c01, c02, c03)
                c10, c11, c12, c13 = _fnma4(vload(F, r1 + k * W), b0, b1, b2, b3, c10, c11, c12, c13)
                c20, c21, c22, c23 = _fnma4(vload(F, r2 + k * W), b0, b1, b2, b3, c20, c21, c22, c23)
                c30, c31, c32, c33 = _fnma4(vload(F, r3 + k * W), b0, b1, b2, b3, c30, c31, c32, c33)
            _store4(F, r0 + o, W, c00, c01, c02, c03)
            _store4(F, r1 + o, W, c10, c11, c12, c13)
            _store4(F, r2 + o, W, c20, c21, c22, c23)
            _store4(F, r3 + o, W, c30, c31, c32, c33)
    for i in range(k1, n):
        for c in range(m4 if i < m4 else k1, n):
            o = (i * ld + c) * W
            acc = vload(F, o)
            for k in range(k0, k1):
                acc = vfnma(vload(F, (i * ld + k) * W), vload(F, (k * ld + c) * W), acc)
            vstore(F, o, acc)


@_jit
def _factor(F, n, ld, piv, tmp, rec, rows, sfmin, nb=NB):
    """LU with partial pivoting of the W interleaved matrices in ``F``, in place; 0-based pivots
    into ``piv`` (j * W + lane)."""
    W = 64 // F.itemsize
    for k0 in range(0, n, nb):
        k1 = min(n, k0 + nb)
        pidx = _search(F, n, ld, k0, rows)
        for j in range(k0, k1):
            vstore(tmp, 0, pidx)
            _swap_rows(F, n, ld, j, tmp, piv)
            if _reciprocals(F, (j * ld + j) * W, rec, sfmin):
                _divide_tiny(F, n, ld, j, sfmin)
            if j + 1 < n:
                pidx = _panel_step(F, n, ld, j, k1, rec, rows)
        if k1 < n:
            _trsm(F, n, ld, k0, k1)
            _gemm(F, n, ld, k0, k1)


# --- the factorization, complex (real parts F, imaginary parts G) ----------------------------------


@_jit
def _search_complex(F, G, n, ld, j, rows):
    W = 64 // F.itemsize
    o = (j * ld + j) * W
    best = vadd(vabs(vload(F, o)), vabs(vload(G, o)))
    pidx = vsplat(rows[j])
    for i in range(j + 1, n):
        o = (i * ld + j) * W
        m = vadd(vabs(vload(F, o)), vabs(vload(G, o)))
        pidx = vsel_gt(m, best, vsplat(rows[i]), pidx)
        best = vsel_gt(m, best, m, best)
    return pidx


@_jit
def _reciprocals_complex(F, G, d0, rec, rec_im, sfmin):
    """:func:`_reciprocals` of complex pivots (formed in complex128); a lane whose pivot is below
    ``sfmin`` or ``_cpu_numba.huge_pivot`` (1 / d would come out 0) divides instead, as it returns."""
    W = 64 // F.itemsize
    tiny = False
    for lane in range(W):
        d = complex(F[d0 + lane], G[d0 + lane])
        if d == 0:
            rec[lane] = 1
            rec_im[lane] = 0
        elif huge_pivot(d):
            rec[lane] = 1
            rec_im[lane] = 0
            tiny = True
        elif abs(d) >= sfmin:
            q = 1 / d
            rec[lane] = q.real
            rec_im[lane] = q.imag
        else:
            rec[lane] = 1
            rec_im[lane] = 0
            tiny = True
    return tiny


@_jit
def _divide_tiny_complex(F, G, n, ld, j, sfmin):
    """Rows below j of column j divided by the pivot, in the lanes whose nonzero pivot is below
    ``sfmin`` or ``_cpu_numba.huge_pivot``."""
    W = 64 // F.itemsize
    d0 = (j * ld + j) * W
    for lane in range(W):
        d = complex(F[d0 + lane], G[d0 + lane])
        huge = huge_pivot(d)
        if huge or (d != 0 and abs(d) < sfmin):
            for i in range(j + 1, n):
                o = (i * ld + j) * W + lane
                x = complex(F[o], G[o])
                q = huge_quotient(x, d) if huge else x / d
                F[o] = q.real
                G[o] = q.imag


@_inline
def _cfnma(ar, ai, br, bi, cr, ci):
    """``c - a * b`` for complex vectors given as real and imaginary parts."""
    return vfma(ai, bi, vfnma(ar, br, cr)), vfnma(ai, br, vfnma(ar, bi, ci))


@_jit
def _panel_step_complex(F, G, n, ld, j, k1, rec, rec_im, rows):
    W = 64 // F.itemsize
    d0 = (j * ld + j) * W
    rr = vload(rec, 0)
    ri = vload(rec_im, 0)
    pidx = vsplat(rows[j + 1])
    if j + 1 == k1:
        for i in range(j + 1, n):
            o = (i * ld + j) * W
            xr, xi = vload(F, o), vload(G, o)
            vstore(F, o, vfnma(xi, ri, vmul(xr, rr)))
            vstore(G, o, vfma(xr, ri, vmul(xi, rr)))
        return pidx
    ur, ui = vload(F, d0 + W), vload(G, d0 + W)
    best = vsub(rr, rr)
    for i in range(j + 1, n):
        o = (i * ld + j) * W
        xr, xi = vload(F, o), vload(G, o)
        lr = vfnma(xi, ri, vmul(xr, rr))
        li = vfma(xr, ri, vmul(xi, rr))
        vstore(F, o, lr)
        vstore(G, o, li)
        yr, yi = _cfnma(lr, li, ur, ui, vload(F, o + W), vload(G, o + W))
        vstore(F, o + W, yr)
        vstore(G, o + W, yi)
        m = vadd(vabs(yr), vabs(yi))
        if i == j + 1:
            best = m
        else:
            pidx = vsel_gt(m, best, vsplat(rows[i]), pidx)
            best = vsel_gt(m, best, m, best)
        for c in range(j + 2, k1):
            q = o + (c - j) * W
            p = d0 + (c - j) * W
            yr, yi = _cfnma(lr, li, vload(F, p), vload(G, p), vload(F, q), vload(G, q))
            vstore(F, q, yr)
            vstore(G, q, yi)
    return pidx


@_jit
def _trsm_complex(F, G, n, ld, k0, k1):
    W = 64 // F.itemsize
    for j in range(k0, k1):
        for i in range(j + 1, k1):
            o = (i * ld + j) * W
            lr, li = vload(F, o), vload(G, o)
            for c in range(k1, n):
                q = (i * ld + c) * W
                p = (j * ld + c) * W
                yr, yi = _cfnma(lr, li, vload(F, p), vload(G, p), vload(F, q), vload(G, q))
                vstore(F, q, yr)
                vstore(G, q, yi)


@_inline
def _cfnma4(ar, ai, F, G, p, W, c0r, c0i, c1r, c1i, c2r, c2i, c3r, c3i):
    """A row of a complex tile minus ``a`` times the four complex vectors from ``p`` on."""
    c0r, c0i = _cfnma(ar, ai, vload(F, p), vload(G, p), c0r, c0i)
    c1r, c1i = _cfnma(ar, ai, vload(F, p + W), vload(G, p + W), c1r, c1i)
    c2r, c2i = _cfnma(ar, ai, vload(F, p + 2 * W), vload(G, p + 2 * W), c2r, c2i)
    c3r, c3i = _cfnma(ar, ai, vload(F, p + 3 * W), vload(G, p + 3 * W), c3r, c3i)
    return c0r, c0i, c1r, c1i, c2r, c2i, c3r, c3i


@_jit
def _gemm_complex(F, G, n, ld, k0, k1):
    """:func:`_gemm` in complex arithmetic, tiles of 2 x 4 complex vectors."""
    W = 64 // F.itemsize
    m2 = k1 + (n - k1) // 2 * 2
    m4 = k1 + (n - k1) // 4 * 4
    for i in range(k1, m2, 2):
        r0 = i * ld * W
        r1 = r0 + ld * W
        for c in range(k1, m4, 4):
            o0 = r0 + c * W
            o1 = r1 + c * W
            c00r, c01r, c02r, c03r = _load4(F, o0, W)
            c00i, c01i, c02i, c03i = _load4(G, o0, W)
            c10r, c11r, c12r, c13r = _load4(F, o1, W)
            c10i, c11i, c12i, c13i = _load4(G, o1, W)
            for k in range(k0, k1):
                kb = (k * ld + c) * W
                c00r, c00i, c01r, c01i, c02r, c02i, c03r, c03i = _cfnma4(
                    vload(F, r0 + k * W), vload(G, r0 + k * W), F, G, kb, W,
                    c00r, c00i, c01r, c01i, c02r, c02i, c03r, c03i)
                c10r, c10i, c11r, c11i, c12r, c12i, c13r, c13i = _cfnma4(
                    vload(F, r1 + k * W), vload(G, r1 + k * W), F, G, kb, W,
                    c10r, c10i, c11r, c11i, c12r, c12i, c13r, c13i)
            _store4(F, o0, W, c00r, c01r, c02r, c03r)
            _store4(G, o0, W, c00i, c01i, c02i, c03i)
            _store4(F, o1, W, c10r, c11r, c12r, c13r)
            _store4(G, o1, W, c10i, c11i, c12i, c13i)
    for i in range(k1, n):
        for c in range(m4 if i < m2 else k1, n):
            o = (i * ld + c) * W
            accr, acci = vload(F, o), vload(G, o)
            for k in range(k0, k1):
                p = (i * ld + k) * W
                q = (k * ld + c) * W
                accr, acci = _cfnma(vload(F, p), vload(G, p), vload(F, q), vload(G, q), accr, acci)
            vstore(F, o, accr)
            vstore(G, o, acci)


@_jit
def _factor_complex(F, G, n, ld, piv, tmp, rec, rec_im, rows, sfmin, nb=NB):
    W = 64 // F.itemsize
    for k0 in range(0, n, nb):
        k1 = min(n, k0 + nb)
        pidx = _search_complex(F, G, n, ld, k0, rows)
        for j in range(k0, k1):
            vstore(tmp, 0, pidx)
            _swap_rows(F, n, ld, j, tmp, piv)
            _swap_rows(G, n, ld, j, tmp, piv)
            if _reciprocals_complex(F, G, (j * ld + j) * W, rec, rec_im, sfmin):
                _divide_tiny_complex(F, G, n, ld, j, sfmin)
            if j + 1 < n:
                pidx = _panel_step_complex(F, G, n, ld, j, k1, rec, rec_im, rows)
        if k1 < n:
            _trsm_complex(F, G, n, ld, k0, k1)
            _gemm_complex(F, G, n, ld, k0, k1)


# --- kernels over a range of the batch ----------------------------------------------------------
# As the other compiled kernels (``batchlu.kernels._cpu_numba``): outputs from the caller, matrices
# lo .. hi - 1, scratch allocated once per range; ``info`` with ``batchlu.kernels._info``'s rule.


@_jit
def _first_zero_pivot(F, G, n, ld, lane):
    W = 64 // F.itemsize
    for i in range(n):
        o = (i * ld + i) * W + lane
        if F[o] == 0 and (G.size == 0 or G[o] == 0):
            return i + 1
    return 0


@_jit
def _check_input(F, G, n, ld, tmp, bad):
    """``bad[lane]``: the matrix in that lane holds NaN or Inf; it is replaced by the identity."""
    W = 64 // F.itemsize
    _lanes_finite(F, n * ld, tmp)
    for lane in range(W):
        bad[lane] = tmp[lane] != 0
    if G.size:
        _lanes_finite(G, n * ld, tmp)
        for lane in range(W):
            bad[lane] |= tmp[lane] != 0
    for lane in range(W):
        if bad[lane]:
            _set_identity(F, n, ld, lane)
            if G.size:
                for r in range(n):
                    for c in range(n):
                        G[(r * ld + c) * W + lane] = 0.0


@_jit
def _finish_getrf(F, G, n, ld, g, cnt, pv, tmp, bad, lu, piv, info):
    """``piv`` and ``info`` of the group's matrices (``tmp``: :func:`_lanes_finite` of the
    factors), and NaN ``lu`` for the non-finite inputs."""
    W = 64 // F.itemsize
    for lane in range(cnt):
        b = g + lane
        if bad[lane]:
            info[b] = INFO_NONFINITE_INPUT
            for r in range(n):
                piv[b, r] = r
                for c in range(n):
                    lu[b, r, c] = np.nan
            continue
        for r in range(n):
            piv[b, r] = pv[r * W + lane]
        code = _first_zero_pivot(F, G, n, ld, lane)
        if code == 0 and tmp[lane] != 0:
            code = INFO_NONFINITE_RESULT
        info[b] = code


@_jit
def _workspace(x, n, complex_):
    """One thread's buffers for groups of W matrices of order n (``x``: the flat real input): lane
    count W, row stride ld, the factors F (real parts) and G (imaginary parts; empty for real
    matrices), per-lane scratch tmp, rec and rec_im, pivots, row numbers, and the bad-input flags."""
    W = 64 // x.itemsize
    ld = n + 1
    F = _aligned(n * ld * W, x)
    G = _aligned(n * ld * W, x) if complex_ else F[:0]
    tmp, rec, rec_im = _aligned(W, x), _aligned(W, x), _aligned(W if complex_ else 0, x)
    pv = np.empty(n * W, np.int32)
    rows = np.arange(n).astype(x.dtype)
    bad = np.zeros(W, np.bool_)
    return W, ld, F, G, tmp, rec, rec_im, pv, rows, bad


@_jit
def _getrf_real(af, lu, luf, piv, info, sfmin, lo, hi):
    n = lu.shape[-1]
    W, ld, F, G, tmp, rec, _, pv, rows, bad = _workspace(af, n, False)
    for g in range(lo, hi, W):
        cnt = min(W, hi - g)
        _gather(af, g, cnt, F, n, ld)
        _check_input(F, G, n, ld, tmp, bad)
        _factor(F, n, ld, pv, tmp, rec, rows, sfmin)
        _lanes_finite(F, n * ld, tmp)
        _scatter(F, luf, g, cnt, n, ld)
        _finish_getrf(F, G, n, ld, g, cnt, pv, tmp, bad, lu, piv, info)


@_jit
def _getrf_complex(ar, lu, lur, piv, info, sfmin, lo, hi):
    n = lu.shape[-1]
    W, ld, F, G, tmp, rec, rec_im, pv, rows, bad = _workspace(ar, n, True)
    for g in range(lo, hi, W):
        cnt = min(W, hi - g)
        _gather_complex(ar, g, cnt, F, G, n, ld)
        _check_input(F, G, n, ld, tmp, bad)
        _factor_complex(F, G, n, ld, pv, tmp, rec, rec_im, rows, sfmin)
        _lanes_finite(F, n * ld, rec)
        _lanes_finite(G, n * ld, tmp)
        for lane in range(W):
            tmp[lane] += rec[lane]
        _scatter_complex(F, G, lur, g, cnt, n, ld)
        _finish_getrf(F, G, n, ld, g, cnt, pv, tmp, bad, lu, piv, info)


@_jit
def _finish_slogdet(F, n, ld, g, cnt, pv, bad, sign, logabsdet, info):
    """Sign and log|det| of the group's real matrices from their factors."""
    W = 64 // F.itemsize
    for lane in range(cnt):
        code = INFO_NONFINITE_INPUT if bad[lane] else _first_zero_pivot(F, F[:0], n, ld, lane)
        s = 1.0
        total = 0.0
        if code == 0:
            for i in range(n):
                d = F[(i * ld + i) * W + lane]
                m = abs(d)
                s = s * (d / m)
                total += np.log(m)
                if pv[i * W + lane] != i:
                    s = -s
        store_slogdet(g + lane, code, s, total, sign, logabsdet, info)


@_jit
def _finish_slogdet_complex(F, G, n, ld, g, cnt, pv, bad, sign, logabsdet, info):
    """:func:`_finish_slogdet` of complex matrices."""
    W = 64 // F.itemsize
    for lane in range(cnt):
        code = INFO_NONFINITE_INPUT if bad[lane] else _first_zero_pivot(F, G, n, ld, lane)
        s = 1.0 + 0j
        total = 0.0
        if code == 0:
            for i in range(n):
                o = (i * ld + i) * W + lane
                d = complex(F[o], G[o])
                m = abs(d)
                s = s * (d / m)
                total += np.log(m)
                if pv[i * W + lane] != i:
                    s = -s
        store_slogdet(g + lane, code, s, total, sign, logabsdet, info)


@_jit
def _slogdet_real(af, n, sign, logabsdet, info, sfmin, lo, hi):
    W, ld, F, G, tmp, rec, _, pv, rows, bad = _workspace(af, n, False)
    for g in range(lo, hi, W):
        cnt = min(W, hi - g)
        _gather(af, g, cnt, F, n, ld)
        _check_input(F, G, n, ld, tmp, bad)
        _factor(F, n, ld, pv, tmp, rec, rows, sfmin)
        _finish_slogdet(F, n, ld, g, cnt, pv, bad, sign, logabsdet, info)


@_jit
def _slogdet_complex(ar, n, sign, logabsdet, info, sfmin, lo, hi):
    W, ld, F, G, tmp, rec, rec_im, pv, rows, bad = _workspace(ar, n, True)
    for g in range(lo, hi, W):
        cnt = min(W, hi - g)
        _gather_complex(ar, g, cnt, F, G, n, ld)
        _check_input(F, G, n, ld, tmp, bad)
        _factor_complex(F, G, n, ld, pv, tmp, rec, rec_im, rows, sfmin)
        _finish_slogdet_complex(F, G, n, ld, g, cnt, pv, bad, sign, logabsdet, info)


# --- entry points --------------------------------------------------------------------------------


def lanes(dtype) -> int:
    """Matrices factored together (one vector's lanes) for ``dtype``."""
    return 64 // np.dtype(dtype).type(0).real.dtype.itemsize


def _flat_real(x):
    return x.view(x.real.dtype).reshape(-1)


def getrf(a, lu, piv, info) -> None:
    """``lu``, 0-based ``piv`` and ``info`` of every matrix of ``a`` (B, n, n), as
    ``batchlu.kernels._cpu_numba.getrf``."""
    from . import _cpu_threads

    sfmin = float(np.finfo(a.dtype).tiny)
    kernel = _getrf_complex if a.dtype.kind == "c" else _getrf_real
    _cpu_threads.run(kernel, a.shape[0], a.shape[-1], _flat_real(a), lu, _flat_real(lu), piv, info,
                     sfmin, align=lanes(a.dtype))


def slogdet(a, sign, logabsdet, info) -> None:
    """Sign and log|det| of every matrix of ``a``, as ``batchlu.kernels._cpu_numba.slogdet``."""
    from . import _cpu_threads

    sfmin = float(np.finfo(a.dtype).tiny)
    kernel = _slogdet_complex if a.dtype.kind == "c" else _slogdet_real
    _cpu_threads.run(kernel, a.shape[0], a.shape[-1], _flat_real(a), a.shape[-1], sign, logabsdet, info,
                     sfmin, align=lanes(a.dtype))
