"""Completion records: one bool per output chunk, in a small Zarr array ``_complete`` of the output
group, stored one element per object so that each task writes only the records of its own chunks.

Only True is ever stored (False is the fill value, and zarr deletes an object set back to it), so
on a local store the records are read by listing the objects, not by opening thousands of them.

A chunk is recorded only after every output array of that chunk was written (zarr's local store
writes each object to a temporary file and renames it into place), so a SIGKILL at any moment
leaves either a complete chunk that is recorded, or a chunk that is redone on resume.
"""

from __future__ import annotations

import os

import numpy as np
import zarr

NAME = "_complete"


def create(group: zarr.Group, n_chunks: int) -> zarr.Array:
    return group.create_array(NAME, shape=(n_chunks,), chunks=(1,), dtype="bool", fill_value=False,
                              compressors=None, overwrite=True)


def exists(group: zarr.Group) -> bool:
    return NAME in group


def read(path: str) -> np.ndarray:
    """One bool per output chunk: True where the chunk is complete."""
    array = zarr.open_array(store=path, path=NAME, mode="r")
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


def mark(path: str, c0: int, c1: int) -> None:
    """Record chunks ``[c0, c1)`` complete. Call only after all their outputs are written."""
    zarr.open_array(store=path, path=NAME, mode="r+")[c0:c1] = True


def matrix_mask(complete: np.ndarray, chunk: int, count: int) -> np.ndarray:
    """One bool per matrix: True where its output chunk is complete."""
    return np.repeat(np.asarray(complete, bool), chunk)[:count]
