"""Benchmark driver for batchlu's GPU kernels against cuBLAS, torch (MAGMA / default) and JAX.

    python3 benchmarks/bench_kernels.py --ops lu --dtypes float32,float64,complex64,complex128 \\
        --sizes 16,33,64,96,128,160,190,256,512 --batch 10000 --out benchmarks/results

Implementations come from per-op registries, private modules beside this file that expose
``IMPLS = {op: {name: factory(dtype, n, batch) -> Case}}`` and ``FLOPS = {op: fn(n, batch, dtype)}``
(optionally ``BYTES`` for the memory floor and ``variant(op, name)`` for extra names such as
``ours:blocked-16``): ``_lu_impls`` (op ``lu``), ``_inv_impls`` (ops ``inv``, ``solve``) and
``_api_impls`` (``api``: the public API's dispatch; ``cusolver``: the large-n path forced).

Timing: per (op, dtype, n, impl) two fresh random input sets, a warm-up, then ``--reps`` runs, each
after an untimed copy of fresh input into the work buffer and a 256 MB write that evicts the L2
cache; CUDA events on the null stream around the call (JAX: host clock around a blocking call);
the median is reported. Outputs, in ``--out``: ``kernels-<gpu>.json`` (records ``op, dtype, n,
batch, impl, ms, gflops, device, date``; merged into ``--merge``, replacing records with the same
``op, dtype, n, impl``), ``kernels-<gpu>-<op>.png`` (GFLOP/s against n, one panel per dtype) and
``kernels-<gpu>.md`` (per-point table: speedup over the best peer, memory/compute floor, % of floor).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import os
import statistics
import sys
from pathlib import Path

import numpy as np

from _harness import time_case

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# JAX's default allocator keeps what it once took: the next points then run out of memory.
os.environ.setdefault("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")

REGISTRIES = ("_lu_impls", "_inv_impls", "_api_impls")
BAR_SIZES = (33, 64, 128, 190)
# H100 SXM non-tensor peaks (datasheet): FP32 66.9 TFLOP/s, FP64 33.5 TFLOP/s.
PEAK = {"float32": 66.9e12, "complex64": 66.9e12, "float64": 33.5e12, "complex128": 33.5e12}


def load_registries():
    impls, flops, nbytes, variants = {}, {}, {}, []
    for name in REGISTRIES:
        mod = importlib.import_module(name)
        for op, table in mod.IMPLS.items():
            impls.setdefault(op, {}).update(table)
        flops.update(mod.FLOPS)
        nbytes.update(getattr(mod, "BYTES", {}))
        if hasattr(mod, "variant"):
            variants.append(mod.variant)
    return impls, flops, nbytes, variants


def gpu_tag() -> str:
    import cupy

    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())["name"].decode().lower()
    for tag in ("h200", "h100", "a100", "l40s", "v100"):
        if tag in name:
            return tag
    return "".join(ch if ch.isalnum() else "-" for ch in name).strip("-")


def device_name() -> str:
    import cupy

    return cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())["name"].decode()


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth (bytes read + written per second), 1 GiB, median of 10."""
    import cupy

    x = cupy.ones(1 << 28, np.float32)
    y = cupy.empty_like(x)
    times = []
    for _ in range(12):
        s, e = cupy.cuda.Event(), cupy.cuda.Event()
        s.record()
        y[...] = x
        e.record()
        e.synchronize()
        times.append(cupy.cuda.get_elapsed_time(s, e) / 1e3)
    del x, y
    return 2 * (1 << 30) / statistics.median(times[2:])


def free_memory() -> None:
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()
    if "torch" in sys.modules:
        sys.modules["torch"].cuda.empty_cache()


def run(args) -> list[dict]:
    impls, flops, _, variants = load_registries()
    device, date = device_name(), datetime.date.today().isoformat()
    records = []
    for op in args.ops:
        if op not in impls:
            raise SystemExit(f"Expected --ops among {sorted(impls)}. Got {op!r} instead.")
        names = args.impls or list(impls[op])
        names += [x for x in args.extra if x not in names]
        for dtype in args.dtypes:
            for n in args.sizes:
                itemsize = np.dtype(dtype).itemsize
                batch = int(max(1, min(args.batch, args.max_bytes // (n * n * itemsize))))
                for name in names:
                    factory = impls[op].get(name)
                    for v in variants:
                        factory = factory or v(op, name)
                    if factory is None:
                        raise SystemExit(f"Expected an implementation of {op}. Got unknown {name!r}.")
                    try:
                        case = factory(dtype, n, batch)
                        ms = time_case(case, args.reps)
                        del case
                    except Exception as err:  # a peer that cannot run a point is recorded, not fatal
                        print(f"  {op} {dtype} n={n} {name}: FAILED {type(err).__name__}: {err}"[:300],
                              flush=True)
                        free_memory()
                        continue
                    free_memory()
                    gf = flops[op](n, batch, dtype) / (ms * 1e-3) / 1e9
                    records.append(dict(op=op, dtype=dtype, n=n, batch=batch, impl=name, ms=ms,
                                        gflops=gf, device=device, date=date))
                    print(f"  {op:5s} {dtype:10s} n={n:4d} B={batch:6d} {name:18s} {ms:9.3f} ms "
                          f"{gf:9.1f} GFLOP/s", flush=True)
    return records


def merge(base: list[dict], new: list[dict]) -> list[dict]:
    key = lambda r: (r["op"], r["dtype"], r["n"], r["impl"])  # noqa: E731
    fresh = {key(r) for r in new}
    out = [r for r in base if key(r) not in fresh] + new
    return sorted(out, key=lambda r: (r["op"], r["dtype"], r["n"], r["impl"]))


def plot(records: list[dict], op: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in records if r["op"] == op]
    dtypes = [d for d in ("float32", "float64", "complex64", "complex128") if any(r["dtype"] == d for r in rows)]
    fig, axes = plt.subplots(1, len(dtypes), figsize=(4.2 * len(dtypes), 3.8), squeeze=False)
    for ax, dtype in zip(axes[0], dtypes):
        sub = [r for r in rows if r["dtype"] == dtype]
        for impl in sorted({r["impl"] for r in sub}, key=lambda s: (not s.startswith("ours"), s)):
            pts = sorted((r["n"], r["gflops"]) for r in sub if r["impl"] == impl)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3,
                    lw=2.2 if impl == "ours" else 1.2, label=impl)
        ax.set_title(f"{op} {dtype}")
        ax.set_xlabel("n")
        ax.set_ylabel("GFLOP/s (LAWN 41)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    device = rows[0]["device"] if rows else ""
    fig.suptitle(f"batched {op}, {device}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(records: list[dict], op: str, bw: float, nbytes) -> str:
    rows = [r for r in records if r["op"] == op]
    impls = sorted({r["impl"] for r in rows}, key=lambda s: (not s.startswith("ours"), s))
    peers = [i for i in impls if not i.startswith("ours")]
    head = ("| dtype | n | batch | " + " | ".join(f"{i} GF/s" for i in impls)
            + " | best peer | speedup | floor ms | ours ms | % of floor |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    bar = {}
    for dtype in ("float32", "float64", "complex64", "complex128"):
        for n in sorted({r["n"] for r in rows if r["dtype"] == dtype}):
            pt = {r["impl"]: r for r in rows if r["dtype"] == dtype and r["n"] == n}
            if "ours" not in pt:
                continue
            batch = pt["ours"]["batch"]
            ours = pt["ours"]
            best = max((pt[p] for p in peers if p in pt), key=lambda r: r["gflops"], default=None)
            flop = ours["gflops"] * 1e9 * ours["ms"] * 1e-3
            byts = nbytes(n, batch, dtype) if nbytes else 2 * batch * n * n * np.dtype(dtype).itemsize
            floor = max(byts / bw, flop / PEAK[dtype]) * 1e3
            speed = ours["gflops"] / best["gflops"] if best else float("nan")
            if n in BAR_SIZES and best:
                bar[(dtype, n)] = speed
            cells = [f"{pt[i]['gflops']:.0f}" if i in pt else "-" for i in impls]
            lines.append(f"| {dtype} | {n} | {batch} | " + " | ".join(cells)
                         + f" | {best['impl'] if best else '-'} | {speed:.2f}x | {floor:.3f} | "
                         f"{ours['ms']:.3f} | {100 * floor / ours['ms']:.0f}% |")
    out = "\n".join(lines)
    if bar:
        vals = list(bar.values())
        geo = math.exp(sum(math.log(v) for v in vals) / len(vals))
        low = min(bar, key=bar.get)
        out += (f"\n\nBar points (n in {', '.join(map(str, BAR_SIZES))}): geometric mean of speedup over "
                f"the best peer = {geo:.2f}x over {len(vals)} points; minimum {bar[low]:.2f}x at "
                f"{low[0]} n={low[1]}.")
        for dtype in ("float32", "float64", "complex64", "complex128"):
            sub = [v for (d, _), v in bar.items() if d == dtype]
            if sub:
                g = math.exp(sum(math.log(v) for v in sub) / len(sub))
                out += f"\n- {dtype}: geomean {g:.2f}x, min {min(sub):.2f}x"
    out += f"\n\nFloor = max(bytes / {bw / 1e12:.2f} TB/s measured copy bandwidth, LAWN 41 flops / peak)."
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default="lu", type=lambda s: s.split(","))
    ap.add_argument("--dtypes", default="float32,float64,complex64,complex128", type=lambda s: s.split(","))
    ap.add_argument("--sizes", default="16,33,64,96,128,160,190,256,512",
                    type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--batch", type=int, default=10000)
    ap.add_argument("--impls", type=lambda s: s.split(","), default=None,
                    help="implementations to run (default: all registered for the op)")
    ap.add_argument("--extra", type=lambda s: s.split(","), default=[],
                    help="extra implementation names, e.g. ours:blocked-16,ours:small-32")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--max-bytes", type=float, default=3e9, help="cap on one input batch's bytes")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--merge", default=None, help="existing JSON to merge into (default: the output's)")
    args = ap.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bw = copy_bandwidth()
    print(f"device {device_name()}, copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    records = run(args)
    tag = gpu_tag()
    json_path = out / f"kernels-{tag}.json"
    base_path = Path(args.merge) if args.merge else json_path
    base = json.loads(base_path.read_text()) if base_path.exists() else []
    merged = merge(base, records)
    json_path.write_text(json.dumps(merged, indent=1) + "\n")
    _, _, nbytes, _ = load_registries()
    md = [f"Command: `python3 benchmarks/bench_kernels.py {' '.join(sys.argv[1:] if argv is None else argv)}`",
          f"Device: {device_name()}; measured copy bandwidth {bw / 1e12:.2f} TB/s.", ""]
    for op in sorted({r["op"] for r in merged}):
        plot(merged, op, out / f"kernels-{tag}-{op}.png")
        md += [f"### {op}", "", table(merged, op, bw, nbytes.get(op)), ""]
    (out / f"kernels-{tag}.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
