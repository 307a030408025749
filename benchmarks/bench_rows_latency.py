"""Where the time of the register-tile LU (``getrf_rows``) goes, at one n (GPU machine, repo root):

    python3 benchmarks/bench_rows_latency.py --n 33 --out benchmarks/results/rows-latency-h200.json

Two measurements per dtype, on the kernel and tile the dispatch picks for n (an n the dispatch sends to
another kernel is refused):

1. **Time against batch.** The batch is SMs x k matrices, k = 1, 2, 4, ... up to ``--batch``; one
   block per matrix, so k matrices per SM. Where the time stays flat while k grows up to the blocks an
   SM holds at once (the kernel's occupancy, printed), each block's own chain of dependent steps, not
   the SM's throughput, sets the time: the kernel is latency-bound, and ``waves`` (batch over the
   blocks resident on the device at once) times one block's latency predicts the time at any batch.
2. **Cycles per phase of a column step.** The same source with ``%clock`` read at the boundaries of
   the phases of a column step (rows.cuh's steps 1-4 and the rank-1 update), accumulated per block and
   averaged over blocks and columns; at batch = SMs (one block per SM: the chain alone) and at the
   largest batch (every SM full: the chain under contention). The reads add a few cycles each and some
   registers (complex128 spills a little more), so the probed kernel's time is printed next to the
   plain one's; phases are approximate where instructions of one phase are still in flight in the next.

Every launch's output is checked first: outputs poisoned, LAPACK's get01 ratio on 32 matrices below the
threshold, every pivot written (a kernel that computes the wrong thing is not timed). Records go to
``--out`` (JSON list: ``op``, ``dtype``, ``n``, ``plan``, ``regs``, ``blocks_per_sm``, ``batch``,
``ms`` per batch; the phase split as ``cycles``).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import date
from pathlib import Path

import numpy as np

from _harness import random_batch

PHASES = ("load", "loop", "column to colv + keys", "arg-max", "pivot row + pivot", "pivot value + l",
          "update", "store")
# (anchor in rows.cuh, stamp index, insert after the anchor?) for the phase split; a rows.cuh whose
# text no longer holds an anchor stops the run with the anchor's name.
STAMPS = (
    ("    T x[RR][CC];\n    unsigned act = 0;", None, False),
    ("    if (!nonfinite) {", 0, False),
    ("const bool owner = tj == kt;", 1, True),
    ("                // 2-3. the warp's candidate", 2, False),
    ("const int wl = rows_argmax<WIDE>(key, kpos);", 3, True),
    ("                const T pv = colv[buf][ci];", 4, False),
    ("                // rank-1 update of the unpivoted rows", 5, False),
    ("                        if ((act >> r) & 1) x[r][kc] = l[r];\n                    }\n                }\n", 6, True),
)
PROBE = r'''
__device__ unsigned long long blu_probe[8];
#define BLU_PROBE_DECL unsigned pacc[8] = {0, 0, 0, 0, 0, 0, 0, 0}; unsigned plast; \
    asm volatile("mov.u32 %0, %%clock;" : "=r"(plast) :: "memory");
#define BLU_STAMP(i) { unsigned t_; asm volatile("mov.u32 %0, %%clock;" : "=r"(t_) :: "memory"); \
    pacc[i] += t_ - plast; plast = t_; }
'''
FLUSH = ("BLU_STAMP(7)\nif (threadIdx.x == 0) for (int q = 0; q < 8; ++q) "
         "atomicAdd(&blu_probe[q], (unsigned long long)pacc[q]);\n")


def probed_source() -> str:
    """getrf.cu with rows.cuh inlined and clock stamps at the phase boundaries of rows_run."""
    from batchlu.kernels import tuning

    cuda = Path(tuning.__file__).resolve().parent / "cuda"
    rows = (cuda / "rows.cuh").read_text()
    for anchor, index, after in STAMPS:
        at = rows.find(anchor)
        if at < 0:
            raise SystemExit(f"Expected rows.cuh to hold the phase anchor {anchor.strip()[:60]!r} "
                             f"(bench_rows_latency.STAMPS). Got a rows.cuh without it instead.")
        text = "BLU_PROBE_DECL\n" if index is None else f"\nBLU_STAMP({index})\n"
        at += len(anchor) if after else 0
        rows = rows[:at] + text + rows[at:]
    end = rows.rfind("    }\n}\n\n}  // namespace blu")
    if end < 0:
        raise SystemExit("Expected rows.cuh to end rows_run before namespace blu closes. Got another layout.")
    rows = rows[:end] + FLUSH + rows[end:]
    getrf = tuning.kernel_source("getrf")
    if '#include "rows.cuh"' not in getrf:
        raise SystemExit("Expected getrf.cu to include rows.cuh. Got a getrf.cu without it instead.")
    return getrf.replace('#include "rows.cuh"', PROBE + rows)


def checked_launch(a, plan):
    """Outputs for ``a`` and a launcher; the first launch, on poisoned outputs, must pass get01 on 32
    matrices with every pivot written."""
    import cupy

    from batchlu.kernels import tuning
    from batchlu.testing.ratios import THRESHOLD, get01

    batch, n = a.shape[0], a.shape[-1]
    lu, piv = cupy.full_like(a, np.nan), cupy.full((batch, n), -7, np.int32)
    info = cupy.full((batch,), -9, np.int32)

    def launch():
        tuning.launch_getrf(a, lu, piv, info, plan)

    launch()
    ratio = float(get01(cupy.asnumpy(a[:32]), cupy.asnumpy(lu[:32]), cupy.asnumpy(piv[:32])).max())
    if not ratio < THRESHOLD or int((piv < 0).sum()) or int((info < 0).sum()):
        raise SystemExit(f"Expected a correct LU from {plan.describe()}. Got get01 = {ratio:.3g}, "
                         f"{int((piv < 0).sum())} unwritten pivots instead.")
    return launch


def median_ms(fn, reps: int) -> float:
    import cupy

    fn()
    cupy.cuda.Device().synchronize()
    start, end, times = cupy.cuda.Event(), cupy.cuda.Event(), []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return float(np.median(times))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=33)
    ap.add_argument("--dtypes", default="float32,float64,complex64,complex128")
    ap.add_argument("--batch", type=int, default=10032, help="largest batch (rounded down to whole SMs)")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--out", type=Path, default=None, help="JSON records")
    args = ap.parse_args(argv)

    import cupy

    from batchlu.kernels import tuning

    device = cupy.cuda.Device()
    sms = device.attributes["MultiProcessorCount"]
    name = cupy.cuda.runtime.getDeviceProperties(device.id)["name"].decode()
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64) if sms * k < args.batch] + [args.batch // sms]
    probed = probed_source()
    records, today = [], date.today().isoformat()
    for dtype in args.dtypes.split(","):
        dtype = np.dtype(dtype)
        plan = tuning.getrf_plan(dtype, args.n)
        if plan.kind != "rows":
            raise SystemExit(f"Expected n = {args.n} to go to getrf_rows for {dtype}. Got {plan.describe()} "
                             f"instead.")
        kname = tuning.getrf_kernel_name(plan, dtype, args.n)
        func = tuning.compiled_kernel("getrf", kname)
        threads = plan.tile[0] * plan.tile[1]
        handle = getattr(func, "kernel", func).ptr  # a RawKernel's CUfunction
        per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(handle, threads, 0)
        base = dict(op="lu", dtype=dtype.name, n=args.n, plan=plan.describe(), regs=func.num_regs,
                    blocks_per_sm=per_sm, device=name, date=today)
        times = []
        for k in ks:
            a = random_batch((sms * k, args.n, args.n), dtype, seed=k)
            ms = median_ms(checked_launch(a, plan), args.reps)
            times.append((k, ms))
            records.append(dict(base, batch=sms * k, ms=ms))
        print(f"{dtype.name:<10} {plan.describe():<16} regs {func.num_regs:>3}, {per_sm:>2} blocks/SM: "
              + "  ".join(f"k={k} {ms * 1000:.1f} us" for k, ms in times), flush=True)
        for k in (1, ks[-1]):
            a = random_batch((sms * k, args.n, args.n), dtype, seed=100 + k)
            plain = median_ms(checked_launch(a, plan), args.reps)
            with tuning.source_override("getrf", probed):
                launch = checked_launch(a, plan)
                probe_ms = median_ms(launch, args.reps)
                acc = cupy.ndarray((8,), np.uint64, tuning.kernel_global("getrf", kname, "blu_probe"))
                acc[...] = 0
                launch()
                device.synchronize()
                per_block = acc.get().astype(float) / (sms * k)
            cycles = {p: round(c if i in (0, 7) else c / args.n, 1) for i, (p, c) in
                      enumerate(zip(PHASES, per_block))}
            records.append(dict(base, batch=sms * k, ms=plain, probed_ms=probe_ms,
                                cycles_per_block=round(float(per_block.sum())), cycles=cycles))
            print(f"  batch {sms * k:>6}: plain {plain * 1000:.1f} us, probed {probe_ms * 1000:.1f} us, "
                  f"{per_block.sum():.0f} cycles a block; per column: "
                  + ", ".join(f"{p} {c:.0f}" for p, c in list(cycles.items())[1:7])
                  + f"; load {cycles['load']:.0f}, store {cycles['store']:.0f}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(records, indent=1) + "\n")
        print(f"wrote {len(records)} records to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
