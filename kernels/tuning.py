"""The tuning surface of batchlu's GPU kernels (dispatch tables, the plans they give, launchers that
take an explicit plan, and control over compilation) and of the CPU backend (its crossovers). For
benchmarks and sweeps (``benchmarks/``); everyday code uses :mod:`batchlu.kernels`, which dispatches
by these tables itself.

The tables and plans need no GPU; the launchers and the device queries need CuPy (imported when
they run). Why each dispatch row is what it is: ``docs/design.md``. Arrays are CuPy arrays,
C-contiguous, (B, n, n) with one flat batch axis; the launchers write into preallocated outputs on
CuPy's current stream and never synchronise.

Dispatch tables (first matching row wins):

* getrf: :data:`GETRF_DISPATCH` ((largest n, kind, tile) rows per dtype), :data:`BLOCKED_NB`,
  :data:`SMALL_NP`;
* inverse: :data:`TINY_MAX_N` (``inv_tiny``, one thread per matrix), :data:`FUSED_MAX_N` and
  :data:`GJE_TILES` (the fused ``inv_gje``), :data:`GETRI_MODE`,
  :data:`GETRI_PLANS` and :data:`GETRI_NBS` (getrf + ``getri``);
* solve: :data:`GESV_ROWS` and :data:`GESV_ROWS_MAX_RHS` (the fused ``gesv_rows``), else getrf +
  ``getrs``; getrs (and lu_solve): :data:`GETRS_BLOCK` (where ``getrs_kernel`` runs instead of
  ``getrs_warp``), :data:`GETRS_WARP_KC_MAX`;
* every op: :func:`path` (the kernels above, or ``"cusolver"`` where they do not fit the device:
  :func:`fitting_plan`, :func:`getri_fits`, :func:`getrs_fits`), :func:`first_cusolver_n`.

Plans: :func:`getrf_plan` / :func:`rows_plan` / :class:`Plan`; :func:`inv_plan`, :func:`gje_tile`,
:func:`getri_plan`; :func:`solve_plan`, :func:`gesv_rows_tile`, :func:`getrs_plan`.

Launchers: :func:`launch_getrf` (``plan``), :func:`launch_inv_tiny`, :func:`launch_inv_gje` (``tile``),
:func:`launch_getri` (``mode``, ``minb``, ``mma``, ``nb``), :func:`launch_gesv_rows` (``tile``), :func:`launch_getrs`
(``kind``, ``stages``, ``kc``),
:func:`launch_slogdet`; each takes the dispatched plan when none is given. The cuSOLVER path at any n
(the backend's contract, allocating its outputs): :func:`cusolver_getrf`, :func:`cusolver_getrs`,
:func:`cusolver_inv`, :func:`cusolver_solve`, :func:`cusolver_slogdet`.

Compilation: every kernel family is one ``kernels/cuda/<family>.cu`` (:data:`FAMILIES`), compiled at
first use by NVRTC. :func:`getrf_kernel_name`, :func:`gje_name`, :func:`gesv_rows_name` and
:func:`getri_kernels` give the instantiations a launch compiles; :func:`compile_kernels` compiles a
set ahead of use (e.g. in parallel processes before timing: CuPy's disk cache keeps the binaries);
:func:`source_override` compiles a family from another text inside a ``with`` block, for A/B timings
of an edit (:func:`kernel_source` gives the text compiled now); :func:`compiled_kernel` gives a compiled
kernel (its registers, its occupancy) and :func:`kernel_global` a ``__device__`` variable of its module
(counters of an instrumented text). Shared-memory sizes:
:func:`blocked_smem`, :func:`blocked_ldp`, :func:`gesv_rows_smem`, :func:`smem_optin`, :func:`smem_per_sm`.

CPU backend (NumPy arrays; no CuPy): LAPACK from a crossover n on, the engine's own LU below it.
:data:`COMPILED_LAPACK_MIN_N` (per op, per dtype float32/float64/complex64/complex128) and
:data:`NUMPY_LAPACK_MIN_N` are the two engines' tables, :func:`cpu_lapack_min_n` the one in force
for an (op, dtype); :func:`cpu_crossover` moves every op's crossover of both engines to one n inside
a ``with`` block (``1``: LAPACK at every n; a huge n: the own LU at every n), for A/B timings.
The compiled engine's ``getrf`` and ``slogdet`` run on its lane LU (W matrices at once) for the n in
:data:`COMPILED_LANES_N` (:func:`cpu_lanes_range`: the range in force); :func:`cpu_lanes_from`
moves it inside a ``with`` block; inside :func:`cpu_crossover` alone the lane LU does not run.
"""

from contextlib import contextmanager

from batchlu.errors import ConfigError

from ._gpu._gesv import (GESV_ROWS, GESV_ROWS_MAX_RHS, gesv_rows_name, gesv_rows_smem, gesv_rows_tile,
                         launch_gesv_rows)
from ._gpu._getrf import (
    BLOCKED_NB,
    GETRF_DISPATCH,
    SMALL_NP,
    Plan,
    blocked_ldp,
    blocked_smem,
    fitting_plan,
    getrf_plan,
    launch_getrf,
    rows_min_blocks,
    rows_plan,
)
from ._gpu._getrf import kernel_name as getrf_kernel_name
from ._gpu._getri import (
    FUSED_MAX_N,
    GETRI_MODE,
    GETRI_NBS,
    GETRI_PLANS,
    GJE_TILES,
    TINY_LIMIT,
    TINY_MAX_N,
    getri_fits,
    getri_kernels,
    getri_plan,
    getri_smem,
    gje_name,
    gje_tile,
    inv_plan,
    launch_getri,
    launch_inv_gje,
    launch_inv_tiny,
    tiny_name,
)
from ._gpu._getrf import tiny_mpb, tiny_smem
from ._gpu._getrs import (GETRS_BLOCK, GETRS_WARP_KC_MAX, default_nb, getrs_fits, getrs_plan, getrs_smem,
                          launch_getrs, solve_plan)
from ._gpu._paths import CUSOLVER, first_cusolver_n, path
from ._gpu._cusolver import getrf as cusolver_getrf
from ._gpu._cusolver import getrs as cusolver_getrs
from ._gpu._cusolver import inv as cusolver_inv
from ._gpu._cusolver import slogdet as cusolver_slogdet
from ._gpu._cusolver import solve as cusolver_solve
from ._gpu._runtime import (KernelCompileError, compile_kernels, compiled_kernel, families, kernel_global, smem_optin,
                            smem_per_sm)
from ._gpu._runtime import source as kernel_source
from ._gpu._runtime import source_override
from ._gpu._slogdet import launch_slogdet
from . import _cpu
from ._cpu import COMPILED_LANES_N, COMPILED_LAPACK_MIN_N, NUMPY_LAPACK_MIN_N
from ._cpu import lanes_range as cpu_lanes_range
from ._cpu import lapack_min_n as cpu_lapack_min_n


FAMILIES = families()


@contextmanager
def _cpu_threshold(name: str, n: int):
    """Inside the block, ``_cpu.<name>`` is ``n`` (checked: an int >= 1); its value again after it."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"Expected a crossover n >= 1. Got {n!r} instead.")
    before = getattr(_cpu, name)
    setattr(_cpu, name, n)
    try:
        yield
    finally:
        setattr(_cpu, name, before)


def cpu_crossover(n: int):
    """Inside the block, the CPU backend calls LAPACK for every op from ``n`` on, its own LU below
    (both engines); the tables are in force again after it. Process-wide: not for concurrent use."""
    return _cpu_threshold("LAPACK_MIN_N", n)


def cpu_lanes_from(n: int):
    """Inside the block, the compiled CPU engine runs ``getrf`` and ``slogdet`` on its lane LU
    (``batchlu.kernels._cpu_lanes``) for every n from ``n`` on, and below it as its tables say
    without the lane LU (``1``: the lane LU at every n; a huge n: never). Process-wide: not for
    concurrent use."""
    return _cpu_threshold("LANES_MIN_N", n)


__all__ = [
    "BLOCKED_NB",
    "COMPILED_LANES_N",
    "COMPILED_LAPACK_MIN_N",
    "CUSOLVER",
    "FAMILIES",
    "FUSED_MAX_N",
    "GESV_ROWS",
    "GESV_ROWS_MAX_RHS",
    "GETRF_DISPATCH",
    "GETRS_BLOCK",
    "GETRS_WARP_KC_MAX",
    "GETRI_MODE",
    "GETRI_NBS",
    "GETRI_PLANS",
    "GJE_TILES",
    "NUMPY_LAPACK_MIN_N",
    "SMALL_NP",
    "TINY_LIMIT",
    "TINY_MAX_N",
    "KernelCompileError",
    "Plan",
    "blocked_ldp",
    "blocked_smem",
    "compile_kernels",
    "compiled_kernel",
    "cpu_crossover",
    "cpu_lanes_from",
    "cpu_lanes_range",
    "cpu_lapack_min_n",
    "cusolver_getrf",
    "cusolver_getrs",
    "cusolver_inv",
    "cusolver_slogdet",
    "cusolver_solve",
    "default_nb",
    "first_cusolver_n",
    "fitting_plan",
    "gesv_rows_name",
    "gesv_rows_smem",
    "gesv_rows_tile",
    "getrf_kernel_name",
    "getrf_plan",
    "getri_fits",
    "getri_kernels",
    "getri_plan",
    "getri_smem",
    "getrs_fits",
    "getrs_plan",
    "getrs_smem",
    "gje_name",
    "gje_tile",
    "inv_plan",
    "kernel_global",
    "kernel_source",
    "launch_gesv_rows",
    "launch_getrf",
    "launch_getri",
    "launch_getrs",
    "launch_inv_gje",
    "launch_inv_tiny",
    "launch_slogdet",
    "path",
    "rows_min_blocks",
    "rows_plan",
    "smem_optin",
    "tiny_mpb",
    "tiny_name",
    "tiny_smem",
    "smem_per_sm",
    "solve_plan",
    "source_override",
]
