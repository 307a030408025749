"""The four ops: which arrays each writes (name, shape after N, dtype, fill) and how one batch of
each is computed with :mod:`kernels` (NumPy or CuPy arrays alike)."""

from __future__ import annotations

import dataclasses

import numpy as np

from .errors import ConfigError

OPS = ("lu", "inv", "solve", "slogdet")
INFO_NOT_COMPUTED = np.iinfo(np.int32).min  # fill of ``info``: a chunk no task has written yet


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    name: str
    tail: tuple[int, ...]  # shape after the leading N
    dtype: np.dtype
    fill: object

    def nbytes(self) -> int:
        return int(np.prod(self.tail, dtype=np.int64)) * self.dtype.itemsize


def check_op(op: str) -> str:
    if op not in OPS:
        raise ConfigError(f"Expected op to be one of {', '.join(OPS)}. Got {op!r} instead.")
    return op


def output_specs(op: str, n: int, dtype, rhs_dtype=None, k: int | None = None) -> list[OutputSpec]:
    """The arrays ``op`` writes, in the order they are created and written."""
    dtype = np.dtype(dtype)
    real = np.empty(0, dtype).real.dtype
    nan = float("nan")
    info = OutputSpec("info", (), np.dtype(np.int32), int(INFO_NOT_COMPUTED))
    check_op(op)
    if op == "lu":
        return [OutputSpec("lu", (n, n), dtype, nan), OutputSpec("piv", (n,), np.dtype(np.int32), -1),
                info]
    if op == "inv":
        return [OutputSpec("inv", (n, n), dtype, nan), info]
    if op == "solve":
        xdtype = np.result_type(dtype, rhs_dtype)
        return [OutputSpec("x", (n,) if k is None else (n, k), xdtype, nan), info]
    return [OutputSpec("sign", (), dtype, nan), OutputSpec("logabsdet", (), real, nan), info]


def info_counts(info) -> tuple[int, int, int]:
    """(ok, singular, non-finite) counts of an ``info`` array: 0, > 0 and < 0."""
    info = np.asarray(info)
    return (int(np.count_nonzero(info == 0)), int(np.count_nonzero(info > 0)),
            int(np.count_nonzero(info < 0)))


def compute(op: str, a, b=None) -> dict:
    """One batch of ``op`` through :mod:`kernels`; arrays stay on the device they came in on."""
    from batchlu import kernels

    if op == "lu":
        lu, piv, info = kernels.lu_factor(a)
        return {"lu": lu, "piv": piv, "info": info}
    if op == "inv":
        ainv, info = kernels.inv(a)
        return {"inv": ainv, "info": info}
    if op == "solve":
        x, info = kernels.solve(a, b)
        return {"x": x, "info": info}
    if op == "slogdet":
        sign, logabsdet, info = kernels.slogdet(a)
        return {"sign": sign, "logabsdet": logabsdet, "info": info}
    raise ConfigError(f"Expected op to be one of {', '.join(OPS)}. Got {op!r} instead.")
