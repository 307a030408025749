"""How many threads one call of the CPU backend's compiled engine uses, and the pool that runs them.

The rule (first that applies):

1. inside ``with batchlu.kernels.cpu_threads(k):`` the calling thread uses ``k`` threads (the
   setting is per calling thread);
2. the environment variable ``BATCHLU_CPU_THREADS=k``;
3. the main thread uses every core the process may run on (``os.sched_getaffinity``); any other
   thread uses 1.

Rule 3 is for the callers that already run side by side: a Dask worker runs one batch per worker
thread (``batchlu.pipeline``'s ``HostEngine``), so each of them computing on one core fills the
worker's cores without oversubscribing them; a script calling ``batchlu.kernels`` from its main
thread gets the whole machine.

A call splits its batch into contiguous ranges, runs one range on the calling thread and the
others on a shared pool; a batch too small to repay the hand-off (about 0.2 ms of work per thread)
stays on the calling thread. The compiled kernels release the GIL, so the ranges run in parallel.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading

from batchlu.errors import ConfigError


__all__ = ["ENV", "cpu_threads", "run", "run_parts", "threads"]

ENV = "BATCHLU_CPU_THREADS"
MIN_WORK = 1 << 20     # per thread, in units of (n + 4)**3 per matrix (~0.25 ns each, measured)

_local = threading.local()
_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:   # not on Linux
        return max(1, os.cpu_count() or 1)


def _positive(value, what: str) -> int:
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
        raise ConfigError(f"Expected {what} to be a positive integer. Got {value!r} instead.")
    return int(text)


@contextlib.contextmanager
def cpu_threads(count: int):
    """Within the block, CPU-backend calls made by this thread use ``count`` threads."""
    count = _positive(count, "the CPU thread count")
    before = getattr(_local, "count", None)
    _local.count = count
    try:
        yield
    finally:
        _local.count = before


def threads() -> int:
    """Threads a CPU-backend call made now by this thread uses (the rule in the module docstring)."""
    count = getattr(_local, "count", None)
    if count is not None:
        return count
    env = os.environ.get(ENV, "").strip()
    if env:
        return _positive(env, ENV)
    if threading.current_thread() is threading.main_thread():
        return _cores()
    return 1


def _get_pool(size: int) -> concurrent.futures.ThreadPoolExecutor:
    """A pool of at least ``size`` threads. A larger one replaces a smaller one, which is not shut
    down: another caller may still be submitting to it (its idle threads end with the process)."""
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < size:
            _pool = concurrent.futures.ThreadPoolExecutor(size, thread_name_prefix="batchlu-cpu")
            _pool_size = size
        return _pool


def _forget_pool() -> None:   # a forked child has the pool object but not its threads
    global _pool, _pool_size
    _pool, _pool_size = None, 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def run(kernel, count: int, n: int, *args, align: int = 1) -> None:
    """``kernel(*args, lo, hi)`` over ``[0, count)``, split into ranges on up to :func:`threads`
    threads; every range but the last starts and ends on a multiple of ``align``."""
    run_parts(kernel, min(threads(), count, max(1, count * (n + 4) ** 3 // MIN_WORK)), count, *args,
              align=align)


def run_parts(kernel, parts: int, count: int, *args, align: int = 1) -> None:
    """``kernel(*args, lo, hi)`` over ``[0, count)`` split into ``parts`` ranges (at most
    :func:`threads` of them wanted by the caller), one on the calling thread; range bounds are
    multiples of ``align`` (but the end of the last)."""
    parts = min(parts, -(-count // align))
    if parts <= 1:
        kernel(*args, 0, count)
        return
    groups = -(-count // align)
    bounds = [min(count, groups * i // parts * align) for i in range(parts + 1)]
    pool = _get_pool(parts - 1)
    futures = [pool.submit(kernel, *args, bounds[i], bounds[i + 1]) for i in range(1, parts)]
    kernel(*args, bounds[0], bounds[1])
    for future in futures:
        future.result()
