"""What the integrity checks of ``batchlu run`` / ``--resume`` cost on the CPU path (issue 16):

* during a run, each task takes the XXH3-64 of every output chunk's input and stores it beside the
  chunk's completion record: the run's time with and without that (the "without" replaces the
  checksum by nothing and skips its store, i.e. the code before the checks);
* during a run, every output chunk gets zarr's crc32c trailer (``batchlu.output-checksum``): the
  run's time with ``crc32c`` (the default) and with ``none``;
* before a resume, the stored-chunk check (every recorded output chunk file read and its CRC-32C
  checked) and the input check (every completed chunk's input read again and its digest compared);
* with ``--noop-mib M``, the output checksum where it weighs most: runs whose compute is a copy of
  the input (``tuning.HostEngine`` replaced), on M MiB of float64 64 x 64 matrices, i.e. the read,
  the write and the bookkeeping alone, with ``output-checksum`` ``crc32c`` and ``none``
  alternating; then the stored-chunk check before a resume of that output, in GB/s of output files.

    python benchmarks/bench_resume_checks.py [--dir /tmp/bench-resume] [--count 40000] [--size 16]
                                       [--chunks input,500,100] [--repeat 5] [--output-codec zstd]
                                       [--noop-mib 0] [--digests-gb 1]

``--digests-gb G`` first times the ledger's digest (XXH3-64 of each 32 MiB batch of float64 values,
xxhash's hasher as the tasks use it) against the CRC-32 it replaced (zlib, and zlib-ng where it is
installed) on G GB of fresh random values, in one process, alternating, one core.

One in-process LocalCluster (2 workers x 1 thread), so that the "without"
(``batchlu.pipeline.tuning.without_input_checksums``) reaches the workers; with, without and without
the output checksum alternate, and the medians of the wall time and of the process's CPU time (all
its threads: the client and both workers) are printed (and written as JSON with --out). The checks
before a resume are timed one by one through ``batchlu.pipeline.tuning.ResumeChecks``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import zarr


def _run_once(client, source, out, chunk, checks: bool, codec: str = "zstd", checksum: str = "crc32c") -> float:
    from batchlu import pipeline
    from batchlu.pipeline import tuning

    shutil.rmtree(out, ignore_errors=True)
    config = {"output-codec": codec, "output-checksum": checksum, **({} if chunk is None else {"chunk": chunk})}
    with (contextlib.nullcontext() if checks else tuning.without_input_checksums()):
        start, cpu = time.perf_counter(), time.process_time()
        report = pipeline.run(source, out, op="inv", backend="cpu", client=client, progress=False,
                              config=config)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert report.status == "complete"
    return elapsed, cpu


def _resume_checks(out) -> dict:
    """Time the checks resume runs before it trusts the ledger, on a complete output."""
    from batchlu.pipeline import tuning

    checks = tuning.ResumeChecks(out)
    times = {"output_bytes": sum(os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(out)
                                 for f in names)}
    start = time.perf_counter()
    checks.stored()
    times["stored_chunks_s"] = time.perf_counter() - start
    start = time.perf_counter()
    checks.input()
    times["input_s"] = time.perf_counter() - start
    return times


def _digest_rates(gb: float, repeat: int) -> dict:
    """GB/s of XXH3-64 and CRC-32 over ``gb`` GB of float64 values in 32 MiB batches (best of ``repeat``,
    the candidates alternating)."""
    import zlib

    import xxhash

    def xxh3(batch):
        h = xxhash.xxh3_64()
        h.update(batch)
        return h.intdigest()

    candidates = {"xxh3_64": xxh3, "crc32_zlib": zlib.crc32}
    try:
        from zlib_ng.zlib_ng import crc32 as crc32_ng
        candidates["crc32_zlib_ng"] = crc32_ng
    except ImportError:
        pass
    values = np.random.default_rng(0).standard_normal(int(gb * 1e9) // 8)
    batches = [values[i:i + (32 << 20) // 8] for i in range(0, values.size, (32 << 20) // 8)]
    best = {name: float("inf") for name in candidates}
    for _ in range(repeat):
        for name, digest in candidates.items():
            start = time.perf_counter()
            for batch in batches:
                digest(batch)
            best[name] = min(best[name], time.perf_counter() - start)
    rates = {name: values.nbytes / 1e9 / seconds for name, seconds in best.items()}
    print(f"digests of {values.nbytes / 1e9:.2f} GB of float64 in 32 MiB batches, one core: "
          + ", ".join(f"{name} {rate:.2f} GB/s" for name, rate in rates.items()), flush=True)
    return rates


def _noop_rates(client, work: Path, mib: int, codec: str, repeat: int) -> dict:
    """The I/O path alone (the compute a copy), with and without the output checksum: medians of wall
    and CPU time, GB/s of input; then the resume's stored-chunk check of that output."""
    from batchlu import pipeline
    from batchlu.pipeline import tuning

    class Copy(tuning.HostEngine):
        def run(self, op, slot):
            np.copyto(slot.outs["inv"], slot.a)
            slot.outs["info"][...] = 0

    n = 64
    count = (mib << 20) // (n * n * 8)
    source = work / "noop-a.zarr"
    if not (source / "zarr.json").exists() or zarr.open_array(str(source), mode="r").shape[0] != count:
        shutil.rmtree(source, ignore_errors=True)
        zarr.create_array(str(source), shape=(count, n, n), chunks=(1024, n, n), dtype="f8")[...] = \
            np.random.default_rng(0).standard_normal((count, n, n))
    out = work / "noop-o.zarr"
    engine = Copy()
    saved = tuning.register_engine("cpu", lambda: engine)
    try:
        timings = {"crc32c": [], "none": []}
        for i in range(repeat + 1):
            for checksum in timings:
                shutil.rmtree(out, ignore_errors=True)
                start, cpu = time.perf_counter(), time.process_time()
                report = pipeline.run(str(source), str(out), op="inv", backend="cpu", client=client, progress=False,
                                      config={"output-codec": codec, "output-checksum": checksum})
                elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
                assert report.status == "complete"
                if i:   # the first round warms up
                    timings[checksum].append((elapsed, cpu))
    finally:
        tuning.register_engine("cpu", saved)
    nbytes = count * n * n * 8
    entry = {"mib": mib, "n": n, "count": count, "output_codec": codec}
    for checksum, runs in timings.items():
        entry[f"{checksum}_s"] = statistics.median(t for t, _ in runs)
        entry[f"{checksum}_cpu_s"] = statistics.median(c for _, c in runs)
        entry[f"{checksum}_gbps"] = nbytes / 1e9 / entry[f"{checksum}_s"]
    entry["overhead"] = entry["crc32c_s"] / entry["none_s"] - 1
    entry["cpu_overhead"] = entry["crc32c_cpu_s"] / entry["none_cpu_s"] - 1
    pipeline.run(str(source), str(out), op="inv", backend="cpu", client=client, progress=False, overwrite=True,
                 config={"output-codec": codec})   # crc32c, the default (the real engine: the check reads files)
    checks = []
    for _ in range(repeat):
        start, cpu = time.perf_counter(), time.process_time()
        tuning.ResumeChecks(str(out)).stored()
        checks.append((time.perf_counter() - start, time.process_time() - cpu))
    entry["output_bytes"] = sum(os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(out) for f in names)
    entry["stored_check_s"] = statistics.median(t for t, _ in checks)
    entry["stored_check_cpu_s"] = statistics.median(c for _, c in checks)
    entry["stored_check_gbps"] = entry["output_bytes"] / 1e9 / entry["stored_check_s"]
    print(f"copy compute, {mib} MiB of {n} x {n} float64, output {codec}: {entry['crc32c_s']:.2f} s "
          f"({entry['crc32c_gbps']:.2f} GB/s) with crc32c, {entry['none_s']:.2f} s ({entry['none_gbps']:.2f} GB/s) "
          f"without ({100 * entry['overhead']:+.1f} %); CPU {entry['crc32c_cpu_s']:.2f} / {entry['none_cpu_s']:.2f} s "
          f"({100 * entry['cpu_overhead']:+.1f} %); resume's stored-chunk check {1e3 * entry['stored_check_s']:.0f} ms "
          f"for {entry['output_bytes'] / 1e6:.0f} MB ({entry['stored_check_gbps']:.2f} GB/s, CPU "
          f"{1e3 * entry['stored_check_cpu_s']:.0f} ms)", flush=True)
    return entry


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="/tmp/bench-resume")
    parser.add_argument("--count", type=int, default=40000)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--chunks", default="input,500,100")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--output-codec", default="zstd", help="batchlu.output-codec of the runs")
    parser.add_argument("--noop-mib", type=int, default=0, help="also time the I/O path alone on this many MiB")
    parser.add_argument("--out", default=None, help="write the medians as JSON here")
    parser.add_argument("--digests-gb", type=float, default=0.0,
                        help="first time XXH3-64 against CRC-32 on this many GB of float64 values")
    args = parser.parse_args(argv)
    digest_rates = _digest_rates(args.digests_gb, args.repeat) if args.digests_gb > 0 else None

    from distributed import Client, LocalCluster

    from batchlu import pipeline
    from batchlu.pipeline.tuning import FRESH_SECONDS

    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    source = str(work / "a.zarr")
    shutil.rmtree(source, ignore_errors=True)
    pipeline.generate(source, count=args.count, size=args.size, dtype="float64", seed=0)
    old = time.time() - 60
    for folder, _, names in os.walk(source):  # older than FRESH_SECONDS: the run's signature stats them
        for name in names:
            os.utime(os.path.join(folder, name), (old, old))
    time.sleep(FRESH_SECONDS + 0.5)  # ... and their ctimes too

    results = {"count": args.count, "size": args.size, "dtype": "float64", "op": "inv",
               "output_codec": args.output_codec, "cores": os.cpu_count(), "digest_gb_per_s": digest_rates,
               "runs": []}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        out = str(work / "o.zarr")
        for label in filter(None, args.chunks.split(",")):
            chunk = None if label == "input" else int(label)
            codec = args.output_codec
            _run_once(client, source, out, chunk, True, codec)  # warm-up
            variants = {"with": (True, "crc32c"), "without": (False, "crc32c"), "no_output_checksum": (True, "none")}
            timings = {name: [] for name in variants}
            for _ in range(args.repeat):
                for name, (checks, checksum) in variants.items():
                    timings[name].append(_run_once(client, source, out, chunk, checks, codec, checksum))
            _run_once(client, source, out, chunk, True, codec)
            n_chunks = zarr.open_group(out, mode="r").attrs["batchlu"]["plan"]["n_chunks"]
            entry = {"chunk": label, "n_chunks": n_chunks}
            for name in variants:
                entry[f"{name}_s"] = statistics.median(t for t, _ in timings[name])
                entry[f"{name}_cpu_s"] = statistics.median(c for _, c in timings[name])
            entry.update(_resume_checks(out))
            entry["overhead"] = entry["with_s"] / entry["without_s"] - 1
            entry["cpu_overhead"] = entry["with_cpu_s"] / entry["without_cpu_s"] - 1
            entry["output_checksum_overhead"] = entry["with_s"] / entry["no_output_checksum_s"] - 1
            entry["output_checksum_cpu_overhead"] = entry["with_cpu_s"] / entry["no_output_checksum_cpu_s"] - 1
            results["runs"].append(entry)
            print(f"chunk {label:>6} ({n_chunks} chunks): run {entry['with_s']:.3f} s with checksums, "
                  f"{entry['without_s']:.3f} s without input checksums ({100 * entry['overhead']:+.1f} %), "
                  f"{entry['no_output_checksum_s']:.3f} s without output crc32c "
                  f"({100 * entry['output_checksum_overhead']:+.1f} %); CPU time "
                  f"{entry['with_cpu_s']:.2f} / {entry['without_cpu_s']:.2f} / "
                  f"{entry['no_output_checksum_cpu_s']:.2f} s; before a resume: "
                  f"stored chunks {1e3 * entry['stored_chunks_s']:.1f} ms "
                  f"({entry['output_bytes'] / 1e6:.0f} MB of output files checked), input "
                  f"{1e3 * entry['input_s']:.1f} ms", flush=True)
        if args.noop_mib:
            results["noop"] = _noop_rates(client, work, args.noop_mib, args.output_codec, args.repeat)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
