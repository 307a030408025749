"""Plan sweep of the blocked getrf kernels (GPU machine, repo root):

    python3 benchmarks/blocked_sweep.py --dtypes float32,float64,complex64,complex128 --sizes 128,190 \\
        --rev HEAD

``--op getri`` instead times ``_getri.launch_getri`` in each mode and blocks-per-SM bound (minb) on
the factors of one random batch. For ``--op lu`` (the default): for each (dtype, n), every blocked plan -- kind ``blocked`` (panel rows in registers) or
``blocked_smem``, NB from ``_getrf._BLOCKED_NB`` but 32, and ``minb`` (``__launch_bounds__``' blocks
per SM; 0 = none) among those whose shared memory and registers (>= 64 per thread) allow it -- is
compiled in parallel first (16 processes, CuPy's disk cache), then run on the same fresh random batch
(``benchmarks/kernels.py``'s ``time_case``: L2 scrubbed, median of ``--reps``). With ``--rev``, the
``getrf_blocked.cu`` of that git revision runs too, on the minb = 0 plans (the kernel names are the
same), and its outputs are compared bit for bit with the working tree's. Prints the best plan per point
and a Markdown table; the LAPACK ratio get01 of the best plan on 32 matrices is checked (< 30).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks"]
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "benchmarks"))

from gesv_sweep import _time_case, precompile  # noqa: E402  (shared with the gesv_rows sweep)

SMEM_SM = 228 * 1024  # H100: shared memory per SM (each block also reserves 1 KB; 16 B static)


def plans(dtype, n: int, split: bool = False) -> list:
    """Every blocked plan (kind, NB but 32, minb); with ``split`` also those whose blocks of L are
    narrower than the panel (kb < NB, NB 32 included), and only those."""
    from batchlu.kernels._gpu import _getrf

    item, warps = np.dtype(dtype).itemsize, -(-n // 32)
    nbs = _getrf._BLOCKED_NB[item]
    out = []
    for kind in ("blocked", "blocked_smem"):
        for nb in nbs:
            for kb in [k for k in nbs if k < nb] if split else [0]:
                if nb == 32 and not split:
                    continue
                smem = _getrf.blocked_smem(dtype, n, nb, _getrf.blocked_ldp(dtype, n, nb, SMEM_SM, kb), kb)
                if smem + 16 + 1024 > SMEM_SM:
                    continue
                out.append(_getrf.Plan(kind, nb, 0, kb))
                for minb in range(2, 9):
                    per_partition = -(-minb * warps // 4)
                    regs = min(255, 16384 // (per_partition * 32) // 8 * 8)
                    if minb * (smem + 16 + 1024) <= SMEM_SM and regs >= 64 and minb * warps <= 64:
                        out.append(_getrf.Plan(kind, nb, minb, kb))
    return out


def _name(dtype, n: int, plan) -> str:
    from batchlu.kernels._gpu import _getrf

    return _getrf._blocked_name(plan.kind, dtype, plan.tile, -(-n // 32) * 32, plan.minb, plan.kb)


def _prev_smem(dtype, n: int, nb: int, ldp: int, layout: str) -> int:
    """Shared memory of an older getrf_blocked.cu, so that such a source gets what it needs: layout
    "3buf" = three NB x ldp buffers (commits 1764154 .. 58ef887), "pre1764154" = that and int
    bookkeeping with the padded stride (e6ed8ac .. the parent of 1764154)."""
    from batchlu.kernels._gpu import _getrf

    item = np.dtype(dtype).itemsize
    if layout == "3buf":
        return 3 * nb * ldp * item + n * (4 + 2 * 2) + 16 + 32 * 16 + 64 * item
    return 3 * nb * _getrf._ldp(n) * item + 3 * n * 4 + 16 + 64 * 16 + 128 * item


class _OldSmem:
    """Switches ``_getrf.blocked_smem`` to max(current, previous layout) while the old source runs."""

    def __init__(self, sources, layout: str):
        from batchlu.kernels._gpu import _getrf

        self.sources, self.getrf, self.current, self.layout = sources, _getrf, _getrf.blocked_smem, layout

    def use(self, which: str) -> None:
        self.sources.use(which)
        cur = self.current
        self.getrf.blocked_smem = cur if which == "new" else (
            lambda d, n, nb, ldp=None: max(cur(d, n, nb, ldp),
                                           _prev_smem(d, n, nb, self.getrf._ldp(n) if ldp is None else ldp,
                                                      self.layout)))


def _old_text(rev: str) -> str:
    """The old getrf_blocked.cu: a file path (the GPU machine's copy has no .git) or a git revision."""
    if Path(rev).is_file():
        return Path(rev).read_text()
    from kernel_ab import old_source

    return old_source("getrf_blocked", rev)


def compile_one(job):
    dtype, n, plan, rev = job
    from batchlu.kernels._gpu._module import get_function

    if rev:
        from kernel_ab import Sources

        Sources("getrf_blocked", _old_text(rev)).use("old")
    t0 = time.time()
    try:
        get_function("getrf_blocked", _name(dtype, n, plan))
    except Exception as e:  # reported, the sweep goes on without it
        return f"{dtype} {n} {plan.describe()} {'old' if rev else ''}: {type(e).__name__} {str(e)[-400:]}"
    return f"{dtype} {n} {plan.describe()} {'old' if rev else 'new'} {time.time() - t0:.1f}s"


def getri_plans(dtype, n: int, nbs=None) -> list[tuple[str, int, bool, int]]:
    """(mode, minb, mma, nb) of ``_getri.launch_getri``: every mode at minb = 0 and with each
    minb whose registers (>= 64 per thread) allow it; for n <= 512 each of them with mma too; each for
    every block-row height in ``nbs`` (default: ``_getri._nb``'s)."""
    from batchlu.kernels._gpu import _getri

    warps = -(-n // 32)
    out = [("static", 0), ("merged", 0), ("dynamic", 0)]
    for minb in range(2, 6):
        if min(255, 16384 // (-(-minb * warps // 4) * 32) // 8 * 8) >= 64 and minb * warps <= 64:
            out += [("static", minb), ("merged", minb), ("dynamic", minb)]
    plans = [(mode, minb, False) for mode, minb in out]
    if n <= 512:
        plans += [(mode, minb, True) for mode, minb in out]
    return [p + (nb,) for nb in (nbs or [_getri._nb(dtype)]) for p in plans]


def compile_getri(job):
    dtype, n, mode, minb, mma, nb = job
    from batchlu.kernels._gpu import _getri
    from batchlu.kernels._gpu._module import get_function

    _, names = _getri.getri_kernels(dtype, -(-n // 32) * 32, mode, minb, mma, nb)
    t0 = time.time()
    get_function("getri", names[0], names=names)
    return f"{dtype} {n} {mode} minb {minb} mma {mma} nb {nb} {time.time() - t0:.1f}s"


def sweep_getri(dtypes, sizes, args) -> None:
    """The getri op: each (mode, minb) on the factors of one fresh random batch (get03 of the best)."""
    import cupy

    from _lu_impls import Case
    from kernel_ab import random_batch
    from batchlu.kernels._gpu import _getrf, _getri
    from batchlu.testing.ratios import get03

    nbs = [int(x) for x in args.nbs.split(",") if x] or None
    jobs = {}  # one job per set of kernels compiled together
    for d in dtypes:
        for n in sizes:
            for plan in getri_plans(d, n, nbs):
                jobs.setdefault(_getri.getri_kernels(d, -(-n // 32) * 32, *plan)[1], (d, n) + plan)
    precompile(compile_getri, sorted(jobs.values(), key=str))
    time_case = _time_case()
    table = []
    for d in dtypes:
        for n in sizes:
            batch = max(1, min(args.batch, int(args.max_bytes // (np.dtype(d).itemsize * n * n))))
            a = random_batch((batch, n, n), d, seed=n)
            lu, piv, info = _getrf.getrf(a)
            work, out = cupy.empty_like(lu), cupy.empty_like(lu)
            res = {}
            plans = {}
            for mode, minb, mma, nb in getri_plans(d, n, nbs):
                def prepare(k):
                    work[...] = lu

                def run(mode=mode, minb=minb, mma=mma, nb=nb):
                    _getri.launch_getri(work, piv, info, out, mode, minb, mma, nb)

                key = f"{mode}-m{minb}{'-mma' if mma else ''}" + (f"-nb{nb}" if nbs else "")
                plans[key] = (mode, minb, mma, nb)
                try:
                    res[key] = time_case(Case(prepare, run), args.reps)
                except Exception as e:
                    print(d, n, key, "FAILED", type(e).__name__, str(e)[:300], flush=True)
            best = min(res, key=res.get)
            out[...] = np.nan
            work[...] = lu
            _getri.launch_getri(work, piv, info, out, *plans[best])
            assert not bool(cupy.isnan(out).any()), f"{d} n={n} {best}: elements left unwritten"
            ratio = float(get03(cupy.asnumpy(a[:32]), cupy.asnumpy(out[:32])).max())
            ref = res[min((k for k in res if k.startswith(f"{_getri.GETRI_MODE[np.dtype(d)]}-m0")), key=len)]
            print(f"{d:10s} n={n:3d} batch={batch} " + " ".join(f"{k}={v:.3f}" for k, v in res.items()), flush=True)
            table.append((d, n, batch, _getri.GETRI_MODE[np.dtype(d)], ref, best, res[best], ratio))
            del a, lu, piv, info, work, out
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
    ap.add_argument("--rev", default="", help="git revision (or a file) of the old getrf_blocked.cu "
                                              "(minb = 0 plans)")
    ap.add_argument("--old-layout", choices=("current", "3buf", "pre1764154"), default="current",
                    help="shared-memory layout of the --rev source (_prev_smem): it gets max(current, that) "
                         "bytes")
    ap.add_argument("--plans", choices=("all", "dispatched"), default="all",
                    help="all: every blocked plan; dispatched: only _getrf.plan's (old and new source on it, "
                         "for a quick A/B with --rev)")
    ap.add_argument("--split", action="store_true",
                    help="sweep the plans whose blocks of L are narrower than the panel (kb < NB) instead")
    ap.add_argument("--op", choices=("lu", "getri"), default="lu",
                    help="lu: the getrf_blocked plans; getri: launch_getri's modes and minb")
    ap.add_argument("--nbs", default="", help="getri: block-row heights to sweep (default: _getri._nb's)")
    args = ap.parse_args(argv)
    dtypes = [d for d in args.dtypes.split(",") if d]
    sizes = [int(x) for x in args.sizes.split(",") if x]
    if args.op == "getri":
        return sweep_getri(dtypes, sizes, args)

    def swept(d, n):
        if args.plans == "dispatched":
            from batchlu.kernels._gpu import _getrf

            return [_getrf.plan(d, n)]
        if args.split:  # the dispatched plan too, for reference
            from batchlu.kernels._gpu import _getrf

            return [_getrf.plan(d, n)] + plans(d, n, True)
        return plans(d, n)

    def old_too(p):  # every plan runs the old source too when only the dispatched one is swept
        return args.rev and not p.kb and (args.plans == "dispatched" or not p.minb)

    jobs = [(d, n, p, "") for d in dtypes for n in sizes for p in swept(d, n)]
    jobs += [(d, n, p, args.rev) for d in dtypes for n in sizes for p in swept(d, n) if old_too(p)]
    precompile(compile_one, jobs)

    import cupy

    from _lu_impls import ours
    from kernel_ab import Sources, same_bits
    from batchlu.kernels._gpu import _getrf
    from batchlu.testing.ratios import get01

    time_case = _time_case()
    sources = None
    if args.rev:
        sources = Sources("getrf_blocked", _old_text(args.rev))
        sources = _OldSmem(sources, args.old_layout) if args.old_layout != "current" else sources
    table = []
    for d in dtypes:
        for n in sizes:
            batch = max(1, min(args.batch, int(args.max_bytes // (np.dtype(d).itemsize * n * n))))
            dispatched = _getrf.plan(d, n)
            res = {}
            for p in swept(d, n):
                for which in (("old", "new") if old_too(p) else ("new",)):
                    key = p.describe() + (" (old)" if which == "old" else "")
                    if sources:
                        sources.use(which)
                    try:
                        case = ours(d, n, batch, p)
                        res[key] = time_case(case, args.reps)
                    except Exception as e:
                        print(d, n, key, "FAILED", type(e).__name__, str(e)[:300], flush=True)
                    cupy.get_default_memory_pool().free_all_blocks()
            if sources:
                sources.use("new")
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
                _getrf.launch(ga, *out, plan)
                return out

            lu, piv, info = factor(next(p for p in swept(d, n) if p.describe() == best))
            ratio = float(get01(a[:32].astype(d), cupy.asnumpy(lu[:32]), cupy.asnumpy(piv[:32])).max())
            ratio = ratio if bool((info == 0).all()) else float("inf")
            bitwise = ""
            if args.rev:
                sources.use("old")
                old = factor(dispatched)
                sources.use("new")
                bitwise = str(same_bits(old, factor(dispatched)))
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
