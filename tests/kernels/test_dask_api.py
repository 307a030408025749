"""The batched ops on dask arrays (``kernels/_dask.py``): lazy, chunked like the input along the batch
axes, ``info`` a dask array too, and bit for bit the results of the same call on the computed NumPy
array; matrices split between chunks are made whole; ``check=True`` is refused with one line."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import batchlu
from batchlu.errors import InputError
from batchlu.testing import matrices
from batchlu.testing.ratios import THRESHOLD, get03

da = pytest.importorskip("dask.array")
import dask  # noqa: E402

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]


def _same_bits(x, y) -> None:
    """Equal shapes, dtypes and bytes (NaN where NaN, the same NaN)."""
    x, y = np.asarray(x), np.asarray(y)
    assert x.shape == y.shape and x.dtype == y.dtype
    assert x.tobytes() == y.tobytes()


def _batch(n, dtype, count, seed):
    """Fresh random matrices, a singular one and a non-finite one among them."""
    a = matrices.generate("random", n, dtype, seed=seed, start=0, stop=count)
    a[3, :, 1] = 0
    a[5, 0, 0] = np.nan
    return a


class Counted:
    """A source of blocks that counts how many were made: a lazy call makes none."""

    def __init__(self, a):
        self.a, self.calls = a, 0

    def block(self, start, stop):
        self.calls += 1
        return self.a[start:stop]

    def array(self, step):
        from dask import delayed

        parts = [da.from_delayed(delayed(self.block)(i, min(i + step, len(self.a))),
                                 shape=(min(i + step, len(self.a)) - i,) + self.a.shape[1:], dtype=self.a.dtype)
                 for i in range(0, len(self.a), step)]
        return da.concatenate(parts)


@pytest.mark.parametrize("dtype", DTYPES)
def test_inv_is_lazy_and_bitwise_the_in_memory_result(dtype):
    a = _batch(9, dtype, 200, seed=1)
    source = Counted(a)
    x = source.array(37)
    ainv, info = batchlu.inv(x)
    assert source.calls == 0
    assert isinstance(ainv, da.Array) and isinstance(info, da.Array)
    assert ainv.chunks == x.chunks and info.chunks == (x.chunks[0],)
    assert ainv.dtype == dtype and info.dtype == np.int32
    ref_inv, ref_info = batchlu.inv(a)
    got_inv, got_info = dask.compute(ainv, info, scheduler="threads")
    _same_bits(got_inv, ref_inv)
    _same_bits(got_info, ref_info)
    assert got_info[3] > 0 and got_info[5] == -1
    good = got_info == 0
    assert good.sum() == len(a) - 2 and get03(a[good], got_inv[good]).max() < THRESHOLD


@pytest.mark.parametrize("dtype", DTYPES)
def test_lu_factor_and_lu_solve_chain_lazily(dtype):
    a = _batch(7, dtype, 120, seed=2)
    b = matrices.rhs(7, 3, dtype, seed=3, start=0, stop=120)
    x = da.from_array(a, chunks=(25, 7, 7))
    lu, piv, info = batchlu.lu_factor(x)
    sol = batchlu.lu_solve(lu, piv, da.from_array(b, chunks=(40, 7, 3)))
    assert all(isinstance(v, da.Array) for v in (lu, piv, info, sol))
    ref_lu, ref_piv, ref_info = batchlu.lu_factor(a)
    got = dask.compute(lu, piv, info, sol, scheduler="sync")
    for g, r in zip(got, (ref_lu, ref_piv, ref_info, batchlu.lu_solve(ref_lu, ref_piv, b))):
        _same_bits(g, r)


@pytest.mark.parametrize("vector", [True, False], ids=["vector", "matrix"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_solve_and_slogdet(dtype, vector):
    a = _batch(6, dtype, 90, seed=4)
    b = matrices.rhs(6, None if vector else 4, dtype, seed=5, start=0, stop=90)
    x = da.from_array(a, chunks=(20, 6, 6))
    sol, info = batchlu.solve(x, b)                 # a NumPy right-hand side joins the graph
    sign, logabsdet, sinfo = batchlu.slogdet(x)
    got = dask.compute(sol, info, sign, logabsdet, sinfo)
    ref = (*batchlu.solve(a, b), *batchlu.slogdet(a))
    for g, r in zip(got, ref):
        _same_bits(g, r)
    assert sol.chunks[0] == x.chunks[0] and sign.chunks == (x.chunks[0],)


def test_matrices_split_between_chunks_are_made_whole():
    a = _batch(12, np.float64, 64, seed=6)
    x = da.from_array(a, chunks=(16, 5, 7))        # every matrix cut in 6 pieces
    ainv, info = batchlu.inv(x)
    assert ainv.chunks[0] == x.chunks[0] and ainv.chunks[1:] == ((12,), (12,))
    got_inv, got_info = dask.compute(ainv, info)
    ref_inv, ref_info = batchlu.inv(a)
    _same_bits(got_inv, ref_inv)
    _same_bits(got_info, ref_info)


def test_two_batch_axes_keep_their_chunks():
    a = _batch(5, np.complex128, 60, seed=7).reshape(6, 10, 5, 5)
    x = da.from_array(a, chunks=(4, 3, 5, 5))
    sign, logabsdet, info = batchlu.slogdet(x)
    assert info.chunks == x.chunks[:2]
    for g, r in zip(dask.compute(sign, logabsdet, info), batchlu.slogdet(a)):
        _same_bits(g, r)


def test_the_processes_scheduler_runs_the_blocks(monkeypatch):
    """The blocks are module-level functions: a scheduler that pickles them runs them. (The spawned
    processes get this sys.path: without tests/kernels, whose sparse/ folder would pass for the pydata
    package that dask.array probes for.)"""
    here = str(Path(__file__).resolve().parent)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if str(Path(p or ".").resolve()) != here])
    a = _batch(8, np.float64, 80, seed=8)
    ainv, info = batchlu.inv(da.from_array(a, chunks=(20, 8, 8)))
    got_inv, got_info = dask.compute(ainv, info, scheduler="processes", num_workers=2)
    ref_inv, ref_info = batchlu.inv(a)
    _same_bits(got_inv, ref_inv)
    _same_bits(got_info, ref_info)


@pytest.mark.parametrize("op", ["lu_factor", "inv", "slogdet"])
def test_check_true_is_refused_with_one_line(op):
    x = da.from_array(_batch(4, np.float64, 10, seed=9), chunks=(5, 4, 4))
    with pytest.raises(InputError, match=r"^Expected check=False .* Got check=True instead") as err:
        getattr(batchlu, op)(x, check=True)
    assert "\n" not in str(err.value)


def test_bad_shapes_and_dtypes_are_refused_before_any_compute():
    with pytest.raises(InputError, match="square matrices"):
        batchlu.inv(da.zeros((10, 3, 4), chunks=(5, 3, 4)))
    with pytest.raises(TypeError, match="dtypes"):
        batchlu.inv(da.zeros((10, 3, 3), dtype=np.int64, chunks=(5, 3, 3)))
    x = da.from_array(_batch(4, np.float64, 10, seed=10), chunks=(5, 4, 4))
    with pytest.raises(InputError, match="Expected b of shape"):
        batchlu.solve(x, da.ones((10, 5), chunks=(5, 5)))
    unknown = x[x[:, 0, 0] > 0]                      # unknown chunk sizes along the batch
    with pytest.raises(InputError, match="compute_chunk_sizes"):
        batchlu.inv(unknown)


@pytest.mark.parametrize("n", [5, 23])   # the NumPy engine's vectorised LU below 10, LAPACK from 10
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_op_bitwise_the_in_memory_call_on_every_cpu_engine_and_chunking(cpu_engine, dtype, n):
    """Chunks of 1, 2 and 7 matrices and an uneven rest: a matrix's results must not depend on the
    matrices batched with it (NumPy's complex multiply rounds by position in the array)."""
    a = _batch(n, dtype, 40, seed=11 + n)
    b = matrices.rhs(n, 2, dtype, seed=12 + n, start=0, stop=40)
    ref_lu, ref_piv, ref_info = batchlu.lu_factor(a)
    ref = (ref_lu, ref_piv, ref_info, batchlu.lu_solve(ref_lu, ref_piv, b), *batchlu.inv(a),
           *batchlu.solve(a, b), *batchlu.slogdet(a))
    for chunks in [(1,) * 40, (2,) * 20, (7, 7, 7, 7, 7, 5), (1, 39)]:
        x = da.from_array(a, chunks=(chunks, n, n))
        lu, piv, info = batchlu.lu_factor(x)
        got = dask.compute(lu, piv, info, batchlu.lu_solve(lu, piv, b), *batchlu.inv(x),
                           *batchlu.solve(x, b), *batchlu.slogdet(x), scheduler="sync")
        for g, r in zip(got, ref, strict=True):
            _same_bits(g, r)


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
@pytest.mark.parametrize("op", ["lu_factor", "inv", "solve", "slogdet", "lu_solve"])
def test_masked_arrays_are_refused_in_one_line(op, lazy):
    """The ops have no masks: computing on the values under one would answer for what the mask hides."""
    a = _batch(4, np.float64, 6, seed=13)
    masked = np.ma.masked_array(a, mask=np.zeros(a.shape, bool))
    masked.mask[2, 1, 1] = True
    x = da.from_array(masked, chunks=(3, 4, 4), asarray=False) if lazy else masked
    b = matrices.rhs(4, None, np.float64, seed=14, start=0, stop=6)
    call = {"lu_factor": lambda: batchlu.lu_factor(x), "inv": lambda: batchlu.inv(x),
            "solve": lambda: batchlu.solve(x, b), "slogdet": lambda: batchlu.slogdet(x),
            "lu_solve": lambda: batchlu.lu_solve(x, np.zeros((6, 4), np.int32), b)}[op]
    with pytest.raises(TypeError, match=r"^Expected NumPy or CuPy arrays\. Got a numpy\.ma\.MaskedArray") as caught:
        call()
    assert "\n" not in str(caught.value)
