"""batchlu's one error hierarchy (kernels, pipeline, CLI). Messages read "Expected X. Got Y instead."

Every class derives from :class:`BatchluError`, so ``except batchlu.errors.BatchluError`` catches all
of them (``batchlu.pipeline.errors`` is the same module's names); each also derives from the closest built-in (``ValueError``, ``FileNotFoundError``, ...)
so that generic handlers keep working. The classes take one message argument, which keeps them
picklable across Dask workers.
"""

from __future__ import annotations

import numpy

__all__ = [
    "BackendError",
    "BatchIndexError",
    "BatchluError",
    "BatchluWarning",
    "ClusterError",
    "ConfigError",
    "CorruptInputError",
    "DependencyError",
    "FencedError",
    "GPUCodecError",
    "FrameError",
    "GPUUnavailableError",
    "IOProcessError",
    "InputChangedError",
    "InputError",
    "InputNotFoundError",
    "InputTypeError",
    "KernelCompileError",
    "LinAlgError",
    "MissingChunkError",
    "ObjectStoreError",
    "OutputError",
    "OutputExistsError",
    "OutputLockedError",
    "ResumeError",
]


class BatchluError(Exception):
    """Base class of every error batchlu raises on purpose."""


class ConfigError(BatchluError, ValueError):
    """An unknown op, backend or setting, or a setting out of range."""


class BackendError(ConfigError):
    """The requested compute backend is not available on the workers (e.g. ``gpu`` with no GPU)."""


class GPUUnavailableError(BackendError):
    """``--backend gpu`` was asked for, but no usable GPU (or no CUDA Python stack) is present."""


class LinAlgError(BatchluError, numpy.linalg.LinAlgError):
    """``check=True`` found a matrix with ``info`` != 0 (singular, non-finite input or result); the
    message names its index. Also a :class:`numpy.linalg.LinAlgError`, as SciPy raises."""


class KernelCompileError(BatchluError, RuntimeError):
    """A CUDA source failed to compile; the message carries NVRTC's log."""


class GPUCodecError(BatchluError, RuntimeError):
    """nvCOMP refused a call of the GPU codec path; the message names the function and its status."""


class IOProcessError(BatchluError, RuntimeError):
    """An I/O process exited (killed, out of memory) before answering a request."""


class InputError(BatchluError, ValueError):
    """The input (or right-hand side) is not a readable Zarr array of the expected shape and dtype."""


class InputTypeError(InputError, TypeError):
    """An array of the wrong kind or dtype: NumPy and CuPy arrays mixed, or a dtype batchlu does not take."""


class BatchIndexError(InputError, IndexError):
    """An index outside the batch (e.g. ``Factor.factors(i)``)."""


class DependencyError(BatchluError, ImportError):
    """A package that was asked for by name is not importable (e.g. numba for ``BATCHLU_CPU_ENGINE=compiled``)."""


class InputNotFoundError(InputError, FileNotFoundError):
    """The input path, or the array inside it, does not exist."""


class CorruptInputError(InputError):
    """A chunk of the input could not be read or decoded; the message names the chunk file."""


class FrameError(CorruptInputError):
    """A stored frame that the GPU codec path cannot read or decode to exactly its chunk's bytes. The
    run re-reads that batch through zarr, which names the chunk if it is really corrupt."""


class InputChangedError(InputError):
    """A file of the input (or right-hand side) was written or replaced while a run read it: the
    results may mix old and new values, so the run does not report complete."""


class MissingChunkError(InputError):
    """A chunk (or shard, or a chunk inside a shard) of the input or right-hand side is missing from its
    store: Zarr would read it as the fill value. The message names the chunk and its matrices."""


class OutputError(BatchluError, OSError):
    """The output cannot be written where asked (not writable, same as the input, not a Zarr store)."""


class OutputExistsError(OutputError, FileExistsError):
    """The output exists and neither ``resume`` nor ``overwrite`` was asked for."""


class OutputLockedError(OutputError):
    """Another batchlu run holds the output's lock (``OUT.zarr.lock``): one writer per output."""


class FencedError(OutputLockedError):
    """A task found the output's lock (``OUT.zarr.lock``) naming another run than its own (its client
    was killed or its lock was taken over): the task stops without writing."""


class BatchluWarning(UserWarning):
    """Something the user should know that does not stop the run (e.g. a stale lock taken over)."""


class ObjectStoreError(BatchluError, OSError):
    """An object store (``s3://``) cannot be used: a URL scheme batchlu has no store for, a missing
    bucket, credentials it refuses, or an endpoint that does not answer."""


class ResumeError(OutputError):
    """``resume`` was asked for an output written from another input, right-hand side or op."""


class ClusterError(BatchluError, OSError):
    """The cluster cannot be used: the scheduler of ``scheduler`` / ``scheduler_file`` does not answer
    or is not a Dask scheduler, or the embedded local cluster cannot start."""
