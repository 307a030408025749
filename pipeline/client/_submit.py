"""The run's tasks on the cluster: connect (or start the embedded cluster), decide the backend and the
codecs, set the workers up (:mod:`batchlu.pipeline.client._warmup`), submit one task per run of output
chunks, and sum what they report into the run's :class:`batchlu.pipeline.client._report.Report` as
they finish, with the progress bar (:mod:`batchlu.pipeline.client._progress`).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time

from .._plan import merge_tasks
from ..cluster import _connect, _devices
from ..errors import BatchluError, FencedError
from ..worker._tasks import Job, process_range
from . import _progress
from ._report import Report

__all__ = ["HOST_TASKS_PER_THREAD", "TASKS_PER_LANE", "submit"]

TASKS_PER_LANE = 2   # GPU codec path: tasks per lane (pipeline.codecs._gpu.LANES per worker) after merging
# The host path on GPU workers: tasks per worker thread after merging. A task of one chunk reads,
# computes and writes it in turn; one of a few chunks overlaps its own batches too, which keeps more
# requests in the I/O processes (docs/performance.md, "No regression of the host path").
HOST_TASKS_PER_THREAD = 4


# cluster.processes auto: the embedded CPU cluster's workers are threads of this process up to this
# many bytes of input (a process start costs more than the run), processes above (the threads'
# compute phase is bound by the GIL). 2-core VM, 1 GB: threads 8.5-9.3 s, processes 8.4-9.5 s from
# start to exit; 4-50 MB: threads 3.0-4.3 s, processes 4.0-4.9 s (docs/performance.md, end to end).
THREADS_UP_TO = 1 << 30

# backend auto, embedded cluster, dense ops: the CPU backend for inputs of up to this many bytes per
# thread it would run (the usable cores, or the threads configured), the GPU above. The embedded GPU
# cluster costs a run 6-8 s before its first task, while the CPU backend takes 1 GB of `inv` in 4-8 s
# on 2 cores from start to exit (~0.1 GB/s per core, n = 8-128). Measured on a 16-core H100 host
# (docs/performance.md, end to end), from start to exit, CPU against --backend gpu: 8 MB (float64
# n = 32) 1.9 s / 7.4-8.1 s; float64 n = 64, 1 GB 3.1 / 11.4 s, 2 GB 6.1 / 10.8 s. A sparse op's cost
# per byte of values depends on its pattern's fill, not on its size: those stay on the GPU.
# `--backend gpu`, or GPUs named (`--gpus`), insist.
CPU_AUTO_BYTES_PER_CORE = 128 << 20


def cpu_pays(job: Job, nbytes: int, threads: int) -> bool:
    """Whether backend auto takes the CPU for ``job`` of ``nbytes`` of input on a machine with GPUs,
    the CPU backend running ``threads`` threads (:data:`CPU_AUTO_BYTES_PER_CORE` per thread)."""
    return job.symbolic is None and nbytes <= CPU_AUTO_BYTES_PER_CORE * max(1, int(threads))


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity and cgroup quota: a Slurm or container
    allocation, ``taskset``), as dask counts them, and distributed's LocalCluster by default."""
    from dask.system import cpu_count

    return max(1, int(cpu_count()))


def job_bytes(job: Job) -> int:
    """Bytes of the run's input and right-hand sides (from their metadata)."""
    from ..worker._batches import input_bytes

    source = job.input.open("r")
    rhs = job.rhs.open("r") if job.rhs is not None else None
    return input_bytes(source, rhs) * int(source.shape[0])


def submit(job: Job, tasks, report: Report, opts, show: bool, **connect) -> None:
    """Run ``tasks`` (chunk ranges) of ``job`` on the cluster ``connect`` names (a client, a
    scheduler, or none: the embedded one), filling ``report`` in."""
    from . import _warmup

    t0 = time.perf_counter()
    embedded = all(value is None for value in connect.values())
    if embedded:
        # the embedded cluster is built for one backend, decided here once: it is the tasks' too
        nbytes = job_bytes(job)
        backend = _devices.resolve_embedded(opts.backend, opts.cluster.gpus)
        threads = pool_threads(opts.cluster.n_workers, opts.cluster.threads_per_worker)
        if backend == "gpu" and opts.backend == "auto" and opts.cluster.gpus is None and cpu_pays(job, nbytes, threads):
            backend = "cpu"
            report.backend_note = (f"{nbytes / 1e6:,.1f} MB of input: the CPU is done before GPU workers "
                                   f"would start; --backend gpu insists")
        opts = opts.replace(backend=backend)
        if opts.cluster.processes is None:   # auto: threads of this process for small inputs
            processes = nbytes > THREADS_UP_TO
            opts = opts.replace(cluster=dataclasses.replace(opts.cluster, processes=processes))
        if _in_process(opts):
            _run_in_process(job, tasks, report, opts, show, t0)
            return
    computed = None
    with _connect.connect(opts, **connect) as client, _connect.performance_report(opts.performance_report):
        dashboard = _connect.dashboard_link(client)
        if embedded and _connect.dashboard_address(opts) is None:
            dashboard = None   # distributed's health routes, not a dashboard: no link to show
        # the report keeps the link of a cluster that outlives the run only: the embedded one stops
        # when the run returns (the progress line shows its link while it runs)
        report.dashboard = None if embedded else dashboard
        started = time.perf_counter()
        report.cluster_start = started - t0
        # cpu asks nothing; else one probe of the workers: the tasks get cpu or gpu (gpu fails here,
        # before any task, where a worker has none)
        job = dataclasses.replace(job, backend=_devices.resolve_on_workers(client, opts.backend))
        job = _warmup.choose_codecs(client, job)  # GPU runs: where each array's chunks are decoded/encoded
        report.codecs = {name: f"{c.device} ({c.reason})" for name, c in (job.codecs or {}).items()}
        report.warmup_steps = _warmup.prepare_workers(client, job, opts)  # kernels; GPU: device, allocator, pinned
        submitted = time.perf_counter()
        report.warmup = submitted - started
        tasks = _merged(tasks, job, client, report)
        report.submitted = True  # from here on tasks may write: a failure keeps the output
        backends = _collect(client, job, tasks, report, show, dashboard)
        computed = time.perf_counter()
        report.elapsed = computed - submitted
        report.backends = tuple(sorted(backends))
    if computed is not None:   # the cluster (or the connection) closed: the first part of the finish
        report.finish_steps["cluster close"] = time.perf_counter() - computed


def _in_process(opts) -> bool:
    """Whether the embedded cluster would be threads of this process with nothing of distributed's
    in use: the CPU backend, no worker processes, no performance report, no dashboard (its default
    for threads) and no Jupyter widget. Such a run takes a thread pool of this process instead."""
    return (opts.backend == "cpu" and not opts.cluster.processes and not opts.performance_report
            and _connect.dashboard_address(opts) is None and not _progress.in_notebook())


def pool_threads(n_workers: int | None, threads_per_worker: int | None) -> int:
    """The threads of the embedded cluster of threads: ``n_workers`` (1) times ``threads_per_worker``,
    by default the cores shared out among the workers, rounded up, as distributed's LocalCluster does."""
    workers = n_workers or 1
    return workers * (threads_per_worker or max(1, -(-usable_cores() // workers)))


def _run_in_process(job: Job, tasks, report: Report, opts, show: bool, t0: float) -> None:
    """The tasks on threads of this process, as many as the embedded cluster of threads would run
    (``cluster.n-workers`` x ``cluster.threads-per-worker``; one per core by default): the same task
    body, warm-up and report, without distributed's client, scheduler and worker in this process,
    which cost a 1,000-matrix run 0.5 s of its 1.7 (import 0.4 s, start, a worker plugin's round
    trip). The run's log goes to its log file as the cluster's does. After an error or Ctrl-C no task
    starts, and the ones running stop at their next write (:class:`_Stopping`); the run returns once
    they have (``STOP_WAIT_S`` at most), so that nothing they log reaches the terminal after it.
    From the first Ctrl-C or SIGTERM on, the others are dropped as the embedded cluster's stop drops
    them (:mod:`batchlu.pipeline.cluster._stops`): until the stop has ended, and in the ``batchlu``
    command's own process until it exits."""
    import concurrent.futures

    from ..cluster import _logs, _stops
    from ..worker import _engines
    from . import _warmup

    spec = opts.cluster
    threads = pool_threads(spec.n_workers, spec.threads_per_worker)
    log = _logs.log_file(spec.log_file)
    restore = _logs.redirect(log)
    pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="batchlu-task")
    stopping = _Stopping(job.fence)
    hold = _stops.SignalHold()
    stopped = False
    futures = []
    try:
        with hold.from_the_first_signal():   # the first Ctrl-C or SIGTERM holds off those after it
            started = time.perf_counter()
            report.cluster_start = started - t0
            job = dataclasses.replace(job, backend="cpu", fence=stopping)
            _engines.compile_op(_engines.host_engine(), _warmup.warmup_for(job))   # HostSetup's warm-up
            submitted = time.perf_counter()
            report.warmup_steps = {"kernels": submitted - started}
            report.warmup = submitted - started
            report.submitted = True  # from here on tasks may write: a failure keeps the output
            futures.extend(pool.submit(process_range, job, c0, c1) for c0, c1 in tasks)
            total = sum(job.plan.chunk_range(c0, c1)[1] - job.plan.chunk_range(c0, c1)[0] for c0, c1 in tasks)
            bar = _progress.ProgressBar(total, enabled=show, label=f"batchlu {job.op}")
            pending = set(futures)
            try:
                while pending:   # a bounded wait: Ctrl-C lands between them
                    done, pending = concurrent.futures.wait(pending, timeout=0.2,
                                                            return_when=concurrent.futures.FIRST_COMPLETED)
                    for future in done:
                        _add(future.result(), report, bar)
            finally:
                bar.close()
            report.elapsed = time.perf_counter() - submitted
            report.backends = ("cpu",)
    except BaseException as exc:
        stopped = isinstance(exc, (KeyboardInterrupt, SystemExit))
        if stopped:   # held already where a signal raised it; a stop raised otherwise is held here
            hold.hold()
        stopping.stop()
        pool.shutdown(wait=False, cancel_futures=True)
        running = [future for future in futures if not future.cancelled()]   # a cancelled one never ends
        concurrent.futures.wait(running, timeout=STOP_WAIT_S)   # their last words go to the log too
        if not isinstance(exc, BatchluError):
            raise
        noted = _connect.note_log(exc, log)   # as the embedded cluster's: the message names the log
        if noted is exc:
            raise
        raise noted from exc
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        restore()
        hold.end(stopped)   # in the batchlu command's process a stop holds until it exits


# How long a stopped in-process run waits for its running tasks to reach their next write
STOP_WAIT_S = 10.0


class _Stopping:
    """The output's fence of the in-process run's tasks, with a stop of its own: once :meth:`stop`
    is called (an error elsewhere, Ctrl-C), a task's next write raises :class:`FencedError` and the
    task ends without writing, as a task of a run whose lock was taken does."""

    def __init__(self, fence):
        self.fence = fence
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()

    def check(self) -> None:
        if self._stopped.is_set():
            raise FencedError("Expected the run to go on. Got its stop (an error in another task, or an "
                              "interrupt) instead: this task stops without writing.")
        if self.fence is not None:
            self.fence.check()


def _merged(tasks, job: Job, client, report: Report) -> list:
    """``tasks`` merged into a few long ones per worker thread where the GPU workers gain from it."""
    if any(c.device == "gpu" for c in (job.codecs or {}).values()):
        # the GPU codec path: a few long tasks per lane of each worker (see _plan.merge_tasks)
        from ..codecs._gpu import LANES

        tasks = merge_tasks(tasks, TASKS_PER_LANE * sum(min(n, LANES) for n in client.nthreads().values()))
        report.tasks = len(tasks)
    elif job.backend == "gpu" and job.symbolic is None:
        # the host path on GPU workers: a few chunks per task (see HOST_TASKS_PER_THREAD)
        tasks = merge_tasks(tasks, HOST_TASKS_PER_THREAD * sum(client.nthreads().values()))
        report.tasks = len(tasks)
    return tasks


def _collect(client, job: Job, tasks, report: Report, show: bool, dashboard: str | None) -> set:
    """Submit one task per chunk range of ``tasks`` and add each result to ``report`` as it comes
    back; an error raised on purpose in a task is raised here, and the tasks left are cancelled.
    Returns the backends the tasks ran on, with those ``report`` had."""
    from distributed import as_completed

    c0s, c1s = [t[0] for t in tasks], [t[1] for t in tasks]
    # a sparse op's Job holds its pattern's analysis (arrays of the size of L): sent to every
    # worker once, not pickled into every task
    shipped = client.scatter(job, broadcast=True, hash=False) if job.symbolic is not None else job
    futures = client.map(process_range, [shipped] * len(tasks), c0s, c1s, pure=False,
                         key=[f"batchlu-{job.op}-{c0}-{c1}-{os.getpid()}-{time.time_ns()}"
                              for c0, c1 in tasks])
    total = sum(job.plan.chunk_range(c0, c1)[1] - job.plan.chunk_range(c0, c1)[0]
                for c0, c1 in tasks)
    bar = _progress.progress(futures, total, enabled=show, label=f"batchlu {job.op}",
                             dashboard=dashboard)  # widget in Jupyter, text bar in a terminal
    backends = set(report.backends)
    try:
        for future in as_completed(futures):
            backends.add(_add(future.result(), report, bar))
    except BaseException:
        client.cancel(futures)
        raise
    finally:
        bar.close()
    return backends


def _add(result, report: Report, bar) -> str:
    """A task's result into ``report`` and the progress; an error the task raised on purpose (a
    missing chunk, ...) is raised here. Returns the backend it ran on."""
    if result.error is not None:
        raise result.error
    bar.update(result.matrices)
    report.add(result)
    return result.backend
