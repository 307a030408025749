"""Pinning host memory on the GPU machine, per GiB: CuPy's pinned memory (``cudaHostAlloc``) against
the kind the pipeline pins (``memfd`` shared memory registered with ``cudaHostRegister``), with and
without its pages written by threads first (as the pipeline's ``prefault`` does), and the
host-to-device copy rate from each. A GPU run's warm-up pins its slots and codec staging buffers, so
this rate sets that part of its fixed cost.

    python benchmarks/bench_pinning.py [--gib 1] [--repeat 2]
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import threading
import time

import numpy as np


def shared_memory(nbytes: int) -> np.ndarray:
    """``nbytes`` of anonymous shared memory (whole pages), unmapped when the array is garbage."""
    nbytes = -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
    fd = os.memfd_create("bench-pinning", os.MFD_CLOEXEC)
    os.ftruncate(fd, nbytes)
    mapping = mmap.mmap(fd, nbytes)
    os.close(fd)
    return np.frombuffer(mapping, np.uint8, nbytes)


def written_by_threads(raw: np.ndarray, threads: int = 16) -> None:
    """Every page of ``raw`` written from ``threads`` threads at once (ctypes' memset lets the GIL go)."""
    step = -(-raw.nbytes // threads)
    workers = [threading.Thread(target=ctypes.memset, args=(raw.ctypes.data + i, 0, min(step, raw.nbytes - i)))
               for i in range(0, raw.nbytes, step)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    import cupy

    size = int(args.gib * (1 << 30))
    cupy.cuda.Device(0).use()
    cupy.cuda.alloc_pinned_memory(1 << 20)   # the context first: not part of any figure
    kept = {}

    def cupy_pinned():
        return np.frombuffer(cupy.cuda.alloc_pinned_memory(size), np.uint8, size)

    def registered(prefault: bool):
        def make():
            raw = shared_memory(size)
            if prefault:
                written_by_threads(raw, min(16, os.cpu_count() or 1))
            cupy.cuda.runtime.hostRegister(raw.ctypes.data, raw.nbytes, 1)   # portable, as the pipeline's
            return raw
        return make

    kinds = {"cudaHostAlloc (CuPy)": cupy_pinned, "shared memory + cudaHostRegister": registered(False),
             "shared memory, prefaulted + cudaHostRegister": registered(True)}
    device = cupy.empty(size, cupy.uint8)
    stream = cupy.cuda.Stream(non_blocking=True)
    print(f"{'kind':48s} {'s per GiB':>10s} {'H2D GB/s':>9s}")
    for label, make in kinds.items():
        for _ in range(args.repeat):
            start = time.perf_counter()
            host = make()
            seconds = (time.perf_counter() - start) / args.gib
            begin, end = cupy.cuda.Event(), cupy.cuda.Event()
            begin.record(stream)
            device.set(host, stream=stream)
            end.record(stream)
            end.synchronize()
            rate = size / cupy.cuda.get_elapsed_time(begin, end) / 1e6
            print(f"{label:48s} {seconds:10.3f} {rate:9.1f}")
            old = kept.pop(label, None)
            if old is not None and label != "cudaHostAlloc (CuPy)":
                cupy.cuda.runtime.hostUnregister(old.ctypes.data)
            kept[label] = host   # freed when the next one of its kind is made


if __name__ == "__main__":
    main()
