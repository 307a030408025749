"""The public API and the cuSOLVER path as implementations for ``benchmarks/bench_kernels.py`` (ops
``lu``, ``inv``, ``solve``), by name only (``--extra api,cusolver``; the default peer sets are
unchanged):

* ``api``: ``batchlu.kernels.lu_factor`` / ``inv`` / ``solve`` themselves, on the path they dispatch
  to at each n (the own kernels, or cuSOLVER above their range), the API's checks included;
* ``cusolver``: the cuSOLVER path forced at any n (``tuning.cusolver_*``: cuSOLVER's getrf / getrs one
  matrix at a time over up to four streams), to find where it overtakes the kernels for a batch size.

Same inputs and :class:`Case` interface as ``_lu_impls`` and ``_inv_impls`` (solve: 16 right-hand
sides); flop counts are theirs.
"""

from __future__ import annotations

from _harness import inv_ratio, lu_ratio, solve_ratio
from _inv_impls import SOLVE_RHS, _rhs
from _lu_impls import Case, _sources

IMPLS: dict = {}
FLOPS: dict = {}


def _case(op: str, dtype, n: int, batch: int, forced: bool) -> Case:
    import cupy

    from batchlu import kernels
    from batchlu.kernels import tuning

    src = _sources(dtype, n, batch)
    a = cupy.empty_like(src[0])
    b = _rhs(dtype, n, batch, (n, SOLVE_RHS)) if op == "solve" else None
    if forced:
        call = {"lu": tuning.cusolver_getrf, "inv": tuning.cusolver_inv,
                "solve": lambda x: tuning.cusolver_solve(x, b)}[op]
    else:
        call = {"lu": kernels.lu_factor, "inv": kernels.inv, "solve": lambda x: kernels.solve(x, b)}[op]

    state = {}

    def prepare(k):
        a[...] = src[k % len(src)]

    def run():
        state["out"] = call(a)

    def check(k):
        out, ref = state["out"], src[k % len(src)]
        if op == "lu":
            return lu_ratio(ref, out[0], out[1])
        return inv_ratio(ref, out[0]) if op == "inv" else solve_ratio(ref, out[0], b)

    return Case(prepare, run, check=check)


def variant(op: str, name: str):
    """Factories for ``api`` and ``cusolver`` (ops lu, inv, solve); None for other names."""
    if op not in ("lu", "inv", "solve") or name not in ("api", "cusolver"):
        return None
    return lambda dtype, n, batch: _case(op, dtype, n, batch, name == "cusolver")
