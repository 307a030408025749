"""The batch loop (batchlu.pipeline.worker._batches): double-buffered read -> compute -> write.

The loop is the same on the CPU (HostEngine) and the GPU (CudaEngine), so most of it is tested here
without a device; the ``gpu`` tests at the end run it on CuPy with pinned buffers.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
import zarr

from batchlu import kernels
from batchlu.testing.matrices import generate, rhs as make_rhs
from batchlu.testing.ratios import THRESHOLD, get01, get02, get03, slogdet_ratios
from batchlu.pipeline.worker import _buffers, _engines
from batchlu.pipeline.worker._batches import BatchIO, run_batches, split_requests, sub_batches
from batchlu.pipeline.worker._engines import HostEngine
from batchlu.pipeline._ops import output_specs
from batchlu.pipeline._plan import Plan
from batchlu.pipeline.errors import CorruptInputError

from _pipeline_helpers import recording

DTYPES = ("float32", "float64", "complex64", "complex128")
# Fill of the output stores: no kernel result equals it (NaN, 0 and -inf are results of bad matrices),
# so an element never written shows; a power of two, exact in every dtype.
FILL, INT_FILL = 2.0 ** 100, -7777


def _store(tmp_path, name, data, chunk):
    arr = zarr.create_array(str(tmp_path / name), shape=data.shape, dtype=data.dtype,
                            chunks=(chunk,) + data.shape[1:])
    arr[...] = data
    return zarr.open_array(str(tmp_path / name), mode="r")


def _outputs(tmp_path, op, n, dtype, count, chunk, rhs_dtype=None, k=None):
    """Output arrays poisoned with a fill that no kernel result equals."""
    group = zarr.open_group(str(tmp_path / f"out-{op}.zarr"), mode="w")
    outs = {}
    for spec in output_specs(op, n, dtype, rhs_dtype, k):
        fill = INT_FILL if spec.dtype.kind in "iu" else FILL
        outs[spec.name] = group.create_array(spec.name, shape=(count,) + spec.tail, dtype=spec.dtype,
                                             chunks=(chunk,) + spec.tail, fill_value=fill)
    return outs


def _ranges(count, chunk, per):
    step = chunk * per
    return [(s, min(s + step, count)) for s in range(0, count, step)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["lu", "inv", "solve", "slogdet"])
def test_host_path_matches_kernels(tmp_path, op, dtype):
    count, n, chunk = 53, 9, 7  # chunks do not divide N
    a = generate("singular-mix" if dtype == "float64" else "random", n, dtype, seed=3, start=0, stop=count)
    src = _store(tmp_path, "a.zarr", a, chunk)
    b = rhs = None
    if op == "solve":
        b = make_rhs(n, 2, dtype, seed=4, start=0, stop=count)
        rhs = _store(tmp_path, "b.zarr", b, chunk)
    outs = _outputs(tmp_path, op, n, dtype, count, chunk, dtype if b is not None else None,
                    2 if b is not None else None)
    marks = []
    io = BatchIO(src, rhs, outs)
    ranges = _ranges(count, chunk, 2)
    stats = run_batches(HostEngine(), op, io, ranges, record=recording(marks))

    assert marks == ranges  # every batch recorded, in order, after its writes
    assert stats.matrices == count
    assert stats.bytes_in == a.nbytes + (0 if b is None else b.nbytes)
    got = {name: arr[...] for name, arr in outs.items()}
    info = got["info"]
    assert info.dtype == np.int32 and info.shape == (count,)
    assert (stats.ok, stats.singular, stats.nonfinite) == (
        int((info == 0).sum()), int((info > 0).sum()), int((info < 0).sum()))
    # the same kernels on the whole array give bit-identical results, batch by batch
    want = {"lu": lambda: dict(zip(("lu", "piv", "info"), kernels.lu_factor(a))),
            "inv": lambda: dict(zip(("inv", "info"), kernels.inv(a))),
            "solve": lambda: dict(zip(("x", "info"), kernels.solve(a, b))),
            "slogdet": lambda: dict(zip(("sign", "logabsdet", "info"), kernels.slogdet(a)))}[op]()
    for name, value in want.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape
        np.testing.assert_array_equal(got[name], value)
    good = info == 0
    assert good.any()
    if op == "lu":
        assert get01(a[good], got["lu"][good], got["piv"][good]).max() < THRESHOLD
    if op == "inv":
        assert get03(a[good], got["inv"][good]).max() < THRESHOLD
        assert np.isnan(got["inv"][~good]).all()
    if op == "solve":
        assert get02(a[good], got["x"][good], b[good]).max() < THRESHOLD
    if op == "slogdet":
        assert max(r.max() for r in slogdet_ratios(a[good], got["sign"][good], got["logabsdet"][good])) < THRESHOLD


class _SlowArray:
    """A Zarr array stand-in whose reads and writes take ``delay`` seconds (to see the overlap)."""

    def __init__(self, data, delay, log, name):
        self.data, self.delay, self.log, self.name = data, delay, log, name
        self.shape, self.dtype = data.shape, data.dtype

    def get_basic_selection(self, selection, out=None):
        self.log.append(("read", selection[0].start, time.perf_counter()))
        time.sleep(self.delay)
        out.as_numpy_array()[...] = self.data[selection]

    def __getitem__(self, key):
        time.sleep(self.delay)
        return self.data[key]

    def __setitem__(self, key, value):
        self.log.append(("write", key.start, time.perf_counter()))
        time.sleep(self.delay)
        self.data[key] = value


class _SlowEngine(HostEngine):
    def __init__(self, delay):
        super().__init__()
        self.delay = delay

    def run(self, op, slot):
        time.sleep(self.delay)
        super().run(op, slot)


def test_read_compute_write_overlap(tmp_path):
    count, n, chunk, delay = 48, 4, 8, 0.08
    a = generate("random", n, "float64", seed=5, start=0, stop=count)
    log = []
    src = _SlowArray(a, delay, log, "a")
    outs = {"inv": _SlowArray(np.full((count, n, n), np.nan), delay / 2, log, "inv"),
            "info": _SlowArray(np.full((count,), -7, np.int32), delay / 2, log, "info")}
    ranges = _ranges(count, chunk, 1)  # 6 batches
    t = time.perf_counter()
    stats = run_batches(_SlowEngine(delay), "inv", BatchIO(src, None, outs), ranges)
    wall = time.perf_counter() - t
    serial = len(ranges) * 3 * delay
    # three stages of `delay` each: serial ~ 6 * 3 * delay, overlapped ~ (6 + 2) * delay
    assert wall < 0.75 * serial, (wall, serial)
    assert stats.read_s + stats.compute_s + stats.write_s > 1.3 * wall
    reads = {s: t for kind, s, t in log if kind == "read"}
    writes = {s: t for kind, s, t in log if kind == "write"}
    # batch i + 1 is read before batch i is written: reading runs ahead of writing
    assert all(reads[ranges[i + 1][0]] < writes[ranges[i][0]] for i in range(len(ranges) - 1))
    np.testing.assert_array_equal(outs["inv"].data, kernels.inv(a)[0])


class _OOMEngine(HostEngine):
    """Raises the engine's out-of-memory error for any piece larger than ``limit`` matrices."""

    def __init__(self, limit):
        super().__init__()
        self.limit, self.sizes, self.released = limit, [], 0

    def run(self, op, slot):
        self.sizes.append(slot.a.shape[0])
        if slot.a.shape[0] > self.limit:
            raise MemoryError("out of memory (test)")
        super().run(op, slot)

    def release(self):
        self.released += 1


def test_out_of_memory_splits_and_retries(tmp_path):
    count, n, chunk = 100, 6, 25
    a = generate("singular-mix", n, "float64", seed=6, start=0, stop=count)
    src = _store(tmp_path, "a.zarr", a, chunk)
    outs = _outputs(tmp_path, "lu", n, "float64", count, chunk)
    engine = _OOMEngine(limit=12)
    stats = run_batches(engine, "lu", BatchIO(src, None, outs), _ranges(count, chunk, 2))
    assert stats.oom_splits >= 2 and engine.released == stats.oom_splits
    assert max(s for s in engine.sizes if s <= engine.limit) <= 12
    lu, piv, info = kernels.lu_factor(a)
    np.testing.assert_array_equal(outs["lu"][...], lu)
    np.testing.assert_array_equal(outs["piv"][...], piv)
    np.testing.assert_array_equal(outs["info"][...], info)


def test_out_of_memory_on_one_matrix_raises(tmp_path):
    a = generate("random", 3, "float64", seed=7, start=0, stop=8)
    src = _store(tmp_path, "a.zarr", a, 4)
    outs = _outputs(tmp_path, "inv", 3, "float64", 8, 4)
    marks = []
    with pytest.raises(MemoryError):
        run_batches(_OOMEngine(limit=0), "inv", BatchIO(src, None, outs), _ranges(8, 4, 1),
                    record=recording(marks))
    assert marks == []  # nothing recorded complete
    assert (outs["inv"][...] == FILL).all()  # nothing written


def test_pinned_slots_are_reused_not_grown(tmp_path):
    count, n, chunk = 40, 5, 10
    a = generate("random", n, "complex128", seed=8, start=0, stop=count)
    src = _store(tmp_path, "a.zarr", a, chunk)
    engine = HostEngine()
    sizes = []
    for repeat in range(4):
        outs = _outputs(tmp_path, "inv", n, "complex128", count, chunk)
        run_batches(engine, "inv", BatchIO(src, None, outs), _ranges(count, chunk, 2 if repeat < 3 else 1))
        sizes.append(engine.pool.nbytes)
    assert engine.pool.allocations == 1 and engine.pool.pairs == 1
    assert len(set(sizes)) == 1
    per_matrix = 2 * n * n * 16 + 4  # input + inverse + info
    assert sizes[0] == 2 * 2 * chunk * per_matrix  # one pair of two-chunk slots


def test_concurrent_tasks_borrow_one_pair_each(tmp_path):
    count, n, chunk = 64, 4, 8
    a = generate("random", n, "float64", seed=9, start=0, stop=count)
    src = _store(tmp_path, "a.zarr", a, chunk)
    engine = _SlowEngine(0.02)
    outs = _outputs(tmp_path, "inv", n, "float64", count, chunk)
    halves = [_ranges(count, chunk, 1)[:4], _ranges(count, chunk, 1)[4:]]
    for _ in range(2):
        threads = [threading.Thread(target=run_batches, args=(engine, "inv", BatchIO(src, None, outs), h))
                   for h in halves]
        [t.start() for t in threads]
        [t.join() for t in threads]
    assert engine.pool.pairs == 2 and engine.pool.allocations == 2
    np.testing.assert_array_equal(outs["inv"][...], kernels.inv(a)[0])


def test_a_corrupt_chunk_is_named_and_nothing_after_it_recorded(tmp_path):
    a = generate("random", 4, "float64", seed=10, start=0, stop=16)
    src = _store(tmp_path, "a.zarr", a, 4)
    # corrupt the third chunk file
    (tmp_path / "a.zarr" / "c" / "2" / "0" / "0").write_bytes(b"not zstd")
    outs = _outputs(tmp_path, "inv", 4, "float64", 16, 4)
    marks = []
    where = {"a": (str(tmp_path / "a.zarr"), "")}
    with pytest.raises(CorruptInputError, match=r"unreadable chunk file .*a\.zarr/c/2/0/0 \(matrices 8:12\)"):
        run_batches(HostEngine(), "inv", BatchIO(src, None, outs, where=where), _ranges(16, 4, 1),
                    record=recording(marks))
    assert (8, 12) not in marks and (12, 16) not in marks
    assert (outs["inv"][8:][...] == FILL).all()


@pytest.mark.parametrize("failing_start", [None, 1], ids=["threads", "a-thread-that-cannot-start"])
def test_prefault_writes_every_page_and_leaves_no_thread_behind(monkeypatch, failing_start):
    """Before a pinned buffer is registered its pages are written from several threads; prefault
    returns only when all of them are written, also where a thread cannot start (a thread limit):
    else a thread could still be writing into memory its caller frees."""
    monkeypatch.setattr(_buffers, "PREFAULT_BYTES", 1 << 16)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)   # 8 pieces
    rng = np.random.default_rng()
    raw = rng.integers(1, 255, size=(1 << 19) + 4097, dtype=np.uint8)   # nothing zero: every byte to write
    starts = []
    real_start = threading.Thread.start

    def start(thread):
        starts.append(thread)
        if failing_start is not None and len(starts) == failing_start:
            raise RuntimeError("can't start new thread")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    _buffers.prefault(raw)
    assert len(starts) >= 1
    assert not any(thread.is_alive() for thread in starts)
    assert not raw.any()


def test_sub_batches_whole_chunks_and_at_least_two():
    plan = Plan(count=1000, chunk=30, batch=300, chunks_per_task=10)
    assert sub_batches(plan, 0, 10) == [(0, 5), (5, 10)]
    assert sub_batches(plan, 10, 11) == [(10, 11)]
    assert sub_batches(plan, 20, 23) == [(20, 22), (22, 23)]
    big = Plan(count=10**7, chunk=100, batch=400, chunks_per_task=250)
    got = sub_batches(big, 0, 250)
    assert got[0] == (0, 4) and got[-1] == (248, 250) and len(got) == 63
    assert all(b0 < b1 for b0, b1 in got) and [g[1] for g in got[:-1]] == [g[0] for g in got[1:]]


class _Chunked:
    def __init__(self, chunk):
        self.chunks = (chunk, 4, 4)


@pytest.mark.parametrize("start,stop,chunk,parts", [(0, 100, 10, 8), (3, 97, 10, 4), (0, 10, 10, 8), (5, 9, 10, 3),
                                                    (0, 7, 1, 7), (0, 7, 1, 20), (11, 250, 16, 8), (0, 33, 4, 1)])
def test_split_requests_cuts_only_at_chunk_ends(start, stop, chunk, parts):
    got = split_requests(_Chunked(chunk), start, stop, parts)
    assert got[0][0] == start and got[-1][1] == stop
    assert [g[1] for g in got[:-1]] == [g[0] for g in got[1:]] and all(lo < hi for lo, hi in got)
    assert all(hi % chunk == 0 for _, hi in got[:-1])                 # no stored chunk read by two requests
    chunks = len(range(start // chunk, -(-stop // chunk)))
    assert len(got) == min(parts, chunks)                             # as many requests as it can send
    sizes = [len(range(lo // chunk, -(-hi // chunk))) for lo, hi in got]
    assert max(sizes) - min(sizes) <= 1                               # about as many chunks each


def test_pool_read_spreads_a_batch_over_the_processes(tmp_path):
    """One batch, read through a pool of 3 processes: 3 requests, each into its own part of the slot."""
    from concurrent.futures import Future

    from batchlu.pipeline.worker._batches import pool_read

    a = generate("random", 4, "float64", seed=27, start=0, stop=40)
    src = zarr.create_array(str(tmp_path / "a.zarr"), shape=a.shape, chunks=(5, 4, 4), dtype=a.dtype)
    src[...] = a

    class Pool:
        processes = 3
        calls = []

        def read(self, store, path, lo, hi, out):
            self.calls.append((lo, hi))
            out[...] = src[lo:hi]
            done = Future()
            done.set_result(None)
            return done

    out = np.full((32, 4, 4), np.nan)
    pool_read(BatchIO(src, None, {}, pool=Pool(), where={"a": ("a.zarr", "")}), [("a", out)], 3, 35, Pool.processes)
    assert Pool.calls == [(3, 10), (10, 25), (25, 35)]   # 7 chunks touched: 2, 3, 2
    assert out.tobytes() == a[3:35].tobytes()


def test_pool_read_waits_for_its_reads_when_the_lookup_beside_them_fails(tmp_path):
    """The store lookup runs while the I/O processes read (``meanwhile``): when it raises, the reads
    in flight are still waited for (the slot is about to be reused), then its error is raised."""
    import threading
    from concurrent.futures import Future

    from batchlu.pipeline.worker._batches import pool_read

    a = generate("random", 4, "float64", seed=28, start=0, stop=20)
    src = zarr.create_array(str(tmp_path / "a.zarr"), shape=a.shape, chunks=(5, 4, 4), dtype=a.dtype)
    src[...] = a
    release = threading.Event()
    order = []

    class Pool:
        processes = 2

        def read(self, store, path, lo, hi, out):
            done = Future()

            def work():
                release.wait(10)
                out[...] = src[lo:hi]
                order.append(("read", lo))
                done.set_result(None)

            threading.Thread(target=work).start()
            return done

    def lookup():
        order.append(("lookup", None))
        release.set()
        raise RuntimeError("Expected every chunk stored. Got chunk 1 missing instead.")

    out = np.full((20, 4, 4), np.nan)
    with pytest.raises(RuntimeError, match="chunk 1 missing"):
        pool_read(BatchIO(src, None, {}, pool=Pool(), where={"a": ("a.zarr", "")}), [("a", out)], 0, 20, 2,
                  meanwhile=lookup)
    assert order[0] == ("lookup", None) and sorted(order[1:]) == [("read", 0), ("read", 10)]
    assert out.tobytes() == a.tobytes()   # both reads had finished when the error came


def test_module_imports_without_cupy():
    import subprocess
    import sys

    code = ("import sys; sys.modules['cupy'] = None; sys.modules['dask_cuda'] = None\n"
            "import batchlu.pipeline.worker._tasks, batchlu.pipeline.client._warmup, batchlu.pipeline.plugins, "
            "batchlu.pipeline.cluster._gpu_cluster\n"
            "assert 'cupy' not in [m for m in sys.modules if sys.modules[m] is not None]\n")
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------------------------------ GPU
def _cpu_results(op, a, b) -> dict:
    return {"lu": lambda: dict(zip(("lu", "piv", "info"), kernels.lu_factor(a))),
            "inv": lambda: dict(zip(("inv", "info"), kernels.inv(a))),
            "solve": lambda: dict(zip(("x", "info"), kernels.solve(a, b))),
            "slogdet": lambda: dict(zip(("sign", "logabsdet", "info"), kernels.slogdet(a)))}[op]()


def _assert_results(op, a, b, got) -> None:
    """Engine outputs ``got`` (read back from stores whose fill no result equals) against the CPU
    kernels: info equal; the bad matrices' outputs exactly the agreed ones (NaN results, identity
    pivots, sign 0 and logabsdet -inf), so an element never written shows; the others by LAPACK's
    ratios, and sign and logabsdet by slogdet_ratios."""
    cpu = _cpu_results(op, a, b)
    np.testing.assert_array_equal(got["info"], cpu["info"])
    for name, value in cpu.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
    info = got["info"]
    good = info == 0
    assert good.sum() > len(info) // 2 and (~good).any()
    for name, value in got.items():
        if value.dtype.kind in "fc":
            assert np.isfinite(value[good]).all(), name
    bad = info < 0 if op == "lu" else ~good  # lu: the factors of a singular matrix are still factors
    for name in cpu:
        np.testing.assert_array_equal(got[name][bad], cpu[name][bad], err_msg=f"{name} of the bad matrices")
    if op == "lu":
        rated = info >= 0
        assert get01(a[rated], got["lu"][rated], got["piv"][rated]).max() < THRESHOLD
    elif op == "inv":
        assert get03(a[good], got["inv"][good]).max() < THRESHOLD
    elif op == "solve":
        assert get02(a[good], got["x"][good], b[good]).max() < THRESHOLD
    else:
        for name, ratio in slogdet_ratios(a[good], got["sign"][good], got["logabsdet"][good])._asdict().items():
            assert ratio.max() < THRESHOLD, name


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["lu", "inv", "solve", "slogdet"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_engine_matches_lapack_ratios(tmp_path, op, dtype):
    import cupy

    count, n, chunk = 300, 24, 64
    a = generate("singular-mix", n, dtype, seed=11, start=0, stop=count)
    src = _store(tmp_path, "a.zarr", a, chunk)
    b = rhs = None
    if op == "solve":
        b = make_rhs(n, 3, dtype, seed=12, start=0, stop=count)
        rhs = _store(tmp_path, "b.zarr", b, chunk)
    outs = _outputs(tmp_path, op, n, dtype, count, chunk, dtype if b is not None else None,
                    3 if b is not None else None)
    engine = _engines.CudaEngine(0, threads=1)
    stats = run_batches(engine, op, BatchIO(src, None if rhs is None else rhs, outs), _ranges(count, chunk, 2))
    assert stats.matrices == count
    _assert_results(op, a, b, {name: arr[...] for name, arr in outs.items()})
    # the buffers are page-locked host memory, kept by the engine's pool
    ptr = engine.pool._free[0][2][0].a.ctypes.data
    attrs = cupy.cuda.runtime.pointerGetAttributes(ptr)
    assert attrs.type == cupy.cuda.runtime.memoryTypeHost


def test_host_engine_passes_the_gpu_checks(tmp_path):
    """The checks of the GPU test above, on the host engine for every op: they pass on right output,
    and fail when one output element of a non-finite matrix was never written (still the fill)."""
    count, n, chunk = 60, 7, 8
    a = generate("singular-mix", n, "complex64", seed=16, start=0, stop=count)
    b = make_rhs(n, 2, "complex64", seed=17, start=0, stop=count)
    for op in ("lu", "inv", "solve", "slogdet"):
        (tmp_path / op).mkdir()
        src = _store(tmp_path / op, "a.zarr", a, chunk)
        rhs = _store(tmp_path / op, "b.zarr", b, chunk) if op == "solve" else None
        outs = _outputs(tmp_path / op, op, n, "complex64", count, chunk, "complex64" if rhs else None,
                        2 if rhs else None)
        run_batches(HostEngine(), op, BatchIO(src, rhs, outs), _ranges(count, chunk, 2))
        got = {name: arr[...] for name, arr in outs.items()}
        _assert_results(op, a, b, got)
        bad = int(np.flatnonzero(got["info"] < 0)[0])
        for name in set(got) - {"info"}:
            spoiled = {k: v.copy() for k, v in got.items()}
            spoiled[name].reshape(count, -1)[bad, 0] = FILL if spoiled[name].dtype.kind in "fc" else INT_FILL
            with pytest.raises(AssertionError, match="bad matrices"):
                _assert_results(op, a, b, spoiled)


@pytest.mark.gpu
def test_cuda_out_of_memory_splits(tmp_path):
    import cupy

    count, n, chunk = 2048, 64, 512
    a = generate("random", n, "float64", seed=13, start=0, stop=count)
    src = _store(tmp_path, "a.zarr", a, chunk)
    outs = _outputs(tmp_path, "inv", n, "float64", count, chunk)
    engine = _engines.CudaEngine(0, threads=1)
    engine.device_fit = lambda per_matrix: 10**9  # pretend everything fits, so the kernels hit the limit
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    # 1024 matrices need 2 x 32 MiB + workspace; 64 fit. Above what earlier tests of this process
    # still hold (under xdist a worker runs many), so that the limit is the test's and not theirs.
    pool.set_limit(size=pool.total_bytes() + 12 * 2**20)
    try:
        stats = run_batches(engine, "inv", BatchIO(src, None, outs), _ranges(count, chunk, 2))
    finally:
        pool.set_limit(size=0)
    assert stats.oom_splits >= 3
    inv = outs["inv"][...]
    assert get03(a, inv).max() < THRESHOLD
    assert (outs["info"][...] == 0).all()



@pytest.mark.gpu
@pytest.mark.parametrize("op", ["lu", "solve"])
def test_cuda_engine_through_io_processes_registered_and_identical(tmp_path, op):
    """The I/O processes decode into and encode from the very page-locked buffers the copies use."""
    import cupy

    from batchlu.pipeline.worker import _io_pool, _shared_memory

    count, n, chunk, dtype = 400, 32, 50, "float64"
    a = generate("singular-mix", n, dtype, seed=14, start=0, stop=count)
    src = _store(tmp_path, "a.zarr", a, chunk)
    b = rhs = None
    where = {"a": (str(tmp_path / "a.zarr"), "")}
    if op == "solve":
        b = make_rhs(n, 2, dtype, seed=15, start=0, stop=count)
        rhs = _store(tmp_path, "b.zarr", b, chunk)
        where["b"] = (str(tmp_path / "b.zarr"), "")
    engine = _engines.CudaEngine(0, threads=2)
    pool = _io_pool.get_pool(2, 2)
    got = {}
    for mode in ("worker", "pool"):
        (tmp_path / mode).mkdir()
        outs = _outputs(tmp_path / mode, op, n, dtype, count, chunk, dtype if b is not None else None,
                        2 if b is not None else None)
        paths = {name: (str(tmp_path / mode / f"out-{op}.zarr"), name) for name in outs}
        io = BatchIO(src, rhs, outs, pool=pool if mode == "pool" else None, where={**where, **paths})
        stats = run_batches(engine, op, io, _ranges(count, chunk, 2))
        assert stats.matrices == count
        got[mode] = {name: np.asarray(arr[...]) for name, arr in outs.items()}
    assert _buffers._REGISTER_FAILED == []
    slot = engine.pool._free[0][2][0]
    assert _shared_memory.locate(slot.a) is not None and all(_shared_memory.locate(v) for v in slot.outs.values())
    attrs = cupy.cuda.runtime.pointerGetAttributes(slot.a.ctypes.data)
    assert attrs.type == cupy.cuda.runtime.memoryTypeHost
    for name in got["worker"]:
        assert got["pool"][name].tobytes() == got["worker"][name].tobytes(), name
    good = got["pool"]["info"] == 0
    assert good.sum() > count // 2
    if op == "lu":
        assert get01(a[good], got["pool"]["lu"][good], got["pool"]["piv"][good]).max() < THRESHOLD
    else:
        assert get02(a[good], got["pool"]["x"][good], b[good]).max() < THRESHOLD
