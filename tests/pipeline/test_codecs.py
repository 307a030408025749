"""The host half of the GPU codec path (pipeline.codecs, store._layout): which arrays go to the GPU and why, and the
stored bytes it reads and writes, checked against plain zarr-python with numcodecs standing in for
nvCOMP (the GPU half is tests/pipeline/test_gpu_codecs.py)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numcodecs
import numpy as np
import pytest
import zarr

from batchlu.pipeline.output import _group
from batchlu.pipeline.codecs import _choice, _frames, _reader, _writer
from batchlu.pipeline.config._choices import OUTPUT_CODECS
from batchlu.pipeline.store import _files, _layout

RNG = np.random.default_rng()
ZSTD = zarr.codecs.ZstdCodec


def _values(shape, dtype="f8"):
    return RNG.standard_normal(shape).astype(dtype)




def _read_back(stored: _layout.Stored, start: int, stop: int, pool=None) -> np.ndarray:
    """Matrices [start, stop) through plan_reads / read_frames / payload and numcodecs: what the GPU
    path does with nvCOMP."""
    reads = _reader.plan_reads(stored, start, stop)
    sizes = _reader.frame_sizes(reads)
    offsets, total = _reader.aligned(sizes)
    buffer = np.empty(max(total, 1), np.uint8)
    buffer[:] = 0xA5   # poison: every frame byte must be read
    _reader.read_frames(reads, sizes, offsets, buffer, pool)
    first = reads[0].first
    out = np.full((reads[-1].first + reads[-1].matrices - first,) + stored.shape[1:], np.nan, stored.dtype)
    flat = out.reshape(-1).view(np.uint8)
    for r, size, at in zip(reads, sizes, offsets):
        assert size > 0, r
        off, length = _frames.payload(stored.frames, buffer, at, size, r.label)
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
    "v3 lz4": dict(chunks=(7, 5, 5), compressors=_group.compressors("lz4")),
    "v2 zstd": dict(chunks=(7, 5, 5), zarr_format=2, compressors=numcodecs.Zstd(level=1)),
    "v2 lz4": dict(chunks=(7, 5, 5), zarr_format=2, compressors=numcodecs.LZ4()),
    "v2 none": dict(chunks=(7, 5, 5), zarr_format=2, compressors=None),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_gpu_decodable_layouts_read_back_as_zarr_does(tmp_path, layout):
    x = _values((40, 5, 5))
    array = zarr.create_array(str(tmp_path / "a.zarr"), shape=x.shape, dtype=x.dtype, **LAYOUTS[layout])
    array[:] = x
    choice = _choice.choose(array, "auto", gpu=True, nvcomp=None)
    assert choice.device == "gpu", choice.reason
    stored = choice.stored
    unit = stored.unit
    # whole stored objects, the last one partial (40 is not a multiple of 7 or 9)
    for start, stop in ((0, unit), (unit, 3 * unit), (4 * unit, 40)):
        got = _read_back(stored, start, min(stop, 40))
        np.testing.assert_array_equal(got, x[start:min(stop, 40)])


def test_shard_frames_read_in_threads_as_zarr_reads_them(tmp_path):
    """Back-to-back inner chunks of one shard are read by one preadv each run, in the pool's threads."""
    from concurrent.futures import ThreadPoolExecutor

    x = _values((1500, 3, 3))   # 500 inner chunks per shard file: runs longer than one call's buffers
    array = zarr.create_array(str(tmp_path / "a.zarr"), shape=x.shape, dtype=x.dtype, chunks=(1, 3, 3),
                              shards=(1200, 3, 3), compressors=[ZSTD(level=1), zarr.codecs.Crc32cCodec()])
    array[:] = x
    stored = _choice.choose(array, "auto", gpu=True, nvcomp=None).stored
    with ThreadPoolExecutor(3) as pool:
        np.testing.assert_array_equal(_read_back(stored, 0, 1500, pool), x)
        np.testing.assert_array_equal(_read_back(stored, 1200, 1500, pool), x[1200:])


def test_a_truncated_shard_names_the_chunk_that_ends_early(tmp_path):
    x = _values((18, 5, 5))
    array = zarr.create_array(str(tmp_path / "a.zarr"), shape=x.shape, dtype=x.dtype, chunks=(3, 5, 5),
                              shards=(9, 5, 5), compressors=[ZSTD(), zarr.codecs.Crc32cCodec()])
    array[:] = x
    stored = _choice.choose(array, "auto", gpu=True, nvcomp=None).stored
    reads = _reader.plan_reads(stored, 9, 18)   # the index is read before the file is cut
    path = stored.path(1)
    data = open(path, "rb").read()
    cut = reads[1].offset + 3   # three bytes into the shard's second chunk
    open(path, "wb").write(data[:cut])
    sizes = _reader.frame_sizes(reads)
    offsets, total = _reader.aligned(sizes)
    with pytest.raises(ValueError, match=r"c/1/0/0 \(chunk 1 of the shard\) ended after 3 of"):
        _reader.read_frames(reads, sizes, offsets, np.empty(total, np.uint8))


def test_big_endian_v2_goes_to_the_host(tmp_path):
    array = zarr.create_array(str(tmp_path / "a.zarr"), shape=(8, 4, 4), chunks=(4, 4, 4), dtype=">f8",
                              zarr_format=2, compressors=numcodecs.Zstd())
    choice = _choice.choose(array, "auto", gpu=True, nvcomp=None)
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
    choice = _choice.choose(array, "auto", gpu=True, nvcomp=None)
    assert choice.device == "cpu" and reason in choice.reason, choice


def test_settings_and_missing_nvcomp_choose_the_host(tmp_path):
    array = zarr.create_array(str(tmp_path / "a.zarr"), shape=(8, 4, 4), chunks=(4, 4, 4), dtype="f8")
    assert _choice.choose(array, "cpu", gpu=True, nvcomp=None).reason == "codec-device is cpu"
    assert _choice.choose(array, "auto", gpu=False, nvcomp=None).reason == "the run computes on the CPU"
    why = "nvCOMP is not installed on worker tcp://x (No module named 'nvidia.nvcomp')"
    assert _choice.choose(array, "gpu", gpu=True, nvcomp=why) == _choice.Choice("cpu", why)


def test_auto_routes_large_input_frames_and_encodes_large_output_frames_on_the_host(tmp_path):
    big = zarr.create_array(str(tmp_path / "big.zarr"), shape=(80, 128, 128), chunks=(40, 128, 128), dtype="f8")
    choice = _choice.choose(big, "auto", gpu=True, nvcomp=None, reading=True)
    assert choice.device == "gpu" and choice.route and "5 MiB frames: those that are compressed" in choice.reason
    output = _choice.choose(big, "auto", gpu=True, nvcomp=None)
    assert output.device == "cpu" and not output.route and "5 MiB are faster on the host" in output.reason
    for reading in (True, False):   # asked for: the GPU, every frame
        forced = _choice.choose(big, "gpu", gpu=True, nvcomp=None, reading=reading)
        assert forced.device == "gpu" and not forced.route
    small = zarr.create_array(str(tmp_path / "small.zarr"), shape=(80, 128, 128), chunks=(8, 128, 128), dtype="f8")
    assert not _choice.choose(small, "auto", gpu=True, nvcomp=None, reading=True).route
    sharded = zarr.create_array(str(tmp_path / "s.zarr"), shape=(80, 128, 128), chunks=(2, 128, 128),
                                shards=(40, 128, 128), dtype="f8")
    assert _choice.choose(sharded, "auto", gpu=True, nvcomp=None).device == "gpu"


def test_lz4_outputs_with_frames_over_nvcomps_limit_are_encoded_on_the_host(tmp_path):
    """nvCOMP's LZ4 encoder takes frames of 16 MiB at most: a larger output chunk goes to the host,
    an input chunk (decoded, no such limit) stays on the GPU."""
    big = zarr.create_array(str(tmp_path / "l.zarr"), shape=(300, 128, 128), chunks=(136, 128, 128), dtype="f8",
                            zarr_format=2, compressors=numcodecs.LZ4())
    choice = _choice.choose(big, "gpu", gpu=True, nvcomp=None)
    assert choice.device == "cpu" and "17 MiB are larger than nvCOMP's lz4 encoder takes (16 MiB)" in choice.reason
    fits = zarr.create_array(str(tmp_path / "f.zarr"), shape=(300, 128, 128), chunks=(128, 128, 128), dtype="f8",
                             zarr_format=2, compressors=numcodecs.LZ4())
    assert _choice.choose(fits, "gpu", gpu=True, nvcomp=None).device == "gpu"
    zstd = zarr.create_array(str(tmp_path / "z.zarr"), shape=(300, 128, 128), chunks=(136, 128, 128), dtype="f8")
    assert _choice.choose(zstd, "gpu", gpu=True, nvcomp=None).device == "gpu"


def test_nvcomp_missing_says_why_in_one_line(monkeypatch):
    """Without nvCOMP's C library (or with another major version) the workers report why, in one line."""
    import sys
    import types

    from batchlu.pipeline.codecs import _nvcomp

    monkeypatch.setitem(sys.modules, "nvidia.libnvcomp", None)
    _nvcomp.library.cache_clear()
    try:
        why = _nvcomp.missing()
        assert why.startswith("nvCOMP is not installed on the workers (Expected the nvidia-libnvcomp-cu12")
        assert "\n" not in why
        fake = types.ModuleType("nvidia.libnvcomp")
        fake.__version__ = "5.1.0"
        fake.load_library = lambda: None
        monkeypatch.setitem(sys.modules, "nvidia.libnvcomp", fake)
        monkeypatch.setitem(sys.modules, "nvidia", types.SimpleNamespace(libnvcomp=fake))
        _nvcomp.library.cache_clear()
        assert "Expected nvCOMP 6 (nvidia-libnvcomp-cu1x==6.*). Got 5.1.0 instead." in _nvcomp.missing()
    finally:
        _nvcomp.library.cache_clear()


def test_zstd_inputs_without_crc32c_decode_on_the_gpu_lz4_ones_on_the_host(tmp_path):
    plain = zarr.create_array(str(tmp_path / "p.zarr"), shape=(8, 4, 4), chunks=(4, 4, 4), dtype="f8")
    choice = _choice.choose(plain, "gpu", gpu=True, nvcomp=None, reading=True)
    assert choice.device == "gpu" and "frames checked on the host" in choice.reason
    lz4 = zarr.create_array(str(tmp_path / "l.zarr"), shape=(8, 4, 4), chunks=(4, 4, 4), dtype="f8",
                            zarr_format=2, compressors=numcodecs.LZ4())
    choice = _choice.choose(lz4, "gpu", gpu=True, nvcomp=None, reading=True)
    assert choice.device == "cpu" and "no crc32c" in choice.reason
    assert _choice.choose(lz4, "gpu", gpu=True, nvcomp=None).device == "gpu"   # an output: encoded there
    checked = zarr.create_array(str(tmp_path / "c.zarr"), shape=(8, 4, 4), chunks=(4, 4, 4), dtype="f8",
                                compressors=[ZSTD(), zarr.codecs.Crc32cCodec()])
    assert _choice.choose(checked, "gpu", gpu=True, nvcomp=None, reading=True).device == "gpu"


@pytest.mark.parametrize("data", ["normal", "rounded", "tiny"])
@pytest.mark.parametrize("level, checksum", [(0, False), (3, True), (19, False)])
def test_zstd_check_passes_whole_frames_and_catches_every_cut(data, level, checksum):
    values = {"normal": _values(70_000), "rounded": np.round(_values(70_000), 2), "tiny": _values(3)}[data]
    raw = values.tobytes()
    frame = np.frombuffer(numcodecs.Zstd(level=level, checksum=checksum).encode(raw), np.uint8)
    padded = np.concatenate((np.full(5, 7, np.uint8), frame, np.full(9, 7, np.uint8)))   # at an offset
    _frames.zstd_check(padded, 5, frame.size, len(raw), "c/0")
    for cut in sorted({1, 2, 3, 4, 5, frame.size // 2, frame.size - 6} - {0}):
        if 0 < cut < frame.size:
            with pytest.raises(ValueError, match="c/0"):
                _frames.zstd_check(padded, 5, frame.size - cut, len(raw), "c/0")
    with pytest.raises(ValueError, match="bytes after its zstd frame"):
        _frames.zstd_check(padded, 5, frame.size + 4, len(raw), "c/0")
    with pytest.raises(ValueError, match=f"declares {len(raw)} bytes; its matrices take {len(raw) + 8}"):
        _frames.zstd_check(padded, 5, frame.size, len(raw) + 8, "c/0")
    damaged = padded.copy()
    damaged[5 + 4] |= 0x08
    with pytest.raises(ValueError, match="damaged zstd frame header"):
        _frames.zstd_check(damaged, 5, frame.size, len(raw), "c/0")
    damaged = padded.copy()
    damaged[5:9] = 0
    with pytest.raises(ValueError, match="not a zstd frame"):
        _frames.zstd_check(damaged, 5, frame.size, len(raw), "c/0")


def test_a_truncated_zstd_chunk_without_crc32c_is_named_before_decoding(tmp_path):
    x = _values((21, 5, 5))
    array = zarr.create_array(str(tmp_path / "a.zarr"), shape=x.shape, dtype=x.dtype, chunks=(7, 5, 5))
    array[:] = x
    stored = _choice.choose(array, "gpu", gpu=True, nvcomp=None, reading=True).stored
    path = stored.path(1)
    data = open(path, "rb").read()
    open(path, "wb").write(data[:len(data) - 5])
    reads = _reader.plan_reads(stored, 7, 14)
    sizes = _reader.frame_sizes(reads)
    offsets, total = _reader.aligned(sizes)
    buffer = np.empty(total, np.uint8)
    _reader.read_frames(reads, sizes, offsets, buffer)
    with pytest.raises(ValueError, match=r"the chunk c/1/0/0 .*(truncated|ends inside)"):
        offset, length = _frames.payload(stored.frames, buffer, offsets[0], sizes[0], reads[0].label)
        _frames.zstd_check_many(buffer, [offset], [length], 7 * stored.matrix_bytes, [reads[0].label])


def test_a_memory_store_goes_to_the_host():
    array = zarr.create_array(zarr.storage.MemoryStore(), shape=(8, 4, 4), chunks=(4, 4, 4), dtype="f8")
    choice = _choice.choose(array, "gpu", gpu=True, nvcomp=None)
    assert choice.device == "cpu" and "not a local folder" in choice.reason


def test_corrupt_crc32c_and_shard_index_are_named(tmp_path):
    x = _values((18, 5, 5))
    array = zarr.create_array(str(tmp_path / "a.zarr"), shape=x.shape, dtype=x.dtype, chunks=(3, 5, 5),
                              shards=(9, 5, 5), compressors=[ZSTD(), zarr.codecs.Crc32cCodec()])
    array[:] = x
    stored = _choice.choose(array, "auto", gpu=True, nvcomp=None).stored
    path = stored.path(1)
    data = bytearray(open(path, "rb").read())
    data[5] ^= 0xFF   # inside the first chunk of shard 1
    open(path, "wb").write(bytes(data))
    with pytest.raises(ValueError, match=r"c/1/0/0 \(chunk 0 of the shard\) fails its CRC-32C"):
        _read_back(stored, 9, 18)
    data[-6] ^= 0xFF  # inside the index
    open(path, "wb").write(bytes(data))
    with pytest.raises(ValueError, match="index of shard .*c/1/0/0 fails its CRC-32C"):
        _reader.plan_reads(stored, 9, 18)


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
    compressors = _group.compressors(codec)
    if crc:
        compressors = [compressors, zarr.codecs.Crc32cCodec()]
    x = _values((16, 5, 5))
    array = zarr.create_array(str(tmp_path / "o.zarr"), shape=x.shape, dtype=x.dtype, fill_value=np.nan,
                              compressors=compressors, **spec)
    stored = _choice.choose(array, "gpu", gpu=True, nvcomp=None).stored
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
    _writer.write_chunks(stored, 0, frames, sizes)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "o.zarr"), mode="r")[:], x)


def test_write_file_writes_every_part_in_order(tmp_path):
    """write_file: parts of every size (empty ones, more parts than one writev takes) land in order,
    through a temporary file renamed into place (none left behind)."""
    rng = np.random.default_rng()
    parts = [rng.integers(0, 256, int(rng.integers(0, 3000)), dtype=np.uint8) for _ in range(2 * _files.IOV_MAX + 7)]
    parts[3] = b""
    parts[10] = bytes(rng.integers(0, 256, 100, dtype=np.uint8))
    path = tmp_path / "d" / "c" / "0"
    _files.write_file(str(path), parts)
    assert path.read_bytes() == b"".join(bytes(p) for p in parts)
    assert sorted(p.name for p in path.parent.iterdir()) == ["0"]


def _first_block_header(frame: np.ndarray) -> int:
    """Where a zstd frame's first block header starts: after the magic number, the frame header
    descriptor, the window descriptor, the dictionary id and the content size (RFC 8878, 3.1.1.1)."""
    descriptor = int(frame[4])
    single, did, fcs_flag = descriptor >> 5 & 1, descriptor & 3, descriptor >> 6
    return 5 + (1 - single) + (0, 1, 2, 4)[did] + (single, 2, 4, 8)[fcs_flag]


def _outcome(check, *args) -> str:
    """"ok", or the message of the ValueError ``check(*args)`` raised."""
    try:
        check(*args)
    except ValueError as exc:
        return str(exc)
    return "ok"


@pytest.mark.parametrize("data", ["normal", "rounded", "tiny"])
def test_zstd_check_many_agrees_with_zstd_check_on_every_frame(data):
    """The vectorised check passes exactly the frames the one-frame check passes, and raises its
    message for the first frame that fails: each of a group's frames in turn cut short, run on by
    trailing bytes, declaring another size, with a damaged frame header, magic number or block
    header; and two frames damaged at once."""
    rng = np.random.default_rng(["normal", "rounded", "tiny"].index(data))
    frames, wants = [], []
    for level, checksum in [(0, False), (3, True), (19, False), (1, False)]:
        values = {"normal": rng.standard_normal(int(rng.integers(1, 70_000))),
                  "rounded": np.round(rng.standard_normal(70_000), 2), "tiny": rng.standard_normal(3)}[data]
        wants.append(values.nbytes)
        frames.append(np.frombuffer(numcodecs.Zstd(level=level, checksum=checksum).encode(values.tobytes()), np.uint8))
    labels = [f"c/{i}" for i in range(len(frames))]

    def variants(f, want):
        """(what, frame bytes, declared size) of frame ``f``: whole, then each fault."""
        yield "whole", f, want
        for cut in sorted({1, 3, 5, f.size // 2, f.size - 6}):
            if 0 < cut < f.size:
                yield f"cut by {cut}", f[:f.size - cut], want
        for extra in (1, 4, 9):
            yield f"{extra} trailing bytes", np.concatenate((f, rng.integers(0, 256, extra, np.uint8))), want
        yield "another size", f, want + 8
        for what, at, bits in (("frame header", 4, 0x08), ("magic number", 0, 0xFF),
                               ("block header", _first_block_header(f), 0x06)):
            damaged = f.copy()
            damaged[at] |= bits
            yield f"damaged {what}", damaged, want

    def group(parts):
        """The frames packed as the GPU path packs them (aligned, padding poisoned): buffer, offsets, sizes."""
        sizes = [p.size for p in parts]
        offsets, total = _reader.aligned(sizes)
        buffer = np.full(total + 7, 7, np.uint8)
        for p, at in zip(parts, offsets):
            buffer[at:at + p.size] = p
        return buffer, offsets, sizes

    checked = {"ok": 0, "refused": 0}
    for i in range(len(frames)):
        for what, part, want in variants(frames[i], wants[i]):
            parts = frames[:i] + [part] + frames[i + 1:]
            buffer, offsets, sizes = group(parts)
            declared = wants[:i] + [want] + wants[i + 1:]
            one = _outcome(_frames.zstd_check, buffer, offsets[i], sizes[i], want, labels[i])
            many = _outcome(_frames.zstd_check_many, buffer, offsets, sizes, declared, labels)
            assert many == one, (what, labels[i])
            assert (one == "ok") == (what == "whole") and (one == "ok" or labels[i] in one), (what, one)
            checked["ok" if one == "ok" else "refused"] += 1
            if what != "whole" and i + 1 < len(frames):   # a later frame cut short too: the first is named
                buffer, offsets, sizes = group(parts[:-1] + [frames[-1][:-3]])
                assert _outcome(_frames.zstd_check_many, buffer, offsets, sizes, declared, labels) == one
    assert checked["ok"] == len(frames) and checked["refused"] >= 10 * len(frames), checked


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_gaps_from_the_reads_are_the_stores(tmp_path, layout):
    """The GPU codec path finds missing chunks from the reads it plans (shard indexes, chunk sizes):
    the same gaps as the store's own lookup, for chunk files, whole shards and inner chunks; a chunk
    stored with no bytes is a corrupt frame, never zeros."""
    from batchlu.pipeline.store import _missing

    x = _values((40, 5, 5))
    x[9:12] = 0   # an inner chunk of fill values: zarr leaves it out of its shard
    array = zarr.create_array(str(tmp_path / "a.zarr"), shape=x.shape, dtype=x.dtype, fill_value=0, **LAYOUTS[layout])
    array[:] = x
    stored = _choice.choose(array, "gpu", gpu=True, nvcomp=None).stored
    os.remove(stored.path(2))   # a whole chunk file, or a whole shard
    for start, stop in ((0, 40), (stored.unit, 3 * stored.unit), (0, stored.unit)):
        reads = _reader.plan_reads(stored, start, stop)
        got = _reader.gaps(stored, reads, _reader.frame_sizes(reads))
        want = _missing.find(array, start, stop)
        assert sorted(got, key=lambda g: (g.lo, g.key)) == want
        assert any(g.lo == 2 * stored.unit for g in want) == (start <= 2 * stored.unit < stop)
    path = stored.path(1)
    open(path, "wb").close()   # stored, with no bytes
    reads = _reader.plan_reads(stored, 0, 40) if not stored.sharded else None
    if reads is not None:
        with pytest.raises(ValueError, match=r"is stored with no bytes"):
            _reader.gaps(stored, reads, _reader.frame_sizes(reads))
    else:
        with pytest.raises(ValueError, match="fewer than its index"):
            _reader.plan_reads(stored, 0, 40)


CHECKSUMMED = {   # batchlu's output layouts with batchlu.output-checksum crc32c, the shipped default
    f"{codec} {layout}": (codec, grid) for codec in OUTPUT_CODECS if codec != "auto"   # auto: one of these
    for layout, grid in (("chunks", dict(chunks=(6, 5, 5))), ("sharded", dict(chunks=(2, 5, 5), shards=(6, 5, 5))))
}


def _encode(stored: _layout.Stored, values: np.ndarray) -> tuple[list, list]:
    """The frames of ``values`` (whole inner chunks, the last one padded as the GPU path pads it), as
    nvCOMP encodes them, with numcodecs standing in: numcodecs' Zstd(level=0) and LZ4 are what zarr
    writes, so the files come out byte for byte as zarr's."""
    padded = np.zeros((-(-values.shape[0] // stored.inner) * stored.inner,) + values.shape[1:], values.dtype)
    padded[:values.shape[0]] = values
    frames, sizes = [], []
    for lo in range(0, padded.shape[0], stored.inner):
        raw = padded[lo:lo + stored.inner].tobytes()
        if stored.frames.algorithm == "zstd":
            frames.append(np.frombuffer(numcodecs.Zstd(level=0).encode(raw), np.uint8))
        elif stored.frames.algorithm == "lz4":
            frames.append(np.frombuffer(numcodecs.LZ4().encode(raw), np.uint8)[4:])   # nvCOMP: no size header
        else:
            frames.append(np.frombuffer(raw, np.uint8))
        sizes.append(len(raw))
    return frames, sizes


def _stored_files(root) -> dict[str, bytes]:
    return {os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
            for d, _, names in os.walk(root) for f in names if f != "zarr.json"}


@pytest.mark.parametrize("library", ["crc32c", "google_crc32c"])
def test_crc32c_gives_zarrs_value_with_either_library(monkeypatch, library):
    """_frames.crc32c with the GIL-free ``crc32c`` package and, where it is not installed, with
    ``google_crc32c`` (zarr's codec's own): zarr's trailer value on fresh random bytes, whole and
    continued across pieces of odd lengths, from bytes, arrays and memoryviews alike."""
    import sys

    import google_crc32c

    pytest.importorskip(library)
    if library == "google_crc32c":   # as on a machine without the crc32c package
        monkeypatch.setitem(sys.modules, "crc32c", None)
    monkeypatch.setattr(_frames, "_EXTEND", None)
    data = np.random.default_rng().integers(0, 256, 100_003, dtype=np.uint8)
    want = int.from_bytes(google_crc32c.Checksum(data.tobytes()).digest(), "big")
    assert _frames.crc32c(data) == _frames.crc32c(data.tobytes()) == _frames.crc32c(memoryview(data)) == want
    crc = 0
    for lo, hi in [(0, 1), (1, 4097), (4097, 50_000), (50_000, 100_003)]:
        crc = _frames.crc32c(data[lo:hi], crc)
    assert crc == want
    used = _frames._crc32c_extend()
    assert (used is google_crc32c.extend) == (library == "google_crc32c")


@pytest.mark.parametrize("layout", sorted(CHECKSUMMED))
def test_the_host_writer_appends_crc32c_trailers_as_zarr_does(tmp_path, layout):
    """The chunk and shard writer of the GPU codec lane (write_chunks) with zarr's crc32c codec last:
    every chunk file and shard (chunk trailers and the index's) is byte for byte the one zarr writes
    for the same values, and plain zarr reads the values back bit for bit, through its checksums."""
    codec, grid = CHECKSUMMED[layout]
    x = _values((16, 5, 5))   # 16: the last chunk (and shard) partial, padded with zeros as the GPU path pads it
    make = dict(shape=x.shape, dtype=x.dtype, fill_value=0, config={"write_empty_chunks": True},
                compressors=_group.compressors(codec, "crc32c"), **grid)
    reference = zarr.create_array(str(tmp_path / "zarr.zarr"), **make)
    reference[:] = x
    array = zarr.create_array(str(tmp_path / "ours.zarr"), **make)
    stored = _choice.choose(array, "gpu", gpu=True, nvcomp=None).stored
    assert stored is not None and stored.frames.crc32c and stored.frames.algorithm == codec
    frames, sizes = _encode(stored, x)
    with ThreadPoolExecutor(2) as pool:   # as the GPU lane writes: in I/O threads, trailers there
        for future in _writer.write_chunks(stored, 0, frames, sizes, pool):
            future.result()
    ours, theirs = _stored_files(tmp_path / "ours.zarr"), _stored_files(tmp_path / "zarr.zarr")
    assert sorted(ours) == sorted(theirs) and len(ours) == 3
    for name in ours:
        assert ours[name] == theirs[name], name
    back = np.asarray(zarr.open_array(str(tmp_path / "ours.zarr"), mode="r")[:])
    assert back.dtype == x.dtype and back.shape == x.shape and back.tobytes() == x.tobytes()


@pytest.mark.parametrize("layout", sorted(CHECKSUMMED))
def test_faults_names_each_stored_object_that_fails_its_checksums(tmp_path, layout):
    """What resume checks in the recorded chunks of an output with crc32c: a flipped payload byte, a
    truncated file, a damaged shard index; each named, the sound ones passed, none decoded."""
    codec, grid = CHECKSUMMED[layout]
    x = _values((30, 5, 5))
    array = zarr.create_array(str(tmp_path / "o.zarr"), shape=x.shape, dtype=x.dtype,
                              compressors=_group.compressors(codec, "crc32c"), **grid)
    array[:] = x
    stored, _ = _layout.describe(array)
    assert _frames.faults(stored, range(5)) == {}
    flipped, cut = bytearray(open(stored.path(1), "rb").read()), open(stored.path(3), "rb").read()
    flipped[len(flipped) // 3] ^= 0x01          # a payload byte (a value, or the compressed frame)
    open(stored.path(1), "wb").write(bytes(flipped))
    open(stored.path(3), "wb").write(cut[:len(cut) // 2])
    os.remove(stored.path(4))                    # not stored: the caller's own check names it
    found = _frames.faults(stored, range(5))
    assert sorted(found) == [1, 3]
    assert "fails its CRC-32C" in found[1] and ("chunk" in found[1]) == stored.sharded
    if stored.sharded:
        index = bytearray(open(stored.path(2), "rb").read())
        index[-7] ^= 0x10
        open(stored.path(2), "wb").write(bytes(index))
        assert _frames.faults(stored, [0, 2]) == {2: "has a shard index that fails its CRC-32C"}
    without = zarr.create_array(str(tmp_path / "plain.zarr"), shape=x.shape, dtype=x.dtype,
                                compressors=_group.compressors(codec), **grid)
    assert not _layout.describe(without)[0].frames.crc32c and _frames.faults(_layout.describe(without)[0], [0]) == {}
