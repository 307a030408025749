"""What the kernel benchmarks share: timing a case, compiling ahead in parallel, random input, bitwise
comparison, and the source of a kernel family at a git revision (for A/B runs).

A sibling module of the ``bench_*.py`` scripts: running ``python benchmarks/bench_x.py`` puts this
folder first on ``sys.path``. CuPy is imported inside the functions, so the scripts' ``--help`` works
without a GPU.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def time_case(case, reps: int) -> float:
    """Median milliseconds of ``case.run()`` over ``reps`` runs, each after ``case.prepare(r)`` (fresh
    input, untimed) and a 256 MB write that evicts the L2 cache; two warm-up runs first. CUDA events
    on the null stream, or the host clock around a call that blocks (``case.sync == "block"``)."""
    import cupy

    scrub = cupy.empty(1 << 26, np.float32)
    case.prepare(0)
    case.run()
    case.prepare(1)
    case.run()
    cupy.cuda.Device().synchronize()
    times = []
    for r in range(reps):
        case.prepare(r)
        scrub.fill(r)
        if case.sync == "events":
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            case.run()
            end.record()
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end))
        else:
            cupy.cuda.Device().synchronize()
            t0 = time.perf_counter()
            case.run()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def precompile(compile_fn, jobs, processes: int = 16) -> None:
    """``compile_fn`` over ``jobs`` in spawned processes (CuPy's disk cache keeps the binaries for
    this process), printing each job's report line and the total time."""
    t0 = time.time()
    with cf.ProcessPoolExecutor(processes, mp_context=mp.get_context("spawn")) as ex:
        for r in ex.map(compile_fn, jobs):
            print("compiled", r, flush=True)
    print(f"compile {len(jobs)} in {time.time() - t0:.0f}s", flush=True)


def random_batch(shape, dtype, seed: int):
    """CuPy array of ``shape``, entries uniform in [-1, 1) (complex: both parts)."""
    import cupy

    rng = cupy.random.default_rng(seed)
    dtype = np.dtype(dtype)
    x = (rng.random(shape) * 2 - 1).astype(dtype)
    if dtype.kind == "c":
        x = (x + 1j * (rng.random(shape) * 2 - 1)).astype(dtype)
    return x


def same_bits(x, y) -> bool:
    """Every pair of arrays of ``x`` and ``y`` equal bit for bit."""
    import cupy

    return all(bool(cupy.array_equal(p.view(np.uint8), q.view(np.uint8))) for p, q in zip(x, y))


def old_source(family: str, rev: str, path: str | None = None) -> str:
    """The source of kernel family ``family`` at git revision ``rev`` (``path`` in that revision:
    default ``kernels/cuda/<family>.cu``), or the text of the file ``rev`` (the GPU machine's copy of
    the repository may have no .git). A text from before the kernels moved into namespace ``blu``
    (no ``namespace blu {`` in it) is wrapped in it, so that the kernel names are the current ones."""
    if Path(rev).is_file():
        text = Path(rev).read_text()
    else:
        path = path or f"kernels/cuda/{family}.cu"
        done = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"Expected {path} at revision {rev!r}. Got: {done.stderr.strip()}")
        text = done.stdout
    if "namespace blu {" not in text:
        text = f'#include "common.cuh"\nnamespace blu {{\n{text}\n}}  // namespace blu\n'
    return text
