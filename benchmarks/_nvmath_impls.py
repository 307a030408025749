"""The NVIDIA peers reached through nvmath-python 1.0 (ops ``lu``, ``inv``, ``solve``), timed by
``benchmarks/bench_kernels.py`` with the same inputs, :class:`Case` interface and flop counts as
``_lu_impls`` and ``_inv_impls``:

* ``cusolverdx``: cuSOLVERDx's block-level LU with partial pivoting (``nvmath.device.LUPivotSolver``,
  cuSOLVERDx through libmathdx) in a numba-cuda kernel. Each block copies ``batches_per_block``
  matrices into shared memory as they lie in global memory, factors them (``factorize``: getrf),
  and writes back LU, pivots and info (lu); solves the 16 right-hand sides (``solve``: getrs) and
  writes X (solve); or solves against the identity, ``panel`` columns at a time, and writes each
  panel of the inverse (inv: cuSOLVERDx has no getri). One launch per call, CUDA events around it.
  The matrix must fit in shared memory with its right-hand sides: a point where even one matrix per
  block does not fit is recorded as unavailable with the bytes it needs.
  Settings: cuSOLVERDx's suggested ``batches_per_block`` and ``block_dim`` and, by ``--dx-sweep``,
  others: ``bpb`` adds batches_per_block 1, 2, 4, 8; ``full`` also the column-major arrangement
  (the same bytes read as A^T: factor A^T, solve with A^T's transpose), block_dim of 64, 128, 256
  threads and, for inv, panels of 16 and 32 columns. Each setting is checked (LAPACK ratio), timed
  3 times, and the fastest is returned: its record's ``config`` names it.
* ``nvmath``: ``nvmath.linalg.DirectSolver`` on the whole batch (implicit batching, CuPy operands on
  the GPU, ``inplace_a`` and ``inplace_b`` so that no copy is timed): lu ``factorize()``; solve
  ``factorize()`` + ``solve()`` on the 16 right-hand sides; inv the same against the identity
  (DirectSolver has no inverse). For a batch it calls cuBLAS' ``getrfBatched`` / ``getrsBatched``
  and reads ``info`` back, so each call blocks: host clock around it. A C-order A is seen
  column-major as A^T (getrs with the transpose flag); the right-hand sides, X and the inverse are
  column-major per matrix, as DirectSolver requires for ``inplace_b``.

A missing or broken nvmath-python (or numba-cuda, libmathdx) makes every point of the peer
``PeerUnavailable`` with the import's one-line error; the benchmark records that reason.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, replace

import numpy as np

from _harness import PeerUnavailable, check_case, inv_ratio, lu_ratio, solve_ratio, time_case
from _inv_impls import SOLVE_RHS, _rhs
from _lu_impls import Case, _sources

SWEEPS = ("suggested", "bpb", "full")
SETTINGS = {"sweep": "bpb"}
SWEEP_REPS = 3  # timed runs of each setting in the sweep (the winner is then timed by the benchmark)


def configure(args) -> None:
    """Take ``--dx-sweep`` from bench_kernels' options."""
    sweep = getattr(args, "dx_sweep", None)
    if sweep is not None:
        if sweep not in SWEEPS:
            raise ValueError(f"Expected --dx-sweep among {', '.join(SWEEPS)}. Got {sweep!r} instead.")
        SETTINGS["sweep"] = sweep


_FAILED_IMPORTS: dict[str, str] = {}


def preload_nvidia_lib(soname: str, needs: tuple[str, ...] = ()) -> None:
    """Load ``soname`` (e.g. ``libmathdx.so.0``, ``libcudss.so.0``) from the first ``nvidia/cu13/lib``
    (or ``cu12``) of the ``nvidia`` namespace package, after the cuda-pathfinder libraries it
    ``needs``. cuda-pathfinder, which nvmath asks for these, searches only the interpreter's
    site-packages (and LD_LIBRARY_PATH): wheels installed with ``pip --target`` and found through
    PYTHONPATH (the GPU machine's way) would be missed; a library already loaded is taken as found."""
    import ctypes
    import importlib.util
    from pathlib import Path

    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return
    for root in (spec.submodule_search_locations or []) if spec else []:
        for sub in ("cu13/lib", "cu12/lib"):
            lib = Path(root) / sub / soname
            if lib.is_file():
                try:
                    for name in needs:
                        importlib.import_module("cuda.pathfinder").load_nvidia_dynamic_lib(name)
                    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
                except Exception:  # noqa: BLE001 - nvmath's own search reports what is missing
                    pass
                return


def _numpy_aliases_numba_cuda_needs() -> None:
    """numba-cuda 0.30.4 (the newest release) registers an overload for ``np.row_stack`` when
    ``nvmath.device`` imports it, and NumPy 2.4 removed that alias of ``np.vstack``: without it the
    import fails with ``AttributeError``. The alias is put back, for this benchmark process only."""
    import numpy

    if not hasattr(numpy, "row_stack"):
        numpy.row_stack = numpy.vstack


def _import(module: str):
    """``module`` imported, or :class:`PeerUnavailable` with the import's error on one line (a missing
    package, a missing libmathdx or CUDA driver: nvmath raises more than ImportError)."""
    if module in _FAILED_IMPORTS:
        raise PeerUnavailable(_FAILED_IMPORTS[module])
    try:
        if module.startswith("nvmath.device") and module not in sys.modules:
            preload_nvidia_lib("libmathdx.so.0", needs=("nvrtc",))
            _numpy_aliases_numba_cuda_needs()
        return importlib.import_module(module)
    except Exception as err:  # noqa: BLE001 - any import failure makes the peer unavailable
        first = (str(err).strip().splitlines() or [""])[0]
        _FAILED_IMPORTS[module] = f"import {module} failed: {type(err).__name__}: {first}"[:300]
        raise PeerUnavailable(_FAILED_IMPORTS[module]) from None


def _version() -> str:
    return getattr(_import("nvmath"), "__version__", "?")


# ---- cuSOLVERDx -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class DxConfig:
    """One setting of the cuSOLVERDx kernel; ``"suggested"`` asks cuSOLVERDx. ``panel``: inverse
    columns per getrs (0: as many as fit, up to n)."""

    arrangement: str = "row_major"
    bpb: int | str = "suggested"
    block_dim: tuple | str = "suggested"
    panel: int = 0


def dx_configs(op: str, sweep: str) -> list[DxConfig]:
    """The settings ``--dx-sweep sweep`` tries for ``op`` (before cuSOLVERDx resolves "suggested";
    duplicates after resolution are tried once)."""
    out = [DxConfig()]
    if sweep in ("bpb", "full"):
        out += [DxConfig(bpb=b) for b in (1, 2, 4, 8)]
    if sweep == "full":
        out += [DxConfig(arrangement="col_major")]
        out += [DxConfig(block_dim=(t, 1, 1)) for t in (64, 128, 256)]
        if op == "inv":
            out += [DxConfig(panel=p) for p in (16, 32)]
    return out


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


@dataclass(frozen=True)
class _Layout:
    """Where one block's matrices sit in its dynamic shared memory (offsets in elements of the value
    type, then of int32), and the bytes it needs."""

    bpb: int
    n: int
    k: int  # right-hand-side columns in shared memory (0 for lu)
    itemsize: int

    @property
    def b_off(self) -> int:
        return _round_up(self.bpb * self.n * self.n, max(1, 16 // self.itemsize))

    @property
    def ipiv_off(self) -> int:
        return _round_up((self.b_off + self.bpb * self.n * self.k) * self.itemsize, 16) // 4

    @property
    def info_off(self) -> int:
        return self.ipiv_off + self.bpb * self.n

    @property
    def nbytes(self) -> int:
        return (self.info_off + self.bpb) * 4


def dx_layout(op: str, n: int, dtype, bpb: int, panel: int, limit: int) -> _Layout | None:
    """The shared-memory layout of ``bpb`` matrices for ``op``; for inv with ``panel`` 0 the widest
    panel of n, 64, 32, 16, 8 columns that fits in ``limit`` bytes. None if nothing fits."""
    item = np.dtype(dtype).itemsize
    if op == "lu":
        ks = [0]
    elif op == "solve":
        ks = [SOLVE_RHS]
    else:
        ks = [panel] if panel else [n] + [p for p in (64, 32, 16, 8) if p < n]
    for k in ks:
        lay = _Layout(bpb, n, min(k, n) if op == "inv" else k, item)
        if lay.nbytes <= limit:
            return lay
    return None


def _solver(op: str, dtype, n: int, cfg: DxConfig, k: int):
    """The LUPivotSolver of ``cfg`` with ``k`` right-hand sides (1 for lu). A suggested
    batches_per_block or block_dim is asked of cuSOLVERDx for the factorization and then fixed for
    both of the solver's functions (getrf and getrs must run on one block shape)."""
    dx = _import("nvmath.device")
    dtype = np.dtype(dtype)
    precision = np.float32 if dtype in (np.float32, np.complex64) else np.float64
    # col_major: the C-order bytes are A^T; solve then asks for (A^T)^T X = B (inv: A^T Y = I, whose
    # Y column-major is inv(A) in C order, so no transpose there).
    transpose = "transposed" if (cfg.arrangement == "col_major" and op == "solve") else "non_transposed"
    if transpose == "transposed" and dtype.kind == "c":
        raise PeerUnavailable(f"cuSOLVERDx solves A^T X = B only for real types (complex: non_trans or conj_trans), "
                              f"so {dtype.name} solve has no column-major arrangement")

    def make(bpb, block_dim):
        return dx.LUPivotSolver(size=(n, n, max(k, 1)), precision=precision,
                                data_type="complex" if dtype.kind == "c" else "real", execution="Block",
                                arrangement=(cfg.arrangement, cfg.arrangement), transpose_mode=transpose,
                                batches_per_block=bpb, block_dim=block_dim)

    solver = make(cfg.bpb, cfg.block_dim)
    if "suggested" in (cfg.bpb, cfg.block_dim):
        solver = make(int(solver.batches_per_block), tuple(int(t) for t in solver.block_dim))
    return solver


def _kernel(op: str, solver, lay: _Layout, row_major: bool):
    """The numba-cuda kernel of ``op`` for ``solver`` (one block per ``lay.bpb`` matrices). Arrays
    are flat (1-D) views of the C-order global buffers."""
    numba = _import("numba")
    cuda = _import("numba.cuda")
    bpb, n, k = lay.bpb, lay.n, lay.k
    nn, nk = n * n, n * k
    b_off, ipiv_off, info_off = lay.b_off, lay.ipiv_off, lay.info_off

    @cuda.jit(device=True, forceinline=True)
    def position():
        tid = cuda.threadIdx.x + cuda.blockDim.x * (cuda.threadIdx.y + cuda.blockDim.y * cuda.threadIdx.z)
        return tid, cuda.blockDim.x * cuda.blockDim.y * cuda.blockDim.z

    @cuda.jit(device=True, forceinline=True)
    def load(dst, off, src, first, count, size, tid, step):
        # the block's matrices as they lie in global memory; slots past the batch's end (last block
        # only) get a copy of its first matrix, so that cuSOLVERDx factors finite numbers there
        for i in range(tid, bpb * size, step):
            dst[off + i] = src[first * size + (i if i < count * size else i % size)]

    @cuda.jit(device=True, forceinline=True)
    def store_info(smem_i, ipiv, info, first, count, tid, step):
        for i in range(tid, count * n, step):
            ipiv[first * n + i] = smem_i[ipiv_off + i]
        for i in range(tid, count, step):
            info[first + i] = smem_i[info_off + i]

    if op == "lu":
        def lu_kernel(a, lu, ipiv, info, batch):
            smem = cuda.shared.array(shape=(0,), dtype=solver.value_type)
            smem_i = cuda.shared.array(shape=(0,), dtype=numba.int32)
            tid, step = position()
            first = cuda.blockIdx.x * bpb
            count = min(bpb, batch - first)
            load(smem, 0, a, first, count, nn, tid, step)
            cuda.syncthreads()
            solver.factorize(smem, smem_i[ipiv_off:], smem_i[info_off:])
            cuda.syncthreads()
            for i in range(tid, count * nn, step):
                lu[first * nn + i] = smem[i]
            store_info(smem_i, ipiv, info, first, count, tid, step)

        return cuda.jit(lu_kernel)

    if op == "solve":
        def solve_kernel(a, b, x, ipiv, info, batch):
            smem = cuda.shared.array(shape=(0,), dtype=solver.value_type)
            smem_i = cuda.shared.array(shape=(0,), dtype=numba.int32)
            tid, step = position()
            first = cuda.blockIdx.x * bpb
            count = min(bpb, batch - first)
            load(smem, 0, a, first, count, nn, tid, step)
            load(smem, b_off, b, first, count, nk, tid, step)
            cuda.syncthreads()
            solver.factorize(smem, smem_i[ipiv_off:], smem_i[info_off:])
            cuda.syncthreads()
            solver.solve(smem, smem_i[ipiv_off:], smem[b_off:])
            cuda.syncthreads()
            for i in range(tid, count * nk, step):
                x[first * nk + i] = smem[b_off + i]
            store_info(smem_i, ipiv, info, first, count, tid, step)

        return cuda.jit(solve_kernel)

    def inv_kernel(a, out, unit, ipiv, info, batch):
        # unit = [0, 1] in the value type: the identity's entries, converted as any loaded value
        smem = cuda.shared.array(shape=(0,), dtype=solver.value_type)
        smem_i = cuda.shared.array(shape=(0,), dtype=numba.int32)
        tid, step = position()
        first = cuda.blockIdx.x * bpb
        count = min(bpb, batch - first)
        load(smem, 0, a, first, count, nn, tid, step)
        cuda.syncthreads()
        solver.factorize(smem, smem_i[ipiv_off:], smem_i[info_off:])
        cuda.syncthreads()
        for j0 in range(0, n, k):
            # panel: columns j0 .. j0+k of the identity; smem index i = m*nk + (r*k + c | c*n + r)
            for i in range(tid, bpb * nk, step):
                rem = i % nk
                if row_major:
                    r, c = rem // k, rem % k
                else:
                    r, c = rem % n, rem // n
                smem[b_off + i] = unit[1 if r == j0 + c else 0]
            cuda.syncthreads()
            solver.solve(smem, smem_i[ipiv_off:], smem[b_off:])
            cuda.syncthreads()
            for i in range(tid, count * nk, step):
                m, rem = i // nk, i % nk
                if row_major:  # X = inv(A)[:, j0:j0+k], row-major panel
                    r, c = rem // k, rem % k
                    dst = r * n + j0 + c
                else:  # Y = inv(A^T)[:, j0:j0+k] column-major: its column c is row j0+c of inv(A)
                    r, c = rem % n, rem // n
                    dst = (j0 + c) * n + r
                if j0 + c < n:
                    out[(first + m) * nn + dst] = smem[b_off + i]
            cuda.syncthreads()
        store_info(smem_i, ipiv, info, first, count, tid, step)

    return cuda.jit(inv_kernel)


def _raise_smem_limit(dispatcher, args, nbytes: int) -> int:
    """Compile ``dispatcher`` for ``args``, let it take ``nbytes`` of dynamic shared memory (above the
    48 KB default), and return its static shared memory in bytes."""
    driver = _import("cuda.bindings.driver")
    kernel = dispatcher.compile(tuple(dispatcher.typeof_pyval(x) for x in args))
    cufunc = kernel._codelibrary.get_cufunc()
    handle = cufunc.handle
    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    if isinstance(handle, driver.CUkernel):
        err, handle = driver.cuKernelGetFunction(handle)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"Expected cuKernelGetFunction to succeed. Got {err} instead.")
    elif not isinstance(handle, driver.CUfunction):  # ctypes handle (older numba-cuda)
        handle = driver.CUfunction(getattr(handle, "value", handle))
    (err,) = driver.cuFuncSetAttribute(handle, attr, int(nbytes))
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"Expected cuFuncSetAttribute(max dynamic shared memory = {nbytes}) to "
                           f"succeed. Got {err} instead.")
    return int(cufunc.attrs.shared)


class _DxBuffers:
    """Inputs and outputs shared by every setting tried at one point (one set per arrangement)."""

    def __init__(self, op: str, dtype, n: int, batch: int, row_major: bool):
        import cupy

        self.src = _sources(dtype, n, batch)
        self.a = cupy.empty_like(self.src[0])
        self.ipiv = cupy.empty((batch, n), np.int32)
        self.info = cupy.empty((batch,), np.int32)
        if op == "solve":  # row-major: B is (n, 16) in C order; column-major: (16, n) in C order
            self.b = _rhs(dtype, n, batch, (n, SOLVE_RHS) if row_major else (SOLVE_RHS, n))
            self.out = cupy.empty_like(self.b)
        else:
            self.out = cupy.empty_like(self.a)
        self.unit = cupy.asarray(np.array([0, 1], dtype))


_PLANS: dict = {}  # (op, dtype name, n, DxConfig) -> (bpb, block_dim, k), from precompile()


def _dx_plan(op: str, dtype, n: int, cfg: DxConfig, limit: int):
    """The solver and shared-memory layout of setting ``cfg`` (nothing compiled yet; for inv with
    ``panel`` 0, the widest panel of n, 64, 32, 16, 8 columns that fits). :class:`PeerUnavailable`
    where its matrices do not fit in ``limit`` bytes or cuSOLVERDx's own check says they do not fit
    in shared memory."""
    item, name = np.dtype(dtype).itemsize, np.dtype(dtype).name
    planned = _PLANS.get((op, name, n, cfg))
    if planned:
        bpb, block_dim, k = planned
        return _solver(op, dtype, n, replace(cfg, bpb=bpb, block_dim=block_dim), k), \
            _Layout(bpb, n, 0 if op == "lu" else k, item)
    if op == "inv":
        ks = [cfg.panel] if cfg.panel else [n] + [p for p in (64, 32, 16, 8) if p < n]
    else:
        ks = [1] if op == "lu" else [SOLVE_RHS]
    problems = []
    for k in ks:
        try:
            solver = _solver(op, dtype, n, cfg, k)
        except RuntimeError as err:  # cuSOLVERDx's static checks, e.g. shared memory
            text = " ".join(str(err).split())
            problems.append(f"cuSOLVERDx refuses n={n} {name} k={k}: does not fit into shared memory"
                            if "fit into shared memory" in text else text[:200])
            continue
        bpb = int(solver.batches_per_block)
        lay = _Layout(bpb, n, 0 if op == "lu" else k, item)
        if lay.nbytes <= limit:
            return solver, lay
        problems.append(f"cuSOLVERDx keeps each matrix in shared memory: {bpb} matrices of n={n} {name} "
                        f"(k={lay.k}) need {lay.nbytes} bytes per block; the device allows {limit}")
    if all("shared memory" in p for p in problems):
        raise PeerUnavailable(problems[-1])
    raise RuntimeError("; ".join(problems))


def _codegen_key(s, api: str) -> tuple:
    """What libmathdx generates a cuSOLVERDx function from (a ``Solver``'s description)."""
    return (s.function, tuple(s.size), np.dtype(s.precision).name, s.execution, tuple(s.sm),
            tuple(s.arrangement), s.transpose_mode, int(s.batches_per_block), s.data_type,
            tuple(s.leading_dimensions), tuple(int(t) for t in s.block_dim), api)


_CODE: dict = {}  # _codegen_key -> (Code, symbol), from precompile()


def _install_code_memo() -> None:
    """Let numba-cuda's cuSOLVERDx overload (``nvmath.device.cusolverdx_numba``) take the code that
    precompile() generated instead of generating it again."""
    numba_side = _import("nvmath.device.cusolverdx_numba")
    generate = numba_side.compile_solver_execute
    if getattr(generate, "takes_precompiled", False):
        return

    def compile_solver_execute(solver, code_type, execution_api):
        hit = _CODE.get(_codegen_key(solver, execution_api))
        if hit is not None and hit[0].code_type == code_type:
            return hit
        return generate(solver, code_type=code_type, execution_api=execution_api)

    compile_solver_execute.takes_precompiled = True
    numba_side.compile_solver_execute = compile_solver_execute


def _dx_codegen(job):
    """In a worker process: the plan of one setting and the code of its cuSOLVERDx functions."""
    op, dtype, n, cfg, limit = job
    try:
        dx = _import("nvmath.device")
        solver, lay = _dx_plan(op, dtype, n, cfg, limit)
        code_type = dx.current_device_lto()
        codes = {}
        for fn in [solver._factorize] + ([solver._solve] if op != "lu" else []):
            code = dx.compile_solver_execute(fn, code_type=code_type, execution_api="compiled_leading_dim")
            codes[_codegen_key(fn, "compiled_leading_dim")] = code
        return job, (lay.bpb, tuple(int(t) for t in solver.block_dim), lay.k), codes, ""
    except Exception as err:  # noqa: BLE001 - reported by the caller; the setting is tried again there
        return job, None, {}, f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"


def precompile(args) -> None:
    """Before timing: cuSOLVERDx's code for every point and setting this run will try, generated in
    parallel processes (libmathdx compiles each function with NVRTC: seconds apiece). numba-cuda
    then only builds and links each kernel in this process. Nothing happens when the run has no
    ``cusolverdx`` or nvmath-python cannot be imported; a pool that fails leaves the work to the
    points themselves."""
    import multiprocessing
    import os
    import time
    from concurrent.futures import ProcessPoolExecutor

    if "cusolverdx" not in (args.impls or ["cusolverdx"]) + list(getattr(args, "extra", [])):
        return
    try:
        _install_code_memo()
        _import("numba.cuda")
    except PeerUnavailable:
        return
    from batchlu.kernels import tuning

    limit = tuning.smem_optin()
    jobs = [(op, np.dtype(d).name, n, cfg, limit) for op in args.ops if op in IMPLS for d in args.dtypes
            for n in args.sizes if dx_layout(op, n, d, 1, 0, limit) is not None
            for cfg in dx_configs(op, SETTINGS["sweep"])]
    if not jobs:
        return
    start, failed = time.time(), []
    try:
        with ProcessPoolExecutor(min(len(jobs), os.cpu_count() or 1, 16),
                                 mp_context=multiprocessing.get_context("spawn")) as pool:
            for job, plan, codes, err in pool.map(_dx_codegen, jobs):
                if plan is None:
                    failed.append(err)
                    continue
                _PLANS[job[:4]] = plan
                _CODE.update(codes)
    except Exception as err:  # noqa: BLE001 - the points compile on their own instead
        print(f"cuSOLVERDx precompile failed ({type(err).__name__}: {err}); compiling per point", flush=True)
        return
    print(f"cuSOLVERDx: code of {len(jobs) - len(failed)} settings generated in {time.time() - start:.0f} s "
          f"({len(failed)} not possible here)", flush=True)


def _dx_case(op: str, batch: int, solver, lay: _Layout, row_major: bool, bufs: _DxBuffers,
             limit: int) -> Case:
    """The Case of one cuSOLVERDx setting: its kernel compiled, shared memory raised, checked by
    the caller."""
    cuda = _import("numba.cuda")
    flat = lambda x: cuda.as_cuda_array(x.reshape(-1))  # noqa: E731
    d_a, d_out, d_ipiv, d_info = flat(bufs.a), flat(bufs.out), flat(bufs.ipiv), flat(bufs.info)
    if op == "lu":
        args = (d_a, d_out, d_ipiv, d_info, batch)
    elif op == "solve":
        args = (d_a, flat(bufs.b), d_out, d_ipiv, d_info, batch)
    else:
        args = (d_a, d_out, cuda.as_cuda_array(bufs.unit), d_ipiv, d_info, batch)
    kernel = _kernel(op, solver, lay, row_major)
    static = _raise_smem_limit(kernel, args, lay.nbytes)
    if static + lay.nbytes > limit:
        raise PeerUnavailable(f"cuSOLVERDx's kernel needs {static} bytes of static shared memory "
                              f"besides {lay.nbytes} for its matrices; the device allows {limit}")
    block = tuple(int(t) for t in solver.block_dim)
    launch = kernel[-(-batch // lay.bpb), block, 0, lay.nbytes]
    src = bufs.src

    def prepare(k):
        bufs.a[...] = src[k % len(src)]

    def run():
        launch(*args)

    def check(k):
        a = src[k % len(src)]
        if op == "lu":
            return lu_ratio(a, bufs.out, bufs.ipiv, one_based=True, transposed=not row_major)
        if op == "inv":
            return inv_ratio(a, bufs.out)
        if row_major:
            return solve_ratio(a, bufs.out, bufs.b)
        return solve_ratio(a, bufs.out.transpose(0, 2, 1), bufs.b.transpose(0, 2, 1))

    note = (f"{'row' if row_major else 'col'}_major bpb={lay.bpb} block_dim={'x'.join(map(str, block))}"
            + (f" panel={lay.k}" if op == "inv" else "") + f" smem={lay.nbytes}+{static}")
    return Case(prepare, run, check=check, outputs=(bufs.out, bufs.ipiv, bufs.info), note=note)


def cusolverdx(op: str):
    """The ``cusolverdx`` factory of ``op``: every setting of the sweep checked and briefly timed,
    the fastest returned."""

    def factory(dtype, n, batch) -> Case:
        from batchlu.kernels import tuning

        _import("nvmath.device")
        _import("numba.cuda")
        limit = tuning.smem_optin()
        if dx_layout(op, n, dtype, 1, 0, limit) is None:
            need = _Layout(1, n, {"lu": 0, "solve": SOLVE_RHS}.get(op, 8), np.dtype(dtype).itemsize).nbytes
            raise PeerUnavailable(f"cuSOLVERDx keeps each matrix in shared memory: one n={n} "
                                  f"{np.dtype(dtype).name} matrix needs {need} bytes for {op}; the "
                                  f"device allows {limit} per block")
        _install_code_memo()
        configs = dx_configs(op, SETTINGS["sweep"])
        buffers: dict[str, _DxBuffers] = {}
        best, best_ms, seen, tried, problems = None, float("inf"), set(), 0, []
        for cfg in configs:
            try:
                solver, lay = _dx_plan(op, dtype, n, cfg, limit)
                key = (cfg.arrangement, lay.bpb, tuple(solver.block_dim), lay.k)
                if key in seen:
                    continue
                seen.add(key)
                row_major = cfg.arrangement == "row_major"
                if cfg.arrangement not in buffers:
                    buffers[cfg.arrangement] = _DxBuffers(op, dtype, n, batch, row_major)
                case = _dx_case(op, batch, solver, lay, row_major, buffers[cfg.arrangement], limit)
                check_case(case)
                ms = time_case(case, SWEEP_REPS) if len(configs) > 1 else 0.0
            except Exception as err:  # noqa: BLE001 - one setting failing leaves the others
                what = str(err).strip().splitlines()[0] if str(err).strip() else ""
                problems.append(what if isinstance(err, PeerUnavailable)
                                else f"{cfg}: {type(err).__name__}: {what}")
                continue
            tried += 1
            print(f"    cusolverdx {op} {np.dtype(dtype).name} n={n}: {case.note}: "
                  f"{'checked' if ms == 0.0 else f'{ms:.3f} ms'}", flush=True)
            if ms < best_ms:
                best, best_ms = case, ms
        del buffers  # the winner's closure keeps its own
        if best is None:
            text = "; ".join(dict.fromkeys(problems))[:400]
            if problems and all("shared memory" in p for p in problems):
                raise PeerUnavailable(text)
            raise RuntimeError(f"Expected a cuSOLVERDx setting that runs and passes its check. Got: {text}")
        skipped = f", {len(problems)} not run" if problems else ""
        best.note = f"nvmath-python {_version()} cuSOLVERDx {best.note} (fastest of {tried}{skipped})"
        return best

    return factory


# ---- nvmath.linalg.DirectSolver -------------------------------------------------------------------

def nvmath_solver(op: str):
    """The ``nvmath`` factory of ``op`` (DirectSolver, in place on the GPU)."""

    def factory(dtype, n, batch) -> Case:
        la = _import("nvmath.linalg")
        import cupy

        src = _sources(dtype, n, batch)
        a = cupy.empty_like(src[0])
        if op == "solve":
            b0 = _rhs(dtype, n, batch, (SOLVE_RHS, n)).transpose(0, 2, 1)  # (batch, n, 16) column-major
        elif op == "inv":
            b0 = cupy.empty((batch, n, n), dtype).transpose(0, 2, 1)
            b0[...] = cupy.eye(n, dtype=dtype)
        else:  # lu: DirectSolver needs a right-hand side; factorize() never reads it
            b0 = cupy.zeros((batch, 1, n), dtype).transpose(0, 2, 1)
        b = cupy.empty_like(b0.transpose(0, 2, 1)).transpose(0, 2, 1)
        b[...] = b0
        a[...] = src[0]
        solver = la.DirectSolver(a, b, options=la.DirectSolverOptions(inplace_a=True, inplace_b=True))
        solver.plan()
        state = {}

        def prepare(k):
            a[...] = src[k % len(src)]
            if op != "lu":
                b[...] = b0

        def run():
            solver.factorize()
            if op != "lu":
                state["x"] = solver.solve()

        def check(k):
            ref = src[k % len(src)]
            if op == "lu":  # cuBLAS' getrfBatched on the column-major view: A^T, 1-based pivots
                piv = getattr(solver.pivot, "tensor", solver.pivot)
                return lu_ratio(ref, a, piv, one_based=True, transposed=True)
            if op == "inv":
                return inv_ratio(ref, state["x"])
            return solve_ratio(ref, state["x"], b0)

        return Case(prepare, run, sync="block", check=check,
                    note=f"nvmath-python {_version()} DirectSolver, in place")

    return factory


IMPLS = {op: {"cusolverdx": cusolverdx(op), "nvmath": nvmath_solver(op)} for op in ("lu", "inv", "solve")}
FLOPS: dict = {}
