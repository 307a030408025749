"""The choices a setting takes, one tuple each, which everything else (the settings' parsers, the
command line's choices, ``batchlu generate``, the output's codecs) reads from here."""

from __future__ import annotations

from batchlu.kernels.sparse import ORDERINGS

__all__ = ["BACKENDS", "CODEC_DEVICES", "MISSING_CHUNKS", "OUTPUT_CHECKSUMS", "OUTPUT_CODECS", "OUTPUT_LAYOUTS",
           "SPARSE_ORDERINGS", "ZSTD_LEVELS"]

BACKENDS = ("auto", "cpu", "gpu")                # batchlu.backend
CODEC_DEVICES = ("auto", "gpu", "cpu")           # batchlu.codec-device
OUTPUT_CODECS = ("auto", "zstd", "lz4", "none")  # batchlu.output-codec (zstd also as zstd:LEVEL)
OUTPUT_CHECKSUMS = ("crc32c", "none")            # batchlu.output-checksum: zarr's crc32c codec after the compressor
OUTPUT_LAYOUTS = ("chunks", "sharded")           # batchlu.output-layout, and batchlu generate --layout
MISSING_CHUNKS = ("error", "fill")               # batchlu.missing-chunks
SPARSE_ORDERINGS = ORDERINGS                     # batchlu.sparse.ordering: batchlu.sparse.analyze's orderings by name
ZSTD_LEVELS = range(-(1 << 17), 23)              # Zstandard's levels: ZSTD_minCLevel() to ZSTD_maxCLevel()
