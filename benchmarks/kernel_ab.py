"""A/B of one CUDA kernel family: its source at a git revision against the working tree's, on the GPU.

    python3 benchmarks/kernel_ab.py --family getrf_blocked --rev 3a6c669 --op lu \\
        --dtypes float32,float64,complex64,complex128 --sizes 96,128,160,190,256

For each (dtype, n): fresh random matrices (uniform in [-1, 1), complex parts drawn separately), the
launch plan of the current dispatch, then both sources of ``kernels/cuda/<family>.cu`` on the same
input: outputs poisoned before each launch and compared bit for bit (``bitwise``), the LAPACK test
ratio of the new output on 32 matrices, and the median of ``--reps`` CUDA-event timings of each,
interleaved. A change that only moves data (copies, staging, loads in flight) must keep ``bitwise``
True. Ops: ``lu`` (getrf: family getrf_blocked / getrf_rows / getrf_small), ``getri`` (inverse from
the factors, family getri) and ``getrs`` (16 right-hand sides, family getrs).

The old source is compiled through the same loader (``batchlu.kernels._gpu._module``) and includes the
working tree's ``common.cuh``; a revision whose family needs an older ``common.cuh`` will not compile.
``--once`` launches each version once per point and times nothing (for ``ncu``).

Status: gathered from the two dev scripts behind the A/B tables of session 2 (getrf_blocked and getri,
``docs/kernels-notes.md`` / ``docs/getri-notes.md``); first run on a GPU in session 3 (op ``lu``, the
one-barrier-per-step experiment of kernels-notes.md "Session 3"); ops ``getri`` / ``getrs`` not yet.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks"]
sys.path.insert(0, str(ROOT))

OPS = ("lu", "getri", "getrs")


def old_source(family: str, rev: str) -> str:
    """``kernels/cuda/<family>.cu`` at git revision ``rev``."""
    path = f"kernels/cuda/{family}.cu"
    done = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"Expected {path} at revision {rev!r}. Got: {done.stderr.strip()}")
    return done.stdout


class Sources:
    """Switches ``batchlu.kernels._gpu._module`` between the old and the current source of one family."""

    def __init__(self, family: str, text: str):
        from batchlu.kernels._gpu import _module

        self.module, self.family, self.text = _module, family, text
        self.current = _module._source
        _module._source = self._source
        self.old = False

    def _source(self, family: str) -> str:
        return self.text if self.old and family == self.family else self.current(family)

    def use(self, which: str) -> None:
        self.old = which == "old"
        self.module._module.cache_clear()  # compiled modules are cached per (family, names)


def random_batch(shape, dtype, seed: int):
    import cupy

    rng = cupy.random.default_rng(seed)
    dtype = np.dtype(dtype)
    x = (rng.random(shape) * 2 - 1).astype(dtype)
    if dtype.kind == "c":
        x = (x + 1j * (rng.random(shape) * 2 - 1)).astype(dtype)
    return x


def point(op: str, dtype: str, n: int, batch: int, seed: int):
    """(inputs, run(out) -> None, fresh outputs(), ratio(inputs, outputs) -> float) of one point."""
    import cupy

    from batchlu.kernels._gpu import _getrf, _getri
    from batchlu.testing.ratios import get01, get02, get03

    a = random_batch((batch, n, n), dtype, seed)
    if op == "lu":
        plan = _getrf.plan(dtype, n)

        def fresh():
            return (cupy.full_like(a, np.nan), cupy.full((batch, n), -7, np.int32), cupy.full((batch,), -9, np.int32))

        def run(out):
            _getrf.launch(a, *out, plan)

        def ratio(out):
            return float(get01(cupy.asnumpy(a[:32]), cupy.asnumpy(out[0][:32]), cupy.asnumpy(out[1][:32])).max())

        return plan.describe(), fresh, run, ratio, None
    lu, piv, info = _getrf.getrf(a)
    if op == "getri":
        work = cupy.empty_like(lu)

        def fresh():
            return (cupy.full_like(a, np.nan),)

        def prepare():  # getri overwrites the factors
            work[...] = lu

        def run(out):
            _getri.launch_getri(work, piv, info, out[0])

        def ratio(out):
            return float(get03(cupy.asnumpy(a[:32]), cupy.asnumpy(out[0][:32])).max())

        return f"getri-{_getri.GETRI_MODE[np.dtype(dtype)]}", fresh, run, ratio, prepare
    b = random_batch((batch, n, 16), dtype, seed + 1)

    def fresh():
        return (cupy.full_like(b, np.nan),)

    def run(out):
        _getri.launch_getrs(lu, piv, b, out[0], info)

    def ratio(out):
        return float(get02(cupy.asnumpy(a[:32]), cupy.asnumpy(out[0][:32]), cupy.asnumpy(b[:32])).max())

    return "getrs-16", fresh, run, ratio, None


def elapsed_ms(fn, prepare, reps: int) -> float:
    import cupy

    times = []
    for _ in range(reps):
        if prepare:
            prepare()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return float(np.median(times))


def same_bits(x, y) -> bool:
    import cupy

    return all(bool(cupy.array_equal(p.view(np.uint8), q.view(np.uint8))) for p, q in zip(x, y))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", required=True, help="kernels/cuda/<family>.cu to compare")
    ap.add_argument("--rev", required=True, help="git revision of the old source")
    ap.add_argument("--op", choices=OPS, required=True)
    ap.add_argument("--dtypes", default="float32,float64,complex64,complex128")
    ap.add_argument("--sizes", default="128,190")
    ap.add_argument("--batch", type=int, default=10000)
    ap.add_argument("--max-bytes", type=float, default=2.5e9, help="cap on one input batch's bytes")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--once", action="store_true", help="launch each version once, time nothing (ncu)")
    args = ap.parse_args(argv)

    import cupy

    sources = Sources(args.family, old_source(args.family, args.rev))
    rows = []
    for dtype in filter(None, args.dtypes.split(",")):
        for n in (int(x) for x in args.sizes.split(",") if x):
            batch = max(1, min(args.batch, int(args.max_bytes // (np.dtype(dtype).itemsize * n * n))))
            plan, fresh, run, ratio, prepare = point(args.op, dtype, n, batch, seed=n)
            outs, ms = {}, {"old": [], "new": []}
            for which in ("old", "new"):
                sources.use(which)
                if prepare:
                    prepare()
                outs[which] = fresh()
                run(outs[which])
            cupy.cuda.Device().synchronize()
            if not args.once:
                for _ in range(2):  # interleaved, so that clocks and caches treat both alike
                    for which in ("old", "new"):
                        sources.use(which)
                        ms[which].append(elapsed_ms(lambda: run(outs[which]), prepare, args.reps))
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
