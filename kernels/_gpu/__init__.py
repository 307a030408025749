"""CuPy backend: batchlu's own CUDA kernels. Imported only when a CuPy array reaches ``kernels``.

One module per kernel family, each the host code of one ``kernels/cuda/<family>.cu``: ``_getrf``,
``_getri`` (inverse), ``_getrs`` (solve), ``_gesv`` (fused solve) and ``_slogdet``; what they share
(C++ names, device limits, compilation) is in ``_runtime``. Each function below takes arrays already
normalised by ``batchlu.kernels._api`` (C-contiguous, (B, n, n), a supported dtype, B >= 1, n >= 1)
and launches on CuPy's current stream. The tuning surface is ``batchlu.kernels.tuning``.
"""

from ._getrf import getrf
from ._getri import inv
from ._getrs import getrs, solve
from ._slogdet import slogdet

__all__ = ["getrf", "getrs", "inv", "slogdet", "solve"]
