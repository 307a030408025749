"""Lazy compilation of the CUDA sources in ``kernels/cuda`` through ``cupy.RawModule`` (NVRTC).

A kernel family is one ``.cu`` file; Python only names the template instantiations it needs. Modules
are compiled at first use and cached per device; CuPy also keeps the binaries in its on-disk cache.
"""

from __future__ import annotations

import functools
from pathlib import Path

import cupy

CUDA_DIR = Path(__file__).resolve().parent.parent / "cuda"


class KernelCompileError(RuntimeError):
    """A CUDA source failed to compile; the message carries NVRTC's log."""


@functools.lru_cache(maxsize=None)
def _source(family: str) -> str:
    return (CUDA_DIR / f"{family}.cu").read_text()


@functools.lru_cache(maxsize=None)
def _module(device: int, family: str, names: tuple[str, ...], options: tuple[str, ...]):
    module = cupy.RawModule(code=_source(family), name_expressions=names,
                            options=("-std=c++17", f"-I{CUDA_DIR}") + options)
    try:
        module.compile()
    except cupy.cuda.compiler.CompileException as err:
        log = err.get_message() if hasattr(err, "get_message") else str(err)
        raise KernelCompileError(f"Compiling kernels/cuda/{family}.cu for {names} failed:\n{log}") from err
    return module


def get_function(family: str, name: str, *, names: tuple[str, ...] | None = None,
                 options: tuple[str, ...] = ()):
    """Return the compiled kernel ``name`` of ``family``.

    ``names`` lists every instantiation to compile together with it (one NVRTC run for the set);
    by default only ``name`` itself.
    """
    names = tuple(names) if names else (name,)
    device = cupy.cuda.runtime.getDevice()
    return _module(device, family, names, tuple(options)).get_function(name)
