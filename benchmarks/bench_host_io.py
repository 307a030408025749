"""What the host itself can move, by threads: page-cache writes and reads, memory copies, and zstd
encode + decode (numcodecs, zarr's default codec). The pipeline benchmark's numbers are host-bound;
this says by how much the host's throughput grows from one GPU's share of threads to all of them.

    python benchmarks/bench_host_io.py [--dir /tmp/bench] [--threads 8,16,32]

The page-cache read test reads the chunk files of ``DIR/in.zarr`` (the pipeline benchmark's input)
when it exists.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

CHUNK = 32 * 2**20  # bytes: one 256-matrix chunk of 128 x 128 float64


def _rate(nbytes: int, fn, threads: int, tasks) -> float:
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(fn, tasks))
    return nbytes / 1e9 / (time.perf_counter() - start)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="/tmp/bench")
    parser.add_argument("--threads", default="8,16,32")
    args = parser.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",") if t]
    work = Path(args.dir)

    for name in ("dirty_ratio", "dirty_background_ratio"):
        path = Path("/proc/sys/vm") / name
        if path.exists():
            print(f"vm.{name} = {path.read_text().strip()}")
    print(f"cores {os.cpu_count()}")

    data = np.random.default_rng(0).standard_normal(CHUNK // 8)
    raw = data.tobytes()
    scratch = work / "host-io-scratch"

    def write(i):
        (scratch / f"f{i}").write_bytes(raw)

    for t in threads:
        scratch.mkdir(parents=True, exist_ok=True)
        count = 8 * t
        print(f"page-cache write, {t} threads: {_rate(count * CHUNK, write, t, range(count)):.2f} GB/s", flush=True)
        shutil.rmtree(scratch)

    chunks = [p for p in (work / "in.zarr").rglob("*") if p.is_file() and p.name != "zarr.json"]
    if chunks:
        total = sum(p.stat().st_size for p in chunks)
        for t in threads:
            print(f"page-cache read of {len(chunks)} input chunks, {t} threads: "
                  f"{_rate(total, lambda p: p.read_bytes(), t, chunks):.2f} GB/s", flush=True)

    sources = [np.random.default_rng(i).standard_normal(CHUNK // 8) for i in range(max(threads))]
    targets = [np.empty_like(x) for x in sources]

    def copy(i):
        for _ in range(8):
            np.copyto(targets[i], sources[i])

    for t in threads:
        print(f"memory copy, {t} threads: {_rate(8 * t * CHUNK, copy, t, range(t)):.2f} GB/s copied", flush=True)

    import numcodecs

    codec = numcodecs.Zstd(level=0)

    def zstd(i):
        for _ in range(2):
            codec.decode(codec.encode(sources[i]))

    for t in threads:
        print(f"zstd encode + decode, {t} threads: {_rate(2 * t * CHUNK, zstd, t, range(t)):.2f} GB/s", flush=True)


if __name__ == "__main__":
    main()
