"""Find, open and check the Zarr arrays the pipeline reads: ``PATH`` or ``PATH:ARRAY``, v2 or v3.

Everything here runs in the client before any task is submitted, so that a malformed input fails
fast with a clear :mod:`batchlu.pipeline.errors` error and nothing is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import pathlib
import tempfile

import numpy as np
import zarr

from batchlu.kernels._validate import SUPPORTED_DTYPES  # the one dtype table

from .errors import CorruptInputError, InputError, InputNotFoundError, OutputError

_DTYPE_NAMES = ", ".join(str(d) for d in SUPPORTED_DTYPES)
_METADATA_FILES = ("zarr.json", ".zarray", ".zgroup")


@dataclasses.dataclass(frozen=True)
class ArrayRef:
    """Where one array lives: an absolute store path and the array's path inside it ("" = root)."""

    path: str
    array: str = ""

    def __str__(self) -> str:
        return f"{self.path}:{self.array}" if self.array else self.path

    def open(self, mode: str = "r") -> zarr.Array:
        return zarr.open_array(store=self.path, path=self.array, mode=mode)

    def as_dict(self) -> dict:
        return {"path": self.path, "array": self.array}


@dataclasses.dataclass(frozen=True)
class ArrayInfo:
    """An input array, checked: its reference, shape, dtype and storage layout."""

    ref: ArrayRef
    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[int, ...]
    read_unit: int  # matrices per stored object along N (the shard if sharded, else the chunk)
    zarr_format: int

    @property
    def count(self) -> int:
        return self.shape[0]

    def as_dict(self) -> dict:
        return {**self.ref.as_dict(), "shape": list(self.shape), "dtype": str(self.dtype),
                "chunks": list(self.chunks), "zarr_format": self.zarr_format}


def native_dtype(dtype) -> np.dtype:
    """``dtype`` in this machine's byte order: what every read of an input gives. A Zarr v2 array of
    ``>f8`` says so in its dtype (v3 keeps the byte order in its ``bytes`` codec and reads native)."""
    dtype = np.dtype(dtype)
    return dtype if dtype.isnative else dtype.newbyteorder("=")


def parse_ref(spec: str | os.PathLike, array: str | None = None) -> ArrayRef:
    """Split ``PATH:ARRAY`` (or take ``array`` separately) into an absolute :class:`ArrayRef`.

    A spec whose whole text names an existing path is a path, even if it holds a colon.
    """
    text = os.fspath(spec)
    if not text:
        raise InputError("Expected an input path, PATH or PATH:ARRAY. Got an empty string instead.")
    name = array
    if name is None and not os.path.exists(text) and ":" in text:
        head, tail = text.rsplit(":", 1)
        if head and tail and not tail.startswith(("/", "\\")):
            text, name = head, tail
    path = str(pathlib.Path(text).expanduser().resolve())
    return ArrayRef(path, (name or "").strip("/"))


def _is_store(path: str) -> bool:
    return any(os.path.exists(os.path.join(path, f)) for f in _METADATA_FILES)


def _list_arrays(group: zarr.Group) -> list[str]:
    """The group's arrays, nested ones by their path (``sub/m``)."""
    return sorted(name for name, node in group.members(max_depth=None) if isinstance(node, zarr.Array))


def open_array_info(ref: ArrayRef, what: str = "input") -> ArrayInfo:
    """Open ``ref`` read-only and describe it; errors say what was expected and what was found."""
    if not os.path.exists(ref.path):
        raise InputNotFoundError(f"Expected the {what} at {ref.path} to exist. Got no such path instead.")
    if not os.path.isdir(ref.path):
        raise InputError(f"Expected the {what} {ref.path} to be a Zarr store (a directory). "
                         f"Got a regular file instead.")
    if not _is_store(ref.path):
        raise InputError(f"Expected the {what} {ref.path} to be a Zarr store (with zarr.json, "
                         f".zarray or .zgroup). Got a directory without Zarr metadata instead.")
    try:
        node = zarr.open(store=ref.path, path=ref.array or None, mode="r")
    except (FileNotFoundError, KeyError) as exc:
        raise InputNotFoundError(f"Expected an array {ref.array!r} in the {what} store {ref.path}. "
                                 f"Got nothing at that path instead ({exc}).") from None
    except Exception as exc:  # malformed metadata
        raise InputError(f"Expected readable Zarr metadata in the {what} {ref}. "
                         f"Got {type(exc).__name__}: {exc} instead.") from None
    if isinstance(node, zarr.Group):
        arrays = _list_arrays(node)
        hint = (f" Name one of its arrays as PATH:ARRAY, e.g. {ref.path}:{arrays[0]}." if arrays
                else " It holds no arrays.")
        raise InputError(f"Expected the {what} {ref} to be an array. Got a group instead.{hint}")
    stored = node.shards or node.chunks
    return ArrayInfo(ref=ref, shape=tuple(node.shape), dtype=native_dtype(node.dtype),
                     chunks=tuple(node.chunks), read_unit=int(stored[0]) if stored else 1,
                     zarr_format=int(node.metadata.zarr_format))


def check_matrices(info: ArrayInfo) -> int:
    """Check a stack of square matrices (N, n, n) of a supported dtype; return n."""
    if len(info.shape) != 3:
        raise InputError(f"Expected the input {info.ref} to have shape (N, n, n), ndim 3. "
                         f"Got shape {info.shape} (ndim {len(info.shape)}) instead.")
    if info.shape[1] != info.shape[2]:
        raise InputError(f"Expected the input {info.ref} to hold square matrices, shape (N, n, n). "
                         f"Got shape {info.shape} instead.")
    if info.dtype not in SUPPORTED_DTYPES:
        raise InputError(f"Expected the input {info.ref} to have one of the dtypes {_DTYPE_NAMES}. "
                         f"Got {info.dtype} instead.")
    return info.shape[1]


def check_rhs(rhs: ArrayInfo, matrices: ArrayInfo) -> int | None:
    """Check B against A (N, n, n): B is (N, n) or (N, n, k). Return k, or None for vectors."""
    count, n = matrices.shape[0], matrices.shape[1]
    if len(rhs.shape) not in (2, 3):
        raise InputError(f"Expected the right-hand side {rhs.ref} to have shape (N, n) or (N, n, k) "
                         f"= ({count}, {n}) or ({count}, {n}, k). Got shape {rhs.shape} instead.")
    if rhs.shape[0] != count:
        raise InputError(f"Expected the right-hand side {rhs.ref} to hold N = {count} entries, one "
                         f"per matrix of the input. Got N = {rhs.shape[0]} (shape {rhs.shape}) instead.")
    if rhs.shape[1] != n:
        raise InputError(f"Expected the right-hand side {rhs.ref} to have n = {n} rows, as the "
                         f"input's matrices. Got n = {rhs.shape[1]} (shape {rhs.shape}) instead.")
    if rhs.dtype not in SUPPORTED_DTYPES:
        raise InputError(f"Expected the right-hand side {rhs.ref} to have one of the dtypes "
                         f"{_DTYPE_NAMES}. Got {rhs.dtype} instead.")
    return rhs.shape[2] if len(rhs.shape) == 3 else None


def check_output_path(output: str | os.PathLike, inputs: list[ArrayRef]) -> str:
    """Resolve the output path and check it can be written and does not overlap an input."""
    path = pathlib.Path(os.fspath(output)).expanduser().resolve()
    for ref in inputs:
        src = pathlib.Path(ref.path)
        if path == src or src in path.parents or path in src.parents:
            raise OutputError(f"Expected the output {path} to be apart from the input {ref}. "
                              f"Got the same or a nested path instead.")
    if path.exists() and not path.is_dir():
        raise OutputError(f"Expected the output {path} to be a Zarr store (a directory) or not to "
                          f"exist. Got a regular file instead.")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise OutputError(f"Expected the output's parent {parent} to be a directory. "
                          f"Got a regular file instead.")
    target = path if path.exists() else parent
    try:  # os.access says yes to root everywhere: try a real write (read-only mounts, /proc, ...)
        os.rmdir(tempfile.mkdtemp(prefix=".batchlu-probe-", dir=target))
    except OSError as err:
        raise OutputError(f"Expected the output location {target} to be writable. "
                          f"Got {err.strerror or err} instead.") from None
    return str(path)


FULL_DEVICE = (errno.ENOSPC, errno.EDQUOT)   # "No space left on device", "Disk quota exceeded"


@contextlib.contextmanager
def naming_full_device(path, then: str):
    """Inside the block, an :class:`OSError` that says the device is full (a write cut short, which
    names no file) becomes an :class:`OutputError` naming ``path``, the store being written, and what
    to do ``then`` once there is room."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in FULL_DEVICE:
            raise
        where = pathlib.Path(os.fspath(path)).expanduser().resolve()
        raise OutputError(f"Expected room on the device to write {where}. Got \"{exc.strerror or exc}\" "
                          f"instead: free some space, then {then}.") from exc


def is_zarr_store(path: str) -> bool:
    return os.path.isdir(path) and _is_store(path)


def stored_key(array: zarr.Array, index: int) -> str:
    """The store key of the object (chunk, or shard when sharded) number ``index`` along N."""
    coords = (index,) + (0,) * (array.ndim - 1)
    try:
        return array._async_array.metadata.encode_chunk_key(coords)
    except Exception:  # a metadata class without the helper: name the coordinates instead
        return f"chunk {coords}"


def read_range(ref: ArrayRef, array: zarr.Array, start: int, stop: int) -> np.ndarray:
    """``array[start:stop]`` in native byte order, or a :class:`CorruptInputError` naming the chunk
    file that fails."""
    try:
        return np.asarray(array[start:stop]).astype(native_dtype(array.dtype), copy=False)
    except Exception as exc:
        raise unreadable(array, np.arange(start, stop), os.path.join(ref.path, ref.array), exc,
                         CorruptInputError) from None


def unreadable(array: zarr.Array, rows: np.ndarray, folder: str, exc: Exception, error=CorruptInputError):
    """``error`` naming the first chunk file of ``array`` (stored in ``folder``) holding one of
    ``rows`` that cannot be read or decoded; ``exc`` (the read's failure) where each reads alone."""
    unit = (array.shards or array.chunks)[0]
    for index in np.unique(np.asarray(rows) // unit):
        lo, hi = int(index) * unit, min((int(index) + 1) * unit, array.shape[0])
        try:
            array[lo:hi]
        except Exception as inner:
            return error(f"Expected readable chunks in {folder}. Got an unreadable chunk file "
                         f"{os.path.join(folder, stored_key(array, int(index)))} (matrices {lo}:{hi}) "
                         f"instead: {type(inner).__name__}: {inner}")
    return error(f"Expected matrices {int(np.min(rows))}:{int(np.max(rows)) + 1} of {folder} to be "
                 f"readable. Got {type(exc).__name__}: {exc} instead.")


# Who wrote a store, from the attributes at its root: a run's output group, or a generated array
# (the second name marks one still being written, or killed while it was).
WRITERS = {"batchlu": "run", "batchlu_generate": "generate", "batchlu_generate_incomplete": "generate"}


def written_by(path: str) -> str | None:
    """``"run"`` or ``"generate"`` for a store batchlu wrote at ``path``; None for anything else."""
    if not is_zarr_store(path):
        return None
    try:
        attrs = dict(zarr.open(store=path, mode="r").attrs)
    except Exception:
        return None
    for key, writer in WRITERS.items():
        if isinstance(attrs.get(key), dict):
            return writer
    return None


def check_replaceable(path: str, *, writer: str, force: bool) -> None:
    """Before ``overwrite`` deletes ``path``: refuse a Zarr store that ``batchlu <writer>`` did not
    write, unless ``force`` (a user's own array is never deleted without a word)."""
    if force or not os.path.exists(path) or not is_zarr_store(path):
        return  # nothing there, an empty folder, or no Zarr store (that one is refused later)
    found = written_by(path)
    if found == writer:
        return
    got = f"the output of batchlu {found}" if found else "a Zarr store that batchlu did not write"
    raise OutputError(f"Expected {path} to be written by batchlu {writer} before overwrite replaces it. "
                      f"Got {got} instead; pass force=True (--force) with overwrite to delete it anyway.")
