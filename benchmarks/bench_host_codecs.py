"""Host Zarr codecs: batchlu's I/O processes against zarr-python's own codec pipelines and the zarrs
pipeline, on the pipeline benchmark's input (issue 18, item 6).

    python benchmarks/bench_host_codecs.py [--count 40000] [--kinds normal,rounded] [--repeat 3] \\
        [--dir /tmp/batchlu-bench] [--out benchmarks/results/host-codecs-HOST.json]

Input: ``--count`` float64 matrices of order ``--size`` (default 40,000 x 128 x 128, 5.2 GB) in a
zstd Zarr v3 array of 256-matrix (32 MiB) chunks, as ``batchlu generate`` writes them, made by
``bench_pipeline.generate`` once per data kind and reused: ``normal`` (random normal entries,
compression ratio ~1.04) and ``rounded`` (the same rounded to 2 decimals, ~4).

Each variant runs in a fresh Python process (its zarr configuration, thread pools and I/O children
its own) and times, best of ``--repeat``:

* **read**: decode the whole input into one preallocated buffer (in shared memory, as the pipeline's
  slots; filled with NaN before each run), through ``batchlu.pipeline.tuning.read_into``, the
  pipeline's own read call;
* **write**: encode that buffer into an equal-size output array made like the pipeline's outputs
  (zstd, zarr's default codec; ``write_empty_chunks``; fresh before each run, removed after).

Requests are 1 chunk each, as the pipeline's default tasks make them (``--batch-chunks``), sent by as
many caller threads as there are cores (the worker's threads), or the whole array in one call
(``1xall``: zarr's own parallelism alone). Variants:

* ``processes PxT``: batchlu's I/O pool (``batchlu.io-processes`` P, ``io-threads`` T), zarr's
  default codec pipeline in each child: today's host path on GPU workers;
* ``zarr``: zarr's default ``BatchedCodecPipeline`` in this process, with its defaults and with
  ``codec_pipeline.batch_size`` / ``async.concurrency`` / ``threading.max_workers`` raised;
* ``zarr-fused``: zarr's ``FusedCodecPipeline`` (``codec_pipeline.max_workers``), where the
  installed zarr has it;
* ``zarrs``: the zarrs codec pipeline for zarr-python (Rust; ``codec_pipeline.strict``, so nothing
  falls back to zarr's pipeline unnoticed), where it is installed; else the record says why not.
  Its writes are timed too, but ``batchlu.io-engine: zarrs`` writes through zarr's pipeline (zarrs
  0.2.3 drops chunks of fill values despite ``write_empty_chunks``: ``pipeline/store/_io_engines.py``);
* ``processes PxT + zarrs``: the I/O pool with zarrs in its children.

The page cache is warm: the input was just written or read in full before the runs, and each
variant reads a part of it untimed first. Every variant's last read is checked against the input's
per-chunk CRC-32, and its last write is decoded with numcodecs (not through zarr) and checked the
same way; the record says whether its frames are byte for byte numcodecs' (zarr's) own. GB/s count
the input's decoded bytes; ``read+write`` is bytes / (best read + best write seconds).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np

from bench_pipeline import DATA_KINDS, device_name, generate, timed

ZARRS = "zarrs.ZarrsCodecPipeline"


# --------------------------------------------------------------------------------------- variants
def variants(cores: int) -> list[dict]:
    """The default sweep for a host of ``cores`` cores, the settings that decide first: each a dict
    of ``engine``, ``pool`` (P, T: I/O processes) or ``callers`` (threads of this process sending
    requests; 0: one call for the whole array), ``zarr`` (the zarr configuration of the process and
    of its I/O children) and a ``name``."""
    from batchlu.pipeline.tuning import FUSED_PIPELINE

    half = (max(1, cores // 2), 2 if cores > 1 else 1)  # batchlu's default pool on a GPU worker
    zarrs = {"codec_pipeline.path": ZARRS, "codec_pipeline.strict": True}
    fused = {"codec_pipeline.path": FUSED_PIPELINE, "codec_pipeline.max_workers": cores}
    wide = {"codec_pipeline.batch_size": cores, "async.concurrency": 2 * cores, "threading.max_workers": 2 * cores}
    out = [dict(name=f"processes {half[0]}x{half[1]}", engine="processes", pool=half, zarr={}),
           dict(name=f"zarrs {cores} callers", engine="zarrs", callers=cores, zarr=zarrs),
           dict(name=f"zarr-fused {cores} callers", engine="zarr-fused", callers=cores, zarr=fused),
           dict(name=f"zarr {cores} callers", engine="zarr", callers=cores, zarr={}),
           dict(name="zarrs 1xall", engine="zarrs", callers=0, zarr=zarrs),
           dict(name="zarr-fused 1xall", engine="zarr-fused", callers=0, zarr=fused),
           dict(name=f"processes {half[0]}x{half[1]} + zarrs", engine="processes+zarrs", pool=half,
                zarr={**zarrs, "threading.max_workers": half[1]})]
    for p in (max(1, cores // 4), cores):
        if (p, cores // p) != half:
            out.append(dict(name=f"processes {p}x{cores // p}", engine="processes", pool=(p, cores // p), zarr={}))
    out += [dict(name="zarr 1xall", engine="zarr", callers=0, zarr={}),
            dict(name=f"zarr {cores} callers, wide", engine="zarr", callers=cores, zarr=wide),
            dict(name="zarr 1xall, wide", engine="zarr", callers=0, zarr=wide)]
    return out


def zarr_env(settings: dict) -> dict:
    """``ZARR_...`` environment variables for the zarr configuration ``settings`` (donfig reads them
    when zarr is imported: in the variant's process and in its I/O children alike)."""
    env = {}
    for key, value in settings.items():
        env["ZARR_" + key.upper().replace(".", "__")] = repr(value) if not isinstance(value, str) else value
    return env


def unavailable(variant: dict) -> str | None:
    """Why ``variant`` cannot run with what is installed, or None."""
    path = variant["zarr"].get("codec_pipeline.path")
    if path:
        module, _, name = path.rpartition(".")
        try:
            mod = __import__(module, fromlist=[name])
        except ImportError as exc:
            return f"{module} is not installed ({exc})"
        if not hasattr(mod, name):
            import zarr

            return f"zarr {zarr.__version__} has no {path}"
    if variant["engine"].startswith("processes"):
        from batchlu.pipeline import tuning as io_pool

        if not io_pool.supported():
            return "I/O processes need Linux (memfd_create and /proc)"
    return None


# ------------------------------------------------------------------------------ input and checks
def reference_crcs(src: Path) -> list[int]:
    """CRC-32 of each chunk's decoded values, through plain zarr (cached beside the store)."""
    import zarr

    cache = src.with_suffix(".crc.json")
    stamp = (src / "zarr.json").stat().st_mtime_ns
    if cache.exists():
        saved = json.loads(cache.read_text())
        if saved.get("stamp") == stamp:
            return saved["crc"]
    arr = zarr.open_array(str(src), mode="r")
    chunk = arr.chunks[0]
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as ex:
        crc = list(ex.map(lambda s: zlib.crc32(np.ascontiguousarray(arr[s:s + chunk])),
                          range(0, arr.shape[0], chunk)))
    cache.write_text(json.dumps({"stamp": stamp, "crc": crc}))
    return crc


def chunk_crcs(values: np.ndarray, chunk: int) -> list[int]:
    """CRC-32 of each chunk of ``values`` (threads: zlib lets go of the GIL on large buffers)."""
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as ex:
        return list(ex.map(lambda s: zlib.crc32(values[s:s + chunk]), range(0, values.shape[0], chunk)))


def stored_ratio(src: Path) -> float:
    files = [p for p in src.rglob("*") if p.is_file() and p.name != "zarr.json"]
    import zarr

    arr = zarr.open_array(str(src), mode="r")
    return round(arr.nbytes / max(1, sum(p.stat().st_size for p in files)), 3)


# ------------------------------------------------------------------------------- one variant's run
def _requests(count: int, chunk: int, per: int, callers: int) -> list[tuple[int, int]]:
    """Matrix ranges of ``per`` chunks each; ``callers`` 0 (``per`` ignored): the whole array once."""
    if callers == 0:
        return [(0, count)]
    step = per * chunk
    return [(s, min(s + step, count)) for s in range(0, count, step)]


def run_variant(variant: dict, src: Path, work: Path, repeat: int, per: int, crcs: list[int]) -> dict:
    """In the variant's own process: time the reads and writes, check them, return the record."""
    import numcodecs
    import zarr

    from batchlu.pipeline import tuning as io_pool

    io_pool.tune_malloc()  # as a worker process does (the I/O children get it from their environment)
    for key, value in variant["zarr"].items():  # already in force through ZARR_*; made sure here
        zarr.config.set({key: value})
    arr = io_pool.open_array(str(src), "", "r")
    pipeline = type(io_pool.codec_pipeline(arr)).__name__
    count, n, chunk = arr.shape[0], arr.shape[1], arr.chunks[0]
    raw = io_pool.shared_buffer(arr.nbytes)
    buf = raw[:arr.nbytes].view(np.float64).reshape(arr.shape)
    out_store = work / f"out-{os.getpid()}.zarr"

    pool = None
    if variant.get("pool"):
        pool = io_pool.IOPool(*variant["pool"])
        callers = variant["pool"][0] * variant["pool"][1]
    else:
        callers = variant["callers"]
    ranges = _requests(count, chunk, per, variant.get("callers", 1) if pool is None else 1)

    def read_all(ranges=ranges):
        if pool is not None:
            for f in [pool.read(str(src), "", s, e, buf[s:e]) for s, e in ranges]:
                f.result()
            return
        with concurrent.futures.ThreadPoolExecutor(max(1, callers)) as ex:
            list(ex.map(lambda r: io_pool.read_into(arr, r[0], r[1], buf[r[0]:r[1]]), ranges))

    def fresh_output():
        shutil.rmtree(out_store, ignore_errors=True)
        zarr.create_array(str(out_store), name="inv", shape=arr.shape, chunks=(chunk, n, n), dtype=arr.dtype,
                          fill_value=np.nan, compressors="auto", config={"write_empty_chunks": True})

    def write_all(ranges=ranges):
        if pool is not None:
            for f in [pool.write(str(out_store), "inv", s, e, buf[s:e]) for s, e in ranges]:
                f.result()
            return
        out = io_pool.open_array(str(out_store), "inv", "r+", write_empty=True)
        with concurrent.futures.ThreadPoolExecutor(max(1, callers)) as ex:
            list(ex.map(lambda r: out.__setitem__(slice(r[0], r[1]), buf[r[0]:r[1]]), ranges))

    # warm-up, untimed: thread pools, I/O children, opened arrays, a part of the page cache
    warm = ranges if len(ranges) == 1 else ranges[:max(1, 2 * callers)]
    buf.fill(np.nan)
    read_all(warm)
    fresh_output()
    write_all(warm)

    reads, writes = [], []
    for _ in range(repeat):
        buf.fill(np.nan)
        reads.append(timed(read_all))
    read_ok = chunk_crcs(buf, chunk) == crcs
    for _ in range(repeat):
        fresh_output()
        writes.append(timed(write_all))
    # the last output, decoded by numcodecs' zstd from the chunk files, not through zarr
    stored = zarr.open_array(str(out_store), path="inv", mode="r")
    codec = numcodecs.Zstd(level=0)

    def frame(i):
        return (out_store / "inv" / io_pool.chunk_key(stored, (i, 0, 0))).read_bytes()

    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as ex:
        back = list(ex.map(lambda i: zlib.crc32(codec.decode(frame(i))), range(-(-count // chunk))))
    write_ok = back == crcs
    # the first chunk's frame, against the one numcodecs (zarr's default pipeline) writes for it
    same_frames = frame(0) == codec.encode(np.ascontiguousarray(buf[:chunk]))
    shutil.rmtree(out_store, ignore_errors=True)
    if pool is not None:
        pool.close()
    return dict(pipeline=pipeline, reads_s=[round(t, 4) for t in reads], writes_s=[round(t, 4) for t in writes],
                read_ok=read_ok, write_ok=write_ok, frames_as_numcodecs=bool(same_frames),
                requests=f"{callers}x{per}" if len(ranges) > 1 else "1xall")


def _child(args) -> None:
    variant = json.loads(args.variant)
    crcs = json.loads(Path(args.crcs).read_text())["crc"]
    result = run_variant(variant, Path(args.src), Path(args.dir), args.repeat, args.batch_chunks, crcs)
    print("RESULT " + json.dumps(result), flush=True)


def spawn(variant: dict, src: Path, args) -> dict:
    """Run ``variant`` in a fresh interpreter, its zarr configuration in the environment."""
    env = dict(os.environ)
    env.update(zarr_env(variant["zarr"]))
    cmd = [sys.executable, os.path.abspath(__file__), "--variant", json.dumps(variant), "--src", str(src),
           "--crcs", str(src.with_suffix(".crc.json")), "--dir", args.dir, "--repeat", str(args.repeat),
           "--batch-chunks", str(args.batch_chunks)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return dict(error=f"exit {done.returncode}: " + " | ".join(tail))


# -------------------------------------------------------------------------------------------- main
def host_label() -> str:
    name = device_name()
    if name == "no GPU":
        return f"cpu{os.cpu_count()}"
    model = name.split(" ", 1)[1]  # "1x NVIDIA H100 80GB HBM3" -> "h100"
    for word in model.split():
        if word[:1] in "HABLV" and any(c.isdigit() for c in word):
            return word.lower()
    return socket.gethostname()


def versions() -> dict:
    import numcodecs
    import zarr

    out = {"zarr": zarr.__version__, "numcodecs": numcodecs.__version__, "python": platform.python_version()}
    try:
        import zarrs

        out["zarrs"] = zarrs.__version__
    except ImportError:
        out["zarrs"] = None
    return out


def table(records: list[dict]) -> str:
    lines = ["", "data     variant                                requests  read GB/s  write GB/s  read+write  ok",
             ]
    for r in records:
        if "error" in r or "skipped" in r:
            lines.append(f"{r['data']:<8} {r['variant']:<38} {'-':>8}  {r.get('skipped') or r['error']}")
            continue
        lines.append(f"{r['data']:<8} {r['variant']:<38} {r['requests']:>8}  {r['read_gbps']:>9.2f}  "
                     f"{r['write_gbps']:>10.2f}  {r['read_write_gbps']:>10.2f}  "
                     f"{'yes' if r['read_ok'] and r['write_ok'] else 'NO'}")
    return "\n".join(lines)


def settings_table(records: list[dict], cores: int) -> str:
    """What each ``batchlu.io-engine`` x ``io-processes`` setting would move, from the variants that
    do its reads and its writes (zarrs decodes only: zarr's pipeline writes for it)."""
    half = f"{max(1, cores // 2)}x{2 if cores > 1 else 1}"
    combos = [("zarr, I/O processes " + half + " (GPU default)", f"processes {half}", f"processes {half}"),
              ("zarr, in the worker", f"zarr {cores} callers", f"zarr {cores} callers"),
              ("zarr-fused, in the worker", f"zarr-fused {cores} callers", f"zarr-fused {cores} callers"),
              ("zarrs, in the worker", f"zarrs {cores} callers", f"zarr {cores} callers"),
              ("zarrs, I/O processes " + half, f"processes {half} + zarrs", f"processes {half}")]
    lines = ["", "data     batchlu io-engine, where                  read GB/s  write GB/s  read+write"]
    for kind in dict.fromkeys(r["data"] for r in records):
        got = {r["variant"]: r for r in records if r["data"] == kind and "read_gbps" in r}
        for label, reader, writer in combos:
            if reader in got and writer in got:
                r, w = got[reader]["read_gbps"], got[writer]["write_gbps"]
                lines.append(f"{kind:<8} {label:<40} {r:>9.2f}  {w:>10.2f}  {1 / (1 / r + 1 / w):>10.2f}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=40_000)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--chunk", type=int, default=256, help="input chunk length (matrices): 32 MiB at n=128")
    parser.add_argument("--kinds", default=",".join(DATA_KINDS), help="data kinds: normal, rounded")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each (the best is reported)")
    parser.add_argument("--batch-chunks", type=int, default=1, help="chunks per request (a pipeline batch)")
    parser.add_argument("--only", default="", help="run only variants whose name contains one of these "
                                                   "comma-separated words")
    parser.add_argument("--dir", default="/tmp/batchlu-bench")
    parser.add_argument("--out", default=None, help="default: benchmarks/results/host-codecs-HOST.json; "
                                                    "the records already there are kept, but for what "
                                                    "this run measures again")
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    parser.add_argument("--crcs", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.variant:
        return _child(args)

    cores = os.cpu_count() or 1
    kinds = [k for k in args.kinds.split(",") if k]
    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out or Path(__file__).resolve().parent / "results" / f"host-codecs-{host_label()}.json")
    device, date, info = device_name(), datetime.date.today().isoformat(), versions()
    nbytes = args.count * args.size * args.size * 8
    print(f"{cores} cores, {device}; {args.count} x {args.size}^2 float64 = {nbytes / 1e9:.2f} GB, chunk "
          f"{args.chunk}; {info}", flush=True)
    words = [w for w in args.only.split(",") if w]
    chosen = [v["name"] for v in variants(cores) if not words or any(w in v["name"] for w in words)]
    # records already in --out are kept, but for the (kind, variant) pairs this run measures again
    records = [r for r in (json.loads(out.read_text()) if out.exists() else [])
               if not (r.get("data") in kinds and r.get("variant") in chosen)]
    for kind in kinds:
        src = work / f"host-codecs-{kind}-{args.count}x{args.size}.zarr"
        t = timed(lambda: generate(src, args.count, args.size, args.chunk, seed=2024, data=kind))
        t_crc = timed(lambda: reference_crcs(src))  # reads the whole input once: the page cache is warm
        ratio = stored_ratio(src)
        print(f"{kind}: {src} ready in {t:.1f} s, compression ratio {ratio}, reference read {t_crc:.1f} s",
              flush=True)
        for variant in variants(cores):
            if variant["name"] not in chosen:
                continue
            base = dict(data=kind, variant=variant["name"], engine=variant["engine"], zarr_config=variant["zarr"],
                        pool=variant.get("pool"), dtype="float64", n=args.size, count=args.count,
                        chunk=args.chunk, compression_ratio=ratio, batch_chunks=args.batch_chunks,
                        repeat=args.repeat, cpu_cores=cores, device=device, date=date, page_cache="warm", **info)
            why = unavailable(variant)
            if why:
                rec = dict(base, skipped=why)
            else:
                t0 = time.perf_counter()
                rec = dict(base, **spawn(variant, src, args))
                rec["variant_wall_s"] = round(time.perf_counter() - t0, 1)
                if "error" not in rec:
                    best_r, best_w = min(rec["reads_s"]), min(rec["writes_s"])
                    rec.update(read_gbps=round(nbytes / 1e9 / best_r, 3), write_gbps=round(nbytes / 1e9 / best_w, 3),
                               read_write_gbps=round(nbytes / 1e9 / (best_r + best_w), 3))
            records.append(rec)
            print(table([rec]).splitlines()[-1], flush=True)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(records, indent=1) + "\n")
    print(table([r for r in records if r["data"] in kinds]))
    print(settings_table([r for r in records if r["data"] in kinds], cores))
    print(f"\nrecords: {out}")
    return records


if __name__ == "__main__":
    main()
