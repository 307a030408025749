"""What a new sparse pattern costs the first time: factorize + solve in a fresh process, against the
same calls again (new values, same pattern), each point in a process of its own, one after another.

    python benchmarks/bench_sparse_first_call.py [--device gpu|cpu] [--batch 256]
        [--points fem-elasticity:132,kkt:2200,fem-poisson:3000,kkt:3000] [--delta 1e-8]
        [--cache-dir DIR] [--out results.json]

``--points`` are ``kind:size`` (the generators of ``batchlu generate``; ``:batch`` after the size
overrides ``--batch``). On the GPU the kernels compile at their first use and are kept on disk
(``$CUPY_CACHE_DIR``; batchlu's under it): ``--cache-dir`` names that folder for the run, so an
empty one shows the first process on a new machine, and the later points whatever is compiled
already. Per point: ``first_s`` (``first_factor_s`` + ``first_solve_s``, each synchronised),
``second_s`` (the same calls on the next ``batch`` matrices), the matrices at ``info`` 0 of both
calls and the largest normwise backward error in units of ``n eps``, and ``cache`` (GPU): whether
the cache folder held files before the point's process started. The process's imports are not
timed. On the CPU the first call loads numba's compiled code (kept beside batchlu's modules).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_POINTS = "fem-elasticity:132,kkt:2200,fem-poisson:3000,kkt:3000,fem-elasticity:924:64,saddle:20000:64"


def _point(device: str, kind: str, size: int, batch: int, delta: float | None) -> dict:
    """One point, in this process (a fresh one: ``main`` starts it)."""
    import numpy as np

    import batchlu
    from batchlu.testing import sparse as generators

    if device == "gpu":
        import cupy

        to_device, to_host = cupy.asarray, cupy.asnumpy
        sync = cupy.cuda.Device().synchronize
    else:
        to_device = to_host = np.asarray
        sync = lambda: None   # noqa: E731

    problem = generators.make(kind, size=size, **({"delta": delta} if kind == "kkt" and delta else {}))
    plan = batchlu.sparse.analyze(problem.indptr, problem.indices, problem.n, kind=problem.matrix_kind)
    batches = [(to_device(problem.values(i * batch, (i + 1) * batch)), to_device(problem.rhs(i * batch, (i + 1) * batch)))
               for i in range(2)]
    sync()
    times, info0, worst = [], 0, 0.0
    for values, b in batches:
        started = time.perf_counter()
        factor = plan.factorize(values)
        sync()
        factored = time.perf_counter()
        x, info = factor.solve(b)
        sync()
        times.append((factored - started, time.perf_counter() - factored))
        info0 += int((to_host(info) == 0).sum())
        worst = max(worst, float(to_host(factor.backward_error(b, x)).max()))
    eps = float(np.finfo(np.float64).eps)
    delta = (delta or 1e-8) if kind == "kkt" else None   # kkt's generator's default: 1e-8
    return {"kind": kind, "n": int(problem.n), "batch": batch, "delta": delta,
            "first_s": round(sum(times[0]), 4), "first_factor_s": round(times[0][0], 4),
            "first_solve_s": round(times[0][1], 4), "second_s": round(sum(times[1]), 4),
            "info0": info0, "matrices": 2 * batch, "max_berr_neps": worst / (problem.n * eps)}


def _cache_has_files(folder: str | None) -> bool:
    if folder is None:
        folder = os.environ.get("CUPY_CACHE_DIR") or os.path.expanduser("~/.cupy/kernel_cache")
    return any(files for _, _, files in os.walk(folder)) if os.path.isdir(folder) else False


def _device_name(device: str) -> str:
    if device == "cpu":
        return f"cpu ({os.cpu_count()} cores)"
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "gpu"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--points", default=DEFAULT_POINTS)
    parser.add_argument("--delta", type=float, default=None, help="kkt's regularization (its default: 1e-8)")
    parser.add_argument("--cache-dir", default=None, help="the kernel cache folder ($CUPY_CACHE_DIR) for the run")
    parser.add_argument("--out", default=None)
    parser.add_argument("--one", nargs=4, help=argparse.SUPPRESS)   # device kind size batch: a point's process
    args = parser.parse_args(argv)
    if args.one:
        device, kind, size, batch = args.one
        print(json.dumps(_point(device, kind, int(size), int(batch), args.delta)))
        return 0
    env = dict(os.environ)
    if args.cache_dir:
        env["CUPY_CACHE_DIR"] = os.path.abspath(args.cache_dir)
    records = []
    for spec in args.points.split(","):
        kind, size, *rest = spec.split(":")
        batch = int(rest[0]) if rest else args.batch
        cached = _cache_has_files(env.get("CUPY_CACHE_DIR"))
        command = [sys.executable, __file__, "--one", args.device, kind, size, str(batch)]
        if args.delta is not None:
            command += ["--delta", str(args.delta)]
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{spec}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
            return 1
        record = json.loads(done.stdout.strip().splitlines()[-1])
        record.update(cache=("warm" if cached else "cold") if args.device == "gpu" else None,
                      device=_device_name(args.device),
                      date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
        records.append(record)
        bar = 2 * record["second_s"] + 1
        print(f"{record['kind']:>15} n={record['n']:>6} batch {batch:>4} {record['cache'] or 'cpu'}: first {record['first_s']:.3f} s "
              f"(factor {record['first_factor_s']:.3f}, solve {record['first_solve_s']:.3f}), second "
              f"{record['second_s']:.3f} s; 2 x second + 1 s = {bar:.3f} ({'met' if record['first_s'] <= bar else 'NOT met'}); "
              f"info 0: {record['info0']}/{record['matrices']}, backward error {record['max_berr_neps']:.1e} n eps",
              flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
