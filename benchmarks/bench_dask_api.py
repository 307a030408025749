"""``batchlu.inv`` on a dask array against the hand-written ``x.map_blocks(numpy.linalg.inv)`` (issue 41,
"Benchmark"): the same in-memory dask array, the same chunks, dask's default (threaded) scheduler, in
one process, in turns.

    python benchmarks/bench_dask_api.py [--sizes 4MB,50MB,400MB] [--ns 8,32,128] [--dtype float64]
        [--chunk-bytes 32MiB] [--repeat 3] [--out benchmarks/results/dask-api-cpu.json]

Inputs: standard normal entries (nonsingular with probability one: ``numpy.linalg.inv`` raises on a
singular matrix, where batchlu flags it), N = size // (n * n * itemsize), chunks of about
``--chunk-bytes`` along N. Each timing is ``dask.compute`` of the whole inverse into memory, after
one untimed warm-up of each impl on the same input (numba's kernels loaded from their disk cache,
pages touched). Both outputs are checked before their times are trusted: LAPACK's inverse ratio
(dget03) on 64 matrices drawn at random, below 30. The median of ``--repeat`` runs is recorded, with
the machine, its load and the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

import dask
import dask.array as da
from dask.utils import parse_bytes as parse_size

import batchlu
from batchlu.testing.ratios import THRESHOLD, get03


def _checked(a, ainv) -> float:
    pick = np.random.default_rng(0).choice(len(a), size=min(64, len(a)), replace=False)
    ratio = float(get03(a[pick], ainv[pick]).max())
    if not ratio < THRESHOLD:
        raise SystemExit(f"an output failed LAPACK's dget03 check (ratio {ratio:.3g})")
    return ratio


def _time(compute, repeat: int) -> float:
    compute()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        compute()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def measure(size: int, n: int, dtype, chunk_bytes: int, repeat: int) -> dict:
    dtype = np.dtype(dtype)
    count = max(1, size // (n * n * dtype.itemsize))
    a = np.random.default_rng(n).standard_normal((count, n, n)).astype(dtype)
    x = da.from_array(a, chunks=(max(1, chunk_bytes // (n * n * dtype.itemsize)), n, n))
    ours = batchlu.inv(x)[0]
    theirs = x.map_blocks(np.linalg.inv, dtype=dtype)
    ratios = {"batchlu": _checked(a, ours.compute()), "map_blocks": _checked(a, theirs.compute())}
    seconds = {"batchlu": _time(lambda: dask.compute(ours), repeat),
               "map_blocks": _time(lambda: dask.compute(theirs), repeat)}
    return {"n": n, "dtype": str(dtype), "bytes": a.nbytes, "count": count, "chunks": x.chunksize,
            "seconds": seconds, "max_ratio": ratios,
            "speedup": seconds["map_blocks"] / seconds["batchlu"]}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="4MB,50MB,400MB")
    p.add_argument("--ns", default="8,32,128")
    p.add_argument("--dtype", default="float64")
    p.add_argument("--chunk-bytes", default="32MiB")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "dask-api-cpu.json"))
    args = p.parse_args(argv)
    records = []
    for size in (parse_size(s) for s in args.sizes.split(",")):
        for n in (int(v) for v in args.ns.split(",")):
            r = measure(size, n, args.dtype, parse_size(args.chunk_bytes), args.repeat)
            r.update(device=f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                     load=os.getloadavg()[0], date=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
            records.append(r)
            print(f"{r['bytes'] / 1e6:8.1f} MB n={n:4d}  batchlu {r['seconds']['batchlu']:.3f} s  "
                  f"map_blocks(numpy.linalg.inv) {r['seconds']['map_blocks']:.3f} s  "
                  f"-> {r['speedup']:.2f}x", flush=True)
    command = "python benchmarks/bench_dask_api.py " + " ".join(argv if argv is not None else sys.argv[1:])
    Path(args.out).write_text(json.dumps({"command": command.strip(), "records": records}, indent=1) + "\n")


if __name__ == "__main__":
    main()
