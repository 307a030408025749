"""I/O processes: Zarr decoding and encoding outside the worker process, straight into shared buffers.

One worker process reads and writes Zarr through zarr-python; the codecs run in threads, but the
rest (zarr's single asyncio loop per process, its copies, the GIL around them) caps one process well
below what the cores can decode and encode: on the GPU hosts one worker reached ~1.3 GB/s of zstd
read + write however many threads it had, two processes exactly twice that (docs/performance.md).
So a worker hands its Zarr I/O to a few child processes of its own, and keeps one process per GPU.

* **Shared buffers.** The slot buffers lie in anonymous shared memory
  (:mod:`batchlu.pipeline.worker._shared_memory`) that a child maps too, so it reads (decodes) input
  chunks directly into the buffer the GPU copies from, and writes (encodes) outputs directly from
  the buffer the GPU copied into.
* **Control messages only.** A request is ``(id, kind, store, array, start, stop, buffer, engine)``: a
  few hundred bytes over a pipe; the data never goes through it. ``engine`` is the run's
  ``batchlu.io-engine`` (:mod:`batchlu.pipeline.store._io_engines`): the Zarr codec pipeline the child
  opens the array with.
* **Children.** ``processes`` children (:mod:`batchlu.pipeline.worker._io_child`) started with
  :mod:`subprocess` (not :mod:`multiprocessing`: Dask's worker processes are daemonic and may not
  have multiprocessing children), each running ``threads`` requests at once, with its own cache of
  opened arrays (:func:`open_array`, as the worker's own). A child exits when its pipe
  closes: when the pool is closed or the worker dies (SIGKILL included), after finishing the writes
  it has started (zarr's local store writes each object to a temporary file and renames it).
* **Faults.** A child that dies fails its requests with :class:`IOProcessError` and is replaced on
  the next request. Errors raised in a child (a corrupt chunk, a full disk) come back as the same
  exception. Only the worker records chunks complete, after every write of the batch succeeded.
  A chunk missing from the input store is caught by the worker before it sends the read
  (:mod:`batchlu.pipeline.store._missing`): a child never reads one as the fill value unnoticed.

Linux only (``memfd_create`` and ``/proc``): :func:`supported` says so; elsewhere the data path does
its I/O in the worker process as before.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import os
import subprocess
import sys
import threading
from multiprocessing.connection import Connection

import numpy as np

from ..errors import IOProcessError
from ..store import _io_engines, _object_store
from ..store._object_store import is_url, join
from ..store._zarr import nd_buffer
from ._shared_memory import forgotten, locate, supported

__all__ = ["EnginePool", "IOPool", "IOProcessError", "get_pool", "io_settings", "open_array", "read_into", "supported",
           "tune_malloc"]

logger = logging.getLogger("batchlu.io")

TOP_PAD = 64 << 20
_TUNED: list[bool] = []


def tune_malloc() -> bool:
    """Keep 64 MiB of glibc heap padding in this process (``mallopt(M_TOP_PAD)``), once, unless
    ``MALLOC_TOP_PAD_`` is set already. Returns whether the setting is in force.

    zarr allocates a fresh buffer per chunk decoded or encoded (tens of MiB). With glibc's defaults,
    and Dask's ``MALLOC_TRIM_THRESHOLD_=65536`` in its worker processes, each one is mapped,
    page-faulted in and given back again, and the page faults and unmaps of one process serialise on
    its memory map. With the padding the heap keeps those pages for the next buffer: on a zstd Zarr
    copy, 10x fewer page faults, a third of the kernel time per GB, and ~40 % more GB/s.
    """
    if not _TUNED:
        done = "MALLOC_TOP_PAD_" in os.environ
        if not done:
            try:
                import ctypes

                done = bool(ctypes.CDLL(None).mallopt(-2, TOP_PAD))  # M_TOP_PAD
            except (OSError, AttributeError):
                done = False
        _TUNED.append(done)
    return _TUNED[0]


# --------------------------------------------------------------------------------- opened arrays
_OPENED: dict[tuple, tuple] = {}
_OPENED_LOCK = threading.Lock()


def _signature(store: str, path: str) -> tuple:
    if is_url(store):   # object storage: the metadata object's ETag (one HEAD request)
        for name in ("zarr.json", ".zarray"):
            meta = _object_store.head(join(store, path, name))
            if meta is not None:
                return (name, meta.get("e_tag"), meta.get("size"))
        return ()
    for name in ("zarr.json", ".zarray"):
        try:
            st = os.stat(os.path.join(store, path, name))
        except OSError:
            continue
        return (name, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
    return ()


def open_array(store: str, path: str, mode: str, write_empty: bool = False, engine: str = "auto",
               strict: bool = False):
    """``zarr.open_array``, cached in this process (worker or I/O process) while the array's metadata
    file is the same file with the same modification time: an output deleted and made again, or an
    input replaced, is opened afresh; a missing one raises as zarr does. ``write_empty``: store
    every chunk written, even one whose values all equal the fill value (zarr skips those).
    ``engine``: the ``batchlu.io-engine`` whose codec pipeline decodes and encodes its chunks.
    ``strict``: an object store's "not found" for a chunk is an error (see
    :func:`batchlu.pipeline.store._object_store.zarr_store`)."""
    import zarr

    key = (str(store), str(path), mode, bool(write_empty), engine, bool(strict))
    signature = _signature(store, path)
    with _OPENED_LOCK:
        cached = _OPENED.get(key)
    if cached is not None and signature and cached[0] == signature:
        return cached[1]
    with _io_engines.opening(engine, write=mode != "r"):  # with_config makes a new array: its pipeline too
        array = zarr.open_array(store=_object_store.zarr_store(store, read_only=mode == "r", strict=strict),
                                path=path, mode=mode)
        if write_empty:
            array = array.with_config({"write_empty_chunks": True})
    with _OPENED_LOCK:
        if len(_OPENED) >= 256:
            _OPENED.clear()
        _OPENED[key] = (signature, array)
    return array


def read_into(array, start: int, stop: int, out: np.ndarray) -> None:
    """``out[...] = array[start:stop]``, decoded by zarr straight into ``out`` where zarr allows it.
    ``out`` is in native byte order (the slots' layout): zarr swaps a Zarr v2 ``>f8`` array's bytes
    on the way, as it does for a v3 array stored big-endian."""
    buffer = nd_buffer(out)
    if buffer is not None:
        array.get_basic_selection((slice(start, stop),), out=buffer)
    else:  # another zarr: read, then copy
        out[...] = array[start:stop]


# -------------------------------------------------------------------------------------- the pool
class _Child:
    def __init__(self, threads: int):
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("MALLOC_TOP_PAD_", str(TOP_PAD))  # see tune_malloc
        read_fd, write_fd = os.pipe()  # requests: worker -> child
        back_read, back_write = os.pipe()  # replies: child -> worker
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "batchlu.pipeline.worker._io_child", str(os.getpid()), str(read_fd),
                 str(back_write), str(threads)],
                pass_fds=(read_fd, back_write), env=env, stdin=subprocess.DEVNULL, close_fds=True)
        finally:
            os.close(read_fd)
            os.close(back_write)
        self.requests = Connection(write_fd, readable=False)
        self.replies = Connection(back_read, writable=False)
        self.send_lock = threading.Lock()
        self.pending: dict[int, concurrent.futures.Future] = {}
        self.alive = True
        self.receiver = threading.Thread(target=self._receive, name=f"batchlu-io-{self.process.pid}",
                                         daemon=True)
        self.receiver.start()

    def _receive(self) -> None:
        while True:
            try:
                rid, error = self.replies.recv()
            except (EOFError, OSError):
                break
            future = self.pending.pop(rid, None)
            if future is None:
                continue
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)
        with self.send_lock:  # from here on, send() refuses: no request is left unanswered
            self.alive = False
            orphans, self.pending = self.pending, {}
        code = self.process.wait()
        for rid, future in orphans.items():
            if not future.done():
                future.set_exception(IOProcessError(
                    f"Expected I/O process {self.process.pid} to answer request {rid}. "
                    f"Got its exit (code {code}) instead."))

    def send(self, rid: int, message: tuple, future) -> None:
        with self.send_lock:
            if not self.alive:
                raise IOProcessError(f"Expected I/O process {self.process.pid} to be running. Got it "
                                     f"exited (code {self.process.poll()}) instead.")
            self.pending[rid] = future
            try:
                self.requests.send((rid,) + message)
            except BaseException as exc:
                self.pending.pop(rid, None)
                if isinstance(exc, OSError):    # a broken pipe: the process is gone, even if the
                    self.alive = False          # receiver has not read its end yet; replace it
                raise

    def close(self) -> None:
        with self.send_lock:
            try:
                self.requests.close()
            except OSError:
                pass


class IOPool:
    """``processes`` I/O processes of ``threads`` threads each; requests go to the least busy one.

    :meth:`read` and :meth:`write` return a :class:`concurrent.futures.Future` that resolves when
    the child has decoded ``array[start:stop]`` into ``out`` / encoded and stored ``value`` there.
    ``out`` and ``value`` must lie in shared buffers (:mod:`batchlu.pipeline.worker._shared_memory`).
    """

    def __init__(self, processes: int, threads: int):
        if not supported():
            raise RuntimeError("Expected Linux (memfd_create and /proc) for I/O processes. "
                               "Got another platform instead; set batchlu.io-processes to 0.")
        self.processes, self.threads = max(1, int(processes)), max(1, int(threads))
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._closed = False
        self._children = [_Child(self.threads) for _ in range(self.processes)]
        self.restarts = 0

    @property
    def pids(self) -> list[int]:
        return [child.process.pid for child in self._children]

    def _pick(self) -> _Child:
        with self._lock:
            if self._closed:
                raise RuntimeError("Expected an open I/O pool. Got a closed one instead.")
            for i, child in enumerate(self._children):
                if not child.alive:
                    logger.warning("batchlu: I/O process %s exited (code %s); starting another",
                                   child.process.pid, child.process.poll())
                    child.close()
                    self._children[i] = _Child(self.threads)
                    self.restarts += 1
            return min(self._children, key=lambda c: len(c.pending))

    def _submit(self, kind: str, store: str, array: str, start: int, stop: int, buffer: np.ndarray,
                engine: str = "auto"):
        where = locate(buffer)
        if where is None:
            raise ValueError("Expected a buffer from batchlu.pipeline.worker._shared_memory.shared_buffer for "
                             "the I/O processes. Got ordinary memory instead.")
        forget = forgotten()
        future: concurrent.futures.Future = concurrent.futures.Future()
        child = self._pick()
        message = (kind, str(store), str(array), int(start), int(stop), where, tuple(forget), str(engine))
        try:
            child.send(next(self._ids), message, future)
        except (OSError, IOProcessError) as exc:
            if not future.done():
                future.set_exception(exc if isinstance(exc, IOProcessError) else IOProcessError(
                    f"Expected to reach I/O process {child.process.pid}. Got {exc!r} instead."))
        return future

    def read(self, store: str, array: str, start: int, stop: int, out: np.ndarray, engine: str = "auto"):
        """Decode ``array[start:stop]`` of the Zarr store at ``store`` into ``out``."""
        return self._submit("read", store, array, start, stop, out, engine)

    def write(self, store: str, array: str, start: int, stop: int, value: np.ndarray, engine: str = "auto"):
        """Encode ``value`` into ``array[start:stop]`` of the Zarr store at ``store``."""
        return self._submit("write", store, array, start, stop, value, engine)

    def using(self, engine: str) -> "EnginePool":
        """This pool with every request decoded and encoded by ``batchlu.io-engine`` ``engine``."""
        return EnginePool(self, engine)

    def close(self, wait: float = 30.0) -> None:
        """Close the pipes: each child finishes what it started, then exits."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            children = list(self._children)
        for child in children:
            child.close()
        for child in children:
            try:
                child.process.wait(wait)
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()


class EnginePool:
    """An :class:`IOPool` whose :meth:`read` and :meth:`write` name one ``batchlu.io-engine`` (a
    run's), with the pool's signature otherwise."""

    def __init__(self, pool: IOPool, engine: str):
        self.pool, self.engine = pool, engine

    @property
    def processes(self) -> int:
        return self.pool.processes

    @property
    def threads(self) -> int:
        return self.pool.threads

    def read(self, store: str, array: str, start: int, stop: int, out: np.ndarray):
        return self.pool.read(store, array, start, stop, out, self.engine)

    def write(self, store: str, array: str, start: int, stop: int, value: np.ndarray):
        return self.pool.write(store, array, start, stop, value, self.engine)


_POOL: IOPool | None = None
_POOL_LOCK = threading.Lock()


def get_pool(processes: int, threads: int) -> IOPool:
    """This process's pool, started on first use; a pool of other sizes is closed and replaced (its
    children finish their requests first)."""
    global _POOL
    with _POOL_LOCK:
        old = _POOL
        if old is not None and (old.processes, old.threads) == (max(1, processes), max(1, threads)):
            return old
        _POOL = IOPool(processes, threads)
    if old is not None:
        old.close()
    return _POOL


def io_settings(processes: int | None, threads: int | None, engine: str,
                worker_threads: int) -> tuple[int, int]:
    """``(processes, threads)`` of the worker's I/O pool from ``batchlu.io-processes`` and
    ``batchlu.io-threads`` (None: auto).

    auto: on a GPU worker, one I/O process per 2 worker threads (the worker's threads wait on the
    I/O and the GPU; the cores do the decoding and encoding), each with as many threads as it takes
    to give the worker's thread count in all; on a CPU worker none (its cores also compute, and
    CPU clusters already run a process per few cores). 0 processes: I/O in the worker process.
    On the 2 x H200 host, 16 worker threads as 8 processes x 2 threads moved 3.13 GB/s (1 GPU) and
    4.94 GB/s (2 GPUs), against 2.93 / 4.51 as 4 x 4 and 2.99 / 4.61 as 16 x 1 (medians of 3 runs,
    docs/performance.md).
    """
    worker_threads = max(1, int(worker_threads))
    if processes is None:
        processes = max(1, worker_threads // 2) if engine == "gpu" else 0
    if threads is None:
        threads = max(1, -(-worker_threads // max(1, processes)))
    return int(processes), int(threads)


def pool_settings(settings, engine: str, worker_threads: int, locations) -> tuple[int, int]:
    """``(processes, threads)`` of the I/O pool a run's tasks use on this worker, ``(0, 0)`` where
    their I/O stays in the worker process: none asked for (:func:`io_settings`), no shared memory
    here, or a store in object storage among ``locations`` (obstore's client does its requests
    outside the GIL, and an I/O process would not see the storage options the run set in this
    one's Dask config). The tasks (:func:`batchlu.pipeline.worker._tasks.io_pool_for`) and the
    warm-up (:func:`batchlu.pipeline.worker._engines.warm_up`) ask here alike."""
    if any(is_url(location) for location in locations):
        return 0, 0
    processes, threads = io_settings(settings.io_processes, settings.io_threads, engine, worker_threads)
    if processes == 0 or not supported():
        return 0, 0
    return processes, threads
