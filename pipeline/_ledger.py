"""Completion records: one bool per output chunk, in a small Zarr array ``_complete`` of the output
group, stored one element per object so that each task writes only the records of its own chunks.

A chunk is recorded only after every output array of that chunk was written (zarr's local store
writes each object to a temporary file and renames it into place), so a SIGKILL at any moment
leaves either a complete chunk that is recorded, or a chunk that is redone on resume.
"""

from __future__ import annotations

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
    return np.asarray(zarr.open_array(store=path, path=NAME, mode="r")[...], dtype=bool)


def mark(path: str, c0: int, c1: int) -> None:
    """Record chunks ``[c0, c1)`` complete. Call only after all their outputs are written."""
    zarr.open_array(store=path, path=NAME, mode="r+")[c0:c1] = True
