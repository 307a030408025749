"""A task's Zarr arrays, opened once per worker process (:func:`batchlu.pipeline.worker._io_pool.open_array`):
its input, right-hand side and outputs, the store's answer on the chunks a batch needs
(:mod:`batchlu.pipeline.store._missing`), and the record of chunks complete in the output's ledger
(:mod:`batchlu.pipeline.output._ledger`)."""

from __future__ import annotations


import numpy as np

from ..output import _ledger
from ..store import _missing, _object_store
from ._io_pool import open_array

__all__ = ["TaskIO"]


class TaskIO:
    """The task's Zarr arrays (opened once per worker process, see
    :func:`batchlu.pipeline.worker._io_pool.open_array`): the chunks a batch needs, and the record of
    chunks complete."""

    def __init__(self, job):
        self.job = job
        engine = job.settings.io_engine  # batchlu.io-engine: the codec pipeline (pipeline._io_engines)
        # object stores: a batch's chunks are read after the missing-chunk check (:meth:`missing`), so
        # a store that answers "not found" for one the check found stored is an error, not the fill
        # value; under missing-chunks fill the store is told the keys the check found absent
        self.input = open_array(job.input.path, job.input.array, "r", engine=engine, strict=True)
        self.rhs = (open_array(job.rhs.path, job.rhs.array, "r", engine=engine, strict=True)
                    if job.rhs is not None else None)
        # write_empty: a chunk whose values all equal the fill value (the NaN inverses of a chunk of
        # singular matrices) is stored too, so that resume can check every complete chunk is there
        self.out = {name: open_array(job.output, name, "r+", write_empty=True, engine=engine)
                    for name in job.outputs}

    def missing(self, start: int, stop: int, found: dict | None = None) -> np.ndarray | None:
        """Look up the chunks matrices ``[start, stop)`` need, in the input and the right-hand side:
        None when all are stored, else (``fill``) the mask of the matrices in missing chunks;
        ``error`` raises :class:`batchlu.pipeline.errors.MissingChunkError`. ``found`` maps ``"a"`` /
        ``"b"`` to the gaps the GPU codec path already found while reading them (the same shard
        indexes and chunk sizes); an array not in it is looked up in the store."""
        rows, absent = None, []
        for name, ref, array, what in (("a", self.job.input, self.input, "input"),
                                       ("b", self.job.rhs, self.rhs, "right-hand side")):
            if array is None:
                continue
            where = ref.location()
            known = (found or {}).get(name)
            gaps = known if known is not None else _missing.find(array, start, stop)
            if getattr(array.store, "strict", False):   # an object store: its objects found absent
                absent += [(array.store, f"{array.path}/{gap.key}" if array.path else gap.key)
                           for gap in gaps if gap.inner is None]   # not a shard that is there
            mask = _missing.judge(gaps, where, start, stop, self.job.settings.missing_chunks, what)
            if mask is not None:
                rows = mask if rows is None else rows | mask
        _object_store.expect_absent(absent)   # for this batch's read, in this thread
        return rows

    def mark(self, c0: int, c1: int, digests) -> None:
        """Record chunks ``[c0, c1)`` complete with the digests of their inputs, ``digests`` (as
        :func:`batchlu.pipeline.output._ledger.mark`, on the cached arrays): the ledger of the loop's
        record stage (:class:`batchlu.pipeline.worker._loop.Record`)."""
        _ledger.mark_arrays(open_array(self.job.output, _ledger.DIGESTS, "r+"),
                            open_array(self.job.output, _ledger.NAME, "r+"), c0, c1, digests)
