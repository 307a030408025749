"""Run ``kernels/cuda/ldlt.cu`` on the host, so that the GPU factorization's code is tested where there
is no GPU: the same CUDA text, compiled by the host's C++ compiler with a few macros for the CUDA
keywords, each launch run thread by thread.

:class:`HostLaunch` takes the place of :class:`batchlu.kernels.sparse._gpu.CudaLaunch`
(``launch(name expression, threads, args)``) and checks each argument as CUDA would read it: every
array C-contiguous, and each argument's kind (pointer, ``long long``, ``int``, ...) that of the
kernel's parameter at that place (a NumPy ``int32`` where the kernel takes ``long long`` fails here,
where CuPy would pass four bytes and the kernel read eight). ``order`` runs the threads of every
launch first to last (0) or last to first (1): the kernels' threads must not depend on one another,
so both orders must give the same bits.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from batchlu.kernels import _cuda_sources
from batchlu.kernels.sparse import _gpu

SHIM = r"""
#include <string>
#include <type_traits>
#include <utility>

struct blu_dim3 { unsigned int x = 0, y = 0, z = 0; };
static blu_dim3 threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __syncthreads() ((void)0)
#define __shared__ static

#include "ldlt.cu"

template <typename A> constexpr char kind() {
    using U = std::remove_cv_t<A>;
    if constexpr (std::is_pointer_v<U>) return 'p';
    else if constexpr (std::is_same_v<U, long long>) return 'q';
    else if constexpr (std::is_same_v<U, int>) return 'i';
    else if constexpr (std::is_same_v<U, double>) return 'd';
    else if constexpr (std::is_same_v<U, float>) return 'f';
    else return '?';
}

template <typename... A, std::size_t... I>
static void call(void (*k)(A...), void** params, std::index_sequence<I...>) {
    k(*static_cast<std::remove_cv_t<A>*>(params[I])...);
}

template <typename... A>
static int run(void (*k)(A...), unsigned long long grid, unsigned int block, int order, int nargs,
               const char* kinds, void** params) {
    const char want[] = {kind<A>()..., 0};
    if (nargs != (int)sizeof...(A)) return -1;
    for (int i = 0; i < nargs; ++i)
        if (kinds[i] != want[i]) return i + 1;
    blockDim.x = block;
    gridDim.x = (unsigned int)grid;
    const unsigned long long total = grid * block;
    for (unsigned long long s = 0; s < total; ++s) {
        const unsigned long long t = order ? total - 1 - s : s;
        blockIdx.x = (unsigned int)(t / block);
        threadIdx.x = (unsigned int)(t % block);
        call(k, params, std::index_sequence_for<A...>{});
    }
    return 0;
}

extern "C" int blu_launch(const char* name, unsigned long long grid, unsigned int block, int order,
                          int nargs, const char* kinds, void** params) {
    const std::string n(name);
@TABLE@
    return -2;
}
"""


def compiler() -> str | None:
    return shutil.which("g++") or shutil.which("clang++")


def build(folder: Path | None = None, *, flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    """Compile ``ldlt.cu`` with :data:`SHIM` into a shared library (every kernel of both dtypes),
    with the compiler's extra ``flags`` (``-fsanitize=address``: see the test that uses it)."""
    table = "\n".join(f'    if (n == "{e}") return run(&{e}, grid, block, order, nargs, kinds, params);'
                      for dtype in _gpu.SCALAR for e in _gpu.names(dtype))
    text = SHIM.replace("@TABLE@", table)
    source = _cuda_sources.read(_gpu.FAMILY) + (_cuda_sources.CUDA_DIR / "ldlt.cuh").read_text()
    tag = hashlib.sha256((text + source + " ".join(flags)).encode()).hexdigest()[:16]
    folder = Path(folder or tempfile.mkdtemp(prefix="batchlu-ldlt-host-"))
    library = folder / f"ldlt-host-{tag}.so"
    if not library.exists():
        shim = folder / f"ldlt-host-{tag}.cpp"
        shim.write_text(text)
        done = subprocess.run([compiler(), "-std=c++17", "-O1", *flags, "-shared", "-fPIC", "-Wall", "-Werror",
                               f"-I{_cuda_sources.CUDA_DIR}", str(shim), "-o", str(library)],
                              capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"Compiling ldlt.cu for the host failed:\n{done.stderr}")
    lib = ctypes.CDLL(str(library))
    lib.blu_launch.restype = ctypes.c_int
    lib.blu_launch.argtypes = [ctypes.c_char_p, ctypes.c_ulonglong, ctypes.c_uint, ctypes.c_int, ctypes.c_int,
                               ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    return lib


_SCALARS = {np.int64: ("q", ctypes.c_longlong), np.int32: ("i", ctypes.c_int),
            np.float64: ("d", ctypes.c_double), np.float32: ("f", ctypes.c_float)}


class HostLaunch:
    """``launch(name, threads, args)`` on the host (see the module docstring); counts its launches."""

    def __init__(self, lib: ctypes.CDLL, order: int = 0):
        self.lib, self.order, self.launches = lib, order, 0

    def __call__(self, expression: str, threads: int, args: tuple) -> None:
        if threads > 0:
            self._run(expression, -(-threads // _gpu.THREADS), _gpu.THREADS, args)

    def blocks(self, expression: str, grid: int, block: int, args: tuple) -> None:
        """A kernel whose blocks synchronise (``ldlt_wide_panels``, ``ldlt_*_wide``,
        ``ldlt_backward_error``): ``grid`` blocks of one thread each, which runs every phase of its
        block in order, so that the barriers hold (``block``, the GPU's block size, is not used here)."""
        if grid > 0:
            self._run(expression, grid, 1, args)

    def _run(self, expression: str, grid: int, block: int, args: tuple) -> None:
        kinds, held = [], []
        for i, arg in enumerate(args):
            if isinstance(arg, np.ndarray):
                if not arg.flags.c_contiguous:
                    raise AssertionError(f"{expression}: argument {i} is not C-contiguous")
                kinds.append("p")
                held.append(ctypes.c_void_p(arg.ctypes.data))
            elif type(arg) in _SCALARS:
                code, ctype = _SCALARS[type(arg)]
                kinds.append(code)
                held.append(ctype(arg.item()))
            else:
                raise AssertionError(f"{expression}: argument {i} is a {type(arg).__name__}; pass NumPy "
                                     f"scalars of the kernel's parameter type")
        params = (ctypes.c_void_p * len(held))(*[ctypes.cast(ctypes.pointer(h), ctypes.c_void_p) for h in held])
        rc = self.lib.blu_launch(expression.encode(), grid, block, self.order, len(held),
                                 "".join(kinds).encode(), params)
        if rc == -2:
            raise AssertionError(f"{expression}: no such kernel in ldlt.cu")
        if rc == -1:
            raise AssertionError(f"{expression}: {len(held)} arguments, not the kernel's count")
        if rc:
            raise AssertionError(f"{expression}: argument {rc - 1} is of kind {kinds[rc - 1]!r}, not the "
                                 f"kernel's parameter's")
        self.launches += 1
