"""Tile sweep of the fused inverse inv_gje (GPU machine, repo root):

    python3 benchmarks/bench_gje_sweep.py --dtypes complex64,complex128 --sizes 33,64

Every tile (TI, TJ, RR, CC, MINB) that holds n (TI x TJ threads of whole warps, TI <= 32, each thread
RR x CC elements in at most 160 registers, MINB blocks per SM where the registers allow it) is compiled
in parallel first (16 processes, CuPy's disk cache), then timed with ``_harness.time_case`` (median
of ``--reps``, batch 10000) on the same fresh random batches; prints every time, the best tile per
point against the dispatched one (``tuning.gje_tile``, the source of ``GJE_TILES`` in
``batchlu.kernels.tuning``) and get03 of the best on 32 matrices (< 30).
"""
from __future__ import annotations

import argparse

import numpy as np

from _harness import compile_report, precompile, random_batch, time_case


def tiles(dtype, n: int) -> list[tuple[int, int, int, int, int]]:
    """The candidate tiles for order n (see the module docstring)."""
    words = np.dtype(dtype).itemsize // 4
    out = []
    for ti in (8, 12, 16, 32):
        for tj in (8, 16, 32):
            nt, rr, cc = ti * tj, -(-n // ti), -(-n // tj)
            if nt % 32 or nt > 1024 or rr * cc * words > 160:
                continue
            for minb in (1, 2):
                if minb == 1 or 65536 // (nt * minb) >= rr * cc * words + 32:
                    out.append((ti, tj, rr, cc, minb))
    return out


def compile_one(job):
    dtype, tile = job
    from batchlu.kernels import tuning

    return compile_report(f"{dtype} {tile}", "getri", tuning.gje_name(dtype, tile))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtypes", default="float32,float64,complex64,complex128")
    ap.add_argument("--sizes", default="33,64")
    ap.add_argument("--batch", type=int, default=10000)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args(argv)
    dtypes = [d for d in args.dtypes.split(",") if d]
    sizes = [int(x) for x in args.sizes.split(",") if x]

    import cupy

    from _inv_impls import ours_inv
    from batchlu.kernels import tuning
    from batchlu.testing.ratios import get03

    precompile(compile_one, sorted({(d, t) for d in dtypes for n in sizes for t in tiles(d, n)}))
    rows = []
    for d in dtypes:
        for n in sizes:
            res = {}
            for t in tiles(d, n):
                key = "x".join(map(str, t))
                try:
                    res[key] = time_case(ours_inv(d, n, args.batch, f"fused-{key}"), args.reps)
                except Exception as e:
                    print(d, n, key, "FAILED", type(e).__name__, str(e)[:200], flush=True)
                cupy.get_default_memory_pool().free_all_blocks()
            ref_key = "x".join(map(str, tuning.gje_tile(d, n)))
            best = min(res, key=res.get)
            a = random_batch((32, n, n), d, seed=n)
            out = cupy.full_like(a, np.nan)
            info = cupy.empty((32,), np.int32)
            tuning.launch_inv_gje(a, out, info, tuple(int(x) for x in best.split("x")))
            ratio = float(get03(cupy.asnumpy(a), cupy.asnumpy(out)).max())
            print(f"{d:10s} n={n:3d} " + " ".join(f"{k}={v:.3f}" for k, v in sorted(res.items(), key=lambda kv: kv[1])),
                  flush=True)
            rows.append((d, n, ref_key, res.get(ref_key, float("nan")), best, res[best], ratio))
    print("\n| dtype | n | dispatched tile | ms | best tile | ms | gain | get03 |\n|---|---|---|---|---|---|---|---|")
    for d, n, rk, rms, b, bms, ratio in rows:
        print(f"| {d} | {n} | {rk} | {rms:.3f} | {b} | {bms:.3f} | {rms / bms:.2f}x | {ratio:.3f} |")


if __name__ == "__main__":
    main()
