"""What resume checks before it trusts the ledger (issue 16, items 1 and 3): every output array and
every chunk recorded complete is stored, and the input still holds the values the completed chunks
were computed from. Each refusal names what is wrong, suggests overwrite, and changes nothing."""

from __future__ import annotations

import os
import shutil
import textwrap
import time
import warnings

import numpy as np
import pytest
import zarr
from _pipeline_helpers import complete_flags, outputs_of, sigkill, start_script, wait_for_chunks

from batchlu import pipeline
from batchlu.pipeline import _fingerprint, errors

POOL = {"io-processes": 2, "io-threads": 2}  # the size tests/pipeline/test_io_pool.py uses: no restart


@pytest.fixture(params=["in-worker", "io-processes"])
def io(request):
    """The two places a task reads its input (and takes its checksums): the data path with I/O in
    the worker and with I/O processes. Yields the config to run with."""
    return {"io-processes": 0} if request.param == "in-worker" else POOL


def _forget(out, chunks: slice) -> None:
    """As if the run had been killed: some chunks not recorded, the status "running"."""
    zarr.open_array(str(out), path="_complete", mode="r+")[chunks] = False
    pipeline._output.update(str(out), status="running")


def _snapshot(out) -> dict[str, bytes]:
    """Every file of an output, to show that a refused resume changed nothing."""
    files = {}
    for folder, _, names in os.walk(out):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, out)] = f.read()
    return files


def _regenerate(path, *, seed, **kw) -> str:
    """The input written again at the same path: same shape, dtype and chunks, other values."""
    shutil.rmtree(path)
    return pipeline.generate(path, seed=seed, **kw)


# ------------------------------------------------------------------------ item 1: outputs are there
@pytest.mark.parametrize("op,victim", [("inv", "inv"), ("lu", "piv"), ("slogdet", "info")])
def test_resume_refuses_a_deleted_output_array(client, stores, tmp_path, op, victim):
    """``run; rm -rf o/inv; run --resume`` said complete with an all-fill ``inv``."""
    out = tmp_path / "o.zarr"
    pipeline.run(stores["a"], out, op=op, client=client, progress=False, config={"chunk": 10})
    shutil.rmtree(out / victim)
    before = _snapshot(out)
    with pytest.raises(errors.ResumeError, match=rf"output array {victim} .* 6 of 6 chunks .*--overwrite"):
        pipeline.run(stores["a"], out, op=op, resume=True, client=client, progress=False)
    assert _snapshot(out) == before


def test_resume_refuses_a_missing_chunk_of_an_output(client, stores, tmp_path):
    out = tmp_path / "o.zarr"
    pipeline.run(stores["a"], out, op="inv", client=client, progress=False, config={"chunk": 10})
    _forget(out, slice(5, 6))  # resume has work to do, and chunk 2 is still recorded complete
    os.remove(out / "inv" / "c" / "2" / "0" / "0")
    before = _snapshot(out)
    with pytest.raises(errors.ResumeError, match=r"1 of 5 missing from inv .*c/2/0/0, matrices 20:30\).*--overwrite"):
        pipeline.run(stores["a"], out, op="inv", resume=True, client=client, progress=False)
    assert _snapshot(out) == before


@pytest.mark.parametrize("change", ["dtype", "chunks", "shape"])
def test_resume_refuses_an_output_array_of_another_layout(client, stores, tmp_path, change):
    out = tmp_path / "o.zarr"
    pipeline.run(stores["a"], out, op="inv", client=client, progress=False, config={"chunk": 10})
    shape, chunks, dtype = {"dtype": ((53, 6, 6), (10, 6, 6), "f4"), "chunks": ((53, 6, 6), (5, 6, 6), "f8"),
                            "shape": ((53, 6, 5), (10, 6, 5), "f8")}[change]
    group = zarr.open_group(str(out), mode="r+")
    group.create_array("inv", shape=shape, chunks=chunks, dtype=dtype, overwrite=True)[...] = 1.5
    with pytest.raises(errors.ResumeError, match=r"output array inv .* as recorded. Got .*--overwrite"):
        pipeline.run(stores["a"], out, op="inv", resume=True, client=client, progress=False)


def test_resume_accepts_complete_chunks_that_hold_only_fill_values(client, tmp_path):
    """A chunk of singular matrices has all-NaN inverses, NaN being the fill value: it is stored all
    the same (zarr skips such chunks by default), so the resume check finds it."""
    rng = np.random.default_rng(41)
    a = rng.standard_normal((30, 5, 5))
    a[10:20, :, 3] = 0.0  # chunk 1: random matrices with a zero column, exactly singular
    source = zarr.create_array(str(tmp_path / "a.zarr"), shape=a.shape, chunks=(10, 5, 5), dtype="f8")
    source[...] = a
    out = tmp_path / "o.zarr"
    first = pipeline.run(str(tmp_path / "a.zarr"), out, op="inv", client=client, progress=False,
                         config={"chunk": 10})
    assert first.singular == 10 and np.isnan(outputs_of(str(out))["inv"][10:20]).all()
    assert (out / "inv" / "c" / "1" / "0" / "0").is_file()
    again = pipeline.run(str(tmp_path / "a.zarr"), out, op="inv", resume=True, client=client,
                         progress=False)
    assert again.status == "complete" and again.skipped == 30 and again.singular == 10


def test_resume_makes_a_missing_array_again_while_nothing_is_complete(client, stores, tmp_path):
    """A run killed while it created its arrays: nothing recorded complete, an array missing."""
    out, clean = tmp_path / "o.zarr", tmp_path / "clean.zarr"
    pipeline.run(stores["a"], clean, op="lu", client=client, progress=False, config={"chunk": 10})
    pipeline.run(stores["a"], out, op="lu", client=client, progress=False, config={"chunk": 10})
    _forget(out, slice(None))
    shutil.rmtree(out / "piv")
    report = pipeline.run(stores["a"], out, op="lu", resume=True, client=client, progress=False)
    assert report.status == "complete" and report.processed == 53
    got, want = outputs_of(str(out)), outputs_of(str(clean))
    assert {k: v.tobytes() for k, v in got.items()} == {k: v.tobytes() for k, v in want.items()}


def test_resume_of_an_output_recording_output_compressor_keeps_its_codec(client, stores, tmp_path):
    """An output of a batchlu from before batchlu.output-compressor became output-codec records its
    codec as ``output_compressor``: a resume (asking for the default, zstd) makes a missing array
    again with the recorded codec, and records it under today's name."""
    out, clean = tmp_path / "o.zarr", tmp_path / "clean.zarr"
    pipeline.run(stores["a"], clean, op="lu", client=client, progress=False, config={"chunk": 10})
    pipeline.run(stores["a"], out, op="lu", client=client, progress=False,
                 config={"chunk": 10, "output-codec": "lz4"})
    settings = dict(pipeline._output.read_provenance(str(out))["settings"])
    settings["output_compressor"] = settings.pop("output_codec")   # as the older batchlu wrote it
    pipeline._output.update(str(out), settings=settings)
    _forget(out, slice(None))
    shutil.rmtree(out / "piv")
    report = pipeline.run(stores["a"], out, op="lu", resume=True, client=client, progress=False)
    assert report.status == "complete" and report.processed == 53
    group = zarr.open_group(str(out), mode="r")
    assert [type(c).__name__ for c in group["piv"].compressors] == ["LZ4", "Crc32cCodec"]   # made again as
    assert [type(c).__name__ for c in group["lu"].compressors] == ["LZ4", "Crc32cCodec"]    # it was made
    recorded = pipeline._output.read_provenance(str(out))["settings"]
    assert recorded["output_codec"] == "lz4" and "output_compressor" not in recorded
    got, want = outputs_of(str(out)), outputs_of(str(clean))
    assert {k: v.tobytes() for k, v in got.items()} == {k: v.tobytes() for k, v in want.items()}


# ------------------------------------------- issue 38, item 8: a recorded chunk passes its checksum
def _flip_a_byte(path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("codec,layout", [("none", "chunks"), ("zstd", "sharded")])
def test_resume_redoes_a_recorded_chunk_that_fails_its_crc32c(client, stores, tmp_path, codec, layout):
    """A payload byte of a recorded output chunk flipped after it was written (bit rot): resume kept
    it and said complete. Now the chunk fails its CRC-32C: one warning names it, the resume computes
    it again with the chunks never recorded, and the output is the clean run's, bit for bit."""
    config = {"chunk": 10, "output-codec": codec, "output-layout": layout}
    out, clean = tmp_path / "o.zarr", tmp_path / "clean.zarr"
    pipeline.run(stores["a"], clean, op="lu", client=client, progress=False, config=config)
    pipeline.run(stores["a"], out, op="lu", client=client, progress=False, config=config)
    victim = out / "lu" / "c" / "2" / "0" / "0"
    _flip_a_byte(victim, victim.stat().st_size // 3)
    _forget(out, slice(5, 6))   # killed before its last chunk: resume has that to do too
    with pytest.warns(errors.BatchluWarning, match=rf"^1 chunk recorded complete in {out} fails its CRC-32C "
                                                   rf"\(first: {victim} .*, matrices 20:30\); the resume "
                                                   rf"computes it again\.$"):
        report = pipeline.run(stores["a"], out, op="lu", resume=True, client=client, progress=False)
    assert report.status == "complete" and report.processed == 13 and report.skipped == 40
    assert complete_flags(out).all()
    got, want = outputs_of(str(out)), outputs_of(str(clean))
    assert sorted(got) == sorted(want)
    assert {k: v.tobytes() for k, v in got.items()} == {k: v.tobytes() for k, v in want.items()}


def test_a_resume_refused_for_its_input_keeps_the_records_of_damaged_chunks(client, tmp_path):
    """A damaged chunk and a changed input: the resume is refused for the input, with no warning about
    the chunk and nothing changed (the chunk stays recorded, as it was, for the user to see)."""
    source = pipeline.generate(tmp_path / "a.zarr", count=60, size=5, chunk=10, seed=3)
    out = tmp_path / "o.zarr"
    pipeline.run(source, out, op="inv", client=client, progress=False, config={"chunk": 10})
    victim = out / "inv" / "c" / "1" / "0" / "0"
    _flip_a_byte(victim, victim.stat().st_size // 2)
    array = zarr.open_array(source, mode="r+")
    array[43, 1, 1] = array[43, 1, 1] + 0.5   # chunk 4 (matrices 40:50)
    before = _snapshot(out)
    with warnings.catch_warnings():
        warnings.simplefilter("error", errors.BatchluWarning)
        with pytest.raises(errors.ResumeError, match=r"other values in matrices 40:50 instead"):
            pipeline.run(source, out, op="inv", resume=True, client=client, progress=False)
    assert _snapshot(out) == before and complete_flags(out).all()


def test_resume_of_an_output_from_before_output_checksums_keeps_its_arrays_without(client, stores, tmp_path):
    """An output whose record names no output_checksum was written without crc32c: a resume makes a
    missing array again as the others were made (no checksum) and records that it has none."""
    out, clean = tmp_path / "o.zarr", tmp_path / "clean.zarr"
    pipeline.run(stores["a"], clean, op="lu", client=client, progress=False, config={"chunk": 10})
    pipeline.run(stores["a"], out, op="lu", client=client, progress=False,
                 config={"chunk": 10, "output-checksum": "none"})
    settings = dict(pipeline._output.read_provenance(str(out))["settings"])
    assert settings.pop("output_checksum") == "none"   # as a batchlu before the setting wrote it
    pipeline._output.update(str(out), settings=settings)
    _forget(out, slice(None))
    shutil.rmtree(out / "piv")
    report = pipeline.run(stores["a"], out, op="lu", resume=True, client=client, progress=False)
    assert report.status == "complete" and report.processed == 53
    group = zarr.open_group(str(out), mode="r")
    assert [type(c).__name__ for c in group["piv"].compressors] == ["ZstdCodec"]
    assert [type(c).__name__ for c in group["lu"].compressors] == ["ZstdCodec"]
    assert [type(c).__name__ for c in zarr.open_group(str(clean), mode="r")["lu"].compressors] == \
        ["ZstdCodec", "Crc32cCodec"]
    assert pipeline._output.read_provenance(str(out))["settings"]["output_checksum"] == "none"
    got, want = outputs_of(str(out)), outputs_of(str(clean))
    assert {k: v.tobytes() for k, v in got.items()} == {k: v.tobytes() for k, v in want.items()}


# -------------------------------------------------------------------- item 3: the input is the same
RUNNER = textwrap.dedent("""
    import sys
    from distributed import Client, LocalCluster
    import dask
    from batchlu import pipeline

    if __name__ == "__main__":
        dask.config.set({"batchlu-testing.task-delay": 0.15})  # slowed down: it is still running when killed
        with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            pipeline.run(sys.argv[1], sys.argv[2], op="inv", client=client, progress=False,
                         config={"chunk": 500, "memory-budget": 1})
""")


def test_resume_refuses_an_input_regenerated_in_place_after_a_kill(client, tmp_path):
    """The reported case: a killed run, its input written again (same path, shape, dtype, other
    values), resumed: it said complete, with most inverses wrong."""
    kw = dict(count=8000, size=6, chunk=1000)
    source = pipeline.generate(tmp_path / "a.zarr", seed=1, **kw)
    out = tmp_path / "o.zarr"
    proc = start_script(tmp_path, RUNNER, source, out)
    try:
        wait_for_chunks(proc, out, 3)
        sigkill(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    done = complete_flags(out)
    assert 3 <= done.sum() < done.size
    _regenerate(source, seed=2, **kw)
    before = _snapshot(out)
    with warnings.catch_warnings(record=True) as caught, \
            pytest.raises(errors.ResumeError, match=r"other values in matrices \d+:\d+ .*--overwrite"):
        warnings.simplefilter("always")
        pipeline.run(source, out, op="inv", resume=True, client=client, progress=False)
    assert any("stale lock" in str(w.message) for w in caught)  # the killed run's lock
    assert _snapshot(out) == before


def test_resume_refuses_one_value_changed_in_the_input(client, tmp_path, io):
    """One matrix entry written in place, same shape and dtype: refused, naming that chunk; the
    checksums come from the tasks' reads, in the worker or in the I/O processes alike."""
    source = pipeline.generate(tmp_path / "a.zarr", count=60, size=5, chunk=7, seed=3)
    out = tmp_path / "o.zarr"
    pipeline.run(source, out, op="lu", backend="cpu", client=client, progress=False,
                 config={"chunk": 6, **io})
    _forget(out, slice(8, 10))
    recorded = zarr.open_array(str(out), path="_input_crc32", mode="r")[...]
    assert recorded.dtype == np.uint32 and np.count_nonzero(recorded) == 10  # one per chunk
    array = zarr.open_array(source, mode="r+")
    assert recorded[5] == _fingerprint.digest(array[30:36])
    array[33, 2, 4] = array[33, 2, 4] + 0.5  # chunk 5 (matrices 30:36)
    with pytest.raises(errors.ResumeError, match=r"other values in matrices 30:36 instead"):
        pipeline.run(source, out, op="lu", backend="cpu", resume=True, client=client, progress=False,
                     config=io)


def test_resume_accepts_an_input_rewritten_with_the_same_values(client, tmp_path, io):
    """New files, same values (e.g. restored from a backup): the checksums match, resume finishes
    the run, bit for bit as an uninterrupted one."""
    kw = dict(count=60, size=5, chunk=7, seed=4)
    source = pipeline.generate(tmp_path / "a.zarr", **kw)
    b = pipeline.generate_rhs(tmp_path / "b.zarr", count=60, size=5, k=2, chunk=11, seed=5)
    out, clean = tmp_path / "o.zarr", tmp_path / "clean.zarr"
    for path in (out, clean):
        pipeline.run(source, path, op="solve", rhs=b, backend="cpu", client=client, progress=False,
                     config={"chunk": 6, **io})
    _forget(out, slice(2, 5))
    zarr.open_array(str(out), path="x", mode="r+")[12:30] = 0.0  # stale data where nothing is recorded
    _regenerate(source, **kw)
    report = pipeline.run(source, out, op="solve", rhs=b, backend="cpu", resume=True, client=client,
                          progress=False, config=io)
    assert report.status == "complete" and report.processed == 18 and report.skipped == 42
    got, want = outputs_of(str(out)), outputs_of(str(clean))
    assert {k: v.tobytes() for k, v in got.items()} == {k: v.tobytes() for k, v in want.items()}


def test_resume_refuses_a_right_hand_side_changed(client, tmp_path):
    source = pipeline.generate(tmp_path / "a.zarr", count=40, size=4, chunk=10, seed=6)
    b = pipeline.generate_rhs(tmp_path / "b.zarr", count=40, size=4, chunk=10, seed=7)
    out = tmp_path / "o.zarr"
    pipeline.run(source, out, op="solve", rhs=b, client=client, progress=False, config={"chunk": 10})
    _forget(out, slice(3, 4))
    shutil.rmtree(b)
    pipeline.generate_rhs(b, count=40, size=4, chunk=10, seed=8)
    with pytest.raises(errors.ResumeError, match=r"or the right-hand side .* other values in matrices 0:10"):
        pipeline.run(source, out, op="solve", rhs=b, resume=True, client=client, progress=False)


def test_unchanged_input_files_are_not_read_again(client, tmp_path, monkeypatch):
    """Files untouched since the run started: their signature says so, and resume reads nothing;
    files written since: the values are compared."""
    monkeypatch.setattr(_fingerprint, "FRESH_SECONDS", 0.0)  # the input was written just now
    compared = []
    real = _fingerprint.compare_content
    monkeypatch.setattr(_fingerprint, "compare_content", lambda *a: compared.append(1) or real(*a))
    source = pipeline.generate(tmp_path / "a.zarr", count=30, size=4, chunk=10, seed=9)
    out = tmp_path / "o.zarr"
    pipeline.run(source, out, op="inv", client=client, progress=False, config={"chunk": 10})
    assert zarr.open_group(str(out), mode="r").attrs["batchlu"]["input_files"]["input"]
    _forget(out, slice(2, 3))
    assert pipeline.run(source, out, op="inv", resume=True, client=client, progress=False).processed == 10
    assert compared == []
    _forget(out, slice(2, 3))
    _regenerate(source, count=30, size=4, chunk=10, seed=10)
    with pytest.raises(errors.ResumeError, match="other values in matrices 0:10"):
        pipeline.run(source, out, op="inv", resume=True, client=client, progress=False)
    assert compared == [1]


def test_freshly_written_input_files_give_no_signature(tmp_path):
    source = pipeline.generate(tmp_path / "a.zarr", count=10, size=3, chunk=5, seed=11)
    ref = pipeline._store.parse_ref(source)
    assert _fingerprint.signature(ref) is None  # written within FRESH_SECONDS: times cannot tell
    old = time.time() - 3600
    for folder, _, names in os.walk(source):
        for name in names:
            os.utime(os.path.join(folder, name), (old, old))
    assert _fingerprint.signature(ref) is None  # the ctime is still fresh: utime cannot hide a write


def test_the_signature_sees_a_write_through_a_symlinked_folder(tmp_path, monkeypatch):
    """The input's chunk folder a symbolic link to another disk: a rewritten chunk must change the
    signature (before, the walk did not follow the link, saw no file and let resume skip the CRCs);
    a link back up the tree is walked once."""
    monkeypatch.setattr(_fingerprint, "FRESH_SECONDS", 0.0)
    source = pipeline.generate(tmp_path / "a.zarr", count=10, size=3, chunk=5, seed=11)
    real = tmp_path / "elsewhere"
    shutil.move(os.path.join(source, "c"), real)
    os.symlink(real, os.path.join(source, "c"))
    os.symlink(source, os.path.join(real, "loop"))
    ref = pipeline._store.parse_ref(source)
    before = _fingerprint.signature(ref)
    assert int(before.split(":")[0]) >= 2 + 1  # both chunk files and zarr.json
    time.sleep(0.01)
    z = zarr.open_array(source, mode="r+")
    z[0:5] = z[0:5] * 2.0
    assert _fingerprint.signature(ref) != before


def test_resume_refuses_an_output_without_input_checksums(client, stores, tmp_path):
    """An output of an older batchlu records no checksums: the input cannot be checked."""
    out = tmp_path / "o.zarr"
    pipeline.run(stores["a"], out, op="inv", client=client, progress=False, config={"chunk": 10})
    _forget(out, slice(4, 6))
    shutil.rmtree(out / "_input_crc32")
    record = dict(zarr.open_group(str(out), mode="r").attrs["batchlu"])
    del record["input_files"]
    zarr.open_group(str(out), mode="r+").attrs["batchlu"] = record
    with pytest.raises(errors.ResumeError, match="checksums of the input .*--overwrite"):
        pipeline.run(stores["a"], out, op="inv", resume=True, client=client, progress=False)


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128"])
def test_chunk_digests_match_per_chunk_and_byte_order(dtype):
    rng = np.random.default_rng(12)
    a = rng.standard_normal((23, 3, 3)).astype(dtype)
    b = rng.standard_normal((23, 3)).astype(dtype)
    got = _fingerprint.chunk_digests(5, 10, 33, a, b)
    assert got.dtype == np.uint32 and got.shape == (5,)
    for i, lo in enumerate(range(0, 23, 5)):
        assert got[i] == _fingerprint.digest(a[lo:lo + 5], b[lo:lo + 5])
    swapped = a.astype(a.dtype.newbyteorder(">"))
    assert _fingerprint.digest(swapped) == _fingerprint.digest(a)  # values, not their storage
    assert _fingerprint.digest(np.asfortranarray(a)) == _fingerprint.digest(a)
    changed = a.copy()
    changed.flat[40] = changed.flat[40] * 2 + 1
    assert _fingerprint.digest(changed) != _fingerprint.digest(a)


def test_digests_are_zlibs_crc32_whichever_library_computes_them():
    """The ledger keeps zlib's CRC-32 of the values' bytes: outputs recorded by earlier versions
    (zlib) resume under zlib-ng, and the other way round."""
    import zlib

    from batchlu.pipeline import _crc32

    rng = np.random.default_rng(31)
    for size in (0, 1, 7, 5 * 1024 - 1, 5 * 1024 + 3, 1 << 20):
        data = rng.integers(0, 256, size, np.uint8)
        for value in (0, 1, 0xFFFFFFFF, int(rng.integers(0, 2**32))):
            assert _crc32.crc32(data, value) == zlib.crc32(data.tobytes(), value)
    a = rng.standard_normal((9, 4, 4))
    b = rng.standard_normal((9, 4))
    assert _fingerprint.digest(a, b) == zlib.crc32(b.tobytes(), zlib.crc32(a.tobytes()))
    assert _crc32._crc32 is not zlib.crc32   # zlib-ng (a dependency) computes them: ~8x faster


@pytest.mark.gpu
@pytest.mark.parametrize("threads", [1, 3])
def test_gpu_host_path_records_the_checksums_of_matrices_and_right_hand_sides(tmp_path, threads):
    """solve through the host codecs on the GPU (tasks of several chunks, batches of one): each
    chunk's recorded CRC-32 is the one of its matrices then its right-hand sides."""
    rng = np.random.default_rng(44)
    a = rng.standard_normal((90, 6, 6))
    b = rng.standard_normal((90, 6, 2))
    for name, x, chunks in (("a", a, (10, 6, 6)), ("b", b, (10, 6, 2))):
        zarr.create_array(str(tmp_path / f"{name}.zarr"), shape=x.shape, chunks=chunks, dtype="f8")[...] = x
    out = tmp_path / "x.zarr"
    report = pipeline.run(str(tmp_path / "a.zarr"), out, op="solve", rhs=str(tmp_path / "b.zarr"), backend="gpu",
                          progress=False, config={"chunk": 10, "codec-device": "cpu",
                                                  "cluster.threads-per-worker": threads})
    assert report.status == "complete" and report.backends == ("gpu",) and report.tasks <= 9
    recorded = zarr.open_array(str(out), path="_input_crc32", mode="r")[...]
    assert [int(x) for x in recorded] == [_fingerprint.digest(a[lo:lo + 10], b[lo:lo + 10]) for lo in range(0, 90, 10)]


@pytest.mark.gpu
@pytest.mark.parametrize("codec_device", ["cpu", "auto"])
def test_gpu_run_records_the_same_checksums_and_stores_fill_chunks(tmp_path, codec_device):
    """On the GPU data paths (host codecs: pinned buffers, I/O processes by default; auto: the GPU
    codecs where nvCOMP is there): each chunk's recorded CRC-32 is the one of its input values, a
    chunk of all-NaN inverses is stored, and resume refuses a value changed in the input."""
    rng = np.random.default_rng(43)
    a = rng.standard_normal((96, 8, 8))
    a[16:32, :, 5] = 0.0  # chunk 1: random matrices with a zero column, exactly singular
    source = zarr.create_array(str(tmp_path / "a.zarr"), shape=a.shape, chunks=(16, 8, 8), dtype="f8")
    source[...] = a
    out = tmp_path / "o.zarr"
    report = pipeline.run(str(tmp_path / "a.zarr"), out, op="inv", backend="gpu", progress=False,
                          config={"chunk": 16, "codec-device": codec_device})
    assert report.backends == ("gpu",) and report.singular == 16
    recorded = zarr.open_array(str(out), path="_input_crc32", mode="r")[...]
    assert [int(x) for x in recorded] == [_fingerprint.digest(a[lo:lo + 16]) for lo in range(0, 96, 16)]
    assert (out / "inv" / "c" / "1" / "0" / "0").is_file()
    _forget(out, slice(4, 6))
    source[70, 1, 1] = source[70, 1, 1] + 1.0  # chunk 4: not complete any more, not checked
    source[40, 3, 2] = source[40, 3, 2] - 1.0  # chunk 2: complete
    with pytest.raises(errors.ResumeError, match=r"other values in matrices 32:48 instead"):
        pipeline.run(str(tmp_path / "a.zarr"), out, op="inv", backend="gpu", resume=True, progress=False,
                     config={"codec-device": codec_device})
