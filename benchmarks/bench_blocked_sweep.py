"""Plan sweep of the blocked getrf kernels (GPU machine, repo root):

    python3 benchmarks/bench_blocked_sweep.py --dtypes float32,float64,complex64,complex128 --sizes 128,190 \\
        --rev HEAD

``--op getri`` instead times ``tuning.launch_getri`` in each mode and blocks-per-SM bound (minb) on
the factors of one random batch. For ``--op lu`` (the default): for each (dtype, n), every blocked
plan -- kind ``blocked`` (panel rows in registers) or ``blocked_smem``, NB from ``tuning.BLOCKED_NB``
but 32, and ``minb`` (``__launch_bounds__``' blocks per SM; 0 = none) among those whose shared memory
and registers (>= 64 per thread) allow it -- is compiled in parallel first (16 processes, CuPy's disk
cache), then run on the same fresh random batch (``_harness.time_case``: L2 scrubbed, median of
``--reps``). With ``--rev``, the getrf family's source at that git revision (``--path``: its file
there, e.g. ``kernels/cuda/getrf_blocked.cu`` before one ``.cu`` per family) runs too, on the minb = 0
plans (``tuning.source_override``: the kernel names are the same), and its outputs are compared bit
for bit with the working tree's. Prints the best plan per point and a Markdown table; the LAPACK ratio
get01 of the best plan on 32 matrices is checked (< 30).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from _harness import old_source, precompile, random_batch, same_bits, time_case

SMEM_SM = 228 * 1024  # H100: shared memory per SM (each block also reserves 1 KB; 16 B static)


def plans(dtype, n: int, split: bool = False) -> list:
    """Every blocked plan (kind, NB but 32, minb); with ``split`` also those whose blocks of L are
    narrower than the panel (kb < NB, NB 32 included), and only those."""
    from batchlu.kernels import tuning

    item, warps = np.dtype(dtype).itemsize, -(-n // 32)
    nbs = tuning.BLOCKED_NB[item]
    out = []
    for kind in ("blocked", "blocked_smem"):
        for nb in nbs:
            for kb in [k for k in nbs if k < nb] if split else [0]:
                if nb == 32 and not split:
                    continue
                smem = tuning.blocked_smem(dtype, n, nb, tuning.blocked_ldp(dtype, n, nb, SMEM_SM, kb), kb)
                if smem + 16 + 1024 > SMEM_SM:
                    continue
                out.append(tuning.Plan(kind, nb, 0, kb))
                for minb in range(2, 9):
                    per_partition = -(-minb * warps // 4)
                    regs = min(255, 16384 // (per_partition * 32) // 8 * 8)
                    if minb * (smem + 16 + 1024) <= SMEM_SM and regs >= 64 and minb * warps <= 64:
                        out.append(tuning.Plan(kind, nb, minb, kb))
    return out


def compile_one(job):
    """Compile one plan's kernel, from the working tree's source or (``old`` not empty) that text."""
    dtype, n, plan, old = job
    from batchlu.kernels import tuning

    t0 = time.time()
    name = tuning.getrf_kernel_name(plan, dtype, n)
    try:
        if old:
            with tuning.source_override("getrf", old):
                tuning.compile_kernels("getrf", [name])
        else:
            tuning.compile_kernels("getrf", [name])
    except Exception as e:  # reported, the sweep goes on without it
        return f"{dtype} {n} {plan.describe()} {'old' if old else ''}: {type(e).__name__} {str(e)[-400:]}"
    return f"{dtype} {n} {plan.describe()} {'old' if old else 'new'} {time.time() - t0:.1f}s"


def getri_plans(dtype, n: int, nbs=None) -> list[tuple[str, int, bool, int]]:
    """(mode, minb, mma, nb) of ``tuning.launch_getri``: every mode at minb = 0 and with each
    minb whose registers (>= 64 per thread) allow it; for n <= 512 each of them with mma too; each for
    every block-row height in ``nbs`` (default: ``tuning.default_nb``'s)."""
    from batchlu.kernels import tuning

    warps = -(-n // 32)
    out = [("static", 0), ("merged", 0), ("dynamic", 0)]
    for minb in range(2, 6):
        if min(255, 16384 // (-(-minb * warps // 4) * 32) // 8 * 8) >= 64 and minb * warps <= 64:
            out += [("static", minb), ("merged", minb), ("dynamic", minb)]
    plans = [(mode, minb, False) for mode, minb in out]
    if n <= 512:
        plans += [(mode, minb, True) for mode, minb in out]
    return [p + (nb,) for nb in (nbs or [tuning.default_nb(dtype)]) for p in plans]


def compile_getri(job):
    dtype, n, mode, minb, mma, nb = job
    from batchlu.kernels import tuning

    _, names = tuning.getri_kernels(dtype, -(-n // 32) * 32, mode, minb, mma, nb)
    t0 = time.time()
    tuning.compile_kernels("getri", names)
    return f"{dtype} {n} {mode} minb {minb} mma {mma} nb {nb} {time.time() - t0:.1f}s"


def sweep_getri(dtypes, sizes, args) -> None:
    """The getri op: each (mode, minb) on the factors of one fresh random batch (get03 of the best)."""
    import cupy

    from _lu_impls import Case
    from batchlu import kernels
    from batchlu.kernels import tuning
    from batchlu.testing.ratios import get03

    nbs = [int(x) for x in args.nbs.split(",") if x] or None
    jobs = {}  # one job per set of kernels compiled together
    for d in dtypes:
        for n in sizes:
            for plan in getri_plans(d, n, nbs):
                jobs.setdefault(tuning.getri_kernels(d, -(-n // 32) * 32, *plan)[1], (d, n) + plan)
    precompile(compile_getri, sorted(jobs.values(), key=str))
    table = []
    for d in dtypes:
        for n in sizes:
            batch = max(1, min(args.batch, int(args.max_bytes // (np.dtype(d).itemsize * n * n))))
            a = random_batch((batch, n, n), d, seed=n)
            lu, piv, info = kernels.lu_factor(a)
            work, out = cupy.empty_like(lu), cupy.empty_like(lu)
            res = {}
            plans = {}
            for mode, minb, mma, nb in getri_plans(d, n, nbs):
                def prepare(k, work=work, lu=lu):
                    work[...] = lu

                def run(mode=mode, minb=minb, mma=mma, nb=nb, work=work, piv=piv, info=info, out=out):
                    tuning.launch_getri(work, piv, info, out, mode, minb, mma, nb)

                key = f"{mode}-m{minb}{'-mma' if mma else ''}" + (f"-nb{nb}" if nbs else "")
                plans[key] = (mode, minb, mma, nb)
                try:
                    res[key] = time_case(Case(prepare, run), args.reps)
                except Exception as e:
                    print(d, n, key, "FAILED", type(e).__name__, str(e)[:300], flush=True)
            best = min(res, key=res.get)
            out[...] = np.nan
            work[...] = lu
            tuning.launch_getri(work, piv, info, out, *plans[best])
            assert not bool(cupy.isnan(out).any()), f"{d} n={n} {best}: elements left unwritten"
            ratio = float(get03(cupy.asnumpy(a[:32]), cupy.asnumpy(out[:32])).max())
            mode = tuning.GETRI_MODE[np.dtype(d)]
            ref = res[min((k for k in res if k.startswith(f"{mode}-m0")), key=len)]
            print(f"{d:10s} n={n:3d} batch={batch} " + " ".join(f"{k}={v:.3f}" for k, v in res.items()), flush=True)
            table.append((d, n, batch, mode, ref, best, res[best], ratio))
            del a, lu, piv, info, work, out, prepare, run
            cupy.get_default_memory_pool().free_all_blocks()
    print("\n| dtype | n | batch | dispatched mode | ms | best (mode-minb) | ms | gain | get03 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for d, n, batch, mode, ref, best, ms, ratio in table:
        print(f"| {d} | {n} | {batch} | {mode} | {ref:.3f} | {best} | {ms:.3f} | {ref / ms:.2f}x | {ratio:.3f} |")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtypes", default="float32,float64,complex64,complex128")
    ap.add_argument("--sizes", default="128,190")
    ap.add_argument("--batch", type=int, default=10000)
    ap.add_argument("--max-bytes", type=float, default=3e9, help="cap on one input batch's bytes")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rev", default="", help="git revision (or a file) of the old getrf source "
                                              "(minb = 0 plans)")
    ap.add_argument("--path", default=None,
                    help="the old source's path in that revision (default kernels/cuda/getrf.cu)")
    ap.add_argument("--plans", choices=("all", "dispatched"), default="all",
                    help="all: every blocked plan; dispatched: only tuning.getrf_plan's (old and new source "
                         "on it, for a quick A/B with --rev)")
    ap.add_argument("--split", action="store_true",
                    help="sweep the plans whose blocks of L are narrower than the panel (kb < NB) instead")
    ap.add_argument("--op", choices=("lu", "getri"), default="lu",
                    help="lu: the getrf_blocked plans; getri: launch_getri's modes and minb")
    ap.add_argument("--nbs", default="", help="getri: block-row heights to sweep (default: tuning.default_nb's)")
    args = ap.parse_args(argv)
    dtypes = [d for d in args.dtypes.split(",") if d]
    sizes = [int(x) for x in args.sizes.split(",") if x]
    if args.op == "getri":
        return sweep_getri(dtypes, sizes, args)

    from batchlu.kernels import tuning

    def swept(d, n):
        if args.plans == "dispatched":
            return [tuning.getrf_plan(d, n)]
        if args.split:  # the dispatched plan too, for reference
            return [tuning.getrf_plan(d, n)] + plans(d, n, True)
        return plans(d, n)

    def old_too(p):  # every plan runs the old source too when only the dispatched one is swept
        return args.rev and not p.kb and (args.plans == "dispatched" or not p.minb)

    old = old_source("getrf", args.rev, args.path) if args.rev else ""
    jobs = [(d, n, p, "") for d in dtypes for n in sizes for p in swept(d, n)]
    jobs += [(d, n, p, old) for d in dtypes for n in sizes for p in swept(d, n) if old_too(p)]
    precompile(compile_one, jobs)

    import cupy

    from _lu_impls import ours
    from batchlu.testing.ratios import get01

    def on(which, fn):
        """fn() with the old (--rev) or the working tree's getrf source."""
        if which == "new":
            return fn()
        with tuning.source_override("getrf", old):
            return fn()

    table = []
    for d in dtypes:
        for n in sizes:
            batch = max(1, min(args.batch, int(args.max_bytes // (np.dtype(d).itemsize * n * n))))
            dispatched = tuning.getrf_plan(d, n)
            res = {}
            for p in swept(d, n):
                for which in (("old", "new") if old_too(p) else ("new",)):
                    key = p.describe() + (" (old)" if which == "old" else "")
                    try:
                        case = ours(d, n, batch, p)
                        res[key] = on(which, lambda case=case: time_case(case, args.reps))
                        del case
                    except Exception as e:
                        print(d, n, key, "FAILED", type(e).__name__, str(e)[:300], flush=True)
                    cupy.get_default_memory_pool().free_all_blocks()
            new = {k: v for k, v in res.items() if not k.endswith("(old)")}
            best = min(new, key=new.get)
            ref = res.get(dispatched.describe() + " (old)", res.get(dispatched.describe(), float("nan")))
            print(f"{d:10s} n={n:3d} batch={batch} " + " ".join(f"{k}={v:.3f}" for k, v in sorted(res.items())),
                  flush=True)
            # accuracy of the best plan on fresh matrices (outputs poisoned); old and new dispatched
            # plan bit for bit on the same 256
            rng = np.random.default_rng(n)
            a = rng.uniform(-1, 1, (256, n, n))
            if np.dtype(d).kind == "c":
                a = a + 1j * rng.uniform(-1, 1, (256, n, n))
            ga = cupy.asarray(a.astype(d))

            def factor(plan):
                out = (cupy.full_like(ga, np.nan), cupy.full((256, n), -7, np.int32), cupy.full((256,), -9, np.int32))
                tuning.launch_getrf(ga, *out, plan)
                return out

            lu, piv, info = factor(next(p for p in swept(d, n) if p.describe() == best))
            ratio = float(get01(a[:32].astype(d), cupy.asnumpy(lu[:32]), cupy.asnumpy(piv[:32])).max())
            ratio = ratio if bool((info == 0).all()) else float("inf")
            bitwise = ""
            if args.rev:
                bitwise = str(same_bits(on("old", lambda: factor(dispatched)), factor(dispatched)))
            print(f"  BEST {best} {new[best]:.3f} ms; dispatched {dispatched.describe()} "
                  f"{res.get(dispatched.describe(), float('nan')):.3f} (old {ref:.3f}); get01 {ratio:.3f}"
                  f" bitwise {bitwise}", flush=True)
            table.append((d, n, batch, dispatched.describe(), ref, new.get(dispatched.describe(), float("nan")),
                          best, new[best], ratio, bitwise))
    print("\n| dtype | n | batch | dispatched | old ms | new ms | best plan | ms | gain over old | get01 | bitwise |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for d, n, batch, dp, ref, now, best, ms, ratio, bitwise in table:
        print(f"| {d} | {n} | {batch} | {dp} | {ref:.3f} | {now:.3f} | {best} | {ms:.3f} | {ref / ms:.2f}x | "
              f"{ratio:.3f} | {bitwise} |")


if __name__ == "__main__":
    main()
