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

from ._config import Options
from .errors import ConfigError


def _local_cluster(options: Options):
    from distributed import LocalCluster

    spec = options.cluster
    kwargs = {"processes": spec.processes, "host": spec.host,
              "dashboard_address": spec.dashboard_address, "silence_logs": logging.ERROR}
    if spec.n_workers is not None:
        kwargs["n_workers"] = spec.n_workers
    if spec.threads_per_worker is not None:
        kwargs["threads_per_worker"] = spec.threads_per_worker
    return LocalCluster(**kwargs)


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

    if scheduler_file is not None:
        if not os.path.isfile(scheduler_file):
            raise ConfigError(f"Expected the scheduler file {scheduler_file} to exist. "
                              f"Got no such file instead.")
        with Client(scheduler_file=scheduler_file) as connected:
            yield connected
        return
    if scheduler is not None:
        with Client(scheduler) as connected:
            yield connected
        return
    with _local_cluster(options) as cluster, Client(cluster) as embedded:
        yield embedded


def dashboard_link(client) -> str | None:
    try:
        return client.dashboard_link
    except Exception:
        return None
