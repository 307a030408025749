"""Task planning: tasks cover whole output chunks, batches follow the memory budget, and the number
of tasks stays bounded for N in the millions."""

from __future__ import annotations

import numpy as np
import pytest

from batchlu.pipeline.worker._batches import sub_batches
from batchlu.pipeline._plan import MIN_CHUNKS, Plan, bytes_per_matrix, make_plan, merge_tasks


def covered(plan: Plan, tasks) -> np.ndarray:
    hits = np.zeros(plan.n_chunks, int)
    for c0, c1 in tasks:
        hits[c0:c1] += 1
    return hits


@pytest.mark.parametrize("count,input_chunk,budget", [(53, 10, 6000), (1000, 7, 10**6),
                                                      (10, 100, 1), (1, 1, 10**9)])
def test_tasks_cover_every_chunk_once(count, input_chunk, budget):
    plan = make_plan(count, 1000, memory_budget=budget, max_tasks=1000, input_chunk=input_chunk)
    tasks = plan.tasks()
    assert (covered(plan, tasks) == 1).all()
    ranges = [plan.chunk_range(c0, c1) for c0, c1 in tasks]
    assert ranges[0][0] == 0 and ranges[-1][1] == count
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    for c0, c1 in tasks:  # every task starts and ends on output chunk boundaries
        start, stop = plan.chunk_range(c0, c1)
        assert start % plan.chunk == 0 and (stop % plan.chunk == 0 or stop == count)
        batches = [plan.chunk_range(b0, b1) for b0, b1 in sub_batches(plan, c0, c1)]
        assert batches[0][0] == start and batches[-1][1] == stop
        assert all(b - a <= plan.batch for a, b in batches)


def test_batch_from_memory_budget():
    per = bytes_per_matrix(128, 8, 128 * 128 * 8 + 4)  # inv of float64 n=128
    plan = make_plan(10**6, per, memory_budget=256 * 2**20, max_tasks=20000, input_chunk=100)
    assert plan.chunk == plan.batch == 100 and plan.chunks_per_task == 1  # one chunk per kernels call
    small = make_plan(10**6, per, memory_budget=per * 30, max_tasks=10**6, input_chunk=100)
    assert small.chunk == 30 and small.batch == 30  # chunk capped so one batch fits the budget


def test_task_count_bounded_for_millions():
    plan = make_plan(10_000_000, 1000, memory_budget=1, max_tasks=20000, input_chunk=10)
    assert plan.chunk == 1 and plan.n_chunks == 10_000_000
    tasks = plan.tasks()
    assert len(tasks) <= 20000
    assert (covered(plan, tasks) == 1).all()
    assert plan.batch == 1 and len(sub_batches(plan, *tasks[0])) == plan.chunks_per_task


def test_tasks_skip_complete_chunks():
    plan = Plan(count=100, chunk=10, batch=20, chunks_per_task=4)
    assert plan.tasks() == [(0, 4), (4, 8), (8, 10)]
    done = np.zeros(10, bool)
    done[[0, 1, 5, 9]] = True
    tasks = plan.tasks(done)
    assert tasks == [(2, 4), (4, 5), (6, 8), (8, 9)]
    assert (covered(plan, tasks) == ~done).all()
    assert plan.tasks(np.ones(10, bool)) == []


def test_explicit_chunk_and_edges():
    plan = make_plan(53, 100, memory_budget=10**6, max_tasks=5, input_chunk=10, chunk=8)
    assert plan.chunk == 8 and plan.n_chunks == 7
    assert plan.chunk_range(6, 7) == (48, 53)
    empty = make_plan(0, 100, memory_budget=10**6, max_tasks=5, input_chunk=10)
    assert empty.n_chunks == 0 and empty.tasks() == []


def test_ledger_listing_matches_zarr(tmp_path):
    """The ledger is read by listing objects; it must agree with reading the array through zarr."""
    import zarr

    from batchlu.pipeline.output import _ledger

    group = zarr.open_group(tmp_path / "o.zarr", mode="w")
    records = _ledger.create(group, 1000)
    assert not _ledger.read(str(tmp_path / "o.zarr")).any()
    rng = np.random.default_rng(0)
    for _ in range(5):
        lo = int(rng.integers(0, 990))
        _ledger.mark(str(tmp_path / "o.zarr"), lo, lo + int(rng.integers(1, 10)))
    records[int(rng.integers(0, 1000))] = False
    (tmp_path / "o.zarr" / "_complete" / "c" / "7.1234.partial").write_bytes(b"\x01")
    assert np.array_equal(_ledger.read(str(tmp_path / "o.zarr")), np.asarray(records[...]))
    mask = _ledger.matrix_mask(np.array([True, False, True]), 4, 10)
    assert mask.tolist() == [True] * 4 + [False] * 4 + [True] * 2


# ------------------------------------------------------------------------------- sizing in bytes
MiB = 2**20


def inv_plan(count: int, n: int, input_chunk: int, *, inner=None, budget=256 * MiB, target=32 * MiB,
             dtype="float64") -> Plan:
    """The plan ``batchlu.pipeline.run`` makes for ``op="inv"`` (same arithmetic as pipeline.client._run)."""
    from batchlu.pipeline._ops import output_specs

    item = np.dtype(dtype).itemsize
    specs = output_specs("inv", n, np.dtype(dtype), None, None)
    per = bytes_per_matrix(n, item, sum(s.nbytes() for s in specs))
    return make_plan(count, per, memory_budget=budget, max_tasks=20000, input_chunk=input_chunk,
                     matrix_bytes=n * n * item, chunk_bytes=target, input_inner=inner)


def chunk_bytes(plan: Plan, n: int) -> int:
    return plan.chunk * n * n * 8


@pytest.mark.parametrize("total", [100_000 * 32 * 32 * 8, 640_000 * 32 * 32 * 8])  # 0.8 and 5.2 GB
def test_equal_bytes_give_equal_chunks_for_every_n(total):
    """At equal bytes, n = 8 and n = 32 get output chunks (and tasks) of as many bytes as n = 128:
    inputs written by ``batchlu generate`` (32 MiB chunks) and inputs of 256 matrices per chunk
    (128 KiB at n = 8: 256 times fewer bytes per chunk than n = 128)."""
    generated = {n: inv_plan(total // (n * n * 8), n, 32 * MiB // (n * n * 8)) for n in (8, 32, 128)}
    assert {p.n_chunks for p in generated.values()} == {generated[128].n_chunks}
    assert {chunk_bytes(p, n) for n, p in generated.items()} == {32 * MiB}
    small = {n: inv_plan(total // (n * n * 8), n, 256) for n in (8, 32, 128)}
    ref = small[128]
    assert chunk_bytes(ref, 128) == 32 * MiB  # 256 matrices of n = 128 make a 32 MiB chunk already
    for n, plan in small.items():
        assert plan.chunk % 256 == 0 and plan.batch == plan.chunk and plan.chunks_per_task == 1
        assert len(plan.tasks()) == plan.n_chunks
        # chunks of as many bytes as n = 128's, unless that leaves fewer than MIN_CHUNKS chunks
        assert plan.n_chunks <= max(ref.n_chunks, 2 * MIN_CHUNKS)
        assert chunk_bytes(plan, n) >= min(chunk_bytes(ref, 128), total // (2 * MIN_CHUNKS))
        if ref.n_chunks >= 2 * MIN_CHUNKS:
            assert chunk_bytes(plan, n) == chunk_bytes(ref, 128) and plan.n_chunks == ref.n_chunks
    before = {n: make_plan(total // (n * n * 8), 1, memory_budget=256 * MiB, max_tasks=20000,
                           input_chunk=256) for n in (8, 32)}  # no byte target: one input chunk each
    assert before[8].n_chunks == total // (256 * 8 * 8 * 8) and before[8].n_chunks > 50 * small[8].n_chunks


def inv_bytes(n: int) -> int:
    """``bytes_per_matrix`` of a float64 inverse: input, inverse and info, times the workspace factor."""
    return 2 * (2 * n * n * 8 + 4)


def test_merged_chunks_fit_the_budget_and_keep_whole_input_chunks():
    assert inv_plan(10**6, 8, 100, budget=650 * inv_bytes(8)).chunk == 600  # 6 input chunks fit
    assert inv_plan(10**6, 8, 100, target=100 * 8 * 8 * 8 * 5 + 1).chunk == 500  # 5 fit the target
    # an input chunk of 3000 matrices already over the target is kept whole, never split
    assert inv_plan(10**6, 8, 3000, target=1).chunk == 3000
    # few input chunks: no merging below MIN_CHUNKS output chunks (a task for every thread)
    assert inv_plan(MIN_CHUNKS * 100, 8, 100).chunk == 100
    three = inv_plan(MIN_CHUNKS * 300, 8, 100)
    assert three.chunk == 300 and three.n_chunks == MIN_CHUNKS


def test_shards_over_the_budget_are_cut_at_inner_chunks():
    budget = 1000 * inv_bytes(32)  # one batch fits 1000 matrices, a shard holds 10,000
    assert inv_plan(10**5, 32, 10_000, inner=300, budget=budget).chunk == 900  # 3 whole inner chunks
    assert inv_plan(10**5, 32, 10_000, inner=None, budget=budget).chunk == 1000
    assert inv_plan(10**5, 32, 10_000, inner=2000, budget=budget).chunk == 1000  # inner too big
    # a shard that fits is kept whole (and merged like a chunk)
    assert inv_plan(10**5, 32, 500, inner=100, budget=budget).chunk == 1000  # two shards


def test_a_matrix_above_the_budget_runs_alone_and_says_so():
    """n = 4096 complex128: 256 MiB a matrix, 1 GiB with the inverse and workspace, against the default
    256 MiB budget: one matrix per batch, and a warning naming the budget that would hold it."""
    from batchlu.pipeline._ops import output_specs
    from batchlu.pipeline._plan import budget_warning

    n, budget = 4096, 256 * 2**20
    per = bytes_per_matrix(n, 16, sum(s.nbytes() for s in output_specs("inv", n, np.complex128)))
    assert per == 2 * (2 * n * n * 16 + 4)
    plan = make_plan(3, per, memory_budget=budget, max_tasks=20000, input_chunk=2)
    assert plan.chunk == plan.batch == 1 and plan.n_chunks == 3
    note = budget_warning(plan, per, budget)
    assert note.startswith("memory-budget 256 MiB is smaller than one matrix") and "1 GiB" in note
    roomy = make_plan(3, per, memory_budget=2 * per, max_tasks=20000, input_chunk=2)
    assert roomy.batch == 2 and budget_warning(roomy, per, 2 * per) is None
    forced = make_plan(3, per, memory_budget=budget, max_tasks=20000, input_chunk=2, chunk=2)
    assert forced.batch == 2 and budget_warning(forced, per, budget).startswith("chunk 2 needs about 2 GiB")
    assert budget_warning(make_plan(0, per, memory_budget=1, max_tasks=5, input_chunk=1), per, 1) is None


@pytest.mark.parametrize("tasks, parts", [
    ([(c, c + 1) for c in range(160)], 8),          # a fresh run: one chunk per task
    ([(0, 3), (3, 7), (9, 10), (10, 40)], 3),       # a resumed run: chunks 7 and 8 done
    ([(0, 5)], 16),                                  # fewer chunks than parts
    ([(2, 3), (5, 6), (8, 9)], 2),                   # nothing touches
])
def test_merged_tasks_cover_the_same_chunks_in_runs_that_touch(tasks, parts):
    merged = merge_tasks(tasks, parts)
    covered = sorted(c for c0, c1 in merged for c in range(c0, c1))
    assert covered == sorted(c for c0, c1 in tasks for c in range(c0, c1))   # each once, none added
    todo = {c for c0, c1 in tasks for c in range(c0, c1)}
    for c0, c1 in merged:
        assert set(range(c0, c1)) <= todo, (c0, c1)   # never spans a chunk not to do
    size = -(-sum(c1 - c0 for c0, c1 in tasks) // parts)
    assert all(c1 - c0 <= size for c0, c1 in merged)
    if tasks == [(c, c + 1) for c in range(160)]:
        assert merged == [(c, c + 20) for c in range(0, 160, 20)]


def test_device_groups_hold_consecutive_batches_within_the_bytes():
    from batchlu.pipeline.worker._device_batches import group_batches

    batches = [(0, 256), (256, 512), (512, 768), (768, 1000), (2000, 2256)]
    assert group_batches(batches, 1000, 600_000) == [[(0, 256), (256, 512)], [(512, 768), (768, 1000)],
                                                     [(2000, 2256)]]
    assert group_batches(batches, 1000, 0) == [[b] for b in batches]   # at least one batch per group


def test_device_slots_hold_every_group_of_every_task_but_never_more_than_the_input():
    """The GPU codec path's pinned slots: one size for every task of a run (the warm-up reserves it),
    large enough for each group any task makes (whole tasks, merged ones, a resumed run's, the one
    holding a partial last chunk), and a small run pins what its input holds (pinning costs ~0.25-0.4 s
    per GiB), not a group's bytes."""
    from batchlu.pipeline._plan import Plan, merge_tasks
    from batchlu.pipeline.worker._batches import sub_batches
    from batchlu.pipeline.worker._device_batches import group_batches, slot_rows

    rng = np.random.default_rng()
    per = 32 * 32 * 8
    for count in (10, 120, 1020, 5020, 20_000):
        for chunk in (50, 64):
            for batch_chunks in (1, 4):
                for limit in (0, per * 20, per * 128, 512 << 20):
                    plan = Plan(count=count, chunk=chunk, batch=chunk * batch_chunks, chunks_per_task=3)
                    rows = slot_rows(plan, limit, per)
                    assert 1 <= rows <= count
                    complete = rng.random(plan.n_chunks) < 0.3   # a resumed run's tasks too
                    for tasks in (plan.tasks(), merge_tasks(plan.tasks(), 4), plan.tasks(complete)):
                        for c0, c1 in tasks:
                            groups = group_batches([plan.chunk_range(*b) for b in sub_batches(plan, c0, c1)],
                                                   per, limit)
                            assert max(g[-1][1] - g[0][0] for g in groups) <= rows, (count, chunk, limit)
    plan = Plan(count=10**6, chunk=50, batch=50, chunks_per_task=3)
    assert slot_rows(plan, 512 << 20, per) == (512 << 20) // per             # a group's bytes
    assert slot_rows(Plan(count=120, chunk=50, batch=50, chunks_per_task=3), 512 << 20, per) == 120
    assert slot_rows(Plan(count=10**6, chunk=50, batch=200, chunks_per_task=8), per * 60, per) == 200


def test_ledger_objects_written_as_files_are_zarrs_bytes(tmp_path):
    """The ledger's fast path writes each record as a file: the same bytes zarr writes, read back the
    same by zarr and by the ledger's own readers; a layout it does not know goes through zarr."""
    import zarr

    from batchlu.pipeline.output import _ledger

    rng = np.random.default_rng()
    digests = rng.integers(1, 2**32, size=9, dtype=np.uint64).astype(np.uint32)
    roots = {}
    for how in ("zarr", "files"):
        group = zarr.open_group(str(tmp_path / f"{how}.zarr"), mode="w")
        _ledger.create(group, 20)
        d, c = group[_ledger.DIGESTS], group[_ledger.NAME]
        if how == "zarr":
            d[5:14] = digests
            c[5:14] = True
        else:
            assert _ledger.objects_folder(d) is not None and _ledger.objects_folder(c) is not None
            _ledger.mark_arrays(d, c, 5, 14, digests)
        roots[how] = tmp_path / f"{how}.zarr"
    for name in (_ledger.DIGESTS, _ledger.NAME):
        files = sorted(p.name for p in (roots["zarr"] / name / "c").iterdir())
        assert files == [str(i) for i in sorted(range(5, 14), key=str)]
        assert sorted(p.name for p in (roots["files"] / name / "c").iterdir()) == files
        for f in files:
            assert (roots["files"] / name / "c" / f).read_bytes() == (roots["zarr"] / name / "c" / f).read_bytes()
    path = str(roots["files"])
    assert _ledger.read(path).tolist() == [5 <= i < 14 for i in range(20)]
    assert np.array_equal(_ledger.read_digests(path)[5:14], digests)
    assert np.array_equal(zarr.open_array(path, path=_ledger.DIGESTS, mode="r")[5:14], digests)
    # a v2 ledger (another layout): written through zarr, read back the same
    group = zarr.open_group(str(tmp_path / "v2.zarr"), mode="w", zarr_format=2)
    d = group.create_array(_ledger.DIGESTS, shape=(20,), chunks=(1,), dtype="uint32", fill_value=0)
    c = group.create_array(_ledger.NAME, shape=(20,), chunks=(1,), dtype="bool", fill_value=False)
    assert _ledger.objects_folder(d) is None
    _ledger.mark_arrays(d, c, 2, 11, digests)
    assert np.array_equal(d[2:11], digests) and c[...].tolist() == [2 <= i < 11 for i in range(20)]
