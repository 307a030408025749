"""The CPU backend against NumPy's batched routines and a Python loop over SciPy, on in-memory arrays.

    python benchmarks/bench_cpu.py [--ops lu_factor,lu_solve,inv,solve,slogdet]
                                   [--dtypes float32,float64,complex64,complex128]
                                   [--sizes 2,4,8,16,32,64,128] [--scale 1.0] [--rhs 1]
                                   [--repeat 7] [--machine NAME] [--out PATH]

Peers, per op: ``inv`` ``numpy.linalg.inv``; ``solve`` ``numpy.linalg.solve``; ``slogdet``
``numpy.linalg.slogdet``; ``lu_factor`` and ``lu_solve`` a Python loop over
``scipy.linalg.lu_factor`` / ``lu_solve`` (``check_finite=False``, one matrix per call: NumPy has
no LU). batchlu is timed twice: with its default thread count (``batchlu``: every core of the
process) and with one thread (``batchlu-1thread``), the per-core comparison with NumPy, which runs
one matrix after another on one thread.

Batches: 100,000 matrices for n <= 16, 10,000 for n = 32-64, 2,000 above (times ``--scale``),
fresh random entries uniform in [-1, 1) (``batchlu.testing.matrices``). The SciPy loops, whose
cost is linear in the batch, run on the first 5,000 matrices at most; each record carries its own
``batch``. Before anything is timed, every implementation is checked on 64 matrices of the case
with LAPACK's test ratios (get01 / get02 / get03, slogdet's) against a threshold of 30: one that
computes the wrong thing is reported and not timed.

Timing: one warm-up call each (the first call of batchlu compiles, or loads numba's cache), then
``--repeat`` rounds in which the implementations take turns; the best wall time of each is kept
(the machine is shared: the minimum is the least disturbed run). Prints a table (ms, and the
peer's time over batchlu's: > 1 means batchlu is faster) and writes the records, ``op``, ``dtype``,
``n``, ``batch``, ``impl``, ``seconds``, ``cores``, ``threads``, ``date``, ``seed``, ``load`` (the
1-minute load average when the case ended: on a shared machine, above the core count means other
processes took cores from the timings), to ``benchmarks/results/cpu-<machine>.json`` (machine: the
host name unless given). Records already there are kept, but for the (op, dtype, n) this run
measures again, so that a case timed while the machine was busy can be timed again on its own; the
file lists every command that wrote its records.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import sys
import time
from pathlib import Path

import numpy as np
import scipy
import scipy.linalg

from batchlu import kernels
from batchlu.testing import matrices
from batchlu.testing.ratios import THRESHOLD, get01, get02, get03, slogdet_ratios

ROOT = Path(__file__).resolve().parents[1]
OPS = ("lu_factor", "lu_solve", "inv", "solve", "slogdet")
DTYPES = ("float32", "float64", "complex64", "complex128")
SIZES = (2, 4, 8, 16, 32, 64, 128)
LOOP_MAX = 5000        # matrices the SciPy loops run on
CHECK = 64             # matrices each implementation is checked on before it is timed


def default_batch(n: int) -> int:
    return 100_000 if n <= 16 else 10_000 if n <= 64 else 2_000


# --- implementations: f(case) -> outputs; each op's check reads them -------------------------


def _ours(op, threads):
    def run(c):
        with kernels.cpu_threads(threads):
            if op == "lu_factor":
                return kernels.lu_factor(c["a"])
            if op == "lu_solve":
                return (kernels.lu_solve(c["lu"], c["piv"], c["b"]),)
            if op == "inv":
                return kernels.inv(c["a"])
            if op == "solve":
                return kernels.solve(c["a"], c["b"])
            return kernels.slogdet(c["a"])
    return run


def _numpy(op):
    def run(c):
        if op == "inv":
            return (np.linalg.inv(c["a"]),)
        if op == "solve":
            return (np.linalg.solve(c["a"], c["b"]),)
        sign, logabsdet = np.linalg.slogdet(c["a"])
        return sign, logabsdet
    return run


def _scipy_loop(op):
    def run(c):
        if op == "lu_factor":
            pairs = [scipy.linalg.lu_factor(m, check_finite=False) for m in c["a"]]
            return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])
        lu, piv, b = c["lu"], c["piv"], c["b"]
        return (np.stack([scipy.linalg.lu_solve((lu[i], piv[i]), b[i], check_finite=False)
                          for i in range(len(b))]),)
    return run


def implementations(op: str, cores: int) -> dict:
    impls = {"batchlu": _ours(op, cores), "batchlu-1thread": _ours(op, 1)}
    if op in ("lu_factor", "lu_solve"):
        impls["scipy-loop"] = _scipy_loop(op)
    else:
        impls["numpy"] = _numpy(op)
    return impls


def check(op: str, case: dict, out) -> float:
    """The largest LAPACK test ratio of ``out`` on ``case`` (NaN or Inf: a failure)."""
    a, b = case["a"], case.get("b")
    if op == "lu_factor":
        return float(get01(a, out[0], out[1]).max())
    if op in ("lu_solve", "solve"):
        return float(get02(a, out[0], b).max())
    if op == "inv":
        return float(get03(a, out[0]).max())
    return float(max(r.max() for r in slogdet_ratios(a, out[0], out[1])))


def make_case(op: str, dtype, n: int, count: int, rhs: int, seed: int) -> dict:
    case = {"a": matrices.generate("random", n, dtype, seed=seed, stop=count)}
    if op in ("lu_solve", "solve"):
        case["b"] = matrices.rhs(n, rhs, dtype, seed=seed + 1, stop=count)
    if op == "lu_solve":
        case["lu"], case["piv"], _ = kernels.lu_factor(case["a"])
    return case


def head(case: dict, count: int) -> dict:
    return {k: v[:count] for k, v in case.items()}


# --- one (op, dtype, n) ------------------------------------------------------------------------


def bench(op: str, dtype: str, n: int, batch: int, rhs: int, repeat: int, cores: int, seed: int):
    case = make_case(op, dtype, n, batch, rhs, seed)
    small = head(case, CHECK)
    impls, sizes, errors = {}, {}, {}
    for name, run in implementations(op, cores).items():
        ratio = check(op, small, run(small))
        if not ratio < THRESHOLD:     # NaN fails too
            errors[name] = f"check failed: ratio {ratio:.3g} >= {THRESHOLD}"
            continue
        impls[name] = run
        sizes[name] = min(batch, LOOP_MAX) if name == "scipy-loop" else batch
    inputs = {name: case if sizes[name] == batch else head(case, sizes[name]) for name in impls}
    for name, run in impls.items():   # warm-up: batchlu's first call compiles or loads its cache
        run(inputs[name])
    best = {name: float("inf") for name in impls}
    for _ in range(repeat):
        for name, run in impls.items():
            start = time.perf_counter()
            run(inputs[name])
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: (best[name], sizes[name]) for name in impls}, errors


def _cell(seconds: float | None, count: int, batch: int) -> str:
    if seconds is None:
        return f"{'-':>9}"
    return f"{seconds * 1e3 * batch / count:9.2f}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--sizes", default=",".join(str(n) for n in SIZES))
    parser.add_argument("--scale", type=float, default=1.0, help="times the default batches")
    parser.add_argument("--rhs", type=int, default=1, help="right-hand sides of solve / lu_solve")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--machine", default=socket.gethostname())
    parser.add_argument("--out", default=None, help="default benchmarks/results/cpu-<machine>.json")
    parser.add_argument("--seed", type=int, default=None, help="default: fresh inputs")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)

    ops = [o for o in args.ops.split(",") if o]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        parser.error(f"Expected ops among {', '.join(OPS)}. Got {', '.join(unknown)} instead.")
    dtypes = [d for d in args.dtypes.split(",") if d]
    sizes = [int(n) for n in args.sizes.split(",") if n]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    seed = args.seed if args.seed is not None else int(np.random.SeedSequence().generate_state(1)[0])
    engine = kernels.cpu_engine()
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    print(f"# {args.machine}: {cores} cores, {platform.processor() or platform.machine()}; "
          f"batchlu CPU engine {engine}; numpy {np.__version__}, scipy {scipy.__version__}; "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}; seed {seed}")
    print("# ms per batch (SciPy loops: scaled from their 5,000); "
          "ratio = peer / batchlu, > 1: batchlu faster")
    print(f"{'op':10} {'dtype':10} {'n':>4} {'batch':>7} {'batchlu':>9} {'1 thread':>9} {'peer':>9} "
          f"{'peer':10} {'ratio':>6} {'ratio 1t':>8}")
    records = []
    for op in ops:
        for dtype in dtypes:
            for n in sizes:
                batch = max(1, int(default_batch(n) * args.scale))
                times, errors = bench(op, dtype, n, batch, args.rhs, args.repeat, cores, seed)
                for name, message in errors.items():
                    print(f"# {op} {dtype} n={n}: {name} not timed: {message}")
                load = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
                for name, (seconds, count) in times.items():
                    records.append({"op": op, "dtype": dtype, "n": n, "batch": count, "impl": name,
                                    "seconds": seconds, "cores": 1 if name.endswith("1thread") else cores,
                                    "threads": 1 if name.endswith("1thread") else cores,
                                    "rhs": args.rhs if op in ("solve", "lu_solve") else None,
                                    "date": date, "machine": args.machine, "seed": seed, "load": load})
                peer = "scipy-loop" if op in ("lu_factor", "lu_solve") else "numpy"
                per = {name: s / c for name, (s, c) in times.items()}
                ours, ours1, theirs = per.get("batchlu"), per.get("batchlu-1thread"), per.get(peer)
                ratio = f"{theirs / ours:6.2f}" if ours and theirs else f"{'-':>6}"
                ratio1 = f"{theirs / ours1:8.2f}" if ours1 and theirs else f"{'-':>8}"
                cells = [_cell(times[k][0] if k in times else None, times[k][1] if k in times else 1,
                               batch) for k in ("batchlu", "batchlu-1thread", peer)]
                print(f"{op:10} {dtype:10} {n:4d} {batch:7d} {cells[0]} {cells[1]} {cells[2]} "
                      f"{peer:10} {ratio} {ratio1}", flush=True)
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"cpu-{args.machine}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/bench_cpu.py " + " ".join(argv)
    before = json.loads(out.read_text()) if out.exists() else {}
    again = {(r["op"], r["dtype"], r["n"]) for r in records}
    kept = [r for r in before.get("records", []) if (r["op"], r["dtype"], r["n"]) not in again]
    commands = before.get("commands", [before["command"]] if "command" in before else []) if kept else []
    out.write_text(json.dumps({"commands": commands + [command], "engine": engine, "cores": cores,
                               "numpy": np.__version__, "scipy": scipy.__version__,
                               "records": kept + records}, indent=1) + "\n")
    print(f"# wrote {out}")


if __name__ == "__main__":
    main()
