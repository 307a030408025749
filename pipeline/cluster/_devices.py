"""The backend a run computes on (``cpu`` or ``gpu``), decided here and nowhere else, from the GPUs
there are: this machine's, counted without CUDA, and a worker's, seen through CuPy.

``batchlu.backend`` ``auto`` means the GPU where there is one; ``gpu`` without one is refused with
what is missing and how to fix it. Where the answer is taken depends on the cluster:

* the embedded cluster is built for one backend, in the client: :func:`resolve_embedded` counts this
  machine's GPUs through NVML (``nvidia-ml-py``), ``nvidia-smi -L`` or ``CUDA_VISIBLE_DEVICES``
  (:func:`visible_gpus`) and looks CuPy and dask-cuda up without importing them;
* on a cluster given by address or client, :func:`resolve_on_workers` asks every worker once
  (:func:`probe`, through ``client.run``), before any task;
* a worker (a task, a worker plugin) asks its own process: :func:`resolve_here`, :func:`gpu_missing`.
  Only these import CuPy, and only inside the worker: nothing here creates a CUDA context in the
  client process.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
from collections.abc import Sequence

from ..config._choices import BACKENDS
from ..errors import BackendError, BatchluError, GPUUnavailableError

__all__ = ["CUDA_EXTRA_HINT", "gpu_available", "gpu_missing", "gpu_packages_missing", "physical_gpu_count", "probe",
           "resolve_embedded", "resolve_here", "resolve_on_workers", "visible_gpus"]

CUDA_EXTRA_HINT = "pip install 'batchlu[cuda12]' (or [cuda13]), or use the conda environment.yml"


# ------------------------------------------------------------------------------- this machine's GPUs
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


# --------------------------------------------------------------------------------- a worker's GPU
@functools.lru_cache(maxsize=None)
def gpu_missing() -> str | None:
    """None when this process can use a CUDA GPU through CuPy, else why not (imports CuPy: worker
    side only)."""
    try:
        import cupy

        if int(cupy.cuda.runtime.getDeviceCount()) < 1:
            return "no CUDA device"
    except Exception as exc:
        return str(exc) or type(exc).__name__
    return None


def gpu_available() -> bool:
    """Whether this process can use a CUDA GPU through CuPy (:func:`gpu_missing`)."""
    return gpu_missing() is None


# ---------------------------------------------------------------------------------- the backend
def resolve_here(name: str) -> str:
    """The backend ``name`` means in this worker process: ``auto`` is ``gpu`` if CuPy sees a GPU here,
    else ``cpu``; ``gpu`` without one raises :class:`BackendError`; any other name is returned as is."""
    if name == "auto":
        return "gpu" if gpu_available() else "cpu"
    if name == "gpu" and not gpu_available():
        raise BackendError("Expected a CUDA GPU usable through CuPy on the worker for backend 'gpu'. "
                           "Got none instead; use backend 'cpu' or 'auto', or install cupy-cuda12x.")
    return name


def probe(name: str) -> str:
    """Run on each worker with ``client.run``: the backend name ``name`` resolves to there."""
    return resolve_here(name)


def resolve_on_workers(client, requested: str) -> str:
    """The backend the tasks get: ``cpu`` or ``gpu``, from ``requested`` (``auto``, ``cpu`` or ``gpu``).

    ``cpu`` asks nothing; otherwise one probe of every worker (``client.run``) says what ``requested``
    means there and, for ``gpu``, fails before any task when a worker has no usable GPU. ``auto``
    becomes what every worker answered; on a cluster whose workers disagree (some with a GPU, some
    without) or with no worker yet it stays ``auto``, and each worker takes its own.
    """
    if requested == "cpu":
        return "cpu"
    answers = set(client.run(probe, requested).values())
    return answers.pop() if len(answers) == 1 else requested


def resolve_embedded(backend: str, gpus=None) -> str:
    """``auto`` / ``cpu`` / ``gpu`` -> ``cpu`` or ``gpu`` for the embedded cluster.

    ``gpu`` without a GPU, or without CuPy and dask-cuda, raises :class:`GPUUnavailableError` saying
    what is missing and how to fix it; ``auto`` quietly falls back to ``cpu`` then. With an existing
    cluster the workers decide: see :func:`resolve_on_workers`.
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
