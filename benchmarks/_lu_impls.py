"""Implementations of batched LU (op ``lu``) timed by ``benchmarks/bench_kernels.py``.

Each factory takes ``(dtype, n, batch)`` and returns a :class:`Case`: ``prepare(k)`` copies fresh
input set ``k`` into the implementation's work buffer (untimed), ``run()`` does one factorization of
the whole batch on the current device (timed), ``check(k)`` judges the last run's output on input set
``k`` by LAPACK's test ratio (``_harness.check_case`` runs it once, outputs poisoned, before any
timing). Every implementation reads the same random matrices (entries uniform in [-1, 1)). A factory
that cannot run a point for a structural reason raises ``_harness.PeerUnavailable``.

Flop counts are LAWN 41's (as MAGMA's ``flops.h``): for getrf of an n x n matrix,
``FMULS = n^3/3 + 2n/3`` and ``FADDS = n^3/3 - n^2/2 + n/6``; real flops = FMULS + FADDS
(= 2n^3/3 - n^2/2 + 5n/6); complex flops = 6 FMULS + 2 FADDS (a complex multiply is 6 real flops, a
complex add 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from _harness import lu_ratio


@dataclass
class Case:
    prepare: Callable[[int], None]
    run: Callable[[], None]
    sync: str = "events"  # "events": CUDA events on the null stream; "block": the call blocks itself
    check: Callable[[int], float] | None = None  # largest LAPACK ratio of the last run on input set k
    outputs: tuple[Any, ...] = ()  # preallocated output arrays, poisoned before the checked run
    note: str = ""  # what the record should say about the setting timed (e.g. a peer's best config)


def getrf_flops(n: int, batch: int, dtype) -> float:
    fmuls = n ** 3 / 3 + 2 * n / 3
    fadds = n ** 3 / 3 - n ** 2 / 2 + n / 6
    per = 6 * fmuls + 2 * fadds if np.dtype(dtype).kind == "c" else fmuls + fadds
    return per * batch


def _sources(dtype, n, batch, sets: int = 2):
    """``sets`` independent random input batches on the GPU (CuPy), uniform in [-1, 1)."""
    import cupy

    dtype = np.dtype(dtype)
    rng = cupy.random.default_rng(n * 7919 + batch)
    real = np.float32 if dtype in (np.float32, np.complex64) else np.float64
    out = []
    for _ in range(sets):
        x = cupy.empty((batch, n, n), dtype)
        if dtype.kind == "c":
            x.real = rng.random(x.shape, dtype=real) * 2 - 1
            x.imag = rng.random(x.shape, dtype=real) * 2 - 1
        else:
            x[...] = rng.random(x.shape, dtype=real) * 2 - 1
        out.append(x)
    return out


def ours(dtype, n, batch, plan=None) -> Case:
    import cupy

    from batchlu.kernels import tuning

    src = _sources(dtype, n, batch)
    a = cupy.empty_like(src[0])
    lu = cupy.empty_like(a)
    piv = cupy.empty((batch, n), np.int32)
    info = cupy.empty((batch,), np.int32)
    p = plan or tuning.getrf_plan(dtype, n)

    def prepare(k):
        a[...] = src[k % len(src)]

    def run():
        tuning.launch_getrf(a, lu, piv, info, p)

    return Case(prepare, run, check=lambda k: lu_ratio(src[k % len(src)], lu, piv), outputs=(lu, piv))


def cublas(dtype, n, batch) -> Case:
    """cuBLAS ?getrfBatched on the same buffer read as column-major (it factors A^T: same work)."""
    import cupy
    from cupy_backends.cuda.libs import cublas as lib

    src = _sources(dtype, n, batch)
    a = cupy.empty_like(src[0])
    ptrs = cupy.asarray(a.data.ptr + np.arange(batch, dtype=np.uint64) * np.uint64(n * n * a.itemsize))
    piv = cupy.empty((batch, n), np.int32)
    info = cupy.empty((batch,), np.int32)
    fn = {np.float32: lib.sgetrfBatched, np.float64: lib.dgetrfBatched,
          np.complex64: lib.cgetrfBatched, np.complex128: lib.zgetrfBatched}[np.dtype(dtype).type]
    handle = cupy.cuda.device.get_cublas_handle()
    lib.setStream(handle, cupy.cuda.get_current_stream().ptr)

    def prepare(k):
        a[...] = src[k % len(src)]

    def run():
        fn(handle, n, ptrs.data.ptr, n, piv.data.ptr, info.data.ptr, batch)

    def check(k):  # in place, 1-based pivots, factors of A^T
        return lu_ratio(src[k % len(src)], a, piv, one_based=True, transposed=True)

    return Case(prepare, run, check=check, outputs=(piv,))


def _torch(dtype, n, batch, library: str, function: str = "lu_factor_ex") -> Case:
    """``torch.linalg.<function>`` (``lu_factor_ex`` or ``inv_ex``) on the batch with the given
    linalg backend (MAGMA or default)."""
    import torch

    from _harness import inv_ratio

    src = [torch.from_dlpack(x) for x in _sources(dtype, n, batch)]
    a = torch.empty_like(src[0])
    call = getattr(torch.linalg, function)
    state = {}

    def prepare(k):
        a.copy_(src[k % len(src)])

    def run():
        torch.backends.cuda.preferred_linalg_library(library)
        state["out"] = call(a)

    def check(k):
        out = state["out"]
        if function == "inv_ex":
            return inv_ratio(src[k % len(src)], out[0])
        return lu_ratio(src[k % len(src)], out[0], out[1], one_based=True)  # LAPACK pivots

    return Case(prepare, run, check=check)


def torch_magma(dtype, n, batch) -> Case:
    return _torch(dtype, n, batch, "magma")


def torch_default(dtype, n, batch) -> Case:
    return _torch(dtype, n, batch, "default")


def jax_lu(dtype, n, batch) -> Case:
    """jax.scipy.linalg.lu_factor under jit; JAX runs on its own stream, so the call blocks
    (block_until_ready) and is timed on the host clock."""
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    host = [x.get() for x in _sources(dtype, n, batch)]
    inputs = [jnp.asarray(h) for h in host]
    del host
    fn = jax.jit(jax.scipy.linalg.lu_factor)
    state = {"k": 0}

    def prepare(k):
        state["k"] = k % len(inputs)

    def run():
        state["out"] = jax.block_until_ready(fn(inputs[state["k"]]))

    def check(k):
        lu, piv = state["out"]
        return lu_ratio(inputs[k % len(inputs)], lu, piv)  # SciPy's 0-based pivots

    run()  # compile outside the timing
    return Case(prepare, run, sync="block", check=check)


IMPLS = {"lu": {"ours": ours, "cublas": cublas, "torch-magma": torch_magma,
                "torch-default": torch_default, "jax": jax_lu}}
FLOPS = {"lu": getrf_flops}


def rows_plan_of(tile: str, n: int):
    """The getrf_rows plan of a name's tile ``RRxTJ[xSTEP][mM]`` for order n (``tuning.rows_plan``)."""
    from batchlu.kernels import tuning

    shape, _, minb = tile.partition("m")
    return tuning.rows_plan(n, *(int(x) for x in shape.split("x")), minb=int(minb or 0))


def variant(op: str, name: str):
    """Factories for names outside IMPLS: ``ours:tiny-n`` (one thread per matrix, n <= 8),
    ``ours:small-8``, ``ours:blocked-16``, ``ours:blocked_smem-8`` (a fixed plan) and
    ``ours:rows-RRxTJ`` (the register-resident kernel with RR rows per thread and TJ threads per row,
    its tile sized for each n by ``tuning.rows_plan``; ``rows-RRxTJxSTEP`` pads n to STEP, a suffix
    ``mM`` compiles it for M blocks per SM)."""
    if op != "lu" or not name.startswith("ours:"):
        return None
    kind, tile = name[5:].split("-")

    def factory(dtype, n, batch):
        from batchlu.kernels import tuning

        if kind == "rows":
            return ours(dtype, n, batch, rows_plan_of(tile, n))
        if kind == "tiny":
            return ours(dtype, n, batch, tuning.Plan("tiny", n))
        return ours(dtype, n, batch, tuning.Plan(kind, int(tile)))
    return factory
