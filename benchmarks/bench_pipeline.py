"""End-to-end pipeline throughput on the GPU machine: batchlu vs the hand-written dask + CuPy pipeline
vs the I/O floor, on the same Zarr input (issue 5).

    python benchmarks/bench_pipeline.py --gpus 1 --gpus 2 --out benchmarks/results/pipeline-h200x2.json

Input: ``--count`` float64 matrices of order ``--size`` (default 40,000 x 128 x 128, 5.2 GB), random
normal entries drawn afresh per chunk, in a zstd Zarr v3 array on local disk (``--dir``, made once
and reused). For each GPU count, three pipelines run on a LocalCUDACluster of that many GPUs:

* ``batchlu``   -- ``batchlu.pipeline.run(op="inv", backend="gpu", client=...)``, writing zstd (the default)
                   and uncompressed (``output-codec: none``) outputs, for each ``--io-processes``
                   setting (``0``: Zarr I/O in the worker process; ``auto``: the default, I/O processes
                   per GPU worker, see ``batchlu.io-processes``; or a number);
* ``dask-cupy`` -- ``da.from_zarr(...).map_blocks(cupy.asarray).map_blocks(cupy.linalg.inv)
                   .map_blocks(cupy.asnumpy).to_zarr(...)``, for each of ``--threads`` threads per
                   worker (every setting is recorded; the table quotes the best), then at its
                   best threads writing uncompressed (``to_zarr(..., compressors=None)``);
* ``io-floor``  -- the same read and write (same codecs, same chunks), no compute, one task per
                   range of chunks on the same cluster.

batchlu's ``codec-device gpu`` and ``auto`` runs write sharded outputs (``--gpu-output-layout``), the
layout made for the GPU codecs; its ``cpu`` runs write the input's layout. ``--limits`` adds the physical limits
on the same machine, in GB/s of input: ``limit-page-cache`` (every file of the input read from the
page cache, 16 threads), ``limit-h2d`` (a 1 GiB pinned buffer to the GPU) and ``limit-kernel``
(batchlu's inverse kernel on device-resident matrices).

``--host-noop`` measures the same on a machine without a GPU: a CPU LocalCluster with one worker
process per ``--gpus``, batchlu with a no-op compute (copies the input to ``inv``: the Zarr I/O and
the bookkeeping only) as ``batchlu-noop``, and ``io-floor``.

Each pipeline first runs once on a small store (kernel compilation, cuBLAS/cuSOLVER handles, pools),
then once timed on the full input, from the call to its return. GB/s counts the input bytes.
Records go to ``--out`` as a JSON list: impl, gpus, threads_per_worker, gbps, seconds, dtype, n,
count, device, date (plus the settings used).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np


def device_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.split("\n")
        names = [line.strip() for line in out if line.strip()]
        return f"{len(names)}x {names[0]}" if names else "no GPU"
    except OSError:
        return "no GPU"


def visible_gpus() -> tuple[str, ...]:
    """``CUDA_VISIBLE_DEVICES``' tokens where it is set, else every GPU nvidia-smi lists."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return tuple(t.strip() for t in env.split(",") if t.strip())
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return ()
    return tuple(line.strip() for line in out.split("\n") if line.strip())


def make_gpu_cluster(use, threads_per_worker, dashboard_address):
    """One dask-cuda worker per GPU in ``use``, on 127.0.0.1 (batchlu sets its workers up itself)."""
    import logging

    from dask_cuda import LocalCUDACluster

    return LocalCUDACluster(CUDA_VISIBLE_DEVICES=",".join(use), n_workers=len(use),
                            threads_per_worker=threads_per_worker, host="127.0.0.1",
                            dashboard_address=dashboard_address, silence_logs=logging.ERROR)


DATA_KINDS = ("normal", "rounded")  # random normal entries; the same rounded to 2 decimals (compressible)
INNER_BYTES = 256 << 10   # sharded inputs: inner chunks of about this many bytes, as batchlu generate writes


def generate(path: Path, count: int, n: int, chunk: int, seed: int, data: str = "normal",
             layout: str = "chunks") -> None:
    """Float64 matrices, each chunk from its own generator, zstd-compressed: ``normal`` random normal
    entries, or ``rounded`` (the same rounded to 2 decimals: compressible, like measured data); one
    zarr chunk per ``chunk`` matrices, or (``sharded``) one shard of ~256 KiB inner chunks."""
    import zarr

    inner = max(d for d in range(1, chunk + 1) if chunk % d == 0 and (d * n * n * 8 <= INNER_BYTES or d == 1))
    grid = {"chunks": (chunk, n, n)} if layout == "chunks" else {"chunks": (inner, n, n), "shards": (chunk, n, n)}
    if (path / "zarr.json").exists():
        arr = zarr.open_array(str(path), mode="r")
        if arr.shape == (count, n, n) and (arr.shards or arr.chunks)[0] == chunk and arr.attrs.get("data") == data \
                and bool(arr.shards) == (layout == "sharded"):
            return
    shutil.rmtree(path, ignore_errors=True)
    arr = zarr.create_array(str(path), shape=(count, n, n), dtype="float64", attributes={"data": data},
                            compressors=zarr.codecs.ZstdCodec(level=0), **grid)

    def one(start):
        stop = min(start + chunk, count)
        rng = np.random.default_rng([seed, start])
        x = rng.standard_normal((stop - start, n, n))
        arr[start:stop] = np.round(x, 2) if data == "rounded" else x

    with ThreadPoolExecutor(os.cpu_count()) as pool:
        list(pool.map(one, range(0, count, chunk)))


def codec_scaling(chunk: np.ndarray, threads=(1, 8, 16)) -> dict:
    """GB/s of zarr's zstd (numcodecs) encode + decode of ``chunk``-sized blocks, by threads: the CPU
    cost every pipeline here pays per byte, whatever it computes."""
    import numcodecs

    data = chunk.tobytes()
    impls = {f"zstd{level}": (lambda level=level: numcodecs.Zstd(level=level).decode(
        numcodecs.Zstd(level=level).encode(data))) for level in (0, 1)}
    out = {}
    for name, fn in impls.items():
        for t in threads:
            reps = 2 * t
            with ThreadPoolExecutor(t) as pool:
                start = time.perf_counter()
                list(pool.map(lambda _: fn(), range(reps)))
                seconds = time.perf_counter() - start
            out[f"{name}-{t}"] = round(reps * len(data) / 1e9 / seconds, 3)
    return out


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


DRY_RUN = False  # --dry-run-cpu / --host-noop: a CPU LocalCluster instead of GPUs
EXTRA: dict = {}  # --config KEY=VALUE: more batchlu.* settings for every batchlu run


def run_batchlu(client, src, out, budget, codec="zstd", io=("auto", "auto"), codec_device="auto",
                layout="chunks"):
    from batchlu import pipeline

    backend = "cpu" if DRY_RUN else "gpu"
    report = pipeline.run(str(src), str(out), op="inv", backend=backend, client=client, progress=False,
                          overwrite=True, config={"memory-budget": budget, "output-codec": codec,
                                                  "io-processes": io[0], "io-threads": io[1],
                                                  "codec-device": codec_device, "output-layout": layout,
                                                  **EXTRA})
    assert report.status == "complete" and report.backends == (backend,), report
    return report


def install_noop_engine():
    """On each worker (``client.run``): the ``cpu`` backend's compute becomes a copy of the input, so
    that batchlu's run is its Zarr I/O and bookkeeping alone (``--host-noop``)."""
    from batchlu.pipeline import tuning

    class NoopEngine(tuning.HostEngine):
        def run(self, op, slot):
            np.copyto(slot.outs["inv"], slot.a)
            slot.outs["info"][...] = 0

    engine = NoopEngine()
    tuning.register_engine("cpu", lambda: engine)
    return True


def io_label(value: str, threads: int, io_threads: str) -> tuple:
    """``(setting, processes, threads)`` of the I/O pool a GPU worker of ``threads`` threads gets."""
    from batchlu.pipeline.tuning import io_settings

    procs = None if value == "auto" else int(value)
    per = None if io_threads == "auto" else int(io_threads)
    resolved = io_settings(procs, per, "cpu" if DRY_RUN else "gpu", threads)
    return value, resolved[0], resolved[1] if resolved[0] else 0


HOST_NOOP = False


def run_dask_cupy(src, out, codec="zstd"):
    import dask.array as da

    if DRY_RUN:
        def inv(x):  # like cupy.linalg.inv: no error on a singular matrix (dask's dtype probe)
            with np.errstate(all="ignore"):
                try:
                    return np.linalg.inv(x)
                except np.linalg.LinAlgError:
                    return np.full_like(x, np.nan)

        cupy = argparse.Namespace(asarray=np.asarray, asnumpy=np.asarray, linalg=argparse.Namespace(inv=inv))
    else:
        import cupy

    import zarr

    source = zarr.open_array(str(src), mode="r")
    x = da.from_zarr(source, chunks=source.shards or source.chunks)   # a task per shard of a sharded store
    y = x.map_blocks(cupy.asarray).map_blocks(cupy.linalg.inv).map_blocks(cupy.asnumpy)
    if codec == "zstd":
        y.to_zarr(str(out), overwrite=True)  # zarr's default codecs: zstd
    else:
        y.to_zarr(str(out), overwrite=True, compressors=None)


def _copy_range(src, out, start, stop):
    import zarr

    a = zarr.open_array(src, mode="r")
    b = zarr.open_array(out, mode="r+")
    b[start:stop] = a[start:stop]
    return stop - start


def run_io_floor(client, src, out, step, codec="zstd"):
    import zarr

    a = zarr.open_array(str(src), mode="r")
    shutil.rmtree(out, ignore_errors=True)
    zarr.create_array(str(out), shape=a.shape, chunks=a.chunks, dtype=a.dtype,
                      compressors="auto" if codec == "zstd" else None)
    starts = list(range(0, a.shape[0], step))
    futures = client.map(_copy_range, [str(src)] * len(starts), [str(out)] * len(starts), starts,
                         [min(s + step, a.shape[0]) for s in starts], pure=False)
    assert sum(client.gather(futures)) == a.shape[0]


def limit_page_cache(src: Path, threads: int = 16) -> float:
    """Seconds to read every file of the store ``src`` (already in the page cache: the timed runs read
    it just before) into memory, in ``threads`` threads: no pipeline reading it can be faster."""
    files = [os.path.join(d, f) for d, _, names in os.walk(src) for f in names]

    def one(path):
        with open(path, "rb", buffering=0) as f:
            while f.read(64 << 20):
                pass

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, files))   # warm: the files in the page cache
        return timed(lambda: list(pool.map(one, files)))


def limit_h2d(nbytes: int = 1 << 30) -> float:
    """GB/s of one pinned host buffer copied to the GPU (best of 5)."""
    import cupy

    pinned = np.frombuffer(cupy.cuda.alloc_pinned_memory(nbytes), np.uint8, nbytes)
    pinned[:] = 1
    device = cupy.empty(nbytes, cupy.uint8)
    best = float("inf")
    for _ in range(5):
        cupy.cuda.Device().synchronize()
        t = time.perf_counter()
        device.set(pinned)
        cupy.cuda.Device().synchronize()
        best = min(best, time.perf_counter() - t)
    return nbytes / 1e9 / best


def limit_kernel(n: int, count: int) -> float:
    """GB/s of input through batchlu's inverse kernel alone, on device-resident random matrices."""
    import cupy

    from batchlu import kernels

    a = cupy.asarray(np.random.default_rng(3).standard_normal((count, n, n)))
    kernels.inv(a)   # compile
    best = float("inf")
    for _ in range(5):
        cupy.cuda.Device().synchronize()
        t = time.perf_counter()
        kernels.inv(a)
        cupy.cuda.Device().synchronize()
        best = min(best, time.perf_counter() - t)
    return a.nbytes / 1e9 / best


def check_inverse(src, out, sample=64):
    """Spot check of the timed output: LAPACK's dget03 ratio on a random sample of matrices."""
    import zarr

    from batchlu.testing.ratios import THRESHOLD, get03

    a = zarr.open_array(str(src), mode="r")
    group_or_array = zarr.open(str(out), mode="r")
    inv = group_or_array["inv"] if hasattr(group_or_array, "arrays") else group_or_array
    idx = np.sort(np.random.default_rng().choice(a.shape[0], size=min(sample, a.shape[0]), replace=False))
    ratio = float(get03(a.oindex[idx], inv.oindex[idx]).max())
    assert ratio < THRESHOLD, f"dget03 ratio {ratio} on the benchmark output"
    return ratio


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, action="append", help="GPU counts to run (repeatable)")
    parser.add_argument("--count", type=int, default=40_000)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--chunk", type=int, default=256, help="input chunk length (matrices)")
    parser.add_argument("--dir", default="/tmp/batchlu-bench")
    parser.add_argument("--threads", default="4,8,16", help="dask-cupy threads per worker to try")
    parser.add_argument("--batchlu-threads", default="4", help="batchlu threads per worker to try")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="another batchlu.* setting for the batchlu runs (repeatable), e.g. output-checksum=none")
    parser.add_argument("--budget", default=None,
                        help="batchlu memory budget (batch size; default: batchlu.memory-budget's)")
    parser.add_argument("--codecs", default="zstd,none",
                        help="output codecs to run: zstd (zarr's default, what to_zarr writes) and/or none")
    parser.add_argument("--io-processes", default="0,auto",
                        help="batchlu.io-processes settings to run (0: I/O in the worker; auto; or N)")
    parser.add_argument("--io-threads", default="auto", help="batchlu.io-threads for those runs")
    parser.add_argument("--repeat", type=int, default=1,
                        help="timed runs of each setting (each is recorded; the summary gives the median)")
    parser.add_argument("--skip", default="", help="impls to skip, comma separated")
    parser.add_argument("--sizes", default="128,32",
                        help="matrix orders to run, each with the bytes of --count matrices of --size")
    parser.add_argument("--data", default="normal,rounded", help="normal and/or rounded (2 decimals)")
    parser.add_argument("--layouts", default="chunks,sharded", help="input (and output) layouts")
    parser.add_argument("--codec-devices", default="gpu,cpu", help="batchlu.codec-device settings to run")
    parser.add_argument("--gpu-output-layout", default="sharded", choices=("sharded", "same"),
                        help="output layout of batchlu's codec-device gpu and auto runs: sharded (the layout "
                             "for the GPU codecs) or the input's; cpu runs write the input's")
    parser.add_argument("--limits", action="store_true",
                        help="also measure the physical limits: page-cache read of the input's files, "
                             "pinned H2D, the kernel alone (records impl limit-*)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--host-noop", action="store_true",
                        help="no GPU: CPU workers, batchlu with a no-op compute, and the I/O floor")
    parser.add_argument("--dry-run-cpu", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    EXTRA.update(item.split("=", 1) for item in args.config)
    if args.budget is None:
        from batchlu import pipeline

        args.budget = pipeline.options().memory_budget   # the shipped default, in bytes

    if args.dry_run_cpu or args.host_noop:
        global DRY_RUN, HOST_NOOP, make_gpu_cluster, visible_gpus
        from distributed import LocalCluster

        DRY_RUN, HOST_NOOP = True, bool(args.host_noop)
        if HOST_NOOP:
            args.skip += ",dask-cupy"

        def make_gpu_cluster(use, threads_per_worker, dashboard_address):
            return LocalCluster(n_workers=len(use), threads_per_worker=threads_per_worker,
                                host="127.0.0.1", dashboard_address=dashboard_address)

        def visible_gpus():
            return ("0", "1")

    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    devices = visible_gpus()
    device = device_name()
    date = datetime.date.today().isoformat()
    skip = set(filter(None, args.skip.split(",")))
    records = []
    codecs = [c for c in args.codecs.split(",") if c]
    codec_devices = [c for c in args.codec_devices.split(",") if c]
    first = True
    for size in [int(x) for x in args.sizes.split(",")] if args.sizes else [args.size]:
        count = args.count * args.size ** 2 // size ** 2       # the same bytes at every size
        chunk = max(1, args.chunk * args.size ** 2 // size ** 2)
        nbytes = count * size * size * 8
        for data in args.data.split(","):
            for layout in args.layouts.split(","):
                src, small = work / f"in-{size}-{data}-{layout}.zarr", work / f"warm-{size}-{layout}.zarr"
                t = timed(lambda: generate(src, count, size, chunk, 2024, data, layout))
                generate(small, min(count, 16 * chunk), size, chunk, 7, data, layout)
                print(f"input {src}: {count} x {size}^2 float64 {data} {layout}, {nbytes / 1e9:.2f} GB, chunk "
                      f"{chunk} (ready in {t:.1f} s); cores {os.cpu_count()}", flush=True)
                if first:
                    print("zstd encode+decode GB/s by threads:",
                          codec_scaling(np.random.default_rng(1).standard_normal((chunk, size, size)),
                                        (1, 2) if HOST_NOOP else (1, 8, 16)), flush=True)
                    first = False

                def record(impl, gpus, threads, seconds, **extra):
                    rec = dict(impl=impl, gpus=gpus, threads_per_worker=threads,
                               gbps=round(nbytes / 1e9 / seconds, 4), seconds=round(seconds, 3), dtype="float64",
                               n=size, count=count, device=device, date=date, data=data, layout=layout,
                               chunk=chunk, cpu_cores=os.cpu_count(), **{"codec_device": None, **extra})
                    records.append(rec)
                    print(json.dumps(rec), flush=True)
                    if args.out:
                        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                        Path(args.out).write_text(json.dumps(records, indent=1) + "\n")

                if args.limits and not DRY_RUN:
                    record("limit-page-cache", 1, 16, limit_page_cache(src))
                    h2d = limit_h2d()
                    record("limit-h2d", 1, 1, nbytes / 1e9 / h2d)
                    kernel = limit_kernel(size, min(count, 10_000 * 128 ** 2 // size ** 2))
                    record("limit-kernel", 1, 1, nbytes / 1e9 / kernel)

                for gpus in args.gpus or [1]:
                    if gpus > len(devices):
                        print(f"skipping {gpus} GPUs: only {len(devices)} visible", flush=True)
                        continue
                    use = devices[:gpus]
                    _run_pipelines(args, use, src, small, work, layout, chunk, codecs, codec_devices, skip, record)
    print(summary(records))
    return records


def _run_pipelines(args, use, src, small, work, layout, chunk, codecs, codec_devices, skip, record) -> None:
    """batchlu (each codec device and output codec), the I/O floor and dask-cupy on ``use``'s GPUs."""
    from distributed import Client

    gpus = len(use)
    for threads in [int(x) for x in args.batchlu_threads.split(",")]:
        with make_gpu_cluster(use, threads_per_worker=threads, dashboard_address="127.0.0.1:0") as cluster, \
                Client(cluster) as client:
            # first, on the fresh workers: batchlu tunes its worker processes (malloc padding)
            if "io-floor" not in skip and threads == int(args.batchlu_threads.split(",")[0]):
                step = 4 * chunk
                out = work / "io-out.zarr"
                run_io_floor(client, small, work / "warm-out.zarr", step)
                for codec in codecs:
                    for rep in range(args.repeat):
                        seconds = timed(lambda: run_io_floor(client, src, out, step, codec))
                        record("io-floor", gpus, threads, seconds, output_codec=codec, repeat=rep)
                        shutil.rmtree(out, ignore_errors=True)
            impl = "batchlu-noop" if HOST_NOOP else "batchlu"
            if HOST_NOOP:
                client.run(install_noop_engine)
            for io in [x for x in args.io_processes.split(",") if x] if "batchlu" not in skip else []:
                setting = (io, args.io_threads)
                label = io_label(io, threads, args.io_threads)
                for device_setting in codec_devices:
                    out_layout = "sharded" if device_setting in ("gpu", "auto") and args.gpu_output_layout == "sharded" \
                        else layout
                    run_batchlu(client, small, work / "warm-batchlu.zarr", args.budget, io=setting,
                                codec_device=device_setting, layout=out_layout)  # starts the pool, compiles
                    for codec in codecs:
                        for rep in range(args.repeat):
                            out = work / "batchlu-out.zarr"
                            shutil.rmtree(out, ignore_errors=True)
                            report = {}
                            seconds = timed(lambda: report.setdefault("r", run_batchlu(
                                client, src, out, args.budget, codec, setting, device_setting, out_layout)))
                            ratio = None if HOST_NOOP else check_inverse(src, out)
                            where = report["r"].codecs.get("a", "cpu (host)")
                            record(impl, gpus, threads, seconds, output_codec=codec, memory_budget=args.budget,
                                   codec_device=where.split(" ")[0], codec_device_setting=device_setting,
                                   codec_reason=where, output_layout=out_layout,
                                   io_processes_setting=label[0], io_processes=label[1], io_threads=label[2],
                                   max_dget03_sample=ratio, repeat=rep, tasks=report["r"].tasks,
                                   stage_s={k: round(getattr(report["r"], k), 3)
                                            for k in ("cluster_start", "warmup", "read_s", "compute_s", "write_s")})
                            shutil.rmtree(out, ignore_errors=True)
    if "dask-cupy" not in skip:
        best = {}
        for threads in [int(x) for x in args.threads.split(",")]:
            with make_gpu_cluster(use, threads_per_worker=threads, dashboard_address="127.0.0.1:0") as cluster, \
                    Client(cluster):
                run_dask_cupy(small, work / "warm-out.zarr")
                out = work / "dask-out.zarr"
                times = []
                for rep in range(args.repeat):
                    shutil.rmtree(out, ignore_errors=True)
                    seconds = timed(lambda: run_dask_cupy(src, out))
                    ratio = check_inverse(src, out)
                    record("dask-cupy", gpus, threads, seconds, output_codec="zstd", max_dget03_sample=ratio,
                           repeat=rep)
                    shutil.rmtree(out, ignore_errors=True)
                    times.append(seconds)
                best[threads] = float(np.median(times))
        if "none" in codecs and best:  # the same pipeline writing uncompressed, at its best threads
            threads = min(best, key=best.get)
            with make_gpu_cluster(use, threads_per_worker=threads, dashboard_address="127.0.0.1:0") as cluster, \
                    Client(cluster):
                run_dask_cupy(small, work / "warm-out.zarr", "none")
                out = work / "dask-out.zarr"
                for rep in range(args.repeat):
                    seconds = timed(lambda: run_dask_cupy(src, out, "none"))
                    record("dask-cupy", gpus, threads, seconds, output_codec="none", repeat=rep)
                    shutil.rmtree(out, ignore_errors=True)


def summary(records: list[dict]) -> str:
    """One line per setting: the median GB/s over its repeats, and every run's GB/s."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        io = f"{r['io_processes']}x{r['io_threads']}" if r.get("io_processes") else \
            ("0" if "io_processes" in r else "")
        key = (r["impl"], r["n"], r.get("data", ""), r.get("layout", ""), r.get("codec_device") or "",
               r["gpus"], r["threads_per_worker"], io, r.get("output_codec", ""))
        groups.setdefault(key, []).append(r)
    lines = ["", "impl            n  data     layout   codec-dev  gpus  threads  io-procs  codec  median GB/s  runs"]
    for (impl, n, data, layout, where, gpus, threads, io, codec), rs in groups.items():
        runs = [r["gbps"] for r in rs]
        lines.append(f"{impl:<13} {n:>3}  {data:<8} {layout:<8} {where:<9} {gpus:>4} {threads:>8}  {io:>8}  "
                     f"{codec:<5} {np.median(runs):>11.3f}  " + " ".join(f"{g:.2f}" for g in runs))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
