"""How an array's chunks lie on disk, as the GPU codec path reads and writes their files directly.

:class:`Stored` is what a worker needs to find an array's chunk files and their frames: the folder,
the chunk key encoding, the chunk (or shard and inner chunk) length along N, and how a chunk's
bytes wrap the codec's frame (:class:`Frames`: numcodecs' LZ4 size header, zarr's crc32c trailer).
:func:`describe` reads it from a zarr array, or says why the array's chunks cannot go to the GPU.
Only local folders (zarr's ``LocalStore``) have such a layout: their files are read and written
directly.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from ._zarr import chunk_key

__all__ = ["EMPTY", "Frames", "Stored", "describe"]

EMPTY = 2**64 - 1   # a shard index entry of a chunk that is not stored


@dataclasses.dataclass(frozen=True)
class Frames:
    """How one stored chunk's bytes wrap the codec's frame."""

    algorithm: str         # "zstd", "lz4", or "none" (the bytes are the values)
    head: int = 0          # bytes before the frame: numcodecs' LZ4 keeps the decoded size there
    crc32c: bool = False   # zarr's crc32c codec: a CRC-32C of the rest, 4 bytes little-endian, after it
    level: int = 0         # zstd level the output is declared with (decoders ignore it)


@dataclasses.dataclass(frozen=True)
class Stored:
    """An array's chunk files, as a worker reads or writes them directly."""

    root: str                  # the array's folder
    prefix: str                # chunk key prefix: "c" + separator (v3 default encoding) or ""
    separator: str
    shape: tuple[int, ...]
    dtype: str
    unit: int                  # matrices per stored object along N: the shard, else the chunk
    inner: int                 # matrices per chunk inside a shard (== unit when not sharded)
    frames: Frames
    sharded: bool = False
    index_at_end: bool = True

    @property
    def per_shard(self) -> int:
        return self.unit // self.inner

    @property
    def matrix_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def index_bytes(self) -> int:
        return 16 * self.per_shard + 4

    def key(self, index: int) -> str:
        return self.prefix + self.separator.join([str(index)] + ["0"] * (len(self.shape) - 1))

    def path(self, index: int) -> str:
        return os.path.join(self.root, *self.key(index).split("/"))


def _name(codec) -> str:
    to_dict = getattr(codec, "to_dict", None)
    if to_dict is not None:
        return str(to_dict().get("name", type(codec).__name__))
    return str(getattr(codec, "codec_id", type(codec).__name__))


def _frames(chain: list, where: str) -> tuple[Frames | None, str]:
    """The :class:`Frames` of a chain of bytes-to-bytes codecs, or why the GPU cannot decode it."""
    crc = bool(chain) and _name(chain[-1]) == "crc32c"
    if crc:
        chain = chain[:-1]
    if not chain:
        return Frames("none", crc32c=crc), ""
    if len(chain) > 1:
        return None, f"{where} has the codecs {', '.join(_name(c) for c in chain)}: only one compressor decodes on the GPU"
    name = _name(chain[0])
    if name == "zstd":
        return Frames("zstd", crc32c=crc, level=int(getattr(chain[0], "level", 0) or 0)), ""
    if name in ("lz4", "numcodecs.lz4"):
        return Frames("lz4", head=4, crc32c=crc), ""
    return None, f"{where} is compressed with {name}, which nvCOMP does not decode to the standard format"


def describe(array) -> tuple[Stored | None, str]:
    """The :class:`Stored` layout of a zarr array, or None and why its chunks cannot go to the GPU."""
    from zarr.storage import LocalStore

    store = array.store
    if not isinstance(store, LocalStore):
        if type(store).__name__ == "ObjectStore":   # the GPU codec path reads files with preadv
            return None, "it is on object storage (s3://), which the GPU codec path does not read: host codecs"
        return None, f"its store is a {type(store).__name__}, not a local folder"
    shape = tuple(int(s) for s in array.shape)
    dtype = np.dtype(array.dtype)
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and not np.little_endian):
        return None, "its values are big-endian"
    root = os.path.join(str(store.root), *[p for p in str(array.path).split("/") if p])
    meta = array.metadata
    sharded = False
    index_at_end = True
    if meta.zarr_format == 2:
        if getattr(meta, "filters", None):
            return None, f"it has the filters {', '.join(_name(f) for f in meta.filters)}"
        if getattr(meta, "order", "C") != "C":
            return None, "its chunks are in Fortran order"
        compressor = getattr(meta, "compressor", None)
        frames, why = _frames([] if compressor is None else [compressor], "it")
        prefix, separator = "", str(getattr(meta, "dimension_separator", ".") or ".")
        chunk = unit = int(array.chunks[0])
        chunk_shape = tuple(array.chunks)
    else:
        codecs = list(meta.codecs)
        if len(codecs) == 1 and _name(codecs[0]) == "sharding_indexed":
            sharding = codecs[0]
            sharded = True
            index = [_name(c) for c in sharding.index_codecs]
            if index not in (["bytes"], ["bytes", "crc32c"]) or _endian(sharding.index_codecs[0]) == "big":
                return None, f"its shard index has the codecs {', '.join(index)}"
            if index == ["bytes"]:
                return None, "its shard index has no crc32c codec"
            index_at_end = str(getattr(sharding.index_location, "value", sharding.index_location)) == "end"
            codecs = list(sharding.codecs)
            chunk_shape = tuple(int(c) for c in sharding.chunk_shape)
            unit = int(array.shards[0])
        else:
            chunk_shape = tuple(array.chunks)
            unit = int(chunk_shape[0])
        if not codecs or _name(codecs[0]) != "bytes":
            return None, f"its codecs start with {_name(codecs[0]) if codecs else 'nothing'}, not bytes"
        if _endian(codecs[0]) == "big" and dtype.itemsize > 1:
            return None, "its values are stored big-endian"
        frames, why = _frames(codecs[1:], "it")
        encoding = meta.chunk_key_encoding
        separator = str(getattr(encoding, "separator", "/"))
        prefix = ("c" + separator) if getattr(encoding, "name", "default") == "default" else ""
        chunk = int(chunk_shape[0])
    if frames is None:
        return None, why
    if tuple(chunk_shape[1:]) != shape[1:] or (array.shards is not None and tuple(array.shards[1:]) != shape[1:]):
        return None, f"its chunks {chunk_shape} cut through the matrices {shape[1:]}"
    stored = Stored(root, prefix, separator, shape, dtype.str, unit, chunk, frames, sharded, index_at_end)
    for index in (0, 1, 17):
        expected = chunk_key(array, (index,) + (0,) * (len(shape) - 1))
        if stored.key(index) != expected:
            return None, f"its chunk keys ({expected}) use an encoding batchlu does not know"
    return stored, ""


def _endian(codec) -> str | None:
    endian = getattr(codec, "endian", None)
    return None if endian is None else str(getattr(endian, "value", endian))
