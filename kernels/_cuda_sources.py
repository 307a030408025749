"""The CUDA sources of ``kernels/cuda`` as text, without CuPy: one ``.cu`` file per kernel family,
and the ``.cuh`` headers they include.

The GPU runtime keeps each compiled module in an on-disk cache (``kernels/_gpu/_nvrtc.py``), under
a key made of the text compiled, the names, the options and the compiler, not of the files that
text includes: a header edited under an unchanged ``.cu`` would load the module compiled from the
old header. :func:`compiled_text` therefore ends the text with a digest of every header
(:func:`headers_tag`), so that any change to a header compiles afresh, and an unchanged tree loads
from the cache in every later process and run.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

CUDA_DIR = Path(__file__).resolve().parent / "cuda"

__all__ = ["CUDA_DIR", "compiled_text", "families", "headers_tag", "read"]


def families() -> tuple[str, ...]:
    """The kernel families: the ``.cu`` files of ``kernels/cuda``."""
    return tuple(sorted(p.stem for p in CUDA_DIR.glob("*.cu")))


@functools.lru_cache(maxsize=None)
def read(family: str) -> str:
    """The text of ``kernels/cuda/<family>.cu`` (read once per process)."""
    return (CUDA_DIR / f"{family}.cu").read_text()


@functools.lru_cache(maxsize=None)
def headers_tag(folder: Path = CUDA_DIR) -> str:
    """A C++ comment naming the SHA-256 of the ``.cuh`` files of ``folder`` (names and contents)."""
    digest = hashlib.sha256()
    for path in sorted(Path(folder).glob("*.cuh")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return f"// batchlu kernels/cuda headers sha256 {digest.hexdigest()}\n"


def compiled_text(code: str, folder: Path = CUDA_DIR) -> str:
    """``code`` as handed to NVRTC: followed by :func:`headers_tag`, so that the cache key changes
    whenever a header does."""
    return (code if code.endswith("\n") else code + "\n") + headers_tag(folder)

