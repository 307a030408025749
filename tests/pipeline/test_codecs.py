"""The host half of the GPU codec path (pipeline._codecs): which arrays go to the GPU and why, and the
stored bytes it reads and writes, checked against plain zarr-python with numcodecs standing in for
nvCOMP (the GPU half is tests/pipeline/test_gpu_codecs.py)."""

from __future__ import annotations

import numcodecs
import numpy as np
import pytest
import zarr

from batchlu.pipeline import _codecs

RNG = np.random.default_rng()
ZSTD = zarr.codecs.ZstdCodec


def _values(shape, dtype="f8"):
    return RNG.standard_normal(shape).astype(dtype)




def _read_back(stored: _codecs.Stored, start: int, stop: int) -> np.ndarray:
    """Matrices [start, stop) through plan_reads / read_frames / payload and numcodecs: what the GPU
    path does with nvCOMP."""
    reads = _codecs.plan_reads(stored, start, stop)
    sizes = _codecs.frame_sizes(reads)
    offsets, total = _codecs.aligned(sizes)
    buffer = np.empty(max(total, 1), np.uint8)
    read_frames = _codecs.read_frames
    read_frames(reads, sizes, offsets, buffer)
    first = reads[0].first
    out = np.full((reads[-1].first + reads[-1].matrices - first,) + stored.shape[1:], np.nan, stored.dtype)
    flat = out.reshape(-1).view(np.uint8)
    for r, size, at in zip(reads, sizes, offsets):
        assert size > 0, r
        off, length = _codecs.payload(stored.frames, buffer, at, size, r.label)
        raw = bytes(buffer[off:off + length])
        if stored.frames.algorithm == "lz4":
            raw = bytes(numcodecs.LZ4().decode(bytes(buffer[off - 4:off]) + raw))
        elif stored.frames.algorithm == "zstd":
            raw = bytes(numcodecs.Zstd().decode(raw))
        lo = (r.first - first) * stored.matrix_bytes
        flat[lo:lo + len(raw)] = np.frombuffer(raw, np.uint8)
    return out[:stop - start]


LAYOUTS = {
    "v3 zstd": dict(chunks=(7, 5, 5), compressors=ZSTD(level=1)),
    "v3 zstd crc32c": dict(chunks=(7, 5, 5), compressors=[ZSTD(level=0), zarr.codecs.Crc32cCodec()]),
    "v3 zstd checksum": dict(chunks=(7, 5, 5), compressors=ZSTD(level=3, checksum=True)),
    "v3 none": dict(chunks=(7, 5, 5), compressors=None),
    "v3 sharded": dict(chunks=(3, 5, 5), shards=(9, 5, 5), compressors=ZSTD(level=0)),
    "v3 sharded crc32c": dict(chunks=(3, 5, 5), shards=(9, 5, 5),
                              compressors=[ZSTD(level=0), zarr.codecs.Crc32cCodec()]),
    "v3 lz4": dict(chunks=(7, 5, 5), compressors=_codecs.output_compressors("lz4")),
    "v2 zstd": dict(chunks=(7, 5, 5), zarr_format=2, compressors=numcodecs.Zstd(level=1)),
    "v2 lz4": dict(chunks=(7, 5, 5), zarr_format=2, compressors=numcodecs.LZ4()),
    "v2 none": dict(chunks=(7, 5, 5), zarr_format=2, compressors=None),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_gpu_decodable_layouts_read_back_as_zarr_does(tmp_path, layout):
    x = _values((40, 5, 5))
    array = zarr.create_array(str(tmp_path / "a.zarr"), shape=x.shape, dtype=x.dtype, **LAYOUTS[layout])
    array[:] = x
    choice = _codecs.choose(array, "auto", gpu=True, nvcomp=None)
    assert choice.device == "gpu", choice.reason
    stored = choice.stored
    unit = stored.unit
    # whole stored objects, the last one partial (40 is not a multiple of 7 or 9)
    for start, stop in ((0, unit), (unit, 3 * unit), (4 * unit, 40)):
        got = _read_back(stored, start, min(stop, 40))
        np.testing.assert_array_equal(got, x[start:min(stop, 40)])


def test_big_endian_v2_goes_to_the_host(tmp_path):
    array = zarr.create_array(str(tmp_path / "a.zarr"), shape=(8, 4, 4), chunks=(4, 4, 4), dtype=">f8",
                              zarr_format=2, compressors=numcodecs.Zstd())
    choice = _codecs.choose(array, "auto", gpu=True, nvcomp=None)
    assert (choice.device, choice.reason) == ("cpu", "its values are big-endian")


@pytest.mark.parametrize("kwargs, reason", [
    (dict(chunks=(4, 4, 4), compressors=zarr.codecs.BloscCodec()), "compressed with blosc"),
    (dict(chunks=(4, 4, 4), compressors=zarr.codecs.GzipCodec()), "compressed with gzip"),
    (dict(chunks=(4, 2, 4), compressors=ZSTD()), "cut through the matrices"),
    (dict(chunks=(4, 4, 4), zarr_format=2, compressors=numcodecs.Zstd(), filters=[numcodecs.Delta("f8")]),
     "filters"),
    (dict(chunks=(4, 4, 4), compressors=[ZSTD(), ZSTD()]), "only one compressor"),
])
def test_other_codecs_go_to_the_host_with_the_reason(tmp_path, kwargs, reason):
    array = zarr.create_array(str(tmp_path / "a.zarr"), shape=(8, 4, 4), dtype="f8", **kwargs)
    choice = _codecs.choose(array, "auto", gpu=True, nvcomp=None)
    assert choice.device == "cpu" and reason in choice.reason, choice


def test_settings_and_missing_nvcomp_choose_the_host(tmp_path):
    array = zarr.create_array(str(tmp_path / "a.zarr"), shape=(8, 4, 4), chunks=(4, 4, 4), dtype="f8")
    assert _codecs.choose(array, "cpu", gpu=True, nvcomp=None).reason == "codec-device is cpu"
    assert _codecs.choose(array, "auto", gpu=False, nvcomp=None).reason == "the run computes on the CPU"
    why = "nvCOMP is not installed on worker tcp://x (No module named 'nvidia.nvcomp')"
    assert _codecs.choose(array, "gpu", gpu=True, nvcomp=why) == _codecs.Choice("cpu", why)


def test_auto_keeps_large_frames_on_the_host(tmp_path):
    big = zarr.create_array(str(tmp_path / "big.zarr"), shape=(80, 128, 128), chunks=(40, 128, 128), dtype="f8")
    choice = _codecs.choose(big, "auto", gpu=True, nvcomp=None)
    assert choice.device == "cpu" and "5 MiB are faster on the host" in choice.reason
    assert _codecs.choose(big, "gpu", gpu=True, nvcomp=None).device == "gpu"   # asked for: the GPU
    sharded = zarr.create_array(str(tmp_path / "s.zarr"), shape=(80, 128, 128), chunks=(2, 128, 128),
                                shards=(40, 128, 128), dtype="f8")
    assert _codecs.choose(sharded, "auto", gpu=True, nvcomp=None).device == "gpu"


def test_inputs_without_crc32c_are_decoded_on_the_host(tmp_path):
    plain = zarr.create_array(str(tmp_path / "p.zarr"), shape=(8, 4, 4), chunks=(4, 4, 4), dtype="f8")
    choice = _codecs.choose(plain, "gpu", gpu=True, nvcomp=None, reading=True)
    assert choice.device == "cpu" and "no crc32c" in choice.reason
    assert _codecs.choose(plain, "gpu", gpu=True, nvcomp=None).device == "gpu"   # an output: encoded there
    checked = zarr.create_array(str(tmp_path / "c.zarr"), shape=(8, 4, 4), chunks=(4, 4, 4), dtype="f8",
                                compressors=[ZSTD(), zarr.codecs.Crc32cCodec()])
    assert _codecs.choose(checked, "gpu", gpu=True, nvcomp=None, reading=True).device == "gpu"


def test_a_memory_store_goes_to_the_host():
    array = zarr.create_array(zarr.storage.MemoryStore(), shape=(8, 4, 4), chunks=(4, 4, 4), dtype="f8")
    choice = _codecs.choose(array, "gpu", gpu=True, nvcomp=None)
    assert choice.device == "cpu" and "not a local folder" in choice.reason


def test_corrupt_crc32c_and_shard_index_are_named(tmp_path):
    x = _values((18, 5, 5))
    array = zarr.create_array(str(tmp_path / "a.zarr"), shape=x.shape, dtype=x.dtype, chunks=(3, 5, 5),
                              shards=(9, 5, 5), compressors=[ZSTD(), zarr.codecs.Crc32cCodec()])
    array[:] = x
    stored = _codecs.choose(array, "auto", gpu=True, nvcomp=None).stored
    path = stored.path(1)
    data = bytearray(open(path, "rb").read())
    data[5] ^= 0xFF   # inside the first chunk of shard 1
    open(path, "wb").write(bytes(data))
    with pytest.raises(ValueError, match=r"c/1/0/0 \(chunk 0 of the shard\) fails its CRC-32C"):
        _read_back(stored, 9, 18)
    data[-6] ^= 0xFF  # inside the index
    open(path, "wb").write(bytes(data))
    with pytest.raises(ValueError, match="index of shard .*c/1/0/0 fails its CRC-32C"):
        _codecs.plan_reads(stored, 9, 18)


OUTPUTS = {
    "zstd chunks": dict(chunks=(6, 5, 5)),
    "zstd sharded": dict(chunks=(2, 5, 5), shards=(6, 5, 5)),
    "lz4 chunks": dict(chunks=(6, 5, 5), codec="lz4"),
    "none sharded": dict(chunks=(3, 5, 5), shards=(6, 5, 5), codec="none"),
    "crc32c sharded": dict(chunks=(2, 5, 5), shards=(6, 5, 5), crc=True),
}


@pytest.mark.parametrize("layout", sorted(OUTPUTS))
def test_written_chunks_read_back_with_plain_zarr(tmp_path, layout):
    spec = dict(OUTPUTS[layout])
    codec = spec.pop("codec", "zstd")
    crc = spec.pop("crc", False)
    compressors = _codecs.output_compressors(codec)
    if crc:
        compressors = [compressors, zarr.codecs.Crc32cCodec()]
    x = _values((16, 5, 5))
    array = zarr.create_array(str(tmp_path / "o.zarr"), shape=x.shape, dtype=x.dtype, fill_value=np.nan,
                              compressors=compressors, **spec)
    stored = _codecs.choose(array, "gpu", gpu=True, nvcomp=None).stored
    assert stored is not None
    # encode each inner chunk (padded to whole chunks, as the GPU path does) with numcodecs
    inner = stored.inner
    padded = np.zeros((-(-16 // stored.unit) * stored.unit,) + x.shape[1:], x.dtype)
    padded[:16] = x
    frames, sizes = [], []
    for lo in range(0, padded.shape[0], inner):
        raw = padded[lo:lo + inner].tobytes()
        if stored.frames.algorithm == "zstd":
            frames.append(bytes(numcodecs.Zstd().encode(raw)))
        elif stored.frames.algorithm == "lz4":
            frames.append(bytes(numcodecs.LZ4().encode(raw))[4:])
        else:
            frames.append(raw)
        sizes.append(len(raw))
    _codecs.write_chunks(stored, 0, frames, sizes)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "o.zarr"), mode="r")[:], x)
