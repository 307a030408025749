"""Tile sweep of the fused solve gesv_rows (GPU machine, repo root): ``python3 benchmarks/bench_gesv_sweep.py``.

Every (RR, TJ) candidate of CANDS per dtype and n of DT, compiled in parallel first (16 processes,
CuPy's disk cache), then timed with ``_harness.time_case`` (median of 7, batch 10000, 16 right-hand
sides) against getrf + getrs; prints the best tile per point (the source of ``GESV_ROWS`` in
``batchlu.kernels.tuning``; docs/design.md#gesv-dispatch).
"""
from __future__ import annotations

import argparse

import numpy as np

from _harness import compile_report, precompile, time_case

CANDS = {
    16: [(1, 2), (2, 4)],
    33: [(5, 4), (3, 4), (5, 8), (3, 8)],
    48: [(6, 8), (3, 8), (3, 4)],
    64: [(4, 4), (4, 8), (8, 8)],
    96: [(4, 8), (6, 8)],
    128: [(8, 8), (8, 16)],
}
DT = {"float32": [16, 33, 48, 64, 96, 128], "float64": [16, 33, 48, 64, 96],
      "complex64": [16, 33, 48, 64], "complex128": [16, 33, 48, 64]}


def fits(dtype, n, rr_tj):
    from batchlu.kernels import tuning

    t = tuning.gesv_rows_tile(dtype, n, 16, rr_tj)
    return t if t[2] * (t[3] + t[4]) * np.dtype(dtype).itemsize // 4 <= 192 and t[0] * t[1] <= 1024 else None


def compile_one(job):
    dtype, n, rr_tj = job
    from batchlu.kernels import tuning

    t = fits(dtype, n, rr_tj)
    return compile_report(f"{job} {t}", "gesv", tuning.gesv_rows_name(dtype, t))


def main(argv=None) -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)

    import cupy

    from _inv_impls import ours_solve

    precompile(compile_one, [(d, n, c) for d, ns in DT.items() for n in ns for c in CANDS[n] if fits(d, n, c)])
    rows = []
    for d, ns in DT.items():
        for n in ns:
            res = {}
            for path in ["getrs"] + [f"rows-{rr}x{tj}" for rr, tj in CANDS[n] if fits(d, n, (rr, tj))]:
                try:
                    res[path] = time_case(ours_solve(d, n, 10000, path), 7)
                except Exception as e:
                    print(d, n, path, "FAILED", type(e).__name__, str(e)[:200], flush=True)
                cupy.get_default_memory_pool().free_all_blocks()
            tiles = [(v, k) for k, v in res.items() if k.startswith("rows")]
            if not tiles or "getrs" not in res:
                continue
            best = min(tiles)
            ref = res["getrs"]
            print(f"{d:10s} n={n:3d} " + " ".join(f"{k}={v:.3f}" for k, v in res.items())
                  + f"  BEST {best[1]} {best[0]:.3f} ms gain {ref / best[0]:.2f}x", flush=True)
            rows.append((d, n, best[1], best[0], ref))
    print("\n| dtype | n | best rows tile | ms | getrf + getrs ms | gain |\n|---|---|---|---|---|---|")
    for d, n, t, ms, ref in rows:
        print(f"| {d} | {n} | {t} | {ms:.3f} | {ref:.3f} | {ref / ms:.2f}x |")


if __name__ == "__main__":
    main()
