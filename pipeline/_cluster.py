"""Where the tasks run: a client passed in, an existing scheduler, or an embedded LocalCluster.

:func:`connect` is the one entry point. The embedded cluster listens on 127.0.0.1 only (scheduler
and dashboard) and is sized by ``Options.cluster`` (distributed's own sizing where unset). GPU
clusters (LocalCUDACluster, one worker per GPU) and TLS security plug in here.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

from . import _gpu_cluster
from ._config import Options
from .errors import ConfigError


def _local_cluster(options: Options, security=None):
    from distributed import LocalCluster

    spec = options.cluster
    kwargs = {"processes": spec.processes, "host": spec.host,
              "dashboard_address": spec.dashboard_address, "silence_logs": logging.ERROR}
    if spec.n_workers is not None:
        kwargs["n_workers"] = spec.n_workers
    if spec.threads_per_worker is not None:
        kwargs["threads_per_worker"] = spec.threads_per_worker
    if security is not None:  # TLS: see pipeline._gpu_cluster.make_security
        kwargs.update(security=security, protocol="tls")
    return LocalCluster(**kwargs)


def _embedded_cluster(options: Options, security=None):
    """LocalCUDACluster (one worker per GPU) when the backend resolves to the GPU, else LocalCluster."""
    spec = options.cluster
    if _gpu_cluster.resolve_backend(options.backend, spec.gpus) != "gpu":
        return _local_cluster(options, security)
    devices = _gpu_cluster.visible_gpus(spec.gpus)
    threads = spec.threads_per_worker or _gpu_cluster.default_gpu_threads(len(devices))
    return _gpu_cluster.make_gpu_cluster(devices, threads_per_worker=threads, security=security,
                                         dashboard_address=spec.dashboard_address)


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
        if not os.path.isfile(scheduler_file):
            raise ConfigError(f"Expected the scheduler file {scheduler_file} to exist. "
                              f"Got no such file instead.")
        with Client(scheduler_file=scheduler_file, security=security) as connected:
            yield connected
        return
    if scheduler is not None:
        with Client(scheduler, security=security) as connected:
            yield connected
        return
    with _embedded_cluster(options, security) as cluster, Client(cluster, security=security) as embedded:
        yield embedded


def dashboard_link(client) -> str | None:
    try:
        return client.dashboard_link
    except Exception:
        return None


def prepare_workers(client, job, options: Options) -> None:
    """Before the tasks: set up every GPU worker for ``job`` (device, allocator, kernel warm-up,
    pinned buffers) through the :class:`batchlu.pipeline.plugins.GPUSetup` worker plugin.

    Runs only when the backend may use GPUs and the workers see one; CPU workers are left alone.
    """
    if job.backend == "cpu" or not _gpu_cluster.workers_have_gpus(client):
        return
    from .plugins import GPUSetup

    client.register_plugin(GPUSetup(rmm_pool_size=options.cluster.rmm_pool_size,
                                    warmup=_gpu_cluster.warmup_for(job)))


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
