"""Sparse LDL^T pivoting options on the generators' matrices: which matrices each one solves to the
backward-error tolerance, and at what cost (CPU backend).

    python benchmarks/bench_sparse_pivoting.py [--size 2200] [--batch 64] [--dtype float64]
                                               [--kinds kkt,saddle,power-grid,fem-poisson,fem-elasticity]
                                               [--deltas 1e-4,1e-6,1e-8,1e-10] [--gmres 4] [--repeat 5]
                                               [--out results.json]

Options (``--options``), each ``plan.factorize(values, ...)`` then ``solve(b, refine=2)`` for the
whole batch:

* ``sqrt-eps``: static pivoting at ``sqrt(eps) ||A||_inf``, alone (``pivot_tol=sqrt(eps)``: the
  threshold given, so no second attempt; the results of the defaults before the second attempt);
* ``eps``: static pivoting at ``eps ||A||_inf`` alone;
* ``default``: the defaults: ``sqrt(eps)``, and a second attempt at ``eps`` for the matrices left at
  -4 after perturbed pivots, kept where it perturbed no pivot (``Factor.solve``);
* ``gmres``: GMRES-based refinement (GMRES-IR: each step's correction by SciPy's GMRES(k),
  left-preconditioned by the ``sqrt-eps`` factors, against the float64 residual; up to 2 steps as
  the refinement's), one matrix at a time (the first ``--gmres`` of the batch), for the smallest
  restart length k among 2, 5, 10, 20, 50, 100, 200, 400 that reaches the tolerance; -4 where none
  does. Not timed: the preconditioned solves it took (``1 + steps (k + 1)``) against refinement's
  at most 3.

Per (kind, delta, option): the matrices at ``info`` 0, -4 and other codes, the largest normwise
backward error in units of ``n eps`` (the solve's tolerance is 1; the tests' bar 30), the most
perturbed pivots of a matrix (after the solve: those of the factors kept), how many matrices took
the second attempt, and the fastest of ``--repeat`` runs of factorize + solve, ms per matrix of wall
time and of this process's CPU time (steadier on a shared machine).
``kkt`` runs once per ``--deltas`` value; the records go to ``--out`` (JSON) and a Markdown table
is printed.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

OPTIONS = ("sqrt-eps", "eps", "default", "gmres")
RESTARTS = (2, 5, 10, 20, 50, 100, 200, 400)


def _threshold(option: str, dtype) -> float | None:
    eps = float(np.finfo(dtype).eps)
    return {"sqrt-eps": float(np.sqrt(eps)), "eps": eps, "default": None}[option]


def _solve_batch(plan, values, b, option):
    """``(factor, x, info, seconds, cpu seconds)`` of factorize + solve with the option's threshold."""
    start, cpu = time.perf_counter(), time.process_time()
    factor = plan.factorize(values, pivot_tol=_threshold(option, values.dtype))
    x, info = factor.solve(b)
    return factor, x, info, time.perf_counter() - start, time.process_time() - cpu


def _gmres(problem, plan, values, b, tol):
    """Per matrix: ``(preconditioned solves that reached tol or None, the backward error)`` of
    GMRES-IR: ``x = M^-1 b``, then up to 2 steps ``x += GMRES(k)(A, b - A x)`` (left-preconditioned by
    the factors M, one cycle of ``k`` iterations, the residual in float64), for the smallest ``k`` of
    :data:`RESTARTS` that reaches ``tol``; solves counted as ``1 + steps (k + 1)``."""
    import scipy.sparse as sp
    from scipy.sparse.linalg import LinearOperator, gmres

    out = []
    for i in range(values.shape[0]):
        factor = plan.factorize(values[i], pivot_tol=_threshold("sqrt-eps", values.dtype))
        low = sp.csr_array((values[i].astype(np.float64), problem.indices, problem.indptr), shape=(problem.n,) * 2)
        a = (low + sp.triu(low.T, k=1)).tocsr()
        precond = LinearOperator(a.shape, matvec=lambda r, f=factor: f.solve(r.astype(values.dtype), refine=0)[0]
                                 .astype(np.float64))
        rhs = b[i].astype(np.float64)
        first = factor.solve(b[i], refine=0)[0]
        found, last = None, float(factor.backward_error(b[i], first))
        for k in RESTARTS:
            x = first.astype(np.float64)
            for step in range(1, 3):
                d, _ = gmres(a, rhs - a @ x, M=precond, rtol=1e-300, atol=0.0, restart=k, maxiter=1)
                x = x + d
                last = float(factor.backward_error(b[i], x.astype(values.dtype)))
                if last <= tol:
                    found = 1 + step * (k + 1)
                    break
            if found is not None:
                break
        out.append((found, last))
    return out


def measure(problem, delta, option, values, b, args) -> dict:
    import batchlu

    plan = batchlu.sparse.analyze(problem.indptr, problem.indices, problem.n, kind=problem.matrix_kind)
    eps = float(np.finfo(values.dtype).eps)
    unit = problem.n * eps
    record = {"kind": problem.kind, "delta": delta, "n": problem.n, "nnz": problem.nnz, "batch": values.shape[0],
              "dtype": values.dtype.name, "option": option, "description": problem.description}
    if option == "gmres":
        runs = _gmres(problem, plan, values[:args.gmres], b[:args.gmres], unit)
        ks = [k for k, _ in runs]
        record.update(matrices=len(runs), ok=sum(k is not None for k in ks), refinement=sum(k is None for k in ks),
                      other=0, max_berr_n_eps=max((be for _, be in runs), default=0.0) / unit,
                      solves_max=None if None in ks else max(ks, default=0), ms_per_matrix=None)
        return record
    _solve_batch(plan, values[:1], b[:1], option)                 # compiled, caches warm
    times, cpu = [], []
    for _ in range(args.repeat):
        factor, x, info, seconds, cpu_seconds = _solve_batch(plan, values, b, option)
        times.append(seconds)
        cpu.append(cpu_seconds)
    berr = factor.last_backward_error
    record.update(matrices=int(info.size), ok=int(np.sum(info == 0)), refinement=int(np.sum(info == -4)),
                  other=int(np.sum((info != 0) & (info != -4))),
                  max_berr_n_eps=float(np.nanmax(berr)) / unit if np.isfinite(berr).any() else None,
                  perturbed_max=int(factor.perturbed_pivots().max()), retried=int(factor.retried().sum()),
                  refine_steps_max=int(factor.refine_steps.max()),
                  ms_per_matrix=1e3 * min(times) / values.shape[0], cpu_ms_per_matrix=1e3 * min(cpu) / values.shape[0])
    return record


def _options(text: str) -> tuple[str, ...]:
    """``--options``: names of :data:`OPTIONS`, comma separated."""
    chosen = tuple(text.split(","))
    if not set(chosen) <= set(OPTIONS):
        raise argparse.ArgumentTypeError(f"Expected options among {', '.join(OPTIONS)}. Got {text!r} instead.")
    return chosen


def table(records) -> str:
    lines = ["| kind | delta | n | option | info 0 | -4 | other | max berr / (n eps) | perturbed (max) | "
             "second attempts | ms / matrix (CPU ms) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        berr = "—" if r["max_berr_n_eps"] is None else f"{r['max_berr_n_eps']:.2g}"
        cost = (f"{r['ms_per_matrix']:.2f} ({r['cpu_ms_per_matrix']:.2f})" if r["ms_per_matrix"] is not None
                else f"{r['solves_max']} solves" if r.get("solves_max") is not None else "> 400 solves")
        lines.append(f"| {r['kind']} | {'' if r['delta'] is None else format(r['delta'], 'g')} | {r['n']:,} | "
                     f"{r['option']} | {r['ok']}/{r['matrices']} | {r['refinement']} | {r['other']} | {berr} | "
                     f"{r.get('perturbed_max', '—')} | {r.get('retried', '—')} | {cost} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kinds", default="kkt,saddle,power-grid,fem-poisson,fem-elasticity")
    ap.add_argument("--deltas", default="1e-4,1e-6,1e-8,1e-10", help="the kkt kind's regularizations")
    ap.add_argument("--size", type=int, default=2200)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--dtype", default="float64", choices=("float32", "float64"))
    ap.add_argument("--options", type=_options, default=OPTIONS, help=f"comma separated, of {', '.join(OPTIONS)}")
    ap.add_argument("--gmres", type=int, default=4, help="matrices per point that the gmres option solves")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=None, help="write the records as JSON here")
    args = ap.parse_args(argv)
    from batchlu.testing import sparse

    records = []
    for kind in args.kinds.split(","):
        deltas = [float(d) for d in args.deltas.split(",")] if kind == "kkt" else [None]
        for delta in deltas:
            problem = sparse.make(kind, size=args.size, seed=1, **({} if delta is None else {"delta": delta}))
            values = problem.values(0, args.batch, args.dtype, seed=2)
            b = problem.rhs(0, args.batch, None, args.dtype, seed=2)
            for option in args.options:
                records.append(measure(problem, delta, option, values, b, args))
                print(table(records[-1:]).splitlines()[-1], flush=True)
                if args.out:
                    Path(args.out).write_text(json.dumps(records, indent=1) + "\n")
    print()
    print(table(records))


if __name__ == "__main__":
    main()
