"""Worker plugins: the per-process setup for a run (GPU: device, allocator, kernels; CPU: kernels),
done inside each worker and never in the client.

Each ``__init__`` only stores settings (plugins are pickled to the workers); ``setup(worker)`` does
the imports and the CUDA work there. Register them with ``client.register_plugin(...)``; a plugin of
the same name registered again replaces the old one (its ``teardown`` runs first) and runs its
``setup`` on every worker, current and future, so each run can bring its own warm-up.
"""

from __future__ import annotations

import logging
import os

from distributed.diagnostics.plugin import WorkerPlugin

from .cluster._devices import gpu_missing
from .cluster._worker_log import WorkerLog
from .config._settings import Options
from .errors import GPUUnavailableError
from .worker._engines import WarmUp

__all__ = ["GPUSetup", "HostSetup", "WarmUp", "WorkerLog", "setup_steps"]

logger = logging.getLogger("batchlu.plugins")


class GPUSetup(WorkerPlugin):
    """Select the worker's GPU, set CuPy's allocator (or an RMM pool), compile, pin buffers.

    * device: 0 -- under dask-cuda (``LocalCUDACluster`` or ``dask cuda worker``) each worker's own
      GPU comes first in its ``CUDA_VISIBLE_DEVICES``;
    * allocator: CuPy's memory pool, or an RMM pool of ``settings.cluster.rmm_pool_size`` bytes (needs
      the ``rmm`` package on the workers);
    * warm-up: runs the ``warmup`` op once on a few random matrices, so NVRTC compiles before the
      first task and compile time never counts as a task's;
    * pinned buffers: reserves one pair of page-locked slots per worker thread for that batch size
      (see :class:`batchlu.pipeline.worker._buffers.SlotPool`); tasks borrow them and give them back;
    * I/O processes: starts the worker's pool of :mod:`batchlu.pipeline.worker._io_pool` (``batchlu.io-processes``),
      which reads into and writes from those pinned buffers.

    On a worker without a GPU (a CPU worker of a mixed cluster, ``backend="auto"``) it does nothing
    and says so in the worker's log; ``backend="gpu"`` then fails in the task with a clear error.
    """

    name = "batchlu-gpu"
    idempotent = False

    def __init__(self, settings: Options | None = None, *, warmup: WarmUp | None = None):
        self.settings = settings if settings is not None else Options()
        self.warmup = warmup
        self.engine = None
        self.setup_seconds = None
        self.steps = {}   # seconds of each part of the setup, by name (the run's report prints them)

    def setup(self, worker):
        import time

        started = time.perf_counter()
        why = gpu_missing()
        if why is not None:
            logger.info("batchlu: no GPU on worker %s (%s); GPU setup skipped", worker.address, why)
            return
        import cupy

        from .worker import _engines

        device = 0   # the worker's own GPU (see above)
        cupy.cuda.Device(device).use()
        rmm_pool_size = self.settings.cluster.rmm_pool_size
        if rmm_pool_size:
            _use_rmm_pool(device, int(rmm_pool_size))
        else:
            cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
        engine = _engines.install_engine(device=device, threads=worker.state.nthreads)
        self.steps = {"device": time.perf_counter() - started}   # CuPy, the device, allocator, streams
        if self.warmup is not None:
            self.steps.update(_engines.warm_up(engine, self.warmup, reserve=worker.state.nthreads))
        self.engine = engine
        self.setup_seconds = time.perf_counter() - started
        logger.info("batchlu: %s ready on worker %s (CUDA_VISIBLE_DEVICES=%s) in %.2f s",
                    engine.describe(), worker.address, os.environ.get("CUDA_VISIBLE_DEVICES"),
                    self.setup_seconds)

    def teardown(self, worker):
        # The engine (its streams and pinned slots) lives as long as the worker process: the next
        # run's GPUSetup finds it and reuses the buffers instead of pinning new ones.
        self.engine = None


class HostSetup(WorkerPlugin):
    """A CPU worker before a run's tasks: runs the ``warmup`` op once on a few random matrices, so
    that numba compiles the kernels the tasks call (or loads them from its disk cache) here, and the
    compilation counts as warm-up, not as a task's compute."""

    name = "batchlu-cpu"
    idempotent = False

    def __init__(self, warmup: WarmUp):
        self.warmup = warmup
        self.setup_seconds = None
        self.steps = {}

    def setup(self, worker):
        import time

        from .worker import _engines

        started = time.perf_counter()
        _engines.compile_op(_engines.host_engine(), self.warmup)
        self.setup_seconds = time.perf_counter() - started
        self.steps = {"kernels": self.setup_seconds}
        logger.info("batchlu: cpu kernels of %s ready on worker %s in %.2f s", self.warmup.op, worker.address,
                    self.setup_seconds)


def setup_steps(name: str, dask_worker) -> dict[str, float]:
    """The seconds of each part of this worker's batchlu setup for the current run, by the plugin
    ``name`` the run registered (``client.run`` calls it on every worker after
    :func:`batchlu.pipeline.client._warmup.prepare_workers`; a cluster kept up keeps an earlier run's
    plugin of the other kind too)."""
    plugin = dask_worker.plugins.get(name)
    return dict(getattr(plugin, "steps", None) or {})


def _use_rmm_pool(device: int, size: int) -> None:
    try:
        import rmm
        from rmm.allocators.cupy import rmm_cupy_allocator
    except ImportError as exc:
        raise GPUUnavailableError("Expected the rmm package on the worker for batchlu.cluster.rmm-pool-size. "
                                  "Got an ImportError instead: install rmm (conda environment.yml) or "
                                  "leave rmm-pool-size unset to use CuPy's memory pool.") from exc
    import cupy

    rmm.reinitialize(pool_allocator=True, initial_pool_size=size, devices=device)
    cupy.cuda.set_allocator(rmm_cupy_allocator)
