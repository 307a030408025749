"""The ops: which arrays each writes (name, shape after N, dtype, fill) and how one batch of each is
computed with :mod:`kernels` (NumPy or CuPy arrays alike); the ``info`` categories a run counts.

The dense ops (``lu``, ``inv``, ``solve``, ``slogdet``) read matrices (N, n, n). The sparse ops
(``ldlt-solve``, ``ldlt-inertia``) read the ``values`` (N, nnz) of a sparse batch (a Zarr group, see
:mod:`batchlu.pipeline.store._sparse`); their compute needs the pattern's symbolic analysis, so the task
runs them as a :class:`BoundOp` (the op, the :class:`batchlu.kernels.sparse.Plan` and the settings),
which every place that takes an op name also takes."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from batchlu.kernels._info import (INFO_MISSING_INPUT, INFO_NONFINITE_INPUT, INFO_NONFINITE_RESULT, INFO_OK,
                                  INFO_REFINEMENT)
from batchlu.kernels._validate import array_module

from .errors import ConfigError

INFO_NOT_COMPUTED = np.iinfo(np.int32).min  # fill of ``info``: a chunk no task has written yet


class InfoCounts(NamedTuple):
    """How many matrices have each kind of ``info``: one category per code (``k > 0`` together)."""

    ok: int = 0                 # 0
    singular: int = 0           # k > 0
    nonfinite: int = 0          # -1: the input holds NaN or Inf
    nonfinite_result: int = 0   # -2: finite input, non-finite result (overflow)
    missing: int = 0            # -3: input chunk missing, filled (batchlu.missing-chunks: fill)
    refinement: int = 0         # -4: sparse solves: refinement short of its tolerance

    def plus(self, other: InfoCounts) -> InfoCounts:
        return InfoCounts(*(x + y for x, y in zip(self, other)))

    def describe(self) -> str:
        """``ok 1,000   singular 0   non-finite input 0   non-finite result 3   missing input 0``
        (and ``refinement short K`` where a sparse solve's refinement fell short)."""
        return "   ".join(f"{INFO_LABELS[name]} {value:,}" for name, value in zip(self._fields, self)
                           if name != "refinement" or value)


@dataclasses.dataclass(kw_only=True)
class InfoTally:
    """The :class:`InfoCounts` of a task or a batch loop as fields that add up (keyword-only, so the
    records that derive from it keep their own positional fields first)."""

    ok: int = 0
    singular: int = 0
    nonfinite: int = 0
    nonfinite_result: int = 0
    missing: int = 0
    refinement: int = 0

    @property
    def counts(self) -> InfoCounts:
        return InfoCounts(*(getattr(self, name) for name in InfoCounts._fields))

    def add_info(self, info) -> None:
        """Count the ``info`` values of one batch."""
        for name, value in zip(InfoCounts._fields, info_counts(info)):
            setattr(self, name, getattr(self, name) + value)


INFO_LABELS = {"ok": "ok", "singular": "singular", "nonfinite": "non-finite input",
               "nonfinite_result": "non-finite result", "missing": "missing input",
               "refinement": "refinement short"}


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    name: str
    tail: tuple[int, ...]  # shape after the leading N
    dtype: np.dtype
    fill: object

    def nbytes(self) -> int:
        return int(np.prod(self.tail, dtype=np.int64)) * self.dtype.itemsize


@dataclasses.dataclass(frozen=True)
class Output:
    """One array an op writes, as the op table declares it: its name; its shape after N, of ``"n"``
    (the matrix order), ``"k"`` (the right-hand sides' columns, absent where they are vectors) and
    numbers; its dtype, ``"input"`` (the input's), ``"real"`` (the input's real type), ``"result"``
    (NumPy's result type of the input and the right-hand sides) or a NumPy dtype name; its fill."""

    name: str
    tail: tuple = ()
    dtype: str = "input"
    fill: object = "nan"

    def spec(self, n: int, dtype: np.dtype, rhs_dtype, k: int | None) -> OutputSpec:
        """The array for matrices of order ``n`` and ``dtype``, right-hand sides of ``rhs_dtype`` with
        ``k`` columns (None: vectors)."""
        tail = tuple(n if d == "n" else k if d == "k" else d for d in self.tail if d != "k" or k is not None)
        if self.dtype == "input":
            out = dtype
        elif self.dtype == "real":
            out = np.empty(0, dtype).real.dtype
        elif self.dtype == "result":
            out = np.result_type(dtype, rhs_dtype)
        else:
            out = np.dtype(self.dtype)
        return OutputSpec(self.name, tail, out, float("nan") if self.fill == "nan" else self.fill)

    def describe(self) -> str:
        """``lu (N,n,n)``, ``x (N,n) or (N,n,k)``, ``piv (N,n) int32``: as the command line's help and
        the README give it (the input's dtype unsaid)."""
        def shape(tail):
            return "(" + ",".join(("N",) + tuple(str(d) for d in tail)) + ("," if not tail else "") + ")"

        text = f"{self.name} {shape(tuple(d for d in self.tail if d != 'k'))}"
        if "k" in self.tail:
            text += f" or {shape(self.tail)}"
        return text + ("" if self.dtype in ("input", "result") else f" {self.dtype}")


INFO_OUTPUT = Output("info", (), "int32", int(INFO_NOT_COMPUTED))


# The test ratios ``batchlu verify`` judges each op's results by (name -> one float per matrix), from
# :mod:`batchlu.testing.ratios`; ``out`` holds the op's outputs, ``b`` the right-hand sides of solve.
def _lu_ratios(a, out, b):
    from batchlu.testing import ratios

    return {"dget01": ratios.get01(a, out["lu"], out["piv"])}


def _inv_ratios(a, out, b):
    from batchlu.testing import ratios

    return {"dget03": ratios.get03(a, out["inv"])}


def _solve_ratios(a, out, b):
    from batchlu.testing import ratios

    return {"dget02": ratios.get02(a, out["x"], b)}


def _slogdet_ratios(a, out, b):
    from batchlu.testing import ratios

    r = ratios.slogdet_ratios(a, out["sign"], out["logabsdet"])
    return {"logabsdet": r.logabsdet, "sign": r.sign, "sign-modulus": r.modulus}


def _sparse_ratios(a, out, b):
    raise TypeError("Expected the dense ops' ratios. Got a sparse op, whose backward error needs its "
                    "pattern: batchlu.pipeline.verify._sparse_rules computes it.")


@dataclasses.dataclass(frozen=True)
class Op:
    """One op: the :mod:`batchlu.kernels` function that computes a batch, the arrays it writes
    (:class:`Output`, before ``info``, in that function's return order; the first is its main
    result), whether it takes right-hand sides, and the test ratios ``batchlu verify`` judges its
    results by, with the name its summary gives them (its other rules:
    :mod:`batchlu.pipeline.verify._rules`)."""

    name: str
    kernel: str
    writes: tuple[Output, ...]
    needs_rhs: bool
    _ratios: object = dataclasses.field(repr=False, compare=False)
    sparse: bool = False   # reads a sparse batch's values (N, nnz); computed as a BoundOp
    ratio_name: str = ""   # what verify's summary calls the ratios (empty: the op has none)

    @property
    def results(self) -> tuple[str, ...]:
        """The names of the arrays the op's kernel returns before ``info``."""
        return tuple(out.name for out in self.writes)

    def outputs(self, n: int, dtype, rhs_dtype=None, k: int | None = None) -> list[OutputSpec]:
        """The arrays the op writes, ``info`` last, in the order they are created and written."""
        dtype = np.dtype(dtype)
        return [out.spec(n, dtype, rhs_dtype, k) for out in self.writes + (INFO_OUTPUT,)]

    def describe_outputs(self) -> str:
        """The arrays the op writes, ``info`` last, in one line: what ``batchlu run --help`` and the
        README's table of outputs say (``inv (N,n,n), info (N,) int32``)."""
        return ", ".join(out.describe() for out in self.writes + (INFO_OUTPUT,))

    def compute(self, a, b=None) -> dict:
        """One batch through :mod:`batchlu.kernels`; arrays stay on the device they came in on."""
        if self.sparse:
            raise TypeError(f"Expected op {self.name} bound to its pattern's analysis (Op.bind). "
                            f"Got the bare op instead.")
        from batchlu import kernels

        values = getattr(kernels, self.kernel)(*((a, b) if self.needs_rhs else (a,)))
        return dict(zip(self.results + ("info",), values))

    def ratios(self, a, out: dict, b=None) -> dict:
        """The op's test ratios of the outputs ``out`` for inputs ``a`` (and ``b``): name -> per matrix."""
        return self._ratios(a, out, b)

    def bind(self, symbolic, settings) -> BoundOp:
        """The sparse op ready to compute: ``symbolic`` a :class:`batchlu.kernels.sparse.Plan`,
        ``settings`` the run's :class:`batchlu.pipeline.Options` (its ``sparse_*`` fields)."""
        return BoundOp(self, symbolic, settings)


@dataclasses.dataclass(frozen=True)
class BoundOp:
    """A sparse op with its pattern's symbolic analysis and settings: what a task computes with."""

    op: Op
    symbolic: object
    settings: object

    @property
    def name(self) -> str:
        return self.op.name

    def compute(self, a, b=None) -> dict:
        """One batch: NumPy ``a`` (values) on the CPU backend, CuPy on the GPU's; results stay there."""
        s = self.settings
        factor = self.symbolic.factorize(a, perturb=s.sparse_perturb, pivot_tol=s.sparse_pivot_tol)
        if self.op.kernel == "ldlt_solve":
            x, info = factor.solve(b, refine=s.sparse_refine)
            # a non-finite right-hand side makes the whole matrix's outputs those of -1
            xp = array_module(info)
            perturbed = xp.where(info == INFO_NONFINITE_INPUT, -1, factor.perturbed_pivots()).astype(np.int32)
            return {"x": x, "berr": factor.last_backward_error, "perturbed": perturbed, "info": info}
        return {"inertia": factor.inertia(), "perturbed": factor.perturbed_pivots(), "info": factor.info}


# The one table of ops: the CLI's choices and help, the outputs, the compute and verify all read it.
_PERTURBED = Output("perturbed", (), "int32", -1)
OP_TABLE = {op.name: op for op in (
    Op("lu", "lu_factor", (Output("lu", ("n", "n")), Output("piv", ("n",), "int32", -1)), needs_rhs=False,
       _ratios=_lu_ratios, ratio_name="dget01"),
    Op("inv", "inv", (Output("inv", ("n", "n")),), needs_rhs=False, _ratios=_inv_ratios, ratio_name="dget03"),
    Op("solve", "solve", (Output("x", ("n", "k"), "result"),), needs_rhs=True, _ratios=_solve_ratios,
       ratio_name="dget02"),
    Op("slogdet", "slogdet", (Output("sign"), Output("logabsdet", (), "real")), needs_rhs=False,
       _ratios=_slogdet_ratios, ratio_name="slogdet (logabsdet, sign; n eps units)"),
    Op("ldlt-solve", "ldlt_solve", (Output("x", ("n", "k")), Output("berr", (), "float64"), _PERTURBED),
       needs_rhs=True, _ratios=_sparse_ratios, sparse=True, ratio_name="backward error (n eps units)"),
    Op("ldlt-inertia", "ldlt_inertia", (Output("inertia", (3,), "int64", -1), _PERTURBED), needs_rhs=False,
       _ratios=_sparse_ratios, sparse=True),
)}
OPS = tuple(OP_TABLE)
DENSE_OPS = tuple(name for name, op in OP_TABLE.items() if not op.sparse)
SPARSE_OPS = tuple(name for name, op in OP_TABLE.items() if op.sparse)


def get_op(op) -> Op:
    """The :class:`Op` named ``op`` (an :class:`Op` or :class:`BoundOp` is returned as it is)."""
    if isinstance(op, (Op, BoundOp)):
        return op
    if op not in OP_TABLE:
        raise ConfigError(f"Expected op to be one of {', '.join(OPS)}. Got {op!r} instead.")
    return OP_TABLE[op]


def check_op(op: str) -> str:
    return get_op(op).name


def output_specs(op: str, n: int, dtype, rhs_dtype=None, k: int | None = None) -> list[OutputSpec]:
    """The arrays ``op`` writes, in the order they are created and written."""
    return get_op(op).outputs(n, dtype, rhs_dtype, k)


def info_counts(info) -> InfoCounts:
    """The :class:`InfoCounts` of an ``info`` array."""
    info = np.asarray(info)
    return InfoCounts(int(np.count_nonzero(info == INFO_OK)), int(np.count_nonzero(info > 0)),
                      int(np.count_nonzero(info == INFO_NONFINITE_INPUT)),
                      int(np.count_nonzero(info == INFO_NONFINITE_RESULT)),
                      int(np.count_nonzero(info == INFO_MISSING_INPUT)),
                      int(np.count_nonzero(info == INFO_REFINEMENT)))


def mark_missing(outputs: dict, rows) -> None:
    """Give the matrices ``rows`` (a mask or indices along N) of one batch's ``outputs`` (name ->
    host array, written in place) the outputs of a missing input: ``info`` -3, NaN results,
    ``piv`` the identity and -1 in the sparse ops' counts, as for a non-finite input."""
    for name, value in outputs.items():
        if name == "info":
            value[rows] = INFO_MISSING_INPUT
        elif name == "piv":
            value[rows] = np.arange(value.shape[-1], dtype=value.dtype)
        elif value.dtype.kind in "iu":
            value[rows] = -1
        else:
            value[rows] = np.nan


def compute(op: str, a, b=None) -> dict:
    """One batch of ``op`` through :mod:`batchlu.kernels`; arrays stay on the device they came in on."""
    return get_op(op).compute(a, b)
