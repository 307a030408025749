"""generate / generate_rhs: Zarr v3 arrays from batchlu.testing.matrices, chunk by chunk, reproducible."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from batchlu import pipeline
from batchlu.testing import matrices
from batchlu.pipeline import errors


@pytest.mark.parametrize("kind", matrices.KINDS)
@pytest.mark.parametrize("dtype", ["float32", "complex128"])
def test_generate_matches_kernels_matrices(tmp_path, kind, dtype):
    path = pipeline.generate(tmp_path / "a.zarr", count=37, size=5, dtype=dtype, chunk=8,
                             kind=kind, seed=7)
    arr = zarr.open_array(path, mode="r")
    assert arr.shape == (37, 5, 5) and arr.dtype == np.dtype(dtype) and arr.chunks == (8, 5, 5)
    assert arr.metadata.zarr_format == 3
    want = matrices.generate(kind, 5, dtype, seed=7, start=0, stop=37)
    assert np.array_equal(arr[...], want, equal_nan=True)
    again = pipeline.generate(tmp_path / "b.zarr", count=37, size=5, dtype=dtype, chunk=5,
                              kind=kind, seed=7)
    assert np.array_equal(zarr.open_array(again)[...], want, equal_nan=True)  # chunk-independent


def test_generate_seed_changes_data_and_default_chunk(tmp_path):
    a = pipeline.generate(tmp_path / "a.zarr", count=20, size=4, seed=1)
    b = pipeline.generate(tmp_path / "b.zarr", count=20, size=4, seed=2)
    assert not np.array_equal(zarr.open_array(a)[...], zarr.open_array(b)[...])
    assert zarr.open_array(a).chunks == (20, 4, 4)  # default: whole collection when it is small


def test_generate_rhs_shapes(tmp_path):
    one = pipeline.generate_rhs(tmp_path / "b1.zarr", count=9, size=4, seed=3)
    many = pipeline.generate_rhs(tmp_path / "b3.zarr", count=9, size=4, k=3, chunk=4, seed=3,
                                 dtype="complex64")
    assert zarr.open_array(one).shape == (9, 4)
    arr = zarr.open_array(many)
    assert arr.shape == (9, 4, 3) and arr.dtype == np.complex64 and arr.chunks == (4, 4, 3)
    assert np.array_equal(arr[...], matrices.rhs(4, 3, "complex64", seed=3, start=0, stop=9))


def test_generate_replaces_only_its_own_store_and_only_with_overwrite(tmp_path):
    path = pipeline.generate(tmp_path / "a.zarr", count=5, size=3, seed=1)
    with pytest.raises(errors.OutputExistsError, match="overwrite"):
        pipeline.generate(path, count=6, size=3, seed=1)
    assert zarr.open_array(path).shape == (5, 3, 3)  # untouched
    pipeline.generate(path, count=6, size=3, seed=1, overwrite=True)
    assert zarr.open_array(path).shape == (6, 3, 3)

    mine = tmp_path / "mine.zarr"  # a user's own array: overwrite alone does not delete it
    zarr.create_array(mine, shape=(4,), dtype="float64")[...] = np.arange(4.0)
    with pytest.raises(errors.OutputError, match="force"):
        pipeline.generate(mine, count=5, size=3, overwrite=True)
    np.testing.assert_array_equal(zarr.open_array(mine)[...], np.arange(4.0))
    pipeline.generate(mine, count=5, size=3, overwrite=True, force=True)
    assert zarr.open_array(mine).shape == (5, 3, 3)

    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "notes.txt").write_text("x")
    with pytest.raises(errors.OutputError, match="refusing"):
        pipeline.generate(tmp_path / "keep", count=5, size=3, overwrite=True, force=True)
    assert (tmp_path / "keep" / "notes.txt").exists()


def test_a_store_too_large_for_the_disk_is_refused_before_writing(tmp_path):
    with pytest.raises(errors.OutputError, match="room for 1,000,000,000,000 x 64 x 64 float64"):
        pipeline.generate(tmp_path / "a.zarr", count=10**12, size=64)
    assert not (tmp_path / "a.zarr").exists()
    with pytest.raises(errors.OutputError, match="room"):
        pipeline.generate_rhs(tmp_path / "b.zarr", count=10**15, size=64)
    assert not (tmp_path / "b.zarr").exists()


def test_a_chunk_too_large_for_the_memory_is_refused_before_writing(tmp_path, monkeypatch):
    import psutil

    real = psutil.virtual_memory()
    small = real._replace(available=2**20)  # 1 MiB: one chunk of 64 matrices 64x64 needs more
    monkeypatch.setattr(psutil, "virtual_memory", lambda: small)
    with pytest.raises(errors.OutputError, match="memory"):
        pipeline.generate(tmp_path / "a.zarr", count=640, size=64, chunk=64)
    assert not (tmp_path / "a.zarr").exists()


def test_a_sparse_kind_too_large_to_build_is_refused_before_building(tmp_path, monkeypatch):
    """size 1e8 of fem-poisson took ~24 GB, then the OOM killer, with no message: refused up front
    now, from an estimate that bounds the measured peaks, and nothing is built or written."""
    from batchlu.testing import sparse

    built = []
    monkeypatch.setattr(sparse, "make", lambda *a, **k: built.append(1))
    with pytest.raises(errors.OutputError, match="memory to build the fem-poisson pattern .*size 100,000,000"):
        pipeline.generate(tmp_path / "s.zarr", count=2, kind="fem-poisson", size=10**8)
    assert built == [] and not (tmp_path / "s.zarr").exists()


def test_the_sparse_build_estimate_bounds_a_real_build():
    """build_bytes is above the peak a small build adds (tracemalloc sees NumPy's buffers)."""
    import tracemalloc

    from batchlu.testing import sparse

    for kind, dim in (("fem-poisson", 2), ("saddle", 3), ("power-grid", 2), ("kkt", 2)):
        tracemalloc.start()
        sparse.make(kind, size=20000, dim=dim)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < sparse.build_bytes(kind, size=20000, dim=dim), kind


def test_a_failed_generate_leaves_no_store(tmp_path, monkeypatch):
    """A store is marked generated only when complete; a failure midway removes it."""
    real = matrices.generate

    def fail_after_the_first_chunk(kind, n, dtype, *, seed, start, stop):
        if start > 0:
            raise RuntimeError("disk gone")
        return real(kind, n, dtype, seed=seed, start=start, stop=stop)

    monkeypatch.setattr(matrices, "generate", fail_after_the_first_chunk)
    with pytest.raises(RuntimeError, match="disk gone"):
        pipeline.generate(tmp_path / "a.zarr", count=40, size=3, chunk=8)
    assert not (tmp_path / "a.zarr").exists()
    monkeypatch.setattr(matrices, "generate", real)
    path = pipeline.generate(tmp_path / "a.zarr", count=40, size=3, chunk=8)
    assert "generated:" in pipeline.inspect(path)
    assert zarr.open_array(path).attrs["batchlu_generate"]["kind"] == "random"


@pytest.mark.parametrize("kwargs,pattern", [
    (dict(count=-1, size=3), "count"), (dict(count=3, size=0), "size"),
    (dict(count=3, size=3, dtype="int32"), "dtype"), (dict(count=3, size=3, chunk=0), "chunk"),
    (dict(count=3, size=3, kind="hilbert"), "kind"),
])
def test_generate_bad_arguments(tmp_path, kwargs, pattern):
    with pytest.raises(errors.ConfigError, match=pattern):
        pipeline.generate(tmp_path / "a.zarr", **kwargs)
    assert not (tmp_path / "a.zarr").exists()


def test_chunks_of_zero_matrices_are_stored(tmp_path):
    """singular-mix holds zero matrices: in one-matrix chunks they equal the fill value, and zarr
    would skip them; then ``batchlu run`` would refuse the input for missing chunks."""
    from batchlu.pipeline.store import _missing

    out = pipeline.generate(tmp_path / "z.zarr", count=40, size=3, chunk=1, kind="singular-mix", seed=1)
    arr = zarr.open_array(out, mode="r")
    zero = [i for i in range(40) if not np.asarray(arr[i]).any()]
    assert zero  # the test needs a chunk that is all fill value
    assert _missing.find(arr, 0, 40) == []


@pytest.mark.parametrize("layout", ["chunks", "sharded"])
def test_generated_arrays_carry_crc32c_so_a_flipped_byte_is_named(client, tmp_path, layout):
    """Every array batchlu generate writes (matrices, right-hand sides, a sparse batch's four) ends
    its codecs with zarr's crc32c: a byte flipped later fails to read, and batchlu run names the chunk
    file instead of computing from the changed values."""
    import os

    a = pipeline.generate(tmp_path / "a.zarr", count=30, size=5, chunk=10, seed=4, layout=layout)
    b = pipeline.generate_rhs(tmp_path / "b.zarr", count=30, size=5, k=2, chunk=10, seed=5, layout=layout)
    s = pipeline.generate(tmp_path / "s.zarr", count=4, kind="saddle", size=60, chunk=2, seed=6, layout=layout)
    arrays = [zarr.open_array(a), zarr.open_array(b)] + [zarr.open_array(s, path=name)
                                                         for name in ("values", "rhs", "indptr", "indices")]
    for array in arrays:
        codecs = array.metadata.codecs
        if array.shards is not None:   # the codecs of each inner chunk
            codecs = codecs[0].codecs
        names = [c.to_dict()["name"] for c in codecs]
        assert names[-1] == "crc32c", (array.path, names)
    victim = os.path.join(a, "c", "1", "0", "0")
    data = bytearray(open(victim, "rb").read())
    data[len(data) // 2] ^= 0x01
    open(victim, "wb").write(bytes(data))
    with pytest.raises(errors.CorruptInputError, match=f"unreadable chunk file {victim} \\(matrices 10:20\\)"):
        pipeline.run(a, tmp_path / "o.zarr", op="inv", client=client, progress=False)


def test_generate_kkt_with_its_delta(tmp_path):
    """kind kkt: a sparse batch on one pattern, a fresh matrix per sample, -delta on the constraint
    rows' diagonal, the known inertia, the values those of batchlu.testing.sparse whatever the chunks."""
    from batchlu.testing import sparse

    path = pipeline.generate(tmp_path / "k.zarr", count=5, kind="kkt", size=120, delta=1e-10, chunk=2, seed=3)
    group = zarr.open_group(path, mode="r")
    problem = sparse.make("kkt", size=120, seed=3, delta=1e-10)
    assert group.attrs["sparse"] == {"pattern": "lower", "kind": "sym-indef", "n": problem.n,
                                     "inertia": list(problem.inertia)}
    info = group.attrs["batchlu_generate"]
    assert info["kind"] == "kkt" and "delta 1e-10" in info["description"] and "dependent" in info["description"]
    values = group["values"][...]
    assert values.shape == (5, problem.nnz) and np.array_equal(values, problem.values(0, 5, seed=3))
    assert len({v.tobytes() for v in values}) == 5
    assert np.array_equal(group["indptr"][...], problem.indptr) and group["rhs"].shape == (5, problem.n)
    rows = np.repeat(np.arange(problem.n), np.diff(problem.indptr))
    diagonal = values[:, rows == problem.indices]
    assert np.all(diagonal[:, problem.inertia[0]:] == -1e-10) and np.all(diagonal[:, :problem.inertia[0]] > 0)
    default = pipeline.generate(tmp_path / "d.zarr", count=2, kind="kkt", size=120, seed=3)
    assert "delta 1e-08" in zarr.open_group(default, mode="r").attrs["batchlu_generate"]["description"]


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(kind="saddle", size=60, delta=1e-8), "delta only with kind kkt"),
    (dict(kind="random", size=3, delta=1e-8), "delta only with kind kkt"),
    (dict(kind="kkt", size=60, delta=-1.0), "delta to be a finite number >= 0"),
    (dict(kind="kkt", size=60, delta=float("inf")), "delta to be a finite number >= 0"),
])
def test_generate_refuses_a_bad_delta(tmp_path, kwargs, pattern):
    with pytest.raises(errors.ConfigError, match=pattern):
        pipeline.generate(tmp_path / "x.zarr", count=2, **kwargs)
    assert not (tmp_path / "x.zarr").exists()
