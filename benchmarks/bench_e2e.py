"""What a user gets, from process start to exit: ``batchlu run IN OUT --op inv`` against the script a
user would write, on inputs written with plain zarr-python (issue 43, "Benchmark").

    python benchmarks/bench_e2e.py                      # the GPU machine: 4MB,5GB,20GB
    python benchmarks/bench_e2e.py --device cpu         # no GPU: 4MB,50MB,1GB
        [--sizes 4MB,50MB,1GB] [--ns 8,64,128] [--dtypes float32,float64] [--data random,compressible]
        [--impls batchlu-cli,script,batchlu-client,script-client] [--client-sizes 4MB,50MB]
        [--repeat 1] [--chunks 32MiB|zarr] [--data-dir DIR] [--keep] [--out PATH]

**Inputs**: one Zarr v3 array (N, n, n) per (data, n, dtype, size), written by ``zarr.create_array``
with zarr's default codec (zstd) and no other setting but the chunks: ``--chunks 32MiB`` (the
default) cuts the first axis only, into chunks of about that many bytes, as issue 43's inputs were
written; ``--chunks zarr`` takes zarr's own guess, which also cuts the matrices themselves (zarr
3.1: (244141, 1, 1) for 1 GB of float64 8 x 8), so that the script's ``map_blocks`` inverts pieces
of matrices and its records fail the check. Sizes are bytes of matrices (``4MB`` = 4e6, ``1GiB``
= 2**30), N = size // (n * n * itemsize). Data ``random``: standard normal entries.
``compressible``: like measured or simulated fields: a smooth kernel that drifts slowly along the
batch, plus noise, rounded to 2 decimals (zstd: about 5x in float64, 4x in float32), its diagonal
raised to twice its row's sum (diagonally dominant: nonsingular, condition number about 2). Matrix
i depends only on (data, n, dtype, seed, i). Inputs are written in parallel pieces of whole chunks
(spawned processes, one per core); with ``--data-dir`` they stay there and a later call reuses an
input written with the same parameters; otherwise they live in a temporary folder and go once
their runs are done (``--keep`` keeps them and the last output of each impl).

**Impls**, each run on the same input, outputs deleted between runs:

* ``batchlu-cli``: ``batchlu run IN OUT --op inv``, no other flag, as a subprocess timed from its
  start to its exit; ``compute_s`` is the compute time of the report it prints (``report``: every
  part of the report's time line and of its task stages);
* ``script``: the hand-written script (:data:`CPU_SCRIPT`: two lines of dask + NumPy on dask's
  default threaded scheduler; :data:`GPU_SCRIPT`: ten lines of dask + CuPy on a LocalCUDACluster)
  written to a file and run as ``python script.py IN OUT``, timed the same way;
* ``batchlu-client`` and ``script-client``: the notebook case, for ``--client-sizes`` (default: the
  smallest and the second of ``--sizes``): one child process keeps one client up (``LocalCluster()``
  on the CPU, ``LocalCUDACluster()`` on the GPU, defaults) for the whole call and times
  ``batchlu.run(IN, OUT, op="inv", client=c)`` and the script's graph computed on that client, in
  turns, each twice per input (``run`` 1 and 2). The child ends before the larger inputs run.

Before the first timed run of each (n, dtype), the CLI runs once, untimed, on a small input of that n
and dtype: the first run on a machine compiles batchlu's kernels into their disk caches (numba on
the CPU, NVRTC on the GPU; a minute on a 2-core VM), which a user pays once. On a GPU machine it runs
twice, with the defaults (a small input computes on the CPU) and with ``--backend gpu``. (It also
brings the libraries the script imports into the page cache.)

Every output is checked before its time is trusted: LAPACK's inverse ratio (dget03,
``batchlu.testing.ratios.get03``) on 64 matrices drawn at random, below 30, and its shape and dtype
those of the input. A run that exits non-zero, or whose output fails, is recorded with
``ok: false`` and left out of the table.

**Records**, one per run, to ``--out`` (default ``benchmarks/results/e2e-<device>.json``: ``cpu``,
``h200``, ...): ``impl``, ``data``, ``n``, ``dtype``, ``bytes``, ``count``, ``chunks``, ``wall_s``,
``compute_s`` (null for the scripts), ``report``, ``run``, ``ok``, ``max_ratio``, ``device``,
``cores``, ``load`` (the 1-minute load average after the run: above ``cores`` means the machine was
shared), ``date``, ``commit`` (``git rev-parse --short HEAD``, ``-dirty`` when the product's code
differs from it). Records already in ``--out`` stay, but for the points this call measures again;
the file lists every command that wrote its records. A table at the end gives, per point, the CLI's
wall time, the script's and script / CLI (> 1: batchlu is faster).

The benchmark's own process creates no CUDA context: CuPy is imported only in the GPU script's text
and in the client child.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import datetime
import json
import multiprocessing as mp
import os
import platform
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
IMPLS = ("batchlu-cli", "script", "batchlu-client", "script-client")
CLIENT_IMPLS = ("batchlu-client", "script-client")
DATA = ("random", "compressible")
DTYPES = ("float32", "float64")
SIZES = {"gpu": "4MB,5GB,20GB", "cpu": "4MB,50MB,1GB"}
NS = (8, 64, 128)
SAMPLE = 64                 # matrices of each output checked with dget03
GENERATOR = 1               # version of the data kinds: a reused input must have been written by this one
GEN_BYTES = 8 << 20         # matrices are drawn in blocks of about this many bytes (float64)
PIECE_BYTES = 64 << 20      # a writer process writes whole chunks, about this many bytes at a time
WARM_BYTES = 256 << 10      # the untimed warm-up input
PREFIX = "E2E "             # the client child's replies

# The user's scripts: IN and OUT are their arguments.
CPU_SCRIPT = """\
import sys, dask.array as da, numpy as np
x = da.from_zarr(sys.argv[1]); da.to_zarr(x.map_blocks(np.linalg.inv, dtype=x.dtype), sys.argv[2])
"""

GPU_SCRIPT = """\
import sys
import cupy
import dask.array as da
from dask_cuda import LocalCUDACluster
from distributed import Client

if __name__ == "__main__":
    with LocalCUDACluster() as cluster, Client(cluster):
        x = da.from_zarr(sys.argv[1])
        x.map_blocks(cupy.asarray).map_blocks(cupy.linalg.inv).map_blocks(cupy.asnumpy).to_zarr(sys.argv[2])
"""

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_bytes(text: str) -> int:
    """``4MB`` -> 4_000_000, ``32MiB`` -> 33_554_432, ``1e6`` -> 1_000_000."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"Expected a size such as 4MB, 50MB, 1GB or 32MiB. Got {text!r} instead.")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def _choices(text: str, allowed, what: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in items if x not in allowed]
    if unknown or not items:
        raise argparse.ArgumentTypeError(f"Expected {what} among {', '.join(allowed)}. "
                                         f"Got {', '.join(unknown) or 'none'} instead.")
    return items


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench_e2e.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                        help="gpu: the GPU script and LocalCUDACluster; cpu: the NumPy script, and "
                             "CUDA_VISIBLE_DEVICES='' for every subprocess; auto: gpu where nvidia-smi "
                             "lists one")
    parser.add_argument("--sizes", default=None,
                        help=f"input sizes in bytes (default gpu {SIZES['gpu']}, cpu {SIZES['cpu']})")
    parser.add_argument("--ns", type=lambda s: [int(x) for x in s.split(",") if x], default=list(NS),
                        help="matrix orders (default 8,64,128)")
    parser.add_argument("--dtypes", type=lambda s: _choices(s, DTYPES, "dtypes"), default=list(DTYPES))
    parser.add_argument("--data", type=lambda s: _choices(s, DATA, "data kinds"), default=list(DATA))
    parser.add_argument("--impls", type=lambda s: _choices(s, IMPLS, "impls"), default=list(IMPLS))
    parser.add_argument("--client-sizes", default=None,
                        help="sizes of the client case (default: the smallest and the second of --sizes)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="timed runs of the CLI and of the script per input, in turns")
    parser.add_argument("--chunks", default="32MiB",
                        help="input chunks: a size (first axis only, about that many bytes per chunk) "
                             "or 'zarr' (zarr's own guess, which also cuts the matrices)")
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--data-dir", default=None,
                        help="keep the inputs here and reuse those written with the same parameters")
    parser.add_argument("--keep", action="store_true",
                        help="keep the inputs and each impl's last output (printed where)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed to one run")
    parser.add_argument("--commit", default=None,
                        help="the commit to record (default: git rev-parse --short HEAD)")
    parser.add_argument("--out", default=None, help="default benchmarks/results/e2e-<device>.json")
    parser.add_argument("--client-child", choices=("cpu", "gpu"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        if args.chunks != "zarr":
            parse_bytes(args.chunks)
        for text in filter(None, (args.sizes, args.client_sizes)):
            [parse_bytes(s) for s in text.split(",") if s]
    except ValueError as err:
        parser.error(str(err))
    if args.repeat < 1 or not args.ns or min(args.ns) < 1:
        parser.error(f"Expected --repeat >= 1 and orders >= 1. Got {args.repeat} and {args.ns} instead.")
    return args


# ---- the machine ----------------------------------------------------------------------------------

def gpu_names() -> list[str]:
    """The GPUs nvidia-smi lists (none where it is missing or CUDA_VISIBLE_DEVICES is empty); no CUDA
    context in this process."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe_device(device: str) -> tuple[str, str]:
    """(the record's ``device``, the short name of the default output file)."""
    if device == "cpu":
        return f"CPU: {cpu_model()}, {cores()} cores", "cpu"
    names = gpu_names()
    name = names[0] if names else "GPU"
    model = re.search(r"\b([A-Z]{1,2}\d{2,4})\b", name)
    return (name if len(names) <= 1 else f"{len(names)}x {name}"), (model.group(1).lower() if model else "gpu")


def git_commit() -> str | None:
    """HEAD's short hash, with ``-dirty`` where the product's code (not benchmarks/) differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=30)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src", "kernels", "pipeline", "workflows"],
                               cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
        return head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


# ---- inputs ---------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Input:
    data: str
    n: int
    dtype: str
    size: str          # as asked, e.g. "50MB"
    count: int
    chunks: str        # --chunks
    seed: int

    @property
    def nbytes(self) -> int:
        return self.count * self.n * self.n * np.dtype(self.dtype).itemsize

    @property
    def name(self) -> str:
        return f"{self.data}-n{self.n}-{self.dtype}-{self.count}x-{self.chunks}-s{self.seed}.zarr"

    def params(self) -> dict:
        return {"generator": GENERATOR, **dataclasses.asdict(self)}


def make_input(data: str, n: int, dtype: str, size: str, chunks: str, seed: int) -> Input:
    count = max(1, parse_bytes(size) // (n * n * np.dtype(dtype).itemsize))
    return Input(data, n, dtype, size, count, chunks, seed)


def chunk_shape(inp: Input) -> tuple[int, int, int] | None:
    """The chunks to ask zarr for: (C, n, n) of about ``--chunks`` bytes; None for zarr's guess."""
    if inp.chunks == "zarr":
        return None
    per = inp.n * inp.n * np.dtype(inp.dtype).itemsize
    return (max(1, min(inp.count, parse_bytes(inp.chunks) // per)), inp.n, inp.n)


def _block(data: str, n: int, dtype: str, first: int, count: int, rng) -> np.ndarray:
    """Matrices ``first`` .. ``first + count`` of a data kind (see the module's doc)."""
    if data == "random":
        return rng.standard_normal((count, n, n), dtype=np.float32 if dtype == "float32" else np.float64)
    t = ((first + np.arange(count)) * 0.013)[:, None, None]        # drifts slowly along the batch
    j, k = np.arange(n)[:, None], np.arange(n)[None, :]
    field = np.exp(-np.abs(j - k) / (0.1 * n + 1)) * (1 + 0.5 * np.sin(t)) \
        + 0.3 * np.cos(2 * np.pi * (j + 2 * k) / n + t)
    x = np.round(field + 0.01 * rng.standard_normal((count, n, n)), 2)
    d = np.arange(n)
    x[:, d, d] += 2 * np.ceil(np.abs(x).sum(axis=-1))                # diagonally dominant: nonsingular
    return x.astype(dtype)


def matrices(inp: Input, start: int, stop: int) -> np.ndarray:
    """Matrices ``start`` .. ``stop`` of ``inp``: drawn in blocks of fixed length, each block from its
    own generator, so that matrix i is the same however the input is cut into pieces."""
    per = max(1, GEN_BYTES // (inp.n * inp.n * 8))
    out = np.empty((stop - start, inp.n, inp.n), inp.dtype)
    for b in range(start // per, (stop - 1) // per + 1):
        lo = b * per
        x = _block(inp.data, inp.n, inp.dtype, lo, per, np.random.default_rng([inp.seed, inp.n, b]))
        s, e = max(lo, start), min(lo + per, stop)
        out[s - start:e - start] = x[s - lo:e - lo]
    return out


def _write_piece(path: str, inp: Input, start: int, stop: int) -> int:
    import zarr

    zarr.open_array(path, mode="r+")[start:stop] = matrices(inp, start, stop)
    return stop - start


def stored_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def write_input(path: Path, inp: Input) -> float | None:
    """Write ``inp`` at ``path`` with zarr's defaults (but the chunks of ``--chunks``); None where an
    input written with the same parameters is already there. Returns the seconds it took."""
    import zarr

    if (path / "zarr.json").exists():
        try:
            if zarr.open_array(str(path), mode="r").attrs.get("bench_e2e") == inp.params():
                return None
        except Exception:
            pass
    shutil.rmtree(path, ignore_errors=True)
    t0 = time.perf_counter()
    grid = chunk_shape(inp)
    arr = zarr.create_array(str(path), shape=(inp.count, inp.n, inp.n), dtype=inp.dtype,
                            **({"chunks": grid} if grid else {}))
    step = arr.chunks[0] * max(1, PIECE_BYTES // (arr.chunks[0] * inp.n * inp.n * np.dtype(inp.dtype).itemsize))
    pieces = [(s, min(s + step, inp.count)) for s in range(0, inp.count, step)]
    if len(pieces) == 1:
        _write_piece(str(path), inp, *pieces[0])
    else:
        piece_bytes = step * inp.n * inp.n * 8
        workers = max(1, min(cores(), len(pieces), _available_memory() // (4 * piece_bytes)))
        with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            done = sum(pool.map(_write_piece, *zip(*[(str(path), inp, s, e) for s, e in pieces])))
        assert done == inp.count, (done, inp.count)
    arr.attrs["bench_e2e"] = inp.params()   # last: a store cut short is written again
    return time.perf_counter() - t0


def _available_memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


# ---- checks and reports ---------------------------------------------------------------------------

def check_output(src: Path, out: Path, seed: int = 0) -> tuple[bool, float | None, str | None]:
    """(ok, the largest dget03 ratio, why not ok) of the inverses at ``out`` (a batchlu output group's
    ``inv``, or the script's array) of the input at ``src``, on :data:`SAMPLE` matrices drawn at
    random; the output's shape and dtype must be the input's."""
    import zarr

    from batchlu.testing.ratios import THRESHOLD, get03

    try:
        a = zarr.open_array(str(src), mode="r")
        node = zarr.open(str(out), mode="r")
        inv = node["inv"] if isinstance(node, zarr.Group) else node
    except Exception as err:
        return False, None, f"Expected an output at {out}. Got {type(err).__name__}: {err}"[:300]
    if inv.shape != a.shape or inv.dtype != a.dtype:
        return False, None, (f"Expected inverses of shape {a.shape} and dtype {a.dtype}. "
                             f"Got {inv.shape} {inv.dtype} instead.")
    idx = np.sort(np.random.default_rng(seed).choice(a.shape[0], size=min(SAMPLE, a.shape[0]), replace=False))
    ratio = float(get03(a.oindex[idx], inv.oindex[idx]).max())
    if not ratio < THRESHOLD:
        return False, ratio, f"Expected dget03 ratios below {THRESHOLD:g}. Got {ratio:.3g} instead."
    return True, ratio, None


_PART = re.compile(r"([a-z][a-z -]*?) (\d+(?:\.\d+)?) s\b")
_STEP = re.compile(r"([A-Za-z][A-Za-z /-]*?) (\d+(?:\.\d+)?)(?:,|$)")


def parse_report(text: str) -> dict | None:
    """The parts of the report ``batchlu run`` prints that say where the time went: ``phases_s``
    (its time line: import, plan, cluster start, warm-up, compute, finish, total), ``warm_up_s``
    and ``finish_s`` (the warm-up's parts: kernels, pinned slots, ...; the finish's: cluster close,
    checks, record; where the line names them), ``stages_s``
    (the task stages, summed over the tasks), ``status``, ``backends``, ``ok`` (matrices); None where
    there is no time line."""
    found = {}
    for line in text.splitlines():
        line = line.strip()
        if m := re.match(r"batchlu \S+: (\w+),", line):
            found["status"] = m.group(1)
        elif line.startswith("time:"):
            found["phases_s"] = {k.strip().replace(" ", "_").replace("-", "_"): float(v)
                                 for k, v in _PART.findall(line.split(":", 1)[1].split(";")[0])}
            if m := re.search(r"warm-up \d+(?:\.\d+)? s \(([^)]*)\)", line):   # its parts, by name
                found["warm_up_s"] = {k.strip(): float(v) for k, v in _STEP.findall(m.group(1))}
            if m := re.search(r"finish \d+(?:\.\d+)? s \(([^)]*)\)", line):
                found["finish_s"] = {k.strip(): float(v) for k, v in _STEP.findall(m.group(1))}
        elif line.startswith("task stages"):
            found["stages_s"] = {k.strip(): float(v) for k, v in _PART.findall(line.split(":", 1)[1])}
        elif line.startswith("backend "):
            found["backends"] = line.split("->", 1)[-1].strip()
        elif m := re.match(r"ok ([\d,]+)\b", line):
            found["ok"] = int(m.group(1).replace(",", ""))
    return found if "phases_s" in found else None


def report_of(report) -> dict:
    """The same parts from a :class:`batchlu.pipeline.Report` (the client case)."""
    return {"status": report.status, "backends": ", ".join(report.backends), "ok": report.ok,
            "phases_s": {"plan": round(report.plan, 3), "cluster_start": round(report.cluster_start, 3),
                         "warm_up": round(report.warmup, 3), "compute": round(report.elapsed, 3),
                         "finish": round(report.finish, 3), "total": round(report.wall, 3)},
            "warm_up_s": {k: round(v, 3) for k, v in report.warmup_steps.items()},
            "finish_s": {k: round(v, 3) for k, v in report.finish_steps.items()},
            "stages_s": {k: round(getattr(report, f"{k}_s"), 3) for k in ("read", "compute", "write")}}


# ---- the runs -------------------------------------------------------------------------------------

def batchlu_command() -> str:
    here = Path(sys.executable).with_name("batchlu")
    found = str(here) if here.exists() else shutil.which("batchlu")
    if not found:
        raise SystemExit(f"Expected the batchlu command beside {sys.executable} or on PATH. Got none "
                         "instead: pip install -e . first.")
    return found


def timed_subprocess(cmd: list[str], env: dict, cwd: Path, timeout: float) -> dict:
    """Run ``cmd`` in a session of its own; its wall time from start to exit, exit status and output.
    Past ``timeout`` its whole process group is killed (a cluster's workers too)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, _ = proc.communicate()
        rc, stderr = None, f"timed out after {timeout:g} s"
    return {"wall_s": time.perf_counter() - t0, "rc": rc, "stdout": stdout, "stderr": stderr}


class ClientCase:
    """The notebook case: one child process (this script, ``--client-child``) holding one client for
    the whole call, asked one run at a time over a pipe (one JSON line each way)."""

    def __init__(self, device: str, env: dict, cwd: Path, timeout: float):
        self.device, self.env, self.cwd, self.timeout = device, env, cwd, timeout
        self.proc = self.log_file = None
        self.log = cwd / "client-child.log"

    def _start(self) -> None:
        self.log_file = self.log.open("w")
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--client-child", self.device],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log_file,
                                     text=True, env=self.env, cwd=self.cwd, start_new_session=True)
        ready = self._reply()
        print(f"# client case: {ready.get('cluster', '?')} up in {ready.get('start_s', float('nan')):.1f} s",
              flush=True)

    def _reply(self) -> dict:
        while True:
            ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
            line = self.proc.stdout.readline() if ready else ""
            if not line:
                tail = self.log.read_text()[-2000:] if self.log.exists() else ""
                self.close()
                raise RuntimeError(f"Expected a reply from the client child. Got {'none in time' if not ready else 'its exit'}"
                                   f" instead; its log ends:\n{tail}")
            if line.startswith(PREFIX):
                return json.loads(line[len(PREFIX):])

    def run(self, impl: str, src: Path, out: Path) -> dict:
        if self.proc is None:
            self._start()
        self.proc.stdin.write(json.dumps({"impl": impl, "input": str(src), "output": str(out)}) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=120)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGKILL)   # its cluster's workers too
            self.proc = None
            self.log_file.close()


def client_child(device: str) -> None:
    """The child of :class:`ClientCase`: start the cluster (defaults), then for each request time
    ``batchlu.run(..., client=c)`` or the script's graph on the same client. Replies go to the
    original stdout; everything the libraries print goes to stderr (the child's log)."""
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def reply(**fields):
        proto.write(PREFIX + json.dumps(fields) + "\n")
        proto.flush()

    import dask.array as da
    from distributed import Client

    import batchlu

    t0 = time.perf_counter()
    if device == "gpu":
        import cupy
        from dask_cuda import LocalCUDACluster

        cluster = LocalCUDACluster()

        def script(src, out):
            x = da.from_zarr(src)
            x.map_blocks(cupy.asarray).map_blocks(cupy.linalg.inv).map_blocks(cupy.asnumpy).to_zarr(out)
    else:
        from distributed import LocalCluster

        cluster = LocalCluster()

        def script(src, out):
            x = da.from_zarr(src)
            da.to_zarr(x.map_blocks(np.linalg.inv, dtype=x.dtype), out)

    client = Client(cluster)
    reply(cluster=f"{type(cluster).__name__}, {len(cluster.workers)} workers",
          start_s=time.perf_counter() - t0)
    for line in sys.stdin:
        ask = json.loads(line)
        t = time.perf_counter()
        try:
            if ask["impl"] == "batchlu-client":
                report = batchlu.run(ask["input"], ask["output"], op="inv", client=client)
                reply(wall_s=time.perf_counter() - t, report=report_of(report), compute_s=report.elapsed)
            else:
                script(ask["input"], ask["output"])
                reply(wall_s=time.perf_counter() - t)
        except Exception as err:
            reply(wall_s=time.perf_counter() - t, error=f"{type(err).__name__}: {err}"[:2000])
    client.close()
    cluster.close()


# ---- the benchmark --------------------------------------------------------------------------------

def summary(records: list[dict]) -> str:
    """Per (size, n, dtype, data): the median wall time of the ok runs of the CLI and of the script,
    script / CLI (> 1: batchlu is faster), the CLI's compute time (its report's); then the client
    case, run by run."""
    def med(rs, key="wall_s"):
        values = [r[key] for r in rs if r["ok"] and r.get(key) is not None]
        return statistics.median(values) if values else None

    def cell(x, width=8):
        return f"{x:{width}.2f}" if x is not None else f"{'-':>{width}}"

    points: dict[tuple, dict[str, list]] = {}
    for r in records:
        key = (parse_bytes(r["size"]), r["n"], r["dtype"], r["data"])
        points.setdefault(key, {}).setdefault(r["impl"], []).append(r)
    head = f"{'size':>7} {'n':>4} {'dtype':<8} {'data':<13}"
    lines = ["", "wall seconds from process start to exit (median of the ok runs); ratio = script / CLI, "
             "> 1: batchlu faster", f"{head} {'CLI':>8} {'script':>8} {'ratio':>6} {'compute':>8}  ok: CLI, script"]
    client = []
    for key, by in sorted(points.items()):
        size, n, dtype, data = key
        label = f"{next(iter(by.values()))[0]['size']:>7} {n:>4} {dtype:<8} {data:<13}"
        if any(i in by for i in CLIENT_IMPLS):
            client.append((label, by))
        cli, scr = by.get("batchlu-cli", []), by.get("script", [])
        if cli or scr:
            c, s = med(cli), med(scr)
            lines.append(f"{label} {cell(c)} {cell(s)} {cell(s / c if c and s else None, 6)} "
                         f"{cell(med(cli, 'compute_s'))}  {sum(r['ok'] for r in cli)}/{len(cli)}, "
                         f"{sum(r['ok'] for r in scr)}/{len(scr)}")
    if client:
        lines += ["", "client case (one client kept up): wall seconds of run 1 and run 2; ratio of the "
                  "second runs, script / batchlu", f"{head} {'batchlu 1':>10} {'batchlu 2':>10} "
                  f"{'script 1':>9} {'script 2':>9} {'ratio':>6}"]
        for label, by in client:
            runs = {(impl, r["run"]): r["wall_s"] if r["ok"] else None
                    for impl in CLIENT_IMPLS for r in by.get(impl, [])}
            b2, s2 = runs.get(("batchlu-client", 2)), runs.get(("script-client", 2))
            lines.append(f"{label} {cell(runs.get(('batchlu-client', 1)), 10)} {cell(b2, 10)} "
                         f"{cell(runs.get(('script-client', 1)), 9)} {cell(s2, 9)} "
                         f"{cell(s2 / b2 if b2 and s2 else None, 6)}")
    return "\n".join(lines)


def save(out: Path, command: str, records: list[dict]) -> None:
    """Records already in ``out`` stay, but for the points (impl, data, n, dtype, bytes, chunks) of
    ``records``; the file lists every command that wrote its records."""
    def key(r):
        return r["impl"], r["data"], r["n"], r["dtype"], r["bytes"], r.get("chunks_setting")

    before = json.loads(out.read_text()) if out.exists() else {}
    again = {key(r) for r in records}
    kept = [r for r in before.get("records", []) if key(r) not in again]
    commands = before.get("commands", []) if kept else []
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"commands": commands + [command] if command not in commands else commands,
                               "records": kept + records}, indent=1) + "\n")


def main(argv=None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.client_child:
        client_child(args.client_child)
        return []
    device = args.device if args.device != "auto" else ("gpu" if gpu_names() else "cpu")
    device_label, short = describe_device(device)
    sizes = [s for s in (args.sizes or SIZES[device]).split(",") if s]
    by_bytes = sorted(sizes, key=parse_bytes)
    client_sizes = {parse_bytes(s) for s in args.client_sizes.split(",") if s} if args.client_sizes \
        else {parse_bytes(s) for s in by_bytes[:2]}
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"e2e-{short}.json"
    commit = args.commit or git_commit()
    env = dict(os.environ)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""     # batchlu's backend auto would take a GPU where there is one
    work = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    data_dir = Path(args.data_dir) if args.data_dir else work / "inputs"
    data_dir.mkdir(parents=True, exist_ok=True)
    script = work / "script.py"
    script.write_text(GPU_SCRIPT if device == "gpu" else CPU_SCRIPT)
    cli = batchlu_command()
    command = "python benchmarks/bench_e2e.py " + " ".join(argv)
    print(f"# {device_label}; commit {commit}; load {os.getloadavg()[0]:.2f}; work {work}; inputs {data_dir}",
          flush=True)
    clients = ClientCase(device, env, work, args.timeout)
    records: list[dict] = []
    warmed: set[tuple] = set()
    try:
        for size in by_bytes:
            for n in args.ns:
                for dtype in args.dtypes:
                    for data in args.data:
                        inp = make_input(data, n, dtype, size, args.chunks, args.seed)
                        _point(args, inp, data_dir, work, script, cli, env, clients, client_sizes, warmed,
                               device, lambda rec: _record(rec, records, out, command, device_label, commit))
            if parse_bytes(size) >= max(client_sizes, default=0):
                clients.close()   # its cluster's workers idle no more beside the larger runs
    finally:
        clients.close()
        if args.keep:
            print(f"# kept {work}" + (f" and {data_dir}" if args.data_dir else ""))
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(summary(records))
    print(f"# wrote {out}")
    return records


def _record(rec: dict, records: list, out: Path, command: str, device_label: str, commit: str | None) -> None:
    rec.update(device=device_label, cores=cores(), load=round(os.getloadavg()[0], 2),
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), commit=commit)
    records.append(rec)
    save(out, command, records)
    status = "ok" if rec["ok"] else f"FAILED: {rec.get('error')}"
    compute = f", compute {rec['compute_s']:.2f} s" if rec.get("compute_s") is not None else ""
    print(f"{rec['impl']:<15} {rec['data']:<13} n={rec['n']:<4} {rec['dtype']:<8} {rec['bytes']:>14,} B "
          f"run {rec['run']}: {rec['wall_s'] if rec['wall_s'] is None else format(rec['wall_s'], '.2f')} s{compute}, "
          f"load {rec['load']}; {status}", flush=True)


def _point(args, inp: Input, data_dir: Path, work: Path, script: Path, cli: str, env: dict,
           clients: ClientCase, client_sizes: set, warmed: set, device: str, record) -> None:
    """Every impl on one input: written (or reused), warmed up for its (n, dtype), run, checked."""
    src = data_dir / inp.name
    seconds = write_input(src, inp)
    ratio = inp.nbytes / max(1, stored_bytes(src))
    import zarr

    chunks = list(zarr.open_array(str(src), mode="r").chunks)
    print(f"# input {src.name}: {inp.count:,} x {inp.n}x{inp.n} {inp.dtype}, {inp.nbytes:,} B, chunks {chunks}, "
          f"zstd {ratio:.2f}x, " + ("reused" if seconds is None else f"written in {seconds:.1f} s"), flush=True)

    def run_one(impl: str, source: Path = src, k: int = 0, flags: tuple = ()) -> dict:
        target = work / f"out-{impl}.zarr"
        shutil.rmtree(target, ignore_errors=True)
        if impl in CLIENT_IMPLS:
            try:
                result = clients.run(impl, source, target)
            except RuntimeError as err:     # the child died or hung: this run fails, the next starts another
                result = {"wall_s": None, "error": str(err)[-1500:]}
            ok = "error" not in result
        else:
            cmd = [cli, "run", str(source), str(target), "--op", "inv", *flags] if impl == "batchlu-cli" \
                else [sys.executable, str(script), str(source), str(target)]
            result = timed_subprocess(cmd, env, work, args.timeout)
            ok = result["rc"] == 0
            if not ok:
                result["error"] = f"exit {result['rc']}: {(result['stderr'] or result['stdout']).strip()[-1500:]}"
            if impl == "batchlu-cli":
                report = parse_report(result["stdout"])
                result["report"] = report
                result["compute_s"] = report["phases_s"].get("compute") if report else None
                if ok and report is None:
                    print(f"# warning: no time line in the CLI's report:\n{result['stdout'][-1000:]}", flush=True)
        if ok and result.get("report") and result["report"].get("status", "complete") != "complete":
            ok, result["error"] = False, f"batchlu's report says {result['report']['status']}"
        if ok:
            ok, result["max_ratio"], why = check_output(source, target, seed=k)
            if why:
                result["error"] = why
        result["ok"] = ok
        if not args.keep:
            shutil.rmtree(target, ignore_errors=True)
        return result

    if (inp.n, inp.dtype) not in warmed and {"batchlu-cli", "batchlu-client"} & set(args.impls):
        warmed.add((inp.n, inp.dtype))   # the first run on a machine compiles the kernels into their disk caches
        small = make_input("random", inp.n, inp.dtype, str(WARM_BYTES), inp.chunks, inp.seed)
        write_input(work / small.name, small)
        # the small input runs on the CPU (backend auto); on a GPU machine the GPU's kernels are
        # compiled too, as a user's earlier larger run would have
        for flags in ((),) if device == "cpu" else ((), ("--backend", "gpu")):
            result = run_one("batchlu-cli", work / small.name, flags=flags)
            print(f"# warm-up batchlu-cli {' '.join(flags)} n={inp.n} {inp.dtype}: {result['wall_s']:.1f} s"
                  + ("" if result["ok"] else f" (failed: {result.get('error')})"), flush=True)
        shutil.rmtree(work / small.name, ignore_errors=True)

    base = {"data": inp.data, "n": inp.n, "dtype": inp.dtype, "bytes": inp.nbytes, "count": inp.count,
            "size": inp.size, "chunks": chunks, "chunks_setting": inp.chunks, "input_zstd_ratio": round(ratio, 3)}
    fields = ("wall_s", "compute_s", "report", "ok", "max_ratio", "error")

    def keep(impl, run, result):
        rec = {"impl": impl, **base, "run": run, **{f: result.get(f) for f in fields}}
        rec["wall_s"], rec["compute_s"] = (None if x is None else round(x, 3) for x in (rec["wall_s"], rec["compute_s"]))
        record(rec)

    for rep in range(1, args.repeat + 1):
        for impl in [i for i in ("batchlu-cli", "script") if i in args.impls]:
            keep(impl, rep, run_one(impl, k=rep))
    if parse_bytes(inp.size) in client_sizes:
        for rep in (1, 2):
            for impl in [i for i in CLIENT_IMPLS if i in args.impls]:
                keep(impl, rep, run_one(impl, k=rep))
    if not args.data_dir and not args.keep:
        shutil.rmtree(src, ignore_errors=True)


if __name__ == "__main__":
    main()
