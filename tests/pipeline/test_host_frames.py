"""The host half of the codec path (batchlu.pipeline.codecs._host), which CPU runs take by default:
inputs read from their chunk files give zarr's values bit for bit, outputs written as chunk files
are the files zarr writes byte for byte, whatever the path cannot do exactly is declined (zarr does
it), and whole runs give the outputs of zarr's pipeline (``io-engine zarr``), the corrupt and missing
chunks named as before."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ShardingCodec, ZstdCodec

import batchlu
from batchlu.errors import CorruptInputError, FrameError, MissingChunkError
from batchlu.pipeline.codecs import _host, _reader
from batchlu.pipeline.store._layout import describe
from batchlu.testing import matrices
from batchlu.testing.ratios import THRESHOLD, get03

N, COUNT, CHUNK = 5, 45, 7   # 7 chunks, the last of 3 matrices
CONFIG = {"cluster.dashboard-address": "127.0.0.1:0"}


def _values(dtype="float64", count=COUNT, seed=41, special=True) -> np.ndarray:
    """Fresh random matrices, with a rounded (compressible) block and (``special``) the values a copy
    could get wrong in the first: NaN, infinities, -0.0."""
    a = matrices.generate("random", N, dtype, seed=seed, start=0, stop=count)
    real = a.view(np.finfo(a.dtype).dtype)
    if special:
        real[0, 0, :4] = [np.nan, np.inf, -np.inf, -0.0]
    real[20:30] = np.round(real[20:30], 1) + np.eye(N)   # well away from singular
    return a


# each input layout a user may have written, zarr-python's own way
LAYOUTS = {
    "zstd": dict(compressors=ZstdCodec()),                         # zarr's default: no checksum
    "zstd-crc32c": dict(compressors=[ZstdCodec(level=3), Crc32cCodec()]),
    "raw": dict(compressors=None),
    "raw-crc32c": dict(compressors=[Crc32cCodec()]),
    "sharded-zstd": dict(shards=(4 * CHUNK, N, N), compressors=[ZstdCodec(), Crc32cCodec()]),
    "v2-zstd": dict(zarr_format=2, compressors=None),              # made below with numcodecs' Zstd
}


def _input(path, layout: str, values: np.ndarray):
    kwargs = dict(LAYOUTS[layout])
    if layout == "v2-zstd":
        from numcodecs import Zstd

        kwargs["compressors"] = Zstd()
    array = zarr.create_array(str(path), shape=values.shape, dtype=values.dtype, chunks=(CHUNK, N, N), **kwargs)
    array[...] = values
    return zarr.open_array(str(path), mode="r")


def _poisoned(shape, dtype) -> np.ndarray:
    out = np.empty(shape, dtype)
    out.view(np.uint8)[...] = 0xA5    # no value of the input: every element must be written
    return out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_reads_the_values_zarr_reads_bit_for_bit(tmp_path, layout):
    values = _values()
    array = _input(tmp_path / "in.zarr", layout, values)
    stored = _host.arrays({"a": array}, {}).get("a")
    assert stored is not None, describe(array)[1]
    # whole chunks; a range that starts and ends inside chunks; the array's last, partial chunk
    for start, stop in ((0, 14), (3, 30), (28, COUNT), (44, COUNT)):
        out = _poisoned((stop - start, N, N), values.dtype)
        assert _host.read(stored, start, stop, out)
        assert out.tobytes() == np.asarray(array[start:stop]).tobytes() == values[start:stop].tobytes()


def _chunk_file(array, index: int) -> pathlib.Path:
    stored, _ = describe(array)
    return pathlib.Path(stored.path(index))


def test_declines_a_chunk_not_stored_or_failing_its_checks(tmp_path):
    values = _values()
    out = _poisoned((14, N, N), values.dtype)
    crc = _input(tmp_path / "crc.zarr", "zstd-crc32c", values)
    stored = _host.arrays({"a": crc}, {})["a"]
    assert _host.read(stored, 0, 14, out)
    path = _chunk_file(crc, 1)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10                      # a flipped bit: the CRC-32C fails
    path.write_bytes(bytes(data))
    assert not _host.read(stored, 0, 14, out)
    path.unlink()                                      # not stored: zarr's fill value and missing rules
    assert not _host.read(stored, 0, 14, out)
    # a frame with a good CRC-32C that declares fewer bytes than the chunk's: numcodecs would decode
    # only those, leaving the rest of the batch's buffer as it was
    from numcodecs import Zstd

    from batchlu.pipeline.codecs._frames import crc32c

    short = Zstd().encode(values[7:13].tobytes())
    path.write_bytes(short + crc32c(short).to_bytes(4, "little"))
    assert not _host.read(stored, 0, 14, out)

    plain = _input(tmp_path / "zstd.zarr", "zstd", values)
    stored = _host.arrays({"a": plain}, {})["a"]
    path = _chunk_file(plain, 0)
    path.write_bytes(path.read_bytes()[:-9])          # a zstd frame cut short, no checksum to catch it
    assert not _host.read(stored, 0, 7, out[:7])


def test_takes_only_what_it_reads_and_writes_exactly(tmp_path):
    values = _values()
    blosc = zarr.create_array(str(tmp_path / "blosc.zarr"), shape=values.shape, dtype=values.dtype,
                              chunks=(CHUNK, N, N), compressors=BloscCodec())
    zstd = _input(tmp_path / "zstd.zarr", "zstd", values)
    sharded = _input(tmp_path / "sharded.zarr", "sharded-zstd", values)
    raw_sharded = zarr.create_array(str(tmp_path / "rs.zarr"), shape=values.shape, dtype=values.dtype,
                                    chunks=(CHUNK, N, N), shards=(2 * CHUNK, N, N), compressors=None)
    found = _host.arrays({"a": blosc, "b": sharded}, {"inv": zstd, "x": raw_sharded, "lu": _output(tmp_path, "lu")})
    assert sorted(found) == ["b", "lu"]    # blosc: zarr's; outputs: raw chunk files only


def _output(tmp_path, name: str, count: int = COUNT):
    """An output array as batchlu makes floats by default: raw bytes with their crc32c, NaN fill,
    every chunk stored."""
    return zarr.create_array(str(tmp_path / f"{name}.zarr"), shape=(count, N, N), dtype="float64",
                             chunks=(CHUNK, N, N), fill_value=np.nan, serializer=BytesCodec(),
                             compressors=[Crc32cCodec()], config={"write_empty_chunks": True})


def test_writes_the_chunk_files_zarr_writes_byte_for_byte(tmp_path):
    values = _values()
    ours, theirs = _output(tmp_path, "ours"), _output(tmp_path, "theirs")
    stored = _host.arrays({}, {"x": ours})["x"]
    for start, stop in ((0, 14), (14, 35), (35, COUNT)):   # whole chunks, then the partial last one
        assert _host.write(stored, start, stop, values[start:stop], ours.fill_value)
        theirs[start:stop] = values[start:stop]
    for index in range(-(-COUNT // CHUNK)):
        assert _chunk_file(ours, index).read_bytes() == _chunk_file(theirs, index).read_bytes(), index
    assert np.asarray(zarr.open_array(str(tmp_path / "ours.zarr"), mode="r")[...]).tobytes() == values.tobytes()
    assert not _host.write(stored, 3, 14, values[3:14], np.nan)     # not whole chunks: zarr writes it
    assert not _host.write(stored, 0, 10, values[:10], np.nan)
    assert not list(tmp_path.glob("ours.zarr/**/.batchlu-*"))       # no temporary file left


def _run(source, out, config=None, **kwargs):
    return batchlu.run(str(source), str(out), backend="cpu", progress=False, config={**CONFIG, **(config or {})},
                       **kwargs)


@pytest.mark.parametrize("layout", ["zstd", "sharded-zstd", "raw-crc32c"])
def test_a_cpu_run_gives_zarrs_outputs_bit_for_bit(tmp_path, layout, monkeypatch):
    values = _values(seed=43, special=False)   # every matrix inverted
    _input(tmp_path / "in.zarr", layout, values)
    taken = []
    read = _host.read
    monkeypatch.setattr(_host, "read", lambda *a: taken.append(read(*a)) or taken[-1])
    _run(tmp_path / "in.zarr", tmp_path / "frames.zarr", op="inv")
    assert taken and all(taken)                                     # the frames path read every batch
    frames_reads = len(taken)
    _run(tmp_path / "in.zarr", tmp_path / "zarr.zarr", op="inv", config={"io-engine": "zarr"})
    assert len(taken) == frames_reads                               # ... and io-engine zarr read none
    for name in ("inv", "info"):
        got = np.asarray(zarr.open_array(str(tmp_path / "frames.zarr"), path=name, mode="r")[...])
        ref = np.asarray(zarr.open_array(str(tmp_path / "zarr.zarr"), path=name, mode="r")[...])
        assert got.tobytes() == ref.tobytes(), name
    info = np.asarray(zarr.open_array(str(tmp_path / "frames.zarr"), path="info", mode="r")[...])
    assert (info == 0).all()
    assert get03(values, np.asarray(zarr.open_array(str(tmp_path / "frames.zarr"), path="inv")[...])).max() < THRESHOLD
    assert batchlu.verify(str(tmp_path / "in.zarr"), str(tmp_path / "frames.zarr")).ok


def test_a_corrupt_or_missing_chunk_is_named_as_before(tmp_path):
    values = _values(seed=47)
    array = _input(tmp_path / "in.zarr", "zstd-crc32c", values)
    path = _chunk_file(array, 2)
    data = bytearray(path.read_bytes())
    data[10] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptInputError, match=r"c/2/0/0"):
        _run(tmp_path / "in.zarr", tmp_path / "out1.zarr", op="inv")
    os.unlink(path)
    with pytest.raises(MissingChunkError, match=r"c/2/0/0"):
        _run(tmp_path / "in.zarr", tmp_path / "out2.zarr", op="inv")


@pytest.mark.parametrize("entry", [(0, 1 << 62), (1 << 63, 100), (0, 1 << 40)])
def test_a_shard_index_listing_bytes_past_the_end_is_one_error(tmp_path, entry):
    """An index that passes its CRC-32C but lists (offset, nbytes) beyond the shard's end (a buggy
    writer): declined here (the read buffer would be sized by the entry, or preadv's offset overflow),
    and the run ends in one CorruptInputError naming the shard, as zarr reads it."""
    from batchlu.pipeline.codecs._frames import crc32c

    values = _values(seed=53, special=False)
    array = _input(tmp_path / "in.zarr", "sharded-zstd", values)
    stored = _host.arrays({"a": array}, {})["a"]
    path = _chunk_file(array, 0)
    data = bytearray(path.read_bytes())
    size = 16 * 4 + 4
    index = np.frombuffer(bytes(data[-size:-4]), "<u8").copy().reshape(4, 2)
    index[1] = entry
    data[-size:] = index.tobytes() + crc32c(index.tobytes()).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    assert not _host.read(stored, 0, 28, _poisoned((28, N, N), values.dtype))
    with pytest.raises(FrameError, match="lists chunk 1 .* beyond its end"):   # the GPU path's reader
        _reader.shard_index(stored, 0)
    with pytest.raises(CorruptInputError, match="c/0/0/0"):
        _run(tmp_path / "in.zarr", tmp_path / "out.zarr", op="inv")


@pytest.mark.parametrize("layout", ["raw-crc32c", "zstd"])
def test_a_chunk_file_far_larger_than_its_frame_is_declined(tmp_path, layout):
    """A chunk file extended to a terabyte (sparse): declined before any buffer is sized by it (the
    thread's read buffer is kept from batch to batch), not a MemoryError."""
    values = _values(seed=59, special=False)
    array = _input(tmp_path / "in.zarr", layout, values)
    stored = _host.arrays({"a": array}, {})["a"]
    os.truncate(_chunk_file(array, 2), 1 << 40)
    assert not _host.read(stored, 14, 21, _poisoned((7, N, N), values.dtype))
    assert _host.read(stored, 0, 14, _poisoned((14, N, N), values.dtype))   # its neighbours still read
    os.unlink(_chunk_file(array, 2))


@pytest.mark.parametrize("engine", ["auto", "zarr"])
def test_an_empty_shard_file_is_corrupt_not_the_fill_value(tmp_path, engine):
    """zarr reads a shard file of no bytes as every chunk of it not stored (the fill value), and the
    missing-chunk check found no gap in it: the run computed from the fill value, "complete", verify
    OK (found by an adversarial pass)."""
    values = _values(seed=61, special=False)
    array = _input(tmp_path / "in.zarr", "sharded-zstd", values)
    _chunk_file(array, 0).write_bytes(b"")
    with pytest.raises(CorruptInputError, match="c/0/0/0"):
        _run(tmp_path / "in.zarr", tmp_path / "out.zarr", op="inv", config={"io-engine": engine})


def test_output_chunk_files_get_the_mode_zarr_gives_them(tmp_path):
    """Chunk files this path writes go through a temporary file (mkstemp: 0600) renamed into place:
    they get the mode zarr's own writes get (0666 less the umask), as the output's metadata has."""
    import stat

    values = _values(seed=67, special=False)
    _input(tmp_path / "in.zarr", "zstd", values)
    _run(tmp_path / "in.zarr", tmp_path / "out.zarr", op="inv")
    mask = os.umask(0o022)
    os.umask(mask)
    files = [p for p in (tmp_path / "out.zarr" / "inv").rglob("*") if p.is_file()]
    assert len(files) == 1 + -(-COUNT // CHUNK)         # zarr.json and each chunk file
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o666 & ~mask}
    everything = {stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "out.zarr").rglob("*") if p.is_file()}
    assert everything == {0o666 & ~mask}, sorted(oct(m) for m in everything)   # the ledger's records too


def test_write_file_gives_the_mode_zarr_gives(tmp_path):
    """Every file written whole (the GPU path's chunk files, the ledger's records) goes through
    ``write_file``'s temporary file (mkstemp: 0600); it must end with zarr's mode, under any umask."""
    import stat

    from batchlu.pipeline.store import _files

    old = os.umask(0o027)
    try:
        _files._MODE = None
        _files.write_file(str(tmp_path / "a" / "f"), [b"xy", np.arange(3)])
        assert stat.S_IMODE((tmp_path / "a" / "f").stat().st_mode) == 0o640
        assert (tmp_path / "a" / "f").read_bytes() == b"xy" + np.arange(3).tobytes()
    finally:
        os.umask(old)
        _files._MODE = None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("layout", ["zstd", "sharded-zstd"])
@pytest.mark.parametrize("policy", ["error", "fill"])
def test_a_named_pipe_in_the_input_is_one_error_not_a_hang(tmp_path, policy, layout):
    """A FIFO in place of a chunk (or shard) file: the input's signature opened every file of the
    folder, and (``missing-chunks: fill``) zarr's read of it, each waiting for a writer forever. Only
    regular files are signed, and the pipe is a corrupt input, whatever the policy. The GPU path's
    reader, which opens a shard to read its index, refuses it too."""
    values = _values(seed=73, special=False)
    array = _input(tmp_path / "in.zarr", layout, values)
    path = _chunk_file(array, 1 if layout.startswith("sharded") else 4)
    if layout.startswith("sharded"):
        stored = _host.arrays({"a": array}, {})["a"]
        path.unlink()
        os.mkfifo(path)
        with pytest.raises(FrameError, match="not a regular file"):
            _reader.shard_index(stored, 1)
        with pytest.raises(CorruptInputError, match="named pipe"):
            _run(tmp_path / "in.zarr", tmp_path / "out.zarr", op="inv", config={"missing-chunks": policy})
        return
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(CorruptInputError, match="named pipe"):
        _run(tmp_path / "in.zarr", tmp_path / "out.zarr", op="inv", config={"missing-chunks": policy})


@pytest.mark.timeout(120)
def test_a_named_pipe_in_the_input_after_the_run_is_verifys_one_error_not_a_hang(tmp_path):
    """verify read each block before it asked the store about it, so a pipe in place of an input
    chunk hung it (a run refuses the same pipe in one line)."""
    values = _values(seed=74, special=False)
    _input(tmp_path / "in.zarr", "zstd", values)
    _run(tmp_path / "in.zarr", tmp_path / "out.zarr", op="inv")
    path = _chunk_file(zarr.open_array(str(tmp_path / "in.zarr"), mode="r"), 4)
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(CorruptInputError, match="named pipe"):
        batchlu.verify(str(tmp_path / "in.zarr"), str(tmp_path / "out.zarr"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["root", "nested"])
def test_a_named_pipe_in_place_of_the_inputs_metadata_is_one_error_not_a_hang(tmp_path, where):
    values = _values(seed=75, special=False)
    if where == "root":
        _input(tmp_path / "in.zarr", "zstd", values)
        source, meta = str(tmp_path / "in.zarr"), tmp_path / "in.zarr" / "zarr.json"
    else:
        group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
        x = group.create_group("sub").create_array("a", shape=values.shape, dtype=values.dtype,
                                                   chunks=(16,) + values.shape[1:])
        x[...] = values
        source, meta = f"{tmp_path / 'g.zarr'}:sub/a", tmp_path / "g.zarr" / "sub" / "zarr.json"
    meta.unlink()
    os.mkfifo(meta)
    with pytest.raises(CorruptInputError, match="named pipe"):
        _run(source, tmp_path / "out.zarr", op="inv")
