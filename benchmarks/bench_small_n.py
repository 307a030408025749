"""Small matrices against large ones at equal bytes: ``batchlu.run(op="inv")`` on float64 inputs of
n = 8, 32 and 128 holding the same bytes, with the run's time split into cluster start, warm-up and
compute (issue 18, item 5).

    python benchmarks/bench_small_n.py --backend cpu --repeat 3 --out benchmarks/results/small-n-cpu.json
    python benchmarks/bench_small_n.py --backend gpu --bytes 5242880000 --out benchmarks/results/small-n-h100.json

Inputs (``--dir``, made once and reused): ``--bytes`` of random float64 matrices per size, written
by ``batchlu generate`` in two layouts: ``generate`` (its default chunks of 32 MiB, whatever n is)
and ``256`` (256 matrices a chunk, as ``benchmarks/bench_pipeline.py`` writes them: 128 KiB at
n = 8, 32 MiB at n = 128). Each input runs under two plans: ``bytes`` (batchlu's default: output
chunks gather whole input chunks up to ``batchlu.chunk-bytes``) and ``chunks`` (``chunk-bytes`` of
1 byte: one output chunk per input chunk, batchlu's plan before it sized chunks in bytes).

Each run starts its own embedded cluster (``pipeline.run`` with no client), as ``batchlu run``
does, so its report has all three times; ``--noop`` runs instead on one LocalCluster shared by the
runs, with the ``cpu`` backend's compute replaced by a copy (the pipeline's own costs alone, on a
machine whose CPU inverse would hide them). GB/s count the input bytes over the compute time
(``gbps``) and over the whole call (``gbps_wall``). Records go to ``--out`` as a JSON list.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path

from bench_pipeline import check_inverse, install_noop_engine

PLANS = {"bytes": {}, "chunks": {"chunk-bytes": 1}}


def device_name(backend: str) -> str:
    if backend == "cpu":
        return f"CPU, {os.cpu_count()} cores"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.split("\n")
        names = [line.strip() for line in out if line.strip()]
        return f"{len(names)}x {names[0]}" if names else "no GPU"
    except OSError:
        return "no GPU"


def make_input(folder: Path, n: int, nbytes: int, layout: str) -> str:
    from batchlu import pipeline

    count = nbytes // (n * n * 8)
    path = folder / f"n{n}-N{count}-{layout}.zarr"
    chunk = None if layout == "generate" else int(layout)
    if not (path / "zarr.json").exists():
        pipeline.generate(path, count=count, size=n, chunk=chunk, seed=n, overwrite=True)
    return str(path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8,32,128", help="matrix orders n, comma separated")
    parser.add_argument("--bytes", type=int, default=100_000 * 32 * 32 * 8,
                        help="input bytes per size (default: 100,000 matrices of n = 32, 0.82 GB)")
    parser.add_argument("--layouts", default="generate,256", help="input chunks: generate and/or a matrix count")
    parser.add_argument("--plans", default="bytes,chunks", help="bytes (the default plan) and/or chunks")
    parser.add_argument("--backend", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument("--noop", action="store_true", help="cpu only: a copy instead of the inverse")
    parser.add_argument("--repeat", type=int, default=1, help="timed runs of each setting")
    parser.add_argument("--dir", default="/tmp/batchlu-small-n")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.noop and args.backend != "cpu":
        parser.error("--noop replaces the cpu backend's compute: use it with --backend cpu")

    from batchlu import pipeline

    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    sizes = [int(x) for x in args.sizes.split(",") if x]
    layouts = [x for x in args.layouts.split(",") if x]
    plans = [x for x in args.plans.split(",") if x]
    inputs = {(n, layout): make_input(work, n, args.bytes, layout) for n in sizes for layout in layouts}
    device, date = device_name(args.backend), datetime.date.today().isoformat()
    records = []
    client = cluster = None
    if args.noop:
        from distributed import Client, LocalCluster

        cluster = LocalCluster(host="127.0.0.1", dashboard_address="127.0.0.1:0")
        client = Client(cluster)
        client.run(install_noop_engine)
    base = {"cluster.dashboard-address": "127.0.0.1:0"}
    try:
        for rep in range(args.repeat):
            for (n, layout), src in inputs.items():
                for plan in plans:
                    out = str(work / "out.zarr")
                    shutil.rmtree(out, ignore_errors=True)  # not timed: the previous run's output
                    t = time.perf_counter()
                    report = pipeline.run(src, out, op="inv", backend=args.backend, client=client,
                                          progress=False, config={**base, **PLANS[plan]})
                    seconds = time.perf_counter() - t
                    assert report.status == "complete" and report.ok == report.count, report
                    written = json.loads((Path(out) / "zarr.json").read_text())["attributes"]["batchlu"]
                    rec = dict(impl="batchlu-noop" if args.noop else "batchlu", backend=args.backend,
                               n=n, count=report.count, dtype="float64", bytes=report.bytes_in,
                               input_layout=layout, input_chunk=int(json.loads(
                                   (Path(src) / "zarr.json").read_text())["chunk_grid"]["configuration"]
                                   ["chunk_shape"][0]),
                               plan=plan, chunk=written["plan"]["chunk"], tasks=report.tasks,
                               cluster_start=round(report.cluster_start, 3), warmup=round(report.warmup, 3),
                               compute=round(report.elapsed, 3), wall=round(seconds, 3),
                               gbps=round(report.gb_in_per_s, 4),
                               gbps_wall=round(report.bytes_in / 1e9 / seconds, 4),
                               read_s=round(report.read_s, 3), compute_s=round(report.compute_s, 3),
                               write_s=round(report.write_s, 3),
                               max_dget03_sample=None if args.noop else check_inverse(src, out, sample=32),
                               device=device, cpu_cores=os.cpu_count(), date=date, repeat=rep)
                    records.append(rec)
                    print(json.dumps(rec), flush=True)
                    if args.out:
                        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                        Path(args.out).write_text(json.dumps(records, indent=1) + "\n")
    finally:
        if client is not None:
            client.close()
            cluster.close()
    print("\nmedians: n, input chunk, plan -> chunk, tasks, compute GB/s, whole-call GB/s, "
          "cluster start, warm-up, compute s")
    for n in sizes:
        for layout in layouts:
            for plan in plans:
                runs = [r for r in records if (r["n"], r["input_layout"], r["plan"]) == (n, layout, plan)]
                med = {k: statistics.median(r[k] for r in runs)
                       for k in ("gbps", "gbps_wall", "cluster_start", "warmup", "compute")}
                print(f"n={n:4d} {layout:>8} {plan:>6} -> chunk {runs[0]['chunk']:7d}, {runs[0]['tasks']:5d} tasks: "
                      f"{med['gbps']:.3f} GB/s, {med['gbps_wall']:.3f} GB/s whole; start "
                      f"{med['cluster_start']:.2f} s, warm-up {med['warmup']:.2f} s, compute {med['compute']:.2f} s")


if __name__ == "__main__":
    main()
