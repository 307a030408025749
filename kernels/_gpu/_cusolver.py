"""GPU path above the one-kernel range: cuSOLVER's getrf and getrs, one matrix at a time.

:mod:`._paths` sends an op here where batchlu's own kernels do not fit the device (on an H100: getrf
above n = 1155 in float64, getri and getrs above n = 1024; ``docs/design.md#large-n-cusolver``). The entry points
keep the backend contract of ``kernels/_api.py`` and the kernels' conventions:

* **Layout.** batchlu's matrices are C-order, cuSOLVER's column-major. Each matrix is copied into a
  column-major work buffer (one transposing elementwise copy, O(n^2) against getrf's O(n^3)) and
  factored there; ``lu_factor`` copies the factors back in C order and stores cuSOLVER's 1-based
  interchanges 0-based, as :func:`scipy.linalg.lu_factor`. ``lu_solve`` copies ``lu`` the same way.
* **Inverse** by getrs against the identity, in place in the output: with P A = L U of the
  column-major A, solving A^T X = I (``CUBLAS_OP_T``, no conjugate) leaves X = A^-T in column-major
  order, which read in C order is A^-1.
* **info.** cuSOLVER's devInfo of each matrix goes straight into ``info`` (k > 0 at the first exactly
  zero pivot, LAPACK's); then, on the caller's stream, a matrix holding NaN or Inf gets -1 with NaN
  results and identity pivots, and ``inv`` / ``solve`` write NaN where info != 0, as the kernels do.
  ``slogdet`` is reduced from the pivots and the diagonal of U (sign 0 and -inf for info > 0, NaN for
  info -1), in float64 / complex128 and rounded once to the input's precision.
* **Singular matrices.** cuSOLVER does not complete the factorization of an exactly singular matrix
  as LAPACK does (it divides by the zero pivot): ``lu_factor`` refactors those on the host
  (:func:`_complete_singular`). The other ops need only their ``info``.
* **Streams.** Everything is ordered on CuPy's current stream (the caller's); nothing synchronises
  the host but ``lu_factor``'s look at ``info``. A batch of several matrices goes round-robin over up
  to :data:`MAX_LANES` lanes: the caller's stream with CuPy's cuSOLVER handle, plus side streams with
  handles of their own (kept per thread and device). The side streams wait for the caller's work so
  far, and the caller waits for theirs before anything else runs on it (also when a call fails
  half-way), so a single matrix's launches, too short to fill the GPU at these n, overlap with the
  next matrix's. Each lane has its own work buffers, allocated on the caller's stream; lanes are
  limited to one per matrix and to :data:`LANE_BYTES` of work buffers in all.
"""

from __future__ import annotations

import threading

import numpy as np

from .._info import INFO_NONFINITE_INPUT

MAX_LANES = 4  # streams a batch is spread over
LANE_BYTES = 512 << 20  # work buffers of all lanes together, at most (one lane always)
_PREFIX = {np.dtype(np.float32): "s", np.dtype(np.float64): "d",
           np.dtype(np.complex64): "c", np.dtype(np.complex128): "z"}
_OP_N, _OP_T = 0, 1  # cublasOperation_t: CUBLAS_OP_N, CUBLAS_OP_T
_local = threading.local()

__all__ = ["LANE_BYTES", "MAX_LANES", "getrf", "getrs", "inv", "lanes_for", "slogdet", "solve"]


def _lib():
    from cupy_backends.cuda.libs import cusolver

    return cusolver


def _routine(dtype, name: str):
    """cuSOLVER's ``<t>name`` for ``dtype`` (``getrf_bufferSize``, ``getrf``, ``getrs``)."""
    return getattr(_lib(), _PREFIX[np.dtype(dtype)] + name)


def lanes_for(batch: int, lane_bytes: int) -> int:
    """Lanes (streams) for a batch of ``batch`` matrices whose work buffers take ``lane_bytes`` per
    lane: one per matrix, at most MAX_LANES, their buffers within LANE_BYTES (at least one lane)."""
    return max(1, min(batch, MAX_LANES, LANE_BYTES // max(1, lane_bytes)))


class _SideLane:
    """A non-blocking stream with a cuSOLVER handle of its own, for one thread on one device."""

    def __init__(self):
        import cupy

        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.handle = _lib().create()

    def __del__(self):
        try:
            _lib().destroy(self.handle)
        except Exception:  # at interpreter exit the CUDA context may be gone already
            pass


def _lanes(count: int) -> list[tuple[object, int]]:
    """``count`` (stream, cuSOLVER handle) pairs: the caller's first, then this thread's side lanes."""
    import cupy

    lanes = [(cupy.cuda.get_current_stream(), cupy.cuda.device.get_cusolver_handle())]
    if count > 1:
        per_device = getattr(_local, "side", None)
        if per_device is None:
            per_device = _local.side = {}
        side = per_device.setdefault(cupy.cuda.runtime.getDevice(), [])
        while len(side) < count - 1:
            side.append(_SideLane())
        lanes += [(lane.stream, lane.handle) for lane in side[:count - 1]]
    return lanes


class _Work:
    """One lane's buffers: the column-major matrix, the interchanges, getrs' info, (``k`` > 0) a
    column-major right-hand side and (:func:`_prepare`) getrf's workspace ``ws``."""

    def __init__(self, dtype, n: int, k: int):
        import cupy

        self.a = cupy.empty((n, n), dtype, order="F")
        self.diag = self.a.T.reshape(-1)[:: n + 1]  # a view of a's diagonal
        self.ipiv = cupy.empty((n,), np.int32)
        self.info = cupy.empty((1,), np.int32)
        self.b = cupy.empty((n, k), dtype, order="F") if k else None
        self.ws = None


def _prepare(batch: int, dtype, n: int, k: int = 0):
    """The lanes for this batch and one :class:`_Work` per lane (allocated on the caller's stream)."""
    import cupy

    item = np.dtype(dtype).itemsize
    lanes = _lanes(lanes_for(batch, (n * n + n * k) * item))
    works = [_Work(dtype, n, k) for _ in lanes]
    lwork = _routine(dtype, "getrf_bufferSize")(lanes[0][1], n, n, works[0].a.data.ptr, n)
    for work in works:
        work.ws = cupy.empty((max(1, lwork),), dtype)
    return lanes, works


def _round_robin(batch: int, lanes, works, body) -> None:
    """``body(i, handle, work)`` for each matrix i, on lane i % len(lanes) with that lane's stream
    current and its handle set on it; fork from and join back to the caller's stream."""
    lib = _lib()
    caller = lanes[0][0]
    if len(lanes) > 1:
        ready = caller.record()
        for stream, _handle in lanes[1:]:
            stream.wait_event(ready)
    try:
        for i in range(batch):
            j = i % len(lanes)
            stream, handle = lanes[j]
            with stream:
                lib.setStream(handle, stream.ptr)
                body(i, handle, works[j])
    finally:
        for stream, _handle in lanes[1:]:
            caller.wait_event(stream.record())


def _factor(dtype, n: int, handle, work: _Work, a, bad, ipiv_ptr: int, info_ptr: int) -> None:
    """Copy ``a`` (one C-order matrix) into the lane's column-major buffer and factor it there. A
    matrix holding NaN or Inf (``bad``, a device bool) is not handed to cuSOLVER, whose pivot search
    would meet NaN: the identity takes its place (its results are overwritten with NaN afterwards)."""
    import cupy

    work.a[...] = a
    cupy.copyto(work.a, 0, where=bad)
    cupy.copyto(work.diag, 1, where=bad)
    _routine(dtype, "getrf")(handle, n, n, work.a.data.ptr, n, work.ws.data.ptr, ipiv_ptr, info_ptr)


def _bad(a):
    """Per matrix: holds NaN or Inf (on the caller's stream, before the fork)."""
    import cupy

    return ~cupy.isfinite(a).all(axis=(1, 2))


def _where(mask, shape):
    """``mask`` (B,) broadcast, without a copy, over arrays of ``shape`` (B, ...)."""
    import cupy

    return cupy.broadcast_to(mask.reshape((-1,) + (1,) * (len(shape) - 1)), shape)


def _nan(dtype):
    """The kernels' NaN of ``dtype`` (complex: NaN in both parts)."""
    return complex(np.nan, np.nan) if np.dtype(dtype).kind == "c" else np.nan


def _nonfinite_input(bad, info, *results) -> None:
    """info -1 and NaN results for the matrices ``bad`` holds (in place)."""
    import cupy

    cupy.copyto(info, INFO_NONFINITE_INPUT, where=bad)
    for x in results:
        cupy.copyto(x, _nan(x.dtype), where=_where(bad, x.shape))


# ---- backend entry points (contract in kernels/_api.py) -----------------------------------------

def getrf(a):
    """``lu``, ``piv`` (0-based int32), ``info`` of a (B, n, n) C-contiguous array."""
    import cupy

    batch, n, dtype = a.shape[0], a.shape[-1], a.dtype
    lu = cupy.empty_like(a)
    piv = cupy.empty((batch, n), np.int32)
    info = cupy.empty((batch,), np.int32)
    bad = _bad(a)
    lanes, works = _prepare(batch, dtype, n)

    def body(i, handle, work):
        _factor(dtype, n, handle, work, a[i], bad[i], piv[i].data.ptr, info[i:i + 1].data.ptr)
        lu[i][...] = work.a

    _round_robin(batch, lanes, works, body)
    piv -= 1
    _nonfinite_input(bad, info, lu)
    cupy.copyto(piv, cupy.arange(n, dtype=np.int32), where=_where(bad, piv.shape))
    _complete_singular(a, lu, piv, info)
    return lu, piv, info


def _complete_singular(a, lu, piv, info) -> None:
    """LAPACK's completed factorization for the exactly singular matrices (info > 0).

    At an exactly zero pivot LAPACK leaves the column below it unscaled (it is all zero) and goes on;
    cuSOLVER's getrf divides by the zero (NaN below the pivot, then in everything after it; CuPy's
    ``lu_factor`` documents the same). Those few matrices are factored again on the host by the CPU
    backend (SciPy's LAPACK; ``lu``, ``piv`` and ``info`` all from that one factorization). Finding
    them reads ``info`` on the host: ``lu_factor`` on this path synchronises the caller's stream once.
    """
    from .. import _cpu

    host_info = info.get()
    for i in np.flatnonzero(host_info > 0):
        lu_h, piv_h, info_h = _cpu.getrf(np.ascontiguousarray(a[i].get())[None])
        lu[i].set(lu_h[0])
        piv[i].set(piv_h[0].astype(np.int32, copy=False))
        info[i:i + 1].set(info_h.astype(np.int32, copy=False))


def inv(a):
    """``ainv``, ``info`` of a (B, n, n) C-contiguous array: getrf, then getrs against the identity."""
    import cupy

    batch, n, dtype = a.shape[0], a.shape[-1], a.dtype
    out = cupy.empty_like(a)
    info = cupy.empty((batch,), np.int32)
    bad = _bad(a)
    lanes, works = _prepare(batch, dtype, n)
    getrs_ = _routine(dtype, "getrs")

    def body(i, handle, work):
        _factor(dtype, n, handle, work, a[i], bad[i], work.ipiv.data.ptr, info[i:i + 1].data.ptr)
        x = out[i]
        x.fill(0)
        x.reshape(-1)[:: n + 1] = 1
        # A^T X = I in column-major order: X = A^-T there, A^-1 in C order (the module docstring)
        getrs_(handle, _OP_T, n, n, work.a.data.ptr, n, work.ipiv.data.ptr, x.data.ptr, n, work.info.data.ptr)

    _round_robin(batch, lanes, works, body)
    _nonfinite_input(bad, info)
    cupy.copyto(out, _nan(dtype), where=_where(info != 0, out.shape))
    return out, info


def solve(a, b):
    """``x``, ``info`` for a (B, n, n) and b (B, n, k), both C-contiguous of one dtype."""
    import cupy

    batch, n, k, dtype = a.shape[0], a.shape[-1], b.shape[-1], a.dtype
    x = cupy.empty(b.shape, dtype)
    info = cupy.empty((batch,), np.int32)
    bad = _bad(a)
    lanes, works = _prepare(batch, dtype, n, k)
    getrs_ = _routine(dtype, "getrs")

    def body(i, handle, work):
        _factor(dtype, n, handle, work, a[i], bad[i], work.ipiv.data.ptr, info[i:i + 1].data.ptr)
        work.b[...] = b[i]
        getrs_(handle, _OP_N, n, k, work.a.data.ptr, n, work.ipiv.data.ptr, work.b.data.ptr, n,
               work.info.data.ptr)
        x[i][...] = work.b

    _round_robin(batch, lanes, works, body)
    _nonfinite_input(bad, info)
    cupy.copyto(x, _nan(dtype), where=_where(info != 0, x.shape))
    return x, info


def getrs(lu, piv, b):
    """``x`` (B, n, k) from ``lu_factor``'s C-order ``lu``, 0-based ``piv`` and ``b`` (B, n, k). As
    the kernels, an interchange outside [k, n) at step k is skipped (getrf never writes one), and a
    zero pivot gives inf/NaN in that matrix's x."""
    import cupy

    batch, n, k, dtype = lu.shape[0], lu.shape[-1], b.shape[-1], lu.dtype
    b = b.astype(dtype, copy=False)
    x = cupy.empty(b.shape, dtype)
    steps = cupy.arange(n, dtype=np.int32)
    ipiv = (cupy.where((piv > steps) & (piv < n), piv, steps) + 1).astype(np.int32, copy=False)
    lanes, works = _prepare(batch, dtype, n, k)
    getrs_ = _routine(dtype, "getrs")

    def body(i, handle, work):
        work.a[...] = lu[i]
        work.b[...] = b[i]
        getrs_(handle, _OP_N, n, k, work.a.data.ptr, n, ipiv[i].data.ptr, work.b.data.ptr, n,
               work.info.data.ptr)
        x[i][...] = work.b

    _round_robin(batch, lanes, works, body)
    return x


def slogdet(a):
    """``sign`` (input dtype), ``logabsdet`` (real), ``info`` of a (B, n, n) C-contiguous array."""
    import cupy

    batch, n, dtype = a.shape[0], a.shape[-1], a.dtype
    diag = cupy.empty((batch, n), dtype)
    piv = cupy.empty((batch, n), np.int32)
    info = cupy.empty((batch,), np.int32)
    bad = _bad(a)
    lanes, works = _prepare(batch, dtype, n)

    def body(i, handle, work):
        _factor(dtype, n, handle, work, a[i], bad[i], piv[i].data.ptr, info[i:i + 1].data.ptr)
        diag[i][...] = work.a.diagonal()

    _round_robin(batch, lanes, works, body)
    real = np.empty(0, dtype).real.dtype
    if dtype.kind == "c":
        d = diag.astype(np.complex128)
        mag = cupy.abs(d)
        prod = (d / mag).prod(axis=1)  # unit phases; an overflowed u_ii gives NaN, as the kernel
        prod = prod / cupy.abs(prod)
    else:
        d = diag.astype(np.float64)
        mag = cupy.abs(d)
        prod = cupy.where(d < 0, -1.0, 1.0).prod(axis=1)
    swaps = cupy.count_nonzero(piv != cupy.arange(1, n + 1, dtype=np.int32), axis=1)
    sign = cupy.where(swaps % 2 == 1, -prod, prod).astype(dtype)
    logabsdet = cupy.log(mag).sum(axis=1).astype(real)
    singular = info > 0
    cupy.copyto(sign, 0, where=singular)
    cupy.copyto(logabsdet, -np.inf, where=singular)
    _nonfinite_input(bad, info, sign, logabsdet)
    return sign, logabsdet, info
