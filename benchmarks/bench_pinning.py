"""Pinning host memory on the GPU machine, per GiB: CuPy's pinned memory (``cudaHostAlloc``) against
the memory the pipeline pins (shared memory registered with ``cudaHostRegister``), with and without
its pages faulted in by threads first (:func:`batchlu.pipeline.worker._buffers.prefault`), and the
host-to-device copy rate from each. A GPU run's warm-up pins its slots and codec staging buffers, so
this rate sets that part of its fixed cost.

    python benchmarks/bench_pinning.py [--gib 1] [--repeat 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    import cupy

    from batchlu.pipeline.worker import _buffers, _shared_memory

    size = int(args.gib * (1 << 30))
    cupy.cuda.Device(0).use()
    cupy.cuda.alloc_pinned_memory(1 << 20)   # the context first: not part of any figure
    kept = {}

    def cupy_pinned():
        return np.frombuffer(cupy.cuda.alloc_pinned_memory(size), np.uint8, size)

    def registered(prefault: bool):
        def make():
            raw = _shared_memory.shared_buffer(size, on_free=_buffers._unregister)
            if prefault:
                _buffers.prefault(raw)
            cupy.cuda.runtime.hostRegister(raw.ctypes.data, raw.nbytes, 1)
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
            kept[label] = host   # freed when the next one of its kind is made


if __name__ == "__main__":
    main()
