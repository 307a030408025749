"""Where the time of the register-tile LU (``getrf_rows``) or fused solve (``gesv_rows``) goes, at one n
(GPU machine, repo root):

    python3 benchmarks/bench_rows_latency.py --n 33 --out benchmarks/results/rows-latency-h200.json
    python3 benchmarks/bench_rows_latency.py --op solve --n 33 --rhs 16

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
   For solve the last phase holds the factors' move to shared memory, both triangular solves and the
   stores of X.

Every launch's output is checked first: outputs poisoned, LAPACK's get01 (lu) or get02 (solve) ratio on
32 matrices below the threshold, every pivot, info and element of X written (a kernel that computes the
wrong thing is not timed). Records go to ``--out`` (JSON list: ``op``, ``dtype``, ``n``, ``plan``,
``regs``, ``blocks_per_sm``, ``batch``, ``ms`` per batch; the phase split as ``cycles``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np

from _harness import event_ms, random_batch

PHASES = ("load", "loop", "column to colv + keys", "arg-max", "pivot row + pivot", "pivot value + l",
          "update", "store")  # solve: the last is the triangular solves and the stores
FAMILY = {"lu": "getrf", "solve": "gesv"}
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


def probed_source(family: str = "getrf") -> str:
    """``family``.cu (getrf or gesv) with rows.cuh inlined and clock stamps at the phase boundaries of
    rows_run."""
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
    text = tuning.kernel_source(family)
    if '#include "rows.cuh"' not in text:
        raise SystemExit(f"Expected {family}.cu to include rows.cuh. Got a {family}.cu without it instead.")
    return text.replace('#include "rows.cuh"', PROBE + rows)


@dataclass
class Target:
    """The dispatched register-tile kernel of (op, dtype, n): its family, name expression, path name,
    threads and dynamic shared memory a block."""

    op: str
    kernel: str
    label: str
    threads: int
    smem: int
    plan: object


def target(op: str, dtype, n: int, rhs: int) -> Target:
    from batchlu.kernels import tuning

    if op == "lu":
        plan = tuning.getrf_plan(dtype, n)
        if plan.kind != "rows":
            raise SystemExit(f"Expected n = {n} to go to getrf_rows for {dtype}. Got {plan.describe()} instead.")
        return Target(op, tuning.getrf_kernel_name(plan, dtype, n), plan.describe(),
                      plan.tile[0] * plan.tile[1], 0, plan)
    tile = tuning.gesv_rows_tile(dtype, n, rhs)
    if tile is None:
        raise SystemExit(f"Expected n = {n} and {rhs} right-hand sides to go to gesv_rows for {dtype}. Got "
                         f"a point the dispatch sends to getrf + getrs instead.")
    return Target(op, tuning.gesv_rows_name(dtype, tile), "gesv_rows-" + "x".join(map(str, tile)),
                  tile[0] * tile[1], tuning.gesv_rows_smem(dtype, tile), tile)


def checked_launch(t: Target, a, rhs: int):
    """Outputs for ``a`` and a launcher of ``t``; the first launch, on poisoned outputs, must pass get01
    (lu) or get02 (solve) on 32 matrices with every pivot, info and element of X written."""
    import cupy

    from batchlu.kernels import tuning
    from batchlu.testing.ratios import THRESHOLD, get01, get02

    batch, n = a.shape[0], a.shape[-1]
    info = cupy.full((batch,), -9, np.int32)
    if t.op == "lu":
        lu, piv = cupy.full_like(a, np.nan), cupy.full((batch, n), -7, np.int32)

        def launch():
            tuning.launch_getrf(a, lu, piv, info, t.plan)

        launch()
        ratio = float(get01(cupy.asnumpy(a[:32]), cupy.asnumpy(lu[:32]), cupy.asnumpy(piv[:32])).max())
        unwritten = int((piv < 0).sum()) + int((info < 0).sum())
    else:
        b = random_batch((batch, n, rhs), a.dtype, seed=batch + 1)
        x = cupy.full_like(b, np.nan)

        def launch():
            tuning.launch_gesv_rows(a, b, x, info, t.plan)

        launch()
        ratio = float(get02(cupy.asnumpy(a[:32]), cupy.asnumpy(x[:32]), cupy.asnumpy(b[:32])).max())
        unwritten = int((~cupy.isfinite(x)).sum()) + int((info != 0).sum())
    if not ratio < THRESHOLD or unwritten:
        raise SystemExit(f"Expected a correct {t.op} from {t.label}. Got a LAPACK ratio of {ratio:.3g} and "
                         f"{unwritten} unwritten outputs instead.")
    return launch


def median_ms(fn, reps: int) -> float:
    """:func:`_harness.event_ms` after one warm-up launch."""
    import cupy

    fn()
    cupy.cuda.Device().synchronize()
    return event_ms(fn, reps)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", choices=tuple(FAMILY), default="lu")
    ap.add_argument("--n", type=int, default=33)
    ap.add_argument("--rhs", type=int, default=16, help="right-hand sides (solve)")
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
    family = FAMILY[args.op]
    probed = probed_source(family)
    records, today = [], date.today().isoformat()
    for dtype in args.dtypes.split(","):
        dtype = np.dtype(dtype)
        t = target(args.op, dtype, args.n, args.rhs)
        func = tuning.compiled_kernel(family, t.kernel)
        handle = getattr(func, "kernel", func).ptr  # a RawKernel's CUfunction
        per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(handle, t.threads, t.smem)
        base = dict(op=args.op, dtype=dtype.name, n=args.n, plan=t.label, regs=func.num_regs,
                    blocks_per_sm=per_sm, device=name, date=today)
        if args.op == "solve":
            base["rhs"] = args.rhs
        times = []
        for k in ks:
            a = random_batch((sms * k, args.n, args.n), dtype, seed=k)
            ms = median_ms(checked_launch(t, a, args.rhs), args.reps)
            times.append((k, ms))
            records.append(dict(base, batch=sms * k, ms=ms))
        print(f"{dtype.name:<10} {t.label:<16} regs {func.num_regs:>3}, {per_sm:>2} blocks/SM: "
              + "  ".join(f"k={k} {ms * 1000:.1f} us" for k, ms in times), flush=True)
        for k in (1, ks[-1]):
            a = random_batch((sms * k, args.n, args.n), dtype, seed=100 + k)
            plain = median_ms(checked_launch(t, a, args.rhs), args.reps)
            with tuning.source_override(family, probed):
                launch = checked_launch(t, a, args.rhs)
                probe_ms = median_ms(launch, args.reps)
                acc = cupy.ndarray((8,), np.uint64, tuning.kernel_global(family, t.kernel, "blu_probe"))
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
