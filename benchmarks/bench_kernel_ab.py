"""A/B of one CUDA kernel family: its source at a git revision against the working tree's, on the GPU.

    python3 benchmarks/bench_kernel_ab.py --family getrf --rev 3a6c669 --op lu \\
        --dtypes float32,float64,complex64,complex128 --sizes 96,128,160,190,256

For each (dtype, n): fresh random matrices (uniform in [-1, 1), complex parts drawn separately), the
launch plan of the current dispatch, then both sources of the family on the same input: outputs
poisoned before each launch and compared bit for bit (``bitwise``), the LAPACK test ratio of the new
output on 32 matrices, and the median of ``--reps`` CUDA-event timings of each, interleaved. A change
that only moves data (copies, staging, loads in flight) must keep ``bitwise`` True. Ops: ``lu``
(getrf: family getrf), ``getri`` (inverse from the factors, family getri), ``getrs`` (16
right-hand sides, family getrs), ``gesv`` (the fused solve ``gesv_rows``, 16 right-hand sides, family
gesv) and ``gje`` (the fused inverse ``inv_gje``, family getri); the last two at the n their tables
cover.

The old source runs through ``batchlu.kernels.tuning.source_override``, with the headers it includes
(``common.cuh``, ``rows.cuh``) as they were at that revision. The GPU machine's copy of the repository
has no .git: write the old source to a file here first and pass the file as ``--rev`` there:

    python3 benchmarks/bench_kernel_ab.py --family getrf --rev main --save .abold/getrf-main.cu

For a revision from before one ``.cu`` per family, name the file with ``--path`` (e.g.
``kernels/cuda/getrf_blocked.cu`` for the blocked getrf plans); a text from before namespace ``blu``
is wrapped in it. ``--once`` launches each version once per point and times nothing (for ``ncu``).
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import numpy as np

from _harness import event_ms, old_source, random_batch, same_bits

OPS = ("lu", "getri", "getrs", "gesv", "gje")
FAMILIES = ("getrf", "getri", "getrs", "gesv", "slogdet")


def point(op: str, dtype: str, n: int, batch: int, seed: int):
    """(inputs, run(out) -> None, fresh outputs(), ratio(inputs, outputs) -> float) of one point."""
    import cupy

    from batchlu import kernels
    from batchlu.kernels import tuning
    from batchlu.testing.ratios import get01, get02, get03

    a = random_batch((batch, n, n), dtype, seed)
    if op == "lu":
        plan = tuning.getrf_plan(dtype, n)

        def fresh():
            return (cupy.full_like(a, np.nan), cupy.full((batch, n), -7, np.int32), cupy.full((batch,), -9, np.int32))

        def run(out):
            tuning.launch_getrf(a, *out, plan)

        def ratio(out):
            return float(get01(cupy.asnumpy(a[:32]), cupy.asnumpy(out[0][:32]), cupy.asnumpy(out[1][:32])).max())

        return plan.describe(), fresh, run, ratio, None
    if op == "gesv":
        b = random_batch((batch, n, 16), dtype, seed + 1)
        tile = tuning.gesv_rows_tile(dtype, n, 16)
        if tile is None:
            raise SystemExit(f"Expected n within gesv_rows' table for {dtype}. Got n = {n} instead.")

        def fresh():
            return (cupy.full_like(b, np.nan), cupy.full((batch,), -9, np.int32))

        def run(out):
            tuning.launch_gesv_rows(a, b, *out, tile)

        def ratio(out):
            return float(get02(cupy.asnumpy(a[:32]), cupy.asnumpy(out[0][:32]), cupy.asnumpy(b[:32])).max())

        return "gesv_rows-" + "x".join(map(str, tile)), fresh, run, ratio, None
    if op == "gje":
        tile = tuning.gje_tile(dtype, n)
        if tile is None:
            raise SystemExit(f"Expected n within inv_gje's table for {dtype}. Got n = {n} instead.")

        def fresh():
            return (cupy.full_like(a, np.nan), cupy.full((batch,), -9, np.int32))

        def run(out):
            tuning.launch_inv_gje(a, *out, tile)

        def ratio(out):
            return float(get03(cupy.asnumpy(a[:32]), cupy.asnumpy(out[0][:32])).max())

        return "inv_gje-" + "x".join(map(str, tile)), fresh, run, ratio, None
    lu, piv, info = kernels.lu_factor(a)
    if op == "getri":
        work = cupy.empty_like(lu)

        def fresh():
            return (cupy.full_like(a, np.nan),)

        def prepare():  # getri overwrites the factors
            work[...] = lu

        def run(out):
            tuning.launch_getri(work, piv, info, out[0])

        def ratio(out):
            return float(get03(cupy.asnumpy(a[:32]), cupy.asnumpy(out[0][:32])).max())

        mode, minb, mma, nb = tuning.getri_plan(dtype, n)
        return f"getri-{mode}-m{minb}{'-mma' if mma else ''}-nb{nb}", fresh, run, ratio, prepare
    b = random_batch((batch, n, 16), dtype, seed + 1)

    def fresh():
        return (cupy.full_like(b, np.nan),)

    def run(out):
        tuning.launch_getrs(lu, piv, b, out[0], info)

    def ratio(out):
        return float(get02(cupy.asnumpy(a[:32]), cupy.asnumpy(out[0][:32]), cupy.asnumpy(b[:32])).max())

    return "getrs-16", fresh, run, ratio, None


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", required=True, choices=FAMILIES, help="kernels/cuda/<family>.cu to compare")
    ap.add_argument("--rev", required=True, help="git revision of the old source, or a file holding it")
    ap.add_argument("--path", default=None,
                    help="the old source's path in that revision (default kernels/cuda/<family>.cu)")
    ap.add_argument("--save", metavar="FILE", default=None,
                    help="write the old source, headers inlined, to FILE and stop (no GPU needed)")
    ap.add_argument("--op", choices=OPS)
    ap.add_argument("--dtypes", default="float32,float64,complex64,complex128")
    ap.add_argument("--sizes", default="128,190")
    ap.add_argument("--batch", type=int, default=10000)
    ap.add_argument("--max-bytes", type=float, default=2.5e9, help="cap on one input batch's bytes")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--once", action="store_true", help="launch each version once, time nothing (ncu)")
    args = ap.parse_args(argv)
    if args.save:
        Path(args.save).parent.mkdir(parents=True, exist_ok=True)
        Path(args.save).write_text(old_source(args.family, args.rev, args.path))
        print(f"{args.family} at {args.rev}: {args.save}")
        return
    if args.op is None:
        ap.error("the following arguments are required: --op")

    import cupy

    from batchlu.kernels import tuning

    old_text = old_source(args.family, args.rev, args.path)

    def on(which, fn):
        """fn() with the old or the new source of the family."""
        if which == "new":
            return fn()
        with tuning.source_override(args.family, old_text):
            return fn()

    rows = []
    for dtype in filter(None, args.dtypes.split(",")):
        for n in (int(x) for x in args.sizes.split(",") if x):
            batch = max(1, min(args.batch, int(args.max_bytes // (np.dtype(dtype).itemsize * n * n))))
            plan, fresh, run, ratio, prepare = point(args.op, dtype, n, batch, seed=n)
            outs, ms = {}, {"old": [], "new": []}
            for which in ("old", "new"):
                if prepare:
                    prepare()
                outs[which] = fresh()
                on(which, partial(run, outs[which]))
            cupy.cuda.Device().synchronize()
            if not args.once:
                for _ in range(2):  # interleaved, so that clocks and caches treat both alike
                    for which in ("old", "new"):
                        timed = partial(event_ms, partial(run, outs[which]), args.reps, prepare)
                        ms[which].append(on(which, timed))
                        del timed
            row = dict(dtype=dtype, n=n, batch=batch, plan=plan, bitwise=same_bits(outs["old"], outs["new"]),
                       ratio=ratio(outs["new"]), old_ms=min(ms["old"], default=float("nan")),
                       new_ms=min(ms["new"], default=float("nan")))
            rows.append(row)
            print(row, flush=True)
            del outs
            cupy.get_default_memory_pool().free_all_blocks()
    print(f"\n{args.family} at {args.rev} (old) against the working tree (new), op {args.op}")
    print("dtype        n   batch  plan                  old ms    new ms  speedup  bitwise  ratio")
    for r in rows:
        print(f"{r['dtype']:<10} {r['n']:>4} {r['batch']:>6}  {r['plan']:<18} {r['old_ms']:9.3f} {r['new_ms']:9.3f}"
              f"  {r['old_ms'] / r['new_ms']:6.2f}x  {r['bitwise']!s:<7}  {r['ratio']:.3f}")


if __name__ == "__main__":
    main()
