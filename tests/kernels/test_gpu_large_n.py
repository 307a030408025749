"""The GPU above the one-kernel range (issue 20): every op of ``batchlu.kernels`` on CuPy arrays at
n = 1100, 1500, 2048 and 4096 in every dtype, and at each op's boundary on this device (the largest n
its own kernels take and the next, which goes to cuSOLVER, ``kernels/_gpu/_paths.py``):

* LAPACK's test ratios (get01, get02, get03, slogdet's) on a fresh random matrix, against float64 /
  complex128 references on the host, one matrix per batch (the host's n^3 work is the cost here);
* in the same batch, a singular matrix (a zero column: info n // 3 + 1, NaN inverse and x, sign 0 and
  logabsdet -inf) and a matrix holding NaN (info -1, NaN results, identity pivots);
* every output element written: each op runs twice, CuPy's pool poisoned first with NaN bytes (an
  unwritten finite result shows) and then with a large finite pattern (an unwritten NaN shows);
* cuSOLVER's conventions at small n, where the kernels are the reference (the path forced), its
  results on the caller's stream with its side streams joined, and a run through the pipeline.

Run on a machine with a CUDA GPU (a few minutes, mostly the host's references):
``BATCHLU_REQUIRE_GPU=1 python -m pytest -q -m gpu tests/kernels/test_gpu_large_n.py``"""

from __future__ import annotations

import numpy as np
import pytest

from batchlu import kernels
from batchlu.testing import matrices
from batchlu.testing.ratios import THRESHOLD, get01, get02, get03, slogdet_ratios

from _overflow import GROUP, check_codes, overflow_batch

pytestmark = pytest.mark.gpu

try:
    import cupy
except ImportError:  # the gpu marker skips these tests (fails them under BATCHLU_REQUIRE_GPU=1), saying why
    cupy = None

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
SIZES = [1100, 1500, 2048, 4096]
OPS = ["lu_factor", "inv", "solve", "slogdet"]   # lu_solve runs on lu_factor's outputs
K = 3                                            # right-hand sides
SINGULAR, GOOD, NAN = 0, 1, 2                    # the matrices of a batch (n = 4096: the first two)
POISON_BYTES = (0xFF, 0x7B)  # NaN in every float type (-1 in int32) / a large finite float (2071690107)


def _batch(dtype, n: int, seed: int):
    """Fresh random matrices: SINGULAR with a zero column, GOOD, and (below n = 4096, where two
    matrices of 256 MiB are enough) NAN with one NaN; right-hand sides (count, n, K)."""
    count = 2 if n >= 4096 else 3
    a = matrices.generate("random", n, dtype, seed=seed, start=0, stop=count)
    a[SINGULAR, :, n // 3] = 0
    if count > NAN:
        a[NAN, n // 2, n // 5] = np.nan
    b = matrices.rhs(n, K, dtype, seed=seed + 1, stop=count)
    info = np.zeros(count, np.int32)
    info[SINGULAR] = n // 3 + 1
    if count > NAN:
        info[NAN] = -1
    return a, b, info


def _poison_pool(byte: int, nbytes: int, stream=None) -> None:
    """Fill CuPy's pool with one block of ``byte`` in the arena of ``stream`` (default: the current
    one): the arrays allocated next on that stream are carved out of it."""
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    with stream if stream is not None else cupy.cuda.get_current_stream():
        junk = cupy.full(nbytes, byte, dtype=cupy.uint8)
    cupy.cuda.Device().synchronize()
    del junk


def _run(op: str, *args, poison: int, **kwargs):
    """``kernels.<op>`` on device copies of ``args`` in freshly poisoned memory; host results."""
    _poison_pool(poison, 4 * sum(x.nbytes for x in args) + (64 << 20))
    device = [cupy.asarray(x) for x in args]
    out = getattr(kernels, op)(*device, **kwargs)
    out = out if isinstance(out, tuple) else (out,)
    host = tuple(x.get() for x in out)
    for x, d in zip(args, device):
        assert np.array_equal(d.get(), x, equal_nan=True), f"{op} changed its input"
    return host


def _nan(x) -> bool:
    return bool(np.isnan(x).all())


def _finite(x) -> bool:
    return bool(np.isfinite(x).all())


def _ok(ratio, what: str) -> None:
    ratio = np.atleast_1d(ratio)
    assert np.isfinite(ratio).all() and ratio.max() < THRESHOLD, f"{what}: ratio {ratio.max():.3g}"


def _check(op: str, a, b, info_want, out, ratios: bool, where: str):
    """Every convention of ``op``'s outputs ``out`` on the batch of :func:`_batch`; LAPACK's ratio on
    GOOD where ``ratios``. Returns ``out``."""
    count, n = a.shape[0], a.shape[-1]
    dtype = a.dtype
    bad = [m for m in (SINGULAR, NAN) if m < count]
    info = out[-1]
    assert info.dtype == np.int32 and info.shape == (count,), where
    np.testing.assert_array_equal(info, info_want, err_msg=where)
    if op == "lu_factor":
        lu, piv = out[0], out[1]
        assert lu.dtype == dtype and lu.shape == a.shape and piv.dtype == np.int32 and piv.shape == (count, n)
        assert (piv >= 0).all() and (piv < n).all(), where
        for m in range(count):
            if m == NAN:
                assert _nan(lu[m]) and (piv[m] == np.arange(n)).all(), where
            else:  # LAPACK's interchanges: row j with a row at or below it
                assert _finite(lu[m]) and (piv[m] >= np.arange(n)).all(), (where, m)
        if ratios:
            _ok(get01(a[[GOOD]], lu[[GOOD]], piv[[GOOD]]), f"{where} get01")
            if n <= 2048:
                _ok(get01(a[[SINGULAR]], lu[[SINGULAR]], piv[[SINGULAR]]), f"{where} get01 (singular)")
    elif op in ("inv", "solve"):
        x = out[0]
        assert x.dtype == dtype and x.shape == (a.shape if op == "inv" else b.shape), where
        assert _finite(x[GOOD]) and all(_nan(x[m]) for m in bad), where
        if ratios:
            ratio = get03(a[GOOD], x[GOOD]) if op == "inv" else get02(a[GOOD], x[GOOD], b[GOOD])
            _ok(ratio, f"{where} {'get03' if op == 'inv' else 'get02'}")
    else:
        sign, logabsdet = out[0], out[1]
        assert sign.dtype == dtype and logabsdet.dtype == np.empty(0, dtype).real.dtype, where
        assert sign[SINGULAR] == 0 and logabsdet[SINGULAR] == -np.inf, where
        assert _finite(sign[GOOD]) and _finite(logabsdet[GOOD]), where
        if NAN < count:
            assert _nan(sign[NAN]) and _nan(logabsdet[NAN]), where
        if ratios:
            for name, r in slogdet_ratios(a[[GOOD]], sign[[GOOD]], logabsdet[[GOOD]])._asdict().items():
                _ok(r, f"{where} slogdet {name}")
    return out


def _every_op(op: str, dtype, n: int, seed: int) -> None:
    """``op`` twice on a fresh batch (both poisons), every check; lu_factor also runs lu_solve on its
    factors."""
    from batchlu.kernels._gpu._paths import path

    a, b, info = _batch(dtype, n, seed)
    where = f"{op} {np.dtype(dtype)} n={n} ({path(op, dtype, n, K)})"
    for run, poison in enumerate(POISON_BYTES):
        args = (a, b) if op == "solve" else (a,)
        out = _check(op, a, b, info, _run(op, *args, poison=poison), ratios=run == 0, where=where)
        if op != "lu_factor":
            continue
        lu, piv = out[0], out[1]
        x, = _run("lu_solve", lu, piv, b, poison=poison)
        solved = f"lu_solve {np.dtype(dtype)} n={n} ({path('lu_solve', dtype, n, K)})"
        assert x.dtype == np.dtype(dtype) and x.shape == b.shape
        assert _finite(x[GOOD]) and not _finite(x[SINGULAR]), solved  # a zero pivot: inf/NaN there
        assert NAN >= len(a) or _nan(x[NAN]), solved
        if run == 0:
            _ok(get02(a[GOOD], x[GOOD], b[GOOD]), f"{solved} get02")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_large_n(op, dtype, n):
    _every_op(op, dtype, n, seed=100 + n + DTYPES.index(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS + ["lu_solve"])
def test_boundary_of_the_kernels(op, dtype):
    """The largest n this device's kernels take for ``op`` and the next one (cuSOLVER's first): both
    right. On an H100: getrf 2225 / 2226 in float32, 1155 / 1156 in float64 and complex64, 1152 / 1153
    in complex128 (lu_factor, slogdet); 1024 / 1025 for inv, solve and lu_solve."""
    from batchlu.kernels._gpu import _paths
    from batchlu.kernels.tuning import smem_optin

    n0 = _paths.first_cusolver_n(op, dtype, smem_optin(), k=K)
    assert _paths.path(op, dtype, n0 - 1, K) != _paths.CUSOLVER and _paths.path(op, dtype, n0, K) == _paths.CUSOLVER
    for n in (n0 - 1, n0):
        if op == "lu_solve":  # lu_factor's factors (checked by get01 there), then lu_solve
            _every_op("lu_factor", dtype, n, seed=7 * n)
        else:
            _every_op(op, dtype, n, seed=7 * n)


@pytest.mark.parametrize("op", ["lu_factor", "inv", "solve", "slogdet", "lu_solve"])
def test_cusolver_joins_the_callers_stream(op):
    """Four matrices (four lanes: the caller's stream and three side streams) on a non-blocking stream
    of the caller's, read after synchronising that stream only: every result written and right."""
    from batchlu.kernels._gpu import _paths

    n, count = 1200, 4
    assert _paths.path(op, np.float64, n, K) == _paths.CUSOLVER
    a = matrices.generate("random", n, np.float64, seed=41, start=0, stop=count)
    b = matrices.rhs(n, K, np.float64, seed=42, stop=count)
    if op == "lu_solve":
        lu, piv, _ = (x.get() for x in kernels.lu_factor(cupy.asarray(a)))
        args = (lu, piv, b)
    else:
        args = (a, b) if op == "solve" else (a,)
    device = [cupy.asarray(x) for x in args]
    stream = cupy.cuda.Stream(non_blocking=True)
    _poison_pool(0xFF, 4 * sum(x.nbytes for x in args), stream)  # where the outputs will be allocated
    out = getattr(kernels, op)(*device, stream=stream)
    out = out if isinstance(out, tuple) else (out,)
    stream.synchronize()
    out = [x.get() for x in out]
    if op == "lu_factor":
        assert (out[2] == 0).all()
        _ok(get01(a, out[0], out[1]), "get01")
    elif op == "slogdet":
        assert (out[2] == 0).all()
        for name, r in slogdet_ratios(a, out[0], out[1])._asdict().items():
            _ok(r, f"slogdet {name}")
    elif op == "inv":
        assert (out[1] == 0).all()
        _ok(get03(a, out[0]), "get03")
    else:
        assert op == "lu_solve" or (out[1] == 0).all()
        _ok(get02(a, out[0], b), "get02")


@pytest.mark.parametrize("n", [1, 40])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cusolver_path_keeps_the_kernels_conventions(monkeypatch, dtype, n):
    """Every op forced onto cuSOLVER at small n, through the API, on a batch of plain, overflowing and
    singular / zero / NaN / Inf matrices (tests/kernels/_overflow.py): the info codes of the bad
    matrices equal the CPU backend's, -2 follows its rule, NaN where the kernels write NaN, LAPACK's
    ratios on the plain matrices."""
    from batchlu.kernels import _gpu
    from batchlu.kernels._gpu import _paths

    monkeypatch.setattr(_gpu, "path", lambda *args, **kwargs: _paths.CUSOLVER)
    a = overflow_batch(n, dtype, seed=n + 5)
    b = matrices.rhs(n, K, dtype, seed=n + 6, stop=a.shape[0])
    mix = slice(3 * GROUP, None)      # the singular-mix group: exact zeros, NaN and Inf
    plain = slice(0, GROUP)
    for op in OPS:
        args = (a, b) if op == "solve" else (a,)
        out = _run(op, *args, poison=0xFF)
        info = out[-1]
        cpu_info = getattr(kernels, op)(*args)[-1]
        np.testing.assert_array_equal(info[mix], cpu_info[mix], err_msg=op)
        assert (info[plain] == 0).all(), op
        results = out[:-1] if op != "lu_factor" else (out[0],)
        check_codes(info, a, *results, overflow=bool((info == -2).any()))
        if op == "lu_factor":
            lu, piv = out[0], out[1]
            assert (piv[info == -1] == np.arange(n)).all() and np.isnan(lu[info == -1]).all()
            _ok(get01(a[plain], lu[plain], piv[plain]), "get01")
            x, = _run("lu_solve", lu[plain], piv[plain], b[plain], poison=0x7B)
            _ok(get02(a[plain], x, b[plain]), "lu_solve get02")
        elif op == "inv":
            assert np.isnan(out[0][info > 0]).all() and np.isnan(out[0][info == -1]).all()
            _ok(get03(a[plain], out[0][plain]), "get03")
        elif op == "solve":
            assert np.isnan(out[0][info > 0]).all() and np.isnan(out[0][info == -1]).all()
            _ok(get02(a[plain], out[0][plain], b[plain]), "get02")
        else:
            sign, logabsdet = out[0], out[1]
            assert (sign[info > 0] == 0).all() and (logabsdet[info > 0] == -np.inf).all()
            assert np.isnan(sign[info == -1]).all() and np.isnan(logabsdet[info == -1]).all()
            for name, r in slogdet_ratios(a[plain], sign[plain], logabsdet[plain])._asdict().items():
                _ok(r, f"slogdet {name}")
