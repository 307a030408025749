"""NumPy backend: LU, solve, inverse and log-determinant of each matrix with per-matrix ``info``.

Two engines compute the same LAPACK factorization (``lu`` and ``piv`` mean what ``xGETRF`` returns,
``piv`` 0-based):

- **compiled** (``batchlu.kernels._cpu_numba``, wherever numba is importable): one compiled loop over
  the batch per op, split between threads (``batchlu.kernels._cpu_threads``). ``getrf`` and
  ``slogdet`` for n in ``COMPILED_LANES_N``: the lane LU (``batchlu.kernels._cpu_lanes``), which
  factors W matrices at once, one per SIMD lane (``lu`` equal to SciPy's to rounding). From the crossover
  ``COMPILED_LAPACK_MIN_N[op]`` on it calls LAPACK through SciPy's ``cython_lapack`` function
  pointers (``lu`` and ``piv`` bit-identical to ``scipy.linalg.lu_factor``; ``inv`` is ``xGETRI``,
  ``solve`` ``xGETRS``); below, where a LAPACK call costs more than the arithmetic, LAPACK's
  unblocked ``xGETF2`` and ``xGETRS``'s substitutions compiled by numba. ``getrf``, ``inv``,
  ``solve`` and ``slogdet`` apply ``batchlu.kernels._info``'s -2 rule in the loop
  (``flags_results``).
- **numpy** (the fallback: numba not importable, or ``BATCHLU_CPU_ENGINE=numpy``): from
  ``NUMPY_LAPACK_MIN_N`` on, LAPACK through SciPy's Python wrappers, one call per matrix
  (``batchlu.kernels._cpu_lapack``); below, LAPACK's algorithm re-written in NumPy and vectorised
  over the batch (``batchlu.kernels._cpu_vectorised``); ``inv`` there is ``numpy.linalg.inv`` on the
  matrices with info == 0. Measured (best of 5 wall times; 2 busy cores, ``OPENBLAS_NUM_THREADS=1``,
  batches of 2000): the two break even at n = 9-10 for ``getrf`` in all four dtypes.

One exception to the size rule in both: OpenBLAS's ``xGETRF`` loses subnormal intermediates, so a
matrix with a nonzero entry below ``tiny / eps`` (~2e-292 in float64), or whose LAPACK ``U`` has a
subnormal pivot, is factored by the engine's own LU, which follows reference LAPACK there. So is a
complex matrix whose ``U`` has a pivot with both parts nonzero and one above half the largest float:
OpenBLAS's reciprocal of it (as NumPy's and numba's complex division) forms ``|d|^2 / max(|re|,
|im|)``, which overflows, and comes out 0, leaving a column of ``L`` zero and finite, wrong factors;
the engines' own LU divides by a pivot with a part above a quarter of the largest float (a margin
for rounding), both scaled by a power of two (exact). The solves and
inverses from such factors stay off OpenBLAS's ``xGETRS`` / ``xGETRI`` too.

Functions take arrays normalised by ``batchlu.kernels._api``: C-contiguous (B, n, n), a supported dtype,
B >= 1, n >= 1. Matrices holding NaN or Inf are set aside up front (``info == -1``, NaN results,
identity ``piv``) so they never touch their neighbours' arithmetic, and are never handed to LAPACK.
Results are in the input dtype.
"""

from __future__ import annotations

import contextlib
import os
import threading

import numpy as np

from batchlu.errors import ConfigError, DependencyError, InputError

from . import _cpu_lapack, _cpu_vectorised
from ._info import INFO_NONFINITE_RESULT


__all__ = ["compiled_available", "flags_results", "getrf", "getrs", "inv", "lanes_range", "lapack_min_n",
           "slogdet", "solve"]

# Crossovers: LAPACK from this n on, the engine's own LU below. LAPACK_MIN_N, when set (tests,
# experiments), overrides every op of both engines.
LAPACK_MIN_N: int | None = None
NUMPY_LAPACK_MIN_N = 10     # NumPy engine: one LAPACK call per matrix beats the vectorised LU here
# Compiled engine, per op and dtype (float32, float64, complex64, complex128): the first n where LAPACK
# through function pointers is as fast as the compiled xGETF2 on one thread, measured with
# benchmarks/bench_cpu_crossover.py on the 2-core development machine (docs/design.md, CPU backend).
# getrs (lu_solve) keeps getrf's LAPACK crossover, so that lu_solve is SciPy's bit for bit from it on
# given the same factors (measured with one right-hand side, the compiled substitutions are within
# 10% of LAPACK's to n = 128).
COMPILED_LAPACK_MIN_N = {
    "getrf": (28, 32, 24, 24),
    "getrs": (28, 32, 24, 24),
    "inv": (32, 40, 16, 16),
    "solve": (24, 32, 24, 24),
    "slogdet": (24, 28, 24, 24),
}
# Compiled engine, getrf and slogdet: the batched LU that factors W matrices at once, one per SIMD
# lane (batchlu.kernels._cpu_lanes), for n in [first, last] per dtype: where it is faster than both
# of the above on one thread, measured with benchmarks/bench_cpu_crossover.py --lanes on the 2-core
# development machine (docs/design.md, CPU backend). Outside that range, the crossover above.
COMPILED_LANES_N = {
    "getrf": ((2, 384), (4, 384), (5, 384), (8, 384)),
    "slogdet": ((2, 320), (4, 256), (5, 256), (8, 320)),
}
# Override (tests, experiments): the lane LU for getrf and slogdet at every n from this one on.
# While LAPACK_MIN_N is set and this is not, the lane LU never runs (A/B timings of the other two).
LANES_MIN_N: int | None = None
_NEVER = 1 << 62
_DTYPE_INDEX = {"f": 0, "d": 1, "F": 2, "D": 3}
ENGINE_ENV = "BATCHLU_CPU_ENGINE"   # "numpy": the NumPy engines even where numba is importable
_CHUNK_ENTRIES = 1 << 19    # matrices per pass ~ this many entries, to bound the temporaries
_CHUNK_MIN = 16             # ... but at least this many, so Python's per-step cost stays shared


_COMPILED = None   # the module batchlu.kernels._cpu_numba once imported, or why it could not be


def compiled_available() -> bool:
    """Whether the compiled engine can run here (numba importable), importing it on the first call."""
    global _COMPILED
    if _COMPILED is None:
        try:
            from . import _cpu_numba
        except (ImportError, OSError) as exc:   # OSError: llvmlite's library failed to load
            _COMPILED = f"{type(exc).__name__}: {exc}"
        else:
            _COMPILED = _cpu_numba
    return not isinstance(_COMPILED, str)


def _compiled():
    """The compiled engine (``batchlu.kernels._cpu_numba``), or None: the NumPy engine runs, because
    numba is not importable or ``BATCHLU_CPU_ENGINE=numpy``. Imported on first use, never at
    ``import batchlu``; ``BATCHLU_CPU_ENGINE=compiled`` insists on it."""
    choice = os.environ.get(ENGINE_ENV, "").strip().lower()
    if choice == "numpy":
        return None
    if choice not in ("", "compiled"):
        raise ConfigError(f"Expected {ENGINE_ENV} to be 'compiled' or 'numpy'. Got {choice!r} instead.")
    if compiled_available():
        return _COMPILED
    if choice == "compiled":
        raise DependencyError(f"Expected numba to be importable for {ENGINE_ENV}=compiled. "
                              f"Got {_COMPILED} instead.")
    return None


_ON_DEMAND = threading.local()


@contextlib.contextmanager
def numba_on_demand():
    """Inside this block (this thread), ``inv`` and ``solve`` where the compiled engine would call
    LAPACK (n from its crossover on) give the compiled engine's results bit for bit without loading
    numba when they can: the NumPy engine makes the same LAPACK calls (``xGETRF`` then ``xGETRI`` or
    ``xGETRS``), and the matrices the compiled engine treats otherwise (see :func:`_numba_on_demand`)
    are computed again by it, numba loaded then. Loading numba's compiled code costs ~0.5 s in a
    fresh process (its typing and target registries); a small CPU run of the pipeline would spend
    most of its warm-up there. Outside the block, and once numba is loaded, the engines run as
    always. The pipeline's CPU tasks compute inside it: their threads already share the batches, so
    the compiled engine's own threads bring nothing there."""
    previous = getattr(_ON_DEMAND, "on", False)
    _ON_DEMAND.on = True
    try:
        yield
    finally:
        _ON_DEMAND.on = previous


def _deferring() -> bool:
    """Inside :func:`numba_on_demand`, with numba not asked for yet and no engine forced."""
    return (getattr(_ON_DEMAND, "on", False) and _COMPILED is None and LAPACK_MIN_N is None
            and not os.environ.get(ENGINE_ENV, "").strip())


def _deferred(op: str, a: np.ndarray) -> bool:
    """Whether ``op`` (inv, solve) on ``a`` is computed by :func:`_numba_on_demand`."""
    return _deferring() and a.shape[-1] >= max(COMPILED_LAPACK_MIN_N[op][_DTYPE_INDEX[a.dtype.char]],
                                               NUMPY_LAPACK_MIN_N)


def _numba_on_demand(op: str, a: np.ndarray, b: np.ndarray | None = None):
    """``inv(a)`` or ``solve(a, b)`` as the compiled engine computes them, for n in its LAPACK range:
    the NumPy engine's results (the same LAPACK calls on the same matrices), except for the
    matrices the compiled engine does not hand to LAPACK's ``xGETRF`` / ``xGETRI`` / ``xGETRS`` or
    whose results it flags: a non-finite input or right-hand side, a nonzero part below
    ``tiny / eps``, a factor ``U`` with a nonzero diagonal entry below ``tiny`` or (complex) a part
    above a quarter of the largest float, a zero pivot, a result that is not finite. Those are
    computed again by the compiled engine (numba loaded then), on their own: its result for a
    matrix does not depend on the batch around it. Where numba cannot load, the NumPy engine's
    results stand, as they do without numba."""
    count, n = a.shape[0], a.shape[-1]
    with _cpu_lapack.one_blas_thread():   # as the compiled engine calls LAPACK: threaded OpenBLAS rounds otherwise
        lu, piv, info = _getrf_numpy(a, np.empty_like(a), np.empty((count, n), np.int32), np.empty(count, np.int32))
        out, info = _inv_numpy(a, lu, piv, info) if op == "inv" else _solve_numpy(a, b, lu, piv, info)
    finite, fit = _screen(a)
    d = np.diagonal(lu, axis1=-2, axis2=-1)
    m = np.abs(d)
    redo = ~(finite & fit) | (info != 0) | np.any((m != 0) & (m < np.finfo(m.dtype).tiny), axis=1)
    if d.dtype.kind == "c":
        redo |= np.any(np.maximum(np.abs(d.real), np.abs(d.imag)) > np.finfo(m.dtype).max / 4, axis=1)
    redo |= ~_finite(out.reshape(count, -1, 1))
    if b is not None:
        redo |= ~_finite(b.reshape(count, -1, 1))
    if redo.any() and compiled_available():
        sel = np.flatnonzero(redo)
        again = inv(a[sel]) if op == "inv" else solve(a[sel], np.ascontiguousarray(b[sel]))
        out[sel], info[sel] = again
    return out, info


def _lanes():
    """The compiled engine's lane LU (``batchlu.kernels._cpu_lanes``), imported with numba."""
    from . import _cpu_lanes

    return _cpu_lanes


def flags_results() -> bool:
    """Whether ``getrf``, ``inv``, ``solve`` and ``slogdet`` return ``info`` with
    ``batchlu.kernels._info``'s rule already applied (the compiled engine applies it as it writes
    the results), so that the API skips its own passes over them."""
    if _deferring():   # not loaded for this: the API applies the rule (again: it changes nothing)
        return False
    return _compiled() is not None


def lapack_min_n(op: str, dtype) -> int:
    """The active engine's crossover for ``op`` (getrf, getrs, inv, solve, slogdet) and ``dtype``:
    LAPACK from this n on, the engine's own LU below."""
    if LAPACK_MIN_N is not None:
        return LAPACK_MIN_N
    if _compiled() is None:
        return NUMPY_LAPACK_MIN_N
    return COMPILED_LAPACK_MIN_N[op][_DTYPE_INDEX[np.dtype(dtype).char]]


def lanes_range(op: str, dtype) -> tuple[int, int]:
    """The n (first, last) for which the compiled engine runs ``op`` (getrf, slogdet) on its lane
    LU; an empty range for the other ops, for the NumPy engine, and while ``LAPACK_MIN_N`` alone is
    set."""
    if op not in COMPILED_LANES_N or _compiled() is None:
        return _NEVER, 0
    if LANES_MIN_N is not None:
        return LANES_MIN_N, _NEVER
    if LAPACK_MIN_N is not None:
        return _NEVER, 0
    return COMPILED_LANES_N[op][_DTYPE_INDEX[np.dtype(dtype).char]]


def _on_lanes(op: str, dtype, n: int) -> bool:
    first, last = lanes_range(op, dtype)
    return first <= n <= last


def _engine(n: int):
    """The NumPy engine's module for n."""
    return _cpu_lapack if n >= (NUMPY_LAPACK_MIN_N if LAPACK_MIN_N is None else LAPACK_MIN_N) \
        else _cpu_vectorised


def _chunks(count: int, per_matrix: int):
    """Slices of the batch, one per pass."""
    step = max(_CHUNK_MIN, _CHUNK_ENTRIES // max(1, per_matrix))
    for lo in range(0, count, step):
        yield slice(lo, min(count, lo + step))


def _finite(a: np.ndarray) -> np.ndarray:
    return np.isfinite(a).all(axis=(-2, -1))


def _screen(a: np.ndarray):
    """Per matrix: finite (no NaN or Inf), and fit for LAPACK: no nonzero entry (real or imaginary
    part) below ``tiny / eps``. One pass over ``|a|`` answers both.

    OpenBLAS's ``xGETRF`` loses subnormal intermediates (measured: get01 ratios ~1e14 and spurious
    zero pivots on float64 matrices scaled to ~1e-295, where the vectorised LU, which follows
    reference LAPACK's ``xGETF2``, passes), so matrices that reach that range stay with NumPy.
    """
    real = a.dtype.type(0).real.dtype
    m = np.abs(a.view(real).reshape(a.shape[0], -1))
    finite = m.max(axis=1) <= np.finfo(real).max     # NaN compares False
    small = np.finfo(real).tiny / np.finfo(real).eps
    fit = m.min(axis=1) >= small
    closer = np.flatnonzero(~fit & finite)           # zeros are fine: look again at these only
    if closer.size:
        rows = m[closer]
        fit[closer] = ~np.any((rows < small) & (rows != 0), axis=1)
    return finite, fit


def _factor_rows(engine, work: np.ndarray, piv: np.ndarray, rows: np.ndarray) -> None:
    """``engine.factor`` on the matrices of ``work`` picked by the mask ``rows``, in place."""
    if rows.all():
        engine.factor(work, piv)
    elif rows.any():
        sel = np.flatnonzero(rows)
        sub, sub_piv = work[sel], piv[sel]
        engine.factor(sub, sub_piv)
        work[sel], piv[sel] = sub, sub_piv


def _unsafe_pivot(lu: np.ndarray) -> np.ndarray:
    """Per matrix: a diagonal entry of ``lu`` that OpenBLAS scales by a wrong reciprocal: nonzero
    below ``tiny`` (subnormal; the reciprocal overflows), or complex with a part above a quarter of the
    largest float (``_cpu_vectorised.huge``: from half of it on, the reciprocal comes out 0)."""
    d = np.diagonal(lu, axis1=-2, axis2=-1)
    m = np.abs(d)
    return np.any(((m != 0) & (m < np.finfo(m.dtype).tiny)) | _cpu_vectorised.huge(d), axis=1)


def _substitute_rows(engine, lu, piv, b, x, rows: np.ndarray) -> None:
    """``x = engine.substitute(lu, piv, b)`` on the matrices picked by the mask ``rows``."""
    if rows.all():
        x[...] = engine.substitute(lu, piv, b)
    elif rows.any():
        sel = np.flatnonzero(rows)
        x[sel] = engine.substitute(lu[sel], piv[sel], b[sel])


def getrf(a: np.ndarray):
    """LU with partial pivoting of each matrix: ``lu`` (B, n, n), ``piv`` (B, n) int32, ``info`` (B,)."""
    count, n = a.shape[0], a.shape[-1]
    lu = np.empty_like(a)
    piv = np.empty((count, n), np.int32)
    info = np.empty(count, np.int32)
    compiled = _compiled()
    if compiled is not None:
        if _on_lanes("getrf", a.dtype, n):
            _lanes().getrf(a, lu, piv, info)
        else:
            compiled.getrf(a, lu, piv, info, lapack_min_n("getrf", a.dtype))
        return lu, piv, info
    return _getrf_numpy(a, lu, piv, info)


def _getrf_numpy(a: np.ndarray, lu: np.ndarray, piv: np.ndarray, info: np.ndarray):
    """The NumPy engine's :func:`getrf`, into ``lu``, ``piv`` and ``info``."""
    count, n = a.shape[0], a.shape[-1]
    with np.errstate(all="ignore"):
        for part in _chunks(count, n * n):
            work, p = lu[part], piv[part]           # views: factored in place
            work[...] = a[part]
            if _engine(n) is _cpu_lapack:
                finite, fit = _screen(work)
                lapack = finite & fit
            else:
                finite = _finite(work)
                lapack = np.zeros_like(finite)
            work[~finite] = np.eye(n, dtype=a.dtype)
            _factor_rows(_cpu_lapack, work, p, lapack)
            # A subnormal or huge pivot: OpenBLAS scaled by a wrong reciprocal. Redo that matrix with NumPy.
            redo = lapack & _unsafe_pivot(work)
            work[redo] = a[part][redo]
            _factor_rows(_cpu_vectorised, work, p, ~lapack | redo)
            work[~finite] = np.nan
            p[~finite] = np.arange(n)
            zero = np.diagonal(work, axis1=-2, axis2=-1) == 0
            info[part] = np.where(finite, np.where(zero.any(axis=1), zero.argmax(axis=1) + 1, 0), -1)
    return lu, piv, info


def getrs(lu: np.ndarray, piv: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Solve ``A x = b`` (b: (B, n, k)) from ``getrf``'s output; a zero pivot gives inf/NaN there."""
    n = lu.shape[-1]
    if piv.size and (piv.min() < 0 or piv.max() >= n):
        raise InputError(f"Expected piv values in [0, {n}). Got values in "
                         f"[{int(piv.min())}, {int(piv.max())}] instead.")
    compiled = _compiled()
    if compiled is not None:
        x = np.empty(b.shape, lu.dtype)
        compiled.getrs(lu, piv, np.ascontiguousarray(b, lu.dtype), x, lapack_min_n("getrs", lu.dtype))
        return x
    return _getrs_numpy(lu, piv, b)


def _getrs_numpy(lu: np.ndarray, piv: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The NumPy engine's :func:`getrs`."""
    count, n = lu.shape[0], lu.shape[-1]
    x = np.empty(b.shape, lu.dtype)
    engine = _engine(n)
    with np.errstate(all="ignore"):
        for part in _chunks(count, n * (n + b.shape[-1])):
            lu_p, piv_p, b_p, x_p = lu[part], piv[part], b[part].astype(lu.dtype, copy=False), x[part]
            # A subnormal or huge diagonal of U: OpenBLAS's xGETRS scales by a wrong reciprocal of it;
            # those matrices go through the vectorised substitution, which divides (as xTRSM).
            slow = _unsafe_pivot(lu_p) if engine is _cpu_lapack else np.ones(len(lu_p), bool)
            _substitute_rows(_cpu_lapack, lu_p, piv_p, b_p, x_p, ~slow)
            _substitute_rows(_cpu_vectorised, lu_p, piv_p, b_p, x_p, slow)
    return x


def _overflowed_factors(info: np.ndarray, lu: np.ndarray) -> np.ndarray:
    """``info`` with -2 where it was 0 and the factors ``lu`` are not finite: an inverse or solution
    computed from them means nothing, even where it comes out finite (1 / inf is 0); NaN there."""
    return np.where((info == 0) & ~_finite(lu), np.int32(INFO_NONFINITE_RESULT), info).astype(np.int32)


def _on_good(info: np.ndarray, shape: tuple, dtype, compute) -> np.ndarray:
    """``compute(sel)`` for the matrices with info == 0 (all of them: ``sel`` is a slice), NaN elsewhere."""
    good = info == 0
    if good.all():
        return compute(slice(None))
    out = np.full(shape, np.nan, dtype)
    if good.any():
        sel = np.flatnonzero(good)
        out[sel] = compute(sel)
    return out


def solve(a: np.ndarray, b: np.ndarray):
    """``x`` (B, n, k) with ``a x = b``, NaN for matrices with info != 0; and ``info``."""
    if _deferred("solve", a):
        return _numba_on_demand("solve", a, b)
    compiled = _compiled()
    if compiled is not None:
        x = np.empty(b.shape, a.dtype)
        info = np.empty(a.shape[0], np.int32)
        compiled.solve(a, np.ascontiguousarray(b, a.dtype), x, info, lapack_min_n("solve", a.dtype))
        return x, info
    return _solve_numpy(a, b, *getrf(a))


def _solve_numpy(a: np.ndarray, b: np.ndarray, lu: np.ndarray, piv: np.ndarray, info: np.ndarray):
    """The NumPy engine's :func:`solve` from its factors."""
    if b.shape[-1]:          # no right-hand side, no x: info stays the factorization's
        info = _overflowed_factors(info, lu)
    x = _on_good(info, b.shape, a.dtype, lambda sel: _getrs_numpy(lu[sel], piv[sel], b[sel]))
    return x, info


def _inverse_from_factors(lu: np.ndarray, piv: np.ndarray) -> np.ndarray:
    """``A^-1`` from ``getrf``'s factors, as ``getrs`` of the identity."""
    n = lu.shape[-1]
    return _getrs_numpy(lu, piv, np.broadcast_to(np.eye(n, dtype=lu.dtype), lu.shape))


def _inverse_small(a: np.ndarray, lu: np.ndarray, piv: np.ndarray) -> np.ndarray:
    """Inverses of small matrices with info == 0: ``numpy.linalg.inv`` runs its LAPACK loop in C.

    It factors again with NumPy's LAPACK; should that find an exact zero pivot our LU did not (the
    rounding differs), the inverses come from our LU instead, so ``info`` stays the factorization's.
    So do those whose factors have a pivot OpenBLAS gets wrong (``_unsafe_pivot``).
    """
    unsafe = _unsafe_pivot(lu)
    if unsafe.any():
        out = np.empty_like(lu)
        out[unsafe] = _inverse_from_factors(lu[unsafe], piv[unsafe])
        if not unsafe.all():
            out[~unsafe] = _inverse_small(a[~unsafe], lu[~unsafe], piv[~unsafe])
        return out
    try:
        return np.linalg.inv(a)
    except np.linalg.LinAlgError:
        return _inverse_from_factors(lu, piv)


def inv(a: np.ndarray):
    """Inverse of each matrix, NaN where info != 0; and ``info``."""
    if _deferred("inv", a):
        return _numba_on_demand("inv", a)
    compiled = _compiled()
    if compiled is not None:
        ainv = np.empty_like(a)
        info = np.empty(a.shape[0], np.int32)
        compiled.inv(a, ainv, info, lapack_min_n("inv", a.dtype))
        return ainv, info
    return _inv_numpy(a, *getrf(a))


def _inv_numpy(a: np.ndarray, lu: np.ndarray, piv: np.ndarray, info: np.ndarray):
    """The NumPy engine's :func:`inv` from its factors."""
    info = _overflowed_factors(info, lu)
    if _engine(a.shape[-1]) is _cpu_lapack:
        def compute(sel):
            unsafe = _unsafe_pivot(lu[sel])    # OpenBLAS's xGETRI would scale by a wrong reciprocal
            if not unsafe.any():
                return _cpu_lapack.invert(lu[sel], piv[sel])
            rows = np.arange(len(info))[sel]
            out = np.empty((len(rows),) + a.shape[1:], a.dtype)
            out[unsafe] = _inverse_from_factors(lu[rows[unsafe]], piv[rows[unsafe]])
            if not unsafe.all():
                out[~unsafe] = _cpu_lapack.invert(lu[rows[~unsafe]], piv[rows[~unsafe]])
            return out
    else:
        def compute(sel):
            return _inverse_small(a[sel], lu[sel], piv[sel])
    with np.errstate(all="ignore"):
        ainv = _on_good(info, a.shape, a.dtype, compute)
    return ainv, info


def slogdet(a: np.ndarray):
    """Sign (input dtype) and log|det| (real) of each matrix from its LU; and ``info``."""
    compiled = _compiled()
    if compiled is not None:
        sign = np.empty(a.shape[0], a.dtype)
        logabsdet = np.empty(a.shape[0], a.real.dtype)
        info = np.empty(a.shape[0], np.int32)
        if _on_lanes("slogdet", a.dtype, a.shape[-1]):
            _lanes().slogdet(a, sign, logabsdet, info)
        else:
            compiled.slogdet(a, sign, logabsdet, info, lapack_min_n("slogdet", a.dtype))
        return sign, logabsdet, info
    lu, piv, info = getrf(a)
    n = a.shape[-1]
    d = np.diagonal(lu, axis1=-2, axis2=-1)
    with np.errstate(all="ignore"):
        mag = np.abs(d)
        swaps = np.count_nonzero(piv != np.arange(n), axis=1)
        sign = np.prod(d / np.where(mag == 0, 1, mag), axis=1) * np.where(swaps % 2, -1, 1)
        logabsdet = np.log(mag).sum(axis=1)
    sign = sign.astype(a.dtype)
    sign[info > 0] = 0
    sign[info < 0] = np.nan
    logabsdet[info > 0] = -np.inf
    logabsdet[info < 0] = np.nan
    return sign, logabsdet, info
