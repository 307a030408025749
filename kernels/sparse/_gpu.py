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
   thread per run and matrix (``ldlt_panel``); the wide runs a column index at a time, a thread per
   entry and matrix (``ldlt_panel_entries``, then ``ldlt_pivots``), two launches per column index
   shared by the level's wide runs. The pivots as used stay in ``dd`` (n, B) until the end, when they
   replace L's diagonal (which holds the unperturbed values until then).

Every thread writes only its own entries of its own matrix and reads only what earlier launches (or,
in a narrow panel, the same thread) wrote: no atomics, no rounds, no scratch of the size of the work (the
index arrays are the size of L and A), and each matrix's factors are bit for bit the same whatever
the batch around it. The paper updates right-looking with atomic adds; the dot-product (left-looking)
form gives the same factors with a deterministic order of summation and one writer per entry, which
resume's bit-identical outputs need.

The solves walk the same levels, forward and then from the last level backward: a narrow run's
rows in one thread per run and right-hand side (``ldlt_forward_runs``, ``ldlt_backward_runs``), a
wide run's in two launches (what lies below or above the run, a thread per column:
``ldlt_*_external``; then within the run: ``ldlt_*_panel``); refinement's residuals ``b - A x``
are float64 (``ldlt_residual``) against the original values, and ``||A||_inf`` comes from
``ldlt_row_sums``. Pivot rule, ``info`` codes, inertia and the refinement's stopping rules are the
CPU's (:mod:`batchlu.kernels.sparse._factor`); the results stay on the device.

:func:`factorize_with` is written over an array module ``xp`` and a ``launch(name, threads, args)``
function: CuPy and :class:`CudaLaunch` on the GPU; the tests also run it with NumPy and the same
CUDA text compiled for the host (``tests/kernels/sparse/_cuda_on_host.py``).
"""

from __future__ import annotations

import collections
import threading

import numpy as np

from batchlu.errors import BatchIndexError, InputError
from batchlu.kernels._info import INFO_NONFINITE_INPUT, INFO_OK

from . import _gpu_maps
from ._factor import Refining, check_pivot_tol, check_values

FAMILY = "ldlt"
KERNELS = ("ldlt_external", "ldlt_panel", "ldlt_panel_entries", "ldlt_pivots", "ldlt_forward_external", "ldlt_forward_panel", "ldlt_backward_external",
           "ldlt_backward_panel", "ldlt_forward_runs", "ldlt_backward_runs", "ldlt_residual", "ldlt_row_sums")
THREADS = 256
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

    def __call__(self, expression: str, threads: int, args: tuple) -> None:
        if threads <= 0:
            return
        function = self._found.get(expression)
        if function is None:
            from batchlu.kernels._gpu._runtime import kernel

            dtype = next(d for d, s in SCALAR.items() if expression.endswith(f"<{s}>"))
            function = self._found[expression] = kernel(FAMILY, expression, names(dtype))
        function((-(-threads // THREADS),), (THREADS,), args)


def factorize(plan, values, *, perturb: bool = True, pivot_tol: float | None = None):
    """LDL^T of the CuPy ``values`` (B, nnz) (or (nnz,)) on the current device and stream: a
    :class:`GpuFactor` (see :meth:`batchlu.kernels.sparse.Plan.factorize`)."""
    import cupy

    return factorize_with(plan, values, perturb=perturb, pivot_tol=pivot_tol, xp=cupy, launch=CudaLaunch())


# ------------------------------------------------------------------------------------- index arrays
_PLAN_ARRAYS = ("colptr", "rowind", "value_src", "value_dst", "perm", "iperm")
_ON_DEVICE: collections.OrderedDict = collections.OrderedDict()
_CACHED = 4
_LOCK = threading.Lock()


def _where(xp):
    return "host" if xp is np else int(xp.cuda.runtime.getDevice())


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


def factorize_with(plan, values, *, perturb: bool, pivot_tol: float | None, xp, launch):
    """The factorization over the array module ``xp`` with the kernels run by ``launch`` (see the
    module docstring); the checks, pivot rule and codes of the CPU's
    :func:`batchlu.kernels.sparse._factor.factorize`."""
    values, single = check_values(plan, values, xp)
    values = xp.ascontiguousarray(values)
    dtype = values.dtype
    pivot_tol = check_pivot_tol(pivot_tol, dtype)
    arrays = device_arrays(plan, xp)
    count, n = values.shape[0], plan.n
    finite = xp.isfinite(values).all(axis=1)
    anorm = inf_norms(plan, values, xp, launch, arrays)
    tau = xp.ascontiguousarray((float(pivot_tol) * xp.nan_to_num(anorm, nan=0.0, posinf=0.0)).astype(dtype))
    lx = xp.zeros((plan.nnz_l, count), dtype)
    lx[arrays["value_dst"]] = values[:, arrays["value_src"]].T
    flag = xp.zeros((n, count), np.uint8)
    external, panel = name("ldlt_external", dtype), name("ldlt_panel", dtype)
    entries, pivots = name("ldlt_panel_entries", dtype), name("ldlt_pivots", dtype)
    ent_ptr, narrow_ptr, step_ptr, step_ent_ptr = (arrays[k] for k in ("ent_ptr", "narrow_ptr", "step_ptr",
                                                                       "step_ent_ptr"))
    b = np.int64(count)
    dd = xp.empty((n, count), dtype)                # the pivots as used; lx's diagonal holds them at the end
    pivoting = (tau, np.int32(bool(perturb)), lx, dd, flag)

    def over(items, ptr, k):                            # (array, first, count) of range k of ptr
        lo, hi = int(ptr[k]), int(ptr[k + 1])
        return hi - lo, (items, np.int64(lo), np.int64(hi - lo), b)

    for level in range(arrays["sn_ptr"].size - 1):
        if level:                                   # leaves: no supernode below them
            items, args = over(arrays["ent"], ent_ptr, level)
            launch(external, items * count, (*args, arrays["col_of"], arrays["rowind"], arrays["base"],
                                             arrays["sn_first"], arrays["sn_size"], arrays["rl_ptr"], arrays["rl_sn"],
                                             arrays["rl_idx"], dd, lx))
        items, args = over(arrays["narrow"], narrow_ptr, level)
        launch(panel, items * count, (*args, arrays["sn_first"], arrays["sn_size"], arrays["colptr"], *pivoting))
        for step in range(int(step_ptr[level]), int(step_ptr[level + 1])):
            if step > int(step_ptr[level]):               # column 0 has no earlier column in its run
                items, args = over(arrays["step_ent"], step_ent_ptr, step)
                launch(entries, items * count, (*args, arrays["col_of"], arrays["sn_of"], arrays["sn_first"],
                                                arrays["colptr"], dd, lx))
            items, args = over(arrays["step_ent"], step_ent_ptr, step)
            launch(pivots, items * count, (*args, arrays["col_of"], arrays["colptr"], *pivoting))
    lx[arrays["colptr"][:-1]] = dd
    d = lx[arrays["colptr"][:-1]]                                   # (n, B): the pivots as used
    negative = (d < 0).sum(axis=0).astype(np.int64)
    zero = (d == 0).sum(axis=0).astype(np.int64)
    perturbed = flag.sum(axis=0, dtype=np.int64)
    if n and count:
        is_zero = d == 0
        first_zero = xp.where(is_zero.any(axis=0), is_zero.argmax(axis=0), n).astype(np.int64)
    else:
        first_zero = xp.full(count, n, np.int64)
    info = xp.where((first_zero < n) & (not perturb), first_zero + 1, INFO_OK).astype(np.int32)
    info[~finite] = INFO_NONFINITE_INPUT
    inertia = xp.stack([n - negative - zero, negative, zero], axis=1).astype(np.int64)
    inertia[~finite] = -1
    perturbed[~finite] = -1
    return GpuFactor(plan, values, lx, arrays, info, perturbed.astype(np.int32), inertia, anorm,
                     float(pivot_tol), bool(perturb), single, xp, launch)


class GpuFactor(Refining):
    """``P A P^T = L D L^T`` for every matrix of a batch, on the device: the interface and meanings of
    :class:`batchlu.kernels.sparse.Factor` (``info``, :meth:`solve`, :meth:`inertia`, ...), with
    device arrays in and out. ``lx`` (nnz(L), B) holds L and D batch-minor."""

    backend = "gpu"

    def __init__(self, plan, values, lx, arrays, info, perturbed, inertia, anorm, pivot_tol, perturb, single,
                 xp, launch):
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

    # -------------------------------------------------------------------------------------- solve
    def _solve(self, r, rows):
        """``x`` (len(rows), n, k) in the factor's dtype with ``L D L^T (P x) = P r`` for the matrices
        ``rows`` (int64, on the device); ``r`` (len(rows), n, k) holds their right-hand sides."""
        xp, plan, arrays, dtype = self.xp, self.plan, self._arrays, self.dtype
        count, k = rows.size, r.shape[2]
        if count == 0 or k == 0 or plan.n == 0:
            return xp.zeros(r.shape, dtype)
        y = xp.ascontiguousarray(r.transpose(1, 0, 2)[arrays["perm"]].astype(dtype, copy=False))   # (n, R, k)
        fixed = (np.int64(count), np.int64(k), np.int64(self.batch), rows)
        narrow, wide = (arrays["narrow"], arrays["narrow_ptr"]), (arrays["wide"], arrays["wide_ptr"])
        columns = (arrays["wide_cols"], arrays["wide_cols_ptr"])
        shape = (arrays["sn_first"], arrays["sn_size"])
        below = (arrays["rl_ptr"], arrays["rl_sn"], arrays["rl_idx"])
        up = (arrays["colptr"], arrays["rowind"], arrays["base"])

        def step(kernel, over, level, *args):           # one launch: the level's runs or columns x R x K
            items, ptr = over
            lo, hi = int(ptr[level]), int(ptr[level + 1])
            self._launch(name(f"ldlt_{kernel}", dtype), (hi - lo) * count * k,
                         (items, np.int64(lo), np.int64(hi - lo), *fixed, *args))

        nlevels = arrays["sn_ptr"].size - 1
        for level in range(nlevels):
            step("forward_runs", narrow, level, *shape, arrays["colptr"], arrays["base"], *below, self.lx, y)
            if level:                                   # leaves: no supernode below them
                step("forward_external", columns, level, arrays["base"], *shape, *below, self.lx, y)
            step("forward_panel", wide, level, *shape, arrays["colptr"], self.lx, y)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            y /= self.lx[arrays["colptr"][:-1]][:, rows][:, :, None]
        for level in range(nlevels - 1, -1, -1):
            step("backward_runs", narrow, level, *shape, *up, self.lx, y)
            step("backward_external", columns, level, *up, self.lx, y)
            step("backward_panel", wide, level, *shape, arrays["colptr"], self.lx, y)
        return xp.ascontiguousarray(y[arrays["iperm"]].transpose(1, 0, 2))

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
        return self._solve(b, self.xp.arange(self.batch, dtype=np.int64))

    def _correction(self, r, rows):
        return self._solve(r[rows], rows)

    # solve: Refining.solve, the rules and results of batchlu.kernels.sparse.Factor.solve, on the device

def _host(x) -> np.ndarray:
    return x.get() if hasattr(x, "get") and not isinstance(x, np.ndarray) else np.asarray(x)
