"""Helpers shared by the pipeline tests (imported as a plain module: tests/ has no packages)."""

from __future__ import annotations

import os

import numpy as np
import zarr

import pipeline


def outputs_of(path: str) -> dict[str, np.ndarray]:
    """Every array of an output group (ledger included), read back."""
    group = zarr.open_group(path, mode="r")
    return {name: np.asarray(array[...]) for name, array in group.arrays()}


def assert_nothing_complete(path) -> None:
    """A failed run leaves either no output, or one whose status and ledger say nothing is done."""
    path = str(path)
    if not os.path.exists(path):
        return
    record = pipeline._output.read_provenance(path)
    if record is None:  # not even a group: nothing that looks like an output
        return
    assert record["status"] != "complete"
    group = zarr.open_group(path, mode="r")
    if "_complete" in group:
        assert not np.asarray(group["_complete"][...]).any()


