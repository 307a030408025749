"""Before the tasks, once the backend is decided (:func:`batchlu.pipeline.cluster._devices.resolve_on_workers`):
choose where each array's chunks are decoded and encoded (:func:`choose_codecs`), and set up the
workers for the coming run: GPU workers (device, allocator, kernel warm-up, pinned buffers and I/O
processes) through :class:`batchlu.pipeline.plugins.GPUSetup`, CPU workers (kernel warm-up: numba's
compilation) through :class:`batchlu.pipeline.plugins.HostSetup`.

Kept apart from the cluster (:mod:`batchlu.pipeline.cluster`), which knows nothing of the work that
will run on it: this module reads the run's :class:`batchlu.pipeline.worker._tasks.Job`.
"""

from __future__ import annotations

import zarr

from ..config._settings import Options
from ..store._arrays import native_dtype
from ..store._object_store import zarr_store
from ..worker._batches import input_bytes, sub_batches
from ..worker._engines import WarmUp

__all__ = ["choose_codecs", "prepare_workers", "warmup_for"]


def choose_codecs(client, job):
    """``job`` with :attr:`codecs`: where each array's chunks are decoded or encoded
    (:func:`batchlu.pipeline.codecs._choice.choose`), from one probe of the workers for nvCOMP. Only GPU runs
    ask; a CPU run decodes on the host, as always."""
    import dataclasses

    from ..codecs import _choice, _gpu

    if job.backend != "gpu":
        return job
    setting = job.settings.codec_device
    nvcomp = None
    if setting != "cpu":
        answers = {why for why in client.run(_gpu.missing).values() if why}
        nvcomp = sorted(answers)[0] if answers else None
    arrays = {"a": job.input.open("r")}
    if job.rhs is not None:
        arrays["b"] = job.rhs.open("r")
    for name in job.outputs:
        arrays[name] = zarr.open_array(store=zarr_store(job.output, read_only=True), path=name, mode="r")
    codecs = {name: _choice.choose(array, setting, gpu=True, nvcomp=nvcomp, reading=name in ("a", "b"))
              for name, array in arrays.items()}
    return dataclasses.replace(job, codecs=codecs)


def prepare_workers(client, job, options: Options) -> dict[str, float]:
    """Before the tasks: set up every worker for ``job``: on the GPU (device, allocator, kernel
    warm-up, pinned buffers) through the :class:`batchlu.pipeline.plugins.GPUSetup` worker plugin, on
    the CPU (the kernels compiled) through :class:`batchlu.pipeline.plugins.HostSetup`.

    ``job.backend`` is the one :func:`batchlu.pipeline.cluster._devices.resolve_on_workers` gave;
    ``auto`` (workers that disagree) sets up none. Returns the seconds of each part of the setup
    (kernels, pinned slots, ...) of the worker whose setup took longest.
    """
    from ..plugins import GPUSetup, HostSetup, setup_steps   # distributed's plugin base: imported with the cluster

    if job.backend == "gpu":
        plugin = GPUSetup(options, warmup=warmup_for(job))
    elif job.backend == "cpu":
        plugin = HostSetup(warmup_for(job))
    else:
        return {}
    client.register_plugin(plugin)
    # the parts of the slowest worker's setup (workers set up side by side: its parts add up to
    # at most the warm-up, where the slowest per part could add up to more)
    every = [steps for steps in client.run(setup_steps, plugin.name).values() if steps]
    return dict(max(every, key=lambda steps: sum(steps.values()), default={}))


def warmup_for(job):
    """The :class:`batchlu.pipeline.worker._engines.WarmUp` of a :class:`batchlu.pipeline.worker._tasks.Job`
    (read from the metadata of its arrays; no data is read and nothing touches CUDA here)."""
    source = job.input.open("r")
    rhs = job.rhs.open("r") if job.rhs is not None else None
    outputs = []
    for name in job.outputs:
        arr = zarr.open_array(store=zarr_store(job.output, read_only=True), path=name, mode="r")
        outputs.append((name, tuple(int(d) for d in arr.shape[1:]), str(arr.dtype)))
    plan = job.plan
    first = sub_batches(plan, 0, max(1, min(plan.chunks_per_task, plan.n_chunks)))
    batch = max((plan.chunk_range(b0, b1)[1] - plan.chunk_range(b0, b1)[0] for b0, b1 in first),
                default=1)
    sparse = job.symbolic is not None   # a sparse op reads values (N, nnz) of an n x n pattern
    # the dtypes as the tasks read them: native byte order (pipeline.store._arrays.native_dtype)
    return WarmUp(op=job.op, dtype=str(native_dtype(source.dtype)),
                  n=int(job.symbolic.n if sparse else source.shape[1]), outputs=tuple(outputs),
                  batch=max(1, batch),
                  rhs=None if rhs is None else (tuple(int(d) for d in rhs.shape[1:]),
                                                str(native_dtype(rhs.dtype))),
                  settings=job.settings, tail=tuple(int(d) for d in source.shape[1:]) if sparse else None,
                  symbolic=job.symbolic, staging=_staging(job, source, rhs),
                  input_bytes=input_bytes(source, rhs) * int(plan.count),
                  device_slots=_device_slots(job, source, rhs, outputs),
                  locations=tuple(str(location) for location in job.locations()))


def _device_slots(job, source, rhs, outputs) -> dict[bool, tuple] | None:
    """The GPU codec path's pinned pair per task, as its tasks will borrow it
    (:func:`batchlu.pipeline.worker._device_batches.slot_layout` and ``slot_rows``), by whether the
    worker has I/O processes (a routed input is read on the host only then: ``_device_batches._routed``):
    ``(Layout, matrices)``, ``()`` where they borrow none; None where the run takes the host path (no
    array's codec on the GPU)."""
    from ..worker._device_batches import slot_layout, slot_rows

    codecs = job.codecs or {}
    if not any(c.device == "gpu" for c in codecs.values()):
        return None
    inputs = {"a": source} if rhs is None else {"a": source, "b": rhs}
    host_outputs = {name: _Shape(tail, dtype) for name, tail, dtype in outputs
                    if codecs.get(name) is None or codecs[name].device != "gpu"}
    rows = slot_rows(job.plan, int(job.settings.device_batch_bytes), input_bytes(source, rhs))
    slots = {}
    for pooled in (True, False):
        slotted = [name for name in inputs if codecs.get(name) is None or codecs[name].device != "gpu"
                   or (codecs[name].route and pooled)]
        slots[pooled] = (slot_layout(inputs, host_outputs, slotted), rows) if slotted or host_outputs else ()
    return slots


class _Shape:
    """An output's ``shape`` (N left out: 0) and ``dtype``, as :func:`slot_layout` reads them."""

    def __init__(self, tail, dtype):
        self.shape = (0, *tail)
        self.dtype = dtype


def _staging(job, source, rhs) -> int:
    """Input bytes per group of the GPU codec path (its lanes' staging buffers are sized for it at
    warm-up): ``batchlu.device-batch-bytes``, or the whole input where that is less; 0 where no array
    is decoded or encoded on the GPU."""
    if not any(c.device == "gpu" for c in (job.codecs or {}).values()):
        return 0
    return min(int(job.settings.device_batch_bytes), input_bytes(source, rhs) * int(source.shape[0]))
