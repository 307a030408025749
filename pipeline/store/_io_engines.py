"""Which Zarr codec pipeline decodes the inputs and encodes the outputs on the host
(``batchlu.io-engine``), in the worker process or in its I/O processes (:mod:`batchlu.pipeline.worker._io_pool`).

zarr-python picks the pipeline of an array when the array is opened, from its configuration
(``codec_pipeline.path``); :func:`opening` sets it for the arrays the data path opens, and nothing
else: every engine reads and writes the same values, bit for bit (tests/pipeline/test_io_engines.py).

* ``zarr``: zarr-python as it is configured: by default its ``BatchedCodecPipeline``.
* ``zarr-fused``: zarr-python's ``FusedCodecPipeline`` (the installed zarr must have it): the codecs
  of a call run synchronously in threads, without an asyncio task per chunk.
* ``zarrs``: the codec pipeline of the ``zarrs`` package (Rust, https://github.com/zarrs/zarrs-python),
  which decodes outside the GIL in its own thread pool, for the inputs. An array it cannot handle
  falls back to zarr's pipeline (zarrs' ``codec_pipeline.strict`` off). The outputs are written by
  zarr's pipeline all the same: zarrs (0.2.3) deletes a chunk whose values all equal the fill value
  even with ``write_empty_chunks`` (``store_chunk_bytes`` does not look at the option), and resume
  needs every chunk of an output stored (the NaN inverses of a chunk of singular matrices too).
* ``auto``: the first of :data:`AUTO` that is installed.

``benchmarks/bench_host_codecs.py`` measures them against the I/O processes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import threading

from ..errors import ConfigError
from ._zarr import FUSED_PIPELINE

__all__ = ["AUTO", "ENGINES", "IOEngine", "NAMES", "check", "opening", "resolve", "unavailable"]


@dataclasses.dataclass(frozen=True)
class IOEngine:
    """One entry of :data:`ENGINES`: the zarr configuration under which an array is opened."""

    name: str
    pipeline: str | None          # zarr's ``codec_pipeline.path``; None: zarr's default
    settings: tuple = ()          # more zarr configuration, (key, value) pairs
    install: str = ""             # what to install when the pipeline is missing
    writes: bool = True           # False: arrays opened for writing get zarr's pipeline instead

    def zarr_config(self) -> dict:
        """What :func:`opening` sets: nothing for ``zarr`` (zarr as configured, by default its
        BatchedCodecPipeline), else the pipeline and its settings."""
        return {} if self.pipeline is None else {"codec_pipeline.path": self.pipeline, **dict(self.settings)}


ENGINES = {
    "zarr": IOEngine("zarr", None),
    "zarr-fused": IOEngine("zarr-fused", FUSED_PIPELINE,
                           install="a zarr that has FusedCodecPipeline (pip install -U zarr)"),
    "zarrs": IOEngine("zarrs", "zarrs.ZarrsCodecPipeline", (("codec_pipeline.strict", False),),
                      install="the zarrs package (pip install zarrs)", writes=False),
}
NAMES = ("auto", *ENGINES)
# ``auto``: the first of these that is installed. zarr's default until the host codec benchmark
# (benchmarks/bench_host_codecs.py) on the GPU hosts says otherwise.
AUTO = ("zarr",)


def unavailable(name: str) -> str | None:
    """Why engine ``name`` cannot be used here (its pipeline does not import), or None."""
    engine = ENGINES[name]
    if engine.pipeline is None:
        return None
    module, _, attr = engine.pipeline.rpartition(".")
    try:
        found = importlib.import_module(module)
    except ImportError as exc:
        return f"{module} does not import ({exc})"
    if not hasattr(found, attr):
        return f"{module} has no {attr}"
    return None


def check(value) -> str:
    """The ``batchlu.io-engine`` setting, checked: one of :data:`NAMES`, and installed where named."""
    text = str(value).strip().lower() if isinstance(value, str) else value
    if text not in NAMES:
        raise ConfigError(f"Expected batchlu.io-engine to be one of {', '.join(NAMES)}. Got {value!r} instead.")
    if text != "auto":
        why = unavailable(text)
        if why is not None:
            raise ConfigError(f"Expected {ENGINES[text].install} for batchlu.io-engine {text}. "
                              f"Got {why} instead.")
    return text


def resolve(name: str) -> IOEngine:
    """The engine of setting ``name`` in this process: ``auto`` is the first of :data:`AUTO` installed
    here; a named engine not installed here (a worker unlike the client) raises :class:`ConfigError`."""
    if name == "auto":
        return next(ENGINES[n] for n in AUTO + ("zarr",) if unavailable(n) is None)
    return ENGINES[check(name)]


_OPENING = threading.Lock()


@contextlib.contextmanager
def opening(name: str, write: bool = False):
    """Open Zarr arrays with engine ``name`` inside this block (one block at a time in the process:
    zarr's configuration is global while it lasts); ``write``: arrays to write, which an engine
    that does not write (:attr:`IOEngine.writes`) leaves to zarr's pipeline."""
    import zarr

    engine = resolve(name)
    if write and not engine.writes:
        engine = ENGINES["zarr"]
    with _OPENING, zarr.config.set(engine.zarr_config()):
        yield engine
