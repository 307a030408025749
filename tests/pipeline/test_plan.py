"""Task planning: tasks cover whole output chunks, batches follow the memory budget, and the number
of tasks stays bounded for N in the millions."""

from __future__ import annotations

import numpy as np
import pytest

from batchlu.pipeline._batches import sub_batches
from batchlu.pipeline._plan import Plan, bytes_per_matrix, make_plan


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

    from batchlu.pipeline import _ledger

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
