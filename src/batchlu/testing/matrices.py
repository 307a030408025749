"""Test matrices and right-hand sides, reproducible per (seed, matrix index).

Matrix ``i`` of a collection depends only on ``(kind, n, real or complex, seed, i)``, never on the
range asked for, so any chunk ``[start, stop)`` of a huge collection can be made on its own and
``generate(..., start=0, stop=100)`` equals the concatenation of ``[0, 37)`` and ``[37, 100)``.

Matrices are drawn in blocks of a fixed number of matrices (about 2**18 entries per block), each block
from its own :class:`numpy.random.PCG64` stream keyed by ``(seed, kind, n, block)``; a chunk draws the
blocks it overlaps and slices them. Entries are drawn in float64/complex128 and rounded to the requested
dtype, so float32 and float64 collections with the same seed hold the same matrices up to rounding.

Kinds:

``random``
    entries uniform in [-1, 1) (real and imaginary parts independently for complex types).
``illcond``
    ``U diag(s) V^H`` with Haar-random unitary ``U``, ``V`` and singular values ``s`` log-spaced from
    1 down to ``1/cond``: 2-norm condition number ``cond`` = 1e12 for float64/complex128, 1e5 for
    float32/complex64 (about the same share of each precision's digits).
``singular-mix``
    ``random`` matrices where, by global index ``i``: ``i % 7 == 6`` has one exactly zero column
    (exactly singular: ``info > 0``), ``i % 11 == 10`` is all zero (``info == 1``), ``i % 13 == 12``
    holds one NaN and ``i % 17 == 16`` one +-Inf (``info == -1``); later rules win where they overlap.
"""

from __future__ import annotations

import numpy as np

from batchlu.errors import ConfigError, InputError

from ..kernels._validate import check_dtype


__all__ = ["KINDS", "generate", "illcond_target", "rhs", "singular_mix_masks",
           "subnormal_first_column"]

KINDS = ("random", "illcond", "singular-mix")
_KIND_CODE = {"random": 1, "illcond": 2, "singular-mix": 1, "rhs": 3}
_BLOCK_ENTRIES = 1 << 18

# singular-mix: (period, what); index i gets `what` when i % period == period - 1.
_SINGULAR_EVERY, _ZERO_EVERY, _NAN_EVERY, _INF_EVERY = 7, 11, 13, 17


def illcond_target(dtype) -> float:
    """The 2-norm condition number of ``illcond`` matrices in ``dtype``."""
    return 1e12 if np.dtype(dtype) in (np.float64, np.complex128) else 1e5


def _check_range(start: int, stop: int) -> tuple[int, int]:
    start, stop = int(start), int(stop)
    if start < 0 or stop < start:
        raise InputError(f"Expected 0 <= start <= stop. Got start={start}, stop={stop} instead.")
    return start, stop


def _check_n(n: int, what: str = "n") -> int:
    n = int(n)
    if n < 0:
        raise InputError(f"Expected {what} >= 0. Got {what}={n} instead.")
    return n


def _stream(seed: int, code: int, n: int, k: int, complex_: bool, block: int) -> np.random.Generator:
    key = np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFFFFFF, code, n, k, int(complex_), block])
    return np.random.Generator(np.random.PCG64(key))


def _blocks(draw, out: np.ndarray, per_matrix: int, start: int, seed: int, code: int, n: int,
            k: int, complex_: bool) -> np.ndarray:
    """Fill ``out`` (items start .. start+len(out)) from ``draw(rng, count)`` over the fixed blocks."""
    stop = start + out.shape[0]
    size = max(1, _BLOCK_ENTRIES // max(1, per_matrix))
    for block in range(start // size, -(-stop // size)):
        lo, hi = block * size, (block + 1) * size
        values = draw(_stream(seed, code, n, k, complex_, block), size)
        first, last = max(start, lo), min(stop, hi)
        out[first - start: last - start] = values[first - lo: last - lo]
    return out


def _uniform(rng: np.random.Generator, shape: tuple, complex_: bool) -> np.ndarray:
    if complex_:
        z = rng.uniform(-1.0, 1.0, shape + (2,))
        return z[..., 0] + 1j * z[..., 1]
    return rng.uniform(-1.0, 1.0, shape)


def _haar(rng: np.random.Generator, count: int, n: int, complex_: bool) -> np.ndarray:
    """Haar-random orthogonal/unitary matrices (count, n, n): QR of Gaussians, phases fixed by R."""
    g = rng.standard_normal((count, n, n))
    if complex_:
        g = g + 1j * rng.standard_normal((count, n, n))
    q, r = np.linalg.qr(g)
    d = np.diagonal(r, axis1=-2, axis2=-1)
    phase = np.where(d == 0, 1, d / np.where(d == 0, 1, np.abs(d)))
    return q * phase[:, None, :]


def _draw_illcond(n: int, complex_: bool, cond: float):
    s = np.logspace(0.0, -np.log10(cond), n) if n > 1 else np.ones(n)

    def draw(rng, count):
        u = _haar(rng, count, n, complex_)
        v = _haar(rng, count, n, complex_)
        return (u * s[None, None, :]) @ np.conj(np.swapaxes(v, -1, -2))
    return draw


def singular_mix_masks(start: int, stop: int) -> dict[str, np.ndarray]:
    """Which matrices of ``singular-mix`` in [start, stop) are ``singular``, ``zero``, ``nan``, ``inf``.

    Masks are exclusive (later rules win, as in :func:`generate`); ``singular`` is exactly singular
    with nonzero entries, so ``info > 0`` for ``singular`` and ``zero``, -1 for ``nan`` and ``inf``.
    """
    start, stop = _check_range(start, stop)
    i = np.arange(start, stop, dtype=np.int64)
    inf = i % _INF_EVERY == _INF_EVERY - 1
    nan = (i % _NAN_EVERY == _NAN_EVERY - 1) & ~inf
    zero = (i % _ZERO_EVERY == _ZERO_EVERY - 1) & ~inf & ~nan
    singular = (i % _SINGULAR_EVERY == _SINGULAR_EVERY - 1) & ~inf & ~nan & ~zero
    return {"singular": singular, "zero": zero, "nan": nan, "inf": inf}


def _spoil(a: np.ndarray, start: int) -> None:
    """Apply the singular-mix rules in place to ``a`` holding matrices [start, start + len(a))."""
    count, n = a.shape[0], a.shape[-1]
    if count == 0 or n == 0:
        return
    masks = singular_mix_masks(start, start + count)
    i = np.arange(start, start + count, dtype=np.int64)
    rows = np.arange(count)
    # A zero column stays exactly zero through elimination, so U has an exact zero pivot there.
    sing = np.flatnonzero(masks["singular"])
    a[sing, :, (i[sing] // _SINGULAR_EVERY) % n] = 0
    a[masks["zero"]] = 0
    where = (i * 31) % (n * n)
    nan = rows[masks["nan"]]
    a[nan, where[nan] // n, where[nan] % n] = np.nan
    inf = rows[masks["inf"]]
    a[inf, where[inf] // n, where[inf] % n] = np.where(i[inf] % 2 == 0, np.inf, -np.inf)


def generate(kind: str, n: int, dtype="float64", *, seed: int = 0, start: int = 0,
             stop: int) -> np.ndarray:
    """Matrices ``start .. stop-1`` of the collection ``(kind, n, dtype, seed)``: (stop-start, n, n).

    C-contiguous, of ``dtype`` (float32, float64, complex64 or complex128).
    """
    if kind not in KINDS:
        raise ConfigError(f"Expected kind to be one of {', '.join(KINDS)}. Got {kind!r} instead.")
    dtype = check_dtype(dtype, "the matrices")
    n = _check_n(n)
    start, stop = _check_range(start, stop)
    complex_ = dtype.kind == "c"
    if stop == start or n == 0:
        return np.zeros((stop - start, n, n), dtype)
    if kind == "illcond":
        draw = _draw_illcond(n, complex_, illcond_target(dtype))
        # QR of two n x n Gaussians per matrix: keep blocks smaller than for plain draws.
        per_matrix = 4 * n * n
    else:
        def draw(rng, count):
            return _uniform(rng, (count, n, n), complex_)
        per_matrix = n * n
    a = _blocks(draw, np.empty((stop - start, n, n), dtype), per_matrix, start, seed,
                _KIND_CODE[kind], n, 0, complex_)
    if kind == "singular-mix":
        _spoil(a, start)
    return a


def subnormal_first_column(n: int, dtype="float64", *, seed: int = 0, start: int = 0,
                           stop: int) -> np.ndarray:
    """``random`` matrices ``start .. stop-1`` with column 0 scaled by 2^(minexp - 12), into the
    subnormal range: the first pivot is nonzero but below sfmin, where LAPACK divides the column by
    it instead of multiplying by its reciprocal (which would overflow)."""
    a = generate("random", n, dtype, seed=seed, start=start, stop=stop)
    a[:, :, 0] *= 2.0 ** (np.finfo(a.dtype).minexp - 12)
    return a


def rhs(n: int, k: int | None, dtype="float64", *, seed: int = 0, start: int = 0,
        stop: int) -> np.ndarray:
    """Right-hand sides ``start .. stop-1``: (stop-start, n, k), or (stop-start, n) when ``k`` is None.

    Entries uniform in [-1, 1), reproducible per (seed, n, k, index) as for :func:`generate`, and
    drawn from streams separate from the matrices'.
    """
    dtype = check_dtype(dtype, "the right-hand sides")
    n = _check_n(n)
    cols = 1 if k is None else _check_n(k, "k")
    start, stop = _check_range(start, stop)
    complex_ = dtype.kind == "c"
    shape = (n,) if k is None else (n, cols)
    if stop == start or n == 0 or cols == 0:
        return np.zeros((stop - start,) + shape, dtype)

    def draw(rng, count):
        return _uniform(rng, (count,) + shape, complex_)
    return _blocks(draw, np.empty((stop - start,) + shape, dtype), n * cols, start, seed,
                   _KIND_CODE["rhs"], n, 0 if k is None else cols + 1, complex_)
