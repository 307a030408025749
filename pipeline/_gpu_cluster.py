"""The embedded GPU cluster: one dask-cuda worker per GPU on 127.0.0.1, optionally secured with TLS.

Nothing here creates a CUDA context in the client process: GPUs are counted through NVML
(``nvidia-ml-py``), ``nvidia-smi -L`` or ``CUDA_VISIBLE_DEVICES``, and CuPy / dask-cuda are looked up
with :func:`importlib.util.find_spec` until a cluster is actually started. All CUDA work happens in
the workers, through the plugins of :mod:`batchlu.pipeline.plugins`.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from ._config import BACKENDS
from .errors import BatchluError, GPUUnavailableError

__all__ = [
    "GPUUnavailableError", "gpu_packages_missing", "make_gpu_cluster", "make_security", "resolve_backend",
    "visible_gpus",
]

CUDA_EXTRA_HINT = "pip install 'batchlu[cuda12]' (or [cuda13]), or use the conda environment.yml"


# ------------------------------------------------------------------------------------- GPU detection
def _parse_device_list(text: str, what: str) -> tuple[str, ...]:
    """``"0,1"`` / ``"GPU-1a2b..."`` / ``""`` -> device tokens; ``-1`` hides every device, like CUDA."""
    tokens = tuple(t.strip() for t in str(text).split(",") if t.strip())
    out = []
    for token in tokens:
        if token.lstrip("-").isdigit() and int(token) < 0:
            break  # CUDA stops at the first invalid index
        if not (token.isdigit() or token.upper().startswith(("GPU-", "MIG-"))):
            raise BatchluError(f"Expected {what} to list GPU indices or UUIDs such as 0,1 or GPU-8a3c... "
                               f"Got {text!r} instead.")
        out.append(token)
    if len(set(out)) != len(out):
        raise BatchluError(f"Expected each GPU once in {what}. Got {text!r} instead.")
    return tuple(out)


def _nvml_count() -> int | None:
    """Number of GPUs according to NVML (no CUDA context), or None without nvidia-ml-py / a driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _nvidia_smi_count() -> int | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def physical_gpu_count() -> int:
    """GPUs on this machine, before ``CUDA_VISIBLE_DEVICES`` (0 when there is no driver)."""
    for probe in (_nvml_count, _nvidia_smi_count):
        count = probe()
        if count is not None:
            return count
    return 0


def visible_gpus(gpus: str | Sequence[int | str] | None = None) -> tuple[str, ...]:
    """The GPUs a run may use, as ``CUDA_VISIBLE_DEVICES`` tokens, without touching CUDA.

    ``gpus`` (``--gpus 0,1``) wins; otherwise ``CUDA_VISIBLE_DEVICES`` when it is set; otherwise
    every GPU the driver reports. Indices are the driver's (physical) ones, as in dask-cuda.
    """
    if gpus is not None and not isinstance(gpus, str):
        gpus = ",".join(str(g) for g in gpus)
    if gpus is not None and str(gpus).strip():
        chosen = _parse_device_list(gpus, "--gpus")
        count = physical_gpu_count()
        missing = [t for t in chosen if t.isdigit() and int(t) >= count]
        if missing:
            raise GPUUnavailableError(
                f"Expected --gpus to name GPUs present on this machine (0..{count - 1}). "
                f"Got {','.join(missing)} instead." if count else
                f"Expected a CUDA GPU for --gpus {gpus}. Got none instead: no NVIDIA driver or device found.")
        return chosen
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        if not physical_gpu_count():
            return ()
        return _parse_device_list(env, "CUDA_VISIBLE_DEVICES")
    return tuple(str(i) for i in range(physical_gpu_count()))


def gpu_packages_missing() -> list[str]:
    """The Python packages the GPU backend needs that are not installed (looked up, not imported)."""
    return [name for name, module in (("cupy", "cupy"), ("dask-cuda", "dask_cuda"))
            if importlib.util.find_spec(module) is None]


def resolve_backend(backend: str, gpus=None) -> str:
    """``auto`` / ``cpu`` / ``gpu`` -> ``cpu`` or ``gpu`` for the embedded cluster.

    ``gpu`` without a GPU, or without CuPy and dask-cuda, raises :class:`GPUUnavailableError` saying
    what is missing and how to fix it; ``auto`` quietly falls back to ``cpu`` then. With an existing
    cluster the workers decide: see :func:`batchlu.pipeline._warmup.resolve_backend`.
    """
    if backend not in BACKENDS:
        raise BatchluError(f"Expected backend to be one of {', '.join(BACKENDS)}. Got {backend!r} instead.")
    if backend == "cpu":
        return "cpu"
    devices = visible_gpus(gpus)
    missing = gpu_packages_missing()
    if backend == "auto":
        return "gpu" if devices and not missing else "cpu"
    if not devices:
        hint = ("CUDA_VISIBLE_DEVICES is set to an empty list" if os.environ.get("CUDA_VISIBLE_DEVICES")
                is not None and physical_gpu_count() else "no NVIDIA driver or device was found")
        raise GPUUnavailableError(
            f"Expected a CUDA GPU for --backend gpu. Got none instead: {hint}. "
            f"Use --backend cpu (or auto) on a machine without GPUs.")
    if missing:
        raise GPUUnavailableError(
            f"Expected CuPy and dask-cuda for --backend gpu. Got {', '.join(missing)} missing instead: "
            f"{CUDA_EXTRA_HINT}.")
    return "gpu"


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
                     dashboard_address: str = "127.0.0.1:0"):
    """A :class:`dask_cuda.LocalCUDACluster` with one worker per device, listening on 127.0.0.1.

    ``devices`` are ``CUDA_VISIBLE_DEVICES`` tokens (:func:`visible_gpus`). dask-cuda gives each
    worker its own GPU first in its ``CUDA_VISIBLE_DEVICES``, so device 0 inside a worker is its GPU.
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
