"""``batchlu.pipeline.run``: check everything, create or reopen the output, submit one task per run of
output chunks (:mod:`batchlu.pipeline.client._submit`), and report.

The client's sequence, one step each: open and check the inputs (:func:`_open_inputs`), describe
the run (:func:`_provenance`), take the output's lock and decide on what is there, cut the matrices
into tasks (:func:`_plan`), create the output or check the one to resume (:func:`_create_or_reopen`),
compute (:func:`_compute`), and check and record the end (:func:`_finish`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
import warnings

import numpy as np
import zarr

from .._ops import INFO_NOT_COMPUTED, InfoCounts, get_op, info_counts, output_specs
from .._plan import Plan, budget_warning, bytes_per_matrix, make_plan
from ..cluster._guard import check_not_bootstrapping
from ..config._settings import Options, task_delay
from ..config._settings import options as make_options
from ..errors import BatchluWarning, FencedError, InputChangedError, InputError, ObjectStoreError, ResumeError
from ..output import _fingerprint, _group, _ledger, _lock
from ..store import _sparse
from ..store._arrays import ArrayInfo, check_matrices, check_rhs, open_array_info, parse_ref
from ..store._files import check_output_path, check_replaceable, discard, naming_full_device
from ..store._object_store import naming_store_failures, store_error, takes_storage_options, zarr_store
from ..worker._tasks import Job
from . import _submit
from ._report import Report

__all__ = ["run"]


@contextlib.contextmanager
def _kept_for_resume(report: Report):
    """An object store that fails once tasks may have written (obstore's error, or batchlu's line of
    it): one :class:`ObjectStoreError` that says so and that the output is kept for resume."""
    try:
        yield
    except Exception as exc:
        failed = store_error(exc)
        if failed is None or not report.submitted:
            raise
        raise ObjectStoreError(f"{failed} The output is kept: finish the run with resume (--resume) once "
                               f"the store works again.") from None


def _count_info(path: str) -> InfoCounts:
    info = np.asarray(zarr.open_array(store=zarr_store(path, read_only=True), path="info", mode="r")[...])
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


@takes_storage_options(writes="output")
@naming_store_failures
@_naming_a_full_device
@_lock.releases_locks
def run(input, output, *, op, rhs=None, resume=False, overwrite=False, force=False, backend=None,
        client=None, scheduler=None, scheduler_file=None, progress=True, config=None) -> Report:
    """Compute ``op`` (``lu``, ``inv``, ``solve``, ``slogdet``, ``ldlt-solve`` or ``ldlt-inertia``)
    for every matrix of ``input``.

    ``input`` (and ``rhs`` for ``solve``) is ``PATH`` or ``PATH:ARRAY`` of a Zarr v2 or v3 array
    (N, n, n) (right-hand side (N, n) or (N, n, k)); for the sparse ops it is a sparse batch, a Zarr
    group (:mod:`batchlu.pipeline.store._sparse`) whose ``rhs`` array ``ldlt-solve`` reads unless ``rhs``
    is given. ``output`` becomes a Zarr v3 group with one
    array per result and ``info``. ``resume`` finishes an interrupted run (same input and op);
    ``overwrite`` replaces an existing output that batchlu wrote (any Zarr store with ``force``).
    ``backend`` (``auto``: the GPU where a worker has one, ``cpu`` or ``gpu``) overrides
    ``batchlu.backend``; None keeps the config's. ``progress`` False hides the bar. Tasks run on
    ``client``, on the cluster at ``scheduler`` / ``scheduler_file``, or on an embedded LocalCluster. ``config`` holds ``batchlu`` settings
    (mapping or :class:`batchlu.pipeline.Options`). ``storage_options`` (a mapping): credentials,
    endpoint and region for ``s3://`` inputs and outputs, obstore's S3 keys or fsspec's names
    (``key``, ``secret``, ``endpoint_url``), else the environment's ``AWS_*`` variables and the Dask
    config's ``batchlu-s3.storage-options``. Returns a :class:`batchlu.pipeline.Report`.
    """
    check_not_bootstrapping("batchlu.run")
    called = time.perf_counter()
    opts = make_options(config, backend=backend)
    show = bool(progress) and opts.progress
    inputs = _open_inputs(input, rhs, op, opts)
    out_path = check_output_path(output, inputs.refs())
    if overwrite:
        check_replaceable(out_path, writer="run", force=force)
    specs = inputs.output_specs()
    provenance = _provenance(inputs, specs, opts)
    lock = _lock.acquire(out_path)  # one writer per output, before overwrite deletes anything; held until return
    record = _group.check_existing(out_path, resume=resume, overwrite=overwrite)
    if record is not None:
        _group.check_resume(record, provenance)
        if inputs.sparse is not None:
            _check_same_pattern(record, provenance["sparse"])
    plan = _plan(inputs, specs, record, opts)
    provenance["plan"] = plan.as_dict()
    entry = _create_or_reopen(out_path, record, provenance, specs, plan, opts, inputs)

    job = Job(op=op, input=inputs.matrices.ref, rhs=inputs.rhs_ref, output=out_path,
              outputs=tuple(s.name for s in specs), plan=plan, backend=opts.backend,
              settings=opts, task_delay=task_delay(), symbolic=inputs.symbolic,
              fence=lock.fence())  # the tasks write only while the lock names this run
    report = Report(output=out_path, op=op, count=inputs.matrices.count, backend=opts.backend)
    with _kept_for_resume(report):
        _compute(job, report, entry, opts, show, called,
                 connect=dict(client=client, scheduler=scheduler, scheduler_file=scheduler_file))
        _finish(job, report, entry, inputs, called)
    return report


# ------------------------------------------------------------------------------------------ the steps
@dataclasses.dataclass(frozen=True)
class _Inputs:
    """The run's inputs, checked: the matrices (a sparse batch's values), the right-hand sides, the
    op and, for a sparse op, its batch and the pattern's analysis."""

    op: str
    matrices: ArrayInfo
    rhs: ArrayInfo | None
    k: int | None
    n: int
    sparse: _sparse.SparseInput | None = None

    @property
    def symbolic(self):
        return None if self.sparse is None else self.sparse.symbolic

    @property
    def rhs_ref(self):
        return self.rhs.ref if self.rhs else None

    def refs(self) -> list:
        return [self.matrices.ref] + ([self.rhs.ref] if self.rhs else [])

    def output_specs(self) -> list:
        return output_specs(self.op, self.n, self.matrices.dtype, self.rhs.dtype if self.rhs else None, self.k)


def _open_inputs(input, rhs, op: str, opts: Options) -> _Inputs:
    """Open and check the input (a sparse op's batch and its pattern's analysis) and the right-hand
    sides ``op`` takes, before anything is written."""
    spec = get_op(op)
    if spec.sparse:
        source = _sparse.open_input(input, rhs, needs_rhs=spec.needs_rhs, settings=opts)
        return _Inputs(op, source.values, source.rhs, source.k, source.n, source)
    matrices = open_array_info(parse_ref(input))
    n = check_matrices(matrices)
    if spec.needs_rhs:
        if rhs is None:
            raise InputError(f"Expected a right-hand side (rhs, --rhs B.zarr) for op {op}. "
                             "Got none instead.")
        rhs_info = open_array_info(parse_ref(rhs), "right-hand side")
        return _Inputs(op, matrices, rhs_info, check_rhs(rhs_info, matrices), n)
    if rhs is not None:
        raise InputError(f"Expected no right-hand side for op {op}; only solve takes one. "
                         f"Got rhs={rhs!r} instead.")
    return _Inputs(op, matrices, None, None, n)


def _provenance(inputs: _Inputs, specs: list, opts: Options) -> dict:
    """The output's record of this run, as it starts: status running, no plan yet."""
    matrices, rhs_info = inputs.matrices, inputs.rhs
    provenance = {
        "format": _group.FORMAT, "status": "running", "op": inputs.op,
        "input": matrices.as_dict(), "rhs": rhs_info.as_dict() if rhs_info else None,
        "dtype": str(matrices.dtype), "n": inputs.n, "N": matrices.count, "k": inputs.k,
        "outputs": [s.name for s in specs], "backend": opts.backend, "backends_used": [],
        "version": _group.version(), "started": _group.now(), "finished": None,
        "settings": opts.as_dict(),
        "input_files": _fingerprint.signatures(matrices.ref, inputs.rhs_ref),
    }
    if inputs.sparse is not None:
        provenance["sparse"] = inputs.sparse.provenance()
    return provenance


def _plan(inputs: _Inputs, specs: list, record: dict | None, opts: Options) -> Plan:
    """The tasks, batches and chunks of the run (an output to resume keeps its chunks), with a
    warning where one matrix exceeds the memory budget."""
    matrices, n = inputs.matrices, inputs.n
    chunk = int(record["plan"]["chunk"]) if record and record.get("plan") else opts.chunk
    out_bytes = sum(s.nbytes() for s in specs)
    rhs_bytes = inputs.rhs.dtype.itemsize * n * (inputs.k or 1) if inputs.rhs else 0
    if inputs.sparse is not None:
        symbolic = inputs.symbolic
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
        warnings.warn(note, BatchluWarning, stacklevel=3)
    return plan


@dataclasses.dataclass
class _Entry:
    """This run's entry in the output's record: where the record is, what it says, and the earlier
    runs' entries it keeps."""

    path: str
    provenance: dict
    runs: list
    started: str
    resumed: bool

    def fail(self, report: Report, exc: BaseException, times: dict) -> None:
        """Best effort: record the failure (obstore's error as its one line); the status never says
        complete."""
        exc = store_error(exc) or exc
        try:
            _group.update(self.path, status="failed", error=f"{type(exc).__name__}: {exc}",
                          runs=self.runs + [{"started": self.started, "finished": _group.now(),
                                             "status": "failed", "matrices": report.processed, **times}])
        except Exception:
            pass
        report.status = "failed"


def _create_or_reopen(out_path: str, record: dict | None, provenance: dict, specs: list, plan: Plan,
                      opts: Options, inputs: _Inputs) -> _Entry:
    """A new output, or the output to resume checked before its ledger is trusted (the arrays and the
    chunks recorded complete stored, the same input values); then the record of this run, status
    running."""
    if record is None:
        _group.create(out_path, provenance, specs, plan, opts.output_codec, opts.output_layout,
                      checksum=opts.output_checksum)
        runs = []
    else:
        group = zarr.open_group(store=zarr_store(out_path), mode="r+")
        # before trusting the ledger: every output and complete chunk stored, the same input values
        complete = _ledger.read(out_path) if _ledger.exists(group) else None
        damaged = _group.check_stored(out_path, group, specs, plan, complete)
        if damaged:   # chunks that fail their CRC-32C: not trusted, computed again (unless refused below)
            complete = complete.copy()
            complete[[c for c, _ in damaged]] = False
        _fingerprint.check_unchanged(out_path, record, plan, complete, inputs.matrices.ref, inputs.rhs_ref,
                                     opts.memory_budget)
        if damaged:
            _group.redo(out_path, plan, damaged)
        _group.clean_partials(out_path)
        # arrays made again after a kill during creation: as the run that created the output made them;
        # the record keeps saying so, under today's names, whatever this run's settings ask
        codec, layout, checksum = _group.created_with(record)
        _group.ensure_arrays(group, specs, plan, codec, layout, checksum=checksum)
        provenance["settings"].update(output_codec=codec, output_layout=layout, output_checksum=checksum)
        runs = list(record.get("runs", []))
        provenance["started"] = record.get("started", provenance["started"])
        provenance["backends_used"] = list(record.get("backends_used", []))
    entry = _Entry(out_path, provenance, runs, _group.now(), bool(record))
    _group.update(out_path, **provenance, error=None, runs=runs + [{"started": entry.started, "resume": entry.resumed}])
    return entry


def _compute(job: Job, report: Report, entry: _Entry, opts: Options, show: bool, called: float, connect: dict):
    """The tasks of the chunks not yet complete, on the cluster. A failure before any task was
    submitted leaves no new output behind; one after is recorded (unless the output is another run's
    now) and the output kept for resume."""
    try:
        complete = _ledger.read(entry.path)
        tasks = job.plan.tasks(complete)
        report.skipped = int(_ledger.matrix_mask(complete, job.plan.chunk, job.plan.count).sum())
        report.tasks = len(tasks)
        report.plan = time.perf_counter() - called
        if tasks:
            _submit.submit(job, tasks, report, opts, show, **connect)
    except BaseException as exc:
        if not entry.resumed and not report.submitted:
            # no task was submitted (no cluster, no GPU, interrupted at once): leave no output
            # behind, so that the corrected command needs neither --resume nor --overwrite
            discard(entry.path)
        elif not isinstance(exc, FencedError):   # fenced: the output is another run's now
            entry.fail(report, exc, _times(report, called))
        raise


def _finish(job: Job, report: Report, entry: _Entry, inputs: _Inputs, called: float) -> None:
    """After the tasks: the output still this run's, every chunk recorded, the input's files as the
    run found them; then the record says complete."""
    out_path = entry.path
    checking = time.perf_counter()
    job.fence.check()   # the record too: no status written over an output another run took meanwhile
    if not _ledger.read(out_path).all():  # a task returned without recording its chunks
        exc = RuntimeError("Expected every output chunk recorded complete after the run. "
                           "Got some unrecorded instead.")
        entry.fail(report, exc, _times(report, called))
        raise exc
    try:   # the input's files as the run found them: else its chunks may mix old and new values
        _fingerprint.check_same_files(entry.provenance["input_files"], inputs.matrices.ref, inputs.rhs_ref)
        if report.skipped:
            report.counts = _count_info(out_path)
    except (InputChangedError, KeyboardInterrupt, SystemExit) as exc:   # a stop here: recorded too
        entry.fail(report, exc, _times(report, called))
        raise
    recording = time.perf_counter()
    report.finish_steps["checks"] = recording - checking
    used = sorted(set(entry.provenance["backends_used"]) | set(report.backends))
    _group.update(out_path, status="complete", finished=_group.now(), backends_used=used,
                  runs=entry.runs + [{"started": entry.started, "finished": _group.now(),
                                      "resume": entry.resumed, "status": "complete",
                                      "matrices": report.processed, **_times(report, called)}],
                  counts=report.counts._asdict())
    report.finish_steps["record"] = time.perf_counter() - recording
    report.status = "complete"
    report.end(time.perf_counter() - called)


def _check_same_pattern(record: dict, now: dict) -> None:
    """Resume of a sparse op: the pattern and its analysis (ordering, L) must be the recorded ones."""
    before = record.get("sparse") or {}
    if before.get("digest") != now["digest"]:
        raise ResumeError(f"Expected the sparse pattern and ordering of {now['group']} to be the ones the "
                          f"output was computed with (digest {before.get('digest')}, ordering "
                          f"{before.get('ordering')}). Got digest {now['digest']} (ordering {now['ordering']}) "
                          f"instead: the pattern or the ordering changed; use overwrite (--overwrite).")


def _times(report: Report, called: float) -> dict:
    """The run's times as its record in the output's provenance keeps them (see client._report)."""
    report.end(time.perf_counter() - called)
    return {"plan": report.plan, "cluster_start": report.cluster_start, "warmup": report.warmup,
            "seconds": report.elapsed, "finish": report.finish, "wall": report.wall}
