"""What the kernel benchmarks share: checking a case's output (LAPACK test ratios) and timing it,
compiling ahead in parallel, random input, tile names, bitwise comparison, and the source of a kernel
family at a git revision (for A/B runs).

A sibling module of the ``bench_*.py`` scripts: running ``python benchmarks/bench_x.py`` puts this
folder first on ``sys.path``. CuPy is imported inside the functions, so the scripts' ``--help`` works
without a GPU.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import re
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

# Matrices of a case's output judged by the LAPACK test ratios before it is timed.
CHECK_COUNT = 32


class PeerUnavailable(Exception):
    """A peer that cannot run a point for a structural reason (a package missing, a dtype or size it
    does not support); the benchmark records the one-line reason instead of a time."""


class WrongResult(Exception):
    """A case whose output failed its LAPACK test ratio: it is not timed."""


def check_case(case) -> float | None:
    """Run ``case`` once on input set 0 with its outputs poisoned (NaN; -7 for integer arrays) and
    return the largest LAPACK test ratio its ``check`` finds on the first :data:`CHECK_COUNT`
    matrices; raise :class:`WrongResult` if that is not below the threshold (NaN included). None for
    a case without a check."""
    from batchlu.testing.ratios import THRESHOLD

    if case.check is None:
        return None
    case.prepare(0)
    for x in case.outputs:
        x.fill(-7 if np.dtype(x.dtype).kind in "iu" else np.nan)
    case.run()
    try:
        ratio = float(case.check(0))
    except ValueError as err:  # e.g. a pivot index out of range (an unwritten, poisoned piv)
        raise WrongResult(f"Expected an output the LAPACK test ratios can judge. Got: {err}") from None
    if not ratio < THRESHOLD:
        raise WrongResult(f"Expected LAPACK test ratios below {THRESHOLD:g} on the first {CHECK_COUNT} "
                          f"matrices. Got {ratio:.3g} instead.")
    return ratio


def host(x, count: int = CHECK_COUNT) -> np.ndarray:
    """The first ``count`` entries of ``x`` (CuPy, torch, JAX or NumPy) as a NumPy array."""
    x = x[:count]
    if hasattr(x, "get"):  # CuPy
        return x.get()
    if hasattr(x, "detach"):  # torch
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _t(x: np.ndarray) -> np.ndarray:
    return np.swapaxes(x, -1, -2)


def lu_ratio(a, lu, piv, *, one_based: bool = False, transposed: bool = False) -> float:
    """Largest get01 over the first matrices of an LU factorization of ``a``: ``piv`` 1-based
    (LAPACK) or 0-based (SciPy); ``transposed``: ``lu`` is the factorization of ``a``'s transpose
    held column-major (cuBLAS on our C-order buffers), i.e. its C-order buffer read as ``lu^T``."""
    from batchlu.testing.ratios import get01

    a, lu, piv = host(a), host(lu), host(piv).astype(np.int64)
    if transposed:
        a, lu = _t(a), _t(lu)
    return float(get01(a, lu, piv - 1 if one_based else piv).max())


def inv_ratio(a, ainv) -> float:
    """Largest get03 over the first matrices of ``ainv`` against ``a``."""
    from batchlu.testing.ratios import get03

    return float(get03(host(a), host(ainv)).max())


def solve_ratio(a, x, b) -> float:
    """Largest get02 over the first matrices of ``a x = b``."""
    from batchlu.testing.ratios import get02

    return float(get02(host(a), host(x), host(b)).max())


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


def event_ms(fn, reps: int, prepare=None) -> float:
    """Median milliseconds of ``fn()`` over ``reps`` CUDA-event timings on the null stream, each after
    ``prepare()`` (untimed) where one is given; no warm-up, no cache scrub (A/B and latency probes)."""
    import cupy

    times = []
    for _ in range(reps):
        if prepare:
            prepare()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def precompile(compile_fn, jobs, processes: int = 16) -> None:
    """``compile_fn`` over ``jobs`` in spawned processes (CuPy's disk cache keeps the binaries for
    this process), printing each job's report line and the total time."""
    t0 = time.time()
    with cf.ProcessPoolExecutor(processes, mp_context=mp.get_context("spawn")) as ex:
        for r in ex.map(compile_fn, jobs):
            print("compiled", r, flush=True)
    print(f"compile {len(jobs)} in {time.time() - t0:.0f}s", flush=True)


def compile_report(label: str, family: str, name: str) -> str:
    """Compile (or load) kernel ``name`` of ``family``: a report line with ``label`` and the seconds it
    took, or the error (a sweep goes on without that candidate)."""
    from batchlu.kernels import tuning

    t0 = time.time()
    try:
        tuning.compile_kernels(family, [name])
    except Exception as e:
        return f"{label}: {type(e).__name__} {str(e)[-300:]}"
    return f"{label} {time.time() - t0:.1f}s"


def tile_of(path: str) -> tuple[int, ...]:
    """The integers of a path name's tile: ``fused-12x8x3x5x1`` -> (12, 8, 3, 5, 1)."""
    return tuple(int(x) for x in path.split("-")[1].split("x"))


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


def _git_show(rev: str, path: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True)


_LOCAL_INCLUDE = re.compile(r'^[ \t]*#include "([\w.]+\.cuh)"[ \t]*$', re.M)


def _inline_headers(text: str, rev: str, seen: set[str]) -> str:
    """``text`` with each ``#include "X.cuh"`` replaced by kernels/cuda/X.cuh at ``rev`` (itself so
    inlined), each header once; an include of a header ``rev`` lacks stays (the working tree's)."""
    def one(m):
        name = m.group(1)
        if name in seen:
            return f"// {name}: inlined above"
        header = _git_show(rev, f"kernels/cuda/{name}")
        if header.returncode != 0:
            return m.group(0)
        seen.add(name)
        return f"// ---- {name} at {rev}\n{_inline_headers(header.stdout, rev, seen)}\n// ---- end of {name}"
    return _LOCAL_INCLUDE.sub(one, text)


def old_source(family: str, rev: str, path: str | None = None) -> str:
    """The source of kernel family ``family`` at git revision ``rev`` (``path`` in that revision:
    default ``kernels/cuda/<family>.cu``), with the headers it includes (``common.cuh``, ``rows.cuh``)
    inlined as they were at ``rev``, so that a change to a header compares like the family's own; or
    the text of the file ``rev`` as it is (the GPU machine's copy of the repository has no .git: write
    the file here with ``bench_kernel_ab.py --save``). A text from before the kernels moved into
    namespace ``blu`` (no ``namespace blu {`` in it) is wrapped in it, so that the kernel names are the
    current ones."""
    if Path(rev).is_file():
        text = Path(rev).read_text()
    else:
        path = path or f"kernels/cuda/{family}.cu"
        done = _git_show(rev, path)
        if done.returncode != 0:
            raise SystemExit(f"Expected {path} at revision {rev!r}. Got: {done.stderr.strip()}")
        if "namespace blu {" not in done.stdout:
            return f'#include "common.cuh"\nnamespace blu {{\n{done.stdout}\n}}  // namespace blu\n'
        return _inline_headers(done.stdout, rev, set())
    if "namespace blu {" not in text:
        text = f'#include "common.cuh"\nnamespace blu {{\n{text}\n}}  // namespace blu\n'
    return text
