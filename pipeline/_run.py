"""``batchlu.pipeline.run``: check everything, create or reopen the output, submit one task per run of
output chunks, and report."""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import time
import warnings

import numpy as np
import zarr

from . import _cluster, _fingerprint, _live, _ledger, _lock, _output, _sparse
from ._config import options as make_options, task_delay
from ._ops import INFO_NOT_COMPUTED, InfoCounts, get_op, info_counts, output_specs
from ._plan import budget_warning, bytes_per_matrix, make_plan, merge_tasks
from ._report import Report
from ._store import (check_matrices, check_output_path, check_replaceable, check_rhs, naming_full_device,
                     open_array_info, parse_ref)
from ._tasks import Job, process_range
from .errors import BatchluWarning, FencedError, InputChangedError, InputError, ResumeError

TASKS_PER_LANE = 2   # GPU codec path: tasks per lane (pipeline._gpu_codecs.LANES per worker) after merging
# The host path on GPU workers: tasks per worker thread after merging. A task of one chunk reads,
# computes and writes it in turn; one of a few chunks overlaps its own batches too, which keeps more
# requests in the I/O processes (docs/performance.md, "No regression of the host path").
HOST_TASKS_PER_THREAD = 4


def _count_info(path: str) -> InfoCounts:
    info = np.asarray(zarr.open_array(store=path, path="info", mode="r")[...])
    return info_counts(info[info != INFO_NOT_COMPUTED])


def _naming_a_full_device(func):
    """A full device while the run writes (a chunk, the ledger, the record): one error that names the
    output, where the failed write names no file; the output is left for resume."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        output = args[1] if len(args) > 1 else kwargs.get("output", "")
        with naming_full_device(output, "finish the run with resume (--resume)"):
            return func(*args, **kwargs)
    return wrapper


@_naming_a_full_device
@_lock.releases_locks
def run(input, output, *, op, rhs=None, resume=False, overwrite=False, force=False, backend=None,
        client=None, scheduler=None, scheduler_file=None, progress=True, config=None) -> Report:
    """Compute ``op`` (``lu``, ``inv``, ``solve``, ``slogdet``, ``ldlt-solve`` or ``ldlt-inertia``)
    for every matrix of ``input``.

    ``input`` (and ``rhs`` for ``solve``) is ``PATH`` or ``PATH:ARRAY`` of a Zarr v2 or v3 array
    (N, n, n) (right-hand side (N, n) or (N, n, k)); for the sparse ops it is a sparse batch, a Zarr
    group (:mod:`batchlu.pipeline._sparse`) whose ``rhs`` array ``ldlt-solve`` reads unless ``rhs``
    is given. ``output`` becomes a Zarr v3 group with one
    array per result and ``info``. ``resume`` finishes an interrupted run (same input and op);
    ``overwrite`` replaces an existing output that batchlu wrote (any Zarr store with ``force``).
    ``backend`` (``auto``: the GPU where a worker has one, ``cpu`` or ``gpu``) overrides
    ``batchlu.backend``; None keeps the config's. ``progress`` False hides the bar. Tasks run on
    ``client``, on the cluster at ``scheduler`` / ``scheduler_file``, or on an embedded LocalCluster. ``config`` holds ``batchlu`` settings
    (mapping or :class:`batchlu.pipeline.Options`). Returns a :class:`batchlu.pipeline.Report`.
    """
    _cluster.check_not_bootstrapping("batchlu.run")
    called = time.perf_counter()
    opts = make_options(config, backend=backend)
    show = bool(progress) and opts.progress
    spec = get_op(op)
    symbolic = None
    if spec.sparse:
        source = _sparse.open_input(input, rhs, needs_rhs=spec.needs_rhs, settings=opts)
        matrices, rhs_info, k, n, symbolic = source.values, source.rhs, source.k, source.n, source.symbolic
    else:
        matrices = open_array_info(parse_ref(input))
        n = check_matrices(matrices)
        rhs_info, k = None, None
    if spec.sparse:
        pass  # checked with the sparse batch
    elif spec.needs_rhs:
        if rhs is None:
            raise InputError(f"Expected a right-hand side (rhs, --rhs B.zarr) for op {op}. "
                             "Got none instead.")
        rhs_info = open_array_info(parse_ref(rhs), "right-hand side")
        k = check_rhs(rhs_info, matrices)
    elif rhs is not None:
        raise InputError(f"Expected no right-hand side for op {op}; only solve takes one. "
                         f"Got rhs={rhs!r} instead.")
    refs = [matrices.ref] + ([rhs_info.ref] if rhs_info else [])
    out_path = check_output_path(output, refs)
    if overwrite:
        check_replaceable(out_path, writer="run", force=force)
    specs = output_specs(op, n, matrices.dtype, rhs_info.dtype if rhs_info else None, k)

    provenance = {
        "format": _output.FORMAT, "status": "running", "op": op,
        "input": matrices.as_dict(), "rhs": rhs_info.as_dict() if rhs_info else None,
        "dtype": str(matrices.dtype), "n": n, "N": matrices.count, "k": k,
        "outputs": [s.name for s in specs], "backend": opts.backend, "backends_used": [],
        "version": _output.version(), "started": _output.now(), "finished": None,
        "settings": opts.as_dict(),
        "input_files": _fingerprint.signatures(matrices.ref, rhs_info.ref if rhs_info else None),
    }
    if spec.sparse:
        provenance["sparse"] = source.provenance()
    lock = _lock.acquire(out_path)  # one writer per output, before overwrite deletes anything; held until return
    record = _output.check_existing(out_path, resume=resume, overwrite=overwrite)
    if record is not None:
        _output.check_resume(record, provenance)
        if spec.sparse:
            _check_same_pattern(record, provenance["sparse"])
    chunk = int(record["plan"]["chunk"]) if record and record.get("plan") else opts.chunk
    out_bytes = sum(s.nbytes() for s in specs)
    rhs_bytes = rhs_info.dtype.itemsize * n * (k or 1) if rhs_info else 0
    if spec.sparse:
        per_matrix = _sparse.bytes_per_matrix(symbolic, matrices.dtype.itemsize, out_bytes, rhs_bytes)
        matrix_bytes = symbolic.nnz * matrices.dtype.itemsize + rhs_bytes  # input read per matrix
    else:
        per_matrix = bytes_per_matrix(n, matrices.dtype.itemsize, out_bytes, rhs_bytes)
        matrix_bytes = n * n * matrices.dtype.itemsize + rhs_bytes  # input read per matrix
    plan = make_plan(matrices.count, per_matrix, memory_budget=opts.memory_budget,
                     max_tasks=opts.max_tasks, input_chunk=matrices.read_unit, chunk=chunk,
                     matrix_bytes=matrix_bytes, chunk_bytes=opts.chunk_bytes,
                     input_inner=matrices.chunks[0] if matrices.chunks else None)
    note = budget_warning(plan, per_matrix, opts.memory_budget)
    if note is not None:
        warnings.warn(note, BatchluWarning, stacklevel=2)
    provenance["plan"] = plan.as_dict()

    if record is None:
        _output.create(out_path, provenance, specs, plan, opts.output_codec, opts.output_layout,
                       checksum=opts.output_checksum)
        runs = []
    else:
        group = zarr.open_group(store=out_path, mode="r+")
        # before trusting the ledger: every output and complete chunk stored, the same input values
        complete = _ledger.read(out_path) if _ledger.exists(group) else None
        damaged = _output.check_stored(out_path, group, specs, plan, complete)
        if damaged:   # chunks that fail their CRC-32C: not trusted, computed again (unless refused below)
            complete = complete.copy()
            complete[[c for c, _ in damaged]] = False
        _fingerprint.check_unchanged(out_path, record, plan, complete, matrices.ref,
                                     rhs_info.ref if rhs_info else None, opts.memory_budget)
        if damaged:
            _output.redo(out_path, plan, damaged)
        _output.clean_partials(out_path)
        # arrays made again after a kill during creation: as the run that created the output made them;
        # the record keeps saying so, under today's names, whatever this run's settings ask
        codec, layout, checksum = _output.created_with(record)
        _output.ensure_arrays(group, specs, plan, codec, layout, checksum=checksum)
        provenance["settings"].update(output_codec=codec, output_layout=layout, output_checksum=checksum)
        runs = list(record.get("runs", []))
        provenance["started"] = record.get("started", provenance["started"])
        provenance["backends_used"] = list(record.get("backends_used", []))
    run_started = _output.now()
    _output.update(out_path, **provenance, error=None,
                   runs=runs + [{"started": run_started, "resume": bool(record)}])

    job = Job(op=op, input=matrices.ref, rhs=rhs_info.ref if rhs_info else None, output=out_path,
              outputs=tuple(s.name for s in specs), plan=plan, backend=opts.backend,
              settings=opts, task_delay=task_delay(), symbolic=symbolic,
              fence=lock.fence())  # the tasks write only while the lock names this run
    report = Report(output=out_path, op=op, count=matrices.count, backend=opts.backend)
    try:
        complete = _ledger.read(out_path)
        tasks = plan.tasks(complete)
        report.skipped = int(_ledger.matrix_mask(complete, plan.chunk, plan.count).sum())
        report.tasks = len(tasks)
        if tasks:
            _submit(job, tasks, report, opts, show, client=client, scheduler=scheduler,
                    scheduler_file=scheduler_file)
    except BaseException as exc:
        if record is None and not report.submitted:
            # no task was submitted (no cluster, no GPU, interrupted at once): leave no output
            # behind, so that the corrected command needs neither --resume nor --overwrite
            shutil.rmtree(out_path, ignore_errors=True)
        elif not isinstance(exc, FencedError):   # fenced: the output is another run's now
            _fail(out_path, provenance, runs, run_started, report, exc, _times(report, called))
        raise

    job.fence.check()   # the record too: no status written over an output another run took meanwhile
    if not _ledger.read(out_path).all():  # a task returned without recording its chunks
        exc = RuntimeError("Expected every output chunk recorded complete after the run. "
                           "Got some unrecorded instead.")
        _fail(out_path, provenance, runs, run_started, report, exc, _times(report, called))
        raise exc
    try:   # the input's files as the run found them: else its chunks may mix old and new values
        _fingerprint.check_same_files(provenance["input_files"], matrices.ref, rhs_info.ref if rhs_info else None)
    except InputChangedError as exc:
        _fail(out_path, provenance, runs, run_started, report, exc, _times(report, called))
        raise
    if report.skipped:
        report.counts = _count_info(out_path)
    used = sorted(set(provenance["backends_used"]) | set(report.backends))
    _output.update(out_path, status="complete", finished=_output.now(), backends_used=used,
                   runs=runs + [{"started": run_started, "finished": _output.now(),
                                 "resume": bool(record), "status": "complete",
                                 "matrices": report.processed, **_times(report, called)}],
                   counts=report.counts._asdict())
    report.status = "complete"
    report.wall = time.perf_counter() - called
    return report


def _check_same_pattern(record: dict, now: dict) -> None:
    """Resume of a sparse op: the pattern and its analysis (ordering, L) must be the recorded ones."""
    before = record.get("sparse") or {}
    if before.get("digest") != now["digest"]:
        raise ResumeError(f"Expected the sparse pattern and ordering of {now['group']} to be the ones the "
                          f"output was computed with (digest {before.get('digest')}, ordering "
                          f"{before.get('ordering')}). Got digest {now['digest']} (ordering {now['ordering']}) "
                          f"instead: the pattern or the ordering changed; use overwrite (--overwrite).")


def _times(report: Report, called: float) -> dict:
    """The run's times as its record in the output's provenance keeps them (see pipeline._report)."""
    return {"cluster_start": report.cluster_start, "warmup": report.warmup, "seconds": report.elapsed,
            "wall": time.perf_counter() - called}


def _fail(out_path, provenance, runs, run_started, report, exc, times: dict) -> None:
    """Best effort: record the failure; the status never says complete."""
    report.wall = times["wall"]
    try:
        _output.update(out_path, status="failed", error=f"{type(exc).__name__}: {exc}",
                       runs=runs + [{"started": run_started, "finished": _output.now(),
                                     "status": "failed", "matrices": report.processed, **times}])
    except Exception:
        pass
    report.status = "failed"


def _submit(job: Job, tasks, report: Report, opts, show: bool, **connect) -> None:
    from distributed import as_completed

    from . import _warmup

    t0 = time.perf_counter()
    embedded = all(value is None for value in connect.values())
    if embedded:
        # the embedded cluster is built for one backend, decided here once: it is the tasks' too
        opts = opts.replace(backend=_cluster.embedded_backend(opts))
    with _cluster.connect(opts, **connect) as client, _cluster.performance_report(opts.performance_report):
        dashboard = _cluster.dashboard_link(client)
        # the report keeps the link of a cluster that outlives the run only: the embedded one stops
        # when the run returns (the progress line shows its link while it runs)
        report.dashboard = None if embedded else dashboard
        started = time.perf_counter()
        report.cluster_start = started - t0
        # cpu asks nothing; else one probe of the workers: the tasks get cpu or gpu (gpu fails here,
        # before any task, where a worker has none)
        job = dataclasses.replace(job, backend=_warmup.resolve_backend(client, opts.backend))
        job = _warmup.choose_codecs(client, job)  # GPU runs: where each array's chunks are decoded/encoded
        report.codecs = {name: f"{c.device} ({c.reason})" for name, c in (job.codecs or {}).items()}
        _warmup.prepare_workers(client, job, opts)  # kernels compiled; GPU: device, allocator, pinned
        submitted = time.perf_counter()
        report.warmup = submitted - started
        if any(c.device == "gpu" for c in (job.codecs or {}).values()):
            # the GPU codec path: a few long tasks per lane of each worker (see _plan.merge_tasks)
            from ._gpu_codecs import LANES

            tasks = merge_tasks(tasks, TASKS_PER_LANE * sum(min(n, LANES) for n in client.nthreads().values()))
            report.tasks = len(tasks)
        elif job.backend == "gpu" and job.symbolic is None:
            # the host path on GPU workers: a few chunks per task (see HOST_TASKS_PER_THREAD)
            tasks = merge_tasks(tasks, HOST_TASKS_PER_THREAD * sum(client.nthreads().values()))
            report.tasks = len(tasks)
        c0s, c1s = [t[0] for t in tasks], [t[1] for t in tasks]
        report.submitted = True  # from here on tasks may write: a failure keeps the output
        # a sparse op's Job holds its pattern's analysis (arrays of the size of L): sent to every
        # worker once, not pickled into every task
        shipped = client.scatter(job, broadcast=True, hash=False) if job.symbolic is not None else job
        futures = client.map(process_range, [shipped] * len(tasks), c0s, c1s, pure=False,
                             key=[f"batchlu-{job.op}-{c0}-{c1}-{os.getpid()}-{time.time_ns()}"
                                  for c0, c1 in tasks])
        total = sum(job.plan.chunk_range(c0, c1)[1] - job.plan.chunk_range(c0, c1)[0]
                    for c0, c1 in tasks)
        bar = _live.progress(futures, total, enabled=show, label=f"batchlu {job.op}",
                             dashboard=dashboard)  # widget in Jupyter, text bar in a terminal
        backends = set(report.backends)
        try:
            for future in as_completed(futures):
                result = future.result()
                if result.error is not None:   # raised on purpose in the task (missing chunk, ...)
                    raise result.error
                bar.update(result.matrices)
                report.processed += result.matrices
                report.counts = report.counts.plus(result.counts)
                report.bytes_in += result.bytes_in
                report.bytes_out += result.bytes_out
                report.read_s += result.read_s
                report.compute_s += result.compute_s
                report.write_s += result.write_s
                report.per_worker[result.worker] = report.per_worker.get(result.worker, 0) + result.matrices
                backends.add(result.backend)
        except BaseException:
            client.cancel(futures)
            raise
        finally:
            bar.close()
        report.elapsed = time.perf_counter() - submitted
        report.backends = tuple(sorted(backends))
