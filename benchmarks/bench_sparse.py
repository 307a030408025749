"""Sparse symmetric batches: factorize + solve per matrix, batchlu against its peers, on the
generators' matrices (``batchlu.testing.sparse``).

    python benchmarks/bench_sparse.py [--kinds fem-poisson,saddle] [--sizes 1000,5000] [--batch 64]
                                      [--dtype float64] [--dim 2] [--impls batchlu,scipy-splu]
                                      [--ordering amd] [--refine 2] [--repeat 3] [--out results.json]
    python benchmarks/bench_sparse.py --report results.json [--plot results.png]

Implementations (``--impls``):

* ``batchlu``: ``batchlu.sparse`` on NumPy values (the CPU backend): ``plan.factorize(values)``
  then ``solve(b, refine=2)`` for the whole batch, on ``--threads`` threads (``cpu_threads``);
  the symbolic analysis is timed apart (once per pattern, not per batch);
* ``scipy-splu``: SciPy's SuperLU (``scipy.sparse.linalg.splu``, its default ordering) factor and
  solve, one matrix after the other; with ``--threads k > 1`` the batch is cut into ``k`` ranges
  run by a pool of ``k`` worker processes (started and warmed before timing; two threads ran
  ``splu`` only 1.2x faster than one on a 2-core machine, so threads would not use the cores),
  the values and solutions shipped to and from them inside the timing;
* ``batchlu-gpu``: ``batchlu.sparse`` on CuPy values (the GPU backend, ``kernels/cuda/ldlt.cu``),
  values and right-hand sides already on the device; the batch goes through in one call, or in
  pieces halved at each out-of-memory error (``pieces`` in the record);
* ``cudss-uniform``: cuDSS's uniform batch through ``nvmath.bindings.cudss`` (the high-level
  ``nvmath.sparse.advanced.DirectSolver`` does not expose it): one CSR descriptor of the lower
  triangle (symmetric, or SPD for the FEM kinds) whose values hold the whole batch,
  ``CUDSS_CONFIG_UBATCH_SIZE`` = the batch, one analysis, then factorization and solve timed;
* ``cudss``: ``nvmath.sparse.advanced.DirectSolver`` on the batch as a sequence of CuPy CSR
  matrices (cuDSS's non-uniform batch), planned once, factorization and solve timed;
* ``dense-gpu``: batchlu's own dense batched solve (``batchlu.kernels.solve``, LU with partial
  pivoting) on the densified matrices, where ``B n^2`` numbers fit ``--dense-max-bytes``.

The GPU peers run ``--refine`` steps of iterative refinement as batchlu does (cuDSS's
``IR_N_STEPS``). Before any timing each implementation runs once and its backward error is
checked: above ``30 n eps`` (or not finite) the point is recorded with ``check`` ``failed ...``
and not timed, so that no time of a wrong answer is reported.

Every matrix's backward error ``||b - A x||_inf / (||A||_inf ||x||_inf + ||b||_inf)`` is computed in
float64 from the same matrices; the records (one per point and implementation; the median of
``--repeat`` runs) carry the fields ``impl``, ``kind``, ``n``, ``nnz``, ``batch``, ``dtype``,
``seconds``, ``per_matrix_ms``, ``factorizations_per_s``, ``max_backward_error``, ``refine_steps``
(batchlu's largest; the peers' configured steps), ``device``, ``date`` and ``check``, and for the
CPU ones ``threads`` and ``cpu_seconds`` (this process's CPU time, worker processes not included:
steadier than the wall time on a shared machine, meaningful with one thread only).

``--report`` measures nothing: it reads such records and prints a Markdown table, one row per
(kind, n, batch, dtype) point with the last record of each implementation there (newer records are
appended), and the bar line (batchlu against cuDSS's uniform batch where both passed, batch >= 256); the
table is also written next to ``--plot`` (or the records) as ``.md``. ``--plot`` draws ms per matrix
against n, a panel per kind.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
import time
from pathlib import Path

import numpy as np


def _berr(problem, values, b, x) -> float:
    """The largest normwise backward error over the batch, in float64 (NaN if any x is not finite)."""
    import scipy.sparse as sp

    worst = 0.0
    for i in range(values.shape[0]):
        if not np.isfinite(x[i]).all():
            return float("nan")
        low = sp.csr_array((values[i].astype(np.float64), problem.indices, problem.indptr),
                           shape=(problem.n, problem.n))
        a = low + sp.triu(low.T, k=1)
        r = b[i] - a @ x[i].astype(np.float64)
        den = abs(a).sum(axis=1).max() * np.abs(x[i]).max() + np.abs(b[i]).max()
        worst = max(worst, float(np.abs(r).max() / den))
    return worst


class Skip(Exception):
    """This implementation cannot run this point here (a package missing, out of memory): recorded."""


# ------------------------------------------------------------------------------------------- CPU
class BatchluCPU:
    """batchlu.sparse on NumPy values (the CPU backend)."""

    def __init__(self, problem, values, b, args):
        import batchlu

        self.values, self.b, self.refine, self.threads = values, b, args.refine, args.threads
        t = time.perf_counter()
        self.plan = batchlu.sparse.analyze(problem.indptr, problem.indices, problem.n, kind=problem.matrix_kind,
                                           ordering=args.ordering)
        self.plan.factorize(values[:1])    # the CPU schedule, built at the first factorization of a pattern
        self.extra = {"analyze_seconds": time.perf_counter() - t, "nnz_l": self.plan.nnz_l,
                      "levels": self.plan.nlevels, "multiply_adds": self.plan.update_pairs}

    def run(self):
        from batchlu.kernels import cpu_threads

        with cpu_threads(self.threads):
            factor = self.plan.factorize(self.values)
            x, info = factor.solve(self.b, refine=self.refine)
        self.extra.update(refine_steps=int(np.max(factor.refine_steps)) if factor.refine_steps.size else 0,
                          info_nonzero=int(np.count_nonzero(info)))
        return x


class SciPySplu:
    """SciPy's SuperLU, one matrix after the other."""

    def __init__(self, problem, values, b, args):
        import scipy.sparse as sp

        self.values, self.b, self.extra = values, b, {}
        low = sp.csr_array((np.ones(problem.nnz), problem.indices, problem.indptr), shape=(problem.n, problem.n))
        full = (low + sp.triu(low.T, k=1)).tocsc()
        full.sort_indices()
        self.full = full
        # where each lower entry lands in the full CSC (both triangles)
        index = sp.csc_array((np.arange(1, full.nnz + 1, dtype=float), full.indices, full.indptr),
                             shape=full.shape)
        rows = np.repeat(np.arange(problem.n), np.diff(problem.indptr))
        self.lower_pos = np.asarray(index[rows, problem.indices]).astype(np.int64) - 1
        self.upper_pos = np.asarray(index[problem.indices, rows]).astype(np.int64) - 1

        self.workers = args.threads
        self.pool = None
        if self.workers > 1:   # threads ran splu 1.2x faster on 2 cores: processes use the cores
            import concurrent.futures
            import multiprocessing

            self.pool = concurrent.futures.ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("fork"))
            list(self.pool.map(_splu_range, [(full, self.upper_pos, self.lower_pos, values[:1], b[:1])] * self.workers))

    def run(self):
        if self.pool is None:
            return _splu_range((self.full, self.upper_pos, self.lower_pos, self.values, self.b))
        count = self.values.shape[0]
        bounds = [count * i // self.workers for i in range(self.workers + 1)]
        parts = [(self.full, self.upper_pos, self.lower_pos, self.values[lo:hi], self.b[lo:hi])
                 for lo, hi in zip(bounds[:-1], bounds[1:])]
        return np.concatenate(list(self.pool.map(_splu_range, parts)))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


def _splu_range(job):
    """SuperLU factor and solve of each matrix of ``values``, one after the other."""
    import scipy.sparse as sp
    from scipy.sparse.linalg import splu

    full, upper_pos, lower_pos, values, b = job
    x = np.empty(b.shape, values.dtype)
    for i in range(values.shape[0]):
        data = np.empty(full.nnz, values.dtype)
        data[upper_pos] = values[i]
        data[lower_pos] = values[i]
        a = sp.csc_matrix((data, full.indices, full.indptr), shape=full.shape)
        x[i] = splu(a).solve(b[i])
    return x


# ------------------------------------------------------------------------------------------- GPU
def _cupy():
    try:
        import cupy
    except ImportError as exc:
        raise Skip(f"CuPy is not installed ({exc})") from None
    if cupy.cuda.runtime.getDeviceCount() < 1:
        raise Skip("no CUDA device")
    return cupy


def _sync():
    import cupy

    cupy.cuda.get_current_stream().synchronize()


class BatchluGPU:
    """batchlu.sparse on CuPy values (kernels/cuda/ldlt.cu); pieces halved on out-of-memory."""

    def __init__(self, problem, values, b, args):
        import batchlu

        cupy = _cupy()
        t = time.perf_counter()
        self.plan = batchlu.sparse.analyze(problem.indptr, problem.indices, problem.n, kind=problem.matrix_kind,
                                           ordering=args.ordering)
        analyze = time.perf_counter() - t
        self.values, self.b = cupy.asarray(values), cupy.asarray(b)
        self.refine, self.piece = args.refine, values.shape[0]
        t = time.perf_counter()
        self.plan.factorize(self.values[:1]).solve(self.b[:1], refine=1)   # compile, index maps to the device
        _sync()
        self.extra = {"analyze_seconds": analyze, "warmup_seconds": time.perf_counter() - t,
                      "nnz_l": self.plan.nnz_l, "levels": self.plan.nlevels,
                      "multiply_adds": self.plan.update_pairs}

    def run(self):
        import cupy

        count, start, xs, steps, info_nonzero = self.values.shape[0], 0, [], 0, 0
        while start < count:
            stop = min(count, start + self.piece)
            factor = None
            try:
                factor = self.plan.factorize(self.values[start:stop])
                x, info = factor.solve(self.b[start:stop], refine=self.refine)
                steps = max(steps, int(factor.refine_steps.max()))
                info_nonzero += int(cupy.count_nonzero(info))
            except cupy.cuda.memory.OutOfMemoryError:
                factor = None
                cupy.get_default_memory_pool().free_all_blocks()
                if self.piece == 1:
                    raise Skip("out of device memory for one matrix") from None
                self.piece = max(1, self.piece // 2)
                continue
            xs.append(x)
            start = stop
        _sync()
        self.extra.update(refine_steps=steps, info_nonzero=info_nonzero, pieces=-(-count // self.piece))
        return cupy.concatenate(xs).get()


def _nvmath():
    from _nvmath_impls import preload_nvidia_lib

    preload_nvidia_lib("libcudss.so.0", needs=("cublas", "cublasLt"))  # nvmath 1.0 takes cuDSS 0.x
    try:
        import nvmath  # noqa: F401
        from nvmath.bindings import cudss
    except ImportError as exc:
        raise Skip(f"nvmath-python with cuDSS is not installed ({exc})") from None
    return cudss


def _value_type(dtype):
    import nvmath

    return int(nvmath.CudaDataType.CUDA_R_64F if np.dtype(dtype) == np.float64 else nvmath.CudaDataType.CUDA_R_32F)


def _full_pattern(problem):
    """Both triangles of the pattern in CSR (int32, columns sorted) and, per entry, its index into
    a row of values (the lower entry it mirrors)."""
    import scipy.sparse as sp

    low = sp.csr_array((np.arange(1, problem.nnz + 1, dtype=np.float64), problem.indices, problem.indptr),
                       shape=(problem.n, problem.n))
    full = (low + sp.triu(low.T, k=1)).tocsr()
    full.sort_indices()
    return full.indptr.astype(np.int32), full.indices.astype(np.int32), full.data.astype(np.int64) - 1


class CudssUniform:
    """cuDSS's uniform batch (CUDSS_CONFIG_UBATCH_SIZE) through nvmath.bindings.cudss: one CSR
    descriptor of the lower triangle whose values array holds the batch, matrix after matrix."""

    def __init__(self, problem, values, b, args):
        cupy, cudss = _cupy(), _nvmath()
        import nvmath

        count, n, nnz = values.shape[0], problem.n, problem.nnz
        self.cudss, self.count = cudss, count
        self.indptr = cupy.asarray(problem.indptr.astype(np.int32))
        self.indices = cupy.asarray(problem.indices.astype(np.int32))
        self.values = cupy.ascontiguousarray(cupy.asarray(values))          # (B, nnz): batch-major
        self.b = cupy.ascontiguousarray(cupy.asarray(b))                    # (B, n)
        self.x = cupy.empty_like(self.b)
        self.handle = cudss.create()
        cudss.set_stream(self.handle, cupy.cuda.get_current_stream().ptr)
        self.config = cudss.config_create()
        self.data = cudss.data_create(self.handle)
        self._set(cudss.ConfigParam.UBATCH_SIZE, count)
        self._set(cudss.ConfigParam.IR_N_STEPS, args.refine)
        self.index, self.value = int(nvmath.CudaDataType.CUDA_R_32I), _value_type(values.dtype)
        layout = int(cudss.Layout.COL_MAJOR)
        self.bm = cudss.matrix_create_dn(n, 1, n, self.b.data.ptr, self.value, layout)
        self.xm = cudss.matrix_create_dn(n, 1, n, self.x.data.ptr, self.value, layout)
        if args.cudss_view == "lower":
            mtype = cudss.MatrixType.SPD if problem.matrix_kind == "spd" else cudss.MatrixType.SYMMETRIC
            self.a = self._csr(n, nnz, mtype, cudss.MatrixViewType.LOWER)
        else:   # the general matrix, both triangles
            indptr, indices, src = _full_pattern(problem)
            self.indptr, self.indices = cupy.asarray(indptr), cupy.asarray(indices)
            self.values = cupy.ascontiguousarray(self.values[:, cupy.asarray(src)])
            mtype = cudss.MatrixType.GENERAL
            self.a = self._csr(n, indices.size, mtype, cudss.MatrixViewType.FULL)
        t = time.perf_counter()
        self._execute(cudss.Phase.ANALYSIS)
        _sync()
        self.extra = {"analyze_seconds": time.perf_counter() - t, "matrix_type": mtype.name,
                      "refine_steps": args.refine}

    def _csr(self, n: int, nnz: int, mtype, view):
        cudss = self.cudss
        csr = (n, n, nnz, self.indptr.data.ptr, 0, self.indices.data.ptr, self.values.data.ptr)
        tail = (self.value, int(mtype), int(view), int(cudss.IndexBase.ZERO))
        try:   # nvmath-python >= 0.7 (cuDSS 0.7): offset and index types apart
            return cudss.matrix_create_csr(*csr, self.index, self.index, *tail)
        except TypeError:
            return cudss.matrix_create_csr(*csr, self.index, *tail)

    def _set(self, param, number: int) -> None:
        value = np.array([number], np.int32)
        self.cudss.config_set(self.config, int(param), value.ctypes.data, value.nbytes)

    def _execute(self, phase) -> None:
        self.cudss.execute(self.handle, int(phase), self.config, self.data, self.a, self.xm, self.bm)

    def run(self):
        self._execute(self.cudss.Phase.FACTORIZATION)
        self._execute(self.cudss.Phase.SOLVE)
        _sync()
        return self.x.get()

    def close(self) -> None:
        cudss = self.cudss
        for matrix in (self.a, self.bm, self.xm):
            cudss.matrix_destroy(matrix)
        cudss.data_destroy(self.handle, self.data)
        cudss.config_destroy(self.config)
        cudss.destroy(self.handle)


class Cudss:
    """nvmath.sparse.advanced.DirectSolver on the batch as a sequence of CuPy CSR matrices."""

    def __init__(self, problem, values, b, args):
        cupy = _cupy()
        _nvmath()
        import cupyx.scipy.sparse as csp
        from nvmath.sparse.advanced import (DirectSolver, DirectSolverMatrixType, DirectSolverMatrixViewType,
                                            DirectSolverOptions)

        if args.cudss_view == "lower":
            indptr = cupy.asarray(problem.indptr.astype(np.int32))
            indices = cupy.asarray(problem.indices.astype(np.int32))
            self.values = cupy.asarray(values)
            mtype = DirectSolverMatrixType.SPD if problem.matrix_kind == "spd" else DirectSolverMatrixType.SYMMETRIC
            view = DirectSolverMatrixViewType.LOWER
        else:   # the general matrix, both triangles
            full_indptr, full_indices, src = _full_pattern(problem)
            indptr, indices = cupy.asarray(full_indptr), cupy.asarray(full_indices)
            self.values = cupy.ascontiguousarray(cupy.asarray(values)[:, cupy.asarray(src)])
            mtype, view = DirectSolverMatrixType.GENERAL, DirectSolverMatrixViewType.FULL
        self.b = [cupy.ascontiguousarray(cupy.asarray(row)) for row in b]
        self.a = [csp.csr_matrix((self.values[i], indices, indptr), shape=(problem.n, problem.n))
                  for i in range(values.shape[0])]
        options = DirectSolverOptions(sparse_system_type=mtype, sparse_system_view=view)
        self.solver = DirectSolver(self.a, self.b, options=options)
        self.solver.solution_config.ir_num_steps = args.refine
        t = time.perf_counter()
        self.solver.plan()
        _sync()
        self.extra = {"analyze_seconds": time.perf_counter() - t, "matrix_type": mtype.name,
                      "refine_steps": args.refine}

    def run(self):
        import cupy

        self.solver.factorize()
        x = self.solver.solve()
        _sync()
        return cupy.stack(x).get()

    def close(self) -> None:
        self.solver.free()


class DenseGPU:
    """batchlu's dense batched solve (LU with partial pivoting) on the densified matrices."""

    def __init__(self, problem, values, b, args):
        cupy = _cupy()
        need = values.shape[0] * problem.n ** 2 * values.dtype.itemsize
        if need > args.dense_max_bytes:
            raise Skip(f"the dense batch needs {need / 2**30:.1f} GiB (over --dense-max-bytes)")
        from batchlu import kernels

        self.kernels = kernels
        self.a = cupy.asarray(problem.dense(values).astype(values.dtype))
        self.b = cupy.asarray(b)
        self.kernels.solve(self.a[:1], self.b[:1])   # compile
        _sync()
        self.extra = {}

    def run(self):
        x, info = self.kernels.solve(self.a, self.b)
        _sync()
        self.extra["info_nonzero"] = int(np.count_nonzero(info.get()))
        return x.get()


IMPLS = {"batchlu": BatchluCPU, "scipy-splu": SciPySplu, "batchlu-gpu": BatchluGPU, "cudss-uniform": CudssUniform,
         "cudss": Cudss, "dense-gpu": DenseGPU}
GPU_IMPLS = ("batchlu-gpu", "cudss-uniform", "cudss", "dense-gpu")


def _device(impl: str) -> str:
    if impl in GPU_IMPLS:
        import cupy

        name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    return f"CPU {platform.processor() or platform.machine()}"


CUDSS_IMPLS = ("cudss-uniform", "cudss")


def measure(impl: str, problem, values, b, args) -> dict:
    """One point of one implementation; for cuDSS, its best mode: each of ``--cudss-views`` in
    turn (the symmetric matrix's lower triangle, or the general matrix with both triangles), the
    fastest that passes the check (the record lists every view's outcome)."""
    if impl not in CUDSS_IMPLS:
        return measure_one(impl, problem, values, b, args)
    tried = []
    for view in args.cudss_views.split(","):
        record = measure_one(impl, problem, values, b, argparse.Namespace(**{**vars(args), "cudss_view": view}))
        record["cudss_view"] = view
        tried.append(record)
    passed = [r for r in tried if r["seconds"] is not None]
    best = min(passed, key=lambda r: r["seconds"]) if passed else tried[-1]
    return {**best, "views_tried": {r["cudss_view"]: r["check"] for r in tried}}


def measure_one(impl: str, problem, values, b, args) -> dict:
    """One point of one implementation: prepare (untimed), run once and check the backward error,
    then ``--repeat`` timed runs (median)."""
    base = {"impl": impl, "threads": args.threads if impl not in GPU_IMPLS else None, "kind": problem.kind,
            "dim": args.dim, "n": problem.n, "nnz": problem.nnz,
            "batch": values.shape[0], "dtype": str(values.dtype), "date": datetime.date.today().isoformat()}
    runner = None
    try:
        runner = IMPLS[impl](problem, values, b, args)
        base["device"] = _device(impl)
        t = time.perf_counter()
        x = runner.run()
        base["first_seconds"] = time.perf_counter() - t     # the checked run: batchlu-gpu captures its graphs here
        berr = _berr(problem, values, b, x)
        bound = 30 * problem.n * np.finfo(values.dtype).eps
        base["max_backward_error"] = berr
        if not berr <= bound:
            return {**base, "check": f"failed: backward error {berr:.3g} > 30 n eps = {bound:.3g}",
                    "seconds": None, **runner.extra}
        times, cpus = [], []
        for _ in range(args.repeat):
            t, c = time.perf_counter(), time.process_time()
            runner.run()
            times.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c)
    except Skip as why:
        return {**base, "check": f"skipped: {why}", "seconds": None}
    except Exception as exc:   # a peer (or batchlu) failing at one point: recorded, the sweep goes on
        import traceback

        traceback.print_exc()
        return {**base, "check": f"error: {type(exc).__name__}: {exc}", "seconds": None}
    finally:
        if runner is not None and hasattr(runner, "close"):
            runner.close()
    seconds = statistics.median(times)
    record = {**base, "check": "ok", "seconds": seconds, "per_matrix_ms": 1e3 * seconds / values.shape[0],
              "factorizations_per_s": values.shape[0] / seconds, **runner.extra}
    if impl not in GPU_IMPLS:
        record["cpu_seconds"] = statistics.median(cpus)
    return record


# ---------------------------------------------------------------------------------------- report
BAR_BATCH = 256   # the bar's points: batch >= this; the plot's lines: this batch
PEERS = ("cudss-uniform", "cudss", "dense-gpu")


def latest(records: list[dict]) -> dict:
    """``(kind, n, batch, dtype, impl)`` -> the last such record: newer records are appended."""
    return {(r["kind"], r["n"], r["batch"], r["dtype"], r["impl"]): r for r in records}


def _ok(record) -> bool:
    return record is not None and record["check"] == "ok"


def _short(record: dict) -> str:
    """A check that did not pass, in a few words: ``failed (berr nan)``, ``skipped``, ``error (TypeError)``."""
    word, _, why = record["check"].partition(": ")
    if word == "failed" and record.get("max_backward_error") is not None:
        return f"failed (berr {record['max_backward_error']:.2g})"
    if word == "error":
        return f"error ({why.partition(':')[0]})"
    return word


def _ms(record) -> str:
    if record is None:
        return "-"
    return f"{record['per_matrix_ms']:.3f}" if _ok(record) else _short(record)


def _berr_cell(record) -> str:
    return f"{record['max_backward_error']:.1e}" if _ok(record) else "-"


def best_cudss(last: dict, point: tuple) -> dict | None:
    """cuDSS's best mode at ``point``: the faster of its uniform batch and DirectSolver that passed;
    None unless both were measured there (a mode left out may have been the faster)."""
    tried = [last.get((*point, impl)) for impl in ("cudss-uniform", "cudss")]
    if None in tried:
        return None
    return min((r for r in tried if _ok(r)), key=lambda r: r["per_matrix_ms"], default=None)


def speed(last: dict, point: tuple) -> float | None:
    """cuDSS's best time over batchlu-gpu's at ``point``, where batchlu and a cuDSS mode passed."""
    ours, peer = last.get((*point, "batchlu-gpu")), best_cudss(last, point)
    return peer["per_matrix_ms"] / ours["per_matrix_ms"] if _ok(ours) and peer is not None else None


def report(records: list[dict]) -> str:
    """The Markdown table of ``records``, one row per (kind, n, batch, dtype) point, and the bar line."""
    last = latest(records)
    kinds = list(dict.fromkeys(r["kind"] for r in records))
    points = sorted({key[:4] for key in last}, key=lambda p: (kinds.index(p[0]), *p[1:]))
    head = ("| kind | n | nnz (lower) | batch | dtype | batchlu-gpu ms/matrix (refinement steps) "
            "| cuDSS uniform ms/matrix | cuDSS DirectSolver ms/matrix | batchlu / cuDSS best | dense-gpu ms/matrix "
            "| max backward error batchlu / cuDSS best |")
    lines = [head, "|---|---:|---:|---:|---|---:|---:|---:|---|---:|---|"]
    for point in points:
        kind, n, batch, dtype = point
        ours = last.get((*point, "batchlu-gpu"))
        uniform, solver, dense = (last.get((*point, impl)) for impl in PEERS)
        nnz = next(r["nnz"] for r in (ours, uniform, solver, dense) if r is not None)
        steps = f" ({ours['refine_steps']})" if _ok(ours) else ""
        ratio = speed(last, point)
        lines.append(f"| {kind} | {n:,} | {nnz:,} | {batch:,} | {dtype} | {_ms(ours)}{steps} | {_ms(uniform)} "
                     f"| {_ms(solver)} | {'-' if ratio is None else f'{ratio:.2f}x'} | {_ms(dense)} "
                     f"| {_berr_cell(ours)} / {_berr_cell(best_cudss(last, point))} |")
    return "\n".join(lines) + "\n\n" + bar(last, points)


def bar(last: dict, points: list[tuple]) -> str:
    """The bar line: over the points with batch >= BAR_BATCH where batchlu-gpu and a cuDSS mode
    passed, the geometric mean and the minimum of the speed against cuDSS's best; and cuDSS's failed
    checks."""
    points = [p for p in points if p[2] >= BAR_BATCH]
    speeds = {p: s for p in points if (s := speed(last, p)) is not None}
    failed = {impl: sum(1 for p in points if (r := last.get((*p, impl))) and r["check"].startswith("failed"))
              for impl in ("cudss-uniform", "cudss")}
    head = f"Bar (batch >= {BAR_BATCH}, both cuDSS modes measured, batchlu-gpu and one of them ok): "
    tail = (f"cuDSS failed its check at {failed['cudss-uniform']} of {len(points)} points (uniform batch), "
            f"{failed['cudss']} (DirectSolver).")
    if not speeds:
        return head + "no point. " + tail
    geo = math.exp(sum(math.log(s) for s in speeds.values()) / len(speeds))
    low = min(speeds, key=speeds.get)
    return (head + f"batchlu / cuDSS best geometric mean {geo:.2f}x over {len(speeds)} points; minimum "
            f"{speeds[low]:.2f}x at {low[0]} n={low[1]} B={low[2]} {low[3]}. " + tail)


def plot(records: list[dict], path) -> None:
    """ms per matrix against n (log-log), a panel per kind: batchlu-gpu and cuDSS (uniform batch,
    DirectSolver), lines
    at batch BAR_BATCH, markers at other batches; points that did not pass are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    impls = ("batchlu-gpu", "cudss-uniform", "cudss")
    ok = [r for r in latest(records).values() if _ok(r) and r["impl"] in impls]
    kinds = list(dict.fromkeys(r["kind"] for r in records))
    dtypes = sorted({r["dtype"] for r in ok})
    rows = -(-len(kinds) // 2)
    fig, axes = plt.subplots(rows, 2, figsize=(9, 3.6 * rows), squeeze=False)
    for ax in axes.flat[len(kinds):]:
        ax.axis("off")
    for ax, kind in zip(axes.flat, kinds):
        for color, impl in enumerate(impls):
            for style, dtype in zip(("-", "--", ":"), dtypes):
                sub = sorted((r["batch"], r["n"], r["per_matrix_ms"]) for r in ok
                             if (r["kind"], r["impl"], r["dtype"]) == (kind, impl, dtype))
                name = impl if len(dtypes) == 1 else f"{impl} {dtype}"
                line = [(n, ms) for b, n, ms in sub if b == BAR_BATCH]
                if line:
                    ax.plot(*zip(*line), style, marker="o", ms=3, color=f"C{color}", label=f"{name} B={BAR_BATCH}")
                for marker, batch in zip("sv^D<>", sorted({b for b, _, _ in sub} - {BAR_BATCH})):
                    pts = [(n, ms) for b, n, ms in sub if b == batch]
                    ax.plot(*zip(*pts), marker, ls="", color=f"C{color}", label=f"{name} B={batch}")
        ax.set(xscale="log", yscale="log", title=kind, xlabel="n", ylabel="ms per matrix")
        ax.grid(alpha=0.3, which="both")
        if ax.has_data():
            ax.legend(fontsize=7)
    devices = sorted({r["device"] for r in ok if r.get("device")})
    fig.suptitle(f"sparse factorize + solve, {', '.join(devices)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kinds", default="fem-poisson,fem-elasticity,saddle,power-grid")
    ap.add_argument("--sizes", default="1000,5000")
    ap.add_argument("--batch", default="64", help="batch sizes, comma separated")
    ap.add_argument("--dtype", default="float64", choices=("float32", "float64"))
    ap.add_argument("--dim", type=int, default=2, choices=(2, 3))
    ap.add_argument("--impls", default="batchlu,scipy-splu",
                    help=f"comma separated, of {', '.join(IMPLS)}")
    ap.add_argument("--ordering", default="amd", choices=("amd", "metis", "natural"))
    ap.add_argument("--refine", type=int, default=2, help="iterative refinement steps (batchlu and cuDSS)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU implementations: batchlu's threads (cpu_threads), splu's worker processes")
    ap.add_argument("--dense-max-bytes", type=float, default=8 * 2**30)
    ap.add_argument("--cudss-views", default="lower,full",
                    help="cuDSS modes tried per point, the fastest that passes is recorded: lower (SPD or "
                         "SYMMETRIC, lower triangle) and full (GENERAL, both triangles)")
    ap.add_argument("--out", default=None, help="write the records as JSON here")
    ap.add_argument("--report", default=None, metavar="JSON",
                    help="measure nothing: print these records' table (also written next to --plot, or "
                         "to JSON, as .md)")
    ap.add_argument("--plot", default=None, metavar="PNG", help="with --report: ms per matrix against n, here")
    args = ap.parse_args(argv)
    if args.plot and not args.report:
        ap.error("Expected --report with --plot. Got --plot alone instead.")
    if args.report:
        records = json.loads(Path(args.report).read_text())
        text = report(records)
        print(text)
        Path(args.plot or args.report).with_suffix(".md").write_text(text + "\n")
        if args.plot:
            plot(records, args.plot)
        return
    impls = args.impls.split(",")
    unknown = [i for i in impls if i not in IMPLS]
    if unknown:
        ap.error(f"Expected --impls among {', '.join(IMPLS)}. Got {', '.join(unknown)} instead.")

    from batchlu.testing import sparse

    records = []
    for kind in args.kinds.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            problem = sparse.make(kind, size=size, dim=args.dim)
            for batch in (int(s) for s in args.batch.split(",")):
                values = problem.values(0, batch, args.dtype, seed=1)
                b = problem.rhs(0, batch, None, args.dtype, seed=1)
                for impl in impls:
                    record = measure(impl, problem, values, b, args)
                    records.append(record)
                    if args.out:   # written as it goes: a long sweep keeps what it measured
                        with open(args.out, "w") as f:
                            json.dump(records, f, indent=1)
                    head = f"{impl:>13} {kind:>15} n={problem.n:>6} B={batch:>5} {args.dtype}:"
                    if record["seconds"] is None:
                        print(f"{head} {record['check']}", flush=True)
                        continue
                    print(f"{head} {record['per_matrix_ms']:9.4f} ms/matrix, "
                          f"{record['factorizations_per_s']:10.1f} /s, max berr {record['max_backward_error']:.1e}"
                          + (f", refine {record['refine_steps']}" if "refine_steps" in record else "")
                          + (f", analyze {record['analyze_seconds']:.2f} s" if "analyze_seconds" in record else ""),
                          flush=True)


if __name__ == "__main__":
    main()
