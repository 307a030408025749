"""Where each array's chunks are decoded and encoded: the client's choice, per array.

The GPU codec path (``batchlu.codec-device``) moves the stored bytes of each chunk to the GPU and
decodes them there with nvCOMP (:mod:`batchlu.pipeline.codecs._gpu`); outputs are encoded there and
their frames written as chunk files. :func:`choose` decides per array, in the client: the GPU where
the codec, the byte order, the chunking and the store allow it (and the workers have nvCOMP), else
the host path, with the reason, which the run's report prints.
"""

from __future__ import annotations

import dataclasses

from ..store._layout import Stored, describe
from . import _nvcomp

__all__ = ["AUTO_FRAME_BYTES", "Choice", "GPU_ALGORITHMS", "choose"]

# Codecs whose standard frames nvCOMP decodes bit-exactly (checked on the GPU by tests/pipeline/test_gpu_codecs.py)
GPU_ALGORITHMS = ("zstd", "lz4")
# ``auto`` encodes on the GPU only frames at most this large, and decodes larger ones there only where
# they are barely compressed: nvCOMP spreads a batch over its frames, one thread block each, so a batch
# of a few large compressed frames decodes and encodes slower on the GPU than on the host
# (docs/performance.md, "GPU codecs")
AUTO_FRAME_BYTES = 4 << 20


@dataclasses.dataclass(frozen=True)
class Choice:
    """Where an array's codec runs: ``device`` "gpu" or "cpu", and why."""

    device: str
    reason: str
    stored: Stored | None = None
    route: bool = False   # an input of large frames: groups of compressed ones go to the host (_device_batches)

    def as_dict(self) -> dict:
        return {"device": self.device, "reason": self.reason}


def choose(array, setting: str, *, gpu: bool, nvcomp: str | None, reading: bool = False) -> Choice:
    """Where ``array``'s codec runs for ``batchlu.codec-device`` = ``setting``.

    ``gpu``: the run computes on GPUs; ``nvcomp``: None when every worker imports nvCOMP, else why not;
    ``reading``: an input. nvCOMP cannot be relied on to notice a damaged frame (a zstd frame cut in
    half decoded without an error on the H100), and a run must never compute from one, so every frame
    is checked on the host before it goes to the device: its crc32c where the array has zarr's crc32c
    codec, else (zstd) the frame's structure (:func:`batchlu.pipeline.codecs._frames.zstd_check`); an
    lz4 input without crc32c decodes on the host.
    ``auto`` takes the GPU where it can and says why not otherwise; ``gpu`` asked for an array the GPU
    cannot decode falls back to the host with the reason too (the run does not fail over it).
    """
    if setting == "cpu":
        return Choice("cpu", "codec-device is cpu")
    if not gpu:
        return Choice("cpu", "the run computes on the CPU")
    if nvcomp is not None:
        return Choice("cpu", nvcomp)
    stored, why = describe(array)
    if stored is None:
        return Choice("cpu", why)
    if reading and stored.frames.algorithm == "lz4" and not stored.frames.crc32c:
        return Choice("cpu", "its lz4 chunks carry no crc32c checksum, which the GPU path needs to catch a "
                             "damaged frame (batchlu generate writes one)")
    frame_bytes = stored.inner * stored.matrix_bytes
    limit = _nvcomp.ENCODE_LIMIT.get(stored.frames.algorithm)
    if not reading and limit is not None and frame_bytes > limit:
        return Choice("cpu", f"its chunks of {frame_bytes / 2**20:.0f} MiB are larger than nvCOMP's "
                             f"{stored.frames.algorithm} encoder takes ({limit >> 20} MiB)")
    large = setting == "auto" and frame_bytes > AUTO_FRAME_BYTES and stored.frames.algorithm != "none"
    if large and not reading:
        return Choice("cpu", f"its chunks of {frame_bytes / 2**20:.0f} MiB are faster on the host (the GPU "
                             f"encodes many small frames well, few large ones slowly; the sharded layout "
                             f"suits it)")
    frames = stored.frames
    what = "raw bytes" if frames.algorithm == "none" else frames.algorithm + (
        " + crc32c" if frames.crc32c else ", frames checked on the host" if reading else "")
    layout = f"shards of {stored.unit} matrices in chunks of {stored.inner}" if stored.sharded \
        else f"chunks of {stored.unit} matrices"
    if large:
        return Choice("gpu", f"{what}, {layout}; the chunks are {frame_bytes / 2**20:.0f} MiB frames: "
                             f"those that are compressed are decoded on the host, which decodes few large "
                             f"compressed frames faster", stored, route=True)
    return Choice("gpu", f"{what}, {layout}", stored)
