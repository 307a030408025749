"""The GPU numeric factorization of :mod:`batchlu.kernels.sparse` (CuPy ``values``): the host code of
``kernels/cuda/ldlt.cu``.

The seed paper's numeric phase, level by level over the elimination tree, with the whole batch in
every launch; the levels are those of L's supernodes (:mod:`batchlu.kernels.sparse._gpu_maps`), so
that a run of columns with one shared row structure is one node. Per level:

1. ``ldlt_external``: thread (entry ``(i, j)`` of a column of the level, matrix) subtracts what the
   supernodes below contribute, the left-looking dot product ``sum_k l_ik (l_jk d_k)`` over the
   columns of the supernodes that rows ``i`` and ``j`` both lie below (all on earlier levels), merged
   supernode by supernode; ``i == j`` gives the pivot's part (not on the leaves: nothing lies below);
2. the runs' dense panels, column by column: the run's earlier columns' part of each entry, static
   pivoting, division by the pivot. A narrow run (fewer than ``_gpu_maps.WIDE`` columns) in one
   thread per run and matrix (``ldlt_panel``); a wide run in one block per run and group of
   :data:`WIDE_MATRICES` matrices (``ldlt_wide_panels``): a thread per entry and matrix, a barrier
   between the columns. The pivots as used stay in ``dd`` (n, B) until the end, when they replace L's
   diagonal (which holds the unperturbed values until then).

Every thread writes only its own entries of its own matrix and reads only what earlier launches (or,
in a narrow panel, the same thread) wrote: no atomics, no rounds, no scratch of the size of the work (the
index arrays are the size of L and A), and each matrix's factors are bit for bit the same whatever
the batch around it. The paper updates right-looking with atomic adds; the dot-product (left-looking)
form gives the same factors with a deterministic order of summation and one writer per entry, which
resume's bit-identical outputs need.

The solves walk the same levels, forward and then from the last level backward: a narrow run's
rows in one thread per run and right-hand side (``ldlt_forward_runs``, ``ldlt_backward_runs``), a
wide run's in two launches (what lies below or above the run, a thread per column:
``ldlt_*_external``; then within the run, a block per run and group of matrices, each row's sum in
its own thread in the narrow runs' order: ``ldlt_*_wide``); refinement's residuals ``b - A x`` are
float64 (``ldlt_residual``) against the original values, and ``||A||_inf`` comes from
``ldlt_row_sums``. Refinement computes every matrix in each step and keeps each one's result by its
rules (:meth:`Refining._refine_whole_batch`: one synchronisation a step). Pivot rule, ``info``
codes, inertia and the refinement's stopping rules are the CPU's, from the module both import
(:mod:`batchlu.kernels.sparse._shared`); the results stay on the device.

A level's launches are few but the levels many (29-87 at n = 1,000-20,000), so each (plan, device,
stream, dtype, batch size) gets a :class:`Workspace`: fixed buffers over which the factorization's
launches and each solve's are captured once as CUDA graphs and replayed (one launch from the host
instead of hundreds). ``BATCHLU_SPARSE_GRAPHS=0`` turns them off; a batch whose buffers would pass
:data:`GRAPH_BYTES` runs launch by launch. Both give the same bits.

:func:`factorize_with` is written over an array module ``xp`` and a ``launch(name, threads, args)``
function: CuPy and :class:`CudaLaunch` on the GPU; the tests also run it with NumPy and the same
CUDA text compiled for the host (``tests/kernels/sparse/_cuda_on_host.py``).
"""

from __future__ import annotations

import collections
import os
import threading
from typing import ClassVar

import numpy as np

from batchlu.errors import BatchIndexError, InputError

from . import _gpu_maps
from ._shared import Refining, check_pivot_tol, check_values, pivot_codes, retry_pivot_tol

FAMILY = "ldlt"
KERNELS = ("ldlt_external", "ldlt_panel", "ldlt_wide_panels", "ldlt_forward_external", "ldlt_forward_wide",
           "ldlt_backward_external", "ldlt_backward_wide", "ldlt_forward_runs", "ldlt_backward_runs", "ldlt_residual",
           "ldlt_row_sums", "ldlt_backward_error")
THREADS = 256
WIDE_MATRICES, WIDE_THREADS = 4, 256     # a wide run's block: this many matrices, this many threads
BERR_THREADS = 256                       # a backward error's block (a power of two, at most 256)
GRAPH_BYTES = 1 << 30      # a Workspace (and its graphs) only for a batch whose buffers fit this
SCALAR = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


def name(kernel: str, dtype) -> str:
    """The name expression of ``kernel`` for ``dtype``: ``blu::ldlt_panel<double>``."""
    return f"blu::{kernel}<{SCALAR[np.dtype(dtype)]}>"


def names(dtype) -> tuple[str, ...]:
    """Every kernel of the family for ``dtype`` (compiled together, one NVRTC run)."""
    return tuple(name(k, dtype) for k in KERNELS)


class CudaLaunch:
    """Launch a kernel of ``kernels/cuda/ldlt.cu`` on CuPy's current stream: a 1-D grid of
    :data:`THREADS`-thread blocks covering ``threads``. Compiled at first use (with the other
    kernels of its dtype), cached per compute capability and in CuPy's disk cache. Each instance
    keeps the functions it found, for the device current when it found them: a factorization (one
    instance, one device, like its arrays) launches a few kernels thousands of times."""

    def __init__(self):
        self._found = {}

    def _function(self, expression: str):
        function = self._found.get(expression)
        if function is None:
            from batchlu.kernels._gpu._runtime import kernel

            dtype = next(d for d, s in SCALAR.items() if expression.endswith(f"<{s}>"))
            function = self._found[expression] = kernel(FAMILY, expression, names(dtype))
        return function

    def __call__(self, expression: str, threads: int, args: tuple) -> None:
        if threads <= 0:
            return
        self._function(expression)((-(-threads // THREADS),), (THREADS,), args)

    def blocks(self, expression: str, grid: int, block: int, args: tuple) -> None:
        """A kernel whose blocks synchronise (``ldlt_wide_panels``, ``ldlt_*_wide``, ``ldlt_backward_error``):
        ``grid`` blocks of ``block`` threads."""
        if grid > 0:
            self._function(expression)((grid,), (block,), args)

    def record(self, body, dtype):
        """The launches of ``body(self)`` captured into a CUDA graph, not run (every kernel of
        ``dtype`` is loaded first: nothing but launches happens during the capture). Returns a
        function that runs the graph on the current stream; it holds every argument of the
        captured launches, so that no array the graph reads or writes is freed before it."""
        import cupy

        for kernel in KERNELS:
            self._function(name(kernel, dtype))
        held = []
        parent = self

        class Capture:
            def __call__(self, expression, threads, args):
                held.append(args)
                parent(expression, threads, args)

            def blocks(self, expression, grid, block, args):
                held.append(args)
                parent.blocks(expression, grid, block, args)

        stream = cupy.cuda.Stream(non_blocking=True)     # the legacy null stream cannot capture
        with stream:
            stream.begin_capture()
            try:
                body(Capture())
            finally:
                graph = stream.end_capture()

        def run():
            graph.launch(cupy.cuda.get_current_stream())
            return held

        return run


def record(launch, body, dtype):
    """``body(launch)``'s launches, recorded to be run again and again on the same buffers: a CUDA
    graph where ``launch`` can capture one (:meth:`CudaLaunch.record`), otherwise the list of calls
    (the host tests' launcher). Returns the function that runs them."""
    if hasattr(launch, "record"):
        return launch.record(body, dtype)
    calls = []

    class Recorder:
        def __call__(self, *call):
            calls.append((launch, call))

        if hasattr(launch, "blocks"):
            def blocks(self, *call):
                calls.append((launch.blocks, call))

    body(Recorder())

    def run():
        for function, call in calls:
            function(*call)

    return run


def factorize(plan, values, *, perturb: bool = True, pivot_tol: float | None = None):
    """LDL^T of the CuPy ``values`` (B, nnz) (or (nnz,)) on the current device and stream: a
    :class:`GpuFactor` (see :meth:`batchlu.kernels.sparse.Plan.factorize`)."""
    import cupy

    return factorize_with(plan, values, perturb=perturb, pivot_tol=pivot_tol, xp=cupy, launch=CudaLaunch(),
                          recorded=graphs_wanted())


def graphs_wanted() -> bool:
    """Whether the GPU records its launches as CUDA graphs (:class:`Workspace`): yes, unless the
    environment's ``BATCHLU_SPARSE_GRAPHS`` is ``0``."""
    return os.environ.get("BATCHLU_SPARSE_GRAPHS", "1").strip() != "0"


# ------------------------------------------------------------------------------------- index arrays
_PLAN_ARRAYS = ("colptr", "rowind", "value_src", "value_dst", "perm", "iperm")
_ON_DEVICE: collections.OrderedDict = collections.OrderedDict()
_CACHED = 4
_LOCK = threading.Lock()


def _where(xp):
    return "host" if xp is np else int(xp.cuda.runtime.getDevice())


def _stream(xp):
    return "host" if xp is np else int(xp.cuda.get_current_stream().ptr)


def device_arrays(plan, xp) -> dict:
    """The plan's arrays and :mod:`._gpu_maps` on the device (``xp.asarray``), once per plan and
    device: copied on the current stream, which is synchronised before they are shared, so that
    another thread's stream never reads them half copied."""
    key = (plan.digest, _where(xp))
    with _LOCK:
        found = _ON_DEVICE.get(key)
        if found is not None:
            _ON_DEVICE.move_to_end(key)
            return found
    host = dict(_gpu_maps.for_plan(plan).arrays())
    host.update({k: np.ascontiguousarray(getattr(plan, k), np.int64) for k in _PLAN_ARRAYS})
    made = {k: (v if k in _gpu_maps.HOST_ARRAYS else xp.asarray(v)) for k, v in host.items()}   # loop bounds: host
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()
    with _LOCK:
        _ON_DEVICE[key] = made
        while len(_ON_DEVICE) > _CACHED:
            _ON_DEVICE.popitem(last=False)
        return made


# ---------------------------------------------------------------------------------- factorization
def inf_norms(plan, values, xp, launch, arrays) -> object:
    """``||A||_inf`` per matrix (float64; NaN for a non-finite matrix), on the device."""
    count, n = values.shape[0], plan.n
    if n == 0 or count == 0:
        return xp.zeros(count)
    sums = xp.empty((count, n), np.float64)
    launch(name("ldlt_row_sums", values.dtype), n * count,
           (np.int64(n), np.int64(count), np.int64(plan.nnz), arrays["a_ptr"], arrays["a_src"], values, sums))
    return sums.max(axis=1)


def factorize_with(plan, values, *, perturb: bool, pivot_tol: float | None, xp, launch, recorded: bool = False):
    """The factorization over the array module ``xp`` with the kernels run by ``launch`` (see the
    module docstring); the checks, pivot rule and codes of the CPU's
    :func:`batchlu.kernels.sparse._factor.factorize`. ``recorded``: run the level loop and the
    solves as recordings over a :class:`Workspace` (where one fits), the same launches."""
    values, single = check_values(plan, values, xp)
    values = xp.ascontiguousarray(values)
    dtype = values.dtype
    retry_tol = retry_pivot_tol(pivot_tol, perturb, dtype)
    pivot_tol = check_pivot_tol(pivot_tol, dtype)
    arrays = device_arrays(plan, xp)
    count, n = values.shape[0], plan.n
    finite = xp.isfinite(values).all(axis=1)
    anorm = inf_norms(plan, values, xp, launch, arrays)
    tau = (float(pivot_tol) * xp.nan_to_num(anorm, nan=0.0, posinf=0.0)).astype(dtype)
    space = Workspace.get(plan, arrays, dtype, count, xp) if recorded and count and n else None
    if space is None:
        lx, dd, flag = xp.empty((plan.nnz_l, count), dtype), xp.empty((n, count), dtype), xp.empty((n, count), np.uint8)
        _initial(arrays, values, lx, flag)
        _factor_levels(arrays, count, dtype, (tau, np.int32(bool(perturb)), lx, dd, flag), launch)
        lx[arrays["colptr"][:-1]] = dd
    else:
        with space.lock:
            lx, dd, flag, token = space.factorize(values, tau, perturb, launch)
    finite_d = xp.isfinite(dd)                                      # dd (n, B): the pivots as used
    negative = ((dd < 0) & finite_d).sum(axis=0).astype(np.int64)
    zero = (dd == 0).sum(axis=0).astype(np.int64)
    nonfinite = (~finite_d).sum(axis=0).astype(np.int64)
    perturbed = flag.sum(axis=0, dtype=np.int64)
    if n and count:
        is_zero = dd == 0
        first_zero = xp.where(is_zero.any(axis=0), is_zero.argmax(axis=0), n).astype(np.int64)
    else:
        first_zero = xp.full(count, n, np.int64)
    info, inertia = pivot_codes(n, first_zero, negative, zero, nonfinite, finite, xp)
    perturbed[~finite] = -1
    return GpuFactor(plan, values, lx, arrays, info, perturbed.astype(np.int32), inertia, anorm,
                     float(pivot_tol), bool(perturb), single, xp, launch, None if space is None else (space, token),
                     retry_tol, recorded)


def _initial(arrays, values, lx, flag) -> None:
    """The level loop's inputs, in place: A's entries scattered into L's pattern (zeros elsewhere),
    no pivot perturbed."""
    lx.fill(0)
    lx[arrays["value_dst"]] = values[:, arrays["value_src"]].T
    flag.fill(0)


def _over(items, ptr, k, count):
    """``(threads, (items, first, length, count))`` for range ``k`` of ``ptr`` over ``count`` matrices."""
    lo, hi = int(ptr[k]), int(ptr[k + 1])
    return (hi - lo) * count, (items, np.int64(lo), np.int64(hi - lo), np.int64(count))


def _factor_levels(arrays, count, dtype, pivoting, launch) -> None:
    """The factorization's launches, level by level (module docstring): launches only, no
    allocation and no synchronisation, so that they can be recorded. ``pivoting`` is ``(tau,
    perturb, lx, dd, flag)``."""
    lx, dd = pivoting[2], pivoting[3]
    external, panel, wide = (name(f"ldlt_{k}", dtype) for k in ("external", "panel", "wide_panels"))
    ent_ptr, narrow_ptr, wide_ptr = arrays["ent_ptr"], arrays["narrow_ptr"], arrays["wide_ptr"]
    below = (arrays["col_of"], arrays["rowind"], arrays["base"], arrays["sn_first"], arrays["sn_size"],
             arrays["rl_ptr"], arrays["rl_sn"], arrays["rl_idx"], dd, lx)
    groups = -(-count // WIDE_MATRICES)
    for level in range(arrays["sn_ptr"].size - 1):
        if level:                                   # leaves: no supernode below them
            threads, args = _over(arrays["ent"], ent_ptr, level, count)
            launch(external, threads, (*args, *below))
        threads, args = _over(arrays["narrow"], narrow_ptr, level, count)
        launch(panel, threads, (*args, arrays["sn_first"], arrays["sn_size"], arrays["colptr"], *pivoting))
        lo, hi = int(wide_ptr[level]), int(wide_ptr[level + 1])
        if hi > lo:
            launch.blocks(wide, (hi - lo) * groups, WIDE_THREADS,
                          (arrays["wide"], np.int64(lo), np.int64(WIDE_MATRICES), np.int64(count), arrays["sn_first"],
                           arrays["sn_size"], arrays["col_of"], arrays["sn_of"], arrays["colptr"], *pivoting))


def _solve_levels(arrays, dtype, launch, lx, y, acc, rows, count, k, batch, backward: bool) -> None:
    """A solve's launches over the levels, forward (``L``) or backward (``L^T``), for ``y`` (n,
    count, k) in place, whose matrices are ``rows`` of ``lx``'s ``batch``; ``acc`` (y's shape) holds
    the wide runs' sums: launches only, as :func:`_factor_levels`."""
    fixed = (np.int64(count), np.int64(k), np.int64(batch), rows)
    narrow, columns = (arrays["narrow"], arrays["narrow_ptr"]), (arrays["wide_cols"], arrays["wide_cols_ptr"])
    shape = (arrays["sn_first"], arrays["sn_size"])
    below = (arrays["rl_ptr"], arrays["rl_sn"], arrays["rl_idx"])
    up = (arrays["colptr"], arrays["rowind"], arrays["base"])
    way = "backward" if backward else "forward"
    runs, external, wide = (name(f"ldlt_{way}_{part}", dtype) for part in ("runs", "external", "wide"))
    groups = -(-count // WIDE_MATRICES)

    def step(kernel, over, level, *args):           # one launch: the level's runs or columns x R x K
        items, ptr = over
        lo, hi = int(ptr[level]), int(ptr[level + 1])
        launch(kernel, (hi - lo) * count * k, (items, np.int64(lo), np.int64(hi - lo), *fixed, *args))

    def panels(level):                              # the level's wide runs, a block per run and group
        lo, hi = int(arrays["wide_ptr"][level]), int(arrays["wide_ptr"][level + 1])
        if hi > lo:
            launch.blocks(wide, (hi - lo) * groups, WIDE_THREADS,
                          (arrays["wide"], np.int64(lo), np.int64(WIDE_MATRICES), np.int64(count), np.int64(k),
                           np.int64(batch), rows, *shape, arrays["colptr"], lx, y, acc))

    nlevels = arrays["sn_ptr"].size - 1
    if not backward:
        for level in range(nlevels):
            step(runs, narrow, level, *shape, arrays["colptr"], arrays["base"], *below, lx, y)
            if level:                                   # leaves: no supernode below them
                step(external, columns, level, arrays["base"], *shape, *below, lx, y)
            panels(level)
    else:
        for level in range(nlevels - 1, -1, -1):
            step(runs, narrow, level, *shape, *up, lx, y)
            step(external, columns, level, *up, lx, y)
            panels(level)


class Workspace:
    """The fixed buffers of one (plan, device, stream, dtype, batch size) and the launches recorded
    over them: on the GPU, CUDA graphs, so that a factorization or a solve costs one launch from
    the host instead of one per level and step (hundreds at n = 1,000).

    The factorization's graph (one per ``perturb``) reads ``values``' scatter and ``tau`` from here
    and writes ``lx``, ``dd`` and ``flag`` here; the factor gets a copy of ``lx``, and this
    workspace remembers whose factors its ``lx`` holds (:attr:`owner`). A solve's two graphs (per
    number of right-hand sides) read ``lx`` and update ``y`` (n, batch, k) in place, for the whole
    batch; a factor whose factors are not the ones here copies its own in first. The same kernels,
    arguments and order as without graphs, so the same bits. Made when a batch's buffers fit
    :data:`GRAPH_BYTES`; the last :data:`_KEEP` are kept (their memory stays allocated)."""

    _made: ClassVar[collections.OrderedDict] = collections.OrderedDict()
    _KEEP: ClassVar[int] = 2

    def __init__(self, plan, arrays, dtype, count, xp):
        n = plan.n
        self.arrays = arrays            # the graphs read them: kept alive with them
        self.dtype, self.count, self.xp = dtype, count, xp
        self.lx = xp.zeros((plan.nnz_l, count), dtype)
        self.dd = xp.zeros((n, count), dtype)
        self.flag = xp.zeros((n, count), np.uint8)
        self.tau = xp.zeros(count, dtype)
        self.rows = xp.arange(count, dtype=np.int64)
        self.stream = _stream(xp)
        self.owner = None               # the token of the factor whose factors lx holds
        self.lock = threading.Lock()
        self._factorizations = {}       # perturb: run
        self._solves = {}               # k: (y, forward run, backward run)

    @staticmethod
    def nbytes(plan, dtype, count, k: int = 0) -> int:
        """The buffers' bytes, with a solve's for ``k`` right-hand sides."""
        item = np.dtype(dtype).itemsize
        return count * (plan.nnz_l * item + plan.n * (item * (1 + 2 * k) + 1) + item + 8)

    @classmethod
    def get(cls, plan, arrays, dtype, count, xp):
        """The workspace of this plan, device, stream, dtype and batch size (made on first use), or
        None where its buffers would pass :data:`GRAPH_BYTES`."""
        if cls.nbytes(plan, dtype, count) > GRAPH_BYTES:
            return None
        key = (plan.digest, _where(xp), _stream(xp), np.dtype(dtype).str, count)
        with _LOCK:
            found = cls._made.get(key)
            if found is not None:
                cls._made.move_to_end(key)
                return found
        made = cls(plan, arrays, dtype, count, xp)
        with _LOCK:
            made = cls._made.setdefault(key, made)
            while len(cls._made) > cls._KEEP:
                cls._made.popitem(last=False)
            return made

    def factorize(self, values, tau, perturb, launch):
        """``(lx, dd, flag, token)`` of ``values`` (count, nnz): copies for the factor, and the token
        that names its factors here (the caller holds :attr:`lock`)."""
        perturb = bool(perturb)
        self.tau[...] = tau
        _initial(self.arrays, values, self.lx, self.flag)
        run = self._factorizations.get(perturb)
        if run is None:
            pivoting = (self.tau, np.int32(perturb), self.lx, self.dd, self.flag)
            run = self._factorizations[perturb] = record(
                launch, lambda go: _factor_levels(self.arrays, self.count, self.dtype, pivoting, go), self.dtype)
        run()
        self.lx[self.arrays["colptr"][:-1]] = self.dd
        self.owner = object()
        return self.lx.copy(), self.dd.copy(), self.flag.copy(), self.owner

    def solve(self, lx, token, y, launch):
        """``L D L^T``'s solution for ``y`` (n, count, k, in the factor's dtype, permuted) and every
        matrix of the factor ``lx`` named ``token`` (its factors copied in first if they are not the
        ones here; the caller holds :attr:`lock`)."""
        k = y.shape[2]
        if self.owner is not token:
            self.lx[...] = lx
            self.dd[...] = lx[self.arrays["colptr"][:-1]]
            self.owner = token
        found = self._solves.get(k)
        if found is None:
            if len(self._solves) >= 2:
                self._solves.clear()
            buffer, acc = self.xp.zeros(y.shape, self.dtype), self.xp.zeros(y.shape, self.dtype)
            ways = [record(launch, lambda go, back=back: _solve_levels(
                self.arrays, self.dtype, go, self.lx, buffer, acc, self.rows, self.count, k, self.count, back),
                self.dtype) for back in (False, True)]
            found = self._solves[k] = (buffer, *ways)     # the runs hold acc (and every argument)
        buffer, forward, backward = found
        buffer[...] = y
        forward()
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            buffer /= self.dd[:, :, None]
        backward()
        return buffer.copy()


class GpuFactor(Refining):
    """``P A P^T = L D L^T`` for every matrix of a batch, on the device: the interface and meanings of
    :class:`batchlu.kernels.sparse.Factor` (``info``, :meth:`solve`, :meth:`inertia`, ...), with
    device arrays in and out. ``lx`` (nnz(L), B) holds L and D batch-minor."""

    backend = "gpu"
    whole_batch = True

    def __init__(self, plan, values, lx, arrays, info, perturbed, inertia, anorm, pivot_tol, perturb, single,
                 xp, launch, space=None, retry_tol=None, recorded=False):
        self.plan = plan
        self.dtype = values.dtype
        self.values = values             # kept for the residuals of iterative refinement
        self.lx = lx
        self._arrays = arrays
        self.info = info
        self._perturbed = perturbed
        self._inertia = inertia
        self.anorm = anorm               # ||A||_inf per matrix (float64)
        self.pivot_tol = pivot_tol
        self.perturb = perturb
        self.single = single
        self.xp = xp
        self._launch = launch
        self._space = space              # (Workspace, token) whose recorded solves this factor uses, or None
        self._recorded = recorded        # factored with recording wanted (the second attempt's too)
        self.retry_tol = retry_tol       # the second attempt's threshold factor (solve), or None
        self._tried = xp.zeros(values.shape[0], bool)     # given a second attempt
        self._retried = xp.zeros(values.shape[0], bool)   # ... and holding its factors now
        self.refine_steps = None         # per matrix, of the last solve
        self.last_backward_error = None  # per matrix, of the last solve

    @property
    def batch(self) -> int:
        return self.values.shape[0]

    # ------------------------------------------------------------------------------------ queries
    def perturbed_pivots(self):
        """(B,) int32: how many pivots static pivoting replaced, per matrix (-1 for a non-finite one)."""
        return self._out(self._perturbed.copy())

    def inertia(self):
        """(B, 3) int64: positive, negative and zero pivots of D per matrix, as used (see
        :meth:`batchlu.kernels.sparse.Factor.inertia`); -1 for a non-finite matrix."""
        return self._out(self._inertia.copy())

    def pivots(self):
        """(B, n): D's pivots in C's numbering, as used (perturbed ones replaced)."""
        return self._out(self.xp.ascontiguousarray(self.lx[self._arrays["colptr"][:-1]].T))

    def factors(self, index: int = 0):
        """``(L, d)`` of matrix ``index`` on the host: L unit lower triangular as a SciPy CSC array and
        D's pivots, with ``L @ diag(d) @ L.T == A[perm][:, perm]`` up to rounding."""
        import scipy.sparse as sp

        if not 0 <= index < self.batch:
            raise BatchIndexError(f"Expected an index in [0, {self.batch}). Got {index} instead.")
        plan = self.plan
        data = _host(self.lx[:, index]).copy()
        d = data[plan.colptr[:-1]].copy()
        data[plan.colptr[:-1]] = 1
        return sp.csc_array((data, plan.rowind, plan.colptr), shape=(plan.n, plan.n)), d

    # -------------------------------------------------------------------------------- second attempt
    def _refactor(self, rows, pivot_tol: float) -> GpuFactor:
        """The matrices ``rows`` factored again with the threshold factor ``pivot_tol``, the same launcher:
        recorded (on this batch size's workspace, its graphs replayed) when they are the whole batch,
        launch by launch otherwise (no new graphs for a one-off batch size)."""
        return factorize_with(self.plan, self.values[rows], perturb=True, pivot_tol=float(pivot_tol), xp=self.xp,
                              launch=self._launch, recorded=self._recorded and rows.size == self.batch)

    def _adopt(self, rows, other: GpuFactor, src) -> None:
        """Take ``other``'s factors of its matrices ``src`` for this factor's matrices ``rows``; a
        workspace holding this factor's old ones is told they are not current (new token)."""
        if rows.size == self.batch and other.batch == self.batch:     # all of them, in order: its copy
            self.lx = other.lx
        else:
            self.lx[:, rows] = other.lx[:, src]
        if self._space is not None:
            self._space = (self._space[0], object())

    # -------------------------------------------------------------------------------------- solve
    def _solve(self, r, rows):
        """``x`` (len(rows), n, k) in the factor's dtype with ``L D L^T (P x) = P r`` for the matrices
        ``rows`` (int64, on the device); ``r`` (len(rows), n, k) holds their right-hand sides."""
        xp, plan, arrays, dtype = self.xp, self.plan, self._arrays, self.dtype
        count, k = rows.size, r.shape[2]
        if count == 0 or k == 0 or plan.n == 0:
            return xp.zeros(r.shape, dtype)
        y = xp.ascontiguousarray(r.transpose(1, 0, 2)[arrays["perm"]].astype(dtype, copy=False))   # (n, R, k)
        acc = xp.empty_like(y)
        _solve_levels(arrays, dtype, self._launch, self.lx, y, acc, rows, count, k, self.batch, backward=False)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            y /= self.lx[arrays["colptr"][:-1]][:, rows][:, :, None]
        _solve_levels(arrays, dtype, self._launch, self.lx, y, acc, rows, count, k, self.batch, backward=True)
        return xp.ascontiguousarray(y[arrays["iperm"]].transpose(1, 0, 2))

    def _solve_all(self, r):
        """:meth:`_solve` for every matrix, ``r`` (B, n, k): through the workspace's recorded solves
        where it has them, None otherwise."""
        if self._space is None or r.shape[2] == 0:
            return None
        space, token = self._space
        if space.stream != _stream(self.xp) or space.nbytes(self.plan, self.dtype, self.batch, r.shape[2]) > GRAPH_BYTES:
            return None                     # another stream than the factorization's, or too large
        arrays = self._arrays
        y = r.transpose(1, 0, 2)[arrays["perm"]].astype(self.dtype, copy=False)
        with space.lock:
            y = space.solve(self.lx, token, y, self._launch)
        return self.xp.ascontiguousarray(y[arrays["iperm"]].transpose(1, 0, 2))

    def _residual(self, b, x, rows):
        """``b - A x`` in float64 for the matrices ``rows``; ``b`` and ``x`` (len(rows), n, k) are
        theirs, in the same order."""
        xp, plan = self.xp, self.plan
        count, n, k = rows.size, plan.n, b.shape[2]
        out = xp.empty((count, n, k), np.float64)
        a = self._arrays
        self._launch(name("ldlt_residual", self.dtype), n * count * k,
                     (np.int64(n), np.int64(count), np.int64(k), np.int64(plan.nnz), rows, a["a_ptr"], a["a_col"],
                      a["a_src"], self.values, xp.ascontiguousarray(x, dtype=np.float64),
                      xp.ascontiguousarray(b, dtype=np.float64), out))
        return out

    def _berr(self, r, x, b, rows):
        """:meth:`Refining._berr` in one launch (``ldlt_backward_error``, a block per solution), then
        the largest over each matrix's right-hand sides."""
        xp = self.xp
        count, n, k = r.shape
        if count == 0 or k == 0:
            return xp.zeros(count)
        if n == 0 or x.dtype != self.dtype:        # a caller's x in another dtype: as it is, in float64
            return super()._berr(r, x, b, rows)
        out = xp.empty((count, k), np.float64)
        self._launch.blocks(name("ldlt_backward_error", self.dtype), count * k, BERR_THREADS,
                            (np.int64(n), np.int64(k), xp.ascontiguousarray(r, dtype=np.float64),
                             xp.ascontiguousarray(x), xp.ascontiguousarray(b, dtype=np.float64),
                             xp.ascontiguousarray(self.anorm[rows], dtype=np.float64), out))
        return out.max(axis=1)

    def backward_error(self, b, x):
        """(B,) float64: ``||b - A x||_inf / (||A||_inf ||x||_inf + ||b||_inf)`` per matrix (the
        largest over a matrix's right-hand sides), computed in float64. NaN where x is not finite."""
        xp = self.xp
        b3, _ = self._check_rhs(b)
        x3, _ = self._check_rhs(x, "x")
        if x3.shape != b3.shape:
            raise InputError(f"Expected x of the shape of b, {tuple(b.shape)}. Got {tuple(x.shape)} instead.")
        rows = xp.arange(self.batch, dtype=np.int64)
        if self.plan.n == 0 or b3.shape[2] == 0 or self.batch == 0:
            return self._out(xp.zeros(self.batch))
        b64 = b3.astype(np.float64)
        return self._out(self._berr(self._residual(b64, x3, rows), x3, b64, rows))

    def _first(self, b):
        x = self._solve_all(b)
        return x if x is not None else self._solve(b, self.xp.arange(self.batch, dtype=np.int64))

    def _correction(self, r, rows):
        if 2 * rows.size > self.batch:      # more than half the batch: the recorded solve of all of it
            x = self._solve_all(r)
            if x is not None:
                return x[rows]
        return self._solve(r[rows], rows)

    # solve: Refining.solve, the rules and results of batchlu.kernels.sparse.Factor.solve, on the device

def _host(x) -> np.ndarray:
    return x.get() if hasattr(x, "get") and not isinstance(x, np.ndarray) else np.asarray(x)
