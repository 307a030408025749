"""Compiling ``kernels/cuda`` with NVRTC, and the on-disk cache of the binaries.

Why not ``cupy.RawModule(code=...)``, which did this before: CuPy appends ``-ftz=true`` after the
caller's options (``cupy.cuda.compiler._compile_with_cache_cuda``), and NVRTC honours the last
occurrence. In single precision every subnormal was then zero on the GPU: the reciprocal of a pivot
above 2^126 came out 0, and a matrix with such a pivot got wrong factors with info 0. Here the options
are ours (:data:`OPTIONS`, ``-ftz=false``: IEEE subnormals, as the CPU backend and LAPACK have;
``-default-device``: unannotated functions, the sources' generic lambdas among them, are device
functions, as CuPy's compile makes them), and
the binary is loaded with ``cupy.RawModule(path=...)``, which compiles nothing.

A module is compiled once per source text, names, options, architecture and NVRTC version and kept
as ``<key>.cubin`` with its lowered (mangled) kernel names in ``<key>.json`` under
:func:`cache_dir`; a later process, a worker's warm-up or a later run loads it from there. Both files
are written under temporary names and renamed into place, so concurrent processes (pytest-xdist, a
node's workers) never read half a file; the JSON is written last and read first, so a key whose JSON
exists has its binary. Where the folder cannot be written, the module is compiled into a temporary
folder of this process.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from ...errors import KernelCompileError
from .._cuda_sources import CUDA_DIR

OPTIONS = ("-std=c++17", "-ftz=false", "-default-device", f"-I{CUDA_DIR}")
_FORMAT = 1  # bump when the cache files' layout changes


def cache_dir() -> Path:
    """``$BATCHLU_KERNEL_CACHE``, else ``batchlu/`` in CuPy's kernel cache (``$CUPY_CACHE_DIR``, by
    default ``~/.cupy/kernel_cache``)."""
    mine = os.environ.get("BATCHLU_KERNEL_CACHE")
    if mine:
        return Path(mine)
    cupy_dir = os.environ.get("CUPY_CACHE_DIR") or os.path.expanduser("~/.cupy/kernel_cache")
    return Path(cupy_dir) / "batchlu"


def _nvrtc():
    from cupy.cuda import nvrtc

    return nvrtc


def _target(arch: str) -> tuple[str, str]:
    """NVRTC's architecture option and the binary asked of it: a cubin for the device's own
    architecture where NVRTC knows it, else PTX for the newest it knows (the driver compiles it)."""
    nvrtc = _nvrtc()
    supported = getattr(nvrtc, "getSupportedArchs", None)
    archs = tuple(supported()) if supported is not None else ()
    if (not archs or int(arch) in archs) and hasattr(nvrtc, "getCUBIN"):
        return f"--gpu-architecture=sm_{arch}", "cubin"
    below = [a for a in archs if a <= int(arch)] or list(archs)
    return f"--gpu-architecture=compute_{max(below)}", "ptx"


def _compile(code: str, names: tuple[str, ...], arch: str) -> tuple[bytes, str, dict[str, str]]:
    """(binary, its suffix, name expression -> lowered name) for ``code`` with ``names``."""
    nvrtc = _nvrtc()
    option, kind = _target(arch)
    program = nvrtc.createProgram(code, "batchlu.cu", (), ())
    try:
        add = getattr(nvrtc, "addNameExpression", None) or nvrtc.addAddNameExpression
        for name in names:
            add(program, name)
        try:
            nvrtc.compileProgram(program, list(OPTIONS) + [option])
        except nvrtc.NVRTCError as err:
            raise KernelCompileError(f"{err}\n{nvrtc.getProgramLog(program)}") from None
        binary = nvrtc.getCUBIN(program) if kind == "cubin" else nvrtc.getPTX(program).encode()
        lowered = {name: nvrtc.getLoweredName(program, name) for name in names}
    finally:
        nvrtc.destroyProgram(program)
    return bytes(binary), "." + kind, lowered


def _key(code: str, names: tuple[str, ...], arch: str) -> str:
    version = ".".join(str(v) for v in _nvrtc().getVersion())
    digest = hashlib.sha256()
    for part in (str(_FORMAT), arch, version, "\0".join(OPTIONS), "\0".join(names), code):
        digest.update(part.encode() + b"\0\0")
    return digest.hexdigest()[:40]


def _write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _cached(folder: Path, key: str):
    """(binary path, lowered names) of ``key`` in ``folder``, or None."""
    try:
        entry = json.loads((folder / f"{key}.json").read_text())
        binary = folder / entry["binary"]
        return (binary, entry["lowered"]) if binary.is_file() else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _store(folder: Path, key: str, binary: bytes, suffix: str, lowered: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}{suffix}"
    _write(path, binary)
    _write(folder / f"{key}.json", json.dumps({"binary": path.name, "lowered": lowered}).encode())
    return path


def binary(code: str, names: tuple[str, ...], arch: str, *, fresh: bool = False):
    """(path of the compiled module, name expression -> lowered name): from the cache, or compiled
    now and stored there. ``fresh`` compiles again whatever the cache holds (a binary the driver
    refused to load)."""
    key = _key(code, names, arch)
    folder = cache_dir()
    hit = None if fresh else _cached(folder, key)
    if hit is not None:
        return hit
    data, suffix, lowered = _compile(code, names, arch)
    try:
        return _store(folder, key, data, suffix, lowered), lowered
    except OSError:
        private = Path(tempfile.mkdtemp(prefix="batchlu-kernels-"))
        return _store(private, key, data, suffix, lowered), lowered
