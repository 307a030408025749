"""The GPU codec path (issue 18) on a GPU with nvCOMP: frames written by zarr decode on the device to
zarr's values, frames encoded on the device read back with plain zarr, bit for bit and the same bytes
every time; the device XXH3-64 is xxhash's; whole runs through the GPU codecs give the host path's bits,
survive a killed run and a killed worker, and name a corrupt chunk.

Run on the GPU machine with nvCOMP installed: ``BATCHLU_REQUIRE_NVCOMP=1 pytest -m gpu tests/pipeline/test_gpu_codecs.py``
(without that variable, the tests skip where nvCOMP is absent)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import dask
import numpy as np
import pytest
import zarr

from batchlu import pipeline
from batchlu.pipeline.output import _group
from batchlu.pipeline.codecs import _choice
from batchlu.pipeline.config._settings import TESTING_TASK_DELAY
from batchlu.pipeline.cluster._devices import visible_gpus
from batchlu.pipeline.cluster._gpu_cluster import make_gpu_cluster
from batchlu.pipeline.errors import CorruptInputError
from batchlu.testing.ratios import THRESHOLD, get01
from _pipeline_helpers import complete_flags, complete_flags_once_created, require_nvcomp, wait_partly_complete
from test_codecs import LAYOUTS, OUTPUTS

pytestmark = pytest.mark.gpu
RNG = np.random.default_rng()


@pytest.fixture(autouse=True)
def _nvcomp():
    pytest.importorskip("cupy")
    require_nvcomp()


def _lane():
    from batchlu.pipeline.codecs import _gpu

    return _gpu.lane(0)


def test_device_xxh3_is_xxhashs():
    """Ranges of every kind: empty and short (XXH3's short paths, hashed on the host), unaligned (on
    the host), on the device around the stripe and block ends, and long (thousands of blocks)."""
    import cupy
    import xxhash

    from batchlu.kernels._gpu import _xxh3 as gpu_xxh3

    data = RNG.integers(0, 256, 3_000_004, dtype=np.uint8)
    ranges = [(0, 0), (0, 1), (5, 255), (8, 240), (4, 244), (16, 1020), (12, 1024), (4, 1028),
              (1024, 2048), (100, 4100), (1000, 1_000_000), (12, 2_999_988), (7, 4000)]
    got = gpu_xxh3.digests(cupy.asarray(data), [o for o, _ in ranges], [n for _, n in ranges])
    assert got.dtype == np.uint64 and got.shape == (len(ranges),)
    for (offset, length), value in zip(ranges, got):
        assert int(value) == xxhash.xxh3_64_intdigest(data[offset:offset + length].tobytes()), (offset, length)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_frames_written_by_zarr_decode_on_the_gpu(tmp_path, layout):
    x = RNG.standard_normal((40, 5, 5))
    array = zarr.create_array(str(tmp_path / "a.zarr"), shape=x.shape, dtype=x.dtype, **LAYOUTS[layout])
    array[:] = x
    stored = _choice.choose(array, "gpu", gpu=True, nvcomp=None).stored
    for start, stop in ((0, stored.unit), (stored.unit, 40), (0, 40)):
        got, gaps = _lane().decode(stored, start, stop, 0)
        assert gaps == []
        assert got.get().tobytes() == x[start:stop].tobytes()


def _output_array(path, layout: str, x, fill):
    """An empty array shaped like ``x`` in output layout ``layout`` (:data:`test_codecs.OUTPUTS`)."""
    spec = dict(OUTPUTS[layout])
    codec, crc = spec.pop("codec", "zstd"), spec.pop("crc", False)
    compressors = _group.compressors(codec)
    if crc:
        compressors = [compressors, zarr.codecs.Crc32cCodec()]
    return zarr.create_array(str(path), shape=x.shape, dtype=x.dtype, fill_value=fill, compressors=compressors,
                             **spec)


@pytest.mark.parametrize("layout", sorted(OUTPUTS))
def test_frames_encoded_on_the_gpu_read_back_with_zarr_and_repeat(tmp_path, layout):
    import cupy

    x = RNG.standard_normal((16, 5, 5))
    stores = []
    for name in ("one.zarr", "two.zarr"):
        array = _output_array(tmp_path / name, layout, x, np.nan)
        stored = _choice.choose(array, "gpu", gpu=True, nvcomp=None).stored
        unit = stored.unit
        for lo in range(0, 16, unit):   # one batch per stored object, the last one partial
            for write in _lane().encode([(stored, cupy.asarray(x[lo:lo + unit]))], lo, lo // unit % 2):
                write.result()
        assert zarr.open_array(str(tmp_path / name), mode="r")[:].tobytes() == x.tobytes()
        stores.append(tmp_path / name)
    files = sorted(p.relative_to(stores[0]) for p in stores[0].rglob("*") if p.is_file() and "zarr.json" not in p.name)
    assert files
    for rel in files:   # deterministic: the same frames, byte for byte
        assert (stores[0] / rel).read_bytes() == (stores[1] / rel).read_bytes(), rel


SPIN = r"""extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}"""


@pytest.mark.parametrize("layout", sorted(OUTPUTS))
def test_encode_waits_for_values_still_in_the_making_on_the_callers_stream(tmp_path, layout):
    """The race of the GPU encode under load, made certain: the value is still being written on the
    caller's stream (held back by a kernel that spins for ~0.1 s) when ``encode`` is called. The lane's
    write stream must wait for it, not copy or compress what the value held before (NaN here)."""
    import cupy

    spin = cupy.RawKernel(SPIN, "spin")
    x = RNG.standard_normal((16, 5, 5))
    array = _output_array(tmp_path / "out.zarr", layout, x, 0.0)
    stored = _choice.choose(array, "gpu", gpu=True, nvcomp=None).stored
    unit = stored.unit
    producer = cupy.cuda.Stream(non_blocking=True)
    for lo in range(0, 16, unit):
        source = cupy.asarray(x[lo:lo + unit])
        value = cupy.full(source.shape, cupy.nan)
        cupy.cuda.Device().synchronize()
        with producer:
            spin((1,), (1,), (np.int64(200_000_000),))
            value[...] = source   # queued behind the spin on the producer stream
            writes = _lane().encode([(stored, value)], lo, lo // unit % 2)
        for write in writes:
            write.result()
    assert zarr.open_array(str(tmp_path / "out.zarr"), mode="r")[:].tobytes() == x.tobytes()


def _outputs(path) -> dict:
    group = zarr.open_group(str(path), mode="r")
    return {name: np.asarray(a[...]) for name, a in group.arrays() if not name.startswith("_complete")}


def _identical(path, reference) -> None:
    got, want = _outputs(path), _outputs(reference)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].tobytes() == want[name].tobytes(), name


QUIET = {"cluster.dashboard-address": "127.0.0.1:0"}
GROUP = "200KiB"   # the kill tests: groups of two 96 KiB chunks, so that the ledger fills in steps


def _config(**extra):
    return {**QUIET, "cluster.gpus": visible_gpus()[0], **extra}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("codecs")
    return {
        "chunks": pipeline.generate(root / "c.zarr", count=960, size=16, chunk=48, kind="singular-mix", seed=5),
        "sharded": pipeline.generate(root / "s.zarr", count=960, size=16, chunk=48, kind="singular-mix",
                                     seed=5, layout="sharded"),
        "rhs": pipeline.generate_rhs(root / "b.zarr", count=960, size=16, k=3, chunk=48, seed=6,
                                     layout="sharded"),
    }


@pytest.mark.parametrize("op", ["lu", "inv", "solve", "slogdet"])
@pytest.mark.parametrize("layout", ["chunks", "sharded"])
def test_gpu_codecs_give_the_host_paths_bits(inputs, tmp_path, op, layout):
    rhs = inputs["rhs"] if op == "solve" else None
    host = pipeline.run(inputs[layout], str(tmp_path / "host.zarr"), op=op, rhs=rhs, backend="gpu",
                        progress=False, config=_config(**{"codec-device": "cpu", "output-layout": layout}))
    gpu = pipeline.run(inputs[layout], str(tmp_path / "gpu.zarr"), op=op, rhs=rhs, backend="gpu",
                       progress=False, config=_config(**{"codec-device": "gpu", "output-layout": layout}))
    assert all(where.startswith("cpu") for where in host.codecs.values()), host.codecs
    outputs = {name: where for name, where in gpu.codecs.items() if name not in ("a", "b")}
    assert all(where.startswith("gpu") for where in outputs.values()), gpu.codecs
    # zstd inputs decode on the GPU, their crc32c checked on the host (generate writes crc32c in both layouts)
    assert gpu.codecs["a"].startswith("gpu"), gpu.codecs
    assert "crc32c" in gpu.codecs["a"], gpu.codecs
    assert gpu.counts == host.counts and gpu.singular > 0
    _identical(tmp_path / "gpu.zarr", tmp_path / "host.zarr")
    assert pipeline.verify(inputs[layout], str(tmp_path / "gpu.zarr"), rhs=rhs).ok


def test_corrupt_frames_name_the_chunk_and_write_nothing_from_them(tmp_path):
    path = pipeline.generate(tmp_path / "a.zarr", count=240, size=16, chunk=24, seed=9, layout="sharded")
    victim = os.path.join(path, "c", "4", "0", "0")
    data = bytearray(open(victim, "rb").read())
    data[len(data) // 3] ^= 0xFF   # a damaged frame inside the shard: its crc32c no longer matches
    open(victim, "wb").write(bytes(data))
    with pytest.raises(CorruptInputError, match=r"c/4/0/0 \(matrices 96:120\)"):
        pipeline.run(path, str(tmp_path / "out.zarr"), op="inv", backend="gpu", progress=False,
                     config=_config(**{"codec-device": "gpu"}))
    flags = complete_flags_once_created(tmp_path / "out.zarr")
    assert flags is None or not flags[4]


@pytest.mark.parametrize("damage", ["truncated", "trailing bytes", "frame header"])
def test_damaged_frames_without_checksum_name_the_chunk_and_write_nothing_from_them(tmp_path, damage):
    """A zstd input without crc32c decodes on the GPU after its frames' structure is checked on the
    host: a frame cut short (which nvCOMP decoded without an error) stops the run, naming its file."""
    path = pipeline.generate(tmp_path / "a.zarr", count=240, size=16, chunk=24, seed=9)
    victim = os.path.join(path, "c", "4", "0", "0")
    data = bytearray(open(victim, "rb").read())
    if damage == "truncated":
        data = data[:len(data) // 2]
    elif damage == "trailing bytes":
        data += b"\x00" * 8
    else:
        data[4] |= 0x08   # the frame header's reserved bit
    open(victim, "wb").write(bytes(data))
    with pytest.raises(CorruptInputError, match=r"c/4/0/0 \(matrices 96:120\)"):
        pipeline.run(path, str(tmp_path / "out.zarr"), op="inv", backend="gpu", progress=False,
                     config=_config(**{"codec-device": "gpu", "device-batch-bytes": "8KiB"}))
    flags = complete_flags_once_created(tmp_path / "out.zarr")
    assert flags is None or not flags[4]


def test_a_frame_nvcomp_refuses_is_read_through_zarr(tmp_path, monkeypatch):
    """The fallback inside one worker thread: nvCOMP refusing a batch (simulated) never writes its
    bytes; zarr's values are used."""
    import cupy

    from batchlu.pipeline.worker import _batches, _device_batches
    from batchlu.pipeline.worker import _engines
    from batchlu.pipeline.codecs import _gpu

    x = RNG.standard_normal((24, 6, 6))
    array = zarr.create_array(str(tmp_path / "a.zarr"), shape=x.shape, dtype=x.dtype, chunks=(8, 6, 6))
    array[:] = x
    stored = _choice.choose(array, "gpu", gpu=True, nvcomp=None).stored
    lane = _gpu.lane(0)

    def refuse(*args, **kwargs):
        raise _gpu.FrameError("simulated")

    monkeypatch.setattr(lane, "decode", refuse)
    io = _batches.BatchIO(array, None, {})
    dio = _device_batches.DeviceIO(io, {"a": stored}, 8)
    got, found = _device_batches._input(_engines.current_engine(), dio, lane, "a", 8, 24, 0, None)
    assert isinstance(got, cupy.ndarray) and got.get().tobytes() == x[8:24].tobytes()
    assert found is None   # read on the host: the missing-chunk check asks the store


def test_killed_run_resumes_bit_identical_through_gpu_codecs(inputs, tmp_path):
    reference = tmp_path / "reference.zarr"
    pipeline.run(inputs["sharded"], str(reference), op="lu", backend="gpu", progress=False,
                 config=_config(**{"codec-device": "cpu", "output-layout": "sharded"}))
    out = tmp_path / "killed.zarr"
    env = dict(os.environ, DASK_BATCHLU_TESTING__TASK_DELAY="0.5")
    cmd = [sys.executable, "-m", "batchlu", "run", str(inputs["sharded"]), str(out), "--op", "lu", "--backend",
           "gpu", "--codec-device", "gpu", "--output-layout", "sharded", "--config", f"device-batch-bytes={GROUP}",
           "--config", "cluster.dashboard-address=127.0.0.1:0", "--config", f"cluster.gpus={visible_gpus()[0]}"]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        done = complete_flags_once_created(out)
        if done is not None and 3 <= done.sum() < done.size // 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = complete_flags(out)
    assert 0 < done.sum() < done.size
    resumed = subprocess.run([a for a in cmd if a != "--output-layout" and a != "sharded"] + ["--resume"],
                             env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "skipped" in resumed.stdout and "codec of the input: gpu" in resumed.stdout
    assert "context is destroyed" not in resumed.stdout + resumed.stderr
    _identical(out, reference)


def test_killed_worker_restarted_by_its_nanny_gives_the_same_bits(inputs, tmp_path):
    from distributed import Client

    reference = tmp_path / "reference.zarr"
    pipeline.run(inputs["sharded"], str(reference), op="inv", backend="gpu", progress=False,
                 config=_config(**{"codec-device": "cpu"}))
    out = tmp_path / "killed.zarr"
    with make_gpu_cluster(visible_gpus()[:1], threads_per_worker=2, dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster) as client:
        pid = list(client.run(os.getpid).values())[0]
        box = {}

        def target():
            try:
                with dask.config.set({TESTING_TASK_DELAY: 0.5}):
                    box["report"] = pipeline.run(inputs["sharded"], str(out), op="inv", backend="gpu",
                                                 client=client, progress=False,
                                                 config={"codec-device": "gpu", "device-batch-bytes": GROUP})
            except BaseException as exc:  # pragma: no cover - reported below
                box["error"] = exc

        thread = threading.Thread(target=target)
        thread.start()
        wait_partly_complete(out)
        os.kill(pid, signal.SIGKILL)   # the nanny starts a new worker process
        thread.join(300)
        assert not thread.is_alive()
        if "error" in box:
            raise box["error"]
        assert list(client.run(os.getpid).values())[0] != pid
    report = box["report"]
    assert report.status == "complete" and report.codecs["a"].startswith("gpu")
    _identical(out, reference)


def test_staging_buffers_reserved_at_warm_up_are_what_lanes_take():
    """Warm-up pins the lanes' staging buffers once per process (pinning is slow): a lane growing its
    buffer takes a spare, and reserving again counts what the lanes hold."""
    from batchlu.pipeline.codecs import _gpu

    size = 3 << 20
    _gpu.reserve(2, size)
    spares = len(_gpu._SPARES)
    assert spares >= 2
    lane = _gpu.Lane(0)
    _gpu._LANES.add(lane)
    view = lane._read[0].get(size - 5)
    assert view.nbytes == size - 5 and len(_gpu._SPARES) == spares - 1
    view[:] = 7   # writable host memory
    _gpu.reserve(2, size)   # the lane's buffer counts: nothing new is pinned
    assert len(_gpu._SPARES) == spares - 1


def test_routed_reads_and_host_writes_give_the_device_paths_bits(tmp_path, monkeypatch):
    """codec-device auto, an input of large frames: a group of compressed frames is decoded by the I/O
    processes, one of frames stored raw by nvCOMP; outputs whose codec runs on the host are written by
    the I/O processes from the slot. Both give the bits of the device-only path (outputs written by
    zarr here), every element written; a chunk missing from a group read on the host is found by
    asking the store."""
    from batchlu.pipeline.worker import _batches, _device_batches
    from batchlu.pipeline.worker import _engines, _io_pool
    from batchlu.pipeline.codecs import _gpu
    from batchlu.pipeline.store._missing import Gap
    from batchlu.pipeline._ops import output_specs
    from batchlu.testing.matrices import generate as matrices

    monkeypatch.setattr(_choice, "AUTO_FRAME_BYTES", 1024)   # these 400 KiB frames count as large
    count, n, chunk = 400, 32, 50
    x = matrices("random", n, "float64", seed=31, start=0, stop=count)
    x[:count // 2] = np.round(x[:count // 2], 2)   # the first groups compress (ratio about 3), the rest not
    array = zarr.create_array(str(tmp_path / "a.zarr"), shape=x.shape, dtype=x.dtype, chunks=(chunk, n, n))
    array[:] = x
    choice = _choice.choose(array, "auto", gpu=True, nvcomp=None, reading=True)
    assert choice.device == "gpu" and choice.route
    engine = _engines.CudaEngine(0, threads=2)
    pool = _io_pool.get_pool(2, 2)
    batches = [(s, s + chunk) for s in range(0, count, chunk)]
    host_reads = []
    real = _device_batches._host_read
    monkeypatch.setattr(_device_batches, "_host_read",
                        lambda dio, name, start, stop, slot, meanwhile=None:
                        host_reads.append((start, stop)) or real(dio, name, start, stop, slot, meanwhile))
    got, seen = {}, []
    for mode in ("device", "routed"):
        group = zarr.open_group(str(tmp_path / f"{mode}.zarr"), mode="w")
        outs = {spec.name: group.create_array(spec.name, shape=(count,) + spec.tail, dtype=spec.dtype,
                                              chunks=(chunk,) + spec.tail,
                                              fill_value=-7 if spec.dtype.kind == "i" else np.nan)
                for spec in output_specs("lu", n, "float64")}
        where = {"a": (str(tmp_path / "a.zarr"), ""), **{k: (str(tmp_path / f"{mode}.zarr"), k) for k in outs}}
        io = _batches.BatchIO(array, None, outs, pool=pool if mode == "routed" else None, where=where,
                              lookup=lambda s, e, found=None: seen.append((s, e, found)) and None)
        dio = _device_batches.DeviceIO(io, {"a": choice.stored}, chunk, group_bytes=4 * chunk * n * n * 8,
                                       routed=frozenset({"a"}))
        assert _device_batches._routed(dio, "a") == (mode == "routed")
        stats = _device_batches.run_device_batches(engine, "lu", dio, batches)
        assert stats.matrices == count
        got[mode] = {name: np.asarray(arr[...]) for name, arr in outs.items()}
    assert host_reads == [(0, 200)]   # the compressed group; the raw one went to nvCOMP
    assert [found for s, e, found in seen[-2:]] == [{"a": [], "b": None}, {"a": [], "b": None}]
    for name, value in got["device"].items():
        assert got["routed"][name].tobytes() == value.tobytes(), name
    assert not np.isnan(got["routed"]["lu"]).any() and (got["routed"]["info"] == 0).all()
    assert get01(x, got["routed"]["lu"], got["routed"]["piv"]).max() < THRESHOLD
    # a chunk missing from a group the host reads: found by asking the store before the read
    os.remove(tmp_path / "a.zarr" / "c" / "0" / "0" / "0")
    io = _batches.BatchIO(array, None, {}, pool=pool, where={"a": (str(tmp_path / "a.zarr"), "")},
                          lookup=lambda s, e, found=None: None)
    dio = _device_batches.DeviceIO(io, {"a": choice.stored}, chunk, routed=frozenset({"a"}))
    layout = _device_batches.Layout(a=((n, n), np.dtype("float64")), b=None, outs=())
    with engine.pool.borrow(layout, 4 * chunk) as pair, _gpu.borrow(0) as lane:
        value, found = _device_batches._input(engine, dio, lane, "a", 0, 4 * chunk, 0, pair[0])
    assert found == [Gap("c/0/0/0", None, 0, chunk)]
    assert value.get()[chunk:].tobytes() == x[chunk:4 * chunk].tobytes()


def test_tasks_borrow_the_pinned_slots_the_warm_up_reserved(tmp_path, monkeypatch):
    """Pinning host memory is slow (about 0.4 s per GiB on the H100 machine), so a GPU run pins at
    warm-up what its tasks will use and nothing else: on the GPU codec path a task per lane at a time,
    each borrowing a pair of the path's own layout (an input read on the host, no buffer for outputs
    encoded on the device). No task pins a pair of its own, and the warm-up pins none it never lends."""
    from distributed import Client

    from batchlu.pipeline.codecs import _gpu
    from batchlu.testing.matrices import generate as matrices

    require_nvcomp()
    monkeypatch.setattr(_choice, "AUTO_FRAME_BYTES", 1024)   # the client's choice: these frames count as large
    count, n, chunk = 400, 32, 50
    x = matrices("random", n, "float64", seed=37, start=0, stop=count)
    x[:count // 2] = np.round(x[:count // 2], 2)   # compressed groups go to the host, the others to nvCOMP
    source = zarr.create_array(str(tmp_path / "a.zarr"), shape=x.shape, dtype=x.dtype, chunks=(chunk, n, n))
    source[:] = x
    out = tmp_path / "out.zarr"
    with make_gpu_cluster(visible_gpus()[:1], threads_per_worker=4, dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster) as client:
        report = pipeline.run(str(tmp_path / "a.zarr"), str(out), op="inv", backend="gpu", client=client,
                              progress=False, config={"device-batch-bytes": 1 << 20, "chunk": chunk})

        def pool_state():
            from batchlu.pipeline.worker import _engines

            pool = _engines.current_engine().pool
            return pool.allocations, pool.pairs, [(lay, rows) for lay, rows, _ in pool._free]

        (allocations, pairs, free), = client.run(pool_state).values()
    assert report.status == "complete" and report.codecs["a"].startswith("gpu") and report.tasks > 1
    assert "pinned slots" in report.warmup_steps and "codec staging" in report.warmup_steps, report.warmup_steps
    assert allocations == pairs == _gpu.LANES, (allocations, pairs, free)
    for layout, rows in free:   # the input's buffer only: inv and info are encoded on the device
        assert layout.a == ((n, n), np.dtype("float64")) and layout.b is None and layout.outs == ()
        assert rows == (1 << 20) // (n * n * 8)   # a group of 1 MiB of input (slot_rows)
    result = pipeline.verify(str(tmp_path / "a.zarr"), str(out))
    assert result.ok and result.checked == count, result.summary()
