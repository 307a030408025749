"""Shared buffers: host memory that the worker and its I/O processes map alike.

The slot buffers of :mod:`batchlu.pipeline.worker._buffers` are allocated here, in anonymous shared
memory (``memfd_create``): :func:`shared_buffer`. An I/O process (:mod:`batchlu.pipeline.worker._io_child`)
maps the same pages through ``/proc/<worker pid>/fd/<fd>``, so it decodes input chunks directly into
the buffer the GPU copies from and encodes outputs directly from the buffer the GPU copied into; a
request names its buffer by :func:`locate`. The GPU engine page-locks those pages with
``cudaHostRegister``, so its copies stay asynchronous. The memory has no name: it goes away with
the last process that maps it, even after a SIGKILL.

Linux only (``memfd_create`` and ``/proc``): :func:`supported` says so.
"""

from __future__ import annotations

import itertools
import mmap
import os
import threading
import weakref

import numpy as np

__all__ = ["forgotten", "locate", "shared_buffer", "supported"]


def supported() -> bool:
    """Whether this process can make shared buffers (Linux: ``memfd_create`` and ``/proc``)."""
    return hasattr(os, "memfd_create") and os.path.isdir(f"/proc/{os.getpid()}/fd")


_SEGMENTS: dict[str, tuple[int, int, int]] = {}   # name -> (fd, address, size), in this process
_SEGMENTS_LOCK = threading.Lock()
_FORGOTTEN: list[str] = []                         # freed segments the children may still map
_COUNTER = itertools.count()


def shared_buffer(nbytes: int, on_free=None) -> np.ndarray:
    """A flat uint8 array of at least ``nbytes`` (whole pages) in anonymous shared memory that the I/O
    processes can map.

    ``on_free(address, size)`` runs when the array (and every view of it) is garbage, before the
    pages are unmapped (the GPU engine unregisters them there).
    """
    nbytes = -(-max(1, int(nbytes)) // mmap.PAGESIZE) * mmap.PAGESIZE  # whole pages (cudaHostRegister)
    name = f"batchlu-{os.getpid()}-{next(_COUNTER)}"
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, nbytes)
        mapping = mmap.mmap(fd, nbytes)
    except BaseException:
        os.close(fd)
        raise
    raw = np.frombuffer(mapping, np.uint8, nbytes)
    address = raw.ctypes.data
    with _SEGMENTS_LOCK:
        _SEGMENTS[name] = (fd, address, nbytes)
    # every view of ``raw`` keeps ``mapping`` alive (NumPy bases end at its buffer), so the pages
    # are released when the last view is gone: then the mapping's weak reference calls _free
    weakref.finalize(mapping, _free, name, fd, address, nbytes, on_free)
    return raw


def _free(name, fd, address, nbytes, on_free) -> None:
    """Runs just before the mapping is unmapped (its last view is gone)."""
    with _SEGMENTS_LOCK:
        _SEGMENTS.pop(name, None)
        _FORGOTTEN.append(name)
    try:
        if on_free is not None:
            on_free(address, nbytes)
    finally:
        os.close(fd)


def locate(array: np.ndarray) -> tuple | None:
    """``(name, fd, size, offset, shape, dtype)`` of a C-contiguous array inside a shared buffer of
    this process, or None when it is ordinary memory."""
    if not array.flags.c_contiguous:
        return None
    pointer = array.ctypes.data
    with _SEGMENTS_LOCK:
        for name, (fd, address, size) in _SEGMENTS.items():
            if address <= pointer and pointer + array.nbytes <= address + size:
                return (name, fd, size, pointer - address, tuple(array.shape), array.dtype.str)
    return None


def forgotten() -> list[str]:
    """The shared buffers freed since the last call, which the I/O processes may still map: each
    request tells its process to let go of them."""
    with _SEGMENTS_LOCK:
        names, _FORGOTTEN[:] = list(_FORGOTTEN), []
    return names
