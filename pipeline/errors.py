"""The pipeline's errors: batchlu's one hierarchy, :mod:`batchlu.errors`, under the pipeline's name."""

from batchlu.errors import *  # noqa: F401,F403
from batchlu.errors import __all__  # noqa: F401
