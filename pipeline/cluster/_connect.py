"""Where the tasks run: a client passed in, an existing scheduler, or an embedded LocalCluster.

:func:`connect` is the one entry point. A scheduler given by address or file must answer as a Dask
scheduler within ``batchlu.connect-timeout`` (distributed's own Client waits forever on a port that
accepts the connection but speaks another protocol). The embedded cluster listens on 127.0.0.1 only
(scheduler and dashboard), is sized by ``Options.cluster`` (distributed's own sizing where unset) and
logs to a file (:mod:`batchlu.pipeline.cluster._logs`), not to the terminal. GPU clusters
(LocalCUDACluster, one worker per GPU) and TLS security plug in here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
import warnings
from collections.abc import Iterator

from ..config._settings import Options
from ..errors import BatchluError, ClusterError, ConfigError
from . import _devices, _gpu_cluster, _guard, _stops

DASHBOARD = "127.0.0.1:8787"   # batchlu.cluster.dashboard-address's address where auto gives one


def dashboard_address(options: Options) -> str | None:
    """The embedded cluster's dashboard (``options.backend`` resolved, ``cluster.processes`` decided):
    ``none`` gives none; ``auto`` gives none to a CPU cluster of threads of this process, whose runs
    (inputs up to 1 GiB) last seconds and would spend 0.35 s of them importing bokeh for its server,
    unless a performance report needs it, and :data:`DASHBOARD` to worker processes (the GPU's
    always); any other value is the address."""
    value = options.cluster.dashboard_address
    if value.lower() == "none":
        return None
    if value.lower() != "auto":
        return value
    in_process = options.backend != "gpu" and not options.cluster.processes
    return None if in_process and not options.performance_report else DASHBOARD


def _local_cluster(options: Options, security=None):
    from distributed import LocalCluster

    spec = options.cluster
    dashboard = dashboard_address(options.replace(backend="cpu"))
    kwargs = {"processes": bool(spec.processes), "host": spec.host, "silence_logs": logging.ERROR,
              # no dashboard: distributed still serves its health routes, here on a free port
              "dashboard_address": dashboard or f"{spec.host}:0"}
    if dashboard is None:
        kwargs["scheduler_kwargs"] = {"dashboard": False}
    if not spec.processes:  # distributed's default for threads, inproc://, does not take a host
        kwargs["protocol"] = "tcp"
    if spec.n_workers is not None:
        kwargs["n_workers"] = spec.n_workers
    if spec.threads_per_worker is not None:
        kwargs["threads_per_worker"] = spec.threads_per_worker
    if security is not None:  # TLS: see pipeline.cluster._gpu_cluster.make_security
        kwargs.update(security=security, protocol="tls")
    return LocalCluster(**kwargs)


def _embedded_cluster(options: Options, gpu: bool, security=None):
    """LocalCUDACluster (one worker process per GPU) for the GPU backend, else LocalCluster (worker
    processes or threads of this process: ``batchlu.cluster.processes``, decided by then)."""
    spec = options.cluster
    if not gpu:
        return _local_cluster(options, security)
    devices = _devices.visible_gpus(spec.gpus)
    threads = spec.threads_per_worker or _gpu_cluster.default_gpu_threads(len(devices))
    return _gpu_cluster.make_gpu_cluster(devices, threads_per_worker=threads, security=security,
                                         dashboard_address=dashboard_address(options.replace(backend="gpu")))


def _scheduler_address(path: str) -> str:
    """The ``address`` of a scheduler file written by ``dask scheduler --scheduler-file``."""
    if not os.path.isfile(path):
        raise ConfigError(f"Expected the scheduler file {path} to exist. Got no such file instead.")
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"Expected the scheduler file {path} to be the JSON that `dask scheduler "
                          f"--scheduler-file` writes. Got unreadable JSON instead ({exc}).") from None
    address = record.get("address") if isinstance(record, dict) else None
    if not isinstance(address, str) or not address.strip():
        got = (f"address {record['address']!r}" if isinstance(record, dict) and "address" in record
               else "no address" if isinstance(record, dict) else f"a JSON {type(record).__name__}")
        raise ConfigError(f"Expected the scheduler file {path} to hold a scheduler \"address\" "
                          f"(written by `dask scheduler --scheduler-file`). Got {got} instead.")
    return address.strip()


def _check_scheduler(address: str, security, timeout: float) -> None:
    """Ask ``address`` who it is; refuse silence, a refusal or anything but a Dask scheduler."""
    import asyncio

    from distributed.core import rpc

    async def identity():
        args = security.get_connection_args("client") if security is not None else {}
        remote = rpc(address, timeout=timeout, connection_args=args)
        try:
            return await remote.identity()
        finally:
            await remote.close_rpc()

    box: dict = {}

    def ask() -> None:  # a thread of its own: the caller may run an event loop (Jupyter)
        try:
            box["answer"] = asyncio.run(asyncio.wait_for(identity(), timeout))
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=ask, name="batchlu-scheduler-check", daemon=True)
    thread.start()
    thread.join(timeout + 5)
    error = box.get("error")
    if thread.is_alive() or isinstance(error, (asyncio.TimeoutError, TimeoutError)):
        raise ClusterError(f"Expected a Dask scheduler to answer at {address} within {timeout:g} s "
                           f"(batchlu.connect-timeout). Got no answer instead: is it the address of "
                           f"a Dask scheduler?")
    if error is not None:
        root = error
        while root.__cause__ is not None or root.__context__ is not None:
            root = root.__cause__ or root.__context__
        why = f"{type(error).__name__}: {error}"
        if root is not error:  # e.g. the TLS handshake's own reason under distributed's comm error
            why += f" ({type(root).__name__}: {root})"
        raise ClusterError(f"Expected a Dask scheduler at {address}. Got {why} instead.") from error
    answer = box.get("answer")
    kind = answer.get("type") if isinstance(answer, dict) else None
    if kind != "Scheduler":
        raise ClusterError(f"Expected a Dask scheduler at {address}. Got {kind or 'another server'} "
                           f"instead.")


def note_log(exc: BatchluError, log: str) -> BatchluError:
    """``exc`` with the worker log named at the end of its message, when something was logged."""
    if not os.path.isfile(log) or os.path.getsize(log) == 0:
        return exc
    return type(exc)(f"{exc} (Worker log: {log})")


@contextlib.contextmanager
def _sigint_held(processes: bool) -> Iterator:
    """Keep a terminal's Ctrl-C from the embedded cluster's worker processes for good, and hold it
    back from this process while they start: pressed then, it takes effect when the start ends.

    Ctrl-C goes to the terminal's whole process group, the spawned workers included: they died
    mid-import or mid-task with tracebacks of their own over the client's one line, while the client
    stops them anyway as it unwinds. The workers start with SIGINT blocked: a blocked signal stays
    blocked in the threads a thread starts and across fork and exec, and distributed's event-loop
    thread, started here with it blocked, starts the threads that spawn them (their other signals
    are as before: SIGTERM and the client's close still end them). This process's own threads may
    still take the signal, so its Python handler waits for the start: an interrupt of the start
    itself left a cluster half made, closed only at exit with distributed's log on the terminal.
    Only for worker processes started from the main thread."""
    if (not processes or threading.current_thread() is not threading.main_thread()
            or not hasattr(signal, "pthread_sigmask")):
        yield
        return
    from multiprocessing import resource_tracker

    # multiprocessing's resource tracker, started by the cluster's first lock, unblocks SIGINT in
    # the thread that starts it (CPython's ensure_running): started here, before the hold
    resource_tracker.ensure_running()
    pressed = []
    handler = signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, handler)
    if pressed:
        signal.raise_signal(signal.SIGINT)   # as if pressed now: the caller's handler decides


# How long a worker of the embedded cluster may take to close after a run that ended well, before
# it is killed. distributed's own close gives a worker 4 s, kills it, waits 1 s more and raises
# TimeoutError past that: on a loaded GPU machine a worker's CUDA teardown outlasted it, and a
# finished run ended in a TimeoutError traceback. A run stopped by an error or an interrupt closes as
# distributed does (no wait for busy workers), and a timeout of that close does not hide the error.
WORKER_CLOSE_S = 30
# After Ctrl-C or SIGTERM a worker process's tasks are of no use: it gets this long (distributed's
# 4 s kept a stopped run on the terminal that long), then SIGTERM. Its writes in flight are as safe
# as after a kill (the output's writes are fenced and marked after they land).
INTERRUPTED_CLOSE_S = 0.5
# ... and the client, the worker processes and the cluster this long to close after that, all
# together: one deadline, counted from the first of those closes, that they share. A GPU worker
# killed while busy took longer than that to go on a loaded machine, and a stopped GPU run waited
# for it (one test run out of two: over 60 s); with a wait of its own for each close, a stopped GPU
# run on a loaded machine still took 5.8 s. Past it, the cluster's worker processes still there are
# killed.
INTERRUPTED_CLUSTER_CLOSE_S = 2.0
# A close that the deadline leaves no time for still gets this long (the scheduler in this process
# closes in milliseconds when the workers are gone).
LEAST_CLOSE_S = 0.2


class _Stop(_stops.SignalHold):
    """The deadline of a stopped run's closes (:data:`INTERRUPTED_CLUSTER_CLOSE_S` from the first
    call of :meth:`left`), shared by the client's close and :func:`_closing`'s.

    From that first call until :meth:`release`, Ctrl-C and SIGTERM wait (they are dropped: the run
    is stopping, within seconds): a second Ctrl-C 0.5 s into the closes cut them short, and
    distributed's exit hook then closed the cluster again (a stopped run took 11 s to exit)."""

    def __init__(self):
        super().__init__()
        self.deadline = None

    def left(self) -> float:
        """Seconds the next close may take: what is left of the deadline, at least ``LEAST_CLOSE_S``."""
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + INTERRUPTED_CLUSTER_CLOSE_S
            self.hold()
        return max(LEAST_CLOSE_S, self.deadline - now)


@contextlib.contextmanager
def _closing(cluster, stop: _Stop) -> Iterator:
    """Close ``cluster`` on the way out: after a run that ended well, its workers first, with
    ``WORKER_CLOSE_S`` each to end; after Ctrl-C or SIGTERM, worker processes with
    ``INTERRUPTED_CLOSE_S`` each and then the cluster, both within what is left of ``stop``'s
    deadline (the client's close may have used part of it), and then its worker processes still
    alive are killed: a stopped run exits in seconds."""
    import asyncio

    try:
        yield cluster
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            pids = _worker_pids(cluster)   # before the close: the cluster forgets workers as they go
            below = _descendants(pids)   # and their I/O processes, while a worker is there to name them
            with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                cluster.sync(_close_workers, cluster, INTERRUPTED_CLOSE_S, processes_only=True,
                             callback_timeout=stop.left())
            with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                cluster.close(timeout=stop.left())
            _kill_worker_processes(pids | _worker_pids(cluster), below)
            # a close cut short: distributed's atexit hook (close_clusters) closed the cluster again,
            # waiting up to 10 s more (a GPU run stopped by Ctrl-C exited 12.8 s after it); its
            # workers are gone and what is left of it lives in this process, which is stopping
            cluster.shutdown_on_close = False
        else:
            with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                cluster.close()
        raise
    try:
        cluster.sync(_close_workers, cluster, WORKER_CLOSE_S)
    finally:
        cluster.close()


def _worker_pids(cluster) -> set[int]:
    """The process IDs of ``cluster``'s worker processes (its nannies' children) alive now."""
    pids = set()
    for worker in list(getattr(cluster, "workers", {}).values()):
        with contextlib.suppress(Exception):
            pid = getattr(worker, "pid", None)   # a Nanny's worker process; None for a worker thread
            if pid:
                pids.add(int(pid))
    return pids


def _own(pids: set[int]) -> list:
    """This process's children among ``pids``, as ``psutil.Process`` objects. Only those: a program
    calling batchlu may run processes of its own, and clusters of its own (a Jupyter kernel
    interrupted mid-run)."""
    import psutil

    try:
        return [child for child in psutil.Process().children() if child.pid in pids]
    except psutil.Error:
        return []


def _below(processes: list) -> list:
    """The processes below ``processes`` (a GPU worker's I/O processes), those still there."""
    import psutil

    found = []
    for process in processes:
        with contextlib.suppress(psutil.Error):
            found += process.children(recursive=True)
    return found


def _descendants(pids: set[int]) -> list:
    """The processes below this process's children ``pids`` (a GPU worker's I/O processes): a worker
    that ends leaves its children to init, out of :func:`_kill_worker_processes`'s reach, and an
    I/O process, which blocks SIGINT as its worker does, lived on until its worker's end reached it
    (a stopped GPU run's terminal waited 6.9 s)."""
    return _below(_own(pids))


def _kill_worker_processes(pids: set[int], below: list = ()) -> None:
    """SIGKILL the worker processes ``pids`` that this process started (:func:`_own`) and are still
    alive, their children (the GPU workers' I/O processes), and ``below`` (such children named
    earlier, by :func:`_descendants`)."""
    import psutil

    workers = _own(pids)
    doomed = {process.pid: process for process in [*below, *workers, *_below(workers)]}
    for process in doomed.values():   # psutil refuses a pid reused since it was named
        with contextlib.suppress(psutil.Error):
            process.kill()
    # gone or a zombie: not reaped here (psutil's wait would take the exit status from the Nanny's
    # own watcher of the process)
    deadline = time.monotonic() + INTERRUPTED_CLOSE_S
    while time.monotonic() < deadline and any(_running(process) for process in doomed.values()):
        time.sleep(0.01)


def _running(process) -> bool:
    import psutil

    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:   # gone
        return False


async def _close_workers(cluster, timeout: float, processes_only: bool = False) -> None:
    """Close the workers of ``cluster`` (or its worker processes only), ``timeout`` s each before
    a kill; a worker that fails to is closed by the cluster's own close."""
    import asyncio

    from distributed import Nanny

    workers = [worker for worker in list(cluster.workers.values())
               if isinstance(worker, Nanny) or not processes_only]
    await asyncio.gather(*(worker.close(timeout=timeout) for worker in workers), return_exceptions=True)


@contextlib.contextmanager
def _embedded(options: Options, security) -> Iterator:
    """The embedded cluster and its client; their logs go to the run's log file."""
    import asyncio

    from . import _logs
    from ._worker_exit import ExitWhenClosed   # both import distributed: not at batchlu's import
    from ._worker_log import WorkerLog

    # the backend decides the cluster (:func:`batchlu.pipeline.cluster._devices.resolve_embedded`)
    gpu = _devices.resolve_embedded(options.backend, options.cluster.gpus) == "gpu"
    if gpu or options.cluster.processes:   # spawned worker processes import the main script again
        _guard.refuse_unguarded()
    log = _logs.log_file(options.cluster.log_file)
    restore = _logs.redirect(log)
    stopped = False
    stop = _Stop()   # a stopped run's closes: one deadline
    try:
        with contextlib.ExitStack() as closing:
            try:
                with _sigint_held(gpu or options.cluster.processes), warnings.catch_warnings():
                    # a dashboard port in use (another run's): distributed takes a free port and says
                    # so in a 4-line UserWarning; the progress line shows the link it got
                    warnings.filterwarnings("ignore", message=r"Port \d+ is already in use",
                                            category=UserWarning)
                    cluster = _embedded_cluster(options, gpu, security)
                    closing.enter_context(_closing(cluster, stop))   # before a held Ctrl-C is let through
            except BatchluError:
                raise
            except Exception as exc:
                script = _guard.rerun_main_script()
                hint = (f" If {script} calls batchlu at its top level, put those calls under "
                        f"`{_guard.GUARD}`: {_guard.RERUN}." if script else "")
                raise note_log(ClusterError(f"Expected the embedded local cluster to start. Got "
                                             f"{type(exc).__name__}: {exc} instead.{hint}"), log) from exc
            from distributed import Client

            client = Client(cluster, security=security)
            try:
                client.register_plugin(WorkerLog(log))
                if options.cluster.processes and not gpu:   # see _worker_exit: a CPU cluster's only
                    client.register_plugin(ExitWhenClosed())
                yield client
            except (KeyboardInterrupt, SystemExit):
                # distributed's close waits up to twice its connect timeout (60 s) for a busy scheduler
                with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                    client.close(timeout=stop.left())
                raise
            except BaseException:
                client.close()
                raise
            client.close()
    except BatchluError as exc:
        noted = note_log(exc, log)
        if noted is exc:
            raise
        raise noted from exc
    except (KeyboardInterrupt, SystemExit):
        # stopped: the logs stay in the file. The client's event loop can still be gathering a
        # result from a worker just killed, and its warning ("Couldn't gather 1 keys") came after
        # the terminal's handlers were back, under the run's one line
        stopped = True
        raise
    finally:
        stop.end(stopped)   # in the batchlu command's process a stop holds until it exits
        if not stopped:
            restore()


@contextlib.contextmanager
def connect(options: Options, *, client=None, scheduler: str | None = None,
            scheduler_file: str | None = None) -> Iterator:
    """Yield a ``distributed.Client``; close what this function opened, never a client passed in."""
    given = [name for name, value in (("client", client), ("scheduler", scheduler),
                                      ("scheduler_file", scheduler_file)) if value is not None]
    if len(given) > 1:
        raise ConfigError(f"Expected at most one of client, scheduler and scheduler_file. "
                          f"Got {', '.join(given)} instead.")
    if client is not None:
        yield client
        return
    from distributed import Client

    security = _gpu_cluster.make_security(options.cluster.tls_ca_file, options.cluster.tls_cert,
                                          options.cluster.tls_key)
    if scheduler_file is not None:
        scheduler = _scheduler_address(scheduler_file)
    if scheduler is not None:
        _check_scheduler(scheduler, security, options.connect_timeout)
        with Client(scheduler, security=security, timeout=options.connect_timeout) as connected:
            yield connected
        return
    with _embedded(options, security) as embedded:
        yield embedded


def dashboard_link(client) -> str | None:
    try:
        return client.dashboard_link
    except Exception:
        return None


@contextlib.contextmanager
def performance_report(path: str | None):
    """``distributed.performance_report`` to ``path`` (an HTML file) around the run, if asked for."""
    if not path:
        yield
        return
    import importlib.util

    if importlib.util.find_spec("bokeh") is None:
        raise ConfigError(f"Expected the bokeh package for the performance report {path}. "
                          f"Got no bokeh installed instead: pip install 'bokeh>=3.1'.")
    from distributed import performance_report as report

    with report(filename=str(path)):
        yield
