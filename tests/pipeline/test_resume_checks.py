"""What resume checks before it trusts the ledger (issue 16, items 1 and 3): every output array and
every chunk recorded complete is stored, and the input still holds the values the completed chunks
were computed from. Each refusal names what is wrong, suggests overwrite, and changes nothing."""

from __future__ import annotations

import os
import shutil
import textwrap
import threading
import time
import warnings

import dask

import numpy as np
import pytest
import zarr
from _pipeline_helpers import (complete_flags, outputs_of, sigkill, start_script, wait_for_chunks,
                               wait_partly_complete)

from batchlu import pipeline
from batchlu.pipeline import errors
from batchlu.pipeline.output import _fingerprint
from batchlu.pipeline.config._settings import TESTING_TASK_DELAY

POOL = {"io-processes": 2, "io-threads": 2}  # the size tests/pipeline/test_io_pool.py uses: no restart


@pytest.fixture(params=["in-worker", "io-processes"])
def io(request):
    """The two places a task reads its input (and takes its checksums): the data path with I/O in
    the worker and with I/O processes. Yields the config to run with."""
    return {"io-processes": 0} if request.param == "in-worker" else POOL


def _forget(out, chunks: slice) -> None:
    """As if the run had been killed: some chunks not recorded, the status "running"."""
    zarr.open_array(str(out), path="_complete", mode="r+")[chunks] = False
    pipeline.output._group.update(str(out), status="running")


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
    """``run; rm -rf o/inv; run --resume`` said complete with an all-fill ``inv``. The same resume of
    the output with the array in place is accepted: the refusal is the deleted array's; it names that
    array and the output, makes nothing again, and changes nothing."""
    out = tmp_path / "o.zarr"
    pipeline.run(stores["a"], out, op=op, client=client, progress=False, config={"chunk": 10})
    intact = pipeline.run(stores["a"], out, op=op, resume=True, client=client, progress=False)
    assert intact.status == "complete" and intact.skipped == 53 and intact.processed == 0
    shutil.rmtree(out / victim)
    before = _snapshot(out)
    with pytest.raises(errors.ResumeError) as refused:
        pipeline.run(stores["a"], out, op=op, resume=True, client=client, progress=False)
    assert str(refused.value) == (
        f"Expected the output array {victim} in {out}, where 6 of 6 chunks are recorded complete. Got "
        f"no such array instead; use overwrite (--overwrite) to start again.")
    assert not (out / victim).exists()
    assert _snapshot(out) == before


def test_resume_refuses_a_deleted_output_array_of_a_partly_complete_output(client, stores, tmp_path):
    """The same with only part of the output complete (resume has chunks to compute): refused before
    any is computed, and nothing changed."""
    out = tmp_path / "o.zarr"
    pipeline.run(stores["a"], out, op="lu", client=client, progress=False, config={"chunk": 10})
    _forget(out, slice(2, 5))
    shutil.rmtree(out / "piv")
    before = _snapshot(out)
    with pytest.raises(errors.ResumeError, match=r"output array piv in .*, where 3 of 6 chunks .*--overwrite"):
        pipeline.run(stores["a"], out, op="lu", resume=True, client=client, progress=False)
    assert not (out / "piv").exists()
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


def _resume_an_older_output(stores, client, tmp_path, config: dict, as_older):
    """An lu output of ``stores["a"]`` written with ``config``, its recorded settings edited by
    ``as_older`` as an older batchlu wrote them, every record forgotten and ``piv`` deleted, then
    resumed; beside it a clean run of today's defaults. Returns the two paths and the resumed group."""
    out, clean = tmp_path / "o.zarr", tmp_path / "clean.zarr"
    pipeline.run(stores["a"], clean, op="lu", client=client, progress=False, config={"chunk": 10})
    pipeline.run(stores["a"], out, op="lu", client=client, progress=False, config={"chunk": 10, **config})
    settings = dict(pipeline.output._group.read_provenance(str(out))["settings"])
    as_older(settings)
    pipeline.output._group.update(str(out), settings=settings)
    _forget(out, slice(None))
    shutil.rmtree(out / "piv")
    report = pipeline.run(stores["a"], out, op="lu", resume=True, client=client, progress=False)
    assert report.status == "complete" and report.processed == 53
    return out, clean, zarr.open_group(str(out), mode="r")


def test_resume_of_an_output_recording_output_compressor_keeps_its_codec(client, stores, tmp_path):
    """An output of a batchlu from before batchlu.output-compressor became output-codec records its
    codec as ``output_compressor``: a resume (asking for the default, zstd) makes a missing array
    again with the recorded codec, and records it under today's name."""
    def as_older(settings):
        settings["output_compressor"] = settings.pop("output_codec")   # as the older batchlu wrote it

    out, clean, group = _resume_an_older_output(stores, client, tmp_path, {"output-codec": "lz4"}, as_older)
    assert [type(c).__name__ for c in group["piv"].compressors] == ["LZ4", "Crc32cCodec"]   # made again as
    assert [type(c).__name__ for c in group["lu"].compressors] == ["LZ4", "Crc32cCodec"]    # it was made
    recorded = pipeline.output._group.read_provenance(str(out))["settings"]
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
    def as_older(settings):
        assert settings.pop("output_checksum") == "none"   # as a batchlu before the setting wrote it

    out, clean, group = _resume_an_older_output(stores, client, tmp_path, {"output-checksum": "none"}, as_older)
    assert [type(c).__name__ for c in group["piv"].compressors] == ["ZstdCodec"]   # output-codec auto:
    assert [type(c).__name__ for c in group["lu"].compressors] == []               # floats uncompressed
    assert [type(c).__name__ for c in zarr.open_group(str(clean), mode="r")["lu"].compressors] == \
        ["Crc32cCodec"]
    assert pipeline.output._group.read_provenance(str(out))["settings"]["output_checksum"] == "none"
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
    recorded = zarr.open_array(str(out), path="_input_xxh3", mode="r")[...]
    assert recorded.dtype == np.uint64 and np.count_nonzero(recorded) == 10  # one per chunk
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


def _held_times(monkeypatch, path: str) -> None:
    """From now on ``os.stat`` of ``path`` gives the size, inode, mtime and ctime it has now: as Linux
    does for a file written through a shared memory map whose page was already dirty."""
    held = os.stat(path)
    real = os.stat

    def stat(p, *args, **kwargs):
        st = real(p, *args, **kwargs)
        if isinstance(p, int) or os.fspath(p) != path:
            return st
        fields = {k: getattr(st, k) for k in dir(st) if k.startswith("st_")}
        fields.update({k: getattr(held, k) for k in fields if "time" in k})
        return type("stat_result", (), fields)()

    monkeypatch.setattr(os, "stat", stat)


def test_resume_refuses_an_input_changed_through_a_memory_map_with_its_times_kept(client, tmp_path, monkeypatch):
    """Item 5 of issue 38: bytes of an input chunk changed in place, its size, inode, mtime and ctime
    the same (a write through a shared memory map to a page already dirty): resume used to trust the
    files' signature, read nothing and say complete. It reads the completed chunks again and refuses."""
    import mmap

    monkeypatch.setattr(_fingerprint, "FRESH_SECONDS", 0.0)   # the files count as old, times trusted
    x = np.random.default_rng(13).standard_normal((30, 4, 4))
    source = str(tmp_path / "a.zarr")
    zarr.create_array(source, shape=x.shape, chunks=(10, 4, 4), dtype="f8", compressors=None)[...] = x
    out = tmp_path / "o.zarr"
    pipeline.run(source, out, op="inv", client=client, progress=False, config={"chunk": 10})
    _forget(out, slice(2, 3))
    victim = os.path.join(source, "c", "1", "0", "0")            # matrices 10:20, stored raw
    _held_times(monkeypatch, victim)
    with open(victim, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        values = np.frombuffer(m, "<f8")
        assert values[37] == x[12].flat[5]
        m[37 * 8:38 * 8] = np.float64(x[12].flat[5] + 0.25).tobytes()
        del values
    before = _snapshot(out)
    with pytest.raises(errors.ResumeError, match=r"other values in matrices 10:20 instead.*--overwrite"):
        pipeline.run(source, out, op="inv", resume=True, client=client, progress=False)
    assert _snapshot(out) == before


def test_freshly_written_input_files_are_signed_by_their_bytes(tmp_path):
    """A file written within FRESH_SECONDS of the signature may be written again with the same times:
    it is entered by the XXH3-128 of its bytes, so that a signature taken again with the same horizon
    differs when its bytes do, even with every stat field kept; an untouched input signs the same."""
    x = np.random.default_rng(14).standard_normal((10, 3, 3))
    source = str(tmp_path / "a.zarr")
    zarr.create_array(source, shape=x.shape, chunks=(5, 3, 3), dtype="f8", compressors=None)[...] = x
    ref = pipeline.store._arrays.parse_ref(source)
    first = _fingerprint.signature(ref)
    assert first["files"] == 3 and _fingerprint.signature(ref, first["horizon"]) == first
    victim = os.path.join(source, "c", "1", "0", "0")
    st = os.stat(victim)
    with open(victim, "r+b") as f:
        f.seek(8)
        f.write(np.float64(x[5].flat[1] * 2 + 1).tobytes())
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = _fingerprint.signature(ref, first["horizon"])
    assert again["files"] == 3 and again["digest"] != first["digest"]


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
    ref = pipeline.store._arrays.parse_ref(source)
    before = _fingerprint.signature(ref)
    assert before["files"] >= 2 + 1  # both chunk files and zarr.json
    time.sleep(0.01)
    z = zarr.open_array(source, mode="r+")
    z[0:5] = z[0:5] * 2.0
    assert _fingerprint.signature(ref, before["horizon"])["digest"] != before["digest"]


def test_resume_refuses_an_output_without_input_checksums(client, stores, tmp_path):
    """An output of an older batchlu records no checksums: the input cannot be checked."""
    out = tmp_path / "o.zarr"
    pipeline.run(stores["a"], out, op="inv", client=client, progress=False, config={"chunk": 10})
    _forget(out, slice(4, 6))
    shutil.rmtree(out / "_input_xxh3")
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
    assert got.dtype == np.uint64 and got.shape == (5,)
    for i, lo in enumerate(range(0, 23, 5)):
        assert got[i] == _fingerprint.digest(a[lo:lo + 5], b[lo:lo + 5])
    swapped = a.astype(a.dtype.newbyteorder(">"))
    assert _fingerprint.digest(swapped) == _fingerprint.digest(a)  # values, not their storage
    assert _fingerprint.digest(np.asfortranarray(a)) == _fingerprint.digest(a)
    changed = a.copy()
    changed.flat[40] = changed.flat[40] * 2 + 1
    assert _fingerprint.digest(changed) != _fingerprint.digest(a)


def test_digests_are_xxh3_of_the_values_and_of_the_missing_mask():
    """The ledger keeps xxhash's XXH3-64 of the values' bytes (of the two XXH3-64 with a right-hand
    side), with the mask of matrices read from missing chunks folded in where one is."""
    import struct

    import xxhash

    rng = np.random.default_rng(31)
    a = rng.standard_normal((9, 4, 4))
    b = rng.standard_normal((9, 4))
    h = xxhash.xxh3_64_intdigest
    assert _fingerprint.digest(a) == h(a.tobytes())
    assert _fingerprint.digest(a, b) == h(struct.pack("<QQ", h(a.tobytes()), h(b.tobytes())))
    assert _fingerprint.digest(a, missing=np.zeros(9, bool)) == h(a.tobytes())
    masks = [np.eye(9, dtype=bool)[i] for i in (0, 8)] + [np.ones(9, bool)]
    folded = {_fingerprint.digest(a, missing=mask) for mask in masks}
    assert len(folded) == 3 and h(a.tobytes()) not in folded
    zeros = np.zeros((9, 4, 4))
    assert _fingerprint.digest(zeros, missing=masks[2]) != _fingerprint.digest(zeros)  # issue 38, item 9


def test_the_model_of_the_device_xxh3_is_xxhashs():
    """kernels/cuda/xxh3.cu computes XXH3-64 in two passes (block sums, then each lane on its own):
    the NumPy model of those passes gives xxhash's value around every stripe and block end."""
    import xxhash

    from batchlu.pipeline.output import _xxh3

    rng = np.random.default_rng(32)
    for length in (241, 252, 256, 1020, 1024, 1028, 1088, 2044, 2048, 2052, 4096 + 60, 64 * 1024 + 4):
        data = rng.integers(0, 256, length, np.uint8).tobytes()
        assert _xxh3.model(data) == xxhash.xxh3_64_intdigest(data), length
    with pytest.raises(ValueError, match="more than 240 bytes"):
        _xxh3.model(bytes(240))


def _keep_crc32(data: bytearray, at: int, want: int) -> None:
    """Set the 4 bytes ``data[at:at + 4]`` so that zlib's CRC-32 of ``data`` is ``want`` (CRC-32 is
    affine over GF(2): solve for the 32 bits)."""
    import zlib

    zero = bytearray(len(data))
    base = zlib.crc32(bytes(zero))
    columns = []
    for bit in range(32):
        zero[at + bit // 8] ^= 1 << (bit % 8)
        columns.append(zlib.crc32(bytes(zero)) ^ base)
        zero[at + bit // 8] ^= 1 << (bit % 8)
    data[at:at + 4] = bytes(4)
    target = zlib.crc32(bytes(data)) ^ want
    rows = [(columns[bit], 1 << bit) for bit in range(32)]   # Gaussian elimination on (effect, bits)
    solution = 0
    for pivot in range(32):
        index = next(i for i, (effect, _) in enumerate(rows) if effect >> pivot & 1)
        effect, bits = rows.pop(index)
        rows = [(e ^ effect, b ^ bits) if e >> pivot & 1 else (e, b) for e, b in rows]
        if target >> pivot & 1:
            target ^= effect
            solution ^= bits
    assert target == 0
    data[at:at + 4] = solution.to_bytes(4, "little")


def test_resume_refuses_a_chunk_rewritten_to_keep_its_crc32(client, tmp_path):
    """Issue 38, item 7: a chunk of other values with the CRC-32 of the old ones passed resume."""
    import zlib

    x = np.random.default_rng(15).standard_normal((30, 4, 4))
    source = str(tmp_path / "a.zarr")
    array = zarr.create_array(source, shape=x.shape, chunks=(10, 4, 4), dtype="<f8", compressors=None)
    array[...] = x
    out = tmp_path / "o.zarr"
    pipeline.run(source, out, op="inv", client=client, progress=False, config={"chunk": 10})
    _forget(out, slice(2, 3))
    chunk = bytearray(x[10:20].tobytes())
    chunk[3 * 128 + 40:3 * 128 + 48] = np.float64(-7.5).tobytes()   # matrix 13, entry (1, 1)
    _keep_crc32(chunk, 9 * 128 + 120, zlib.crc32(x[10:20].tobytes()))  # the low bytes of matrix 19's last entry
    changed = np.frombuffer(bytes(chunk), "<f8").reshape(10, 4, 4)
    assert zlib.crc32(changed.tobytes()) == zlib.crc32(x[10:20].tobytes()) and np.isfinite(changed).all()
    array[10:20] = changed
    with pytest.raises(errors.ResumeError, match=r"other values in matrices 10:20 instead"):
        pipeline.run(source, out, op="inv", resume=True, client=client, progress=False)


def test_resume_refuses_an_output_of_crc32_checksums(client, stores, tmp_path):
    """An output of a batchlu that recorded CRC-32 checksums (``_input_crc32``) is not resumed: one
    line that says so and names --overwrite."""
    out = tmp_path / "o.zarr"
    pipeline.run(stores["a"], out, op="inv", client=client, progress=False, config={"chunk": 10})
    _forget(out, slice(4, 6))
    shutil.rmtree(out / "_input_xxh3")
    older = zarr.open_group(str(out), mode="r+").create_array(
        "_input_crc32", shape=(6,), chunks=(1,), dtype="uint32", fill_value=0, compressors=None)
    older[...] = np.arange(1, 7, dtype=np.uint32)
    before = _snapshot(out)
    with pytest.raises(errors.ResumeError) as refused:
        pipeline.run(stores["a"], out, op="inv", resume=True, client=client, progress=False)
    message = str(refused.value)
    assert "\n" not in message and "(CRC-32)" in message and message.endswith("use overwrite (--overwrite) to start again.")
    assert _snapshot(out) == before


def test_resume_refuses_a_missing_chunk_stored_later_as_its_fill_value(client, tmp_path):
    """Issue 38, item 9: with ``missing-chunks: fill`` the matrices of a missing input chunk get info
    -3; that chunk later stored as zeros (its fill value) read as the same values, so resume accepted
    it and the -3 flags went stale. The mask of missing matrices is part of the digest: resume accepts
    the chunk still missing, and refuses it once stored."""
    x = np.random.default_rng(16).standard_normal((40, 4, 4))
    source = str(tmp_path / "a.zarr")
    zarr.create_array(source, shape=x.shape, chunks=(10, 4, 4), dtype="f8", fill_value=0.0)[...] = x
    os.remove(os.path.join(source, "c", "1", "0", "0"))                     # matrices 10:20
    out = tmp_path / "o.zarr"
    config = {"chunk": 10, "missing-chunks": "fill"}
    first = pipeline.run(source, out, op="inv", client=client, progress=False, config=config)
    assert first.status == "complete"
    info = zarr.open_array(str(out), path="info", mode="r")[...]
    assert (info[10:20] == -3).all() and (info[:10] == 0).all()
    _forget(out, slice(3, 4))
    again = pipeline.run(source, out, op="inv", resume=True, client=client, progress=False, config=config)
    assert again.status == "complete" and again.processed == 10                # still missing: accepted
    _forget(out, slice(3, 4))
    with zarr.config.set({"array.write_empty_chunks": True}):   # stored, though all fill values
        zarr.open_array(source, mode="r+")[10:20] = 0.0
    assert os.path.isfile(os.path.join(source, "c", "1", "0", "0"))
    before = _snapshot(out)
    with pytest.raises(errors.ResumeError, match=r"other values in matrices 10:20 instead"):
        pipeline.run(source, out, op="inv", resume=True, client=client, progress=False, config=config)
    assert _snapshot(out) == before


@pytest.mark.parametrize("plain_files", [True, False], ids=["object-files", "through-zarr"])
def test_the_ledger_writes_each_digest_before_its_record(tmp_path, monkeypatch, plain_files):
    """Issue 38, R8: a chunk recorded complete always has its digest: each digest is written before
    the records (a kill between the two leaves a digest without a record, never the other way)."""
    from batchlu.pipeline.output import _ledger
    from batchlu.pipeline.store import _files

    group = zarr.open_group(str(tmp_path / "o.zarr"), mode="w")
    complete = _ledger.create(group, 8)
    digests = zarr.open_array(str(tmp_path / "o.zarr"), path=_ledger.DIGESTS, mode="r+")
    writes = []
    real = _files.write_file
    monkeypatch.setattr(_files, "write_file", lambda path, parts: writes.append(path) or real(path, parts))
    if not plain_files:   # another store: zarr writes them, the digests' slice first
        monkeypatch.setattr(_ledger, "objects_folder", lambda array: None)
        setitem = zarr.Array.__setitem__
        monkeypatch.setattr(zarr.Array, "__setitem__",
                            lambda self, key, value: (writes.append(self.path), setitem(self, key, value))[1])
    values = np.random.default_rng(17).integers(1, 2**63, 3, dtype=np.uint64)
    _ledger.mark_arrays(digests, complete, 2, 5, values)
    if plain_files:
        names = [os.path.relpath(w, str(tmp_path / "o.zarr")).split(os.sep)[0] for w in writes]
        assert names == [_ledger.DIGESTS] * 3 + [_ledger.NAME] * 3
    else:
        assert writes == [_ledger.DIGESTS, _ledger.NAME]
    assert _ledger.read(str(tmp_path / "o.zarr")).tolist() == [False] * 2 + [True] * 3 + [False] * 3
    assert _ledger.read_digests(str(tmp_path / "o.zarr"), [2, 3, 4]).tolist() == values.tolist()


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
    recorded = zarr.open_array(str(out), path="_input_xxh3", mode="r")[...]
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
    recorded = zarr.open_array(str(out), path="_input_xxh3", mode="r")[...]
    assert [int(x) for x in recorded] == [_fingerprint.digest(a[lo:lo + 16]) for lo in range(0, 96, 16)]
    assert (out / "inv" / "c" / "1" / "0" / "0").is_file()
    _forget(out, slice(4, 6))
    source[70, 1, 1] = source[70, 1, 1] + 1.0  # chunk 4: not complete any more, not checked
    source[40, 3, 2] = source[40, 3, 2] - 1.0  # chunk 2: complete
    with pytest.raises(errors.ResumeError, match=r"other values in matrices 32:48 instead"):
        pipeline.run(str(tmp_path / "a.zarr"), out, op="inv", backend="gpu", resume=True, progress=False,
                     config={"codec-device": codec_device})


# ------------------------------------------------------------------- the input changed during a run
def test_an_input_rewritten_during_the_run_fails_it(client, tmp_path):
    """Issue 38, item 4: the input written again with other values while tasks wait (the test-only
    task delay): the run said complete and verify failed later. Its end finds the files changed: one
    line naming the input and --overwrite, the status failed, and resume over it refuses."""
    source = pipeline.generate(tmp_path / "a.zarr", count=120, size=4, chunk=10, seed=18)
    out = tmp_path / "o.zarr"
    ended = {}

    def run():
        try:
            ended["report"] = pipeline.run(source, out, op="inv", client=client, progress=False,
                                           config={"chunk": 10})
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            ended["error"] = exc

    with dask.config.set({TESTING_TASK_DELAY: 0.3}):   # each batch waits 0.3 s between read and compute
        thread = threading.Thread(target=run)
        thread.start()
        wait_partly_complete(out)   # 3 to 5 of 12 chunks complete, 2 tasks waiting at a time
        other = np.random.default_rng(19).standard_normal((120, 4, 4))
        zarr.open_array(source, mode="r+")[...] = other   # each chunk file replaced whole
        thread.join(120)
    assert not thread.is_alive() and "report" not in ended, ended
    error = ended["error"]
    assert isinstance(error, errors.InputChangedError)
    message = str(error)
    assert "\n" not in message and f"the input {source}" in message and "changed during the run" in message
    assert message.endswith("use overwrite (--overwrite) to start again.")
    record = zarr.open_group(str(out), mode="r").attrs["batchlu"]
    assert record["status"] == "failed" and "InputChangedError" in record["error"]
    with pytest.raises(errors.ResumeError, match=r"other values in matrices \d+:\d+ instead"):
        pipeline.run(source, out, op="inv", resume=True, client=client, progress=False)


def test_an_unchanged_input_passes_the_end_of_run_check_whatever_its_age(client, tmp_path, monkeypatch):
    """The check at the end compares like with like: files old enough for their times to be trusted,
    and files as fresh as a just-generated input (signed by their bytes), both give a complete run."""
    source = pipeline.generate(tmp_path / "a.zarr", count=20, size=3, chunk=10, seed=20)
    for fresh in (5.0, 0.0):
        monkeypatch.setattr(_fingerprint, "FRESH_SECONDS", fresh)
        out = tmp_path / f"o{fresh}.zarr"
        report = pipeline.run(source, out, op="inv", client=client, progress=False, config={"chunk": 10})
        assert report.status == "complete"
