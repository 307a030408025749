"""Benchmark driver for batchlu's GPU kernels against cuBLAS, torch (MAGMA / default), JAX,
cuSOLVERDx and nvmath-python's DirectSolver.

    python3 benchmarks/bench_kernels.py --ops lu --dtypes float32,float64,complex64,complex128 \\
        --sizes 16,33,64,96,128,160,190,256,512 --batch 10000 --out benchmarks/results

Implementations come from per-op registries, private modules beside this file that expose
``IMPLS = {op: {name: factory(dtype, n, batch) -> Case}}`` and ``FLOPS = {op: fn(n, batch, dtype)}``
(optionally ``BYTES`` for the memory floor, ``variant(op, name)`` for extra names such as
``ours:blocked-16`` and ``configure(args)`` for their own options): ``_lu_impls`` (op ``lu``),
``_inv_impls`` (ops ``inv``, ``solve``), ``_api_impls`` (``api``: the public API's dispatch;
``cusolver``: the large-n path forced) and ``_nvmath_impls`` (``cusolverdx``: cuSOLVERDx's
device-side LU in a numba-cuda kernel, its settings swept by ``--dx-sweep``; ``nvmath``:
``nvmath.linalg.DirectSolver``). ``--impls`` picks some (``batchlu`` is another name for ``ours``).

Checking: before it is timed, each case runs once on the first input set with its outputs poisoned
(NaN) and its result is judged by LAPACK's test ratio (get01 / get03 / get02 on the first 32
matrices, threshold 30); a case that fails is not timed. Timing: per (op, dtype, n, impl) two fresh
random input sets, a warm-up, then ``--reps`` runs, each after an untimed copy of fresh input into
the work buffer and a 256 MB write that evicts the L2 cache; CUDA events on the null stream around
the call (JAX, DirectSolver: host clock around a blocking call); the median is reported.

Outputs, in ``--out``: ``kernels-<gpu>.json`` (records ``op, dtype, n, batch, impl, ms, gflops,
device, date``, with ``ratio`` (the check's) and ``config`` (the setting timed, where a peer has
several); a peer that cannot run a point has ``skipped`` (a structural reason: a package missing, a
size that does not fit) or ``failed`` (the error, or a wrong result) instead of a time; merged into
``--merge``, replacing records with the same ``op, dtype, n, impl``), ``kernels-<gpu>-<op>.png``
(GFLOP/s against n, one panel per dtype) and ``kernels-<gpu>.md`` (per-point table: speedup over the
best peer, memory/compute floor, % of floor; the points not run and why). A short table of this
run's times comes last on stdout. ``--budget SECONDS`` stops starting new points once spent (they
are listed, not recorded), so that a run on a leased machine still writes its outputs.
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
import time
from pathlib import Path

import numpy as np

from _harness import PeerUnavailable, check_case, time_case

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# JAX's default allocator keeps what it once took: the next points then run out of memory.
os.environ.setdefault("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")

REGISTRIES = ("_lu_impls", "_inv_impls", "_api_impls", "_nvmath_impls")
STARTED = time.monotonic()  # --budget counts from here
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


def configure_registries(args) -> None:
    """Hand the options to the registries that take some (``configure(args)``)."""
    for name in REGISTRIES:
        mod = importlib.import_module(name)
        if hasattr(mod, "configure"):
            mod.configure(args)


def precompile_registries(args) -> None:
    """Let the registries that can compile this run's code ahead of timing do so (``precompile(args)``,
    e.g. cuSOLVERDx's, in parallel processes)."""
    for name in REGISTRIES:
        mod = importlib.import_module(name)
        if hasattr(mod, "precompile"):
            mod.precompile(args)


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


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return (text if isinstance(err, PeerUnavailable) else f"{type(err).__name__}: {text}")[:300]


def run(args) -> list[dict]:
    """Check and time every (op, dtype, n, impl) of ``args``. Records of points timed carry ``ms``;
    of points a peer cannot run, ``skipped`` or ``failed``; of points left when ``--budget`` was
    spent, ``skipped`` and ``budget`` (not merged into the JSON)."""
    impls, flops, _, variants = load_registries()
    device, date = device_name(), datetime.date.today().isoformat()
    records, said = [], set()
    for op in args.ops:
        if op not in impls:
            raise SystemExit(f"Expected --ops among {sorted(impls)}. Got {op!r} instead.")
        names = list(args.impls or impls[op])
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
                    base = dict(op=op, dtype=dtype, n=n, batch=batch, impl=name)
                    where = f"  {op} {dtype} n={n} {name}"
                    if args.budget is not None and time.monotonic() - STARTED > args.budget:
                        records.append(dict(base, skipped=f"--budget {args.budget:g} s spent", budget=True,
                                            device=device, date=date))
                        continue
                    try:
                        case = factory(dtype, n, batch)
                        ratio = check_case(case)  # a wrong result is not timed
                        ms = time_case(case, args.reps)
                        note = case.note
                        del case
                    except PeerUnavailable as err:  # a structural reason, recorded
                        records.append(dict(base, skipped=_one_line(err), device=device, date=date))
                        if (name, _one_line(err)) not in said:  # once per reason, not per point
                            said.add((name, _one_line(err)))
                            print(f"{where}: skipped: {_one_line(err)}", flush=True)
                        free_memory()
                        continue
                    except Exception as err:  # a peer that cannot run a point is recorded, not fatal
                        records.append(dict(base, failed=_one_line(err), device=device, date=date))
                        print(f"{where}: FAILED {_one_line(err)}", flush=True)
                        free_memory()
                        continue
                    free_memory()
                    gf = flops[op](n, batch, dtype) / (ms * 1e-3) / 1e9
                    rec = dict(base, ms=ms, gflops=gf, device=device, date=date)
                    if ratio is not None:
                        rec["ratio"] = round(ratio, 3)
                    if note:
                        rec["config"] = note
                    records.append(rec)
                    print(f"  {op:5s} {dtype:10s} n={n:4d} B={batch:6d} {name:18s} {ms:9.3f} ms "
                          f"{gf:9.1f} GFLOP/s" + (f"  ratio {ratio:.2f}" if ratio is not None else ""),
                          flush=True)
    return records


def timed(records: list[dict]) -> list[dict]:
    """The records that carry a time."""
    return [r for r in records if "ms" in r]


def merge(base: list[dict], new: list[dict]) -> list[dict]:
    key = lambda r: (r["op"], r["dtype"], r["n"], r["impl"])  # noqa: E731
    fresh = {key(r) for r in new}
    out = [r for r in base if key(r) not in fresh] + new
    return sorted(out, key=lambda r: (r["op"], r["dtype"], r["n"], r["impl"]))


def plot(records: list[dict], op: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in timed(records) if r["op"] == op]
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
    rows = [r for r in timed(records) if r["op"] == op]
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


def not_run(records: list[dict], op: str) -> str:
    """The points of ``op`` a peer did not run, grouped by reason (one line each)."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for r in records:
        if r["op"] == op and "ms" not in r:
            kind = "failed" if "failed" in r else "skipped"
            groups.setdefault((r["impl"], kind, r[kind]), []).append(f"{r['dtype']} n={r['n']}")
    return "\n".join(f"- {op} {impl} {kind} at {', '.join(pts)}: {why}"
                     for (impl, kind, why), pts in groups.items())


def summary(records: list[dict], names: list[str]) -> str:
    """A short table of this run: ms per implementation at each point, the best peer and our
    speedup over it (its time / ours), then the points not run."""
    impls = [x for x in dict.fromkeys(names) if any(r["impl"] == x for r in records)]
    impls += sorted({r["impl"] for r in records} - set(impls))
    head = "| op | dtype | n | " + " | ".join(f"{i} ms" for i in impls) + " | best peer | speedup |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    points = dict.fromkeys((r["op"], r["dtype"], r["n"]) for r in records)
    for op, dtype, n in points:
        pt = {r["impl"]: r for r in records if (r["op"], r["dtype"], r["n"]) == (op, dtype, n)}
        cells = [f"{pt[i]['ms']:.3f}" if "ms" in pt.get(i, {}) else
                 ("fail" if "failed" in pt.get(i, {}) else "-") for i in impls]
        peers = [pt[i] for i in impls if not i.startswith("ours") and "ms" in pt.get(i, {})]
        best = min(peers, key=lambda r: r["ms"], default=None)
        ours = pt.get("ours", {})
        speed = f"{best['ms'] / ours['ms']:.2f}x" if best and "ms" in ours else "-"
        lines.append(f"| {op} | {dtype} | {n} | " + " | ".join(cells)
                     + f" | {best['impl'] if best else '-'} | {speed} |")
    rest = "\n".join(filter(None, (not_run(records, op) for op in dict.fromkeys(r["op"] for r in records))))
    return "\n".join(lines) + ("\n\nNot run:\n" + rest if rest else "")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    names = lambda s: ["ours" if x == "batchlu" else x for x in s.split(",")]  # noqa: E731
    ap.add_argument("--ops", default="lu", type=lambda s: s.split(","))
    ap.add_argument("--dtypes", default="float32,float64,complex64,complex128", type=lambda s: s.split(","))
    ap.add_argument("--sizes", "--ns", default="16,33,64,96,128,160,190,256,512", type=ints)
    ap.add_argument("--batch", type=int, default=10000)
    ap.add_argument("--impls", type=names, default=None,
                    help="implementations to run (default: all registered for the op); batchlu = ours")
    ap.add_argument("--extra", type=lambda s: s.split(","), default=[],
                    help="extra implementation names, e.g. ours:blocked-16,ours:small-32")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--max-bytes", type=float, default=3e9, help="cap on one input batch's bytes")
    ap.add_argument("--dx-sweep", default="bpb", choices=("suggested", "bpb", "full"),
                    help="cuSOLVERDx settings tried per point (the fastest is timed): its suggested "
                         "batches_per_block and block_dim; bpb: also batches_per_block 1, 2, 4, 8; full: "
                         "also the column-major arrangement, block_dim 64/128/256, inverse panels 16/32")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds after which no new point is started (those left are listed, not recorded)")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--merge", default=None, help="existing JSON to merge into (default: the output's)")
    args = ap.parse_args(argv)
    for dtype in args.dtypes:
        if dtype not in PEAK:
            ap.error(f"Expected --dtypes among {', '.join(PEAK)}. Got {dtype!r} instead.")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    configure_registries(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bw = copy_bandwidth()
    print(f"device {device_name()}, copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    precompile_registries(args)
    records = run(args)
    tag = gpu_tag()
    json_path = out / f"kernels-{tag}.json"
    base_path = Path(args.merge) if args.merge else json_path
    base = json.loads(base_path.read_text()) if base_path.exists() else []
    merged = merge(base, [r for r in records if not r.get("budget")])
    json_path.write_text(json.dumps(merged, indent=1) + "\n")
    _, _, nbytes, _ = load_registries()
    md = [f"Command: `python3 benchmarks/bench_kernels.py {' '.join(sys.argv[1:] if argv is None else argv)}`",
          f"Device: {device_name()}; measured copy bandwidth {bw / 1e12:.2f} TB/s.", ""]
    for op in sorted({r["op"] for r in merged}):
        plot(merged, op, out / f"kernels-{tag}-{op}.png")
        md += [f"### {op}", "", table(merged, op, bw, nbytes.get(op)), ""]
        missing = not_run(merged, op)
        md += ["Not run:", "", missing, ""] if missing else []
    (out / f"kernels-{tag}.md").write_text("\n".join(md))
    print("\n".join(md))
    names = list(args.impls or []) + list(args.extra)
    print(f"\nThis run ({len(timed(records))} points timed), ms (median of {args.reps}):\n", flush=True)
    print(summary(records, names), flush=True)


if __name__ == "__main__":
    main()
