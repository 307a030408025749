"""Before the tasks: set up the workers for the coming run (the GPU workers' device, allocator, kernel
warm-up, pinned buffers and I/O processes) through :class:`batchlu.pipeline.plugins.GPUSetup`.

Kept apart from the cluster (:mod:`batchlu.pipeline._cluster`), which knows nothing of the work
that will run on it: this module reads the run's :class:`batchlu.pipeline._tasks.Job`.
"""

from __future__ import annotations

import zarr

from ._batches import sub_batches
from ._config import Options
from ._gpu_cluster import workers_have_gpus
from .plugins import GPUSetup, WarmUp

__all__ = ["prepare_workers", "warmup_for"]


def prepare_workers(client, job, options: Options) -> None:
    """Before the tasks: set up every GPU worker for ``job`` (device, allocator, kernel warm-up,
    pinned buffers) through the :class:`batchlu.pipeline.plugins.GPUSetup` worker plugin.

    Runs only when the backend may use GPUs and the workers see one; CPU workers are left alone.
    """
    if job.backend == "cpu" or not workers_have_gpus(client):
        return
    client.register_plugin(GPUSetup(rmm_pool_size=options.cluster.rmm_pool_size, warmup=warmup_for(job)))


def warmup_for(job):
    """The :class:`batchlu.pipeline.plugins.WarmUp` of a :class:`batchlu.pipeline._tasks.Job` (read from the metadata
    of its arrays; no data is read and nothing touches CUDA here)."""
    source = job.input.open("r")
    rhs = job.rhs.open("r") if job.rhs is not None else None
    outputs = []
    for name in job.outputs:
        arr = zarr.open_array(store=job.output, path=name, mode="r")
        outputs.append((name, tuple(int(d) for d in arr.shape[1:]), str(arr.dtype)))
    plan = job.plan
    first = sub_batches(plan, 0, max(1, min(plan.chunks_per_task, plan.n_chunks)))
    batch = max((plan.chunk_range(b0, b1)[1] - plan.chunk_range(b0, b1)[0] for b0, b1 in first),
                default=1)
    return WarmUp(op=job.op, dtype=str(source.dtype), n=int(source.shape[1]), outputs=tuple(outputs),
                  batch=max(1, batch),
                  rhs=None if rhs is None else (tuple(int(d) for d in rhs.shape[1:]), str(rhs.dtype)),
                  io_processes=job.io_processes, io_threads=job.io_threads)
