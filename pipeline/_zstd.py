"""A zstd codec for zarr whose compression and decompression release the GIL.

zarr decodes and encodes chunks in a thread pool, but its stock ``zstd`` codec calls numcodecs,
which holds the GIL while (de)compressing: in one worker process, all chunk decoding and encoding
then runs one chunk at a time, whatever the number of threads. This module swaps in the same format
(standard zstd frames, same level and checksum settings, readable by any zstd reader) through the
``zstandard`` package, whose one-shot calls run without the GIL, so the threads really decode and
encode in parallel.

:func:`install` selects it in the current process (a worker; the client never needs it); without
``zstandard`` it leaves zarr's codec in place. Frames without a content size (rare; streaming
writers) are decoded by numcodecs as before.
"""

from __future__ import annotations

import threading

__all__ = ["install", "installed"]

_LOCK = threading.Lock()
_INSTALLED = False
_NAME = f"{__name__}.ThreadedZstdCodec"


def installed() -> bool:
    return _INSTALLED


def install() -> bool:
    """Make zarr use :class:`ThreadedZstdCodec` for ``zstd`` in this process. True when it does."""
    global _INSTALLED
    with _LOCK:
        if _INSTALLED:
            return True
        try:
            import zstandard  # noqa: F401
            import zarr
            from zarr.registry import register_codec
        except ImportError:
            return False
        register_codec("zstd", _codec_class())
        zarr.config.set({"codecs.zstd": _NAME})
        _INSTALLED = True
        return True


_CLASS = None


def _codec_class():
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    import zstandard
    from zarr.codecs.zstd import ZstdCodec
    from zarr.core.buffer.cpu import as_numpy_array_wrapper

    local = threading.local()

    def compressor(level: int, checksum: bool):
        cache = getattr(local, "compressors", None)
        if cache is None:
            cache = local.compressors = {}
        key = (level, checksum)
        if key not in cache:
            cache[key] = zstandard.ZstdCompressor(level=level, write_checksum=checksum,
                                                  write_content_size=True)
        return cache[key]

    def decompressor():
        d = getattr(local, "decompressor", None)
        if d is None:
            d = local.decompressor = zstandard.ZstdDecompressor()
        return d

    class ThreadedZstdCodec(ZstdCodec):
        """``zstd`` (zarr v3) through ``zstandard``: same frames, no GIL held while (de)compressing."""

        def _decode_sync(self, chunk_bytes, chunk_spec):
            def decode(data):
                try:
                    return decompressor().decompress(data)
                except zstandard.ZstdError:  # no content size in the frame: numcodecs streams it
                    return self._zstd_codec.decode(data)
            return as_numpy_array_wrapper(decode, chunk_bytes, chunk_spec.prototype)

        def _encode_sync(self, chunk_bytes, chunk_spec):
            level, checksum = int(self.level), bool(self.checksum)
            return as_numpy_array_wrapper(lambda data: compressor(level, checksum).compress(data),
                                          chunk_bytes, chunk_spec.prototype)

    ThreadedZstdCodec.__module__ = __name__
    ThreadedZstdCodec.__qualname__ = "ThreadedZstdCodec"
    _CLASS = ThreadedZstdCodec
    return _CLASS


def __getattr__(name):
    if name == "ThreadedZstdCodec":
        return _codec_class()
    raise AttributeError(name)
