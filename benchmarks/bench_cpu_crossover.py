"""Where the CPU backend's compiled engine should switch from its own LU to LAPACK, per op and dtype.

    python benchmarks/bench_cpu_crossover.py [--ops getrf,getrs,inv,solve,slogdet]
                                             [--dtypes float32,float64,complex64,complex128]
                                             [--sizes 8,12,16,20,24,28,32,40,48,64] [--repeat 9]
                                             [--machine NAME] [--out PATH]

For each (op, dtype, n), the op runs through the public API on one thread twice per round, once
with every n on the compiled xGETF2 / substitution kernels and once on the LAPACK ones
(``batchlu.kernels.tuning.cpu_crossover``), on the same fresh random batch (about 4e6 / n^3 matrices,
at least 200; ``getrs`` and ``solve`` with one right-hand side). The best process-CPU time of each
over ``--repeat`` rounds gives the ratio own / LAPACK; the crossover printed for each op and dtype
is the first n from which LAPACK is at least as fast, the value that goes into
``batchlu.kernels.tuning.COMPILED_LAPACK_MIN_N`` (but for ``getrs``, which switches with ``getrf``).
Writes the ratios to ``benchmarks/results/cpu-crossover-<machine>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import socket
import sys
import time
from pathlib import Path

from batchlu import kernels
from batchlu.kernels import tuning
from batchlu.testing import matrices

ROOT = Path(__file__).resolve().parents[1]
OPS = ("getrf", "getrs", "inv", "solve", "slogdet")


def _call(op, a, b, lu, piv):
    if op == "getrf":
        return kernels.lu_factor(a)
    if op == "getrs":
        return kernels.lu_solve(lu, piv, b)
    if op == "inv":
        return kernels.inv(a)
    if op == "solve":
        return kernels.solve(a, b)
    return kernels.slogdet(a)


def ratio(op: str, dtype: str, n: int, repeat: int, seed: int) -> float:
    count = max(200, 4_000_000 // n ** 3)
    a = matrices.generate("random", n, dtype, seed=seed, stop=count)
    b = matrices.rhs(n, 1, dtype, seed=seed + 1, stop=count)
    lu, piv, _ = kernels.lu_factor(a)
    best = {}
    with kernels.cpu_threads(1):
        for side, crossover in (("own", 1 << 30), ("lapack", 1)):
            with tuning.cpu_crossover(crossover):
                _call(op, a, b, lu, piv)             # compiles, or loads numba's cache
        for _ in range(repeat):
            for side, crossover in (("own", 1 << 30), ("lapack", 1)):
                with tuning.cpu_crossover(crossover):
                    start = time.process_time()
                    _call(op, a, b, lu, piv)
                    best[side] = min(best.get(side, float("inf")), time.process_time() - start)
    return best["own"] / best["lapack"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--dtypes", default="float32,float64,complex64,complex128")
    parser.add_argument("--sizes", default="8,12,16,20,24,28,32,40,48,64")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--machine", default=socket.gethostname())
    parser.add_argument("--out", default=None,
                        help="default benchmarks/results/cpu-crossover-<machine>.json")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if kernels.cpu_engine() != "compiled":
        parser.error("Expected the compiled CPU engine (numba importable, BATCHLU_CPU_ENGINE unset). "
                     f"Got the {kernels.cpu_engine()} engine instead.")
    sizes = [int(n) for n in args.sizes.split(",") if n]
    records, crossovers = [], {}
    for op in args.ops.split(","):
        for dtype in args.dtypes.split(","):
            row = []
            for n in sizes:
                r = ratio(op, dtype, n, args.repeat, seed=n)
                records.append({"op": op, "dtype": dtype, "n": n, "own_over_lapack": r})
                row.append(f"{n}:{r:.2f}")
                if r >= 1 and (op, dtype) not in crossovers:
                    crossovers[op, dtype] = n
            print(f"{op:8} {dtype:10} own/LAPACK  " + "  ".join(row), flush=True)
    print("crossovers (first n where LAPACK is as fast):")
    for (op, dtype), n in crossovers.items():
        print(f"  {op:8} {dtype:10} {n}")
    out = Path(args.out) if args.out else \
        ROOT / "benchmarks" / "results" / f"cpu-crossover-{args.machine}.json"
    out.write_text(json.dumps({
        "command": "python benchmarks/bench_cpu_crossover.py " + " ".join(argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "crossovers": {f"{op} {dtype}": n for (op, dtype), n in crossovers.items()},
        "records": records}, indent=1) + "\n")
    print(f"# wrote {out}")


if __name__ == "__main__":
    main()
