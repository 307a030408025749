"""``batchlu run`` on object storage against local disk (issue 41, item 2, "Benchmark"): the same input,
``batchlu run IN OUT --op inv`` from process start to exit, IN and OUT on the local disk or both on
moto's standalone S3 server on the loopback address.

    python benchmarks/bench_objstore.py [--size 2GB] [--n 32] [--repeat 2] [--data-dir DIR]
        [--compare-stores] [--out benchmarks/results/objstore-cpu.json]

**Input**: ``batchlu generate`` (random float64 n x n, chunks of about 32 MiB along N, zstd + crc32c),
written once to the local disk (``--data-dir`` keeps it for a later call) and copied object by object
into a bucket of a moto server (``moto.server.ThreadedMotoServer``) that this script starts in a child
process on a free loopback port, with the ``AWS_*`` variables pointing the runs at it. Sizes are
bytes of matrices (``2GB`` = 2e9).

**Runs**, in turns, ``--repeat`` times each, outputs deleted between runs: ``local`` (``batchlu run
DIR/in.zarr DIR/out.zarr --op inv``) and ``s3`` (``batchlu run s3://BUCKET/in.zarr
s3://BUCKET/out.zarr --op inv``), each a subprocess timed from its start to its exit, and its report's
compute time kept. Every output is then checked (untimed) by ``batchlu verify --sample 64``: LAPACK's
dget03 ratios; a run that fails or whose output fails is recorded ``ok: false``.

``--compare-stores`` also reads the S3 input whole through zarr with each of zarr-python's two S3
stores, ``FsspecStore`` (s3fs) and ``ObjectStore`` (obstore), three times each (s3fs must be
installed): the measurement behind docs/design.md's choice of store.

**Records** to ``--out``: ``where``, ``run``, ``wall_s``, ``compute_s``, ``ok``, ``bytes``, ``count``,
``n``, ``chunks``, ``cores``, ``load``, ``date``, ``commit``; ``stores`` for ``--compare-stores``; a
table at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "bench"
SERVER = """
import logging, sys, time
from moto.server import ThreadedMotoServer
logging.getLogger("werkzeug").setLevel(logging.ERROR)
ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]), verbose=False).start()
print("up", flush=True)
time.sleep(1e9)
"""


def _bytes(text: str) -> int:
    number, unit = re.fullmatch(r"([\d.]+)\s*([KMG]?i?B?)", text.strip()).groups()
    scale = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]
    return int(float(number) * scale)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli() -> str:
    """The ``batchlu`` console script beside this Python (as a user runs it), else on the PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "batchlu")
    return here if os.path.exists(here) else shutil.which("batchlu")


def _batchlu(*args, env=None) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    done = subprocess.run([_cli(), *map(str, args)], env=env, capture_output=True, text=True)
    return time.perf_counter() - started, done


def _compute_s(report: str) -> float | None:
    found = re.search(r"compute ([\d.]+) s", report)
    return float(found.group(1)) if found else None


def _bucket(prefix: str = ""):
    from obstore.store import S3Store

    return S3Store(BUCKET, prefix=prefix or None, client_options={"allow_http": True})


def _upload(local: str, key: str) -> None:
    import obstore

    bucket = _bucket()
    for folder, _, files in os.walk(local):
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                obstore.put(bucket, f"{key}/{os.path.relpath(path, local)}", f.read())


def _remove(where: str) -> None:
    if where.startswith("s3://"):
        import obstore

        key = where.split("/", 3)[3]
        paths = [meta["path"] for batch in obstore.list(_bucket(), prefix=f"{key}/") for meta in batch]
        if paths:
            obstore.delete(_bucket(), paths)
    else:
        shutil.rmtree(where, ignore_errors=True)


def _compare_stores(url: str, endpoint: str) -> dict:
    """Seconds to read the input whole through zarr with FsspecStore (s3fs) and ObjectStore (obstore)."""
    import numpy as np
    import zarr

    stores = {"ObjectStore (obstore)": lambda: zarr.storage.ObjectStore(_bucket(url.split("/", 3)[3]), read_only=True),
              "FsspecStore (s3fs)": lambda: zarr.storage.FsspecStore.from_url(
                  url, read_only=True, storage_options={"endpoint_url": endpoint})}
    times = {}
    for name, make in stores.items():
        best = []
        for _ in range(3):
            started = time.perf_counter()
            np.asarray(zarr.open_array(make(), mode="r")[...])
            best.append(time.perf_counter() - started)
        times[name] = round(min(best), 3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="2GB")
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--compare-stores", action="store_true")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "objstore-cpu.json"))
    args = parser.parse_args()

    size, n = _bytes(args.size), args.n
    count = size // (n * n * 8)
    chunk = max(1, (32 << 20) // (n * n * 8))
    scratch = tempfile.mkdtemp(prefix="bench-objstore-")
    data = args.data_dir or scratch
    os.makedirs(data, exist_ok=True)
    source = os.path.join(data, f"in-{args.size}-n{n}.zarr")
    if not os.path.exists(source):
        _, done = _batchlu("generate", source, "--count", count, "--size", n, "--chunk", chunk, "--seed", 1)
        assert done.returncode == 0, done.stderr

    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "up"
        env = dict(os.environ, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_ENDPOINT_URL=endpoint,
                   AWS_REGION="us-east-1", AWS_DEFAULT_REGION="us-east-1")
        os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
        import boto3

        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=BUCKET)
        s3_source = f"s3://{BUCKET}/in.zarr"
        started = time.perf_counter()
        _upload(source, "in.zarr")
        print(f"input: {count:,} float64 {n}x{n} ({size / 1e9:.2f} GB), chunks of {chunk:,}; "
              f"copied to {s3_source} in {time.perf_counter() - started:.1f} s", flush=True)
        _batchlu("run", source, os.path.join(scratch, "warm.zarr"), "--op", "inv", env=env)   # numba's cache
        _remove(os.path.join(scratch, "warm.zarr"))
        places = {"local": (source, os.path.join(scratch, "out.zarr")), "s3": (s3_source, f"s3://{BUCKET}/out.zarr")}
        records = []
        for run in range(1, args.repeat + 1):
            for where, (a, out) in places.items():
                wall, done = _batchlu("run", a, out, "--op", "inv", "--no-progress", env=env)
                ok = done.returncode == 0
                if ok:
                    _, checked = _batchlu("verify", a, out, "--sample", 64, env=env)
                    ok = checked.returncode == 0
                records.append({"where": where, "run": run, "wall_s": round(wall, 3),
                                "compute_s": _compute_s(done.stdout), "ok": ok, "bytes": count * n * n * 8,
                                "count": count, "n": n, "chunks": [chunk, n, n], "cores": os.cpu_count(),
                                "load": round(os.getloadavg()[0], 2),
                                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
                print(json.dumps(records[-1]) if ok else done.stderr[-2000:], flush=True)
                _remove(out)
        stores = _compare_stores(s3_source, endpoint) if args.compare_stores else None
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(scratch, ignore_errors=True)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    for record in records:
        record["commit"] = commit
    command = "python benchmarks/bench_objstore.py " + " ".join(sys.argv[1:])
    with open(args.out, "w") as f:
        json.dump({"commands": [command], "records": records, "stores": stores}, f, indent=1)
        f.write("\n")
    print(f"\n| where | wall s (runs) | compute s |\n|---|---|---|")
    for where in places:
        mine = [r for r in records if r["where"] == where and r["ok"]]
        walls = ", ".join(f"{r['wall_s']:.2f}" for r in mine)
        computes = ", ".join(f"{r['compute_s']:.2f}" for r in mine if r["compute_s"] is not None)
        print(f"| {where} | {walls} | {computes} |")
    if stores:
        print("\nzarr read of the S3 input, best of 3: " + ", ".join(f"{k} {v:.2f} s" for k, v in stores.items()))


if __name__ == "__main__":
    main()
