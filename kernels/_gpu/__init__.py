"""CuPy backend: batchlu's own CUDA kernels. Imported only when a CuPy array reaches ``kernels``.

Each function takes arrays already normalised by ``batchlu.kernels._api`` (C-contiguous, (B, n, n), a
supported dtype, B >= 1, n >= 1) and launches on CuPy's current stream.
"""

from ._getrf import getrf
from ._getri import getrs, inv, slogdet, solve

__all__ = ["getrf", "getrs", "inv", "slogdet", "solve"]
