"""What the integrity checks of ``batchlu run`` / ``--resume`` cost on the CPU path (issue 16):

* during a run, each task takes the XXH3-64 of every output chunk's input and stores it beside the
  chunk's completion record: the run's time with and without that (the "without" replaces the
  checksum by nothing and skips its store, i.e. the code before the checks);
* before a resume, the stored-chunk check and the input check (every completed chunk's input read
  again and its digest compared).

    python benchmarks/bench_resume_checks.py [--dir /tmp/bench-resume] [--count 40000] [--size 16]
                                       [--chunks input,500,100] [--repeat 5] [--digests-gb 1]

``--digests-gb G`` first times the ledger's digest (XXH3-64 of each 32 MiB batch of float64 values,
xxhash's hasher as the tasks use it) against the CRC-32 it replaced (zlib, and zlib-ng where it is
installed) on G GB of fresh random values, in one process, alternating, one core.

One in-process LocalCluster (2 workers x 1 thread), so that the "without"
(``batchlu.pipeline.tuning.without_input_checksums``) reaches the workers; with and without
alternate, and the medians of the wall time and of the process's CPU time (all its threads: the
client and both workers) are printed (and written as JSON with --out). The checks before a resume
are timed one by one through ``batchlu.pipeline.tuning.ResumeChecks``.
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


def _run_once(client, source, out, chunk, checks: bool) -> float:
    from batchlu import pipeline
    from batchlu.pipeline import tuning

    shutil.rmtree(out, ignore_errors=True)
    config = {} if chunk is None else {"chunk": chunk}
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
    times = {}
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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="/tmp/bench-resume")
    parser.add_argument("--count", type=int, default=40000)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--chunks", default="input,500,100")
    parser.add_argument("--repeat", type=int, default=5)
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
               "cores": os.cpu_count(), "digest_gb_per_s": digest_rates, "runs": []}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        out = str(work / "o.zarr")
        for label in args.chunks.split(","):
            chunk = None if label == "input" else int(label)
            _run_once(client, source, out, chunk, True)  # warm-up
            timings = {True: [], False: []}
            for _ in range(args.repeat):
                for checks in (True, False):
                    timings[checks].append(_run_once(client, source, out, chunk, checks))
            _run_once(client, source, out, chunk, True)
            n_chunks = zarr.open_group(out, mode="r").attrs["batchlu"]["plan"]["n_chunks"]
            entry = {"chunk": label, "n_chunks": n_chunks,
                     "with_s": statistics.median(t for t, _ in timings[True]),
                     "without_s": statistics.median(t for t, _ in timings[False]),
                     "with_cpu_s": statistics.median(c for _, c in timings[True]),
                     "without_cpu_s": statistics.median(c for _, c in timings[False]),
                     **_resume_checks(out)}
            entry["overhead"] = entry["with_s"] / entry["without_s"] - 1
            entry["cpu_overhead"] = entry["with_cpu_s"] / entry["without_cpu_s"] - 1
            results["runs"].append(entry)
            print(f"chunk {label:>6} ({n_chunks} chunks): run {entry['with_s']:.3f} s with checksums, "
                  f"{entry['without_s']:.3f} s without ({100 * entry['overhead']:+.1f} %), CPU time "
                  f"{entry['with_cpu_s']:.2f} / {entry['without_cpu_s']:.2f} s "
                  f"({100 * entry['cpu_overhead']:+.1f} %); before a resume: "
                  f"stored chunks {1e3 * entry['stored_chunks_s']:.1f} ms, input "
                  f"{1e3 * entry['input_s']:.1f} ms", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
