"""An I/O process: ``python -m batchlu.pipeline.worker._io_child PARENT_PID REQUEST_FD REPLY_FD THREADS``,
started by its worker's :class:`batchlu.pipeline.worker._io_pool.IOPool`.

It maps the worker's shared buffers (:mod:`batchlu.pipeline.worker._shared_memory`) through
``/proc/<worker pid>/fd/<fd>``, runs ``THREADS`` requests at once, each a read (decode
``array[start:stop]`` into a buffer) or a write (encode a buffer into it) through its own cache of
opened arrays, and answers each with None or the exception it raised. It exits when its request
pipe closes (the pool closed, or the worker died, SIGKILL included) after finishing the writes it
has started, or when its parent is gone.

A module of its own, which the package never imports, so that ``-m`` runs it once rather than over
a copy already imported with the package.
"""

from __future__ import annotations

import concurrent.futures
import mmap
import os
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection

import numpy as np

from ._io_pool import open_array, read_into


class _ChildState:
    def __init__(self, parent: int):
        self.parent = parent
        self.maps: dict[str, mmap.mmap] = {}
        self.lock = threading.Lock()

    def view(self, where) -> np.ndarray:
        name, fd, size, offset, shape, dtype = where
        with self.lock:
            mapping = self.maps.get(name)
            if mapping is None:
                handle = os.open(f"/proc/{self.parent}/fd/{fd}", os.O_RDWR)
                try:
                    mapping = self.maps[name] = mmap.mmap(handle, size)
                finally:
                    os.close(handle)
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        return np.frombuffer(mapping, dtype, count, offset).reshape(shape)

    def forget(self, names) -> None:
        with self.lock:
            for name in names:
                self.maps.pop(name, None)  # unmapped once the last view of it is gone


def _serve(state: _ChildState, kind, store, path, start, stop, where, engine="auto") -> None:
    view = state.view(where)
    if kind == "read":
        read_into(open_array(store, path, "r", engine=engine), start, stop, view)
    elif kind == "write":  # outputs only (the worker records chunks complete itself)
        open_array(store, path, "r+", write_empty=True, engine=engine)[start:stop] = view
    else:
        raise ValueError(f"Expected an I/O request read or write. Got {kind!r} instead.")


def _portable(exc: BaseException) -> BaseException:
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _child_main() -> None:
    """The I/O process: ``PARENT_PID REQUEST_FD REPLY_FD THREADS`` in ``sys.argv``."""
    # a terminal's Ctrl-C is its worker's to act on (a GPU worker's child inherits the worker's block
    # of it; one of a run in the command's own process died with a traceback over "Aborted!")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent, request_fd, reply_fd, threads = (int(x) for x in sys.argv[1:5])
    requests = Connection(request_fd, writable=False)
    replies = Connection(reply_fd, readable=False)
    reply_lock = threading.Lock()
    state = _ChildState(parent)

    def answer(rid, future):
        error = future.exception()
        with reply_lock:
            try:
                replies.send((rid, None if error is None else _portable(error)))
            except OSError:  # the worker is gone: nobody waits for the answer
                pass

    def watch_parent():  # a process forked from the worker may hold the pipe open: look, too
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)  # a write cut short leaves only a ``*.partial`` temporary file (zarr's local store)

    threading.Thread(target=watch_parent, daemon=True).start()
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="batchlu-io") as pool:
        while True:
            try:
                rid, kind, store, path, start, stop, where, forget, engine = requests.recv()
            except (EOFError, OSError):
                break  # pool closed or worker dead: finish what was started, then exit
            if forget:
                state.forget(forget)
            future = pool.submit(_serve, state, kind, store, path, start, stop, where, engine)
            future.add_done_callback(lambda f, rid=rid: answer(rid, f))
    # its writes have landed: no teardown of the interpreter, which took seconds on a loaded machine
    # while the worker's stopped run waited for its terminal
    os._exit(0)


if __name__ == "__main__":
    _child_main()
