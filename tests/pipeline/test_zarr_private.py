"""The zarr-python private API batchlu leans on, all of it in :mod:`batchlu.pipeline.store._zarr`: each
name the wrapper uses still exists in the installed zarr and does what the pipeline relies on. A
zarr release that moves or changes one of them fails here, by name, rather than as a slower read,
a missing chunk taken for a stored one, or a wrong file named in an error."""

from __future__ import annotations

import ast
import asyncio
import importlib
import os
from pathlib import Path

import numpy as np
import pytest
import zarr

from batchlu.pipeline.store import _zarr

ROOT = Path(__file__).resolve().parents[2]


def test_the_private_names_exist():
    from zarr.codecs import ShardingCodec
    from zarr.core.buffer import default_buffer_prototype  # noqa: F401
    from zarr.core.sync import sync  # noqa: F401

    assert callable(getattr(ShardingCodec, "_load_shard_index_maybe", None))
    array = zarr.create_array(store={}, shape=(4, 2), dtype="f8", chunks=(2, 2))
    assert hasattr(array, "_async_array") and array._async_array.codec_pipeline is not None
    assert callable(array.metadata.encode_chunk_key)


def test_sync_runs_a_coroutine_on_zarrs_loop():
    async def where():
        return asyncio.get_running_loop()

    loop = _zarr.sync(where())
    assert loop is _zarr.sync(where())   # zarr's one loop, the same each time
    assert _zarr.sync(asyncio.sleep(0, result=7)) == 7


def test_nd_buffer_makes_zarr_decode_straight_into_the_array(tmp_path):
    values = np.arange(48, dtype=np.float64).reshape(6, 2, 4)
    array = zarr.create_array(str(tmp_path / "a.zarr"), shape=values.shape, dtype=values.dtype, chunks=(2, 2, 4))
    array[...] = values
    out = np.zeros((3, 2, 4))
    buffer = _zarr.nd_buffer(out)
    assert buffer is not None, "this zarr has no output buffer: every read would be copied"
    array.get_basic_selection((slice(1, 4),), out=buffer)
    np.testing.assert_array_equal(out, values[1:4])   # in out's own memory, no copy back


@pytest.mark.parametrize("zarr_format,separator,expected", [(3, "/", "c/3/0/0"), (3, ".", "c.3.0.0"),
                                                            (2, ".", "3.0.0"), (2, "/", "3/0/0")])
def test_chunk_key_names_the_file_zarr_writes(tmp_path, zarr_format, separator, expected):
    path = tmp_path / "a.zarr"
    encoding = ({"name": "default", "separator": separator} if zarr_format == 3
                else {"name": "v2", "separator": separator})
    array = zarr.create_array(str(path), shape=(8, 2, 2), dtype="f4", chunks=(2, 2, 2), zarr_format=zarr_format,
                              chunk_key_encoding=encoding)
    array[...] = 1
    key = _zarr.chunk_key(array, (3, 0, 0))
    assert key == expected and os.path.isfile(path / key)


def test_load_shard_index_says_which_inner_chunks_a_shard_holds(tmp_path):
    from zarr.codecs import ShardingCodec

    array = zarr.create_array(str(tmp_path / "s.zarr"), shape=(16, 2), dtype="f8", chunks=(2, 2), shards=(8, 2),
                              fill_value=0)
    array[0:2] = 1      # inner chunk 0 of shard 0
    array[6:8] = 1      # inner chunk 3 of shard 0; shard 1 is never written
    (codec,) = [c for c in array.metadata.codecs if isinstance(c, ShardingCodec)]
    assert _zarr.reads_shard_indexes(codec)
    index = _zarr.sync(_zarr.load_shard_index(codec, array.store_path / _zarr.chunk_key(array, (0, 0)), (4, 1)))
    assert np.asarray(index.get_full_chunk_map()).reshape(-1).tolist() == [True, False, False, True]
    assert _zarr.sync(_zarr.load_shard_index(codec, array.store_path / _zarr.chunk_key(array, (1, 0)), (4, 1))) \
        is None


def test_codec_pipeline_is_the_one_zarrs_configuration_names():
    array = zarr.create_array(store={}, shape=(4,), dtype="f8", chunks=(2,))
    module, _, name = zarr.config.get("codec_pipeline.path").rpartition(".")
    assert type(_zarr.codec_pipeline(array)) is getattr(importlib.import_module(module), name)
    # batchlu.io-engine's zarr-fused names its pipeline in the module zarr's default pipeline lives in
    assert _zarr.FUSED_PIPELINE.rpartition(".")[0] == module


def test_settle_reads_waits_for_zarrs_tasks_in_flight():
    done = []

    async def slow():
        await asyncio.sleep(0.05)
        done.append(True)

    async def start():
        asyncio.get_running_loop().create_task(slow())

    _zarr.sync(start())
    _zarr.settle_reads()
    assert done == [True]


def test_nothing_else_reaches_into_zarrs_private_api():
    """``zarr.core`` and zarr's underscored names are used in store/_zarr.py only."""
    found = []
    for folder in ("pipeline", "kernels", "workflows", "src", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == ROOT / "pipeline" / "store" / "_zarr.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.Attribute) and node.attr in ("_async_array", "_load_shard_index_maybe"):
                    names = [node.attr]
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "zarr.core" in node.value:
                    names = [node.value]
                found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                          if n.startswith("zarr.core") or n.startswith("zarr._") or n.startswith("_")
                          and n in ("_async_array", "_load_shard_index_maybe") or "zarr.core" in n]
    assert not found, found
