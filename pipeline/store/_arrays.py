"""Find, open and check the Zarr arrays the pipeline reads: ``PATH`` or ``PATH:ARRAY``, v2 or v3.

The checks run in the client before any task is submitted, so that a malformed input fails fast
with a clear :mod:`batchlu.pipeline.errors` error and nothing is written; :func:`read_range` and
:func:`unreadable` name the chunk file that fails when a read does.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

import numpy as np
import zarr

from batchlu.kernels._validate import SUPPORTED_DTYPES  # the one dtype table

from ..errors import CorruptInputError, InputError, InputNotFoundError
from ._files import METADATA_FILES, has_metadata, zarr_location
from ._object_store import head, is_url, join, parse, probe, store_error, zarr_store
from ._zarr import chunk_key

_DTYPE_NAMES = ", ".join(str(d) for d in SUPPORTED_DTYPES)


@dataclasses.dataclass(frozen=True)
class ArrayRef:
    """Where one array lives: an absolute store path (or an ``s3://`` URL) and the array's path inside
    it ("" = root)."""

    path: str
    array: str = ""

    def __str__(self) -> str:
        return f"{self.path}:{self.array}" if self.array else self.path

    def open(self, mode: str = "r") -> zarr.Array:
        return zarr.open_array(store=zarr_store(self.path, read_only=mode == "r"), path=self.array, mode=mode)

    def location(self) -> str:
        """Where the array's own objects are: ``PATH/ARRAY`` (or the URL's), for messages."""
        return join(self.path, self.array) if self.array else self.path

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

    A spec whose whole text names an existing path is a path, even if it holds a colon. In place of a
    path: a ``zarr.Array``, a ``zarr.Group`` or ``zarr.storage.LocalStore`` (with ``array``, or as
    ``(group or store, name)``), see :func:`batchlu.pipeline.store._files.zarr_location`.
    """
    location = zarr_location(spec, "input", InputError)
    if location is not None:
        root, inner = location
        inside = "/".join(part.strip("/") for part in (inner, array or "") if part.strip("/"))
        return ArrayRef(str(pathlib.Path(root).expanduser().resolve()), inside)
    if not isinstance(spec, (str, os.PathLike)):
        raise InputError(f"Expected an input path (PATH or PATH:ARRAY), a zarr.Array, a zarr.Group or a "
                         f"zarr.storage.LocalStore. Got a {type(spec).__name__} instead.")
    text = os.fspath(spec)
    if not text:
        raise InputError("Expected an input path, PATH or PATH:ARRAY. Got an empty string instead.")
    if is_url(text):   # s3://BUCKET/KEY[:ARRAY]
        name = array
        head_, _, tail = text.rpartition(":")
        if name is None and "://" in head_ and tail and "/" not in tail:
            text, name = head_, tail
        return ArrayRef(str(parse(text)), (name or "").strip("/"))
    name = array
    if name is None and not os.path.exists(text) and ":" in text:
        head, tail = text.rsplit(":", 1)
        if head and tail and not tail.startswith(("/", "\\")):
            text, name = head, tail
    path = str(pathlib.Path(text).expanduser().resolve())
    return ArrayRef(path, (name or "").strip("/"))


def _list_arrays(group: zarr.Group) -> list[str]:
    """The group's arrays, nested ones by their path (``sub/m``)."""
    return sorted(name for name, node in group.members(max_depth=None) if isinstance(node, zarr.Array))


_METADATA_NAMES = (".zattrs", ".zmetadata")   # read beside METADATA_FILES


def _regular_metadata(ref: ArrayRef, what: str) -> None:
    """The metadata files zarr reads for ``ref`` (a local store): at its root and at every level of
    its array path, any there must be a regular file. zarr's read of a named pipe waits for a writer
    forever (a run hung on a pipe in place of ``zarr.json``)."""
    import stat

    folder = pathlib.Path(ref.path)
    folders = [folder]
    for part in (p for p in (ref.array or "").split("/") if p):
        folders.append(folders[-1] / part)
    for folder in folders:
        for name in (*METADATA_FILES, *_METADATA_NAMES):
            path = folder / name
            try:
                mode = os.stat(path).st_mode
            except OSError:
                continue
            if not stat.S_ISREG(mode):
                raise CorruptInputError(f"Expected the {what}'s metadata {path} to be a regular file. "
                                        f"Got a named pipe, socket, device or folder instead.")


def open_array_info(ref: ArrayRef, what: str = "input") -> ArrayInfo:
    """Open ``ref`` read-only and describe it; errors say what was expected and what was found."""
    if is_url(ref.path):
        probe(ref.path, f"the {what}")   # no bucket, refused credentials, no endpoint: one line each
        if not any(head(join(ref.path, name)) for name in METADATA_FILES):
            raise InputNotFoundError(f"Expected the {what} at {ref.path} to exist. Got no Zarr metadata "
                                     f"(zarr.json, .zarray or .zgroup) there instead.")
    elif not os.path.exists(ref.path):
        raise InputNotFoundError(f"Expected the {what} at {ref.path} to exist. Got no such path instead.")
    elif not os.path.isdir(ref.path):
        raise InputError(f"Expected the {what} {ref.path} to be a Zarr store (a directory). "
                         f"Got a regular file instead.")
    elif not has_metadata(ref.path):
        raise InputError(f"Expected the {what} {ref.path} to be a Zarr store (with zarr.json, "
                         f".zarray or .zgroup). Got a directory without Zarr metadata instead.")
    else:
        _regular_metadata(ref, what)
    try:
        node = zarr.open(store=zarr_store(ref.path, read_only=True), path=ref.array or None, mode="r")
    except (FileNotFoundError, KeyError) as exc:
        raise InputNotFoundError(f"Expected an array {ref.array!r} in the {what} store {ref.path}. "
                                 f"Got nothing at that path instead ({exc}).") from None
    except Exception as exc:  # malformed metadata (an object store that fails: its one line)
        failed = store_error(exc, ref.path)
        if failed is not None:
            raise failed from None
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


def stored_key(array: zarr.Array, index: int) -> str:
    """The store key of the object (chunk, or shard when sharded) number ``index`` along N."""
    coords = (index,) + (0,) * (array.ndim - 1)
    try:
        return chunk_key(array, coords)
    except Exception:  # a metadata class without the helper: name the coordinates instead
        return f"chunk {coords}"


def read_range(ref: ArrayRef, array: zarr.Array, start: int, stop: int) -> np.ndarray:
    """``array[start:stop]`` in native byte order, or a :class:`CorruptInputError` naming the chunk
    file that fails."""
    try:
        return np.asarray(array[start:stop]).astype(native_dtype(array.dtype), copy=False)
    except Exception as exc:
        raise unreadable(array, np.arange(start, stop), join(ref.path, ref.array), exc,
                         CorruptInputError) from None


def unreadable(array: zarr.Array, rows: np.ndarray, folder: str, exc: Exception, error=CorruptInputError):
    """``error`` naming the first chunk file of ``array`` (stored in ``folder``) holding one of
    ``rows`` that cannot be read or decoded; ``exc`` (the read's failure) where each reads alone.
    An object store that fails the read (no answer, a 5xx, refused access) is no corrupt chunk: its
    one-line :class:`batchlu.pipeline.errors.ObjectStoreError` instead."""
    failed = store_error(exc, folder)
    if failed is not None:
        return failed
    unit = (array.shards or array.chunks)[0]
    for index in np.unique(np.asarray(rows) // unit):
        lo, hi = int(index) * unit, min((int(index) + 1) * unit, array.shape[0])
        try:
            array[lo:hi]
        except Exception as inner:
            failed = store_error(inner, folder)
            if failed is not None:
                return failed
            return error(f"Expected readable chunks in {folder}. Got an unreadable chunk file "
                         f"{join(folder, stored_key(array, int(index)))} (matrices {lo}:{hi}) "
                         f"instead: {type(inner).__name__}: {inner}")
    return error(f"Expected matrices {int(np.min(rows))}:{int(np.max(rows)) + 1} of {folder} to be "
                 f"readable. Got {type(exc).__name__}: {exc} instead.")
