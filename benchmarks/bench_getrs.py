"""getrs_warp against getrs_kernel (``launch_getrs(kind=...)``) on the GPU machine, repo root:

    python3 benchmarks/bench_getrs.py --dtypes float32,float64,complex64,complex128 \\
        --sizes 16,33,64,100,128,190,256,512,1024 --rhs 1,4,16,40

For each dtype, n and k right-hand sides: fresh random matrices factored by the dispatched getrf
(untimed), then each kernel run once on poisoned outputs and checked by LAPACK's test ratio
(``_harness.check_case``: a wrong one is reported, never timed), then timed by ``_harness.time_case``
(median of ``--reps``). The batch is 10,000, or fewer where the matrices would pass 2 GB. The floor
is one read of LU and b and one write of x at 3.35 TB/s; ``dispatched`` is ``tuning.getrs_plan``'s kernel.
The source of ``GETRS_BLOCK`` (kernels/_gpu/_getrs.py).
"""
from __future__ import annotations

import argparse
from functools import partial

import numpy as np

from _harness import WrongResult, check_case, solve_ratio, time_case

BANDWIDTH = 3.35e12  # H100 SXM HBM3, bytes/s
KINDS = ("warp", "block")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="float32,float64,complex64,complex128")
    parser.add_argument("--sizes", default="33,64,128,190")
    parser.add_argument("--rhs", default="1,16")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()

    import cupy

    from _inv_impls import _rhs
    from _lu_impls import Case, _sources

    from batchlu.kernels import tuning

    print("| dtype | n | k | batch | warp KC | warp ms | block ms | dispatched | block / warp | "
          "dispatched % of floor |", flush=True)
    for dtype in args.dtypes.split(","):
        itemsize = np.dtype(dtype).itemsize
        for n in map(int, args.sizes.split(",")):
            batch = int(min(10000, 2e9 // (n * n * itemsize)))
            src = _sources(dtype, n, batch)
            a = cupy.empty_like(src[0])
            lu = cupy.empty_like(a)
            piv = cupy.empty((batch, n), np.int32)
            info = cupy.empty((batch,), np.int32)

            def prepare(i):
                a[...] = src[i % len(src)]
                tuning.launch_getrf(a, lu, piv, info)

            for k in map(int, args.rhs.split(",")):
                b = _rhs(dtype, n, batch, (n, k))
                x = cupy.empty_like(b)
                ms = {}
                for kind in KINDS:
                    run = partial(tuning.launch_getrs, lu, piv, b, x, info, kind=kind)
                    case = Case(prepare, run, check=lambda i: solve_ratio(src[i % len(src)], x, b),
                                outputs=(x,))
                    try:
                        check_case(case)
                    except WrongResult as err:
                        print(f"| {dtype} | {n} | {k} | {kind}: WRONG, not timed: {err} |", flush=True)
                        ms[kind] = float("nan")
                        continue
                    ms[kind] = time_case(case, args.reps)
                plan = tuning.getrs_plan(dtype, n, k)
                floor = batch * (n * n + 2 * n * k) * itemsize / BANDWIDTH * 1e3
                print(f"| {dtype} | {n} | {k} | {batch} | {tuning.getrs_plan(dtype, n, k, 'warp')[1]} | "
                      f"{ms['warp']:.3f} | {ms['block']:.3f} | {plan[0]} | {ms['block'] / ms['warp']:.2f} | "
                      f"{100 * floor / ms[plan[0]]:.0f}% |", flush=True)
                del b, x
            del a, lu, src
            cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
