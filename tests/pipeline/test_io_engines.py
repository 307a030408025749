"""``batchlu.io-engine`` (batchlu.pipeline.store._io_engines): the setting, the codec pipeline each engine
opens arrays with, and bit-identical reads and writes against zarr's default pipeline (the present
path), in this process, through the I/O processes and in whole runs."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from batchlu import pipeline
from batchlu.errors import BatchluError
from batchlu.pipeline.worker import _io_pool, _shared_memory
from batchlu.pipeline.store import _io_engines
from batchlu.pipeline.store._zarr import codec_pipeline
from batchlu.pipeline.errors import ConfigError, CorruptInputError
from batchlu.testing.matrices import generate

PIPELINES = {"zarr": "BatchedCodecPipeline", "zarr-fused": "FusedCodecPipeline", "zarrs": "ZarrsCodecPipeline"}
ENGINES = [pytest.param(name, id=name, marks=pytest.mark.skipif(
    _io_engines.unavailable(name) is not None, reason=f"{name}: {_io_engines.unavailable(name)}"))
    for name in _io_engines.ENGINES]
POOL = (2, 2)  # the size tests/pipeline/test_io_pool.py uses: the process's pool is not restarted
DTYPES = ("float32", "float64", "complex64", "complex128")


def _values(dtype, count=45, n=5, seed=31) -> np.ndarray:
    """Fresh random matrices with the values a codec could get wrong: NaN, infinities, -0.0,
    subnormals, and a rounded block (compressible); chunk 2 (of 7 matrices) all NaN, the fill value."""
    a = generate("random", n, dtype, seed=seed, start=0, stop=count)
    real = a.view(np.finfo(a.dtype).dtype)
    real[0, 0, :4] = [np.nan, np.inf, -np.inf, -0.0]
    real[1, 1, :2] = [np.finfo(real.dtype).smallest_subnormal, -np.finfo(real.dtype).smallest_subnormal]
    real[21:28] = np.round(real[21:28], 2)
    a[14:21] = np.nan
    return a


def _plain_store(path, data, chunk=7):
    arr = zarr.create_array(str(path), shape=data.shape, dtype=data.dtype, chunks=(chunk,) + data.shape[1:])
    arr[...] = data
    return arr


def _output(path, data, chunk=7):
    """An empty output array made as the pipeline makes them (zstd, NaN fill, every chunk stored)."""
    return zarr.create_array(str(path), shape=data.shape, dtype=data.dtype, chunks=(chunk,) + data.shape[1:],
                             fill_value=np.nan, compressors="auto", config={"write_empty_chunks": True})


def _same_bits(x, y) -> bool:
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def _shared(like: np.ndarray) -> np.ndarray:
    raw = _shared_memory.shared_buffer(like.nbytes)
    out = raw[:like.nbytes].view(like.dtype).reshape(like.shape)
    out[...] = np.nan
    return out


# ----------------------------------------------------------------------------------------- setting
def test_setting_defaults_choices_and_errors():
    assert pipeline.config._settings.options().io_engine == "auto"
    assert _io_engines.NAMES == ("auto", "zarr", "zarr-fused", "zarrs")
    assert pipeline.config._settings.options({"io-engine": " ZARR "}).io_engine == "zarr"
    with pytest.raises(ConfigError, match=r"Expected batchlu.io-engine to be one of auto, zarr, zarr-fused, "
                                          r"zarrs. Got 'fast' instead."):
        pipeline.config._settings.options({"io-engine": "fast"})
    assert _io_engines.resolve("auto").name == _io_engines.AUTO[0]


def test_engine_not_installed_is_refused_and_auto_passes_it_over(monkeypatch):
    missing = _io_engines.IOEngine("zarrs", "batchlu_no_such_module.Pipeline", install="the zarrs package")
    monkeypatch.setitem(_io_engines.ENGINES, "zarrs", missing)
    with pytest.raises(ConfigError, match="Expected the zarrs package for batchlu.io-engine zarrs. "
                                          "Got batchlu_no_such_module does not import"):
        pipeline.config._settings.options({"io-engine": "zarrs"})
    with pytest.raises(ConfigError):
        _io_engines.resolve("zarrs")  # a worker without it: the task fails with the same error
    monkeypatch.setattr(_io_engines, "AUTO", ("zarrs", "zarr"))
    assert _io_engines.resolve("auto").name == "zarr"
    fused = _io_engines.IOEngine("zarr-fused", "zarr.NoSuchPipeline", install="a newer zarr")
    monkeypatch.setitem(_io_engines.ENGINES, "zarr-fused", fused)
    assert _io_engines.unavailable("zarr-fused") == "zarr has no NoSuchPipeline"


@pytest.mark.parametrize("engine", ENGINES)
def test_open_array_uses_the_engines_pipeline(tmp_path, engine):
    data = _values("float64")
    _plain_store(tmp_path / "a.zarr", data)
    _output(tmp_path / "o.zarr", data)
    read = _io_pool.open_array(str(tmp_path / "a.zarr"), "", "r", engine=engine)
    write = _io_pool.open_array(str(tmp_path / "o.zarr"), "", "r+", write_empty=True, engine=engine)
    assert type(codec_pipeline(read)).__name__ == PIPELINES[engine]
    writer = engine if _io_engines.ENGINES[engine].writes else "zarr"
    assert type(codec_pipeline(write)).__name__ == PIPELINES[writer]
    assert write.config.write_empty_chunks  # with_config kept the engine's pipeline
    assert _io_pool.open_array(str(tmp_path / "a.zarr"), "", "r", engine=engine) is read  # cached
    if engine != "zarr":  # the same array under another engine is another object
        assert _io_pool.open_array(str(tmp_path / "a.zarr"), "", "r", engine="zarr") is not read
    # zarr's own configuration is as it was outside the engine's block
    assert type(codec_pipeline(zarr.open_array(str(tmp_path / "a.zarr"), mode="r"))).__name__ == \
        "BatchedCodecPipeline"


# ------------------------------------------------------------------------------------ round trips
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("engine", ENGINES)
def test_read_and_write_bit_identical_to_zarrs_default_pipeline(tmp_path, engine, dtype):
    data = _values(dtype)
    _plain_store(tmp_path / "a.zarr", data)
    arr = _io_pool.open_array(str(tmp_path / "a.zarr"), "", "r", engine=engine)
    got = np.full_like(data, np.nan)
    for start, stop in ((0, 7), (7, 30), (30, 45)):  # whole chunks and ranges across chunks
        _io_pool.read_into(arr, start, stop, got[start:stop])
    assert _same_bits(got, data)

    _output(tmp_path / "o.zarr", data)
    out = _io_pool.open_array(str(tmp_path / "o.zarr"), "", "r+", write_empty=True, engine=engine)
    out[0:21] = data[0:21]
    out[21:45] = data[21:45]
    back = zarr.open_array(str(tmp_path / "o.zarr"), mode="r")  # the present path, zarr's default
    assert _same_bits(np.asarray(back[...]), data)
    assert (tmp_path / "o.zarr" / "c" / "2" / "0" / "0").is_file()  # the all-NaN chunk is stored too


@pytest.mark.parametrize("engine", ENGINES)
def test_io_processes_read_and_write_with_the_engine(tmp_path, engine):
    import numcodecs

    pool = _io_pool.get_pool(*POOL).using(engine)
    data = _values("float64", count=70)
    _plain_store(tmp_path / "a.zarr", data)
    got = _shared(data)
    for future in [pool.read(str(tmp_path / "a.zarr"), "", s, min(s + 14, 70), got[s:s + 14]) for s in range(0, 70, 14)]:
        future.result()
    assert _same_bits(got, data)

    _output(tmp_path / "o.zarr", data)
    for future in [pool.write(str(tmp_path / "o.zarr"), "", s, s + 7, got[s:s + 7]) for s in range(0, 70, 7)]:
        future.result()
    assert _same_bits(np.asarray(zarr.open_array(str(tmp_path / "o.zarr"), mode="r")[...]), data)
    # the children decoded with the engine: a corrupt chunk fails in zarrs' decoder, or numcodecs'
    (tmp_path / "a.zarr" / "c" / "3" / "0" / "0").write_bytes(b"\x00garbage, not zstd" * 7)
    error = pool.read(str(tmp_path / "a.zarr"), "", 14, 28, got[14:28]).exception()
    assert error is not None and ("Zstd decompression error" in str(error)) == (engine != "zarrs"), error
    # zarr's pipeline wrote them (numcodecs' frames), zarrs' included: see the next test
    frame = (tmp_path / "o.zarr" / "c" / "0" / "0" / "0").read_bytes()
    assert frame == numcodecs.Zstd(level=0).encode(np.ascontiguousarray(data[:7]))
    assert (tmp_path / "o.zarr" / "c" / "2" / "0" / "0").is_file()  # the all-NaN chunk is stored too


@pytest.mark.skipif(_io_engines.unavailable("zarrs") is not None, reason="zarrs is not installed")
def test_zarrs_drops_a_chunk_of_fill_values_so_it_does_not_write_outputs(tmp_path):
    """Why ENGINES["zarrs"].writes is False: zarrs deletes a chunk of fill values although the array
    says write_empty_chunks, and resume needs every output chunk stored. When this test fails, a
    zarrs that keeps them is installed: let it write outputs too (and its frames are then checked)."""
    data = _values("float64")
    _output(tmp_path / "o.zarr", data)
    with zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline", "codec_pipeline.strict": True}):
        out = zarr.open_array(str(tmp_path / "o.zarr"), mode="r+").with_config({"write_empty_chunks": True})
        assert type(codec_pipeline(out)).__name__ == "ZarrsCodecPipeline"
        out[...] = data
    assert not (tmp_path / "o.zarr" / "c" / "2" / "0" / "0").exists()
    assert (tmp_path / "o.zarr" / "c" / "1" / "0" / "0").is_file()


# ------------------------------------------------------------------------------------------- runs
def _arrays(path) -> dict[str, bytes]:
    group = zarr.open_group(str(path), mode="r")
    return {name: np.asarray(arr[...]).tobytes() for name, arr in group.arrays() if name != "_complete"}


@pytest.mark.parametrize("io_processes", [0, POOL[0]], ids=["in-worker", "io-processes"])
@pytest.mark.parametrize("engine", ENGINES)
def test_run_bit_identical_with_each_engine(client, stores, tmp_path, engine, io_processes):
    plain = tmp_path / "plain.zarr"
    pipeline.run(stores["a"], str(plain), op="solve", rhs=stores["b"], backend="cpu", client=client,
                 progress=False, config={"io-processes": 0, "io-engine": "zarr"})
    out = tmp_path / f"{engine}.zarr"
    report = pipeline.run(stores["a"], str(out), op="solve", rhs=stores["b"], backend="cpu", client=client,
                          progress=False, config={"io-processes": io_processes, "io-threads": POOL[1],
                                                  "io-engine": engine})
    assert report.status == "complete" and report.processed == 53
    assert _arrays(out) == _arrays(plain)
    assert zarr.open_group(str(out), mode="r").attrs["batchlu"]["settings"]["io_engine"] == engine


@pytest.mark.parametrize("engine", ENGINES)
def test_corrupt_chunk_with_each_engine_names_the_file(client, tmp_path, engine):
    source = pipeline.generate(tmp_path / "a.zarr", count=40, size=4, chunk=10, seed=3)
    bad = tmp_path / "a.zarr" / "c" / "2" / "0" / "0"
    bad.write_bytes(b"\x00garbage, not zstd" * 7)
    with pytest.raises(CorruptInputError) as caught:
        pipeline.run(source, tmp_path / "out.zarr", op="inv", backend="cpu", client=client, progress=False,
                     config={"io-processes": 0, "io-engine": engine})
    assert isinstance(caught.value, BatchluError)
    assert "Expected readable chunks" in str(caught.value) and str(bad) in str(caught.value)
    assert "20:30" in str(caught.value)
