"""What every GPU kernel family's host code shares: C++ names, device limits, argument checks and the
compilation of ``kernels/cuda``.

* :func:`scalar` and :func:`template` spell a dtype and a kernel instantiation as the CUDA sources
  do (every kernel lives in namespace ``blu``): ``template("getrf_small", "float32", 8)`` is
  ``"blu::getrf_small<float, 8>"``;
* :func:`smem_optin` and :func:`smem_per_sm` are device attributes, queried once per device;
* :func:`kernel` returns a compiled kernel of a family: ``kernels/cuda/<family>.cu`` is compiled by
  NVRTC at first use, once per compute capability, with our own options (``-ftz=false``: CuPy's
  ``RawModule(code=...)`` appends ``-ftz=true``, which flushed single-precision subnormals) and kept
  in an on-disk cache that a later process or run loads instead of compiling again
  (:mod:`._nvrtc`); a failed compilation raises :class:`KernelCompileError` with NVRTC's log. The
  text compiled ends with a digest of the headers
  (:func:`batchlu.kernels._cuda_sources.compiled_text`), so that an edited header compiles afresh;
* :func:`source_override` compiles a family from another text for the duration of a ``with`` block
  (A/B timings of an edit, see ``batchlu.kernels.tuning``).
"""

from __future__ import annotations

import contextlib
import functools
import logging

import numpy as np

from ...errors import ConfigError, InputError, KernelCompileError
from .._cuda_sources import CUDA_DIR, compiled_text, families, read as _read
from . import _nvrtc

logger = logging.getLogger("batchlu.kernels")
OPTIONS = _nvrtc.OPTIONS
MAX_N = 1024  # getri (one thread per column) and getrs (the right-hand sides in shared memory)

# The C++ scalar type of each dtype (common.cuh): bit for bit the NumPy/CuPy layouts.
SCALAR = {
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
    np.dtype(np.complex64): "blu::c64",
    np.dtype(np.complex128): "blu::c128",
}


def scalar(dtype) -> str:
    """The C++ spelling of ``dtype`` in the CUDA sources."""
    return SCALAR[np.dtype(dtype)]


def template(name: str, dtype, *args) -> str:
    """The name expression ``blu::name<T, args...>`` of a kernel templated first on the scalar type T
    of ``dtype``; bools are spelled true / false."""
    spelled = [scalar(dtype)] + ["true" if x is True else "false" if x is False else str(x) for x in args]
    return f"blu::{name}<{', '.join(spelled)}>"


# ---- device attributes --------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _attribute(device: int, name: str, number: int) -> int:
    import cupy

    return int(cupy.cuda.runtime.deviceGetAttribute(getattr(cupy.cuda.runtime, name, number), device))


def smem_optin() -> int:
    """Largest dynamic shared memory one block may opt in to on the current device."""
    import cupy

    return _attribute(cupy.cuda.runtime.getDevice(), "cudaDevAttrMaxSharedMemoryPerBlockOptin", 97)


def smem_per_sm() -> int:
    """Shared memory of one multiprocessor of the current device."""
    import cupy

    return _attribute(cupy.cuda.runtime.getDevice(), "cudaDevAttrMaxSharedMemoryPerMultiprocessor", 81)


@functools.lru_cache(maxsize=None)
def _arch(device: int) -> str:
    import cupy

    return str(cupy.cuda.Device(device).compute_capability)


# ---- argument checks ----------------------------------------------------------------------------

def check(name: str, arr, shape, dtype) -> None:
    """``arr`` must be a C-contiguous array of ``shape`` and ``dtype`` (preallocated outputs too)."""
    if arr.shape != tuple(shape) or arr.dtype != np.dtype(dtype) or not arr.flags.c_contiguous:
        raise InputError(f"Expected {name} to be a C-contiguous {np.dtype(dtype)} array of shape "
                         f"{tuple(shape)}. Got {arr.dtype} {arr.shape} "
                         f"(C-contiguous: {arr.flags.c_contiguous}) instead.")


def check_n(n: int) -> None:
    if n > MAX_N:
        raise InputError(f"Expected n <= {MAX_N} for the GPU inverse and solve kernels. "
                         f"Got n = {n} instead.")


# ---- sources and compilation --------------------------------------------------------------------

_OVERRIDES: dict[str, str] = {}


def source(family: str) -> str:
    """The text compiled for ``family``: ``kernels/cuda/<family>.cu`` unless overridden."""
    text = _OVERRIDES.get(family)
    return _read(family) if text is None else text


@contextlib.contextmanager
def source_override(family: str, text: str):
    """Compile ``family`` from ``text`` (which may include the headers of ``kernels/cuda``) inside the
    block; the kernel names stay those of the family. Modules are cached per source text, so switching
    back and forth compiles each text once. Not for concurrent use from several threads."""
    if not (CUDA_DIR / f"{family}.cu").exists():
        raise ConfigError(f"Expected a kernel family among {families()}. Got {family!r} instead.")
    previous = _OVERRIDES.get(family)
    _OVERRIDES[family] = text
    try:
        yield
    finally:
        if previous is None:
            _OVERRIDES.pop(family, None)
        else:
            _OVERRIDES[family] = previous


@functools.lru_cache(maxsize=None)
def _module(arch: str, family: str, code: str, names: tuple[str, ...]):
    """(the loaded module of ``family`` compiled from ``code`` with ``names``, name -> lowered name)."""
    import cupy

    text = compiled_text(code)
    try:
        path, lowered = _nvrtc.binary(text, names, arch)
        module = cupy.RawModule(path=str(path))
        try:
            module.compile()
        except cupy.cuda.driver.CUDADriverError:      # a binary the driver refuses: compile it again
            path, lowered = _nvrtc.binary(text, names, arch, fresh=True)
            module = cupy.RawModule(path=str(path))
            module.compile()
    except KernelCompileError as err:   # NVRTC's error and log (_nvrtc), named here
        what = "kernels/cuda" if code is _read(family) else "an override of kernels/cuda"
        raise KernelCompileError(f"Compiling {what}/{family}.cu for {names} failed:\n{err}") from None
    return module, lowered


@functools.lru_cache(maxsize=None)
def _function(arch: str, family: str, code: str, name: str, names: tuple[str, ...]):
    module, lowered = _module(arch, family, code, names)
    return module.get_function(lowered[name])


def kernel(family: str, name: str, names=None, smem: int = 0):
    """The compiled kernel ``name`` of ``family``, allowed ``smem`` bytes of dynamic shared memory.

    ``names`` lists every instantiation compiled together with it (one NVRTC run for the set; by
    default ``name`` alone). Compiled at first use and cached per compute capability.
    """
    import cupy

    names = tuple(names) if names else (name,)
    func = _function(_arch(cupy.cuda.runtime.getDevice()), family, source(family), name, names)
    # The default limit is 48 KB less the kernel's static shared memory, so a block with both kinds
    # can need the opt-in with well under 48 KB dynamic.
    if func.max_dynamic_shared_size_bytes < smem:
        func.max_dynamic_shared_size_bytes = smem
    return func


def compile_kernels(family: str, names) -> None:
    """Compile (or load from the disk cache) the instantiations ``names`` of ``family`` together."""
    names = tuple(names)
    kernel(family, names[0], names)


def compiled_kernel(family: str, name: str):
    """The compiled CuPy function of the kernel ``name`` of ``family``, compiled alone (as a launch with
    no other instantiations compiles it): for its attributes (``num_regs``, ``ptr`` for occupancy)."""
    return kernel(family, name)


def kernel_global(family: str, name: str, symbol: str):
    """A CuPy memory pointer to the ``__device__`` variable ``symbol`` of the module that holds the
    kernel ``name`` of ``family`` compiled alone, from the source compiled now (an override included):
    for instrumented sources (``benchmarks/bench_rows_latency.py``)."""
    import cupy

    return _module(_arch(cupy.cuda.runtime.getDevice()), family, source(family), (name,))[0].get_global(symbol)
