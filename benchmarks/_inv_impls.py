"""Implementations of batched inverse (op ``inv``) and solve with 16 right-hand sides (op ``solve``)
timed by ``benchmarks/bench_kernels.py``, with the same :class:`Case` interface as ``_lu_impls``.

Flop counts are LAWN 41's (MAGMA's ``flops.h``): inv = getrf + getri, with getri
``FMULS = 2n^3/3 + n^2/2 + 5n/6``, ``FADDS = 2n^3/3 - 3n^2/2 + 5n/6``; solve = getrf + getrs with
``FMULS = k n^2``, ``FADDS = k (n^2 - n)``; complex flops = 6 FMULS + 2 FADDS.

cuBLAS works in column-major order: it reads our C-order buffers as the transposes, and factors and
inverts A^T (the same work; inv(A^T) read back in C order is inv(A)). For its solve it factors A^T and
solves with the transpose flag, against its own column-major right-hand sides.
"""

from __future__ import annotations

import numpy as np

from _harness import inv_ratio, solve_ratio, tile_of
from _lu_impls import Case, _sources, _torch, getrf_flops

SOLVE_RHS = 16


def _complex(dtype) -> bool:
    return np.dtype(dtype).kind == "c"


def getri_flops(n: int, batch: int, dtype) -> float:
    fmuls = 2 * n ** 3 / 3 + n ** 2 / 2 + 5 * n / 6
    fadds = 2 * n ** 3 / 3 - 3 * n ** 2 / 2 + 5 * n / 6
    return (6 * fmuls + 2 * fadds if _complex(dtype) else fmuls + fadds) * batch


def getrs_flops(n: int, k: int, batch: int, dtype) -> float:
    fmuls, fadds = k * n ** 2, k * (n ** 2 - n)
    return (6 * fmuls + 2 * fadds if _complex(dtype) else fmuls + fadds) * batch


def inv_flops(n: int, batch: int, dtype) -> float:
    return getrf_flops(n, batch, dtype) + getri_flops(n, batch, dtype)


def solve_flops(n: int, batch: int, dtype) -> float:
    return getrf_flops(n, batch, dtype) + getrs_flops(n, SOLVE_RHS, batch, dtype)


def _rhs(dtype, n, batch, shape_tail):
    import cupy

    rng = cupy.random.default_rng(n * 104729 + batch)
    real = np.float32 if np.dtype(dtype) in (np.float32, np.complex64) else np.float64
    b = cupy.empty((batch,) + shape_tail, dtype)
    if _complex(dtype):
        b.real = rng.random(b.shape, dtype=real) * 2 - 1
        b.imag = rng.random(b.shape, dtype=real) * 2 - 1
    else:
        b[...] = rng.random(b.shape, dtype=real) * 2 - 1
    return b


# ---- inv ------------------------------------------------------------------------------------------

def ours_inv(dtype, n, batch, path: str | None = None) -> Case:
    """Our dispatch (or a fixed ``path``: "tiny", "fused", "getri" (getri_plan's launch), "getri-static",
    "getri-dynamic")."""
    import cupy

    from batchlu.kernels import tuning

    src = _sources(dtype, n, batch)
    a = cupy.empty_like(src[0])
    out = cupy.empty_like(a)
    lu = cupy.empty_like(a)
    piv = cupy.empty((batch, n), np.int32)
    info = cupy.empty((batch,), np.int32)
    path = path or {"tiny": "tiny", "fused": "fused"}.get(tuning.inv_plan(dtype, n), "getri")  # getri: getri_plan

    def prepare(k):
        a[...] = src[k % len(src)]

    if path == "tiny":
        def run():
            tuning.launch_inv_tiny(a, out, info)
    elif path.startswith("fused"):
        tile = tile_of(path) if "-" in path else None
        if tile and (tile[0] * tile[2] < n or tile[1] * tile[3] < n
                     or tile[2] * tile[3] * np.dtype(dtype).itemsize // 4 > 160):
            raise ValueError(f"Expected a tile that holds n = {n} in registers. Got {tile} instead.")

        def run():
            tuning.launch_inv_gje(a, out, info, tile)
    else:
        mode = path.split("-")[1] if "-" in path else None

        def run():
            tuning.launch_getrf(a, lu, piv, info)
            tuning.launch_getri(lu, piv, info, out, mode=mode)

    return Case(prepare, run, check=lambda k: inv_ratio(src[k % len(src)], out), outputs=(out,))


def _cublas_lib(dtype, names):
    from cupy_backends.cuda.libs import cublas as lib

    prefix = {np.float32: "s", np.float64: "d", np.complex64: "c", np.complex128: "z"}[np.dtype(dtype).type]
    return lib, [getattr(lib, prefix + name) for name in names]


def _pointers(x, batch, per_matrix):
    import cupy

    return cupy.asarray(x.data.ptr + np.arange(batch, dtype=np.uint64) * np.uint64(per_matrix * x.itemsize))


def cublas_inv(dtype, n, batch) -> Case:
    """cuBLAS ?getrfBatched + ?getriBatched (out of place)."""
    import cupy

    lib, (getrf, getri) = _cublas_lib(dtype, ("getrfBatched", "getriBatched"))
    src = _sources(dtype, n, batch)
    a = cupy.empty_like(src[0])
    c = cupy.empty_like(a)
    pa, pc = _pointers(a, batch, n * n), _pointers(c, batch, n * n)
    piv = cupy.empty((batch, n), np.int32)
    info = cupy.empty((batch,), np.int32)
    handle = cupy.cuda.device.get_cublas_handle()
    lib.setStream(handle, cupy.cuda.get_current_stream().ptr)

    def prepare(k):
        a[...] = src[k % len(src)]

    def run():
        getrf(handle, n, pa.data.ptr, n, piv.data.ptr, info.data.ptr, batch)
        getri(handle, n, pa.data.ptr, n, piv.data.ptr, pc.data.ptr, n, info.data.ptr, batch)

    # inv(A^T) column-major is inv(A) in C order
    return Case(prepare, run, check=lambda k: inv_ratio(src[k % len(src)], c), outputs=(c,))


def torch_magma_inv(dtype, n, batch) -> Case:
    return _torch(dtype, n, batch, "magma", "inv_ex")


def torch_default_inv(dtype, n, batch) -> Case:
    return _torch(dtype, n, batch, "default", "inv_ex")


def _jax_case(fn, host_inputs, ratio) -> Case:
    """``fn`` under jit on ``host_inputs[k]`` (tuples of arguments); ``ratio(inputs, out)`` judges
    the output."""
    import jax

    state = {"k": 0}
    jitted = jax.jit(fn)

    def prepare(k):
        state["k"] = k % len(host_inputs)

    def run():
        state["out"] = jax.block_until_ready(jitted(*host_inputs[state["k"]]))

    run()  # compile outside the timing
    return Case(prepare, run, sync="block",
                check=lambda k: ratio(host_inputs[k % len(host_inputs)], state["out"]))


def jax_inv(dtype, n, batch) -> Case:
    """jnp.linalg.inv under jit; JAX runs on its own stream, so the call blocks and is host-timed."""
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    inputs = [(jnp.asarray(x.get()),) for x in _sources(dtype, n, batch)]
    return _jax_case(jnp.linalg.inv, inputs, lambda args, out: inv_ratio(args[0], out))


def cupy_inv(dtype, n, batch) -> Case:
    import cupy

    src = _sources(dtype, n, batch)
    a = cupy.empty_like(src[0])
    state = {}

    def prepare(k):
        a[...] = src[k % len(src)]

    def run():
        state["out"] = cupy.linalg.inv(a)

    return Case(prepare, run, check=lambda k: inv_ratio(src[k % len(src)], state["out"]))


# ---- solve (16 right-hand sides unless told) -------------------------------------------------------

def ours_solve(dtype, n, batch, path: str | None = None, rhs: int = SOLVE_RHS) -> Case:
    """Our dispatch (or a fixed ``path``: "rows", "rows-RRxTJ[xSTEP[xLANES]]" (gesv_rows on a fixed tile
    shape, n padded to STEP, at least LANES lanes per right-hand side), "getrs")."""
    import cupy

    from batchlu.kernels import tuning

    src = _sources(dtype, n, batch)
    b = _rhs(dtype, n, batch, (n, rhs))
    a = cupy.empty_like(src[0])
    lu = cupy.empty_like(a)
    x = cupy.empty_like(b)
    piv = cupy.empty((batch, n), np.int32)
    info = cupy.empty((batch,), np.int32)
    path = path or tuning.solve_plan(dtype, n, rhs)

    def prepare(k):
        a[...] = src[k % len(src)]

    if path.startswith("rows"):
        tile = tuning.gesv_rows_tile(dtype, n, rhs, tile_of(path) if "-" in path else None)
        if tile is None:
            raise ValueError(f"Expected a gesv_rows tile for n = {n}. Got none for {path}.")

        def run():
            tuning.launch_gesv_rows(a, b, x, info, tile)
    else:
        def run():
            tuning.launch_getrf(a, lu, piv, info)
            tuning.launch_getrs(lu, piv, b, x, info)

    return Case(prepare, run, check=lambda k: solve_ratio(src[k % len(src)], x, b), outputs=(x,))


def cublas_solve(dtype, n, batch) -> Case:
    """cuBLAS ?getrfBatched on A^T, then ?getrsBatched with the transpose flag (solves A X = B), in
    place on a column-major B (its info is a host pointer, as cuBLAS requires)."""
    import cupy

    lib, (getrf, getrs) = _cublas_lib(dtype, ("getrfBatched", "getrsBatched"))
    src = _sources(dtype, n, batch)
    b0 = _rhs(dtype, n, batch, (SOLVE_RHS, n))  # column-major n x k
    a = cupy.empty_like(src[0])
    b = cupy.empty_like(b0)
    pa, pb = _pointers(a, batch, n * n), _pointers(b, batch, n * SOLVE_RHS)
    piv = cupy.empty((batch, n), np.int32)
    info = cupy.empty((batch,), np.int32)
    host_info = np.zeros(1, np.int32)
    handle = cupy.cuda.device.get_cublas_handle()
    lib.setStream(handle, cupy.cuda.get_current_stream().ptr)

    def prepare(k):
        a[...] = src[k % len(src)]
        b[...] = b0

    def run():
        getrf(handle, n, pa.data.ptr, n, piv.data.ptr, info.data.ptr, batch)
        getrs(handle, 1, n, SOLVE_RHS, pa.data.ptr, n, piv.data.ptr, pb.data.ptr, n,
              host_info.ctypes.data, batch)

    def check(k):  # X and B column-major: (batch, k, n) buffers
        return solve_ratio(src[k % len(src)], b.transpose(0, 2, 1), b0.transpose(0, 2, 1))

    return Case(prepare, run, check=check)


def torch_solve(dtype, n, batch) -> Case:
    import torch

    src = [torch.from_dlpack(x) for x in _sources(dtype, n, batch)]
    b = torch.from_dlpack(_rhs(dtype, n, batch, (n, SOLVE_RHS)))
    a = torch.empty_like(src[0])

    def prepare(k):
        a.copy_(src[k % len(src)])

    state = {}

    def run():
        torch.backends.cuda.preferred_linalg_library("default")
        state["out"] = torch.linalg.solve_ex(a, b)

    return Case(prepare, run, check=lambda k: solve_ratio(src[k % len(src)], state["out"][0], b))


def jax_solve(dtype, n, batch) -> Case:
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    b = jnp.asarray(_rhs(dtype, n, batch, (n, SOLVE_RHS)).get())
    inputs = [(jnp.asarray(x.get()), b) for x in _sources(dtype, n, batch)]
    return _jax_case(jnp.linalg.solve, inputs, lambda args, out: solve_ratio(args[0], out, args[1]))


def inv_bytes(n: int, batch: int, dtype) -> float:
    """Fewest bytes: read A, write inv(A)."""
    return 2 * n * n * np.dtype(dtype).itemsize * batch


def solve_bytes(n: int, batch: int, dtype) -> float:
    """Fewest bytes: read A and B (n x 16), write X."""
    return (n * n + 2 * n * SOLVE_RHS) * np.dtype(dtype).itemsize * batch


IMPLS = {
    "inv": {"ours": ours_inv, "cublas": cublas_inv, "torch-magma": torch_magma_inv,
            "torch-default": torch_default_inv, "jax": jax_inv, "cupy": cupy_inv},
    "solve": {"ours": ours_solve, "cublas": cublas_solve, "torch-default": torch_solve,
              "jax": jax_solve},
}
FLOPS = {"inv": inv_flops, "solve": solve_flops}
BYTES = {"inv": inv_bytes, "solve": solve_bytes}


def variant(op: str, name: str):
    """Factories outside IMPLS: for inv ``ours:tiny`` (n <= 8), ``ours:fused``,
    ``ours:fused-16x16x4x4x2`` (a fixed tile TIxTJxRRxCCxMINB), ``ours:getri`` (getrf + getri on
    getri_plan's launch), ``ours:getri-static``, ``ours:getri-dynamic``; for solve ``ours:rows``,
    ``ours:rows-4x8`` (gesv_rows, RR x TJ), ``ours:getrs``. None for names of other ops."""
    if not name.startswith("ours:"):
        return None
    path = name[5:]
    if op == "inv" and (path == "tiny" or path.startswith("fused") or path == "getri" or path.startswith("getri-")):
        return lambda dtype, n, batch: ours_inv(dtype, n, batch, path)
    if op == "solve" and (path == "getrs" or path.split("-")[0] == "rows"):
        return lambda dtype, n, batch: ours_solve(dtype, n, batch, path)
    return None
