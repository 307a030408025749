"""A CPU run's reads and writes: zarr-python's codec pipeline against batchlu's own frames path
(``batchlu.pipeline.codecs._host``, through ``batchlu.pipeline.tuning``), which CPU runs take by default.

    python benchmarks/bench_host_frames.py [--bytes 1GB] [--n 64] [--repeat 5] [--threads 2] \\
        [--dir /tmp/bench-host-frames] [--out benchmarks/results/host-frames-cpu.json]

Input: float64 matrices of order ``--n`` written with plain zarr-python and its defaults (zstd, no
checksum) in chunks of about 32 MiB, random normal entries, reused between runs. Output: an array
made as batchlu makes float outputs by default (raw bytes with zarr's crc32c, NaN fill, every chunk
stored), fresh before each write.

Both paths run in this process, alternated, ``--repeat`` times each, one chunk per request from
``--threads`` threads (a CPU run's worker threads): **read** decodes the input into a preallocated
buffer (zarr: ``read_into``, the pipeline's call; frames: ``frames_read``), **write** writes that
buffer (zarr: ``array[a:b] = values``; frames: ``frames_write``). Each read is checked bit for bit
against the input; each path's output chunk files are compared byte for byte with the other's.
Wall, user and system seconds per pass; the record keeps every pass and the medians.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np


def _bytes(text: str) -> int:
    text = text.strip().upper()
    for suffix, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if text.endswith(suffix):
            return int(float(text[:-len(suffix)]) * scale)
    return int(text)


def make_input(path: Path, count: int, n: int, chunk: int):
    import zarr

    if (path / "zarr.json").exists():
        array = zarr.open_array(str(path), mode="r")
        if array.shape == (count, n, n) and array.chunks[0] == chunk:
            return array
        shutil.rmtree(path)
    array = zarr.create_array(str(path), shape=(count, n, n), chunks=(chunk, n, n), dtype="float64")
    for start in range(0, count, chunk):
        stop = min(start + chunk, count)
        array[start:stop] = np.random.default_rng(start).standard_normal((stop - start, n, n))
    return zarr.open_array(str(path), mode="r")


def make_output(path: Path, like):
    import zarr
    from zarr.codecs import BytesCodec, Crc32cCodec

    shutil.rmtree(path, ignore_errors=True)
    return zarr.create_array(str(path), shape=like.shape, chunks=like.chunks, dtype=like.dtype, fill_value=np.nan,
                             serializer=BytesCodec(), compressors=[Crc32cCodec()], config={"write_empty_chunks": True})


def timed(fn) -> dict:
    t, before = time.perf_counter(), os.times()
    fn()
    after = os.times()
    return {"wall_s": round(time.perf_counter() - t, 4), "user_s": round(after.user - before.user, 4),
            "sys_s": round(after.system - before.system, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes", default="1GB")
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dir", default="/tmp/bench-host-frames")
    parser.add_argument("--out", default="benchmarks/results/host-frames-cpu.json")
    args = parser.parse_args()

    from batchlu.pipeline.tuning import frame_layouts, frames_read, frames_write, read_into, tune_malloc

    tune_malloc()   # as a worker does
    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    per = args.n * args.n * 8
    chunk = max(1, (32 << 20) // per)
    count = max(chunk, _bytes(args.bytes) // per)
    source = make_input(work / f"in-n{args.n}-{count}.zarr", count, args.n, chunk)
    stored_in = frame_layouts({"a": source}, {})["a"]
    truth = np.asarray(source[...])
    ranges = [(s, min(s + chunk, count)) for s in range(0, count, chunk)]
    buffer = np.empty(truth.shape, truth.dtype)

    def reads(path: str):
        def one(r):
            out = buffer[r[0]:r[1]]
            if path == "frames":
                assert frames_read(stored_in, r[0], r[1], out), r
            else:
                read_into(source, r[0], r[1], out)
        return lambda: list(pool.map(one, ranges))

    def writes(path: str, output):
        stored = frame_layouts({}, {"x": output})["x"]

        def one(r):
            if path == "frames":
                assert frames_write(stored, r[0], r[1], buffer[r[0]:r[1]], output.fill_value), r
            else:
                output[r[0]:r[1]] = buffer[r[0]:r[1]]
        return lambda: list(pool.map(one, ranges))

    passes = {("read", p): [] for p in ("zarr", "frames")} | {("write", p): [] for p in ("zarr", "frames")}
    with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:
        reads("zarr")(), reads("frames")()   # untimed: thread pool, buffers, page cache
        for _ in range(args.repeat):
            for path in ("zarr", "frames"):
                buffer.fill(np.nan)
                passes[("read", path)].append(timed(reads(path)))
                assert buffer.tobytes() == truth.tobytes(), f"{path} read other values"
            for path in ("zarr", "frames"):
                output = make_output(work / f"out-{path}.zarr", source)
                passes[("write", path)].append(timed(writes(path, output)))
    same = all((work / f"out-zarr.zarr/c/{i}/0/0").read_bytes() == (work / f"out-frames.zarr/c/{i}/0/0").read_bytes()
               for i in range(len(ranges)))
    assert same, "the two paths wrote different chunk files"

    records = []
    print(f"{count:,} x {args.n}x{args.n} float64 ({truth.nbytes / 1e9:.2f} GB), chunks of {chunk}, "
          f"{args.threads} threads; medians of {args.repeat}")
    print("stage  path      wall s   user s   sys s   GB/s")
    for (stage, path), runs in passes.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "user_s", "sys_s")}
        print(f"{stage:<6} {path:<8} {med['wall_s']:7.2f}  {med['user_s']:7.2f} {med['sys_s']:7.2f}  "
              f"{truth.nbytes / 1e9 / med['wall_s']:5.2f}")
        records.append(dict(stage=stage, path=path, n=args.n, count=count, bytes=truth.nbytes, chunk=chunk,
                            threads=args.threads, runs=runs, median=med, checked=True))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = dict(machine=f"{platform.node()} ({os.cpu_count()} cores, no GPU)", date=datetime.date.today().isoformat(),
                commit=commit, command="python benchmarks/bench_host_frames.py " + " ".join(
                    f"--{k} {v}" for k, v in vars(args).items() if k not in ("dir", "out")))
    Path(args.out).write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")
    print(f"# wrote {args.out}")


if __name__ == "__main__":
    main()
