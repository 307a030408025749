"""Tile sweep of the register-resident kernels at small n (GPU machine, repo root):

    python3 benchmarks/bench_rows_sweep.py --ops lu,solve,inv --sizes 33 --reps 7

For each op, dtype and n, every candidate tile: ``getrf_rows`` (lu) and ``gesv_rows`` (solve, ``--rhs``
right-hand sides, 16 by default; and getrf + getrs) on (RR, TJ) shapes with n padded to 8 (the
default) or to 4, for lu also compiled for the next two occupancy steps above ``rows_min_blocks``'
(blocks per SM in ``__launch_bounds__`` whose register caps keep more blocks resident, spilling what
does not fit: :func:`occupancy_minbs`; two, as ptxas may already use fewer registers than the
default cap allows), for
solve also with fewer right-hand sides a pass (more lanes each); ``inv_gje`` (inv) on (TI, TJ, RR, CC,
MINB) tiles. ``--kinds`` keeps the candidates whose names start so (the dispatched one is always
timed): ``--ops solve --rhs 64 --kinds getrs`` times the dispatched solve against getrf + getrs. A candidate must be whole warps (at most 256 threads), its padded tile at most
1.5 n^2 elements, its data at most 200 registers a thread. All are compiled first in parallel (16
processes, CuPy's disk cache); each is then run once on poisoned outputs and checked by LAPACK's test
ratio (``_harness.check_case``: a wrong one is reported, never timed), then timed by
``_harness.time_case`` (median of ``--reps``, batch ``--batch``) on the same fresh random batches.
Prints every time, then a table of the dispatched tile against the fastest (the source of
``GETRF_DISPATCH``, ``GESV_ROWS`` and ``GJE_TILES``: docs/design.md).
"""
from __future__ import annotations

import argparse

import numpy as np

from _harness import WrongResult, check_case, compile_report, precompile, tile_of, time_case

MAX_THREADS = 256
MAX_DATA_REGS = 200
MAX_AREA = 1.5


def _words(dtype) -> int:
    return np.dtype(dtype).itemsize // 4


def rows_shapes(op: str, dtype, n: int) -> list[str]:
    """Candidate path names of getrf_rows (``rows-RRxTJ[xSTEP][mM]``) or gesv_rows
    (``rows-RRxTJ[xSTEPxLANES]``: LANES at least per right-hand side, 16 right-hand sides)."""
    from batchlu.kernels import tuning

    out = []
    for tj in (2, 4, 8, 16):
        for rr in range(1, 18):
            for step in (0, 4):
                plan = tuning.rows_plan(n, rr, tj, step)
                ti, _, _, cc = plan.tile
                if (ti * tj > MAX_THREADS or ti * rr * tj * cc > MAX_AREA * n * n
                        or rr * cc * _words(dtype) > MAX_DATA_REGS):
                    continue
                if step and plan.tile == tuning.rows_plan(n, rr, tj).tile:
                    continue  # the same tile as the default padding
                name = f"rows-{rr}x{tj}" + (f"x{step}" if step else "")
                out.append(name)
                if op == "solve":  # fewer right-hand sides a pass: 2 and 4 times the lanes each
                    kr = {tuning.gesv_rows_tile(dtype, n, 16, (rr, tj, step, 1))[4]}
                    for lanes in (2, 4, 8, 16, 32):
                        tile = tuning.gesv_rows_tile(dtype, n, 16, (rr, tj, step, lanes))
                        if tile[4] not in kr and len(kr) < 3:
                            kr.add(tile[4])
                            out.append(f"rows-{rr}x{tj}x{step}x{lanes}")
                if op == "lu":
                    out += [f"{name}m{m}" for m in occupancy_minbs(tuning.rows_min_blocks(dtype, plan.tile), ti * tj)]
    return out


def _resident(minb: int, threads: int) -> int:
    """Blocks of ``threads`` an SM (4 partitions of 16K registers, 2048 threads) keeps resident when
    compiled with ``__launch_bounds__(threads, minb)``: ptxas caps registers at 65536 / (minb threads)
    (a multiple of 8, at most 255); a warp takes them rounded up to 256 registers."""
    regs = min(255, 65536 // (minb * threads) // 8 * 8)
    per_partition = 16384 // (-(-regs * 32 // 256) * 256)
    return min(4 * per_partition // max(1, threads // 32), 2048 // threads, 32)


def occupancy_minbs(base: int, threads: int, steps: int = 2) -> list[int]:
    """The ``steps`` smallest blocks-per-SM bounds above ``base`` each of whose register caps keeps
    more blocks resident than the one before (fewer where 2048 threads an SM end it first)."""
    out, now = [], _resident(base, threads)
    for m in range(base + 1, 2048 // threads + 1):
        if len(out) < steps and _resident(m, threads) > now:
            out.append(m)
            now = _resident(m, threads)
    return out


def gje_tiles(dtype, n: int) -> list[str]:
    """Candidate path names ``fused-TIxTJxRRxCCxMINB`` of inv_gje."""
    out = []
    for ti in (4, 8, 12, 16, 32):
        for tj in (4, 8, 16):
            nt, rr, cc = ti * tj, -(-n // ti), -(-n // tj)
            if (nt % 32 or nt > MAX_THREADS or ti * rr * tj * cc > MAX_AREA * n * n
                    or rr * cc * _words(dtype) > MAX_DATA_REGS):
                continue
            most = 65536 // (nt * min(255, rr * cc * _words(dtype) + 48))
            out += [f"fused-{ti}x{tj}x{rr}x{cc}x{m}" for m in sorted({1, max(1, min(most, 2048 // nt))})]
    return out


def candidates(op: str, dtype, n: int) -> list[str]:
    """Every candidate path of (op, dtype, n); for solve also getrf + getrs (``getrs``)."""
    if op == "inv":
        return gje_tiles(dtype, n)
    return rows_shapes(op, dtype, n) + (["getrs"] if op == "solve" else [])


def dispatched(op: str, dtype, n: int, rhs: int = 16) -> str:
    """The path name of the tile the dispatch tables give (op, dtype, n; solve: ``rhs`` right-hand
    sides)."""
    from batchlu.kernels import tuning

    if op == "inv":
        return "fused-" + "x".join(map(str, tuning.gje_tile(dtype, n)))
    if op == "solve":
        tile = tuning.gesv_rows_tile(dtype, n, rhs)
        return next((p for p in rows_shapes(op, dtype, n) if _solve_tile(dtype, n, p, rhs) == tile), "getrs")
    return "plan:" + tuning.getrf_plan(dtype, n, smem=232448).describe()


def _solve_tile(dtype, n: int, path: str, rhs: int = 16):
    from batchlu.kernels import tuning

    return tuning.gesv_rows_tile(dtype, n, rhs, tile_of(path))


def _lu_plan(n: int, path: str):
    from _lu_impls import rows_plan_of

    return rows_plan_of(path.split("-")[1], n)


def _case(op: str, dtype, n: int, batch: int, path: str, rhs: int = 16):
    if op == "lu":
        from _lu_impls import ours

        return ours(dtype, n, batch, None if path.startswith("plan:") else _lu_plan(n, path))
    from _inv_impls import ours_inv, ours_solve

    return ours_inv(dtype, n, batch, path) if op == "inv" else ours_solve(dtype, n, batch, path, rhs)


def compile_one(job):
    op, dtype, n, path, rhs = job
    from batchlu.kernels import tuning

    label = f"{op} {dtype} {n} {path}"
    if path == "getrs":
        return f"{label}: compiled when first run"
    if op == "lu":
        return compile_report(label, "getrf", tuning.getrf_kernel_name(_lu_plan(n, path), dtype, n))
    if op == "solve":
        return compile_report(label, "gesv", tuning.gesv_rows_name(dtype, _solve_tile(dtype, n, path, rhs)))
    return compile_report(label, "getri", tuning.gje_name(dtype, tile_of(path)))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default="lu,solve,inv")
    ap.add_argument("--dtypes", default="float32,float64,complex64,complex128")
    ap.add_argument("--sizes", default="33")
    ap.add_argument("--batch", type=int, default=10000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--kinds", default="", help="only candidates whose name starts with one of these "
                    "(comma-separated, e.g. rows-5x4,getrs); the dispatched one is always timed")
    ap.add_argument("--rhs", type=int, default=16, help="right-hand sides of solve")
    args = ap.parse_args(argv)
    ops = [o for o in args.ops.split(",") if o]
    dtypes = [d for d in args.dtypes.split(",") if d]
    sizes = [int(x) for x in args.sizes.split(",") if x]

    import cupy

    kinds = tuple(k for k in args.kinds.split(",") if k)

    def chosen(op, d, n):
        ref = dispatched(op, d, n, args.rhs)
        return [ref] + [p for p in candidates(op, d, n) if p != ref and (not kinds or p.startswith(kinds))]

    jobs = [(op, d, n, p, args.rhs) for op in ops for d in dtypes for n in sizes for p in chosen(op, d, n)
            if not p.startswith("plan:")]
    precompile(compile_one, jobs)
    rows = []
    for op in ops:
        for d in dtypes:
            for n in sizes:
                ref = dispatched(op, d, n, args.rhs)
                res = {}
                for path in chosen(op, d, n):
                    try:
                        case = _case(op, d, n, args.batch, path, args.rhs)
                        check_case(case)
                        res[path] = time_case(case, args.reps)
                    except WrongResult as e:
                        print(op, d, n, path, "WRONG", e, flush=True)
                    except Exception as e:
                        print(op, d, n, path, "FAILED", type(e).__name__, str(e)[:200], flush=True)
                    cupy.get_default_memory_pool().free_all_blocks()
                if not res:
                    continue
                best = min(res, key=res.get)
                ranked = sorted(res.items(), key=lambda kv: kv[1])
                print(f"{op} {d:10s} n={n:3d} " + " ".join(f"{k}={v:.3f}" for k, v in ranked), flush=True)
                rows.append((op, d, n, ref, res.get(ref, float("nan")), best, res[best]))
    print("\n| op | dtype | n | dispatched | ms | fastest | ms | gain |\n|---|---|---|---|---|---|---|---|")
    for op, d, n, ref, rms, b, bms in rows:
        print(f"| {op} | {d} | {n} | {ref} | {rms:.3f} | {b} | {bms:.3f} | {rms / bms:.2f}x |")


if __name__ == "__main__":
    main()
