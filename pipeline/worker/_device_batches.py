"""The GPU codec path's stages of the batch loop (:mod:`batchlu.pipeline.worker._loop`): stored frames in,
stored frames out, the values on the device. A unit is a group of consecutive batches.

    read      the group's frames read, copied to the GPU and decoded there (nvCOMP), and each output
              chunk's input hashed (XXH3-64, on the GPU), on the lane's read stream
    compute   the kernels, on the engine's stream of this thread
    write     every output encoded on the GPU, the frames copied back, and their chunk files or
              shards started in the I/O threads; the group is recorded complete once they are
              written, while the next group encodes

The groups hold up to ``batchlu.device-batch-bytes`` of input: nvCOMP decodes and encodes across
frames, so one call over a group's many chunks keeps the GPU busy where one chunk's frames (one
32 MiB frame, say) would not. The kernels still run once per batch (one output chunk), as on the
host path, so a chunk's results never depend on which group it was computed in. An input whose codec
the client sent to the host (:mod:`batchlu.pipeline.codecs`) is read as there (the I/O processes
decode the group's chunks into a pinned slot, a request per I/O thread of theirs) and copied to the
device; an output sent to the host is copied back into the slot and written by the I/O processes
while the next group computes.

With ``codec-device auto``, an input of large frames (chunks over ``AUTO_FRAME_BYTES``) goes group
by group: a group of compressed frames is decoded by the I/O processes, one of frames stored nearly
raw by nvCOMP (:func:`_routed_read`).

A batch whose frames fail (a CRC-32C, a size, nvCOMP itself) is read again through zarr on the host:
a chunk zarr cannot read either stops the run with the error that names its file; one zarr reads is
used as zarr decoded it (and the worker's log says so). Nothing is written from a frame that did not
decode to exactly its chunk's bytes.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import _ops
from ._batches import BatchIO, input_bytes, pool_read, pool_write, read_into
from ._buffers import Layout, shared
from ._loop import PathStats, Record, Stages, Unit, run_loop
from ._shared_memory import locate
from ..store._arrays import native_dtype

__all__ = ["DeviceIO", "group_batches", "run_device_batches", "slot_layout", "slot_rows"]

logger = logging.getLogger("batchlu.path")


@dataclasses.dataclass
class DeviceIO:
    """A :class:`batchlu.pipeline.worker._batches.BatchIO` plus where each array's codec runs: ``stored``
    maps ``"a"``, ``"b"`` and output names to a :class:`batchlu.pipeline.store._layout.Stored` (GPU) or
    None (host)."""

    io: BatchIO
    stored: dict
    chunk: int
    group_bytes: int = 0   # input bytes per group of batches (0: one batch per group)
    routed: frozenset = frozenset()   # inputs whose groups of compressed large frames the host decodes
    slot_rows: int = 0   # matrices per pinned slot (:func:`slot_rows`); a task's largest group at least


def run_device_batches(engine, op: str, dio: DeviceIO, batches: list[tuple[int, int]], *,
                       record: Record | None = None, delay: float = 0.0) -> PathStats:
    """Run ``op`` over matrix ranges ``batches`` (each one output chunk or more) on the GPU codec
    path's stages, recording each group complete through ``record`` (None: nothing recorded); as
    :func:`batchlu.pipeline.worker._batches.run_batches`."""
    stats = PathStats()
    if not batches:
        return stats
    from ..codecs import _gpu as _gpu_codecs

    with _gpu_codecs.borrow(engine.device) as lane:   # the worker's other tasks wait for a lane here
        t_start = time.perf_counter()
        _run_lane(engine, op, dio, lane, batches, stats, delay, record or Record())
        stats.wall_s = time.perf_counter() - t_start
    return stats


def _run_lane(engine, op, dio: DeviceIO, lane, batches, stats: PathStats, delay: float, record: Record) -> None:
    io = dio.io
    per = input_bytes(io.source, io.rhs)
    groups = group_batches(batches, per, dio.group_bytes)
    host_outputs = [name for name in io.outputs if dio.stored.get(name) is None]
    slotted = [name for name in ("a", "b") if io.array(name) is not None
               and (dio.stored.get(name) is None or _routed(dio, name))]

    def run(slots) -> None:
        with ThreadPoolExecutor(1, thread_name_prefix="batchlu-host-write") as host_writer:
            stages = Stages(DeviceRead(engine, dio, lane, slots), DeviceCompute(engine, op, io),
                            DeviceWrite(engine, dio, lane, slots, host_writer, record), record,
                            unrecorded=1, read_ahead=0)
            run_loop(stages, groups, stats, delay)

    if not (slotted or host_outputs):
        run(None)
        return

    inputs = {name: io.array(name) for name in ("a", "b") if io.array(name) is not None}
    layout = slot_layout(inputs, {name: io.outputs[name] for name in host_outputs}, slotted)
    rows = max(dio.slot_rows, max(g[-1][1] - g[0][0] for g in groups))
    with engine.pool.borrow(layout, rows) as slots:
        run(slots)


def slot_layout(inputs: dict, host_outputs: dict, slotted) -> Layout:
    """The layout of the pinned slots a task of this path borrows: a buffer for each input in
    ``slotted`` (read on the host) and each output in ``host_outputs`` (encoded there); an input the
    device decodes alone gets none. ``inputs`` / ``host_outputs``: arrays (or anything with ``shape``
    and ``dtype``) by name. The warm-up reserves the same (:func:`batchlu.pipeline.client._warmup.warmup_for`)."""
    def buffer(name):   # inputs are read in native byte order
        array = inputs[name]
        return (tuple(array.shape[1:]) if name in slotted else (0,), native_dtype(array.dtype))

    return Layout(a=buffer("a"), b=None if "b" not in slotted else buffer("b"),
                  outs=tuple((name, tuple(arr.shape[1:]), np.dtype(arr.dtype)) for name, arr in host_outputs.items()))


def slot_rows(plan, group_bytes: int, per: int) -> int:
    """Matrices per slot of a run's tasks (``plan`` a :class:`batchlu.pipeline._plan.Plan`, ``per``
    input bytes per matrix): the most a group can hold (:func:`group_batches`: its batches within
    ``group_bytes``, or one batch past them), never more than the input's matrices. One size for every
    task and its warm-up (:func:`batchlu.pipeline.client._warmup.warmup_for`), so that the pool keeps
    reusing the pairs reserved, where a size per task would register and free pinned memory per
    task; and a small run pins what it holds, not a group's bytes."""
    batch_rows = max(1, plan.batch // plan.chunk) * plan.chunk   # sub_batches' largest batch
    return max(1, min(max(group_bytes // max(1, per), batch_rows), plan.count))


def _routed(dio: DeviceIO, name: str) -> bool:
    """Whether input ``name``'s groups go to the host or the device by their frames
    (:func:`_routed_read`): ``codec-device auto`` chose it so (large frames, :attr:`Choice.route
    <batchlu.pipeline.codecs._choice.Choice>`) and the worker has I/O processes to decode there."""
    return name in dio.routed and dio.io.pool is not None and bool(dio.io.where) and name in dio.io.where


def group_batches(batches: list[tuple[int, int]], matrix_bytes: int, limit: int) -> list[list[tuple[int, int]]]:
    """Consecutive ``batches`` gathered into groups of at most ``limit`` bytes of input
    (``matrix_bytes`` per matrix), each at least one batch."""
    groups: list[list[tuple[int, int]]] = []
    for start, stop in batches:
        if (groups and groups[-1][-1][1] == start
                and (stop - groups[-1][0][0]) * matrix_bytes <= limit):
            groups[-1].append((start, stop))
        else:
            groups.append([(start, stop)])
    return groups


def _input(engine, dio: DeviceIO, lane, name: str, start: int, stop: int, parity: int, slot):
    """Input ``name`` of matrices ``[start, stop)`` on the device (a CuPy array, its copies done), and
    the gaps found on the way (:class:`batchlu.pipeline.store._missing.Gap`: by the GPU decode from the
    reads it planned, by the store before a host read), or None where the host read it all (the
    caller asks the store then, before the read)."""
    stored = dio.stored.get(name)
    if stored is None:
        return _to_device(engine, lane, _host_read(dio, name, start, stop, slot)[0]), None
    if slot is None or not _routed(dio, name) or not shared(slot):
        return _device_read(engine, dio, lane, name, start, stop, parity)
    return _routed_read(engine, dio, lane, name, start, stop, parity, slot)


def _host_read(dio: DeviceIO, name: str, start: int, stop: int, slot, meanwhile=None):
    """Matrices ``[start, stop)`` decoded on the host into ``slot``'s buffer: by the I/O processes
    (:func:`batchlu.pipeline.worker._batches.pool_read`, ``meanwhile()`` run while they read), else by zarr
    in this process (after ``meanwhile()``). Returns the buffer and what ``meanwhile`` returned."""
    io = dio.io
    buffer = (slot.a if name == "a" else slot.b)[:stop - start]
    if io.pool is not None and io.where and shared(slot):
        value = pool_read(io, [(name, buffer)], start, stop, io.pool.processes * io.pool.threads,
                          meanwhile=meanwhile)
    else:
        value = meanwhile() if meanwhile is not None else None
        read_into(io, name, start, stop, buffer)
    return buffer, value


def _to_device(engine, lane, host: np.ndarray):
    """``host`` (page-locked where it can be) copied to the device on the lane's read stream."""
    import cupy

    with cupy.cuda.Device(engine.device), lane.read_stream:
        value = cupy.empty(host.shape, host.dtype)
        value.set(host, stream=lane.read_stream)
    lane.read_stream.synchronize()
    return value


def _device_read(engine, dio: DeviceIO, lane, name: str, start: int, stop: int, parity: int):
    """Matrices ``[start, stop)`` decoded on the device (:meth:`batchlu.pipeline.codecs._gpu.Lane.decode`)
    and the gaps it found; frames that fail are read through zarr instead, or stop the run naming
    the chunk."""
    from ..codecs._gpu import FrameError

    io = dio.io
    array = io.array(name)
    try:
        return lane.decode(dio.stored[name], start, stop, parity)
    except FrameError as exc:
        logger.warning("batchlu: GPU decode of matrices %d:%d failed (%s); reading them through zarr",
                       start, stop, exc)
        try:
            host = np.ascontiguousarray(array[start:stop])
        except Exception as again:
            io.unreadable(name, start, stop, again)   # raises CorruptInputError naming the file
            raise
        # zarr reads it: use zarr's values, and ask the store for the gaps (None)
        return _to_device(engine, lane, host), None


def _routed_read(engine, dio: DeviceIO, lane, name: str, start: int, stop: int, parity: int, slot):
    """Matrices ``[start, stop)`` of an input of large frames: decoded by the I/O processes when the
    group's frames are compressed (stored in under ``COMPRESSED`` of their decoded bytes), else by
    nvCOMP. nvCOMP decodes a frame in one thread block: a few large compressed frames keep a few of
    the GPU's multiprocessors busy for as long as one takes (a 32 MiB frame of values rounded to 2
    decimals: about half a second), where the host's processes decode them side by side; frames
    stored raw it copies at tens of GB/s."""
    from ..codecs import _reader as _codecs
    from ..store import _missing

    stored = dio.stored[name]
    reads = _codecs.plan_reads(stored, start, stop)
    size = sum(_codecs.frame_sizes(reads))
    if size >= _codecs.COMPRESSED * (stop - start) * stored.matrix_bytes:
        return _device_read(engine, dio, lane, name, start, stop, parity)
    # the store is asked while the host reads (a missing chunk reads as the fill value): its answer
    # comes back with the values, and the caller fails or marks those matrices
    lookup = None if dio.io.lookup is None else (lambda: _missing.find(dio.io.array(name), start, stop))
    host, gaps = _host_read(dio, name, start, stop, slot, lookup)
    return _to_device(engine, lane, host), gaps or []


def _digests(chunk: int, start: int, stop: int, a, b, missing) -> np.ndarray:
    """The digest of each output chunk's input (``a`` then ``b``, and the chunk's matrices in
    ``missing``): :func:`batchlu.pipeline.output._fingerprint.chunk_digests`, its XXH3-64 taken on the device."""
    from batchlu.kernels._gpu import _xxh3 as gpu_xxh3

    from ..output import _fingerprint

    los = list(range(0, stop - start, chunk))
    his = [min(lo + chunk, stop - start) for lo in los]

    def values(x):
        per = int(np.prod(x.shape[1:], dtype=np.int64)) * x.dtype.itemsize
        return gpu_xxh3.digests(x, [lo * per for lo in los], [(hi - lo) * per for lo, hi in zip(los, his)])

    digests = values(a)
    if b is not None:
        digests = [_fingerprint.pair(int(x), int(y)) for x, y in zip(digests, values(b))]
    return _fingerprint.fold_chunks(chunk, digests, missing)


class DeviceRead:
    """The read stage: group ``unit``'s inputs on the device, its gaps, and its chunks' input
    digests (see the module docstring)."""

    def __init__(self, engine, dio: DeviceIO, lane, slots):
        self.engine, self.dio, self.lane, self.slots = engine, dio, lane, slots
        io = dio.io
        self.host_inputs = any(dio.stored.get(name) is None for name in ("a", "b") if io.array(name) is not None)

    def __call__(self, unit: Unit) -> None:
        import cupy

        engine, dio, lane, io = self.engine, self.dio, self.lane, self.dio.io
        start, stop, parity = unit.start, unit.stop, unit.index % 2
        # the store is asked before a host read; the GPU decode finds the gaps itself as it reads
        gaps = io.lookup(start, stop) if io.lookup is not None and self.host_inputs else None
        slot = None if self.slots is None else self.slots[parity]
        a, found_a = _input(engine, dio, lane, "a", start, stop, parity, slot)
        b, found_b = (None, None) if io.rhs is None else _input(engine, dio, lane, "b", start, stop, parity, slot)
        if io.lookup is not None and not self.host_inputs:
            gaps = io.lookup(start, stop, {"a": found_a, "b": found_b})
        if io.digest_chunk is not None:
            with cupy.cuda.Device(engine.device), lane.read_stream:
                unit.digests = _digests(io.digest_chunk, start, stop, a, b, gaps)
        unit.inputs, unit.gaps = (a, b), gaps
        unit.bytes_in = a.nbytes + (0 if b is None else b.nbytes)


class DeviceCompute:
    """The compute stage: the kernels once per batch of the group (see the module docstring), the
    matrices of missing chunks then marked (``missing-chunks: fill``)."""

    def __init__(self, engine, op, io: BatchIO):
        self.engine, self.op = engine, op
        self.shapes = {name: tuple(arr.shape[1:]) for name, arr in io.outputs.items()}

    def __call__(self, unit: Unit) -> None:
        import cupy

        a, b = unit.inputs
        g0 = unit.start
        outs = self.engine.run_device(self.op, a, b, self.shapes, [(lo - g0, hi - g0) for lo, hi in unit.batches])
        if unit.gaps is not None:
            _mark_missing_device(outs, unit.gaps)
        unit.outputs = outs
        unit.info = cupy.asnumpy(outs["info"]) if "info" in outs else None


class DeviceWrite:
    """The write stage: encode the group's outputs and start writing their files (the record stage
    waits for them, the I/O threads writing one group while the GPU encodes the next). An output
    whose codec runs on the host is copied back into the slot and written by the I/O processes (or
    zarr here) in the background the same way. Fenced first."""

    def __init__(self, engine, dio: DeviceIO, lane, slots, host_writer, record: Record):
        self.engine, self.dio, self.lane, self.slots = engine, dio, lane, slots
        self.host_writer, self.record = host_writer, record

    def __call__(self, unit: Unit) -> None:
        import cupy

        dio, lane, outs = self.dio, self.lane, unit.outputs
        start, stop, parity = unit.start, unit.stop, unit.index % 2
        self.record.check()   # before the first file of the group is written
        coded = [(dio.stored[name], value) for name, value in outs.items() if dio.stored.get(name) is not None]
        unit.writes = lane.encode(coded, start, parity) if coded else []
        host = [name for name in outs if dio.stored.get(name) is None]
        if host:
            values = {name: self.slots[parity].outs[name][:stop - start] for name in host}
            with cupy.cuda.Device(self.engine.device), lane.write_stream:
                for name in host:
                    outs[name].get(stream=lane.write_stream, out=values[name])
            lane.write_stream.synchronize()
            unit.writes.append(self.host_writer.submit(_host_write, dio.io, host, start, stop, values))


def _host_write(io: BatchIO, names: list[str], start: int, stop: int, values: dict) -> None:
    """Outputs ``names`` of matrices ``[start, stop)`` written from ``values`` (in the slot): by the I/O
    processes, else through zarr here."""
    if io.pool is not None and io.where and all(locate(v) is not None for v in values.values()):
        pool_write(io, names, start, stop, values, io.pool.processes * io.pool.threads)
    else:
        for name in names:
            io.outputs[name][start:stop] = values[name]


def _mark_missing_device(outs: dict, gaps) -> None:
    """:func:`batchlu.pipeline._ops.mark_missing` for device outputs, complete when it returns: the
    writer thread reads them on the lane's write stream, which does not wait for this thread's."""
    import cupy

    host = {name: cupy.asnumpy(value) for name, value in outs.items()}
    _ops.mark_missing(host, gaps)
    for name, value in host.items():
        outs[name][...] = cupy.asarray(value)
    cupy.cuda.get_current_stream().synchronize()
