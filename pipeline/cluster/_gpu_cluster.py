"""The embedded GPU cluster: one dask-cuda worker per GPU on 127.0.0.1, optionally secured with TLS.

Nothing here creates a CUDA context in the client process: the GPUs are those
:func:`batchlu.pipeline.cluster._devices.visible_gpus` counts without CUDA, and dask-cuda is imported
only when a cluster is actually started. All CUDA work happens in the workers, through the plugins
of :mod:`batchlu.pipeline.plugins`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..errors import BatchluError, GPUUnavailableError
from ._devices import CUDA_EXTRA_HINT, gpu_packages_missing

__all__ = ["default_gpu_threads", "make_gpu_cluster", "make_security"]


# --------------------------------------------------------------------------------------------- TLS
def make_security(ca_file: str | None = None, cert: str | None = None, key: str | None = None):
    """:class:`distributed.Security` from ``--tls-ca-file/--tls-cert/--tls-key``; None when none given.

    The same certificate serves the client, the scheduler and the workers of the embedded cluster;
    for an existing secured scheduler it is the client's certificate. Encryption is then required.
    """
    given = {"--tls-ca-file": ca_file, "--tls-cert": cert, "--tls-key": key}
    if not any(given.values()):
        return None
    absent = [flag for flag, value in given.items() if not value and flag != "--tls-key"]
    if absent:
        raise BatchluError(f"Expected --tls-ca-file and --tls-cert together (and --tls-key unless the "
                           f"certificate file holds the key). Got {', '.join(absent)} missing instead.")
    for flag, value in given.items():
        if value and not Path(value).is_file():
            raise BatchluError(f"Expected {flag} to be a readable PEM file. Got {value!r} instead "
                               f"(no such file).")
    from distributed.security import Security

    return Security(
        tls_ca_file=ca_file,
        tls_client_cert=cert, tls_client_key=key,
        tls_scheduler_cert=cert, tls_scheduler_key=key,
        tls_worker_cert=cert, tls_worker_key=key,
        require_encryption=True,
    )


# --------------------------------------------------------------------------------------------- cluster
def make_gpu_cluster(devices: Sequence[str], *, threads_per_worker: int = 2, security=None,
                     dashboard_address: str | None = "127.0.0.1:0"):
    """A :class:`dask_cuda.LocalCUDACluster` with one worker per device, listening on 127.0.0.1.

    ``devices`` are ``CUDA_VISIBLE_DEVICES`` tokens (:func:`batchlu.pipeline.cluster._devices.visible_gpus`).
    dask-cuda gives each worker its own GPU first in its ``CUDA_VISIBLE_DEVICES``, so device 0 inside a
    worker is its GPU.
    The client process creates no CUDA context: dask-cuda sizes the workers through NVML.
    """
    devices = tuple(str(d) for d in devices)
    if not devices:
        raise GPUUnavailableError("Expected at least one GPU for the GPU cluster. Got none instead.")
    missing = gpu_packages_missing()
    if missing:
        raise GPUUnavailableError(f"Expected CuPy and dask-cuda for the GPU cluster. Got {', '.join(missing)} "
                                  f"missing instead: {CUDA_EXTRA_HINT}.")
    import logging

    from dask_cuda import LocalCUDACluster

    kwargs = dict(
        CUDA_VISIBLE_DEVICES=",".join(devices),
        n_workers=len(devices),
        threads_per_worker=int(threads_per_worker),
        host="127.0.0.1",
        dashboard_address=dashboard_address,
        memory_limit="auto",
        silence_logs=logging.ERROR,
    )
    if security is not None:
        kwargs.update(security=security, protocol="tls")
    return LocalCUDACluster(**kwargs)


def default_gpu_threads(n_gpus: int) -> int:
    """Task threads per GPU worker: the machine's cores shared between the GPUs (at most 16).

    The GPU is rarely the limit: decoding and encoding the Zarr chunks is, and it scales with the
    threads (measured on an H100 host: 4 threads 0.54 GB/s, 8 threads 1.04 GB/s end to end)."""
    cores = os.cpu_count() or 1
    return max(2, min(16, cores // max(1, n_gpus)))
