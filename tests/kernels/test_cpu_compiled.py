"""The CPU backend's compiled engine (numba): both of its paths (the compiled xGETF2 and LAPACK
through SciPy's function pointers) at every size of the benchmark, in every dtype, against LAPACK's
test ratios; per-matrix ``info`` in mixed batches with poisoned outputs; results that do not depend
on the thread count or on the neighbours; the thread-count rule; the crossovers; and the fallback
when numba is not importable."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from batchlu import kernels
from batchlu.kernels import _cpu, _cpu_lapack, _cpu_threads, _cpu_vectorised
from batchlu.testing import matrices
from batchlu.testing.ratios import THRESHOLD, get01, get02, get03, slogdet_ratios

numba_engine = pytest.importorskip("batchlu.kernels._cpu_numba", reason="numba is not importable")

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
SIZES = [2, 4, 8, 16, 32, 64, 128]
OPS = ["getrf", "getrs", "inv", "solve", "slogdet"]


class _PoisonedNumpy:
    """``numpy`` inside the CPU backend with fresh buffers full of NaN (-7 for integers)."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def _poison(dtype):
        return np.nan if np.dtype(dtype).kind in "fc" else -7

    def empty(self, shape, dtype=float, *args, **kwargs):
        return np.full(shape, self._poison(dtype), dtype)

    def empty_like(self, x, dtype=None, *args, **kwargs):
        return np.full(np.shape(x), self._poison(dtype or x.dtype), dtype or x.dtype)


@pytest.fixture
def poisoned(monkeypatch):
    for module in (_cpu, _cpu_lapack, _cpu_vectorised):
        monkeypatch.setattr(module, "np", _PoisonedNumpy())


@pytest.fixture(autouse=True)
def compiled(monkeypatch):
    monkeypatch.setenv(_cpu.ENGINE_ENV, "compiled")
    assert kernels.cpu_engine() == "compiled"


@pytest.fixture(params=["own", "lapack", "lanes"])
def side(request, monkeypatch):
    """Every n through the compiled xGETF2, or every n through LAPACK; or ``getrf`` and ``slogdet``
    at every n through the lane LU (W matrices at once), the other ops as the tables say."""
    if request.param == "lanes":
        monkeypatch.setattr(_cpu, "LANES_MIN_N", 1)
    else:
        monkeypatch.setattr(_cpu, "LAPACK_MIN_N", 1 << 30 if request.param == "own" else 1)
    return request.param


def _batch(n, dtype, seed, count):
    """Fresh random matrices with, at fixed places, an exactly singular one (a zero column), one
    holding NaN and one holding Inf; the expected ``info`` (-1 for the non-finite, > 0 for the
    singular: its value is the factorization's first zero pivot, checked against SciPy's)."""
    a = matrices.generate("random", n, dtype, seed=seed, stop=count)
    a[1, :, n // 2] = 0
    a[3, n - 1, 0] = np.nan
    a[4, 0, n - 1] = np.inf
    return a


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_op_on_both_paths(dtype, n, side, poisoned):
    count = 7
    seed = int(np.random.SeedSequence().generate_state(1)[0])  # fresh inputs on every run
    a = _batch(n, dtype, seed, count)
    b = matrices.rhs(n, 3, dtype, seed=seed + 1, stop=count)
    good = np.array([0, 2, 5, 6])
    msg = f"seed {seed}"

    lu, piv, info = kernels.lu_factor(a)
    assert lu.dtype == dtype and piv.dtype == np.int32 and info.dtype == np.int32
    assert info[1] > 0 and info[3] == info[4] == -1 and (info[good] == 0).all(), msg
    assert get01(a[good], lu[good], piv[good]).max() < THRESHOLD, msg
    assert np.isfinite(lu[1]).all() and get01(a[[1]], lu[[1]], piv[[1]]).max() < THRESHOLD, msg
    assert np.isnan(lu[[3, 4]]).all()
    np.testing.assert_array_equal(piv[[3, 4]], np.broadcast_to(np.arange(n), (2, n)))

    x = kernels.lu_solve(lu[good], piv[good], b[good])
    assert x.dtype == dtype and get02(a[good], x, b[good]).max() < THRESHOLD, msg

    ainv, info_inv = kernels.inv(a)
    x, info_solve = kernels.solve(a, b)
    sign, logabsdet, info_det = kernels.slogdet(a)
    for got in (info_inv, info_solve, info_det):
        np.testing.assert_array_equal(got, info, err_msg=msg)
    assert get03(a[good], ainv[good]).max() < THRESHOLD, msg
    assert get02(a[good], x[good], b[good]).max() < THRESHOLD, msg
    assert max(r.max() for r in slogdet_ratios(a[good], sign[good], logabsdet[good])) < THRESHOLD, msg
    bad = np.array([1, 3, 4])
    assert np.isnan(ainv[bad]).all() and np.isnan(x[bad]).all()
    assert sign[1] == 0 and logabsdet[1] == -np.inf
    assert np.isnan(sign[[3, 4]]).all() and np.isnan(logabsdet[[3, 4]]).all()
    assert sign.dtype == dtype and logabsdet.dtype == np.empty(0, dtype).real.dtype


@pytest.mark.parametrize("dtype", DTYPES)
def test_singular_info_is_lapacks(dtype, side):
    """``info`` of exactly singular matrices is LAPACK's: the first zero pivot of this LU."""
    import scipy.linalg

    n, count = 12, 40
    a = matrices.generate("singular-mix", n, dtype, seed=8, stop=count)
    _, _, info = kernels.lu_factor(a)
    for k in np.flatnonzero(info > 0):
        ref = scipy.linalg.get_lapack_funcs("getrf", (a[k],))(a[k])[2]
        assert info[k] == ref, f"matrix {k}"
    assert (info > 0).sum() >= 5


@pytest.mark.parametrize("dtype", DTYPES)
def test_results_do_not_depend_on_threads_or_neighbours(dtype, monkeypatch):
    """Each matrix is computed on its own, on whichever thread: a batch split four ways gives the
    bits of one thread, and a matrix gives the same bits alone as in its batch."""
    for n in (5, 40):
        a = matrices.generate("singular-mix", n, dtype, seed=n, stop=400)
        b = matrices.rhs(n, 2, dtype, seed=n, stop=400)

        def everything(x, y):
            return (*kernels.lu_factor(x), *kernels.inv(x), *kernels.solve(x, y),
                    *kernels.slogdet(x))

        with kernels.cpu_threads(1):
            one = everything(a, b)
            alone = everything(a[123:124], b[123:124])
        with kernels.cpu_threads(4), monkeypatch.context() as m:
            m.setattr(_cpu_threads, "MIN_WORK", 1)      # split however small the batch
            four = everything(a, b)
        for p, q, r in zip(one, four, alone):
            assert p.tobytes() == q.tobytes()
            assert p[123:124].tobytes() == r.tobytes()


def test_thread_count_rule(monkeypatch):
    monkeypatch.delenv(_cpu_threads.ENV, raising=False)
    cores = len(os.sched_getaffinity(0))
    assert _cpu_threads.threads() == cores            # the main thread: every core
    seen = []
    worker = threading.Thread(target=lambda: seen.append(_cpu_threads.threads()))
    worker.start()
    worker.join()
    assert seen == [1]                                # any other thread: one
    with kernels.cpu_threads(3):
        assert _cpu_threads.threads() == 3
        with kernels.cpu_threads(1):
            assert _cpu_threads.threads() == 1
        assert _cpu_threads.threads() == 3
    monkeypatch.setenv(_cpu_threads.ENV, "2")
    assert _cpu_threads.threads() == 2
    with kernels.cpu_threads(5):                      # the context wins over the environment
        assert _cpu_threads.threads() == 5


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5"])
def test_bad_thread_count(bad, monkeypatch):
    monkeypatch.setenv(_cpu_threads.ENV, bad)
    with pytest.raises(ValueError, match=f"Expected {_cpu_threads.ENV} to be a positive integer. "
                                         f"Got '{bad}' instead."):
        kernels.inv(np.eye(3)[None])
    with pytest.raises(ValueError, match="Expected the CPU thread count to be a positive integer"):
        with kernels.cpu_threads(0):
            pass


def test_a_batch_is_split_between_threads(monkeypatch):
    """With 2 threads a large batch runs as two ranges, one on the calling thread."""
    calls = []
    real = numba_engine._inv_own

    def spy(*args):
        calls.append((threading.current_thread().name, args[-2], args[-1]))
        real(*args)

    monkeypatch.setattr(numba_engine, "_inv_own", spy)
    a = matrices.generate("random", 4, np.float64, seed=1, stop=20_000)
    with kernels.cpu_threads(2):
        ainv, info = kernels.inv(a)
    assert sorted((lo, hi) for _, lo, hi in calls) == [(0, 10_000), (10_000, 20_000)]
    names = {name for name, _, _ in calls}
    assert len(names) == 2 and threading.current_thread().name in names
    assert (info == 0).all() and get03(a[:50], ainv[:50]).max() < THRESHOLD


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [np.float64, np.complex64])
def test_crossover_picks_the_path(op, dtype, monkeypatch):
    """Below ``COMPILED_LAPACK_MIN_N`` the compiled xGETF2 kernel runs, from it on the LAPACK one
    (with the lane LU of ``getrf`` and ``slogdet`` out of the way: ``test_lanes_range_picks_the_path``)."""
    monkeypatch.setattr(_cpu, "LANES_MIN_N", 1 << 30)
    picked = []
    for name in ("_" + op + "_own", "_" + op + "_lapack"):
        real = getattr(numba_engine, name)

        def spy(*args, _real=real, _name=name):
            picked.append(_name.rsplit("_", 1)[1])
            _real(*args)
        monkeypatch.setattr(numba_engine, name, spy)
    crossover = _cpu.lapack_min_n(op, dtype)
    for n in (crossover - 1, crossover):
        a = matrices.generate("random", n, dtype, seed=n, stop=3)
        b = matrices.rhs(n, 2, dtype, seed=n, stop=3)
        if op == "getrf":
            kernels.lu_factor(a)
        elif op == "getrs":
            lu, piv, _ = kernels.lu_factor(a)
            kernels.lu_solve(lu, piv, b)
        elif op == "inv":
            kernels.inv(a)
        elif op == "solve":
            kernels.solve(a, b)
        else:
            kernels.slogdet(a)
    assert picked == ["own", "lapack"]


@pytest.mark.parametrize("op", ["getrf", "slogdet"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_lanes_range_picks_the_path(op, dtype, monkeypatch):
    """``getrf`` and ``slogdet`` run on the lane LU for n in ``COMPILED_LANES_N``, on the tables'
    own LU or LAPACK just outside it; ``cpu_crossover`` alone turns the lane LU off."""
    from batchlu.kernels import _cpu_lanes, tuning

    picked = []
    for module, name in ((_cpu_lanes, "lanes"), (numba_engine, "tables")):
        real = getattr(module, op)

        def spy(*args, _real=real, _name=name):
            picked.append(_name)
            _real(*args)
        monkeypatch.setattr(module, op, spy)
    first, last = _cpu.lanes_range(op, dtype)
    assert (first, last) == _cpu.COMPILED_LANES_N[op][DTYPES.index(dtype)]
    sizes = [first - 1, first, last, last + 1] if first > 1 else [first, last, last + 1]
    for n in sizes:
        a = matrices.generate("random", n, dtype, seed=n, stop=3)
        kernels.lu_factor(a) if op == "getrf" else kernels.slogdet(a)
    expected = ["tables", "lanes", "lanes", "tables"]
    assert picked == expected[-len(sizes):]
    with tuning.cpu_crossover(1):
        assert _cpu.lanes_range(op, dtype)[0] > 1 << 40
    with tuning.cpu_lanes_from(1):
        assert _cpu.lanes_range(op, dtype) == (1, _cpu._NEVER)
        assert _cpu.lanes_range("inv", dtype)[0] > 1 << 40


def test_blocks_of_one_blas_thread_overlapping_in_two_threads_keep_openblas_at_one_thread():
    """``openblas_set_num_threads_local`` sets the whole process's count in SciPy's OpenBLAS: two
    task threads that each set one thread and restored what they found left OpenBLAS threaded
    under the one still running (its results then rounded as threaded OpenBLAS does). The blocks
    share one setting: one thread from the first block's start to the last one's end, then the
    count there was before."""

    setter = _cpu_lapack._blas_thread_setter()
    if setter is None:
        pytest.skip("SciPy's LAPACK here is not an OpenBLAS with openblas_set_num_threads_local")
    before = setter(3)
    try:
        opened, first_done, seen = threading.Event(), threading.Event(), []

        def first():
            with _cpu_lapack.one_blas_thread():
                opened.set()
                time.sleep(0.1)
            first_done.set()

        thread = threading.Thread(target=first)
        thread.start()
        opened.wait(10)
        with _cpu_lapack.one_blas_thread():
            first_done.wait(10)           # the first block ends while this one runs
            seen.append(setter(1))        # the count now (setting 1 again changes nothing)
        thread.join()
        assert first_done.is_set() and seen == [1]
        assert setter(3) == 3             # the last block gave back the count found by the first
    finally:
        setter(before)


def _python(code: str, **env) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter, with this environment less the engine choice, plus ``env``."""
    base = {k: v for k, v in os.environ.items() if k != _cpu.ENGINE_ENV}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**base, **env})


def test_import_batchlu_does_not_import_numba():
    done = _python("import sys, batchlu, batchlu.kernels; print('numba' in sys.modules)")
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr[-2000:]


def test_without_numba_the_numpy_engine_runs():
    """numba not importable: no error, the NumPy engine, right answers."""
    code = """
import sys
sys.modules["numba"] = None          # import numba now raises ImportError
import numpy as np
from batchlu import kernels
from batchlu.testing.ratios import get03
a = np.random.default_rng(0).uniform(-1, 1, (50, 12, 12))
ainv, info = kernels.inv(a)
print(kernels.cpu_engine(), int((info == 0).sum()), float(get03(a, ainv).max()) < 30)
"""
    done = _python(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["numpy", "50", "True"]
    done = _python(code, BATCHLU_CPU_ENGINE="compiled")     # asked for by name: an error that says why
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("batchlu.errors.DependencyError: Expected numba to be importable for "
                           "BATCHLU_CPU_ENGINE=compiled. "
                           "Got ModuleNotFoundError: ") and last.endswith(" instead."), last


def test_unknown_engine_name(monkeypatch):
    monkeypatch.setenv(_cpu.ENGINE_ENV, "fortran")
    with pytest.raises(ValueError, match="Expected BATCHLU_CPU_ENGINE to be 'compiled' or 'numpy'. "
                                         "Got 'fortran' instead."):
        kernels.inv(np.eye(2)[None])


def test_a_dask_worker_thread_computes_on_one_core():
    """The pipeline's CPU tasks run in Dask worker threads: one core each, by the thread rule."""
    distributed = pytest.importorskip("distributed")

    def task():
        a = matrices.generate("random", 6, np.float64, seed=2, stop=100)
        ainv, info = kernels.inv(a)
        return _cpu_threads.threads(), int((info == 0).sum()), float(get03(a, ainv).max())

    with distributed.Client(processes=False, n_workers=1, threads_per_worker=2,
                            dashboard_address=None) as client:
        threads, ok, ratio = client.submit(task, pure=False).result()
    assert threads == 1 and ok == 100 and ratio < THRESHOLD
