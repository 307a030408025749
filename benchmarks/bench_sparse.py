"""Sparse symmetric batches: factorize + solve per matrix, batchlu against its peers, on the
generators' matrices (``batchlu.testing.sparse``).

    python benchmarks/bench_sparse.py [--kinds fem-poisson,saddle] [--sizes 1000,5000] [--batch 64]
                                      [--dtype float64] [--dim 2] [--impls batchlu,scipy-splu]
                                      [--ordering amd] [--repeat 3] [--out results.json]

Implementations (``--impls``):

* ``batchlu``: ``batchlu.sparse`` on NumPy values (the CPU backend): ``plan.factorize(values)``
  then ``solve(b, refine=2)`` for the whole batch; the symbolic analysis is timed apart (once per
  pattern, not per batch);
* ``scipy-splu``: SciPy's SuperLU (``scipy.sparse.linalg.splu``, its default ordering) factor and
  solve, one matrix after the other in this thread.

Every matrix's backward error ``||b - A x||_inf / (||A||_inf ||x||_inf + ||b||_inf)`` is computed in
float64 from the same matrices; the records (one per point and implementation; the median of
``--repeat`` runs) carry the fields ``impl``, ``kind``, ``n``, ``nnz``, ``batch``, ``dtype``,
``seconds``, ``per_matrix_ms``, ``max_backward_error``, ``refine_steps`` (batchlu's largest),
``device`` and ``date``, and ``cpu_seconds`` (this process's CPU time: steadier than the wall time
on a shared machine). GPU implementations (batchlu on CuPy values, cuDSS) come with the GPU
numeric factorization.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time

import numpy as np


def _berr(problem, values, b, x) -> float:
    import scipy.sparse as sp

    worst = 0.0
    for i in range(values.shape[0]):
        low = sp.csr_array((values[i].astype(np.float64), problem.indices, problem.indptr),
                           shape=(problem.n, problem.n))
        a = low + sp.triu(low.T, k=1)
        r = b[i] - a @ x[i].astype(np.float64)
        den = abs(a).sum(axis=1).max() * np.abs(x[i]).max() + np.abs(b[i]).max()
        worst = max(worst, float(np.abs(r).max() / den))
    return worst


def run_batchlu(problem, values, b, ordering):
    import batchlu

    t = time.perf_counter()
    plan = batchlu.sparse.analyze(problem.indptr, problem.indices, problem.n, kind=problem.matrix_kind,
                                  ordering=ordering)
    plan.factorize(values[:1])    # the CPU schedule, built at the first factorization of a pattern
    analyze = time.perf_counter() - t
    t, c = time.perf_counter(), time.process_time()
    factor = plan.factorize(values)
    x, info = factor.solve(b, refine=2)
    seconds, cpu = time.perf_counter() - t, time.process_time() - c
    return seconds, x, {"cpu_seconds": cpu, "analyze_seconds": analyze, "refine_steps": int(np.max(factor.refine_steps)),
                        "info_nonzero": int(np.count_nonzero(info)), "nnz_l": plan.nnz_l,
                        "levels": plan.nlevels, "multiply_adds": plan.update_pairs}


def run_splu(problem, values, b, ordering):
    import scipy.sparse as sp
    from scipy.sparse.linalg import splu

    low = sp.csr_array((np.ones(problem.nnz), problem.indices, problem.indptr), shape=(problem.n, problem.n))
    full = (low + sp.triu(low.T, k=1)).tocsc()
    full.sort_indices()
    # where each lower entry lands in the full CSC (both triangles)
    index = sp.csc_array((np.arange(1, full.nnz + 1, dtype=float), full.indices, full.indptr),
                         shape=full.shape)
    rows = np.repeat(np.arange(problem.n), np.diff(problem.indptr))
    lower_pos = np.asarray(index[rows, problem.indices]).astype(np.int64) - 1
    upper_pos = np.asarray(index[problem.indices, rows]).astype(np.int64) - 1
    x = np.empty(b.shape, values.dtype)
    t, c = time.perf_counter(), time.process_time()
    for i in range(values.shape[0]):
        data = np.empty(full.nnz, values.dtype)
        data[upper_pos] = values[i]
        data[lower_pos] = values[i]
        a = sp.csc_matrix((data, full.indices, full.indptr), shape=full.shape)
        x[i] = splu(a).solve(b[i])
    return time.perf_counter() - t, x, {"cpu_seconds": time.process_time() - c}


IMPLS = {"batchlu": run_batchlu, "scipy-splu": run_splu}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kinds", default="fem-poisson,fem-elasticity,saddle,power-grid")
    ap.add_argument("--sizes", default="1000,5000")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--dtype", default="float64", choices=("float32", "float64"))
    ap.add_argument("--dim", type=int, default=2, choices=(2, 3))
    ap.add_argument("--impls", default="batchlu,scipy-splu")
    ap.add_argument("--ordering", default="amd", choices=("amd", "metis", "natural"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=None, help="write the records as JSON here")
    args = ap.parse_args(argv)

    from batchlu.testing import sparse

    device = f"CPU {platform.processor() or platform.machine()}, 1 thread"
    records = []
    for kind in args.kinds.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            problem = sparse.make(kind, size=size, dim=args.dim)
            values = problem.values(0, args.batch, args.dtype, seed=1)
            b = problem.rhs(0, args.batch, None, args.dtype, seed=1)
            for impl in args.impls.split(","):
                times, cpus, extra = [], [], {}
                for _ in range(args.repeat):
                    seconds, x, extra = IMPLS[impl](problem, values, b, args.ordering)
                    times.append(seconds)
                    cpus.append(extra["cpu_seconds"])
                seconds = statistics.median(times)
                extra["cpu_seconds"] = statistics.median(cpus)
                record = {"impl": impl, "kind": kind, "dim": args.dim, "n": problem.n, "nnz": problem.nnz,
                          "batch": args.batch, "dtype": args.dtype, "seconds": seconds,
                          "per_matrix_ms": 1e3 * seconds / args.batch,
                          "max_backward_error": _berr(problem, values, b, x), "device": device,
                          "date": datetime.date.today().isoformat(), **extra}
                records.append(record)
                print(f"{impl:>11} {kind:>15} n={problem.n:>6} B={args.batch:>4} {args.dtype}: "
                      f"{record['per_matrix_ms']:8.3f} ms/matrix wall, "
                      f"{1e3 * extra['cpu_seconds'] / args.batch:8.3f} CPU, "
                      f"max berr {record['max_backward_error']:.1e}"
                      + (f", analyze {extra['analyze_seconds']:.2f} s" if "analyze_seconds" in extra else ""),
                      flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
