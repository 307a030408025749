"""Where the CPU backend's compiled engine should switch from its own LU to LAPACK, per op and dtype,
and for which n its lane LU (W matrices at once) should take ``getrf`` and ``slogdet``.

    python benchmarks/bench_cpu_crossover.py [--ops getrf,getrs,inv,solve,slogdet]
                                             [--dtypes float32,float64,complex64,complex128]
                                             [--sizes 8,12,16,20,24,28,32,40,48,64] [--repeat 9]
                                             [--machine NAME] [--out PATH]
    python benchmarks/bench_cpu_crossover.py --lanes [--ops getrf,slogdet] [--sizes ...] ...

For each (op, dtype, n), the op runs through the public API on one thread twice per round, once
with every n on the compiled xGETF2 / substitution kernels and once on the LAPACK ones
(``batchlu.kernels.tuning.cpu_crossover``), on the same fresh random batch (about 4e6 / n^3 matrices,
at least 200; ``getrs`` and ``solve`` with one right-hand side). The best process-CPU time of each
over ``--repeat`` rounds gives the ratio own / LAPACK; the crossover printed for each op and dtype
is the first n from which LAPACK is at least as fast, the value that goes into
``batchlu.kernels.tuning.COMPILED_LAPACK_MIN_N`` (but for ``getrs``, which switches with ``getrf``).
Writes the ratios to ``benchmarks/results/cpu-crossover-<machine>.json``.

With ``--lanes`` (ops ``getrf`` and ``slogdet``; default sizes 2 to 512), the two sides are the
engine without its lane LU (the tables above: own LU or LAPACK) and the lane LU at every n
(``batchlu.kernels.tuning.cpu_lanes_from``), on about 4e6 / n^3 matrices (at least 64, whole
groups of 16 lanes), and the ratio is tables / lanes; the range printed
for each op and dtype is the longest run of consecutive sizes where the lane LU is at least as fast,
the values that go into ``batchlu.kernels.tuning.COMPILED_LANES_N``.
Written to ``benchmarks/results/cpu-lanes-<machine>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import time
from pathlib import Path

from batchlu import kernels
from batchlu.kernels import tuning
from batchlu.testing import matrices

ROOT = Path(__file__).resolve().parents[1]
OPS = ("getrf", "getrs", "inv", "solve", "slogdet")
LANES_OPS = ("getrf", "slogdet")
SIZES = "8,12,16,20,24,28,32,40,48,64"
LANES_SIZES = "2,3,4,5,6,7,8,10,12,16,24,32,48,64,96,128,192,256,320,384"


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


def ratio(op: str, dtype: str, n: int, repeat: int, seed: int, lanes: bool = False) -> float:
    """own / LAPACK, or with ``lanes`` tables / lanes: the best process-CPU time of each side."""
    count = max(200, 4_000_000 // n ** 3)
    if lanes:     # whole groups of 16 lanes, at least 4 of them
        count = max(64, count // 16 * 16)
    a = matrices.generate("random", n, dtype, seed=seed, stop=count)
    b = matrices.rhs(n, 1, dtype, seed=seed + 1, stop=count)
    lu, piv, _ = kernels.lu_factor(a)
    if lanes:
        sides = (("tables", tuning.cpu_lanes_from, 1 << 30), ("lanes", tuning.cpu_lanes_from, 1))
    else:
        sides = (("own", tuning.cpu_crossover, 1 << 30), ("lapack", tuning.cpu_crossover, 1))
    best = {}
    with kernels.cpu_threads(1):
        for side, setting, crossover in sides:
            with setting(crossover):
                _call(op, a, b, lu, piv)             # compiles, or loads numba's cache
        for _ in range(repeat):
            for side, setting, crossover in sides:
                with setting(crossover):
                    start = time.process_time()
                    _call(op, a, b, lu, piv)
                    best[side] = min(best.get(side, float("inf")), time.process_time() - start)
    return best[sides[0][0]] / best[sides[1][0]]


def _longest_run(sizes, ratios):
    """[first, last] of the longest run of consecutive sizes where the ratio is >= 1 (None: none)."""
    best, start = None, None
    for i, r in enumerate(ratios + [0.0]):
        if r >= 1 and start is None:
            start = i
        elif r < 1 and start is not None:
            if best is None or i - start > best[1] - best[0] + 1:
                best = [start, i - 1]
            start = None
    return None if best is None else [sizes[best[0]], sizes[best[1]]]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default=None, help=f"default {','.join(OPS)}; with --lanes "
                        f"{','.join(LANES_OPS)}")
    parser.add_argument("--dtypes", default="float32,float64,complex64,complex128")
    parser.add_argument("--sizes", default=None, help=f"default {SIZES}; with --lanes {LANES_SIZES}")
    parser.add_argument("--lanes", action="store_true",
                        help="time the lane LU against the tables without it (getrf, slogdet)")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--machine", default=socket.gethostname())
    parser.add_argument("--out", default=None,
                        help="default benchmarks/results/cpu-crossover-<machine>.json")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if kernels.cpu_engine() != "compiled":
        parser.error("Expected the compiled CPU engine (numba importable, BATCHLU_CPU_ENGINE unset). "
                     f"Got the {kernels.cpu_engine()} engine instead.")
    ops = (args.ops or ",".join(LANES_OPS if args.lanes else OPS)).split(",")
    allowed = LANES_OPS if args.lanes else OPS
    if set(ops) - set(allowed):
        parser.error(f"Expected ops among {', '.join(allowed)}. Got {args.ops} instead.")
    sizes = [int(n) for n in (args.sizes or (LANES_SIZES if args.lanes else SIZES)).split(",") if n]
    key = "tables_over_lanes" if args.lanes else "own_over_lapack"
    records, crossovers = [], {}
    for op in ops:
        for dtype in args.dtypes.split(","):
            row = []
            for n in sizes:
                r = ratio(op, dtype, n, args.repeat, seed=n, lanes=args.lanes)
                records.append({"op": op, "dtype": dtype, "n": n, key: r})
                row.append(f"{n}:{r:.2f}")
                if not args.lanes and r >= 1 and (op, dtype) not in crossovers:
                    crossovers[op, dtype] = n
            if args.lanes:
                crossovers[op, dtype] = _longest_run(sizes, [r["tables_over_lanes"] for r in records[-len(sizes):]])
            print(f"{op:8} {dtype:10} {'tables/lanes' if args.lanes else 'own/LAPACK'}  " + "  ".join(row),
                  flush=True)
    print("lane LU range (the longest run of sizes where it is as fast):" if args.lanes
          else "crossovers (first n where LAPACK is as fast):")
    for (op, dtype), n in crossovers.items():
        print(f"  {op:8} {dtype:10} {n}")
    name = "cpu-lanes" if args.lanes else "cpu-crossover"
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"{name}-{args.machine}.json"
    out.write_text(json.dumps({
        "command": "python benchmarks/bench_cpu_crossover.py " + " ".join(argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "crossovers": {f"{op} {dtype}": n for (op, dtype), n in crossovers.items()},
        "records": records}, indent=1) + "\n")
    print(f"# wrote {out}")


if __name__ == "__main__":
    main()
