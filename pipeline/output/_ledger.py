"""Completion records: one bool per output chunk, in a small Zarr array ``_complete`` of the output
group, stored one element per object so that each task writes only the records of its own chunks.

Only True is ever stored (False is the fill value, and zarr deletes an object set back to it), so
on a local store (and on object storage) the records are read by listing the objects, not by opening
thousands of them.

A chunk is recorded only after every output array of that chunk was written (zarr's local store
writes each object to a temporary file and renames it into place), so a SIGKILL at any moment
leaves either a complete chunk that is recorded, or a chunk that is redone on resume.

Beside each record, ``_input_xxh3`` keeps the XXH3-64 of the input (and right-hand side) values the
chunk was computed from (:mod:`batchlu.pipeline.output._fingerprint`), written just before the record, so that
``--resume`` can tell whether the input changed since. An older batchlu kept a CRC-32 there, in
``_input_crc32``: such an output is not resumed (:data:`OLDER_DIGESTS`).
"""

from __future__ import annotations

import os

import numpy as np
import zarr

from ..store import _object_store
from ..store._object_store import is_url, join, zarr_store

NAME = "_complete"
DIGESTS = "_input_xxh3"
OLDER_DIGESTS = "_input_crc32"   # CRC-32 of the input, before XXH3-64: resume refuses them


def create_digests(group: zarr.Group, n_chunks: int) -> zarr.Array:
    return group.create_array(DIGESTS, shape=(n_chunks,), chunks=(1,), dtype="uint64", fill_value=0,
                              compressors=None, overwrite=True)


def create(group: zarr.Group, n_chunks: int) -> zarr.Array:
    """The digests, then the records (made last: :func:`exists` means both are there)."""
    create_digests(group, n_chunks)
    return group.create_array(NAME, shape=(n_chunks,), chunks=(1,), dtype="bool", fill_value=False,
                              compressors=None, overwrite=True)


def exists(group: zarr.Group) -> bool:
    return NAME in group


def read(path: str) -> np.ndarray:
    """One bool per output chunk: True where the chunk is complete."""
    array = zarr.open_array(store=zarr_store(path, read_only=True), path=NAME, mode="r")
    if is_url(path) and array.metadata.zarr_format == 3 and array.metadata.chunk_key_encoding.name == "default":
        done = np.zeros(array.shape[0], bool)   # one listing request per 1,000 records
        index = [int(name) for name in _object_store.listing(join(path, NAME, "c")) if name.isdigit()]
        done[np.asarray([i for i in index if i < done.size], dtype=np.int64)] = True
        return done
    folder = os.path.join(path, NAME, "c")
    if array.metadata.zarr_format != 3 or array.metadata.chunk_key_encoding.name != "default" \
            or not os.path.isdir(path):
        return np.asarray(array[...], dtype=bool)
    done = np.zeros(array.shape[0], bool)
    if os.path.isdir(folder):
        with os.scandir(folder) as entries:  # "c/<i>"; a killed writer's "*.partial" is skipped
            index = [int(e.name) for e in entries if e.name.isdigit() and e.is_file()]
        index = np.asarray([i for i in index if i < done.size], dtype=np.int64)
        done[index] = True
    return done


def has_digests(path: str) -> bool:
    if is_url(path):
        return _object_store.head(join(path, DIGESTS, "zarr.json")) is not None
    return os.path.isfile(os.path.join(path, DIGESTS, "zarr.json"))


def has_older_digests(path: str) -> bool:
    if is_url(path):
        return _object_store.head(join(path, OLDER_DIGESTS, "zarr.json")) is not None
    return os.path.isfile(os.path.join(path, OLDER_DIGESTS, "zarr.json"))


def objects_folder(array) -> str | None:
    """The folder of a ledger array's objects when each is a plain file of its one element's bytes:
    a local v3 store, default chunk keys with "/", one element per object, the bytes codec alone
    (little-endian). Else None (then zarr reads and writes them)."""
    from zarr.storage import LocalStore

    meta = array.metadata
    if not isinstance(array.store, LocalStore) or meta.zarr_format != 3 or tuple(array.chunks) != (1,):
        return None
    encoding = meta.chunk_key_encoding
    if encoding.name != "default" or str(getattr(encoding, "separator", "/")) != "/" or len(meta.codecs) != 1:
        return None
    codec = meta.codecs[0]
    endian = getattr(codec, "endian", None)
    endian = getattr(endian, "value", endian)
    if codec.to_dict().get("name") != "bytes" or endian not in ("little", None) or \
            (endian is None and np.dtype(array.dtype).itemsize > 1):
        return None
    return os.path.join(str(array.store.root), *[p for p in str(array.path).split("/") if p], "c")


def read_digests(path: str, chunks=None) -> np.ndarray:
    """The input digests recorded for output chunks ``chunks`` (default all; 0 where none).

    On a local store the 8-byte objects are read as files (zarr takes about a millisecond per
    object, a minute for 50,000 chunks)."""
    array = zarr.open_array(store=zarr_store(path, read_only=True), path=DIGESTS, mode="r")
    index = np.arange(array.shape[0]) if chunks is None else np.asarray(chunks, np.int64)
    folder = objects_folder(array) if np.dtype(array.dtype) == np.uint64 else None
    if folder is None:
        return np.asarray(array.get_coordinate_selection(index), dtype=np.uint64)
    out = np.zeros(index.size, np.uint64)
    for i, c in enumerate(index):
        try:
            with open(os.path.join(folder, str(int(c))), "rb") as f:
                out[i] = np.frombuffer(f.read(8), "<u8")[0]
        except FileNotFoundError:
            pass  # never written, or written as the fill value 0
    return out


def mark(path: str, c0: int, c1: int, digests=None) -> None:
    """Record chunks ``[c0, c1)`` complete, with the digests of their inputs (``digests``, one per
    chunk). Call only after all their outputs are written."""
    store = zarr_store(path)
    mark_arrays(zarr.open_array(store=store, path=DIGESTS, mode="r+") if digests is not None else None,
                zarr.open_array(store=store, path=NAME, mode="r+"), c0, c1, digests)


def mark_arrays(digest_array, complete_array, c0: int, c1: int, digests=None) -> None:
    """:func:`mark` on the ledger's arrays already open. Where their objects are plain files
    (:func:`objects_folder`), each is written as a file through a temporary file renamed into place,
    as zarr's local store does, in a fraction of zarr's time per object: the digests first, then the
    records."""
    from ..store._files import write_file

    for array, values in ((digest_array, None if digests is None else np.asarray(digests, "<u8")),
                          (complete_array, np.ones(c1 - c0, bool))):
        if array is None or values is None:
            continue
        folder = objects_folder(array)
        if folder is None or values.dtype != np.dtype(array.dtype):
            array[c0:c1] = values
            continue
        for i, value in zip(range(c0, c1), values):
            write_file(os.path.join(folder, str(i)), [value.tobytes()])


def unrecord(path: str, chunks) -> None:
    """Take back the completion records of ``chunks`` (a resume redoes them): each set back to the
    fill value False, which zarr stores by deleting the object."""
    array = zarr.open_array(store=zarr_store(path), path=NAME, mode="r+")
    for c in chunks:
        array[int(c)] = False


def matrix_mask(complete: np.ndarray, chunk: int, count: int) -> np.ndarray:
    """One bool per matrix: True where its output chunk is complete."""
    return np.repeat(np.asarray(complete, bool), chunk)[:count]
